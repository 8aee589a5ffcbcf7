"""The calls core_log makes to write, sync and cut files: one seam for injecting disk faults.

Segments, indexes and checkpoints write through :data:`ops` instead of calling ``os`` directly,
so a test can swap in a :class:`FileOps` subclass (:func:`injected`) that makes the N-th write
fail with ``ENOSPC`` or the next fsync with ``EIO``, or blocks an fsync until told to go on —
the faults a real disk produces and a test machine does not. Production uses :class:`FileOps`
itself: one attribute lookup and one method call more per write or sync (well under 1 µs, next
to the ≥ 5 µs of the system call).

Simulated page-cache loss (test only)
-------------------------------------
A SIGKILL loses nothing the process wrote: the kernel keeps its page cache. A power loss
keeps only what was fsynced. To test ``durability=fsync`` with real processes, a broker
started with ``LOGBUS_TEST_UNSYNCED_JOURNAL=PATH`` uses :class:`SyncJournal`: before every
fsync of a regular file it appends one line ``<file id> <size>`` to ``PATH`` (a plain append,
which survives a SIGKILL). The size is read *before* the fsync starts, so a write racing with
it is counted as unsynced — the adversarial reading. After killing the broker, a test calls
:func:`drop_unsynced` on its data directory: every file is cut back to the size its last fsync
covered, and a file never fsynced is emptied (its directory entry is kept: directory fsyncs are
not modelled). Files are identified by a random tag stored in an extended attribute at their
first fsync, so a rename keeps the identity and a recycled inode number does not inherit it.
Truncations lower the recorded size (``min``), so data rewritten after a cut is unsynced
again. Never set the variable in production: every fsync then costs a write and an xattr.
"""

from __future__ import annotations

import os
import secrets
import stat
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from _typeshed import ReadableBuffer as Buffer


class FileOps:
    """Thin wrappers of the ``os`` calls, same signatures and errors."""

    def pwritev(self, fd: int, buffers: Sequence[Buffer], offset: int) -> int:
        return os.pwritev(fd, buffers, offset)

    def pwrite(self, fd: int, data: Buffer, offset: int) -> int:
        return os.pwrite(fd, data, offset)

    def write(self, fd: int, data: Buffer) -> int:
        return os.write(fd, data)

    def fsync(self, fd: int) -> None:
        os.fsync(fd)

    def fdatasync(self, fd: int) -> None:
        os.fdatasync(fd)

    def ftruncate(self, fd: int, length: int) -> None:
        os.ftruncate(fd, length)


class SyncJournal(FileOps):
    """:class:`FileOps` that records the size each fsync of a regular file covers (tests)."""

    def __init__(self, journal: str) -> None:
        self._fd = os.open(journal, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        self._lock = threading.Lock()

    def _tag(self, fd: int) -> str | None:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None  # a directory fsync: entries are not modelled
        try:
            return os.getxattr(fd, _XATTR).decode()
        except OSError:
            tag = secrets.token_hex(8)
            os.setxattr(fd, _XATTR, tag.encode())
            return tag

    def _record(self, fd: int, size: int | None = None, shrink: bool = False) -> None:
        tag = self._tag(fd)
        if tag is None:
            return
        line = f"{tag} {os.fstat(fd).st_size if size is None else size}"
        with self._lock:
            os.write(self._fd, f"{line}{' shrink' if shrink else ''}\n".encode())

    def fsync(self, fd: int) -> None:
        self._record(fd)
        os.fsync(fd)

    def fdatasync(self, fd: int) -> None:
        self._record(fd)
        os.fdatasync(fd)

    def ftruncate(self, fd: int, length: int) -> None:
        os.ftruncate(fd, length)
        if stat.S_ISREG(os.fstat(fd).st_mode):
            try:
                os.getxattr(fd, _XATTR)
            except OSError:
                return  # never fsynced: nothing recorded to lower
            self._record(fd, length, shrink=True)


_XATTR = "user.logbus.sync"
JOURNAL_ENV = "LOGBUS_TEST_UNSYNCED_JOURNAL"


def read_journal(journal: str | os.PathLike[str]) -> dict[str, int]:
    """File tag -> the size its last fsync covered (lowered by later truncations)."""
    synced: dict[str, int] = {}
    with open(journal) as f:
        for line in f:
            parts = line.split()
            if len(parts) < 2:
                continue  # a torn last line (the writer was killed mid-write)
            tag, size = parts[0], int(parts[1])
            if len(parts) > 2:  # a truncation lowers what is known to be on disk
                synced[tag] = min(synced.get(tag, size), size)
            else:
                synced[tag] = size
    return synced


def drop_unsynced(root: str | os.PathLike[str], journal: str | os.PathLike[str]) -> int:
    """Cut every file under ``root`` back to what its last fsync covered (empty if never
    fsynced), as a power loss would; return the number of bytes dropped. Run only while no
    process uses ``root``."""
    synced = read_journal(journal)
    dropped = 0
    for dirpath, _, files in os.walk(root):
        for name in files:
            path = os.path.join(dirpath, name)
            try:
                tag = os.getxattr(path, _XATTR).decode()
            except OSError:
                tag = ""
            keep = synced.get(tag, 0)
            size = os.path.getsize(path)
            if size > keep:
                os.truncate(path, keep)
                dropped += size - keep
    return dropped


def ops_from_environment() -> FileOps:
    """The file operations the environment asks for: :class:`SyncJournal` when
    ``LOGBUS_TEST_UNSYNCED_JOURNAL`` names a journal, else plain ones. Read once at import; a
    test fork server (tests/zygote.py) calls it again in each child after setting its env."""
    journal = os.environ.get(JOURNAL_ENV)
    return SyncJournal(journal) if journal else FileOps()


ops: FileOps = ops_from_environment()


@contextmanager
def injected(replacement: FileOps) -> Iterator[FileOps]:
    """Use ``replacement`` for every file call of core_log inside the block (tests only)."""
    global ops
    previous, ops = ops, replacement
    try:
        yield replacement
    finally:
        ops = previous
