"""What a quota costs a one-record produce, in instructions (issue 12's "quota enforcement
costs ≤ 5 %"), measured where throughput ratios are too noisy to tell 5 % from 10 %.

    python -m benchmarks.auth_callgrind [--seconds 20] [--connections 16]

Needs ``valgrind`` (Debian's package) and ``wrk``. One ``logbus serve --auth`` broker runs
under callgrind with instrumentation off; a user with 100 ACLs (those of
:mod:`benchmarks.auth`) and a quota for the client id ``bench-client`` that never throttles.
After a warm-up, phases alternate: wrk sends one-record produces (as ``benchmarks.auth``'s
small load) for ``--seconds`` with the client id ``free-client`` (no quota applies: the gate's
no-quota path) then ``bench-client`` (measured, timed and answered with the throttle fields),
twice each, instrumentation on only during each phase. Instructions per request = the phase's
total (``callgrind_control``'s dump) ÷ the records it appended (the partition's high-watermark
delta). Same process, same state, same requests apart from one header value: the difference
is the quota path, including what it costs uvicorn (its response fields) and the event loop.

Under callgrind the broker runs ~50 times slower, so background work (the security poll every
250 ms) weighs more per request than it does at full speed; it is the same in both phases.
Output: instructions per request for each phase and the ratio (free ÷ quota).
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
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


def run(seconds: int, connections: int, workdir: Path) -> dict[str, list[float]]:
    key = generate_api_key().token
    port = free_port()
    out = workdir / "callgrind.out"
    cmd = [
        "valgrind",
        "--tool=callgrind",
        "--instr-atstart=no",
        f"--callgrind-out-file={out}.%p",
        sys.executable,
        "-m",
        "api.cli",
        "serve",
        "--data-dir",
        str(workdir / "data"),
        "--port",
        str(port),
        "--auth",
    ]
    env = {**os.environ, "LOGBUS_BOOTSTRAP_KEY": key}
    with open(workdir / "broker.log", "wb") as log:
        proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    pid = str(proc.pid)
    per_request: dict[str, list[float]] = {"free-client": [], "bench-client": []}
    try:
        deadline = time.monotonic() + 600
        while True:
            try:
                if httpx.get(url + "/readyz", timeout=5).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline or proc.poll() is not None:
                raise RuntimeError(f"the broker did not start: see {workdir / 'broker.log'}")
            time.sleep(0.5)
        admin = httpx.Client(base_url=url, headers={"Authorization": f"Bearer {key}"}, timeout=300)
        made = bench_auth._check(admin.post("/v1/users", json={"name": "bench"}), "user")
        user_key = made.json()["key"]
        bench_auth._check(admin.post("/v1/acls", json=bench_auth.bench_acls(100)), "ACLs")
        quota = {
            "entity": {"user": "bench", "client_id": "bench-client"},
            "quotas": dict(bench_auth.NEVER_THROTTLES),
        }
        bench_auth._check(admin.put("/v1/quotas", json=quota), "quota")
        created = admin.post("/v1/topics", json={"name": TOPIC, "partitions": 1})
        bench_auth._check(created, "topic")
        body = bench_auth.loads()["small"].body

        def high_watermark() -> int:
            doc = admin.get(f"/v1/topics/{TOPIC}/partitions").json()
            parts = doc["partitions"] if isinstance(doc, dict) else doc
            return int(parts[0]["high_watermark"])

        def phase(client: str, secs: int, measure: bool) -> None:
            headers = {"Authorization": f"Bearer {user_key}", "Logbus-Client-Id": client}
            if measure:
                subprocess.run(["callgrind_control", "-z", pid], check=True, capture_output=True)
                subprocess.run(
                    ["callgrind_control", "-i", "on", pid], check=True, capture_output=True
                )
            before = high_watermark()
            run_wrk(
                f"{url}/v1/topics/{TOPIC}/records?acks=1",
                workdir,
                seconds=secs,
                connections=connections,
                method="POST",
                body=body,
                headers=headers,
            )
            records = high_watermark() - before
            if not measure:
                return
            subprocess.run(["callgrind_control", "-i", "off", pid], check=True, capture_output=True)
            dumps = set(workdir.glob("callgrind.out.*"))
            subprocess.run(
                ["callgrind_control", "-d", client, pid], check=True, capture_output=True
            )
            total = None
            for _ in range(600):  # the dump appears, then its last line, "totals:"
                new = set(workdir.glob("callgrind.out.*")) - dumps
                if new and (total := _totals(next(iter(new)))) is not None:
                    break
                time.sleep(0.1)
            if total is None:
                raise RuntimeError("callgrind wrote no dump within 60 s")
            per_request[client].append(total / max(records, 1))
            print(
                f"  {client:13} {records:6} records, {per_request[client][-1]:12,.0f} "
                "instructions per request",
                flush=True,
            )

        phase("free-client", 10, False)  # warm-up: both paths, the key verified
        phase("bench-client", 10, False)
        for _ in range(2):
            phase("free-client", seconds, True)
            phase("bench-client", seconds, True)
    finally:
        proc.terminate()
        proc.wait(120)
    return per_request


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=int, default=20, help="per measured phase")
    parser.add_argument("--connections", type=int, default=16)
    args = parser.parse_args(argv)
    for tool in ("valgrind", "callgrind_control", "wrk"):
        if shutil.which(tool) is None:
            parser.error(f"{tool} is needed (apt-get install -y valgrind wrk)")
    with tempfile.TemporaryDirectory(prefix="auth-callgrind-") as tmp:
        result = run(args.seconds, args.connections, Path(tmp))
    free = sum(result["free-client"]) / len(result["free-client"])
    quota = sum(result["bench-client"]) / len(result["bench-client"])
    print(f"no quota applies: {free:,.0f} instructions per request")
    print(f"quota measured:   {quota:,.0f} instructions per request (+{quota - free:,.0f})")
    print(f"ratio (no quota ÷ quota): {free / quota:.3f}   target ≥ 0.95")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
