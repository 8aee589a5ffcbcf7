"""ASGI servers for the broker's front door (issue 14): the bare app on each, side by side.

    python -m benchmarks.asgi_servers [--rounds 3] [--seconds 5] [--python VENV/bin/python]
                                      [--only uvicorn,granian-uvloop,...] [--json out.json]

Theory of operation
-------------------
The ceiling of one small request is the server's own cost: parsing a request head, handing
the body to the app, writing the answer. :mod:`benchmarks.bare_asgi` is the app (reads the
body, answers a fixed body of a produce answer's size); this module serves it with each
candidate server on its own port, all started before the first round, and drives each in turn
with ``wrk`` (:func:`benchmarks.http.run_wrk`): 64 connections, one 100-byte JSON record per
POST, as :mod:`benchmarks.per_request` does for the broker. Rounds alternate the order
(:func:`benchmarks.ratios.alternate`) so that the load of a shared 2-core machine, which moves
throughput by ±20 % between runs, falls on every candidate alike.

Two figures per candidate and round: requests/s, and the server's CPU time per request — the
utime + stime of the server process and its children from ``/proc`` (granian and hypercorn
serve from a worker process, and granian's Rust runtime runs in threads of it), divided by the
requests wrk completed. CPU per request is the steadier of the two when other jobs take the
cores; throughput also counts how well a server overlaps its work with wrk's.

Each candidate is reported as a :class:`~benchmarks.ratios.Ratio` against the broker's choice
(uvicorn, httptools, uvloop) with a target of 1.0: "as fast as what we run". Candidates whose
server or loop is not importable by the interpreter meant to run them are skipped with a line
saying so. uvicorn candidates run on this interpreter (the broker's, with the project's
dependencies for ``--broker-protocol``); granian and hypercorn on ``--python`` (a venv with
them installed; the repository is put on its ``PYTHONPATH``), defaulting to this one.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from api.process import free_port
from benchmarks.bare_asgi import ANSWER
from benchmarks.consumers import CLK_TCK
from benchmarks.http import json_body, run_wrk
from benchmarks.ratios import Ratio, alternate, print_table

CONNECTIONS = 64
BASELINE = "uvicorn-httptools-uvloop"
REPO = Path(__file__).resolve().parent.parent
APP = "benchmarks.bare_asgi:app"
START_TIMEOUT_S = 60.0


@dataclass(frozen=True)
class Candidate:
    """One server configuration: how to start it on a port, and what it needs to import."""

    name: str
    args: tuple[str, ...]  # after ``python -m``; ``{port}`` is replaced
    needs: tuple[str, ...]  # modules the interpreter must import
    project: bool  # run on this interpreter (uvicorn) rather than --python
    note: str = ""

    def argv(self, python: str, port: int) -> list[str]:
        return [python, "-m", *(a.replace("{port}", str(port)) for a in self.args)]


def _uvicorn(name: str, *extra: str, needs: tuple[str, ...], note: str) -> Candidate:
    args = ("benchmarks.bare_asgi", "--port", "{port}", *extra)
    return Candidate(name, args, ("uvicorn", *needs), True, note)


def _granian(loop: str, http: str, *extra: str, note: str = "") -> Candidate:
    name = f"granian-{loop}-h{http}" + "".join(f"-{e.lstrip('-')}" for e in extra if "=" not in e)
    args = (
        "granian",
        "--interface",
        "asgi",
        "--workers",
        "1",
        "--loop",
        loop,
        "--http",
        http,
        "--host",
        "127.0.0.1",
        "--port",
        "{port}",
        "--backlog",
        "2048",
        "--log-level",
        "warning",
        "--no-access-log",
        *extra,
        APP,
    )
    needs = ("granian",) + (() if loop == "asyncio" else (loop,))
    return Candidate(name, args, needs, False, note)


def _hypercorn(worker_class: str) -> Candidate:
    args = (
        "hypercorn",
        "--worker-class",
        worker_class,
        "--workers",
        "1",
        "--bind",
        "127.0.0.1:{port}",
        "--backlog",
        "2048",
        "--log-level",
        "warning",
        APP,
    )
    needs = ("hypercorn",) + (("uvloop",) if worker_class == "uvloop" else ())
    return Candidate(f"hypercorn-{worker_class}", args, needs, False, "h11; HTTP/2 on h2c/TLS")


CANDIDATES: tuple[Candidate, ...] = (
    _uvicorn(BASELINE, needs=("httptools", "uvloop"), note="the broker's choice"),
    _uvicorn(
        "uvicorn-httptools-asyncio",
        "--loop",
        "asyncio",
        needs=("httptools",),
        note="stdlib loop",
    ),
    _uvicorn("uvicorn-h11-uvloop", "--http", "h11", needs=("h11", "uvloop"), note="pure-Python"),
    _uvicorn(
        "uvicorn-broker-protocol",
        "--broker-protocol",
        needs=("httptools", "uvloop", "pydantic_settings"),
        note="api.connections: caps, timeouts",
    ),
    _granian("uvloop", "1", note="HTTP/1 only"),
    _granian("asyncio", "1"),
    _granian("rloop", "1", note="granian's Rust loop"),
    _granian("uvloop", "auto", note="default: HTTP/1 + h2c"),
    _granian("uvloop", "1", "--runtime-mode", "st", note="single-threaded runtime"),
    _hypercorn("uvloop"),
)


@dataclass
class Measured:
    candidate: Candidate
    requests_per_s: list[float] = field(default_factory=list)
    cpu_us_per_request: list[float] = field(default_factory=list)
    loads: list[float] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return {
            "name": self.candidate.name,
            "note": self.candidate.note,
            "requests_per_s": self.requests_per_s,
            "cpu_us_per_request": self.cpu_us_per_request,
            "load_average": self.loads,
            "median_requests_per_s": statistics.median(self.requests_per_s),
            "median_cpu_us_per_request": statistics.median(self.cpu_us_per_request),
        }


def tree_cpu_seconds(pid: int) -> float:
    """utime + stime of ``pid`` and its living descendants (threads included), from /proc."""
    total = 0.0
    todo = [pid]
    while todo:
        p = todo.pop()
        try:
            stat = Path(f"/proc/{p}/stat").read_text()
        except FileNotFoundError:
            continue
        fields = stat[stat.rindex(")") + 2 :].split()  # after "pid (comm) "
        total += (int(fields[11]) + int(fields[12])) / CLK_TCK  # fields 14 and 15 of proc(5)
        for task in Path(f"/proc/{p}/task").glob("*/children"):
            try:
                todo.extend(int(c) for c in task.read_text().split())
            except FileNotFoundError:
                continue
    return total


def missing_modules(python: str, modules: Sequence[str]) -> list[str]:
    """The modules ``python`` cannot import (run in a child so nothing is imported here)."""
    code = (
        "import importlib.util, sys\n"
        "print(' '.join(m for m in sys.argv[1:] if importlib.util.find_spec(m) is None))"
    )
    out = subprocess.run(
        [python, "-c", code, *modules], capture_output=True, text=True, timeout=60, check=True
    )
    return out.stdout.split()


@contextmanager
def serving(c: Candidate, python: str, workdir: Path) -> Iterator[tuple[str, int]]:
    """The candidate serving the bare app in a child process: (url, pid). Checks one answer."""
    port = free_port()
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH")) if p)
    log_path = workdir / f"{c.name}.log"
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            c.argv(python, port),
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
            cwd=REPO,
            start_new_session=True,  # granian and hypercorn fork workers: stop the group
        )
    url = f"http://127.0.0.1:{port}/"
    try:
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            try:
                answer = httpx.post(url, content=json_body(1), timeout=5)
                break
            except httpx.HTTPError:
                if time.monotonic() > deadline or proc.poll() is not None:
                    tail = log_path.read_text(errors="replace")[-2000:]
                    raise RuntimeError(f"{c.name} did not start:\n{tail}") from None
                time.sleep(0.2)
        if answer.status_code != 200 or answer.content != ANSWER:
            raise RuntimeError(f"{c.name} answered {answer.status_code} {answer.content[:200]!r}")
        yield url, proc.pid
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, 15)
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, 9)
                proc.wait(30)


def measure_once(url: str, pid: int, seconds: float, workdir: Path) -> tuple[float, float]:
    """(requests/s, server CPU µs per request) of one wrk run."""
    cpu0 = tree_cpu_seconds(pid)
    r = run_wrk(
        url, workdir, seconds=seconds, connections=CONNECTIONS, method="POST", body=json_body(1)
    )
    cpu = tree_cpu_seconds(pid) - cpu0
    requests = max(r.requests_per_s * max(1, round(seconds)), 1.0)
    return r.requests_per_s, cpu / requests * 1e6


def select(only: str | None) -> list[Candidate]:
    """Candidates whose name starts with one of the comma-separated prefixes (all if None);
    the baseline is always included."""
    if not only:
        return list(CANDIDATES)
    prefixes = [p.strip() for p in only.split(",") if p.strip()]
    return [
        c for c in CANDIDATES if c.name == BASELINE or any(c.name.startswith(p) for p in prefixes)
    ]


def measure(
    candidates: Sequence[Candidate],
    python: str,
    rounds: int,
    seconds: float,
    workdir: Path,
    warmup: float = 2.0,
) -> tuple[list[Measured], list[str]]:
    """Every available candidate, ``rounds`` alternating rounds after a ``warmup``-second run
    of each (0: none); also the skipped lines."""
    skipped: list[str] = []
    runnable: list[Candidate] = []
    for c in candidates:
        interpreter = sys.executable if c.project else python
        missing = missing_modules(interpreter, c.needs)
        if missing:
            line = f"{c.name}: skipped, {interpreter} cannot import {', '.join(missing)}"
            print(line, flush=True)
            skipped.append(line)
        else:
            runnable.append(c)
    results = {c.name: Measured(c) for c in runnable}
    with ExitStack() as stack:
        urls: dict[str, tuple[str, int]] = {}
        for c in runnable:
            interpreter = sys.executable if c.project else python
            urls[c.name] = stack.enter_context(serving(c, interpreter, workdir))
        for c in runnable if warmup > 0 else ():  # imports, first connections, caches
            measure_once(*urls[c.name], warmup, workdir)
        for k, forward in alternate(rounds):
            order = runnable if forward else list(reversed(runnable))
            for c in order:
                rate, cpu = measure_once(*urls[c.name], seconds, workdir)
                load = os.getloadavg()[0]
                m = results[c.name]
                m.requests_per_s.append(rate)
                m.cpu_us_per_request.append(cpu)
                m.loads.append(load)
                print(
                    f"  round {k + 1} {c.name:<34} {rate:>9,.0f} requests/s "
                    f"{cpu:7.1f} µs CPU/request (load {load:.1f})",
                    flush=True,
                )
    return list(results.values()), skipped


def ratios(measured: Sequence[Measured]) -> list[Ratio]:
    """Each candidate's requests/s against the baseline's, round by round."""
    base = next((m for m in measured if m.candidate.name == BASELINE), None)
    if base is None:
        return []
    out = []
    for m in measured:
        if m is base:
            continue
        cpu = statistics.median(m.cpu_us_per_request)
        base_cpu = statistics.median(base.cpu_us_per_request)
        out.append(
            Ratio(
                f"{m.candidate.name} / {BASELINE}",
                1.0,
                [a / b for a, b in zip(m.requests_per_s, base.requests_per_s, strict=True)],
                numerator=m.candidate.name,
                denominator=BASELINE,
                note=f"CPU/request {cpu:.0f} vs {base_cpu:.0f} µs",
                detail={
                    "requests_per_s": {
                        m.candidate.name: m.requests_per_s,
                        BASELINE: base.requests_per_s,
                    },
                    "cpu_us_per_request": {
                        m.candidate.name: m.cpu_us_per_request,
                        BASELINE: base.cpu_us_per_request,
                    },
                },
            )
        )
    return out


def print_servers(measured: Sequence[Measured]) -> None:
    print(f"\n{'server':<34} {'requests/s':>11} {'CPU µs/req':>11}  note")
    for m in measured:
        rate = statistics.median(m.requests_per_s)
        cpu = statistics.median(m.cpu_us_per_request)
        print(f"{m.candidate.name:<34} {rate:>11,.0f} {cpu:>11.1f}  {m.candidate.note}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=5)
    parser.add_argument(
        "--python",
        default=sys.executable,
        help="interpreter for granian and hypercorn (a venv with them installed)",
    )
    parser.add_argument("--only", help="comma-separated name prefixes (the baseline always runs)")
    parser.add_argument("--warmup", type=float, default=2.0, help="seconds per candidate; 0: none")
    parser.add_argument("--json")
    parser.add_argument("--data-dir", default="bench-data")
    args = parser.parse_args(argv)
    if shutil.which("wrk") is None:
        parser.error("wrk is not installed (apt-get install wrk)")
    candidates = select(args.only)
    base_dir = Path(args.data_dir)
    base_dir.mkdir(parents=True, exist_ok=True)
    workdir = Path(tempfile.mkdtemp(prefix="asgi-servers-", dir=base_dir))
    started = datetime.datetime.now(datetime.UTC)
    load_before = os.getloadavg()
    try:
        measured, skipped = measure(
            candidates, args.python, args.rounds, args.seconds, workdir, args.warmup
        )
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    print_servers(measured)
    found = ratios(measured)
    print_table(found)
    for line in skipped:
        print(line)
    load_after = os.getloadavg()
    print(f"load average: {load_before[0]:.1f} at start, {load_after[0]:.1f} at end")
    if args.json:
        out: dict[str, Any] = {
            "date": started.strftime("%Y-%m-%d %H:%M UTC"),
            "cpus": os.cpu_count(),
            "load_average": {"start": load_before[0], "end": load_after[0]},
            "rounds": args.rounds,
            "seconds": args.seconds,
            "connections": CONNECTIONS,
            "baseline": BASELINE,
            "servers": [m.as_dict() for m in measured],
            "skipped": skipped,
            "ratios": [r.as_dict() for r in found],
        }
        Path(args.json).write_text(json.dumps(out, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
