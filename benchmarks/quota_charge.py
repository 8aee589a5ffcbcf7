"""What :meth:`auth_quotas.quotas.QuotaSensors.charge` alone costs a request, in instructions.

    python -m benchmarks.quota_charge [--requests 20000]

The benchmark's quota (:data:`benchmarks.auth.NEVER_THROTTLES`: producer bytes and request
time) on one caller sending 120-byte requests, 5 a millisecond (about what one broker serves
at 64 connections), charged twice under callgrind: a *young* caller (its first 4 s, as in
every phase of :mod:`benchmarks.per_request`, where RateLimit's r moves with every request)
and an *established* one (after 20 s of history, r is the whole policy). Each is counted
against the same loop calling a function that does nothing (instrumentation on only around
the loop), so what is printed is charge's own cost and its call.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path

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


def _callgrind(*args: str) -> None:
    subprocess.run(["callgrind_control", *args, str(os.getpid())], check=True, capture_output=True)


def _count(mode: str, requests: int, empty: bool) -> int:
    with tempfile.TemporaryDirectory(prefix="quota-charge-cg-") as tmp:
        return _count_in(Path(tmp), mode, requests, empty)


def _count_in(out: Path, mode: str, requests: int, empty: bool) -> int:
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
        *(["--empty"] if empty else []),
    ]
    subprocess.run(cmd, check=True, capture_output=True)
    text = (out / "callgrind.out").read_text()
    totals = [line for line in text.splitlines() if line.startswith("totals:")]
    return int(totals[0].split()[1])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=20_000)
    parser.add_argument("--run", choices=MODES, help=argparse.SUPPRESS)
    parser.add_argument("--empty", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.run:
        _loop(args.run, args.requests, args.empty)
        return 0
    for mode in MODES:
        charged = _count(mode, args.requests, False)
        empty = _count(mode, args.requests, True)
        print(f"{mode:11}: {(charged - empty) / args.requests:,.0f} instructions per charge")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
