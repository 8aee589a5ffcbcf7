"""``read_committed`` reads of a partition led elsewhere: the leader's answer crosses the
partition wire (``cluster.forwarding``) with its last stable offset and aborted transactions
intact, so a remote reader filters exactly as a local one would.

In-process: a :class:`~cluster.forwarding.PartitionService` answers for a local partition
holding committed, aborted and open transactions, and a :class:`RemotePartition` reads it
through a forwarder that frames every request and answer as the h2 transport would.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from cluster import replica_wire as wire
from cluster.forwarding import FollowerPartition, PartitionService, RemotePartition
from cluster.h2base import H2Request
from core_log.isolation import committed_records
from core_log.manager import LogManager, Partition
from core_log.txn_index import AbortedTxn
from tests.core_log.test_transactions import plain, txn


class _Wire:
    """A forwarder whose calls go through the service's framed request and answer."""

    def __init__(self, service: PartitionService) -> None:
        self.service = service
        self.calls = 0

    async def call(
        self, topic: str, partition: int, path: str, header: dict[str, Any], payload: bytes = b""
    ) -> tuple[dict[str, Any], bytes | memoryview]:
        self.calls += 1
        framed = wire.frame({"topic": topic, "partition": partition, **header}, payload)
        response = await self.service.handle(H2Request("POST", path, [], framed))
        assert response.status == 200, response.body
        body = response.body
        joined = b"".join(bytes(b) for b in body) if isinstance(body, list) else bytes(body)
        return wire.unframe(joined)


async def _partition(tmp_path: Path) -> tuple[LogManager, Partition]:
    m = LogManager(tmp_path)
    await m.start(background=False)
    p = await m.create("t", 0)
    await p.append(plain(b"p0"))  # 0
    await p.append(txn(1, 0, b"a1", b"a2"), transactional=True)  # 1-2, aborted below
    await p.append(txn(2, 0, b"b1"), transactional=True)  # 3, committed below
    await p.append_marker(1, 0, False, 0)  # 4: ABORT of producer 1
    await p.append_marker(2, 0, True, 0)  # 5: COMMIT of producer 2
    await p.append(txn(3, 0, b"c1"), transactional=True)  # 6: open
    await p.append(plain(b"p7"))  # 7
    return m, p


def test_a_remote_read_committed_equals_the_leaders_own() -> None:
    async def main(tmp_path: Path) -> None:
        m, p = await _partition(tmp_path)
        leader = SimpleNamespace(leader_of=lambda _t, _p: SimpleNamespace(partition=p))
        forwarder = _Wire(PartitionService(leader))  # type: ignore[arg-type]
        remote = RemotePartition(forwarder, "t", 0)  # type: ignore[arg-type]
        for offset in (0, 1, 3, 4, 6):
            local = await p.read_committed(offset, 1 << 20)
            got = await remote.read_committed(offset, 1 << 20)
            assert got == local, offset
        got = await remote.read_committed(0, 1 << 20)
        assert got.last_stable_offset == 6 and got.high_watermark == 8
        # (producer 1, first offset, the ABORT marker, the LSO then: producer 2 was open at 3)
        assert got.aborted_transactions == (AbortedTxn(1, 1, 4, 3),)
        values = [r.value for r in committed_records(got.data, got.aborted_transactions)]
        assert values == [b"p0", b"b1"]
        # read_uncommitted through the same wire is unchanged
        assert await remote.read(0, 1 << 20) == await p.read(0, 1 << 20)
        # A follower serves committed reads from the leader, never from its own replica
        # (whose last stable offset may trail the leader's).
        local_replica = SimpleNamespace(
            topic="t", partition=0, high_watermark=8, log_start_offset=0, log_end_offset=8
        )
        follower = FollowerPartition(local_replica, remote)  # type: ignore[arg-type]
        before = forwarder.calls
        assert await follower.read_committed(0, 1 << 20) == got
        assert forwarder.calls == before + 1
        await p.append_marker(3, 0, True, 0)  # 8: the open transaction commits
        later = await remote.read_committed(6, 1 << 20)
        assert later.last_stable_offset == 9
        assert [r.value for r in committed_records(later.data, ())] == [b"c1", b"p7"]
        await m.close()

    import tempfile

    with tempfile.TemporaryDirectory() as d:
        asyncio.run(main(Path(d)))
