"""The stream and batch readers' driver logic and ``read()``, against a real broker, without
Spark: admission control, Trigger.AvailableNow, new partitions, data loss, compression, auth."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import httpx
import pyarrow as pa  # type: ignore[import-untyped]
import pytest
from pyspark.sql.pandas.types import to_arrow_schema
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadMaxRows, ReadMinRows

from core_log.batch import Record, build_batch
from core_log.compression import Compression
from spark_sink.client import BinaryFetcher, Fetched, LogbusClient, OutOfRange, PartitionState
from spark_sink.columns import arrow_schema, kafka_schema
from spark_sink.errors import DataLossError, OptionError
from spark_sink.offsets import OffsetRange
from spark_sink.options import Connection, source_options
from spark_sink.source import LogbusBatchReader, LogbusStreamReader, plan_ranges, read_range
from tests.server import BrokerProcess

from .helpers import new_topic, produce

_open: list[LogbusStreamReader] = []


@pytest.fixture(autouse=True)
def _close_readers() -> Iterator[None]:
    yield
    while _open:
        _open.pop().stop()


def stream_reader(
    broker: BrokerProcess, clock: list[float] | None = None, **opts: str
) -> LogbusStreamReader:
    o = source_options({"url": broker.url, **opts}, batch=False)
    r = LogbusStreamReader(o) if clock is None else LogbusStreamReader(o, lambda: clock[0])
    _open.append(r)
    return r


def rows(table: list[pa.RecordBatch]) -> list[tuple[int, bytes]]:
    return [(r["offset"], r["value"]) for b in table for r in b.to_pylist()]


def test_arrow_schema_is_what_spark_expects_for_the_kafka_schema() -> None:
    for headers in (False, True):
        assert to_arrow_schema(kafka_schema(headers), timezone="UTC").equals(arrow_schema(headers))


def test_initial_offsets_and_admission_control(
    spark_broker: BrokerProcess, http: httpx.Client
) -> None:
    topic = new_topic(http, "admit", 3)
    produce(http, topic, [{"value": i, "partition": i % 3} for i in range(30)])
    clock = [1_000_000.0]
    r = stream_reader(
        spark_broker,
        clock,
        subscribe=topic,
        startingOffsets="earliest",
        minOffsetsPerTrigger="20",
        maxTriggerDelay="10s",
        maxOffsetsPerTrigger="24",
    )
    start = r.initialOffset()
    assert start == {topic: {"0": 0, "1": 0, "2": 0}}
    assert isinstance(r.getDefaultReadLimit(), ReadMinRows)
    # 30 pending >= 20: a batch, capped at 24
    end = r.latestOffset(start, r.getDefaultReadLimit())
    assert end == {topic: {"0": 8, "1": 8, "2": 8}}
    assert r.reportLatestOffset() == {topic: {"0": 10, "1": 10, "2": 10}}
    # 6 pending < 20: wait until maxTriggerDelay has passed
    clock[0] += 5_000
    assert r.latestOffset(end, r.getDefaultReadLimit()) == end
    clock[0] += 5_000
    assert r.latestOffset(end, r.getDefaultReadLimit()) == {topic: {"0": 10, "1": 10, "2": 10}}
    # Trigger.Once hands ReadAllAvailable: the options are ignored
    assert r.latestOffset(start, ReadAllAvailable()) == {topic: {"0": 10, "1": 10, "2": 10}}
    assert r.latestOffset(start, ReadMaxRows(3)) == {topic: {"0": 1, "1": 1, "2": 1}}


def test_available_now_stops_at_the_target_and_new_partitions_start_at_earliest(
    spark_broker: BrokerProcess, http: httpx.Client
) -> None:
    topic = new_topic(http, "avail", 1)
    produce(http, topic, [{"value": i} for i in range(10)])
    r = stream_reader(spark_broker, subscribe=topic, startingOffsets="latest")
    start = r.initialOffset()
    assert start == {topic: {"0": 10}}
    produce(http, topic, [{"value": i} for i in range(5)])
    r.prepareForTriggerAvailableNow()
    produce(http, topic, [{"value": i} for i in range(5)])  # after the target: not read
    assert r.latestOffset(start, ReadAllAvailable()) == {topic: {"0": 15}}
    # a partition added while the query runs is read from its start
    r2 = stream_reader(spark_broker, subscribe=topic, startingOffsets="latest")
    start = r2.initialOffset()
    assert http.post(f"/v1/topics/{topic}/partitions", json={"count": 2}).status_code == 200
    produce(http, topic, [{"value": i, "partition": 1} for i in range(4)])
    end = r2.latestOffset(start, ReadAllAvailable())
    assert end == {topic: {"0": 20, "1": 4}}
    (part,) = r2.partitions(start, end)
    assert part.range == OffsetRange(topic, 1, 0, 4)  # type: ignore[attr-defined]
    assert len(rows(list(r2.read(part)))) == 4


def test_starting_offsets_json_must_cover_every_partition(
    spark_broker: BrokerProcess, http: httpx.Client
) -> None:
    topic = new_topic(http, "json", 2)
    produce(http, topic, [{"value": i, "partition": i % 2} for i in range(10)])
    r = stream_reader(
        spark_broker, subscribe=topic, startingOffsets=f'{{"{topic}": {{"0": 2, "1": -1}}}}'
    )
    assert r.initialOffset() == {topic: {"0": 2, "1": 5}}
    r = stream_reader(spark_broker, subscribe=topic, startingOffsets=f'{{"{topic}": {{"0": 2}}}}')
    with pytest.raises(OptionError, match="every subscribed partition"):
        r.initialOffset()


def test_starting_timestamp(spark_broker: BrokerProcess, http: httpx.Client) -> None:
    topic = new_topic(http, "ts", 1)
    base = int(time.time() * 1000) - 60_000  # recent: the test broker's retention keeps them
    produce(http, topic, [{"value": i, "timestamp": base + 1000 * (i + 1)} for i in range(10)])
    r = stream_reader(spark_broker, subscribe=topic, startingTimestamp=str(base + 4500))
    assert r.initialOffset() == {topic: {"0": 4}}
    late = base + 99_999
    r = stream_reader(
        spark_broker, subscribe=topic, startingOffsetsByTimestamp=f'{{"{topic}": {{"0": {late}}}}}'
    )
    with pytest.raises(OptionError, match="timestamp"):
        r.initialOffset()
    r = stream_reader(
        spark_broker,
        subscribe=topic,
        startingTimestamp=str(late),
        startingOffsetsByTimestampStrategy="latest",
    )
    assert r.initialOffset() == {topic: {"0": 10}}


def test_batch_reader_reads_exactly_the_range(
    spark_broker: BrokerProcess, http: httpx.Client
) -> None:
    topic = new_topic(http, "batch", 2)
    produce(http, topic, [{"value": i, "partition": i % 2} for i in range(100)])
    o = source_options(
        {
            "url": spark_broker.url,
            "subscribe": topic,
            "startingOffsets": f'{{"{topic}": {{"0": 3, "1": -2}}}}',
            "endingOffsets": f'{{"{topic}": {{"0": 10, "1": -1}}}}',
            "fetchMaxBytes": "1024",
        },
        batch=True,
    )
    parts = LogbusBatchReader(o).partitions()
    got = {p.range.partition: rows(list(read_range(o, p.range))) for p in parts}  # type: ignore[attr-defined]
    assert [off for off, _ in got[0]] == list(range(3, 10))
    assert [off for off, _ in got[1]] == list(range(50))


def test_compressed_batches_are_read(spark_broker: BrokerProcess, http: httpx.Client) -> None:
    topic = new_topic(http, "gzip", 1)
    now_ms = int(time.time() * 1000)  # recent: the test broker's retention keeps them
    for codec in (Compression.GZIP, Compression.ZSTD, Compression.NONE):
        data = build_batch(
            [Record(f"{codec.name}-{i}".encode(), timestamp=now_ms) for i in range(50)],
            compression=codec,
        )
        r = http.post(
            f"/v1/topics/{topic}/partitions/0/records",
            content=data,
            headers={"content-type": "application/vnd.logbus.batch"},
        )
        assert r.status_code == 200, r.text
    o = source_options({"url": spark_broker.url, "subscribe": topic}, batch=True)
    got = rows(list(read_range(o, OffsetRange(topic, 0, 25, 140))))
    assert [off for off, _ in got] == list(range(25, 140))
    assert got[0][1] == b"GZIP-25" and got[-1][1] == b"NONE-39"


def test_data_loss_is_found_when_planning() -> None:
    o = source_options({"url": "http://x", "subscribe": "t"}, batch=False)
    lax = source_options(
        {"url": "http://x", "subscribe": "t", "failOnDataLoss": "false"}, batch=False
    )
    states = {("t", 0): PartitionState(0, 40, 100)}
    with pytest.raises(DataLossError, match=r"\[10, 40\) of t-0 were deleted.*failOnDataLoss"):
        plan_ranges({("t", 0): 10}, {("t", 0): 100}, states, o)
    assert plan_ranges({("t", 0): 10}, {("t", 0): 100}, states, lax) == [
        OffsetRange("t", 0, 40, 100)
    ]
    with pytest.raises(DataLossError, match="went back"):
        plan_ranges({("t", 0): 10}, {("t", 0): 5}, states, o)
    assert plan_ranges({("t", 1): 0}, {("t", 1): 5}, states, lax) == []  # partition gone


def test_bearer_token_is_sent() -> None:
    seen: list[str | None] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request.headers.get("authorization"))
        return httpx.Response(200, json={"topics": []})

    with LogbusClient(
        Connection("http://x", token="s3cret"), transport=httpx.MockTransport(handler)
    ) as c:
        assert c.topics() == []
    assert seen == ["Bearer s3cret"] * 2  # GET /v1/cluster (where the brokers are), /v1/topics


def test_the_client_is_never_pickled() -> None:
    import pickle

    with LogbusClient(Connection("http://x")) as c, pytest.raises(TypeError):
        pickle.dumps(c)
    with BinaryFetcher(Connection("http://x")) as f, pytest.raises(TypeError):
        pickle.dumps(f)
    r = LogbusStreamReader(source_options({"url": "http://x", "subscribe": "t"}, batch=False))
    r.client()
    clone = pickle.loads(pickle.dumps(r))
    assert clone._client is None


def test_a_range_past_the_log_end_is_data_loss(
    spark_broker: BrokerProcess, http: httpx.Client
) -> None:
    topic = new_topic(http, "short", 1)
    produce(http, topic, [{"value": i} for i in range(10)])
    strict = source_options({"url": spark_broker.url, "subscribe": topic}, batch=True)
    lax = source_options(
        {"url": spark_broker.url, "subscribe": topic, "failOnDataLoss": "false"}, batch=True
    )
    with pytest.raises(DataLossError, match=r"\[10, 50\) of .* past the high watermark 10"):
        list(read_range(strict, OffsetRange(topic, 0, 5, 50)))
    assert [o for o, _ in rows(list(read_range(lax, OffsetRange(topic, 0, 5, 50))))] == list(
        range(5, 10)
    )
    with pytest.raises(DataLossError, match="past the log end"):
        list(read_range(strict, OffsetRange(topic, 0, 20, 50)))


def test_binary_fetcher_sends_the_token_and_retries() -> None:
    """Against a scripted HTTP server: 503 then 200 (retried, same connection or a new one)."""
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    seen: list[tuple[str, str | None]] = []
    answers = [(503, b"{}", {}), (200, b"", {"Logbus-Next-Offset": "7"}), (416, b"", {})]

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            seen.append((self.path, self.headers.get("authorization")))
            if self.path.endswith("/v1/cluster"):  # a broker from before clusters
                answer: tuple[int, bytes, dict[str, str]] = (404, b"", {})
            else:
                answer = answers.pop(0)
            status, body, headers = answer
            if status == 416:
                body = (
                    b'{"code": "OFFSET_OUT_OF_RANGE", "log_start_offset": 9, "log_end_offset": 12}'
                )
            self.send_response(status)
            for k, v in {
                "Logbus-High-Watermark": "7",
                "Logbus-Log-Start-Offset": "0",
                "Content-Length": str(len(body)),
                **headers,
            }.items():
                self.send_header(k, v)
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}/prefix"
        with BinaryFetcher(Connection(url, token="s3cret"), sleep=lambda s: None) as f:
            got = f.fetch("t 1", 0, 5, 1024)
            assert isinstance(got, Fetched) and (got.data, got.next_offset) == (b"", 7)
            gone = f.fetch("t 1", 0, 2, 1024)
            assert gone == OutOfRange(2, 9, 12)
    finally:
        server.shutdown()
        server.server_close()
    assert [a for _, a in seen] == ["Bearer s3cret"] * 4
    assert seen[0][0] == "/prefix/v1/cluster"  # learnt once: one broker, used at its URL
    assert seen[1][0] == "/prefix/v1/topics/t%201/partitions/0/records?offset=5&max_bytes=1024"


def _txn(http: httpx.Client, txn_id: str, topic: str, values: list[int], end: str | None) -> None:
    """One transaction of ``values`` on partition 0, then ``end`` (commit, abort, or open)."""
    r = http.post(f"/v1/transactions/{txn_id}", json={})
    assert r.status_code == 201, r.text
    session = {"producer_id": r.json()["producer_id"], "producer_epoch": r.json()["producer_epoch"]}
    r = http.post(
        f"/v1/topics/{topic}/partitions/0/records",
        json={"records": [{"value": v} for v in values]},
        headers={
            "Logbus-Transactional-Id": txn_id,
            "Logbus-Producer-Id": str(session["producer_id"]),
            "Logbus-Producer-Epoch": str(session["producer_epoch"]),
            "Logbus-Sequence": "0",
        },
    )
    assert r.status_code == 200, r.text
    if end is not None:
        r = http.post(f"/v1/transactions/{txn_id}/{end}", json=session)
        assert r.status_code == 200, r.text


def test_read_committed_reads_committed_rows_only_and_stops_at_the_lso(
    spark_broker: BrokerProcess, http: httpx.Client
) -> None:
    topic = new_topic(http, "rc", 1)
    produce(http, topic, [{"value": v} for v in (0, 1, 2)])
    _txn(http, f"{topic}-a", topic, [10, 11, 12], "commit")
    _txn(http, f"{topic}-b", topic, [20, 21], "abort")
    _txn(http, f"{topic}-a", topic, [30, 31], "commit")
    _txn(http, f"{topic}-d", topic, [40, 41], None)  # open: the LSO is its first offset
    produce(http, topic, [{"value": v} for v in (50, 51)])
    committed = [0, 1, 2, 10, 11, 12, 30, 31]

    def read_all(reader: LogbusStreamReader | LogbusBatchReader, *bounds: Any) -> list[int]:
        return [
            int(v) for part in reader.partitions(*bounds) for _, v in rows(list(reader.read(part)))
        ]

    committed_opts = {"isolation.level": "read_committed"}
    r = stream_reader(
        spark_broker, None, subscribe=topic, startingOffsets="earliest", **committed_opts
    )
    start = r.initialOffset()
    end = r.latestOffset(start, ReadAllAvailable())
    lso = end[topic]["0"]
    assert lso == 3 + 4 + 3 + 3  # records and markers before transaction d
    assert read_all(r, start, end) == committed
    # ranges of two offsets: some hold only markers or aborted records, and yield nothing
    batch = LogbusBatchReader(
        source_options(
            {
                "url": spark_broker.url,
                "subscribe": topic,
                "kafka.isolation.level": "read_committed",
                "maxRecordsPerPartition": "2",
            },
            batch=True,
        )
    )
    assert read_all(batch) == committed
    uncommitted = stream_reader(spark_broker, subscribe=topic, startingOffsets="earliest")
    every = read_all(uncommitted, start, uncommitted.latestOffset(start, ReadAllAvailable()))
    assert every == [0, 1, 2, 10, 11, 12, 20, 21, 30, 31, 40, 41, 50, 51]

    r2 = http.get(f"/v1/transactions/{topic}-d")  # commit d: the rest becomes readable
    session = {k: r2.json()[k] for k in ("producer_id", "producer_epoch")}
    assert http.post(f"/v1/transactions/{topic}-d/commit", json=session).status_code == 200
    later = r.latestOffset(end, ReadAllAvailable())
    assert read_all(r, end, later) == [40, 41, 50, 51]

    for bad in (
        {"isolation.level": "serializable"},
        {"isolation.level": "read_committed", "kafka.isolation.level": "read_uncommitted"},
    ):
        with pytest.raises(OptionError, match=r"isolation\.level"):
            source_options({"url": spark_broker.url, "subscribe": topic, **bad}, batch=False)
