"""One segment of a partition log: ``{base_offset:020d}.log``, its two offset/time indexes and
its aborted-transaction index (:mod:`core_log.txn_index`, ``.txnindex``, a file only once a
transaction aborted in the segment).

The ``.log`` file is a plain concatenation of record batches v2 (see :mod:`core_log.batch`),
exactly as they travel on the wire, in increasing offset order. Positions are byte positions
in this file; offsets are logical record offsets. The
segment appends at its tracked ``size`` with ``pwritev`` (prefix + untouched body, no copy),
reads with ``pread``, and keeps the sparse indexes described in :mod:`core_log.index`.

Threading: every method runs under the owning :class:`~core_log.log.PartitionLog`'s lock,
except :meth:`fsync`, which may run concurrently with appends (``fsync`` and ``pwritev`` on one
descriptor are safe together; the caller only moves the recovery point to what was written
before the sync started).
"""

from __future__ import annotations

import array
import contextlib
import errno
import itertools
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from . import fileio
from .batch import (
    HEADER,
    HEADER_BYTES,
    LOG_OVERHEAD,
    MAGIC,
    BatchHeader,
    Record,
    bytes_taken,
    records_section,
    timestamp_ok,
    validate_batch,
    walk_records,
)
from .errors import CorruptRecordError, KafkaStorageError, StorageFullError
from .handles import Handle, HandleCache, RetiredHandleError
from .index import IndexCorrupt, OffsetIndex, TimeIndex
from .limits import MAX_BATCH_BYTES, MAX_RELATIVE_OFFSET
from .recordscan import batch_columns
from .txn_index import TXN_INDEX_SUFFIX, TransactionIndex

# Two buffers (prefix, body) per batch; Linux takes at most 1,024 (IOV_MAX) per pwritev.
_BATCHES_PER_WRITE = 512
RECOVERY_CHUNK_BYTES = 8 * 1024 * 1024
DISK_FULL_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT})
NO_TIMESTAMP = -1


def segment_name(base_offset: int) -> str:
    return f"{base_offset:020d}"


@dataclass(frozen=True, slots=True)
class FetchSlice:
    """Bytes of whole batches ``[position, position + size)`` of one segment."""

    position: int
    size: int
    first_offset: int  # base offset of the first batch in the slice
    next_offset: int  # last offset of the last batch in the slice + 1


class LogSegment:
    def __init__(
        self,
        directory: Path,
        base_offset: int,
        handles: HandleCache,
        *,
        index_interval_bytes: int,
        index_max_entries: int,
        suffix: str = "",
    ) -> None:
        """``suffix`` (e.g. ``.cleaned``) is appended to every file name: the compaction
        cleaner writes a segment under temporary names before swapping it in."""
        self.base_offset = base_offset
        name = segment_name(base_offset)
        self.log_path = directory / f"{name}.log{suffix}"
        self._handle = Handle(self.log_path)
        self._handles = handles
        self.offset_index = OffsetIndex(
            directory / f"{name}.index{suffix}", base_offset, index_max_entries
        )
        self.time_index = TimeIndex(
            directory / f"{name}.timeindex{suffix}", base_offset, index_max_entries
        )
        self.txn_index = TransactionIndex(
            directory / f"{name}{TXN_INDEX_SUFFIX}{suffix}", base_offset
        )
        # True when the aborted-transaction index was emptied by a recovery scan or failed its
        # load checks: the log refills it from a producer-state replay, then clears this.
        self.txn_index_stale = False
        self.index_interval_bytes = index_interval_bytes
        self.size = 0
        self.next_offset = base_offset
        self.max_timestamp = NO_TIMESTAMP
        self.offset_of_max_timestamp = base_offset
        self.first_batch_ms = NO_TIMESTAMP  # the first batch's max timestamp
        # segment.ms counts from here: the broker's time of the first append, or after a
        # restart (when that is unknown) the first batch's timestamp.
        self.rolling_base_ms = NO_TIMESTAMP
        self._bytes_since_index = 0
        self._closed = False

    # -- state -------------------------------------------------------------------------------

    @property
    def is_empty(self) -> bool:
        return self.size == 0

    @property
    def last_offset(self) -> int:
        return self.next_offset - 1

    def create(self) -> None:
        """Create the empty ``.log`` file of a new segment."""
        with self._handles.use(self._handle):
            pass

    def pin(self, pinned: bool) -> None:
        """Keep the descriptor of the active segment open."""
        self._handles.pin(self._handle, pinned)

    def index_room(self) -> int:
        """Entries either index can still take before the segment must roll."""
        return min(
            self.offset_index.max_entries - len(self.offset_index),
            self.time_index.max_entries - len(self.time_index),
        )

    def can_hold(self, last_offset: int, size: int, segment_bytes: int) -> bool:
        """Whether a batch ending at ``last_offset`` of ``size`` bytes fits without a roll."""
        if self.offset_index.is_full or self.time_index.is_full:
            return False
        if last_offset - self.base_offset > MAX_RELATIVE_OFFSET:
            return False
        return self.size == 0 or self.size + size <= segment_bytes

    # -- appends -------------------------------------------------------------------------------

    def append(self, prefix: bytes, body: bytes | memoryview, h: BatchHeader) -> int:
        """Write one batch (``prefix`` + ``body``) whose patched header is ``h``.

        Returns the position it was written at. ``h`` must carry the final base offset.
        """
        position = self.size
        assert len(prefix) + len(body) == h.size_bytes
        self.append_many([(prefix, body, h)])
        return position

    def append_many(self, batches: Sequence[tuple[bytes, bytes | memoryview, BatchHeader]]) -> None:
        """Write batches (``prefix``, ``body``, patched header) back to back in as few calls as
        the kernel takes (``IOV_MAX`` buffers each); all or nothing, as :meth:`append`."""
        start = self.size
        position = start
        with self._handles.use(self._handle) as fd:
            try:
                for at in range(0, len(batches), _BATCHES_PER_WRITE):
                    chunk = batches[at : at + _BATCHES_PER_WRITE]
                    total = bytes_taken([h for _, _, h in chunk])
                    buffers = [b for prefix, body, _ in chunk for b in (prefix, body)]
                    written = fileio.ops.pwritev(fd, buffers, position)
                    if written < total:  # short write: finish the remainder
                        rest = b"".join(buffers)[written:]
                        while written < total:
                            done = fileio.ops.pwrite(fd, rest, position + written)
                            rest = rest[done:]
                            written += done
                    position += total
            except OSError as e:
                undone = self._try_truncate(fd, start)
                if undone and e.errno in DISK_FULL_ERRNOS:
                    raise StorageFullError(
                        f"{self.log_path.parent.name}: disk full ({e.strerror}); "
                        "nothing was appended"
                    ) from e
                raise KafkaStorageError(f"write to {self.log_path} failed: {e}") from e
        position = start
        for _, _, h in batches:
            self._track(position, h)
            position = self.size

    def _track(self, position: int, h: BatchHeader) -> None:
        """Account for a batch at ``position`` in sizes, offsets and the indexes. (Its fields
        read directly, not through the header's properties: once for every batch appended.)"""
        size = h.batch_length + LOG_OVERHEAD
        last = h.base_offset + h.last_offset_delta
        self.size = position + size
        self.next_offset = last + 1
        if self.first_batch_ms == NO_TIMESTAMP:
            self.first_batch_ms = h.max_timestamp
            if self.rolling_base_ms == NO_TIMESTAMP:
                self.rolling_base_ms = h.max_timestamp  # a recovery scan; appends override
        if h.max_timestamp > self.max_timestamp:
            self.max_timestamp = h.max_timestamp
            self.offset_of_max_timestamp = last
        if self._bytes_since_index >= self.index_interval_bytes or position == 0:
            self.offset_index.append(last, position)
            self.time_index.maybe_append(self.max_timestamp, self.offset_of_max_timestamp)
            self._bytes_since_index = 0
        self._bytes_since_index += size

    def _try_truncate(self, fd: int, position: int) -> bool:
        """Cut a failed write off; False if that failed too (recovery cuts the torn tail)."""
        try:
            fileio.ops.ftruncate(fd, position)
        except OSError:
            return False
        return True

    # -- reads ---------------------------------------------------------------------------------

    def read_bytes(self, position: int, size: int) -> bytes:
        with self._handles.use(self._handle) as fd:
            data = os.pread(fd, size, position)
        if len(data) != size:
            raise KafkaStorageError(
                f"short read of {self.log_path}: {len(data)} of {size} bytes at {position}"
            )
        return data

    def _header_at(self, fd: int, position: int) -> BatchHeader | None:
        raw = os.pread(fd, HEADER_BYTES, position)
        if len(raw) < HEADER_BYTES:
            return None
        return BatchHeader(*HEADER.unpack_from(raw))

    def find_batch(
        self, offset: int, end_position: int | None = None
    ) -> tuple[int, BatchHeader] | None:
        """The first batch whose last offset is >= ``offset``, as (position, header).

        Binary search of the offset index, then a scan of batch headers. None if no batch
        before ``end_position`` (default: the segment's end) holds such an offset.
        """
        end = self.size if end_position is None else end_position
        _, position = self.offset_index.lookup(offset)
        with self._handles.use(self._handle) as fd:
            while position < end:
                h = self._header_at(fd, position)
                if h is None:
                    return None
                if h.last_offset >= offset:
                    return position, h
                position += h.size_bytes
        return None

    def end_of(self, offset: int) -> tuple[int, int]:
        """Where the batches up to the one holding ``offset`` end: the position just past it
        and the offset after it (past the last batch before ``offset`` where a compaction gap
        holds it; the segment's end where no batch here goes beyond it)."""
        found = self.find_batch(offset + 1)
        if found is None:
            return self.size, self.next_offset
        position, h = found
        if h.base_offset <= offset:
            return position + h.size_bytes, h.next_offset
        return position, h.base_offset

    def batch_headers(self, from_offset: int) -> list[BatchHeader]:
        """Headers of the batches from the one holding ``from_offset`` to the end."""
        return [h for _, h in self.batch_positions(from_offset)]

    def batch_positions(self, from_offset: int) -> list[tuple[int, BatchHeader]]:
        """(position, header) of the batches from the one holding ``from_offset`` to the end."""
        found = self.find_batch(from_offset)
        if found is None:
            return []
        position, _ = found
        out: list[tuple[int, BatchHeader]] = []
        with self._handles.use(self._handle) as fd:
            while position < self.size:
                h = self._header_at(fd, position)
                if h is None:
                    break
                out.append((position, h))
                position += h.size_bytes
        return out

    def slice(
        self, offset: int, max_bytes: int, end_position: int, last_offset: int | None = None
    ) -> FetchSlice | None:
        """Whole batches from the one holding ``offset``, up to ``max_bytes`` and, with
        ``last_offset``, none after the batch holding it (at least one batch either way), never
        past ``end_position``. None when nothing at ``offset`` is readable."""
        found = self.find_batch(offset, end_position)
        if found is None:
            return None
        start, first = found
        if start + first.size_bytes > end_position:
            return None
        limit = min(end_position, start + max_bytes)
        if last_offset is not None:  # the batches wanted end here, unless a bound above cuts
            if first.last_offset >= last_offset:
                end, next_offset = start + first.size_bytes, first.next_offset
            else:
                end, next_offset = self.end_of(last_offset)
            if end <= limit:
                return FetchSlice(start, end - start, first.base_offset, next_offset)
        if limit >= end_position:
            end, next_offset = self._walk_to(start, end_position)
        else:
            end, next_offset = self._walk_to(start, limit)
            if end == start:  # the first batch alone is larger than max_bytes: send it anyway
                end, next_offset = start + first.size_bytes, first.next_offset
        return FetchSlice(start, end - start, first.base_offset, next_offset)

    def _walk_to(self, start: int, limit: int) -> tuple[int, int]:
        """Last batch boundary <= ``limit`` reachable from ``start``, and the offset after it.

        Jumps with the offset index close to ``limit`` first, so the header walk is short.
        """
        entry_offset, position = self.offset_index.lookup_position(limit)
        boundary, next_offset = start, -1
        with self._handles.use(self._handle) as fd:
            if position > start:
                h = self._header_at(fd, position)
                if h is not None and h.last_offset == entry_offset:
                    if position + h.size_bytes > limit:
                        # The indexed batch crosses the limit: its base is the next offset.
                        boundary, next_offset = position, h.base_offset
                    else:
                        boundary = position + h.size_bytes
                        next_offset = h.next_offset
            while True:
                h = self._header_at(fd, boundary)
                if h is None or boundary + h.size_bytes > limit:
                    break
                boundary += h.size_bytes
                next_offset = h.next_offset
        return boundary, next_offset

    def offset_for_timestamp(self, timestamp: int, min_offset: int = 0) -> int | None:
        """The first offset >= ``min_offset`` in this segment whose record timestamp is >=
        ``timestamp``."""
        if self.max_timestamp < timestamp:
            return None
        start_offset = self.time_index.lookup(timestamp)
        found = self.find_batch(start_offset)
        if found is None:
            return None
        position, _ = found
        with self._handles.use(self._handle) as fd:
            while position < self.size:
                h2 = self._header_at(fd, position)
                if h2 is None:
                    return None
                if h2.max_timestamp >= timestamp:
                    data = os.pread(fd, h2.size_bytes, position)
                    hit = first_at_or_after(data, h2, timestamp, min_offset)
                    if hit is not None:
                        return hit
                position += h2.size_bytes
        return None

    # -- durability ------------------------------------------------------------------------------

    def fsync(self) -> None:
        """Flush pending index entries and fsync the log (safe alongside appends). New
        aborted-transaction entries are fsynced too: recovery trusts them below the recovery
        point."""
        self.offset_index.flush(fsync=False)
        self.time_index.flush(fsync=False)
        self.txn_index.flush(fsync=True)
        if self._closed:
            return
        # Retention may delete this segment meanwhile: then there is nothing left to sync.
        with contextlib.suppress(RetiredHandleError), self._handles.use(self._handle) as fd:
            fileio.ops.fdatasync(fd)  # data and the file size; other metadata is not needed to read

    def on_roll(self) -> None:
        """Called when this segment stops being active: index its final max timestamp."""
        if self.max_timestamp != NO_TIMESTAMP:
            self.time_index.maybe_append(self.max_timestamp, self.offset_of_max_timestamp)
        self.pin(False)

    # -- loading, recovery, truncation -----------------------------------------------------------

    def load(self) -> None:
        """Open an existing segment after a clean shutdown, trusting (sanity-checked) indexes.

        Rebuilds the indexes by a full recovery scan if they are missing or insane.
        """
        self.size = os.path.getsize(self.log_path)
        try:
            self.offset_index.load(self.size)
            self._reload_tail()
            self.time_index.load(self.next_offset)
        except (IndexCorrupt, CorruptRecordError):
            self.recover()
            return
        try:
            self.txn_index.load(self.next_offset)
        except IndexCorrupt:
            self.txn_index.reset()
            self.txn_index_stale = True
        last = self.time_index.last_entry
        if last is not None and last[0] > self.max_timestamp:
            self.max_timestamp, self.offset_of_max_timestamp = last

    def _reload_tail(self) -> None:
        """Re-derive next offset, first batch time and max timestamp from the files."""
        self.next_offset = self.base_offset
        self.max_timestamp = NO_TIMESTAMP
        self.offset_of_max_timestamp = self.base_offset
        self.first_batch_ms = self.rolling_base_ms = NO_TIMESTAMP
        if self.size == 0:
            return
        with self._handles.use(self._handle) as fd:
            first = self._header_at(fd, 0)
        if first is None:
            raise CorruptRecordError(f"{self.log_path.name}: torn first batch")
        self.first_batch_ms = self.rolling_base_ms = first.max_timestamp
        last = self.time_index.last_entry
        if last is not None:
            self.max_timestamp, self.offset_of_max_timestamp = last
        entry_offset, position = self.offset_index.lookup(2**63 - 1)
        if len(self.offset_index):
            with self._handles.use(self._handle) as fd:
                h = self._header_at(fd, position)
            if h is None or h.last_offset != entry_offset:
                raise IndexCorrupt(f"{self.offset_index.path.name}: last entry is not a batch")
        self._scan_tail(position)

    def _scan_tail(self, position: int) -> None:
        """Walk headers from ``position`` to the end to learn next offset and max timestamp.

        Trusts nothing it reads: a bad length or magic (an index entry that points inside a
        batch, say) raises CorruptRecordError, and the caller rebuilds from a full scan.
        """
        with self._handles.use(self._handle) as fd:
            while position < self.size:
                h = self._header_at(fd, position)
                if (
                    h is None
                    or h.magic != MAGIC
                    or h.batch_length < HEADER_BYTES - LOG_OVERHEAD
                    or h.size_bytes > MAX_BATCH_BYTES
                    or position + h.size_bytes > self.size
                ):
                    raise CorruptRecordError(f"{self.log_path.name}: bad batch at {position}")
                self.next_offset = h.next_offset
                if h.max_timestamp > self.max_timestamp:
                    self.max_timestamp = h.max_timestamp
                    self.offset_of_max_timestamp = h.last_offset
                position += h.size_bytes
        if position != self.size:
            raise CorruptRecordError(f"{self.log_path.name}: size does not end on a batch")

    def recover(
        self,
        on_batch: Callable[[BatchHeader], None] | None = None,
        before_truncate: Callable[[], None] | None = None,
    ) -> int:
        """Re-validate every batch, rebuild both indexes, cut the file at the first bad batch.

        Returns the number of bytes truncated (0 when the segment was intact). ``on_batch`` sees
        every valid batch in order (to rebuild the epoch cache and producer state);
        ``before_truncate`` runs just before the cut, so later segments can be removed first
        and the cut is the step that commits the recovery.
        """
        self.offset_index.reset()
        self.time_index.reset()
        self.txn_index.reset()
        self.txn_index_stale = True
        self.next_offset = self.base_offset
        self.max_timestamp = NO_TIMESTAMP
        self.offset_of_max_timestamp = self.base_offset
        self.first_batch_ms = self.rolling_base_ms = NO_TIMESTAMP
        self._bytes_since_index = 0
        file_size = os.path.getsize(self.log_path)
        position = 0
        with self._handles.use(self._handle) as fd:
            buf = b""
            buf_pos = 0  # file position of buf[0]
            while position < file_size:
                rel = position - buf_pos
                if len(buf) - rel < HEADER_BYTES:
                    buf, buf_pos, rel = os.pread(fd, RECOVERY_CHUNK_BYTES, position), position, 0
                try:
                    h = self._valid_batch_at(fd, buf, rel, position, file_size)
                except CorruptRecordError:
                    break
                self._track(position, h)
                if on_batch is not None:
                    on_batch(h)
                position += h.size_bytes
            truncated = file_size - position
            if truncated:
                if before_truncate is not None:
                    before_truncate()
                fileio.ops.ftruncate(fd, position)
                fileio.ops.fsync(fd)
        self.size = position
        return truncated

    def _valid_batch_at(
        self, fd: int, buf: bytes, rel: int, position: int, file_size: int
    ) -> BatchHeader:
        if len(buf) - rel < HEADER_BYTES:
            raise CorruptRecordError("torn header")
        h = BatchHeader(*HEADER.unpack_from(buf, rel))
        size = h.batch_length + LOG_OVERHEAD
        if h.batch_length < HEADER_BYTES - LOG_OVERHEAD or size > MAX_BATCH_BYTES:
            raise CorruptRecordError("bad length")
        if position + size > file_size:
            raise CorruptRecordError("length past end of file")
        if h.base_offset < self.next_offset or (
            h.last_offset - self.base_offset > MAX_RELATIVE_OFFSET
        ):
            raise CorruptRecordError("offsets out of order")
        data = buf if rel + size <= len(buf) else os.pread(fd, size, position)
        start = rel if data is buf else 0
        return validate_batch(data, start)

    def truncate_to(self, offset: int) -> int:
        """Remove every batch whose last offset is >= ``offset``; return bytes removed."""
        found = self.find_batch(offset)
        if found is None:
            return 0
        position, _ = found
        removed = self.size - position
        with self._handles.use(self._handle) as fd:
            fileio.ops.ftruncate(fd, position)
        self.offset_index.truncate_to_position(position)
        self.time_index.truncate_to_offset(offset)
        self.txn_index.truncate_to(offset)
        self.size = position
        self._reload_tail()
        self._bytes_since_index = self.index_interval_bytes  # index the next append
        return removed

    def abandon(self) -> None:
        """Close the file without writing anything (its log directory failed)."""
        self._closed = True
        self._handle.pinned = False
        self._handles.close(self._handle)

    def close(self) -> None:
        if self._closed:
            return
        self.offset_index.flush(fsync=False)
        self.time_index.flush(fsync=False)
        self.txn_index.flush(fsync=False)
        self._closed = True
        self._handle.pinned = False
        self._handles.close(self._handle)

    def delete(self) -> None:
        self.close()
        self.log_path.unlink(missing_ok=True)
        self.offset_index.delete()
        self.time_index.delete()
        self.txn_index.delete()


# Timestamps compared per C call: ~1 ms of the GIL each, so the event loop gets it back between
# chunks (a C call is never interrupted by the interpreter's 5 ms switch interval).
_SEARCH_CHUNK = 8192


def first_at_or_after(data: bytes, h: BatchHeader, timestamp: int, min_offset: int) -> int | None:
    """The first offset >= ``min_offset`` in the batch ``data`` whose timestamp is >=
    ``timestamp``. An uncompressed batch is walked in C (``batch_columns``: no Python object
    per record, ~1 ms for 100,000 records where decoding them takes ~300 ms of the GIL);
    a compressed one, or one the column walk refuses, is decoded."""
    try:
        columns = batch_columns(data, max(min_offset, h.base_offset), h.next_offset, False)
    except CorruptRecordError:
        columns = None
    if columns is None:
        for record in _readable_records(data, h):
            if record.timestamp >= timestamp and record.offset >= min_offset:
                return record.offset
        return None
    offsets, stamps_us = array.array("q"), array.array("q")
    offsets.frombytes(columns[2])
    stamps_us.frombytes(columns[3])
    at_or_after = (timestamp * 1000).__le__
    for start in range(0, len(stamps_us), _SEARCH_CHUNK):
        end = start + _SEARCH_CHUNK
        chunk = map(at_or_after, stamps_us[start:end])  # no bytecode per record
        first = next(itertools.compress(range(start, end), chunk), None)
        if first is not None:
            return offsets[first]
    return None


def _readable_records(data: bytes, h: BatchHeader) -> list[Record]:
    """The records of the batch ``data`` a timestamp lookup can use: one unreadable record
    (stored before produce checked what it checks now, or corrupt) must not fail every lookup
    on its partition, so the walk's fault ends the list instead of raising, and a record whose
    timestamp no reader renders is left out."""
    try:
        section = records_section(data, h)
    except CorruptRecordError:
        return []
    records, _ = walk_records(h, section, check_timestamps=False)
    return [r for r in records if timestamp_ok(r.timestamp)]  # others say nothing of time
