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
   read whole from the start in pages of 1,000 on one connection: Logbus
   ``GET …/partitions/0/records?offset=o&max_records=1000`` decoded with ``orjson.loads``
   (following ``next_offset``), Redis ``XREAD COUNT 1000 STREAMS s <last id>`` decoded by
   hiredis into redis-py's answer (a list of ``(id, {field: value})``). Records/s.

The client's cost is part of each side's figure (the issue asks for it: a consumer pays for its
decode). The client shares the 2 cores with both servers; each measurement's CPU seconds of the
client, the broker and redis-server are kept in the JSON file (``detail``).
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import orjson
import redis

from api.process import BrokerProcess, free_port
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


def redis_server_path() -> str | None:
    return shutil.which("redis-server") or (REDIS_SERVER if os.path.exists(REDIS_SERVER) else None)


class RedisProcess:
    """redis-server on a loopback port, AOF with an fsync a second, data in ``directory``."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
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


# -- Redis ---------------------------------------------------------------------------------------
# redis-py's blocking client: its pipeline is ≈ 2.3x faster than redis.asyncio's on this
# machine (83k against 37k XADD/s on one connection), so Redis gets it, one thread and one
# connection per concurrent pipeline.


def _redis(port: int) -> redis.Redis:
    return redis.Redis(port=port, socket_timeout=60.0, socket_connect_timeout=5.0)


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

    try:
        with ThreadPoolExecutor(conns) as pool:
            for f in [pool.submit(worker, i) for i in range(conns)]:
                f.result()
    finally:
        for r in clients:
            r.close()
    return sum(sent)


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


def redis_delete(port: int, stream: str) -> None:
    r = _redis(port)
    try:
        r.delete(stream)
    finally:
        r.close()


# -- the run -------------------------------------------------------------------------------------


def _best_concurrency(measure_one: Any) -> tuple[int, dict[int, float]]:
    tried = {c: measure_one(c).records_s for c in CONCURRENCY}
    return max(tried, key=lambda c: tried[c]), {c: round(v) for c, v in tried.items()}


def measure(rounds: int, seconds: float, workdir: Path, records: int = 200_000) -> list[Ratio]:
    """Start both servers in ``workdir``, measure, stop them; the ratios (Logbus / Redis)."""
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

        def logbus_pass(acks: str, conns: int, secs: float) -> Pass:
            topic = f"peer-produce-{acks}"
            return _measured(
                bpid, lambda: asyncio.run(logbus_produce(port, topic, acks, conns, secs))
            )

        def redis_pass(conns: int, secs: float) -> Pass:
            try:
                return _measured(
                    server.pid, lambda: redis_produce(rport, STREAM_PRODUCE, conns, secs)
                )
            finally:
                redis_delete(rport, STREAM_PRODUCE)

        calibrate = max(0.5, seconds / 2)
        c_redis, tried_redis = _best_concurrency(lambda c: redis_pass(c, calibrate))
        c_one, tried_one = _best_concurrency(lambda c: logbus_pass("1", c, calibrate))
        c_all, tried_all = _best_concurrency(lambda c: logbus_pass("all", c, calibrate))

        asyncio.run(logbus_fill(port, TOPIC_CONSUME, records))
        redis_fill(rport, STREAM_CONSUME, records)

        produce_1 = Ratio(
            "JSON produce 1,000x100 B, Logbus acks=1 / Redis XADD pipeline",
            PRODUCE_TARGET,
            numerator=f"Logbus acks=1, {c_one} connections",
            denominator=f"Redis XADD x1,000 pipelined, {c_redis} connections",
            unit="x",
            note="AOF everysec vs flush.ms=1000",
        )
        produce_all = Ratio(
            "JSON produce 1,000x100 B, Logbus acks=all / Redis XADD pipeline",
            PRODUCE_TARGET,
            numerator=f"Logbus acks=all, {c_all} connections",
            denominator=f"Redis XADD x1,000 pipelined, {c_redis} connections",
            note="extra row: the default acks",
        )
        consume = Ratio(
            "JSON consume pages of 1,000, Logbus+orjson / XREAD+hiredis",
            CONSUME_TARGET,
            numerator="Logbus GET max_records=1000, orjson.loads",
            denominator="XREAD COUNT 1000, redis-py + hiredis",
            note=f"{records:,} records read whole",
        )
        passes: dict[str, list[dict[str, float]]] = {
            k: [] for k in ("logbus_acks1", "logbus_acksall", "redis_produce")
        }
        consume_passes: dict[str, list[dict[str, float]]] = {"logbus": [], "redis": []}
        loads: list[float] = []
        for _, a_first in alternate(rounds):
            loads.append(os.getloadavg()[0])
            # produce: (Logbus acks=1, Logbus acks=all) against one Redis pass
            if a_first:
                one = logbus_pass("1", c_one, seconds)
                every = logbus_pass("all", c_all, seconds)
                red = redis_pass(c_redis, seconds)
            else:
                red = redis_pass(c_redis, seconds)
                every = logbus_pass("all", c_all, seconds)
                one = logbus_pass("1", c_one, seconds)
            produce_1.rounds.append(one.records_s / red.records_s)
            produce_all.rounds.append(every.records_s / red.records_s)
            passes["logbus_acks1"].append(one.as_dict())
            passes["logbus_acksall"].append(every.as_dict())
            passes["redis_produce"].append(red.as_dict())

            def lb() -> Pass:
                return _measured(
                    bpid, lambda: asyncio.run(logbus_consume(port, TOPIC_CONSUME, records))
                )

            def rd() -> Pass:
                return _measured(server.pid, lambda: redis_consume(rport, STREAM_CONSUME, records))

            if a_first:
                lc, rc = lb(), rd()
            else:
                rc, lc = rd(), lb()
            consume.rounds.append(lc.records_s / rc.records_s)
            consume_passes["logbus"].append(lc.as_dict())
            consume_passes["redis"].append(rc.as_dict())
        produce_1.detail = {
            "logbus": passes["logbus_acks1"],
            "redis": passes["redis_produce"],
            "concurrency_tried": {"logbus": tried_one, "redis": tried_redis},
            "loadavg_1m": loads,
        }
        produce_all.detail = {
            "logbus": passes["logbus_acksall"],
            "redis": passes["redis_produce"],
            "concurrency_tried": {"logbus": tried_all, "redis": tried_redis},
            "loadavg_1m": loads,
        }
        consume.detail = {**consume_passes, "loadavg_1m": loads}
        return [produce_1, produce_all, consume]
    finally:
        server.stop()
        broker.stop()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--records", type=int, default=200_000, help="records read by consume")
    parser.add_argument("--json", type=Path, help="write the ratios here")
    parser.add_argument("--plot", type=Path, help="draw the ratios here (PNG)")
    args = parser.parse_args(argv)
    if redis_server_path() is None:
        print("redis-server not found: apt-get install -y redis-server", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory(prefix="logbus-redis-peer-") as tmp:
        ratios = measure(args.rounds, args.seconds, Path(tmp), args.records)
    print_table(ratios)
    for r in ratios:
        for side in ("logbus", "redis"):
            rows = r.detail.get(side, [])
            figures = ", ".join(f"{p['records_s'] / 1000:,.0f}k" for p in rows)
            print(f"  {r.name[:40]:<40} {side:<7} records/s per round: {figures}")
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
            "ratios": [r.as_dict() for r in ratios],
        }
        args.json.write_text(json.dumps(doc, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
