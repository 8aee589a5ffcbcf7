"""Stopping a broker process (SIGSTOP) outside its writes to a shared SQLite metadata file.

A broker stopped inside one of its SQLite write transactions keeps the file's write lock, and
every other broker's heartbeat, election and admin change waits for it (up to the busy
timeout, 30 s) — inherent to one file shared by processes (docs/operations.md). A test about a
stopped *broker* undoes a stop that caught the lock at once and tries again. PostgreSQL has no
such lock across processes, so there the first stop stands.
"""

from __future__ import annotations

import os
import signal
import sqlite3
from typing import Final
from urllib.parse import urlsplit

SQLITE_LOCK_S: Final = 5.0  # waiting for the shared file's write lock, far above a normal write
# Asking whether a just-stopped process holds the lock: a short wait (another process's
# write is a few ms), so that a stop that caught the lock is undone long before the stopped
# broker's lease (2-5 s in the tests) can expire. Waiting SQLITE_LOCK_S there kept it stopped
# 5 s: its lease expired, its leader dropped it from the ISR, and a failover scenario that
# needed it in the ISR failed (once in a CI run).
SQLITE_STOPPED_PROBE_S: Final = 0.25
SQLITE_PAUSE_ATTEMPTS: Final = 20


def pause(pid: int, metadata_url: str) -> None:
    """SIGSTOP ``pid``; on a ``sqlite://`` store, at a moment it holds no write lock."""
    for _ in range(SQLITE_PAUSE_ATTEMPTS):
        os.kill(pid, signal.SIGSTOP)
        if not metadata_url.startswith("sqlite") or sqlite_writable(
            metadata_url, SQLITE_STOPPED_PROBE_S
        ):
            return
        os.kill(pid, signal.SIGCONT)
        # Let it finish that transaction before the next stop: stopped again at once, a
        # process inside a longer write held the lock at all 20 stops (CI, a loaded machine).
        sqlite_writable(metadata_url)
    raise AssertionError(f"process {pid} held the SQLite write lock at every stop")


def sqlite_writable(metadata_url: str, timeout_s: float | None = None) -> bool:
    """Whether a write transaction on the SQLite file of ``metadata_url`` can begin within
    ``timeout_s`` (None: :data:`SQLITE_LOCK_S`)."""
    path = urlsplit(metadata_url).path
    wait = SQLITE_LOCK_S if timeout_s is None else timeout_s
    db = sqlite3.connect(path[1:] if path.startswith("//") else path, timeout=wait)
    try:
        db.isolation_level = None
        db.execute("BEGIN IMMEDIATE")
        db.execute("ROLLBACK")
        return True
    except sqlite3.OperationalError as e:
        if "locked" in str(e) or "busy" in str(e):
            return False
        raise
    finally:
        db.close()
