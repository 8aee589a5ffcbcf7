"""Compression amplification against one broker: produce of zstd bombs, answers of a log that
compresses 20,000:1 (issue 10).

    python -m benchmarks.amplification [--bombs 5] [--data-dir DIR]

1. ``--bombs`` requests, each four zstd batches of one 250 MiB record (8 KB each), produced
   while another client asks ``/healthz`` every 10 ms: every answer must be 413 and the
   probe's worst latency shows whether decompression blocked the event loop (it did for
   1-2 s a batch before the produce cap and the worker thread).
2. A topic of 480 records of 1 MiB in 60 zstd batches (26 KB stored), read with
   ``max_bytes=1 MiB`` as JSON fetch, NDJSON fetch, member poll, SSE (12 events) and WebSocket
   JSON push (4 records): answer size, records, and the broker's peak-RSS growth (VmHWM, reset
   before each read through /proc/PID/clear_refs).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import statistics
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import zstandard
from websockets.asyncio.client import connect

from api.process import BrokerProcess
from core_log.batch import Record, assemble_batch, build_batch, encode_varint
from core_log.compression import Compression

MIB = 1024 * 1024
BATCH = "application/vnd.logbus.batch"
BOMB_VALUE_BYTES = 250 * MIB


def zstd_bomb(value_bytes: int = BOMB_VALUE_BYTES) -> bytes:
    """One zstd batch holding one record of ``value_bytes`` zeros, compressed as it streams
    (the record itself is never held)."""
    head = b"\x00" + encode_varint(0) + encode_varint(0)  # attributes, timestamp/offset deltas
    body = encode_varint(-1) + encode_varint(value_bytes)  # null key, value length
    tail = b"\x00"  # no headers
    c = zstandard.ZstdCompressor(level=3).compressobj()
    length = len(head) + len(body) + value_bytes + len(tail)
    parts = [c.compress(encode_varint(length) + head + body)]
    zeros = bytes(MIB)
    for done in range(0, value_bytes, MIB):
        parts.append(c.compress(zeros[: min(MIB, value_bytes - done)]))
    parts += [c.compress(tail), c.flush()]
    now = int(time.time() * 1000)
    return assemble_batch(
        b"".join(parts),
        base_offset=0,
        partition_leader_epoch=-1,
        attributes=int(Compression.ZSTD),
        last_offset_delta=0,
        base_timestamp=now,
        max_timestamp=now,
        producer_id=-1,
        producer_epoch=-1,
        base_sequence=-1,
        record_count=1,
    )


def peak_rss_bytes(broker: BrokerProcess, *, reset: bool = False) -> int:
    assert broker.proc is not None
    if reset:
        Path(f"/proc/{broker.proc.pid}/clear_refs").write_text("5")
    for line in Path(f"/proc/{broker.proc.pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError("no VmHWM")


def bombs(broker: BrokerProcess, requests: int) -> None:
    body = zstd_bomb() * 4
    c = httpx.Client(base_url=broker.url, timeout=120.0)
    c.post("/v1/topics", json={"name": "bombs", "partitions": 1}).raise_for_status()
    statuses: list[int] = []
    done = threading.Event()

    def send() -> None:
        with httpx.Client(base_url=broker.url, timeout=120.0) as s:
            for _ in range(requests):
                r = s.post(
                    "/v1/topics/bombs/partitions/0/records",
                    content=body,
                    headers={"content-type": BATCH},
                )
                statuses.append(r.status_code)
        done.set()

    threading.Thread(target=send, daemon=True).start()
    latencies = []
    while not done.is_set():
        t0 = time.perf_counter()
        c.get("/healthz").raise_for_status()
        latencies.append(time.perf_counter() - t0)
        done.wait(0.01)
    latencies.sort()
    p99 = latencies[min(len(latencies) - 1, int(len(latencies) * 0.99))]
    print(f"bombs: {requests} requests of 4 x {len(body) // 4} bytes -> {sorted(set(statuses))}")
    print(
        f"/healthz meanwhile: {len(latencies)} probes, p50 "
        f"{statistics.median(latencies) * 1000:.1f} ms, p99 {p99 * 1000:.1f} ms, "
        f"max {latencies[-1] * 1000:.1f} ms"
    )


def compressible(broker: BrokerProcess) -> None:
    c = httpx.Client(base_url=broker.url, timeout=120.0)
    c.post(
        "/v1/topics",
        json={"name": "squeezed", "partitions": 1, "configs": {"max.message.bytes": MIB}},
    ).raise_for_status()
    body = b"".join(
        build_batch(
            [Record(b"a" * MIB) for _ in range(8)], base_offset=8 * i, compression=Compression.ZSTD
        )
        for i in range(60)
    )
    c.post(
        "/v1/topics/squeezed/partitions/0/records", content=body, headers={"content-type": BATCH}
    ).raise_for_status()
    print(f"\nlog: 480 records of 1 MiB in {len(body)} bytes; reads with max_bytes=1 MiB")
    url = "/v1/topics/squeezed/partitions/0/records"
    join = {"topics": ["squeezed"], "session_timeout_ms": 60_000, "auto_offset_reset": "earliest"}
    member = c.post("/v1/groups/g/members", json=join).json()["member_id"]

    def fetch(accept: str) -> Callable[[], tuple[int, int]]:
        def run() -> tuple[int, int]:
            r = c.get(url, params={"offset": 0, "max_bytes": MIB}, headers={"accept": accept})
            return len(r.content), int(r.headers["Logbus-Next-Offset"])

        return run

    def poll() -> tuple[int, int]:
        r = c.get(f"/v1/groups/g/members/{member}/records", params={"max_bytes": MIB})
        return len(r.content), len(r.json()["records"])

    def sse() -> tuple[int, int]:
        size = events = 0
        headers = {"accept": "text/event-stream"}
        params = {"offset": 0, "max_bytes": MIB}
        with c.stream("GET", url, params=params, headers=headers) as r:
            for line in r.iter_lines():
                size += len(line) + 1
                events += line.startswith("id: ")
                if events == 12:
                    break
        return size, events

    def ws() -> tuple[int, int]:
        async def main() -> tuple[int, int]:
            size = count = 0
            ws_url = broker.url.replace("http://", "ws://", 1) + "/v1/ws"
            start = {"topic": "squeezed", "partition": 0, "offset": 0}
            async with connect(ws_url, max_size=None) as s:
                await s.send(json.dumps({"op": "subscribe", "partitions": [start]}))
                await s.recv()
                await s.send(json.dumps({"op": "credit", "records": 100}))
                while count < 4:
                    raw = await s.recv()
                    size = max(size, len(raw))
                    count += len(json.loads(raw)["records"])
            return size, count

        return asyncio.run(main())

    cases: list[tuple[str, Callable[[], tuple[int, int]]]] = [
        ("JSON fetch (bytes, next_offset)", fetch("application/json")),
        ("NDJSON fetch (bytes, next_offset)", fetch("application/x-ndjson")),
        ("member poll (bytes, records)", poll),
        ("SSE, 12 events (bytes, events)", sse),
        ("WebSocket, 4 records (largest frame, records)", ws),
    ]
    for name, case in cases:
        before = peak_rss_bytes(broker, reset=True)
        size, n = case()
        growth = peak_rss_bytes(broker) - before
        print(f"{name:48} {size / MIB:8.1f} MiB {n:5d}   peak RSS +{growth / MIB:.0f} MiB")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--bombs", type=int, default=5)
    ap.add_argument("--data-dir", type=Path)
    args = ap.parse_args()
    root = args.data_dir or Path(tempfile.mkdtemp(prefix="logbus-amplification-"))
    broker = BrokerProcess(root / "data").start()
    try:
        bombs(broker, args.bombs)
        compressible(broker)
    finally:
        broker.stop()
        if args.data_dir is None:
            shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
