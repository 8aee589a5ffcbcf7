"""The metadata store: topics, their configs and partition assignments, in SQL.

The embedded default is a SQLite file in the data directory; a cluster points every broker at
one PostgreSQL database (same schema, same code). The store is the single source of truth for
metadata: every change is one transaction, and rows that can be changed concurrently carry a
``version`` column updated by compare-and-set (``UPDATE … WHERE version = :seen``), so a stale
writer cannot overwrite a newer decision.

Calls are synchronous (SQLAlchemy Core); async callers run them in a worker thread.

Storage failures of the store itself (SQLite's "database or disk is full", "disk I/O error", a
database file that cannot be opened, a lost PostgreSQL connection: SQLAlchemy's
``OperationalError``) surface as :class:`~core_log.errors.KafkaStorageError` (503, retriable):
the transaction was rolled back, so the failed call changed nothing and a retry may succeed.
"""

from __future__ import annotations

import functools
import sqlite3
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any, ParamSpec, TypeVar

import sqlalchemy as sa
from sqlalchemy.exc import IntegrityError, OperationalError

from core_log.errors import (
    ErrorCode,
    KafkaStorageError,
    LogbusError,
    TopicAlreadyExistsError,
    UnknownTopicOrPartitionError,
)

from . import migrate
from .schema import (
    brokers_table,
    controller_table,
    counters_table,
    db_now_ms,
    idempotency_keys_table,
    partitions_table,
    producer_names_table,
    topics_table,
)

PRODUCER_ID_COUNTER = "next_producer_id"
METADATA_VERSION = "metadata_version"  # bumped by every change brokers must learn about
CONTROLLER_ROW = 1
MAX_PRODUCER_EPOCH = 2**15 - 1  # int16 in the batch header; Kafka takes a new id past it


@dataclass(frozen=True)
class PartitionMeta:
    topic: str
    partition: int
    replicas: list[int]
    isr: list[int]
    leader: int
    leader_epoch: int
    partition_epoch: int
    unclean_elections: int = 0
    # A reassignment in progress (KIP-455; see cluster.controller): ``replicas`` holds the
    # target replicas first, then the ones being removed.
    adding_replicas: list[int] = field(default_factory=list)
    removing_replicas: list[int] = field(default_factory=list)

    @property
    def reassigning(self) -> bool:
        return bool(self.adding_replicas or self.removing_replicas)

    @property
    def target_replicas(self) -> list[int]:
        """The replicas the partition ends with (its replicas when nothing is in progress)."""
        return [b for b in self.replicas if b not in self.removing_replicas]


@dataclass(frozen=True)
class TopicMeta:
    name: str
    topic_id: str
    partitions: int
    replication_factor: int
    configs: dict[str, Any]
    created_ms: int
    version: int
    assignments: list[PartitionMeta] = field(default_factory=list)


@dataclass(frozen=True)
class BrokerMeta:
    broker_id: int
    host: str
    port: int
    rack: str | None
    url: str = ""  # advertised base URL; "" = http://{host}:{port}
    replication_port: int = 0  # the h2c replication listener
    broker_epoch: int = 0
    alive: bool = True  # lease not expired (judged by the database's clock)

    @property
    def base_url(self) -> str:
        return self.url or f"http://{self.host}:{self.port}"


@dataclass(frozen=True)
class ControllerMeta:
    broker_id: int
    controller_epoch: int
    alive: bool


class ConcurrentUpdateError(LogbusError):
    """A compare-and-set lost: somebody changed the row since it was read (retriable)."""

    code = ErrorCode.CONCURRENT_UPDATE


P = ParamSpec("P")
R = TypeVar("R")


def _storage_errors(method: Callable[P, R]) -> Callable[P, R]:
    """Turn the store's own storage failures into a retriable KAFKA_STORAGE_ERROR."""

    @functools.wraps(method)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
        try:
            return method(*args, **kwargs)
        except OperationalError as e:
            cause = str(e.orig) if e.orig is not None else str(e)
            raise KafkaStorageError(f"metadata store failed ({cause}); nothing was changed") from e

    return wrapper


ALLOCATION_ATTEMPTS = 5  # producer-id races between brokers are rare and short


class MetadataStore:
    @_storage_errors
    def __init__(self, url: str) -> None:
        kwargs: dict[str, Any] = {}
        if url.startswith("sqlite"):
            kwargs["connect_args"] = {"check_same_thread": False, "timeout": 30}
        self.engine = sa.create_engine(url, **kwargs)
        self.writer = self.engine  # every write is one transaction on it
        if url.startswith("sqlite"):
            sa.event.listen(self.engine, "connect", _sqlite_pragmas)
            # Writes take the write lock when they begin, so brokers starting together queue
            # for it instead of failing (reads stay deferred, on the first engine).
            self.writer = sa.create_engine(url, **kwargs)
            sa.event.listen(self.writer, "connect", _sqlite_pragmas)
            migrate.begin_immediate(self.writer)
        migrate.upgrade(self.engine)
        from .security_store import SecurityStore  # it imports this module

        # Users, keys, ACLs, quotas and the cluster secret, on the same engines.
        self.security = SecurityStore(self.engine, self.writer)

    def close(self) -> None:
        self.engine.dispose()
        self.writer.dispose()

    # -- brokers ---------------------------------------------------------------------------------

    @_storage_errors
    def register_broker(self, broker: BrokerMeta, session_timeout_ms: int) -> int:
        """Register (or re-register) ``broker`` with a fresh lease; return its new broker epoch.

        Every registration is a new incarnation: the epoch grows, so a heartbeat or an ISR
        change made under an older epoch is refused."""
        row = {
            "host": broker.host,
            "port": broker.port,
            "rack": broker.rack,
            "url": broker.url,
            "replication_port": broker.replication_port,
            "lease_expires_ms": db_now_ms() + session_timeout_ms,
        }
        b = brokers_table.c
        with self.writer.begin() as c:
            seen = c.execute(
                sa.select(b.broker_epoch).where(b.broker_id == broker.broker_id)
            ).scalar_one_or_none()
            if seen is None:
                epoch = 1
                c.execute(
                    brokers_table.insert().values(
                        broker_id=broker.broker_id, broker_epoch=epoch, **row
                    )
                )
            else:
                epoch = int(seen) + 1
                updated = c.execute(
                    brokers_table.update()
                    .where(b.broker_id == broker.broker_id, b.broker_epoch == seen)
                    .values(broker_epoch=epoch, **row)
                ).rowcount
                if not updated:
                    raise ConcurrentUpdateError(f"broker {broker.broker_id} registered twice")
            _bump_version(c)
            return epoch

    @_storage_errors
    def heartbeat(self, broker_id: int, broker_epoch: int, session_timeout_ms: int) -> bool:
        """Renew the lease of ``broker_id`` in ``broker_epoch``; False if it has expired (or a
        newer incarnation registered): the broker is fenced and must register again."""
        b = brokers_table.c
        with self.writer.begin() as c:
            return bool(
                c.execute(
                    brokers_table.update()
                    .where(
                        b.broker_id == broker_id,
                        b.broker_epoch == broker_epoch,
                        b.lease_expires_ms > db_now_ms(),
                    )
                    .values(lease_expires_ms=db_now_ms() + session_timeout_ms)
                ).rowcount
            )

    @_storage_errors
    def expire_broker(self, broker_id: int, broker_epoch: int) -> None:
        """End the lease now (a clean shutdown): the controller moves leadership at once."""
        b = brokers_table.c
        with self.writer.begin() as c:
            c.execute(
                brokers_table.update()
                .where(b.broker_id == broker_id, b.broker_epoch == broker_epoch)
                .values(lease_expires_ms=0)
            )
            _bump_version(c)

    @_storage_errors
    def brokers(self) -> list[BrokerMeta]:
        with self.engine.connect() as c:
            rows = c.execute(
                sa.select(
                    brokers_table, (brokers_table.c.lease_expires_ms > db_now_ms()).label("alive")
                ).order_by(brokers_table.c.broker_id)
            )
            return [
                BrokerMeta(
                    r.broker_id,
                    r.host,
                    r.port,
                    r.rack,
                    r.url,
                    r.replication_port,
                    int(r.broker_epoch),
                    bool(r.alive),
                )
                for r in rows
            ]

    # -- controller --------------------------------------------------------------------------------

    @_storage_errors
    def acquire_controller(self, broker_id: int, lease_ms: int) -> int | None:
        """Take the controller lease if nobody holds a live one; return the new controller
        epoch, or None if another broker holds it."""
        t = controller_table.c
        with self.writer.begin() as c:
            seen = c.execute(sa.select(t.controller_epoch).where(t.id == CONTROLLER_ROW)).first()
            if seen is None:
                try:
                    with c.begin_nested():
                        c.execute(
                            controller_table.insert().values(
                                id=CONTROLLER_ROW,
                                broker_id=broker_id,
                                controller_epoch=1,
                                lease_expires_ms=db_now_ms() + lease_ms,
                            )
                        )
                except IntegrityError:
                    return None
                _bump_version(c)
                return 1
            epoch = int(seen.controller_epoch) + 1
            taken = c.execute(
                controller_table.update()
                .where(
                    t.id == CONTROLLER_ROW,
                    t.controller_epoch == seen.controller_epoch,
                    t.lease_expires_ms <= db_now_ms(),
                )
                .values(
                    broker_id=broker_id,
                    controller_epoch=epoch,
                    lease_expires_ms=db_now_ms() + lease_ms,
                )
            ).rowcount
            if not taken:
                return None
            _bump_version(c)
            return epoch

    @_storage_errors
    def renew_controller(self, broker_id: int, controller_epoch: int, lease_ms: int) -> bool:
        """Extend the lease held in ``controller_epoch``; False once it has been lost."""
        t = controller_table.c
        with self.writer.begin() as c:
            return bool(
                c.execute(
                    controller_table.update()
                    .where(
                        t.id == CONTROLLER_ROW,
                        t.broker_id == broker_id,
                        t.controller_epoch == controller_epoch,
                        t.lease_expires_ms > db_now_ms(),
                    )
                    .values(lease_expires_ms=db_now_ms() + lease_ms)
                ).rowcount
            )

    @_storage_errors
    def resign_controller(self, broker_id: int, controller_epoch: int) -> None:
        t = controller_table.c
        with self.writer.begin() as c:
            c.execute(
                controller_table.update()
                .where(t.broker_id == broker_id, t.controller_epoch == controller_epoch)
                .values(lease_expires_ms=0)
            )

    @_storage_errors
    def controller(self) -> ControllerMeta | None:
        t = controller_table.c
        with self.engine.connect() as c:
            r = c.execute(
                sa.select(
                    t.broker_id, t.controller_epoch, (t.lease_expires_ms > db_now_ms()).label("a")
                ).where(t.id == CONTROLLER_ROW)
            ).first()
        if r is None:
            return None
        return ControllerMeta(int(r.broker_id), int(r.controller_epoch), bool(r.a))

    # -- partition state ---------------------------------------------------------------------------

    @_storage_errors
    def metadata_version(self) -> int:
        with self.engine.connect() as c:
            v = c.execute(
                sa.select(counters_table.c.value).where(counters_table.c.name == METADATA_VERSION)
            ).scalar_one_or_none()
        return int(v or 0)

    @_storage_errors
    def change_isr(
        self, seen: PartitionMeta, isr: list[int], broker_id: int, broker_epoch: int
    ) -> PartitionMeta:
        """The leader's ISR change: a compare-and-set on the partition epoch, accepted only
        while the leader is still the leader in that epoch AND its own lease is live in
        ``broker_epoch`` (a fenced leader cannot shrink the ISR to itself)."""
        p, b = partitions_table.c, brokers_table.c
        lease_live = (
            sa.select(b.broker_id)
            .where(
                b.broker_id == broker_id,
                b.broker_epoch == broker_epoch,
                b.lease_expires_ms > db_now_ms(),
            )
            .exists()
        )
        with self.writer.begin() as c:
            updated = c.execute(
                partitions_table.update()
                .where(
                    p.topic == seen.topic,
                    p.partition == seen.partition,
                    p.partition_epoch == seen.partition_epoch,
                    p.leader == broker_id,
                    p.leader_epoch == seen.leader_epoch,
                    lease_live,
                )
                .values(isr=isr, partition_epoch=seen.partition_epoch + 1)
            ).rowcount
            if not updated:
                raise ConcurrentUpdateError(
                    f"{seen.topic}-{seen.partition} changed since partition epoch "
                    f"{seen.partition_epoch} (or broker {broker_id} is fenced)"
                )
            _bump_version(c)
        return replace(seen, isr=list(isr), partition_epoch=seen.partition_epoch + 1)

    @_storage_errors
    def apply_controller_changes(
        self, controller: tuple[int, int], changes: list[tuple[int, PartitionMeta]]
    ) -> list[PartitionMeta]:
        """The controller's decisions (elections, ISR removals of fenced brokers, the steps of
        a partition reassignment) in one transaction: each a compare-and-set on the partition
        epoch it was computed from (``(seen_partition_epoch, new_row)``), all under a live
        lease of ``controller`` = (broker id, controller epoch). Returns the rows applied (a
        row changed meanwhile is skipped: the controller looks again on its next pass)."""
        broker_id, controller_epoch = controller
        t, p = controller_table.c, partitions_table.c
        applied: list[PartitionMeta] = []
        with self.writer.begin() as c:
            live = c.execute(
                sa.select(t.id).where(
                    t.id == CONTROLLER_ROW,
                    t.broker_id == broker_id,
                    t.controller_epoch == controller_epoch,
                    t.lease_expires_ms > db_now_ms(),
                )
            ).first()
            if live is None:
                raise ConcurrentUpdateError(f"controller epoch {controller_epoch} lost its lease")
            for seen_epoch, new in changes:
                updated = c.execute(
                    partitions_table.update()
                    .where(
                        p.topic == new.topic,
                        p.partition == new.partition,
                        p.partition_epoch == seen_epoch,
                    )
                    .values(
                        replicas=new.replicas,
                        adding_replicas=new.adding_replicas,
                        removing_replicas=new.removing_replicas,
                        isr=new.isr,
                        leader=new.leader,
                        leader_epoch=new.leader_epoch,
                        partition_epoch=new.partition_epoch,
                        unclean_elections=new.unclean_elections,
                    )
                ).rowcount
                if updated:
                    applied.append(new)
            if applied:
                _bump_version(c)
        return applied

    # -- topics ------------------------------------------------------------------------------------

    @_storage_errors
    def create_topic(self, topic: TopicMeta) -> TopicMeta:
        try:
            with self.writer.begin() as c:
                c.execute(
                    topics_table.insert().values(
                        name=topic.name,
                        topic_id=topic.topic_id,
                        partitions=topic.partitions,
                        replication_factor=topic.replication_factor,
                        configs=topic.configs,
                        created_ms=topic.created_ms,
                        version=topic.version,
                    )
                )
                if topic.assignments:
                    c.execute(
                        partitions_table.insert(), [_partition_row(p) for p in topic.assignments]
                    )
                _bump_version(c)
        except IntegrityError:
            raise TopicAlreadyExistsError(f"topic {topic.name!r} already exists") from None
        return topic

    @_storage_errors
    def topics(self) -> list[TopicMeta]:
        with self.engine.connect() as c:
            rows = c.execute(sa.select(topics_table).order_by(topics_table.c.name)).all()
            parts = c.execute(
                sa.select(partitions_table).order_by(
                    partitions_table.c.topic, partitions_table.c.partition
                )
            ).all()
        by_topic: dict[str, list[PartitionMeta]] = {}
        for p in parts:
            by_topic.setdefault(p.topic, []).append(_partition_meta(p))
        return [_topic_meta(r, by_topic.get(r.name, [])) for r in rows]

    @_storage_errors
    def topic(self, name: str) -> TopicMeta:
        with self.engine.connect() as c:
            row = c.execute(sa.select(topics_table).where(topics_table.c.name == name)).first()
            if row is None:
                raise UnknownTopicOrPartitionError(f"unknown topic {name!r}", topic=name)
            parts = c.execute(
                sa.select(partitions_table)
                .where(partitions_table.c.topic == name)
                .order_by(partitions_table.c.partition)
            ).all()
        return _topic_meta(row, [_partition_meta(p) for p in parts])

    @_storage_errors
    def delete_topic(self, name: str) -> None:
        with self.writer.begin() as c:
            deleted = c.execute(topics_table.delete().where(topics_table.c.name == name)).rowcount
            if not deleted:
                raise UnknownTopicOrPartitionError(f"unknown topic {name!r}", topic=name)
            c.execute(partitions_table.delete().where(partitions_table.c.topic == name))
            _bump_version(c)

    @_storage_errors
    def update_topic(
        self,
        name: str,
        seen_version: int,
        *,
        configs: dict[str, Any] | None = None,
        add_partitions: list[PartitionMeta] | None = None,
    ) -> TopicMeta:
        """Compare-and-set on the topic's version; raise ConcurrentUpdateError if it moved."""
        values: dict[str, Any] = {"version": seen_version + 1}
        if configs is not None:
            values["configs"] = configs
        with self.writer.begin() as c:
            if add_partitions:
                count = c.execute(
                    sa.select(topics_table.c.partitions).where(topics_table.c.name == name)
                ).scalar_one()
                values["partitions"] = count + len(add_partitions)
            updated = c.execute(
                topics_table.update()
                .where(topics_table.c.name == name, topics_table.c.version == seen_version)
                .values(**values)
            ).rowcount
            if not updated:
                raise ConcurrentUpdateError(f"topic {name!r} changed concurrently; retry")
            if add_partitions:
                c.execute(partitions_table.insert(), [_partition_row(p) for p in add_partitions])
            _bump_version(c)
        return self.topic(name)

    # -- producers ---------------------------------------------------------------------------------

    @_storage_errors
    def init_producer(self, name: str | None) -> tuple[int, int]:
        """(producer id, epoch) for a new producer session, in one transaction.

        Without a name: a fresh id (ids come from a persisted counter and are never reused)
        and epoch 0. With a name (Kafka's ``transactional.id``): the same id with the epoch
        bumped, which fences every older session of that name; a fresh id past epoch 32767.
        Brokers allocating at the same moment for the first time race to insert the counter
        (or a name's row): the loser tries again, a few times.
        """
        for attempt in range(ALLOCATION_ATTEMPTS):
            try:
                return self._init_producer(name)
            except IntegrityError:  # another broker inserted the same first row
                if attempt == ALLOCATION_ATTEMPTS - 1:
                    raise ConcurrentUpdateError(
                        "producer id allocation kept racing; retry"
                    ) from None
        raise AssertionError("unreachable")

    def _init_producer(self, name: str | None) -> tuple[int, int]:
        with self.writer.begin() as c:
            row = None
            if name is not None:
                row = c.execute(
                    sa.select(producer_names_table).where(producer_names_table.c.name == name)
                ).first()
            if row is not None and row.producer_epoch < MAX_PRODUCER_EPOCH:
                pid, epoch = int(row.producer_id), int(row.producer_epoch) + 1
            else:
                pid, epoch = self._next_producer_id(c), 0
            if name is not None:
                values = {"producer_id": pid, "producer_epoch": epoch}
                updated = c.execute(
                    producer_names_table.update()
                    .where(producer_names_table.c.name == name)
                    .values(**values)
                ).rowcount
                if not updated:
                    c.execute(producer_names_table.insert().values(name=name, **values))
            return pid, epoch

    @_storage_errors
    def claim_idempotency_key(
        self, key: str, digest: str, now_ms: int, window_ms: int
    ) -> tuple[int, str, bool]:
        """(producer id, digest, new) recorded for ``key``: a fresh id and ``digest`` for a new
        key (committed before the caller appends anything; new = True), the stored pair for a
        known one. Keys older than the window are forgotten first."""
        with self.writer.begin() as c:
            c.execute(
                idempotency_keys_table.delete().where(
                    idempotency_keys_table.c.created_ms < now_ms - window_ms
                )
            )
            row = c.execute(
                sa.select(idempotency_keys_table).where(idempotency_keys_table.c.key == key)
            ).first()
            if row is not None:
                return int(row.producer_id), str(row.digest), False
            pid = self._next_producer_id(c)
            c.execute(
                idempotency_keys_table.insert().values(
                    key=key, digest=digest, producer_id=pid, created_ms=now_ms
                )
            )
            return pid, digest, True

    def release_idempotency_key(self, key: str, digest: str) -> None:
        """Forget ``key`` if it still stands for ``digest``: its request was rejected before
        anything was appended, so a corrected retry may claim it afresh."""
        with self.writer.begin() as c:
            c.execute(
                idempotency_keys_table.delete().where(
                    (idempotency_keys_table.c.key == key)
                    & (idempotency_keys_table.c.digest == digest)
                )
            )

    @_storage_errors
    def producer_epochs(self) -> dict[int, int]:
        """Latest epoch of every named producer (the epochs that fence older sessions)."""
        with self.engine.connect() as c:
            rows = c.execute(sa.select(producer_names_table))
            return {int(r.producer_id): int(r.producer_epoch) for r in rows}

    @_storage_errors
    def allocate_producer_ids(self, count: int) -> range:
        """A block of ``count`` fresh producer ids for one broker to hand out (never reused:
        the counter only grows)."""
        with self.writer.begin() as c:
            first = self._next_producer_id(c, count)
        return range(first, first + count)

    @staticmethod
    def _next_producer_id(c: sa.Connection, count: int = 1) -> int:
        """Take ``count`` ids: one atomic increment (the row lock orders concurrent brokers);
        the first allocation ever creates the row, and a broker racing it retries."""
        counter = counters_table.c
        after = c.execute(
            counters_table.update()
            .where(counter.name == PRODUCER_ID_COUNTER)
            .values(value=counter.value + count)
            .returning(counter.value)
        ).scalar_one_or_none()
        if after is None:
            c.execute(counters_table.insert().values(name=PRODUCER_ID_COUNTER, value=count))
            return 0
        return int(after) - count


def _bump_version(c: sa.Connection, counter: str = METADATA_VERSION) -> None:
    """Tell every broker the metadata changed (they poll this counter; the security store
    bumps its own, ``security_version``). An UPDATE of the one row: concurrent changes
    serialise on it, and the counter never goes back."""
    name = counters_table.c.name
    updated = c.execute(
        counters_table.update().where(name == counter).values(value=counters_table.c.value + 1)
    ).rowcount
    if not updated:
        try:
            with c.begin_nested():
                c.execute(counters_table.insert().values(name=counter, value=1))
        except IntegrityError:  # another broker created it first
            c.execute(
                counters_table.update()
                .where(name == counter)
                .values(value=counters_table.c.value + 1)
            )


SQLITE_WAL_SWITCH_S = 30.0  # as long as the busy timeout of every other statement


def _sqlite_pragmas(dbapi_conn: Any, _record: Any) -> None:
    """WAL and full sync on every new SQLite connection.

    WAL mode is stored in the file, so only the first connection ever changes it; switching
    needs an exclusive lock for which SQLite does not always call the busy handler, and brokers
    started together died at start with "database is locked" (1 start in 30 with 6 at once).
    So the mode is read first and set only when needed, and a busy database is retried
    (every 50 ms, for as long as the busy timeout would wait)."""
    cur = dbapi_conn.cursor()
    try:
        deadline = time.monotonic() + SQLITE_WAL_SWITCH_S
        while True:
            try:
                (mode,) = cur.execute("PRAGMA journal_mode").fetchone()
                if str(mode).lower() != "wal":
                    cur.execute("PRAGMA journal_mode=WAL")
                break
            except sqlite3.OperationalError as e:
                busy = "locked" in str(e) or "busy" in str(e)
                if not busy or time.monotonic() > deadline:
                    raise
                time.sleep(0.05)
        cur.execute("PRAGMA synchronous=FULL")
    finally:
        cur.close()


def _partition_row(p: PartitionMeta) -> dict[str, Any]:
    return {
        "topic": p.topic,
        "partition": p.partition,
        "replicas": p.replicas,
        "isr": p.isr,
        "leader": p.leader,
        "leader_epoch": p.leader_epoch,
        "partition_epoch": p.partition_epoch,
        "unclean_elections": p.unclean_elections,
        "adding_replicas": p.adding_replicas,
        "removing_replicas": p.removing_replicas,
    }


def _partition_meta(r: Any) -> PartitionMeta:
    return PartitionMeta(
        r.topic,
        r.partition,
        list(r.replicas),
        list(r.isr),
        r.leader,
        r.leader_epoch,
        r.partition_epoch,
        r.unclean_elections,
        list(r.adding_replicas),
        list(r.removing_replicas),
    )


def _topic_meta(r: Any, parts: list[PartitionMeta]) -> TopicMeta:
    return TopicMeta(
        r.name,
        r.topic_id,
        r.partitions,
        r.replication_factor,
        dict(r.configs),
        r.created_ms,
        r.version,
        parts,
    )
