"""The controller's pure decisions: replica placement and leader election."""

from __future__ import annotations

from collections import Counter

from hypothesis import given
from hypothesis import strategies as st

from cluster.controller import assign_replicas, decide
from cluster.metadata import PartitionMeta
from cluster.replication import NO_LEADER

brokers_st = st.lists(
    st.tuples(st.integers(1, 50), st.sampled_from([None, "a", "b", "c"])),
    min_size=1,
    max_size=9,
    unique_by=lambda b: b[0],
)


@given(brokers_st, st.integers(1, 60), st.integers(1, 5), st.integers(0, 100))
def test_placement_spreads_replicas_racks_and_leaders(
    brokers: list[tuple[int, str | None]], partitions: int, rf: int, start: int
) -> None:
    if rf > len(brokers):
        return
    rack_of = dict(brokers)
    racks = len(set(rack_of.values()))
    plan = assign_replicas(brokers, partitions, rf, start)
    assert len(plan) == partitions
    for replicas in plan:
        assert len(replicas) == rf == len(set(replicas))
        assert len({rack_of[b] for b in replicas}) == min(rf, racks)
    leaders = Counter(r[0] for r in plan)
    if partitions >= len(brokers):
        assert max(leaders.values()) - min(leaders.get(b, 0) for b, _ in brokers) <= 1


def test_placement_refuses_more_replicas_than_brokers() -> None:
    try:
        assign_replicas([(1, None), (2, None)], 1, 3, 0)
    except ValueError as e:
        assert "replication factor 3" in str(e)
    else:
        raise AssertionError("no error")


def _row(leader: int = 1, isr: list[int] | None = None, epoch: int = 4) -> PartitionMeta:
    return PartitionMeta("t", 0, [1, 2, 3], isr or [1, 2, 3], leader, epoch, 10)


def test_a_live_leader_with_its_isr_is_left_alone() -> None:
    assert decide(_row(), {1, 2, 3}, False, False) is None


def test_fenced_followers_leave_the_isr_without_a_leader_change() -> None:
    new = decide(_row(), {1, 2}, False, False)
    assert new is not None
    assert (new.leader, new.isr, new.leader_epoch, new.partition_epoch) == (1, [1, 2], 4, 11)


def test_a_fenced_leader_is_replaced_from_the_isr_with_a_new_epoch() -> None:
    new = decide(_row(isr=[1, 3]), {2, 3}, False, False)
    assert new is not None
    assert (new.leader, new.isr, new.leader_epoch) == (3, [3], 5)  # 2 is live but not in ISR


def test_no_live_isr_member_without_unclean_election_goes_offline() -> None:
    new = decide(_row(isr=[1]), {2, 3}, False, False)
    assert new is not None
    assert (new.leader, new.isr, new.leader_epoch, new.unclean_elections) == (NO_LEADER, [1], 5, 0)
    assert decide(new, {2, 3}, False, False) is None  # stays offline, nothing rewritten
    back = decide(new, {1, 2, 3}, False, False)  # the last ISR member returns and leads
    assert back is not None and (back.leader, back.isr, back.leader_epoch) == (1, [1], 6)


def test_unclean_election_picks_a_live_replica_and_counts_it() -> None:
    offline = decide(_row(isr=[1]), {2, 3}, False, False)
    assert offline is not None
    new = decide(offline, {2, 3}, True, False)
    assert new is not None
    assert (new.leader, new.isr, new.unclean_elections) == (2, [2], 1)


def test_preferred_leader_returns_only_when_in_sync_and_asked() -> None:
    row = _row(leader=2, isr=[1, 2, 3])
    assert decide(row, {1, 2, 3}, False, False) is None
    new = decide(row, {1, 2, 3}, False, True)
    assert new is not None and (new.leader, new.leader_epoch) == (1, 5)
    assert decide(_row(leader=2, isr=[2, 3]), {1, 2, 3}, False, True) is None  # 1 not in ISR
