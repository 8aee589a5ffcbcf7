"""One consumer group's membership and reconciliation, driven by a fake clock.

Scenario tests follow issue 5's group protocol; a Hypothesis state machine then drives random
joins, heartbeats, polls, leaves, expiries, partition changes and commits, checking after every
step that no partition is ever owned by two members and that a member only gains a partition
nobody else still owns.
"""

from __future__ import annotations

from collections.abc import Iterable

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from cluster import group as group_module
from cluster.assignor import TopicPartition
from cluster.group import (
    SESSION_TIMEOUT_MS_MAX,
    SESSION_TIMEOUT_MS_MIN,
    Group,
    GroupState,
    Reconciled,
)
from core_log.errors import ErrorCode, LogbusError

T = frozenset({"t"})
SIX = {"t": 6}
SESSION_MS = 10_000
REBALANCE_MS = 3_000


# -- helpers -------------------------------------------------------------------------------------


def join(
    group: Group,
    member_id: str,
    now_ms: int,
    *,
    counts: dict[str, int] | None = None,
    topics: frozenset[str] = T,
    session_timeout_ms: int = SESSION_MS,
    rebalance_timeout_ms: int = REBALANCE_MS,
    instance_id: str | None = None,
    auto_offset_reset: str = "latest",
) -> Reconciled:
    return group.join(
        member_id,
        topics,
        SIX if counts is None else counts,
        now_ms,
        session_timeout_ms=session_timeout_ms,
        rebalance_timeout_ms=rebalance_timeout_ms,
        instance_id=instance_id,
        auto_offset_reset=auto_offset_reset,
    )


def heartbeat_rounds(group: Group, member_ids: Iterable[str], now_ms: int, rounds: int) -> None:
    ids = list(member_ids)
    for _ in range(rounds):
        for member_id in ids:
            group.reconcile(member_id, now_ms, ack=True)
            group.check_invariants()


def owned(group: Group) -> dict[str, set[TopicPartition]]:
    return {m.member_id: set(m.owned) for m in group.members.values()}


def stable_group(member_ids: Iterable[str], now_ms: int = 0) -> Group:
    """A group of dynamic members on a 6-partition topic, reconciled to its target."""
    group = Group("g")
    ids = list(member_ids)
    for member_id in ids:
        join(group, member_id, now_ms)
    heartbeat_rounds(group, ids, now_ms, 3)
    assert group.state is GroupState.STABLE
    return group


def error_code(excinfo: pytest.ExceptionInfo[LogbusError]) -> ErrorCode:
    return excinfo.value.code


# -- balance, session timeout, revocation ----------------------------------------------------------


def test_three_members_on_six_partitions_get_two_each() -> None:
    group = Group("g")
    for member_id in "abc":
        join(group, member_id, 0)
    assert group.state is GroupState.RECONCILING
    heartbeat_rounds(group, "abc", 100, 2)  # a releases four, then b and c take two each
    assert group.state is GroupState.STABLE
    assert {m: len(tps) for m, tps in owned(group).items()} == {"a": 2, "b": 2, "c": 2}
    assert set().union(*owned(group).values()) == {("t", p) for p in range(6)}


def test_a_silent_member_loses_its_partitions_only_after_its_session_timeout() -> None:
    group = stable_group("abc")
    c_owned = group.members["c"].owned.copy()
    last_heartbeat_ms = 0
    for now_ms in range(1_000, SESSION_MS, 1_000):  # a and b heartbeat, c is silent
        heartbeat_rounds(group, "ab", now_ms, 1)
        assert group.expire(now_ms) == []
        assert group.members["c"].owned == c_owned
        assert {len(group.members[m].owned) for m in "ab"} == {2}
    assert group.expire(last_heartbeat_ms + SESSION_MS - 1) == []
    assert group.expire(last_heartbeat_ms + SESSION_MS) == ["c"]
    heartbeat_rounds(group, "ab", SESSION_MS, 1)
    assert group.state is GroupState.STABLE
    assert {m: len(tps) for m, tps in owned(group).items()} == {"a": 3, "b": 3}
    with pytest.raises(LogbusError) as excinfo:  # c is told it was fenced: join again
        group.reconcile("c", SESSION_MS, ack=True)
    assert error_code(excinfo) is ErrorCode.FENCED_MEMBER_EPOCH


def test_a_partition_moves_only_after_its_old_owner_acknowledges_the_revocation() -> None:
    group = Group("g")
    assert join(group, "a", 0).assigned == {("t", p) for p in range(6)}
    joined = join(group, "b", 0)
    assert joined.assigned == frozenset()
    assert len(joined.pending) == 3

    told = group.reconcile("a", 10, ack=True)  # a learns what to release
    assert told.revoking == joined.pending
    assert told.released == frozenset()
    assert group.reconcile("b", 20, ack=True).assigned == frozenset()  # still a's
    assert group.reconcile("a", 30, ack=False).revoking == joined.pending  # a poll is no ack

    acked = group.reconcile("a", 40, ack=True)
    assert acked.released == joined.pending
    assert acked.revoking == frozenset()
    got = group.reconcile("b", 50, ack=True)
    assert got.added == joined.pending
    assert group.state is GroupState.STABLE


def test_a_member_that_never_acknowledges_is_removed_after_its_rebalance_timeout() -> None:
    group = Group("g")
    join(group, "a", 0, rebalance_timeout_ms=2_000)
    join(group, "b", 0)
    assert group.reconcile("a", 1_000, ack=False).revoking  # revocation starts at 1,000
    for now_ms in range(1_100, 3_000, 100):  # a keeps polling (its session stays alive)
        group.reconcile("a", now_ms, ack=False)
        assert group.reconcile("b", now_ms, ack=True).assigned == frozenset()  # still a's
        assert group.expire(now_ms) == []
    assert group.next_deadline_ms() == 3_000
    assert group.expire(3_000) == ["a"]
    assert group.reconcile("b", 3_000, ack=True).assigned == {("t", p) for p in range(6)}


def test_after_a_graceful_leave_one_heartbeat_each_reaches_the_target() -> None:
    group = stable_group("abc")
    before = owned(group)
    group.leave("c", 1_000)
    for member_id in "ab":
        result = group.reconcile(member_id, 1_001, ack=True)
        assert result.revoking == frozenset()
        assert result.pending == frozenset()
        assert result.added <= before["c"]
    assert group.state is GroupState.STABLE
    assert owned(group)["a"] >= before["a"]
    assert owned(group)["b"] >= before["b"]


@settings(max_examples=40, deadline=None)
@given(st.integers(2, 6), st.integers(0, 20), st.data())
def test_after_any_graceful_leave_one_heartbeat_round_reaches_the_target(
    members: int, partitions: int, data: st.DataObject
) -> None:
    ids = [f"m{i}" for i in range(members)]
    group = Group("g")
    for member_id in ids:
        join(group, member_id, 0, counts={"t": partitions})
    heartbeat_rounds(group, ids, 0, 3)
    leaver = data.draw(st.sampled_from(ids))
    group.leave(leaver, 1)
    rest = [m for m in ids if m != leaver]
    heartbeat_rounds(group, rest, 2, 1)
    assert group.state is GroupState.STABLE
    sizes = [len(m.owned) for m in group.members.values()]
    assert max(sizes) - min(sizes) <= 1


# -- commits -------------------------------------------------------------------------------------


def test_commit_at_the_current_or_previous_epoch_for_owned_partitions() -> None:
    group = stable_group("ab")
    a = group.members["a"]
    group.check_commit("a", a.epoch, sorted(a.owned))
    group.check_commit("a", a.previous_epoch, sorted(a.owned))
    group.check_commit("a", a.epoch, [])


def test_a_stale_generation_is_illegal() -> None:
    group = stable_group("ab")
    a = group.members["a"]
    for stale in (a.previous_epoch - 1, a.epoch + 1):
        with pytest.raises(LogbusError) as excinfo:
            group.check_commit("a", stale, sorted(a.owned))
        assert error_code(excinfo) is ErrorCode.ILLEGAL_GENERATION
    with pytest.raises(LogbusError) as excinfo:
        group.check_commit("a", None, [])
    assert error_code(excinfo) is ErrorCode.ILLEGAL_GENERATION


def test_a_commit_for_a_partition_not_owned_is_fenced() -> None:
    group = stable_group("ab")
    a, b = group.members["a"], group.members["b"]
    with pytest.raises(LogbusError) as excinfo:
        group.check_commit("a", a.epoch, [*sorted(a.owned), min(b.owned)])
    assert error_code(excinfo) is ErrorCode.FENCED_MEMBER_EPOCH
    with pytest.raises(LogbusError) as excinfo:
        group.check_commit("a", a.epoch, [("t", 99)])
    assert error_code(excinfo) is ErrorCode.FENCED_MEMBER_EPOCH


def test_a_partition_being_revoked_may_be_committed_until_released() -> None:
    group = Group("g")
    join(group, "a", 0)
    join(group, "b", 0)
    revoking = sorted(group.reconcile("a", 1, ack=True).revoking)
    a = group.members["a"]
    group.check_commit("a", a.epoch, revoking)
    group.reconcile("a", 2, ack=True)
    with pytest.raises(LogbusError) as excinfo:
        group.check_commit("a", a.epoch, revoking)
    assert error_code(excinfo) is ErrorCode.FENCED_MEMBER_EPOCH
    group.check_commit("a", a.previous_epoch, sorted(a.owned))  # a reply may be in flight


def test_an_unknown_member_is_rejected() -> None:
    group = stable_group("ab")
    with pytest.raises(LogbusError) as excinfo:
        group.check_commit("zz", 1, [])
    assert error_code(excinfo) is ErrorCode.UNKNOWN_MEMBER_ID
    group.leave("b", 1)
    for call in (
        lambda: group.check_commit("b", 1, []),
        lambda: group.reconcile("b", 2, ack=True),
        lambda: group.leave("b", 2),
    ):
        with pytest.raises(LogbusError) as excinfo:
            call()
        assert error_code(excinfo) is ErrorCode.UNKNOWN_MEMBER_ID


def test_a_timed_out_member_is_told_it_was_fenced() -> None:
    group = stable_group("ab")
    heartbeat_rounds(group, "a", SESSION_MS, 1)
    assert group.expire(SESSION_MS) == ["b"]
    for call in (
        lambda: group.check_commit("b", 1, []),
        lambda: group.reconcile("b", SESSION_MS, ack=True),
        lambda: group.leave("b", SESSION_MS),
    ):
        with pytest.raises(LogbusError) as excinfo:
            call()
        assert error_code(excinfo) is ErrorCode.FENCED_MEMBER_EPOCH


def test_standalone_commits_only_without_active_members() -> None:
    group = Group("g")
    group.check_commit(None, None, [("t", 0)])  # a group nobody joined
    join(group, "a", 0)
    with pytest.raises(LogbusError) as excinfo:
        group.check_commit(None, None, [("t", 0)])
    assert error_code(excinfo) is ErrorCode.UNKNOWN_MEMBER_ID
    group.leave("a", 1)
    group.check_commit(None, None, [("t", 0)])


def test_a_departed_static_member_does_not_block_standalone_commits() -> None:
    group = Group("g")
    join(group, "a", 0, instance_id="i")
    group.leave("a", 1)
    assert not group.active
    group.check_commit(None, None, [("t", 0)])


# -- static members ------------------------------------------------------------------------------


def test_a_static_member_back_within_its_session_gets_its_partitions_at_once() -> None:
    group = Group("g")
    join(group, "a1", 0, instance_id="ia")
    for member_id in "bc":
        join(group, member_id, 0)
    heartbeat_rounds(group, ["a1", "b", "c"], 0, 3)
    before, epoch = owned(group), group.epoch
    a_epoch = group.members["a1"].epoch

    group.leave("a1", 1_000)  # a restart
    heartbeat_rounds(group, "bc", 2_000, 2)
    assert owned(group) == before  # nobody takes a's partitions meanwhile
    assert group.expire(1_000 + SESSION_MS - 1) == []

    back = join(group, "a2", 1_000 + SESSION_MS - 1, instance_id="ia")
    assert back.assigned == before["a1"]
    assert back.revoking == back.pending == frozenset()
    assert back.epoch == a_epoch
    assert group.epoch == epoch  # no rebalance: b and c are not disturbed
    assert group.state is GroupState.STABLE
    for member_id in "bc":
        result = group.reconcile(member_id, 1_000 + SESSION_MS, ack=True)
        assert result.added == result.revoking == result.released == frozenset()
    with pytest.raises(LogbusError) as excinfo:
        group.reconcile("a1", 1_000 + SESSION_MS, ack=True)
    assert error_code(excinfo) is ErrorCode.UNKNOWN_MEMBER_ID


def test_a_static_member_not_back_in_time_has_its_partitions_reassigned() -> None:
    group = Group("g")
    join(group, "a1", 0, instance_id="ia")
    join(group, "b", 0)
    heartbeat_rounds(group, ["a1", "b"], 0, 3)
    group.leave("a1", 1_000)
    heartbeat_rounds(group, "b", 1_000 + SESSION_MS - 1, 1)
    assert len(group.members["b"].owned) == 3
    assert group.expire(1_000 + SESSION_MS) == ["a1"]
    heartbeat_rounds(group, "b", 1_000 + SESSION_MS, 1)
    assert len(group.members["b"].owned) == 6
    late = join(group, "a2", 1_000 + SESSION_MS + 1, instance_id="ia")
    assert late.assigned == frozenset()  # a fresh member: b must release first
    assert len(late.pending) == 3


def test_a_static_member_leaving_for_good_frees_its_partitions_at_once() -> None:
    group = Group("g")
    join(group, "a1", 0, instance_id="ia")
    join(group, "b", 0)
    heartbeat_rounds(group, ["a1", "b"], 0, 3)
    group.leave("a1", 1_000, permanent=True)
    assert "a1" not in group.members
    assert group.reconcile("b", 1_001, ack=True).assigned == {("t", p) for p in range(6)}


def test_a_static_rejoin_fences_the_old_member_still_active() -> None:
    group = Group("g")
    join(group, "a1", 0, instance_id="ia")
    a_owned = set(group.members["a1"].owned)
    back = join(group, "a2", 10, instance_id="ia")
    assert back.assigned == a_owned
    assert set(group.members) == {"a2"}
    with pytest.raises(LogbusError) as excinfo:
        group.check_commit("a1", 1, [])
    assert error_code(excinfo) is ErrorCode.UNKNOWN_MEMBER_ID


# -- limits and validation -----------------------------------------------------------------------


def test_the_group_size_is_capped(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(group_module, "MAX_MEMBERS", 3)
    group = Group("g")
    join(group, "a", 0, instance_id="ia")
    join(group, "b", 0)
    join(group, "c", 0)
    with pytest.raises(LogbusError) as excinfo:
        join(group, "d", 0)
    assert error_code(excinfo) is ErrorCode.GROUP_MAX_SIZE_REACHED
    assert "d" not in group.members
    join(group, "a2", 1, instance_id="ia")  # a static member coming back takes its own place
    group.leave("b", 2)
    join(group, "d", 3)


@pytest.mark.parametrize(
    ("session_timeout_ms", "rebalance_timeout_ms"),
    [
        (SESSION_TIMEOUT_MS_MIN - 1, REBALANCE_MS),
        (SESSION_TIMEOUT_MS_MAX + 1, REBALANCE_MS),
        (0, REBALANCE_MS),
        (-1, REBALANCE_MS),
        (SESSION_MS, SESSION_TIMEOUT_MS_MIN - 1),
        (SESSION_MS, SESSION_TIMEOUT_MS_MAX + 1),
    ],
)
def test_invalid_timeouts_are_rejected(session_timeout_ms: int, rebalance_timeout_ms: int) -> None:
    group = Group("g")
    with pytest.raises(LogbusError) as excinfo:
        join(
            group,
            "a",
            0,
            session_timeout_ms=session_timeout_ms,
            rebalance_timeout_ms=rebalance_timeout_ms,
        )
    assert error_code(excinfo) is ErrorCode.INVALID_SESSION_TIMEOUT
    assert group.members == {}
    assert group.epoch == 0


def test_timeouts_at_the_limits_are_accepted() -> None:
    group = Group("g")
    join(group, "a", 0, session_timeout_ms=SESSION_TIMEOUT_MS_MIN)
    join(group, "b", 0, session_timeout_ms=SESSION_TIMEOUT_MS_MAX)
    assert group.next_deadline_ms() == SESSION_TIMEOUT_MS_MIN


@pytest.mark.parametrize(
    ("topics", "auto_offset_reset"),
    [(frozenset(), "latest"), (T, "sometimes")],
)
def test_invalid_joins_are_rejected(topics: frozenset[str], auto_offset_reset: str) -> None:
    group = Group("g")
    with pytest.raises(LogbusError) as excinfo:
        join(group, "a", 0, topics=topics, auto_offset_reset=auto_offset_reset)
    assert error_code(excinfo) is ErrorCode.INVALID_REQUEST
    assert group.members == {}


# -- state and partitions ------------------------------------------------------------------------


def test_state_goes_empty_reconciling_stable_and_back_to_empty() -> None:
    group = Group("g")
    assert group.state is GroupState.EMPTY
    assert group.next_deadline_ms() is None
    join(group, "a", 0)
    assert group.state is GroupState.STABLE  # alone, it takes everything at once
    join(group, "b", 0)
    assert group.state is GroupState.RECONCILING
    heartbeat_rounds(group, "ab", 1, 1)
    assert group.state is GroupState.RECONCILING  # a is releasing
    heartbeat_rounds(group, "ab", 2, 1)
    assert group.state is GroupState.STABLE
    group.leave("a", 3)
    assert group.state is GroupState.RECONCILING  # b has not picked up a's partitions yet
    assert group.empty_since_ms is None
    group.leave("b", 4)
    assert group.state is GroupState.EMPTY
    assert group.empty_since_ms == 4
    join(group, "c", 5)
    assert group.empty_since_ms is None


def test_the_group_epoch_bumps_on_every_input_change() -> None:
    group = Group("g")
    join(group, "a", 0)
    assert group.epoch == 1
    join(group, "b", 0)
    assert group.epoch == 2
    assert not group.update_partitions(SIX)
    assert group.epoch == 2
    assert group.update_partitions({"t": 8})
    assert group.epoch == 3
    group.leave("b", 1)
    assert group.epoch == 4
    assert group.members["a"].epoch <= group.epoch


def test_new_partitions_go_out_without_moving_existing_ones() -> None:
    group = stable_group("abc")
    before = owned(group)
    assert group.update_partitions({"t": 9})
    heartbeat_rounds(group, "abc", 1, 1)
    assert group.state is GroupState.STABLE
    for member_id, tps in owned(group).items():
        assert tps >= before[member_id]
        assert len(tps) == 3


def test_a_deleted_topic_drops_its_partitions_from_every_member() -> None:
    group = Group("g")
    join(group, "a", 0, topics=frozenset({"t", "u"}), counts={"t": 2, "u": 2})
    join(group, "b", 0, topics=frozenset({"t", "u"}), counts={"t": 2, "u": 2})
    heartbeat_rounds(group, "ab", 1, 3)
    assert group.update_partitions({"t": 0, "u": 2})
    assert all(tp[0] == "u" for m in group.members.values() for tp in m.owned)
    assert all(tp[0] == "u" for tps in group.target.values() for tp in tps)
    heartbeat_rounds(group, "ab", 2, 3)
    assert group.state is GroupState.STABLE
    assert {len(m.owned) for m in group.members.values()} == {1}


def test_partition_counts_of_unsubscribed_topics_are_ignored() -> None:
    group = stable_group("ab")
    assert not group.update_partitions({**SIX, "other": 4})
    assert "other" not in group.subscribed_topics()


# -- known bugs ----------------------------------------------------------------------------------


def test_a_heartbeating_member_survives_the_deletion_of_partitions_it_was_releasing() -> None:
    group = Group("g")
    join(group, "a", 0, rebalance_timeout_ms=1_000)
    join(group, "b", 0)
    assert group.reconcile("a", 0, ack=True).revoking  # a is to release 3 partitions by 1,000
    assert group.update_partitions({"t": 0})  # the topic is deleted
    assert group.members["a"].revoking == set()
    for now_ms in range(100, 2_000, 100):
        heartbeat_rounds(group, "ab", now_ms, 1)
        assert group.expire(now_ms) == []


def test_partitions_added_while_a_static_member_was_away_are_assigned() -> None:
    group = Group("g")
    join(group, "s1", 0, instance_id="i", counts={"t": 4})
    group.leave("s1", 10)
    join(group, "s2", 20, instance_id="i", counts=SIX)  # t grew to 6 meanwhile
    group.update_partitions(SIX)
    heartbeat_rounds(group, ["s2"], 30, 2)
    assert group.members["s2"].owned == {("t", p) for p in range(6)}


def test_a_join_seeing_fewer_partitions_leaves_no_member_owning_missing_ones() -> None:
    group = Group("g")
    join(group, "a", 0, counts={"t": 4})
    join(group, "b", 1, counts={"t": 2})  # t was deleted and re-created with 2 partitions
    for m in group.members.values():
        assert all(p < 2 for _, p in m.owned), (m.member_id, m.owned)


# -- state machine -------------------------------------------------------------------------------

TOPICS = ("x", "y")
INSTANCES = ("i0", "i1", "i2")


class GroupMachine(RuleBasedStateMachine):
    """Random membership traffic against one group, on a fake clock."""

    def __init__(self) -> None:
        super().__init__()
        self.group = Group("g")
        self.now_ms = 0
        self.counts = {"x": 4, "y": 3}
        self.serial = 0
        self.epoch = 0
        self.seen_ids: list[str] = []
        self.snapshot = self._owners()
        self.instances: dict[str, str | None] = {}  # member id → instance id, ever seen
        self.expired: set[str] = set()  # ids removed by expire(): answered FENCED_MEMBER_EPOCH

    # -- helpers --

    def _owners(self) -> dict[TopicPartition, str]:
        return {tp: m.member_id for m in self.group.members.values() for tp in m.owned}

    def _live(self) -> list[str]:
        return sorted(m.member_id for m in self.group.members.values() if not m.departed)

    # -- rules --

    @rule(ms=st.integers(0, 3_000))
    def advance(self, ms: int) -> None:
        self.now_ms += ms

    @rule(
        topics=st.frozensets(st.sampled_from(TOPICS), min_size=1),
        instance_id=st.none() | st.sampled_from(INSTANCES),
        session_timeout_ms=st.sampled_from([500, 2_000, 6_000]),
        rebalance_timeout_ms=st.sampled_from([300, 4_000]),
    )
    def join(
        self,
        topics: frozenset[str],
        instance_id: str | None,
        session_timeout_ms: int,
        rebalance_timeout_ms: int,
    ) -> None:
        self.serial += 1
        member_id = f"m{self.serial}"
        old = next(
            (
                m
                for m in self.group.members.values()
                if instance_id is not None and m.instance_id == instance_id
            ),
            None,
        )
        old_owned = set(old.owned) if old else set()
        epoch = self.group.epoch
        result = self.group.join(
            member_id,
            topics,
            {t: self.counts[t] for t in topics},
            self.now_ms,
            session_timeout_ms=session_timeout_ms,
            rebalance_timeout_ms=rebalance_timeout_ms,
            instance_id=instance_id,
        )
        self.seen_ids.append(member_id)
        self.instances[member_id] = instance_id
        member = self.group.members[member_id]
        assert result.epoch == member.epoch
        assert result.assigned | result.revoking == member.owned
        if old is not None:  # the same instance again takes over its partitions
            assert old.member_id not in self.group.members
            assert old_owned <= member.owned <= old_owned | result.added
            if old.topics == topics:  # same subscription: nobody else is disturbed
                assert self.group.epoch == epoch

    @precondition(lambda self: bool(self._live()))
    @rule(data=st.data())
    def heartbeat(self, data: st.DataObject) -> None:
        member_id = data.draw(st.sampled_from(self._live()))
        revoking = set(self.group.members[member_id].revoking)
        result = self.group.reconcile(member_id, self.now_ms, ack=True)
        assert result.released == revoking
        assert result.added <= self.group.target[member_id]

    @precondition(lambda self: bool(self._live()))
    @rule(data=st.data())
    def poll(self, data: st.DataObject) -> None:
        member_id = data.draw(st.sampled_from(self._live()))
        before = set(self.group.members[member_id].owned)
        result = self.group.reconcile(member_id, self.now_ms, ack=False)
        assert result.released == frozenset()
        assert before <= self.group.members[member_id].owned  # a poll never drops anything

    @precondition(lambda self: bool(self._live()))
    @rule(data=st.data(), permanent=st.booleans())
    def leave(self, data: st.DataObject, permanent: bool) -> None:
        member_id = data.draw(st.sampled_from(self._live()))
        member = self.group.members[member_id]
        owned_before = set(member.owned)
        self.group.leave(member_id, self.now_ms, permanent=permanent)
        if member.instance_id is not None and not permanent:
            assert self.group.members[member_id].owned == owned_before  # kept for its return
            with pytest.raises(LogbusError) as excinfo:
                self.group.reconcile(member_id, self.now_ms, ack=True)
            assert excinfo.value.code is ErrorCode.UNKNOWN_MEMBER_ID
        else:
            assert member_id not in self.group.members

    @rule()
    def expire(self) -> None:
        members = dict(self.group.members)
        gone = self.group.expire(self.now_ms)
        self.expired.update(gone)
        for member_id in gone:
            m = members[member_id]
            assert self.now_ms >= m.deadline_ms or (
                m.revoke_deadline_ms is not None and self.now_ms >= m.revoke_deadline_ms
            )
            assert member_id not in self.group.members
        for m in self.group.members.values():
            assert m.deadline_ms > self.now_ms
            assert m.revoke_deadline_ms is None or m.revoke_deadline_ms > self.now_ms

    @rule(topic=st.sampled_from(TOPICS), count=st.integers(0, 6))
    def update_partitions(self, topic: str, count: int) -> None:
        self.counts[topic] = count
        epoch = self.group.epoch
        changed = self.group.update_partitions(self.counts)
        assert self.group.epoch == epoch + changed

    @rule(
        data=st.data(),
        generation_offset=st.sampled_from([0, -1, 1, "previous"]),
        foreign=st.booleans(),
    )
    def check_commit(self, data: st.DataObject, generation_offset: object, foreign: bool) -> None:
        member_id = data.draw(st.sampled_from([None, "never-joined", *self.seen_ids]))
        member = self.group.members.get(member_id) if member_id else None
        if member_id is None:
            expected = ErrorCode.UNKNOWN_MEMBER_ID if self.group.active else None
            generation = None
            partitions: list[TopicPartition] = []
        elif member is None and member_id in self.expired:
            expected, generation, partitions = ErrorCode.FENCED_MEMBER_EPOCH, 0, []
        elif member is None or member.departed:
            expected, generation, partitions = ErrorCode.UNKNOWN_MEMBER_ID, 0, []
        else:
            if generation_offset == "previous":
                generation = member.previous_epoch
            else:
                assert isinstance(generation_offset, int)
                generation = member.epoch + generation_offset
            partitions = sorted(member.owned)
            others = set(self._owners()) - member.owned
            if foreign and others:
                partitions.append(min(others))
            if generation not in (member.epoch, member.previous_epoch):
                expected = ErrorCode.ILLEGAL_GENERATION
            elif foreign and others:
                expected = ErrorCode.FENCED_MEMBER_EPOCH
            else:
                expected = None
        if expected is None:
            self.group.check_commit(member_id, generation, partitions)
        else:
            with pytest.raises(LogbusError) as excinfo:
                self.group.check_commit(member_id, generation, partitions)
            assert excinfo.value.code is expected

    @rule()
    def settle(self) -> None:
        """Every live member heartbeats three rounds with the clock stopped: the group
        reaches its target unless a departed static member holds partitions it cannot
        release."""
        for _ in range(3):
            for member_id in self._live():
                self.group.reconcile(member_id, self.now_ms, ack=True)
                self.group_invariants()
                self.gains_only_what_nobody_else_still_owns()
        if any(m.departed for m in self.group.members.values()):
            return
        expected = GroupState.STABLE if self.group.members else GroupState.EMPTY
        assert self.group.state is expected
        subscriptions = {m.topics for m in self.group.members.values()}
        if len(subscriptions) == 1:
            sizes = [len(m.owned) for m in self.group.members.values()]
            assert max(sizes) - min(sizes) <= 1

    # -- invariants, after every step --

    @invariant()
    def group_invariants(self) -> None:
        self.group.check_invariants()
        owners: dict[TopicPartition, str] = {}
        for m in self.group.members.values():
            assert m.revoking <= m.owned
            for tp in m.owned:
                assert tp not in owners, f"{tp} owned by {owners[tp]} and {m.member_id}"
                owners[tp] = m.member_id
                assert tp[1] < self.counts[tp[0]], f"{m.member_id} owns missing {tp}"
            assert m.epoch <= self.group.epoch
        assert set(self.group.target) == set(self.group.members)
        assert self.group.epoch >= self.epoch
        self.epoch = self.group.epoch

    @invariant()
    def gains_only_what_nobody_else_still_owns(self) -> None:
        """A member gains a partition only if no other member held it before this step, or
        the holder was the same static instance and is gone now (it took over)."""
        now = self._owners()
        for tp, member_id in now.items():
            previous = self.snapshot.get(tp)
            if previous is None or previous == member_id:
                continue
            assert previous not in self.group.members, (
                f"{member_id} gained {tp} while {previous} still owns it"
            )
            assert self.instances.get(previous) is not None
            assert self.instances[previous] == self.instances.get(member_id), (
                f"{member_id} gained {tp} straight from {previous}"
            )
        self.snapshot = now


GroupMachine.TestCase.settings = settings(max_examples=150, stateful_step_count=50, deadline=None)
test_group_state_machine = GroupMachine.TestCase


def test_deleting_a_topic_a_static_member_left_drops_its_partitions() -> None:
    """Found by the state machine: a static member rejoins with a smaller subscription and
    still owns partitions of the topic it left; deleting that topic must drop them."""
    g = Group("g")
    g.join("m1", frozenset({"x", "y"}), {"x": 1, "y": 2}, 0, instance_id="i1")
    g.join("m2", frozenset({"x"}), {"x": 1, "y": 2}, 1, instance_id="i1")
    assert ("y", 1) in g.members["m2"].owned
    assert g.update_partitions({"x": 1, "y": 0})
    assert all(tp[0] == "x" for tp in g.members["m2"].owned)
    g.check_invariants()
