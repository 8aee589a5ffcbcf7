"""The log of one partition: an ordered list of segments and the offsets that describe them.

Theory of operation
-------------------
* Offsets: ``log_start_offset`` <= ``high_watermark`` <= ``log_end_offset`` (LEO, the next
  offset to assign), and ``recovery_point`` <= LEO is the offset below which everything is
  fsynced. The caller sets the high watermark (a single broker: :attr:`committable_offset`,
  the LEO but never past an append that must be fsynced first; a cluster: min LEO of the
  ISR). Consumers never read at or past it.
* Append (leader): every batch of a request is validated first (header, CRC, sizes), so a bad
  request changes nothing; then each batch gets its base offset and leader epoch by rewriting
  the first 16 bytes, and the rest of its bytes goes to the active segment untouched. Only a
  topic ``compression.type`` other than ``producer`` or ``LogAppendTime`` re-signs a batch.
* Append (follower): batches keep the offsets and epochs the leader gave them.
* Durability: appends land in the page cache; :meth:`flush` fsyncs every segment holding data
  past the recovery point *without holding the lock*, so appends continue during an fsync and
  the next flush covers all of them (the group commit is driven by :mod:`core_log.manager`).
* Files: ``{base:020d}.log|.index|.timeindex|.txnindex`` per segment, ``log.checkpoint``
  (JSON: recovery point, high watermark, log start offset) and ``leader-epoch-checkpoint``;
  both checkpoints are written atomically. Recovery after an unclean shutdown re-validates
  every segment from the one holding the recovery point and cuts the log at the first invalid
  batch.
* Transactions (KIP-98): a transactional batch (allowed with ``append(transactional=True)``,
  the broker's decision after asking the coordinator) opens its producer's transaction here; a
  COMMIT/ABORT marker (:meth:`PartitionLog.append_marker`, :mod:`core_log.control`) ends it.
  An ABORT adds an entry to the aborted-transaction index of the segment holding the marker
  (:mod:`core_log.txn_index`). The *last stable offset* is the first offset of the earliest
  transaction not yet stable — open, or ended by a marker the high watermark has not passed yet
  (Kafka's rule: a reader must not take a transaction for decided before its marker is
  replicated) — else the high watermark; never below the log start.
  :meth:`PartitionLog.read_committed` never returns data at or past it and returns the aborted
  transactions overlapping what it returns (:mod:`core_log.isolation` drops their records).
  Open transactions survive restart in the producer snapshots; recovery replays from a
  snapshot at or below both the high watermark and the first segment it re-validated, so the
  transactions ended but not yet stable and the aborted index entries of the re-validated
  segments are rebuilt from the log. The default paths (non-transactional appends,
  :meth:`PartitionLog.read`) do no transactional work.
* Compaction (:mod:`core_log.cleaner`) rewrites segments as ``*.cleaned`` files, then swaps
  them in under the lock (:meth:`PartitionLog.swap_cleaned`); at open,
  :func:`complete_swaps` undoes an uncommitted swap or finishes a committed one.

Threading: one ``RLock`` guards the state; every public method is safe from any thread. Worker
threads hold it across fsyncs (a roll's producer snapshot, a compaction swap), so the event loop
never waits for it: it calls :meth:`PartitionLog.try_append` / :meth:`PartitionLog.try_read`,
which give up at once when the lock is busy or the append would roll (the caller then goes to a
worker thread). The high watermark has its own lock, never held across I/O; retention deletes
files and writes its checkpoint after releasing the lock.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from .batch import (
    LOG_OVERHEAD,
    PREFIX,
    PREFIX_BYTES,
    BatchHeader,
    any_producer_id,
    bytes_taken,
    largest_batch,
    offsets_spanned,
    parse_header,
    recompress,
    records_in,
    restamp,
    split_batches,
)
from .checkpoint import fsync_dir, read_json, write_json
from .cleaner import DEFAULT_MAX_KEYS, CleanResult, clean_log
from .clock import Clock
from .compression import Compression
from .config import LogConfig
from .control import ControlMarker, build_control_batch, parse_control_batch
from .epoch_cache import LeaderEpochCache
from .errors import (
    InvalidRecordError,
    KafkaStorageError,
    OffsetOutOfRangeError,
    RecordTooLargeError,
    StorageFullError,
)
from .handles import HandleCache
from .limits import MAX_FETCH_BYTES, MAX_SEGMENTS_DELETED_PER_PASS
from .producer_state import CompletedTxn, ProducerStateManager
from .segment import DISK_FULL_ERRNOS, LogSegment
from .txn_index import TXN_INDEX_SUFFIX, AbortedTxn, collect_aborted

CHECKPOINT_FILE = "log.checkpoint"
EPOCH_FILE = "leader-epoch-checkpoint"
SUFFIXES = (".log", ".index", ".timeindex", TXN_INDEX_SUFFIX)
# Transactions ended by a marker the high watermark has not passed yet, tracked for the last
# stable offset. Past this many (a high watermark stuck for a long time under transactional
# load), the two oldest merge into one that is at least as strict (the later marker, the
# earlier first offset): the LSO may then lag, never lead.
MAX_UNSTABLE_COMPLETED = 1_000


CLEANED_SUFFIX = ".cleaned"
SWAP_SUFFIX = ".swap"


def _segment_files(directory: Path, base_offset: int, suffix: str) -> list[Path]:
    name = f"{base_offset:020d}"
    return [p for p in (directory / f"{name}{s}{suffix}" for s in SUFFIXES[::-1]) if p.exists()]


def complete_swaps(directory: Path, hook: Callable[[str], None] | None = None) -> None:
    """Finish or undo a compaction swap interrupted by a crash (Kafka's rule, made atomic).

    Any ``.cleaned`` file left means the commit — renaming *every* cleaned file to ``.swap`` —
    did not finish: the pass is undone (``.swap`` files deleted first, so a crash while undoing
    cannot leave only ``.swap`` files). Otherwise every ``.swap`` file belongs to a committed
    pass and is renamed over the segment file it replaces; an empty ``{base}.log.swap`` means
    that segment lost every record: its files are deleted. Index files go before the log file.
    """
    cleaned = sorted(directory.glob("*" + CLEANED_SUFFIX))
    swaps = sorted(directory.glob("*" + SWAP_SUFFIX))
    if cleaned:
        for p in swaps:
            p.unlink()
        if swaps:
            fsync_dir(directory)
        for p in cleaned:
            p.unlink()
        return
    if not swaps:
        return
    first = True
    for p in sorted(swaps, key=lambda p: p.name.endswith(".log" + SWAP_SUFFIX)):
        final = p.with_name(p.name[: -len(SWAP_SUFFIX)])
        if p.name.endswith(".log" + SWAP_SUFFIX) and p.stat().st_size == 0:
            stem = final.name[: -len(".log")]
            for suffix in (".index", ".timeindex", TXN_INDEX_SUFFIX, ".log"):
                (directory / f"{stem}{suffix}").unlink(missing_ok=True)
            p.unlink()
        else:
            os.replace(p, final)
        if first and hook is not None:
            hook("mid-swap")
        first = False
    fsync_dir(directory)


@dataclass(slots=True)  # not frozen: its __init__ then costs 0.5 µs, not 1.4 (one a request)
class AppendResult:
    base_offset: int  # offset of the first record appended
    last_offset: int
    batches: int
    records: int
    size_bytes: int
    log_append_time_ms: int  # -1 unless the topic uses LogAppendTime
    duplicate: bool = False  # an idempotent retry: these are the original offsets, nothing new
    # The caller must fsync up to ``last_offset + 1`` before answering (``durable`` asked, or
    # the topic's ``flush.messages`` reached); the committable offset stays below it till then.
    sync_required: bool = False


@dataclass(frozen=True, slots=True)
class ReadResult:
    data: bytes  # whole batches, as stored
    first_offset: int  # base offset of the first batch in ``data`` (may be < requested)
    next_offset: int  # where the next read should start
    high_watermark: int
    log_start_offset: int
    log_end_offset: int


@dataclass(frozen=True, slots=True)
class CommittedReadResult(ReadResult):
    """A ``read_committed`` read: no data at or past ``last_stable_offset``, and the aborted
    transactions overlapping ``data`` (by first offset), whose batches the reader drops
    (:func:`core_log.isolation.committed_batches`)."""

    last_stable_offset: int = 0
    aborted_transactions: tuple[AbortedTxn, ...] = ()


@dataclass(frozen=True, slots=True)
class RetentionResult:
    deleted_segments: int
    deleted_bytes: int
    log_start_offset: int


class PartitionLog:
    def __init__(
        self,
        directory: Path,
        config: LogConfig,
        clock: Clock,
        handles: HandleCache,
        *,
        clean_shutdown: bool = False,
        fresh: bool = False,
    ) -> None:
        """Open (and recover) the log in ``directory``; with ``fresh``, create a new empty log
        there without a single fsync (see :meth:`_start_empty`)."""
        self.directory = directory
        self.config = config
        self.clock = clock
        self._handles = handles
        self._lock = threading.RLock()
        # The high watermark has its own lock, never held across I/O: the event loop moves it
        # after every append, and must not wait for a worker that holds ``_lock`` for an fsync.
        self._hw_lock = threading.Lock()
        self._checkpoint_lock = threading.Lock()  # one writer of log.checkpoint at a time
        self.cleaner_lock = threading.Lock()  # one compaction pass at a time (core_log.cleaner)
        self._segments: list[LogSegment] = []
        self.epochs = LeaderEpochCache(directory / EPOCH_FILE)
        self.producers = ProducerStateManager()
        self._log_start_offset = 0
        self._high_watermark = 0
        self._recovery_point = 0
        self._durable_end = 0  # end of the last append that must be fsynced before it is seen
        # (first offset of the earliest open transaction or None, ((marker offset, first
        # offset), ...) of transactions ended by a marker the high watermark may not have
        # passed): replaced whole under the lock, read without it by last_stable_offset.
        self._txn_view: tuple[int | None, tuple[tuple[int, int], ...]] = (None, ())
        self._closed = False
        self._checkpoint_written: dict[str, int] | None = None  # what the file holds, if known
        self.recovered_bytes_truncated = 0
        if fresh:
            try:
                directory.mkdir()
            except FileExistsError:
                fresh = False  # a leftover directory: open (and recover) what it holds
        else:
            directory.mkdir(parents=True, exist_ok=True)
        if fresh:
            self._start_empty()
        else:
            self._open(clean_shutdown)

    # -- offsets ---------------------------------------------------------------------------------

    @property
    def log_start_offset(self) -> int:
        return self._log_start_offset

    @property
    def log_end_offset(self) -> int:
        return self._segments[-1].next_offset

    @property
    def high_watermark(self) -> int:
        return self._high_watermark

    @property
    def recovery_point(self) -> int:
        return self._recovery_point

    @property
    def unflushed_records(self) -> int:
        return self.log_end_offset - self._recovery_point

    @property
    def size_bytes(self) -> int:
        return sum(s.size for s in self._segments)

    @property
    def segments(self) -> list[LogSegment]:
        with self._lock:
            return list(self._segments)

    @property
    def committable_offset(self) -> int:
        """How far a single broker may move the high watermark: the log end, unless an append
        that must be fsynced first (``durable``, or ``flush.messages`` reached) is not yet
        covered by the recovery point — then the recovery point. Never below the high
        watermark already reached (it does not move backwards).

        Read without the partition lock (the event loop calls it, and a worker may hold the
        lock across an fsync): the log end is read first, then the durable end, which an
        append raises *before* it writes, then the recovery point, which only grows — so a
        batch seen in the log end is never taken for committable before its fsync."""
        leo = self.log_end_offset
        durable_end = self._durable_end
        recovery_point = self._recovery_point
        end = leo if recovery_point >= durable_end else recovery_point
        return max(self._high_watermark, min(end, leo))

    @property
    def last_stable_offset(self) -> int:
        """The LSO: no ``read_committed`` reader sees data at or past it (see the module doc).
        Between the log start and the high watermark. Read without the partition lock."""
        hw = self._high_watermark
        first, completed = self._txn_view
        lso = hw if first is None else min(first, hw)
        for marker_offset, first_offset in completed:
            if marker_offset >= hw and first_offset < lso:
                lso = first_offset
        return min(hw, max(lso, self._log_start_offset))

    def _publish_txn_view(self, ended: tuple[tuple[int, int], ...] = ()) -> None:
        """Recompute the transactions the LSO waits for (under the lock), adding ``ended``."""
        hw = self._high_watermark
        completed = [c for c in self._txn_view[1] if c[0] >= hw]
        completed += ended
        while len(completed) > MAX_UNSTABLE_COMPLETED:
            (m1, f1), (m2, f2) = completed[0], completed[1]
            completed[:2] = [(max(m1, m2), min(f1, f2))]
        self._txn_view = (self.producers.first_ongoing_offset, tuple(completed))

    def set_high_watermark(self, offset: int) -> int:
        """Move the high watermark forward to ``offset`` (clamped to the LEO); return it."""
        with self._hw_lock:
            offset = min(offset, self.log_end_offset)
            if offset > self._high_watermark:
                self._high_watermark = offset
            return self._high_watermark

    # -- append ----------------------------------------------------------------------------------

    def append(
        self,
        data: bytes | memoryview,
        *,
        leader_epoch: int = 0,
        as_follower: bool = False,
        durable: bool = False,
        transactional: bool = False,
    ) -> AppendResult:
        """Append one or more whole batches; return the offsets they got.

        As leader, offsets are assigned from the LEO and batches are stamped with
        ``leader_epoch``; as follower (replication), batches keep the leader's offsets and
        epochs and must start at the LEO. Raises :class:`CorruptRecordError`,
        :class:`InvalidRecordError` or :class:`RecordTooLargeError` before writing anything.
        With ``durable`` (or once ``flush.messages`` is reached) the result says
        ``sync_required`` and :attr:`committable_offset` stays below these batches until a
        flush covers them — decided under the lock, so no concurrent append can expose them.

        ``transactional``: a leader accepts transactional data batches (the broker checked the
        transaction with its coordinator); without it they are refused as before (a follower
        takes whatever the leader stored). Control batches are never accepted from a producer:
        markers go through :meth:`append_marker`.
        """
        view = memoryview(data)
        headers = self._split(view, as_follower, transactional)
        with self._lock:
            return self._append(view, headers, leader_epoch, as_follower, durable)

    def try_append(
        self,
        data: bytes | memoryview,
        *,
        leader_epoch: int = 0,
        as_follower: bool = False,
        durable: bool = False,
        transactional: bool = False,
    ) -> AppendResult | None:
        """:meth:`append`, but only if it can run without waiting or blocking: None (nothing
        done) when another thread holds the lock (it may be fsyncing), or when the append would
        roll a segment (producer snapshot + fsync), store a new leader epoch (fsync) or convert
        batches (the topic's compression or LogAppendTime). The event loop calls this."""
        view = memoryview(data)
        headers = self._split(view, as_follower, transactional)
        return self._try(view, headers, leader_epoch, as_follower, durable)

    def split(self, data: bytes | memoryview) -> tuple[memoryview, list[BatchHeader]]:
        """A producer's batches checked as :meth:`try_append` checks them, for a caller that
        appends several requests' batches together (:meth:`try_append_split`): each request
        gets its own error before any is written."""
        view = memoryview(data)
        return view, self._split(view, False)

    def gatherable(self, headers: list[BatchHeader]) -> bool:
        """Whether these checked batches can be appended together with other requests'
        (:meth:`try_append_split`) with no error of their own left to find: no producer id
        (a duplicate answers for its whole request), stored as sent (no conversion), each
        within ``max.message.bytes``."""
        if self.config.log_append_time or self._target_compression() is not None:
            return False
        limit = self.config.max_message_bytes
        if len(headers) == 1:  # one batch (most requests): two fields, not two passes
            h = headers[0]
            return h.producer_id < 0 and h.batch_length + LOG_OVERHEAD <= limit
        return not any_producer_id(headers) and largest_batch(headers) <= limit

    def try_append_split(
        self, view: memoryview, headers: list[BatchHeader], *, leader_epoch: int, durable: bool
    ) -> AppendResult | None:
        """:meth:`try_append` of batches :meth:`split` has checked, as leader; None when it
        cannot run without waiting."""
        return self._try(view, headers, leader_epoch, False, durable)

    def _try(
        self,
        view: memoryview,
        headers: list[BatchHeader],
        leader_epoch: int,
        as_follower: bool,
        durable: bool,
        marker: ControlMarker | None = None,
    ) -> AppendResult | None:
        if not self._lock.acquire(blocking=False):
            return None
        try:
            self._check_open()
            if self._append_would_block(headers, len(view), leader_epoch, as_follower):
                return None
            return self._append(view, headers, leader_epoch, as_follower, durable, marker)
        finally:
            self._lock.release()

    def append_marker(
        self,
        producer_id: int,
        producer_epoch: int,
        commit: bool,
        coordinator_epoch: int,
        *,
        leader_epoch: int = 0,
        durable: bool = False,
    ) -> AppendResult:
        """Append a COMMIT (``commit``) or ABORT marker for the producer's transaction, as
        leader (followers replicate it with :meth:`append`). It ends the producer's open
        transaction here, if any (a marker for a producer with none is appended and ends
        nothing, as in Kafka); an ABORT is indexed. Raises
        :class:`~core_log.producer_state.InvalidProducerEpochError` for an epoch older than the
        producer's, :class:`~core_log.producer_state.TransactionCoordinatorFencedError` for an
        older coordinator epoch, :class:`InvalidRecordError` for fields out of range."""
        view, headers, marker = self._marker_batch(
            producer_id, producer_epoch, commit, coordinator_epoch
        )
        with self._lock:
            return self._append(view, headers, leader_epoch, False, durable, marker)

    def try_append_marker(
        self,
        producer_id: int,
        producer_epoch: int,
        commit: bool,
        coordinator_epoch: int,
        *,
        leader_epoch: int = 0,
        durable: bool = False,
    ) -> AppendResult | None:
        """:meth:`append_marker` if it can run without waiting (see :meth:`try_append`)."""
        view, headers, marker = self._marker_batch(
            producer_id, producer_epoch, commit, coordinator_epoch
        )
        return self._try(view, headers, leader_epoch, False, durable, marker)

    def _marker_batch(
        self, producer_id: int, producer_epoch: int, commit: bool, coordinator_epoch: int
    ) -> tuple[memoryview, list[BatchHeader], ControlMarker]:
        data = build_control_batch(
            producer_id, producer_epoch, commit, coordinator_epoch, self.clock.now_ms()
        )
        marker = parse_control_batch(data)
        assert marker is not None
        return memoryview(data), [parse_header(data)], marker

    def _split(
        self, view: memoryview, as_follower: bool, transactional: bool = False
    ) -> list[BatchHeader]:
        headers = split_batches(
            view,
            strict=not as_follower,
            max_decompressed_bytes=self.config.max_decompressed_bytes,
            allow_transactional=transactional,
        )
        if not headers:
            raise InvalidRecordError("no record batch in the request")
        return headers

    def _append_would_block(
        self, headers: list[BatchHeader], size: int, leader_epoch: int, as_follower: bool
    ) -> bool:
        if self.config.log_append_time or self._target_compression() is not None:
            return True
        active = self._segments[-1]
        if self._segment_expired(active):
            return True
        span = offsets_spanned(headers)
        last = headers[-1].last_offset if as_follower else self.log_end_offset + span - 1
        if not active.can_hold(last, size, self.config.segment_bytes):
            return True
        if len(headers) > 1 and active.index_room() < len(headers):
            return True  # one index entry per batch at most: a later batch could roll
        epochs = {h.partition_leader_epoch for h in headers} if as_follower else {leader_epoch}
        return max(epochs) > self.epochs.latest_epoch

    def _append(
        self,
        view: memoryview,
        headers: list[BatchHeader],
        leader_epoch: int,
        as_follower: bool,
        durable: bool,
        marker: ControlMarker | None = None,
    ) -> AppendResult:
        self._check_open()
        if as_follower:
            self._check_follower_offsets(headers)
        elif marker is not None:
            self.producers.check_marker(marker)
        elif (duplicate := self._check_producer(headers, len(view))) is not None:
            # A durable retry of a batch not yet fsynced waits for the fsync too.
            unsynced = duplicate.last_offset >= self._recovery_point
            return dataclasses.replace(duplicate, sync_required=durable and unsynced)
        now = self.clock.now_ms()
        append_time = now if self.config.log_append_time and not as_follower else -1
        batches = self._prepared(view, headers, append_time, as_follower)
        start = offset = self.log_end_offset
        first = headers[0].base_offset if as_follower else offset
        end = headers[-1].next_offset if as_follower else start + offsets_spanned(headers)
        sync_required = durable or end - self._recovery_point >= self.config.flush_messages
        if sync_required:
            # Before the write: whoever sees any of these batches in the log end also sees
            # that they wait for an fsync (committable_offset reads without the lock).
            self._durable_end = max(self._durable_end, end)
        try:
            offset = self._write_batches(batches, offset, leader_epoch, as_follower, now)
        except StorageFullError:
            # The failed batch was cut off; earlier batches of the request go too, so the
            # request changes nothing (an undo that fails raises: the directory is lost).
            if self.log_end_offset > start:
                self.truncate_to(start)
            self._durable_end = min(self._durable_end, self.log_end_offset)
            raise
        return AppendResult(
            base_offset=first,
            last_offset=offset - 1,
            batches=len(headers),
            records=records_in(headers),
            size_bytes=len(view),
            log_append_time_ms=append_time,
            sync_required=sync_required,
        )

    def _write_batches(
        self,
        batches: list[tuple[memoryview, BatchHeader]],
        offset: int,
        leader_epoch: int,
        as_follower: bool,
        now: int,
    ) -> int:
        """Write prepared batches from ``offset`` on; return the offset after the last.

        A leader's batches that all fit the active segment go out in one write (several
        requests appended together: :meth:`core_log.manager.Partition.append`)."""
        if not as_follower and len(batches) > 1:
            written = self._write_together(batches, offset, leader_epoch, now)
            if written is not None:
                return written
        for raw, h in batches:
            if as_follower:
                prefix = bytes(raw[:PREFIX_BYTES])
                epoch = h.partition_leader_epoch
            else:
                prefix = PREFIX.pack(offset, h.batch_length, leader_epoch)
                epoch = leader_epoch
                h = h.at(offset, leader_epoch)
            segment = self._segment_for(h)
            if segment.is_empty:
                segment.rolling_base_ms = now
            segment.append(prefix, raw[PREFIX_BYTES:], h)
            if self.epochs.assign(epoch, h.base_offset):
                self.epochs.store()
            if h.producer_id >= 0:
                if h.is_control:
                    self._apply_marker(segment, parse_control_batch(raw), h, now)
                else:
                    self.producers.update(h, h.base_offset, now)
                    if h.is_transactional or self._txn_view[0] is not None:
                        self._publish_txn_view()
            offset = h.next_offset
        return offset

    def _write_together(
        self,
        batches: list[tuple[memoryview, BatchHeader]],
        offset: int,
        leader_epoch: int,
        now: int,
    ) -> int | None:
        """Producer batches without a producer id, written to the active segment in one
        call; None (nothing written) when they would not all fit it or need more."""
        headers = [h for _, h in batches]
        if any_producer_id(headers):
            return None
        span = offsets_spanned(headers)
        size = bytes_taken(headers)
        active = self._segments[-1]
        if (
            self._segment_expired(active)
            or not active.can_hold(offset + span - 1, size, self.config.segment_bytes)
            or active.size + size > self.config.segment_bytes  # even into an empty one
            or active.index_room() < len(batches)
        ):
            return None
        if active.is_empty:
            active.rolling_base_ms = now
        placed: list[tuple[bytes, memoryview, BatchHeader]] = []
        for raw, h in batches:
            placed.append(
                (
                    PREFIX.pack(offset, h.batch_length, leader_epoch),
                    raw[PREFIX_BYTES:],
                    h.at(offset, leader_epoch),
                )
            )
            offset += h.last_offset_delta + 1
        active.append_many(placed)
        if self.epochs.assign(leader_epoch, placed[0][2].base_offset):
            self.epochs.store()
        return offset

    def _apply_marker(
        self, segment: LogSegment, marker: ControlMarker | None, h: BatchHeader, now: int
    ) -> None:
        """The marker stored as ``h`` in ``segment`` ends its producer's transaction."""
        if marker is None:  # a control batch that is no transaction marker: nothing to do
            return
        marker = dataclasses.replace(marker, offset=h.base_offset)
        completed = self.producers.update_marker(marker, now)
        if completed is None:
            return
        if completed.aborted:
            self._index_abort(segment, completed)
        self._publish_txn_view(((completed.last_offset, completed.first_offset),))

    def _index_abort(self, segment: LogSegment, completed: CompletedTxn) -> None:
        """The aborted-index entry of ``completed``; its LSO field is the LSO once the
        marker is stable (the earliest other open transaction, else after the marker)."""
        first_open = self.producers.first_ongoing_offset
        lso = completed.last_offset + 1 if first_open is None else first_open
        segment.txn_index.append(
            AbortedTxn(completed.producer_id, completed.first_offset, completed.last_offset, lso)
        )

    def _prepared(
        self,
        view: memoryview,
        headers: list[BatchHeader],
        append_time: int,
        as_follower: bool,
    ) -> list[tuple[memoryview, BatchHeader]]:
        """Each batch as it will be stored (recompressed/restamped when the topic says so),
        checked against ``max.message.bytes`` — all before the first byte is written."""
        target = None if as_follower else self._target_compression()
        limit = self.config.max_message_bytes
        out: list[tuple[memoryview, BatchHeader]] = []
        position = 0
        for h in headers:
            size = h.batch_length + LOG_OVERHEAD  # h.size_bytes, without a property call
            raw = view[position : position + size]
            position += size
            if (
                append_time >= 0 or (target is not None and target != h.compression)
            ) and not h.is_control:  # a marker is stored as built: uncompressed, stamped now
                converted = recompress(raw, target) if target is not None else bytes(raw)
                if append_time >= 0:
                    converted = restamp(converted, append_time)
                raw = memoryview(converted)
                h = parse_header(raw)
                size = h.size_bytes
            if size > limit:
                raise RecordTooLargeError(
                    f"batch of {size} bytes exceeds max.message.bytes {limit}",
                    max_message_bytes=limit,
                )
            out.append((raw, h))
        return out

    def _check_producer(self, headers: list[BatchHeader], size: int) -> AppendResult | None:
        """Idempotence (Kafka semantics): a retry of one of the producer's last 5 batches
        answers with the original offsets and appends nothing; a sequence gap or a fenced epoch
        raises. An idempotent batch must be alone in its request, as a Kafka producer sends it.
        """
        if not any_producer_id(headers):
            return None
        if len(headers) > 1:
            raise InvalidRecordError("an idempotent batch must be the only batch of its request")
        h = headers[0]
        dup = self.producers.check(h)
        if dup is None:
            return None
        return AppendResult(
            dup.first_offset, dup.last_offset, 1, h.record_count, size, -1, duplicate=True
        )

    def _target_compression(self) -> Compression | None:
        kind = self.config.compression_type
        if kind == "producer":
            return None
        if kind == "uncompressed":
            return Compression.NONE
        return Compression.from_name(kind)

    def _check_follower_offsets(self, headers: list[BatchHeader]) -> None:
        expected = self.log_end_offset
        for h in headers:
            if h.base_offset < expected:
                raise InvalidRecordError(
                    f"replicated batch at offset {h.base_offset} is below the log end {expected}"
                )
            expected = h.next_offset

    def _segment_for(self, h: BatchHeader) -> LogSegment:
        active = self._segments[-1]
        expired = self._segment_expired(active)
        if expired or not active.can_hold(h.last_offset, h.size_bytes, self.config.segment_bytes):
            active = self._roll(h.base_offset)
        return active

    def _segment_expired(self, segment: LogSegment) -> bool:
        """``segment.ms`` counts from the broker's time of the segment's first append — not
        from record timestamps, which producers choose (an old timestamp would roll a segment
        on every append) — and, after a restart, from the first batch's timestamp (one roll at
        most). A segment that sat empty is not old."""
        if segment.is_empty:
            return False
        return self.clock.now_ms() - segment.rolling_base_ms >= self.config.segment_ms

    def _roll(self, base_offset: int) -> LogSegment:
        """Close the active segment for appends and start a new one at ``base_offset``."""
        old = self._segments[-1]
        if old.is_empty:
            # Nothing to keep: replace the empty segment (its name must match its first offset).
            self._segments.pop()
            old.delete()
        else:
            old.on_roll()
        segment = self._new_segment(base_offset)
        segment.create()
        segment.pin(True)
        self._segments.append(segment)
        if len(self.producers):
            try:
                self.producers.snapshot(self.directory, base_offset)  # recovery replays from here
            except OSError as e:
                if e.errno not in DISK_FULL_ERRNOS:
                    raise
                # The roll stands (an empty segment); recovery replays from an older snapshot.
                raise StorageFullError(
                    f"{self.directory.name}: disk full ({e.strerror}); nothing was appended"
                ) from e
        return segment

    def _new_segment(self, base_offset: int, suffix: str = "") -> LogSegment:
        c = self.config
        return LogSegment(
            self.directory,
            base_offset,
            self._handles,
            index_interval_bytes=c.index_interval_bytes,
            index_max_entries=max(1, c.segment_index_bytes // 8),
            suffix=suffix,
        )

    def new_cleaned_segment(self, base_offset: int) -> LogSegment:
        """A segment under the cleaner's temporary names (``{base}.log.cleaned`` ...)."""
        segment = self._new_segment(base_offset, CLEANED_SUFFIX)
        segment.create()
        return segment

    def roll_if_expired(self) -> bool:
        """Roll the active segment when ``segment.ms`` has passed (called by a timer)."""
        with self._lock:
            active = self._segments[-1]
            if not self._segment_expired(active):
                return False
            self._roll(active.next_offset)
            return True

    # -- read ------------------------------------------------------------------------------------

    def read(
        self,
        offset: int,
        max_bytes: int,
        *,
        max_offset: int | None = None,
        max_records: int | None = None,
    ) -> ReadResult:
        """Whole batches from the one holding ``offset``, at most ``max_bytes`` (but at least one
        batch), never at or past ``max_offset`` (default: the high watermark), and with
        ``max_records`` none after the batch holding offset ``offset + max_records - 1`` (a
        reader that wants that many records reads no batch it would not use).

        Reading at the bound returns no data; outside ``[log_start, LEO]`` raises
        :class:`OffsetOutOfRangeError` with the valid range.
        """
        with self._lock:
            return self._read(offset, max_bytes, max_offset, max_records)

    def try_read(
        self,
        offset: int,
        max_bytes: int,
        *,
        max_offset: int | None = None,
        max_records: int | None = None,
    ) -> ReadResult | None:
        """:meth:`read`, or None at once when another thread holds the lock (it may be
        fsyncing or swapping compacted segments in). The event loop calls this."""
        if not self._lock.acquire(blocking=False):
            return None
        try:
            return self._read(offset, max_bytes, max_offset, max_records)
        finally:
            self._lock.release()

    def read_committed(
        self,
        offset: int,
        max_bytes: int,
        *,
        max_offset: int | None = None,
        max_records: int | None = None,
    ) -> CommittedReadResult:
        """:meth:`read` at ``isolation=read_committed``: never at or past the last stable offset
        (nor ``max_offset``), with the aborted transactions overlapping the data returned. The
        data still holds every batch (markers, aborted batches): the reader filters them with
        :func:`core_log.isolation.committed_batches`, as a Kafka consumer does."""
        with self._lock:
            return self._read_committed(offset, max_bytes, max_offset, max_records)

    def try_read_committed(
        self,
        offset: int,
        max_bytes: int,
        *,
        max_offset: int | None = None,
        max_records: int | None = None,
    ) -> CommittedReadResult | None:
        """:meth:`read_committed`, or None at once when another thread holds the lock."""
        if not self._lock.acquire(blocking=False):
            return None
        try:
            return self._read_committed(offset, max_bytes, max_offset, max_records)
        finally:
            self._lock.release()

    def _read_committed(
        self, offset: int, max_bytes: int, max_offset: int | None, max_records: int | None
    ) -> CommittedReadResult:
        lso = self.last_stable_offset
        upper = lso if max_offset is None else min(max_offset, lso)
        r = self._read(offset, max_bytes, upper, max_records)
        aborted: tuple[AbortedTxn, ...] = ()
        if r.data:
            aborted = tuple(self.aborted_transactions(r.first_offset, r.next_offset))
        return CommittedReadResult(
            r.data,
            r.first_offset,
            r.next_offset,
            r.high_watermark,
            r.log_start_offset,
            r.log_end_offset,
            lso,
            aborted,
        )

    def aborted_transactions(self, start: int, upper: int) -> list[AbortedTxn]:
        """The aborted transactions whose offsets overlap ``[start, upper)``, by first offset
        (Kafka's collectAbortedTransactions: the indexes of the segment holding ``start`` and
        the later ones, until an entry proves no later one can overlap)."""
        with self._lock:
            i = self._segment_index(start)
            return collect_aborted((s.txn_index for s in self._segments[i:]), start, upper)

    def _read(
        self, offset: int, max_bytes: int, max_offset: int | None, max_records: int | None = None
    ) -> ReadResult:
        max_bytes = max(1, min(max_bytes, MAX_FETCH_BYTES))
        self._check_open()
        lso, hw, leo = self._log_start_offset, self._high_watermark, self.log_end_offset
        upper = hw if max_offset is None else min(max_offset, leo)
        if offset < lso or offset > leo:
            raise OffsetOutOfRangeError(offset, lso, leo)
        # The last offset a reader of max_records uses, unless the upper bound cuts first.
        last = None
        if max_records is not None and offset + max_records < upper:
            last = offset + max_records - 1
        i = self._segment_index(offset)
        while offset < upper and i < len(self._segments):
            segment = self._segments[i]
            end_position = segment.size
            if upper < segment.next_offset:
                found = segment.find_batch(upper)
                end_position = found[0] if found is not None else segment.size
            s = segment.slice(offset, max_bytes, end_position, last)
            if s is not None:
                data = segment.read_bytes(s.position, s.size)
                return ReadResult(data, s.first_offset, s.next_offset, hw, lso, leo)
            if upper < segment.next_offset:
                break
            i += 1
        return ReadResult(b"", offset, offset, hw, lso, leo)

    def _segment_index(self, offset: int) -> int:
        """Index of the last segment whose base offset is <= ``offset`` (0 if none)."""
        lo, hi = 0, len(self._segments)
        while lo < hi:
            mid = (lo + hi) // 2
            if self._segments[mid].base_offset <= offset:
                lo = mid + 1
            else:
                hi = mid
        return max(0, lo - 1)

    def offset_for_timestamp(self, timestamp: int) -> int | None:
        """The first offset whose record timestamp is >= ``timestamp``; None if none is."""
        with self._lock:
            self._check_open()
            for segment in self._segments:
                if segment.max_timestamp < timestamp:
                    continue
                if segment.next_offset <= self._log_start_offset:
                    continue
                found = segment.offset_for_timestamp(timestamp, self._log_start_offset)
                if found is not None:
                    return found
            return None

    # -- durability ------------------------------------------------------------------------------

    def flush(self) -> int:
        """fsync everything appended so far; return the new recovery point.

        The lock is held only to pick the segments and the target offset, not during fsync.
        """
        with self._lock:
            self._check_open()
            target = self.log_end_offset
            if target <= self._recovery_point:
                return self._recovery_point
            dirty = [s for s in self._segments if s.next_offset > self._recovery_point]
        try:
            for segment in dirty:
                segment.fsync()
        except OSError as e:
            raise KafkaStorageError(f"fsync of {self.directory} failed: {e}") from e
        with self._lock:
            self._recovery_point = min(max(self._recovery_point, target), self.log_end_offset)
            return self._recovery_point

    def _checkpoint_state(self) -> dict[str, int]:
        return {
            "high_watermark": self._high_watermark,
            "log_start_offset": self._log_start_offset,
            "recovery_point": self._recovery_point,
        }

    def write_checkpoint(self) -> None:
        with self._lock:
            state = self._checkpoint_state()
        with self._checkpoint_lock:  # retention, the janitor and the cleaner may all write it
            write_json(self.directory / CHECKPOINT_FILE, state)
            self._checkpoint_written = state

    # -- replication support ---------------------------------------------------------------------

    @property
    def latest_epoch(self) -> int:
        """The leader epoch of the last batch (or of the last leadership begun here)."""
        return self.epochs.latest_epoch

    def assign_leader_epoch(self, epoch: int) -> None:
        """Record that ``epoch`` begins at the log end: a new leader does this before its first
        append, so a follower's diverging-epoch check sees the epoch even while it is empty."""
        with self._lock:
            self._check_open()
            if self.epochs.assign(epoch, self.log_end_offset):
                self.epochs.store()

    def end_offset_for_epoch(self, epoch: int) -> tuple[int, int]:
        with self._lock:
            return self.epochs.end_offset_for_epoch(epoch, self.log_end_offset)

    def truncate_to(self, offset: int) -> int:
        """Remove every batch whose last offset is >= ``offset``; return the new LEO.

        Used by followers to cut a divergent suffix. Whole batches only, as Kafka does. Epoch
        entries starting at or past the new LEO go too, even when no batch does.
        """
        with self._lock:
            self._check_open()
            if offset >= self.log_end_offset:
                # Nothing to cut, but an epoch this broker began as leader without appending
                # anything ends here: it goes (as in Kafka), or the follower's next fetch would
                # name it as its last epoch again and diverge forever at the same offset.
                if self.epochs.truncate_from_end(self.log_end_offset):
                    self.epochs.store()
                return self.log_end_offset
            offset = max(offset, self._log_start_offset)
            while len(self._segments) > 1 and self._segments[-1].base_offset >= offset:
                self._segments.pop().delete()
            active = self._segments[-1]
            active.truncate_to(offset)
            active.pin(True)
            leo = self.log_end_offset
            if self.epochs.truncate_from_end(leo):
                self.epochs.store()
            # Whole batches go: when the log start was inside the cut batch, the log is now
            # empty at its end (everything below it was already below the log start).
            self._log_start_offset = min(self._log_start_offset, leo)
            with self._hw_lock:
                self._high_watermark = min(self._high_watermark, leo)
            self._reload_producers()
            self._recovery_point = min(self._recovery_point, leo)
            self._durable_end = min(self._durable_end, leo)
            return leo

    def truncate_fully_and_start_at(self, offset: int) -> None:
        """Delete every segment and restart the log empty at ``offset`` (follower catch-up)."""
        with self._lock:
            self._check_open()
            for segment in self._segments:
                segment.delete()
            self._segments = [self._new_segment(offset)]
            self._segments[0].create()
            self._segments[0].pin(True)
            with self._hw_lock:
                self._log_start_offset = self._high_watermark = self._recovery_point = offset
            self._durable_end = offset
            self.epochs.clear()
            self.epochs.store()
            self.write_checkpoint()
            self._reload_producers()

    # -- retention -------------------------------------------------------------------------------

    def apply_retention(self) -> RetentionResult:
        """Delete whole old segments by ``retention.ms``/``retention.bytes``, oldest first.

        Never deletes data at or above the high watermark; at most
        ``MAX_SEGMENTS_DELETED_PER_PASS`` segments per call.
        """
        with self._lock:
            self._check_open()
            c = self.config
            if not c.delete:
                return RetentionResult(0, 0, self._log_start_offset)
            now = self.clock.now_ms()
            if self._all_expired(now) and self._segments[-1].next_offset <= self._high_watermark:
                self._roll(self._segments[-1].next_offset)  # so the last data can go too
            excess = self.size_bytes - c.retention_bytes if c.retention_bytes >= 0 else 0
            doomed: list[LogSegment] = []
            for segment in self._segments[:-1]:
                if len(doomed) >= MAX_SEGMENTS_DELETED_PER_PASS:
                    break
                if segment.next_offset > self._high_watermark:
                    break
                by_time = c.retention_ms >= 0 and self._expired(segment, now)
                by_size = excess - segment.size >= 0 and c.retention_bytes >= 0
                if not (by_time or by_size):
                    break
                excess -= segment.size
                doomed.append(segment)
            if not doomed:
                return RetentionResult(0, 0, self._log_start_offset)
            del self._segments[: len(doomed)]
            freed = sum(s.size for s in doomed)
            self._advance_log_start(self._segments[0].base_offset, checkpoint=False)
            log_start = self._log_start_offset
        # The files go outside the lock (up to 64 unlinks and a checkpoint fsync): appends and
        # reads continue meanwhile. Nothing reaches these segments any more.
        self.write_checkpoint()
        for segment in doomed:
            segment.delete()
        return RetentionResult(len(doomed), freed, log_start)

    def _expired(self, segment: LogSegment, now: int) -> bool:
        return not segment.is_empty and now - segment.max_timestamp > self.config.retention_ms

    def _all_expired(self, now: int) -> bool:
        c = self.config
        return c.retention_ms >= 0 and all(self._expired(s, now) for s in self._segments)

    def increment_log_start_offset(self, offset: int) -> None:
        """Move the log start offset forward (deleting records below it); bounded by the HW."""
        with self._lock:
            if offset > self._high_watermark:
                raise OffsetOutOfRangeError(offset, self._log_start_offset, self._high_watermark)
            self._advance_log_start(offset)
            while len(self._segments) > 1 and self._segments[1].base_offset <= offset:
                self._segments.pop(0).delete()

    def _advance_log_start(self, offset: int, *, checkpoint: bool = True) -> None:
        if offset > self._log_start_offset:
            self._log_start_offset = offset
            self.producers.truncate_from_start(offset)
            self._publish_txn_view()
            if self.epochs.truncate_from_start(offset):
                self.epochs.store()
            if checkpoint:
                self.write_checkpoint()

    # -- compaction ------------------------------------------------------------------------------

    def clean(
        self,
        now: int | None = None,
        *,
        max_keys: int = DEFAULT_MAX_KEYS,
        throttle_bytes_per_s: float | None = None,
    ) -> CleanResult | None:
        """One compaction pass (:func:`core_log.cleaner.clean_log`); None unless compacted."""
        return clean_log(self, now, max_keys=max_keys, throttle_bytes_per_s=throttle_bytes_per_s)

    def swap_cleaned(
        self,
        replaced: list[tuple[LogSegment, int, bool]],
        hook: Callable[[str], None] | None = None,
    ) -> bool:
        """Swap the cleaner's output in, atomically and under the lock.

        ``replaced`` holds, per cleaned segment, (old segment, its size when it was read,
        whether the cleaned copy holds data). The cleaned copies are fully written and fsynced
        under ``{base}.*.cleaned`` (an empty ``{base}.log.cleaned`` alone means "no record
        survived: remove the segment"). Returns False and removes the cleaned files when the
        log changed meanwhile (retention, truncation, close), so the pass is dropped.

        Steps (each a crash point handled by :func:`complete_swaps` at open): rename every
        ``.cleaned`` file to ``.swap`` — the last of these renames commits the pass —, fsync the
        directory, rename every ``.swap`` over the old file (or delete the old segment),
        fsync the directory, load the new segments.
        """
        names = [
            p
            for old, _, _ in replaced
            for p in _segment_files(self.directory, old.base_offset, CLEANED_SUFFIX)
        ]
        with self._lock:
            current = {id(s) for s in self._segments[:-1]}
            if self._closed or any(
                id(old) not in current or old.size != size for old, size, _ in replaced
            ):
                for p in names:
                    p.unlink(missing_ok=True)
                return False
            try:
                for old, _, _ in replaced:
                    old.close()  # pending index entries go to the old files, not the new
                for p in names:
                    os.replace(p, p.with_name(p.name[: -len(CLEANED_SUFFIX)] + SWAP_SUFFIX))
                fsync_dir(self.directory)
                if hook is not None:
                    hook("swap")
                complete_swaps(self.directory, hook)
                fresh: dict[int, LogSegment | None] = {}
                for old, _, has_data in replaced:
                    segment = None
                    if has_data:
                        segment = self._new_segment(old.base_offset)
                        segment.load()
                    fresh[id(old)] = segment
            except OSError as e:
                raise KafkaStorageError(f"compaction swap in {self.directory} failed: {e}") from e
            segments: list[LogSegment] = []
            for s in self._segments:
                if id(s) not in fresh:
                    segments.append(s)
                    continue
                new = fresh[id(s)]
                if new is not None:
                    segments.append(new)
            self._segments = segments
            if any(s.txn_index_stale for s in self._segments):
                self._reload_producers()  # a swapped-in segment's aborted index is rebuilt
            return True

    # -- open, recover, close --------------------------------------------------------------------

    def _open(self, clean_shutdown: bool) -> None:
        for stray in self.directory.glob("*.tmp"):
            stray.unlink()
        complete_swaps(self.directory)
        bases = sorted(int(p.stem) for p in self.directory.glob("*.log") if p.stem.isdigit())
        for suffix in (".index", ".timeindex", TXN_INDEX_SUFFIX):  # without a log file
            for p in self.directory.glob("*" + suffix):
                if not p.stem.isdigit() or int(p.stem) not in bases:
                    p.unlink()
        checkpoint = read_json(self.directory / CHECKPOINT_FILE)
        state = checkpoint if isinstance(checkpoint, dict) else {}
        recovery_point = int(state.get("recovery_point", 0))
        self.epochs.load()
        self._segments = [self._new_segment(b) for b in bases]
        if not self._segments:
            # Never written: nothing to load or recover. Opening 10,000 such partitions at
            # start took ~7 ms each to rebuild and rewrite the indexes of empty segments.
            start = int(state.get("log_start_offset", 0))
            self._segments = [self._new_segment(start)]
            self._segments[0].create()
            self._recovery_point = start
        elif clean_shutdown:
            for segment in self._segments:
                segment.load()
            self._recovery_point = min(recovery_point, self.log_end_offset)
        else:
            self._recover(recovery_point)
        self._segments[-1].pin(True)
        leo = self.log_end_offset
        self._log_start_offset = max(
            int(state.get("log_start_offset", 0)), self._segments[0].base_offset
        )
        self._log_start_offset = min(self._log_start_offset, leo)
        self._high_watermark = max(
            min(int(state.get("high_watermark", 0)), leo), self._log_start_offset
        )
        if self.epochs.truncate_from_end(leo) | self.epochs.truncate_from_start(
            self._log_start_offset
        ):
            self.epochs.store()
        self._reload_producers()
        # What the checkpoint file holds (no file reads as all zeros): close() rewrites it
        # only if it changed, which saved two fsyncs per idle partition (a minute for 10,000).
        keys = ("high_watermark", "log_start_offset", "recovery_point")
        if checkpoint is None or all(isinstance(state.get(k), int) for k in keys):
            self._checkpoint_written = {k: int(state.get(k, 0)) for k in keys}

    def _start_empty(self) -> None:
        """A new log in a new directory: one empty segment at offset 0 whose file is created
        by its first use, no checkpoint, nothing fsynced.

        Nothing needs to be durable: a log with no checkpoint reads as all offsets 0, and a
        directory lost in a crash is made again at start (the broker recreates the logs of every
        partition its metadata knows). Creating a topic of 10,000 partitions therefore costs a
        mkdir per partition instead of five fsyncs and three files (27 s), and an idle partition
        holds no file descriptor.
        """
        segment = self._new_segment(0)
        segment.pin(True)
        self._segments = [segment]
        self._checkpoint_written = self._checkpoint_state()  # no file reads as all zeros

    def _reload_producers(self) -> None:
        """Producer state = the newest snapshot at or below the LEO + a replay of the batch
        headers after it (headers only: no record is decoded but the markers').

        The snapshot is also at or below the high watermark and the first segment whose
        aborted-transaction index must be rebuilt (emptied by recovery, or corrupt), so that
        the replay sees every marker those need: the transactions ended by a marker at or past
        the high watermark (the LSO waits for them) and the aborts of those segments."""
        leo = self.log_end_offset
        stale = [s.base_offset for s in self._segments if s.txn_index_stale]
        hw = self._high_watermark
        start = self.producers.recover(
            self.directory,
            self._log_start_offset,
            leo,
            replay_from_max=min([hw, leo, *stale]),
        )
        now = self.clock.now_ms()
        ended: list[tuple[int, int]] = []
        for segment in self._segments:
            if segment.next_offset <= start:
                continue
            for position, h in segment.batch_positions(start):
                if h.producer_id < 0 or h.base_offset < start:
                    continue
                if not h.is_control:
                    self.producers.update(h, h.base_offset, now)
                    continue
                raw = segment.read_bytes(position, h.size_bytes)
                marker = parse_control_batch(raw)
                if marker is None:
                    continue
                completed = self.producers.update_marker(marker, now)
                if completed is None:
                    continue
                if completed.aborted and segment.txn_index_stale:
                    self._index_abort(segment, completed)
                if completed.last_offset >= hw:
                    ended.append((completed.last_offset, completed.first_offset))
        for segment in self._segments:
            if segment.txn_index_stale:
                # Rebuilt below the recovery point: to disk now, no later flush covers it.
                segment.txn_index.rewrite(fsync=True)
                segment.txn_index_stale = False
        self._txn_view = (None, ())
        self._publish_txn_view(tuple(ended))

    def expire_producers(self, producer_id_expiration_ms: int) -> list[int]:
        """Forget producers idle for longer than the window (Kafka: producer.id.expiration.ms)."""
        with self._lock:
            return self.producers.expire(self.clock.now_ms(), producer_id_expiration_ms)

    def _recover(self, recovery_point: int) -> None:
        """Load segments below the recovery point; re-validate the rest (Kafka's LogLoader)."""
        first_dirty = self._segment_index(recovery_point)
        for segment in self._segments[:first_dirty]:
            segment.load()
        start = self._segments[first_dirty].base_offset
        self.epochs.truncate_from_end(start)

        def on_batch(h: BatchHeader) -> None:
            self.epochs.assign(h.partition_leader_epoch, h.base_offset)

        def drop_later(i: int) -> None:
            """Delete the segments after ``i``, last first: a crash part way leaves a log that
            still ends at the damage, never one with a hole before intact later segments."""
            for later in reversed(self._segments[i + 1 :]):
                self.recovered_bytes_truncated += os.path.getsize(later.log_path)
                later.delete()
            del self._segments[i + 1 :]

        for i in range(first_dirty, len(self._segments)):
            segment = self._segments[i]
            truncated = segment.recover(on_batch, before_truncate=functools.partial(drop_later, i))
            if truncated or (segment.is_empty and i < len(self._segments) - 1):
                self.recovered_bytes_truncated += truncated
                drop_later(i)
                break
        if self._segments[-1].is_empty and len(self._segments) > 1:
            self._segments.pop().delete()
        for segment in self._segments[first_dirty:]:
            segment.fsync()
        self._recovery_point = self.log_end_offset
        self.epochs.store()

    def update_config(self, config: LogConfig) -> None:
        with self._lock:
            self.config = config

    @property
    def closed(self) -> bool:
        return self._closed

    def abandon(self) -> None:
        """Close every file without flushing or writing anything: the log directory failed,
        so nothing more may reach it, and the next start recovers from the last checkpoint."""
        with self._lock:
            for segment in self._segments:
                segment.abandon()
            self._closed = True

    def close(self) -> None:
        """Flush and close: after this the log may be reopened with ``clean_shutdown=True``."""
        with self._lock:
            if self._closed:
                return
        self.flush()
        with self._lock:
            if self._checkpoint_state() != self._checkpoint_written:
                self.write_checkpoint()
            if len(self.producers):
                self.producers.snapshot(self.directory, self.log_end_offset)
            for segment in self._segments:
                segment.close()
            self._closed = True

    def delete(self) -> None:
        """Remove every file of this log."""
        with self._lock:
            for segment in self._segments:
                segment.delete()
            self._segments = []
            self._closed = True
            for p in self.directory.iterdir():
                p.unlink()
            self.directory.rmdir()

    def _check_open(self) -> None:
        if self._closed:
            raise KafkaStorageError(f"log {self.directory.name} is closed")
