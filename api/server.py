"""Run a broker: uvicorn serving the Logbus app, with a prompt shutdown for long-polls."""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import sys
from types import FrameType

import uvicorn

from .app import create_app
from .budgets import Budgets
from .connections import connection_cap, protocols, raise_open_file_limit
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
    open_files = raise_open_file_limit()
    cap = connection_cap(settings.max_connections, open_files, settings.max_open_handles)
    budgets = Budgets.from_settings(settings, cap)
    print(f"Connections: at most {cap} (open-file limit {open_files})", flush=True)
    app = create_app(settings, budgets)
    http, ws = protocols(
        budgets.gate,
        settings.header_timeout_ms,
        settings.body_timeout_ms,
        settings.send_timeout_ms,
    )
    config = uvicorn.Config(
        app,
        host=settings.host,
        port=settings.port,
        http=http,
        ws=ws,
        log_level="warning",
        timeout_graceful_shutdown=10,
        timeout_keep_alive=settings.keep_alive_timeout_ms / 1000,  # type: ignore[arg-type]
        limit_concurrency=None,  # connections.py caps connections; no 503 for everyone
        backlog=2048,
        ws_max_size=settings.max_ws_message_bytes,
        ws_per_message_deflate=settings.ws_compression,
    )
    _Server(config, app).run()
    return 0


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

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        state = self.logbus_app.state
        if state is not None:
            with contextlib.suppress(RuntimeError):  # no loop running: nothing to release
                loop = asyncio.get_running_loop()
                loop.call_soon_threadsafe(state.broker.logs.release_waiters)
        super().handle_exit(sig, frame)
