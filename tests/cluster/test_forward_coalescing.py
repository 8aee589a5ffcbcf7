"""Concurrent forwarded produces to one partition share forwards, each answered as if alone.

In-process: a :class:`~cluster.forwarding.Forwarder` whose link to the leader is a fake h2
client handing each framed request to a :class:`~cluster.forwarding.PartitionService` over
a fake replica manager, whose appends can be held until released. The tests check how
produces were grouped (those arriving in one turn of the event loop), that each caller got
its own offsets or its own error, and that nothing was lost, duplicated or reordered.
"""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

import pytest

from cluster import forwarding
from cluster.forwarding import (
    PRODUCE_MANY_PATH,
    PRODUCE_PATH,
    Forwarder,
    PartitionService,
)
from cluster.h2base import H2Request, H2Response
from cluster.replica_manager import NotLeaderError
from core_log.errors import ErrorCode, LogbusError
from core_log.log import AppendResult


class Leader:
    """The leader's replica manager: appends in arrival order, each answered once ``hold``
    is set."""

    def __init__(self) -> None:
        self.appended: list[bytes] = []
        self.hold = asyncio.Event()
        self.moved_once: set[bytes] = set()

    def leader_of(self, topic: str, partition: int) -> Any:
        return SimpleNamespace(partition=None)

    async def append(
        self,
        topic: str,
        partition: int,
        data: bytes | memoryview,
        *,
        wait_for_isr: bool,
        transactional: bool = False,
    ) -> AppendResult:
        data = bytes(data)
        if data.startswith(b"bad"):
            raise LogbusError("a bad batch", code=ErrorCode.CORRUPT_MESSAGE)
        if data.startswith(b"moved") and data not in self.moved_once:
            self.moved_once.add(data)  # leadership moved, then back: refused once
            raise NotLeaderError("not the leader")
        offset = len(self.appended)
        self.appended.append(data)
        await self.hold.wait()
        return AppendResult(offset, offset, 1, 1, len(data), -1)

    async def append_many(
        self, topic: str, partition: int, datas: list[memoryview], *, wait_for_isr: bool
    ) -> list[AppendResult | BaseException]:
        """Each as :meth:`append` alone, started in order (ReplicaManager.append_many)."""
        appends = [self.append(topic, partition, d, wait_for_isr=wait_for_isr) for d in datas]
        return list(await asyncio.gather(*appends, return_exceptions=True))

    async def refresh(self, force: bool = False) -> None:
        return None


class Link:
    """The forwarding broker's h2 client to the leader: every request framed and answered."""

    def __init__(self, service: PartitionService) -> None:
        self.service = service
        self.paths: list[str] = []

    async def request(
        self, method: str, path: str, *, headers: Any, body: bytes, timeout_s: float
    ) -> H2Response:
        self.paths.append(path)
        response = await self.service.handle(H2Request(method, path, [], body))
        body_out = response.body
        joined = b"".join(bytes(b) for b in body_out) if isinstance(body_out, list) else body_out
        return H2Response(response.status, response.headers, bytes(joined))


def _forwarder() -> tuple[Forwarder, Leader, Link]:
    leader = Leader()
    service = PartitionService(leader)  # type: ignore[arg-type]
    link = Link(service)
    rm = SimpleNamespace(
        me=2,
        config=SimpleNamespace(request_timeout_ms=30_000, socket_timeout_ms=30_000),
        leader_id=lambda topic, partition: 1,
        client_for=lambda broker: link,
        request_headers=lambda: [],
        refresh=leader.refresh,
    )
    return Forwarder(rm, service), leader, link  # type: ignore[arg-type]


async def _until(condition: Any) -> None:
    for _ in range(10_000):
        if condition():
            return
        await asyncio.sleep(0)
    raise AssertionError("condition never held")


def test_produces_arriving_in_one_turn_go_together_each_with_its_own_offsets() -> None:
    async def main() -> None:
        fwd, leader, link = _forwarder()
        # Started in one turn of the loop: they reach the forwarder together.
        first = [
            asyncio.ensure_future(fwd.append("t", 0, b"r%d" % i, acks_all=True)) for i in range(30)
        ]
        await _until(lambda: len(leader.appended) == 30)
        # Produces arriving while that forward is in flight do not wait for it.
        second = [
            asyncio.ensure_future(fwd.append("t", 0, b"r%d" % i, acks_all=True))
            for i in range(30, 40)
        ]
        await _until(lambda: len(leader.appended) == 40)
        assert link.paths == [PRODUCE_MANY_PATH, PRODUCE_MANY_PATH]
        # Another acks level is another forward.
        other = asyncio.ensure_future(fwd.append("t", 0, b"acks1", acks_all=False))
        await _until(lambda: len(leader.appended) == 41)
        assert link.paths[-1] == PRODUCE_PATH
        leader.hold.set()
        results = await asyncio.gather(*first, *second)
        # Every produce appended once, in the order it arrived, and answered its own offset.
        assert leader.appended[:40] == [b"r%d" % i for i in range(40)]
        assert [r.base_offset for r in results] == list(range(40))
        assert (await other).base_offset == 40
        assert not fwd._produces and not fwd._forwards  # nothing left behind

    asyncio.run(main())


def test_groups_stay_within_the_byte_limit(monkeypatch: pytest.MonkeyPatch) -> None:
    async def main() -> None:
        monkeypatch.setattr(forwarding, "FORWARD_GROUP_BYTES", 10)
        fwd, leader, link = _forwarder()
        leader.hold.set()
        sizes = [4, 4, 4, 12, 3]  # 4+4 | 4 | 12 alone (larger than the limit) | 3
        results = await asyncio.gather(
            *(fwd.append("t", 0, b"%d" % i * n, acks_all=True) for i, n in enumerate(sizes))
        )
        assert link.paths == [PRODUCE_MANY_PATH, PRODUCE_PATH, PRODUCE_PATH, PRODUCE_PATH]
        assert [r.size_bytes for r in results] == sizes

    asyncio.run(main())


def test_each_produce_of_a_group_gets_its_own_error() -> None:
    async def main() -> None:
        fwd, leader, link = _forwarder()
        leader.hold.set()
        names = [b"ok1", b"bad1", b"moved1", b"ok2"]
        outcomes = await asyncio.gather(
            *(fwd.append("t", 0, n, acks_all=False) for n in names), return_exceptions=True
        )
        ok1, bad1, moved1, ok2 = outcomes
        assert isinstance(bad1, LogbusError) and bad1.code is ErrorCode.CORRUPT_MESSAGE
        assert isinstance(ok1, AppendResult) and isinstance(ok2, AppendResult)
        # The one the leader refused as not leading (nothing written) was sent again alone.
        assert isinstance(moved1, AppendResult)
        assert leader.appended == [b"ok1", b"ok2", b"moved1"]
        assert link.paths == [PRODUCE_MANY_PATH, PRODUCE_PATH]

    asyncio.run(main())


def test_a_lone_produce_goes_alone_and_transactional_ones_never_group() -> None:
    async def main() -> None:
        fwd, leader, link = _forwarder()
        leader.hold.set()
        r = await fwd.append("t", 0, b"solo", acks_all=True)
        assert r.base_offset == 0 and link.paths == [PRODUCE_PATH]
        link.paths.clear()
        await asyncio.gather(
            *(fwd.append("t", 0, b"tx%d" % i, acks_all=True, transactional=True) for i in range(5))
        )
        assert link.paths == [PRODUCE_PATH] * 5

    asyncio.run(main())


def test_a_network_failure_fails_every_produce_of_the_group() -> None:
    async def main() -> None:
        fwd, leader, link = _forwarder()

        async def broken(*args: Any, **kwargs: Any) -> H2Response:
            raise ConnectionError("link down")

        link.request = broken  # type: ignore[method-assign]
        outcomes = await asyncio.gather(
            *(fwd.append("t", 0, b"g%d" % i, acks_all=True) for i in range(3)),
            return_exceptions=True,
        )
        for outcome in outcomes:
            assert isinstance(outcome, LogbusError)
            assert outcome.code is ErrorCode.NETWORK_EXCEPTION
        assert leader.appended == [] and not fwd._produces

    asyncio.run(main())


def test_a_caller_gone_before_the_forward_sends_nothing() -> None:
    async def main() -> None:
        fwd, leader, link = _forwarder()
        leader.hold.set()
        gone = asyncio.ensure_future(fwd.append("t", 0, b"gone", acks_all=True))
        kept = asyncio.ensure_future(fwd.append("t", 0, b"kept", acks_all=True))
        await asyncio.sleep(0)  # both wait for the end of the turn
        gone.cancel()
        assert (await kept).base_offset == 0
        assert leader.appended == [b"kept"] and link.paths == [PRODUCE_PATH]

    asyncio.run(main())


def test_a_malformed_group_is_400_and_appends_nothing() -> None:
    async def main() -> None:
        from cluster import replica_wire as wire

        leader = Leader()
        service = PartitionService(leader)  # type: ignore[arg-type]
        header = {"topic": "t", "partition": 0, "acks_all": True, "sizes": [3, 5]}
        request = H2Request("POST", PRODUCE_MANY_PATH, [], wire.frame(header, b"abcdef"))
        response = await service.handle(request)
        assert response.status == 400 and leader.appended == []

    asyncio.run(main())
