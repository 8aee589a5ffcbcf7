"""Run a broker: uvicorn serving the Logbus app, with a prompt shutdown for long-polls.

Start order: bind the listening socket, then lock the data directory, then open it (in the
app's lifespan). A broker that cannot bind its port, or finds the directory locked by another
broker, exits with status 1 and one line on stderr, having changed nothing in the directory.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import gc
import logging
import signal
import socket
import ssl
import sys
from types import FrameType
from typing import TYPE_CHECKING, Any

import uvicorn
from starlette.types import ASGIApp

from core_log.datadir import DataDirInUseError, DataDirLock

from .settings import Settings

if TYPE_CHECKING:
    from .budgets import Budgets
    from .fastpath import FastPath


def serve(settings: Settings) -> int:
    """Serve until SIGTERM/SIGINT; refuse a non-loopback bind without auth (exit 2)."""
    if not settings.is_loopback and not settings.insecure and not settings.auth:
        print(
            f"refusing to bind {settings.host}: authentication is not configured. "
            "Bind 127.0.0.1, pass --auth (LOGBUS_AUTH=true), or pass --insecure "
            "(LOGBUS_INSECURE=true) to accept the risk.",
            file=sys.stderr,
        )
        return 2
    try:
        tls_context(settings)
    except (OSError, ssl.SSLError) as e:
        print(f"cannot serve TLS: {e}", file=sys.stderr)
        return 1
    try:
        sock = bind_socket(settings.host, settings.port)
    except OSError as e:
        print(
            f"cannot listen on {settings.host}:{settings.port}: {e.strerror or e}; "
            f"data directory {settings.data_dir.resolve()} left untouched",
            file=sys.stderr,
        )
        return 1
    dir_lock = DataDirLock(settings.data_dir)
    try:
        dir_lock.acquire()
    except (DataDirInUseError, OSError) as e:
        sock.close()
        print(f"cannot start: {e}", file=sys.stderr)
        return 1
    try:
        _run(settings, sock, dir_lock)
    finally:
        sock.close()
        dir_lock.release()
    return 0


_CERT_REQS = {"none": ssl.CERT_NONE, "requested": ssl.CERT_OPTIONAL, "required": ssl.CERT_REQUIRED}


def tls_context(settings: Settings) -> ssl.SSLContext | None:
    """The client listener's TLS context (None without TLS), built as uvicorn builds it from
    the same settings: loading it before binding makes a bad file an error line at start."""
    if settings.ssl_certfile is None:
        return None
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(settings.ssl_certfile, settings.ssl_keyfile)
    if settings.ssl_cafile is not None:
        context.load_verify_locations(settings.ssl_cafile)
    context.verify_mode = _CERT_REQS[settings.ssl_client_auth]
    return context


def bind_socket(host: str, port: int) -> socket.socket:
    """A TCP socket bound to ``host:port`` (not yet listening: uvicorn listens once the app has
    started). Family and ``SO_REUSEADDR`` as uvicorn chooses them when it binds itself."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
    except OSError:
        sock.close()
        raise
    return sock


def _run(settings: Settings, sock: socket.socket, dir_lock: DataDirLock) -> None:
    base = f"{settings.scheme}://{settings.host}:{settings.port}"
    print(f"Logbus API:  {base}/v1", flush=True)
    print(f"Docs UI:     {base}/docs", flush=True)
    print(f"Data dir:    {settings.data_dir.resolve()}", flush=True)
    # Imported only once the port and the directory are ours (the app costs ~1-3 s of imports):
    # a broker that cannot have them says so at once.
    from .app import create_app
    from .budgets import Budgets
    from .connections import connection_cap, raise_open_file_limit

    tune_allocator()
    tune_gc()
    open_files = raise_open_file_limit()
    cap = connection_cap(settings.max_connections, open_files, settings.max_open_handles)
    budgets = Budgets.from_settings(settings, cap)
    print(f"Connections: at most {cap} (open-file limit {open_files})", flush=True)
    app = create_app(settings, dir_lock, budgets)
    asgi: ASGIApp = app
    if (rate := settings.access_log_rate) > 0:
        from . import access_log

        _log_to_stderr(access_log.log)
        asgi = access_log.AccessLog(app, rate)
    config = uvicorn_config(settings, asgi, budgets)
    _Server(config, app).run(sockets=[sock])


def uvicorn_config(settings: Settings, asgi: ASGIApp, budgets: Budgets) -> uvicorn.Config:
    """How the broker runs uvicorn: its own HTTP and WebSocket protocols (:mod:`api.connections`)
    bound to ``budgets``' connection gate. (Also what ``benchmarks.request_cost --server``
    serves through.)"""
    from .connections import protocols

    http, ws = protocols(
        budgets.gate,
        settings.header_timeout_ms,
        settings.body_timeout_ms,
        settings.send_timeout_ms,
        peer_mapping=settings.ssl_principal_mapping if settings.ssl_client_auth != "none" else None,
    )
    return uvicorn.Config(
        asgi,
        host=settings.host,
        port=settings.port,
        http=http,
        ws=ws,
        log_level="warning",
        timeout_graceful_shutdown=10,
        # Logbus has its own access log (api.access_log); uvicorn's, even at level warning,
        # formats each answer's client and quoted path before its logger drops the line.
        access_log=False,
        # Nothing in Logbus reads a request's client address or scheme, which is all that
        # X-Forwarded-For and X-Forwarded-Proto from a trusted proxy would change.
        proxy_headers=False,
        # Every answer's "server: uvicorn" header: one header less to write, and no
        # advertisement of the software behind the broker.
        server_header=False,
        timeout_keep_alive=settings.keep_alive_timeout_ms / 1000,  # type: ignore[arg-type]
        limit_concurrency=None,  # connections.py caps connections; no 503 for everyone
        backlog=2048,
        ws_max_size=settings.max_ws_message_bytes,
        ws_per_message_deflate=settings.ws_compression,
        **_uvicorn_tls(settings),
    )


def _uvicorn_tls(settings: Settings) -> dict[str, Any]:
    if settings.ssl_certfile is None:
        return {}
    return {
        "ssl_certfile": str(settings.ssl_certfile),
        "ssl_keyfile": None if settings.ssl_keyfile is None else str(settings.ssl_keyfile),
        "ssl_ca_certs": None if settings.ssl_cafile is None else str(settings.ssl_cafile),
        "ssl_cert_reqs": _CERT_REQS[settings.ssl_client_auth],
    }


def _log_to_stderr(logger: logging.Logger) -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(asctime)s %(message)s"))
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    logger.propagate = False


# Allocations of container objects (less deallocations) between two collections of the
# youngest generation; Python's default is 700.
GC_GEN0_THRESHOLD = 10_000


def tune_gc() -> None:
    """Collect the youngest generation less often than Python's default.

    A request allocates and frees many containers (coroutines, frames, dicts) and keeps a
    few alive until it is answered; with 64 requests in flight the default threshold ran a
    collection every few requests, each walking every live request's objects: ≈ 5 % of a
    one-record produce's instructions through the broker's server (``python -m
    benchmarks.request_cost --server --callgrind``: ≈ 417 k a request at 700, 411 k at 2,000,
    390-396 k at 5,000, 10,000 and 50,000). Garbage that only the collector frees (cycles)
    waits for at most this many allocations more, a few megabytes at most.
    """
    gc.set_threshold(GC_GEN0_THRESHOLD, *gc.get_threshold()[1:])


# glibc's mallopt parameters (malloc.h) and the values the broker sets.
_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
MMAP_THRESHOLD_BYTES = 64 * 1024 * 1024
TRIM_THRESHOLD_BYTES = 128 * 1024 * 1024


def tune_allocator() -> None:
    """Keep buffers of up to 64 MiB on the heap instead of a fresh mmap each.

    By default glibc maps every allocation of 128 KiB or more anew (the threshold only rises
    once such a block is freed), so each 1 MiB read of a segment page-faulted 256 fresh pages
    in: binary WebSocket push ran at 4.6 M records/s until some larger buffer had been freed,
    and at 12-16 M/s after (benchmarks/consumers.py, docs/benchmarks.md). Freed heap memory
    above 128 MiB is still returned to the system. Not glibc (no ``mallopt``): nothing to do.
    """
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return
    mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES)
    mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD_BYTES)


class _Server(uvicorn.Server):
    """uvicorn, plus: on SIGTERM/SIGINT, answer every pending long-poll at once.

    Otherwise a long-poll keeps its connection busy for up to ``wait_ms`` and the graceful
    shutdown waits for it (or cuts it off with a 500 after its timeout).
    """

    def __init__(self, config: uvicorn.Config, app: FastPath) -> None:
        super().__init__(config)
        self.logbus_app = app
        # Why the server stopped, for the last line it prints: a signal, or its own end (a
        # failed start-up — the port taken, the data directory unusable — ends it too).
        self.stop_reason = "the server exited (start-up failed or it was told to stop)"

    async def _serve(self, sockets: list[socket.socket] | None = None) -> None:
        # The line is printed here, not after run(): uvicorn re-raises a captured SIGTERM once
        # serving ends, which kills the process before run() returns.
        try:
            await super()._serve(sockets)
        finally:
            print(f"Logbus stopped: {self.stop_reason}", flush=True)

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        self.stop_reason = f"signal {signal.Signals(sig).name}"
        state = self.logbus_app.state
        if state is not None:
            with contextlib.suppress(RuntimeError):  # no loop running: nothing to release
                loop = asyncio.get_running_loop()
                loop.call_soon_threadsafe(state.broker.logs.release_waiters)
        super().handle_exit(sig, frame)
