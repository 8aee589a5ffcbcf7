"""Durability through a real process: graceful restarts and SIGKILL in the middle of produce."""

from __future__ import annotations

import json
import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from tests.api.conftest import make_client, start_broker
from tests.api.helpers import (
    BATCH,
    NDJSON,
    assert_problem,
    end_offsets,
    fetch_all,
    kafka_batch,
    produce,
)

KILL_ROUNDS = 4


def snapshot(c: httpx.Client, topic: str, partitions: int) -> list[list[dict[str, Any]]]:
    return [fetch_all(c, topic, p) for p in range(partitions)]


def raw_batches(c: httpx.Client, topic: str, partition: int) -> bytes:
    r = c.get(
        f"/v1/topics/{topic}/partitions/{partition}/records",
        params={"offset": 0, "max_bytes": 64 * 1024 * 1024},
        headers={"accept": BATCH},
    )
    assert r.status_code == 200
    return r.content


def test_graceful_restart_keeps_data_metadata_and_offsets(tmp_path: Path) -> None:
    broker = start_broker(tmp_path / "data")
    try:
        with make_client(broker) as c:
            assert (
                c.post(
                    "/v1/topics",
                    json={"name": "orders", "partitions": 3, "configs": {"retention.ms": 3600000}},
                ).status_code
                == 201
            )
            assert c.post("/v1/topics", json={"name": "gone"}).status_code == 201
            produce(c, "orders", [{"key": f"k{i}", "value": {"i": i}} for i in range(300)])
            ndjson = "".join(
                json.dumps({"value": f"nd{i}", "partition": 1}) + "\n" for i in range(50)
            )
            r = c.post(
                "/v1/topics/orders/records", content=ndjson, headers={"content-type": NDJSON}
            )
            assert r.status_code == 200
            batch = kafka_batch([b'"bin-%d"' % i for i in range(20)], codec=1)
            r = c.post(
                "/v1/topics/orders/partitions/2/records",
                content=batch,
                headers={"content-type": BATCH},
            )
            assert r.status_code == 200
            produce(c, "orders", [{"value": "ts", "timestamp": 1_600_000_000_000}], partition=0)
            r = c.patch("/v1/topics/orders/configs", json={"configs": {"segment.ms": 600000}})
            assert r.status_code == 200
            assert c.post("/v1/topics/orders/partitions", json={"count": 4}).status_code == 200
            assert c.delete("/v1/topics/gone").status_code == 204

            topics_before = c.get("/v1/topics").json()
            configs_before = c.get("/v1/topics/orders/configs").json()
            data_before = snapshot(c, "orders", 4)
            raw_before = [raw_batches(c, "orders", p) for p in range(4)]
            ends_before = end_offsets(c, "orders")
            ts_lookup = c.get(
                "/v1/topics/orders/partitions/0/offsets", params={"at": 1_600_000_000_000}
            ).json()
        assert sum(ends_before) == 300 + 50 + 20 + 1

        broker.stop()  # SIGTERM
        broker.start()

        with make_client(broker) as c:
            assert c.get("/v1/topics").json() == topics_before
            assert c.get("/v1/topics/orders/configs").json() == configs_before
            assert snapshot(c, "orders", 4) == data_before
            assert [raw_batches(c, "orders", p) for p in range(4)] == raw_before
            assert end_offsets(c, "orders") == ends_before
            parts = c.get("/v1/topics/orders/partitions").json()
            assert [p["high_watermark"] for p in parts] == ends_before
            assert (
                c.get(
                    "/v1/topics/orders/partitions/0/offsets", params={"at": 1_600_000_000_000}
                ).json()
                == ts_lookup
            )
            assert_problem(c.get("/v1/topics/gone"), 404, "UNKNOWN_TOPIC_OR_PARTITION")
            # Offsets continue where they were.
            for p in range(4):
                assert produce(c, "orders", [{"value": "after"}], partition=p) == [
                    {"partition": p, "offset": ends_before[p]}
                ]
            # A new topic of the deleted name starts empty.
            assert c.post("/v1/topics", json={"name": "gone"}).status_code == 201
            assert end_offsets(c, "gone") == [0]
    finally:
        broker.stop()


@dataclass
class Acked:
    """Records whose produce was acknowledged: (partition, offset) -> value."""

    records: dict[tuple[int, int], Any] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def add(self, offsets: list[dict[str, int]], values: list[Any]) -> None:
        with self.lock:
            for o, v in zip(offsets, values, strict=True):
                key = (o["partition"], o["offset"])
                assert key not in self.records, f"offset {key} acknowledged twice"
                self.records[key] = v


def _producer_loop(
    url: str, stop: threading.Event, send: Callable[[httpx.Client, int], None]
) -> None:
    """Call ``send`` until the broker goes away (the kill) or ``stop`` is set."""
    with httpx.Client(base_url=url, timeout=10) as c:
        seq = 0
        while not stop.is_set():
            try:
                send(c, seq)
            except httpx.HTTPError:
                return  # the broker died: this request may or may not have been written
            seq += 1


def test_sigkill_mid_produce_keeps_every_acknowledged_record(tmp_path: Path) -> None:
    rng = random.Random(20240607)
    partitions = 3
    broker = start_broker(tmp_path / "data")
    acked = Acked()
    try:
        with make_client(broker) as c:
            r = c.post("/v1/topics", json={"name": "chaos", "partitions": partitions})
            assert r.status_code == 201
        for rnd in range(KILL_ROUNDS):
            stop = threading.Event()

            def json_all(c: httpx.Client, seq: int, rnd: int = rnd) -> None:
                n = 1 + seq % 20
                values = [f"all-r{rnd}-{seq}-{i}" for i in range(n)]
                r = c.post(
                    "/v1/topics/chaos/records",
                    json={"records": [{"key": v, "value": v} for v in values]},
                    params={"acks": "all"},
                )
                if r.status_code == 200:
                    acked.add(r.json()["offsets"], values)

            def ndjson_leader(c: httpx.Client, seq: int, rnd: int = rnd) -> None:
                values = [{"r": rnd, "seq": seq, "i": i, "pad": "p" * 300} for i in range(8)]
                body = "".join(json.dumps({"value": v}) + "\n" for v in values)
                r = c.post(
                    "/v1/topics/chaos/partitions/1/records",
                    content=body,
                    headers={"content-type": NDJSON},
                    params={"acks": "1"},  # written to the log: survives a process crash
                )
                if r.status_code == 200:
                    acked.add(r.json()["offsets"], values)

            def binary_all(c: httpx.Client, seq: int, rnd: int = rnd) -> None:
                values = [f"bin-r{rnd}-{seq}-{i}" for i in range(5)]
                batch = kafka_batch([json.dumps(v).encode() for v in values], codec=seq % 5)
                r = c.post(
                    "/v1/topics/chaos/partitions/2/records",
                    content=batch,
                    headers={"content-type": BATCH},
                    params={"acks": "all"},
                )
                if r.status_code == 200:
                    base = r.json()["offsets"][0]["offset"]
                    acked.add([{"partition": 2, "offset": base + i} for i in range(5)], values)

            threads = [
                threading.Thread(target=_producer_loop, args=(broker.url, stop, send))
                for send in (json_all, json_all, ndjson_leader, binary_all)
            ]
            before = len(acked.records)
            for t in threads:
                t.start()
            deadline = time.monotonic() + 15
            while len(acked.records) < before + 200 and time.monotonic() < deadline:
                time.sleep(0.02)
            time.sleep(rng.uniform(0.1, 0.8))
            broker.kill()  # SIGKILL while the producers are busy
            stop.set()
            for t in threads:
                t.join(timeout=30)
                assert not t.is_alive()
            assert len(acked.records) > before, f"round {rnd}: nothing was acknowledged"

            broker.start()
            with make_client(broker) as c:
                stored: dict[tuple[int, int], Any] = {}
                for p in range(partitions):
                    records = fetch_all(c, "chaos", p)
                    # Dense offsets from 0: no holes, no duplicates after recovery.
                    assert [r["offset"] for r in records] == list(range(len(records)))
                    stored.update({(p, r["offset"]): r["value"] for r in records})
                    part = c.get("/v1/topics/chaos/partitions").json()[p]
                    assert part["high_watermark"] == part["log_end_offset"] == len(records)
                lost = {k: v for k, v in acked.records.items() if stored.get(k) != v}
                assert not lost, (
                    f"round {rnd}: {len(lost)} acknowledged records lost or changed, e.g. "
                    f"{sorted(lost.items())[:3]} -> {[stored.get(k) for k in sorted(lost)[:3]]}"
                )
                # The log takes appends again, right after what survived.
                ends = end_offsets(c, "chaos")
                offsets = produce(c, "chaos", [{"value": "probe"}], partition=0)
                assert offsets == [{"partition": 0, "offset": ends[0]}]
                acked.add(offsets, ["probe"])
    finally:
        broker.kill()


def test_admin_changes_survive_sigkill(tmp_path: Path) -> None:
    broker = start_broker(tmp_path / "data")
    try:
        with make_client(broker) as c:
            assert c.post("/v1/topics", json={"name": "kept", "partitions": 2}).status_code == 201
            assert c.post("/v1/topics", json={"name": "dropped"}).status_code == 201
            r = c.patch("/v1/topics/kept/configs", json={"configs": {"retention.ms": 5000000}})
            assert r.status_code == 200
            assert c.post("/v1/topics/kept/partitions", json={"count": 5}).status_code == 200
            assert c.delete("/v1/topics/dropped").status_code == 204
            produce(c, "kept", [{"value": "durable"}], partition=4, acks="all")
        broker.kill()
        broker.start()
        with make_client(broker) as c:
            topics = {t["name"]: t for t in c.get("/v1/topics").json()["topics"]}
            assert set(topics) == {"kept"}
            assert topics["kept"]["partitions"] == 5
            assert topics["kept"]["configs"] == {"retention.ms": 5000000}
            assert [r["value"] for r in fetch_all(c, "kept", 4)] == ["durable"]
            assert end_offsets(c, "kept") == [0, 0, 0, 0, 1]
    finally:
        broker.kill()
