"""A broker: the metadata store and the local logs, kept consistent.

Theory of operation
-------------------
* The metadata store decides; the logs follow. Creating a topic commits its row first and then
  creates the partition logs; deleting removes the row first and then the logs. At start the
  broker reconciles: logs missing for a known partition are created, logs with no topic row are
  deleted — so a crash between the two steps heals itself.
* A single broker leads every partition at leader epoch 0, its ISR is itself, and the high
  watermark follows the log end but never passes an append that must be fsynced first
  (``acks=all``, or the one reaching ``flush.messages``) before an fsync covers it
  (:attr:`core_log.log.PartitionLog.committable_offset`): ``acks=all`` answers after that fsync
  (group-committed with every concurrent append), its records durable and visible;
  ``acks=1`` after the write to the log (page cache: survives a process crash, not a power
  cut); ``acks=0`` the same, without offsets.
* Topic configs live in the store; a change is applied to the open logs at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import re
import uuid
import zlib
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from core_log.batch import HEADER_BYTES, BatchHeader, parse_header
from core_log.clock import Clock, SystemClock
from core_log.config import KEYS_BY_NAME, LogConfig
from core_log.datadir import DataDirLock
from core_log.errors import (
    ErrorCode,
    InvalidConfigError,
    InvalidTopicError,
    LogbusError,
    UnknownTopicOrPartitionError,
)
from core_log.limits import DEFAULT_MAX_BROKER_PARTITIONS, MAX_PARTITIONS_PER_TOPIC
from core_log.log import AppendResult
from core_log.manager import LogManager, Partition, answered_by, validate_topic_name

from .controller import (
    Controller,
    ReassignmentConflict,
    ReassignmentError,
    assign_replicas,
    cancel_reassignment,
    drain_plan,
    live_placement,
    start_reassignment,
    validate_target,
)
from .forwarding import PATHS as FORWARDED_PATHS
from .forwarding import (
    FollowerPartition,
    Forwarder,
    PartitionReader,
    PartitionService,
    direct_route,
    synced,
)
from .interbroker import ClusterCredential
from .metadata import (
    BrokerMeta,
    ConcurrentUpdateError,
    MetadataStore,
    PartitionMeta,
    TopicMeta,
)
from .partitioner import StickyPartitioner, partition_for_key
from .replica_manager import ReplicaManager, ReplicationConfig
from .txn_state import TXN_STATE_TOPIC

_TRANSACTIONAL_ID = re.compile(r"[a-zA-Z0-9._-]{1,249}")
BROKER_LEASE_MS = 30_000
OFFSETS_TOPIC = "__consumer_offsets"  # committed offsets, written by cluster.coordinator only
# Written by their coordinators only: committed offsets, and transactions' state
# (cluster.txn_coordinator).
INTERNAL_TOPICS = frozenset({OFFSETS_TOPIC, TXN_STATE_TOPIC})
# Configs of internal topics nobody may change: the offsets topic must stay compacted.
INTERNAL_FIXED_CONFIGS = frozenset({"cleanup.policy"})
T = TypeVar("T")


class Acks(enum.Enum):
    NONE = "0"
    LEADER = "1"
    ALL = "all"

    @classmethod
    def parse(cls, raw: str | None) -> Acks:
        if raw is None:
            return cls.ALL
        acks = _ACKS.get(raw)  # a dict, not ``cls(raw)``: an Enum call costs ≈ 1 µs a request
        if acks is None:
            raise LogbusError(
                f"acks must be 0, 1 or all (got {raw!r})", code=ErrorCode.INVALID_REQUIRED_ACKS
            )
        return acks


_ACKS = {"0": Acks.NONE, "1": Acks.LEADER, "all": Acks.ALL, "-1": Acks.ALL}


@dataclass(frozen=True)
class BrokerConfig:
    data_dir: Path
    broker_id: int = 1
    host: str = "127.0.0.1"
    port: int = 8080
    rack: str | None = None
    metadata_url: str | None = None  # default: SQLite in the data directory
    max_open_handles: int = 1024
    retention_check_interval_ms: int = 300_000
    log_cleaner_backoff_ms: int = 15_000
    # Idempotency-Key window; producer state per partition keeps the same horizon (Kafka's
    # producer.id.expiration.ms default) and at most 10,000 producers (core_log.producer_state).
    idempotency_window_ms: int = 86_400_000
    max_broker_partitions: int = DEFAULT_MAX_BROKER_PARTITIONS  # internal topics included
    # The replicated cluster: on when a metadata URL is given (brokers sharing it form one).
    advertised_url: str | None = None
    replication_port: int = 0  # 0 = ephemeral, advertised through the store
    replication_advertised_port: int = 0  # what peers are told, if not the bound port
    replication: ReplicationConfig | None = None
    default_replication_factor: int = 1
    auto_leader_rebalance_enable: bool = True
    leader_imbalance_check_interval_ms: int = 300_000

    @property
    def clustered(self) -> bool:
        return self.metadata_url is not None


# Describing a topic asks each partition's leader for its offsets: a few at a time, briefly.
DESCRIBE_CONCURRENCY = 32
DESCRIBE_TIMEOUT_S = 2.0
# A reassignment races only the controller's own passes on the same row: a few tries suffice.
REASSIGN_ATTEMPTS = 5


@dataclass(frozen=True)
class PartitionHealth:
    total: int = 0
    under_replicated: int = 0
    under_min_isr: int = 0
    offline: int = 0
    unclean_elections: int = 0

    @classmethod
    def of(cls, topics: list[TopicMeta]) -> PartitionHealth:
        total = under = below_min = offline = unclean = 0
        for t in topics:
            min_isr = LogConfig.from_dict(t.configs).min_insync_replicas
            for a in t.assignments:
                total += 1
                # Kafka's rule during a reassignment: the target's size, not the union's.
                rf = len(a.target_replicas)
                under += len(a.isr) < rf
                below_min += len(a.isr) < min(min_isr, rf)
                offline += a.leader < 0
                unclean += a.unclean_elections
        return cls(total, under, below_min, offline, unclean)


@dataclass(frozen=True)
class ClusterView:
    """What ``GET /v1/cluster`` shows, read from the store in one go."""

    brokers: list[BrokerMeta]
    controller: int
    health: PartitionHealth


class Broker:
    def __init__(
        self,
        config: BrokerConfig,
        *,
        clock: Clock | None = None,
        dir_lock: DataDirLock | None = None,
        credential: ClusterCredential | None = None,
    ) -> None:
        """``dir_lock``: the data directory's lock if the caller holds it already.
        ``credential``: with authentication on, what inter-broker requests carry and must
        present (:mod:`cluster.interbroker`); None: not checked."""
        self.config = config
        self.credential = credential
        self.clock = clock or SystemClock()
        self.data_dir = config.data_dir
        self.metadata: MetadataStore | None = None
        self.broker_epoch = 0
        self._topics: dict[str, TopicMeta] = {}
        # Each topic's LogConfig, built once per version of its metadata (a produce asks for
        # it; building it from the overrides cost ≈ 11 µs per request).
        self._log_configs: dict[str, tuple[TopicMeta, LogConfig]] = {}
        self._producer_epochs: dict[int, int] = {}  # named producers: latest epoch handed out
        # Coordinator operations by name (:meth:`coordinator_call`) and listeners of the
        # markers committed on partitions led here (:meth:`write_marker`); in a cluster both
        # live on the partition service, which answers other brokers too.
        self.coordinator_ops: dict[str, Callable[[dict[str, Any]], Awaitable[dict[str, Any]]]] = {}
        self.marker_listeners: list[Callable[[str, int, int, bool], None]] = []
        self.logs = LogManager(
            config.data_dir,
            clock=self.clock,
            config_for=self.log_config,
            max_open_handles=config.max_open_handles,
            retention_check_interval_ms=config.retention_check_interval_ms,
            dir_lock=dir_lock,
            cleaner_backoff_ms=config.log_cleaner_backoff_ms,
            # In a cluster the replica manager moves the high watermark (over the ISR).
            auto_high_watermark=not config.clustered,
        )
        self.replicas: ReplicaManager | None = None
        self.forwarder: Forwarder | None = None
        self.controller: Controller | None = None
        self._controller_task: asyncio.Task[None] | None = None
        self.sticky = StickyPartitioner()
        self._admin_lock = asyncio.Lock()
        self.topic_listeners: list[Callable[[], None]] = []  # told of partition/topic changes
        # Told when this broker may have gained or lost the leadership of partitions.
        self.role_listeners: list[Callable[[], None]] = []
        self.ready = False

    # -- lifecycle -------------------------------------------------------------------------------

    async def start(self) -> None:
        """Lock the data directory first (a second broker on it fails here, having touched
        nothing), then open the metadata store and the logs."""
        self.logs.lock_data_dir()
        try:
            await self._start_locked()
        except BaseException:
            if not self.logs.started:
                self.logs.unlock_data_dir()
            raise

    async def _start_locked(self) -> None:
        url = self.config.metadata_url or f"sqlite:///{self.data_dir / 'metadata.db'}"
        self.metadata = await asyncio.to_thread(MetadataStore, url)
        if self.config.clustered:
            await self._start_clustered()
            return
        self.broker_epoch = await asyncio.to_thread(
            self.metadata.register_broker,
            BrokerMeta(self.config.broker_id, self.config.host, self.config.port, self.config.rack),
            BROKER_LEASE_MS,
        )
        self._topics = {t.name: t for t in await asyncio.to_thread(self.metadata.topics)}
        self._producer_epochs = await asyncio.to_thread(self.metadata.producer_epochs)
        await self.logs.start()
        await self._reconcile()
        self.ready = True

    async def _start_clustered(self) -> None:
        """Open the logs, listen for replica fetches, register with a lease, take the roles the
        store gives this broker, and run for the controller lease."""
        cfg = self.config
        rcfg = cfg.replication or ReplicationConfig(broker_id=cfg.broker_id)
        await self.logs.start()
        self.replicas = ReplicaManager(
            rcfg, self.logs, self.store, self.clock, self.log_config, credential=self.credential
        )
        self.replicas.on_topics.append(self._set_topics)
        self.replicas.on_topics_changed.append(self._topics_changed)
        self.replicas.on_roles_changed.append(self._roles_changed)
        service = PartitionService(self.replicas)
        service.coordinator_ops = self.coordinator_ops  # shared: registered on the broker
        service.marker_listeners = self.marker_listeners
        for path in FORWARDED_PATHS:
            self.replicas.handlers[path] = service.handle
        self.forwarder = Forwarder(self.replicas, service)
        port = await self.replicas.start_listener(cfg.host, cfg.replication_port)
        port = cfg.replication_advertised_port or port
        me = BrokerMeta(cfg.broker_id, cfg.host, cfg.port, cfg.rack, cfg.advertised_url or "", port)
        self.broker_epoch = await asyncio.to_thread(
            self.store.register_broker, me, rcfg.session_timeout_ms
        )
        self._producer_epochs = await asyncio.to_thread(self.store.producer_epochs)
        self.replicas.start(self.broker_epoch)
        await self.replicas.refresh()
        self.controller = Controller(
            self.store,
            cfg.broker_id,
            lease_ms=rcfg.session_timeout_ms,
            interval_ms=rcfg.heartbeat_interval_ms,
            rebalance_interval_ms=cfg.leader_imbalance_check_interval_ms,
            auto_rebalance=cfg.auto_leader_rebalance_enable,
            unclean_for=lambda t: self.log_config(t).unclean_leader_election,
            monotonic_ms=lambda: int(self.clock.monotonic_ms()),
            min_insync_for=lambda t: self.log_config(t).min_insync_replicas,
        )
        self._controller_task = asyncio.create_task(self.controller.run(), name="logbus-ctl")
        self.ready = True

    def _set_topics(self, topics: list[TopicMeta]) -> None:
        self._topics = {t.name: t for t in topics}

    async def _reconcile(self) -> None:
        on_disk = self.logs.topics()
        for name, topic in self._topics.items():
            have = set(on_disk.get(name, []))
            missing = [p for p in range(topic.partitions) if p not in have]
            if missing:
                await self.logs.create_many(name, missing, self.log_config(name))
        for name, partitions in on_disk.items():
            count = self._topics[name].partitions if name in self._topics else 0
            for p in partitions:
                if p >= count:
                    await self.logs.delete(name, p)

    async def close(self) -> None:
        self.ready = False
        if self._controller_task is not None:
            self._controller_task.cancel()
            with contextlib.suppress(BaseException):
                await self._controller_task
        if self.replicas is not None:
            await self.replicas.close()
            with contextlib.suppress(Exception):
                if self.controller is not None:
                    await self.controller.resign()
                await asyncio.to_thread(
                    self.store.expire_broker, self.config.broker_id, self.broker_epoch
                )
        await self.logs.close()
        if self.metadata is not None:
            self.metadata.close()

    @property
    def store(self) -> MetadataStore:
        assert self.metadata is not None, "broker not started"
        return self.metadata

    async def cluster_view(self) -> ClusterView:
        """Brokers, the controller and partition health, from the store (SQL off the loop)."""
        store = self.store

        def read() -> ClusterView:
            ctl = store.controller()
            controller = ctl.broker_id if ctl is not None and ctl.alive else -1
            if not self.config.clustered:
                controller = self.config.broker_id  # one broker controls itself
            return ClusterView(store.brokers(), controller, PartitionHealth.of(store.topics()))

        return await asyncio.to_thread(read)

    # -- topics ----------------------------------------------------------------------------------

    def log_config(self, topic: str) -> LogConfig:
        meta = self._topics.get(topic)
        if meta is None:
            self._log_configs.pop(topic, None)
            return LogConfig()
        cached = self._log_configs.get(topic)
        if cached is not None and cached[0] is meta:
            return cached[1]
        config = LogConfig.from_dict(meta.configs)
        self._log_configs[topic] = (meta, config)
        return config

    def topics(self) -> list[TopicMeta]:
        return sorted(self._topics.values(), key=lambda t: t.name)

    def topic(self, name: str) -> TopicMeta:
        try:
            return self._topics[name]
        except KeyError:
            raise UnknownTopicOrPartitionError(f"unknown topic {name!r}", topic=name) from None

    async def create_topic(
        self,
        name: str,
        partitions: int = 1,
        replication_factor: int | None = None,
        configs: dict[str, Any] | None = None,
    ) -> TopicMeta:
        """``replication_factor`` None: the broker's ``default_replication_factor``."""
        validate_topic_name(name)
        _check_partition_count(partitions)
        if replication_factor is None:
            replication_factor = self.config.default_replication_factor
        if self.config.clustered:
            return await _completed(
                self._create_replicated(name, partitions, replication_factor, configs or {})
            )
        if replication_factor != 1:
            raise LogbusError(
                f"replication factor {replication_factor} is larger than the 1 available broker",
                code=ErrorCode.INVALID_REPLICATION_FACTOR,
            )
        log_config = LogConfig.from_dict(configs or {})
        me = self.config.broker_id
        meta = TopicMeta(
            name=name,
            topic_id=uuid.uuid4().hex,
            partitions=partitions,
            replication_factor=replication_factor,
            configs=log_config.overrides(),
            created_ms=self.clock.now_ms(),
            version=0,
            assignments=[PartitionMeta(name, p, [me], [me], me, 0, 0) for p in range(partitions)],
        )
        return await _completed(self._create_topic(meta, log_config))

    async def _create_topic(self, meta: TopicMeta, log_config: LogConfig) -> TopicMeta:
        async with self._admin_lock:
            self._check_name_free(meta.name)
            self._check_broker_partitions(meta.partitions)
            await asyncio.to_thread(self.store.create_topic, meta)
            self._topics[meta.name] = meta
            try:
                await self.logs.create_many(meta.name, list(range(meta.partitions)), log_config)
            except BaseException:
                del self._topics[meta.name]
                await asyncio.to_thread(self.store.delete_topic, meta.name)
                raise
        return meta

    async def _create_replicated(
        self, name: str, partitions: int, replication_factor: int, configs: dict[str, Any]
    ) -> TopicMeta:
        log_config = LogConfig.from_dict(configs)
        async with self._admin_lock:
            self._check_name_free(name)
            placement = live_placement(await asyncio.to_thread(self.store.brokers))
            start = sum(t.partitions for t in self._topics.values())
            try:
                plan = assign_replicas(placement, partitions, replication_factor, start)
            except ValueError as e:
                raise LogbusError(str(e), code=ErrorCode.INVALID_REPLICATION_FACTOR) from None
            meta = TopicMeta(
                name=name,
                topic_id=uuid.uuid4().hex,
                partitions=partitions,
                replication_factor=replication_factor,
                configs=log_config.overrides(),
                created_ms=self.clock.now_ms(),
                version=0,
                assignments=[
                    PartitionMeta(name, p, r, list(r), r[0], 0, 0) for p, r in enumerate(plan)
                ],
            )
            await asyncio.to_thread(self.store.create_topic, meta)
            await self.cluster.refresh()
        return self.topic(name)

    @property
    def cluster(self) -> ReplicaManager:
        assert self.replicas is not None, "not a clustered broker"
        return self.replicas

    def _check_name_free(self, name: str) -> None:
        """Kafka's rule: ``.`` and ``_`` collide in metric names, so ``a.b`` and ``a_b`` cannot
        both exist."""
        folded = name.replace(".", "_")
        for other in self._topics:
            if other != name and other.replace(".", "_") == folded:
                raise InvalidTopicError(
                    f"topic {name!r} collides with existing topic {other!r}: names that differ "
                    f"only in '.' and '_' would share metric names",
                    topic=name,
                    collides_with=other,
                )

    def _check_broker_partitions(self, adding: int) -> None:
        cap = self.config.max_broker_partitions
        have = sum(t.partitions for t in self._topics.values())
        if have + adding > cap:
            raise LogbusError(
                f"the broker holds {have} partitions; {adding} more would pass its limit of "
                f"{cap} (max_broker_partitions)",
                code=ErrorCode.POLICY_VIOLATION,
                partitions=have,
                max_broker_partitions=cap,
            )

    async def delete_topic(self, name: str) -> None:
        _check_not_internal(name)
        async with self._admin_lock:
            topic = self.topic(name)
            await asyncio.to_thread(self.store.delete_topic, name)
            if self.replicas is not None:
                await self.replicas.refresh()
            else:
                del self._topics[name]
                await self.logs.delete_many(name, list(range(topic.partitions)))
        self._topics_changed()

    def _topics_changed(self) -> None:
        for listener in self.topic_listeners:
            listener()

    def _roles_changed(self) -> None:
        for listener in self.role_listeners:
            listener()

    async def alter_configs(self, name: str, changes: dict[str, Any]) -> TopicMeta:
        """Set keys to new values; a ``None`` value resets the key to its default."""
        async with self._admin_lock:
            topic = self.topic(name)
            merged = {k: v for k, v in topic.configs.items() if k not in changes}
            merged.update({k: v for k, v in changes.items() if v is not None})
            unknown = sorted(set(changes) - set(KEYS_BY_NAME))
            if unknown:
                raise InvalidConfigError(f"unknown configs {unknown}", config=unknown[0])
            if name in INTERNAL_TOPICS and INTERNAL_FIXED_CONFIGS & set(changes):
                raise LogbusError(
                    f"{name} is internal: its {sorted(INTERNAL_FIXED_CONFIGS)} cannot change "
                    f"(a delete policy would erase every group's committed offsets or every "
                    f"transaction's state)",
                    code=ErrorCode.POLICY_VIOLATION,
                    topic=name,
                )
            log_config = LogConfig.from_dict(merged)
            updated = await asyncio.to_thread(
                self.store.update_topic, name, topic.version, configs=log_config.overrides()
            )
            self._topics[name] = updated
            await self.logs.update_config(name, log_config)
            return updated

    async def add_partitions(self, name: str, total: int) -> TopicMeta:
        updated = await _completed(self._add_partitions(name, total))
        self._topics_changed()
        return updated

    async def _add_partitions(self, name: str, total: int) -> TopicMeta:
        async with self._admin_lock:
            topic = self.topic(name)
            if name in INTERNAL_TOPICS:
                raise LogbusError(
                    f"{name} is internal: its partition count is fixed (groups and "
                    f"transactional ids are placed by a hash modulo {topic.partitions})",
                    code=ErrorCode.POLICY_VIOLATION,
                    topic=name,
                )
            _check_partition_count(total)
            if total <= topic.partitions:
                raise LogbusError(
                    f"topic {name!r} has {topic.partitions} partitions; the new count must be "
                    f"larger (partitions can only be added)",
                    code=ErrorCode.INVALID_PARTITIONS,
                )
            self._check_broker_partitions(total - topic.partitions)
            new = await self._new_partitions(name, topic.partitions, total, topic)
            updated = await asyncio.to_thread(
                self.store.update_topic, name, topic.version, add_partitions=new
            )
            self._topics[name] = updated
            if self.replicas is not None:
                await self.replicas.refresh()
                return updated
            # A crash before the logs exist is healed at start (_reconcile creates them).
            await self.logs.create_many(name, [p.partition for p in new], self.log_config(name))
        return updated

    async def _new_partitions(
        self, name: str, first: int, total: int, topic: TopicMeta
    ) -> list[PartitionMeta]:
        me = self.config.broker_id
        if self.replicas is None:
            return [PartitionMeta(name, p, [me], [me], me, 0, 0) for p in range(first, total)]
        placement = live_placement(await asyncio.to_thread(self.store.brokers))
        try:
            plan = assign_replicas(placement, total - first, topic.replication_factor, first)
        except ValueError as e:
            raise LogbusError(str(e), code=ErrorCode.INVALID_REPLICATION_FACTOR) from None
        return [
            PartitionMeta(name, p, r, list(r), r[0], 0, 0)
            for p, r in zip(range(first, total), plan, strict=True)
        ]

    # -- reassignment ----------------------------------------------------------------------------

    async def reassign_partition(
        self, topic: str, partition: int, target: list[int]
    ) -> PartitionMeta:
        """Start moving a partition to the ``target`` replicas (KIP-455, see
        :mod:`cluster.controller`): the row as written, with ``adding_replicas`` /
        ``removing_replicas`` set while the move runs (none when nothing had to be copied, e.g.
        a new order of the same brokers). Answered by the controller's broker."""
        return await _completed(self._partition_change(topic, partition, target))

    async def cancel_reassignment(self, topic: str, partition: int) -> PartitionMeta:
        """Put a partition being reassigned back on its original replicas."""
        return await _completed(self._partition_change(topic, partition, None))

    async def _partition_change(
        self, topic: str, partition: int, target: list[int] | None
    ) -> PartitionMeta:
        async with self._admin_lock:
            for _ in range(REASSIGN_ATTEMPTS):
                # From the store, not this broker's copy: the call may reach the controller
                # before its metadata poll has seen a topic created a moment ago elsewhere.
                row, min_insync, brokers = await asyncio.to_thread(
                    self._row_and_brokers, topic, partition
                )
                live = {b for b, alive in brokers.items() if alive}
                try:
                    if target is not None:
                        validate_target(row, target, brokers, min_insync)
                        new = start_reassignment(row, target)
                    else:
                        new = cancel_reassignment(row, live, min_insync)
                except ReassignmentError as e:
                    raise LogbusError(
                        str(e), code=ErrorCode.INVALID_REPLICA_ASSIGNMENT, topic=topic
                    ) from None
                except ReassignmentConflict as e:
                    code = ErrorCode.REASSIGNMENT_IN_PROGRESS
                    if not e.in_progress:
                        code = ErrorCode.NO_REASSIGNMENT_IN_PROGRESS
                    raise LogbusError(str(e), code=code, topic=topic) from None
                if new is None:
                    return row
                if await self._controller_change(row, new):
                    await self.refresh_metadata()
                    return new
        raise ConcurrentUpdateError(f"{topic}-{partition} kept changing meanwhile; retry")

    def _row_and_brokers(
        self, topic: str, partition: int
    ) -> tuple[PartitionMeta, int, dict[int, bool]]:
        """(the partition's row, its topic's min.insync.replicas, broker id -> alive)."""
        meta = self.store.topic(topic)
        if not 0 <= partition < len(meta.assignments):
            raise UnknownTopicOrPartitionError(
                f"topic {topic!r} has no partition {partition}", topic=topic, partition=partition
            )
        min_insync = LogConfig.from_dict(meta.configs).min_insync_replicas
        brokers = {b.broker_id: b.alive for b in self.store.brokers()}
        if not self.config.clustered:
            brokers = {self.config.broker_id: True}
        return meta.assignments[partition], min_insync, brokers

    async def _controller_change(self, row: PartitionMeta, new: PartitionMeta) -> bool:
        if self.controller is None or not self.controller.active:
            raise LogbusError(
                f"broker {self.config.broker_id} is not the controller now (the controller "
                "answers reassignments; any broker forwards them to it): retry",
                code=ErrorCode.NOT_CONTROLLER,
            )
        try:
            return await self.controller.change(row, new)
        except ConcurrentUpdateError:
            raise LogbusError(
                f"broker {self.config.broker_id} lost the controller lease: retry",
                code=ErrorCode.NOT_CONTROLLER,
            ) from None

    async def drain_plan(self, broker_id: int) -> dict[tuple[str, int], list[int]]:
        """Targets moving every replica off ``broker_id`` (see
        :func:`cluster.controller.drain_plan`); nothing is changed."""
        brokers, topics = await asyncio.gather(
            asyncio.to_thread(self.store.brokers), asyncio.to_thread(self.store.topics)
        )
        if broker_id not in {b.broker_id for b in brokers}:
            raise LogbusError(
                f"unknown broker id {broker_id}", code=ErrorCode.INVALID_REPLICA_ASSIGNMENT
            )
        rows = [r for t in topics for r in t.assignments]
        try:
            return drain_plan(rows, broker_id, live_placement(brokers))
        except ReassignmentError as e:
            raise LogbusError(str(e), code=ErrorCode.INVALID_REPLICA_ASSIGNMENT) from None

    # -- producers -------------------------------------------------------------------------------

    async def init_producer(self, transactional_id: str | None) -> tuple[int, int]:
        """A producer id and epoch for an idempotent producer session (see MetadataStore)."""
        if transactional_id is not None and not _TRANSACTIONAL_ID.fullmatch(transactional_id):
            raise LogbusError(
                "transactional_id must be 1..249 of [a-zA-Z0-9._-]", code=ErrorCode.INVALID_REQUEST
            )
        pid, epoch = await asyncio.to_thread(self.store.init_producer, transactional_id)
        if transactional_id is not None:
            self._producer_epochs[pid] = epoch
        return pid, epoch

    def note_producer_epoch(self, producer_id: int, epoch: int) -> None:
        """The transaction coordinator handed out (or loaded) ``epoch`` for ``producer_id``:
        older epochs of it are fenced here from now on, as for a named producer."""
        if epoch > self._producer_epochs.get(producer_id, -1):
            self._producer_epochs[producer_id] = epoch

    async def idempotency_session(self, key: str, digest: str) -> tuple[int, bool]:
        """The producer id that stands for ``key`` (see api.records) and whether this call
        claimed the key; 422 if the key was used with another request."""
        pid, stored, new = await asyncio.to_thread(
            self.store.claim_idempotency_key,
            key,
            digest,
            self.clock.now_ms(),
            self.config.idempotency_window_ms,
        )
        if stored != digest:
            raise LogbusError(
                "this Idempotency-Key was used with a different request",
                code=ErrorCode.IDEMPOTENCY_KEY_REUSED,
            )
        return pid, new

    async def release_idempotency_key(self, key: str, digest: str) -> None:
        """Undo :meth:`idempotency_session` for a request that appended nothing."""
        await asyncio.to_thread(self.store.release_idempotency_key, key, digest)

    # -- records ---------------------------------------------------------------------------------

    def partition(self, topic: str, partition: int) -> Partition:
        """The partition as this broker leads it (NotLeaderError, 421, where it does not): for
        the broker's own writers and readers. Clients read through :meth:`reader`."""
        self.check_partition(topic, partition)
        if self.replicas is not None:
            return self.replicas.leader_of(topic, partition).partition
        return self.logs.get(topic, partition)

    def check_partition(self, topic: str, partition: int) -> None:
        meta = self.topic(topic)
        if not 0 <= partition < meta.partitions:
            raise UnknownTopicOrPartitionError(
                f"topic {topic!r} has no partition {partition}", topic=topic, partition=partition
            )

    def reader(self, topic: str, partition: int, *, direct: bool | None = None) -> PartitionReader:
        """What a client reads a partition through: the local log where this broker leads it;
        else (unless ``direct``: 421 naming the leader) the local replica up to its high
        watermark and the leader for the rest, or the leader alone where no replica is here.
        No I/O: a remote reader's properties are those of its last answer (see :func:`synced`).
        ``direct`` defaults to the request's ``Logbus-Route`` (:data:`direct_route`).
        """
        self.check_partition(topic, partition)
        direct = direct_route.get() if direct is None else direct
        if self.replicas is None or self.forwarder is None:
            return self.logs.get(topic, partition)
        if direct or self.leads(topic, partition):
            return self.replicas.leader_of(topic, partition).partition
        remote = self.forwarder.remote(topic, partition)
        local = self.replicas.follows(topic, partition)
        return FollowerPartition(local, remote) if local is not None else remote

    async def synced_reader(
        self, topic: str, partition: int, *, direct: bool | None = None
    ) -> PartitionReader:
        """:meth:`reader` with its offsets fresh, for a caller that checks an offset."""
        return await synced(self.reader(topic, partition, direct=direct))

    async def known_reader(
        self, topic: str, partition: int, *, direct: bool | None = None
    ) -> PartitionReader:
        """:meth:`reader`, synced only if its offsets were never seen (a loop that reads it
        keeps them fresh)."""
        reader = self.reader(topic, partition, direct=direct)
        return reader if reader.high_watermark >= 0 else await synced(reader)

    def leads(self, topic: str, partition: int) -> bool:
        """Whether this broker leads the partition now (always, for a single broker)."""
        if self.replicas is None:
            return True
        leading = self.replicas.leading.get((topic, partition))
        return leading is not None and leading.active

    def coordinator_of(self, group_id: str) -> int:
        """The broker coordinating ``group_id``: the leader of its ``__consumer_offsets``
        partition (:func:`offsets_partition`) as this broker last read the metadata; -1 when
        there is none (the topic is not created yet, or the partition is offline)."""
        meta = self._topics.get(OFFSETS_TOPIC)
        if meta is None:
            return -1
        p = offsets_partition(group_id, meta.partitions)
        if self.replicas is None:
            return self.config.broker_id
        return self.replicas.leader_id(OFFSETS_TOPIC, p)

    def broker_url(self, broker_id: int) -> str | None:
        """A broker's advertised base URL as last read from the store (None if unknown)."""
        if self.replicas is None:
            return None
        b = self.replicas.brokers.get(broker_id)
        return b.base_url if b is not None else None

    def leader_epoch(self, topic: str, partition: int) -> int | None:
        """The leader epoch in which this broker leads the partition now; None if it does not
        (a single broker leads everything in epoch 0)."""
        if self.replicas is None:
            return 0
        leading = self.replicas.leading.get((topic, partition))
        return leading.replica.leader_epoch if leading is not None and leading.active else None

    def offsets_replication_factor(self) -> int:
        """Kafka's offsets.topic.replication.factor (3), capped by the brokers registered."""
        if self.replicas is None:
            return 1
        return max(1, min(3, sum(1 for b in self.replicas.brokers.values() if b.alive)))

    async def refresh_metadata(self) -> None:
        if self.replicas is not None:
            await self.replicas.refresh()

    def local_partition(self, topic: str, partition: int) -> Partition | None:
        """This broker's replica of the partition, led here or not (None if it holds none):
        for describing it, never for serving clients."""
        try:
            return self.logs.get(topic, partition)
        except LogbusError:
            return None

    async def leader_offsets(
        self, topic: str, partitions: list[int]
    ) -> list[tuple[int, int, int, int] | None]:
        """(log start, high watermark, log end, last stable offset) of each partition as its
        leader has them; None for one whose leader cannot answer within
        :data:`DESCRIBE_TIMEOUT_S`."""
        limit = asyncio.Semaphore(DESCRIBE_CONCURRENCY)

        async def one(partition: int) -> tuple[int, int, int, int] | None:
            if self.leads(topic, partition):
                p = self.partition(topic, partition)
                return p.log_start_offset, p.high_watermark, p.log_end_offset, p.last_stable_offset
            if self.forwarder is None:
                return None
            remote = self.forwarder.remote(topic, partition)
            async with limit:
                try:
                    async with asyncio.timeout(DESCRIBE_TIMEOUT_S):
                        await remote.sync()
                except (LogbusError, TimeoutError):
                    return None
            return (
                remote.log_start_offset,
                remote.high_watermark,
                remote.log_end_offset,
                remote.last_stable_offset,
            )

        return list(await asyncio.gather(*(one(p) for p in partitions)))

    def partition_for(self, topic: str, key: bytes | None, sticky: int) -> int:
        """Kafka's choice: murmur2 of the key, or the request's sticky partition."""
        count = self.topic(topic).partitions
        if key is None:
            return sticky % count
        return partition_for_key(key, count)

    async def append(
        self,
        topic: str,
        partition: int,
        data: bytes | memoryview,
        acks: Acks,
        *,
        internal: bool = False,
        direct: bool | None = None,
        transactional: bool = False,
        checked: list[BatchHeader] | None = None,
    ) -> AppendResult:
        """Append batches; clients may not write to internal topics (``internal`` is for the
        broker's own writers). In a cluster, a partition led elsewhere is forwarded to its
        leader, or refused with 421 naming it when the client routes itself (``direct``).
        ``transactional``: the batches may be transactional (the caller added the partition to
        the producer's transaction at its coordinator first). ``checked``: see
        :meth:`core_log.manager.Partition.append` (not sent on when forwarded: the leader
        checks what it receives)."""
        if not internal:
            _check_not_internal(topic)
        if self.replicas is not None and self.forwarder is not None:
            self.check_partition(topic, partition)  # unknown partition: 404 before anything
            self._check_not_fenced(data)
            direct = direct_route.get() if direct is None else direct
            try:
                if direct or self.leads(topic, partition):
                    return await self.replicas.append(
                        topic,
                        partition,
                        data,
                        wait_for_isr=acks is Acks.ALL,
                        transactional=transactional,
                        checked=checked,
                    )
                return await self.forwarder.append(
                    topic, partition, data, acks_all=acks is Acks.ALL, transactional=transactional
                )
            except LogbusError as e:
                if direct or e.code is not ErrorCode.NOT_LEADER_OR_FOLLOWER:
                    raise
                raise _leadership_moved(topic, partition, e) from e
        p = self.partition(topic, partition)
        self._check_not_fenced(data)
        return await p.append(
            data,
            leader_epoch=0,
            durable=acks is Acks.ALL,
            transactional=transactional,
            checked=checked,
        )

    def append_built(
        self,
        topic: str,
        partition: int,
        data: bytes,
        acks: Acks,
        checked: list[BatchHeader],
        answer: Callable[[int], T],
    ) -> Awaitable[T]:
        """:meth:`append` of a client's records the broker built into ``data`` itself, with
        their ``checked`` headers (:func:`core_log.batch.built_headers`), neither internal,
        directed nor transactional, answered by ``answer(first offset)``; returned as
        something to await. On a single broker it is the partition's
        :meth:`core_log.manager.Partition.append_built` (where the append is gathered, its
        future: no coroutine of this method's own in the request's chain); in a cluster,
        :meth:`append`'s. Raises what :meth:`append` raises."""
        if self.replicas is not None and self.forwarder is not None:
            return answered_by(self.append(topic, partition, data, acks, checked=checked), answer)
        _check_not_internal(topic)
        p = self.partition(topic, partition)
        self._check_not_fenced(data)
        return p.append_built(data, checked, answer, durable=acks is Acks.ALL)

    async def write_marker(
        self,
        topic: str,
        partition: int,
        producer_id: int,
        producer_epoch: int,
        commit: bool,
        coordinator_epoch: int,
    ) -> AppendResult:
        """A transaction coordinator's COMMIT/ABORT marker on the partition, through its
        leader wherever it is, acknowledged once committed (acks=all); the leader's
        :attr:`marker_listeners` hear it (the group coordinator applies a transaction's
        offsets on its ``__consumer_offsets`` partition)."""
        self.check_partition(topic, partition)
        if self.forwarder is not None:
            return await self.forwarder.append_marker(
                topic, partition, producer_id, producer_epoch, commit, coordinator_epoch
            )
        result = await self.partition(topic, partition).append_marker(
            producer_id, producer_epoch, commit, coordinator_epoch, durable=True
        )
        for listener in self.marker_listeners:
            listener(topic, partition, producer_id, commit)
        return result

    async def coordinator_call(
        self, topic: str, partition: int, op: str, header: dict[str, Any]
    ) -> dict[str, Any]:
        """Run coordinator operation ``op`` on the leader of ``topic``-``partition`` (a
        coordinator's state partition): here, or over the brokers' link."""
        if self.forwarder is not None:
            return await self.forwarder.coordinator_call(topic, partition, op, header)
        self.check_partition(topic, partition)
        handler = self.coordinator_ops.get(op)
        if handler is None:
            raise LogbusError(f"no coordinator op {op!r}", code=ErrorCode.INVALID_REQUEST)
        return await handler({"topic": topic, "partition": partition, "op": op, **header})

    def _check_not_fenced(self, data: bytes | memoryview) -> None:
        """A re-initialised named producer fences its older sessions on every partition at
        once, not only on those where the new session has written (the broker knows the epoch
        it handed out)."""
        if not self._producer_epochs or len(data) < HEADER_BYTES:
            return
        h = parse_header(data)
        latest = self._producer_epochs.get(h.producer_id)
        if latest is not None and h.producer_epoch < latest:
            raise LogbusError(
                f"producer {h.producer_id} epoch {h.producer_epoch} is fenced by epoch {latest}",
                code=ErrorCode.INVALID_PRODUCER_EPOCH,
                epoch=latest,
                received_epoch=h.producer_epoch,
            )


def offsets_partition(group_id: str, partitions: int) -> int:
    """The ``__consumer_offsets`` partition holding a group's offsets and membership."""
    return zlib.crc32(group_id.encode()) % partitions


async def _completed(work: Coroutine[Any, Any, T]) -> T:
    """Run an admin change to its end even if the caller is cancelled (its client went away):
    the change then lands whole, and the client finds it done when it looks again."""
    return await asyncio.shield(asyncio.ensure_future(work))


def check_readable(topic: str) -> None:
    """Clients read internal topics only through the group API (and, later, as super users)."""
    if topic in INTERNAL_TOPICS:
        raise LogbusError(
            f"{topic} is internal: read committed offsets through /v1/groups, transactions "
            "through /v1/transactions",
            code=ErrorCode.TOPIC_AUTHORIZATION_FAILED,
            topic=topic,
        )


def _check_not_internal(topic: str) -> None:
    if topic in INTERNAL_TOPICS:
        raise LogbusError(
            f"{topic} is internal: its coordinator alone writes and deletes it",
            code=ErrorCode.INVALID_TOPIC_EXCEPTION,
        )


def _check_partition_count(partitions: int) -> None:
    if not 1 <= partitions <= MAX_PARTITIONS_PER_TOPIC:
        raise LogbusError(
            f"partitions must be between 1 and {MAX_PARTITIONS_PER_TOPIC}",
            code=ErrorCode.INVALID_PARTITIONS,
        )


def _leadership_moved(topic: str, partition: int, cause: LogbusError) -> LogbusError:
    """421 is for a client that routes itself (``Logbus-Route: direct``): it names the leader
    to go to. A client that let the broker route (curl behind a load balancer) cannot act on
    it, so leadership moving under its request — during an ``acks=all`` wait, or between the
    forwarder's last look at the metadata and the leader's answer — is a retriable 503 with
    the same Kafka code."""
    e = LogbusError(
        f"leadership of {topic}-{partition} moved while the request was in flight: {cause.message}",
        code=ErrorCode.NOT_LEADER_OR_FOLLOWER,
        **cause.detail,
    )
    e.http_status_override = 503
    return e
