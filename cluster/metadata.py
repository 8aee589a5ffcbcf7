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
from collections.abc import Callable
from dataclasses import dataclass, field
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

metadata_obj = sa.MetaData()

topics_table = sa.Table(
    "topics",
    metadata_obj,
    sa.Column("name", sa.String(249), primary_key=True),
    sa.Column("topic_id", sa.String(32), nullable=False),
    sa.Column("partitions", sa.Integer, nullable=False),
    sa.Column("replication_factor", sa.Integer, nullable=False),
    sa.Column("configs", sa.JSON, nullable=False),
    sa.Column("created_ms", sa.BigInteger, nullable=False),
    sa.Column("version", sa.Integer, nullable=False),
)

partitions_table = sa.Table(
    "partitions",
    metadata_obj,
    sa.Column("topic", sa.String(249), primary_key=True),
    sa.Column("partition", sa.Integer, primary_key=True),
    sa.Column("replicas", sa.JSON, nullable=False),
    sa.Column("isr", sa.JSON, nullable=False),
    sa.Column("leader", sa.Integer, nullable=False),
    sa.Column("leader_epoch", sa.Integer, nullable=False),
    sa.Column("partition_epoch", sa.Integer, nullable=False),
)

brokers_table = sa.Table(
    "brokers",
    metadata_obj,
    sa.Column("broker_id", sa.Integer, primary_key=True),
    sa.Column("host", sa.String(255), nullable=False),
    sa.Column("port", sa.Integer, nullable=False),
    sa.Column("rack", sa.String(255), nullable=True),
    sa.Column("lease_expires_ms", sa.BigInteger, nullable=False),
)


counters_table = sa.Table(
    "counters",
    metadata_obj,
    sa.Column("name", sa.String(64), primary_key=True),
    sa.Column("value", sa.BigInteger, nullable=False),
)

producer_names_table = sa.Table(
    "producer_names",
    metadata_obj,
    sa.Column("name", sa.String(249), primary_key=True),
    sa.Column("producer_id", sa.BigInteger, nullable=False),
    sa.Column("producer_epoch", sa.Integer, nullable=False),
)

idempotency_keys_table = sa.Table(
    "idempotency_keys",
    metadata_obj,
    sa.Column("key", sa.String(255), primary_key=True),
    sa.Column("digest", sa.String(64), nullable=False),
    sa.Column("producer_id", sa.BigInteger, nullable=False),
    sa.Column("created_ms", sa.BigInteger, nullable=False, index=True),
)

PRODUCER_ID_COUNTER = "next_producer_id"
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


class MetadataStore:
    @_storage_errors
    def __init__(self, url: str) -> None:
        kwargs: dict[str, Any] = {}
        if url.startswith("sqlite"):
            kwargs["connect_args"] = {"check_same_thread": False, "timeout": 30}
        self.engine = sa.create_engine(url, **kwargs)
        if url.startswith("sqlite"):
            sa.event.listen(self.engine, "connect", _sqlite_pragmas)
        metadata_obj.create_all(self.engine)

    def close(self) -> None:
        self.engine.dispose()

    # -- brokers -----------------------------------------------------------------------------------

    @_storage_errors
    def register_broker(self, broker: BrokerMeta, lease_expires_ms: int) -> None:
        row = {
            "host": broker.host,
            "port": broker.port,
            "rack": broker.rack,
            "lease_expires_ms": lease_expires_ms,
        }
        with self.engine.begin() as c:
            updated = c.execute(
                brokers_table.update()
                .where(brokers_table.c.broker_id == broker.broker_id)
                .values(**row)
            ).rowcount
            if not updated:
                c.execute(brokers_table.insert().values(broker_id=broker.broker_id, **row))

    @_storage_errors
    def brokers(self) -> list[BrokerMeta]:
        with self.engine.connect() as c:
            rows = c.execute(sa.select(brokers_table).order_by(brokers_table.c.broker_id))
            return [BrokerMeta(r.broker_id, r.host, r.port, r.rack) for r in rows]

    # -- topics ------------------------------------------------------------------------------------

    @_storage_errors
    def create_topic(self, topic: TopicMeta) -> TopicMeta:
        try:
            with self.engine.begin() as c:
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
        with self.engine.begin() as c:
            deleted = c.execute(topics_table.delete().where(topics_table.c.name == name)).rowcount
            if not deleted:
                raise UnknownTopicOrPartitionError(f"unknown topic {name!r}", topic=name)
            c.execute(partitions_table.delete().where(partitions_table.c.topic == name))

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
        with self.engine.begin() as c:
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
        return self.topic(name)

    # -- producers ---------------------------------------------------------------------------------

    @_storage_errors
    def init_producer(self, name: str | None) -> tuple[int, int]:
        """(producer id, epoch) for a new producer session, in one transaction.

        Without a name: a fresh id (ids come from a persisted counter and are never reused)
        and epoch 0. With a name (Kafka's ``transactional.id``): the same id with the epoch
        bumped, which fences every older session of that name; a fresh id past epoch 32767.
        """
        with self.engine.begin() as c:
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
        with self.engine.begin() as c:
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
        with self.engine.begin() as c:
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

    @staticmethod
    def _next_producer_id(c: sa.Connection) -> int:
        current = c.execute(
            sa.select(counters_table.c.value).where(counters_table.c.name == PRODUCER_ID_COUNTER)
        ).scalar_one_or_none()
        if current is None:
            c.execute(counters_table.insert().values(name=PRODUCER_ID_COUNTER, value=1))
            return 0
        updated = c.execute(
            counters_table.update()
            .where(counters_table.c.name == PRODUCER_ID_COUNTER, counters_table.c.value == current)
            .values(value=current + 1)
        ).rowcount
        if not updated:  # another broker took it first (PostgreSQL): the caller retries
            raise ConcurrentUpdateError("producer id allocation raced; retry")
        return int(current)


def _sqlite_pragmas(dbapi_conn: Any, _record: Any) -> None:
    cur = dbapi_conn.cursor()
    cur.execute("PRAGMA journal_mode=WAL")
    cur.execute("PRAGMA synchronous=FULL")
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
