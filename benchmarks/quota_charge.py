"""What the quota costs a request at the front door, in instructions: ``QuotaSensors.charge``
(auth_quotas/quotas.py) alone, and the whole gate (``api.quota_gate.serve``).

    python -m benchmarks.quota_charge [--requests 20000]

The benchmark's quota (:data:`benchmarks.auth.NEVER_THROTTLES`: producer bytes and request
time) on one caller sending 120-byte requests, 5 a millisecond on a simulated clock (the
secured broker of :mod:`benchmarks.per_request` serves 11-13 a millisecond; at either rate a
1 s sample holds thousands of requests), for a *young* caller (its first ``requests / 5`` ms,
4 s by default, as in every phase of :mod:`benchmarks.per_request`, where RateLimit's r moves
with every request) and an *established* one (after 20 s of history, r is the whole policy).
Each count runs under callgrind with instrumentation on only around the measured loop:

* ``charge``: charge's own cost and its call (against the same loop calling a function that
  does nothing);
* ``gate``: a one-record produce through ``serve`` to an app that only answers (two
  messages, as the fast path sends them), for the caller the quota applies to against a
  client id no quota applies to (the gate's no-quota path): what being metered adds at the
  front door, the answer's fields included but not what the server does with them.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

MODES = ("young", "established")


def _loop(mode: str, requests: int, empty: bool) -> None:
    from auth_quotas.quotas import QuotaEntity, QuotaSensors, QuotaType, resolve
    from benchmarks.auth import NEVER_THROTTLES

    configs = {QuotaEntity("u", "c"): {QuotaType(k): v for k, v in NEVER_THROTTLES.items()}}
    p, r = QuotaType.PRODUCER_BYTE_RATE, QuotaType.REQUEST_PERCENTAGE
    sensors = QuotaSensors()
    meter = sensors.meter(p, resolve(configs, p, "u", "c"), resolve(configs, r, "u", "c"), 0)
    start = 0
    if mode == "established":
        for now in range(0, 20_000, 5):
            sensors.charge(meter, 120, 30_000, now, [])
        start = 20_000

    def nothing(*_: object) -> None:
        return None

    charge = nothing if empty else sensors.charge
    times = [start + i // 5 for i in range(requests)]
    _callgrind("-i", "on")
    for now in times:
        charge(meter, 120, 30_000, now, [])
    _callgrind("-i", "off")


def _gate_loop(mode: str, requests: int, metered: bool) -> None:
    import asyncio

    from api import quota_gate
    from api.quota_state import QuotaState
    from benchmarks.auth import NEVER_THROTTLES
    from cluster.security_store import QuotaRow

    now = [0]
    quotas = QuotaState(clock=lambda: now[0])
    quotas.apply(QuotaRow("bench", "bench-client", k, v) for k, v in NEVER_THROTTLES.items())

    class Identity:
        user = "bench"

    body = b'{"records":[{"value":"' + b"v" * 98 + b'"}]}'
    client = b"bench-client" if metered else b"free-client"
    scope = {
        "type": "http",
        "method": "POST",
        "path": "/v1/topics/t/records",
        "query_string": b"acks=1",
        "headers": [
            (b"host", b"127.0.0.1"),
            (b"content-type", b"application/json"),
            (b"content-length", str(len(body)).encode()),
            (b"authorization", b"Bearer key"),
            (b"logbus-client-id", client),
        ],
        "logbus.identity": Identity(),
    }
    answer = [(b"content-type", b"application/json"), (b"content-length", b"40")]

    async def receive() -> dict[str, object]:
        return {"type": "http.request", "body": body, "more_body": False}

    async def send(message: object) -> None:
        return None

    async def app(scope: object, receive: object, send: Any) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": list(answer)})
        await send({"type": "http.response.body", "body": b"x" * 40})

    async def run() -> None:
        serve = quota_gate.serve
        if mode == "established":
            for i in range(4000):
                now[0] = i * 5
                await serve(quotas, scope, receive, send, app)
        start = now[0]
        _callgrind("-i", "on")
        for i in range(requests):
            now[0] = start + i // 5
            await serve(quotas, scope, receive, send, app)
        _callgrind("-i", "off")

    asyncio.run(run())


def _callgrind(*args: str) -> None:
    subprocess.run(["callgrind_control", *args, str(os.getpid())], check=True, capture_output=True)


def _count(what: str, mode: str, requests: int, flag: bool) -> int:
    with tempfile.TemporaryDirectory(prefix="quota-charge-cg-") as tmp:
        return _count_in(Path(tmp), what, mode, requests, flag)


def _count_in(out: Path, what: str, mode: str, requests: int, flag: bool) -> int:
    cmd = [
        "valgrind",
        "--tool=callgrind",
        "--instr-atstart=no",
        f"--callgrind-out-file={out}/callgrind.out",
        sys.executable,
        "-m",
        "benchmarks.quota_charge",
        "--requests",
        str(requests),
        "--run",
        mode,
        "--what",
        what,
        *(["--flag"] if flag else []),
    ]
    subprocess.run(cmd, check=True, capture_output=True)
    text = (out / "callgrind.out").read_text()
    totals = [line for line in text.splitlines() if line.startswith("totals:")]
    return int(totals[0].split()[1])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=20_000)
    parser.add_argument("--run", choices=MODES, help=argparse.SUPPRESS)
    parser.add_argument("--what", choices=("charge", "gate"), help=argparse.SUPPRESS)
    parser.add_argument("--flag", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.run:
        if args.what == "gate":
            _gate_loop(args.run, args.requests, args.flag)
        else:
            _loop(args.run, args.requests, args.flag)
        return 0
    n = args.requests
    for mode in MODES:
        charged = _count("charge", mode, n, False) - _count("charge", mode, n, True)
        print(f"{mode:11}: {charged / n:,.0f} instructions per charge")
    for mode in MODES:
        metered, free = _count("gate", mode, n, True), _count("gate", mode, n, False)
        print(
            f"{mode:11}: the gate, metered {metered / n:,.0f} against no quota {free / n:,.0f}"
            f" instructions per request: +{(metered - free) / n:,.0f}"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
