"""Issue 14's cluster and push ratios: forwarded vs leader produce, SSE vs WebSocket push, and
produce → WebSocket latency, each measured side by side in one run.

    .venv/bin/python -m benchmarks.push [--rounds 4] [--seconds 4] [--json PATH]
                                        [--only cluster|push]

Every broker is a ``logbus serve`` child process (:class:`api.process.BrokerProcess`) on
loopback; the load generators are ``wrk`` (C, one thread) and asyncio clients in this process.
Each ratio runs its two sides in ABBA rounds (:func:`benchmarks.ratios.alternate`) and reports
the median of the rounds' ratios (:class:`benchmarks.ratios.Ratio`).

**Forwarded vs leader produce** (:func:`measure_cluster`). A 3-broker cluster sharing a SQLite
metadata store (:class:`benchmarks.cluster.Cluster`, default settings). One 1-partition topic
per load shape, RF=3 with ``min.insync.replicas=2`` (the recommended setting), written with
``acks=all``. Both sides send byte-identical requests (``POST /v1/topics/{t}/records``, no
``Logbus-Route`` header) to the same topic; they differ only in the broker: the partition's
leader, or the lowest-numbered broker that does not lead it (a follower), which forwards the
batch to the leader over the brokers' h2c link (:mod:`cluster.forwarding`). Shapes: one
100-byte JSON record per request over 64 connections (a web backend's producer), and 1,000 x
100-byte JSON records per request over 8 connections (``json_body``, as ``logbus bench``).
The same topic serves every round, so no round pays for a fresh topic's first segment.

**SSE vs WebSocket JSON push** (:func:`measure_push`). One broker; a 1-partition topic
pre-filled with ``--push-records`` 100-byte records (binary batches of 1,000), then read from
offset 0 to its end by one consumer of each kind in turn. Pre-filled rather than produced to
while read: a consumer reading a topic being produced to at full speed can go no faster than
the producer, and on 2 cores the producer's and the pusher's CPU would compete, so the ratio
would measure the producer; a backlog read from the start is what push throughput is (the rate
a consumer catches up at). The WebSocket consumer (``benchmarks.consumers.ws_push``, JSON
frames, 200,000 records of credit kept granted) parses every frame with ``orjson.loads``; the
SSE consumer (:func:`sse_read`: a minimal HTTP/1.1 client decoding the chunked stream itself,
as httpx's per-chunk cost would dominate) collects the ``data:`` lines of each chunk and
parses them all with ``orjson.loads`` too, so both parse every record's JSON with the same
decoder. Both use the broker's defaults (an ``EventSource`` sends no parameters). The broker's
CPU time per record on each side is kept in ``detail``.

**produce → WebSocket latency** (:func:`measure_push`): ``benchmarks.consumers.ws_latency``
(1,000 records/s, one record per produce from 4 keep-alive connections, ``acks=1``, a JSON
WebSocket subscriber in the same asyncio process) for ``--seconds`` per round; the ratio's
rounds are the rounds' p99s in ms against the 5 ms ceiling (``lower_is_better``).

The 1-minute load average is recorded at the start and the end (other work shares the cores).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson

from api.process import BrokerProcess
from benchmarks.cluster import Cluster, start_patiently
from benchmarks.consumers import (
    cpu_seconds,
    create_topic,
    produce_records,
    ws_latency,
    ws_push,
)
from benchmarks.http import json_body, run_wrk
from benchmarks.ratios import Ratio, alternate, plot, print_table

RECORD_BYTES = 100
SMALL_CONNECTIONS = 64
BATCH_CONNECTIONS = 8
LATENCY_RATE = 1_000
READ_TIMEOUT_S = 30.0  # any one read of the SSE client: a stalled stream, not a figure
_DATA = re.compile(rb"^data: (.*)$", re.M)


def load_average() -> float:
    return os.getloadavg()[0]


# -- forwarded vs leader produce ---------------------------------------------------------------


def _pid(cluster: Cluster, broker: int) -> int:
    proc = cluster.brokers[broker].proc
    assert proc is not None, f"broker {broker} is not running"
    return proc.pid


def _forward_pair(
    cluster: Cluster,
    topic: str,
    body: bytes,
    connections: int,
    records: int,
    rounds: int,
    seconds: float,
    workdir: Path,
) -> tuple[list[float], dict[str, Any]]:
    """Rounds of forwarded / leader records/s for ``body`` posted to ``topic``."""
    cluster.create_topic(topic, 3, 2)
    leader, leader_url = cluster.leader_url(topic)
    other = min(i for i in cluster.urls if i != leader)
    urls = {"leader": leader_url, "forwarded": cluster.urls[other]}
    path = f"/v1/topics/{topic}/records?acks=all"
    per_side: dict[str, list[float]] = {"leader": [], "forwarded": []}
    p99: dict[str, list[float]] = {"leader": [], "forwarded": []}
    # CPU of all 3 brokers per request: less at the mercy of the machine's load than rates.
    cpu_us: dict[str, list[float]] = {"leader": [], "forwarded": []}
    # ... and of each broker by its role (the partition's leader, the broker forwarding, the
    # third): where a forwarded request's extra CPU goes.
    third = next(i for i in cluster.urls if i not in (leader, other))
    roles = {"leader": leader, "forwarder": other, "third": third}
    pids_by_role = {role: _pid(cluster, broker) for role, broker in roles.items()}
    by_role: dict[str, dict[str, list[float]]] = {
        side: {role: [] for role in roles} for side in ("leader", "forwarded")
    }
    ratios = []
    for _, leader_first in alternate(rounds):
        got: dict[str, float] = {}
        for side in ("leader", "forwarded") if leader_first else ("forwarded", "leader"):
            cpu0_by_role = {role: cpu_seconds(pid) for role, pid in pids_by_role.items()}
            cpu0 = sum(cpu0_by_role.values())
            r = run_wrk(
                urls[side] + path,
                workdir,
                seconds=seconds,
                connections=connections,
                method="POST",
                body=body,
            )
            cpu1_by_role = {role: cpu_seconds(pid) for role, pid in pids_by_role.items()}
            cpu = sum(cpu1_by_role.values()) - cpu0
            got[side] = r.requests_per_s * records
            per_side[side].append(got[side])
            requests = r.requests_per_s * seconds
            cpu_us[side].append(cpu / requests * 1e6)
            for role in roles:
                spent = cpu1_by_role[role] - cpu0_by_role[role]
                by_role[side][role].append(spent / requests * 1e6)
            p99[side].append(r.latency_p99_ms)
        ratios.append(got["forwarded"] / got["leader"])
        print(
            f"  {topic}: leader {got['leader']:,.0f}, forwarded {got['forwarded']:,.0f} "
            f"records/s → {ratios[-1]:.2f}; CPU of the brokers {cpu_us['leader'][-1]:,.0f} vs "
            f"{cpu_us['forwarded'][-1]:,.0f} µs/request (load {load_average():.1f}); "
            + "; ".join(
                f"{side}: " + ", ".join(f"{role} {v[-1]:,.0f}" for role, v in by_role[side].items())
                for side in ("leader", "forwarded")
            ),
            flush=True,
        )
    detail = {
        "records_per_s": per_side,
        "p99_ms": p99,
        "brokers_cpu_us_per_request": cpu_us,
        "broker_cpu_us_per_request_by_role": by_role,
        "leader": leader,
        "forwarded_via": other,
        "connections": connections,
        "records_per_request": records,
    }
    return ratios, detail


def measure_cluster(rounds: int, seconds: float, workdir: Path) -> list[Ratio]:
    """Forwarded / leader produce, RF=3 acks=all, one small record and 1,000 records per
    request, on a 3-broker cluster started here (and stopped before returning)."""
    cluster = Cluster(workdir / "cluster", 3)
    try:
        cluster.start()
        small = orjson.dumps({"records": [{"value": "v" * (RECORD_BYTES - 2)}]})
        shapes = [
            ("push-fwd-small", small, SMALL_CONNECTIONS, 1, "one 100-byte record/request"),
            ("push-fwd-json", json_body(1000), BATCH_CONNECTIONS, 1000, "JSON 1,000 x 100 B"),
        ]
        out = []
        for topic, body, connections, records, label in shapes:
            load0 = load_average()
            values, detail = _forward_pair(
                cluster, topic, body, connections, records, rounds, seconds, workdir
            )
            detail["load_average"] = [load0, load_average()]
            leader = statistics.median(detail["records_per_s"]["leader"])
            forwarded = statistics.median(detail["records_per_s"]["forwarded"])
            cpu = {k: statistics.median(v) for k, v in detail["brokers_cpu_us_per_request"].items()}
            by_role = {
                side: "/".join(f"{statistics.median(v):,.0f}" for v in roles.values())
                for side, roles in detail["broker_cpu_us_per_request_by_role"].items()
            }
            out.append(
                Ratio(
                    f"forwarded / leader produce, {label}, RF=3 acks=all",
                    0.7,
                    values,
                    "produce sent to a follower (forwarded over h2c)",
                    "the same produce sent to the leader",
                    note=f"{connections} conns; {forwarded:,.0f} vs {leader:,.0f} records/s; "
                    f"brokers' CPU {cpu['forwarded']:,.0f} vs {cpu['leader']:,.0f} µs/request "
                    f"(leader/forwarder/third {by_role['forwarded']} vs {by_role['leader']})",
                    detail=detail,
                )
            )
        return out
    finally:
        cluster.stop()


# -- SSE vs WebSocket push ---------------------------------------------------------------------


async def sse_read(port: int, topic: str, total: int) -> tuple[float, int, int]:
    """Seconds to receive ``total`` records from offset 0 as Server-Sent Events, every event's
    data parsed; (seconds, records, stream bytes)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        start = time.perf_counter()
        writer.write(
            f"GET /v1/topics/{topic}/partitions/0/records?offset=0 HTTP/1.1\r\n"
            f"Host: 127.0.0.1:{port}\r\nAccept: text/event-stream\r\n\r\n".encode()
        )
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), READ_TIMEOUT_S)
        if not head.startswith(b"HTTP/1.1 200") or b"chunked" not in head.lower():
            raise RuntimeError(f"SSE answer: {head[:300]!r}")
        received = nbytes = 0
        rest = b""
        while received < total:
            size_line = await asyncio.wait_for(reader.readuntil(b"\r\n"), READ_TIMEOUT_S)
            size = int(size_line.split(b";", 1)[0], 16)
            if size == 0:
                raise RuntimeError(f"the stream ended after {received} records")
            chunk = await asyncio.wait_for(reader.readexactly(size + 2), READ_TIMEOUT_S)
            nbytes += size
            buf = rest + chunk[:-2] if rest else chunk[:-2]
            cut = buf.rfind(b"\n\n") + 2  # events end with a blank line; keep a partial one
            events, rest = buf[:cut], buf[cut:]
            data = _DATA.findall(events)
            if data:
                records = orjson.loads(b"[" + b",".join(data) + b"]")
                received += len(records)
        return time.perf_counter() - start, received, nbytes
    finally:
        writer.close()


def _timed(pid: int, run: Callable[[], tuple[float, int, int]]) -> dict[str, float]:
    cpu0 = cpu_seconds(pid)
    seconds, records, nbytes = run()
    cpu = cpu_seconds(pid) - cpu0
    return {
        "records_per_s": records / seconds,
        "mb_per_s": nbytes / seconds / 1e6,
        "broker_cpu_us_per_record": cpu / records * 1e6,
        "seconds": seconds,
    }


def measure_push(
    rounds: int,
    seconds: float,
    workdir: Path,
    records: int | None = None,
    *,
    latency_rate: int = LATENCY_RATE,
) -> list[Ratio]:
    """SSE / WebSocket JSON push (records/s) and produce → WebSocket p99, on one broker started
    here. ``records``: the backlog each push consumer reads (default: 150,000 per second of
    ``seconds``, at least 20,000); ``latency_rate``: records/s of the latency run (a smoke
    test lowers it)."""
    total = records or max(20_000, int(seconds * 150_000))
    broker = BrokerProcess(workdir / "push-broker")
    try:
        start_patiently(broker)
        assert broker.proc is not None
        pid = broker.proc.pid
        url = broker.url
        port = int(url.rsplit(":", 1)[1])
        create_topic(url, "push-backlog", 1)
        produced, _ = produce_records(url, "push-backlog", total)
        # One read of each kind first: the log's pages and the broker's code paths warm.
        asyncio.run(ws_push(url, "push-backlog", min(produced, 20_000), "json"))
        asyncio.run(sse_read(port, "push-backlog", min(produced, 20_000)))

        sides: dict[str, list[dict[str, float]]] = {"sse": [], "ws": []}
        push_rounds = []
        load0 = load_average()
        for _, ws_first in alternate(rounds):
            got = {}
            for side in ("ws", "sse") if ws_first else ("sse", "ws"):
                if side == "ws":
                    t = _timed(
                        pid, lambda: asyncio.run(ws_push(url, "push-backlog", produced, "json"))
                    )
                else:
                    t = _timed(pid, lambda: asyncio.run(sse_read(port, "push-backlog", produced)))
                sides[side].append(t)
                got[side] = t["records_per_s"]
            push_rounds.append(got["sse"] / got["ws"])
            print(
                f"  push: SSE {got['sse']:,.0f}, WebSocket JSON {got['ws']:,.0f} records/s "
                f"→ {push_rounds[-1]:.2f} (load {load_average():.1f})",
                flush=True,
            )
        push_load = [load0, load_average()]

        create_topic(url, "push-latency", 1)
        p99s: list[float] = []
        lat: list[dict[str, float]] = []
        load0 = load_average()
        failed: list[str] = []
        for _ in range(rounds):
            cpu0, t0 = cpu_seconds(pid), time.perf_counter()
            try:
                p50, p99, n = asyncio.run(
                    ws_latency(url, port, "push-latency", latency_rate, seconds)
                )
            except RuntimeError as e:  # the producer could not hold the rate: no figure
                failed.append(f"{e} (load {load_average():.1f})")
                print(f"  produce→WebSocket round not measured: {failed[-1]}", flush=True)
                continue
            cpu = (cpu_seconds(pid) - cpu0) / (time.perf_counter() - t0) * 100
            p99s.append(p99)
            lat.append({"p50_ms": p50, "p99_ms": p99, "records": n, "broker_cpu_percent": cpu})
            print(
                f"  produce→WebSocket: p50 {p50:.2f} ms, p99 {p99:.2f} ms over {n:,} records "
                f"(broker CPU {cpu:.0f} %, load {load_average():.1f})",
                flush=True,
            )
    finally:
        broker.stop()

    def med(side: str, key: str) -> float:
        return statistics.median(t[key] for t in sides[side])

    return [
        Ratio(
            "SSE / WebSocket JSON push, records/s, backlog from offset 0",
            0.5,
            push_rounds,
            "SSE stream (every event's data parsed)",
            "WebSocket JSON frames (every frame parsed)",
            note=f"{med('sse', 'records_per_s'):,.0f} vs {med('ws', 'records_per_s'):,.0f} "
            f"records/s; broker {med('sse', 'broker_cpu_us_per_record'):.2f} vs "
            f"{med('ws', 'broker_cpu_us_per_record'):.2f} µs/record",
            detail={"records": produced, "sides": sides, "load_average": push_load},
        ),
        Ratio(
            f"produce → WebSocket p99 at {latency_rate:,} records/s, one broker",
            5.0,
            p99s,
            unit="ms",
            lower_is_better=True,
            note=(f"p50 {statistics.median(x['p50_ms'] for x in lat):.2f} ms" if lat else "")
            + (f"; {len(failed)} round(s) not measured" if failed else ""),
            detail={"rounds": lat, "not_measured": failed, "load_average": [load0, load_average()]},
        ),
    ]


# -- the run -----------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--seconds", type=float, default=4.0)
    parser.add_argument("--json", help="write the ratios here")
    parser.add_argument("--plot", help="draw the ratios here (matplotlib)")
    parser.add_argument("--only", choices=["cluster", "push"])
    parser.add_argument("--data-dir", default="bench-data")
    args = parser.parse_args(argv)
    if args.only != "push" and shutil.which("wrk") is None:
        parser.error("the cluster part needs wrk: apt-get install -y wrk")
    base = Path(args.data_dir)
    base.mkdir(parents=True, exist_ok=True)
    workdir = Path(tempfile.mkdtemp(prefix="bench-push-", dir=base))
    started = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    load_start = load_average()
    ratios: list[Ratio] = []
    try:
        if args.only != "push":
            print("forwarded vs leader produce (3 brokers):", flush=True)
            ratios += measure_cluster(args.rounds, args.seconds, workdir)
        if args.only != "cluster":
            print("SSE vs WebSocket push, produce → WebSocket latency (1 broker):", flush=True)
            ratios += measure_push(args.rounds, args.seconds, workdir)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    print_table(ratios)
    loads = [load_start, load_average()]
    print(f"\n1-min load average {loads[0]:.2f} at the start, {loads[1]:.2f} at the end")
    if args.json:
        doc = {
            "date": started,
            "command": "python -m benchmarks.push "
            + " ".join(sys.argv[1:] if argv is None else argv),
            "cpus": os.cpu_count(),
            "load_average": loads,
            "settings": {"rounds": args.rounds, "seconds": args.seconds},
            "ratios": [r.as_dict() for r in ratios],
        }
        Path(args.json).write_text(json.dumps(doc, indent=2) + "\n")
    if args.plot:
        try:
            plot(ratios, Path(args.plot), "issue 14: forwarding and push, 2 cores, loopback")
        except ImportError:
            print("no plot: matplotlib is missing (pip install -e '.[bench]')")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
