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
* The same fork serves short commands run as a user would (:func:`run`: ``logbus topics
  list``, ``logbus produce`` with lines on stdin, ...) and other pre-importable programs
  (``main``: ``"module:function"``, e.g. the consume-transform-produce loop a test SIGKILLs 20
  times). Such a command names files for its stdin, stdout and stderr, and exits as a fresh
  interpreter would: ``SystemExit(None)`` is 0, ``SystemExit("text")`` prints the text and is
  1, an uncaught exception prints its traceback and is 1, non-daemon threads are joined and
  ``atexit`` functions run. Why: the CLI tests ran ~100 ``python -m api.cli`` processes at 1-2
  s of imports each (more under load); a fork answers in ~0.1 s.
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
import tempfile
import threading
import traceback
from collections.abc import Callable
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
    """In the forked child: become ``logbus serve`` with the command's argv, env and log, or
    (``main``, ``stdin``, ``stdout``, ``stderr`` given) the program it names, exiting like a
    fresh interpreter (module docstring)."""
    code = 1
    program = "stdout" in command
    try:
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        os.environ.clear()
        os.environ.update(command["env"])
        _redirect(0, command.get("stdin") or os.devnull, os.O_RDONLY)
        out_flags = os.O_WRONLY | os.O_CREAT | os.O_APPEND
        _redirect(1, command.get("stdout") or command["log"], out_flags)
        _redirect(2, command.get("stderr") or command["log"], out_flags)
        os.chdir(command.get("cwd") or os.getcwd())
        from core_log import fileio

        fileio.ops = fileio.ops_from_environment()
        result = _main_of(command.get("main") or "api.cli:main")(list(command["argv"]))
        code = 0 if result is None else result
    except SystemExit as e:
        code = _exit_code(e) if program else (e.code if isinstance(e.code, int) else 1)
    except BaseException:
        traceback.print_exc()
    finally:
        if program:
            _interpreter_exit()
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):  # exiting anyway
                stream.flush()
        os._exit(code)


def _redirect(fd: int, path: str, flags: int) -> None:
    opened = os.open(path, flags, 0o644)
    os.dup2(opened, fd)
    os.close(opened)


def _main_of(name: str) -> Callable[[list[str]], int | None]:
    """``"module:function"``: the function, imported (from the preloaded modules if there)."""
    import importlib

    module, _, function = name.partition(":")
    main: Callable[[list[str]], int | None] = getattr(importlib.import_module(module), function)
    return main


def _exit_code(e: SystemExit) -> int:
    """The status a fresh interpreter exits with for an uncaught ``SystemExit``."""
    if e.code is None:
        return 0
    if isinstance(e.code, int):
        return e.code
    print(e.code, file=sys.stderr)
    return 1


def _interpreter_exit() -> None:
    """What a fresh interpreter does at its end before its exit: wait for non-daemon threads,
    run the ``atexit`` functions."""
    for thread in threading.enumerate():
        if thread is not threading.main_thread() and not thread.daemon:
            thread.join()
    with contextlib.suppress(Exception):
        atexit._run_exitfuncs()


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
        self,
        argv: list[str],
        env: dict[str, str],
        log: Path,
        cwd: str | None = None,
        *,
        main: str | None = None,
        stdin: Path | None = None,
        stdout: Path | None = None,
        stderr: Path | None = None,
    ) -> ZygoteChild:
        """Fork a broker (``logbus serve``'s argv, output to ``log``), or with ``stdout``
        given, the program ``main`` (``"module:function"``, default ``api.cli:main``) with
        ``stdin`` (default ``/dev/null``), ``stdout`` and ``stderr`` (default ``log``)."""
        assert self.proc.stdin is not None
        command: dict[str, Any] = {
            "argv": argv,
            "env": env,
            "log": str(log),
            "cwd": cwd or os.getcwd(),
        }
        if stdout is not None:
            command.update(main=main, stdout=str(stdout), stderr=str(stderr or log))
            command.update(stdin=str(stdin) if stdin is not None else None)
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


def run(
    argv: list[str],
    *,
    input: str | None = None,
    env: dict[str, str] | None = None,
    cwd: Path | str | None = None,
    timeout: float = 60.0,
    main: str = "api.cli:main",
) -> subprocess.CompletedProcess[str]:
    """``subprocess.run([python, -m, api.cli, *argv], input=..., capture_output=True,
    text=True, ...)``, forked from the shared zygote (``main`` names another program);
    ``LOGBUS_TEST_FORK=0`` runs a fresh interpreter. Raises ``subprocess.TimeoutExpired``
    (the child killed) like ``subprocess.run``."""
    env = dict(os.environ if env is None else env)
    module = main.partition(":")[0]
    if not forking():
        return subprocess.run(
            [sys.executable, "-m", module, *argv],
            input=input,
            capture_output=True,
            text=True,
            timeout=timeout,
            cwd=cwd,
            env=env,
        )
    with tempfile.TemporaryDirectory(prefix="zygote-run-") as tmp:
        files = Path(tmp)
        stdin = files / "stdin"
        stdin.write_text(input or "")
        out, err = files / "stdout", files / "stderr"
        out.touch()
        err.touch()
        child = shared().spawn(
            argv,
            env,
            err,
            str(cwd) if cwd is not None else None,
            main=main,
            stdin=stdin,
            stdout=out,
            stderr=err,
        )
        try:
            status = child.wait(timeout)
        except subprocess.TimeoutExpired:
            child.kill()
            child.wait(CLOSE_S)
            raise
        return subprocess.CompletedProcess(
            [module, *argv], status, out.read_text(), err.read_text()
        )


if __name__ == "__main__":
    raise SystemExit(main())
