"""The sink without Spark: schema checks, request cutting, JSON records, the exactly-once
replay against a real broker (same key + same body → duplicate; other body → a clear 422),
and the transactional path: placement, invisible until the driver's commit, a retried task
aborting its earlier attempt, a re-run of a committed task writing nothing."""

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

from cluster.partitioner import partition_for_key
from spark_sink.errors import BrokerError, OptionError
from spark_sink.options import sink_options
from spark_sink.sink import (
    _Chunker,
    _rows,
    check_schema,
    end_transactions,
    transactional_id_of,
    write_rows,
    write_transaction,
)
from tests.server import BrokerProcess

from .helpers import high_watermarks, new_topic, values

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
    (t1, r1, size1, k1, p1), (t2, r2, _, k2, p2) = _rows(batch, opts)
    assert (t1, t2) == ("a", "b")
    assert (k1, p1, k2, p2) == (b"\x00k", 2, None, None)
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
    opts = sink_options(
        {
            "url": spark_broker.url,
            "topic": topic,
            "maxRequestRecords": "4",
            "transactional": "false",
        }
    )

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


def test_transactional_ids_are_legal_and_deterministic() -> None:
    assert transactional_id_of("spark", "q-1", 3, 0) == "spark-q-1-3-0"
    odd = transactional_id_of("spark", "q/1 ü", 3, 0)
    assert odd == transactional_id_of("spark", "q/1 ü", 3, 0)
    assert odd.startswith("spark-q_1__-3-0-") and odd != transactional_id_of("spark", "q_1 ü", 3, 0)
    long = transactional_id_of("spark", "x" * 300, 1, 2)
    assert len(long) == 249 and long != transactional_id_of("spark", "x" * 300, 1, 3)


def test_a_task_transaction_is_invisible_until_the_driver_commits(
    spark_broker: BrokerProcess, http: httpx.Client
) -> None:
    topic = new_topic(http, "txn-task", 3)
    opts = sink_options({"url": spark_broker.url, "topic": topic, "maxRequestRecords": "7"})
    keys = [f"k{i % 13}" for i in range(60)]

    def batches() -> list[pa.RecordBatch]:
        return [pa.RecordBatch.from_pydict({"value": [str(i) for i in range(60)], "key": keys})]

    txn_id = transactional_id_of("spark", "test-q", 0, 0)
    failed = write_transaction(iter(batches()), opts, txn_id, 0)  # an attempt that then died
    retry = write_transaction(iter(batches()), opts, txn_id, 0)  # fences and aborts it
    assert (retry.records, retry.transactional_id) == (60, txn_id)
    assert values(http, topic) == []  # read_committed: nothing before the commit
    assert len(values(http, topic, "read_uncommitted")) == 120
    with pytest.raises(BrokerError):  # the failed attempt's session is fenced
        end_transactions(opts, [failed], True, "test")
    end_transactions(opts, [retry, None], True, "test")
    end_transactions(opts, [retry], True, "test")  # a repeat of the commit is harmless
    assert sorted(values(http, topic), key=int) == [str(i) for i in range(60)]
    for p in range(3):  # keyed rows land where the broker's partitioner puts them
        r = http.get(f"/v1/topics/{topic}/partitions/{p}/records", params={"offset": 0})
        for rec in r.json()["records"]:
            if rec["offset"] < high_watermarks(http, topic)[p]:
                want = partition_for_key(keys[int(rec["value"])].encode(), 3)
                assert want == p
    again = write_transaction(iter(batches()), opts, txn_id, 0)  # a re-run of the batch
    assert again.already_committed and again.records == 0 and not again.to_commit
    assert len(values(http, topic, "read_uncommitted")) == 120

    with pytest.raises(OptionError, match="not one of"):
        rows = {"value": ["x"], "partition": pa.array([5], pa.int32())}
        write_transaction(iter([pa.RecordBatch.from_pydict(rows)]), opts, "spark-bad-0-0", 0)
