"""A throwaway PostgreSQL server for tests, started from Debian's ``postgresql`` package.

Theory of operation: ``initdb`` a cluster in a fresh temporary directory (about 1 s), start it
with ``pg_ctl`` on a free loopback port with its Unix socket in that same directory (so nothing
needs ``/var/run/postgresql``), trust authentication for the ``postgres`` superuser, and remove
everything at the end. When the test run is root, PostgreSQL refuses to run as root, so every
server command runs as the ``postgres`` system user (``runuser``) and the directory is theirs.

Semantics are the stock ones: ``fsync``, ``synchronous_commit`` and ``full_page_writes`` stay
on, since the cluster tests kill and restart this server and count on committed rows surviving.
The only departures are sizes: ``shared_buffers=32MB`` (the default 128 MB is a lot on a shared
2-core machine) and ``max_connections=200`` (3 brokers with connection pools plus the test's own
connections exceed the default 100 in a long chaos run).

The server can be stopped, started, restarted and paused (SIGSTOP of the postmaster and every
backend) so tests can check that brokers ride out a database outage.
"""

from __future__ import annotations

import contextlib
import glob
import os
import shutil
import signal
import subprocess
import tempfile
from pathlib import Path
from typing import Final

import psycopg

from api.process import free_port

DEBIAN_ROOT: Final = Path("/usr/lib/postgresql")
SUPERUSER: Final = "postgres"
INSTALL_HINT: Final = "apt-get install postgresql (or `make postgres`)"
START_TIMEOUT_S: Final = 60  # pg_ctl -w waits this long; initdb + first start take ~2 s here
COMMAND_TIMEOUT_S: Final = 120.0  # initdb, pg_ctl stop: bound every subprocess
CONNECT_TIMEOUT_S: Final = 10

SERVER_SETTINGS: Final[dict[str, str]] = {
    "listen_addresses": "'127.0.0.1'",
    "shared_buffers": "32MB",
    "max_connections": "200",
    "fsync": "on",
    "synchronous_commit": "on",
    "full_page_writes": "on",
    "logging_collector": "off",
    "log_min_messages": "warning",
}


class PostgresUnavailable(RuntimeError):
    """Debian's PostgreSQL binaries are not installed."""


def find_bin_dir(root: Path = DEBIAN_ROOT) -> Path:
    """The ``bin`` directory of the newest ``<root>/<version>`` (Debian: /usr/lib/postgresql).

    Raises :class:`PostgresUnavailable` (with how to install it) when there is none.
    """
    candidates = [Path(p).parent for p in glob.glob(f"{glob.escape(str(root))}/*/bin/initdb")]
    candidates = [c for c in candidates if (c / "pg_ctl").exists()]
    if not candidates:
        raise PostgresUnavailable(f"PostgreSQL server binaries not found: {INSTALL_HINT}")

    def version(bin_dir: Path) -> tuple[int, ...]:
        name = bin_dir.parent.name
        return tuple(int(p) for p in name.split(".") if p.isdigit())

    return max(candidates, key=version)


class PostgresServer:
    """One PostgreSQL cluster in a temporary directory, listening on 127.0.0.1:``port``.

    Use as a context manager, or call :meth:`start` and :meth:`close`. :meth:`stop`,
    :meth:`start`, :meth:`restart`, :meth:`pause` and :meth:`resume` keep the data and port.
    """

    def __init__(self, bin_dir: Path | None = None, port: int | None = None) -> None:
        self.bin_dir = bin_dir or find_bin_dir()
        self.port = port or free_port()
        self._as_root = os.geteuid() == 0
        self.base_dir = Path(tempfile.mkdtemp(prefix="logbus-pg-"))
        self.data_dir = self.base_dir / "data"
        self.log_path = self.base_dir / "server.log"
        self._initialised = False
        self._paused = False
        if self._as_root:
            shutil.chown(self.base_dir, SUPERUSER, SUPERUSER)

    def __enter__(self) -> PostgresServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- addresses ---------------------------------------------------------------------------

    def url(self, database: str = "postgres") -> str:
        """An SQLAlchemy URL for ``database`` (psycopg 3 driver)."""
        return f"postgresql+psycopg://{SUPERUSER}@127.0.0.1:{self.port}/{database}"

    def dsn(self, database: str = "postgres") -> str:
        """A libpq connection string for ``database`` (for psycopg directly)."""
        return (
            f"host=127.0.0.1 port={self.port} user={SUPERUSER} dbname={database} "
            f"connect_timeout={CONNECT_TIMEOUT_S}"
        )

    # -- lifecycle ---------------------------------------------------------------------------

    def start(self) -> PostgresServer:
        """initdb on first use, then start and wait until it accepts connections."""
        if not self._initialised:
            self._initdb()
        self._pg_ctl("start", "-w", "-t", str(START_TIMEOUT_S), "-l", str(self.log_path))
        return self

    def stop(self, mode: str = "fast") -> None:
        """Stop the server (``mode``: smart, fast or immediate — immediate is a crash)."""
        self.resume()
        self._pg_ctl("stop", "-w", "-m", mode, "-t", str(START_TIMEOUT_S))

    def restart(self, mode: str = "fast") -> None:
        """Stop (with ``mode``) and start again on the same port and data."""
        self.stop(mode)
        self.start()

    def is_running(self) -> bool:
        result = self._run(
            [str(self.bin_dir / "pg_ctl"), "-D", str(self.data_dir), "status"], check=False
        )
        return result.returncode == 0

    def ensure_running(self) -> None:
        """Undo a test's pause or stop so the next test finds a working server."""
        self.resume()
        if not self.is_running():
            self.start()

    def close(self) -> None:
        """Stop the server (immediately: its data is thrown away) and delete its directory."""
        try:
            if self._initialised and self.is_running():
                self.stop("immediate")
        finally:
            shutil.rmtree(self.base_dir, ignore_errors=True)

    # -- processes ---------------------------------------------------------------------------

    @property
    def pid(self) -> int:
        """The postmaster's pid (first line of ``postmaster.pid``); raises if not running."""
        pid_file = self.data_dir / "postmaster.pid"
        try:
            return int(pid_file.read_text().split("\n", 1)[0])
        except (FileNotFoundError, ValueError) as e:
            raise RuntimeError("PostgreSQL is not running") from e

    def process_ids(self) -> list[int]:
        """The postmaster and its direct children (backends, checkpointer, WAL writer, ...)."""
        root = self.pid
        children: list[int] = []
        for entry in os.scandir("/proc"):
            if not entry.name.isdigit():
                continue
            try:
                stat = Path(entry.path, "stat").read_text()
            except OSError:
                continue
            # /proc/PID/stat: "pid (comm) state ppid ..."; comm may hold spaces and parens.
            fields = stat.rsplit(")", 1)[-1].split()
            if len(fields) > 1 and int(fields[1]) == root:
                children.append(int(entry.name))
        return [root, *children]

    def pause(self) -> None:
        """SIGSTOP every server process: connections stay open but nothing answers."""
        pids = self.process_ids()
        self._paused = True
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGSTOP)

    def resume(self) -> None:
        """SIGCONT what :meth:`pause` stopped (a no-op when not paused)."""
        if not self._paused:
            return
        self._paused = False
        with contextlib.suppress(RuntimeError):
            for pid in self.process_ids():
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGCONT)

    # -- databases ---------------------------------------------------------------------------

    def create_database(self, name: str) -> str:
        """CREATE DATABASE ``name`` (an identifier: letters, digits, _); returns its URL."""
        self._check_identifier(name)
        with psycopg.connect(self.dsn(), autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{name}"')
        return self.url(name)

    def drop_database(self, name: str) -> None:
        """DROP DATABASE ``name``, closing whatever connections brokers left on it."""
        self._check_identifier(name)
        with psycopg.connect(self.dsn(), autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')

    @staticmethod
    def _check_identifier(name: str) -> None:
        if not name or not all(c.isalnum() or c == "_" for c in name):
            raise ValueError(f"not a plain database name: {name!r}")

    # -- plumbing ----------------------------------------------------------------------------

    def _initdb(self) -> None:
        self._run(
            [
                str(self.bin_dir / "initdb"),
                "-D",
                str(self.data_dir),
                "-U",
                SUPERUSER,
                "--auth=trust",
                "--encoding=UTF8",
                "--locale=C",
            ]
        )
        settings = {**SERVER_SETTINGS, "port": str(self.port)}
        settings["unix_socket_directories"] = f"'{self.base_dir}'"
        conf = self.data_dir / "postgresql.conf"
        # Appending keeps the file's owner (postgres) and mode; later settings win.
        with conf.open("a") as f:
            f.write("\n# tests/pg.py\n")
            f.writelines(f"{k} = {v}\n" for k, v in settings.items())
        self._initialised = True

    def _pg_ctl(self, *args: str) -> None:
        self._run([str(self.bin_dir / "pg_ctl"), "-D", str(self.data_dir), *args])

    def _run(self, argv: list[str], check: bool = True) -> subprocess.CompletedProcess[str]:
        if self._as_root:
            argv = ["runuser", "-u", SUPERUSER, "--", *argv]
        result = subprocess.run(
            argv,
            capture_output=True,
            text=True,
            timeout=COMMAND_TIMEOUT_S,
            cwd=self.base_dir,
            # pg_ctl passes its environment to the server; keep the test run's PG* out of it.
            env={k: v for k, v in os.environ.items() if not k.startswith("PG")},
            check=False,
        )
        if check and result.returncode != 0:
            log = self.log_path.read_text()[-4000:] if self.log_path.exists() else ""
            raise RuntimeError(
                f"{' '.join(argv)} exited {result.returncode}\n"
                f"{result.stdout}\n{result.stderr}\nserver log:\n{log}"
            )
        return result
