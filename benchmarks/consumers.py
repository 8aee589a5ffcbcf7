"""Consumers: WebSocket push, idle connections and group rebalance, against a real broker.

    .venv/bin/python -m benchmarks.consumers [--json PATH] [--quick] [--data-dir DIR]

Every measurement talks to a broker started as a child process (:class:`api.process.
BrokerProcess`, default settings, loopback), so the client below never shares a core's Python
interpreter with it. 100-byte record values (a JSON string of 98 characters and its quotes).

1. **WebSocket push throughput** to one consumer: ``--records`` records (1,000,000; 200,000
   with ``--quick``) are produced up front into a 1-partition topic as binary batches of 1,000
   records (``core_log.batch.build_batch``, 8 batches per request); one ``websockets`` client
   subscribes from offset 0 and keeps ``OUTSTANDING`` (200,000) records of credit granted,
   topping it up by half of that whenever half is used. Binary frames are counted from their
   batch headers (``parse_binary_frame`` and ``scan_batches``), JSON frames by their
   ``records`` arrays. Median of ``--repeats`` (3) runs per format. Machine-independent
   companions measured in the same run: the broker's CPU time per record (``utime + stime``
   of the broker process, all threads, from ``/proc/<pid>/stat``), the same records fetched
   over HTTP (sequential requests, one client: binary with 1 MiB fetches, JSON with 10,000
   records per response), and loopback TCP copy (the machine's limit). The client does not
   negotiate ``permessage-deflate`` (``compression=None``); one run with a client that offers it
   (browsers always do) checks that the broker declines it by default (``ws_compression`` off;
   with it on, compression cost 2.3-2.7x the broker CPU of binary push).
2. **produce → WebSocket latency** at 1,000 records/s: one record per request (``acks=1``,
   its value carries a sequence number), sent on schedule from 4 keep-alive connections by a
   minimal asyncio HTTP/1.1 client (httpx costs 1-2 ms of client CPU per request here, too much
   to hold the rate), and a WebSocket subscriber (JSON frames) in the same asyncio process;
   latency is receive time minus send time on one monotonic clock, p50/p99 over ``--seconds``
   (5). The same producer with a long-polling fetch consumer instead (``wait_ms=1000``) is the
   reference measured in the same run, as is the broker's CPU use.
3. **1,000 idle connections**, on a fresh broker (its RSS owes nothing to the other parts):
   after 10 warm-up connections of each kind, 1,000 WebSocket sessions, each subscribed to the
   (empty) 1-partition topic with 1,000 records of credit, then 1,000 long-polls (partition
   fetch, ``wait_ms=30000``, one raw HTTP/1.1 connection each), all kept open. The broker's
   ``VmRSS`` (``/proc/<pid>/status``), read once its CPU has been quiet for 0.3 s after each
   set, → KiB per connection; its CPU time over ``--seconds`` with all 2,000 open → CPU % of
   a core, next to the same measured before any was opened. The client's and the brokers' fd
   limit is raised (``RLIMIT_NOFILE``, inherited) as needed.
4. **Group rebalance after a graceful leave**: 3 HTTP members (httpx) of a fresh group on a
   6-partition topic, default session timeout (45 s: heartbeat interval 3 s), each
   long-polling its records (``wait_ms=5000``) in a loop and heartbeating every
   ``heartbeat_interval_ms`` of its last answer, or at once when an answer shows ``revoking``
   or ``pending`` partitions. Once the group is stable one member stops polling and, at a
   random point of the heartbeat cycle (seeded), DELETEs itself; the time from the DELETE
   until the two others' answers (poll or heartbeat) show them owning all 6 partitions,
   nothing pending or revoking, is the rebalance time as members see it. An observer polling
   ``GET /v1/groups/{g}`` every 2 ms gives the time at which the coordinator's ownership
   changed. Median of ``--rebalances`` (5) leaves.

Every figure is printed next to its target (issue 5, "Performance"; "idle CPU ≈ 0" is taken
as ≤ 1 % of a core); ``--json`` saves them. ``--only push,latency,rebalance,idle`` runs some
of the parts.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import json
import os
import platform
import random
import resource
import shutil
import statistics
import subprocess
import tempfile
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import httpx
import orjson
from websockets.asyncio.client import ClientConnection, connect

from api import ws_protocol as proto
from api.process import BrokerProcess
from benchmarks.http import loopback_mb_s, plot
from core_log.batch import Record, build_batch, scan_batches

MIB = 1024 * 1024
RECORD_BYTES = 100
RECORDS_PER_BATCH = 1_000
BATCHES_PER_REQUEST = 8
OUTSTANDING = 200_000  # records of credit kept granted by the push consumer
BATCH_CT = "application/vnd.logbus.batch"
CLK_TCK = os.sysconf("SC_CLK_TCK")
MAX_WS_FRAME = 64 * MIB


@dataclass
class Figure:
    name: str
    value: float
    unit: str
    target: float | None = None
    lower_is_better: bool = False
    limit_name: str | None = None
    ratio_to_limit: float | None = None
    note: str = ""

    @property
    def met(self) -> bool | None:
        if self.target is None:
            return None
        return self.value <= self.target if self.lower_is_better else self.value >= self.target


PLOT_TITLE = "consumers: one broker on loopback, 2 cores"


# -- broker process ----------------------------------------------------------------------------


def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise RuntimeError(f"no VmRSS for {pid}")


def cpu_seconds(pid: int) -> float:
    stat = Path(f"/proc/{pid}/stat").read_text()
    fields = stat[stat.rindex(")") + 2 :].split()  # after "pid (comm) "
    utime, stime = int(fields[11]), int(fields[12])  # fields 14 and 15 of proc(5)
    return (utime + stime) / CLK_TCK


def broker_pid(broker: BrokerProcess) -> int:
    assert broker.proc is not None
    return broker.proc.pid


def describe_source() -> str:
    """The commit under test, and whether the work tree differs from it."""
    try:
        head = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=True
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return f"{head} (work tree modified)" if dirty else head


def raise_fd_limit(wanted: int) -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < wanted:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(wanted, hard), hard))


def ws_url(url: str) -> str:
    return url.replace("http://", "ws://", 1) + "/v1/ws"


# -- data --------------------------------------------------------------------------------------


def value_batch(n: int = RECORDS_PER_BATCH) -> bytes:
    """One uncompressed batch of ``n`` records with 100-byte JSON string values."""
    now = int(time.time() * 1000)
    values = [b'"' + f"{i:098d}".encode() + b'"' for i in range(n)]
    return build_batch([Record(v) for v in values], default_timestamp=now)


def produce_records(url: str, topic: str, n: int) -> tuple[int, float]:
    """Append ``n`` records (rounded up to whole batches) to partition 0; (records, MB/s)."""
    batch = value_batch()
    body = batch * BATCHES_PER_REQUEST
    per_request = RECORDS_PER_BATCH * BATCHES_PER_REQUEST
    requests = -(-n // per_request)
    start = time.perf_counter()
    with httpx.Client(base_url=url, timeout=60) as c:
        for _ in range(requests):
            r = c.post(
                f"/v1/topics/{topic}/partitions/0/records",
                params={"acks": "1"},
                content=body,
                headers={"content-type": BATCH_CT},
            )
            r.raise_for_status()
    elapsed = time.perf_counter() - start
    return requests * per_request, requests * len(body) / elapsed / 1e6


def create_topic(url: str, name: str, partitions: int) -> None:
    with httpx.Client(base_url=url, timeout=30) as c:
        c.delete(f"/v1/topics/{name}")
        c.post("/v1/topics", json={"name": name, "partitions": partitions}).raise_for_status()


def count_binary(frame: bytes, skip_below: int) -> tuple[int, int]:
    """(records at or after ``skip_below``, next offset) of a binary push frame."""
    _, _, batches = proto.parse_binary_frame(frame)
    count = 0
    next_offset = skip_below
    for _, h in scan_batches(batches):
        first = max(h.base_offset, skip_below)
        count += max(0, h.next_offset - first)
        next_offset = h.next_offset
    return count, next_offset


# -- 1. throughput -----------------------------------------------------------------------------


async def ws_push(
    url: str, topic: str, total: int, fmt: str, *, deflate: bool = False
) -> tuple[float, int, int]:
    """Seconds to receive ``total`` records from offset 0; (seconds, records, frame bytes)."""
    compression = "deflate" if deflate else None
    async with connect(
        ws_url(url), max_size=MAX_WS_FRAME, ping_interval=None, compression=compression
    ) as ws:
        start = time.perf_counter()
        await ws.send(
            orjson.dumps(
                {
                    "op": "subscribe",
                    "partitions": [{"topic": topic, "partition": 0, "offset": 0}],
                    "format": fmt,
                }
            ).decode()
        )
        await ws.send(orjson.dumps({"op": "credit", "records": OUTSTANDING}).decode())
        received = 0
        since_grant = 0
        nbytes = 0
        next_offset = 0
        while received < total:
            frame = await ws.recv()
            nbytes += len(frame)
            if isinstance(frame, bytes):
                n, next_offset = count_binary(frame, next_offset)
            else:
                doc = orjson.loads(frame)
                kind = doc.get("type")
                if kind != "records":
                    if kind in ("error", "stalled"):
                        raise RuntimeError(f"push failed: {doc}")
                    continue
                n = len(doc["records"])
            received += n
            since_grant += n
            if since_grant >= OUTSTANDING // 2:
                await ws.send(orjson.dumps({"op": "credit", "records": since_grant}).decode())
                since_grant = 0
        elapsed = time.perf_counter() - start
    return elapsed, received, nbytes


def http_fetch(url: str, topic: str, total: int, fmt: str) -> tuple[float, int, int]:
    """The same records by sequential HTTP fetches from one client: (seconds, records, bytes)."""
    offset = received = nbytes = 0
    with httpx.Client(base_url=url, timeout=60) as c:
        path = f"/v1/topics/{topic}/partitions/0/records"
        start = time.perf_counter()
        while received < total:
            if fmt == "binary":
                r = c.get(
                    path, params={"offset": offset, "max_bytes": MIB}, headers={"accept": BATCH_CT}
                )
                r.raise_for_status()
                data = r.content
                received += sum(h.record_count for _, h in scan_batches(data))
                offset = int(r.headers["logbus-next-offset"])
            else:
                r = c.get(path, params={"offset": offset, "max_records": 10_000})
                r.raise_for_status()
                data = r.content
                doc = orjson.loads(data)
                received += len(doc["records"])
                offset = doc["next_offset"]
            nbytes += len(data)
        elapsed = time.perf_counter() - start
    return elapsed, received, nbytes


# -- 2. latency --------------------------------------------------------------------------------


class RawHttp:
    """A minimal HTTP/1.1 keep-alive client for small requests: httpx costs ≈ 1-2 ms of client
    CPU per request here, too much to hold 1,000 requests/s next to the consumer."""

    def __init__(self, port: int, headers: Mapping[str, str] | None = None) -> None:
        """``headers``: sent with every request (a ``Content-Type`` replaces the JSON one)."""
        self.port = port
        extra = {"Content-Type": "application/json", **(headers or {})}
        self._headers = "".join(f"{k}: {v}\r\n" for k, v in extra.items())
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None

    async def request(self, method: str, path: str, body: bytes = b"") -> tuple[int, bytes]:
        if self.writer is None:
            self.reader, self.writer = await asyncio.open_connection("127.0.0.1", self.port)
        assert self.reader is not None
        self.writer.write(
            f"{method} {path} HTTP/1.1\r\nHost: 127.0.0.1:{self.port}\r\n"
            f"{self._headers}Content-Length: {len(body)}\r\n\r\n".encode()
            + body
        )
        head = await self.reader.readuntil(b"\r\n\r\n")
        status = int(head.split(b" ", 2)[1])
        length = 0
        for line in head.split(b"\r\n")[1:]:
            name, _, value = line.partition(b":")
            if name.strip().lower() == b"content-length":
                length = int(value)
        return status, await self.reader.readexactly(length)

    async def post(self, path: str, body: bytes) -> int:
        return (await self.request("POST", path, body))[0]

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()


async def ws_latency(
    url: str,
    port: int,
    topic: str,
    rate: int,
    seconds: float,
    producers: int = 4,
    consumer_kind: str = "ws",
) -> tuple[float, float, int]:
    """p50/p99 (ms) from POSTing a record to receiving it over a WebSocket (JSON frames), or
    with ``consumer_kind="poll"`` by a long-polling fetch loop (the reference).

    ``producers`` keep-alive connections take the records in turn, each sent at its scheduled
    time, so one slow answer does not hold the next record back."""
    sent: dict[int, float] = {}
    latencies: list[float] = []
    path = f"/v1/topics/{topic}/partitions/0/records?acks=1"
    async with connect(ws_url(url), ping_interval=None, compression=None) as ws:
        await ws.send(
            orjson.dumps(
                {"op": "subscribe", "topics": [topic], "from": "latest", "format": "json"}
            ).decode()
        )
        await ws.send(orjson.dumps({"op": "credit", "records": proto.CREDIT_MAX}).decode())
        while orjson.loads(await ws.recv()).get("type") != "subscribed":
            pass

        def note(records: list[dict[str, Any]], now: float) -> None:
            for rec in records:
                seq = rec["value"].get("seq")
                if seq is not None:
                    latencies.append((now - sent[seq]) * 1000)

        async def consume_ws() -> None:
            while True:
                frame = await ws.recv()
                now = time.perf_counter()
                doc = orjson.loads(frame)
                if doc.get("type") == "records":
                    note(doc["records"], now)

        async def consume_poll() -> None:
            poller = RawHttp(port)
            _, body = await poller.request("GET", f"/v1/topics/{topic}/partitions/0/offsets")
            offset = orjson.loads(body)["offset"]
            try:
                while True:
                    status, body = await poller.request(
                        "GET",
                        f"/v1/topics/{topic}/partitions/0/records?offset={offset}&wait_ms=1000",
                    )
                    now = time.perf_counter()
                    if status != 200:
                        raise RuntimeError(f"fetch failed: {status} {body[:200]!r}")
                    doc = orjson.loads(body)
                    note(doc["records"], now)
                    offset = doc["next_offset"]
            finally:
                poller.close()

        consumer = asyncio.create_task(consume_ws() if consumer_kind == "ws" else consume_poll())
        clients = [RawHttp(port) for _ in range(producers)]
        for c in clients:  # connect and warm up
            if await c.post(path, b'{"records":[{"value":{"w":1}}]}') != 200:
                raise RuntimeError("warm-up produce failed")
        await asyncio.sleep(0.2)
        interval = 1 / rate
        total = int(seconds * rate)
        queue: asyncio.Queue[int] = asyncio.Queue()
        for seq in range(total):
            queue.put_nowait(seq)
        t0 = time.perf_counter()

        async def produce(client: RawHttp) -> None:
            while not queue.empty():
                seq = queue.get_nowait()
                delay = t0 + seq * interval - time.perf_counter()
                if delay > 0:
                    await asyncio.sleep(delay)
                sent[seq] = time.perf_counter()
                body = b'{"records":[{"value":{"seq":%d}}]}' % seq
                if await client.post(path, body) != 200:
                    raise RuntimeError("produce failed")

        await asyncio.gather(*(produce(c) for c in clients))
        produce_s = time.perf_counter() - t0
        deadline = time.perf_counter() + 30
        while len(latencies) < total and time.perf_counter() < deadline and not consumer.done():
            await asyncio.sleep(0.01)
        consumer.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await consumer
        for c in clients:
            c.close()
        if len(latencies) < total:
            raise RuntimeError(f"{total - len(latencies)} of {total} records never arrived")
        if produce_s > seconds * 1.1:
            raise RuntimeError(f"the producer fell behind: {total} records took {produce_s:.1f} s")
    latencies.sort()
    p99 = latencies[min(len(latencies) - 1, int(len(latencies) * 0.99))]
    return statistics.median(latencies), p99, len(latencies)


# -- 3. idle connections -----------------------------------------------------------------------


async def open_ws_sessions(url: str, topic: str, n: int) -> list[ClientConnection]:
    async def one() -> ClientConnection:
        ws = await connect(ws_url(url), ping_interval=None, compression=None)
        await ws.send(
            orjson.dumps(
                {"op": "subscribe", "topics": [topic], "from": "latest", "format": "json"}
            ).decode()
        )
        await ws.send(orjson.dumps({"op": "credit", "records": 1000}).decode())
        reply = orjson.loads(await ws.recv())
        if reply.get("type") != "subscribed":
            raise RuntimeError(f"subscribe failed: {reply}")
        return ws

    out: list[ClientConnection] = []
    for i in range(0, n, 100):  # 100 handshakes at a time
        out += await asyncio.gather(*(one() for _ in range(min(100, n - i))))
    return out


async def open_long_polls(
    port: int, topic: str, n: int, wait_ms: int
) -> list[tuple[asyncio.StreamReader, asyncio.StreamWriter]]:
    request = (
        f"GET /v1/topics/{topic}/partitions/0/records?offset=0&wait_ms={wait_ms} HTTP/1.1\r\n"
        f"Host: 127.0.0.1:{port}\r\nAccept: application/json\r\n\r\n"
    ).encode()

    async def one() -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(request)
        await writer.drain()
        return reader, writer

    out: list[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = []
    for i in range(0, n, 100):
        out += await asyncio.gather(*(one() for _ in range(min(100, n - i))))
    return out


async def settle(pid: int, quiet_s: float = 0.3, timeout_s: float = 10.0) -> None:
    """Wait until the broker has spent no CPU for ``quiet_s`` (its backlog is served)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        before = cpu_seconds(pid)
        await asyncio.sleep(quiet_s)
        if cpu_seconds(pid) - before <= 1 / CLK_TCK:
            return


async def idle_cpu(pid: int, seconds: float) -> float:
    before = cpu_seconds(pid)
    t0 = time.perf_counter()
    await asyncio.sleep(seconds)
    return (cpu_seconds(pid) - before) / (time.perf_counter() - t0) * 100


async def idle_connections(
    broker: BrokerProcess, topic: str, n: int, seconds: float
) -> dict[str, Any]:
    pid = broker_pid(broker)
    url = broker.url
    # Warm up: the first sessions and polls import and cache what every later one shares.
    warm_ws = await open_ws_sessions(url, topic, 10)
    warm_polls = await open_long_polls(broker.port, topic, 10, 30_000)
    await settle(pid)
    cpu_empty = await idle_cpu(pid, seconds)
    rss0 = rss_kib(pid)
    t = time.perf_counter()
    sessions = await open_ws_sessions(url, topic, n)
    ws_open_s = time.perf_counter() - t
    await settle(pid)
    rss1 = rss_kib(pid)
    t = time.perf_counter()
    polls = await open_long_polls(broker.port, topic, n, 30_000)
    poll_open_s = time.perf_counter() - t
    answers = [asyncio.create_task(reader.read(1)) for reader, _ in polls]  # none expected
    await settle(pid)
    rss2 = rss_kib(pid)
    cpu_open = await idle_cpu(pid, seconds)
    answered = sum(1 for a in answers if a.done())
    closed = sum(1 for ws in sessions if ws.close_code is not None)
    for a in answers:
        a.cancel()
    for ws in sessions + warm_ws:
        await ws.close()
    for _, writer in polls + warm_polls:
        writer.close()
    return {
        "connections": n,
        "rss_kib_before": rss0,
        "rss_kib_with_ws": rss1,
        "rss_kib_with_ws_and_polls": rss2,
        "ws_kib_each": (rss1 - rss0) / n,
        "poll_kib_each": (rss2 - rss1) / n,
        "cpu_percent_no_connections": cpu_empty,
        "cpu_percent_idle_open": cpu_open,
        "ws_open_seconds": ws_open_s,
        "poll_open_seconds": poll_open_s,
        "polls_answered_early": answered,
        "ws_closed_early": closed,
    }


# -- 4. rebalance ------------------------------------------------------------------------------


@dataclass
class View:
    assigned: frozenset[int] = frozenset()
    revoking: frozenset[int] = frozenset()
    pending: frozenset[int] = frozenset()
    interval_ms: int = 3000
    at: float = 0.0


class HttpMember:
    """A group member over HTTP: a long-poll loop and a heartbeat loop."""

    def __init__(self, client: httpx.AsyncClient, group: str, topic: str) -> None:
        self.client = client
        self.group = group
        self.topic = topic
        self.member_id = ""
        self.view = View()
        self.changed = asyncio.Event()
        self.beat_now = asyncio.Event()
        self.tasks: list[asyncio.Task[None]] = []

    def _see(self, doc: dict[str, Any]) -> None:
        def parts(key: str) -> frozenset[int]:
            return frozenset(p["partition"] for p in doc[key])

        self.view = View(
            parts("assignment"),
            parts("revoking"),
            parts("pending"),
            doc["heartbeat_interval_ms"],
            time.perf_counter(),
        )
        if self.view.revoking or self.view.pending:
            self.beat_now.set()
        self.changed.set()

    async def join(self) -> None:
        r = await self.client.post(
            f"/v1/groups/{self.group}/members", json={"topics": [self.topic]}
        )
        r.raise_for_status()
        doc = r.json()
        self.member_id = doc["member_id"]
        self._see(doc)
        self.tasks = [asyncio.create_task(self._poll()), asyncio.create_task(self._beat())]

    async def _poll(self) -> None:
        path = f"/v1/groups/{self.group}/members/{self.member_id}/records"
        while True:
            r = await self.client.get(path, params={"wait_ms": 5000})
            r.raise_for_status()
            self._see(r.json())

    async def _beat(self) -> None:
        path = f"/v1/groups/{self.group}/members/{self.member_id}/heartbeat"
        while True:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self.view.interval_ms / 1000):
                    await self.beat_now.wait()
            self.beat_now.clear()
            r = await self.client.post(path)
            r.raise_for_status()
            self._see(r.json())

    async def stop(self) -> None:
        for t in self.tasks:
            t.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)

    async def leave(self) -> None:
        await self.stop()
        r = await self.client.delete(f"/v1/groups/{self.group}/members/{self.member_id}")
        r.raise_for_status()


async def _until(members: list[HttpMember], partitions: int, timeout_s: float) -> float:
    """Wait until the members' latest answers own all partitions, nothing pending or revoking;
    returns the perf_counter time of the answer that completed it."""
    deadline = time.perf_counter() + timeout_s
    while True:
        views = [m.view for m in members]
        owned = [p for v in views for p in v.assigned]
        if (
            len(owned) == partitions
            and len(set(owned)) == partitions
            and not any(v.revoking or v.pending for v in views)
        ):
            return max(v.at for v in views)
        remaining = deadline - time.perf_counter()
        if remaining <= 0:
            raise TimeoutError(f"group not stable after {timeout_s}s: {views}")
        for m in members:
            m.changed.clear()
        waits = [asyncio.ensure_future(m.changed.wait()) for m in members]
        await asyncio.wait(waits, timeout=remaining, return_when=asyncio.FIRST_COMPLETED)
        for w in waits:
            w.cancel()


async def _server_side(
    client: httpx.AsyncClient, group: str, leaver: str, partitions: int
) -> float:
    """perf_counter time when ``GET /v1/groups/{g}`` first shows the others owning everything."""
    while True:
        doc = (await client.get(f"/v1/groups/{group}")).json()
        now = time.perf_counter()
        members = [m for m in doc["members"] if m["member_id"] != leaver]
        owned = [p["partition"] for m in members for p in m["assignment"]]
        if (
            len(doc["members"]) == len(members)
            and len(set(owned)) == partitions
            and not any(m["revoking"] for m in members)
        ):
            return now
        await asyncio.sleep(0.002)


async def rebalance_times(
    url: str, topic: str, partitions: int, reps: int
) -> list[dict[str, float]]:
    out = []
    rng = random.Random(5)
    limits = httpx.Limits(max_connections=32, max_keepalive_connections=32)
    async with httpx.AsyncClient(base_url=url, timeout=30, limits=limits) as client:
        for rep in range(reps):
            group = f"bench-rebalance-{rep}-{os.getpid()}"
            members = [HttpMember(client, group, topic) for _ in range(3)]
            t = time.perf_counter()
            for m in members:
                await m.join()
            await _until(members, partitions, 30)
            setup_s = time.perf_counter() - t
            # A stable group, every member in its long-poll; leave at a random point of the
            # members' heartbeat cycle (seeded: the same points every run).
            interval_s = max(m.view.interval_ms for m in members) / 1000
            await asyncio.sleep(0.3 + rng.uniform(0, interval_s))
            leaver, stay = members[2], members[:2]
            await leaver.stop()
            observer = asyncio.create_task(
                _server_side(client, group, leaver.member_id, partitions)
            )
            t0 = time.perf_counter()
            r = await client.delete(f"/v1/groups/{group}/members/{leaver.member_id}")
            r.raise_for_status()
            seen = await _until(stay, partitions, 30)
            server = await asyncio.wait_for(observer, 30)
            out.append(
                {
                    "client_ms": (seen - t0) * 1000,
                    "server_ms": (server - t0) * 1000,
                    "setup_s": setup_s,
                }
            )
            for m in stay:
                await m.leave()
    return out


# -- the run -----------------------------------------------------------------------------------


PARTS = ("push", "latency", "rebalance", "idle")


@dataclass
class Transfer:
    seconds: float
    records: int
    nbytes: int
    broker_cpu_s: float  # the broker's CPU time (all threads) during the transfer

    @property
    def records_per_s(self) -> float:
        return self.records / self.seconds

    @property
    def mb_per_s(self) -> float:
        return self.nbytes / self.seconds / 1e6

    @property
    def cpu_us_per_record(self) -> float:
        return self.broker_cpu_s / self.records * 1e6


def transfer(pid: int, measure: Any) -> Transfer:
    """Run ``measure()`` → (seconds, records, bytes) and count the broker's CPU time."""
    before = cpu_seconds(pid)
    seconds, records, nbytes = measure()
    return Transfer(seconds, records, nbytes, cpu_seconds(pid) - before)


def part_push(url: str, pid: int, args: argparse.Namespace, extra: dict[str, Any]) -> list[Figure]:
    loop_mb_s = loopback_mb_s(512 * MIB if args.quick else 2048 * MIB)
    extra["limits_mb_s"] = {"loopback TCP": loop_mb_s}
    create_topic(url, "bench-push", 1)
    produced, produce_mb_s = produce_records(url, "bench-push", args.records)
    extra["produced"] = {"records": produced, "mb_s": produce_mb_s}
    print(f"produced {produced:,} records ({produce_mb_s:,.0f} MB/s)", flush=True)

    def push(fmt: str, deflate: bool = False) -> Transfer:
        return transfer(
            pid, lambda: asyncio.run(ws_push(url, "bench-push", produced, fmt, deflate=deflate))
        )

    runs = {fmt: [push(fmt) for _ in range(args.repeats)] for fmt in ("binary", "json")}
    runs["binary-deflate"] = [push("binary", deflate=True)]
    http_runs = {
        fmt: transfer(pid, lambda fmt=fmt: http_fetch(url, "bench-push", produced, fmt))
        for fmt in ("binary", "json")
    }
    extra["push_runs"] = {k: [asdict(t) for t in v] for k, v in runs.items()}
    extra["http_fetch"] = {k: asdict(t) for k, t in http_runs.items()}

    figures = []
    for fmt, target in (("binary", 500_000), ("json", 200_000)):
        ts = runs[fmt]
        rec_s = statistics.median(t.records_per_s for t in ts)
        mb_s = statistics.median(t.mb_per_s for t in ts)
        cpu_us = statistics.median(t.cpu_us_per_record for t in ts)
        h = http_runs[fmt]
        spread = ", ".join(f"{t.records_per_s / 1e3:,.0f}k" for t in ts)
        figures.append(
            Figure(
                f"WebSocket push, {fmt} frames, 1 consumer",
                rec_s,
                "records/s",
                target,
                limit_name="loopback TCP",
                ratio_to_limit=mb_s / loop_mb_s,
                note=f"{mb_s:,.0f} MB/s; broker CPU {cpu_us:.2f} µs/record "
                f"(≈ {1e6 / cpu_us / 1e3:,.0f}k records/s per core); "
                f"{rec_s / h.records_per_s:.2f}x HTTP {fmt} fetch "
                f"({h.records_per_s / 1e3:,.0f}k records/s, {h.cpu_us_per_record:.2f} µs/record); "
                f"runs {spread}",
            )
        )
    t = runs["binary-deflate"][0]
    figures.append(
        Figure(
            "WebSocket push, binary, client offers permessage-deflate",
            t.records_per_s,
            "records/s",
            note=f"{t.mb_per_s:,.0f} MB/s (the broker declines compression by default); broker CPU "
            f"{t.cpu_us_per_record:.2f} µs/record (one run)",
        )
    )
    return figures


def part_latency(
    url: str, port: int, pid: int, args: argparse.Namespace, extra: dict[str, Any]
) -> list[Figure]:
    out: dict[str, dict[str, float]] = {}
    for kind, topic in (("ws", "bench-ws-lat"), ("poll", "bench-poll-lat")):
        create_topic(url, topic, 1)
        cpu0, t0 = cpu_seconds(pid), time.perf_counter()
        p50, p99, n = asyncio.run(
            ws_latency(url, port, topic, 1000, args.seconds, consumer_kind=kind)
        )
        cpu = (cpu_seconds(pid) - cpu0) / (time.perf_counter() - t0) * 100
        out[kind] = {"p50_ms": p50, "p99_ms": p99, "records": n, "broker_cpu_percent": cpu}
    extra["latency"] = out
    ws, poll = out["ws"], out["poll"]
    return [
        Figure("produce→WebSocket latency p50 at 1,000 records/s", ws["p50_ms"], "ms"),
        Figure(
            "produce→WebSocket latency p99 at 1,000 records/s",
            ws["p99_ms"],
            "ms",
            5,
            lower_is_better=True,
            note=f"{ws['records']:,.0f} records in {args.seconds:.0f} s; "
            f"broker CPU {ws['broker_cpu_percent']:.0f} % of a core",
        ),
        Figure(
            "reference: same producer → long-poll fetch, p99",
            poll["p99_ms"],
            "ms",
            note=f"p50 {poll['p50_ms']:.1f} ms; broker CPU {poll['broker_cpu_percent']:.0f} %",
        ),
    ]


def part_rebalance(url: str, args: argparse.Namespace, extra: dict[str, Any]) -> list[Figure]:
    create_topic(url, "bench-rebalance", 6)
    times = asyncio.run(rebalance_times(url, "bench-rebalance", 6, args.rebalances))
    extra["rebalances"] = times
    client_ms = [t["client_ms"] for t in times]
    server_ms = [t["server_ms"] for t in times]
    return [
        Figure(
            "rebalance after a graceful leave, as members see it",
            statistics.median(client_ms),
            "ms",
            1000,
            lower_is_better=True,
            note=f"median of {len(times)}: " + ", ".join(f"{t:,.0f}" for t in client_ms),
        ),
        Figure(
            "rebalance, as GET /v1/groups/{g} shows it (polled every 2 ms)",
            statistics.median(server_ms),
            "ms",
            note=", ".join(f"{t:,.1f}" for t in server_ms) + " (an upper bound of the coordinator)",
        ),
    ]


def part_idle(
    broker: BrokerProcess, args: argparse.Namespace, extra: dict[str, Any]
) -> list[Figure]:
    create_topic(broker.url, "bench-idle", 1)
    idle = asyncio.run(idle_connections(broker, "bench-idle", args.connections, args.seconds))
    extra["idle"] = idle
    n = args.connections
    return [
        Figure(
            f"idle WebSocket sessions ({n:,}): broker memory each",
            idle["ws_kib_each"],
            "KiB/conn",
            50,
            lower_is_better=True,
            note=f"RSS {idle['rss_kib_before'] / 1024:,.1f} → {idle['rss_kib_with_ws'] / 1024:,.1f}"
            f" MiB; opened in {idle['ws_open_seconds']:.1f} s",
        ),
        Figure(
            f"idle long-polls ({n:,}, wait_ms=30000): broker memory each",
            idle["poll_kib_each"],
            "KiB/conn",
            50,
            lower_is_better=True,
            note=f"RSS → {idle['rss_kib_with_ws_and_polls'] / 1024:,.1f} MiB; "
            f"{idle['polls_answered_early']} answered early",
        ),
        Figure(
            f"broker CPU, idle, {2 * n:,} connections open",
            idle["cpu_percent_idle_open"],
            "% of a core",
            1,
            lower_is_better=True,
            note=f"{idle['cpu_percent_no_connections']:.2f} % with none open; "
            f"over {args.seconds:.0f} s",
        ),
    ]


def run(args: argparse.Namespace, workdir: Path) -> tuple[list[Figure], dict[str, Any]]:
    figures: list[Figure] = []
    extra: dict[str, Any] = {}
    raise_fd_limit(4 * args.connections + 1024)  # the brokers inherit it
    parts = args.only
    if {"push", "latency", "rebalance"} & set(parts):
        broker = BrokerProcess(workdir / "data")
        try:
            broker.start()
            if "push" in parts:
                figures += part_push(broker.url, broker_pid(broker), args, extra)
            if "latency" in parts:
                figures += part_latency(broker.url, broker.port, broker_pid(broker), args, extra)
            if "rebalance" in parts:
                figures += part_rebalance(broker.url, args, extra)
        finally:
            broker.stop()
    if "idle" in parts:
        fresh = BrokerProcess(workdir / "data-idle")  # its RSS owes nothing to the rest
        try:
            fresh.start()
            figures += part_idle(fresh, args, extra)
        finally:
            fresh.stop()
    return figures, extra


def print_table(figures: list[Figure]) -> None:
    print(f"\n{'measure':<60} {'value':>12} {'unit':<11} {'target':>10} {'met':>4}  ratio / note")
    for f in figures:
        met = {True: "yes", False: "NO", None: ""}[f.met]
        target = ""
        if f.target is not None:
            target = ("≤ " if f.lower_is_better else "≥ ") + f"{f.target:,.0f}"
        ratio = f"{f.ratio_to_limit:.2f}x {f.limit_name}; " if f.ratio_to_limit else ""
        print(f"{f.name:<60} {f.value:>12,.1f} {f.unit:<11} {target:>10} {met:>4}  {ratio}{f.note}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", help="write the figures here")
    parser.add_argument("--plot", help="draw the figures against their targets here (PNG)")
    parser.add_argument(
        "--replot", metavar="JSON", help="only draw --plot from the figures of an earlier --json"
    )
    parser.add_argument("--quick", action="store_true", help="a short run (≈ 40 s)")
    parser.add_argument("--data-dir", default="bench-data")
    parser.add_argument("--records", type=int)
    parser.add_argument("--repeats", type=int)
    parser.add_argument("--seconds", type=float)
    parser.add_argument("--connections", type=int, default=1000)
    parser.add_argument("--rebalances", type=int)
    parser.add_argument(
        "--only", default=",".join(PARTS), help=f"comma-separated parts of {', '.join(PARTS)}"
    )
    args = parser.parse_args()
    if args.replot:
        if not args.plot:
            parser.error("--replot needs --plot")
        saved = json.loads(Path(args.replot).read_text())
        fields = {f.name for f in dataclasses.fields(Figure)}
        figures = [Figure(**{k: v for k, v in f.items() if k in fields}) for f in saved["figures"]]
        plot(figures, Path(args.plot), PLOT_TITLE + f" ({saved['date']})")
        return 0
    q = args.quick
    args.records = args.records or (200_000 if q else 1_000_000)
    args.repeats = args.repeats or (1 if q else 3)
    args.seconds = args.seconds or (2.0 if q else 5.0)
    args.rebalances = args.rebalances or (2 if q else 5)
    args.only = [p.strip() for p in args.only.split(",") if p.strip()]
    unknown = set(args.only) - set(PARTS)
    if unknown:
        parser.error(f"unknown parts: {', '.join(sorted(unknown))}")

    base = Path(args.data_dir)
    base.mkdir(parents=True, exist_ok=True)
    workdir = Path(tempfile.mkdtemp(prefix="bench-consumers-", dir=base))
    started = time.time()
    load_start = os.getloadavg()[0]
    try:
        figures, extra = run(args, workdir)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    print_table(figures)
    if args.plot:
        plot(figures, Path(args.plot), PLOT_TITLE)
    print(
        f"\n{time.time() - started:.0f} s in all; load average {load_start:.1f} at the start, "
        f"{os.getloadavg()[0]:.1f} at the end; source {describe_source()}"
    )
    if args.json:
        out = {
            "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(started)),
            "source": describe_source(),
            "machine": {
                "cpus": os.cpu_count(),
                "python": platform.python_version(),
                "load_average_start": load_start,
                "load_average_end": os.getloadavg()[0],
            },
            "settings": {
                k: getattr(args, k)
                for k in (
                    "quick",
                    "records",
                    "repeats",
                    "seconds",
                    "connections",
                    "rebalances",
                    "only",
                )
            },
            "figures": [asdict(f) | {"met": f.met} for f in figures],
            **extra,
            "wall_seconds": time.time() - started,
        }
        Path(args.json).write_text(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
