"""Per-request cost (issue 14): every ratio measured side by side in one run, with its target.

    python -m benchmarks.per_request [--rounds 5] [--seconds 4] [--only small,latency,...]
                                     [--json docs/bench-per-request.json]
                                     [--plot docs/bench-per-request.png]

``make bench`` runs it after ``logbus bench``. The parts (``--only``):

* **small** — one 100-byte JSON record per request, 64 connections, ``wrk`` (C, one thread):
  a bare ASGI app (:mod:`benchmarks.bare_asgi`: reads the body, answers a fixed body of a
  produce answer's size, on uvicorn with the broker's protocol choices) against a broker
  with ``acks=1``; the same broker with ``acks=all`` against ``acks=1``; and a broker with
  authentication (``--auth``, an API key, the 100 ACLs of :mod:`benchmarks.auth`) and a
  quota that never throttles against the broker without, both ``acks=1``. Each round runs
  the four in turn, in the opposite order every other round, each on a fresh topic; each
  ratio is the median of the rounds'. The broker's CPU time per request (from ``/proc``,
  steadier than throughput on a shared machine) is in each ratio's detail. Five rounds by
  default: on this shared VM a round now and then costs a server ≈ 20 % more CPU (seen on
  one broker alone, one round of eight), and with three rounds two such rounds moved a
  median.
* **latency** — produce → long-poll consumer at 1,000 records/s, one record per produce
  (:func:`benchmarks.http.produce_to_consume_latency`): the p99 of each round against 10 ms.
* **redis** — JSON produce and consume against Redis Streams (:mod:`benchmarks.redis_peer`).
* **push** — SSE against WebSocket push, and produce → WebSocket latency
  (:mod:`benchmarks.push`).
* **cluster** — a produce forwarded by a broker that does not lead the partition against the
  same produce sent to the leader (:mod:`benchmarks.push`).

Output: one table of every ratio (median, target, met/missed, the rounds), ``--json`` and
``--plot`` (:mod:`benchmarks.ratios`).
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx

from api.process import BrokerProcess, free_port
from auth_quotas.credentials import generate_api_key
from benchmarks import auth as bench_auth
from benchmarks.cluster import running, start_patiently
from benchmarks.consumers import cpu_seconds
from benchmarks.http import produce_to_consume_latency, run_wrk
from benchmarks.ratios import Ratio, alternate, plot, print_table

SMALL_TARGET = 0.5  # Logbus acks=1 ÷ bare ASGI app
ACKS_ALL_TARGET = 0.8  # acks=all ÷ acks=1
AUTH_TARGET = 0.9  # API key + quota ÷ no authentication
LONG_POLL_P99_MS = 10.0
SMALL_CONNECTIONS = 64
PARTS = ("small", "latency", "redis", "push", "cluster")


@contextmanager
def bare_app(workdir: Path, broker_protocol: bool = False) -> Iterator[tuple[str, int]]:
    """The bare ASGI app as a child process: (url, pid). ``broker_protocol``: served with the
    broker's HTTP protocol (:mod:`api.connections`: its timeouts and one write per answer)
    instead of uvicorn's own."""
    port = free_port()
    name = "bare-asgi-proto.log" if broker_protocol else "bare-asgi.log"
    log = open(workdir / name, "wb")  # noqa: SIM115 - handed to the child
    extra = ["--broker-protocol"] if broker_protocol else []
    proc = subprocess.Popen(
        [sys.executable, "-m", "benchmarks.bare_asgi", "--port", str(port), *extra],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    log.close()
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                httpx.post(url + "/", content=b"{}", timeout=5)
                break
            except httpx.HTTPError:
                if time.monotonic() > deadline or proc.poll() is not None:
                    raise RuntimeError(f"the bare ASGI app did not start: {workdir}") from None
                time.sleep(0.2)
        yield url, proc.pid
    finally:
        proc.terminate()
        proc.wait(30)


def _auth_broker(workdir: Path, admin_key: str) -> bench_auth.Broker:
    """A broker with ``--auth``, the benchmark user's key and 100 ACLs, and a quota for the
    user and client id that never throttles (those of :mod:`benchmarks.auth`)."""
    root = workdir / "auth_quota"
    root.mkdir(parents=True)
    process = BrokerProcess(root / "data", None, "--auth", env={"LOGBUS_BOOTSTRAP_KEY": admin_key})
    admin = {"Authorization": f"Bearer {admin_key}"}
    return bench_auth.Broker("auth_quota", process, admin, {})


def _configure_auth(b: bench_auth.Broker) -> None:
    with httpx.Client(base_url=b.url, headers=b.admin, timeout=bench_auth.TIMEOUT_S) as c:
        user = bench_auth._check(c.post("/v1/users", json={"name": bench_auth.USER}), "user")
        bench_auth._check(c.post("/v1/acls", json=bench_auth.bench_acls(100)), "ACLs")
        entity = {"user": bench_auth.USER, "client_id": bench_auth.CLIENT_ID}
        body = {"entity": entity, "quotas": dict(bench_auth.NEVER_THROTTLES)}
        bench_auth._check(c.put("/v1/quotas", json=body), "quota")
    b.headers = {"Authorization": f"Bearer {user.json()['key']}"}
    b.headers["Logbus-Client-Id"] = bench_auth.CLIENT_ID


def measure_small(rounds: int, seconds: float, workdir: Path) -> list[Ratio]:
    """Bare app, acks=1, acks=all and API key + quota, one small record per request."""
    admin_key = generate_api_key().token
    root = workdir / "none"
    root.mkdir(parents=True)
    plain = bench_auth.Broker("none", BrokerProcess(root / "data"), {}, {})
    secured = _auth_broker(workdir, admin_key)
    small = bench_auth.loads()["small"]
    rates: dict[str, list[float]] = {}
    cpus: dict[str, list[float]] = {}
    with (
        bare_app(workdir) as (bare_url, bare_pid),
        bare_app(workdir, broker_protocol=True) as (proto_url, proto_pid),
        running(plain.process, secured.process),
    ):
        for b in (plain, secured):
            start_patiently(b.process)
        _configure_auth(secured)
        plain.headers = dict(secured.headers)  # the same header bytes; ignored without auth
        seq = 0

        def logbus(b: bench_auth.Broker, acks: str) -> Callable[[float], tuple[float, float]]:
            def run(s: float) -> tuple[float, float]:
                nonlocal seq
                seq += 1
                m = bench_auth.produce(
                    b, f"{bench_auth.TOPIC_PREFIX}small-{seq}", small, s, acks, workdir, "wrk"
                )
                return m.requests_per_s, m.cpu_us_per_request

            return run

        def bare_at(url: str, pid: int) -> Callable[[float], tuple[float, float]]:
            def bare(s: float) -> tuple[float, float]:
                cpu0 = cpu_seconds(pid)
                r = run_wrk(
                    url + "/",
                    workdir,
                    seconds=s,
                    connections=SMALL_CONNECTIONS,
                    method="POST",
                    body=small.body,
                )
                cpu = cpu_seconds(pid) - cpu0
                return r.requests_per_s, cpu / max(r.requests_per_s * max(1, round(s)), 1) * 1e6

            return bare

        sides: dict[str, Callable[[float], tuple[float, float]]] = {
            "bare": bare_at(bare_url, bare_pid),
            "bare_proto": bare_at(proto_url, proto_pid),
            "acks1": logbus(plain, "1"),
            "acks_all": logbus(plain, "all"),
            "auth_quota": logbus(secured, "1"),
        }
        for name, side in sides.items():  # warm-up: first key checks, page cache, imports
            side(min(seconds, 2.0))
            rates[name], cpus[name] = [], []
        for k, forward in alternate(rounds):
            order = list(sides) if forward else list(reversed(sides))
            for name in order:
                rate, cpu = sides[name](seconds)
                rates[name].append(rate)
                cpus[name].append(cpu)
                print(
                    f"  small round {k + 1} {name:10} {rate:>9,.0f} requests/s, "
                    f"{cpu:6.1f} µs CPU/request (load {os.getloadavg()[0]:.1f})",
                    flush=True,
                )

    def ratio(name: str, num: str, den: str, target: float | None, note: str) -> Ratio:
        return Ratio(
            name,
            target,
            [a / b for a, b in zip(rates[num], rates[den], strict=True)],
            numerator=num,
            denominator=den,
            note=note,
            detail={
                "requests_per_s": {num: rates[num], den: rates[den]},
                "cpu_us_per_request": {num: cpus[num], den: cpus[den]},
            },
        )

    def cpu_note(num: str, den: str) -> str:
        a = sorted(cpus[num])[len(cpus[num]) // 2]
        b = sorted(cpus[den])[len(cpus[den]) // 2]
        return f"CPU/request {a:.0f} vs {b:.0f} µs"

    return [
        ratio(
            "1 record/request, 64 conns: Logbus acks=1 / bare ASGI app",
            "acks1",
            "bare",
            SMALL_TARGET,
            cpu_note("acks1", "bare"),
        ),
        ratio(
            "1 record/request, 64 conns: acks=1 / bare, broker's protocol (extra)",
            "acks1",
            "bare_proto",
            None,  # shown for what it tells: the target is against uvicorn's own protocol
            cpu_note("acks1", "bare_proto"),
        ),
        ratio(
            "1 record/request, 64 conns: acks=all / acks=1",
            "acks_all",
            "acks1",
            ACKS_ALL_TARGET,
            cpu_note("acks_all", "acks1"),
        ),
        ratio(
            "1 record/request, 64 conns: API key + quota / no auth",
            "auth_quota",
            "acks1",
            AUTH_TARGET,
            cpu_note("auth_quota", "acks1"),
        ),
    ]


def measure_latency(rounds: int, seconds: float, workdir: Path) -> list[Ratio]:
    """Produce → long-poll p99 at 1,000 records/s, one record per produce, per round."""
    root = workdir / "latency"
    root.mkdir(parents=True)
    p99s: list[float] = []
    p50s: list[float] = []
    with running(b := BrokerProcess(root / "data")):
        start_patiently(b)
        httpx.post(b.url + "/v1/topics", json={"name": "lat"}, timeout=60).raise_for_status()
        for k in range(rounds):
            p50, p99, n = asyncio.run(
                produce_to_consume_latency(b.url, "lat", 1000, seconds, False)
            )
            p50s.append(p50)
            p99s.append(p99)
            print(f"  latency round {k + 1}: p50 {p50:.2f} ms, p99 {p99:.2f} ms ({n} records)")
    return [
        Ratio(
            "produce → long-poll p99 at 1,000 records/s",
            LONG_POLL_P99_MS,
            p99s,
            unit="ms",
            lower_is_better=True,
            note=f"p50 {sorted(p50s)[len(p50s) // 2]:.2f} ms",
            detail={"p50_ms": p50s},
        )
    ]


def _parts() -> dict[str, Callable[[int, float, Path], list[Ratio]]]:
    from benchmarks import push, redis_peer

    parts: dict[str, Callable[[int, float, Path], list[Ratio]]] = {
        "small": measure_small,
        "latency": measure_latency,
        "redis": redis_peer.measure,
        "push": push.measure_push,
        "cluster": push.measure_cluster,
    }
    return parts


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--seconds", type=float, default=4)
    parser.add_argument("--only", default=",".join(PARTS), help="comma-separated parts")
    parser.add_argument("--json")
    parser.add_argument("--plot")
    parser.add_argument("--data-dir", default="bench-data")
    args = parser.parse_args(argv)
    parts = _parts()
    wanted = [p.strip() for p in args.only.split(",") if p.strip()]
    unknown = [p for p in wanted if p not in PARTS]
    if unknown:
        parser.error(f"unknown parts {unknown}; choose from {', '.join(PARTS)}")
    base = Path(args.data_dir)
    base.mkdir(parents=True, exist_ok=True)
    workdir = Path(tempfile.mkdtemp(prefix="per-request-", dir=base))
    started = datetime.datetime.now(datetime.UTC)
    load_before = os.getloadavg()
    ratios: list[Ratio] = []
    failed: list[str] = []
    try:
        for name in wanted:
            if name not in parts:
                print(f"{name}: not available in this build", flush=True)
                continue
            print(f"== {name}", flush=True)
            part_dir = workdir / name
            part_dir.mkdir()
            try:
                ratios.extend(parts[name](args.rounds, args.seconds, part_dir))
            except Exception as e:  # one part's failure leaves the others' figures
                print(f"{name}: failed: {e!r}", flush=True)
                failed.append(name)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    print_table(ratios)
    out: dict[str, Any] = {
        "date": started.strftime("%Y-%m-%d %H:%M UTC"),
        "cpus": os.cpu_count(),
        "load_average": {"start": load_before[0], "end": os.getloadavg()[0]},
        "rounds": args.rounds,
        "seconds": args.seconds,
        "ratios": [r.as_dict() for r in ratios],
        "failed_parts": failed,
    }
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=2) + "\n")
    if args.plot and ratios:
        plot(ratios, Path(args.plot), f"Per-request cost, {out['date']} (2 vCPUs)")
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
