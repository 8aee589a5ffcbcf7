"""Compaction of transactional data (core_log.cleaner with core_log.control/txn_index).

Targeted tests pin each rule — committed transactional records compact by key, aborted ones go
and shadow nothing, open transactions (at or past the LSO) are not touched, a tombstone after a
committed transactional record deletes it for good, markers go only after
``delete.retention.ms`` once their transaction has no data left, the aborted index follows its
markers — and a seeded model test drives several producers' transactions, plain batches,
cleaning passes, restarts and crashes, checking after every step that the ``read_committed`` and
``read_uncommitted`` views are those of a log that never held the removed records.
"""

from __future__ import annotations

import os
import random
import shutil
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from core_log.batch import Record, build_batch, decode_records, scan_batches
from core_log.cleaner import clean_log
from core_log.clock import ManualClock
from core_log.config import LogConfig
from core_log.handles import HandleCache
from core_log.isolation import committed_records
from core_log.log import PartitionLog
from core_log.producer_state import list_snapshots, snapshot_path

FAST_TMP = "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else None
NOW = 1_700_000_000_000
RETENTION = 10_000  # delete.retention.ms in these tests

View = list[tuple[int, bytes | None, bytes | None]]  # (offset, key, value)


@pytest.fixture
def tmp_path() -> Iterator[Path]:
    d = Path(tempfile.mkdtemp(prefix="logbus-txn-compaction-", dir=FAST_TMP))
    yield d
    shutil.rmtree(d, ignore_errors=True)


def config(**overrides: object) -> LogConfig:
    base: dict[str, object] = {
        "cleanup.policy": "compact",
        "delete.retention.ms": RETENTION,
        "min.cleanable.dirty.ratio": 0.0,
        "segment.bytes": 100,  # about one batch per segment
        "segment.ms": 1000,
        "index.interval.bytes": 100,
    }
    base.update(overrides)
    return LogConfig.from_dict(base)


def open_log(
    directory: Path, clock: ManualClock, cfg: LogConfig, clean: bool = True
) -> PartitionLog:
    log = PartitionLog(directory, cfg, clock, HandleCache(max_open=8), clean_shutdown=clean)
    log.set_high_watermark(log.log_end_offset)
    return log


class Producer:
    """A transactional producer of one partition: its id, epoch 0 and next sequence."""

    def __init__(self, log: PartitionLog, pid: int) -> None:
        self.log, self.pid, self.seq = log, pid, 0

    def send(self, *kvs: tuple[bytes, bytes | None]) -> int:
        ts = self.log.clock.now_ms()
        batch = build_batch(
            [Record(v, k, timestamp=ts) for k, v in kvs],
            producer_id=self.pid,
            producer_epoch=0,
            base_sequence=self.seq,
            is_transactional=True,
        )
        self.seq += len(kvs)
        base = self.log.append(batch, transactional=True).base_offset
        self.log.set_high_watermark(self.log.log_end_offset)
        return base

    def end(self, commit: bool) -> int:
        base = self.log.append_marker(self.pid, 0, commit, 0).base_offset
        self.log.set_high_watermark(self.log.log_end_offset)
        return base


def plain(log: PartitionLog, *kvs: tuple[bytes, bytes | None]) -> int:
    ts = log.clock.now_ms()
    base = log.append(build_batch([Record(v, k, timestamp=ts) for k, v in kvs])).base_offset
    log.set_high_watermark(log.log_end_offset)
    return base


def roll_everything(log: PartitionLog, clock: ManualClock) -> None:
    clock.advance(log.config.segment_ms)
    log.roll_if_expired()
    log.flush()
    log.set_high_watermark(log.log_end_offset)


def uncommitted_view(log: PartitionLog) -> View:
    out: View = []
    offset = log.log_start_offset
    while offset < log.high_watermark:
        r = log.read(offset, 1 << 20)
        if not r.data:
            break
        for pos, h in scan_batches(r.data):
            if not h.is_control:  # markers are never rendered as records
                out += [(x.offset, x.key, x.value) for x in decode_records(r.data, pos)]
        offset = r.next_offset
    return out


def committed_view(log: PartitionLog) -> View:
    out: View = []
    offset = log.log_start_offset
    while True:
        r = log.read_committed(offset, 1 << 20)
        if not r.data:
            return out
        out += [
            (x.offset, x.key, x.value)
            for x in committed_records(r.data, r.aborted_transactions)
            if x.offset >= offset
        ]
        offset = r.next_offset


def batches(log: PartitionLog) -> list[tuple[int, int, bool, int]]:
    """(base offset, producer id, control, record count) of every batch below the HW."""
    out = []
    offset = log.log_start_offset
    while offset < log.high_watermark:
        r = log.read(offset, 1 << 20)
        if not r.data:
            break
        out += [
            (h.base_offset, h.producer_id, h.is_control, h.record_count)
            for _, h in scan_batches(r.data)
        ]
        offset = r.next_offset
    return out


def markers(log: PartitionLog) -> list[int]:
    return [b for b, _, control, _ in batches(log) if control]


def index_entries(log: PartitionLog) -> list[int]:
    return [e.last_offset for s in log.segments for e in s.txn_index.entries]


# -- targeted rules -----------------------------------------------------------------------------


def test_committed_transactional_records_compact_by_key(tmp_path: Path) -> None:
    clock = ManualClock(NOW)
    log = open_log(tmp_path, clock, config())
    p = Producer(log, 1)
    p.send((b"k", b"t1"), (b"j", b"j1"))
    p.end(commit=True)
    plain(log, (b"k", b"p2"))  # a plain record supersedes a committed transactional one
    p.send((b"j", b"t3"))  # and a committed transactional one supersedes a record
    last_marker = p.end(commit=True)
    plain(log, (b"x", b"tail"))
    roll_everything(log, clock)
    result = log.clean()
    assert result is not None and result.swapped and result.records_removed == 2
    want = [(3, b"k", b"p2"), (4, b"j", b"t3"), (6, b"x", b"tail")]
    assert uncommitted_view(log) == committed_view(log) == want
    # Marker 2's transaction has no data left: stamped now, gone after delete.retention.ms;
    # marker 5 (the producer's last batch, and it ends a transaction with data) stays.
    assert markers(log) == [2, last_marker]
    clock.advance(RETENTION)
    log.clean()
    assert markers(log) == [last_marker]
    assert uncommitted_view(log) == committed_view(log) == want
    log.close()
    reopened = open_log(tmp_path, clock, config(), clean=False)
    assert uncommitted_view(reopened) == committed_view(reopened) == want
    assert reopened.last_stable_offset == reopened.high_watermark
    reopened.close()


def test_aborted_records_disappear_and_shadow_nothing(tmp_path: Path) -> None:
    clock = ManualClock(NOW)
    log = open_log(tmp_path, clock, config())
    p, q = Producer(log, 1), Producer(log, 2)
    plain(log, (b"k", b"committed"))
    p.send((b"k", b"aborted"), (b"a", b"aborted"))  # 1..2
    p.send((b"k", None))  # 3: an aborted tombstone deletes nothing
    abort = p.end(commit=False)  # 4
    q.send((b"b", b"q"))  # 5
    q.end(commit=True)  # 6 (q's last batch)
    p.send((b"c", b"p"))  # 7: p's last data batch
    p.end(commit=True)  # 8: p's last batch
    roll_everything(log, clock)
    before = committed_view(log)
    assert index_entries(log) == [abort]
    log.clean()
    assert (
        committed_view(log) == before == [(0, b"k", b"committed"), (5, b"b", b"q"), (7, b"c", b"p")]
    )
    assert uncommitted_view(log) == before, "no aborted record is left to read_uncommitted"
    # The ABORT marker and its index entry stay until delete.retention.ms after the data went.
    assert abort in markers(log) and index_entries(log) == [abort]
    clock.advance(RETENTION)
    log.clean()
    assert abort not in markers(log) and index_entries(log) == []
    assert uncommitted_view(log) == committed_view(log) == before
    for clean in (True, False):
        log.close()
        log = open_log(tmp_path, clock, config(), clean=clean)
        assert uncommitted_view(log) == committed_view(log) == before
        assert log.last_stable_offset == log.high_watermark
        assert index_entries(log) == []
    # The producers' sequences survived: both continue where they were.
    p2 = Producer(log, 1)
    p2.seq = p.seq
    p2.send((b"d", b"more"))
    p2.end(commit=True)
    log.close()


def test_open_transactions_are_not_touched(tmp_path: Path) -> None:
    clock = ManualClock(NOW)
    log = open_log(tmp_path, clock, config())
    p, q = Producer(log, 1), Producer(log, 2)
    plain(log, (b"k", b"old"))  # 0
    q.send((b"j", b"q-aborted"))  # 1
    q.end(commit=False)  # 2
    first_open = p.send((b"k", b"open"))  # 3: stays open
    plain(log, (b"k", b"after"), (b"j", b"j-new"))  # 4..5
    q.send((b"k", b"q2"))  # 6
    q.end(commit=False)  # 7
    roll_everything(log, clock)
    assert log.last_stable_offset == first_open
    before = uncommitted_view(log)
    log.clean()
    log.clean(clock.now_ms() + RETENTION)
    got = uncommitted_view(log)
    # Below the LSO: q's first aborted batch went; "k" = "old" has no later value below it.
    assert [r for r in got if r[0] < first_open] == [(0, b"k", b"old")]
    assert [r for r in got if r[0] >= first_open] == [r for r in before if r[0] >= first_open]
    # Marker 2 went with its horizon (its data is gone); marker 7 is above the LSO.
    assert 7 in markers(log) and 2 not in markers(log)
    # Once committed (and the LSO moved), the records compact like any others — but "k" =
    # "open" stays while the later "k" = "after" (4) precedes its marker (8): a reader that
    # applies a transaction at its marker (the group coordinator) then gets the same from the
    # compacted log as from the whole one. A record after the marker removes it.
    p.end(commit=True)  # 8
    plain(log, (b"z", b"z"))  # 9
    roll_everything(log, clock)
    log.clean()
    assert committed_view(log) == [
        (3, b"k", b"open"),
        (4, b"k", b"after"),
        (5, b"j", b"j-new"),
        (9, b"z", b"z"),
    ]
    assert uncommitted_view(log) == committed_view(log)
    plain(log, (b"k", b"last"))  # 10
    roll_everything(log, clock)
    log.clean()
    assert committed_view(log) == [(5, b"j", b"j-new"), (9, b"z", b"z"), (10, b"k", b"last")]
    assert uncommitted_view(log) == committed_view(log)
    log.close()


def test_a_tombstone_after_a_committed_transactional_record_deletes_it_for_good(
    tmp_path: Path,
) -> None:
    clock = ManualClock(NOW)
    log = open_log(tmp_path, clock, config())
    p = Producer(log, 1)
    p.send((b"offset", b"100"))
    p.end(commit=True)
    plain(log, (b"offset", None))
    plain(log, (b"other", b"x"))
    roll_everything(log, clock)
    log.clean()  # the transactional record goes; the tombstone gets its horizon
    assert uncommitted_view(log) == [(2, b"offset", None), (3, b"other", b"x")]
    clock.advance(RETENTION)
    log.clean()  # the tombstone and the marker go
    want = [(3, b"other", b"x")]
    assert uncommitted_view(log) == committed_view(log) == want
    assert markers(log) == [1]  # producer 1's last batch: kept (its epoch, its sequences)
    for clean in (True, False):
        log.close()
        log = open_log(tmp_path, clock, config(), clean=clean)
        assert uncommitted_view(log) == committed_view(log) == want
    log.close()


def test_a_marker_stays_while_a_producer_snapshot_lies_inside_its_transaction(
    tmp_path: Path,
) -> None:
    """Recovery replays from a snapshot: one taken while the transaction was open needs the
    marker to close it, else the LSO would stay stuck after a restart."""
    clock = ManualClock(NOW)
    log = open_log(tmp_path, clock, config())
    p = Producer(log, 1)
    plain(log, (b"k", b"0"))  # 0
    p.send((b"k", b"aborted"))  # 1
    clock.advance(log.config.segment_ms)
    log.roll_if_expired()  # a snapshot at 2, with producer 1's transaction open in it
    snapshot = snapshot_path(tmp_path, 2)
    saved = snapshot.read_bytes()
    p.end(commit=False)  # 2
    p.send((b"y", b"y"))  # 3: marker 2 is not producer 1's last batch
    p.end(commit=True)  # 4
    roll_everything(log, clock)
    snapshot.write_bytes(saved)  # rolls keep the newest two only: bring it back
    log.clean()
    log.clean(clock.now_ms() + RETENTION)
    assert 1 not in [b for b, *_ in batches(log)], "the aborted data went"
    assert 2 in markers(log), "kept: a snapshot lies inside its transaction"
    # Without that snapshot (the usual case: only the newest two are kept) the next pass
    # (new dirty data) stamps it and it goes after delete.retention.ms.
    snapshot.unlink()
    plain(log, (b"w", b"w"))  # 5
    roll_everything(log, clock)
    log.clean()
    assert 2 in markers(log)
    log.clean(clock.now_ms() + RETENTION)
    assert 2 not in markers(log)
    want = [(0, b"k", b"0"), (3, b"y", b"y"), (5, b"w", b"w")]
    assert committed_view(log) == uncommitted_view(log) == want
    log.close()
    reopened = open_log(tmp_path, clock, config(), clean=False)
    assert reopened.last_stable_offset == reopened.high_watermark
    reopened.close()


# -- seeded model workload ----------------------------------------------------------------------


@dataclass
class Model:
    """Every record ever appended (offset -> key, value), and per record whether its
    transaction committed (None: plain or still open)."""

    records: dict[int, tuple[bytes | None, bytes | None]] = field(default_factory=dict)
    aborted: set[int] = field(default_factory=set)
    open_: dict[int, list[int]] = field(default_factory=dict)  # pid -> offsets of its open txn
    marker_of: dict[int, int] = field(default_factory=dict)  # committed txn record -> marker

    def end(self, pid: int, commit: bool, marker: int) -> None:
        ended = self.open_.pop(pid, [])
        if commit:
            self.marker_of.update((o, marker) for o in ended)
        else:
            self.aborted.update(ended)

    def committed(self, lso: int) -> View:
        """What read_committed would return from a log never compacted: no aborted record,
        nothing at or past the LSO."""
        return [
            (o, k, v)
            for o, (k, v) in sorted(self.records.items())
            if o not in self.aborted and o < lso
        ]


def check(log: PartitionLog, model: Model) -> None:
    lso = log.last_stable_offset
    unc = uncommitted_view(log)
    com = committed_view(log)
    ever = model.committed(lso)
    ever_set = set(ever)
    # Everything read is what was written there; read_committed = read_uncommitted minus
    # aborted and open data: both are what a log without the removed records gives.
    for o, k, v in unc:
        assert model.records[o] == (k, v)
    assert com == [r for r in unc if r[0] < lso and r[0] not in model.aborted]
    assert set(com) <= ever_set
    # The latest committed value of every key below the LSO is always there (unless a
    # tombstone); every record at or past the LSO too.
    latest: dict[bytes, tuple[int, bytes | None, bytes | None]] = {}
    for r in ever:
        if r[1] is not None:
            latest[r[1]] = r
    for r in latest.values():
        if r[2] is not None:
            assert r in com, f"latest committed {r} lost"
    assert [r for r in unc if r[0] >= lso] == [
        (o, k, v) for o, (k, v) in sorted(model.records.items()) if lso <= o < log.high_watermark
    ]
    # A data batch of a transaction keeps its marker; an index entry its ABORT marker.
    present = batches(log)
    marker_offsets = {b for b, _, control, _ in present if control}
    assert set(index_entries(log)) <= marker_offsets


@pytest.mark.parametrize("seed", range(12))
def test_model_random_transactional_workload(tmp_path: Path, seed: int) -> None:
    model_workload(tmp_path, seed)


@pytest.mark.slow
@pytest.mark.parametrize("seed", range(12, 100))
def test_model_random_transactional_workload_long(tmp_path: Path, seed: int) -> None:
    model_workload(tmp_path, seed)


def model_workload(tmp_path: Path, seed: int) -> None:
    rng = random.Random(seed)
    clock = ManualClock(NOW)
    cfg = config(**{"segment.bytes": rng.choice([100, 250, 600])})
    log = open_log(tmp_path, clock, cfg)
    model = Model()
    producers = {pid: Producer(log, pid) for pid in (1, 2, 3)}
    keys = rng.choice([3, 8])

    def kvs() -> list[tuple[bytes, bytes | None]]:
        return [
            (f"k{rng.randrange(keys)}".encode(), None if rng.random() < 0.15 else rng.randbytes(4))
            for _ in range(rng.randint(1, 3))
        ]

    for _ in range(120):
        op = rng.random()
        if op < 0.25:
            records = kvs()
            base = plain(log, *records)
            for i, r in enumerate(records):
                model.records[base + i] = r
        elif op < 0.55:
            p = producers[rng.choice([1, 2, 3])]
            records = kvs()
            base = p.send(*records)
            for i, r in enumerate(records):
                model.records[base + i] = r
                model.open_.setdefault(p.pid, []).append(base + i)
        elif op < 0.7:
            p = producers[rng.choice([1, 2, 3])]
            commit = rng.random() < 0.6
            model.end(p.pid, commit, p.end(commit))
        elif op < 0.78:
            clock.advance(rng.choice([10, RETENTION // 2, RETENTION + 1, cfg.segment_ms]))
            log.roll_if_expired()
        elif op < 0.93:
            log.flush()
            log.clean(max_keys=rng.choice([1, 3, 1000]))
        else:
            clean = rng.random() < 0.5
            if clean:
                log.close()
            else:
                log.flush()
                log.abandon()
            log = open_log(tmp_path, clock, cfg, clean=clean)
            for p in producers.values():
                p.log = log
        check(log, model)
    # Commit or abort what is open, then clean everything twice, past delete.retention.ms.
    for pid in list(model.open_):
        commit = rng.random() < 0.5
        model.end(pid, commit, producers[pid].end(commit))
    roll_everything(log, clock)
    log.clean()
    check(log, model)
    clock.advance(RETENTION)
    log.clean()
    check(log, model)
    assert log.last_stable_offset == log.high_watermark
    # Now the log is "latest committed value per key, tombstones and aborted data gone" — and a
    # committed transactional record whose key's latest record came before its marker.
    latest: dict[bytes | None, int] = {}
    for rec in model.committed(log.high_watermark):
        latest[rec[1]] = rec[0]
    want = [
        rec
        for rec in model.committed(log.high_watermark)
        if rec[2] is not None
        and (latest[rec[1]] == rec[0] or latest[rec[1]] <= model.marker_of.get(rec[0], -1))
    ]
    assert uncommitted_view(log) == committed_view(log) == want
    # A marker whose data (a tombstone) went in that pass goes delete.retention.ms later. Then
    # every marker left is its producer's last batch, ends a transaction with a batch left, or
    # has a producer snapshot inside its transaction.
    clock.advance(RETENTION)
    log.clean()
    assert uncommitted_view(log) == committed_view(log) == want
    stored = batches(log)
    snapshots = list_snapshots(tmp_path)
    last_of = {pid: b for b, pid, _, _ in stored if pid >= 0}
    previous: dict[int, int] = {}
    txn_batch: set[int] = set()
    for b, pid, control, _ in stored:
        if pid < 0:
            continue
        if not control:
            txn_batch.add(pid)
            continue
        earlier = previous.get(pid, -1)
        assert last_of[pid] == b or pid in txn_batch or any(earlier < o <= b for o in snapshots), (
            f"marker {b} of producer {pid} should have gone"
        )
        previous[pid] = b
        txn_batch.discard(pid)
    log.close()
    reopened = open_log(tmp_path, clock, cfg, clean=False)
    assert uncommitted_view(reopened) == committed_view(reopened) == want
    assert reopened.last_stable_offset == reopened.high_watermark
    reopened.close()


class Crash(BaseException):
    """A simulated process crash: nothing after the hook runs, no cleanup."""


@pytest.mark.parametrize("clean_shutdown", [True, False])
@pytest.mark.parametrize("stage", ["cleaned", "swap", "mid-swap"])
def test_crash_while_markers_and_index_entries_go(
    tmp_path: Path, stage: str, clean_shutdown: bool
) -> None:
    """The pass that removes ABORT markers (and empties a segment's ``.txnindex``) crashes at
    each step of the swap: after a restart the log is either the one before or the one after,
    its index entries exactly those of its ABORT markers, its LSO at the high watermark."""
    clock = ManualClock(NOW)
    cfg = config(**{"segment.bytes": 400})
    log = open_log(tmp_path, clock, cfg)
    p, q = Producer(log, 1), Producer(log, 2)
    for i in range(6):
        plain(log, (b"k%d" % i, b"v"))
        p.send((b"k%d" % i, b"aborted"))
        last_abort = p.end(commit=False)
        q.send((b"j%d" % i, b"committed"))
        q.end(commit=True)
    roll_everything(log, clock)
    log.clean()  # the aborted data goes; the markers get their horizon
    want = committed_view(log)
    with_markers = markers(log)
    entries = index_entries(log)
    assert len(entries) == 6
    log.write_checkpoint()  # the recovery point at the end, as a running broker has it
    clock.advance(RETENTION)

    def hook(at: str) -> None:
        if at == stage:
            raise Crash(at)

    with pytest.raises(Crash):
        clean_log(log, hook=hook)
    reopened = open_log(tmp_path, clock, cfg, clean=clean_shutdown)
    assert not [f for f in tmp_path.iterdir() if f.suffix in (".cleaned", ".swap")]
    assert uncommitted_view(reopened) == committed_view(reopened) == want
    left = markers(reopened)
    if stage == "cleaned":
        assert left == with_markers  # rolled back
    else:
        assert len(left) < len(with_markers)  # committed
    assert set(index_entries(reopened)) == set(entries) & set(left)
    assert reopened.last_stable_offset == reopened.high_watermark
    reopened.clean()  # the next pass completes the work
    assert uncommitted_view(reopened) == committed_view(reopened) == want
    # Producer 1's last batch stays (and its last data batch, emptied): so do that marker and
    # its entry.
    assert index_entries(reopened) == [last_abort]
    reopened.close()
