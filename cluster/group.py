"""One consumer group's membership and assignment, reconciled the KIP-848 way (sans-I/O).

Theory of operation
-------------------
* The **group epoch** goes up whenever the inputs of the assignment change: a member joins,
  leaves, times out or changes its subscription, or a subscribed topic gains partitions. Each
  bump recomputes the **target assignment** (:func:`cluster.assignor.assign`).
* A member never jumps to its target. It **owns** a set of partitions; on every heartbeat (and
  every poll) it is reconciled towards the target:

  - partitions it owns but should not are put in ``revoking``: it is told to release them and
    keeps them (it may still commit their offsets) until it **acknowledges** with a later
    heartbeat — or is removed when it does not within its rebalance timeout;
  - partitions of its target are added only once no other member owns them (released, or the
    old owner timed out). So **no partition is ever owned by two members**; this invariant is
    checked by :meth:`Group.check_invariants` in the tests after every step.

* The **member epoch** (the "generation" clients send with commits) takes the group epoch
  whenever the member's owned set changes. A commit is accepted from the member's current or
  previous epoch (a response carrying the new epoch may still be on its way) and only for
  partitions it owns; anything else is ``ILLEGAL_GENERATION`` / ``FENCED_MEMBER_EPOCH``.
* **Static members** (``instance_id``): leaving keeps their partitions, unassigned to anyone
  else, until the session timeout; a join with the same ``instance_id`` takes them back at once
  (and fences the old member id).
* Time comes in as ``now_ms`` arguments; nothing here sleeps, reads a clock or does I/O.
* **Persistence.** :meth:`Group.to_record` is everything a coordinator needs to resume the
  group elsewhere (epochs, members, owned/revoking/target partitions, partition counts);
  :meth:`Group.from_record` rebuilds it with every deadline restarted at ``now_ms`` (the new
  coordinator never saw the members' last heartbeats). :attr:`Group.version` goes up whenever
  the record would change, so a coordinator writes only real changes. Not in the record: fetch
  positions (a restored member reads from its committed offsets: at least once).
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from core_log.errors import ErrorCode, LogbusError

from .assignor import TopicPartition, assign

MAX_MEMBERS = 1_000  # per group; past it, joins get GROUP_MAX_SIZE_REACHED
MAX_TOPICS_PER_MEMBER = 1_000
MAX_FENCED_REMEMBERED = 1_000  # per group: ids of timed-out members, to answer them clearly
SESSION_TIMEOUT_MS_MIN = 100  # short sessions are for tests; Kafka's default floor is 6 s
SESSION_TIMEOUT_MS_MAX = 1_800_000
SESSION_TIMEOUT_MS_DEFAULT = 45_000  # KIP-848's group.consumer.session.timeout.ms
REBALANCE_TIMEOUT_MS_DEFAULT = 60_000
OFFSET_RESETS = ("earliest", "latest", "none")


class GroupState(enum.Enum):
    EMPTY = "empty"
    RECONCILING = "reconciling"
    STABLE = "stable"


@dataclass
class Member:
    member_id: str
    topics: frozenset[str]
    session_timeout_ms: int
    rebalance_timeout_ms: int
    deadline_ms: int
    instance_id: str | None = None
    client_id: str | None = None
    auto_offset_reset: str = "latest"
    epoch: int = 0
    previous_epoch: int = -1
    owned: set[TopicPartition] = field(default_factory=set)
    revoking: set[TopicPartition] = field(default_factory=set)
    revoke_deadline_ms: int | None = None
    departed: bool = False  # a static member that left; its partitions wait for it
    positions: dict[TopicPartition, int] = field(default_factory=dict)  # next fetch offsets
    poll_cursor: int = 0  # which assigned partition a poll reads first (round robin)

    @property
    def fetchable(self) -> set[TopicPartition]:
        """What the member may read now: owned and not being released."""
        return self.owned - self.revoking


@dataclass(frozen=True)
class Reconciled:
    """What a heartbeat or poll tells the member."""

    member_id: str
    epoch: int
    assigned: frozenset[TopicPartition]  # owned and not being revoked
    revoking: frozenset[TopicPartition]  # release these, then heartbeat
    pending: frozenset[TopicPartition]  # in the target, waiting for their old owner
    added: frozenset[TopicPartition]  # newly owned by this call
    released: frozenset[TopicPartition]  # revocations this call acknowledged


class Group:
    def __init__(self, group_id: str) -> None:
        self.group_id = group_id
        self.epoch = 0
        self.members: dict[str, Member] = {}
        self.target: dict[str, set[TopicPartition]] = {}
        self._static: dict[str, str] = {}  # instance id → member id
        self._partition_counts: dict[str, int] = {}
        self.empty_since_ms: int | None = None
        self._fenced: dict[str, None] = {}  # insertion-ordered, bounded
        self.version = 0  # bumped whenever to_record() would change (not persisted)

    # -- membership ------------------------------------------------------------------------------

    def join(
        self,
        member_id: str,
        topics: frozenset[str],
        partition_counts: Mapping[str, int],
        now_ms: int,
        *,
        session_timeout_ms: int = SESSION_TIMEOUT_MS_DEFAULT,
        rebalance_timeout_ms: int = REBALANCE_TIMEOUT_MS_DEFAULT,
        instance_id: str | None = None,
        client_id: str | None = None,
        auto_offset_reset: str = "latest",
    ) -> Reconciled:
        """Add a member (``member_id`` is chosen by the caller, unique) and reconcile it."""
        _check_session(session_timeout_ms, rebalance_timeout_ms)
        if not topics or len(topics) > MAX_TOPICS_PER_MEMBER:
            raise LogbusError(
                f"a member subscribes to 1..{MAX_TOPICS_PER_MEMBER} topics",
                code=ErrorCode.INVALID_REQUEST,
            )
        if auto_offset_reset not in OFFSET_RESETS:
            raise LogbusError(
                f"auto_offset_reset must be one of {', '.join(OFFSET_RESETS)}",
                code=ErrorCode.INVALID_REQUEST,
            )
        old = self.members.get(self._static.get(instance_id, "")) if instance_id else None
        if old is None and len(self.members) >= MAX_MEMBERS:
            raise LogbusError(
                f"group {self.group_id!r} has the maximum of {MAX_MEMBERS} members",
                code=ErrorCode.GROUP_MAX_SIZE_REACHED,
            )
        assert member_id not in self.members, "member ids are unique"
        member = Member(
            member_id=member_id,
            topics=topics,
            session_timeout_ms=session_timeout_ms,
            rebalance_timeout_ms=rebalance_timeout_ms,
            deadline_ms=now_ms + session_timeout_ms,
            instance_id=instance_id,
            client_id=client_id,
            auto_offset_reset=auto_offset_reset,
        )
        self.members[member_id] = member
        self.empty_since_ms = None
        if old is not None:
            # The same instance again: it takes over the old member's partitions at once.
            del self.members[old.member_id]
            member.owned = old.owned
            member.revoking = old.revoking
            member.revoke_deadline_ms = old.revoke_deadline_ms
            member.epoch = old.epoch
            self.target[member_id] = self.target.pop(old.member_id, set())
        if instance_id is not None:
            self._static[instance_id] = member_id
        counts_changed = self._apply_counts(partition_counts)
        if old is None or old.topics != topics or counts_changed:
            self._rebalance()
        self.version += 1
        return self.reconcile(member_id, now_ms, ack=False)

    def leave(self, member_id: str, now_ms: int, *, permanent: bool = False) -> None:
        """A member leaves. A static member's partitions wait for it until its session times
        out, unless ``permanent``."""
        member = self.member(member_id)
        if member.instance_id is not None and not permanent:
            member.departed = True
            member.deadline_ms = now_ms + member.session_timeout_ms
            self.version += 1
            return
        self._remove(member_id, now_ms)

    def expire(self, now_ms: int) -> list[str]:
        """Remove members whose session ran out, or who did not release revoked partitions
        within their rebalance timeout. Returns their ids."""
        gone = [
            m.member_id
            for m in self.members.values()
            if now_ms >= m.deadline_ms
            or (m.revoke_deadline_ms is not None and now_ms >= m.revoke_deadline_ms)
        ]
        for member_id in gone:
            self._remove(member_id, now_ms)
            self._fenced[member_id] = None
            self.version += 1
            if len(self._fenced) > MAX_FENCED_REMEMBERED:
                del self._fenced[next(iter(self._fenced))]
        return gone

    def next_deadline_ms(self) -> int | None:
        deadlines = [m.deadline_ms for m in self.members.values()]
        deadlines += [
            m.revoke_deadline_ms for m in self.members.values() if m.revoke_deadline_ms is not None
        ]
        return min(deadlines, default=None)

    def _remove(self, member_id: str, now_ms: int) -> None:
        member = self.members.pop(member_id)
        self.target.pop(member_id, None)
        if member.instance_id is not None and self._static.get(member.instance_id) == member_id:
            del self._static[member.instance_id]
        if not self.members:
            self.empty_since_ms = now_ms
        self._rebalance()
        self.version += 1

    def member(self, member_id: str) -> Member:
        member = self.members.get(member_id)
        if member is None and member_id in self._fenced:
            raise LogbusError(
                f"member {member_id!r} of group {self.group_id!r} was fenced: its session or "
                f"rebalance timeout ran out and its partitions went to others; join again",
                code=ErrorCode.FENCED_MEMBER_EPOCH,
            )
        if member is None or member.departed:
            raise LogbusError(
                f"group {self.group_id!r} has no member {member_id!r} (it left or its session "
                f"timed out); join again",
                code=ErrorCode.UNKNOWN_MEMBER_ID,
            )
        return member

    # -- assignment ------------------------------------------------------------------------------

    def update_partitions(self, partition_counts: Mapping[str, int]) -> bool:
        """New partition counts for subscribed topics (a topic absent or 0 has none, e.g.
        deleted). Rebalances and returns True if anything changed."""
        if not self._apply_counts({t: partition_counts.get(t, 0) for t in self.known_topics()}):
            return False
        self._rebalance()
        return True

    def _apply_counts(self, partition_counts: Mapping[str, int]) -> bool:
        """Record new partition counts; members drop partitions that no longer exist."""
        changed = {
            t: n for t, n in partition_counts.items() if n != self._partition_counts.get(t, 0)
        }
        if not changed:
            return False
        self._partition_counts.update(changed)
        self.version += 1
        for member in self.members.values():
            for tp in list(member.owned):
                if tp[1] >= self._partition_counts.get(tp[0], 0):  # the topic shrank or is gone
                    member.owned.discard(tp)
                    member.revoking.discard(tp)
                    member.positions.pop(tp, None)
            if not member.revoking:
                member.revoke_deadline_ms = None
        return True

    def subscribed_topics(self) -> set[str]:
        return {t for m in self.members.values() for t in m.topics}

    def known_topics(self) -> set[str]:
        """Subscribed topics and those of owned partitions (a member that changed its
        subscription may still hold partitions of a topic it left)."""
        owned = {tp[0] for m in self.members.values() for tp in m.owned}
        return self.subscribed_topics() | owned

    def _rebalance(self) -> None:
        self.version += 1
        self.epoch += 1
        self.target = assign(
            {m.member_id: m.topics for m in self.members.values()},
            self._partition_counts,
            self.target,
        )

    def reconcile(self, member_id: str, now_ms: int, *, ack: bool) -> Reconciled:
        """Bring one member closer to its target; with ``ack``, the member confirms it released
        what it was told to revoke (a heartbeat). Also keeps its session alive."""
        member = self.member(member_id)
        member.deadline_ms = now_ms + member.session_timeout_ms
        revoking_before = len(member.revoking)
        released: set[TopicPartition] = set()
        if ack and member.revoking:
            released = set(member.revoking)
            member.owned -= released
            for tp in released:
                member.positions.pop(tp, None)
            member.revoking = set()
            member.revoke_deadline_ms = None
        target = self.target.get(member_id, set())
        before = set(member.owned)
        revoke = member.owned - target
        if revoke - member.revoking:
            member.revoking |= revoke
            if member.revoke_deadline_ms is None:
                member.revoke_deadline_ms = now_ms + member.rebalance_timeout_ms
        taken = self._owned_by_others(member_id)
        added = {tp for tp in target - member.owned if tp not in taken}
        member.owned |= added
        if member.owned != before or released:
            member.previous_epoch, member.epoch = member.epoch, self.epoch
        if member.owned != before or released or len(member.revoking) != revoking_before:
            self.version += 1
        return Reconciled(
            member_id=member_id,
            epoch=member.epoch,
            assigned=frozenset(member.owned - member.revoking),
            revoking=frozenset(member.revoking),
            pending=frozenset(target - member.owned),
            added=frozenset(added),
            released=frozenset(released),
        )

    def _owned_by_others(self, member_id: str) -> set[TopicPartition]:
        return {tp for m in self.members.values() if m.member_id != member_id for tp in m.owned}

    # -- commits ---------------------------------------------------------------------------------

    def check_commit(
        self, member_id: str | None, generation: int | None, partitions: list[TopicPartition]
    ) -> None:
        """Raise unless this commit may be written: from a member, at its current (or
        previous) epoch, for partitions it owns; without a member, only while the group has no
        active members."""
        if member_id is None:
            if any(not m.departed for m in self.members.values()):
                raise LogbusError(
                    f"group {self.group_id!r} has active members; commits must carry member_id "
                    f"and generation",
                    code=ErrorCode.UNKNOWN_MEMBER_ID,
                )
            return
        member = self.member(member_id)
        if generation not in (member.epoch, member.previous_epoch):
            raise LogbusError(
                f"generation {generation} is stale; member {member_id!r} is at {member.epoch}",
                code=ErrorCode.ILLEGAL_GENERATION,
                generation=member.epoch,
            )
        foreign = [tp for tp in partitions if tp not in member.owned]
        if foreign:
            t, p = foreign[0]
            raise LogbusError(
                f"member {member_id!r} does not own {t}[{p}] (generation {member.epoch})",
                code=ErrorCode.FENCED_MEMBER_EPOCH,
                topic=t,
                partition=p,
                generation=member.epoch,
            )

    # -- views -----------------------------------------------------------------------------------

    @property
    def state(self) -> GroupState:
        if not self.members:
            return GroupState.EMPTY
        for m in self.members.values():
            if m.revoking or m.owned != self.target.get(m.member_id, set()):
                return GroupState.RECONCILING
        return GroupState.STABLE

    @property
    def active(self) -> bool:
        return any(not m.departed for m in self.members.values())

    # -- persistence -----------------------------------------------------------------------------

    def to_record(self) -> dict[str, Any]:
        """The group as a JSON-able document (see the module doc for what it leaves out)."""
        return {
            "v": 1,
            "epoch": self.epoch,
            "empty_since_ms": self.empty_since_ms,
            "partition_counts": dict(sorted(self._partition_counts.items())),
            "static": dict(sorted(self._static.items())),
            "fenced": list(self._fenced),  # ≤ MAX_FENCED_REMEMBERED ids, oldest first
            "members": [
                {
                    "member_id": m.member_id,
                    "instance_id": m.instance_id,
                    "client_id": m.client_id,
                    "topics": sorted(m.topics),
                    "session_timeout_ms": m.session_timeout_ms,
                    "rebalance_timeout_ms": m.rebalance_timeout_ms,
                    "auto_offset_reset": m.auto_offset_reset,
                    "epoch": m.epoch,
                    "previous_epoch": m.previous_epoch,
                    "owned": _tp_list(m.owned),
                    "revoking": _tp_list(m.revoking),
                    "departed": m.departed,
                    "target": _tp_list(self.target.get(m.member_id, ())),
                }
                for m in self.members.values()
            ],
        }

    @classmethod
    def from_record(cls, group_id: str, doc: Mapping[str, Any], now_ms: int) -> Group:
        """Rebuild a group from :meth:`to_record`; every member's session (and revocation)
        deadline starts again at ``now_ms``. Raises ValueError for a document it cannot read."""
        try:
            if doc.get("v") != 1:
                raise ValueError(f"unknown group record version {doc.get('v')!r}")
            group = cls(group_id)
            group.epoch = int(doc["epoch"])
            empty = doc.get("empty_since_ms")
            group.empty_since_ms = None if empty is None else int(empty)
            group._partition_counts = {str(t): int(n) for t, n in doc["partition_counts"].items()}
            group._static = {str(i): str(m) for i, m in doc["static"].items()}
            group._fenced = {str(m): None for m in doc.get("fenced", [])}
            for d in doc["members"]:
                revoking = _tp_set(d["revoking"])
                rebalance_ms = int(d["rebalance_timeout_ms"])
                member = Member(
                    member_id=str(d["member_id"]),
                    topics=frozenset(str(t) for t in d["topics"]),
                    session_timeout_ms=int(d["session_timeout_ms"]),
                    rebalance_timeout_ms=rebalance_ms,
                    deadline_ms=now_ms + int(d["session_timeout_ms"]),
                    instance_id=d["instance_id"],
                    client_id=d["client_id"],
                    auto_offset_reset=str(d["auto_offset_reset"]),
                    epoch=int(d["epoch"]),
                    previous_epoch=int(d["previous_epoch"]),
                    owned=_tp_set(d["owned"]),
                    revoking=revoking,
                    revoke_deadline_ms=now_ms + rebalance_ms if revoking else None,
                    departed=bool(d["departed"]),
                )
                group.members[member.member_id] = member
                group.target[member.member_id] = _tp_set(d["target"])
        except (KeyError, TypeError, AttributeError) as e:
            raise ValueError(f"unreadable group record: {e!r}") from None
        return group

    def check_invariants(self) -> None:
        """For tests: no partition owned twice; revoking ⊆ owned; every owned partition
        exists."""
        seen: dict[TopicPartition, str] = {}
        for m in self.members.values():
            assert m.revoking <= m.owned, (m.member_id, m.revoking, m.owned)
            for tp in m.owned:
                assert tp not in seen, f"{tp} owned by {seen[tp]} and {m.member_id}"
                assert tp[1] < self._partition_counts.get(tp[0], 0), f"{tp} does not exist"
                seen[tp] = m.member_id


def _tp_list(tps: Iterable[TopicPartition]) -> list[list[Any]]:
    return [[t, p] for t, p in sorted(tps)]


def _tp_set(raw: Iterable[Any]) -> set[TopicPartition]:
    return {(str(t), int(p)) for t, p in raw}


def _check_session(session_timeout_ms: int, rebalance_timeout_ms: int) -> None:
    for name, value in (
        ("session_timeout_ms", session_timeout_ms),
        ("rebalance_timeout_ms", rebalance_timeout_ms),
    ):
        if not SESSION_TIMEOUT_MS_MIN <= value <= SESSION_TIMEOUT_MS_MAX:
            raise LogbusError(
                f"{name} must be between {SESSION_TIMEOUT_MS_MIN} and {SESSION_TIMEOUT_MS_MAX}",
                code=ErrorCode.INVALID_SESSION_TIMEOUT,
            )
