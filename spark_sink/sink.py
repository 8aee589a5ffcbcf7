"""The ``logbus`` sink: ``df.writeStream.format("logbus")`` and ``df.write.format("logbus")``.

Columns as in Spark's Kafka sink: ``value`` (string or binary, null for a tombstone) is
required; ``key`` (string or binary), ``headers`` (array<struct<key string, value binary>>),
``topic`` (string) and ``partition`` (int) are optional; the ``topic`` option overrides the
column. A ``timestamp`` column (timestamp or long ms), if present, sets the record timestamps;
otherwise the broker stamps them when it first appends them.

Exactly once per micro-batch. A task cuts its rows, in order, into requests of at most
``maxRequestRecords`` records and ``maxRequestBytes`` bytes (a new request also starts when
the topic changes), and sends each as JSON with ``Idempotency-Key:
spark-<queryId>-<batchId>-<task partition>-<chunk index>``. A re-run of the micro-batch (a
retried task, or the query restarted from its checkpoint) cuts the same rows into the same
requests, and the broker answers each repeat with the original offsets instead of appending it
again. That needs the rows of a task to come in the same order on a re-run, which holds for
deterministic plans; if they do not, the broker answers 422 and the task fails with a clear
message rather than write twice. Records are visible to readers as soon as a task has written
them (Logbus has no transactions), before Spark commits the batch.
"""

from __future__ import annotations

import base64
import logging
import os
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

from .client import LogbusClient
from .errors import BrokerError, OptionError
from .options import SinkOptions

log = logging.getLogger("logbus.spark")

JSON = "application/json"


@dataclass
class SinkCommitMessage(WriterCommitMessage):
    records: int
    requests: int
    duplicates: int


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


def _rows(batch: pa.RecordBatch, opts: SinkOptions) -> Iterator[tuple[str, dict[str, Any], int]]:
    """(topic, JSON record, payload bytes) per row."""
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
        if value is not None:
            record["value_b64"] = _b64(value)
            size += len(value)
        if keys is not None and keys[i] is not None:
            record["key_b64"] = _b64(keys[i])
            size += len(keys[i])
        if partitions is not None and partitions[i] is not None:
            record["partition"] = partitions[i]
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
        yield topic, record, size


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
            for topic, record, size in _rows(batch, opts):
                records += 1
                send(chunker.add(topic, record, size))
        send(chunker.flush())
    return SinkCommitMessage(records, sent, duplicates)


def _maybe_fail_once(opts: SinkOptions, sent: int) -> None:
    """Tests only (option ``testing.failOnceMarker``): fail the task once, after its first
    request was written, so Spark re-runs it; the marker file records that it happened."""
    if sent == 1:
        _fail_once(opts.fail_once_marker, "testing.failOnceMarker")


def _fail_once(marker: str | None, option: str) -> None:
    if marker is None or os.path.exists(marker):
        return
    with open(marker, "w") as f:
        f.write("failed once\n")
    raise RuntimeError(f"injected failure ({option})")


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
                "no micro-batch id in the task: cannot derive idempotency keys", status=0
            )
        prefix = f"spark-{query}-{batch}-{ctx.partitionId()}"
        return write_rows(iterator, self.opts, prefix)

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        # Tests only (option testing.failCommitOnceMarker): fail the batch once after every
        # task wrote, so the query stops and its restart runs the batch again.
        _fail_once(self.opts.fail_commit_once_marker, "testing.failCommitOnceMarker")
        done = [m for m in messages if isinstance(m, SinkCommitMessage)]
        log.info(
            "batch %d: %d records in %d requests (%d answered as duplicates)",
            batchId,
            sum(m.records for m in done),
            sum(m.requests for m in done),
            sum(m.duplicates for m in done),
        )

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        log.warning("batch %d aborted; its re-run will not duplicate what was written", batchId)


class LogbusBatchWriter(DataSourceArrowWriter):
    """``df.write.format("logbus")``: exactly once across task retries of this one write."""

    def __init__(self, opts: SinkOptions, schema: StructType) -> None:
        check_schema(schema, opts)
        self.opts = opts
        self.write_id = uuid.uuid4().hex

    def write(self, iterator: Iterator[pa.RecordBatch]) -> SinkCommitMessage:
        ctx = _task()
        prefix = f"spark-write-{self.write_id}-{ctx.stageId()}-{ctx.partitionId()}"
        return write_rows(iterator, self.opts, prefix)
