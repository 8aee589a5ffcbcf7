"""A fork server that starts broker processes with their modules already imported.

Why: on this machine a broker's start is mostly the interpreter importing FastAPI, pydantic,
SQLAlchemy, Alembic, psycopg and h2 — about 2 s of CPU when idle, 10 s and more when other work
loads the 2 cores (load 10, measured by sampling a restarting broker's stacks: 10.5 of its
12.5 s to ready went to imports). The suite starts a few hundred brokers, so imports were
minutes of it. The tests are about what a broker does, not about the interpreter's imports, so
:class:`tests.server.BrokerProcess` forks brokers from here. The tests whose subject *is* the
start (``logbus serve`` / ``cluster up`` / the installed entry point) run the CLI as a user
would.

Theory of operation
-------------------
* :class:`Zygote` runs ``python -m tests.zygote``. It imports the broker's modules once, then
  reads one JSON command a line on stdin: ``{"argv": [...], "env": {...}, "log": path,
  "cwd": dir}``. For each it forks a child, answers ``{"pid": N}`` on stdout, and the child — a
  new process with nothing but the imported code in common with its siblings (no thread,
  socket, file or event loop exists in the zygote when it forks) — replaces its environment
  with ``env``, changes to ``cwd``, sends stdout and stderr to ``log``, and runs
  ``api.cli.main(argv)`` as ``logbus serve`` would.
* The zygote is single-threaded (a fork from a threaded process may copy a held lock): it
  waits on stdin with a short ``select`` timeout and reaps exited children between commands,
  reporting ``{"exit": pid, "status": code}`` (negative: killed by that signal, like
  ``subprocess``). A test kills a child by its pid (SIGKILL, SIGSTOP, ... reach it directly:
  it is an ordinary process).
* EOF on stdin (the test run ended, or its process died) SIGKILLs every child still running
  and exits, so no broker outlives the run.
* What differs from a fresh interpreter: only module state set at import. Settings are read
  from the environment when the broker starts, so per-broker ``LOGBUS_*`` variables apply; the
  one module that reads the environment at import (``core_log.fileio``'s unsynced-write
  journal) is re-read in the child. ``random`` reseeds itself in a forked child.
* ``LOGBUS_TEST_FORK=0`` makes every test broker a fresh interpreter again (to compare).
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import queue
import select
import signal
import subprocess
import sys
import threading
import traceback
from pathlib import Path
from typing import Any, Final

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
        os.chdir(command.get("cwd") or os.getcwd())
        from api import cli
        from core_log import fileio

        fileio.ops = fileio.ops_from_environment()
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


# --- the test's end ---------------------------------------------------------------------------

# The zygote answers its first fork once it imported the broker's modules: 3 s of CPU, but 116 s
# of wall time when the load average was 35 on 2 cores. A bound that only fails a hang.
ZYGOTE_START_S: Final = 300.0
CLOSE_S: Final = 60.0


class ZygoteChild:
    """A broker forked by the :class:`Zygote`, with the part of ``subprocess.Popen``'s API
    :class:`api.process.BrokerProcess` uses (``pid``, ``poll``, ``wait``, ``kill``,
    ``send_signal``)."""

    def __init__(self, zygote: Zygote, pid: int) -> None:
        self.zygote = zygote
        self.pid = pid
        self.returncode: int | None = None

    def poll(self) -> int | None:
        self.returncode = self.zygote.exit_status(self.pid)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        status = self.zygote.wait_exit(self.pid, timeout)
        if status is None:
            raise subprocess.TimeoutExpired(f"broker {self.pid}", timeout or 0.0)
        self.returncode = status
        return status

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, sig)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


class Zygote:
    """The test's end of the fork server (see the module docstring)."""

    def __init__(self) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "tests.zygote"], stdin=subprocess.PIPE, stdout=subprocess.PIPE
        )
        self._lock = threading.Lock()  # one spawn at a time: answers come in order
        self._exits: dict[int, int] = {}
        self._pids: queue.Queue[int | None] = queue.Queue()
        self._changed = threading.Condition()
        self._reader = threading.Thread(target=self._read, name="zygote-reader", daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            message = json.loads(line)
            if "pid" in message:
                self._pids.put(int(message["pid"]))
            else:
                with self._changed:
                    self._exits[int(message["exit"])] = int(message["status"])
                    self._changed.notify_all()
        self._pids.put(None)  # the zygote died: a waiting spawn fails

    def alive(self) -> bool:
        return self.proc.poll() is None

    def spawn(
        self, argv: list[str], env: dict[str, str], log: Path, cwd: str | None = None
    ) -> ZygoteChild:
        assert self.proc.stdin is not None
        command = {"argv": argv, "env": env, "log": str(log), "cwd": cwd or os.getcwd()}
        with self._lock:
            self.proc.stdin.write(json.dumps(command).encode() + b"\n")
            self.proc.stdin.flush()
            pid = self._pids.get(timeout=ZYGOTE_START_S)
        if pid is None:
            raise RuntimeError(f"the zygote exited with {self.proc.poll()}")
        return ZygoteChild(self, pid)

    def exit_status(self, pid: int) -> int | None:
        with self._changed:
            return self._exits.get(pid)

    def wait_exit(self, pid: int, timeout: float | None) -> int | None:
        with self._changed:
            self._changed.wait_for(lambda: pid in self._exits, timeout)
            return self._exits.get(pid)

    def close(self) -> None:
        """EOF: the zygote SIGKILLs any child still running, reaps them and exits."""
        with contextlib.suppress(OSError):
            assert self.proc.stdin is not None
            self.proc.stdin.close()
        try:
            self.proc.wait(timeout=CLOSE_S)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self._reader.join(CLOSE_S)
        if self.proc.stdout is not None:
            self.proc.stdout.close()


_shared: Zygote | None = None
_shared_lock = threading.Lock()


def forking() -> bool:
    """Whether test brokers are forked (the default) or fresh interpreters."""
    return os.environ.get("LOGBUS_TEST_FORK", "1") != "0"


def shared() -> Zygote:
    """The test run's zygote, started on first use (and again if it died), closed at exit."""
    global _shared
    with _shared_lock:
        if _shared is None or not _shared.alive():
            _shared = Zygote()
            atexit.register(_shared.close)
        return _shared


if __name__ == "__main__":
    raise SystemExit(main())
