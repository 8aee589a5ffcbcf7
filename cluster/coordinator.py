"""The group coordinator: groups in memory, committed offsets in ``__consumer_offsets``.

Theory of operation
-------------------
* **Offsets are records.** A commit appends one record per partition to the internal compacted
  topic ``__consumer_offsets``, partition ``crc32(group) % N``, with ``acks=all`` (fsynced)
  before it is acknowledged. Key: the JSON array ``["offset", group, topic, partition]``;
  value: ``{"offset", "metadata", "commit_ms"}``; a tombstone (null value) deletes. Compaction
  keeps the latest commit per key. At start every partition of the topic is read from its log
  start to its high watermark into memory (``_offsets``); after that, reads are memory only.
* **Groups** (:class:`cluster.group.Group`, sans-I/O) live in memory only: after a broker restart
  members get ``UNKNOWN_MEMBER_ID`` and join again; their committed offsets are intact.
* **Time.** One task sleeps until the earliest session or revocation deadline of any group (or
  a second at most) and expires members; the same task drops the offsets of groups that have
  been empty for ``offsets_retention_ms`` (Kafka's ``offsets.retention.minutes``, 7 days).
* **Wake-ups.** Every change to a group sets that group's event; member polls and WebSocket
  sessions wait on it next to their partitions' high-watermark waiters, so a rebalance reaches
  a waiting member at once instead of at its next heartbeat.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import uuid
import zlib
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import orjson

from core_log.batch import Record, build_batch, iter_records
from core_log.errors import (
    ErrorCode,
    LogbusError,
    OffsetOutOfRangeError,
    TopicAlreadyExistsError,
)
from core_log.log import ReadResult

from .assignor import TopicPartition
from .broker import OFFSETS_TOPIC, Acks, Broker
from .group import Group, Member, Reconciled

log = logging.getLogger("logbus.coordinator")

OFFSETS_TOPIC_CONFIGS = {"cleanup.policy": "compact", "segment.bytes": 16 * 1024 * 1024}
MAX_GROUPS = 10_000
MAX_OFFSETS_PER_COMMIT = 10_000
MAX_METADATA_CHARS = 4_096  # Kafka's offset.metadata.max.bytes
LOAD_READ_BYTES = 1024 * 1024
EXPIRY_TICK_MS = 1_000  # the longest the expiry task sleeps
IDLE_GROUP_KEPT_MS = 600_000  # an empty group without offsets is forgotten after this long
_GROUP_ID = re.compile(r"[a-zA-Z0-9._-]{1,249}")


@dataclass(frozen=True)
class CommittedOffset:
    offset: int
    metadata: str
    commit_ms: int


@dataclass(frozen=True)
class Fetched:
    """Bytes read for a member from one of its partitions, starting at ``offset``."""

    topic: str
    partition: int
    offset: int
    result: ReadResult


def validate_group_id(group_id: str) -> None:
    if not _GROUP_ID.fullmatch(group_id):
        raise LogbusError(
            "group id must be 1..249 of [a-zA-Z0-9._-]", code=ErrorCode.INVALID_GROUP_ID
        )


class Coordinator:
    def __init__(
        self,
        broker: Broker,
        *,
        offsets_partitions: int = 4,
        offsets_retention_ms: int = 7 * 24 * 3600 * 1000,
    ) -> None:
        self.broker = broker
        self.clock = broker.clock
        self.offsets_partitions = offsets_partitions
        self.offsets_retention_ms = offsets_retention_ms
        self.groups: dict[str, Group] = {}
        self._offsets: dict[str, dict[TopicPartition, CommittedOffset]] = {}
        self._events: dict[str, asyncio.Event] = {}
        self._locks: dict[str, asyncio.Lock] = {}
        self._loaded_ms = 0
        self._task: asyncio.Task[None] | None = None
        self._tasks: set[asyncio.Future[None]] = set()  # tombstone writes in flight
        self._wake = asyncio.Event()

    # -- lifecycle -------------------------------------------------------------------------------

    async def start(self) -> None:
        try:
            topic = self.broker.topic(OFFSETS_TOPIC)
        except LogbusError:
            try:
                topic = await self.broker.create_topic(
                    OFFSETS_TOPIC,
                    self.offsets_partitions,
                    self.broker.offsets_replication_factor(),
                    configs=OFFSETS_TOPIC_CONFIGS,
                )
            except TopicAlreadyExistsError:  # another broker of the cluster made it first
                await self.broker.refresh_metadata()
                topic = self.broker.topic(OFFSETS_TOPIC)
        self.offsets_partitions = topic.partitions
        for p in range(topic.partitions):
            if self.broker.leads(OFFSETS_TOPIC, p):
                # In a cluster, this broker coordinates the groups of the partitions it leads.
                # TODO(issue 11, next): load/unload on leadership changes (coordinator failover).
                await self._load(p)
        self._loaded_ms = self.clock.now_ms()
        self.broker.topic_listeners.append(self._topics_changed)
        self._task = asyncio.create_task(self._expiry_loop(), name="group-expiry")

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        await asyncio.gather(*self._tasks, return_exceptions=True)
        for event in self._events.values():
            event.set()

    async def _load(self, partition: int) -> None:
        p = self.broker.partition(OFFSETS_TOPIC, partition)
        offset = p.log_start_offset
        while offset < p.high_watermark:
            result = await p.read(offset, LOAD_READ_BYTES)
            if not result.data:
                break
            for record in iter_records(result.data):
                if record.offset >= offset:
                    self._apply(record)
            offset = result.next_offset

    def _apply(self, record: Record) -> None:
        try:
            kind, group, topic, partition = orjson.loads(record.key or b"")
            assert kind == "offset"
        except (ValueError, TypeError, AssertionError):
            log.warning("skipping an unreadable %s record at %d", OFFSETS_TOPIC, record.offset)
            return
        tp = (topic, partition)
        if record.value is None:
            offsets = self._offsets.get(group)
            if offsets is not None:
                offsets.pop(tp, None)
                if not offsets:
                    del self._offsets[group]
            return
        v = orjson.loads(record.value)
        self._offsets.setdefault(group, {})[tp] = CommittedOffset(
            v["offset"], v.get("metadata", ""), v.get("commit_ms", record.timestamp)
        )

    # -- groups ----------------------------------------------------------------------------------

    def _group(self, group_id: str, *, create: bool = False) -> Group:
        validate_group_id(group_id)
        group = self.groups.get(group_id)
        if group is None:
            if not create:
                if group_id in self._offsets:
                    return Group(group_id)  # known only by its offsets: empty
                raise LogbusError(f"no group {group_id!r}", code=ErrorCode.GROUP_ID_NOT_FOUND)
            if len(self.groups) >= MAX_GROUPS:
                raise LogbusError(
                    f"the coordinator holds the maximum of {MAX_GROUPS} groups",
                    code=ErrorCode.GROUP_MAX_SIZE_REACHED,
                )
            group = self.groups[group_id] = Group(group_id)
        return group

    def _lock(self, group_id: str) -> asyncio.Lock:
        lock = self._locks.get(group_id)
        if lock is None:
            lock = self._locks[group_id] = asyncio.Lock()
        return lock

    def event(self, group_id: str) -> asyncio.Event:
        """Set (and replaced) whenever the group changes; wait on the one you got."""
        event = self._events.get(group_id)
        if event is None:
            event = self._events[group_id] = asyncio.Event()
        return event

    def _changed(self, group_id: str) -> None:
        event = self._events.pop(group_id, None)
        if event is not None:
            event.set()
        self._wake.set()

    def _partition_counts(self, topics: Iterable[str]) -> dict[str, int]:
        return {t: self.broker.topic(t).partitions for t in topics}

    def join(
        self,
        group_id: str,
        topics: list[str],
        *,
        session_timeout_ms: int,
        rebalance_timeout_ms: int,
        instance_id: str | None = None,
        client_id: str | None = None,
        auto_offset_reset: str = "latest",
    ) -> Reconciled:
        """A new member; raises UNKNOWN_TOPIC_OR_PARTITION for a topic that does not exist."""
        counts = self._partition_counts(topics)  # raises for an unknown topic
        if OFFSETS_TOPIC in counts:
            raise LogbusError(
                f"{OFFSETS_TOPIC} is internal", code=ErrorCode.INVALID_TOPIC_EXCEPTION
            )
        group = self._group(group_id, create=True)
        reconciled = group.join(
            uuid.uuid4().hex,
            frozenset(topics),
            counts,
            self.clock.now_ms(),
            session_timeout_ms=session_timeout_ms,
            rebalance_timeout_ms=rebalance_timeout_ms,
            instance_id=instance_id,
            client_id=client_id,
            auto_offset_reset=auto_offset_reset,
        )
        self._changed(group_id)
        return reconciled

    def _member_group(self, group_id: str, member_id: str) -> Group:
        """The group of a member call: an unknown group means an unknown member."""
        validate_group_id(group_id)
        group = self.groups.get(group_id)
        if group is None:
            raise LogbusError(
                f"group {group_id!r} has no member {member_id!r}; join again",
                code=ErrorCode.UNKNOWN_MEMBER_ID,
            )
        return group

    def heartbeat(self, group_id: str, member_id: str, *, ack: bool = True) -> Reconciled:
        group = self._member_group(group_id, member_id)
        before = group.epoch
        reconciled = group.reconcile(member_id, self.clock.now_ms(), ack=ack)
        if reconciled.released or group.epoch != before:
            self._changed(group_id)
        return reconciled

    def leave(self, group_id: str, member_id: str, *, permanent: bool = False) -> None:
        group = self._member_group(group_id, member_id)
        group.leave(member_id, self.clock.now_ms(), permanent=permanent)
        self._changed(group_id)

    def member(self, group_id: str, member_id: str) -> Member:
        return self._member_group(group_id, member_id).member(member_id)

    def _topics_changed(self) -> None:
        """The broker added partitions or deleted a topic: rebalance the groups that care, and
        drop committed offsets of deleted topics (a topic created again under the same name
        starts from its own beginning, not from the old topic's offsets)."""
        names = {t.name for t in self.broker.topics()}
        orphans = {
            group_id: {tp: None for tp in offsets if tp[0] not in names}
            for group_id, offsets in self._offsets.items()
        }
        for group_id, gone in orphans.items():
            if gone:
                for tp in gone:  # forgotten at once; the tombstones follow
                    self._offsets[group_id].pop(tp, None)
                self._background(self._write(group_id, dict(gone)))
        for group in self.groups.values():
            counts = {
                t: self.broker.topic(t).partitions if t in names else 0
                for t in group.known_topics()
            }
            if group.update_partitions(counts):
                self._changed(group.group_id)

    def _background(self, work: Any) -> None:
        task = asyncio.ensure_future(work)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _expiry_loop(self) -> None:
        while True:
            now = self.clock.now_ms()
            for group in list(self.groups.values()):
                gone = group.expire(now)
                if gone:
                    log.info("group %s: members %s timed out", group.group_id, gone)
                    self._changed(group.group_id)
                if not group.members:
                    self._forget_if_idle(group, now)
            await self._expire_offsets(now)
            deadlines = [d for g in self.groups.values() if (d := g.next_deadline_ms()) is not None]
            sleep_ms = min([EXPIRY_TICK_MS, *(d - now + 1 for d in deadlines)])
            self._wake.clear()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(max(sleep_ms, 1) / 1000):
                    await self._wake.wait()

    def _forget_if_idle(self, group: Group, now_ms: int) -> None:
        """An empty group with no offsets holds nothing worth keeping once its fenced members
        have had time to hear that they were fenced."""
        idle_ms = now_ms - (group.empty_since_ms or now_ms)
        if (
            idle_ms >= IDLE_GROUP_KEPT_MS
            and group.group_id not in self._offsets
            and not self._lock(group.group_id).locked()
        ):
            del self.groups[group.group_id]
            self._locks.pop(group.group_id, None)
            event = self._events.pop(group.group_id, None)
            if event is not None:
                event.set()  # nobody should be waiting; if someone is, they look again

    async def _expire_offsets(self, now_ms: int) -> None:
        for group_id, offsets in list(self._offsets.items()):
            group = self.groups.get(group_id)
            if group is not None and group.members:
                continue
            empty_since = (
                group.empty_since_ms if group and group.empty_since_ms else self._loaded_ms
            )
            last = max([empty_since, *(o.commit_ms for o in offsets.values())])
            if now_ms - last >= self.offsets_retention_ms:
                log.info("group %s: offsets expired after %d ms empty", group_id, now_ms - last)
                await self._write(group_id, {tp: None for tp in offsets})

    # -- offsets ---------------------------------------------------------------------------------

    def require_known(self, group_id: str) -> None:
        """404 GROUP_ID_NOT_FOUND unless the group has members or committed offsets (a deleted
        or expired group has neither)."""
        validate_group_id(group_id)
        if group_id not in self.groups and group_id not in self._offsets:
            raise LogbusError(f"no group {group_id!r}", code=ErrorCode.GROUP_ID_NOT_FOUND)

    def committed(self, group_id: str) -> dict[TopicPartition, CommittedOffset]:
        validate_group_id(group_id)
        return dict(self._offsets.get(group_id, {}))

    async def commit(
        self,
        group_id: str,
        member_id: str | None,
        generation: int | None,
        offsets: dict[TopicPartition, tuple[int, str]],
    ) -> None:
        """Write offsets (durably) after checking the member may commit them."""
        if not offsets or len(offsets) > MAX_OFFSETS_PER_COMMIT:
            raise LogbusError(
                f"a commit carries 1..{MAX_OFFSETS_PER_COMMIT} offsets",
                code=ErrorCode.INVALID_REQUEST,
            )
        for (topic, partition), (offset, metadata) in offsets.items():
            self.broker.check_partition(topic, partition)  # raises for an unknown partition
            if offset < 0:
                raise LogbusError("offsets must be >= 0", code=ErrorCode.INVALID_REQUEST)
            if len(metadata) > MAX_METADATA_CHARS:
                raise LogbusError(
                    f"metadata is limited to {MAX_METADATA_CHARS} characters",
                    code=ErrorCode.OFFSET_METADATA_TOO_LARGE,
                )
        if member_id is None:
            validate_group_id(group_id)
            group = self.groups.get(group_id)
            if group is not None:
                group.check_commit(None, None, list(offsets))
        else:
            self._group(group_id).check_commit(member_id, generation, list(offsets))
        now = self.clock.now_ms()
        await self._write(
            group_id, {tp: CommittedOffset(o, m, now) for tp, (o, m) in offsets.items()}
        )
        if member_id is not None:
            self._skip_to_commits(group_id, member_id, offsets)

    def _skip_to_commits(
        self, group_id: str, member_id: str, offsets: dict[TopicPartition, tuple[int, str]]
    ) -> None:
        """A member's commit past its position moves the position there: committing X says
        "done below X", so nothing below X is delivered again — and it is how a member skips a
        record no reader can serve (a poll names its ``next_offset``). Never moves back."""
        member = self._group(group_id).members.get(member_id)
        if member is None:
            return
        for tp, (offset, _) in offsets.items():
            pos = member.positions.get(tp)
            if tp in member.owned and pos is not None and pos < offset:
                hw = self.broker.reader(*tp).high_watermark  # -1: not known here yet
                member.positions[tp] = min(offset, hw) if hw >= 0 else offset

    async def _write(
        self, group_id: str, offsets: dict[TopicPartition, CommittedOffset | None]
    ) -> None:
        now = self.clock.now_ms()
        records = [
            Record(
                key=orjson.dumps(["offset", group_id, t, p]),
                value=None
                if c is None
                else orjson.dumps(
                    {"offset": c.offset, "metadata": c.metadata, "commit_ms": c.commit_ms}
                ),
                timestamp=now,
            )
            for (t, p), c in sorted(offsets.items())
        ]
        partition = zlib.crc32(group_id.encode()) % self.offsets_partitions
        async with self._lock(group_id):
            await self.broker.append(
                OFFSETS_TOPIC, partition, build_batch(records), Acks.ALL, internal=True
            )
            stored = self._offsets.setdefault(group_id, {})
            for tp, c in offsets.items():
                if c is None:
                    stored.pop(tp, None)
                else:
                    stored[tp] = c
            if not stored:
                del self._offsets[group_id]
        self._changed(group_id)

    def _check_empty(self, group_id: str) -> None:
        group = self.groups.get(group_id)
        if group is not None and group.members:
            raise LogbusError(
                f"group {group_id!r} has {len(group.members)} members; stop them first",
                code=ErrorCode.NON_EMPTY_GROUP,
            )

    async def reset(self, group_id: str, offsets: dict[TopicPartition, int]) -> None:
        """Set committed offsets of an empty group (resolved by the caller)."""
        validate_group_id(group_id)
        self._check_empty(group_id)
        await self.commit(group_id, None, None, {tp: (o, "") for tp, o in offsets.items()})

    async def delete(self, group_id: str) -> None:
        validate_group_id(group_id)
        self._check_empty(group_id)
        if group_id not in self._offsets and group_id not in self.groups:
            raise LogbusError(f"no group {group_id!r}", code=ErrorCode.GROUP_ID_NOT_FOUND)
        if group_id in self._offsets:
            await self._write(group_id, {tp: None for tp in self._offsets[group_id]})
        self.groups.pop(group_id, None)

    def group_ids(self) -> list[str]:
        return sorted(set(self.groups) | set(self._offsets))

    def group(self, group_id: str) -> Group:
        """The group (an empty one when it is known by its offsets only)."""
        return self._group(group_id)

    # -- polling ---------------------------------------------------------------------------------

    def position(self, group_id: str, member: Member, tp: TopicPartition) -> int:
        """Where the member reads ``tp`` next: its position, else the committed offset, else
        ``auto_offset_reset``; a committed offset outside the log is reset the same way."""
        pos = member.positions.get(tp)
        if pos is not None:
            return pos
        p = self.broker.reader(*tp)
        committed = self._offsets.get(group_id, {}).get(tp)
        if committed is not None and p.log_start_offset <= committed.offset <= p.high_watermark:
            pos = committed.offset
        else:
            pos = self._reset(member, tp, p.log_start_offset, p.high_watermark)
        member.positions[tp] = pos
        return pos

    def _reset(self, member: Member, tp: TopicPartition, start: int, end: int) -> int:
        if member.auto_offset_reset == "earliest":
            return start
        if member.auto_offset_reset == "latest":
            return end
        raise LogbusError(
            f"no committed offset for {tp[0]}[{tp[1]}] and auto_offset_reset is none",
            code=ErrorCode.OFFSET_OUT_OF_RANGE,
            topic=tp[0],
            partition=tp[1],
        )

    async def poll(
        self, group_id: str, member_id: str, max_bytes: int, wait_ms: int
    ) -> tuple[Reconciled, list[Fetched]]:
        """Read from the member's assigned partitions, from its positions, waiting up to
        ``wait_ms`` for data or a change of assignment. Positions move with :meth:`advance`.
        A poll keeps the member's session alive but does not acknowledge revocations."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + wait_ms / 1000
        first: Reconciled | None = None
        while True:
            event = self.event(group_id)
            reconciled = self.heartbeat(group_id, member_id, ack=False)
            first = first or reconciled
            member = self.member(group_id, member_id)
            fetched = await self._read(group_id, member, sorted(reconciled.assigned), max_bytes)
            remaining = deadline - loop.time()
            moved = (reconciled.assigned, reconciled.revoking) != (first.assigned, first.revoking)
            if fetched or remaining <= 0 or moved:
                return reconciled, fetched
            waits: list[Any] = [event.wait()]
            for tp in reconciled.assigned:
                p = self.broker.reader(*tp)
                waits.append(p.wait_for(member.positions.get(tp, p.high_watermark), remaining))
            await first_of(waits, remaining)

    async def _read(
        self, group_id: str, member: Member, tps: list[TopicPartition], max_bytes: int
    ) -> list[Fetched]:
        if not tps:
            return []
        cursor = member.poll_cursor % len(tps)
        member.poll_cursor = cursor + 1
        out: list[Fetched] = []
        budget = max_bytes
        for tp in tps[cursor:] + tps[:cursor]:
            if budget <= 0:
                break
            p = await self.broker.known_reader(*tp)
            pos = self.position(group_id, member, tp)
            if pos >= p.high_watermark:
                continue
            try:
                result = await p.read(pos, budget)
            except OffsetOutOfRangeError as e:
                member.positions[tp] = self._reset(member, tp, e.log_start_offset, p.high_watermark)
                continue
            if result.data:
                out.append(Fetched(tp[0], tp[1], pos, result))
                budget -= len(result.data)
        return out

    def advance(self, group_id: str, member_id: str, tp: TopicPartition, next_offset: int) -> None:
        """The member was sent records of ``tp`` up to ``next_offset``."""
        member = self._group(group_id).members.get(member_id)
        if member is not None and tp in member.owned:
            member.positions[tp] = next_offset

    def describe(self, group_id: str) -> dict[str, Any]:
        group = self._group(group_id)
        committed = self._offsets.get(group_id, {})
        owners = {tp: m.member_id for m in group.members.values() for tp in m.owned}
        offsets = []
        for tp in sorted(set(committed) | set(owners)):
            try:
                hw: int | None = self.broker.reader(*tp).high_watermark
            except LogbusError:
                hw = None  # the topic is gone
            if hw is not None and hw < 0:
                hw = None  # led by another broker and not read through this one yet
            c = committed.get(tp)
            offsets.append(
                {
                    "topic": tp[0],
                    "partition": tp[1],
                    "committed_offset": c.offset if c else None,
                    "metadata": c.metadata if c else None,
                    "log_end_offset": hw,
                    "lag": max(0, hw - c.offset) if c and hw is not None else None,
                    "member_id": owners.get(tp),
                }
            )
        members = [
            {
                "member_id": m.member_id,
                "instance_id": m.instance_id,
                "client_id": m.client_id,
                "member_epoch": m.epoch,
                "topics": sorted(m.topics),
                "assignment": _tps(m.owned - m.revoking),
                "revoking": _tps(m.revoking),
                "target": _tps(group.target.get(m.member_id, set())),
                "departed": m.departed,
            }
            for m in group.members.values()
        ]
        return {
            "group": group_id,
            "state": group.state.value,
            "group_epoch": group.epoch,
            "members": members,
            "offsets": offsets,
            "lag": sum(o["lag"] or 0 for o in offsets),
        }


def _tps(tps: Iterable[TopicPartition]) -> list[dict[str, Any]]:
    return [{"topic": t, "partition": p} for t, p in sorted(tps)]


async def first_of(waits: list[Any], timeout_s: float) -> None:
    """Wait until the first of ``waits`` completes (or the timeout); cancel the rest."""
    tasks = [asyncio.ensure_future(w) for w in waits]
    try:
        await asyncio.wait(tasks, timeout=timeout_s, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
