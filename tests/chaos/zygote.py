"""A fork server that starts broker processes with their modules already imported.

Why: on this machine a broker's start is mostly the interpreter importing FastAPI, pydantic,
SQLAlchemy, Alembic, psycopg and h2 — about 2 s of CPU when idle, 10 s and more when other test
runs load the 2 cores (load 10, measured by sampling a restarting broker's stacks: 10.5 of its
12.5 s to ready went to imports). A leader-kill cycle restarts a broker, so the imports were
most of a cycle. The chaos tests are about what a broker does with its disk and the store after
a SIGKILL, not about the interpreter's imports (``tests/cluster`` starts brokers with
``python -m api.cli serve``), so they start brokers from here.

Theory of operation
-------------------
* The harness runs ``python -m tests.chaos.zygote``. It imports the broker's modules once, then
  reads one JSON command a line on stdin: ``{"argv": [...], "env": {...}, "log": path}``. For
  each it forks a child, answers ``{"pid": N}`` on stdout, and the child — a new process with
  nothing but the imported code in common with its siblings (no thread, socket, file or event
  loop exists in the zygote when it forks) — replaces its environment with ``env``, sends
  stdout and stderr to ``log``, and runs ``api.cli.main(argv)`` as ``logbus serve`` would.
* The zygote is single-threaded (a fork from a threaded process may copy a held lock): it
  waits on stdin with a short ``select`` timeout and reaps exited children between commands,
  reporting ``{"exit": pid, "status": code}`` (negative: killed by that signal, like
  ``subprocess``). The harness kills a child by its pid (SIGKILL, SIGSTOP, ... reach it
  directly: it is an ordinary process).
* EOF on stdin (the test ended, or its process died) SIGKILLs every child still running and
  exits, so no broker outlives its test.
* What differs from a fresh interpreter: only module state set at import. Settings are read
  from the environment when the broker starts, so per-broker ``LOGBUS_*`` variables apply; a
  module that reads the environment at import (``core_log.fileio``'s test journal hook) sees
  the harness's, which the chaos tests do not set. ``random`` reseeds itself in a forked child.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import signal
import sys
import traceback
from typing import Any

# What ``logbus serve`` imports before it answers /readyz (api.server imports api.app lazily).
PRELOAD = (
    "api.cli",
    "api.client_cli",
    "api.cluster_cli",
    "api.server",
    "api.app",
    "api.budgets",
    "api.connections",
    "api.fastpath",
    "cluster.broker",
    "cluster.migrate",
    "psycopg",
    "uvicorn.protocols.http.h11_impl",
    "uvicorn.protocols.http.httptools_impl",
    "uvicorn.lifespan.on",
    # ... and what it imports lazily on the way to ready (PYTHONPROFILEIMPORTTIME in a child).
    "api.groups_cli",
    "anyio",
    "httpcore",
    "uvloop",
    "sqlalchemy.dialects.sqlite",
    "sqlalchemy.dialects.postgresql.psycopg",
)
REAP_INTERVAL_S = 0.05  # how late an exit is reported at most, while no command arrives


def _preload() -> None:
    import importlib

    for name in PRELOAD:
        try:
            importlib.import_module(name)
        except ImportError:  # an optional module (httptools): the child imports what it needs
            continue


def _child(command: dict[str, Any]) -> None:
    """In the forked child: become ``logbus serve`` with the command's argv, env and log."""
    code = 1
    try:
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        os.environ.clear()
        os.environ.update(command["env"])
        devnull = os.open(os.devnull, os.O_RDONLY)
        os.dup2(devnull, 0)
        os.close(devnull)
        log = os.open(command["log"], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        os.dup2(log, 1)
        os.dup2(log, 2)
        os.close(log)
        from api import cli

        code = cli.main(list(command["argv"]))
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else 1
    except BaseException:
        traceback.print_exc()
    finally:
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):  # exiting anyway
                stream.flush()
        os._exit(code)


def _status(raw: int) -> int:
    if os.WIFSIGNALED(raw):
        return -os.WTERMSIG(raw)
    return os.WEXITSTATUS(raw) if os.WIFEXITED(raw) else 1


def _say(message: dict[str, int]) -> None:
    sys.stdout.write(json.dumps(message) + "\n")
    sys.stdout.flush()


def _reap(children: set[int]) -> None:
    for pid in list(children):
        try:
            done, raw = os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:
            children.discard(pid)
            continue
        if done:
            children.discard(pid)
            _say({"exit": pid, "status": _status(raw)})


def main() -> int:
    _preload()
    children: set[int] = set()
    stdin = sys.stdin.buffer
    pending = b""
    while True:
        readable, _, _ = select.select([stdin], [], [], REAP_INTERVAL_S)
        _reap(children)
        if not readable:
            continue
        chunk = os.read(stdin.fileno(), 1 << 16)
        if not chunk:
            break
        pending += chunk
        while b"\n" in pending:
            line, pending = pending.split(b"\n", 1)
            if not line.strip():
                continue
            command = json.loads(line)
            sys.stdout.flush()
            pid = os.fork()
            if pid == 0:
                _child(command)
            children.add(pid)
            _say({"pid": pid})
    for pid in children:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            continue
    for pid in children:
        try:
            os.waitpid(pid, 0)
        except ChildProcessError:
            continue
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
