"""Tests for core_log.producer_state: idempotent-producer sequence checks and snapshots.

A reference model (full history per producer, the rules restated from Kafka) is run against the
manager on random operation sequences; kafka-python's idempotent batch builder supplies headers
from an independent implementation of the producer side.
"""

from __future__ import annotations

import contextlib
import struct
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import crc32c
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from kafka.record.default_records import DefaultRecordBatchBuilder

from core_log.batch import BatchHeader, Record, build_batch, parse_header
from core_log.errors import ErrorCode, InvalidRecordError, KafkaStorageError
from core_log.producer_state import (
    BATCHES_RETAINED,
    DEFAULT_PRODUCER_ID_EXPIRATION_MS,
    MAX_PRODUCERS_PER_PARTITION,
    SNAPSHOTS_RETAINED,
    BatchMetadata,
    CorruptSnapshotError,
    DuplicateOf,
    InvalidProducerEpochError,
    OutOfOrderSequenceError,
    ProducerStateManager,
    latest_snapshot,
    list_snapshots,
    next_sequence,
    snapshot_offset,
    snapshot_path,
)

FAST = settings(
    derandomize=True,
    database=None,
    deadline=None,
    max_examples=150,
    suppress_health_check=[HealthCheck.too_slow],
)

MAX_SEQ = 2**31 - 1
NOW_MS = 1_700_000_000_000
_TEMPLATE = parse_header(build_batch([Record(b"v")], default_timestamp=NOW_MS))


def header(
    producer_id: int = 7,
    epoch: int = 0,
    seq: int = 0,
    count: int = 1,
    *,
    max_timestamp: int = NOW_MS,
) -> BatchHeader:
    """A producer batch header of ``count`` records (only the fields the manager reads)."""
    return _TEMPLATE._replace(
        producer_id=producer_id,
        producer_epoch=epoch,
        base_sequence=seq,
        record_count=count,
        last_offset_delta=count - 1,
        max_timestamp=max_timestamp,
    )


class Partition:
    """A stand-in for the log: offsets, the append path and the manager, no bytes."""

    def __init__(self, psm: ProducerStateManager | None = None) -> None:
        self.psm = psm if psm is not None else ProducerStateManager()
        self.log_end_offset = 0
        self.now_ms = NOW_MS

    def append(self, h: BatchHeader) -> DuplicateOf | tuple[int, int]:
        dup = self.psm.check(h)
        if dup is not None:
            return dup
        first = self.log_end_offset
        self.psm.update(h, first, self.now_ms)
        self.log_end_offset += h.last_offset_delta + 1
        return first, first + h.last_offset_delta

    def appended(self, h: BatchHeader) -> tuple[int, int]:
        """Append ``h``, which must be new; its (first, last) offsets."""
        result = self.append(h)
        assert isinstance(result, tuple), result
        return result


def state(psm: ProducerStateManager) -> bytes:
    """Everything the manager holds, as bytes (the snapshot encoding at a far offset)."""
    return psm.encode(2**62)


# ---------------------------------------------------------------------------------------------
# check: targeted
# ---------------------------------------------------------------------------------------------


def test_non_idempotent_and_control_batches_are_not_tracked() -> None:
    p = Partition()
    plain = header()._replace(producer_id=-1, producer_epoch=-1, base_sequence=-1)
    assert p.append(plain) == (0, 0)
    assert p.append(plain) == (1, 1)  # no dedup without a producer id
    control = header(seq=5)._replace(attributes=_TEMPLATE.attributes | 0x20)
    assert p.psm.check(control) is None
    p.psm.update(control, 2, NOW_MS)
    assert len(p.psm) == 0


def test_idempotent_batch_needs_a_sequence_and_epoch() -> None:
    psm = ProducerStateManager()
    for h in (header(seq=-1), header(epoch=-1)):
        with pytest.raises(InvalidRecordError):
            psm.check(h)


@pytest.mark.parametrize("seq", [0, 1, 42, MAX_SEQ])
def test_unknown_producer_accepts_any_sequence(seq: int) -> None:
    p = Partition()
    assert p.append(header(seq=seq, count=2)) == (0, 1)
    assert p.append(header(seq=next_sequence(next_sequence(seq)))) == (2, 2)


def test_duplicates_of_each_of_the_last_five_batches_return_the_original_offsets() -> None:
    p = Partition()
    offsets = []
    seq = 0
    for count in (1, 2, 3, 1, 2, 3):  # 6 batches: the first falls out of the window
        offsets.append(p.appended(header(seq=seq, count=count)))
        seq += count
    seqs = [(0, 1), (1, 2), (3, 3), (6, 1), (7, 2), (9, 3)]
    before = state(p.psm)
    for (s, c), (first, last) in list(zip(seqs, offsets, strict=True))[1:]:
        assert p.psm.check(header(seq=s, count=c)) == DuplicateOf(first, last, NOW_MS)
    with pytest.raises(OutOfOrderSequenceError) as e:
        p.psm.check(header(seq=0, count=1))  # 6th-oldest: no longer known
    assert e.value.detail["expected"] == 12 and e.value.detail["received"] == 0
    assert state(p.psm) == before
    assert p.log_end_offset == 12


def test_gap_is_out_of_order_409_with_expected_and_received() -> None:
    p = Partition()
    p.append(header(seq=0, count=3))
    with pytest.raises(OutOfOrderSequenceError) as e:
        p.psm.check(header(seq=4))
    err = e.value
    assert err.code is ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER
    assert err.code.http_status == 409 and err.code.kafka_code == 45 and not err.retriable
    assert err.detail == {"producer_id": 7, "epoch": 0, "expected": 3, "received": 4}
    # a partial overlap with a known batch is not a duplicate either
    with pytest.raises(OutOfOrderSequenceError):
        p.psm.check(header(seq=0, count=2))
    assert p.append(header(seq=3)) == (3, 3)


def test_sequence_wraps_after_int32_max() -> None:
    p = Partition()
    p.append(header(seq=MAX_SEQ - 1, count=2))  # ends at 2**31-1
    entry = p.psm.get(7)
    assert entry is not None and entry.last_seq == MAX_SEQ
    with pytest.raises(OutOfOrderSequenceError) as e:
        p.psm.check(header(seq=MAX_SEQ + 1 - 2**31 + 1))  # 1, skipping 0
    assert e.value.detail["expected"] == 0
    assert p.append(header(seq=0, count=1)) == (2, 2)
    # a batch spanning the wrap: 2**31-2, 2**31-1, 0
    q = Partition()
    q.append(header(seq=MAX_SEQ - 1, count=3))
    assert q.psm.check(header(seq=MAX_SEQ - 1, count=3)) == DuplicateOf(0, 2, NOW_MS)
    assert q.append(header(seq=1)) == (3, 3)


def test_epoch_bump_starts_at_zero_and_fences_the_old_epoch() -> None:
    p = Partition()
    p.append(header(epoch=3, seq=0, count=2))
    with pytest.raises(OutOfOrderSequenceError) as oos:
        p.psm.check(header(epoch=4, seq=2))
    assert oos.value.detail["expected"] == 0
    assert p.append(header(epoch=4, seq=0)) == (2, 2)
    for h in (header(epoch=3, seq=2), header(epoch=3, seq=0, count=2)):  # next, and a retry
        with pytest.raises(InvalidProducerEpochError) as fenced:
            p.psm.check(h)
        assert fenced.value.code is ErrorCode.INVALID_PRODUCER_EPOCH
        assert fenced.value.detail["epoch"] == 4 and fenced.value.detail["received_epoch"] == 3
    entry = p.psm.get(7)
    assert entry is not None and entry.epoch == 4 and len(entry.batches) == 1
    assert p.append(header(epoch=4, seq=1)) == (3, 3)


def test_update_records_offsets_timestamps_and_keeps_five() -> None:
    p = Partition()
    for i in range(8):
        p.now_ms = NOW_MS + i
        p.append(header(seq=i, max_timestamp=NOW_MS + 100 + i))
    entry = p.psm.get(7)
    assert entry is not None
    assert list(entry.batches) == [BatchMetadata(i, i, i, i, NOW_MS + 100 + i) for i in range(3, 8)]
    assert entry.last_timestamp_ms == NOW_MS + 7 and entry.current_txn_first_offset is None
    assert len(entry.batches) == BATCHES_RETAINED


# ---------------------------------------------------------------------------------------------
# truncation, expiration, the cap
# ---------------------------------------------------------------------------------------------


def test_truncate_to_drops_batches_at_or_after_the_offset() -> None:
    p = Partition()
    p.append(header(producer_id=1, seq=0, count=2))  # 0-1
    p.append(header(producer_id=2, seq=0))  # 2
    p.append(header(producer_id=1, seq=2, count=2))  # 3-4
    p.append(header(producer_id=3, seq=0))  # 5
    p.psm.truncate_to(4)  # cuts producer 1's second batch (3-4) and producer 3
    assert sorted(p.psm.producers) == [1, 2]
    e1 = p.psm.get(1)
    assert e1 is not None and e1.last_seq == 1 and e1.last_offset == 1
    p.log_end_offset = 3
    assert p.append(header(producer_id=1, seq=2, count=2)) == (3, 4)  # the retry is new again
    p.psm.truncate_to(0)
    assert len(p.psm) == 0


def test_truncate_from_start_drops_producers_wholly_below() -> None:
    p = Partition()
    p.append(header(producer_id=1, seq=0, count=3))  # 0-2
    p.append(header(producer_id=2, seq=0))  # 3
    p.append(header(producer_id=1, seq=3))  # 4
    p.psm.truncate_from_start(4)
    assert sorted(p.psm.producers) == [1]
    assert p.psm.check(header(producer_id=1, seq=0, count=3)) == DuplicateOf(0, 2, NOW_MS)
    p.psm.truncate_from_start(5)
    assert len(p.psm) == 0


def test_expire_drops_idle_producers_only() -> None:
    p = Partition()
    p.append(header(producer_id=1))
    p.now_ms = NOW_MS + 1000
    p.append(header(producer_id=2))
    window = DEFAULT_PRODUCER_ID_EXPIRATION_MS
    assert window == 86_400_000
    assert p.psm.expire(NOW_MS + window - 1) == []
    assert p.psm.expire(NOW_MS + window) == [1]  # idle for exactly the window: gone
    assert sorted(p.psm.producers) == [2]
    assert p.psm.check(header(producer_id=1, seq=17)) is None  # unknown again: accepted
    entry = p.psm.get(2)
    assert entry is not None
    entry.current_txn_first_offset = 1  # an open transaction pins a producer (Kafka's rule)
    assert p.psm.expire(NOW_MS + 10 * window) == []


def test_producer_cap_evicts_the_least_recently_appended() -> None:
    assert MAX_PRODUCERS_PER_PARTITION >= 1000
    p = Partition(ProducerStateManager(max_producers=3))
    for pid in (1, 2, 3):
        p.append(header(producer_id=pid))
    p.append(header(producer_id=1, seq=1))  # 1 is fresh again; 2 is now the idlest
    p.append(header(producer_id=4))
    assert list(p.psm.producers) == [3, 1, 4]
    p.append(header(producer_id=5))
    assert list(p.psm.producers) == [1, 4, 5]
    assert len(p.psm) == 3


# ---------------------------------------------------------------------------------------------
# check never mutates (Hypothesis)
# ---------------------------------------------------------------------------------------------

seqs = st.sampled_from([0, 1, 2, 3, 5, 8, MAX_SEQ - 1, MAX_SEQ]) | st.integers(0, MAX_SEQ)
headers = st.builds(
    header,
    producer_id=st.integers(-1, 3),
    epoch=st.integers(0, 3),
    seq=seqs,
    count=st.integers(1, 4),
)


@FAST
@given(st.lists(headers, max_size=20), headers)
def test_check_never_mutates(history: list[BatchHeader], probe: BatchHeader) -> None:
    p = Partition()
    for h in history:
        with contextlib.suppress(OutOfOrderSequenceError, InvalidProducerEpochError):
            p.append(h)
    before = state(p.psm)
    order = list(p.psm.producers)
    with contextlib.suppress(OutOfOrderSequenceError, InvalidProducerEpochError):
        p.psm.check(probe)
    assert state(p.psm) == before and list(p.psm.producers) == order


# ---------------------------------------------------------------------------------------------
# the model
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Appended:
    epoch: int
    first_seq: int
    last_seq: int
    first_offset: int
    last_offset: int


class Model:
    """Full append history per producer; the rules written out the simplest way."""

    def __init__(self) -> None:
        self.history: dict[int, list[Appended]] = {}

    def window(self, pid: int) -> list[Appended]:
        hist = self.history[pid]
        return [b for b in hist if b.epoch == hist[-1].epoch][-BATCHES_RETAINED:]

    def expect(self, pid: int, epoch: int, seq: int, count: int) -> str | tuple[int, int]:
        if pid not in self.history:
            return "ok"
        current = self.history[pid][-1].epoch
        if epoch < current:
            return "fenced"
        if epoch > current:
            return "ok" if seq == 0 else "out_of_order"
        last = (seq + count - 1) % 2**31
        for b in self.window(pid):
            if (b.first_seq, b.last_seq) == (seq, last):
                return (b.first_offset, b.last_offset)
        return "ok" if seq == (self.window(pid)[-1].last_seq + 1) % 2**31 else "out_of_order"

    def truncate_to(self, offset: int) -> None:
        for pid in list(self.history):
            kept = [b for b in self.window(pid) if b.last_offset < offset]
            if kept:
                self.history[pid] = kept
            else:
                del self.history[pid]

    def truncate_from_start(self, offset: int) -> None:
        for pid in [p for p, h in self.history.items() if h[-1].last_offset < offset]:
            del self.history[pid]


# An operation: (kind, producer, epoch step, sequence choice, count, a number to pick with)
ops = st.lists(
    st.tuples(
        st.sampled_from(["append"] * 8 + ["truncate", "start", "reload"]),
        st.integers(0, 2),
        st.sampled_from([0, 0, 0, 1, -1, -1]),
        st.sampled_from(["next", "next", "next", "retry", "zero", "random"]),
        st.integers(1, 3),
        st.integers(0, 2**31),
    ),
    min_size=5,
    max_size=80,
)


@settings(FAST, max_examples=300)
@given(ops)
def test_manager_matches_the_model(operations: list[tuple[str, int, int, str, int, int]]) -> None:
    p = Partition()
    model = Model()
    log_start = 0
    for kind, pid, epoch_step, seq_choice, count, pick in operations:
        if kind == "truncate":
            cut = log_start + pick % (p.log_end_offset - log_start + 1)
            p.psm.truncate_to(cut)
            model.truncate_to(cut)
            p.log_end_offset = cut
        elif kind == "start":
            log_start += pick % (p.log_end_offset - log_start + 1)
            p.psm.truncate_from_start(log_start)
            model.truncate_from_start(log_start)
        elif kind == "reload":
            fresh = ProducerStateManager()
            assert fresh.decode(p.psm.encode(p.log_end_offset)) == p.log_end_offset
            assert fresh.producers == p.psm.producers
            assert list(fresh.producers) == list(p.psm.producers)
            p.psm = fresh
        else:
            hist = model.history.get(pid, [])
            current = hist[-1].epoch if hist else 0
            epoch = max(0, current + epoch_step)
            if seq_choice == "retry" and hist:
                b = hist[-1 - pick % len(hist)]
                epoch, seq = b.epoch, b.first_seq
                count = (b.last_seq - b.first_seq) % 2**31 + 1
            elif seq_choice == "next" and hist:
                seq = (hist[-1].last_seq + 1) % 2**31
            elif seq_choice == "random":
                seq = pick % 2**31 if pick % 3 else MAX_SEQ - pick % 3
            else:
                seq = 0
            step(p, model, pid, epoch, seq, count)
        assert_same(p.psm, model)


def step(p: Partition, model: Model, pid: int, epoch: int, seq: int, count: int) -> None:
    expected = model.expect(pid, epoch, seq, count)
    event(expected if isinstance(expected, str) else "duplicate")
    h = header(producer_id=pid, epoch=epoch, seq=seq, count=count)
    if expected == "fenced":
        with pytest.raises(InvalidProducerEpochError):
            p.append(h)
    elif expected == "out_of_order":
        with pytest.raises(OutOfOrderSequenceError):
            p.append(h)
    elif expected == "ok":
        first, last = p.appended(h)
        model.history.setdefault(pid, []).append(
            Appended(epoch, seq, (seq + count - 1) % 2**31, first, last)
        )
    else:
        assert isinstance(expected, tuple)
        assert p.append(h) == DuplicateOf(*expected, NOW_MS)


def assert_same(psm: ProducerStateManager, model: Model) -> None:
    assert sorted(psm.producers) == sorted(model.history)
    for pid in model.history:
        entry = psm.get(pid)
        assert entry is not None
        window = model.window(pid)
        assert entry.epoch == window[-1].epoch
        got = [(b.first_seq, b.last_seq, b.first_offset, b.last_offset) for b in entry.batches]
        assert got == [(b.first_seq, b.last_seq, b.first_offset, b.last_offset) for b in window]


# ---------------------------------------------------------------------------------------------
# snapshots
# ---------------------------------------------------------------------------------------------


def busy_partition() -> Partition:
    p = Partition()
    for i in range(7):
        p.now_ms = NOW_MS + i
        p.append(header(producer_id=1, seq=i))
        p.append(header(producer_id=2, epoch=3, seq=(MAX_SEQ - 2 + 2 * i) % 2**31, count=2))
    p.append(header(producer_id=3, epoch=2**15 - 1, seq=5))
    return p


def test_snapshot_round_trip(tmp_path: Path) -> None:
    p = busy_partition()
    path = p.psm.snapshot(tmp_path, p.log_end_offset)
    assert path == tmp_path / f"{p.log_end_offset:020d}.snapshot"
    assert snapshot_offset(path) == p.log_end_offset
    loaded = ProducerStateManager()
    assert loaded.load(path) == p.log_end_offset
    assert loaded.producers == p.psm.producers
    assert list(loaded.producers) == list(p.psm.producers)  # recency order survives
    h = header(producer_id=1, seq=3)
    assert loaded.check(h) == p.psm.check(h) is not None
    assert not list(tmp_path.glob("*.tmp"))


def test_empty_snapshot_round_trip(tmp_path: Path) -> None:
    psm = ProducerStateManager()
    loaded = ProducerStateManager()
    loaded.load(psm.snapshot(tmp_path, 0))
    assert len(loaded) == 0


def test_every_torn_or_flipped_snapshot_is_detected(tmp_path: Path) -> None:
    p = busy_partition()
    data = p.psm.encode(p.log_end_offset)
    for cut in range(len(data)):
        with pytest.raises(CorruptSnapshotError):
            ProducerStateManager().decode(data[:cut])
    for i in range(len(data)):
        bad = bytearray(data)
        bad[i] ^= 0x10
        with pytest.raises(CorruptSnapshotError):
            ProducerStateManager().decode(bytes(bad))
    assert issubclass(CorruptSnapshotError, KafkaStorageError)


def resigned(data: bytes) -> bytes:
    """``data`` with its snapshot CRC recomputed: damage the checksum cannot see."""
    return data[:2] + struct.pack(">I", crc32c.crc32c(data[6:])) + data[6:]


@pytest.mark.parametrize(
    "damage",
    [
        lambda d: b"\x00\x03" + d[2:],  # a future version
        lambda d: d + b"\x00",  # trailing bytes
        lambda d: d[:14] + struct.pack(">i", -1) + d[18:],  # negative producer count
        lambda d: d[:14] + struct.pack(">i", 10**6) + d[18:],  # count past the cap
        lambda d: d[:6] + struct.pack(">q", 1) + d[14:],  # offset below its batches
        lambda d: d[:56] + b"\x06" + d[57:],  # more batches than are retained
        lambda d: d[:56] + b"\x00" + d[57:],  # fewer batches than the entry holds
        lambda d: d[:57] + d[89:121] + d[57:89] + d[121:],  # batches out of order
        lambda d: d[:48] + struct.pack(">q", 3) + d[56:],  # a marker past the snapshot
        lambda d: d[:36] + struct.pack(">q", 3) + d[44:],  # a transaction opened past it
    ],
)
def test_snapshot_that_passes_its_crc_but_makes_no_sense(
    damage: Callable[[bytes], bytes],
) -> None:
    p = Partition()
    for i in range(3):
        p.append(header(producer_id=1, seq=i))
    data = p.psm.encode(p.log_end_offset)
    assert ProducerStateManager().decode(resigned(data)) == 3
    with pytest.raises(CorruptSnapshotError):
        ProducerStateManager().decode(resigned(damage(data)))


def test_load_keeps_the_most_recent_producers_up_to_the_cap() -> None:
    p = Partition()
    for pid in range(5):
        p.append(header(producer_id=pid))
    small = ProducerStateManager(max_producers=2)
    small.decode(p.psm.encode(p.log_end_offset))
    assert list(small.producers) == [3, 4]


def test_load_rejects_a_renamed_snapshot_and_keeps_its_state(tmp_path: Path) -> None:
    p = busy_partition()
    path = p.psm.snapshot(tmp_path, p.log_end_offset)
    moved = snapshot_path(tmp_path, p.log_end_offset + 1)
    path.rename(moved)
    before = state(p.psm)
    with pytest.raises(CorruptSnapshotError):
        p.psm.load(moved)
    assert state(p.psm) == before


def test_latest_snapshot_and_pruning(tmp_path: Path) -> None:
    assert latest_snapshot(tmp_path / "missing", 100) is None
    p = busy_partition()
    leo = p.log_end_offset
    for offset in (leo, leo + 10, leo + 20):
        p.psm.snapshot(tmp_path, offset)
    assert SNAPSHOTS_RETAINED == 2
    assert list_snapshots(tmp_path) == [leo + 10, leo + 20]
    (tmp_path / "junk.snapshot").write_bytes(b"x")
    (tmp_path / "00000000000000000001.snapshot.tmp").write_bytes(b"x")
    assert latest_snapshot(tmp_path, leo + 25) == snapshot_path(tmp_path, leo + 20)
    assert latest_snapshot(tmp_path, leo + 19) == snapshot_path(tmp_path, leo + 10)
    assert latest_snapshot(tmp_path, leo + 9) is None
    # writing below existing snapshots (after a truncation) deletes the stale ones above
    p.psm.snapshot(tmp_path, leo + 5)
    assert list_snapshots(tmp_path) == [leo + 5]


def test_recover_falls_back_past_torn_and_stale_snapshots(tmp_path: Path) -> None:
    p = busy_partition()
    older_leo = p.log_end_offset
    p.psm.snapshot(tmp_path, older_leo)
    older_state = state(p.psm)
    p.append(header(producer_id=9))
    newest = p.psm.snapshot(tmp_path, p.log_end_offset)
    newest.write_bytes(newest.read_bytes()[:-7])  # torn
    snapshot_path(tmp_path, p.log_end_offset + 50).write_bytes(b"stale, beyond the log end")

    psm = ProducerStateManager()
    assert psm.recover(tmp_path, 0, p.log_end_offset) == older_leo
    assert state(psm) == older_state
    assert list_snapshots(tmp_path) == [older_leo]  # torn and stale ones are deleted
    # replay the tail through update, as the log will
    psm.update(header(producer_id=9), older_leo, p.now_ms)
    assert state(psm) == state(p.psm)


def test_recover_without_snapshots_and_past_the_log_start(tmp_path: Path) -> None:
    psm = ProducerStateManager()
    assert psm.recover(tmp_path / "missing", 3, 10) == 3 and len(psm) == 0
    p = busy_partition()
    leo = p.log_end_offset
    p.psm.snapshot(tmp_path, leo)
    assert psm.recover(tmp_path, 0, leo + 4) == leo and len(psm) == 3
    # segments below the new log start are gone: replay from there; producers below it go too
    assert psm.recover(tmp_path, leo - 1, leo + 4) == leo and sorted(psm.producers) == [3]
    assert psm.recover(tmp_path, leo + 2, leo + 4) == leo + 2 and len(psm) == 0


def test_snapshot_refuses_batches_at_or_past_its_offset(tmp_path: Path) -> None:
    p = busy_partition()
    with pytest.raises(AssertionError):
        p.psm.snapshot(tmp_path, p.log_end_offset - 1)


# ---------------------------------------------------------------------------------------------
# cross-check with kafka-python's idempotent producer batches
# ---------------------------------------------------------------------------------------------


def kafka_batch(producer_id: int, epoch: int, base_sequence: int, n: int) -> BatchHeader:
    builder = DefaultRecordBatchBuilder(
        magic=2,
        compression_type=0,
        is_transactional=0,
        producer_id=producer_id,
        producer_epoch=epoch,
        base_sequence=base_sequence,
        batch_size=1 << 20,
    )
    for i in range(n):
        assert builder.append(i, timestamp=NOW_MS + i, key=b"k", value=b"v%d" % i, headers=[])
    return parse_header(bytes(builder.build()))


def test_kafka_python_idempotent_batches() -> None:
    p = Partition()
    h = kafka_batch(4242, 1, MAX_SEQ - 1, 3)
    assert (h.producer_id, h.producer_epoch, h.base_sequence) == (4242, 1, MAX_SEQ - 1)
    assert h.last_sequence == 0  # wrapped
    assert p.append(h) == (0, 2)
    assert p.append(kafka_batch(4242, 1, MAX_SEQ - 1, 3)) == DuplicateOf(0, 2, NOW_MS + 2)
    assert p.append(kafka_batch(4242, 1, 1, 2)) == (3, 4)
    with pytest.raises(OutOfOrderSequenceError):
        p.append(kafka_batch(4242, 1, 5, 1))
    with pytest.raises(OutOfOrderSequenceError):
        p.append(kafka_batch(4242, 2, 4, 1))
    assert p.append(kafka_batch(4242, 2, 0, 1)) == (5, 5)
    with pytest.raises(InvalidProducerEpochError):
        p.append(kafka_batch(4242, 1, 4, 1))
    assert p.psm.check(kafka_batch(-1, -1, -1, 2)) is None
