"""The chaos harness's own mechanics that a scenario relies on."""

from __future__ import annotations

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
