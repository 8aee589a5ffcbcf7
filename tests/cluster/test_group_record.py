"""A group's membership record: what a new coordinator resumes from after a failover.

Hypothesis builds groups by random joins, heartbeats, leaves, expiries and partition changes;
the record must survive a JSON round trip unchanged, the restored group must then answer every
further call exactly as the original would (deadlines restarted at the restore), and
:attr:`Group.version` must move whenever the record changes (the coordinator writes only then).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cluster.group import Group
from core_log.errors import LogbusError

MEMBERS = [f"m{i}" for i in range(5)]
TOPICS = ["a", "b"]

ops = st.one_of(
    st.tuples(
        st.just("join"),
        st.sampled_from(MEMBERS),
        st.sets(st.sampled_from(TOPICS), min_size=1),
        st.sampled_from([None, "i0", "i1"]),
        st.sampled_from(["earliest", "latest"]),
    ),
    st.tuples(st.just("reconcile"), st.sampled_from(MEMBERS), st.booleans()),
    st.tuples(st.just("leave"), st.sampled_from(MEMBERS), st.booleans()),
    st.tuples(st.just("tick"), st.integers(0, 12_000)),
    st.tuples(st.just("counts"), st.integers(0, 4), st.integers(0, 4)),
)


class Driver:
    """Applies ops to a group; member ids are made unique per join (as the coordinator does)."""

    def __init__(self, group: Group) -> None:
        self.group = group
        self.now = 0
        self.counts = {"a": 3, "b": 2}
        self.ids: dict[str, str] = {}
        self.joins = 0

    def apply(self, op: tuple[Any, ...]) -> Any:
        g = self.group
        try:
            match op:
                case ("join", who, topics, instance, reset):
                    self.joins += 1
                    member_id = self.ids[who] = f"{who}-{self.joins}"
                    r = g.join(
                        member_id,
                        frozenset(topics),
                        self.counts,
                        self.now,
                        session_timeout_ms=5_000,
                        rebalance_timeout_ms=3_000,
                        instance_id=instance,
                        client_id=who,
                        auto_offset_reset=reset,
                    )
                    return ("ok", r)
                case ("reconcile", who, ack):
                    return ("ok", g.reconcile(self.ids.get(who, who), self.now, ack=ack))
                case ("leave", who, permanent):
                    g.leave(self.ids.get(who, who), self.now, permanent=permanent)
                    return ("ok", None)
                case ("tick", ms):
                    self.now += ms
                    return ("ok", g.expire(self.now))
                case ("counts", a, b):
                    self.counts = {"a": a, "b": b}
                    return ("ok", g.update_partitions(self.counts))
        except LogbusError as e:
            return ("error", e.code)
        raise AssertionError(op)


def restore(group: Group, now_ms: int) -> Group:
    return Group.from_record(group.group_id, orjson.loads(orjson.dumps(group.to_record())), now_ms)


def restart_deadlines(group: Group, now_ms: int) -> None:
    """What a restore does to deadlines, done to the original (the only intended difference)."""
    for m in group.members.values():
        m.deadline_ms = now_ms + m.session_timeout_ms
        m.revoke_deadline_ms = now_ms + m.rebalance_timeout_ms if m.revoking else None


@settings(max_examples=50, deadline=None)
@given(st.lists(ops, max_size=30), st.lists(ops, max_size=30))
def test_a_restored_group_answers_exactly_as_the_original(
    before: list[tuple[Any, ...]], after: list[tuple[Any, ...]]
) -> None:
    original = Driver(Group("g"))
    for op in before:
        original.apply(op)
    doc = original.group.to_record()
    copy = Driver(restore(original.group, original.now))
    assert copy.group.to_record() == doc
    copy.now, copy.counts, copy.ids, copy.joins = (
        original.now,
        dict(original.counts),
        dict(original.ids),
        original.joins,
    )
    restart_deadlines(original.group, original.now)
    for op in after:
        assert copy.apply(op) == original.apply(op), op
        assert copy.group.to_record() == original.group.to_record()
        copy.group.check_invariants()


@settings(max_examples=50, deadline=None)
@given(st.lists(ops, max_size=40))
def test_the_version_moves_whenever_the_record_changes(steps: list[tuple[Any, ...]]) -> None:
    driver = Driver(Group("g"))
    for op in steps:
        record, version = driver.group.to_record(), driver.group.version
        driver.apply(op)
        if driver.group.to_record() != record:
            assert driver.group.version > version, op


def test_restored_members_get_fresh_deadlines() -> None:
    g = Group("g")
    g.join("m", frozenset({"a"}), {"a": 2}, 0, session_timeout_ms=5_000)
    restored = restore(g, 100_000)
    assert restored.expire(104_999) == []
    assert restored.members["m"].owned == {("a", 0), ("a", 1)}
    assert restored.expire(105_000) == ["m"]


@pytest.mark.parametrize(
    "doc",
    [
        {},
        {"v": 2},
        {"v": 1, "epoch": 1},
        {"v": 1, "epoch": 1, "partition_counts": {}, "static": {}, "members": [{}]},
        {"v": 1, "epoch": "x", "partition_counts": [], "static": {}, "members": []},
    ],
)
def test_an_unreadable_record_is_a_value_error(doc: dict[str, Any]) -> None:
    with pytest.raises(ValueError):
        Group.from_record("g", doc, 0)


def test_the_record_holds_every_member_field_it_needs() -> None:
    """A guard for whoever adds a Member field: decide whether the record must carry it."""
    fields = {f.name for f in dataclasses.fields(Group("g").members.get("x") or _member())}
    carried = set(_member_doc())
    runtime = {"deadline_ms", "revoke_deadline_ms", "positions", "poll_cursor"}
    assert fields - runtime == carried - {"target"}


def _member() -> Any:
    g = Group("g")
    g.join("x", frozenset({"a"}), {"a": 1}, 0)
    return g.members["x"]


def _member_doc() -> dict[str, Any]:
    g = Group("g")
    g.join("x", frozenset({"a"}), {"a": 1}, 0)
    members: list[dict[str, Any]] = g.to_record()["members"]
    return members[0]
