"""The ``logbus`` command: run a broker, or talk to one over HTTP."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import sys
from pathlib import Path
from types import FrameType

import uvicorn

from .fastpath import FastPath
from .settings import Settings

DEFAULT_URL = "http://127.0.0.1:8080"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="logbus", description="Logbus event streaming")
    sub = parser.add_subparsers(dest="command", required=True)

    serve = sub.add_parser("serve", help="run a broker")
    serve.add_argument("--data-dir", type=Path)
    serve.add_argument("--host")
    serve.add_argument("--port", type=int)
    serve.add_argument("--broker-id", type=int)
    serve.add_argument("--metadata-url", help="SQLAlchemy URL (default: SQLite in the data dir)")
    serve.add_argument(
        "--insecure",
        action="store_true",
        help="allow binding a non-loopback address without authentication",
    )
    serve.add_argument("--no-fast-path", action="store_true", help=argparse.SUPPRESS)
    serve.set_defaults(func=_serve)

    from . import client_cli

    client_cli.add_commands(sub)

    args = parser.parse_args(argv)
    result: int = args.func(args)
    return result


def _serve(args: argparse.Namespace) -> int:
    from .app import create_app

    overrides = {
        k: v
        for k, v in {
            "data_dir": args.data_dir,
            "host": args.host,
            "port": args.port,
            "broker_id": args.broker_id,
            "metadata_url": args.metadata_url,
            "insecure": args.insecure or None,
            "fast_path": False if args.no_fast_path else None,
        }.items()
        if v is not None
    }
    settings = Settings(**overrides)
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
    app = create_app(settings)
    config = uvicorn.Config(
        app,
        host=settings.host,
        port=settings.port,
        log_level="warning",
        timeout_graceful_shutdown=10,
        limit_concurrency=10_000,
        backlog=2048,
    )
    _Server(config, app).run()
    return 0


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


if __name__ == "__main__":
    raise SystemExit(main())
