"""The ``logbus`` sink: ``df.writeStream.format("logbus")`` and ``df.write.format("logbus")``.

Columns as in Spark's Kafka sink: ``value`` (string or binary, null for a tombstone) is
required; ``key`` (string or binary), ``headers`` (array<struct<key string, value binary>>),
``topic`` (string) and ``partition`` (int) are optional; the ``topic`` option overrides the
column. A ``timestamp`` column (timestamp or long ms), if present, sets the record timestamps;
otherwise the broker stamps them when it first appends them.

Theory of operation (the default, ``transactional=true``): one Logbus transaction per task,
committed by the driver when Spark commits the micro-batch (docs/transactions.md).

* A task's transactional id is ``spark-<queryId>-<batchId>-<task partition>`` (``spark-write-
  <write uuid>-<task partition>`` for ``df.write``), cleaned to Kafka's 1..249 of
  ``[a-zA-Z0-9._-]``. The task first asks the coordinator about it: ``complete_commit`` (or
  ``prepare_commit``, decided) means an earlier run of this batch committed this task's rows and
  Spark did not record the batch (the driver died between commits, or after them): the task
  writes nothing. Otherwise it begins a session — which fences every earlier attempt of the
  task and aborts what that left open — and writes.
* The task places every row itself, as the broker would (a ``partition`` column wins; keyed
  rows by Kafka's murmur2, :mod:`logbus_client.partitioner`; keyless rows stick to one
  partition per request, then move on round robin), and sends each partition's rows as JSON
  requests of at most ``maxRequestRecords``/``maxRequestBytes`` to the partition's leader, with
  the session's headers and a sequence per partition (0, then + records): a retried request is
  answered with its original offsets. At most :data:`~spark_sink.limits.SINK_BUFFER_MAX_BYTES`
  are buffered across partitions (the largest buffer is sent first when that is reached).
* A task that fails aborts its transaction itself (best effort: a killed executor leaves it
  to the retry's new session, or to the transaction timeout).
* The task does not commit: its commit message carries (transactional id, producer id,
  epoch, records). The driver's ``commit`` ends each task's transaction with a commit, one
  after the other; a repeat of a commit gets the same answer, so a retry is safe. ``abort``
  aborts them. The transaction timeout (``transaction.timeout.ms``, 15 min by default, the
  broker's maximum) must cover the time from a task's first write to the batch's commit.

So each row is written exactly once, and nothing of a batch is visible to ``read_committed``
readers before Spark commits it; the tasks' transactions are committed one after another, so
such a reader may see part of a batch between two of them (and until the query re-runs the
batch if the driver dies between them). ``read_uncommitted`` readers see rows as soon as a task
writes them, aborted attempts included.

``transactional=false`` keeps the earlier behaviour: each request carries ``Idempotency-Key:
spark-<queryId>-<batchId>-<task partition>-<chunk index>``, and a re-run of a micro-batch with
the same rows in the same order is answered as duplicates (the broker answers 422 if a re-run
cut different requests, and the task fails rather than write twice). Records are visible to
every reader as soon as a task writes them; no coordinator state is kept per task.
"""

from __future__ import annotations

import base64
import hashlib
import logging
import os
import re
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import orjson
import pyarrow as pa  # type: ignore[import-untyped]
from pyspark.sql.datasource import (
    DataSourceArrowWriter,
    DataSourceStreamArrowWriter,
    WriterCommitMessage,
)
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    IntegerType,
    LongType,
    StringType,
    StructType,
    TimestampNTZType,
    TimestampType,
)

from logbus_client.partitioner import partition_for_key

from . import limits
from .client import LogbusClient
from .errors import BrokerError, OptionError
from .options import SinkOptions

log = logging.getLogger("logbus.spark")

JSON = "application/json"


@dataclass
class SinkCommitMessage(WriterCommitMessage):
    """What a task reports to the driver. With transactions: the session whose open
    transaction holds the task's rows (``records`` > 0), for the driver to commit."""

    records: int
    requests: int
    duplicates: int
    transactional_id: str | None = None
    producer_id: int = -1
    producer_epoch: int = -1
    already_committed: bool = False  # an earlier run of the batch committed these rows

    @property
    def to_commit(self) -> bool:
        return self.transactional_id is not None and self.records > 0 and not self.already_committed


_ILLEGAL = re.compile(r"[^a-zA-Z0-9._-]")
MAX_TRANSACTIONAL_ID_CHARS = 249  # Kafka's (a topic name's) limit


def transactional_id_of(*parts: object) -> str:
    """``"-".join(parts)`` if that is a legal transactional id; else a deterministic legal one:
    illegal characters replaced and a hash of the original appended (so two different ids never
    collide), cut to fit 249 characters."""
    raw = "-".join(str(p) for p in parts)
    clean = _ILLEGAL.sub("_", raw)
    if clean == raw and 0 < len(raw) <= MAX_TRANSACTIONAL_ID_CHARS:
        return raw
    digest = hashlib.sha256(raw.encode()).hexdigest()[:32]
    return f"{clean[: MAX_TRANSACTIONAL_ID_CHARS - 33]}-{digest}"


def check_schema(schema: StructType, opts: SinkOptions) -> None:
    """Raise :class:`OptionError` (on the driver, before any task runs) for unusable columns."""
    types = {f.name: f.dataType for f in schema.fields}
    bytes_like = (StringType, BinaryType)
    if "value" not in types:
        raise OptionError("the logbus sink needs a value column (string or binary)")
    for name, allowed in (
        ("value", bytes_like),
        ("key", bytes_like),
        ("topic", (StringType,)),
        ("partition", (IntegerType,)),
        ("timestamp", (TimestampType, TimestampNTZType, LongType)),
    ):
        if name in types and not isinstance(types[name], allowed):
            kinds = " or ".join(t.typeName() for t in allowed)
            raise OptionError(f"column {name} must be {kinds}, not {types[name].simpleString()}")
    if "headers" in types:
        h = types["headers"]
        element = h.elementType if isinstance(h, ArrayType) else None
        ok = isinstance(element, StructType)
        if isinstance(element, StructType):
            inner = {f.name: f.dataType for f in element.fields}
            ok = isinstance(inner.get("key"), StringType) and isinstance(
                inner.get("value"), bytes_like
            )
        if not ok:
            raise OptionError("column headers must be array<struct<key:string,value:binary>>")
    if opts.topic is None and "topic" not in types:
        raise OptionError("the logbus sink needs a topic option or a topic column")


def _b64(raw: bytes | str) -> str:
    if isinstance(raw, str):
        raw = raw.encode()
    return base64.b64encode(raw).decode("ascii")


def _ms(ts: Any) -> int:
    if isinstance(ts, datetime):
        return int(ts.timestamp() * 1000)
    return int(ts)


class _Chunker:
    """Rows → JSON produce requests, cut deterministically by count, bytes and topic."""

    def __init__(self, opts: SinkOptions) -> None:
        self.opts = opts
        self.topic: str | None = None
        self.records: list[dict[str, Any]] = []
        self.size_bytes = 0

    def add(self, topic: str, record: dict[str, Any], size: int) -> tuple[str, bytes] | None:
        """Add a record; returns a full request (topic, body) to send first, if one is due."""
        out = None
        full = (
            len(self.records) >= self.opts.max_request_records
            or self.size_bytes + size > self.opts.max_request_bytes
        )
        if self.records and (topic != self.topic or full):
            out = self.flush()
        self.topic = topic
        self.records.append(record)
        self.size_bytes += size
        return out

    def flush(self) -> tuple[str, bytes] | None:
        if not self.records:
            return None
        assert self.topic is not None
        out = (self.topic, orjson.dumps({"records": self.records}))
        self.records, self.size_bytes = [], 0
        return out


Row = tuple[str, dict[str, Any], int, bytes | None, int | None]


def _rows(batch: pa.RecordBatch, opts: SinkOptions) -> Iterator[Row]:
    """(topic, JSON record, payload bytes, key, partition column) per row."""
    cols = {name: batch.column(name).to_pylist() for name in batch.schema.names}
    values = cols["value"]
    keys = cols.get("key")
    topics = cols.get("topic")
    partitions = cols.get("partition")
    headers = cols.get("headers")
    stamps = cols.get("timestamp")
    for i, value in enumerate(values):
        topic = opts.topic or (topics[i] if topics else None)
        if not topic:
            raise OptionError("a row has a null topic and the sink has no topic option")
        record: dict[str, Any] = {}
        size = 16
        key: bytes | None = None
        partition: int | None = None
        if value is not None:
            record["value_b64"] = _b64(value)
            size += len(value)
        if keys is not None and keys[i] is not None:
            raw_key = keys[i]
            key = raw_key.encode() if isinstance(raw_key, str) else raw_key
            record["key_b64"] = _b64(raw_key)
            size += len(raw_key)
        if partitions is not None and partitions[i] is not None:
            partition = partitions[i]
            record["partition"] = partition
        if stamps is not None and stamps[i] is not None:
            record["timestamp"] = _ms(stamps[i])
        if headers is not None and headers[i]:
            hs = []
            for h in headers[i]:
                entry: dict[str, Any] = {"name": h["key"]}
                if h["value"] is not None:
                    entry["value_b64"] = _b64(h["value"])
                    size += len(h["value"])
                hs.append(entry)
                size += len(h["key"] or "") + 8
            record["headers"] = hs
        yield topic, record, size, key, partition


def write_rows(
    batches: Iterator[pa.RecordBatch], opts: SinkOptions, key_prefix: str
) -> SinkCommitMessage:
    """Send every row; request ``i`` carries ``Idempotency-Key: {key_prefix}-{i}``."""
    chunker = _Chunker(opts)
    sent = duplicates = records = 0
    with LogbusClient(opts.connection) as client:

        def send(request: tuple[str, bytes] | None) -> None:
            nonlocal sent, duplicates
            if request is None:
                return
            topic, body = request
            key = f"{key_prefix}-{sent}"
            try:
                produced = client.produce(topic, body, JSON, key, opts.acks)
            except BrokerError as e:
                if e.status == 422:
                    raise BrokerError(
                        f"request {key} was already written with other contents: the rows of "
                        "this micro-batch came in another order or with other values on a "
                        "re-run (a non-deterministic plan), so exactly-once cannot be kept. "
                        f"{e}",
                        status=422,
                        code=e.code,
                    ) from e
                raise
            duplicates += produced.duplicate
            sent += 1
            _maybe_fail_once(opts, sent)

        for batch in batches:
            for topic, record, size, _, _ in _rows(batch, opts):
                records += 1
                send(chunker.add(topic, record, size))
        send(chunker.flush())
    return SinkCommitMessage(records, sent, duplicates)


def _maybe_fail_once(opts: SinkOptions, sent: int) -> None:
    """Tests only (option ``testing.failOnceMarker``): fail the task once, after its first
    request was written, so Spark re-runs it; the marker file records that it happened. (With
    transactions the failed attempt's transaction stays open until the retry's new session
    aborts it.)"""
    if sent == 1:
        _fail_once(opts.fail_once_marker, "testing.failOnceMarker")


def _fail_once(marker: str | None, option: str) -> None:
    if marker is None or os.path.exists(marker):
        return
    with open(marker, "w") as f:
        f.write("failed once\n")
    raise RuntimeError(f"injected failure ({option})")


# -- transactions -----------------------------------------------------------------------------

_COMMITTED = ("complete_commit", "prepare_commit")  # prepare_commit: decided, markers under way


class _TxnWriter:
    """A task's rows into its open transaction: placed per partition, buffered per partition,
    sent as JSON requests with a sequence per partition (see the module doc)."""

    def __init__(
        self,
        client: LogbusClient,
        opts: SinkOptions,
        txn_id: str,
        session: tuple[int, int],
        first: int,
    ) -> None:
        self.client = client
        self.opts = opts
        self.txn_id = txn_id
        self.session = session
        self.first = first  # where keyless rows start: spreads the tasks over partitions
        self.counts: dict[str, int] = {}
        self.sticky: dict[str, int] = {}
        self.buffers: dict[tuple[str, int], tuple[list[dict[str, Any]], int]] = {}
        self.buffered = 0
        self.sequences: dict[tuple[str, int], int] = {}
        self.requests = 0

    def _count(self, topic: str) -> int:
        n = self.counts.get(topic)
        if n is None:
            states = self.client.partitions(topic)
            if not states:
                raise OptionError(f"topic {topic!r} does not exist (the sink does not create it)")
            n = self.counts[topic] = len(states)
        return n

    def add(
        self, topic: str, record: dict[str, Any], size: int, key: bytes | None, part: int | None
    ) -> None:
        n = self._count(topic)
        if part is not None:
            if not 0 <= part < n:
                raise OptionError(
                    f"a row's partition {part} is not one of {topic}'s {n} partitions"
                )
            del record["partition"]  # the path names it
        elif key is not None:
            part = partition_for_key(key, n)
        tp = (topic, self.sticky.setdefault(topic, self.first % n) if part is None else part)
        records, size_bytes = self.buffers.get(tp, ([], 0))
        while records and (
            len(records) >= self.opts.max_request_records
            or size_bytes + size > self.opts.max_request_bytes
        ):
            self.send(tp)  # a keyless row then goes to the next partition
            tp = (topic, self.sticky[topic] if part is None else part)
            records, size_bytes = self.buffers.get(tp, ([], 0))
        records.append(record)
        self.buffers[tp] = (records, size_bytes + size)
        self.buffered += size
        if self.buffered > limits.SINK_BUFFER_MAX_BYTES:
            self.send(max(self.buffers, key=lambda t: self.buffers[t][1]))

    def send(self, tp: tuple[str, int]) -> None:
        records, size_bytes = self.buffers.pop(tp)
        self.buffered -= size_bytes
        sequence = self.sequences.get(tp, 0)
        body = orjson.dumps({"records": records})
        self.client.produce_transactional(tp[0], tp[1], body, self.txn_id, self.session, sequence)
        self.sequences[tp] = sequence + len(records)
        self.requests += 1
        topic, part = tp
        if self.sticky.get(topic) == part:  # the keyless rows move on to the next partition
            self.sticky[topic] = (part + 1) % self.counts[topic]
        _maybe_fail_once(self.opts, self.requests)

    def flush(self) -> None:
        for tp in sorted(self.buffers):
            self.send(tp)


def write_transaction(
    batches: Iterator[pa.RecordBatch], opts: SinkOptions, txn_id: str, first: int
) -> SinkCommitMessage:
    """Write a task's rows into a new transaction of ``txn_id``, left open for the driver to
    commit; nothing if an earlier run already committed this transaction (see the module doc)."""
    records = 0
    with LogbusClient(opts.connection) as client:
        known = client.describe_transaction(txn_id)
        if known is not None and known["state"] in _COMMITTED:
            log.info("%s: committed by an earlier run of this batch; writing nothing", txn_id)
            return SinkCommitMessage(
                0, 0, 0, txn_id, known["producer_id"], known["producer_epoch"], True
            )
        writer: _TxnWriter | None = None
        try:
            for batch in batches:
                for topic, record, size, key, part in _rows(batch, opts):
                    if writer is None:  # begins (and fences earlier attempts) at the first row
                        session = client.begin_transaction(txn_id, opts.transaction_timeout_ms)
                        writer = _TxnWriter(client, opts, txn_id, session, first)
                    writer.add(topic, record, size, key, part)
                    records += 1
            if writer is not None:
                writer.flush()
        except BaseException:
            if writer is not None:  # don't hold the partitions' LSO back until the timeout
                _abort_quietly(client, txn_id, writer.session)
            raise
        if writer is None:
            if known is not None and known["state"] == "ongoing":
                # no rows, but an earlier attempt left a transaction open: abort it now rather
                # than let it hold the last stable offset back until its timeout
                session = client.begin_transaction(txn_id, opts.transaction_timeout_ms)
                return SinkCommitMessage(0, 0, 0, txn_id, *session)
            return SinkCommitMessage(0, 0, 0, txn_id)
        return SinkCommitMessage(records, writer.requests, 0, txn_id, *writer.session)


def _abort_quietly(client: LogbusClient, txn_id: str, session: tuple[int, int]) -> None:
    """A failing task aborts its own transaction (Spark's ``abort`` never hears of a task that
    failed for good); if that fails too, the retry's new session or the timeout aborts it."""
    try:
        client.end_transaction(txn_id, session[0], session[1], False)
    except Exception as e:  # the task's own error is the one to report
        log.warning("%s: aborting after a failure failed too: %s", txn_id, e)


def end_transactions(
    opts: SinkOptions, messages: list[WriterCommitMessage | None], commit: bool, what: str
) -> None:
    """The driver's side: commit (or abort) every task's open transaction, one after the other.
    A commit that fails raises (Spark then aborts the batch, and its re-run skips the tasks
    already committed); an abort that fails is logged (the re-run's new sessions abort what
    is left, and the transaction timeout would anyway)."""
    done = [m for m in messages if isinstance(m, SinkCommitMessage)]
    ends = sorted((m for m in done if m.to_commit), key=lambda m: m.transactional_id or "")
    with LogbusClient(opts.connection) as client:
        for m in ends:
            assert m.transactional_id is not None
            try:
                client.end_transaction(m.transactional_id, m.producer_id, m.producer_epoch, commit)
            except BrokerError as e:
                if commit:
                    raise
                log.warning("%s: aborting %s failed: %s", what, m.transactional_id, e)
    skipped = sum(m.already_committed for m in done)
    log.info(
        "%s: %s %d transactions, %d records in %d requests (%d tasks committed by an earlier run)",
        what,
        "committed" if commit else "aborted",
        len(ends),
        sum(m.records for m in ends),
        sum(m.requests for m in ends),
        skipped,
    )


def _task() -> Any:
    from pyspark import TaskContext

    ctx = TaskContext.get()
    assert ctx is not None, "write() runs in a Spark task"
    return ctx


class LogbusStreamWriter(DataSourceStreamArrowWriter):
    def __init__(self, opts: SinkOptions, schema: StructType) -> None:
        check_schema(schema, opts)
        self.opts = opts

    def write(self, iterator: Iterator[pa.RecordBatch]) -> SinkCommitMessage:
        ctx = _task()
        query = ctx.getLocalProperty("sql.streaming.queryId") or "unknown-query"
        batch = ctx.getLocalProperty("streaming.sql.batchId")
        if batch is None:
            raise BrokerError(
                "no micro-batch id in the task: cannot derive the transactional id", status=0
            )
        if self.opts.transactional:
            txn_id = transactional_id_of("spark", query, batch, ctx.partitionId())
            return write_transaction(iterator, self.opts, txn_id, ctx.partitionId())
        prefix = f"spark-{query}-{batch}-{ctx.partitionId()}"
        return write_rows(iterator, self.opts, prefix)

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        # Tests only (option testing.failCommitOnceMarker): fail the batch once after every
        # task wrote, so the query stops and its restart runs the batch again.
        _fail_once(self.opts.fail_commit_once_marker, "testing.failCommitOnceMarker")
        if self.opts.transactional:
            end_transactions(self.opts, messages, True, f"batch {batchId}")
            return
        done = [m for m in messages if isinstance(m, SinkCommitMessage)]
        log.info(
            "batch %d: %d records in %d requests (%d answered as duplicates)",
            batchId,
            sum(m.records for m in done),
            sum(m.requests for m in done),
            sum(m.duplicates for m in done),
        )

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        if self.opts.transactional:
            end_transactions(self.opts, messages, False, f"batch {batchId}")
            return
        log.warning("batch %d aborted; its re-run will not duplicate what was written", batchId)


class LogbusBatchWriter(DataSourceArrowWriter):
    """``df.write.format("logbus")``: one transaction per task, committed by the driver when
    every task has written (so the write is all or nothing for read_committed readers, up to
    the moment between two task commits); task retries abort the failed attempt's."""

    def __init__(self, opts: SinkOptions, schema: StructType) -> None:
        check_schema(schema, opts)
        self.opts = opts
        self.write_id = uuid.uuid4().hex

    def write(self, iterator: Iterator[pa.RecordBatch]) -> SinkCommitMessage:
        ctx = _task()
        if self.opts.transactional:
            txn_id = transactional_id_of("spark-write", self.write_id, ctx.partitionId())
            return write_transaction(iterator, self.opts, txn_id, ctx.partitionId())
        prefix = f"spark-write-{self.write_id}-{ctx.stageId()}-{ctx.partitionId()}"
        return write_rows(iterator, self.opts, prefix)

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        if self.opts.transactional:
            end_transactions(self.opts, messages, True, f"write {self.write_id}")

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        if self.opts.transactional:
            end_transactions(self.opts, messages, False, f"write {self.write_id}")
