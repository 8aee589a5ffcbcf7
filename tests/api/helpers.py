"""Small helpers shared by the HTTP integration tests."""

from __future__ import annotations

import itertools
import json
import os
from typing import Any

import httpx
from kafka.partitioner.default import murmur2
from kafka.record.default_records import DefaultRecordBatchBuilder
from kafka.record.memory_records import MemoryRecords

JSON = "application/json"
NDJSON = "application/x-ndjson"
BATCH = "application/vnd.logbus.batch"
OCTETS = "application/octet-stream"
PROBLEM = "application/problem+json"

_counter = itertools.count()


__all__ = ["MemoryRecords", "murmur2"]


def kafka_partition(key: bytes, partitions: int) -> int:
    """Where Kafka's default partitioner puts a keyed record."""
    return (murmur2(key) & 0x7FFFFFFF) % partitions


def unique(prefix: str) -> str:
    """A topic name no other test uses (valid: [a-zA-Z0-9._-])."""
    return f"{prefix}-{os.getpid()}-{next(_counter)}"


def create_topic(
    c: httpx.Client, prefix: str, partitions: int = 1, configs: dict[str, Any] | None = None
) -> str:
    name = unique(prefix)
    body: dict[str, Any] = {"name": name, "partitions": partitions}
    if configs:
        body["configs"] = configs
    r = c.post("/v1/topics", json=body)
    assert r.status_code == 201, r.text
    return name


def assert_problem(r: httpx.Response, status: int, code: str) -> dict[str, Any]:
    """The response is an RFC 9457 problem with our stable fields; return its body."""
    assert r.status_code == status, (r.status_code, r.text)
    assert r.headers["content-type"].startswith(PROBLEM), r.headers
    body: dict[str, Any] = r.json()
    assert body["code"] == code, body
    assert body["status"] == status, body
    assert body["title"] == code, body
    assert isinstance(body["retriable"], bool), body
    assert isinstance(body["detail"], str) and body["detail"], body
    return body


def end_offsets(c: httpx.Client, topic: str) -> list[int]:
    """log_end_offset of every partition, in partition order."""
    r = c.get(f"/v1/topics/{topic}/partitions")
    assert r.status_code == 200, r.text
    parts = sorted(r.json(), key=lambda p: p["partition"])
    return [p["log_end_offset"] for p in parts]


def produce(
    c: httpx.Client,
    topic: str,
    records: list[dict[str, Any]],
    partition: int | None = None,
    **params: Any,
) -> list[dict[str, int]]:
    path = (
        f"/v1/topics/{topic}/records"
        if partition is None
        else f"/v1/topics/{topic}/partitions/{partition}/records"
    )
    r = c.post(path, json={"records": records}, params=params)
    assert r.status_code == 200, r.text
    offsets: list[dict[str, int]] = r.json()["offsets"]
    assert len(offsets) == len(records)
    return offsets


def two_partition_topic(c: httpx.Client, prefix: str) -> str:
    """A topic with two partitions and one record in each: a partial append would show in the
    end offsets."""
    name = create_topic(c, prefix, partitions=2)
    produce(c, name, [{"value": "p0"}], partition=0)
    produce(c, name, [{"value": "p1"}], partition=1)
    return name


def fetch(
    c: httpx.Client, topic: str, partition: int, offset: int, **params: Any
) -> httpx.Response:
    return c.get(
        f"/v1/topics/{topic}/partitions/{partition}/records",
        params={"offset": offset, **params},
    )


def fetch_all(c: httpx.Client, topic: str, partition: int, **params: Any) -> list[dict[str, Any]]:
    """Every record from the log start to the high watermark, following next_offset."""
    out: list[dict[str, Any]] = []
    r = c.get(f"/v1/topics/{topic}/partitions/{partition}/offsets", params={"at": "earliest"})
    offset = r.json()["offset"]
    while True:
        r = fetch(c, topic, partition, offset, **params)
        assert r.status_code == 200, r.text
        body = r.json()
        out.extend(body["records"])
        if body["next_offset"] >= body["high_watermark"]:
            return out
        assert body["next_offset"] > offset, body
        offset = body["next_offset"]


def ndjson_lines(text: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def kafka_batch(
    values: list[bytes | None],
    *,
    codec: int = 0,
    keys: list[bytes | None] | None = None,
    headers: list[list[tuple[str, bytes]]] | None = None,
    base_timestamp: int = 1_700_000_000_000,
) -> bytes:
    """A Kafka record batch v2 built by kafka-python (an independent implementation)."""
    b = DefaultRecordBatchBuilder(
        magic=2,
        compression_type=codec,
        is_transactional=0,
        producer_id=-1,
        producer_epoch=-1,
        base_sequence=-1,
        batch_size=64 * 1024 * 1024,
    )
    for i, v in enumerate(values):
        key = keys[i] if keys else None
        hs = headers[i] if headers else []
        assert b.append(i, timestamp=base_timestamp + i, key=key, value=v, headers=hs) is not None
    return bytes(b.build())
