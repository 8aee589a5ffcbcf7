"""End to end through Spark (one shared local[2] session): the source, the sink, checkpoints,
task failure, data loss and the schema."""

from __future__ import annotations

import time
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx
import pytest
from pyspark.errors import StreamingQueryException
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    IntegerType,
    LongType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from tests.server import BrokerProcess

from .helpers import high_watermarks, new_topic, produce, values

# The schema Spark's Kafka source documents (structured-streaming-kafka-integration.html).
KAFKA_SCHEMA = StructType(
    [
        StructField("key", BinaryType()),
        StructField("value", BinaryType()),
        StructField("topic", StringType()),
        StructField("partition", IntegerType()),
        StructField("offset", LongType()),
        StructField("timestamp", TimestampType()),
        StructField("timestampType", IntegerType()),
    ]
)
KAFKA_HEADERS = StructField(
    "headers",
    ArrayType(StructType([StructField("key", StringType()), StructField("value", BinaryType())])),
)


def stream(spark: Any, broker: BrokerProcess, **opts: str) -> Any:
    reader = spark.readStream.format("logbus").option("url", broker.url)
    for k, v in opts.items():
        reader = reader.option(k, v)
    return reader.load()


def run_available_now(
    df: Any,
    sink: str,
    checkpoint: str,
    path: str | None = None,
    name: str | None = None,
    **opts: str,
) -> Any:
    w = df.writeStream.format(sink).option("checkpointLocation", checkpoint)
    if name:
        w = w.queryName(name)
    for k, v in opts.items():
        w = w.option(k, v)
    q = w.trigger(availableNow=True).start(path) if path else w.trigger(availableNow=True).start()
    q.awaitTermination(120)
    assert not q.isActive
    return q


def test_schema_is_the_kafka_source_schema(spark: Any, spark_broker: BrokerProcess) -> None:
    df = stream(spark, spark_broker, subscribe="any")
    assert df.schema == KAFKA_SCHEMA
    with_headers = stream(spark, spark_broker, subscribe="any", includeHeaders="true")
    assert with_headers.schema == StructType([*KAFKA_SCHEMA.fields, KAFKA_HEADERS])
    batch = spark.read.format("logbus").option("url", spark_broker.url).option("subscribe", "x")
    assert batch.load().schema == KAFKA_SCHEMA


def test_50k_records_from_3_partitions_exactly_once_then_rate_limited(
    spark: Any, spark_broker: BrokerProcess, http: httpx.Client, tmp_path: Path
) -> None:
    topic = new_topic(http, "fifty", 3)
    base_ms = int(time.time() * 1000) - 60_000  # recent: retention (7 days) keeps them
    records: list[dict[str, Any]] = [
        {
            "key": f"user-{i % 977}",
            "value": {"n": i},
            "partition": i % 3,
            "timestamp": base_ms + i,
            "headers": [{"name": "seq", "value": str(i)}, {"name": "none", "value": None}]
            if i % 2
            else [],
        }
        for i in range(50_000)
    ]
    offsets = produce(http, topic, records)
    expected = {(o["partition"], o["offset"]): r for o, r in zip(offsets, records, strict=True)}

    df = stream(
        spark, spark_broker, subscribe=topic, startingOffsets="earliest", includeHeaders="true"
    )
    run_available_now(df, "memory", str(tmp_path / "ck1"), name="fifty")
    got = spark.sql("SELECT * FROM fifty").collect()
    assert len(got) == 50_000
    seen = set()
    for row in got:
        pos = (row.partition, row.offset)
        assert pos not in seen
        seen.add(pos)
        want = expected[pos]
        assert row.topic == topic
        assert row.key == want["key"].encode()
        assert row.value == b'{"n":%d}' % want["value"]["n"]
        ms = want["timestamp"]
        assert row.timestamp == datetime.fromtimestamp(ms // 1000).replace(
            microsecond=ms % 1000 * 1000
        )  # pyspark gives naive local times
        assert row.timestampType == 0
        assert [(h.key, h.value) for h in row.headers] == [
            (h["name"], None if h.get("value") is None else h["value"].encode())
            for h in want["headers"]
        ]
    assert seen == set(expected)

    q = run_available_now(
        stream(
            spark,
            spark_broker,
            subscribe=topic,
            startingOffsets="earliest",
            maxOffsetsPerTrigger="7000",
        ),
        "memory",
        str(tmp_path / "ck2"),
        name="fifty_limited",
    )
    counts = [p["numInputRows"] for p in q.recentProgress if p["numInputRows"]]
    assert sum(counts) == 50_000
    assert max(counts) <= 7000
    assert len(counts) == 8  # ceil(50,000 / 7,000)
    assert (
        spark.sql("SELECT count(DISTINCT partition, offset) FROM fifty_limited").first()[0]
        == 50_000
    )


def test_restart_from_checkpoint_reads_only_new_records(
    spark: Any, spark_broker: BrokerProcess, http: httpx.Client, tmp_path: Path
) -> None:
    topic = new_topic(http, "restart", 2)
    produce(http, topic, [{"value": i, "partition": i % 2} for i in range(1000)])
    out, ck = str(tmp_path / "out"), str(tmp_path / "ck")
    df = stream(spark, spark_broker, subscribe=topic, startingOffsets="earliest")
    run_available_now(
        df.selectExpr("CAST(value AS STRING) AS v", "partition", "offset"), "parquet", ck, out
    )
    assert spark.read.parquet(out).count() == 1000
    produce(http, topic, [{"value": i, "partition": i % 2} for i in range(1000, 1500)])
    df = stream(spark, spark_broker, subscribe=topic, startingOffsets="earliest")
    run_available_now(
        df.selectExpr("CAST(value AS STRING) AS v", "partition", "offset"), "parquet", ck, out
    )
    values = [int(r.v) for r in spark.read.parquet(out).collect()]
    assert sorted(values) == list(range(1500))


def test_a_sink_task_that_fails_once_writes_each_record_once(
    spark: Any, spark_broker: BrokerProcess, http: httpx.Client, tmp_path: Path
) -> None:
    source = new_topic(http, "sink-in", 2)
    target = new_topic(http, "sink-out", 3)
    produce(
        http,
        source,
        [
            {
                "key": f"k{i % 10}",
                "value": i,
                "partition": i % 2,
                "headers": [{"name": "i", "value": str(i)}],
            }
            for i in range(3000)
        ],
    )
    marker = tmp_path / "failed-once"
    df = stream(
        spark, spark_broker, subscribe=source, startingOffsets="earliest", includeHeaders="true"
    )
    run_available_now(
        df.selectExpr("key", "CAST(value AS STRING) AS value", "headers"),
        "logbus",
        str(tmp_path / "ck"),
        url=spark_broker.url,
        topic=target,
        maxRequestRecords="200",
        **{"testing.failOnceMarker": str(marker)},
    )
    assert marker.exists()  # a task did fail after writing, and was re-run
    # the failed attempt's first request is there, aborted: only read_uncommitted sees it
    assert len(values(http, target, "read_uncommitted")) > 3000
    back = (
        spark.read.format("logbus")
        .option("url", spark_broker.url)
        .option("subscribe", target)
        .option("includeHeaders", "true")
        .option("kafka.isolation.level", "read_committed")
        .load()
    )
    rows = back.selectExpr("CAST(key AS STRING) k", "CAST(value AS STRING) v", "headers").collect()
    assert sorted(int(r.v) for r in rows) == list(range(3000))
    assert all(r.k == f"k{int(r.v) % 10}" and r.headers[0].value == r.v.encode() for r in rows)

    # the batch writer too, routing by a topic column
    one, two = new_topic(http, "sink-batch", 1), new_topic(http, "sink-batch", 2)
    rows_in = [(f"k{i}", f"v{i}", two if i % 7 == 0 else one) for i in range(100)]
    frame = spark.createDataFrame(rows_in, "key string, value string, topic string")
    frame.write.format("logbus").mode("append").option("url", spark_broker.url).save()
    assert (len(values(http, one)), len(values(http, two))) == (85, 15)


def test_a_micro_batch_rerun_after_a_restart_writes_each_record_once(
    spark: Any, spark_broker: BrokerProcess, http: httpx.Client, tmp_path: Path
) -> None:
    source = new_topic(http, "rerun-in", 2)
    target = new_topic(http, "rerun-out", 2)
    produce(http, source, [{"value": i, "partition": i % 2} for i in range(2000)])
    marker = tmp_path / "commit-failed-once"

    def run() -> Any:
        df = stream(spark, spark_broker, subscribe=source, startingOffsets="earliest")
        return run_available_now(
            df.selectExpr("CAST(value AS STRING) AS value"),
            "logbus",
            str(tmp_path / "ck"),
            url=spark_broker.url,
            topic=target,
            maxRequestRecords="300",
            **{"testing.failCommitOnceMarker": str(marker)},
        )

    # Every task wrote, then the batch failed before Spark committed it: the query stops,
    # and none of the batch is visible at read_committed (read_uncommitted sees the rows).
    with pytest.raises(StreamingQueryException, match="failCommitOnceMarker"):
        run()
    assert values(http, target) == []
    assert len(values(http, target, "read_uncommitted")) == 2000
    q = run()  # the restart runs batch 0 again: new sessions abort the first run's transactions
    assert [p["batchId"] for p in q.recentProgress if p["numInputRows"]] == [0]
    assert sorted(values(http, target), key=int) == [str(i) for i in range(2000)]


def test_a_stream_over_several_micro_batches_commits_each_row_once(
    spark: Any, spark_broker: BrokerProcess, http: httpx.Client, tmp_path: Path
) -> None:
    source = new_topic(http, "multi-in", 2)
    target = new_topic(http, "multi-out", 3)
    produce(http, source, [{"value": i, "partition": i % 2, "key": f"k{i}"} for i in range(1500)])
    df = stream(
        spark,
        spark_broker,
        subscribe=source,
        startingOffsets="earliest",
        maxOffsetsPerTrigger="500",
    )
    q = run_available_now(
        df.selectExpr("key", "CAST(value AS STRING) AS value"),
        "logbus",
        str(tmp_path / "ck"),
        url=spark_broker.url,
        topic=target,
    )
    assert len([p for p in q.recentProgress if p["numInputRows"]]) == 3
    assert sorted(values(http, target), key=int) == [str(i) for i in range(1500)]
    # the transactions are committed: none is left open to hold read_committed readers back
    stable = [p["last_stable_offset"] for p in http.get(f"/v1/topics/{target}/partitions").json()]
    assert stable == list(high_watermarks(http, target).values())


def _wait_for_log_start(http: httpx.Client, topic: str, past: int) -> int:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        start = http.get(f"/v1/topics/{topic}/partitions").json()[0]["log_start_offset"]
        if start > past:
            return int(start)
        time.sleep(0.1)
    raise AssertionError("retention did not delete the old segments")


def test_fail_on_data_loss_both_ways(
    spark: Any, spark_broker: BrokerProcess, http: httpx.Client, tmp_path: Path
) -> None:
    topic = new_topic(http, "loss", 1, **{"segment.bytes": 2048, "retention.bytes": 4096})
    produce(http, topic, [{"value": i} for i in range(20)])
    for strict in ("true", "false"):  # both queries are at offset 20 ...
        df = stream(
            spark, spark_broker, subscribe=topic, startingOffsets="earliest", failOnDataLoss=strict
        )
        run_available_now(
            df.selectExpr("offset"),
            "parquet",
            str(tmp_path / f"ck-{strict}"),
            str(tmp_path / f"out-{strict}"),
        )
    for _i in range(40):  # ... when retention deletes the records after it
        produce(http, topic, [{"value": "x" * 100} for _ in range(10)])
    log_start = _wait_for_log_start(http, topic, 20)
    end = high_watermarks(http, topic)[0]

    df = stream(
        spark, spark_broker, subscribe=topic, startingOffsets="earliest", failOnDataLoss="true"
    )
    with pytest.raises(
        StreamingQueryException, match=r"were deleted before the query read them.*failOnDataLoss"
    ):
        run_available_now(
            df.selectExpr("offset"),
            "parquet",
            str(tmp_path / "ck-true"),
            str(tmp_path / "out-true"),
        )

    df = stream(
        spark, spark_broker, subscribe=topic, startingOffsets="earliest", failOnDataLoss="false"
    )
    run_available_now(
        df.selectExpr("offset"), "parquet", str(tmp_path / "ck-false"), str(tmp_path / "out-false")
    )
    got = sorted(r.offset for r in spark.read.parquet(str(tmp_path / "out-false")).collect())
    assert got[:20] == list(range(20))
    later = got[20:]
    assert later == list(range(later[0], end))
    assert later[0] >= log_start  # skipped ahead: nothing below the log start was invented
