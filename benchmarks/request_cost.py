"""What one small produce, or one 1,000-record JSON fetch, costs the broker's own code,
without a server or a network.

    python -m benchmarks.request_cost [--requests 6400] [--concurrency 64] [--acks 1]
    python -m benchmarks.request_cost --callgrind      # instructions per request (valgrind)
    python -m benchmarks.request_cost --fetch [--requests 2000] [--callgrind]
    python -m benchmarks.request_cost --callgrind --auth quota   # the secured broker
    python -m benchmarks.request_cost --server [--cut app] [--auth quota] [--callgrind]

The whole ASGI app (:func:`api.app.create_app`: the front door, produce, the log) serves
``--requests`` one-record JSON produces (a 100-byte value, ``POST /v1/topics/{TOPIC}/records``) from
``--concurrency`` concurrent callers in this process: each caller hands the app an ASGI scope
and body as uvicorn would and waits for the answer. What a server adds (HTTP parsing, the
socket) is left out: :mod:`benchmarks.bare_asgi` measures that side by side in
:mod:`benchmarks.per_request`. With ``--server`` each produce goes as HTTP/1.1 bytes through
the broker's server instead (uvicorn as :func:`api.server.uvicorn_config` sets it up, the
broker's protocol, uvloop) on ``--concurrency`` in-memory connections (:func:`serve_http`);
``--server --cut app`` serves the bare app of :mod:`benchmarks.bare_asgi` there.

With ``--fetch`` the app first stores ``FETCH_RECORDS`` records of a 100-byte value (1,000
per produce, as :mod:`benchmarks.redis_peer` does), then serves ``--requests`` fetches of
``GET /v1/topics/{TOPIC}/partitions/0/records?offset=…&max_records=1000`` (JSON), one after the
other, cycling over the stored pages: the broker's side of the JSON consume row.

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
import contextlib
import gc
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator, MutableMapping
from pathlib import Path
from typing import Any

BODY = b'{"records":[{"value":"' + b"v" * 98 + b'"}]}'
WARMUP_PER_CALLER = 20


TOPIC = "auth-bench-t"  # benchmarks.auth.TOPIC_PREFIX: the user ``bench`` may write it
PAGE_PATH = f"/v1/topics/{TOPIC}/partitions/0/records"
FETCH_RECORDS = 50_000
PAGE_RECORDS = 1000
PAGE_BODY = b'{"records":[' + b",".join([b'{"value":"' + b"v" * 98 + b'"}'] * PAGE_RECORDS) + b"]}"


class _App:
    """The app started in this process (lifespan and all), called as uvicorn would."""

    def __init__(self, app: Any) -> None:
        self.app = app
        self.lifespan: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        self.life: asyncio.Task[None] | None = None

    @classmethod
    async def start(cls, admin_key: str | None = None) -> _App:
        """``admin_key``: authentication on, with that bootstrap key."""
        from api.app import create_app
        from api.settings import Settings

        data = Path(tempfile.mkdtemp(prefix="request-cost-"))
        settings = Settings(
            data_dir=data / "data", auth=admin_key is not None, bootstrap_key=admin_key
        )
        self = cls(create_app(settings))
        started = asyncio.Event()

        async def lifespan_send(message: MutableMapping[str, Any]) -> None:
            if message["type"] == "lifespan.startup.complete":
                started.set()
            elif message["type"].endswith(".failed"):
                raise RuntimeError(message)

        await self.lifespan.put({"type": "lifespan.startup"})
        scope = {"type": "lifespan", "asgi": {"version": "3.0"}, "state": {}}
        self.life = asyncio.create_task(self.app(scope, self.lifespan.get, lifespan_send))
        await started.wait()
        assert self.app.state is not None
        await self.app.state.broker.create_topic(TOPIC, 1)
        return self

    async def stop(self) -> None:
        await self.lifespan.put({"type": "lifespan.shutdown"})
        assert self.life is not None
        await self.life

    async def call(
        self,
        method: str,
        path: str,
        query: bytes,
        headers: list[tuple[bytes, bytes]],
        body: bytes,
        ok: bool = True,
    ) -> list[MutableMapping[str, Any]]:
        """One request; the messages the app sent (``ok``: raise unless it answered 200)."""
        answer: list[MutableMapping[str, Any]] = []
        pending = [{"type": "http.request", "body": body, "more_body": False}]

        async def receive() -> dict[str, Any]:
            return pending.pop() if pending else {"type": "http.disconnect"}

        async def send(message: MutableMapping[str, Any]) -> None:
            answer.append(message)

        request = {
            "type": "http",
            "asgi": {"version": "3.0"},
            "http_version": "1.1",
            "method": method,
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
        await self.app(request, receive, send)
        if ok and answer[0]["status"] != 200:
            raise RuntimeError(f"{method} {path} answered {answer}")
        return answer


async def _started(auth: str) -> tuple[_App, str]:
    """The app for ``auth`` (see the module docstring) and the key its requests carry (the
    user's with ``quota``, else one nobody checks)."""
    from auth_quotas.credentials import generate_api_key

    admin_key = generate_api_key().token
    app = await _App.start(admin_key if auth == "quota" else None)
    user_key = await _secure(app, admin_key) if auth == "quota" else generate_api_key().token
    return app, user_key


async def _secure(app: _App, admin_key: str) -> str:
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
        body = orjson.dumps(doc)
        answer = await app.call(method, path, b"", _produce_headers(body) + admin, body, ok=False)
        status = int(answer[0]["status"])
        text = b"".join(m.get("body", b"") for m in answer[1:])
        if status >= 300:
            raise RuntimeError(f"{method} {path}: {status} {text[:300]!r}")
        if path == "/v1/users":
            key = str(orjson.loads(text)["key"])
    await app.app.state.security.refresh()
    return key


def _produce_headers(body: bytes) -> list[tuple[bytes, bytes]]:
    return [
        (b"host", b"127.0.0.1:8080"),
        (b"content-type", b"application/json"),
        (b"content-length", str(len(body)).encode()),
    ]


CUTS = ("none", "app", "front-door", "parse", "checks", "build")
_FIXED_ANSWER = b'{"offsets":[{"partition":0,"offset":1}]}'


@contextlib.contextmanager
def _cut(app: _App, cut: str) -> Iterator[None]:
    """Stop each produce at ``cut`` and answer a fixed body from there, so that the
    instructions of each stage are the differences between cuts (``app``: a bare ASGI app in
    place of the broker's, the harness alone; ``front-door``: produce answers at once;
    ``parse``: after the body is read and parsed; ``checks``: after produce's checks, before
    routing; ``build``: after the batch is built, before the append)."""
    from api import records

    def fixed() -> records.Reply:
        return records.Reply(200, _FIXED_ANSWER, records=1, size_bytes=len(BODY))

    async def at_once(*args: Any, **kwargs: Any) -> records.Reply:
        return fixed()

    async def parsed(
        broker: Any, settings: Any, topic: str, partition: Any, query: Any, headers: Any, body: Any,
        transactions: Any = None,
    ) -> records.Reply:  # fmt: skip
        raw = await records.read_body(body, settings.max_request_bytes)
        records.parse_json_body(raw, settings.max_records_per_request, 0)
        return fixed()

    async def built(
        broker: Any, topic: str, partition: Any, acks: Any, items: Any, count: int
    ) -> records.Reply:
        groups, _ = records._route(
            broker, topic, partition, items, broker.sticky.next_partition(count)
        )
        [(_, rs)] = groups.items()
        records.built_batches(rs, broker.log_config(topic).max_message_bytes)
        return fixed()

    saved = (app.app, records.produce, records._produce_parsed)
    if cut == "app":
        from benchmarks import bare_asgi

        app.app = bare_asgi.app  # the same bare app per_request measures on the server
    elif cut == "front-door":
        records.produce = at_once  # type: ignore[assignment]
    elif cut == "parse":
        records.produce = parsed  # type: ignore[assignment]
    elif cut == "checks":
        records._produce_parsed = at_once  # type: ignore[assignment]
    elif cut == "build":
        records._produce_parsed = built  # type: ignore[assignment]
    try:
        yield
    finally:  # the module as it was: tests run this in their own process
        app.app, records.produce, records._produce_parsed = saved  # type: ignore[assignment]


async def serve(
    requests: int,
    concurrency: int,
    acks: str,
    instrument: bool,
    auth: str = "none",
    cut: str = "none",
) -> float:
    """CPU seconds per request over the measured requests."""
    from benchmarks import auth as bench_auth

    app, user_key = await _started(auth)
    query = f"acks={acks}".encode()
    headers = _produce_headers(BODY)
    if auth != "none":
        headers += [
            (b"authorization", f"Bearer {user_key}".encode()),
            (b"logbus-client-id", bench_auth.CLIENT_ID.encode()),
        ]
    path = f"/v1/topics/{TOPIC}/records"

    async def caller(n: int) -> None:
        for _ in range(n):
            await app.call("POST", path, query, headers, BODY)

    with _cut(app, cut):
        await asyncio.gather(*(caller(WARMUP_PER_CALLER) for _ in range(concurrency)))
        cpu = _measure_start(instrument)
        await asyncio.gather(*(caller(requests // concurrency) for _ in range(concurrency)))
        cpu = _measure_end(instrument, cpu)
    await app.stop()
    return cpu / (requests // concurrency * concurrency)


class _Wire(asyncio.Transport):
    """One keep-alive connection as the server sees it, a client at its other end that sends
    ``request`` again on the next turn of the loop each time a whole answer has come back, until
    it has sent ``count``; then calls ``done(None)``. An answer that is not 200 with a
    Content-Length stops it: ``done(error)``."""

    def __init__(
        self, request: bytes, count: int, done: Callable[[Exception | None], None], port: int
    ) -> None:
        super().__init__()
        self.loop = asyncio.get_running_loop()
        self.request = request
        self.left = count
        self.done = done
        self.received = bytearray()
        self.protocol: asyncio.Protocol | None = None
        self.closing = False
        self.extra = {"peername": ("127.0.0.1", port), "sockname": ("127.0.0.1", 8080)}

    def start(self, protocol: asyncio.Protocol) -> None:
        self.protocol = protocol
        protocol.connection_made(self)
        self.loop.call_soon(protocol.data_received, self.request)

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return self.extra.get(name, default)

    def write(self, data: bytes | bytearray | memoryview) -> None:
        self.received += data
        self._answered()

    def writelines(self, parts: Iterable[bytes | bytearray | memoryview]) -> None:
        for part in parts:
            self.received += part
        self._answered()

    def _answered(self) -> None:
        end = self.received.find(b"\r\n\r\n")
        if end < 0:
            return
        at = self.received.find(b"\r\ncontent-length: ", 0, end)
        if not self.received.startswith(b"HTTP/1.1 200 ") or at < 0:
            self.done(RuntimeError(f"answered {bytes(self.received[:300])!r}"))
            return
        at += len(b"\r\ncontent-length: ")
        whole = end + 4 + int(self.received[at : self.received.index(b"\r\n", at)])
        if len(self.received) < whole:
            return
        del self.received[:whole]
        self.left -= 1
        assert self.protocol is not None
        if self.left > 0:
            self.loop.call_soon(self.protocol.data_received, self.request)
        else:
            self.done(None)

    def is_closing(self) -> bool:
        return self.closing

    def close(self) -> None:
        self.closing = True

    def abort(self) -> None:
        self.closing = True

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass

    def get_write_buffer_size(self) -> int:
        return 0


async def serve_http(
    requests: int,
    concurrency: int,
    acks: str,
    instrument: bool,
    cut: str = "none",
    auth: str = "none",
) -> float:
    """CPU seconds per request over the measured requests, as :func:`serve` but each request
    sent as HTTP/1.1 bytes through the broker's server (uvicorn configured as
    :func:`api.server.uvicorn_config` configures it, the broker's protocol) on ``concurrency``
    in-memory connections: the server's cost too, no socket. ``cut="app"``: the bare ASGI
    app of :mod:`benchmarks.bare_asgi` on the same server instead of the broker. ``auth`` as
    for :func:`serve`."""
    from email.utils import formatdate

    from uvicorn.server import ServerState

    from api.budgets import Budgets
    from api.server import tune_gc, uvicorn_config
    from api.settings import Settings
    from benchmarks import auth as bench_auth
    from benchmarks import bare_asgi

    app, user_key = await _started(auth)
    extra = (
        f"Authorization: Bearer {user_key}\r\nLogbus-Client-Id: {bench_auth.CLIENT_ID}\r\n"
        if auth != "none"
        else ""
    )
    settings = Settings()
    served: Any = bare_asgi.app if cut == "app" else app.app
    with _cut(app, "none" if cut == "app" else cut):
        config = uvicorn_config(settings, served, Budgets.from_settings(settings))
        config.load()
        thresholds = gc.get_threshold()
        tune_gc()  # as the broker's server does
        state = ServerState()
        # What uvicorn's server adds to every answer (its main loop sets them each second).
        now = formatdate(usegmt=True).encode()
        state.default_headers = [(b"date", now), *config.encoded_headers]
        head = (
            f"POST /v1/topics/{TOPIC}/records?acks={acks} HTTP/1.1\r\n"
            f"Host: 127.0.0.1:8080\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(BODY)}\r\n{extra}\r\n"
        ).encode()

        async def run(per_connection: int) -> None:
            finished = asyncio.get_running_loop().create_future()
            left = concurrency

            def done(error: Exception | None) -> None:
                nonlocal left
                left -= 1
                if finished.done():
                    return
                if error is not None:
                    finished.set_exception(error)
                elif left == 0:
                    finished.set_result(None)

            for i in range(concurrency):
                make: Any = config.http_protocol_class
                protocol = make(config=config, server_state=state, app_state={})
                _Wire(head + BODY, per_connection, done, 50000 + i).start(protocol)
            await finished

        try:
            await run(WARMUP_PER_CALLER)
            cpu = _measure_start(instrument)
            await run(requests // concurrency)
            cpu = _measure_end(instrument, cpu)
        finally:  # tests run this in their own process
            gc.set_threshold(*thresholds)
    await app.stop()
    return cpu / (requests // concurrency * concurrency)


async def serve_fetches(requests: int, instrument: bool) -> float:
    """CPU seconds per 1,000-record JSON fetch over the measured fetches."""
    from api.server import tune_allocator

    tune_allocator()  # as the broker does: a 174 KB answer is not a fresh mmap each time
    app = await _App.start()
    headers = _produce_headers(PAGE_BODY)
    for _ in range(FETCH_RECORDS // PAGE_RECORDS):
        await app.call("POST", f"{PAGE_PATH}", b"acks=1", headers, PAGE_BODY)
    pages = FETCH_RECORDS // PAGE_RECORDS
    accept = [(b"host", b"127.0.0.1:8080"), (b"accept", b"application/json")]

    async def fetches(n: int) -> None:
        for i in range(n):
            query = f"offset={i % pages * PAGE_RECORDS}&max_records={PAGE_RECORDS}".encode()
            answer = await app.call("GET", PAGE_PATH, query, accept, b"")
            if len(answer[1]["body"]) < PAGE_RECORDS * 100:
                raise RuntimeError(f"a short page: {answer[1]['body'][:200]!r}")

    await fetches(min(pages, requests))
    cpu = _measure_start(instrument)
    await fetches(requests)
    cpu = _measure_end(instrument, cpu)
    await app.stop()
    return cpu / requests


def _measure_start(instrument: bool) -> float:
    if instrument:
        _callgrind("-i", "on")
    return time.process_time()


def _measure_end(instrument: bool, cpu: float) -> float:
    cpu = time.process_time() - cpu
    if instrument:
        _callgrind("-i", "off")
        _callgrind("-d", "measured")
    return cpu


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
        "--cut",
        args.cut,
        "--instrumented",
        *(["--fetch"] if args.fetch else []),
        *(["--server"] if args.server else []),
    ]
    subprocess.run(cmd, check=True, stderr=subprocess.DEVNULL)
    dumps = sorted(out.glob("callgrind.*.1"))
    if not dumps:
        print("callgrind wrote no dump", file=sys.stderr)
        return 1
    totals = [line for line in dumps[0].read_text().splitlines() if line.startswith("totals:")]
    measured = args.requests if args.fetch else args.requests // args.concurrency * args.concurrency
    what = "fetch" if args.fetch else "request"
    print(f"{int(totals[0].split()[1]) / measured:,.0f} instructions per {what} ({dumps[0]})")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=6400)
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--acks", default="1", choices=["0", "1", "all"])
    parser.add_argument("--auth", default="none", choices=["none", "ignored", "quota"])
    parser.add_argument(
        "--cut", default="none", choices=CUTS, help="stop each produce there (see _cut)"
    )
    parser.add_argument("--callgrind", action="store_true", help="count instructions instead")
    parser.add_argument(
        "--fetch", action="store_true", help="1,000-record JSON fetches, not small produces"
    )
    parser.add_argument(
        "--server",
        action="store_true",
        help="send HTTP/1.1 bytes through the broker's server (uvicorn and its protocol), uvloop",
    )
    parser.add_argument("--instrumented", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.callgrind:
        return _under_callgrind(args)
    if args.fetch:
        per_fetch = asyncio.run(serve_fetches(args.requests, args.instrumented))
        print(f"{per_fetch * 1e6:.1f} µs CPU per 1,000-record JSON fetch")
        return 0
    if args.server:
        import uvloop

        per_request = uvloop.run(
            serve_http(
                args.requests, args.concurrency, args.acks, args.instrumented, args.cut, args.auth
            )
        )
    else:
        per_request = asyncio.run(
            serve(
                args.requests, args.concurrency, args.acks, args.instrumented, args.auth, args.cut
            )
        )
    print(f"{per_request * 1e6:.1f} µs CPU per request ({args.concurrency} concurrent callers)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
