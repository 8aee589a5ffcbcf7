"""JSON produce and consume against Redis Streams, side by side in one run (issue 14).

    python -m benchmarks.redis_peer [--rounds 4] [--seconds 5] [--records 200000]
                                    [--json docs/bench-redis-peer.json] [--plot FILE]

Both servers are started here, on the same 2 cores, in the same run:

* **Logbus**: one :class:`~api.process.BrokerProcess` with its defaults (uvicorn, the raw-ASGI
  fast path, ``flush.ms`` = 1000: the log is fsynced once a second).
* **Redis**: Debian's ``redis-server`` on a free port in a temporary directory, with
  ``appendonly yes`` and ``appendfsync everysec`` — Redis's durable configuration, the one its
  documentation recommends (an fsync a second, at most a second of writes lost on a power
  cut). RDB snapshots are off (``save ""``) so no fork competes for the cores; AOF rewriting
  keeps Redis's defaults (the stream is deleted after each produce measurement, so the
  rewrites stay small).

Fairness of durability: Logbus ``acks=1`` answers once the record is in the leader's log (the
page cache) and fsyncs every second (``flush.ms`` = 1000) — the same promise as AOF everysec,
so ``acks=1`` is the row with the target. ``acks=all`` (the default; on a one-broker cluster
it also waits for the high watermark, which follows the fsync schedule only for
``durability=fsync`` topics) is reported as a second row with the same target.

Measurements, in ABBA rounds (:func:`benchmarks.ratios.alternate`):

1. **Produce** — 1,000 records of a 100-byte value per round trip, for ``--seconds``, from
   ``c`` concurrent connections in this (asyncio) process. Logbus: the client serialises
   ``{"records": [{"value": "vvv…"}, …]}`` with orjson for every request and POSTs it to
   ``/v1/topics/{t}/records`` (one partition) on a raw asyncio HTTP/1.1 connection
   (:class:`benchmarks.transactions.Conn`: ≈ 4x cheaper per request than httpx, so the
   client is not what is measured). Redis: redis-py (hiredis parser), one
   ``pipeline(transaction=False)`` of 1,000 ``XADD s * value <100 bytes>`` per round trip on
   each connection. Records/s.
   Concurrency: before the rounds each side runs ``--seconds``/2 at every ``c`` of
   ``CONCURRENCY`` (2, 4, 8) and keeps its best — Redis executes commands on one thread and the
   redis-py client packs every command in Python, so more connections do not help it past the
   point where this process's core is full; Logbus answers on one event loop too.
2. **Consume** — a stream/partition of ``--records`` records (≥ 200,000) written beforehand,
   read whole from the start ``CONSUME_READS`` times per pass (one read of 200,000 took
   ≈ 0.2 s, too short to outlast the machine's load swings), in pages of 1,000 on one
   connection: Logbus
   ``GET …/partitions/0/records?offset=o&max_records=1000`` decoded with ``orjson.loads``
   (following ``next_offset``), Redis ``XREAD COUNT 1000 STREAMS s <last id>`` decoded by
   hiredis into redis-py's answer (a list of ``(id, {field: value})``). Records/s.
   Both clients block on their socket, in this thread: Logbus's
   :class:`~benchmarks.blocking_http.BlockingConn` (the answer received into one buffer kept
   for the connection, the body decoded from a view of it) against redis-py's blocking
   client. Extra rows read Logbus with the raw asyncio client
   (:class:`benchmarks.transactions.Conn`, under ``asyncio.run`` per read), with the standard
   library's ``http.client``, and asking for the next page ahead. Every consume pass runs
   with this process's heap frozen out of the cyclic garbage collector
   (:func:`with_heap_frozen`): the collections a page's thousands of containers trigger would
   otherwise walk the benchmark's own objects (≈ 46,000 after ``import benchmarks.redis_peer``,
   ≈ 98,000 under :mod:`benchmarks.per_request`), a cost no consumer process has.

The client's cost is part of each side's figure (the issue asks for it: a consumer pays for its
decode). The client shares the 2 cores with both servers; each measurement's CPU seconds of the
client, the broker and redis-server are kept in the JSON file (``detail``).
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import functools
import gc
import http.client
import json
import os
import platform
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import hiredis
import httpx
import orjson
import redis

from api.process import BrokerProcess, free_port
from benchmarks.blocking_http import BlockingConn
from benchmarks.ratios import Ratio, alternate, plot, print_table
from benchmarks.transactions import Conn, cpu_seconds

PRODUCE_TARGET = 2.0
CONSUME_TARGET = 1.5
RECORDS_PER_REQUEST = 1000
VALUE = b'"' + b"v" * 98 + b'"'  # 100 bytes: a JSON string, stored as its JSON text
CONCURRENCY = (1, 2, 4, 8)
REDIS_SERVER = "/usr/bin/redis-server"
STREAM_PRODUCE = "produce"
STREAM_CONSUME = "consume"
TOPIC_CONSUME = "peer-consume"
STARTUP_TIMEOUT_S = 30.0
CONSUME_READS = 5  # whole reads of the stream per consume pass: ≈ 1 s a pass


def redis_server_path() -> str | None:
    return shutil.which("redis-server") or (REDIS_SERVER if os.path.exists(REDIS_SERVER) else None)


class RedisProcess:
    """redis-server on a loopback port, AOF with an fsync a second, data in ``directory``."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory.resolve()  # redis-server changes into it: no relative paths
        self.port = free_port()
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> RedisProcess:
        server = redis_server_path()
        if server is None:
            raise RuntimeError("redis-server not found (apt-get install -y redis-server)")
        self.directory.mkdir(parents=True, exist_ok=True)
        cmd = [
            server,
            "--port",
            str(self.port),
            "--bind",
            "127.0.0.1",
            "--dir",
            str(self.directory),
            "--appendonly",
            "yes",
            "--appendfsync",
            "everysec",
            "--save",
            "",
            "--daemonize",
            "no",
            "--logfile",
            str(self.directory / "redis.log"),
        ]
        self.proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + STARTUP_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"redis-server exited with {self.proc.returncode}")
            try:
                if _ping(self.port):
                    return self
            except OSError:
                pass
            time.sleep(0.05)
        self.stop()
        raise TimeoutError("redis-server did not answer PING")

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def stop(self) -> None:
        if self.proc is None:
            return
        self.proc.terminate()
        try:
            self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.proc = None


def _ping(port: int) -> bool:
    r = redis.Redis(port=port, socket_timeout=1.0, socket_connect_timeout=1.0)
    try:
        return bool(r.ping())
    except redis.ConnectionError:
        return False
    finally:
        r.close()


@dataclass
class Pass:
    """One measurement: records moved, wall seconds, CPU seconds of client and server."""

    records: int
    seconds: float
    client_cpu_s: float
    server_cpu_s: float

    @property
    def records_s(self) -> float:
        return self.records / self.seconds

    def as_dict(self) -> dict[str, float]:
        return {
            "records": self.records,
            "seconds": round(self.seconds, 3),
            "records_s": round(self.records_s),
            "client_cpu_s": round(self.client_cpu_s, 3),
            "server_cpu_s": round(self.server_cpu_s, 3),
        }


def _measured(server_pid: int, run: Callable[[], int]) -> Pass:
    """Call ``run`` (→ records moved) and time it, wall and CPU."""
    client0, server0 = time.process_time(), cpu_seconds(server_pid)
    start = time.perf_counter()
    records = run()
    seconds = time.perf_counter() - start
    return Pass(records, seconds, time.process_time() - client0, cpu_seconds(server_pid) - server0)


def with_heap_frozen(run: Callable[[], int]) -> int:
    """``run()`` with every object this process holds now frozen out of the cyclic garbage
    collector (``gc.freeze``), thawed after.

    A consume pass allocates thousands of collector-tracked containers a page (orjson's dict
    and ``headers`` list per record; hiredis's lists and redis-py's tuple and dict per entry),
    and every full collection they trigger walks the whole heap — ≈ 46,000 objects after
    ``import benchmarks.redis_peer`` (the broker's package, httpx, redis-py), ≈ 98,000 under
    :mod:`benchmarks.per_request` — which a consumer process would not hold. Measured
    (2026-11-27, a process that had started a broker, ≈ 51,000 objects): ``orjson.loads`` of a
    1,000-record page, each result held until the next, ≈ 520 µs a page, ≈ 270 µs with the
    heap frozen, ≈ 290 µs in a bare interpreter; in 4 alternating rounds (load 3-4) the
    blocking client's ratio to redis-py was 1.03-2.55 unfrozen and 1.44-1.48 frozen. Frozen, a
    client's figure is its own work; both sides get the same."""
    gc.freeze()
    try:
        return run()
    finally:
        gc.unfreeze()


def _values() -> list[dict[str, Any]]:
    value = orjson.Fragment(VALUE)
    return [{"value": value} for _ in range(RECORDS_PER_REQUEST)]


# -- Logbus --------------------------------------------------------------------------------------


def _check(status: int, body: bytes, what: str) -> None:
    if status != 200:
        raise RuntimeError(f"{what}: {status} {body[:300]!r}")


async def logbus_produce(port: int, topic: str, acks: str, conns: int, seconds: float) -> int:
    records = _values()
    path = f"/v1/topics/{topic}/records?acks={acks}"
    headers = {"Content-Type": "application/json"}
    opened = [await Conn(port).open() for _ in range(conns)]
    sent = 0
    deadline = time.perf_counter() + seconds

    async def worker(conn: Conn) -> None:
        nonlocal sent
        while time.perf_counter() < deadline:
            body = orjson.dumps({"records": records})  # the client's work, every request
            status, reply = await conn.request("POST", path, body, headers)
            _check(status, reply, path)
            sent += RECORDS_PER_REQUEST

    try:
        await asyncio.gather(*(worker(c) for c in opened))
    finally:
        for c in opened:
            await c.close()
    return sent


async def logbus_fill(port: int, topic: str, total: int) -> None:
    conn = await Conn(port).open()
    body = orjson.dumps({"records": _values()})
    path = f"/v1/topics/{topic}/partitions/0/records?acks=1"
    try:
        for _ in range(total // RECORDS_PER_REQUEST):
            status, reply = await conn.request(
                "POST", path, body, {"Content-Type": "application/json"}
            )
            _check(status, reply, path)
    finally:
        await conn.close()


async def logbus_consume(port: int, topic: str, total: int) -> int:
    conn = await Conn(port).open()
    offset = got = 0
    try:
        while offset < total:
            path = (
                f"/v1/topics/{topic}/partitions/0/records?offset={offset}"
                f"&max_records={RECORDS_PER_REQUEST}"
            )
            status, body = await conn.request("GET", path)
            _check(status, body, path)
            doc = orjson.loads(body)
            got += len(doc["records"])
            offset = doc["next_offset"]
    finally:
        await conn.close()
    return got


def _page_path(topic: str, offset: int) -> str:
    return (
        f"/v1/topics/{topic}/partitions/0/records?offset={offset}&max_records={RECORDS_PER_REQUEST}"
    )


def _read_pages(
    get: Callable[[str], tuple[int, bytes | memoryview]], topic: str, total: int
) -> int:
    """The records of ``topic`` up to ``total``, a page at a time, each page ``get(path)``'s
    (status, body) decoded with ``orjson.loads`` (following ``next_offset``)."""
    offset = got = 0
    while offset < total:
        status, body = get(_page_path(topic, offset))
        _check(status, bytes(body[:300]), topic)
        doc = orjson.loads(body)
        got += len(doc["records"])
        offset = doc["next_offset"]
    return got


def logbus_consume_blocking(port: int, topic: str, total: int) -> int:
    """:func:`logbus_consume` on a blocking socket (:class:`BlockingConn`: each answer read
    into one buffer kept for the connection, the body decoded from a view of it)."""
    conn = BlockingConn(port)
    try:
        return _read_pages(conn.get, topic, total)
    finally:
        conn.close()


def logbus_consume_stdlib(port: int, topic: str, total: int) -> int:
    """:func:`logbus_consume` on the standard library's blocking client
    (``http.client.HTTPConnection``, one keep-alive connection)."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60.0)

    def get(path: str) -> tuple[int, bytes]:
        conn.request("GET", path, headers={"Accept": "application/json"})
        answer = conn.getresponse()
        return answer.status, answer.read()

    try:
        return _read_pages(get, topic, total)
    finally:
        conn.close()


class PeekConn(Conn):
    """A :class:`Conn` that sends a request and reads its answer in two steps, headers apart,
    so the client can ask for the next page before it decodes this one."""

    async def send(self, path: str) -> None:
        assert self.writer is not None
        self.writer.write(
            f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1:{self.port}\r\n"
            "Accept: application/json\r\n\r\n".encode()
        )
        await self.writer.drain()

    async def answer(self) -> tuple[int, dict[bytes, bytes], bytes]:
        assert self.reader is not None
        status = int((await self.reader.readline()).split()[1])
        headers: dict[bytes, bytes] = {}
        while (line := await self.reader.readline()) not in (b"\r\n", b""):
            name, _, value = line.partition(b":")
            headers[name.strip().lower()] = value.strip()
        body = await self.reader.readexactly(int(headers.get(b"content-length", b"0")))
        return status, headers, body


async def logbus_consume_ahead(port: int, topic: str, total: int) -> int:
    """Read ``total`` records as :func:`logbus_consume` does, but ask for page k+1 (on a second
    connection) as soon as page k's headers give its ``Logbus-Next-Offset``, then decode page k:
    the broker renders the next page while the client decodes this one (as Kafka's consumer
    fetches ahead). Redis cannot be read this way: XREAD's next id is inside the answer."""
    conns = [PeekConn(port), PeekConn(port)]
    for c in conns:
        await c.open()
    base = f"/v1/topics/{topic}/partitions/0/records?max_records={RECORDS_PER_REQUEST}&offset="
    got = 0
    k = 0
    try:
        await conns[0].send(base + "0")
        while True:
            status, headers, body = await conns[k % 2].answer()
            _check(status, body, base)
            next_offset = int(headers[b"logbus-next-offset"])
            if next_offset < total:
                await conns[(k + 1) % 2].send(base + str(next_offset))
            got += len(orjson.loads(body)["records"])
            k += 1
            if next_offset >= total:
                return got
    finally:
        for c in conns:
            await c.close()


# -- Redis ---------------------------------------------------------------------------------------
# redis-py's blocking client: its pipeline is ≈ 2.3x faster than redis.asyncio's on this
# machine (83k against 37k XADD/s on one connection), so Redis gets it, one thread and one
# connection per concurrent pipeline.


def _redis(port: int) -> redis.Redis:
    return redis.Redis(port=port, socket_timeout=60.0, socket_connect_timeout=5.0)


def _in_threads(
    worker: Callable[[int], None], clients: Sequence[redis.Redis | RawRedis], sent: list[int]
) -> int:
    """``worker(i)`` for each client, one thread each, until all return; the clients closed
    after; the records sent."""
    try:
        with ThreadPoolExecutor(len(clients)) as pool:
            for f in [pool.submit(worker, i) for i in range(len(clients))]:
                f.result()
    finally:
        for c in clients:
            c.close()
    return sum(sent)


def redis_produce(port: int, stream: str, conns: int, seconds: float) -> int:
    clients = [_redis(port) for _ in range(conns)]
    sent = [0] * conns
    deadline = time.perf_counter() + seconds

    def worker(i: int) -> None:
        r = clients[i]
        while time.perf_counter() < deadline:
            pipe = r.pipeline(transaction=False)
            for _ in range(RECORDS_PER_REQUEST):
                pipe.xadd(stream, {"value": VALUE})
            pipe.execute()
            sent[i] += RECORDS_PER_REQUEST

    return _in_threads(worker, clients, sent)


def redis_fill(port: int, stream: str, total: int) -> None:
    r = _redis(port)
    try:
        for _ in range(total // RECORDS_PER_REQUEST):
            pipe = r.pipeline(transaction=False)
            for _ in range(RECORDS_PER_REQUEST):
                pipe.xadd(stream, {"value": VALUE})
            pipe.execute()
    finally:
        r.close()


def redis_consume(port: int, stream: str, total: int) -> int:
    r = _redis(port)
    last = b"0-0"
    got = 0
    try:
        while got < total:
            # RESP2: [[stream, [(id, {field: value}), ...]]] (the stubs type RESP3's dict)
            answer: Any = r.xread({stream: last}, count=RECORDS_PER_REQUEST)
            entries = answer[0][1]
            got += len(entries)
            last = entries[-1][0]
    finally:
        r.close()
    return got


class RawRedis:
    """Redis's fastest Python client: commands packed by ``hiredis.pack_command`` and answers
    parsed by ``hiredis.Reader``, on a blocking socket — no redis-py objects per command. The
    ceiling of what a Python producer can ask of Redis, for the extra rows."""

    def __init__(self, port: int) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=60.0)
        self.reader = hiredis.Reader()

    def call(self, commands: list[tuple[str | bytes, ...]]) -> list[Any]:
        pack: Any = hiredis.pack_command  # its stub wants a 1-tuple
        self.sock.sendall(b"".join(pack(c) for c in commands))
        out: list[Any] = []
        while len(out) < len(commands):
            while (reply := self.reader.gets()) is not False:
                if isinstance(reply, hiredis.ReplyError):
                    raise reply
                out.append(reply)
                if len(out) == len(commands):
                    return out
            chunk = self.sock.recv(1 << 20)
            if not chunk:
                raise ConnectionError("redis-server closed the connection")
            self.reader.feed(chunk)
        return out

    def close(self) -> None:
        self.sock.close()


def redis_produce_raw(port: int, stream: str, conns: int, seconds: float) -> int:
    clients = [RawRedis(port) for _ in range(conns)]
    sent = [0] * conns
    deadline = time.perf_counter() + seconds

    def worker(i: int) -> None:
        while time.perf_counter() < deadline:
            xadd = ("XADD", stream, "*", "value", VALUE)
            clients[i].call([xadd] * RECORDS_PER_REQUEST)
            sent[i] += RECORDS_PER_REQUEST

    return _in_threads(worker, clients, sent)


def redis_consume_raw(port: int, stream: str, total: int) -> int:
    r = RawRedis(port)
    last: bytes = b"0-0"
    got = 0
    try:
        while got < total:
            cmd = ("XREAD", "COUNT", str(RECORDS_PER_REQUEST), "STREAMS", stream, last)
            entries = r.call([cmd])[0][0][1]  # [[stream, [[id, [field, value]], ...]]]
            got += len(entries)
            last = entries[-1][0]
    finally:
        r.close()
    return got


def redis_delete(port: int, stream: str) -> None:
    r = _redis(port)
    try:
        r.delete(stream)
    finally:
        r.close()


# -- the run -------------------------------------------------------------------------------------


def _best_concurrency(
    measure_one: Callable[[int], Pass], candidates: Sequence[int]
) -> tuple[int, dict[int, int]]:
    """The best of ``candidates`` for one side: each tried twice (the machine is shared, one
    try is noise), best records/s kept."""
    tried = {c: round(max(measure_one(c).records_s for _ in range(2))) for c in candidates}
    return max(tried, key=lambda c: tried[c]), tried


def _at(side: Side, seconds: float, conns: int) -> Pass:
    return side.run(conns, seconds)


@dataclass
class Side:
    """One side of the produce rows: how to run a pass at a concurrency, and what it chose."""

    name: str
    run: Callable[[int, float], Pass]
    conns: int = 1
    tried: dict[int, int] | None = None


def measure(
    rounds: int,
    seconds: float,
    workdir: Path,
    records: int = 200_000,
    concurrency: Sequence[int] = CONCURRENCY,
) -> list[Ratio]:
    """Start both servers in ``workdir``, measure, stop them; the ratios (Logbus / Redis).

    Rows: produce with acks=1 (the target's row), acks=all, and acks=1 against Redis fed by
    raw hiredis (Redis's fastest Python client); consume one page at a time on a blocking
    socket (the target's row), on the raw asyncio client, on ``http.client``, and with the next
    page asked for ahead, against redis-py XREAD, and the blocking and ahead ones against raw
    hiredis XREAD."""
    records = max(RECORDS_PER_REQUEST, records - records % RECORDS_PER_REQUEST)
    broker = BrokerProcess(workdir / "logbus").start()
    server = RedisProcess(workdir / "redis").start()
    try:
        assert broker.proc is not None
        bpid, port, rport = broker.proc.pid, broker.port, server.port
        for name in ("peer-produce-1", "peer-produce-all", TOPIC_CONSUME):
            httpx.post(
                f"{broker.url}/v1/topics", json={"name": name, "partitions": 1}, timeout=60
            ).raise_for_status()

        def logbus(acks: str) -> Callable[[int, float], Pass]:
            topic = f"peer-produce-{acks}"
            return lambda c, secs: _measured(
                bpid, lambda: asyncio.run(logbus_produce(port, topic, acks, c, secs))
            )

        def redis_side(produce: Callable[[int, str, int, float], int]) -> Any:
            def run(c: int, secs: float) -> Pass:
                try:
                    return _measured(server.pid, lambda: produce(rport, STREAM_PRODUCE, c, secs))
                finally:
                    redis_delete(rport, STREAM_PRODUCE)

            return run

        sides = {
            "logbus_acks1": Side("Logbus acks=1", logbus("1")),
            "logbus_acksall": Side("Logbus acks=all", logbus("all")),
            "redis_py": Side("redis-py pipeline", redis_side(redis_produce)),
            "redis_raw": Side("raw hiredis pipeline", redis_side(redis_produce_raw)),
        }
        calibrate = max(0.5, seconds / 3)
        for side in sides.values():
            side.conns, side.tried = _best_concurrency(
                functools.partial(_at, side, calibrate), concurrency
            )

        asyncio.run(logbus_fill(port, TOPIC_CONSUME, records))
        redis_fill(rport, STREAM_CONSUME, records)

        def reads(read_once: Callable[[], int]) -> Callable[[], int]:
            return lambda: with_heap_frozen(lambda: sum(read_once() for _ in range(CONSUME_READS)))

        consumers: dict[str, Callable[[], Pass]] = {
            "logbus_page": lambda: _measured(
                bpid, reads(lambda: logbus_consume_blocking(port, TOPIC_CONSUME, records))
            ),
            "logbus_asyncio": lambda: _measured(
                bpid, reads(lambda: asyncio.run(logbus_consume(port, TOPIC_CONSUME, records)))
            ),
            "logbus_stdlib": lambda: _measured(
                bpid, reads(lambda: logbus_consume_stdlib(port, TOPIC_CONSUME, records))
            ),
            "logbus_ahead": lambda: _measured(
                bpid,
                reads(lambda: asyncio.run(logbus_consume_ahead(port, TOPIC_CONSUME, records))),
            ),
            "redis_py": lambda: _measured(
                server.pid, reads(lambda: redis_consume(rport, STREAM_CONSUME, records))
            ),
            "redis_raw": lambda: _measured(
                server.pid, reads(lambda: redis_consume_raw(rport, STREAM_CONSUME, records))
            ),
        }

        passes: dict[str, list[Pass]] = {k: [] for k in [*sides, *(f"c_{k}" for k in consumers)]}
        loads: list[float] = []
        for _, a_first in alternate(rounds):
            loads.append(os.getloadavg()[0])
            order = list(sides) if a_first else list(reversed(sides))
            for key in order:
                passes[key].append(sides[key].run(sides[key].conns, seconds))
            corder = list(consumers) if a_first else list(reversed(consumers))
            for key in corder:
                got = consumers[key]()
                if got.records != records * CONSUME_READS:
                    raise RuntimeError(
                        f"{key} read {got.records} records of {records} x {CONSUME_READS}"
                    )
                passes[f"c_{key}"].append(got)

        def ratio(name: str, target: float, num: str, den: str, note: str) -> Ratio:
            a, b = passes[num], passes[den]
            return Ratio(
                name,
                target,
                [x.records_s / y.records_s for x, y in zip(a, b, strict=True)],
                numerator=_label(num, sides),
                denominator=_label(den, sides),
                note=note,
                detail={
                    "logbus": [x.as_dict() for x in a],
                    "redis": [y.as_dict() for y in b],
                    "concurrency_tried": {
                        "logbus": sides[num].tried if num in sides else None,
                        "redis": sides[den].tried if den in sides else None,
                    },
                    "loadavg_1m": loads,
                },
            )

        return [
            ratio(
                "JSON produce 1,000x100 B: Logbus acks=1 / Redis XADD (redis-py)",
                PRODUCE_TARGET,
                "logbus_acks1",
                "redis_py",
                "AOF everysec vs flush.ms=1000",
            ),
            ratio(
                "JSON produce 1,000x100 B: Logbus acks=all / Redis XADD (redis-py)",
                PRODUCE_TARGET,
                "logbus_acksall",
                "redis_py",
                "extra: Logbus's default acks",
            ),
            ratio(
                "JSON produce 1,000x100 B: Logbus acks=1 / Redis XADD (raw hiredis)",
                PRODUCE_TARGET,
                "logbus_acks1",
                "redis_raw",
                "extra: Redis's fastest Python client",
            ),
            ratio(
                "JSON consume by 1,000: Logbus blocking+orjson / XREAD (redis-py+hiredis)",
                CONSUME_TARGET,
                "c_logbus_page",
                "c_redis_py",
                f"one page at a time, {records:,} records x {CONSUME_READS}; both clients"
                " blocking, one connection",
            ),
            ratio(
                "JSON consume by 1,000: Logbus asyncio+orjson / XREAD (redis-py)",
                CONSUME_TARGET,
                "c_logbus_asyncio",
                "c_redis_py",
                "extra: the raw asyncio client (the target row's before 2026-11-27)",
            ),
            ratio(
                "JSON consume by 1,000: Logbus http.client+orjson / XREAD (redis-py)",
                CONSUME_TARGET,
                "c_logbus_stdlib",
                "c_redis_py",
                "extra: the standard library's client",
            ),
            ratio(
                "JSON consume by 1,000, next page asked ahead / XREAD (redis-py)",
                CONSUME_TARGET,
                "c_logbus_ahead",
                "c_redis_py",
                "extra: Logbus-Next-Offset read before the body",
            ),
            ratio(
                "JSON consume by 1,000: Logbus blocking+orjson / XREAD (raw hiredis)",
                CONSUME_TARGET,
                "c_logbus_page",
                "c_redis_raw",
                "extra: Redis's fastest Python client",
            ),
            ratio(
                "JSON consume by 1,000, next page asked ahead / XREAD (raw hiredis)",
                CONSUME_TARGET,
                "c_logbus_ahead",
                "c_redis_raw",
                "extra",
            ),
        ]
    finally:
        server.stop()
        broker.stop()


_CONSUMERS = {
    "c_logbus_page": "Logbus GET max_records=1000 + orjson.loads, blocking socket",
    "c_logbus_asyncio": "Logbus GET max_records=1000 + orjson.loads, raw asyncio client",
    "c_logbus_stdlib": "Logbus GET max_records=1000 + orjson.loads, http.client",
    "c_logbus_ahead": "Logbus GET max_records=1000 + orjson.loads, next page asked ahead",
    "c_redis_py": "XREAD COUNT 1000, redis-py + hiredis",
    "c_redis_raw": "XREAD COUNT 1000, raw hiredis",
}


def _label(key: str, sides: dict[str, Side]) -> str:
    if key in sides:
        return f"{sides[key].name}, {sides[key].conns} connections"
    return _CONSUMERS[key]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--records", type=int, default=200_000, help="records read by consume")
    parser.add_argument(
        "--concurrency",
        default=",".join(map(str, CONCURRENCY)),
        help="connection counts each produce side tries before the rounds (its best is kept)",
    )
    parser.add_argument("--json", type=Path, help="write the ratios here")
    parser.add_argument("--plot", type=Path, help="draw the ratios here (PNG; matplotlib)")
    parser.add_argument(
        "--replot", type=Path, help="no run: draw --plot from this --json file of an earlier run"
    )
    args = parser.parse_args(argv)
    if args.replot:
        doc = json.loads(args.replot.read_text())
        fields = ("name", "target", "rounds", "numerator", "denominator", "unit", "note")
        ratios = [Ratio(**{k: r[k] for k in fields}) for r in doc["ratios"]]
        plot(ratios, args.plot, f"Logbus JSON against Redis Streams (issue 14), {doc['when']}")
        return 0
    if redis_server_path() is None:
        print("redis-server not found: apt-get install -y redis-server", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory(prefix="logbus-redis-peer-") as tmp:
        concurrency = [int(c) for c in args.concurrency.split(",")]
        ratios = measure(args.rounds, args.seconds, Path(tmp), args.records, concurrency)
    print_table(ratios)
    for r in ratios:
        for side in ("logbus", "redis"):
            rows = r.detail.get(side, [])
            figures = ", ".join(f"{p['records_s'] / 1000:,.0f}k" for p in rows)
            what = r.numerator if side == "logbus" else r.denominator
            print(f"  {what:<66} records/s per round: {figures}")
    if args.plot:
        plot(ratios, args.plot, "Logbus JSON against Redis Streams (issue 14)")
    if args.json:
        doc = {
            "when": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
            "host": platform.node(),
            "python": platform.python_version(),
            "cpus": os.cpu_count(),
            "rounds": args.rounds,
            "seconds": args.seconds,
            "records": args.records,
            "loadavg_after": os.getloadavg(),
            "ratios": [r.as_dict() for r in ratios],
        }
        args.json.write_text(json.dumps(doc, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
