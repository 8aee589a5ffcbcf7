"""The coordinator on one broker: membership persisted with the offsets, partitions loaded and
unloaded as leadership comes and goes (simulated by overriding ``Broker.leader_epoch``)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

import orjson
import pytest

from cluster.broker import OFFSETS_TOPIC, Broker, BrokerConfig, offsets_partition
from cluster.coordinator import Coordinator
from core_log.batch import iter_records
from core_log.errors import ErrorCode, LogbusError

PARTITIONS = 4


async def started(data_dir: Path) -> tuple[Broker, Coordinator]:
    broker = Broker(BrokerConfig(data_dir=data_dir))
    await broker.start()
    coordinator = Coordinator(broker, offsets_partitions=PARTITIONS)
    await coordinator.start()
    return broker, coordinator


async def stopped(broker: Broker, coordinator: Coordinator) -> None:
    await coordinator.close()
    await broker.close()


def run(tmp_path: Path, body: Callable[[Path], Coroutine[Any, Any, None]]) -> None:
    asyncio.run(body(tmp_path))


async def until(cond: Callable[[], bool], what: str, timeout_s: float = 10.0) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while not cond():
        assert loop.time() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.01)


def view(c: Coordinator, group: str) -> dict[str, Any]:
    g = c.group(group)
    return {m.member_id: (m.epoch, sorted(m.owned), sorted(m.revoking)) for m in g.members.values()}


async def group_records(broker: Broker, group: str) -> list[dict[str, Any] | None]:
    p = broker.partition(OFFSETS_TOPIC, offsets_partition(group, PARTITIONS))
    result = await p.read(0, 16 * 1024 * 1024)
    key = orjson.dumps(["group", group])
    return [
        None if r.value is None else orjson.loads(r.value)
        for r in iter_records(result.data)
        if r.key == key
    ]


async def two_members(c: Coordinator, group: str) -> list[str]:
    ids = []
    for _ in range(2):
        r = c.join(group, ["t"], session_timeout_ms=30_000, rebalance_timeout_ms=30_000)
        ids.append(r.member_id)
    for _ in range(3):  # revocations acknowledged, partitions handed over
        for member_id in ids:
            c.heartbeat(group, member_id, ack=True)
    await c.durable(group)
    return ids


def test_members_survive_a_broker_restart(tmp_path: Path) -> None:
    async def body(data: Path) -> None:
        broker, c = await started(data)
        await broker.create_topic("t", 4)
        ids = await two_members(c, "g")
        before = view(c, "g")
        assert sorted(len(owned) for _, owned, _ in before.values()) == [2, 2]
        await c.commit("g", ids[0], before[ids[0]][0], {before[ids[0]][1][0]: (5, "m")})
        epoch = c.group("g").epoch
        await stopped(broker, c)

        broker, c = await started(data)
        try:
            assert view(c, "g") == before
            assert c.group("g").epoch == epoch
            assert c.group("g").state.value == "stable"
            for member_id in ids:  # same ids, same assignment, nothing to reconcile
                r = c.heartbeat("g", member_id, ack=True)
                assert sorted(r.assigned) == before[member_id][1] and not r.revoking
            assert c.committed("g")[before[ids[0]][1][0]].offset == 5
        finally:
            await stopped(broker, c)

    run(tmp_path, body)


def test_a_burst_of_changes_is_coalesced_and_the_latest_state_wins(tmp_path: Path) -> None:
    async def body(data: Path) -> None:
        broker, c = await started(data)
        try:
            await broker.create_topic("t", 8)
            ids = [
                c.join("g", ["t"], session_timeout_ms=30_000, rebalance_timeout_ms=30_000).member_id
                for _ in range(20)
            ]
            await c.durable("g")
            records = await group_records(broker, "g")
            assert 1 <= len(records) <= 2  # one write started at the first join, one after
            last = records[-1]
            assert last is not None
            assert sorted(m["member_id"] for m in last["members"]) == sorted(ids)
            assert last == c.group("g").to_record()
        finally:
            await stopped(broker, c)

    run(tmp_path, body)


def test_a_forgotten_group_leaves_a_tombstone(tmp_path: Path) -> None:
    async def body(data: Path) -> None:
        broker, c = await started(data)
        try:
            await broker.create_topic("t", 1)
            r = c.join("g", ["t"], session_timeout_ms=30_000, rebalance_timeout_ms=30_000)
            c.leave("g", r.member_id)
            await c.durable("g")
            await c.delete("g")
            assert (await group_records(broker, "g"))[-1] is None
        finally:
            await stopped(broker, c)
        broker, c = await started(data)
        try:
            assert "g" not in c.group_ids()
        finally:
            await stopped(broker, c)

    run(tmp_path, body)


def test_losing_the_partition_unloads_and_regaining_it_restores(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async def body(data: Path) -> None:
        broker, c = await started(data)
        try:
            await broker.create_topic("t", 4)
            ids = await two_members(c, "g")
            before = view(c, "g")
            p = offsets_partition("g", PARTITIONS)
            assert c.coordinates("g") and broker.coordinator_of("g") == 1
            epochs: dict[int, int | None] = {}
            monkeypatch.setattr(
                broker, "leader_epoch", lambda topic, partition: epochs.get(partition, 0)
            )
            # A member long-polling when the leadership goes.
            poll = asyncio.ensure_future(c.poll("g", ids[0], 1024, 30_000))
            await asyncio.sleep(0.05)
            assert not poll.done()
            epochs[p] = None
            broker._roles_changed()
            with pytest.raises(LogbusError) as lost:
                await asyncio.wait_for(poll, 5)
            assert lost.value.code is ErrorCode.NOT_COORDINATOR and lost.value.retriable
            assert not c.coordinates("g") and "g" not in c.group_ids()
            with pytest.raises(LogbusError) as again:
                c.heartbeat("g", ids[1])
            assert again.value.code is ErrorCode.NOT_COORDINATOR
            assert again.value.http_status == 421
            # Back, in a new epoch: loaded from the log, members as they were.
            epochs[p] = 1
            broker._roles_changed()
            await until(lambda: c.coordinates("g"), "the partition to load")
            assert view(c, "g") == before
            r = c.heartbeat("g", ids[1], ack=True)
            assert sorted(r.assigned) == before[ids[1]][1]
        finally:
            await stopped(broker, c)

    run(tmp_path, body)


def test_calls_while_loading_are_told_to_retry(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async def body(data: Path) -> None:
        broker, c = await started(data)
        try:
            p = offsets_partition("g", PARTITIONS)
            gate = asyncio.Event()
            real = broker.partition

            def slow(topic: str, partition: int) -> Any:
                part = real(topic, partition)
                if topic == OFFSETS_TOPIC and partition == p and not gate.is_set():
                    raise LogbusError("not yet", code=ErrorCode.KAFKA_STORAGE_ERROR)
                return part

            c._unload(p, "test")
            monkeypatch.setattr(broker, "partition", slow)
            epochs = {p: 3}
            monkeypatch.setattr(broker, "leader_epoch", lambda t, q: epochs.get(q, 0))
            broker._roles_changed()
            with pytest.raises(LogbusError) as loading:
                c.require_known("g")
            assert loading.value.code is ErrorCode.COORDINATOR_LOAD_IN_PROGRESS
            assert loading.value.retriable and loading.value.http_status == 503
            gate.set()
            await until(lambda: c.coordinates("g"), "the retried load", 15)
        finally:
            await stopped(broker, c)

    run(tmp_path, body)
