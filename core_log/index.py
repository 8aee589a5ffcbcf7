"""Sparse offset and time indexes of one segment, kept in memory and appended to their files.

``.index`` entries are 8 bytes: relative offset (int32, the *last* offset of a batch minus the
segment's base offset) and position (int32, byte position of that batch in ``.log``). One entry
is added after every ``index.interval.bytes`` (4096) of log, so a lookup binary-searches the
entries and then scans at most ~4 KiB of batch headers.

``.timeindex`` entries are 12 bytes: timestamp (int64 ms) and relative offset (int32) of the
record holding the segment's largest timestamp so far; an entry is added only when the largest
timestamp grows, so timestamps in the index are strictly increasing.

Entries go to memory at once and to the file when the segment flushes (before the recovery point
moves past them), so an index file is never ahead of the durable log. Entries beyond the
recovery point are rebuilt by recovery. A file that fails the sanity check on load is rebuilt
from the log. Threading: owned by one :class:`~core_log.segment.LogSegment`, under its log's lock.
"""

from __future__ import annotations

import bisect
import errno
import os
import struct
from array import array
from pathlib import Path

from . import fileio

OFFSET_ENTRY = struct.Struct(">ii")
TIME_ENTRY = struct.Struct(">qi")


class IndexCorrupt(Exception):
    """An index file failed its sanity check; the caller rebuilds it from the log."""


class _IndexFile:
    """The append-only file behind an index: pending entries are written on flush."""

    def __init__(self, path: Path, entry_bytes: int) -> None:
        self.path = path
        self._entry_bytes = entry_bytes
        self._pending = bytearray()

    def read_all(self) -> bytes:
        try:
            data = self.path.read_bytes()
        except FileNotFoundError:
            raise IndexCorrupt(f"{self.path.name} is missing") from None
        if len(data) % self._entry_bytes:
            raise IndexCorrupt(f"{self.path.name} has a partial entry")
        return data

    def add(self, entry: bytes) -> None:
        self._pending += entry

    def flush(self, fsync: bool) -> None:
        """Append the pending entries to the file.

        Runs outside the log's lock, concurrently with appends that add entries: the pending
        buffer is swapped out first (one atomic rebinding under the GIL), so an entry added
        meanwhile lands in the new buffer and is written by the next flush — never lost, and
        the appending thread never sees a buffer that is being written.

        A full disk (ENOSPC/EDQUOT) cuts the file back to whole entries and keeps the entries
        pending for the next flush: an index only speeds lookups up (a missing entry means a
        longer header scan, and recovery rebuilds it), so it must not take the log offline.
        Any other failure raises ``OSError``.
        """
        pending, self._pending = self._pending, bytearray()
        if not pending:
            return
        fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        try:
            size = os.fstat(fd).st_size
            try:
                if fileio.ops.write(fd, pending) != len(pending):
                    raise OSError(errno.ENOSPC, "short write")
            except OSError as e:
                if e.errno not in (errno.ENOSPC, errno.EDQUOT):
                    raise
                fileio.ops.ftruncate(fd, size)
                self._pending[:0] = pending
                return
            if fsync:
                fileio.ops.fsync(fd)
        finally:
            os.close(fd)

    def rewrite(self, data: bytes) -> None:
        """Replace the file with ``data`` (after truncation or a rebuild)."""
        self._pending.clear()
        tmp = self.path.with_name(self.path.name + ".tmp")
        tmp.write_bytes(data)
        os.replace(tmp, self.path)

    def delete(self) -> None:
        self._pending.clear()
        self.path.unlink(missing_ok=True)


class OffsetIndex:
    def __init__(self, path: Path, base_offset: int, max_entries: int) -> None:
        self.base_offset = base_offset
        self.max_entries = max_entries
        self._file = _IndexFile(path, OFFSET_ENTRY.size)
        self._rel = array("q")
        self._pos = array("q")

    @property
    def path(self) -> Path:
        return self._file.path

    def __len__(self) -> int:
        return len(self._rel)

    @property
    def is_full(self) -> bool:
        return len(self._rel) >= self.max_entries

    def load(self, log_size: int) -> None:
        """Read the file; raise :class:`IndexCorrupt` unless entries are sane for ``log_size``."""
        data = self._file.read_all()
        rel = array("q")
        pos = array("q")
        last_rel, last_pos = -1, -1
        for r, p in OFFSET_ENTRY.iter_unpack(data):
            if r <= last_rel or p <= last_pos or p >= log_size or r < 0:
                raise IndexCorrupt(f"{self.path.name}: entry ({r}, {p}) out of order or range")
            rel.append(r)
            pos.append(p)
            last_rel, last_pos = r, p
        self._rel, self._pos = rel, pos

    def append(self, offset: int, position: int) -> None:
        rel = offset - self.base_offset
        if self._rel and (rel <= self._rel[-1] or position <= self._pos[-1]):
            return  # never add an entry that would break monotonicity
        self._rel.append(rel)
        self._pos.append(position)
        self._file.add(OFFSET_ENTRY.pack(rel, position))

    def lookup(self, offset: int) -> tuple[int, int]:
        """(offset, position) of the last entry at or below ``offset``; (base, 0) if none."""
        i = bisect.bisect_right(self._rel, offset - self.base_offset) - 1
        if i < 0:
            return self.base_offset, 0
        return self.base_offset + self._rel[i], self._pos[i]

    def lookup_position(self, position: int) -> tuple[int, int]:
        """(offset, position) of the last entry whose position is at or below ``position``."""
        i = bisect.bisect_right(self._pos, position) - 1
        if i < 0:
            return self.base_offset, 0
        return self.base_offset + self._rel[i], self._pos[i]

    def truncate_to_position(self, position: int) -> None:
        """Drop entries pointing at or past ``position``."""
        i = bisect.bisect_left(self._pos, position)
        if i == len(self._pos):
            return
        del self._rel[i:]
        del self._pos[i:]
        self._file.rewrite(
            b"".join(OFFSET_ENTRY.pack(r, p) for r, p in zip(self._rel, self._pos, strict=True))
        )

    def reset(self) -> None:
        self._rel = array("q")
        self._pos = array("q")
        self._file.rewrite(b"")

    def flush(self, fsync: bool) -> None:
        self._file.flush(fsync)

    def delete(self) -> None:
        self._file.delete()


class TimeIndex:
    def __init__(self, path: Path, base_offset: int, max_entries: int) -> None:
        self.base_offset = base_offset
        self.max_entries = max_entries
        self._file = _IndexFile(path, TIME_ENTRY.size)
        self._ts = array("q")
        self._rel = array("q")

    @property
    def path(self) -> Path:
        return self._file.path

    def __len__(self) -> int:
        return len(self._ts)

    @property
    def is_full(self) -> bool:
        return len(self._ts) >= self.max_entries

    @property
    def last_entry(self) -> tuple[int, int] | None:
        """(timestamp, offset) of the largest timestamp indexed so far."""
        if not self._ts:
            return None
        return self._ts[-1], self.base_offset + self._rel[-1]

    def load(self, next_offset: int) -> None:
        data = self._file.read_all()
        ts = array("q")
        rel = array("q")
        last_ts, last_rel = -(2**63), -1
        for t, r in TIME_ENTRY.iter_unpack(data):
            if t <= last_ts or r < last_rel or r < 0 or self.base_offset + r >= next_offset:
                raise IndexCorrupt(f"{self.path.name}: entry ({t}, {r}) out of order or range")
            ts.append(t)
            rel.append(r)
            last_ts, last_rel = t, r
        self._ts, self._rel = ts, rel

    def maybe_append(self, timestamp: int, offset: int) -> None:
        """Add (timestamp, offset) if ``timestamp`` is larger than every indexed one."""
        if self._ts and timestamp <= self._ts[-1]:
            return
        rel = offset - self.base_offset
        self._ts.append(timestamp)
        self._rel.append(rel)
        self._file.add(TIME_ENTRY.pack(timestamp, rel))

    def lookup(self, timestamp: int) -> int:
        """The offset of the last entry with a timestamp below ``timestamp``, or the base offset.

        Every record before that offset... is not guaranteed older, so callers scan forward
        from the returned offset for the first batch whose max timestamp >= ``timestamp``.
        """
        i = bisect.bisect_left(self._ts, timestamp) - 1
        if i < 0:
            return self.base_offset
        return self.base_offset + self._rel[i]

    def truncate_to_offset(self, offset: int) -> None:
        """Drop entries for offsets at or past ``offset``."""
        i = bisect.bisect_left(self._rel, offset - self.base_offset)
        if i == len(self._rel):
            return
        del self._ts[i:]
        del self._rel[i:]
        self._file.rewrite(
            b"".join(TIME_ENTRY.pack(t, r) for t, r in zip(self._ts, self._rel, strict=True))
        )

    def reset(self) -> None:
        self._ts = array("q")
        self._rel = array("q")
        self._file.rewrite(b"")

    def flush(self, fsync: bool) -> None:
        self._file.flush(fsync)

    def delete(self) -> None:
        self._file.delete()
