"""What a quota, or authentication with 100 ACLs, costs a one-record produce, in instructions
(issue 12: "quota enforcement costs ≤ 5 %", "auth + 100 ACLs ≥ 0.90 x no auth"), measured
where throughput ratios are too noisy to tell 5 % from 10 %.

    python -m benchmarks.auth_callgrind [--mode quota|auth] [--seconds 15] [--connections 16]

Needs ``valgrind`` (Debian's package) and ``wrk``. Brokers run under callgrind with
instrumentation off; wrk sends one-record produces (``benchmarks.auth``'s small load) for
``--seconds`` per phase, instrumentation on only during a phase. Instructions per request =
(the phase's total, from ``callgrind_control``'s dump, less the broker's background work over
the phase's duration) ÷ the records it appended (the partition's high-watermark delta).

* ``--mode quota``: one ``logbus serve --auth`` broker, a user with 100 ACLs (those of
  :mod:`benchmarks.auth`) and a quota for the client id ``bench-client`` that never
  throttles. Phases alternate between the client id ``free-client`` (no quota applies: the
  gate's no-quota path) and ``bench-client`` (measured, timed, answered with the throttle
  fields). Same process, same state, same requests apart from one header value: the
  difference is the quota path, including what it costs uvicorn (its response fields) and
  the event loop. Ratio: free ÷ quota (target ≥ 0.95).
* ``--mode auth``: two brokers side by side, one without authentication and one with
  ``--auth`` and the user's 100 ACLs (no quota); phases alternate between them, the same
  requests (``Authorization: Bearer`` with the user's key, ignored without auth). Ratio:
  none ÷ auth (target ≥ 0.90).

``--cpu``: the same phases without valgrind, more of them (``--rounds``), measuring the
broker's CPU time per request from ``/proc`` (user and system, all threads; the background's
share subtracted the same way): what the request costs including the kernel's part of it,
which instruction counts leave out, at full speed.

*Background work.* Under callgrind a broker runs ~50 times slower, so work done per second
rather than per request (the security poll every 250 ms, the loop-lag probe) would weigh ~50
times more per request than at full speed, and differently on brokers that do different
background work. Before the phases, each broker idles for ``--seconds`` with instrumentation
on: its instructions per second are subtracted from each of its phases (printed).
Output: instructions per request for each phase and the ratio.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from api.process import free_port
from auth_quotas.credentials import generate_api_key
from benchmarks import auth as bench_auth
from benchmarks.http import run_wrk

TOPIC = "auth-bench-callgrind"


def _totals(path: Path) -> int | None:
    """The dump's instruction total, None until callgrind has written it."""
    for line in path.read_text(errors="replace").splitlines():
        if line.startswith("totals:"):
            return int(line.split()[1])
    return None


@dataclass
class _Broker:
    """A broker under callgrind, instrumentation off until :meth:`measured`."""

    name: str
    workdir: Path
    auth: bool
    key: str = field(default_factory=lambda: generate_api_key().token)
    url: str = ""
    valgrind: bool = True
    proc: subprocess.Popen[bytes] | None = None
    background_per_s: dict[str, float] = field(default_factory=dict)

    def start(self) -> None:
        port = free_port()
        out = self.workdir / f"callgrind.{self.name}.out"
        grind = ["valgrind", "--tool=callgrind", "--instr-atstart=no"]
        cmd = [
            *([*grind, f"--callgrind-out-file={out}.%p"] if self.valgrind else []),
            sys.executable,
            "-m",
            "api.cli",
            "serve",
            "--data-dir",
            str(self.workdir / f"data-{self.name}"),
            "--port",
            str(port),
            *(["--auth"] if self.auth else []),
        ]
        env = {**os.environ, "LOGBUS_BOOTSTRAP_KEY": self.key}
        with open(self.workdir / f"broker-{self.name}.log", "wb") as log:
            self.proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT)
        self.url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 600
        while True:
            try:
                if httpx.get(self.url + "/readyz", timeout=5).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline or self.proc.poll() is not None:
                raise RuntimeError(f"{self.name} did not start: see {self.workdir}")
            time.sleep(0.5)

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.terminate()
            self.proc.wait(120)

    def admin(self) -> httpx.Client:
        headers = {"Authorization": f"Bearer {self.key}"} if self.auth else {}
        return httpx.Client(base_url=self.url, headers=headers, timeout=300)

    def high_watermark(self) -> int:
        with self.admin() as admin:
            doc = admin.get(f"/v1/topics/{TOPIC}/partitions").json()
        parts = doc["partitions"] if isinstance(doc, dict) else doc
        return int(parts[0]["high_watermark"])

    def _ctl(self, *args: str) -> None:
        assert self.proc is not None
        subprocess.run(
            ["callgrind_control", *args, str(self.proc.pid)], check=True, capture_output=True
        )

    def _cpu(self) -> dict[str, float]:
        assert self.proc is not None
        fields = Path(f"/proc/{self.proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
        tick = os.sysconf("SC_CLK_TCK")
        return {"user_us": int(fields[11]) / tick * 1e6, "system_us": int(fields[12]) / tick * 1e6}

    def measured(self, label: str, work: Callable[[], None]) -> tuple[dict[str, float], float]:
        """(costs, seconds) of ``work``: its instructions (instrumentation on only then), or
        without valgrind the broker's CPU time (µs, user and system)."""
        if not self.valgrind:
            before = self._cpu()
            started = time.monotonic()
            work()
            elapsed = time.monotonic() - started
            after = self._cpu()
            return {k: after[k] - before[k] for k in after}, elapsed
        self._ctl("-z")
        self._ctl("-i", "on")
        started = time.monotonic()
        work()
        elapsed = time.monotonic() - started
        self._ctl("-i", "off")
        dumps = set(self.workdir.glob(f"callgrind.{self.name}.out.*"))
        self._ctl("-d", label)
        for _ in range(600):  # the dump appears, then its last line, "totals:"
            new = set(self.workdir.glob(f"callgrind.{self.name}.out.*")) - dumps
            if new and (total := _totals(next(iter(new)))) is not None:
                return {"instructions": total}, elapsed
            time.sleep(0.1)
        raise RuntimeError("callgrind wrote no dump within 60 s")

    def idle(self, seconds: int) -> None:
        costs, elapsed = self.measured("idle", lambda: time.sleep(seconds))
        self.background_per_s = {k: v / elapsed for k, v in costs.items()}
        shown = ", ".join(f"{v:,.0f} {k}" for k, v in self.background_per_s.items())
        print(f"  {self.name:13} background per second: {shown}")


def _setup(broker: _Broker, user_acls: int) -> str:
    """The topic, and on an auth broker the user ``bench`` with its ACLs: its key."""
    with broker.admin() as admin:
        user_key = ""
        if broker.auth:
            made = bench_auth._check(admin.post("/v1/users", json={"name": "bench"}), "user")
            user_key = str(made.json()["key"])
            acls = bench_auth.bench_acls(user_acls)
            bench_auth._check(admin.post("/v1/acls", json=acls), "ACLs")
        created = admin.post("/v1/topics", json={"name": TOPIC, "partitions": 1})
        bench_auth._check(created, "topic")
    return user_key


def _phase(
    broker: _Broker, headers: dict[str, str], seconds: int, connections: int, measure: bool
) -> dict[str, float] | None:
    """Produce for ``seconds``: the costs per request (background subtracted) if measured."""
    body = bench_auth.loads()["small"].body

    def load() -> None:
        run_wrk(
            f"{broker.url}/v1/topics/{TOPIC}/records?acks=1",
            broker.workdir,
            seconds=seconds,
            connections=connections,
            method="POST",
            body=body,
            headers=headers,
        )

    before = broker.high_watermark()
    if not measure:
        load()
        return None
    costs, elapsed = broker.measured("load", load)
    records = max(broker.high_watermark() - before, 1)
    per_request = {
        k: (v - broker.background_per_s.get(k, 0.0) * elapsed) / records for k, v in costs.items()
    }
    label = f"{broker.name}/{headers.get('Logbus-Client-Id', '')}"
    shown = ", ".join(
        f"{v:,.1f} {k} ({costs[k] / records:,.1f} with the background)"
        for k, v in per_request.items()
    )
    print(f"  {label:24} {records:7} records: {shown} per request", flush=True)
    return per_request


Costs = dict[str, float]


def _mean(runs: list[Costs]) -> Costs:
    return {k: sum(r[k] for r in runs) / len(runs) for k in runs[0]}


def run_quota(
    seconds: int, connections: int, workdir: Path, valgrind: bool, rounds: int
) -> tuple[Costs, Costs]:
    broker = _Broker("auth", workdir, auth=True, valgrind=valgrind)
    broker.start()
    try:
        key = _setup(broker, 100)
        quota = {
            "entity": {"user": "bench", "client_id": "bench-client"},
            "quotas": dict(bench_auth.NEVER_THROTTLES),
        }
        with broker.admin() as admin:
            bench_auth._check(admin.put("/v1/quotas", json=quota), "quota")
        free = {"Authorization": f"Bearer {key}", "Logbus-Client-Id": "free-client"}
        metered = {**free, "Logbus-Client-Id": "bench-client"}
        _phase(broker, free, 10, connections, False)  # warm-up: both paths, the key verified
        _phase(broker, metered, 10, connections, False)
        broker.idle(seconds)
        runs: dict[str, list[Costs]] = {"free": [], "quota": []}
        for _ in range(rounds):
            for name, headers in (("free", free), ("quota", metered)):
                got = _phase(broker, headers, seconds, connections, True)
                assert got is not None
                runs[name].append(got)
    finally:
        broker.stop()
    return _mean(runs["free"]), _mean(runs["quota"])


def run_auth(
    seconds: int, connections: int, workdir: Path, valgrind: bool, rounds: int
) -> tuple[Costs, Costs]:
    brokers = [
        _Broker("none", workdir, auth=False, valgrind=valgrind),
        _Broker("auth", workdir, auth=True, valgrind=valgrind),
    ]
    try:
        for broker in brokers:
            broker.start()
        key = ""
        for broker in brokers:
            key = _setup(broker, 100) or key
        headers = {"Authorization": f"Bearer {key}", "Logbus-Client-Id": "bench-client"}
        for broker in brokers:
            _phase(broker, headers, 10, connections, False)  # warm-up, the key verified
        for broker in brokers:
            broker.idle(seconds)
        runs: dict[str, list[Costs]] = {"none": [], "auth": []}
        for _ in range(rounds):
            for broker in brokers:
                got = _phase(broker, headers, seconds, connections, True)
                assert got is not None
                runs[broker.name].append(got)
    finally:
        for broker in brokers:
            broker.stop()
    return _mean(runs["none"]), _mean(runs["auth"])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mode", choices=("quota", "auth"), default="quota")
    parser.add_argument("--seconds", type=int, default=15, help="per measured phase")
    parser.add_argument("--connections", type=int, default=16)
    parser.add_argument("--cpu", action="store_true", help="CPU time at full speed, no valgrind")
    parser.add_argument("--rounds", type=int, default=0, help="alternations (2; --cpu: 8)")
    args = parser.parse_args(argv)
    tools = ("wrk",) if args.cpu else ("valgrind", "callgrind_control", "wrk")
    for tool in tools:
        if shutil.which(tool) is None:
            parser.error(f"{tool} is needed (apt-get install -y valgrind wrk)")
    rounds = args.rounds or (8 if args.cpu else 2)
    run = run_quota if args.mode == "quota" else run_auth
    with tempfile.TemporaryDirectory(prefix="auth-callgrind-") as tmp:
        base, more = run(args.seconds, args.connections, Path(tmp), not args.cpu, rounds)
    names = ("no quota applies", "quota measured") if args.mode == "quota" else ("no auth", "auth")
    target = 0.95 if args.mode == "quota" else 0.90
    for name, costs in zip(names, (base, more), strict=True):
        shown = ", ".join(f"{v:,.1f} {k}" for k, v in costs.items())
        print(f"{name:17}: {shown} per request")
    if args.cpu:
        base["cpu_us"] = base["user_us"] + base["system_us"]
        more["cpu_us"] = more["user_us"] + more["system_us"]
    for k in base:
        print(
            f"ratio of {k} ({names[0]} ÷ {names[1]}): {base[k] / more[k]:.3f}   target ≥ {target}"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
