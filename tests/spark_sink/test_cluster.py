"""The Spark source against a 3-broker cluster: a streaming query keeps running across a
SIGKILL of a partition leader and reads every acknowledged record exactly once.

The topic has RF=3 and min.insync.replicas=2; an idempotent producer (logbus_client's
ProducerSession) writes with acks=all to both partitions' leaders. The query reads through
the source's ``url`` list of all three brokers into a memory sink. Mid-query the leader of
partition 0 is killed: the driver's metadata calls and the executors' fetches fail over to
the surviving brokers (logbus_client.routing), the producer's retries are deduplicated by
the new leader, and in the end the sink holds each acknowledged value exactly once, at one
offset, with offsets contiguous per partition (nothing read twice, nothing skipped).
"""

from __future__ import annotations

import functools
import json
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from logbus_client.producer import ProducerSession
from logbus_client.routing import Router
from tests.cluster.test_cluster_processes import brokers_on_one_store, eventually
from tests.server import BrokerProcess

TOPIC = "clicks"
PARTITIONS = 2


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[dict[int, BrokerProcess]]:
    with brokers_on_one_store(tmp_path) as (_, brokers):
        yield brokers


def _partitions(base: str) -> list[dict[str, Any]] | None:
    try:
        r = httpx.get(f"{base}/v1/topics/{TOPIC}/partitions", timeout=5)
    except httpx.TransportError:
        return None
    return r.json() if r.status_code == 200 else None


def _fully_replicated(base: str) -> bool | None:
    ps = _partitions(base)
    if ps is None or not all(len(p["isr"]) == 3 and p["leader"] > 0 for p in ps):
        return None
    return True


class Producer(threading.Thread):
    """Writes ``p{partition}-{n}`` values, 10 per request, to both partitions in turn until
    told to stop; keeps the acknowledged values. An error ends it (and fails the test)."""

    def __init__(self, urls: str) -> None:
        super().__init__(daemon=True)
        self.router = Router(urls, timeout=30)
        self.session = ProducerSession(self.router, TOPIC)
        self.acked: list[str] = []
        self.stop = threading.Event()
        self.error: BaseException | None = None
        self.progress = threading.Condition()

    def acked_count(self) -> int:
        with self.progress:
            return len(self.acked)

    def wait_for(self, count: int, timeout_s: float = 60) -> None:
        with self.progress:
            ok = self.progress.wait_for(
                lambda: len(self.acked) >= count or self.error is not None, timeout_s
            )
        assert ok and self.error is None, f"producer stuck at {len(self.acked)}: {self.error}"

    def run(self) -> None:
        try:
            r = self.session.init()
            assert r.status_code == 201, r.text
            n = 0
            while not self.stop.is_set():
                p = n // 10 % PARTITIONS
                values = [f"p{p}-{n + i}" for i in range(10)]
                body = b"".join(b'{"value":"%s"}\n' % v.encode() for v in values)
                r = self.session.send(p, body, len(values), params={"acks": "all"})
                assert r.status_code == 200, r.text
                with self.progress:
                    self.acked.extend(values)
                    self.progress.notify_all()
                n += 10
        except BaseException as e:
            with self.progress:
                self.error = e
                self.progress.notify_all()
        finally:
            self.router.close()


def test_a_streaming_query_rides_out_a_leader_kill(
    spark: Any, cluster: dict[int, BrokerProcess], tmp_path: Path
) -> None:
    urls = ",".join(b.url for b in cluster.values())
    r = httpx.post(
        f"{cluster[1].url}/v1/topics",
        json={
            "name": TOPIC,
            "partitions": PARTITIONS,
            "replication_factor": 3,
            "configs": {"min.insync.replicas": "2"},
        },
        timeout=30,
    )
    assert r.status_code == 201, r.text
    for b in cluster.values():  # every broker knows the leaders and a full ISR
        eventually(functools.partial(_fully_replicated, b.url), "full ISRs")

    producer = Producer(urls)
    producer.start()
    producer.wait_for(200)
    query = (
        spark.readStream.format("logbus")
        .option("url", urls)
        .option("subscribe", TOPIC)
        .option("startingOffsets", "earliest")
        .load()
        .selectExpr("partition", "offset", "CAST(value AS STRING) AS value")
        .writeStream.format("memory")
        .queryName("failover")
        .option("checkpointLocation", str(tmp_path / "checkpoint"))
        .trigger(processingTime="200 milliseconds")
        .start()
    )
    try:
        eventually(
            lambda: spark.sql("SELECT count(*) FROM failover").first()[0] > 0 or None,
            "the query reading",
            60,
        )
        ps = _partitions(cluster[1].url)
        assert ps is not None
        victim = ps[0]["leader"]
        cluster[victim].kill()
        before = producer.acked_count()
        producer.wait_for(before + 300)  # writes go on at the new leader
        producer.stop.set()
        producer.join(60)
        assert producer.error is None, producer.error
        acked = list(producer.acked)

        def caught_up() -> bool | None:
            n = spark.sql("SELECT count(DISTINCT value) FROM failover").first()[0]
            if query.exception() is not None:
                raise AssertionError(f"the query failed: {query.exception()}")
            return n >= len(acked) or None

        eventually(caught_up, "the query reading every acknowledged record", 90)
        assert query.isActive and query.exception() is None
        rows = spark.sql("SELECT partition, offset, value FROM failover").collect()
    finally:
        query.stop()

    values = [json.loads(row.value) for row in rows]  # JSON strings, as produced
    assert len(values) == len(set(values)), "a record was read twice"
    missing = set(acked) - set(values)
    assert not missing, f"acknowledged but never read: {sorted(missing)[:10]}"
    by_partition: dict[int, list[int]] = {}
    for row in rows:
        by_partition.setdefault(row.partition, []).append(row.offset)
        assert json.loads(row.value).startswith(f"p{row.partition}-")
    for p, offsets in by_partition.items():
        offsets.sort()
        assert offsets == list(range(offsets[0], offsets[0] + len(offsets))), p
        assert offsets[0] == 0
