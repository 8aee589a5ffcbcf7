"""The replica manager: leadership, replication and the high watermark of a broker's partitions.

The asyncio shell around :mod:`cluster.replication` (Kafka's ``ReplicaManager``): every
append and read of a partition in a cluster asks it first.

Theory of operation
-------------------
* **Metadata.** The broker polls the store's metadata version every
  ``metadata_refresh_interval_ms`` and, when it moved, re-reads the partition rows and brokers
  and :meth:`apply`-ies them: a partition whose row names this broker leader (in an epoch it
  does not lead yet) becomes a :class:`Leading` one — the new epoch is recorded at the log end
  first; one led elsewhere becomes a :class:`Following` one, fetched by the fetcher of its
  leader (a broker that a partition increase or a reassignment adds creates an empty log and
  copies it); a partition no longer assigned here (topic deleted, or reassigned away) is
  deleted. In the same leader epoch a new row only updates the leader's view of the replicas
  (:meth:`cluster.replication.LeaderReplica.apply`: added ones are tracked, removed ones
  refused).
* **Lease.** A heartbeat every ``broker_heartbeat_interval_ms`` renews the lease. If the store
  refuses it (expired: the controller may already have moved leadership) or no renewal has
  succeeded for ``broker_session_timeout_ms`` (measured on this machine's monotonic clock from
  the *start* of the last successful call, so it ends before the database's lease does), the
  broker steps down from every partition at once — pending ``acks=all`` appends fail with
  ``NOT_LEADER_OR_FOLLOWER`` rather than succeed — and registers again as a new incarnation.
* **Leader.** An append stamps the leader epoch; ``acks=all`` needs ISR ≥
  ``min.insync.replicas`` first (else ``NOT_ENOUGH_REPLICAS``) and then waits until the high
  watermark passes it (``NOT_ENOUGH_REPLICAS_AFTER_APPEND`` if the ISR shrinks below the
  minimum meanwhile, ``REQUEST_TIMED_OUT`` after ``request_timeout_ms``). Follower fetches
  (:meth:`serve_fetch`) long-poll until there is data past a follower's offset or a high
  watermark it has not seen; each one records the follower's position and may move the high
  watermark. ISR changes are compare-and-sets on the partition row, made only by a leader whose
  lease is live.
* **Follower.** One fetcher task per leader broker, one HTTP/2 long-poll at a time carrying every
  partition it follows there; answers are applied in order: append as follower (batches kept
  byte for byte), truncate on a diverging epoch, restart at the leader's log start, or back off
  until the metadata changes.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from core_log.batch import BatchHeader
from core_log.clock import Clock
from core_log.config import LogConfig
from core_log.epoch_cache import UNDEFINED_EPOCH
from core_log.errors import ErrorCode, KafkaStorageError, LogbusError, OffsetOutOfRangeError
from core_log.limits import OFF_LOOP_IO_BYTES
from core_log.log import AppendResult, PartitionLog
from core_log.manager import LogManager, Partition

from . import replica_wire as wire
from .h2base import DEFAULT_LIMITS, Handler
from .h2transport import H2Client, H2Request, H2Response, H2Server
from .interbroker import ClusterCredential
from .metadata import BrokerMeta, ConcurrentUpdateError, MetadataStore, PartitionMeta, TopicMeta
from .replication import (
    NO_LEADER,
    FetchError,
    FetchPosition,
    FollowerActionKind,
    FollowerReplica,
    LeaderReplica,
    PartitionFetchAnswer,
    PartitionState,
)

log = logging.getLogger("logbus.replication")
TopicPartition = tuple[str, int]
FETCH_BACKOFF_S = 0.1  # after a failed replica fetch (leader down, link cut)
# Replication bytes per fetch that may be read (leader) or appended (follower) on the event
# loop instead of in a worker thread: one default replica.fetch.max.bytes. Only data among the
# leader's last REPLICA_HOT_BYTES appended is read inline (written milliseconds to seconds ago:
# page cache, ≈ 0.25 ms per MiB). Why: under the bench load (4 producers streaming 1 MiB bodies
# into the leader's loop) each hop to a worker thread and back waited for the GIL and cost 3-12
# ms of latency per fetch, more than the copy itself; an acks=all produce waits for two of them.
REPLICA_INLINE_BYTES = 1_048_576
# What a leader counts as recently appended, hence in the page cache: its last 64 MiB (a few
# tenths of a second at the bench's rates; the box has 24 GiB). It is remembered as one entry
# per HOT_STEP_BYTES appended (at most 65 entries per partition, whatever the append sizes),
# so the window's start is exact to within one MiB. A follower that is behind by more
# (restarting, catching up) reads in the reads pool, off the loop.
REPLICA_HOT_BYTES = 64 * 1_048_576
HOT_STEP_BYTES = 1_048_576
FORWARD_HEADER_BYTES = 1024 * 1024  # room for a forwarded request's JSON header


@dataclass(frozen=True)
class ReplicationConfig:
    broker_id: int
    heartbeat_interval_ms: int = 2_000
    session_timeout_ms: int = 9_000
    replica_lag_time_max_ms: int = 30_000
    fetch_wait_max_ms: int = 500
    fetch_max_bytes: int = 1_048_576
    fetch_response_max_bytes: int = 10_485_760
    socket_timeout_ms: int = 30_000
    metadata_refresh_interval_ms: int = 200
    request_timeout_ms: int = 30_000
    # A forwarded produce carries one partition's batches of a request (≤ the API's
    # max_request_bytes, 64 MiB by default) and a small header.
    forward_max_bytes: int = 64 * 1024 * 1024 + FORWARD_HEADER_BYTES


class NotLeaderError(LogbusError):
    """This broker does not lead the partition (421, with the leader's id and URL)."""

    code = ErrorCode.NOT_LEADER_OR_FOLLOWER


class LedLog:
    """A led partition's log as the leader's fetch handling reads it (a
    :class:`cluster.replication.LogView`): ``end_offset_for_epoch`` of the latest epoch is
    answered without the log's lock.

    Why: nearly every fetch of an in-sync follower names the leader's latest epoch, and
    :meth:`PartitionLog.end_offset_for_epoch` takes the log's lock with a *blocking* acquire
    on the event loop. Under acks=all load the appends pool holds that lock for a whole 1 MiB
    append (2-20 ms at load 6 on the 2-core box), so each follower fetch froze the broker's
    loop — every produce, every ack, the other follower's fetch — until the append finished.

    Why it is safe: a led log is never truncated, and its latest epoch changes only by
    ``assign_leader_epoch`` before leading begins (:meth:`ReplicaManager._lead`); the answer
    for the latest epoch is then (that epoch, the log end offset), exactly what the epoch cache
    answers, and the log end only grows — reading it without the lock is reading it a moment
    earlier or later, as ``log_end_offset`` always is. Older epochs (a follower's first fetch
    after a leader change) take the lock as before.
    """

    __slots__ = ("log",)

    def __init__(self, log: PartitionLog) -> None:
        self.log = log

    @property
    def log_start_offset(self) -> int:
        return self.log.log_start_offset

    @property
    def log_end_offset(self) -> int:
        return self.log.log_end_offset

    def end_offset_for_epoch(self, epoch: int) -> tuple[int, int]:
        if epoch != UNDEFINED_EPOCH and epoch == self.log.latest_epoch:
            return epoch, self.log.log_end_offset
        return self.log.end_offset_for_epoch(epoch)


@dataclass(eq=False)
class Leading:
    partition: Partition
    replica: LeaderReplica
    fsync: bool
    led_log: LedLog
    changed: asyncio.Event = field(default_factory=asyncio.Event)  # HW, ISR or role moved
    # (first offset, bytes appended before it) of some of this leader's latest appends, at
    # least HOT_STEP_BYTES apart, oldest first, covering at most REPLICA_HOT_BYTES: see hot().
    recent: deque[tuple[int, int]] = field(default_factory=deque)
    appended_bytes: int = 0
    isr_change: asyncio.Task[None] | None = None
    active: bool = True

    def notify(self) -> None:
        self.changed.set()
        self.changed = asyncio.Event()

    def appended(self, first_offset: int, size: int) -> None:
        if not self.recent or self.appended_bytes - self.recent[-1][1] >= HOT_STEP_BYTES:
            self.recent.append((first_offset, self.appended_bytes))
        self.appended_bytes += size
        while self.recent and self.appended_bytes - self.recent[0][1] > REPLICA_HOT_BYTES:
            self.recent.popleft()

    def hot(self, offset: int) -> bool:
        """Whether reading from ``offset`` to the log end reads only what this leader appended
        among its last REPLICA_HOT_BYTES (in the page cache: cheap enough for the loop)."""
        return bool(self.recent) and offset >= self.recent[0][0]


@dataclass(eq=False)
class Following:
    partition: Partition
    replica: FollowerReplica
    fsync: bool
    backoff: bool = False  # fenced / not leader: wait for newer metadata
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)


class ReplicaManager:
    def __init__(
        self,
        config: ReplicationConfig,
        logs: LogManager,
        store: MetadataStore,
        clock: Clock,
        log_config: Callable[[str], LogConfig],
        *,
        credential: ClusterCredential | None = None,
    ) -> None:
        self.config = config
        # With authentication on, every h2c request carries and must present the cluster
        # credential (cluster.interbroker); None: authentication off, nothing checked.
        self.credential = credential
        self.me = config.broker_id
        self.logs = logs
        self.store = store
        self.clock = clock
        self.log_config = log_config
        self.broker_epoch = 0
        self.rows: dict[TopicPartition, PartitionMeta] = {}
        self.brokers: dict[int, BrokerMeta] = {}
        self.leading: dict[TopicPartition, Leading] = {}
        self.following: dict[TopicPartition, Following] = {}
        self.metadata_version = -1
        self._configs: dict[str, dict[str, Any]] = {}
        self._appended = asyncio.Event()  # replaced after every leader append
        # Leaders whose grouped appends (append_many) finished in this pass of the loop: the
        # fetches are woken and the high watermark advanced once for them, at its end.
        self._settling: dict[int, Leading] = {}
        self._fetchers: dict[int, asyncio.Task[None]] = {}
        self._fetcher_wake: dict[int, asyncio.Event] = {}
        self._clients: dict[int, H2Client] = {}
        self._closing: set[asyncio.Task[None]] = set()
        self._tasks: list[asyncio.Task[None]] = []
        self._last_heartbeat_ms = clock.monotonic_ms()
        self._apply_lock = asyncio.Lock()
        self.server: H2Server | None = None
        # Paths of the h2c listener: replica fetches, and what cluster.forwarding mounts.
        self.handlers: dict[str, Handler] = {wire.PATH: self.serve_fetch}
        self.metadata_applied = asyncio.Event()  # set after every apply (tests wait on it)
        self.on_topics: list[Callable[[list[TopicMeta]], None]] = []  # before roles change
        self.on_topics_changed: list[Callable[[], None]] = []
        # Told after leadership may have moved (an apply, a step-down): look at `leading`.
        self.on_roles_changed: list[Callable[[], None]] = []

    # -- lifecycle -------------------------------------------------------------------------------

    async def start_listener(self, host: str, port: int) -> int:
        limits = dataclasses.replace(
            DEFAULT_LIMITS, max_request_body_bytes=self.config.forward_max_bytes
        )
        self.server = H2Server(self._serve, host=host, port=port, limits=limits)
        await self.server.start()
        return self.server.port

    def start(self, broker_epoch: int) -> None:
        self.broker_epoch = broker_epoch
        self._last_heartbeat_ms = self._now_ms()
        self._tasks = [
            asyncio.create_task(self._heartbeats(), name="logbus-heartbeat"),
            asyncio.create_task(self._metadata_watch(), name="logbus-metadata"),
            asyncio.create_task(self._isr_checks(), name="logbus-isr"),
        ]

    async def close(self) -> None:
        for t in [*self._tasks, *self._fetchers.values()]:
            t.cancel()
        for t in [*self._tasks, *self._fetchers.values()]:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await t
        self._step_down_all("shutting down")
        if self.server is not None:
            await self.server.close()
        for c in self._clients.values():
            await c.close()

    # -- metadata --------------------------------------------------------------------------------

    async def refresh(self, *, force: bool = False) -> None:
        """Read the store now and apply what changed (everything with ``force``)."""
        version = await asyncio.to_thread(self.store.metadata_version)
        if version == self.metadata_version and not force:
            return
        topics, brokers = await asyncio.gather(
            asyncio.to_thread(self.store.topics), asyncio.to_thread(self.store.brokers)
        )
        await self.apply(version, topics, brokers)

    async def apply(self, version: int, topics: list[TopicMeta], brokers: list[BrokerMeta]) -> None:
        async with self._apply_lock:
            if version < self.metadata_version:
                # Two refreshes ran at once (the watcher and a caller's refresh) and the older
                # snapshot reached the lock second: applying it would bring back rows and
                # topics already replaced (a broker then lost a topic it had just created and
                # leads, and failed its start-up).
                return
            self.brokers = {b.broker_id: b for b in brokers}
            rows = {(r.topic, r.partition): r for t in topics for r in t.assignments}
            for listener in self.on_topics:
                listener(topics)
            for t in topics:
                if self._configs.get(t.name, t.configs) != t.configs:
                    await self.logs.update_config(t.name, LogConfig.from_dict(t.configs))
            self._configs = {t.name: t.configs for t in topics}
            local = {(t, p) for t, ps in self.logs.topics().items() for p in ps}
            gone = [tp for tp in local if tp not in rows]
            for tp in gone:
                await self._drop(tp)
            for tp, row in rows.items():
                if self.me not in row.replicas:
                    # Not a replica (any more): a reassignment moved it away, perhaps while
                    # this broker was down, so a copy without a role goes too.
                    if tp in self.leading or tp in self.following or tp in local:
                        await self._drop(tp)
                    continue
                part = await self._local(tp)
                config = self.log_config(tp[0])
                fsync = config.fsync_durability
                if row.leader == self.me:
                    await self._lead(tp, row, part, config, fsync)
                elif row.leader != NO_LEADER:
                    await self._follow(tp, row, part, fsync)
                else:
                    await self._stop_roles(tp, "partition offline")
            self.rows = rows
            self.metadata_version = version
            self.metadata_applied.set()
            self.metadata_applied = asyncio.Event()
        for changed in self.on_topics_changed:
            changed()
        self._roles_changed()

    def _roles_changed(self) -> None:
        for listener in self.on_roles_changed:
            listener()

    async def _local(self, tp: TopicPartition) -> Partition:
        try:
            return self.logs.get(*tp)
        except LogbusError:
            await self.logs.create_many(tp[0], [tp[1]], self.log_config(tp[0]))
            return self.logs.get(*tp)

    async def _drop(self, tp: TopicPartition) -> None:
        await self._stop_roles(tp, "partition removed")
        with contextlib.suppress(LogbusError):
            await self.logs.delete(*tp)

    async def _stop_roles(self, tp: TopicPartition, why: str) -> None:
        leading = self.leading.pop(tp, None)
        if leading is not None:
            leading.active = False
            leading.notify()
        following = self.following.pop(tp, None)
        if following is not None:
            async with following.lock:  # let an in-flight append or truncation finish
                pass

    async def _lead(
        self, tp: TopicPartition, row: PartitionMeta, part: Partition, cfg: LogConfig, fsync: bool
    ) -> None:
        state = _state(row)
        current = self.leading.get(tp)
        if current is not None and current.replica.leader_epoch == row.leader_epoch:
            current.fsync = current.replica.fsync_durability = fsync  # the config may change
            if row.partition_epoch > current.replica.state.partition_epoch:
                current.replica.apply(state)
                self._advance(current)
                current.notify()
            return
        await self._stop_roles(tp, "new leader epoch")
        await asyncio.to_thread(part.log.assign_leader_epoch, row.leader_epoch)
        replica = LeaderReplica(
            me=self.me,
            state=state,
            min_insync_replicas=cfg.min_insync_replicas,
            replica_lag_time_max_ms=self.config.replica_lag_time_max_ms,
            now_ms=self._now_ms(),
            high_watermark=part.high_watermark,
            epoch_start_offset=part.log_end_offset,
            fsync_durability=fsync,
        )
        self.leading[tp] = Leading(part, replica, fsync, LedLog(part.log))
        self._advance(self.leading[tp])
        log.info("%s-%d: leading in epoch %d, isr %s", *tp, row.leader_epoch, row.isr)

    async def _follow(
        self, tp: TopicPartition, row: PartitionMeta, part: Partition, fsync: bool
    ) -> None:
        current = self.following.get(tp)
        if (
            current is not None
            and current.replica.leader == row.leader
            and current.replica.leader_epoch == row.leader_epoch
        ):
            current.backoff = False
            current.fsync = fsync  # the topic's durability may have been altered
            return
        await self._stop_roles(tp, "following")
        self.following[tp] = Following(
            part, FollowerReplica(self.me, row.leader, row.leader_epoch), fsync
        )
        self._ensure_fetcher(row.leader)
        log.info("%s-%d: following %d in epoch %d", *tp, row.leader, row.leader_epoch)

    # -- leader: appends -------------------------------------------------------------------------

    def leader_of(self, topic: str, partition: int) -> Leading:
        """The partition as this broker leads it; NotLeaderError (421) naming the leader."""
        leading = self.leading.get((topic, partition))
        if leading is not None and leading.active and not self._lease_lapsed():
            return leading
        leader = self.leader_id(topic, partition)
        if leader == self.me:  # our lease lapsed: the rows we hold are stale, name nobody
            leader = NO_LEADER
        b = self.brokers.get(leader)
        raise NotLeaderError(
            f"broker {self.me} does not lead {topic}-{partition}"
            + (f"; broker {leader} does" if leader != NO_LEADER else "; it has no leader now"),
            leader_id=leader,
            leader_url=b.base_url if b is not None else None,
        )

    def leader_id(self, topic: str, partition: int) -> int:
        """The partition's leader as this broker last read it (NO_LEADER if none)."""
        row = self.rows.get((topic, partition))
        return row.leader if row is not None else NO_LEADER

    def follows(self, topic: str, partition: int) -> Partition | None:
        """This broker's replica of a partition it follows now (None otherwise)."""
        following = self.following.get((topic, partition))
        return following.partition if following is not None else None

    async def append(
        self,
        topic: str,
        partition: int,
        data: bytes | memoryview,
        *,
        wait_for_isr: bool,
        transactional: bool = False,
        checked: list[BatchHeader] | None = None,
    ) -> AppendResult:
        leading = self.leader_of(topic, partition)
        replica = leading.replica
        if wait_for_isr:
            _check_enough_replicas(topic, partition, replica)
        result = await leading.partition.append(
            data,
            leader_epoch=replica.leader_epoch,
            durable=leading.fsync and wait_for_isr,
            transactional=transactional,
            checked=checked,
        )
        if not result.duplicate:
            leading.appended(result.base_offset, result.size_bytes)
        self._wake_fetches()
        self._advance(leading)
        if wait_for_isr:  # a duplicate too: the first attempt may have timed out uncommitted
            await self._wait_committed(leading, result.last_offset + 1)
        return result

    async def append_many(
        self, topic: str, partition: int, datas: list[memoryview], *, wait_for_isr: bool
    ) -> list[AppendResult | BaseException]:
        """Several producers' appends to one partition (a forwarding broker's group), each as
        :meth:`append` would do it alone — started in order and concurrently, with its own
        leadership and ISR checks, its own result or error — but, with ``wait_for_isr``,
        waiting for the ISR together (:meth:`_wait_all_committed`): per append, that wait
        was a timer, an event wait and a wake-up, ≈ 12 % of the leader's CPU per forwarded
        one-record produce (cProfile, CPU clock)."""
        tasks = [self._append_unconfirmed(topic, partition, d, wait_for_isr) for d in datas]
        done = await asyncio.gather(*tasks, return_exceptions=True)
        outcomes: list[AppendResult | BaseException] = []
        waits: dict[int, tuple[Leading, dict[int, int]]] = {}
        for i, one in enumerate(done):
            if isinstance(one, BaseException):
                outcomes.append(one)
                continue
            result, leading = one
            outcomes.append(result)
            if wait_for_isr:  # a duplicate too, as in append
                waits.setdefault(id(leading), (leading, {}))[1][i] = result.last_offset + 1
        for leading, ends in waits.values():  # one leading, unless it changed meanwhile
            await self._wait_all_committed(leading, ends, outcomes)
        return outcomes

    async def _append_unconfirmed(
        self, topic: str, partition: int, data: memoryview, wait_for_isr: bool
    ) -> tuple[AppendResult, Leading]:
        """:meth:`append` of a non-transactional produce up to the wait for the ISR."""
        leading = self.leader_of(topic, partition)
        replica = leading.replica
        if wait_for_isr:
            _check_enough_replicas(topic, partition, replica)
        result = await leading.partition.append(
            data, leader_epoch=replica.leader_epoch, durable=leading.fsync and wait_for_isr
        )
        if not result.duplicate:
            leading.appended(result.base_offset, result.size_bytes)
        if not self._settling:
            asyncio.get_running_loop().call_soon(self._settle)
        self._settling[id(leading)] = leading
        return result, leading

    def _settle(self) -> None:
        """What :meth:`append` does after each append, once for the grouped appends of a pass
        (a group's appends are answered together, by one run): per append it was ≈ 5 % of the
        leader's CPU per forwarded produce (cProfile, CPU clock)."""
        settling, self._settling = self._settling, {}
        self._wake_fetches()
        for leading in settling.values():
            self._advance(leading)

    async def append_marker(
        self,
        topic: str,
        partition: int,
        producer_id: int,
        producer_epoch: int,
        commit: bool,
        coordinator_epoch: int,
    ) -> AppendResult:
        """Append a transaction marker as the leader, acknowledged like ``acks=all``: the
        coordinator completes a transaction only once every marker is committed."""
        leading = self.leader_of(topic, partition)
        replica = leading.replica
        _check_enough_replicas(topic, partition, replica)
        result = await leading.partition.append_marker(
            producer_id,
            producer_epoch,
            commit,
            coordinator_epoch,
            leader_epoch=replica.leader_epoch,
            durable=leading.fsync,
        )
        leading.appended(result.base_offset, result.size_bytes)
        self._wake_fetches()
        self._advance(leading)
        await self._wait_committed(leading, result.last_offset + 1)
        return result

    async def _wait_committed(self, leading: Leading, offset: int) -> None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.config.request_timeout_ms / 1000
        while True:
            lost = self._leadership_lost(leading)
            if lost is not None:
                raise lost
            if leading.partition.high_watermark >= offset:
                return
            remaining = deadline - loop.time()
            stalled = self._commit_stalled(leading, remaining)
            if stalled is not None:
                raise stalled
            changed = leading.changed
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(min(remaining, 0.25)):
                    await changed.wait()

    async def _wait_all_committed(
        self, leading: Leading, ends: dict[int, int], outcomes: list[AppendResult | BaseException]
    ) -> None:
        """:meth:`_wait_committed` for several appends at once (index in ``outcomes`` -> the
        offset it waits for): the same checks in the same order at each wake-up, each append
        done when the high watermark passes it, the rest given the error that ends the wait.
        One timer and one wake-up per change, not one per append."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.config.request_timeout_ms / 1000
        while ends:
            error = self._leadership_lost(leading)
            remaining = deadline - loop.time()
            if error is None:
                hw = leading.partition.high_watermark
                ends = {i: end for i, end in ends.items() if end > hw}
                if not ends:
                    return
                error = self._commit_stalled(leading, remaining)
            if error is not None:
                for i in ends:
                    outcomes[i] = error
                return
            changed = leading.changed
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(min(remaining, 0.25)):
                    await changed.wait()

    def _leadership_lost(self, leading: Leading) -> LogbusError | None:
        if not leading.active or self._lease_lapsed():
            return LogbusError(
                "leadership moved before the in-sync replicas had the records; they may "
                "or may not be kept: retry (an idempotent producer's retry is safe)",
                code=ErrorCode.NOT_LEADER_OR_FOLLOWER,
            )
        return None

    def _commit_stalled(self, leading: Leading, remaining_s: float) -> LogbusError | None:
        if not leading.replica.enough_replicas:
            return LogbusError(
                "the in-sync replicas fell below min.insync.replicas after the append",
                code=ErrorCode.NOT_ENOUGH_REPLICAS_AFTER_APPEND,
                isr=list(leading.replica.isr),
            )
        if remaining_s <= 0:
            return LogbusError(
                f"the in-sync replicas did not confirm within {self.config.request_timeout_ms} ms",
                code=ErrorCode.REQUEST_TIMED_OUT,
            )
        return None

    def _advance(self, leading: Leading) -> None:
        log_ = leading.partition.log
        if leading.replica.advance_high_watermark(log_.log_end_offset, log_.recovery_point):
            leading.partition.set_high_watermark(leading.replica.high_watermark)
            leading.notify()
            if leading.replica.followers_to_wake():
                self._wake_fetches()

    def _wake_fetches(self) -> None:
        self._appended.set()
        self._appended = asyncio.Event()

    # -- leader: serving follower fetches -------------------------------------------------------

    async def _serve(self, request: H2Request) -> H2Response:
        handler = self.handlers.get(request.path)
        if request.method != "POST" or handler is None:
            return H2Response(404, [], b"")
        if self.credential is not None and not self.credential.valid_headers(request.headers):
            return H2Response(401, [], b"inter-broker requests need the cluster credential")
        return await handler(request)

    def request_headers(self) -> list[tuple[str, str]]:
        """Headers every h2c request to another broker carries (the cluster credential)."""
        return self.credential.headers() if self.credential is not None else []

    async def serve_fetch(self, request: H2Request) -> H2Response:
        try:
            req = wire.decode_request(request.body)
        except wire.ReplicaWireError as e:
            return H2Response(400, [], str(e).encode())
        peer = self.brokers.get(req.broker_id)
        if peer is not None and req.broker_epoch < peer.broker_epoch:
            return H2Response(409, [], b"stale broker epoch")
        loop = asyncio.get_running_loop()
        deadline = loop.time() + max(0, min(req.max_wait_ms, 60_000)) / 1000
        while True:
            appended = self._appended
            answers, buffers, ready = await self._fetch_once(req)
            if ready or loop.time() >= deadline:
                break
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(deadline - loop.time()):
                    await appended.wait()
        return H2Response(
            200,
            [("content-type", wire.CONTENT_TYPE)],
            [wire.encode_answer(answers), *buffers],
        )

    async def _fetch_once(
        self, req: wire.ReplicaFetchRequest
    ) -> tuple[list[tuple[TopicPartition, PartitionFetchAnswer]], list[bytes], bool]:
        answers: list[tuple[TopicPartition, PartitionFetchAnswer]] = []
        buffers: list[bytes] = []
        total, ready = 0, False
        inline_left = REPLICA_INLINE_BYTES
        now = self._now_ms()
        for tp, position in req.positions.items():
            leading = self.leading.get(tp)
            if leading is None or not leading.active or self._lease_lapsed():
                answers.append((tp, _error(FetchError.NOT_LEADER_OR_FOLLOWER)))
                ready = True
                continue
            part = leading.partition
            decision = leading.replica.on_fetch(req.broker_id, position, leading.led_log, now)
            data = b""
            if decision.read_from is not None:
                self._advance(leading)
                self._schedule_isr_change(leading)
                room = min(req.partition_max_bytes, req.max_bytes - total)
                if room > 0 and part.log_end_offset > decision.read_from:
                    hot = room <= inline_left and leading.hot(decision.read_from)
                    try:
                        result = await part.read(
                            decision.read_from,
                            room,
                            max_offset=part.log_end_offset,
                            inline_max_bytes=room if hot else OFF_LOOP_IO_BYTES - 1,
                        )
                        data = result.data
                        if hot:
                            inline_left -= len(data)
                    except OffsetOutOfRangeError:
                        decision = type(decision)(error=FetchError.OFFSET_OUT_OF_RANGE)
                    except KafkaStorageError:
                        decision = type(decision)(error=FetchError.KAFKA_STORAGE_ERROR)
            hw = leading.replica.high_watermark
            if data or decision.read_from is None or position.high_watermark < hw:
                ready = True
            total += len(data)
            buffers.append(data)
            answers.append(
                (
                    tp,
                    PartitionFetchAnswer(
                        decision.error,
                        hw,
                        part.log_start_offset,
                        part.log_end_offset,
                        decision.diverging_epoch,
                        decision.diverging_end_offset,
                        len(data),
                    ),
                )
            )
        return answers, buffers, ready

    # -- leader: ISR ---------------------------------------------------------------------------

    def _schedule_isr_change(self, leading: Leading) -> None:
        if leading.isr_change is not None and not leading.isr_change.done():
            return
        alive = [b for b, m in self.brokers.items() if m.alive]
        proposed = leading.replica.proposed_isr(self._now_ms(), alive)
        if proposed is not None:
            leading.isr_change = asyncio.create_task(self._change_isr(leading, list(proposed)))

    async def _change_isr(self, leading: Leading, isr: list[int]) -> None:
        state = leading.replica.state
        part = leading.partition
        seen = PartitionMeta(
            part.topic,
            part.partition,
            list(state.replicas),
            list(state.isr),
            state.leader,
            state.leader_epoch,
            state.partition_epoch,
        )
        try:
            row = await asyncio.to_thread(
                self.store.change_isr, seen, isr, self.me, self.broker_epoch
            )
        except (ConcurrentUpdateError, KafkaStorageError) as e:
            log.info("%s-%d: ISR change to %s refused: %s", part.topic, part.partition, isr, e)
            return
        if leading.active and leading.replica.leader_epoch == row.leader_epoch:
            log.info("%s-%d: ISR %s -> %s", part.topic, part.partition, list(state.isr), isr)
            leading.replica.apply(_state(row))
            self.rows[(part.topic, part.partition)] = row
            self._advance(leading)
            leading.notify()

    async def _isr_checks(self) -> None:
        interval = max(0.01, self.config.replica_lag_time_max_ms / 2000)
        while True:
            await asyncio.sleep(interval)
            for leading in list(self.leading.values()):
                if leading.active:
                    self._schedule_isr_change(leading)

    # -- lease ---------------------------------------------------------------------------------

    def _lease_lapsed(self) -> bool:
        return self._now_ms() - self._last_heartbeat_ms > self.config.session_timeout_ms

    async def _heartbeats(self) -> None:
        while True:
            await asyncio.sleep(self.config.heartbeat_interval_ms / 1000)
            started = self._now_ms()
            try:
                ok = await asyncio.to_thread(
                    self.store.heartbeat,
                    self.me,
                    self.broker_epoch,
                    self.config.session_timeout_ms,
                )
            except KafkaStorageError:
                log.warning("heartbeat failed: metadata store unreachable")
                if self._lease_lapsed():
                    self._step_down_all("lease lapsed (metadata store unreachable)")
                continue
            if ok:
                self._last_heartbeat_ms = started
                continue
            self._step_down_all("lease expired: fenced")
            await self._reregister()

    async def _reregister(self) -> None:
        me = self.brokers.get(self.me)
        if me is None:
            return
        try:
            started = self._now_ms()
            self.broker_epoch = await asyncio.to_thread(
                self.store.register_broker, me, self.config.session_timeout_ms
            )
            self._last_heartbeat_ms = started
            log.warning("registered again as broker %d epoch %d", self.me, self.broker_epoch)
            self.metadata_version = -1  # take every role afresh
        except KafkaStorageError:
            log.warning("could not register again: metadata store unreachable")

    def _step_down_all(self, why: str) -> None:
        if self.leading:
            log.warning("stepping down from %d partitions: %s", len(self.leading), why)
        for leading in self.leading.values():
            leading.active = False
            leading.notify()
        self.leading.clear()
        self._roles_changed()

    async def _metadata_watch(self) -> None:
        while True:
            try:
                await self.refresh()
            except KafkaStorageError:
                log.warning("metadata refresh failed: store unreachable")
            except LogbusError as e:
                log.warning("metadata refresh failed: %s", e)
            await asyncio.sleep(self.config.metadata_refresh_interval_ms / 1000)

    # -- follower: fetchers --------------------------------------------------------------------

    def _ensure_fetcher(self, leader: int) -> None:
        wake = self._fetcher_wake.setdefault(leader, asyncio.Event())
        wake.set()
        task = self._fetchers.get(leader)
        if task is None or task.done():
            self._fetchers[leader] = asyncio.create_task(
                self._fetch_from(leader), name=f"logbus-fetcher-{leader}"
            )

    def client_for(self, leader: int) -> H2Client | None:
        """The h2c connection to a broker (shared by fetchers and forwarded requests)."""
        b = self.brokers.get(leader)
        if b is None or not b.replication_port:
            return None
        client = self._clients.get(leader)
        if client is None or (client.host, client.port) != (b.host, b.replication_port):
            if client is not None:  # the leader moved to another port (restarted)
                closing = asyncio.create_task(client.close())
                self._closing.add(closing)
                closing.add_done_callback(self._closing.discard)
            client = self._clients[leader] = H2Client(b.host, b.replication_port)
        return client

    async def _fetch_from(self, leader: int) -> None:
        wake = self._fetcher_wake[leader]
        while True:
            mine = {
                tp: f
                for tp, f in self.following.items()
                if f.replica.leader == leader and not f.backoff
            }
            client = self.client_for(leader)
            if not mine or client is None:
                wake.clear()
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(1.0):
                        await wake.wait()
                continue
            try:
                await self._fetch_round(leader, client, mine)
            except (OSError, TimeoutError, wire.ReplicaWireError) as e:
                log.debug("fetch from broker %d failed: %s", leader, e)
                await asyncio.sleep(FETCH_BACKOFF_S)

    async def _fetch_round(
        self, leader: int, client: H2Client, mine: dict[TopicPartition, Following]
    ) -> None:
        sent: dict[TopicPartition, FetchPosition] = {}
        for tp, f in mine.items():
            lg = f.partition.log
            sent[tp] = f.replica.position(
                lg, lg.latest_epoch, lg.recovery_point, f.partition.high_watermark
            )
        req = wire.ReplicaFetchRequest(
            self.me,
            self.broker_epoch,
            self.config.fetch_wait_max_ms,
            self.config.fetch_response_max_bytes,
            self.config.fetch_max_bytes,
            sent,
        )
        timeout_s = (self.config.fetch_wait_max_ms + self.config.socket_timeout_ms) / 1000
        response = await client.request(
            "POST",
            wire.PATH,
            headers=self.request_headers(),
            body=wire.encode_request(req),
            timeout_s=timeout_s,
        )
        if response.status != 200:
            raise OSError(f"replica fetch answered {response.status}")
        body = response.body if isinstance(response.body, bytes) else b"".join(response.body)
        backoff = False
        inline_left = REPLICA_INLINE_BYTES
        for tp, answer, data in wire.decode_answer(body):
            following = self.following.get(tp)
            if following is None or following is not mine.get(tp) or tp not in sent:
                continue  # the role changed while the fetch was out
            inline = OFF_LOOP_IO_BYTES - 1  # the default: small appends run inline anyway
            if len(data) <= inline_left:
                inline = max(inline, len(data))
                inline_left -= len(data)
            async with following.lock:
                if self.following.get(tp) is not following:
                    continue
                backoff |= await self._apply_answer(following, sent[tp], answer, data, inline)
        if backoff:
            await asyncio.sleep(FETCH_BACKOFF_S)

    async def _apply_answer(
        self,
        f: Following,
        sent: FetchPosition,
        answer: PartitionFetchAnswer,
        data: memoryview,
        inline_max_bytes: int = OFF_LOOP_IO_BYTES - 1,
    ) -> bool:
        part, lg = f.partition, f.partition.log
        action = f.replica.on_answer(sent, answer, lg)
        if action.kind is FollowerActionKind.BACK_OFF:
            if action.error in (FetchError.FENCED_LEADER_EPOCH, FetchError.NOT_LEADER_OR_FOLLOWER):
                f.backoff = True  # until the metadata names a leader again
                self.metadata_version = -1
            return True
        if action.kind is FollowerActionKind.TRUNCATE:
            log.info("%s-%d: truncating to %d", part.topic, part.partition, action.offset)
            await asyncio.to_thread(lg.truncate_to, action.offset)
            return False
        if action.kind is FollowerActionKind.RESTART_AT:
            log.info("%s-%d: restarting at %d", part.topic, part.partition, action.offset)
            await asyncio.to_thread(lg.truncate_fully_and_start_at, action.offset)
            return False
        if len(data):
            # A view of the response body (immutable bytes), appended byte for byte, no copy.
            await part.append(
                data, as_follower=True, durable=f.fsync, inline_max_bytes=inline_max_bytes
            )
        # The HW first: the log start may not pass it, and records below the leader's log start
        # (which may differ from what the leader deleted) must go in this same step.
        part.set_high_watermark(FollowerReplica.high_watermark(answer, lg.log_end_offset))
        if answer.log_start_offset > lg.log_start_offset:
            with contextlib.suppress(LogbusError):
                await asyncio.to_thread(lg.increment_log_start_offset, answer.log_start_offset)
        return False

    def _now_ms(self) -> int:
        return int(self.clock.monotonic_ms())

    # -- introspection ---------------------------------------------------------------------------

    def describe(self, tp: TopicPartition) -> dict[str, Any]:
        row = self.rows.get(tp)
        return {"row": row, "leading": tp in self.leading, "following": tp in self.following}


def _state(row: PartitionMeta) -> PartitionState:
    return PartitionState(
        tuple(row.replicas), tuple(row.isr), row.leader, row.leader_epoch, row.partition_epoch
    )


def _error(error: FetchError) -> PartitionFetchAnswer:
    return PartitionFetchAnswer(error, -1, -1, -1)


def _check_enough_replicas(topic: str, partition: int, replica: LeaderReplica) -> None:
    """NOT_ENOUGH_REPLICAS (retriable, nothing written) when an acks=all write could not be
    committed: fewer in-sync replicas than ``min.insync.replicas``."""
    if not replica.enough_replicas:
        raise LogbusError(
            f"{topic}-{partition} has {len(replica.isr)} in-sync replicas, fewer than "
            f"min.insync.replicas={replica.min_insync_replicas}",
            code=ErrorCode.NOT_ENOUGH_REPLICAS,
            isr=list(replica.isr),
        )
