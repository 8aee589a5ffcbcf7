"""``logbus cluster up``: N brokers come up sharing one store, survive a SIGKILL of one (it is
restarted), replicate an RF=3 topic with acks=all, and all stop on SIGINT with exit 0."""

from __future__ import annotations

import os
import queue
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest

from api.cluster_cli import READY_TIMEOUT_S, _shown
from cluster.metadata import MetadataStore
from tests.cluster.test_cluster_processes import (
    CLUSTER_ENV,
    WAIT_S,
    brokers_on_one_store,
    eventually,
)
from tests.test_packaging import _make_recipes

ROOT = Path(__file__).resolve().parent.parent
_BROKER_LINE = re.compile(r"^broker (\d+): (http://\S+)\s+\(pid (\d+),")
_BACK_LINE = re.compile(r"^broker (\d+) is back: (http://\S+)\s+\(pid (\d+)\)")


@dataclass
class ClusterUp:
    """A running ``logbus cluster up`` and what it printed so far."""

    proc: subprocess.Popen[str]
    lines: queue.Queue[str] = field(default_factory=queue.Queue)
    seen: list[str] = field(default_factory=list)
    reader: threading.Thread | None = None

    def read_stdout(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.put(line.rstrip("\n"))

    def close(self) -> None:
        """Stop it if a test left it running (SIGTERM stops its brokers too), then let go of
        its output."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if self.reader is not None:
            self.reader.join(timeout=10)  # EOF follows the exit
        assert self.proc.stdout is not None
        self.proc.stdout.close()

    def wait_for(self, pattern: str, timeout_s: float = WAIT_S) -> re.Match[str]:
        """The first line (from now on) matching ``pattern``; fails after ``timeout_s``."""
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                line = self.lines.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                raise AssertionError(f"no line matching {pattern!r} in {self.seen}") from None
            self.seen.append(line)
            if m := re.search(pattern, line):
                return m


def _start(data_dir: Path, *args: str) -> ClusterUp:
    proc = subprocess.Popen(
        [sys.executable, "-m", "api.cli", "cluster", "up", "--data-dir", str(data_dir), *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        cwd=ROOT,
        env={**os.environ, **CLUSTER_ENV},
    )
    up = ClusterUp(proc)
    up.reader = threading.Thread(target=up.read_stdout, daemon=True)
    up.reader.start()
    return up


# The whole scenario on PostgreSQL is ``slow`` (16 s of the default suite, the same again as on
# SQLite: what it adds after start-up, a topic, a SIGKILL and a restart, is the supervisor's,
# whatever the store); the default suite starts and stops a cluster on PostgreSQL in
# test_cluster_up_on_postgresql_registers_there_and_stops_on_sigint.
@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=pytest.mark.slow)])
def cluster_up(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[ClusterUp]:
    """``cluster up`` on its default store (SQLite in the data dir), or on a PostgreSQL
    database given by ``--metadata-url`` (skipped when PostgreSQL is not installed)."""
    store = []
    if request.param == "postgresql":
        store = ["--metadata-url", request.getfixturevalue("postgres_db_url")]
    up = _start(tmp_path / "cluster", "--brokers", "3", *store)
    try:
        yield up
    finally:
        up.close()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def _ready(url: str) -> bool:
    try:
        return httpx.get(f"{url}/readyz", timeout=5).status_code == 200
    except httpx.TransportError:
        return False


def test_cluster_up_runs_three_brokers_and_stops_them_on_sigint(cluster_up: ClusterUp) -> None:
    metadata_url = cluster_up.wait_for(r"^metadata store: (\S+)")[1]
    brokers: dict[int, tuple[str, int]] = {}
    for _ in range(3):
        # Each broker has READY_TIMEOUT_S to answer /readyz; cluster up says so past it.
        m = cluster_up.wait_for(_BROKER_LINE.pattern, timeout_s=READY_TIMEOUT_S + WAIT_S)
        brokers[int(m[1])] = (m[2], int(m[3]))
    cluster_up.wait_for(r"^3 brokers up")
    assert sorted(brokers) == [1, 2, 3]
    assert len({url for url, _ in brokers.values()}) == 3
    for url, _ in brokers.values():
        assert _ready(url), url

    store = MetadataStore(metadata_url)
    try:
        registered = store.brokers()
        assert sorted(b.broker_id for b in registered if b.alive) == [1, 2, 3]
        assert {b.broker_id: b.url for b in registered} == {
            i: url for i, (url, _) in brokers.items()
        }

        r = httpx.post(
            f"{brokers[1][0]}/v1/topics",
            json={
                "name": "up",
                "partitions": 1,
                "replication_factor": 3,
                "configs": {"min.insync.replicas": "2"},
            },
            timeout=30,
        )
        assert r.status_code == 201, r.text
        row = store.topic("up").assignments[0]
        assert sorted(row.replicas) == [1, 2, 3]
        leader_url = brokers[row.leader][0]

        def produce() -> httpx.Response | None:
            r = httpx.post(
                f"{leader_url}/v1/topics/up/partitions/0/records",
                params={"acks": "all"},
                json={"records": [{"value": "hello"}]},
                timeout=30,
            )
            return r if r.status_code == 200 else None

        # The leader may take a metadata refresh to learn it leads and its followers to join.
        eventually(produce, "an acks=all write on the leader")

        # A broker killed behind its back is reported and restarted on the same URL.
        victim = next(i for i in brokers if i != row.leader)
        os.kill(brokers[victim][1], signal.SIGKILL)
        cluster_up.wait_for(rf"^broker {victim} \(pid {brokers[victim][1]}\) exited unexpectedly")
        back = cluster_up.wait_for(_BACK_LINE.pattern, timeout_s=READY_TIMEOUT_S + WAIT_S)
        assert (int(back[1]), back[2]) == (victim, brokers[victim][0])
        brokers[victim] = (back[2], int(back[3]))
        assert _ready(brokers[victim][0])
        eventually(
            lambda: next((b for b in store.brokers() if b.broker_id == victim and b.alive), None),
            "the restarted broker registered",
        )
    finally:
        store.close()

    cluster_up.proc.send_signal(signal.SIGINT)
    assert cluster_up.proc.wait(timeout=90) == 0, cluster_up.seen
    cluster_up.wait_for(r"^3 brokers stopped", timeout_s=5)
    assert not [pid for _, pid in brokers.values() if _alive(pid)]


def test_cluster_up_on_postgresql_registers_there_and_stops_on_sigint(
    tmp_path: Path, postgres_db_url: str
) -> None:
    """The default suite's run on PostgreSQL: ``--metadata-url`` is the store every broker
    registers in, and SIGINT stops them all with exit 0."""
    up = _start(tmp_path / "cluster", "--brokers", "3", "--metadata-url", postgres_db_url)
    try:
        assert up.wait_for(r"^metadata store: (\S+)")[1] == _shown(postgres_db_url)
        pids = []
        for _ in range(3):
            m = up.wait_for(_BROKER_LINE.pattern, timeout_s=READY_TIMEOUT_S + WAIT_S)
            assert _ready(m[2]), m[2]
            pids.append(int(m[3]))
        up.wait_for(r"^3 brokers up")
        store = MetadataStore(postgres_db_url)
        try:
            assert sorted(b.broker_id for b in store.brokers() if b.alive) == [1, 2, 3]
        finally:
            store.close()
        up.proc.send_signal(signal.SIGINT)
        assert up.proc.wait(timeout=90) == 0, up.seen
        up.wait_for(r"^3 brokers stopped", timeout_s=5)
        assert not [pid for pid in pids if _alive(pid)]
    finally:
        up.close()


def test_a_taken_base_port_fails_at_once_in_one_line(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = subprocess.run(
            [
                sys.executable,
                "-m",
                "api.cli",
                "cluster",
                "up",
                "--data-dir",
                str(tmp_path / "cluster"),
                "--base-port",
                str(port),
            ],
            capture_output=True,
            text=True,
            timeout=60,
            cwd=ROOT,
        )
    assert result.returncode == 1
    assert result.stdout == ""
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and f"port {port} on 127.0.0.1 is in use" in lines[0], result.stderr
    assert not (tmp_path / "cluster").exists()  # nothing started, nothing created


def test_the_compose_click_producer_runs_against_a_cluster(tmp_path: Path) -> None:
    """docker-compose.yml's `clicks` command, pointed at broker 1 of a 3-broker cluster (the
    test brokers' forked one: `cluster up` itself is the subject of the tests above, and its
    four fresh interpreters cost ~30 s of the suite at load 10)."""
    import yaml

    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    command = compose["services"]["clicks"]["command"]
    with brokers_on_one_store(tmp_path) as (_, brokers):
        url = brokers[1].url
        args = [*command[3:], "--url", url, "--events", "300", "--minutes", "1"]
        result = subprocess.run(
            [sys.executable, "-m", command[2], *args],
            capture_output=True,
            text=True,
            timeout=120,
            cwd=ROOT,
        )
        assert result.returncode == 0, result.stderr[-2000:]
        assert "produced 300 click events" in result.stdout


def test_make_cluster_installs_the_runtime_only_and_runs_cluster_up() -> None:
    recipes = _make_recipes((ROOT / "Makefile").read_text())
    assert recipes["cluster"][0] == recipes["run"][0]  # the stamp of `pip install -e .`
    (command,) = recipes["cluster"][1]
    assert command.startswith("$(BIN)/logbus cluster up --brokers 3 "), command
    for variable in ("DATA_DIR", "HOST", "PORT"):
        assert f"$({variable})" in command
    phony = next(x for x in (ROOT / "Makefile").read_text().splitlines() if x.startswith(".PHONY"))
    assert "cluster" in phony.split()


def test_the_printed_metadata_url_hides_its_password() -> None:
    assert _shown("postgresql+psycopg://logbus:s3cret@db:5432/logbus") == (
        "postgresql+psycopg://logbus:***@db:5432/logbus"
    )
    assert _shown("sqlite:////tmp/x/metadata.db") == "sqlite:////tmp/x/metadata.db"
