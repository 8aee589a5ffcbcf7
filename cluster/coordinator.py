"""The group coordinator: groups in memory, committed offsets in ``__consumer_offsets``.

Theory of operation
-------------------
* **Who coordinates.** A group lives in partition ``crc32(group) % N`` of the internal compacted
  topic ``__consumer_offsets`` (:func:`cluster.broker.offsets_partition`); the broker leading
  that partition is its coordinator. When a broker becomes leader of such a partition (told by
  :attr:`cluster.broker.Broker.role_listeners`, and checked again every second) it *loads* it:
  waits until its high watermark covers its whole log (everything the old leader wrote that
  this one holds is then committed; with RF=3 that takes one follower fetch), reads it from
  the log start to the high watermark, and only then answers for its groups. When it loses the
  leadership it *unloads*: its groups and offsets are dropped and every waiting poll or
  WebSocket wakes up to a retriable ``NOT_COORDINATOR`` (421, naming the new coordinator). A
  call for a group whose partition is still loading gets ``COORDINATOR_LOAD_IN_PROGRESS``
  (503, retriable); for one coordinated elsewhere ``NOT_COORDINATOR`` with ``coordinator_id``
  and ``coordinator_url``.
* **Offsets are records.** A commit appends one record per partition with ``acks=all`` (fsynced)
  before it is acknowledged. Key: the JSON array ``["offset", group, topic, partition]``;
  value: ``{"offset", "metadata", "commit_ms"}``; a tombstone (null value) deletes. Compaction
  keeps the latest commit per key. A loaded partition's offsets are in memory (``_offsets``).
* **Membership is a record too.** Key ``["group", group]``, value
  :meth:`cluster.group.Group.to_record` (epochs, members, owned/revoking/target partitions);
  a tombstone when the group is deleted or forgotten. Each group has at most one write in
  flight (acks=all, in order); changes made meanwhile coalesce into the next write, which
  carries the state as it is then — the latest state wins, so a burst of joins costs two
  writes, not one per join. A join, heartbeat, leave or poll that changed the member's view
  answers only once that view is durable (:meth:`Coordinator.durable`: one replicated
  append) — so after a failover the new coordinator resumes the members exactly as they were
  told, with deadlines restarted at load time. A member therefore sees one retriable error
  (the 421/503 while the coordinator moves) and keeps its member id, epoch and assignment.
  Not kept: fetch positions — a restored member reads on from its committed offsets (at least
  once, like any consumer after a crash).
* **Offsets in transactions** (Kafka's TxnOffsetCommit). :meth:`Coordinator.txn_commit_offsets`
  checks offsets as a commit is checked and appends them as *one transactional batch* of the
  producer (its id, its epoch, and the next sequence from the offsets partition's producer
  state: 0 in a new epoch, else after its last batch; one such write at a time per offsets
  partition, so two writes of a producer never take the same sequence). They are *pending*:
  kept per offsets partition and producer, not shown by ``committed()``, until the transaction
  coordinator appends that producer's marker on the same partition and reports it with
  :meth:`Coordinator.on_marker`: COMMIT makes them committed (a later write of the transaction
  wins per partition), ABORT drops them. A marker ends only what its producer wrote before it
  (pending entries remember their batch's offset), and a marker reported while a write is
  being acknowledged ends that write too (a timeout abort racing the write). The log itself
  fences zombies: an older epoch is INVALID_PRODUCER_EPOCH, a write of a new epoch while the
  producer's transaction is open INVALID_TXN_STATE (both 409, nothing written). A load replays
  the log batch by batch in the same way — transactional records wait for the next marker of
  their producer — so it rebuilds exactly the live state; transactions still open stay pending
  for their markers, and the load reads on until no marker appended meanwhile is left unread.
  An unload drops the pending offsets with the rest. Compaction (:mod:`core_log.cleaner`)
  keeps a marker while data of its transaction remains, removes aborted batches whole, and
  removes a committed transactional offset only for a record of its key after its marker (one
  in between is overridden at the marker here), so a load rebuilds the live state; a
  committed transactional offset deleted later stays deleted. At most
  ``MAX_PENDING_TXN_OFFSETS`` (100,000) pending offsets per producer and offsets partition.
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
import dataclasses
import logging
import re
import uuid
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import orjson

from core_log.batch import (
    NO_PRODUCER_ID,
    BatchHeader,
    Record,
    build_batch,
    decode_records,
    scan_batches,
)
from core_log.control import parse_control_batch
from core_log.errors import (
    ErrorCode,
    LogbusError,
    OffsetOutOfRangeError,
    TopicAlreadyExistsError,
)
from core_log.isolation import committed_bytes
from core_log.log import AppendResult, CommittedReadResult, ReadResult
from core_log.producer_state import ProducerEntry, next_sequence

from .assignor import TopicPartition
from .broker import OFFSETS_TOPIC, Acks, Broker, offsets_partition
from .group import Group, Member, Reconciled

log = logging.getLogger("logbus.coordinator")

OFFSETS_TOPIC_CONFIGS = {"cleanup.policy": "compact", "segment.bytes": 16 * 1024 * 1024}
MAX_GROUPS = 10_000
MAX_OFFSETS_PER_COMMIT = 10_000
MAX_METADATA_CHARS = 4_096  # Kafka's offset.metadata.max.bytes
LOAD_READ_BYTES = 1024 * 1024
EXPIRY_TICK_MS = 1_000  # the longest the expiry task sleeps
IDLE_GROUP_KEPT_MS = 600_000  # an empty group without offsets is forgotten after this long
# A membership record larger than this is not written (1,000 members of 1,000 topics would not
# fit a message); such a group is lost on failover and its members join again.
GROUP_RECORD_MAX_BYTES = 900 * 1024
PERSIST_BACKOFF_S = (0.05, 1.0)  # retry a failed membership write: first and longest wait
DURABLE_WAIT_S = 30.0  # the longest an answer waits for its membership record
_GROUP_ID = re.compile(r"[a-zA-Z0-9._-]{1,249}")
# The most offsets one producer may hold pending in one offsets partition (over all its groups
# and calls of one transaction): ten full commits. Replay takes whatever the log holds.
MAX_PENDING_TXN_OFFSETS = 10 * MAX_OFFSETS_PER_COMMIT
_INT16_MAX = 2**15 - 1


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


@dataclass(frozen=True)
class _Staged:
    """A transactional offset waiting for its transaction's marker; ``at`` is the offset of the
    transactional batch holding it (a marker ends only what its producer wrote before it)."""

    at: int
    offset: CommittedOffset


# Pending transactional offsets of one offsets partition: producer id -> group -> tp -> staged.
_Pending = dict[int, dict[str, dict[TopicPartition, _Staged]]]


@dataclass(eq=False)
class _InFlight:
    """The transactional offsets write in flight on one offsets partition (one at a time: they
    hold the partition's lock), and the markers of its producer reported meanwhile."""

    producer_id: int
    markers: list[tuple[int, bool]] = field(default_factory=list)  # (marker offset, commit)


@dataclass(eq=False)
class _Loaded:
    """A loaded offsets partition: the leader epoch it was loaded in."""

    epoch: int


@dataclass(eq=False)
class _Loading:
    epoch: int
    task: asyncio.Task[None] | None = None


@dataclass(eq=False)
class _Persisted:
    """The membership record of one group: what was asked and what is durable."""

    wanted: int = 0  # bumped on every change to write
    written: int = 0  # the last ``wanted`` that is durable
    failed: int = 0  # the ``wanted`` of the last failed write
    error: LogbusError | None = None
    seen: tuple[Group | None, int] = (None, -1)  # the group object and version last marked
    task: asyncio.Task[None] | None = None
    done: asyncio.Event = field(default_factory=asyncio.Event)  # replaced after each attempt

    def attempted(self) -> None:
        self.done.set()
        self.done = asyncio.Event()


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
        self._loaded: dict[int, _Loaded] = {}  # offsets partitions coordinated here
        self._loading: dict[int, _Loading] = {}
        self._persist: dict[str, _Persisted] = {}  # membership records, per group
        self._pending_txn: dict[int, _Pending] = {}  # per loaded offsets partition
        self._txn_locks: dict[int, asyncio.Lock] = {}  # per offsets partition
        self._txn_in_flight: dict[int, _InFlight] = {}
        self._create_task: asyncio.Future[None] | None = None
        self._closed = False

    # -- lifecycle -------------------------------------------------------------------------------

    async def start(self) -> None:
        """Create the offsets topic if missing and load the partitions this broker leads. In a
        cluster the topic is created later, at the first group call, so that it gets a
        replication factor from every broker started by then (Kafka does the same)."""
        try:
            self.broker.topic(OFFSETS_TOPIC)
        except LogbusError:
            if not self.broker.config.clustered:
                await self._create_offsets_topic()
        self.broker.topic_listeners.append(self._topics_changed)
        self.broker.role_listeners.append(self._roles_changed)
        self._roles_changed()
        await asyncio.gather(
            *(x.task for x in self._loading.values() if x.task is not None),
            return_exceptions=True,
        )
        self._loaded_ms = self.clock.now_ms()
        self._task = asyncio.create_task(self._expiry_loop(), name="group-expiry")

    async def _create_offsets_topic(self) -> None:
        try:
            await self.broker.create_topic(
                OFFSETS_TOPIC,
                self.offsets_partitions,
                self.broker.offsets_replication_factor(),
                configs=OFFSETS_TOPIC_CONFIGS,
            )
        except TopicAlreadyExistsError:  # another broker of the cluster made it first
            await self.broker.refresh_metadata()

    def _offsets_partitions(self) -> int | None:
        """The partition count of the offsets topic; None (and its creation started, in a
        cluster) while it does not exist."""
        try:
            return self.broker.topic(OFFSETS_TOPIC).partitions
        except LogbusError:
            if self._create_task is None or self._create_task.done():
                self._create_task = asyncio.ensure_future(self._create_offsets_topic())
                self._create_task.add_done_callback(_log_failure)
            return None

    async def close(self) -> None:
        self._closed = True
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        for loading in self._loading.values():
            if loading.task is not None:
                loading.task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        for st in self._persist.values():
            if st.task is not None:
                st.task.cancel()
        for event in self._events.values():
            event.set()

    # -- loading and unloading -------------------------------------------------------------------

    def _roles_changed(self) -> None:
        """Load the offsets partitions this broker leads now; unload those it lost (or leads
        in a new epoch: another leader may have written meanwhile)."""
        n = self._offsets_known()
        if self._closed or n is None:
            return
        self.offsets_partitions = n
        for p in range(n):
            epoch = self.broker.leader_epoch(OFFSETS_TOPIC, p)
            loaded, loading = self._loaded.get(p), self._loading.get(p)
            have = loaded.epoch if loaded else loading.epoch if loading else None
            if epoch == have:
                continue
            if have is not None:
                self._unload(p, f"leadership moved (epoch {have} -> {epoch})")
            if epoch is not None:
                started = self._loading[p] = _Loading(epoch)
                started.task = asyncio.create_task(self._load(p, started), name=f"offsets-load-{p}")

    async def _load(self, partition: int, loading: _Loading) -> None:
        """Read the partition into fresh maps and install them if still wanted.

        Only the transaction coordinator's markers may be appended meanwhile (this coordinator
        writes nothing until loaded): the read goes on until it has reached the log end with no
        await left before the maps are installed, so every marker is either replayed here or
        appended after the install (and then reported through :meth:`on_marker`)."""
        replay = _Replay()
        try:
            p = self.broker.partition(OFFSETS_TOPIC, partition)
            offset = p.log_start_offset
            end = p.log_end_offset
            while True:
                while p.high_watermark < end:  # the old leader's tail, committed by followers
                    if self._loading.get(partition) is not loading:
                        return
                    await p.wait_for(p.high_watermark, 1.0)
                while offset < end:
                    result = await p.read(offset, LOAD_READ_BYTES, max_offset=end)
                    if not result.data:
                        offset = end  # nothing more below ``end`` (compacted away)
                        break
                    replay.read(result.data, offset, end)
                    offset = result.next_offset
                if p.log_end_offset <= end:
                    break
                end = p.log_end_offset  # markers appended while reading: read them too
        except LogbusError as e:  # lost the leadership, storage: the next check tries again
            log.warning("%s-%d: load failed: %s", OFFSETS_TOPIC, partition, e)
            if self._loading.get(partition) is loading:
                del self._loading[partition]
            return
        if self._loading.get(partition) is not loading:
            return
        del self._loading[partition]
        now = self.clock.now_ms()
        restored = 0
        for group_id, doc in replay.groups.items():
            if doc is None:
                continue
            try:
                group = Group.from_record(group_id, doc, now)
            except ValueError as e:
                log.warning("group %s: %s; its members join again", group_id, e)
                continue
            self.groups[group_id] = group
            self._persist[group_id] = _Persisted(seen=(group, group.version))
            restored += 1
        self._offsets.update(replay.offsets)
        if replay.pending:
            self._pending_txn[partition] = replay.pending
        self._loaded[partition] = _Loaded(loading.epoch)
        log.info(
            "%s-%d: coordinating %d groups (%d with offsets, %d producers with open "
            "transactions) in leader epoch %d",
            OFFSETS_TOPIC,
            partition,
            restored,
            len(replay.offsets),
            len(replay.pending),
            loading.epoch,
        )
        self._topics_changed()  # partitions may have been added while nobody coordinated
        self._wake.set()

    def _unload(self, partition: int, why: str) -> None:
        self._pending_txn.pop(partition, None)
        loading = self._loading.pop(partition, None)
        if loading is not None and loading.task is not None:
            loading.task.cancel()
        if self._loaded.pop(partition, None) is None:
            return
        n = self.offsets_partitions
        mine = {g for g in (*self.groups, *self._offsets) if offsets_partition(g, n) == partition}
        log.info("%s-%d: unloading %d groups: %s", OFFSETS_TOPIC, partition, len(mine), why)
        gone = self._not_coordinator_error(next(iter(mine), ""))
        for group_id in mine:
            self.groups.pop(group_id, None)
            self._offsets.pop(group_id, None)
            st = self._persist.pop(group_id, None)
            if st is not None:
                if st.task is not None:
                    st.task.cancel()
                st.error, st.failed = gone, st.wanted
                st.attempted()
            self._changed(group_id)  # waiting polls look again and hear NOT_COORDINATOR

    def coordinates(self, group_id: str) -> bool:
        """Whether this broker coordinates the group now (its offsets partition is loaded)."""
        n = self._offsets_known()
        return n is not None and offsets_partition(group_id, n) in self._loaded

    def _offsets_known(self) -> int | None:
        try:
            return self.broker.topic(OFFSETS_TOPIC).partitions
        except LogbusError:
            return None

    def _check(self, group_id: str) -> int:
        """The group's offsets partition, if this broker coordinates it; else a retriable
        error: COORDINATOR_NOT_AVAILABLE (no offsets topic yet), COORDINATOR_LOAD_IN_PROGRESS,
        or NOT_COORDINATOR naming the coordinator."""
        validate_group_id(group_id)
        n = self._offsets_partitions()
        if n is None:
            raise LogbusError(
                f"{OFFSETS_TOPIC} is being created; try again",
                code=ErrorCode.COORDINATOR_NOT_AVAILABLE,
            )
        p = offsets_partition(group_id, n)
        if p in self._loaded:
            return p
        if p in self._loading or self.broker.leader_epoch(OFFSETS_TOPIC, p) is not None:
            raise LogbusError(
                f"group {group_id!r}: this broker is loading {OFFSETS_TOPIC}-{p}; try again",
                code=ErrorCode.COORDINATOR_LOAD_IN_PROGRESS,
            )
        raise self._not_coordinator_error(group_id)

    def _not_coordinator_error(self, group_id: str) -> LogbusError:
        leader = self.broker.coordinator_of(group_id) if group_id else -1
        if leader == self.broker.config.broker_id:
            leader = -1  # we lead it in the store's view but stepped down: not known
        return LogbusError(
            f"broker {self.broker.config.broker_id} does not coordinate group {group_id!r}"
            + (f"; broker {leader} does" if leader >= 0 else "; its coordinator is moving"),
            code=ErrorCode.NOT_COORDINATOR,
            coordinator_id=leader,
            coordinator_url=self.broker.broker_url(leader) if leader >= 0 else None,
        )

    # -- groups ----------------------------------------------------------------------------------

    def _group(self, group_id: str, *, create: bool = False) -> Group:
        self._check(group_id)
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
        """The group changed (or went away): wake its waiters and write its record."""
        event = self._events.pop(group_id, None)
        if event is not None:
            event.set()
        self._wake.set()
        self._mark(group_id)

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
        try:
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
        finally:
            self._changed(group_id)
        return reconciled

    def _member_group(self, group_id: str, member_id: str) -> Group:
        """The group of a member call: an unknown group means an unknown member."""
        self._check(group_id)
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
        version = group.version
        try:
            reconciled = group.reconcile(member_id, self.clock.now_ms(), ack=ack)
        finally:
            if group.epoch != before:
                self._changed(group_id)
            elif group.version != version:
                self._mark(group_id)
        if reconciled.released:
            self._changed(group_id)
        return reconciled

    def leave(self, group_id: str, member_id: str, *, permanent: bool = False) -> None:
        group = self._member_group(group_id, member_id)
        try:
            group.leave(member_id, self.clock.now_ms(), permanent=permanent)
        finally:
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
        task.add_done_callback(_log_failure)

    async def _expiry_loop(self) -> None:
        while True:
            self._roles_changed()  # a missed notification costs at most one tick
            now = self.clock.now_ms()
            for group in list(self.groups.values()):
                gone = group.expire(now)
                if gone:
                    log.info("group %s: members %s timed out", group.group_id, gone)
                    self._changed(group.group_id)
                if not group.members:
                    self._forget_if_idle(group, now)
            try:
                await self._expire_offsets(now)
            except LogbusError as e:  # not the coordinator any more, no ISR: next tick
                log.info("expiring offsets failed: %s", e)
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
            self._changed(group.group_id)  # writes the tombstone of its membership record

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
        self._check(group_id)
        if group_id not in self.groups and group_id not in self._offsets:
            raise LogbusError(f"no group {group_id!r}", code=ErrorCode.GROUP_ID_NOT_FOUND)

    def committed(self, group_id: str) -> dict[TopicPartition, CommittedOffset]:
        self._check(group_id)
        return dict(self._offsets.get(group_id, {}))

    async def commit(
        self,
        group_id: str,
        member_id: str | None,
        generation: int | None,
        offsets: dict[TopicPartition, tuple[int, str]],
    ) -> None:
        """Write offsets (durably) after checking the member may commit them."""
        self._check_commit(group_id, member_id, generation, offsets)
        now = self.clock.now_ms()
        await self._write(
            group_id, {tp: CommittedOffset(o, m, now) for tp, (o, m) in offsets.items()}
        )
        if member_id is not None:
            self._skip_to_commits(group_id, member_id, offsets)

    def _check_commit(
        self,
        group_id: str,
        member_id: str | None,
        generation: int | None,
        offsets: dict[TopicPartition, tuple[int, str]],
    ) -> int:
        """Raise unless the offsets may be committed now (limits, known partitions, the member
        and its generation); returns the group's offsets partition."""
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
        partition = self._check(group_id)
        if member_id is None:
            group = self.groups.get(group_id)
            if group is not None:
                group.check_commit(None, None, list(offsets))
        else:
            self._group(group_id).check_commit(member_id, generation, list(offsets))
        return partition

    # -- offsets in transactions -----------------------------------------------------------------

    async def txn_commit_offsets(
        self,
        group_id: str,
        producer_id: int,
        producer_epoch: int,
        offsets: dict[TopicPartition, tuple[int, str]],
        *,
        member_id: str | None = None,
        generation: int | None = None,
    ) -> None:
        """Add the group's offsets to the producer's transaction (Kafka's TxnOffsetCommit):
        checked as :meth:`commit` checks, written as one transactional batch of the producer
        (acks=all) and kept pending, invisible to :meth:`committed`, until the producer's next
        marker on the group's offsets partition (:meth:`on_marker`). The partition's producer
        state fences an older epoch (INVALID_PRODUCER_EPOCH) and a write that does not fit the
        producer's transaction (INVALID_TXN_STATE), as for any transactional write."""
        if producer_id < 0 or not 0 <= producer_epoch <= _INT16_MAX:
            raise LogbusError(
                f"a transactional commit needs a producer id >= 0 and an epoch in 0..{_INT16_MAX}",
                code=ErrorCode.INVALID_REQUEST,
            )
        partition = self._check_commit(group_id, member_id, generation, offsets)
        loaded = self._loaded[partition]
        now = self.clock.now_ms()
        entries = {tp: CommittedOffset(o, m, now) for tp, (o, m) in offsets.items()}
        pending = self._pending_txn.get(partition, {}).get(producer_id, {})
        held = {(g, tp) for g, staged in pending.items() for tp in staged}
        if len(held | {(group_id, tp) for tp in entries}) > MAX_PENDING_TXN_OFFSETS:
            raise LogbusError(
                f"a transaction holds at most {MAX_PENDING_TXN_OFFSETS} offsets per "
                f"{OFFSETS_TOPIC} partition",
                code=ErrorCode.INVALID_REQUEST,
            )
        records = _offset_records(group_id, dict(entries), now)
        lock = self._txn_locks.setdefault(partition, asyncio.Lock())
        async with lock:
            p = self.broker.partition(OFFSETS_TOPIC, partition)
            data = build_batch(
                records,
                producer_id=producer_id,
                producer_epoch=producer_epoch,
                base_sequence=_txn_sequence(p.log.producers.get(producer_id), producer_epoch),
                is_transactional=True,
                default_timestamp=now,
            )
            flight = self._txn_in_flight[partition] = _InFlight(producer_id)
            try:
                result = await self._append(group_id, partition, data, transactional=True)
            finally:
                del self._txn_in_flight[partition]
            if self._loaded.get(partition) is not loaded:  # unloaded meanwhile: not ours now
                raise self._not_coordinator_error(group_id)
            ended = [(m, commit) for m, commit in flight.markers if m > result.base_offset]
            if ended:  # the transaction ended (timed out?) while this write was acknowledged
                if ended[0][1]:
                    self._apply_committed(group_id, entries)
                return
            by_group = self._pending_txn.setdefault(partition, {}).setdefault(producer_id, {})
            staged = by_group.setdefault(group_id, {})
            for tp, c in entries.items():
                staged[tp] = _Staged(result.base_offset, c)

    def on_marker(self, partition: int, producer_id: int, commit: bool) -> None:
        """A COMMIT (``commit``) or ABORT marker of ``producer_id`` was appended to
        ``__consumer_offsets`` partition ``partition`` here as leader: COMMIT makes the
        producer's pending offsets there committed, ABORT drops them. Call it as soon as the
        marker's append returns, committed to the in-sync replicas (acks=all, as every offsets
        write here: a marker lost by a failover must not have been applied), and before any
        later marker of the same producer there. Offsets
        the producer wrote after the marker (a later transaction's) stay pending. Nothing
        happens for an unknown producer or a partition not loaded here (a load replays the
        marker from the log)."""
        if partition not in self._loaded:
            return
        try:
            entry = self.broker.partition(OFFSETS_TOPIC, partition).log.producers.get(producer_id)
        except LogbusError:
            return  # not the leader any more: the next load replays the marker
        marker_offset = (
            entry.marker_offset if entry is not None and entry.marker_offset >= 0 else None
        )
        flight = self._txn_in_flight.get(partition)
        if flight is not None and flight.producer_id == producer_id and marker_offset is not None:
            flight.markers.append((marker_offset, commit))
        pending = self._pending_txn.get(partition)
        if pending is None:
            return
        changed = _end_txn(pending, producer_id, commit, marker_offset, self._offsets)
        if not pending:
            del self._pending_txn[partition]
        for group_id in sorted(changed):
            self._changed(group_id)
        self._drop_orphans(changed)

    def _apply_committed(
        self, group_id: str, entries: dict[TopicPartition, CommittedOffset]
    ) -> None:
        self._offsets.setdefault(group_id, {}).update(entries)
        self._changed(group_id)
        self._drop_orphans({group_id})

    def _drop_orphans(self, groups: set[str]) -> None:
        """Committed transactional offsets of a topic deleted meanwhile go as
        :meth:`_topics_changed` drops any."""
        names = {t.name for t in self.broker.topics()}
        if any(tp[0] not in names for g in groups for tp in self._offsets.get(g, {})):
            self._topics_changed()

    def pending_txn_offsets(
        self, group_id: str
    ) -> dict[int, dict[TopicPartition, CommittedOffset]]:
        """The group's offsets in open transactions: producer id -> offsets (not committed
        until the producer's COMMIT marker; never shown by :meth:`committed`)."""
        partition = self._check(group_id)
        out: dict[int, dict[TopicPartition, CommittedOffset]] = {}
        for producer_id, by_group in self._pending_txn.get(partition, {}).items():
            staged = by_group.get(group_id)
            if staged:
                out[producer_id] = {tp: s.offset for tp, s in staged.items()}
        return out

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
                hw = self.broker.reader(*tp, direct=False).high_watermark  # -1: not known yet
                member.positions[tp] = min(offset, hw) if hw >= 0 else offset

    async def _write(
        self, group_id: str, offsets: dict[TopicPartition, CommittedOffset | None]
    ) -> None:
        records = _offset_records(group_id, offsets, self.clock.now_ms())
        partition = self._check(group_id)
        loaded = self._loaded[partition]
        async with self._lock(group_id):
            await self._append(group_id, partition, build_batch(records))
            if self._loaded.get(partition) is not loaded:  # unloaded meanwhile: not ours now
                raise self._not_coordinator_error(group_id)
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
        self._check(group_id)
        self._check_empty(group_id)
        await self.commit(group_id, None, None, {tp: (o, "") for tp, o in offsets.items()})

    async def delete(self, group_id: str) -> None:
        self._check(group_id)
        self._check_empty(group_id)
        if group_id not in self._offsets and group_id not in self.groups:
            raise LogbusError(f"no group {group_id!r}", code=ErrorCode.GROUP_ID_NOT_FOUND)
        if group_id in self._offsets:
            await self._write(group_id, {tp: None for tp in self._offsets[group_id]})
        if self.groups.pop(group_id, None) is not None:
            self._changed(group_id)  # the tombstone of its membership record
            await self.durable(group_id)

    def group_ids(self) -> list[str]:
        """The groups coordinated here (in a cluster, other brokers coordinate others)."""
        return sorted(set(self.groups) | set(self._offsets))

    def listed_partitions(self) -> tuple[list[int], list[int]]:
        """The offsets partitions whose groups :meth:`group_ids` covers (loaded here), and
        those this broker leads but is still loading (their groups are not listed yet)."""
        n = self._offsets_known()
        if n is None:
            return [], []
        loading = [
            p
            for p in range(n)
            if p not in self._loaded
            and (p in self._loading or self.broker.leader_epoch(OFFSETS_TOPIC, p) is not None)
        ]
        return sorted(p for p in self._loaded if p < n), loading

    def group(self, group_id: str) -> Group:
        """The group (an empty one when it is known by its offsets only)."""
        return self._group(group_id)

    # -- membership records ----------------------------------------------------------------------

    def _mark(self, group_id: str) -> None:
        """Write the group's record (or tombstone) if it changed since the last mark."""
        if self._closed:
            return
        group = self.groups.get(group_id)
        st = self._persist.get(group_id)
        if st is None:
            if group is None:
                return  # unloaded, or forgotten with its tombstone written
            st = self._persist[group_id] = _Persisted()
        seen = (group, group.version if group is not None else -1)
        if st.seen[0] is seen[0] and st.seen[1] == seen[1]:
            return
        st.seen = seen
        st.wanted += 1
        if st.task is None or st.task.done():
            st.task = asyncio.create_task(self._persist_loop(group_id, st), name="group-record")

    async def _persist_loop(self, group_id: str, st: _Persisted) -> None:
        """Write the latest state until what was asked is durable; one write at a time."""
        backoff = PERSIST_BACKOFF_S[0]
        while st.written < st.wanted and self._persist.get(group_id) is st:
            wanted = st.wanted
            try:
                partition = self._check(group_id)
                loaded = self._loaded[partition]
                group = self.groups.get(group_id)
                value = None if group is None else orjson.dumps(group.to_record())
                if value is not None and len(value) > GROUP_RECORD_MAX_BYTES:
                    log.warning(
                        "group %s: membership record of %d bytes is too large to keep; a "
                        "failover loses its members",
                        group_id,
                        len(value),
                    )
                    value = None
                record = Record(
                    key=orjson.dumps(["group", group_id]),
                    value=value,
                    timestamp=self.clock.now_ms(),
                )
                async with self._lock(group_id):
                    await self._append(group_id, partition, build_batch([record]))
                if self._loaded.get(partition) is not loaded:
                    raise self._not_coordinator_error(group_id)
            except LogbusError as e:
                st.error, st.failed = e, wanted
                st.attempted()
                if e.code is ErrorCode.NOT_COORDINATOR or not e.retriable:
                    log.warning("group %s: membership record not written: %s", group_id, e)
                    return
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, PERSIST_BACKOFF_S[1])
                continue
            st.written, st.error = wanted, None
            backoff = PERSIST_BACKOFF_S[0]
            st.attempted()
        gone = group_id not in self.groups and self._persist.get(group_id) is st
        if gone and st.written >= st.wanted:
            del self._persist[group_id]  # the tombstone is written: nothing to track

    async def _append(
        self, group_id: str, partition: int, data: bytes, *, transactional: bool = False
    ) -> AppendResult:
        """Append to the group's offsets partition here, never forwarded: a coordinator that
        lost the leadership must not write into the new leader's log."""
        try:
            return await self.broker.append(
                OFFSETS_TOPIC,
                partition,
                data,
                Acks.ALL,
                internal=True,
                direct=True,
                transactional=transactional,
            )
        except LogbusError as e:
            if e.code is ErrorCode.NOT_LEADER_OR_FOLLOWER:
                raise self._not_coordinator_error(group_id) from e
            raise

    async def durable(self, group_id: str, *, member_id: str | None = None) -> None:
        """Return once the group's membership, as it is now, is in its record (acks=all);
        raise the write's error if it failed (retriable: the member asks again).

        With ``member_id`` (heartbeats, polls, leaves) the wait is bounded by a third of that
        member's session timeout and then simply ends: a slow write (an ISR waiting to shrink
        around a dead follower) must not time out the sessions it is keeping. Such an answer
        may be lost by a failover right after it; the member then hears its previous view
        again (and a commit at the newer generation is refused once: it heartbeats and
        retries). Joins wait fully (up to 30 s), so a member id is never handed out unwritten.
        """
        st = self._persist.get(group_id)
        if st is None or st.written >= st.wanted:
            return
        target = st.wanted
        loop = asyncio.get_running_loop()
        bound = DURABLE_WAIT_S
        if member_id is not None:
            member = (
                self.groups[group_id].members.get(member_id) if group_id in self.groups else None
            )
            bound = min(bound, member.session_timeout_ms / 3000) if member else 0.0
        deadline = loop.time() + bound
        while st.written < target:
            if st.error is not None and st.failed >= target:
                raise st.error
            remaining = deadline - loop.time()
            if remaining <= 0:
                if member_id is not None:
                    return
                raise LogbusError(
                    f"group {group_id!r}: the membership record was not written within "
                    f"{DURABLE_WAIT_S:.0f} s",
                    code=ErrorCode.REQUEST_TIMED_OUT,
                )
            done = st.done
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(remaining):
                    await done.wait()

    # -- polling ---------------------------------------------------------------------------------

    def position(
        self, group_id: str, member: Member, tp: TopicPartition, *, stable: bool = False
    ) -> int:
        """Where the member reads ``tp`` next: its position, else the committed offset, else
        ``auto_offset_reset``; a committed offset outside the log is reset the same way.
        ``stable`` (a read_committed poll): ``latest`` is the last stable offset, as for a
        Kafka consumer at read_committed, so a transaction open at that moment is read once it
        commits rather than skipped."""
        pos = member.positions.get(tp)
        if pos is not None:
            return pos
        p = self.broker.reader(*tp, direct=False)
        committed = self._offsets.get(group_id, {}).get(tp)
        end = _stable_end(p) if stable else p.high_watermark
        if committed is not None and p.log_start_offset <= committed.offset <= p.high_watermark:
            pos = committed.offset
        else:
            pos = self._reset(member, tp, p.log_start_offset, end)
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
        self,
        group_id: str,
        member_id: str,
        max_bytes: int,
        wait_ms: int,
        *,
        committed: bool = False,
    ) -> tuple[Reconciled, list[Fetched]]:
        """Read from the member's assigned partitions, from its positions, waiting up to
        ``wait_ms`` for data or a change of assignment. Positions move with :meth:`advance`.
        A poll keeps the member's session alive but does not acknowledge revocations.
        ``committed``: at ``read_committed`` (committed data only, below each partition's
        last stable offset; a position moves past aborted data and markers as it reads)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + wait_ms / 1000
        first: Reconciled | None = None
        while True:
            event = self.event(group_id)
            reconciled = self.heartbeat(group_id, member_id, ack=False)
            first = first or reconciled
            member = self.member(group_id, member_id)
            seen: dict[TopicPartition, int] = {}  # the high watermarks the reads saw
            tps = sorted(reconciled.assigned)
            fetched, skipped = await self._read(group_id, member, tps, max_bytes, committed, seen)
            remaining = deadline - loop.time()
            moved = (reconciled.assigned, reconciled.revoking) != (first.assigned, first.revoking)
            if fetched or remaining <= 0 or moved:
                await self.durable(group_id, member_id=member_id)  # survives a failover
                return reconciled, fetched
            if skipped:  # a position passed aborted data: what follows it may be there now
                continue
            waits: list[Any] = [event.wait()]
            for tp in reconciled.assigned:
                p = self.broker.reader(*tp, direct=False)
                at = member.positions.get(tp, p.high_watermark)
                if committed:  # the LSO moves only with the high watermark: wait for that
                    at = max(at, seen.get(tp, p.high_watermark))
                waits.append(p.wait_for(at, remaining))
            await first_of(waits, remaining)

    async def _read(
        self,
        group_id: str,
        member: Member,
        tps: list[TopicPartition],
        max_bytes: int,
        committed: bool = False,
        seen: dict[TopicPartition, int] | None = None,
    ) -> tuple[list[Fetched], bool]:
        """What the member's partitions hold from its positions (at most ``max_bytes``), and
        whether a position moved past aborted data and markers without a record to answer."""
        if not tps:
            return [], False
        cursor = member.poll_cursor % len(tps)
        member.poll_cursor = cursor + 1
        out: list[Fetched] = []
        skipped = False
        budget = max_bytes
        for tp in tps[cursor:] + tps[:cursor]:
            if budget <= 0:
                break
            p = await self.broker.known_reader(*tp, direct=False)
            pos = self.position(group_id, member, tp, stable=committed)
            if pos >= p.high_watermark:
                continue
            try:
                result = await (p.read_committed if committed else p.read)(pos, budget)
            except OffsetOutOfRangeError as e:
                member.positions[tp] = self._reset(member, tp, e.log_start_offset, p.high_watermark)
                continue
            if seen is not None:
                seen[tp] = result.high_watermark
            if isinstance(result, CommittedReadResult) and result.data:
                data = committed_bytes(result.data, result.aborted_transactions)
                if not data:  # aborted data and markers only: the position passes them
                    if tp in member.owned:
                        member.positions[tp] = result.next_offset
                        skipped = True
                    continue
                result = dataclasses.replace(result, data=data)
            if result.data:
                out.append(Fetched(tp[0], tp[1], pos, result))
                budget -= len(result.data)
        return out, skipped

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
                hw: int | None = self.broker.reader(*tp, direct=False).high_watermark
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


class _Replay:
    """One offsets partition rebuilt from its log, batch by batch in log order: membership
    records, committed offsets, and the offsets of transactions not ended yet (a transactional
    batch's records wait in ``pending`` for their producer's next marker: COMMIT applies them,
    ABORT drops them)."""

    def __init__(self) -> None:
        self.groups: dict[str, dict[str, Any] | None] = {}
        self.offsets: dict[str, dict[TopicPartition, CommittedOffset]] = {}
        self.pending: _Pending = {}

    def read(self, data: bytes | memoryview, start: int, end: int) -> None:
        """Apply the batches of ``data`` (one read) at offsets ``start`` .. ``end`` - 1."""
        for pos, h in scan_batches(data):
            if h.is_control:
                marker = parse_control_batch(data, pos)
                if marker is not None and start <= marker.offset < end:
                    _end_txn(
                        self.pending, marker.producer_id, marker.commit, marker.offset, self.offsets
                    )
                continue
            staged = h.is_transactional and h.producer_id != NO_PRODUCER_ID
            for record in decode_records(data, pos):
                if not start <= record.offset < end:
                    continue
                if staged:
                    self._stage(h, record)
                else:
                    _apply(record, self.groups, self.offsets)

    def _stage(self, h: BatchHeader, record: Record) -> None:
        parsed = _offset_record(record)
        group, tp, c = parsed if parsed is not None else ("", ("", 0), None)
        if c is None:  # the coordinator stages commits only
            log.warning("skipping a transactional %s record at %d", OFFSETS_TOPIC, record.offset)
            return
        by_group = self.pending.setdefault(h.producer_id, {})
        by_group.setdefault(group, {})[tp] = _Staged(h.base_offset, c)


def _end_txn(
    pending: _Pending,
    producer_id: int,
    commit: bool,
    marker_offset: int | None,
    offsets: dict[str, dict[TopicPartition, CommittedOffset]],
) -> set[str]:
    """End the producer's transaction in ``pending`` at its marker: COMMIT moves what it staged
    before ``marker_offset`` (None: everything) into ``offsets``, ABORT drops it. Returns the
    groups whose committed offsets changed."""
    by_group = pending.get(producer_id)
    if by_group is None:
        return set()
    changed = set()
    for group_id, staged in list(by_group.items()):
        for tp, s in list(staged.items()):
            if marker_offset is not None and s.at > marker_offset:
                continue  # a later transaction's, staged before this marker was reported
            del staged[tp]
            if commit:
                offsets.setdefault(group_id, {})[tp] = s.offset
                changed.add(group_id)
        if not staged:
            del by_group[group_id]
    if not by_group:
        del pending[producer_id]
    return changed


def _offset_record(
    record: Record,
) -> tuple[str, TopicPartition, CommittedOffset | None] | None:
    """An offset record's group, partition and offset (None: a tombstone); None when the
    record is not an offset record or cannot be read."""
    try:
        key = orjson.loads(record.key or b"")
        kind, group, topic, partition = key
        if kind != "offset" or not isinstance(group, str) or not isinstance(topic, str):
            return None
        if not isinstance(partition, int):
            return None
        if record.value is None:
            return group, (topic, partition), None
        v = orjson.loads(record.value)
        c = CommittedOffset(
            v["offset"], v.get("metadata", ""), v.get("commit_ms", record.timestamp)
        )
    except (ValueError, TypeError, KeyError):
        return None
    return group, (topic, partition), c


def _apply(
    record: Record,
    groups: dict[str, dict[str, Any] | None],
    offsets: dict[str, dict[TopicPartition, CommittedOffset]],
) -> None:
    """Apply one record of an offsets partition being loaded (later records win)."""
    try:
        key = orjson.loads(record.key or b"")
        if key[0] == "group":
            groups[key[1]] = None if record.value is None else orjson.loads(record.value)
            return
    except (ValueError, TypeError, IndexError, KeyError):
        pass
    parsed = _offset_record(record)
    if parsed is None:
        log.warning("skipping an unreadable %s record at %d", OFFSETS_TOPIC, record.offset)
        return
    group, tp, c = parsed
    if c is None:
        stored = offsets.get(group)
        if stored is not None:
            stored.pop(tp, None)
            if not stored:
                del offsets[group]
        return
    offsets.setdefault(group, {})[tp] = c


def _offset_records(
    group_id: str, offsets: dict[TopicPartition, CommittedOffset | None], now_ms: int
) -> list[Record]:
    """The records of a commit: key ``["offset", group, topic, partition]``, value JSON (None:
    a tombstone), in partition order."""
    return [
        Record(
            key=orjson.dumps(["offset", group_id, t, p]),
            value=None
            if c is None
            else orjson.dumps(
                {"offset": c.offset, "metadata": c.metadata, "commit_ms": c.commit_ms}
            ),
            timestamp=now_ms,
        )
        for (t, p), c in sorted(offsets.items())
    ]


def _txn_sequence(entry: ProducerEntry | None, epoch: int) -> int:
    """The base sequence of the producer's next batch in a partition whose producer state holds
    ``entry``: 0 for a producer unknown there or in a new epoch, else the one after its last
    batch (an older epoch gets 0 and is fenced by the append)."""
    if entry is None or entry.epoch != epoch:
        return 0
    return next_sequence(entry.last_seq)


def _stable_end(p: Any) -> int:
    """A reader's last stable offset where it knows one (a local leader, or a remote one once
    read), else its high watermark."""
    lso = getattr(p, "last_stable_offset", -1)
    hw: int = p.high_watermark
    return lso if isinstance(lso, int) and 0 <= lso <= hw else hw


def _log_failure(task: asyncio.Future[None]) -> None:
    if not task.cancelled() and task.exception() is not None:
        log.warning("background %s write failed: %s", OFFSETS_TOPIC, task.exception())


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
