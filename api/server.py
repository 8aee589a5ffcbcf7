"""Run a broker: uvicorn serving the Logbus app, with a prompt shutdown for long-polls."""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import logging
import signal
import socket
import sys
from types import FrameType

import uvicorn
from starlette.types import ASGIApp

from . import access_log
from .app import create_app
from .fastpath import FastPath
from .settings import Settings


def serve(settings: Settings) -> int:
    """Serve until SIGTERM/SIGINT; refuse a non-loopback bind without auth (exit 2)."""
    if not settings.is_loopback and not settings.insecure:
        print(
            f"refusing to bind {settings.host}: authentication is not configured. "
            "Bind 127.0.0.1, or pass --insecure (LOGBUS_INSECURE=true) to accept the risk.",
            file=sys.stderr,
        )
        return 2
    base = f"http://{settings.host}:{settings.port}"
    print(f"Logbus API:  {base}/v1", flush=True)
    print(f"Docs UI:     {base}/docs", flush=True)
    print(f"Data dir:    {settings.data_dir.resolve()}", flush=True)
    tune_allocator()
    app = create_app(settings)
    asgi: ASGIApp = app
    if (rate := settings.access_log_rate) > 0:
        _log_to_stderr(access_log.log)
        asgi = access_log.AccessLog(app, rate)
    config = uvicorn.Config(
        asgi,
        host=settings.host,
        port=settings.port,
        log_level="warning",
        timeout_graceful_shutdown=10,
        limit_concurrency=10_000,
        backlog=2048,
        ws_max_size=settings.max_ws_message_bytes,
        ws_per_message_deflate=settings.ws_compression,
    )
    _Server(config, app).run()
    return 0


def _log_to_stderr(logger: logging.Logger) -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(asctime)s %(message)s"))
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    logger.propagate = False


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
