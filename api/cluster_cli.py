"""``logbus cluster up``: a local cluster of broker processes, for trying the cluster out.
(``logbus cluster drain`` is a client command: see :mod:`api.client_cli`.)

Theory of operation. The command migrates the metadata store once (Alembic, as ``logbus
metadata upgrade`` does; brokers would race to create a fresh SQLite file otherwise), then
starts N ``logbus serve`` children on loopback ports sharing that store (by default
``sqlite:///{data_dir}/metadata.db``: SQLite serialises the brokers' writes, which is all one
host needs), each with its own data directory ``{data_dir}/broker-{id}`` and its log in
``{data_dir}/broker-{id}.log``, one after another, each once the previous one answers
``/readyz`` (bounded by ``READY_TIMEOUT_S``). It prints each broker's URL and the metadata
URL, and then supervises:

- Ctrl-C or SIGTERM: every broker gets SIGTERM at once (a graceful shutdown writes the
  clean-shutdown marker, so the next start skips log recovery), and SIGKILL after
  ``STOP_TIMEOUT_S``; the command exits 0 when every broker stopped by itself.
- A broker that dies on its own (a crash, or ``kill -9`` to watch a failover) is reported
  with the end of its log and restarted on the same port and data directory: the point of a
  cluster is to survive that, and the restarted broker rejoins as a follower. A broker that
  does not come back ready, or dies more than ``MAX_RESTARTS`` times, stops the whole cluster
  and the command exits 1 (a crash loop should be looked at, not hidden).

The children run in their own session, so a terminal's Ctrl-C reaches this process only and
each broker gets exactly one signal (uvicorn treats a second one as "exit now"); on Linux they
also get SIGTERM if this process dies without cleaning up (``PR_SET_PDEATHSIG``), so no
broker outlives it. Ports are ``--base-port + i`` when given (checked free first: a taken one
fails at once with one line), else ephemeral ports the kernel picks.
"""

from __future__ import annotations

import argparse
import ctypes
import io
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType

import httpx

from .process import free_port

READY_TIMEOUT_S = 60.0  # a broker start (recovery of a large log included) must fit in this
STOP_TIMEOUT_S = 30.0  # a graceful shutdown flushes and closes; past this, SIGKILL
MAX_RESTARTS = 5  # per broker and run: more looks like a crash loop
POLL_S = 0.2  # how often the supervisor looks at its children (they live in other processes)
LOG_TAIL_BYTES = 2000
_PR_SET_PDEATHSIG = 1


def add_commands(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    cluster = sub.add_parser("cluster", help="run a local cluster of brokers")
    csub = cluster.add_subparsers(dest="cluster_command", required=True)
    up = csub.add_parser(
        "up",
        help="start N brokers on this host sharing one metadata store; Ctrl-C stops them",
    )
    up.add_argument("--brokers", type=int, default=3, help="how many (default: %(default)s)")
    up.add_argument(
        "--metadata-url", help="SQLAlchemy URL (default: sqlite:///{data-dir}/metadata.db)"
    )
    up.add_argument(
        "--data-dir",
        type=Path,
        default=Path("./logbus-cluster"),
        help="brokers' data in DATA_DIR/broker-N, logs in DATA_DIR/broker-N.log "
        "(default: %(default)s)",
    )
    up.add_argument("--host", default="127.0.0.1", help="bind address (default: %(default)s)")
    up.add_argument(
        "--base-port",
        type=int,
        help="broker N listens on BASE_PORT+N-1 (default: free ports chosen by the system)",
    )
    up.add_argument(
        "--insecure",
        action="store_true",
        help="passed to every broker: allow a non-loopback --host without authentication",
    )
    up.set_defaults(func=cluster_up)
    from .client_cli import add_drain

    add_drain(csub)


@dataclass
class _Member:
    broker_id: int
    port: int
    cmd: list[str]
    data_dir: Path
    log_path: Path
    url: str
    env: dict[str, str]
    proc: subprocess.Popen[bytes] | None = None
    restarts: int = 0
    exit_codes: list[int] = field(default_factory=list)

    def start(self) -> None:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(
                self.cmd,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=self.env,
                start_new_session=True,
                # preexec_fn is unsafe with threads; this process starts none.
                preexec_fn=_die_with_parent if sys.platform == "linux" else None,
            )

    def log_tail(self) -> str:
        try:
            with open(self.log_path, "rb") as f:
                f.seek(max(0, f.seek(0, os.SEEK_END) - LOG_TAIL_BYTES))
                return f.read().decode(errors="replace")
        except OSError:
            return ""


def _die_with_parent() -> None:
    """In the child before exec: SIGTERM when the parent dies, so no broker is orphaned."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)


def _fail(message: str) -> int:
    print(f"logbus cluster up: {message}", file=sys.stderr, flush=True)
    return 1


def _port_taken(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as s:
        # The brokers set SO_REUSEADDR too (uvicorn does): a port in TIME_WAIT is usable.
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return True
    return False


def _url_host(host: str) -> str:
    """The host name clients use: a wildcard bind is reached on loopback."""
    if host in ("0.0.0.0", ""):
        return "127.0.0.1"
    if host == "::":
        return "[::1]"
    return f"[{host}]" if ":" in host else host


class _Stop:
    """Set by SIGINT/SIGTERM; the supervisor and the readiness waits look at it."""

    def __init__(self) -> None:
        self.event = threading.Event()
        self.signal: str | None = None

    def __call__(self, sig: int, frame: FrameType | None) -> None:
        self.signal = signal.Signals(sig).name
        self.event.set()


def cluster_up(args: argparse.Namespace) -> int:
    if isinstance(sys.stdout, io.TextIOWrapper):  # each line as it happens, even into a pipe
        sys.stdout.reconfigure(line_buffering=True)
    n: int = args.brokers
    if not 1 <= n <= 64:
        return _fail(f"--brokers must be between 1 and 64, not {n}")
    host: str = args.host
    data_dir: Path = args.data_dir.resolve()
    if args.base_port is not None:
        ports = [args.base_port + i for i in range(n)]
        if ports[0] < 1 or ports[-1] > 65535:
            return _fail(f"ports {ports[0]}-{ports[-1]} are not all valid TCP ports")
        taken = [p for p in ports if _port_taken(host, p)]
        if taken:
            return _fail(
                f"port {taken[0]} on {host} is in use; choose another --base-port "
                f"(brokers need {ports[0]}-{ports[-1]})"
            )
    else:
        ports = []
        while len(ports) < n:  # the kernel may hand the same ephemeral port out twice
            if (p := free_port(host)) not in ports:
                ports.append(p)
    try:
        data_dir.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        return _fail(f"cannot create the data directory {data_dir}: {e}")
    url: str = args.metadata_url or f"sqlite:///{data_dir / 'metadata.db'}"
    from cluster import migrate  # SQLAlchemy and Alembic: only for this command

    try:
        revision = migrate.upgrade_url(url)[1]
    except Exception as e:  # any driver's error: say which store and why, in one line
        return _fail(f"cannot migrate the metadata store {_shown(url)}: {type(e).__name__}: {e}")

    # The URL reaches the brokers in their environment, not on their command line: a password
    # in it would show in every `ps`.
    env = {**os.environ, "LOGBUS_METADATA_URL": url}
    members = []
    for i, port in enumerate(ports, start=1):
        public = f"http://{_url_host(host)}:{port}"
        cmd = [
            sys.executable,
            "-m",
            "api.cli",
            "serve",
            "--broker-id",
            str(i),
            "--data-dir",
            str(data_dir / f"broker-{i}"),
            "--host",
            host,
            "--port",
            str(port),
            "--advertised-url",
            public,
            *(["--insecure"] if args.insecure else []),
        ]
        members.append(
            _Member(
                i, port, cmd, data_dir / f"broker-{i}", data_dir / f"broker-{i}.log", public, env
            )
        )

    stop = _Stop()
    previous = {s: signal.signal(s, stop) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        return _run(members, url, revision, stop)
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)


def _shown(url: str) -> str:
    """The URL as printed: a password becomes ***."""
    import sqlalchemy as sa

    try:
        return sa.engine.make_url(url).render_as_string(hide_password=True)
    except sa.exc.ArgumentError:
        return url


def _run(members: list[_Member], url: str, revision: str, stop: _Stop) -> int:
    print(f"metadata store: {_shown(url)} (schema {revision})")
    try:
        # One after another: brokers registering at the same instant on one SQLite file
        # have failed with "database is locked" (a read transaction upgraded to a write).
        for m in members:
            m.start()
            if (error := _wait_ready(m, stop)) is not None:
                _stop_all(members)
                return _fail(error) if not stop.event.is_set() else 0
            assert m.proc is not None
            print(
                f"broker {m.broker_id}: {m.url}  "
                f"(pid {m.proc.pid}, data {m.data_dir}, log {m.log_path})"
            )
        print(f"{len(members)} brokers up; Ctrl-C stops them all.", flush=True)
        code = _supervise(members, stop)
    except BaseException:
        _stop_all(members)
        raise
    clean = _stop_all(members)
    return code if code != 0 or clean else 1


def _wait_ready(m: _Member, stop: _Stop) -> str | None:
    """None once ``/readyz`` answers 200; else why not (the broker exited, or never got
    ready within the bound). Returns None early when told to stop (the caller checks)."""
    deadline = time.monotonic() + READY_TIMEOUT_S
    with httpx.Client(timeout=1.0) as http:
        while not stop.event.is_set():
            assert m.proc is not None
            if (code := m.proc.poll()) is not None:
                return (
                    f"broker {m.broker_id} exited with {code} before it was ready; "
                    f"the end of {m.log_path}:\n{m.log_tail()}"
                )
            try:
                if http.get(f"{m.url}/readyz").status_code == 200:
                    return None
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline:
                return f"broker {m.broker_id} not ready after {READY_TIMEOUT_S:.0f} s: {m.log_path}"
            stop.event.wait(POLL_S)
    return "stopped"


def _supervise(members: list[_Member], stop: _Stop) -> int:
    """Until a signal: restart brokers that die. 0 after a signal, 1 when a broker cannot be
    brought back."""
    while not stop.event.wait(POLL_S):
        for m in members:
            assert m.proc is not None
            code = m.proc.poll()
            if code is None:
                continue
            m.exit_codes.append(code)
            print(
                f"broker {m.broker_id} (pid {m.proc.pid}) exited unexpectedly with {code}; "
                f"the end of {m.log_path}:\n{m.log_tail()}",
                file=sys.stderr,
                flush=True,
            )
            if m.restarts >= MAX_RESTARTS:
                print(f"broker {m.broker_id} died {len(m.exit_codes)} times: stopping the cluster")
                return 1
            m.restarts += 1
            print(f"restarting broker {m.broker_id} on {m.url}", flush=True)
            m.start()
            if (error := _wait_ready(m, stop)) is not None:
                if stop.event.is_set():
                    break
                print(f"{error}: stopping the cluster", file=sys.stderr, flush=True)
                return 1
            print(f"broker {m.broker_id} is back: {m.url}  (pid {m.proc.pid})", flush=True)
    print(f"{stop.signal or 'stop'}: stopping {len(members)} brokers", flush=True)
    return 0


def _stop_all(members: list[_Member]) -> bool:
    """SIGTERM to every running broker at once, SIGKILL to those still running after
    ``STOP_TIMEOUT_S``. True when every one stopped by itself (exit 0 or by the SIGTERM)."""
    running = [m for m in members if m.proc is not None and m.proc.poll() is None]
    for m in running:
        assert m.proc is not None
        m.proc.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + STOP_TIMEOUT_S
    clean = True
    for m in running:
        assert m.proc is not None
        try:
            code = m.proc.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            m.proc.kill()
            m.proc.wait()
            print(f"broker {m.broker_id} did not stop within {STOP_TIMEOUT_S:.0f} s: killed")
            clean = False
            continue
        if code not in (0, -signal.SIGTERM):
            print(f"broker {m.broker_id} exited with {code}; see {m.log_path}", flush=True)
            clean = False
    if running:
        print(f"{len(running)} brokers stopped", flush=True)
    return clean
