"""Shared by the Spark connector tests: topics and records on the test broker."""

from __future__ import annotations

import base64
import itertools
from typing import Any

import httpx

_names = itertools.count()


def new_topic(http: httpx.Client, prefix: str, partitions: int, **configs: Any) -> str:
    name = f"{prefix}-{next(_names)}"
    r = http.post("/v1/topics", json={"name": name, "partitions": partitions, "configs": configs})
    assert r.status_code == 201, r.text
    return name


def produce(http: httpx.Client, topic: str, records: list[dict[str, Any]]) -> list[dict[str, int]]:
    """Produce in requests of at most 50,000 records; the offsets in request order."""
    offsets: list[dict[str, int]] = []
    for i in range(0, len(records), 50_000):
        r = http.post(f"/v1/topics/{topic}/records", json={"records": records[i : i + 50_000]})
        assert r.status_code == 200, r.text
        offsets.extend(r.json()["offsets"])
    return offsets


def high_watermarks(http: httpx.Client, topic: str) -> dict[int, int]:
    return {
        p["partition"]: p["high_watermark"]
        for p in http.get(f"/v1/topics/{topic}/partitions").json()
    }


def values(http: httpx.Client, topic: str, isolation: str = "read_committed") -> list[str]:
    """Every record value of ``topic`` (as text) a reader at ``isolation`` sees, partition
    after partition."""
    out: list[str] = []
    for p, hw in high_watermarks(http, topic).items():
        offset = 0
        while offset < hw:
            r = http.get(
                f"/v1/topics/{topic}/partitions/{p}/records",
                params={"offset": offset, "isolation": isolation, "max_records": 10_000},
            )
            assert r.status_code == 200, r.text
            doc = r.json()
            out.extend(
                base64.b64decode(rec["value_b64"]).decode()
                if "value_b64" in rec
                else str(rec["value"])
                for rec in doc["records"]
            )
            if doc["next_offset"] <= offset:
                break  # at the last stable offset: an open transaction
            offset = doc["next_offset"]
    return out
