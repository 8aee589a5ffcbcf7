"""The aborted-transaction index of one segment: ``{base_offset:020d}.txnindex`` (Kafka's).

Theory of operation
-------------------
A ``read_committed`` reader must drop the records of aborted transactions. Which batches those
are cannot be seen from a batch alone (the ABORT marker comes later), so the log keeps, per
segment, one entry per aborted transaction whose ABORT marker lies in that segment::

    entry (ABORTED_TXN, 34 bytes, big-endian)
         0  2  version           0
         2  8  producerId
        10  8  firstOffset       the transaction's first batch in this partition
        18  8  lastOffset        the ABORT marker's offset (inside this segment)
        26  8  lastStableOffset  the LSO right after the marker: the first offset of the
                                 earliest other open transaction, else lastOffset + 1

Entries are in marker order (``lastOffset`` strictly increasing), offsets absolute. A fetch of
``[start, upper)`` collects the entries overlapping it (``lastOffset >= start`` and
``firstOffset < upper``) from the segment holding ``start`` onwards, and may stop at the first
entry whose ``lastStableOffset >= upper``: every transaction aborted after that one began at or
after that LSO, so it cannot overlap the range (see :func:`collect_aborted`).

Only commits are frequent; aborts are rare, so most segments have no entry and no file: the
file is created by the first entry's flush, and a missing file is an empty index.

Durability: entries are kept in memory at once and appended to the file when the segment is
flushed, with an fsync (unlike the offset indexes, which recovery can do without, a lost entry
would show aborted data as committed), before the recovery point moves past their marker. A
segment re-validated by recovery starts with an empty index in memory that the producer-state
replay refills (:meth:`core_log.log.PartitionLog._reload_producers`), then written over the
old file atomically (a crash in between leaves the old file, and the next start recovers
again); a file that fails its checks on load (a partial entry, a bad version, offsets outside
the segment or out of order) is :class:`IndexCorrupt`, and the log rebuilds it the same way.

Threading: owned by one :class:`~core_log.segment.LogSegment`, under its log's lock, except
:meth:`TransactionIndex.flush`, which may run concurrently with appends (the pending buffer is
swapped out in one rebinding, as :mod:`core_log.index` does).
"""

from __future__ import annotations

import os
import struct
from collections.abc import Iterable
from pathlib import Path
from typing import NamedTuple

from . import fileio
from .index import IndexCorrupt

ABORTED_TXN = struct.Struct(">hqqqq")  # version, producerId, firstOffset, lastOffset, LSO
assert ABORTED_TXN.size == 34
ENTRY_VERSION = 0
TXN_INDEX_SUFFIX = ".txnindex"


class AbortedTxn(NamedTuple):
    """One aborted transaction of one producer in one partition."""

    producer_id: int
    first_offset: int
    last_offset: int  # the ABORT marker's offset
    last_stable_offset: int


class TransactionIndex:
    """The entries of one segment's ``.txnindex`` file, in memory and on disk."""

    def __init__(self, path: Path, base_offset: int) -> None:
        self.path = path
        self.base_offset = base_offset
        self._entries: list[AbortedTxn] = []
        self._pending = bytearray()

    def __len__(self) -> int:
        return len(self._entries)

    @property
    def entries(self) -> list[AbortedTxn]:
        """A copy, in marker order."""
        return list(self._entries)

    @property
    def last_offset(self) -> int:
        """The newest marker's offset, or -1."""
        return self._entries[-1].last_offset if self._entries else -1

    def append(self, entry: AbortedTxn) -> None:
        """Record an aborted transaction whose ABORT marker is in this segment, after every
        entry already here."""
        assert entry.last_offset > self.last_offset, "markers are indexed in offset order"
        assert entry.last_offset >= self.base_offset
        assert entry.first_offset <= entry.last_offset
        self._entries.append(entry)
        self._pending += ABORTED_TXN.pack(ENTRY_VERSION, *entry)

    def load(self, next_offset: int) -> None:
        """Read the file (none: no entry) of a segment ending before ``next_offset``.
        Raises :class:`IndexCorrupt` when it fails its checks; the index is empty then."""
        self._entries = []
        self._pending.clear()
        try:
            data = self.path.read_bytes()
        except FileNotFoundError:
            return
        if len(data) % ABORTED_TXN.size:
            raise IndexCorrupt(f"{self.path.name} has a partial entry")
        entries: list[AbortedTxn] = []
        previous = self.base_offset - 1
        for version, *fields in ABORTED_TXN.iter_unpack(data):
            entry = AbortedTxn(*fields)
            if (
                version != ENTRY_VERSION
                or entry.producer_id < 0
                or not 0 <= entry.first_offset <= entry.last_offset
                or not previous < entry.last_offset < next_offset
                or entry.last_stable_offset <= entry.first_offset
            ):
                raise IndexCorrupt(f"{self.path.name}: bad entry {entry}")
            entries.append(entry)
            previous = entry.last_offset
        self._entries = entries

    def flush(self, fsync: bool = True) -> None:
        """Append the pending entries to the file (created now if needed), fsynced unless
        ``fsync=False``. Nothing pending: no I/O at all."""
        pending, self._pending = self._pending, bytearray()
        if not pending:
            return
        fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        try:
            written = fileio.ops.write(fd, pending)
            if written != len(pending):
                raise OSError(f"short write to {self.path.name}: {written} of {len(pending)}")
            if fsync:
                fileio.ops.fsync(fd)
        except OSError:
            self._pending[:0] = pending  # the next flush tries again
            raise
        finally:
            os.close(fd)

    def truncate_to(self, offset: int) -> None:
        """Drop the entries whose marker is at or past ``offset`` (the log was cut there)."""
        kept = [e for e in self._entries if e.last_offset < offset]
        if len(kept) != len(self._entries):
            self._rewrite(kept)

    def reset(self) -> None:
        """Forget every entry in memory (recovery refills them, then calls :meth:`rewrite`).
        The file stays as it is until then, so a crash meanwhile loses nothing."""
        self._entries = []
        self._pending.clear()

    def rewrite(self, fsync: bool = True) -> None:
        """Replace the file by the entries in memory, atomically (temporary file, fsync,
        rename); no entry: no file."""
        self._rewrite(self._entries, fsync)

    def replace_with(self, entries: Iterable[AbortedTxn]) -> None:
        """Make the index hold exactly ``entries``."""
        self._rewrite(list(entries))

    def _rewrite(self, entries: list[AbortedTxn], fsync: bool = False) -> None:
        self._entries = entries
        self._pending.clear()
        if not entries:
            self.path.unlink(missing_ok=True)
            return
        tmp = self.path.with_name(self.path.name + ".tmp")
        with tmp.open("wb") as f:
            f.write(b"".join(ABORTED_TXN.pack(ENTRY_VERSION, *e) for e in entries))
            if fsync:
                f.flush()
                fileio.ops.fsync(f.fileno())
        os.replace(tmp, self.path)

    def delete(self) -> None:
        self._pending.clear()
        self.path.unlink(missing_ok=True)

    def collect(self, start: int, upper: int, into: list[AbortedTxn]) -> bool:
        """Add to ``into`` the entries overlapping ``[start, upper)``; True when no later
        entry (here or in a later segment) can overlap it (see the module docstring)."""
        for e in self._entries:
            if e.last_offset >= start and e.first_offset < upper:
                into.append(e)
            if e.last_stable_offset >= upper:
                return True
        return False


def collect_aborted(
    indexes: Iterable[TransactionIndex], start: int, upper: int
) -> list[AbortedTxn]:
    """The aborted transactions overlapping ``[start, upper)``, from ``indexes`` (the segments
    from the one holding ``start`` onwards, in order), by first offset."""
    found: list[AbortedTxn] = []
    if start >= upper:
        return found
    for index in indexes:
        if index.collect(start, upper, found):
            break
    found.sort(key=lambda e: e.first_offset)
    return found
