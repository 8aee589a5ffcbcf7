"""The chaos harness's own mechanics that a scenario relies on."""

from __future__ import annotations

import itertools
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from tests import pause

HOLD_LOCK = """
import sqlite3, sys
db = sqlite3.connect(sys.argv[1], isolation_level=None)
db.execute("BEGIN IMMEDIATE")
print("locked", flush=True)
sys.stdin.read()
"""


def test_a_sqlite_write_lock_held_by_another_process_is_seen(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """tests.pause.pause() re-stops a broker caught inside a write transaction: this is how
    it knows."""
    monkeypatch.setattr(pause, "SQLITE_LOCK_S", 0.2)
    db_path = tmp_path / "shared.db"
    setup = sqlite3.connect(db_path)
    setup.execute("PRAGMA journal_mode=WAL")
    setup.close()
    url = f"sqlite:///{db_path}"
    assert pause.sqlite_writable(url)
    with subprocess.Popen(
        [sys.executable, "-c", HOLD_LOCK, str(db_path)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    ) as holder:
        try:
            assert holder.stdout is not None and holder.stdout.readline().strip() == "locked"
            assert not pause.sqlite_writable(url)
        finally:
            holder.kill()
    assert pause.sqlite_writable(url)


# Takes the write lock, says so, holds it 0.5 s while running, lets go, then ticks: each line
# its monotonic clock, every 10 ms, until told to stop.
HOLD_THEN_TICK = """
import sqlite3, sys, time
db = sqlite3.connect(sys.argv[1], isolation_level=None)
db.execute("BEGIN IMMEDIATE")
print("locked", flush=True)
end = time.monotonic() + 0.5
while time.monotonic() < end:
    print(time.monotonic(), flush=True)
    time.sleep(0.01)
db.execute("ROLLBACK")
while True:
    print(time.monotonic(), flush=True)
    time.sleep(0.01)
"""


def test_a_stop_that_caught_the_lock_is_undone_before_a_lease_could_expire(
    tmp_path: Path,
) -> None:
    """tests.pause.pause() stops a process at the moment it holds the SQLite write lock: it
    must resume it after a short probe, not after waiting the full lock timeout with the
    process stopped (that kept a broker stopped 5 s, past its lease). Seen from the stopped
    process: no gap in its ticks before the final stop as long as the lock timeout."""
    db_path = tmp_path / "shared.db"
    setup = sqlite3.connect(db_path)
    setup.execute("PRAGMA journal_mode=WAL")
    setup.close()
    with subprocess.Popen(
        [sys.executable, "-c", HOLD_THEN_TICK, str(db_path)],
        stdout=subprocess.PIPE,
        text=True,
    ) as holder:
        try:
            assert holder.stdout is not None and holder.stdout.readline().strip() == "locked"
            pause.pause(holder.pid, f"sqlite:///{db_path}")  # first stop: lock held
            assert pause.sqlite_writable(f"sqlite:///{db_path}", 0.1)  # stopped, lock free
        finally:
            holder.kill()
        ticks = [float(line) for line in holder.stdout.read().split()]
    gaps = [b - a for a, b in itertools.pairwise(ticks)]
    assert ticks and max(gaps) < pause.SQLITE_LOCK_S / 2, max(gaps)
