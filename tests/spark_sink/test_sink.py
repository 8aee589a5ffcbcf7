"""The sink without Spark: schema checks, request cutting, JSON records, and the exactly-once
replay against a real broker (same key + same body → duplicate; other body → a clear 422)."""

from __future__ import annotations

import base64
from datetime import UTC, datetime

import httpx
import orjson
import pyarrow as pa  # type: ignore[import-untyped]
import pytest
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    IntegerType,
    StringType,
    StructField,
    StructType,
)

from spark_sink.errors import BrokerError, OptionError
from spark_sink.options import sink_options
from spark_sink.sink import _Chunker, _rows, check_schema, write_rows
from tests.server import BrokerProcess

from .helpers import high_watermarks, new_topic

HEADERS = ArrayType(
    StructType([StructField("key", StringType()), StructField("value", BinaryType())])
)


def schema(**cols: object) -> StructType:
    return StructType([StructField(name, t) for name, t in cols.items()])  # type: ignore[arg-type]


def test_schema_checks() -> None:
    with_topic = sink_options({"url": "http://x", "topic": "t"})
    no_topic = sink_options({"url": "http://x"})
    check_schema(schema(value=BinaryType(), key=StringType(), headers=HEADERS), with_topic)
    check_schema(schema(value=StringType(), topic=StringType(), partition=IntegerType()), no_topic)
    bad = [
        (schema(key=StringType()), with_topic, "value column"),
        (schema(value=IntegerType()), with_topic, "column value must be"),
        (schema(value=StringType(), partition=StringType()), with_topic, "column partition"),
        (schema(value=StringType(), headers=ArrayType(StringType())), with_topic, "headers"),
        (schema(value=StringType()), no_topic, "topic option or a topic column"),
    ]
    for s, opts, message in bad:
        with pytest.raises(OptionError, match=message):
            check_schema(s, opts)


def test_rows_become_json_records() -> None:
    opts = sink_options({"url": "http://x"})
    batch = pa.RecordBatch.from_pydict(
        {
            "value": ["héllo", None],
            "key": [b"\x00k", None],
            "topic": ["a", "b"],
            "partition": [2, None],
            "timestamp": [datetime(2026, 1, 1, tzinfo=UTC), None],
            "headers": [[{"key": "h", "value": b"v"}, {"key": "n", "value": None}], []],
        }
    )
    (t1, r1, size1), (t2, r2, _) = _rows(batch, opts)
    assert (t1, t2) == ("a", "b")
    assert base64.b64decode(r1["value_b64"]) == "héllo".encode()
    assert base64.b64decode(r1["key_b64"]) == b"\x00k"
    assert r1["partition"] == 2 and r1["timestamp"] == 1_767_225_600_000
    assert r1["headers"] == [{"name": "h", "value_b64": "dg=="}, {"name": "n"}]
    assert r2 == {}  # a tombstone without key, partition or headers
    assert size1 >= len("héllo".encode()) + 2


def test_requests_are_cut_by_count_bytes_and_topic() -> None:
    opts = sink_options({"url": "http://x", "maxRequestRecords": "3", "maxRequestBytes": "100"})
    chunker = _Chunker(opts)
    out = [
        chunker.add(t, {"n": i}, size)
        for i, (t, size) in enumerate([("a", 10)] * 4 + [("b", 10), ("b", 60), ("b", 60)])
    ]
    out.append(chunker.flush())
    sent = [(t, [r["n"] for r in orjson.loads(body)["records"]]) for t, body in filter(None, out)]
    assert sent == [("a", [0, 1, 2]), ("a", [3]), ("b", [4, 5]), ("b", [6])]


def test_a_replay_is_a_duplicate_and_other_contents_are_refused(
    spark_broker: BrokerProcess, http: httpx.Client
) -> None:
    topic = new_topic(http, "replay", 2)
    opts = sink_options({"url": spark_broker.url, "topic": topic, "maxRequestRecords": "4"})

    def batches(values: list[str]) -> list[pa.RecordBatch]:
        return [pa.RecordBatch.from_pydict({"value": values, "key": [v[:1] for v in values]})]

    values = [f"v{i}" for i in range(10)]
    first = write_rows(iter(batches(values)), opts, "spark-test-q-0-0")
    assert (first.records, first.requests, first.duplicates) == (10, 3, 0)
    again = write_rows(iter(batches(values)), opts, "spark-test-q-0-0")
    assert (again.records, again.requests, again.duplicates) == (10, 3, 3)
    assert sum(high_watermarks(http, topic).values()) == 10
    with pytest.raises(BrokerError, match="another order or with other values") as e:
        write_rows(iter(batches(list(reversed(values)))), opts, "spark-test-q-0-0")
    assert e.value.status == 422
    assert sum(high_watermarks(http, topic).values()) == 10
