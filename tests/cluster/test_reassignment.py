"""Partition reassignment (KIP-455): the controller's pure steps, the store writing them, and
the replication simulation (:mod:`tests.cluster.sim`) with reassignments among its faults."""

from __future__ import annotations

import asyncio
from dataclasses import replace
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from cluster.controller import (
    ReassignmentConflict,
    ReassignmentError,
    cancel_reassignment,
    complete_reassignment,
    decide,
    drain_plan,
    start_reassignment,
    validate_target,
)
from cluster.metadata import MetadataStore, PartitionMeta, TopicMeta
from cluster.replica_manager import ReplicaManager, ReplicationConfig
from cluster.replication import NO_LEADER
from core_log.clock import ManualClock
from core_log.config import LogConfig
from core_log.manager import LogManager
from tests.cluster.sim import Simulation
from tests.cluster.test_replication_sim import REPLAYING, _first_violation, _run_all

BROKERS = {1: True, 2: True, 3: True, 4: False}  # id -> lease live


def _row(
    replicas: list[int], isr: list[int] | None = None, leader: int | None = None
) -> PartitionMeta:
    isr = list(replicas) if isr is None else isr
    return PartitionMeta("t", 0, replicas, isr, replicas[0] if leader is None else leader, 3, 10)


# -- validation -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("target", "message"),
    [
        ([], "at least one broker"),
        ([2, 2], "broker(s) [2] more than once"),
        ([2, 9], "unknown broker id(s) [9]"),
        ([2, 4], "broker(s) [4] are not alive"),
        ([3], "fewer than the topic's min.insync.replicas=2"),
    ],
)
def test_a_bad_target_is_refused_with_the_reason(target: list[int], message: str) -> None:
    with pytest.raises(ReassignmentError) as e:
        validate_target(_row([1, 2]), target, BROKERS, 2)
    assert message in str(e.value)


def test_a_dead_broker_may_stay_and_the_replication_factor_may_change() -> None:
    row = _row([1, 4])
    validate_target(row, [4, 2], BROKERS, 2)  # 4 is down but already a replica
    validate_target(row, [1, 2, 3], BROKERS, 2)  # RF 2 -> 3
    validate_target(_row([1, 2, 3]), [2], BROKERS, 1)  # RF 3 -> 1


# -- the two steps --------------------------------------------------------------------------------


def test_start_puts_the_target_first_and_keeps_isr_and_leader() -> None:
    row = _row([1, 2])
    new = start_reassignment(row, [2, 3])
    assert new is not None
    assert (new.replicas, new.adding_replicas, new.removing_replicas) == ([2, 3, 1], [3], [1])
    assert (new.isr, new.leader, new.leader_epoch) == ([1, 2], 1, 3)
    assert new.partition_epoch == 11 and new.target_replicas == [2, 3]
    assert start_reassignment(new, [2, 3]) is None  # the same target again: nothing to do


def test_a_new_order_of_the_same_brokers_applies_at_once() -> None:
    new = start_reassignment(_row([1, 2, 3]), [3, 1, 2])
    assert new is not None and not new.reassigning
    assert (new.replicas, new.isr, new.leader) == ([3, 1, 2], [1, 2, 3], 1)
    assert start_reassignment(_row([1, 2]), [1, 2]) is None


def test_completion_waits_until_every_adding_replica_is_in_sync() -> None:
    moving = start_reassignment(_row([1, 2]), [2, 3])
    assert moving is not None
    assert complete_reassignment(moving, {1, 2, 3}, 2) is None  # 3 not in the ISR yet
    in_sync = replace(moving, isr=[1, 2, 3], partition_epoch=12)
    done = complete_reassignment(in_sync, {1, 2, 3}, 2)
    assert done is not None and not done.reassigning
    # The leader (1) was removed: the first live in-sync target replica leads, in a new epoch.
    assert (done.replicas, done.isr, done.leader) == ([2, 3], [2, 3], 2)
    assert (done.leader_epoch, done.partition_epoch) == (4, 13)


def test_completion_keeps_a_leader_that_stays() -> None:
    moving = start_reassignment(_row([1, 2]), [1, 3])
    assert moving is not None
    done = complete_reassignment(replace(moving, isr=[1, 2, 3]), {1, 2, 3}, 2)
    assert done is not None
    assert (done.replicas, done.isr, done.leader, done.leader_epoch) == ([1, 3], [1, 3], 1, 3)


def test_completion_never_takes_the_isr_below_min_insync() -> None:
    # 2 (kept) fell out of the ISR; 3 caught up: dropping 1 would leave the ISR at {3} < 2.
    moving = replace(start_reassignment(_row([1, 2]), [2, 3]) or _row([1]), isr=[1, 3])
    assert complete_reassignment(moving, {1, 2, 3}, 2) is None
    # Once 2 is back in sync it completes.
    assert complete_reassignment(replace(moving, isr=[1, 2, 3]), {1, 2, 3}, 2) is not None
    # min.insync.replicas=1: {3} is enough.
    assert complete_reassignment(moving, {1, 2, 3}, 1) is not None


def test_completion_waits_for_a_live_leader_among_the_target() -> None:
    moving = replace(start_reassignment(_row([1, 2]), [2, 3]) or _row([1]), isr=[1, 2, 3])
    assert complete_reassignment(moving, {1}, 1) is None  # 2 and 3 are fenced


def test_an_offline_partition_completes_and_stays_offline_for_decide() -> None:
    moving = replace(
        start_reassignment(_row([1, 2]), [2, 3]) or _row([1]), isr=[2, 3], leader=NO_LEADER
    )
    done = complete_reassignment(moving, {2, 3}, 1)
    assert done is not None and done.leader == NO_LEADER and done.replicas == [2, 3]
    elected = decide(done, {2, 3}, False, False)
    assert elected is not None and elected.leader == 2


def test_reducing_the_replication_factor_completes_on_the_next_pass() -> None:
    moving = start_reassignment(_row([1, 2, 3]), [1, 2])
    assert moving is not None and moving.adding_replicas == [] and moving.removing_replicas == [3]
    done = complete_reassignment(moving, {1, 2, 3}, 2)
    assert done is not None and (done.replicas, done.isr) == ([1, 2], [1, 2])


def test_a_new_target_replaces_a_running_reassignment_keeping_in_sync_replicas() -> None:
    moving = start_reassignment(_row([1, 2]), [2, 3])
    assert moving is not None
    # 3 is still copying: it is dropped by a new target that does not name it.
    other = start_reassignment(moving, [2, 4])
    assert other is not None
    assert (other.replicas, other.adding_replicas, other.removing_replicas) == ([2, 4, 1], [4], [1])
    # 3 is in sync already: it stays until the new target is in sync.
    synced = replace(moving, isr=[1, 2, 3], leader=3)
    other = start_reassignment(synced, [2, 4])
    assert other is not None
    assert (other.replicas, other.adding_replicas) == ([2, 4, 3, 1], [4])
    assert other.removing_replicas == [3, 1] and (other.isr, other.leader) == ([1, 2, 3], 3)


def test_cancel_goes_back_to_the_original_replicas() -> None:
    moving = start_reassignment(_row([1, 2]), [2, 3])
    assert moving is not None
    back = cancel_reassignment(replace(moving, isr=[1, 2, 3]), {1, 2, 3}, 2)
    assert (back.replicas, back.isr, back.leader, back.reassigning) == ([2, 1], [2, 1], 1, False)
    with pytest.raises(ReassignmentConflict) as none:
        cancel_reassignment(back, {1, 2, 3}, 2)
    assert not none.value.in_progress


def test_cancel_is_refused_while_it_would_shrink_the_isr_below_min_insync() -> None:
    moving = start_reassignment(_row([1, 2]), [2, 3])
    assert moving is not None
    lagging = replace(moving, isr=[2, 3], leader=2)  # 1 fell out, 3 caught up
    with pytest.raises(ReassignmentConflict) as e:
        cancel_reassignment(lagging, {1, 2, 3}, 2)
    assert e.value.in_progress and "min.insync.replicas=2" in str(e.value)


@given(
    st.lists(st.integers(1, 6), min_size=1, max_size=4, unique=True),
    st.lists(st.integers(1, 6), min_size=1, max_size=4, unique=True),
    st.integers(1, 3),
    st.data(),
)
def test_no_step_loses_an_in_sync_replica_below_the_minimum(
    original: list[int], target: list[int], min_insync: int, data: st.DataObject
) -> None:
    """Whatever the ISR when a step runs: the target ends up the replicas, the leader is in the
    ISR, and the ISR never drops below min(min.insync.replicas, what it was)."""
    row = _row(original)
    moving = start_reassignment(row, target)
    if moving is None:
        return
    assert set(moving.replicas) == set(original) | set(target)
    assert moving.isr == row.isr and moving.leader == row.leader
    isr = data.draw(st.lists(st.sampled_from(moving.replicas), min_size=1, unique=True))
    leader = data.draw(st.sampled_from(isr))
    live = set(data.draw(st.lists(st.sampled_from(moving.replicas), unique=True))) | {leader}
    state = replace(moving, isr=isr, leader=leader)
    for step in (
        complete_reassignment(state, live, min_insync),
        _cancelled(state, live, min_insync),
    ):
        if step is None:
            continue
        assert not step.reassigning
        assert set(step.isr) <= set(step.replicas) and step.isr
        assert len(step.isr) >= min(min_insync, len(isr))
        assert step.leader in step.isr
        assert step.leader_epoch == state.leader_epoch + (step.leader != leader)
    done = complete_reassignment(state, live, min_insync)
    if done is not None:
        assert done.replicas == target


def _cancelled(row: PartitionMeta, live: set[int], min_insync: int) -> PartitionMeta | None:
    try:
        return cancel_reassignment(row, live, min_insync)
    except ReassignmentConflict:
        return None


# -- drain ----------------------------------------------------------------------------------------


def test_drain_replaces_the_broker_in_place_on_the_least_loaded_broker() -> None:
    rows = [
        PartitionMeta("a", 0, [1, 2], [1, 2], 1, 0, 0),
        PartitionMeta("a", 1, [2, 3], [2, 3], 2, 0, 0),
        PartitionMeta("b", 0, [3, 1], [3, 1], 3, 0, 0),
        PartitionMeta("b", 1, [1, 3], [1, 3], 1, 0, 0),
    ]
    brokers: list[tuple[int, str | None]] = [(1, None), (2, None), (3, None), (4, None)]
    plan = drain_plan(rows, 1, brokers)
    assert set(plan) == {("a", 0), ("b", 0), ("b", 1)}
    assert plan[("a", 0)] == [4, 2]  # 4 holds nothing: it takes 1's place, as preferred leader
    assert all(1 not in t and len(set(t)) == 2 for t in plan.values())
    assert plan[("b", 0)][0] == 3  # the preferred leader stays where it was


def test_drain_prefers_the_drained_brokers_rack_and_refuses_when_nothing_is_left() -> None:
    rows = [PartitionMeta("a", 0, [1, 2], [1, 2], 1, 0, 0)]
    racks: list[tuple[int, str | None]] = [(1, "x"), (2, "y"), (3, "y"), (4, "x")]
    assert drain_plan(rows, 1, racks) == {("a", 0): [4, 2]}
    with pytest.raises(ReassignmentError, match="no other live broker"):
        drain_plan(rows, 1, [(1, None), (2, None)])


# -- the store ------------------------------------------------------------------------------------


@pytest.fixture(params=["sqlite", "postgresql"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> MetadataStore:
    if request.param == "sqlite":
        url = f"sqlite:///{tmp_path / 'metadata.db'}"
    else:
        url = request.getfixturevalue("postgres_db_url")
    s = MetadataStore(url)
    request.addfinalizer(s.close)
    return s


def test_the_store_keeps_a_reassignment_by_compare_and_set(store: MetadataStore) -> None:
    row = PartitionMeta("t", 0, [1, 2], [1, 2], 1, 0, 0)
    store.create_topic(TopicMeta("t", "0" * 32, 1, 2, {}, 0, 0, [row]))
    assert store.topic("t").assignments[0] == row  # empty lists when none runs
    ctl = (1, store.acquire_controller(1, 60_000) or 0)
    moving = start_reassignment(row, [2, 3])
    assert moving is not None
    assert store.apply_controller_changes(ctl, [(row.partition_epoch, moving)]) == [moving]
    assert store.topic("t").assignments[0] == moving
    # A step computed from the row before the reassignment started changes nothing.
    stale = replace(row, isr=[1], partition_epoch=1)
    assert store.apply_controller_changes(ctl, [(row.partition_epoch, stale)]) == []
    done = complete_reassignment(replace(moving, isr=[1, 2, 3]), {1, 2, 3}, 1)
    assert done is not None
    assert store.apply_controller_changes(ctl, [(moving.partition_epoch, done)]) == [done]
    assert store.topic("t").assignments[0] == done
    assert (done.replicas, done.leader, done.adding_replicas) == ([2, 3], 2, [])


# -- the simulation -------------------------------------------------------------------------------

SIM_SEEDS = range(100)  # ~300 fault steps each, reassignments among the faults: a few seconds


def test_invariants_hold_while_partitions_are_reassigned() -> None:
    """Crashes, pauses and cut links while the replica set changes: one leader per epoch, no
    acknowledged record lost by an ISR member, logs agree below their HWs; afterwards the
    target replicas (only) hold the log."""
    totals = _run_all(Simulation, SIM_SEEDS, reassign=True)
    if not REPLAYING:
        for what in ("reassignments", "reassigned", "deleted", "acked", "elections"):
            assert totals[what] > 10, (what, totals)
        assert totals["cancelled"] > 0, totals


class _CompletesBeforeInSync(Simulation):
    """Broken on purpose: completes a reassignment before the new replicas are in sync (as if
    the controller did not wait for the ISR), electing one of them if the leader leaves."""

    @staticmethod
    def complete(row: PartitionMeta, live: set[int], min_insync: int) -> PartitionMeta | None:
        if not row.reassigning:
            return None
        target = row.target_replicas
        synced = replace(row, isr=[b for b in row.replicas if b in row.isr or b in target])
        return complete_reassignment(synced, live, 1)


def test_a_completion_before_the_new_replicas_are_in_sync_is_caught() -> None:
    violation = _first_violation(_CompletesBeforeInSync, 300, reassign=True)
    assert "lost acknowledged" in violation or "differ below" in violation, violation


# -- a broker applying the rows -------------------------------------------------------------------


def test_a_broker_added_creates_its_copy_and_one_removed_deletes_it(tmp_path: Path) -> None:
    """Broker 1 applies rows naming it a follower (a reassignment adds it: an empty log to copy
    into), then rows without it (removed: the copy goes), and a copy left from before a restart
    that no row names any more also goes."""

    async def main() -> None:
        logs = LogManager(
            tmp_path / "data", clock=ManualClock(1_700_000_000_000), auto_high_watermark=False
        )
        await logs.start(background=False)
        store = MetadataStore(f"sqlite:///{tmp_path / 'meta.db'}")
        rm = ReplicaManager(
            ReplicationConfig(broker_id=1), logs, store, ManualClock(0), lambda _t: LogConfig()
        )
        try:
            await logs.create_many("stale", [0], LogConfig())  # held before a restart
            moving = PartitionMeta("t", 0, [2, 1, 3], [2, 3], 2, 0, 1, adding_replicas=[1])
            stale = PartitionMeta("stale", 0, [2], [2], 2, 0, 0)
            topics = [
                TopicMeta("t", "id", 1, 2, {}, 0, 1, [moving]),
                TopicMeta("stale", "id2", 1, 1, {}, 0, 1, [stale]),
            ]
            await rm.apply(1, topics, [])
            assert ("t", 0) in rm.following and logs.topics() == {"t": [0]}
            done = replace(moving, replicas=[2, 3], adding_replicas=[], partition_epoch=2)
            await rm.apply(2, [replace(topics[0], assignments=[done]), topics[1]], [])
            assert ("t", 0) not in rm.following and logs.topics() == {}
            assert not (tmp_path / "data" / "t-0").exists()
        finally:
            await rm.close()
            await logs.close()
            store.close()

    asyncio.run(main())
