"""What one small produce costs the broker's own code, without a server or a network.

    python -m benchmarks.request_cost [--requests 6400] [--concurrency 64] [--acks 1]
    python -m benchmarks.request_cost --callgrind      # instructions per request (valgrind)
    python -m benchmarks.request_cost --callgrind --auth quota   # the secured broker

The whole ASGI app (:func:`api.app.create_app`: the front door, produce, the log) serves
``--requests`` one-record JSON produces (a 100-byte value, ``POST /v1/topics/t/records``) from
``--concurrency`` concurrent callers in this process: each caller hands the app an ASGI scope
and body as uvicorn would and waits for the answer. What a server adds (HTTP parsing, the
socket) is left out: :mod:`benchmarks.bare_asgi` measures that side by side in
:mod:`benchmarks.per_request`.

Prints CPU µs per request (``time.process_time``), or with ``--callgrind`` the instructions
per request: the script re-runs itself under ``valgrind --tool=callgrind`` with
instrumentation off and switches it on (``callgrind_control``) only around the measured
requests. Instruction counts do not move with the machine's load, so they compare two
versions of the code where throughput on a shared 2-core VM cannot (±20 % between runs).
Under callgrind a run of 3,200 requests takes ≈ 3 minutes.

``--auth``: ``none`` (the default), ``ignored`` (the same broker, every request carrying the
``Authorization`` and ``Logbus-Client-Id`` headers of the secured one) or ``quota``: the
``auth_quota`` broker of :mod:`benchmarks.per_request` — authentication on, the user
``bench`` with its API key and the 100 ACLs of :mod:`benchmarks.auth`, and a quota for
(``bench``, ``bench-client``) that never throttles. ``quota`` against ``ignored`` is what
authentication, the ACL decision and the quota cost the app per request (uvicorn's share of
the extra response fields is not in it: :mod:`benchmarks.auth_callgrind` counts the server).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import MutableMapping
from pathlib import Path
from typing import Any

BODY = b'{"records":[{"value":"' + b"v" * 98 + b'"}]}'
WARMUP_PER_CALLER = 20


async def _call(
    app: Any, method: str, path: str, body: bytes, headers: list[tuple[bytes, bytes]]
) -> tuple[int, bytes]:
    """One request through the ASGI app: (status, body)."""
    answer: list[MutableMapping[str, Any]] = []
    chunks = [{"type": "http.request", "body": body, "more_body": False}]

    async def receive() -> dict[str, Any]:
        return chunks.pop() if chunks else {"type": "http.disconnect"}

    async def send(message: MutableMapping[str, Any]) -> None:
        answer.append(message)

    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": method,
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "query_string": b"",
        "root_path": "",
        "headers": [
            (b"host", b"127.0.0.1:8080"),
            (b"content-type", b"application/json"),
            (b"content-length", str(len(body)).encode()),
            *headers,
        ],
        "client": ("127.0.0.1", 50000),
        "server": ("127.0.0.1", 8080),
        "state": {},
    }
    await app(scope, receive, send)
    status = int(answer[0]["status"])
    return status, b"".join(m.get("body", b"") for m in answer[1:])


async def _secure(app: Any, admin_key: str) -> str:
    """The user ``bench``, its ACLs and its quota (as :mod:`benchmarks.per_request` sets them
    up): the user's API key."""
    import orjson

    from benchmarks import auth as bench_auth

    admin = [(b"authorization", f"Bearer {admin_key}".encode())]
    entity = {"user": bench_auth.USER, "client_id": bench_auth.CLIENT_ID}
    steps = [
        ("POST", "/v1/users", {"name": bench_auth.USER}),
        ("POST", "/v1/acls", bench_auth.bench_acls(100)),
        ("PUT", "/v1/quotas", {"entity": entity, "quotas": dict(bench_auth.NEVER_THROTTLES)}),
    ]
    key = ""
    for method, path, doc in steps:
        status, answer = await _call(app, method, path, orjson.dumps(doc), admin)
        if status >= 300:
            raise RuntimeError(f"{method} {path}: {status} {answer[:300]!r}")
        if path == "/v1/users":
            key = str(orjson.loads(answer)["key"])
    await app.state.security.refresh()
    return key


async def serve(
    requests: int, concurrency: int, acks: str, instrument: bool, auth: str = "none"
) -> float:
    """CPU seconds per request over the measured requests."""
    from api.app import create_app
    from api.settings import Settings
    from auth_quotas.credentials import generate_api_key
    from benchmarks import auth as bench_auth

    data = Path(tempfile.mkdtemp(prefix="request-cost-"))
    admin_key = generate_api_key().token
    secured = auth == "quota"
    settings = Settings(data_dir=data / "data", auth=secured, bootstrap_key=admin_key)
    app = create_app(settings)
    lifespan: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
    started = asyncio.Event()

    async def lifespan_send(message: MutableMapping[str, Any]) -> None:
        if message["type"] == "lifespan.startup.complete":
            started.set()
        elif message["type"].endswith(".failed"):
            raise RuntimeError(message)

    await lifespan.put({"type": "lifespan.startup"})
    scope = {"type": "lifespan", "asgi": {"version": "3.0"}, "state": {}}
    life = asyncio.create_task(app(scope, lifespan.get, lifespan_send))
    await started.wait()
    assert app.state is not None
    topic = f"{bench_auth.TOPIC_PREFIX}t"  # one the user's ACLs let it write
    await app.state.broker.create_topic(topic, 1)
    user_key = await _secure(app, admin_key) if secured else generate_api_key().token
    path = f"/v1/topics/{topic}/records"
    query = f"acks={acks}".encode()
    headers = [
        (b"host", b"127.0.0.1:8080"),
        (b"content-type", b"application/json"),
        (b"content-length", str(len(BODY)).encode()),
    ]
    if auth != "none":
        headers += [
            (b"authorization", f"Bearer {user_key}".encode()),
            (b"logbus-client-id", bench_auth.CLIENT_ID.encode()),
        ]

    async def produce() -> None:
        answer: list[MutableMapping[str, Any]] = []
        body = [{"type": "http.request", "body": BODY, "more_body": False}]

        async def receive() -> dict[str, Any]:
            return body.pop() if body else {"type": "http.disconnect"}

        async def send(message: MutableMapping[str, Any]) -> None:
            answer.append(message)

        request = {
            "type": "http",
            "asgi": {"version": "3.0"},
            "http_version": "1.1",
            "method": "POST",
            "scheme": "http",
            "path": path,
            "raw_path": path.encode(),
            "query_string": query,
            "root_path": "",
            "headers": headers,
            "client": ("127.0.0.1", 50000),
            "server": ("127.0.0.1", 8080),
            "state": {},
        }
        await app(request, receive, send)
        if answer[0]["status"] != 200:
            raise RuntimeError(f"produce answered {answer}")

    async def caller(n: int) -> None:
        for _ in range(n):
            await produce()

    await asyncio.gather(*(caller(WARMUP_PER_CALLER) for _ in range(concurrency)))
    if instrument:
        _callgrind("-i", "on")
    cpu = time.process_time()
    await asyncio.gather(*(caller(requests // concurrency) for _ in range(concurrency)))
    cpu = time.process_time() - cpu
    if instrument:
        _callgrind("-i", "off")
        _callgrind("-d", "measured")
    await lifespan.put({"type": "lifespan.shutdown"})
    await life
    return cpu / (requests // concurrency * concurrency)


def _callgrind(*args: str) -> None:
    subprocess.run(["callgrind_control", *args, str(os.getpid())], check=True, capture_output=True)


def _under_callgrind(args: argparse.Namespace) -> int:
    out = Path(tempfile.mkdtemp(prefix="request-cost-cg-"))
    cmd = [
        "valgrind",
        "--tool=callgrind",
        "--instr-atstart=no",
        f"--callgrind-out-file={out}/callgrind.%p",
        sys.executable,
        "-m",
        "benchmarks.request_cost",
        "--requests",
        str(args.requests),
        "--concurrency",
        str(args.concurrency),
        "--acks",
        args.acks,
        "--auth",
        args.auth,
        "--instrumented",
    ]
    subprocess.run(cmd, check=True, stderr=subprocess.DEVNULL)
    dumps = sorted(out.glob("callgrind.*.1"))
    if not dumps:
        print("callgrind wrote no dump", file=sys.stderr)
        return 1
    totals = [line for line in dumps[0].read_text().splitlines() if line.startswith("totals:")]
    measured = args.requests // args.concurrency * args.concurrency
    print(f"{int(totals[0].split()[1]) / measured:,.0f} instructions per request ({dumps[0]})")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=6400)
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--acks", default="1", choices=["0", "1", "all"])
    parser.add_argument("--auth", default="none", choices=["none", "ignored", "quota"])
    parser.add_argument("--callgrind", action="store_true", help="count instructions instead")
    parser.add_argument("--instrumented", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.callgrind:
        return _under_callgrind(args)
    per_request = asyncio.run(
        serve(args.requests, args.concurrency, args.acks, args.instrumented, args.auth)
    )
    print(f"{per_request * 1e6:.1f} µs CPU per request ({args.concurrency} concurrent callers)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
