"""``logbus bench``: the single-broker HTTP service, measured against this machine's own limits.

One run measures, on loopback with 100-byte records:

* the limits: raw sequential file append (no fsync) and loopback TCP copy;
* binary batch produce (1 MiB batches, acks=1), JSON produce (1,000 records per request),
  one small JSON record per request over 64 connections (acks=1 and acks=all);
* binary fetch from page cache, JSON fetch;
* produce → long-poll consumer latency p50/p99 at 1,000 records/s.

Request-rate and throughput runs use ``wrk`` (C, one thread: the server keeps the other core);
the latency run is an asyncio client. Every figure is printed with its target and its ratio to
the machine limit. ``--json`` saves them, ``--plot`` draws them.

``--url`` may list several brokers of a cluster, comma-separated: the setup (topics) goes
through :class:`logbus_client.routing.Router` (any broker, retried), and every measurement is
aimed at the leader of its topic's partition with ``Logbus-Route: direct``, so a forwarding
hop never enters a figure (a 421 would count as a failed request and stop the run).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import shutil
import socket
import statistics
import subprocess
import tempfile
import threading
import time
import urllib.parse
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import httpx
import orjson

from api.process import BrokerProcess
from benchmarks.storage import batch_records, build_fitting_batch

RECORD_BYTES = 100
MIB = 1024 * 1024


@dataclass
class Figure:
    name: str
    value: float
    unit: str
    target: float | None = None
    limit_name: str | None = None
    ratio_to_limit: float | None = None
    note: str = ""

    @property
    def met(self) -> bool | None:
        if self.target is None:
            return None
        if self.unit.startswith("ms"):
            return self.value <= self.target
        return self.value >= self.target


# -- machine limits ----------------------------------------------------------------------------


def raw_append_mb_s(directory: Path, total_bytes: int = 1024 * MIB) -> float:
    """Sequential 1 MiB writes to a new file, no fsync: the disk/page-cache append limit."""
    buf = os.urandom(MIB)
    path = directory / "raw-append.bin"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        start = time.perf_counter()
        for _ in range(total_bytes // MIB):
            os.write(fd, buf)
        elapsed = time.perf_counter() - start
    finally:
        os.close(fd)
        path.unlink()
    return total_bytes / elapsed / 1e6


def loopback_mb_s(total_bytes: int = 2048 * MIB) -> float:
    """TCP copy over 127.0.0.1 with 1 MiB sends: the network path's limit here."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(1)
    port = server.getsockname()[1]

    def sink() -> None:
        conn, _ = server.accept()
        with conn:
            while conn.recv(4 * MIB):
                pass

    t = threading.Thread(target=sink, daemon=True)
    t.start()
    buf = b"\0" * MIB
    with socket.create_connection(("127.0.0.1", port)) as c:
        start = time.perf_counter()
        for _ in range(total_bytes // MIB):
            c.sendall(buf)
        c.shutdown(socket.SHUT_WR)
        t.join()
        elapsed = time.perf_counter() - start
    server.close()
    return total_bytes / elapsed / 1e6


# -- wrk ---------------------------------------------------------------------------------------

_LUA = """
wrk.method = "{method}"
wrk.headers["Content-Type"] = "{content_type}"
wrk.headers["Accept"] = "{accept}"
{route}
{extra}
{body}
"""


@dataclass
class WrkResult:
    requests_per_s: float
    latency_p50_ms: float
    latency_p99_ms: float
    errors: int


def run_wrk(
    url: str,
    workdir: Path,
    *,
    seconds: float,
    connections: int,
    method: str = "GET",
    body: bytes | None = None,
    content_type: str = "application/json",
    accept: str = "application/json",
    direct: bool = False,
    headers: Mapping[str, str] | None = None,
) -> WrkResult:
    """``headers``: more request headers (e.g. ``Authorization``), sent on every request."""
    body_lua = ""
    if body is not None:
        body_path = workdir / f"body-{len(body)}-{hash(body) & 0xFFFF}.bin"
        body_path.write_bytes(body)
        body_lua = f'local f = io.open("{body_path}", "rb")\nwrk.body = f:read("*all")\nf:close()'
    script = workdir / "bench.lua"
    script.write_text(
        _LUA.format(
            method=method,
            content_type=content_type,
            accept=accept,
            body=body_lua,
            route='wrk.headers["Logbus-Route"] = "direct"' if direct else "",
            extra="\n".join(
                f"wrk.headers[{_lua_string(k)}] = {_lua_string(v)}"
                for k, v in (headers or {}).items()
            ),
        )
    )
    cmd = [
        "wrk",
        "-t1",
        f"-c{connections}",
        f"-d{max(1, round(seconds))}s",
        "--latency",
        "--timeout",
        "10s",
        "-s",
        str(script),
        url,
    ]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=seconds + 60).stdout
    rps = float(re.search(r"Requests/sec:\s+([\d.]+)", out)[1])  # type: ignore[index]
    errors = sum(int(n) for n in re.findall(r"Non-2xx or 3xx responses:\s+(\d+)", out))
    errors += sum(int(n) for n in re.findall(r"(?:connect|read|write|timeout) (\d+)", out))
    if errors:
        raise RuntimeError(f"wrk saw {errors} failed requests to {url}:\n{out}")
    return WrkResult(rps, _wrk_percentile(out, "50%"), _wrk_percentile(out, "99%"), errors)


def _lua_string(text: str) -> str:
    """A Lua string literal of ``text`` (header names and values: printable ASCII)."""
    if not text.isprintable() or not text.isascii():
        raise ValueError(f"not a printable ASCII header: {text[:40]!r}")
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _wrk_percentile(out: str, label: str) -> float:
    m = re.search(rf"^\s+{label}\s+([\d.]+)(us|ms|s)", out, re.M)
    if m is None:
        return float("nan")
    scale = {"us": 0.001, "ms": 1.0, "s": 1000.0}[m[2]]
    return float(m[1]) * scale


# -- payloads ----------------------------------------------------------------------------------


def binary_batch(size_bytes: int = MIB) -> tuple[bytes, int]:
    """The largest uncompressed batch of 100-byte records within ``size_bytes``; (batch, count)."""
    batch = build_fitting_batch(size_bytes // RECORD_BYTES, limit=size_bytes)
    return batch, batch_records(batch)


def json_body(n: int) -> bytes:
    # A 100-byte value: a JSON string of 98 characters plus its quotes.
    value = "v" * (RECORD_BYTES - 2)
    return orjson.dumps({"records": [{"value": value} for _ in range(n)]})


# -- latency -----------------------------------------------------------------------------------


PRODUCERS = 4  # producer connections of the latency run


async def produce_to_consume_latency(
    base: str, topic: str, rate_per_s: int, seconds: float, direct: bool = False
) -> tuple[float, float, int]:
    """p50/p99 (ms) from sending a record to a long-polling consumer receiving it (``base``:
    the partition's leader on loopback; ``direct``: say so, so that no broker forwards).

    One record per produce at ``rate_per_s``, each of :data:`PRODUCERS` keep-alive
    connections sending every PRODUCERS-th record on its schedule, and one consumer
    long-polling from the partition's end; all raw HTTP/1.1 (:class:`benchmarks.transactions.
    Conn`): one connection waiting for each answer in turn could not hold 1,000/s, and httpx's
    own ≈ 0.5 ms a request, in the same process as the consumer, counted as latency."""
    from benchmarks.transactions import Conn

    port = urllib.parse.urlsplit(base).port or 80
    route = {"Logbus-Route": "direct"} if direct else {}
    sent: dict[int, float] = {}
    latencies: list[float] = []
    stop = asyncio.Event()
    records = f"/v1/topics/{topic}/partitions/0/records"
    poller = await Conn(port).open()
    producers = [await Conn(port).open() for _ in range(PRODUCERS)]
    try:
        _, body = await poller.request(
            "GET", f"/v1/topics/{topic}/partitions/0/offsets", b"", route
        )
        start_offset = orjson.loads(body)["offset"]

        async def consume() -> None:
            offset = start_offset
            while not stop.is_set() or offset < start_offset + len(sent):
                _, answer = await poller.request(
                    "GET", f"{records}?offset={offset}&wait_ms=1000", b"", route
                )
                now = time.perf_counter()
                doc = orjson.loads(answer)
                for rec in doc["records"]:
                    seq = rec["value"]["seq"]
                    if seq in sent:
                        latencies.append((now - sent[seq]) * 1000)
                offset = doc["next_offset"]
                if stop.is_set() and not doc["records"]:
                    break

        consumer = asyncio.create_task(consume())
        await asyncio.sleep(0.2)
        interval = 1 / rate_per_s
        total = int(seconds * rate_per_s)
        headers = {"Content-Type": "application/json", **route}
        t0 = time.perf_counter()

        async def produce(conn: Conn, first: int) -> None:
            for seq in range(first, total, PRODUCERS):
                delay = t0 + seq * interval - time.perf_counter()
                if delay > 0:
                    await asyncio.sleep(delay)
                body = b'{"records":[{"value":{"seq":%d}}]}' % seq
                sent[seq] = time.perf_counter()
                status, _ = await conn.request(
                    "POST", f"/v1/topics/{topic}/records?acks=1", body, headers
                )
                if status != 200:
                    raise RuntimeError(f"produce answered {status}")

        await asyncio.gather(*(produce(c, k) for k, c in enumerate(producers)))
        stop.set()
        await asyncio.wait_for(consumer, 30)
    finally:
        for c in (poller, *producers):
            await c.close()
    latencies.sort()
    p50 = statistics.median(latencies)
    p99 = latencies[min(len(latencies) - 1, int(len(latencies) * 0.99))]
    return p50, p99, len(latencies)


# -- the run -----------------------------------------------------------------------------------


TOPICS = ("bench-bin", "bench-json", "bench-small", "bench-small-all", "bench-lat")


def prepare(urls: str) -> tuple[dict[str, str], bool]:
    """(Re)create the benchmark's topics through any broker; each topic's partition-0 leader
    URL (the broker given, on one broker), and whether that is a cluster."""
    from logbus_client.routing import Router

    leaders: dict[str, str] = {}
    with Router(urls, timeout=60) as router:
        for name in TOPICS:
            router.request("DELETE", f"/v1/topics/{name}", idempotent=True)
            r = router.request("POST", "/v1/topics", idempotent=False, json={"name": name})
            r.raise_for_status()
        for name in TOPICS:
            leaders[name] = router.leader_url(name, 0) or router.view.home
        return leaders, bool(router.view.clustered)


def run(url: str, workdir: Path, seconds: float, raw_mb_s: float, loop_mb_s: float) -> list[Figure]:
    figures: list[Figure] = []
    leader, direct = prepare(url)

    batch, batch_records = binary_batch()
    r = run_wrk(
        f"{leader['bench-bin']}/v1/topics/bench-bin/partitions/0/records?acks=1",
        workdir,
        seconds=seconds,
        connections=4,
        method="POST",
        body=batch,
        content_type="application/vnd.logbus.batch",
        direct=direct,
    )
    mb_s = r.requests_per_s * len(batch) / 1e6
    figures.append(
        Figure(
            "binary produce, 1 MiB batches, acks=1",
            mb_s,
            "MB/s",
            300,
            "raw disk append",
            mb_s / raw_mb_s,
            f"{r.requests_per_s * batch_records:,.0f} records/s",
        )
    )

    body = json_body(1000)
    r = run_wrk(
        f"{leader['bench-json']}/v1/topics/bench-json/records",
        workdir,
        seconds=seconds,
        connections=8,
        method="POST",
        body=body,
        direct=direct,
    )
    figures.append(
        Figure(
            "JSON produce, 1,000 records/request, acks=all",
            r.requests_per_s * 1000,
            "records/s",
            300_000,
            note=f"{r.requests_per_s:,.0f} requests/s, p99 {r.latency_p99_ms:.1f} ms",
        )
    )

    small = orjson.dumps({"records": [{"value": "v" * (RECORD_BYTES - 2)}]})
    for acks, topic in (("1", "bench-small"), ("all", "bench-small-all")):
        r = run_wrk(
            f"{leader[topic]}/v1/topics/{topic}/records?acks={acks}",
            workdir,
            seconds=seconds,
            connections=64,
            method="POST",
            body=small,
            direct=direct,
        )
        figures.append(
            Figure(
                f"one JSON record/request, 64 connections, acks={acks}",
                r.requests_per_s,
                "requests/s",
                8000,
                note=f"p50 {r.latency_p50_ms:.1f} ms, p99 {r.latency_p99_ms:.1f} ms",
            )
        )

    fetch_url = (
        f"{leader['bench-bin']}/v1/topics/bench-bin/partitions/0/records?offset=0&max_bytes={MIB}"
    )
    route = {"logbus-route": "direct"} if direct else {}
    size = len(
        httpx.get(fetch_url, headers={"accept": "application/vnd.logbus.batch", **route}).content
    )
    r = run_wrk(
        fetch_url,
        workdir,
        seconds=seconds,
        connections=4,
        accept="application/vnd.logbus.batch",
        direct=direct,
    )
    mb_s = r.requests_per_s * size / 1e6
    figures.append(
        Figure(
            "binary fetch from page cache",
            mb_s,
            "MB/s",
            1000,
            "loopback TCP",
            mb_s / loop_mb_s,
            f"{size / MIB:.2f} MiB per response",
        )
    )

    fetch_url = (
        f"{leader['bench-json']}/v1/topics/bench-json/partitions/0/records"
        "?offset=0&max_records=1000"
    )
    got = len(httpx.get(fetch_url, headers=route).json()["records"])
    r = run_wrk(fetch_url, workdir, seconds=seconds, connections=4, direct=direct)
    figures.append(
        Figure(
            "JSON fetch",
            r.requests_per_s * got,
            "records/s",
            500_000,
            note=f"{got} records per response",
        )
    )

    p50, p99, n = asyncio.run(
        produce_to_consume_latency(leader["bench-lat"], "bench-lat", 1000, seconds, direct)
    )
    figures.append(Figure("produce→long-poll latency p50 at 1,000 records/s", p50, "ms"))
    figures.append(
        Figure(
            "produce→long-poll latency p99 at 1,000 records/s", p99, "ms", 10, note=f"{n} records"
        )
    )
    return figures


def print_table(figures: list[Figure], limits: dict[str, float]) -> None:
    print("\nmachine limits: " + ", ".join(f"{k} {v:,.0f} MB/s" for k, v in limits.items()))
    print(f"{'measure':<58} {'value':>14} {'unit':<11} {'target':>9} {'met':>4}  ratio / note")
    for f in figures:
        met = {True: "yes", False: "NO", None: ""}[f.met]
        target = "" if f.target is None else f"{f.target:,.0f}"
        ratio = f"{f.ratio_to_limit:.0%} of {f.limit_name}; " if f.ratio_to_limit else ""
        print(f"{f.name:<58} {f.value:>14,.1f} {f.unit:<11} {target:>9} {met:>4}  {ratio}{f.note}")


def plot(figures: Sequence[Any], path: Path, title: str = "") -> None:
    """Each figure with a target as achieved / target (target / achieved where lower is
    better: latency, memory, CPU); green meets the target."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    targeted = [f for f in figures if f.target]
    fig, ax = plt.subplots(figsize=(11, 0.6 * len(targeted) + 1.5))
    names = [f.name for f in targeted]
    ratios = [
        f.target / f.value
        if getattr(f, "lower_is_better", f.unit.startswith("ms"))
        else f.value / f.target
        for f in targeted
    ]
    colors = ["tab:green" if r >= 1 else "tab:red" for r in ratios]
    ax.barh(names, ratios, color=colors)
    if max(ratios) > 20 * max(min(ratios), 1e-9):
        ax.set_xscale("log")  # ratios spanning orders of magnitude stay readable
    ax.axvline(1.0, color="black", linestyle="--", linewidth=1)
    ax.set_xlabel("achieved / target (≥ 1 meets the target; lower-is-better: target / achieved)")
    for i, f in enumerate(targeted):
        shown = f"{f.value:,.0f}" if f.value >= 100 else f"{f.value:.3g}"
        ax.text(ratios[i], i, f"  {shown} {f.unit}", va="center", fontsize=8)
    ax.invert_yaxis()
    ax.set_title(title or "logbus bench: single broker on loopback, 2 cores", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def run_bench(args: argparse.Namespace) -> int:
    if shutil.which("wrk") is None:
        print("logbus bench needs wrk: apt-get install -y wrk", flush=True)
        return 2
    seconds = float(getattr(args, "seconds", None) or 5)
    base_dir = Path(getattr(args, "data_dir", None) or "bench-data")
    base_dir.mkdir(parents=True, exist_ok=True)
    workdir = Path(tempfile.mkdtemp(prefix="bench-", dir=base_dir))
    try:
        raw = raw_append_mb_s(workdir)
        loop = loopback_mb_s()
        limits = {"raw disk append": raw, "loopback TCP": loop}
        broker = None
        url = getattr(args, "url", None)
        if not url:
            broker = BrokerProcess(workdir / "data").start()
            url = broker.url
        try:
            figures = run(url, workdir, seconds, raw, loop)
        finally:
            if broker is not None:
                broker.stop()
        print_table(figures, limits)
        out: dict[str, Any] = {
            "date": time.strftime("%Y-%m-%d %H:%M"),
            "cpus": os.cpu_count(),
            "limits_mb_s": limits,
            "figures": [asdict(f) | {"met": f.met} for f in figures],
        }
        if getattr(args, "json", None):
            Path(args.json).write_text(json.dumps(out, indent=2))
        if getattr(args, "plot", None):
            plot(figures, Path(args.plot))
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", help="a broker, or several of a cluster comma-separated")
    parser.add_argument("--seconds", type=float, default=5)
    parser.add_argument("--json")
    parser.add_argument("--plot")
    parser.add_argument("--data-dir")
    return run_bench(parser.parse_args())


if __name__ == "__main__":
    raise SystemExit(main())
