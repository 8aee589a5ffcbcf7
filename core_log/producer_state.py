"""Idempotent-producer state of one partition: who wrote which sequence numbers where.

Theory of operation (Kafka's ``ProducerStateManager``, KIP-98 / KIP-360 semantics)
-------------------------------------------------------------------------------------
A producer with ``producer_id >= 0`` numbers its batches per partition: ``base_sequence`` ..
``last_sequence`` (int32, wrapping from 2**31-1 to 0), under an ``epoch`` the coordinator bumps
to fence zombies. Per producer id we keep its epoch, the metadata of its last
:data:`BATCHES_RETAINED` (5) batches — Kafka's ``max.in.flight.requests.per.connection`` limit
for idempotence, so any retry a well-behaved producer can send is among them — and the time of
its last append (for expiration). :meth:`ProducerStateManager.check` decides, without changing
anything, what to do with an incoming batch:

* ``producer_id < 0`` or a control batch: not idempotent, ``None`` (append it).
* an epoch older than the producer's: fenced, :class:`InvalidProducerEpochError`.
* a newer epoch: its first batch must start at sequence 0, else
  :class:`OutOfOrderSequenceError`.
* the same epoch: ``(base_sequence, last_sequence)`` equal to one of the last 5 batches is a
  retry: :class:`DuplicateOf` with the original offsets (do not append, answer with those);
  ``base_sequence == last_sequence + 1`` (or 0 after 2**31-1) is next in line: ``None``;
  anything else (a gap, or a retry older than the 5) is :class:`OutOfOrderSequenceError` (409)
  with ``expected``/``received`` in its detail.
* transactions (KIP-98): a producer whose transaction is open here may only send transactional
  batches of that epoch (anything else is :class:`InvalidTxnStateError`, Kafka's
  INVALID_TXN_STATE: a write that would slip into or out of the open transaction).
* an unknown producer id: any sequence is accepted. Its state may have expired
  (``producer.id.expiration.ms``), been evicted by :data:`MAX_PRODUCERS_PER_PARTITION`, or left
  with deleted segments; Kafka >= 2.5 (KIP-360) accepts such a producer rather than answering
  ``UNKNOWN_PRODUCER_ID`` as older versions did. The price: a retry of a batch whose state is
  gone is appended twice.

After an append the log calls :meth:`~ProducerStateManager.update` with the stored header; the
same call rebuilds the state during recovery. ``update`` validates nothing (the leader checked
when appending; replicas and replay take what the log holds), but asserts offsets only grow.

Transactions: a producer's first transactional batch opens its transaction here (its offset is
``current_txn_first_offset``, also kept in :attr:`~ProducerStateManager.ongoing`, ordered by
first offset, so the earliest open transaction — the last stable offset — is found in O(1)).
A transaction marker (:mod:`core_log.control`) goes to
:meth:`~ProducerStateManager.update_marker`, which ends the open transaction and returns it as a
:class:`CompletedTxn`; a marker for a producer with no open transaction here (it wrote nothing
to this partition) ends nothing and returns None, as in Kafka. Either way the marker's epoch
becomes the producer's (with KIP-890 the coordinator bumps the epoch at every commit/abort and
the marker carries the new one: the old epoch's batches are forgotten and its late writes are
fenced) and so does its coordinator epoch. :meth:`~ProducerStateManager.check_marker` fences a
marker of an older producer epoch (:class:`InvalidProducerEpochError`) or an older coordinator
epoch (:class:`TransactionCoordinatorFencedError`). A producer with an open transaction is never
expired and is evicted only when every producer has one.

Truncation: :meth:`~ProducerStateManager.truncate_to` drops the retained batches at or past an
offset and producers left with none. It is exact when the truncation point lies inside every
producer's retained window; a producer whose whole window is cut but has older batches in the
log is forgotten (treated as unknown). Kafka instead reloads the newest snapshot below the
truncation point and replays; the log can do the same with :meth:`~ProducerStateManager.recover`
(``log_end`` = the truncation point) and a replay of the tail.
:meth:`~ProducerStateManager.truncate_from_start` drops producers whose last batch and marker lie
below the new log start (Kafka's rule); retained batches below it stay, so a retry still gets
offsets.

Bounds: at most :data:`MAX_PRODUCERS_PER_PARTITION` producers; a new one past the cap evicts the
least recently appended producer (the one idle longest while append times do not go back).

Snapshot file (one per snapshot, ``{offset:020d}.snapshot`` in the partition directory)
----------------------------------------------------------------------------------------
The state as of ``offset`` — every batch below it replayed, none at or past it. Big-endian::

    header (SNAPSHOT_HEADER, 18 bytes)
         0  2  version          SNAPSHOT_VERSION (2; version 1 is still read)
         2  4  crc              CRC-32C of every byte after this field
         6  8  offset           must equal the offset in the file name
        14  4  producerCount    0..MAX_PRODUCERS_PER_PARTITION
    producerCount x producer (PRODUCER_ENTRY, 39 bytes), least recently appended first
         0  8  producerId
         8  2  epoch
        10  8  lastTimestampMs  append time of its last batch or marker
        18  8  txnFirstOffset   -1 when no transaction is open
        26  4  coordinatorEpoch of its last marker, -1 if none    (not in version 1)
        30  8  markerOffset     offset of its last marker, -1 if none  (not in version 1)
        38  1  batchCount       0..BATCHES_RETAINED (version 1: 1..BATCHES_RETAINED; 0 when a
                                marker's new epoch forgot the batches of the old one)
    batchCount x batch (BATCH_ENTRY, 32 bytes), oldest first
         0  4  firstSequence
         4  4  lastSequence
         8  8  firstOffset
        16  8  lastOffset
        24  8  maxTimestamp

Unlike Kafka's snapshot (last batch only) all 5 batches are kept, so retries stay detectable
after a restart. Written atomically (:func:`~core_log.checkpoint.write_atomic`); a file whose
CRC, version, lengths or name disagree is a :class:`CorruptSnapshotError`, which
:meth:`~ProducerStateManager.recover` handles by deleting it and trying the next older one.
Writing a snapshot deletes snapshots past its offset (stale after a truncation) and keeps only
the newest :data:`SNAPSHOTS_RETAINED` (2) at or below it.

Recovery contract (wiring into the log comes later): after segment recovery, with the log's
start and end offsets, call ``recover(dir, log_start, log_end)``; it loads the newest valid
snapshot at or below ``log_end`` (or starts empty) and returns the offset to replay from; feed
every batch header from there to ``log_end`` to :meth:`~ProducerStateManager.update` in offset
order (append time: the batch's LogAppendTime if it has one, else the recovery's ``now`` — a
replayed producer then lives a full expiration window after restart, never less).

Threading: none; the owning log calls every method under its lock. Pure logic except the
snapshot functions, which do file I/O and nothing else.
"""

from __future__ import annotations

import contextlib
import struct
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

import crc32c as _crc32c

from .batch import NO_SEQUENCE, BatchHeader
from .checkpoint import write_atomic
from .control import ControlMarker
from .errors import ErrorCode, InvalidRecordError, KafkaStorageError, LogbusError

# The retries a producer can have in flight: Kafka's idempotent producer allows at most 5
# in-flight requests per connection, and the broker keeps the metadata of that many batches.
BATCHES_RETAINED = 5

# Producer ids tracked per partition. Kafka has no cap and brokers have run out of memory when
# clients create a new producer id per request (the KIP-936 failure mode): until expiration
# (24 h) each one is kept. One entry costs ~1.6 KiB of Python objects with 5 batches (measured
# with tracemalloc), so the cap bounds a partition at ~15 MiB of memory and a snapshot at
# ~1.8 MiB (0.1 s to decode), far above the few hundred live producers a partition normally sees.
MAX_PRODUCERS_PER_PARTITION = 10_000

# Kafka's producer.id.expiration.ms default: 1 day.
DEFAULT_PRODUCER_ID_EXPIRATION_MS = 86_400_000

# Snapshots kept per partition: the newest, plus one older in case the newest is torn.
SNAPSHOTS_RETAINED = 2

SNAPSHOT_SUFFIX = ".snapshot"
SNAPSHOT_VERSION = 2
SNAPSHOT_HEADER = struct.Struct(">hIqi")  # version, crc, offset, producerCount
# producerId, epoch, lastTimestampMs, txnFirstOffset, coordinatorEpoch, markerOffset, batchCount
PRODUCER_ENTRY = struct.Struct(">qhqqiqB")
PRODUCER_ENTRY_V1 = struct.Struct(">qhqqB")  # version 1: no coordinatorEpoch
BATCH_ENTRY = struct.Struct(">iiqqq")  # firstSeq, lastSeq, firstOffset, lastOffset, maxTimestamp
CRC_START = 6  # the CRC covers bytes [6, end)
assert (SNAPSHOT_HEADER.size, PRODUCER_ENTRY.size, BATCH_ENTRY.size) == (18, 39, 32)
MAX_SNAPSHOT_BYTES = SNAPSHOT_HEADER.size + MAX_PRODUCERS_PER_PARTITION * (
    PRODUCER_ENTRY.size + BATCHES_RETAINED * BATCH_ENTRY.size
)

SEQUENCE_MODULUS = 2**31  # sequences are non-negative int32 and wrap from 2**31-1 to 0
NO_TXN_OFFSET = -1


class OutOfOrderSequenceError(LogbusError):
    """A sequence gap, a retry older than the retained batches, or a new epoch not at 0."""

    code = ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER


class InvalidProducerEpochError(LogbusError):
    """The batch's epoch is older than the producer's: a zombie producer, fenced."""

    code = ErrorCode.INVALID_PRODUCER_EPOCH


class InvalidTxnStateError(LogbusError):
    """A write that does not fit the producer's transaction state here (Kafka's
    INVALID_TXN_STATE): a non-transactional or new-epoch batch while its transaction is open."""

    code = ErrorCode.INVALID_TXN_STATE


class TransactionCoordinatorFencedError(LogbusError):
    """A marker from a coordinator older than one that already wrote for this producer."""

    code = ErrorCode.TRANSACTION_COORDINATOR_FENCED


class CorruptSnapshotError(KafkaStorageError):
    """A producer snapshot failed its checks (torn, bit-flipped, renamed or foreign)."""


@dataclass(frozen=True, slots=True)
class BatchMetadata:
    first_seq: int
    last_seq: int
    first_offset: int
    last_offset: int
    max_timestamp: int


@dataclass(frozen=True, slots=True)
class DuplicateOf:
    """A retry of an appended batch: answer with these and append nothing."""

    first_offset: int
    last_offset: int
    max_timestamp: int


@dataclass(frozen=True, slots=True)
class CompletedTxn:
    """A transaction a marker ended: its producer, first offset, the marker's offset, and how."""

    producer_id: int
    first_offset: int
    last_offset: int  # the marker's offset
    aborted: bool


@dataclass(slots=True)
class ProducerEntry:
    producer_id: int
    epoch: int
    last_timestamp_ms: int
    batches: deque[BatchMetadata] = field(default_factory=lambda: deque(maxlen=BATCHES_RETAINED))
    current_txn_first_offset: int | None = None  # the open transaction's first offset here
    coordinator_epoch: int = -1  # of the last marker written for this producer
    marker_offset: int = -1  # offset of that marker

    @property
    def last_write_offset(self) -> int:
        """The offset of its last batch or marker, whichever is later (-1: none)."""
        return max(self.last_offset, self.marker_offset)

    @property
    def last_seq(self) -> int:
        return self.batches[-1].last_seq if self.batches else NO_SEQUENCE

    @property
    def last_offset(self) -> int:
        return self.batches[-1].last_offset if self.batches else -1

    def find(self, first_seq: int, last_seq: int) -> BatchMetadata | None:
        for b in self.batches:
            if b.first_seq == first_seq and b.last_seq == last_seq:
                return b
        return None


def next_sequence(seq: int) -> int:
    """The sequence after ``seq``, wrapping 2**31-1 to 0."""
    return (seq + 1) % SEQUENCE_MODULUS


def _plausible(b: BatchMetadata, previous_last_offset: int) -> bool:
    """A batch entry read back from disk makes sense after one ending at the given offset."""
    return (
        b.first_seq >= 0
        and b.last_seq >= 0
        and previous_last_offset < b.first_offset <= b.last_offset
    )


def _idempotent(h: BatchHeader) -> bool:
    return h.producer_id >= 0 and not h.is_control


class ProducerStateManager:
    """Producer id → :class:`ProducerEntry` for one partition. See the module docstring."""

    def __init__(self, max_producers: int = MAX_PRODUCERS_PER_PARTITION) -> None:
        assert 1 <= max_producers <= MAX_PRODUCERS_PER_PARTITION
        self.max_producers = max_producers
        # Insertion order is append recency: the first entry is the least recently appended.
        self._producers: dict[int, ProducerEntry] = {}
        # Producer id -> first offset of its open transaction, in first-offset order (a
        # transaction opens at the log end, after every open one).
        self._ongoing: dict[int, int] = {}

    def __len__(self) -> int:
        return len(self._producers)

    def get(self, producer_id: int) -> ProducerEntry | None:
        return self._producers.get(producer_id)

    @property
    def producers(self) -> dict[int, ProducerEntry]:
        """A shallow copy, least recently appended first. Do not mutate the entries."""
        return dict(self._producers)

    @property
    def ongoing(self) -> dict[int, int]:
        """Producer id -> first offset of each open transaction, earliest first (a copy)."""
        return dict(self._ongoing)

    @property
    def first_ongoing_offset(self) -> int | None:
        """The first offset of the earliest open transaction, or None."""
        return next(iter(self._ongoing.values()), None)

    # -- the decision --------------------------------------------------------------------------

    def check(self, h: BatchHeader) -> DuplicateOf | None:
        """What to do with batch ``h`` from a producer; changes nothing.

        Returns None to append it, or :class:`DuplicateOf` for a retry of an appended batch.
        Raises :class:`InvalidProducerEpochError` (fenced), :class:`OutOfOrderSequenceError`, or
        :class:`InvalidRecordError` for an idempotent batch with a negative sequence or epoch.
        """
        if not _idempotent(h):
            return None
        if h.base_sequence < 0 or h.producer_epoch < 0:
            raise InvalidRecordError(
                f"producer {h.producer_id}: invalid epoch {h.producer_epoch} or sequence "
                f"{h.base_sequence} in an idempotent batch",
                producer_id=h.producer_id,
            )
        entry = self._producers.get(h.producer_id)
        if entry is None:
            return None
        if (
            entry.current_txn_first_offset is not None
            and h.producer_epoch >= entry.epoch
            and (not h.is_transactional or h.producer_epoch != entry.epoch)
        ):
            raise InvalidTxnStateError(
                f"producer {h.producer_id} has a transaction open at offset "
                f"{entry.current_txn_first_offset} (epoch {entry.epoch}): expected a "
                f"transactional batch of that epoch",
                producer_id=h.producer_id,
                epoch=entry.epoch,
            )
        if h.producer_epoch < entry.epoch:
            raise InvalidProducerEpochError(
                f"producer {h.producer_id} epoch {h.producer_epoch} is fenced by epoch "
                f"{entry.epoch}",
                producer_id=h.producer_id,
                epoch=entry.epoch,
                received_epoch=h.producer_epoch,
            )
        if h.producer_epoch > entry.epoch:
            if h.base_sequence != 0:
                raise self._out_of_order(h, 0, "a new epoch must start at sequence 0")
            return None
        dup = entry.find(h.base_sequence, h.last_sequence)
        if dup is not None:
            return DuplicateOf(dup.first_offset, dup.last_offset, dup.max_timestamp)
        expected = next_sequence(entry.last_seq)
        if h.base_sequence != expected:
            raise self._out_of_order(h, expected, "sequence gap or retry of an expired batch")
        return None

    @staticmethod
    def _out_of_order(h: BatchHeader, expected: int, why: str) -> OutOfOrderSequenceError:
        return OutOfOrderSequenceError(
            f"producer {h.producer_id} epoch {h.producer_epoch}: expected sequence {expected}, "
            f"received {h.base_sequence} ({why})",
            producer_id=h.producer_id,
            epoch=h.producer_epoch,
            expected=expected,
            received=h.base_sequence,
        )

    # -- changes -------------------------------------------------------------------------------

    def check_marker(self, marker: ControlMarker) -> None:
        """May this transaction marker be appended (the leader asks; changes nothing)?

        Raises :class:`InvalidProducerEpochError` for an epoch older than the producer's and
        :class:`TransactionCoordinatorFencedError` for a coordinator epoch older than the one
        of the producer's last marker. An unknown producer's marker is accepted.
        """
        entry = self._producers.get(marker.producer_id)
        if entry is None:
            return
        if marker.producer_epoch < entry.epoch:
            raise InvalidProducerEpochError(
                f"marker for producer {marker.producer_id} epoch {marker.producer_epoch} is "
                f"fenced by epoch {entry.epoch}",
                producer_id=marker.producer_id,
                epoch=entry.epoch,
                received_epoch=marker.producer_epoch,
            )
        if marker.coordinator_epoch < entry.coordinator_epoch:
            raise TransactionCoordinatorFencedError(
                f"marker for producer {marker.producer_id} from coordinator epoch "
                f"{marker.coordinator_epoch}, older than {entry.coordinator_epoch}",
                producer_id=marker.producer_id,
                coordinator_epoch=entry.coordinator_epoch,
            )

    def update_marker(self, marker: ControlMarker, append_time_ms: int) -> CompletedTxn | None:
        """Record the transaction marker ``marker`` (appended at ``marker.offset``); also the
        replay step of recovery. Returns the transaction it ended, or None when the producer had
        none open here. No validation (see :meth:`check_marker`)."""
        pid = marker.producer_id
        entry = self._producers.pop(pid, None)
        if entry is None:
            while len(self._producers) >= self.max_producers:
                self._evict_one()
            entry = ProducerEntry(pid, marker.producer_epoch, append_time_ms)
        else:
            if marker.producer_epoch > entry.epoch:  # KIP-890: the coordinator bumped it
                entry.batches.clear()
                entry.epoch = marker.producer_epoch
            entry.last_timestamp_ms = append_time_ms
        entry.coordinator_epoch = max(entry.coordinator_epoch, marker.coordinator_epoch)
        entry.marker_offset = marker.offset
        completed = None
        first = entry.current_txn_first_offset
        if first is not None:
            completed = CompletedTxn(pid, first, marker.offset, not marker.commit)
            entry.current_txn_first_offset = None
            self._ongoing.pop(pid, None)
        self._producers[pid] = entry
        return completed

    def update(self, h: BatchHeader, first_offset: int, append_time_ms: int) -> None:
        """Record batch ``h``, appended at ``first_offset``; also the replay step of recovery.

        No validation (see the module docstring). A new epoch forgets the old epoch's batches;
        a new producer past the cap evicts the least recently appended one. A transactional
        batch opens its producer's transaction unless one is open.
        """
        if not _idempotent(h):
            return
        last_offset = first_offset + h.last_offset_delta
        meta = BatchMetadata(
            h.base_sequence, h.last_sequence, first_offset, last_offset, h.max_timestamp
        )
        entry = self._producers.pop(h.producer_id, None)
        if entry is None:
            while len(self._producers) >= self.max_producers:
                self._evict_one()
            entry = ProducerEntry(h.producer_id, h.producer_epoch, append_time_ms)
        else:
            assert first_offset > entry.last_offset, "producer batches are recorded in order"
            if entry.epoch != h.producer_epoch:
                entry.batches.clear()
                entry.epoch = h.producer_epoch
            entry.last_timestamp_ms = append_time_ms
        entry.batches.append(meta)
        if h.is_transactional and entry.current_txn_first_offset is None:
            entry.current_txn_first_offset = first_offset
            self._ongoing[h.producer_id] = first_offset
        self._producers[h.producer_id] = entry  # to the end: most recently appended

    def _evict_one(self) -> None:
        """Drop the least recently appended producer without an open transaction."""
        victim = next(
            (pid for pid, e in self._producers.items() if e.current_txn_first_offset is None),
            next(iter(self._producers)),
        )
        self._drop(victim)

    def _drop(self, producer_id: int) -> None:
        del self._producers[producer_id]
        self._ongoing.pop(producer_id, None)

    def truncate_to(self, offset: int) -> None:
        """The log was cut at ``offset``: drop batches at or past it, and producers left empty."""
        for pid in list(self._producers):
            entry = self._producers[pid]
            while entry.batches and entry.batches[-1].last_offset >= offset:
                entry.batches.pop()
            first = entry.current_txn_first_offset
            if first is not None and first >= offset:
                entry.current_txn_first_offset = None
                self._ongoing.pop(pid, None)
            if entry.marker_offset >= offset:
                entry.marker_offset = -1
            if not entry.batches and entry.marker_offset < 0:
                self._drop(pid)

    def truncate_from_start(self, log_start_offset: int) -> None:
        """The log now starts at ``log_start_offset``: drop producers whose data all lies below."""
        for pid in [
            p for p, e in self._producers.items() if e.last_write_offset < log_start_offset
        ]:
            self._drop(pid)

    def expire(
        self, now_ms: int, producer_id_expiration_ms: int = DEFAULT_PRODUCER_ID_EXPIRATION_MS
    ) -> list[int]:
        """Drop producers idle for ``producer_id_expiration_ms`` or longer; return their ids.

        Producers with an open transaction never expire (Kafka's rule).
        """
        expired = [
            pid
            for pid, e in self._producers.items()
            if e.current_txn_first_offset is None
            and now_ms - e.last_timestamp_ms >= producer_id_expiration_ms
        ]
        for pid in expired:
            self._drop(pid)
        return expired

    def clear(self) -> None:
        self._producers.clear()
        self._ongoing.clear()

    # -- snapshots -----------------------------------------------------------------------------

    def encode(self, offset: int) -> bytes:
        """The snapshot file's bytes for the current state as of ``offset`` (pure)."""
        parts = []
        for e in self._producers.values():
            assert e.last_write_offset < offset, "a snapshot holds only writes below its offset"
            txn = e.current_txn_first_offset
            txn = NO_TXN_OFFSET if txn is None else txn
            assert txn < offset, "a snapshot holds only transactions opened below its offset"
            head = (
                e.producer_id,
                e.epoch,
                e.last_timestamp_ms,
                txn,
                e.coordinator_epoch,
                e.marker_offset,
                len(e.batches),
            )
            parts.append(PRODUCER_ENTRY.pack(*head))
            for b in e.batches:
                parts.append(
                    BATCH_ENTRY.pack(
                        b.first_seq, b.last_seq, b.first_offset, b.last_offset, b.max_timestamp
                    )
                )
        body = struct.pack(">qi", offset, len(self._producers)) + b"".join(parts)
        crc = _crc32c.crc32c(body)
        return struct.pack(">hI", SNAPSHOT_VERSION, crc) + body

    def decode(self, data: bytes) -> int:
        """Replace the state with the snapshot ``data``; return its offset (pure).

        Raises :class:`CorruptSnapshotError`; the state is unchanged then.
        """
        if len(data) < SNAPSHOT_HEADER.size or len(data) > MAX_SNAPSHOT_BYTES:
            raise CorruptSnapshotError(f"producer snapshot of {len(data)} bytes")
        version, crc, offset, count = SNAPSHOT_HEADER.unpack_from(data)
        if version not in (1, SNAPSHOT_VERSION):
            raise CorruptSnapshotError(f"producer snapshot version {version}")
        producer_entry = PRODUCER_ENTRY if version == SNAPSHOT_VERSION else PRODUCER_ENTRY_V1
        min_batches = 0 if version == SNAPSHOT_VERSION else 1
        if _crc32c.crc32c(memoryview(data)[CRC_START:]) != crc:
            raise CorruptSnapshotError("producer snapshot CRC-32C mismatch")
        if not 0 <= count <= MAX_PRODUCERS_PER_PARTITION:
            raise CorruptSnapshotError(f"producer snapshot with {count} producers")
        producers: dict[int, ProducerEntry] = {}
        pos = SNAPSHOT_HEADER.size
        try:
            for _ in range(count):
                fields = producer_entry.unpack_from(data, pos)
                pos += producer_entry.size
                pid, epoch, last_ts, txn = fields[:4]
                coordinator_epoch, marker_offset = fields[4:6] if len(fields) == 7 else (-1, -1)
                n = fields[-1]
                if (
                    pid < 0
                    or epoch < 0
                    or not min_batches <= n <= BATCHES_RETAINED
                    or pid in producers
                    or not (txn == NO_TXN_OFFSET or 0 <= txn < offset)
                    or not -1 <= marker_offset < offset
                ):
                    raise CorruptSnapshotError(f"bad producer entry {pid} in snapshot")
                entry = ProducerEntry(
                    pid,
                    epoch,
                    last_ts,
                    coordinator_epoch=coordinator_epoch,
                    marker_offset=marker_offset,
                )
                entry.current_txn_first_offset = None if txn == NO_TXN_OFFSET else txn
                for _ in range(n):
                    b = BatchMetadata(*BATCH_ENTRY.unpack_from(data, pos))
                    pos += BATCH_ENTRY.size
                    if not _plausible(b, entry.last_offset):
                        raise CorruptSnapshotError(f"bad batch entry {b} in snapshot")
                    entry.batches.append(b)
                if entry.last_offset >= offset:
                    raise CorruptSnapshotError(f"producer {pid} has batches past the snapshot")
                producers[pid] = entry
        except struct.error as e:
            raise CorruptSnapshotError(f"truncated producer snapshot: {e}") from e
        if pos != len(data):
            raise CorruptSnapshotError(f"{len(data) - pos} trailing bytes in producer snapshot")
        while len(producers) > self.max_producers:
            del producers[next(iter(producers))]
        self._producers = producers
        self._ongoing = {
            pid: first
            for first, pid in sorted(
                (e.current_txn_first_offset, pid)
                for pid, e in producers.items()
                if e.current_txn_first_offset is not None
            )
        }
        return int(offset)

    def snapshot(self, directory: Path, offset: int) -> Path:
        """Write the state as of ``offset`` to ``directory``; prune stale and old snapshots."""
        path = snapshot_path(directory, offset)
        write_atomic(path, self.encode(offset))
        offsets = list_snapshots(directory)
        stale = [o for o in offsets if o > offset]
        kept = [o for o in offsets if o <= offset]
        for o in stale + kept[:-SNAPSHOTS_RETAINED]:
            snapshot_path(directory, o).unlink(missing_ok=True)
        return path

    def load(self, path: Path) -> int:
        """Replace the state with the snapshot at ``path``; return its offset.

        Raises :class:`CorruptSnapshotError` (state unchanged), or FileNotFoundError.
        """
        expected = snapshot_offset(path)
        if expected is None:
            raise CorruptSnapshotError(f"{path.name} is not a producer snapshot name")
        with path.open("rb") as f:
            data = f.read(MAX_SNAPSHOT_BYTES + 1)
        fresh = ProducerStateManager(self.max_producers)
        offset = fresh.decode(data)
        if offset != expected:
            raise CorruptSnapshotError(f"{path.name} holds the state as of offset {offset}")
        self._producers = fresh._producers
        self._ongoing = fresh._ongoing
        return offset

    def recover(
        self,
        directory: Path,
        log_start_offset: int,
        log_end_offset: int,
        *,
        replay_from_max: int | None = None,
    ) -> int:
        """Load the newest valid snapshot at or below ``log_end_offset`` (and at or below
        ``replay_from_max`` when given: the log replays from there to rebuild what snapshots do
        not hold); return the replay start.

        Snapshots past ``log_end_offset`` are stale and deleted, as are corrupt ones (Kafka does
        the same). Without a valid snapshot the state starts empty. The caller then replays
        every batch from the returned offset (>= ``log_start_offset``) to ``log_end_offset``.
        """
        self.clear()
        start = log_start_offset
        limit = log_end_offset if replay_from_max is None else replay_from_max
        for o in reversed(list_snapshots(directory)):
            path = snapshot_path(directory, o)
            if o > log_end_offset:
                path.unlink(missing_ok=True)
                continue
            if o > limit:
                continue
            try:
                start = max(self.load(path), log_start_offset)
                break
            except CorruptSnapshotError:
                path.unlink(missing_ok=True)
        self.truncate_from_start(log_start_offset)
        return start


# -- snapshot files ----------------------------------------------------------------------------


def snapshot_path(directory: Path, offset: int) -> Path:
    assert offset >= 0
    return directory / f"{offset:020d}{SNAPSHOT_SUFFIX}"


def snapshot_offset(path: Path) -> int | None:
    """The offset in a snapshot file name, or None if ``path`` is not named like one."""
    stem = path.name.removesuffix(SNAPSHOT_SUFFIX)
    if path.name == stem or len(stem) != 20 or not stem.isdigit() or not stem.isascii():
        return None
    return int(stem)


def list_snapshots(directory: Path) -> list[int]:
    """Offsets of the snapshot files in ``directory``, ascending."""
    names: Iterable[Path] = ()
    with contextlib.suppress(FileNotFoundError):
        names = list(directory.iterdir())
    return sorted(o for p in names if (o := snapshot_offset(p)) is not None)


def latest_snapshot(directory: Path, upto_offset: int) -> Path | None:
    """The newest snapshot file at or below ``upto_offset`` (by name; not read), or None."""
    below = [o for o in list_snapshots(directory) if o <= upto_offset]
    return snapshot_path(directory, below[-1]) if below else None
