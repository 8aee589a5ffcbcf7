"""Log compaction: keep the latest record per key of a ``cleanup.policy=compact`` log.

Theory of operation (Kafka's LogCleaner, one log at a time)
-----------------------------------------------------------
* Ranges: the *cleanable* range runs from the log start to the first segment that may not be
  cleaned: the active segment, a segment holding offsets at or past the last stable offset
  (LSO, itself at or below the high watermark: every transaction below it is decided) or the
  recovery point (only durable data is cleaned), or a segment whose largest timestamp is newer
  than ``now - min.compaction.lag.ms``. Whole segments only. The *first dirty offset*
  (persisted in ``cleaner-offset-checkpoint``) splits it into the clean part (already
  compacted) and the dirty part. A transaction left open therefore stops cleaning at its first
  offset until it ends (Kafka's first unstable offset; ``transaction.timeout.ms`` bounds it).
* Transactions: a transactional data batch below the LSO is aborted when its offset lies in
  ``[first, marker]`` of an entry of its producer in the segments' aborted-transaction indexes
  (``.txnindex``; a producer's transactions never overlap), else committed.
* Pass 1 maps key → latest offset over the dirty part, at most ``max_keys`` keys (the memory
  bound), committed transactional records included, markers and aborted records left out (an
  aborted value must not remove the committed one it would have replaced). When the map is
  full the pass is partial: it cleans only up to the *clean point*, the offset after the last
  record mapped; the next pass continues from there.
* Pass 2 rewrites every segment of the cleanable range that starts below the clean point (each
  into one new segment of the same base offset; segments are not merged). A record is dropped
  when its key has a later offset in the map (records in the clean part are dropped as well
  when the dirty part supersedes them); committed transactional records are compacted so,
  except that only a record after the transaction's marker supersedes one: the group
  coordinator applies a transactional offset at its COMMIT marker, over a plain commit or
  delete of the same key appended between the two, so removing the transactional record for
  such a one would make a reload of ``__consumer_offsets`` differ from the live state (Kafka's
  coordinator instead lets the newer record win; kept, the log reads the same both ways).
  Kept always: records at or after the clean point and records without a key (Kafka rejects
  keyless records on compacted topics; Logbus keeps them). A batch of an aborted transaction
  below the clean point goes whole.
* Markers (control batches) go like tombstones once their transaction has no data left: a
  marker of producer ``p`` is kept while any transactional batch of ``p`` between ``p``'s
  previous marker and it stays in the cleaned log; once none does, the pass stamps it with a
  delete horizon ``now + delete.retention.ms`` and a pass at or after that drops it — so a
  reader that saw the transaction's data before it went still finds the marker for
  ``delete.retention.ms``. A marker held back by the rules below is stamped by the first pass
  with dirty data after they stop holding it. Two
  more rules keep a restart exact: a producer's last batch (a marker, usually) stays, and a
  marker stays while a producer snapshot (``{offset}.snapshot``) lies between ``p``'s previous
  marker and it — recovery replays from a snapshot, and one taken inside the transaction needs
  the marker to close it (else the LSO would stick); only the newest two snapshots are kept,
  near the log end, so this rarely holds a marker back. A control batch that is no transaction
  marker stays as it is.
* Aborted index: a cleaned segment keeps the entries whose ABORT marker it keeps (a segment
  whose entries all go gets an empty ``.txnindex``). An entry whose marker stays after its data
  went is harmless: it only tells ``read_committed`` to skip batches that are no longer there.
  Entries are dropped only with their markers, never while aborted data they cover remains.
* Producers: the last batch of every producer (``producer_id >= 0``, last in the whole log)
  and its last data batch are filtered like any other but never dropped: emptied, they stay as
  batches of zero records with their header (producer id, epoch, sequences, offset range),
  which idempotence needs after a restart — as Kafka does. (The last batch is a marker after a
  transaction; with markers of the same epoch the sequences live in the data batch before.)
  An aborted last data batch stays empty, with its marker and index entry.
* Tombstones (a key with a null value) follow KIP-534: the first pass that rewrites a batch
  holding a tombstone stamps the batch with a delete horizon ``now + delete.retention.ms``
  (attribute bit + ``baseTimestamp``; record timestamps are kept). A pass at or after the
  horizon drops the batch's tombstones. A consumer that reads from the log start to its end
  within ``delete.retention.ms`` of the first cleaning therefore sees every delete. So a
  committed transactional record deleted by a later tombstone stays deleted (a consumer
  group's offset committed in a transaction, then deleted, does not come back at a reload).
* Surviving records keep their offsets, order, headers and timestamps; each rebuilt batch
  keeps its header fields and codec (:func:`core_log.batch.rebuild_batch`); an unchanged batch
  is copied byte for byte, an emptied batch is dropped, an emptied segment is removed and an
  unchanged segment is not rewritten. Fetching a compacted-away offset returns the next record.
* Swap (crash-safe, see :meth:`PartitionLog.swap_cleaned` and :func:`complete_swaps`): cleaned
  segments are written and fsynced as ``{base}.log.cleaned`` (+ indexes) without the log's
  lock; only the renames ``.cleaned`` → ``.swap`` → final names and the exchange of segment
  objects run under it. A pass whose segments changed meanwhile (retention, truncation) is
  dropped. After the swap the first dirty offset moves to the clean point.
* Scheduling (:func:`cleaning_priority`): a log is due when its dirty ratio (dirty bytes /
  cleanable bytes) is at least ``min.cleanable.dirty.ratio``, or a dirty segment is older
  than ``max.compaction.lag.ms``, or (with nothing dirty) the earliest delete horizon of a
  kept tombstone or marker has passed; the janitor cleans due logs dirtiest first. An explicit
  :func:`clean_log` always runs (with nothing dirty it only drops expired tombstones).
  The active segment is not rolled for ``max.compaction.lag.ms`` (``segment.ms`` does that).
* Throttle: an optional bytes-per-second bound on what the cleaner reads and writes.
"""

from __future__ import annotations

import bisect
import contextlib
import logging
import os
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from . import fileio
from .batch import (
    HEADER_BYTES,
    PREFIX_BYTES,
    BatchHeader,
    delete_horizon_of,
    parse_header,
    rebuild_batch,
    records_section,
    timestamp_ok,
    walk_records,
)
from .checkpoint import fsync_dir, read_json, write_json
from .config import LONG_MAX
from .control import ControlMarker, parse_control_batch
from .errors import CorruptRecordError
from .handles import RetiredHandleError
from .producer_state import list_snapshots
from .recordscan import record_keys
from .segment import LogSegment

if TYPE_CHECKING:
    from .log import PartitionLog

logger = logging.getLogger(__name__)

CLEANER_CHECKPOINT = "cleaner-offset-checkpoint"
DEFAULT_MAX_KEYS = 1_000_000


@dataclass(frozen=True, slots=True)
class CleanableRange:
    first_dirty_offset: int
    end_offset: int  # first offset that may not be cleaned
    segments: tuple[LogSegment, ...]  # the cleanable segments, oldest first
    clean_bytes: int
    dirty_bytes: int
    overdue: bool  # a dirty segment is older than max.compaction.lag.ms

    @property
    def dirty_ratio(self) -> float:
        total = self.clean_bytes + self.dirty_bytes
        return self.dirty_bytes / total if total else 0.0


@dataclass(frozen=True, slots=True)
class CleanResult:
    first_dirty_offset: int  # where the map started
    clean_point: int  # the new first dirty offset (== first_dirty_offset: nothing done)
    segments_rewritten: int
    segments_removed: int
    records_removed: int
    bytes_before: int
    bytes_after: int
    swapped: bool  # False: nothing to swap, or the log changed and the pass was dropped


def _read_checkpoint(log: PartitionLog) -> tuple[int, int]:
    state = read_json(log.directory / CLEANER_CHECKPOINT)
    offset, horizon = -1, -1
    if isinstance(state, dict):
        with contextlib.suppress(TypeError, ValueError):
            offset = int(state.get("first_dirty_offset", -1))
            horizon = int(state.get("next_delete_horizon_ms", -1))
    return offset, horizon


def read_first_dirty_offset(log: PartitionLog) -> int:
    """The persisted first dirty offset, reset to the log start when out of range."""
    offset, _ = _read_checkpoint(log)
    if offset < log.log_start_offset or offset > log.log_end_offset:
        return log.log_start_offset
    return offset


def write_first_dirty_offset(log: PartitionLog, offset: int, next_horizon: int) -> None:
    """Persist the first dirty offset and the earliest delete horizon of a kept tombstone
    (when a pass is due to drop tombstones even though nothing is dirty)."""
    state = {"first_dirty_offset": offset, "next_delete_horizon_ms": next_horizon}
    write_json(log.directory / CLEANER_CHECKPOINT, state)


def cleanable_range(log: PartitionLog, now: int) -> CleanableRange:
    """The cleanable segments of ``log`` at ``now`` and how dirty they are."""
    c = log.config
    segments = log.segments
    # Only durable data: a segment flushed past the recovery point is not in a running
    # flush's list, so no flush writes to the files the swap replaces. Only stable data: below
    # the last stable offset (itself <= the high watermark) every transaction is decided, so
    # each transactional batch is known committed or aborted.
    hw = min(log.last_stable_offset, log.recovery_point)
    first_dirty = read_first_dirty_offset(log)
    cleanable: list[LogSegment] = []
    for s in segments[:-1]:  # never the active segment
        if s.next_offset > hw or s.max_timestamp > now - c.min_compaction_lag_ms:
            break
        cleanable.append(s)
    end = cleanable[-1].next_offset if cleanable else first_dirty
    clean = sum(s.size for s in cleanable if s.next_offset <= first_dirty)
    dirty_segments = [s for s in cleanable if s.next_offset > first_dirty]
    overdue = any(
        s.first_batch_ms >= 0 and now - s.first_batch_ms > c.max_compaction_lag_ms
        for s in dirty_segments
    )
    dirty = sum(s.size for s in dirty_segments)
    return CleanableRange(first_dirty, end, tuple(cleanable), clean, dirty, overdue)


def cleaning_priority(log: PartitionLog, now: int) -> float | None:
    """The dirty ratio of ``log`` when it is due for cleaning, else None."""
    if not log.config.compact:
        return None
    r = cleanable_range(log, now)
    if r.dirty_bytes == 0:
        _, horizon = _read_checkpoint(log)
        return 0.0 if r.segments and 0 <= horizon <= now else None
    if r.overdue or r.dirty_ratio >= log.config.min_cleanable_dirty_ratio:
        return r.dirty_ratio
    return None


class _Throttle:
    """Sleep so that the bytes counted stay under ``rate`` per second (None: no bound)."""

    def __init__(self, rate: float | None, sleep: Callable[[float], None]) -> None:
        self._rate = rate
        self._sleep = sleep
        self._start = time.monotonic()
        self._bytes = 0

    def add(self, n: int) -> None:
        if self._rate is None:
            return
        self._bytes += n
        ahead = self._bytes / self._rate - (time.monotonic() - self._start)
        if ahead > 0:
            self._sleep(ahead)


def _batches(segment: LogSegment, size: int) -> Iterator[tuple[BatchHeader, bytes]]:
    """Every batch of ``segment`` up to byte ``size``, as (header, bytes)."""
    position = 0
    while position + HEADER_BYTES <= size:
        head = segment.read_bytes(position, HEADER_BYTES)
        h = parse_header(head)
        yield h, head + segment.read_bytes(position + HEADER_BYTES, h.size_bytes - HEADER_BYTES)
        position += h.size_bytes


def _headers(segment: LogSegment, size: int) -> Iterator[BatchHeader]:
    position = 0
    while position + HEADER_BYTES <= size:
        h = parse_header(segment.read_bytes(position, HEADER_BYTES))
        yield h
        position += h.size_bytes


def _append(segment: LogSegment, raw: bytes, throttle: _Throttle) -> None:
    segment.append(raw[:PREFIX_BYTES], memoryview(raw)[PREFIX_BYTES:], parse_header(raw))
    throttle.add(len(raw))


class _Aborted:
    """The aborted transactions of the whole log (every segment's ``.txnindex``), by producer:
    a transactional data batch of producer ``p`` is aborted when its offset lies in ``[first,
    marker]`` of one of ``p``'s entries (a producer's transactions do not overlap), else, below
    the last stable offset, committed. Aborts are rare, so this stays small."""

    def __init__(self, segments: list[LogSegment]) -> None:
        ranges: dict[int, list[tuple[int, int]]] = {}
        for s in segments:
            for e in s.txn_index.entries:
                ranges.setdefault(e.producer_id, []).append((e.first_offset, e.last_offset))
        for r in ranges.values():
            r.sort()
        self._ranges = ranges

    def __contains__(self, h: BatchHeader) -> bool:
        if not h.is_transactional or h.is_control:
            return False
        r = self._ranges.get(h.producer_id)
        if not r:
            return False
        i = bisect.bisect_right(r, (h.base_offset, LONG_MAX)) - 1
        return i >= 0 and r[i][1] >= h.base_offset


def _build_map(
    dirty: list[tuple[LogSegment, int]],
    first_dirty: int,
    max_keys: int,
    throttle: _Throttle,
    aborted: _Aborted,
) -> tuple[dict[bytes, int], int]:
    """Key → latest offset over the dirty segments, and the clean point (see module doc).
    Committed transactional records are mapped like any; markers and aborted data are not."""
    offset_map: dict[bytes, int] = {}
    clean_point = first_dirty
    for segment, size in dirty:
        for h, raw in _batches(segment, size):
            throttle.add(len(raw))
            if h.next_offset <= first_dirty:
                continue
            if not h.is_control and h not in aborted:
                for key, delta, _ in _keys_or_none(raw, h) or ():
                    offset = h.base_offset + delta
                    if offset < first_dirty or key is None:
                        continue
                    if key not in offset_map and len(offset_map) >= max_keys:
                        return offset_map, max(clean_point, offset)
                    offset_map[key] = offset
            clean_point = h.next_offset
        clean_point = max(clean_point, segment.next_offset)
    return offset_map, clean_point


def clean_log(
    log: PartitionLog,
    now: int | None = None,
    *,
    max_keys: int = DEFAULT_MAX_KEYS,
    throttle_bytes_per_s: float | None = None,
    sleep: Callable[[float], None] = time.sleep,
    hook: Callable[[str], None] | None = None,
) -> CleanResult | None:
    """One cleaning pass over ``log`` (see the module doc); None unless it is compacted.

    Runs without the log's lock except for the final swap. ``hook`` is called with
    ``"cleaned"`` (cleaned files written), ``"swap"`` (all renamed to ``.swap``) and
    ``"mid-swap"`` (first file renamed into place): tests raise there to simulate a crash.
    """
    if max_keys < 1:
        raise ValueError("max_keys must be at least 1")
    if not log.config.compact:
        return None
    with log.cleaner_lock:  # one pass per log at a time: they would share file names
        return _clean(log, now, max_keys, throttle_bytes_per_s, sleep, hook)


def _clean(
    log: PartitionLog,
    now: int | None,
    max_keys: int,
    throttle_bytes_per_s: float | None,
    sleep: Callable[[float], None],
    hook: Callable[[str], None] | None,
) -> CleanResult:
    c = log.config
    now = log.clock.now_ms() if now is None else now
    r = cleanable_range(log, now)
    first_dirty = r.first_dirty_offset
    nothing = CleanResult(first_dirty, first_dirty, 0, 0, 0, 0, 0, False)
    dirty = [(s, s.size) for s in r.segments if s.next_offset > first_dirty]
    if not r.segments or (not dirty and not 0 <= _read_checkpoint(log)[1] <= now):
        return nothing  # nothing dirty and no tombstone due to go
    for stray in log.directory.glob("*.cleaned"):  # an earlier pass that failed
        stray.unlink()
    throttle = _Throttle(throttle_bytes_per_s, sleep)
    written: list[LogSegment] = []
    try:
        aborted = _Aborted(log.segments)
        offset_map, clean_point = _build_map(dirty, first_dirty, max_keys, throttle, aborted)
        # Producer id -> base offset of its last batch, and of its last data batch (with
        # markers of the same epoch its sequence numbers live in the data batch before them).
        last_batch_of: dict[int, int] = {}
        last_data_of: dict[int, int] = {}
        markers_of: dict[int, list[int]] = {}  # producer id -> its markers' offsets, in order
        for s in log.segments:
            for h in _headers(s, s.size):
                if h.producer_id >= 0:
                    last_batch_of[h.producer_id] = h.base_offset
                    if h.is_control:
                        markers_of.setdefault(h.producer_id, []).append(h.base_offset)
                    else:
                        last_data_of[h.producer_id] = h.base_offset
        snapshots = list_snapshots(log.directory)
        # Per producer, while walking the log in order: the offset of its previous marker, and
        # whether a data batch of its current transaction stays in the cleaned log.
        previous_marker: dict[int, int] = {}
        txn_data_kept: set[int] = set()
        replaced: list[tuple[LogSegment, int, bool]] = []
        removed_records = bytes_before = bytes_after = removed_segments = 0
        horizon_for_new = min(now + c.delete_retention_ms, LONG_MAX)
        next_horizon = LONG_MAX  # the earliest horizon of a tombstone or marker kept
        for old in r.segments:
            if old.base_offset >= clean_point:
                break
            size = old.size
            # The cleaned copy is started at the first change (unchanged batches before it
            # are copied then): a segment with nothing to drop is only read, never written.
            new: LogSegment | None = None
            dropped_markers: set[int] = set()
            position = 0
            for h, raw in _batches(old, size):
                throttle.add(len(raw))
                batch_position, position = position, position + h.size_bytes
                producer_last = h.producer_id >= 0 and h.base_offset in (
                    last_batch_of.get(h.producer_id),
                    last_data_of.get(h.producer_id),
                )
                out: bytes | None = raw
                below = h.last_offset < clean_point
                if h.is_control:
                    marker = _marker_or_none(raw, h)
                    if marker is not None:
                        pid = h.producer_id
                        data_kept = pid in txn_data_kept
                        txn_data_kept.discard(pid)
                        earlier = previous_marker.get(pid, -1)
                        previous_marker[pid] = h.base_offset
                        if below and not producer_last and not data_kept:
                            i = bisect.bisect_right(snapshots, earlier)
                            if i == len(snapshots) or snapshots[i] > h.base_offset:
                                horizon = delete_horizon_of(h)
                                if horizon is not None and now >= horizon:
                                    out = None
                                    removed_records += h.record_count
                                    dropped_markers.add(h.base_offset)
                                else:
                                    if horizon is None:
                                        horizon = horizon_for_new
                                        out = _stamped(raw, h, horizon)
                                    next_horizon = min(next_horizon, horizon)
                elif h in aborted:
                    if below:  # aborted data goes whole; a producer's last batch stays, empty
                        out = None
                        if producer_last and h.record_count:
                            out = rebuild_batch(h, [], delete_horizon_of(h))
                        elif producer_last:
                            out = raw
                        removed_records += h.record_count
                else:
                    # A committed transactional record is superseded only by a record after
                    # its marker: the group coordinator applies transactional offsets at the
                    # marker, over a record appended between them (see the module doc).
                    applied_at = -1
                    if h.is_transactional:
                        ends = markers_of.get(h.producer_id, [])
                        i = bisect.bisect_right(ends, h.base_offset)
                        applied_at = ends[i] if i < len(ends) else LONG_MAX
                    filtered = _filter(
                        h,
                        raw,
                        offset_map,
                        clean_point,
                        now,
                        producer_last,
                        horizon_for_new,
                        applied_at,
                    )
                    if filtered is not None:
                        out, removed, horizon = filtered
                        removed_records += removed
                        if horizon is not None:
                            next_horizon = min(next_horizon, horizon)
                if out is not None and h.is_transactional and not h.is_control:
                    txn_data_kept.add(h.producer_id)
                if out is raw:
                    if new is not None:
                        _append(new, raw, throttle)
                    continue
                if new is None:
                    new = log.new_cleaned_segment(old.base_offset)
                    written.append(new)
                    for _, earlier_raw in _batches(old, batch_position):
                        _append(new, earlier_raw, throttle)
                if out is not None:
                    _append(new, out, throttle)
            if new is None:
                continue
            bytes_before += size
            bytes_after += new.size
            if new.is_empty:
                removed_segments += 1
            else:
                new.on_roll()
                for entry in old.txn_index.entries:  # an entry stays with its ABORT marker
                    if entry.last_offset not in dropped_markers:
                        new.txn_index.append(entry)
                new.offset_index.flush(fsync=True)
                new.time_index.flush(fsync=True)
                new.txn_index.flush(fsync=True)
                if old.txn_index.entries and not new.txn_index.entries:
                    # Every entry went: an empty file (an empty index) replaces the old one at
                    # the swap; with no file at all the old one would stay.
                    _write_empty(new.txn_index.path)
                new.fsync()
            new.close()
            replaced.append((old, size, not new.is_empty))
        if not replaced:
            write_first_dirty_offset(log, clean_point, next_horizon)
            return CleanResult(first_dirty, clean_point, 0, 0, 0, 0, 0, False)
        fsync_dir(log.directory)
        if hook is not None:
            hook("cleaned")
    except (RetiredHandleError, FileNotFoundError):
        # A segment went away under us (retention, truncation, close): drop the pass.
        for new in written:
            new.delete()
        return nothing
    except Exception:
        for new in written:
            new.delete()
        raise
    if not log.swap_cleaned(replaced, hook):
        return nothing
    write_first_dirty_offset(log, clean_point, next_horizon)
    return CleanResult(
        first_dirty,
        clean_point,
        len(replaced) - removed_segments,
        removed_segments,
        removed_records,
        bytes_before,
        bytes_after,
        True,
    )


def _filter(
    h: BatchHeader,
    raw: bytes,
    offset_map: dict[bytes, int],
    clean_point: int,
    now: int,
    producer_last: bool,
    horizon_for_new: int,
    applied_at: int,
) -> tuple[bytes | None, int, int | None] | None:
    """Batch ``h`` (data, not aborted) without its obsolete records: (the batch to write —
    ``raw`` itself when unchanged, None when it goes —, records removed, the delete horizon of
    a tombstone it keeps or None). A record is superseded by a later offset of its key past
    ``applied_at`` too (a committed transactional batch: its marker; else -1). None: keep the
    batch as it is (unreadable, or a record timestamp out of range). Decided from keys alone
    (C scan, no Record objects); the batch is decoded in full only when it is rewritten."""
    section = _section_or_empty(raw, h)
    keys = _keys_or_none(raw, h, section)
    if keys is None:
        return None
    horizon = delete_horizon_of(h)
    expired = horizon is not None and now >= horizon
    keep = [
        h.base_offset + delta >= clean_point
        or key is None
        or (
            offset_map.get(key, -1) <= max(h.base_offset + delta, applied_at)
            and not (tombstone and expired)
        )
        for key, delta, tombstone in keys
    ]
    kept_count = sum(keep)
    removed = len(keys) - kept_count
    tombstone_kept = any(
        k and key is not None and tombstone
        for k, (key, _, tombstone) in zip(keep, keys, strict=True)
    )
    new_horizon = horizon_for_new if tombstone_kept and horizon is None else horizon
    reported = new_horizon if tombstone_kept else None
    emptied = not kept_count and not producer_last  # e.g. an old empty batch
    if kept_count == len(keys) and new_horizon == horizon and not emptied:
        return raw, 0, reported
    records, _ = walk_records(h, section, check_timestamps=False)
    kept = [r for r, k in zip(records, keep, strict=True) if k]
    if not all(timestamp_ok(r.timestamp) for r in kept):
        logger.warning(
            "compaction keeps batch at offset %d as it is: a record timestamp is out of range",
            h.base_offset,
        )
        return None
    if not kept and not producer_last:
        return None, removed, None
    # A producer's last batch stays, even empty (its sequence numbers, for idempotence).
    return rebuild_batch(h, kept, new_horizon), removed, reported


def _marker_or_none(raw: bytes, h: BatchHeader) -> ControlMarker | None:
    """The transaction marker in control batch ``raw``, or None (kept as it is)."""
    try:
        return parse_control_batch(raw)
    except CorruptRecordError as e:
        logger.warning("compaction keeps unreadable control batch at %d: %s", h.base_offset, e)
        return None


def _stamped(raw: bytes, h: BatchHeader, horizon: int) -> bytes:
    """Control batch ``raw`` with the delete horizon ``horizon`` (KIP-534, as tombstones)."""
    records, _ = walk_records(h, records_section(raw, h), check_timestamps=False)
    return rebuild_batch(h, records, horizon)


def _write_empty(path: Path) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        fileio.ops.fsync(fd)
    finally:
        os.close(fd)


def _section_or_empty(raw: bytes, h: BatchHeader) -> bytes:
    try:
        return records_section(raw, h)
    except CorruptRecordError:
        return b""


def _keys_or_none(
    raw: bytes, h: BatchHeader, section: bytes | None = None
) -> list[tuple[bytes | None, int, bool]] | None:
    """The batch's (key, offset delta, tombstone) list, or None when its bytes are unreadable:
    such a batch (written before produce checked what it checks now, or corrupt) is kept as it
    is and its keys are not compacted, instead of failing every pass on that log."""
    try:
        if section is None:
            section = records_section(raw, h)
        return record_keys(section, h.record_count)
    except CorruptRecordError as e:
        logger.warning("compaction keeps unreadable batch at %d as it is: %s", h.base_offset, e)
        return None
