"""The broker keeps metadata and logs consistent: start-up heals a crash between the two."""

from __future__ import annotations

import asyncio
import errno
import os
import shutil
from pathlib import Path
from typing import Any

import pytest

import core_log.manager as manager_module
from cluster.broker import Broker, BrokerConfig
from core_log.errors import ErrorCode, KafkaStorageError, LogbusError
from core_log.limits import MAX_PARTITIONS_PER_TOPIC
from core_log.log import PartitionLog


def test_start_recreates_missing_logs_and_removes_stray_ones(tmp_path: Path) -> None:
    async def main() -> None:
        broker = Broker(BrokerConfig(data_dir=tmp_path))
        await broker.start()
        await broker.create_topic("kept", partitions=2)
        await broker.close()
        # A crash after the topic row was committed but before partition 1's log existed,
        # and one after a topic row was deleted but before its log was.
        shutil.rmtree(tmp_path / "kept-1")
        (tmp_path / "ghost-0").mkdir()
        broker = Broker(BrokerConfig(data_dir=tmp_path))
        await broker.start()
        try:
            assert sorted(broker.logs.topics().items()) == [("kept", [0, 1])]
            assert (tmp_path / "kept-1").is_dir()
            assert not (tmp_path / "ghost-0").exists()
        finally:
            await broker.close()

    asyncio.run(main())


def test_a_topic_at_the_partition_cap_is_created_one_more_is_refused(tmp_path: Path) -> None:
    async def main() -> None:
        broker = Broker(BrokerConfig(data_dir=tmp_path))
        await broker.start()
        try:
            with pytest.raises(LogbusError) as refused:
                await broker.create_topic("over", MAX_PARTITIONS_PER_TOPIC + 1)
            assert refused.value.code is ErrorCode.INVALID_PARTITIONS
            meta = await broker.create_topic("cap", MAX_PARTITIONS_PER_TOPIC)
            assert meta.partitions == MAX_PARTITIONS_PER_TOPIC
            assert len(broker.logs.topics()["cap"]) == MAX_PARTITIONS_PER_TOPIC
            with pytest.raises(LogbusError) as refused:
                await broker.add_partitions("cap", MAX_PARTITIONS_PER_TOPIC + 1)
            assert refused.value.code is ErrorCode.INVALID_PARTITIONS
        finally:
            await broker.close()

    asyncio.run(main())


def test_the_broker_partition_cap_counts_every_topic(tmp_path: Path) -> None:
    async def main() -> None:
        broker = Broker(BrokerConfig(data_dir=tmp_path, max_broker_partitions=20))
        await broker.start()
        try:
            await broker.create_topic("a", 12)
            for attempt in (broker.create_topic("b", 9), broker.add_partitions("a", 21)):
                with pytest.raises(LogbusError) as refused:
                    await attempt
                assert refused.value.code is ErrorCode.POLICY_VIOLATION
                assert "20" in refused.value.message
            assert [t.name for t in broker.topics()] == ["a"]
            await broker.create_topic("b", 7)
            await broker.add_partitions("a", 13)  # exactly the cap
            assert sum(t.partitions for t in broker.topics()) == 20
            assert sum(len(ps) for ps in broker.logs.topics().values()) == 20
        finally:
            await broker.close()

    asyncio.run(main())


def test_creating_partitions_fsyncs_once_not_per_partition(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Five fsyncs per partition made 3,000 partitions take 21 s; one fsync of the data
    directory makes the new directories durable (and a lost one is recreated at start)."""
    calls = []
    real_fsync = os.fsync

    def counting_fsync(fd: int) -> None:
        calls.append(fd)
        real_fsync(fd)

    async def main() -> None:
        broker = Broker(BrokerConfig(data_dir=tmp_path))
        await broker.start()
        try:
            monkeypatch.setattr(os, "fsync", counting_fsync)
            await broker.create_topic("many", 200)
            await broker.add_partitions("many", 400)
            monkeypatch.setattr(os, "fsync", real_fsync)
        finally:
            await broker.close()
        assert len(calls) <= 2, len(calls)
        # A restart opens the 400 never-written logs without loading, recovering or fsyncing
        # anything of theirs (7 ms each before: 10,000 partitions took over a minute to open).
        calls.clear()
        broker = Broker(BrokerConfig(data_dir=tmp_path))
        monkeypatch.setattr(os, "fsync", counting_fsync)
        await broker.start()
        monkeypatch.setattr(os, "fsync", real_fsync)
        try:
            assert broker.topic("many").partitions == 400
            assert len(broker.logs.topics()["many"]) == 400
            assert not list(tmp_path.glob("many-*/*.index"))
        finally:
            monkeypatch.setattr(os, "fsync", counting_fsync)
            await broker.close()  # and closes them without rewriting unchanged checkpoints
            monkeypatch.setattr(os, "fsync", real_fsync)
        assert len(calls) <= 8, len(calls)  # the data directory and the metadata store

    asyncio.run(main())


def test_a_failed_creation_leaves_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """All or nothing: a disk error part way (past the first thread hop) removes the row and
    every log made so far; the same name can be created afterwards."""
    real = manager_module.PartitionLog
    made = 0

    def failing(*args: Any, **kwargs: Any) -> PartitionLog:
        nonlocal made
        made += 1
        if made == 700:
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(*args, **kwargs)

    async def main() -> None:
        broker = Broker(BrokerConfig(data_dir=tmp_path))
        await broker.start()
        try:
            monkeypatch.setattr(manager_module, "PartitionLog", failing)
            with pytest.raises(KafkaStorageError):
                await broker.create_topic("doomed", 1000)
            monkeypatch.setattr(manager_module, "PartitionLog", real)
            assert "doomed" not in [t.name for t in broker.topics()]
            assert "doomed" not in broker.logs.topics()
            assert not list(tmp_path.glob("doomed-*"))
            assert "doomed" not in [t.name for t in broker.store.topics()]
            assert (await broker.create_topic("doomed", 3)).partitions == 3
        finally:
            await broker.close()

    asyncio.run(main())


def test_a_cancelled_creation_still_lands_whole(tmp_path: Path) -> None:
    """A client that gives up (its request is cancelled) does not leave half a topic: the
    change runs to its end and the client finds it done when it looks again."""

    async def main() -> None:
        broker = Broker(BrokerConfig(data_dir=tmp_path))
        await broker.start()
        try:
            task = asyncio.create_task(broker.create_topic("given-up", 1200))
            while not list(tmp_path.glob("given-up-*")):
                await asyncio.sleep(0.001)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            async with broker._admin_lock:  # the change holds it until it is complete
                pass
            assert broker.topic("given-up").partitions == 1200
            assert len(broker.logs.topics()["given-up"]) == 1200
        finally:
            await broker.close()

    asyncio.run(main())


class _MovedLeader:
    """Stand-ins for the replica manager and forwarder of a clustered broker: leadership moves
    under every append (the acks=all wait's answer, or a forwarded one)."""

    def __init__(self, leads: bool) -> None:
        self.leading = {("t", 0): type("L", (), {"active": True})()} if leads else {}

    async def append(self, *args: Any, **kwargs: Any) -> Any:
        raise LogbusError("leadership moved", code=ErrorCode.NOT_LEADER_OR_FOLLOWER)


@pytest.mark.parametrize("leads", [True, False], ids=["leader here", "forwarded"])
def test_leadership_moving_under_a_routed_produce_is_503_and_421_only_when_direct(
    tmp_path: Path, leads: bool
) -> None:
    """421 names a leader for a client that routes itself; a client the broker routes for gets
    a retriable 503 with the same Kafka code (the chaos run's any-broker writers saw 421s)."""
    from cluster.broker import Acks

    async def main() -> None:
        broker = Broker(BrokerConfig(data_dir=tmp_path))
        await broker.start()
        try:
            await broker.create_topic("t", partitions=1)
            fake = _MovedLeader(leads)
            broker.replicas, broker.forwarder = fake, fake  # type: ignore[assignment]
            answers = {}
            for direct in (False, True):
                with pytest.raises(LogbusError) as caught:
                    await broker.append("t", 0, b"", Acks.ALL, direct=direct)
                answers[direct] = caught.value
            assert answers[False].code is ErrorCode.NOT_LEADER_OR_FOLLOWER
            assert answers[False].http_status == 503 and answers[False].retriable
            assert answers[True].http_status == 421
        finally:
            broker.replicas = broker.forwarder = None
            await broker.close()

    asyncio.run(main())
