"""Transactions in the storage layer: markers, producer state, the LSO, the aborted index, and
``read_committed`` reads (core_log.log, core_log.producer_state, core_log.txn_index,
core_log.isolation).

Targeted tests pin each rule; a seeded model test then drives several producers' transactional
batches, commits and aborts (with and without KIP-890 epoch bumps), non-transactional batches,
flushes, clean restarts and crashes on a log with tiny segments, and after every step compares
the ``read_committed`` view with a model (committed data in offset order, nothing at or past
the model's LSO) and, after each restart, the recovered transaction state with that of a fresh
log built from the same appends.
"""

from __future__ import annotations

import asyncio
import random
import struct
from dataclasses import dataclass, field
from pathlib import Path

import crc32c
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from core_log.batch import BatchHeader, Record, build_batch, scan_batches
from core_log.clock import ManualClock
from core_log.config import LogConfig
from core_log.control import parse_control_batch
from core_log.errors import InvalidRecordError
from core_log.handles import HandleCache
from core_log.index import IndexCorrupt
from core_log.isolation import committed_batches, committed_bytes, committed_records
from core_log.log import CommittedReadResult, PartitionLog
from core_log.manager import LogManager
from core_log.producer_state import (
    BATCH_ENTRY,
    PRODUCER_ENTRY_V1,
    InvalidProducerEpochError,
    InvalidTxnStateError,
    OutOfOrderSequenceError,
    ProducerStateManager,
    TransactionCoordinatorFencedError,
)
from core_log.txn_index import AbortedTxn, TransactionIndex

T0 = 1_700_000_000_000
SMALL = LogConfig(segment_bytes=600, index_interval_bytes=128)


def open_log(directory: Path, config: LogConfig = SMALL, *, clean: bool = False) -> PartitionLog:
    log = PartitionLog(directory, config, ManualClock(T0), HandleCache(), clean_shutdown=clean)
    log.set_high_watermark(log.log_end_offset)  # as a standalone broker does at start
    return log


def txn(pid: int, seq: int, *values: bytes, epoch: int = 0) -> bytes:
    return build_batch(
        [Record(v, timestamp=T0) for v in values],
        producer_id=pid,
        producer_epoch=epoch,
        base_sequence=seq,
        is_transactional=True,
    )


def plain(*values: bytes) -> bytes:
    return build_batch([Record(v, timestamp=T0) for v in values])


def append(log: PartitionLog, data: bytes, **kwargs: bool) -> int:
    r = log.append(data, **kwargs)
    log.set_high_watermark(log.log_end_offset)
    return r.base_offset


def end(log: PartitionLog, pid: int, commit: bool, epoch: int = 0, coordinator: int = 0) -> int:
    r = log.append_marker(pid, epoch, commit, coordinator)
    log.set_high_watermark(log.log_end_offset)
    return r.base_offset


def committed_view(log: PartitionLog, max_bytes: int = 1 << 20) -> list[tuple[int, bytes | None]]:
    """(offset, value) of every record a read_committed reader gets, reading from the log
    start until no data comes back; checks that nothing at or past the LSO is returned."""
    out: list[tuple[int, bytes | None]] = []
    offset = log.log_start_offset
    while True:
        r = log.read_committed(offset, max_bytes)
        if not r.data:
            assert offset >= min(r.last_stable_offset, r.log_end_offset) or offset == r.next_offset
            return out
        for _, h in scan_batches(r.data):
            assert h.last_offset < r.last_stable_offset, "data at or past the LSO"
        out += [(x.offset, x.value) for x in committed_records(r.data, r.aborted_transactions)]
        offset = r.next_offset


def txn_state(log: PartitionLog) -> tuple[object, ...]:
    """What recovery must rebuild: LSO, open transactions, every segment's aborted index."""
    return (
        log.last_stable_offset,
        log.producers.ongoing,
        {p: (e.epoch, e.coordinator_epoch) for p, e in log.producers.producers.items()},
        [(s.base_offset, s.txn_index.entries) for s in log.segments],
    )


# -- producer state and appends ----------------------------------------------------------------


def test_default_append_still_refuses_transactional_batches(tmp_path: Path) -> None:
    log = open_log(tmp_path / "p")
    append(log, plain(b"x"))
    with pytest.raises(InvalidRecordError, match="transactions are not supported yet"):
        log.append(txn(1, 0, b"a"))
    assert log.try_append(txn(1, 0, b"a"), transactional=True) is not None  # on the loop
    assert log.try_append_marker(1, 0, True, 0) is not None
    assert log.log_end_offset == 3


def test_marker_ends_the_open_transaction_and_an_abort_is_indexed(tmp_path: Path) -> None:
    log = open_log(tmp_path / "p")
    append(log, plain(b"x"))  # 0
    append(log, txn(7, 0, b"a", b"b"), transactional=True)  # 1-2
    assert log.producers.ongoing == {7: 1}
    assert log.last_stable_offset == 1
    append(log, plain(b"y"))  # 3: not part of it
    marker = end(log, 7, commit=False, epoch=0, coordinator=3)  # 4
    assert marker == 4 and log.producers.ongoing == {}
    assert log.last_stable_offset == log.high_watermark == 5
    (segment,) = log.segments
    assert segment.txn_index.entries == [AbortedTxn(7, 1, 4, 5)]
    assert committed_view(log) == [(0, b"x"), (3, b"y")]
    r = log.read(0, 1 << 20)  # read_uncommitted: everything, markers included
    assert [h.base_offset for _, h in scan_batches(r.data)] == [0, 1, 3, 4]
    stored = parse_control_batch(r.data, [p for p, h in scan_batches(r.data)][-1])
    assert stored is not None and not stored.commit and stored.offset == 4
    assert stored.coordinator_epoch == 3


def test_marker_without_an_open_transaction_ends_nothing(tmp_path: Path) -> None:
    log = open_log(tmp_path / "p")
    append(log, plain(b"x"))
    assert end(log, 9, commit=False) == 1  # appended, takes its offset
    assert log.last_stable_offset == 2 and log.segments[0].txn_index.entries == []
    assert committed_view(log) == [(0, b"x")]
    assert log.producers.ongoing == {}


def test_open_transaction_accepts_only_its_own_transactional_batches(tmp_path: Path) -> None:
    log = open_log(tmp_path / "p")
    append(log, txn(1, 0, b"a"), transactional=True)
    idempotent = build_batch([Record(b"i")], producer_id=1, producer_epoch=0, base_sequence=1)
    with pytest.raises(InvalidTxnStateError):
        log.append(idempotent)
    with pytest.raises(InvalidTxnStateError):  # a new epoch cannot join or skip it either
        log.append(txn(1, 0, b"b", epoch=1), transactional=True)
    append(log, txn(1, 1, b"b"), transactional=True)
    dup = log.append(txn(1, 1, b"b"), transactional=True)  # a retry: same offsets, nothing new
    assert dup.duplicate and dup.base_offset == 1
    assert log.producers.ongoing == {1: 0}


def test_epochs_fence_markers_and_kip890_bumps_fence_late_writes(tmp_path: Path) -> None:
    log = open_log(tmp_path / "p")
    append(log, txn(1, 0, b"a", epoch=5), transactional=True)
    with pytest.raises(InvalidProducerEpochError):
        log.append_marker(1, 4, True, 0)
    end(log, 1, commit=True, epoch=5, coordinator=2)
    with pytest.raises(TransactionCoordinatorFencedError):
        log.append_marker(1, 5, True, 1)
    # KIP-890: the coordinator bumps the epoch at every end; the marker carries the new one.
    append(log, txn(1, 1, b"b", epoch=5), transactional=True)
    end(log, 1, commit=False, epoch=6, coordinator=2)
    with pytest.raises(InvalidProducerEpochError):  # a delayed write of the old transaction
        log.append(txn(1, 2, b"late", epoch=5), transactional=True)
    with pytest.raises(OutOfOrderSequenceError):  # the new epoch starts at sequence 0
        log.append(txn(1, 2, b"c", epoch=6), transactional=True)
    append(log, txn(1, 0, b"c", epoch=6), transactional=True)
    end(log, 1, commit=True, epoch=7, coordinator=2)
    assert committed_view(log) == [(0, b"a"), (4, b"c")]


def test_lso_moves_only_when_the_earliest_open_transaction_ends(tmp_path: Path) -> None:
    log = open_log(tmp_path / "p")
    append(log, txn(1, 0, b"a1"), transactional=True)  # 0
    append(log, plain(b"p"))  # 1
    append(log, txn(2, 0, b"b1"), transactional=True)  # 2
    append(log, txn(1, 1, b"a2"), transactional=True)  # 3
    assert log.last_stable_offset == 0
    assert committed_view(log) == []
    end(log, 2, commit=True)  # 4: a later transaction ends, the LSO stays
    assert log.last_stable_offset == 0
    append(log, txn(3, 0, b"c1"), transactional=True)  # 5
    end(log, 1, commit=False)  # 6: the earliest ends; the next open one is producer 3's
    assert log.last_stable_offset == 5
    assert committed_view(log) == [(1, b"p"), (2, b"b1")]
    end(log, 3, commit=True)  # 7
    assert log.last_stable_offset == log.high_watermark == 8
    assert committed_view(log) == [(1, b"p"), (2, b"b1"), (5, b"c1")]
    (segment,) = log.segments
    assert segment.txn_index.entries == [AbortedTxn(1, 0, 6, 5)]  # LSO field: producer 3


def test_a_marker_is_stable_only_once_the_high_watermark_passes_it(tmp_path: Path) -> None:
    log = open_log(tmp_path / "p")
    log.append(plain(b"x"))
    log.append(txn(1, 0, b"a"), transactional=True)
    log.set_high_watermark(2)
    assert log.last_stable_offset == 1
    log.append_marker(1, 0, True, 0)  # at 2: replicated nowhere yet
    assert log.last_stable_offset == 1  # Kafka: not decided for readers until replicated
    log.set_high_watermark(3)
    assert log.last_stable_offset == 3
    assert committed_view(log) == [(0, b"x"), (1, b"a")]


def test_read_committed_with_small_reads_returns_committed_data_exactly_once(
    tmp_path: Path,
) -> None:
    log = open_log(tmp_path / "p")
    expected = []
    for i in range(30):
        pid = i % 3
        offset = append(log, txn(pid, i // 3, b"t%d" % i), transactional=True)
        if (i // 3 + pid) % 2 == 0:  # its transaction commits below
            expected.append((offset, b"t%d" % i))
        if i % 3 == 2:
            for p in range(3):
                end(log, p, commit=(i // 3 + p) % 2 == 0)
        if i % 5 == 0:
            expected.append((append(log, plain(b"p%d" % i)), b"p%d" % i))
    assert len(log.segments) > 3
    for max_bytes in (1, 100, 300, 1 << 20):
        assert committed_view(log, max_bytes) == sorted(expected)


def test_isolation_helpers_keep_committed_batches_without_copying(tmp_path: Path) -> None:
    log = open_log(tmp_path / "p")
    append(log, plain(b"x"))
    r = log.read_committed(0, 1 << 20)
    assert committed_bytes(r.data, r.aborted_transactions) is r.data
    append(log, txn(4, 0, b"a"), transactional=True)
    end(log, 4, commit=False)
    append(log, txn(4, 1, b"b"), transactional=True)
    end(log, 4, commit=True)
    r = log.read_committed(0, 1 << 20)
    assert [a.producer_id for a in r.aborted_transactions] == [4]
    kept = committed_bytes(r.data, r.aborted_transactions)
    assert [h.base_offset for _, h in scan_batches(kept)] == [0, 3]
    assert [h.base_offset for _, h in committed_batches(r.data, ())] == [0, 1, 3]


# -- restart, recovery, retention, compaction --------------------------------------------------


def build_history(log: PartitionLog, *, stop_open: bool) -> None:
    for i in range(12):
        append(log, txn(1, i, b"a%d" % i), transactional=True)
        append(log, plain(b"p%d" % i))
        if i % 4 == 3:
            end(log, 1, commit=i % 8 != 3)
        if i % 3 == 0:
            append(log, txn(2, i // 3, b"b%d" % i), transactional=True)
    end(log, 2, commit=False)
    append(log, txn(1, 12, b"open"), transactional=True)
    if not stop_open:
        end(log, 1, commit=False)


@pytest.mark.parametrize("stop_open", [True, False], ids=["mid-transaction", "after-abort"])
@pytest.mark.parametrize("how", ["clean", "crash", "crash-after-flush", "no-index-file"])
def test_restart_rebuilds_transaction_state_identically(
    tmp_path: Path, stop_open: bool, how: str
) -> None:
    fresh = open_log(tmp_path / "fresh")
    build_history(fresh, stop_open=stop_open)
    log = open_log(tmp_path / "p")
    build_history(log, stop_open=stop_open)
    assert len(log.segments) > 3 and any(s.txn_index.entries for s in log.segments[:-1])
    expected_state, expected_view = txn_state(fresh), committed_view(fresh)
    if stop_open:
        assert log.producers.ongoing
    if how == "clean":
        log.close()
    else:
        if how == "crash-after-flush":
            log.flush()
            log.write_checkpoint()
        log.abandon()
    if how == "no-index-file":
        for p in (tmp_path / "p").glob("*.txnindex"):
            p.write_bytes(p.read_bytes()[:-3])  # torn: fails its check, rebuilt from the log
    reopened = open_log(tmp_path / "p", clean=how in ("clean", "no-index-file"))
    assert txn_state(reopened) == expected_state
    assert committed_view(reopened) == expected_view
    # ... and it goes on as the fresh log does
    for target in (fresh, reopened):
        end(target, 1, commit=True)
        append(target, txn(3, 0, b"z"), transactional=True)
    assert txn_state(reopened) == txn_state(fresh)
    assert committed_view(reopened) == committed_view(fresh)


def test_follower_truncation_reopens_a_transaction_and_drops_its_index_entry(
    tmp_path: Path,
) -> None:
    log = open_log(tmp_path / "p", LogConfig())
    append(log, txn(1, 0, b"a"), transactional=True)
    append(log, plain(b"x"))
    marker = end(log, 1, commit=False)
    assert log.segments[0].txn_index.entries
    log.truncate_to(marker)
    assert log.segments[0].txn_index.entries == []
    assert log.producers.ongoing == {1: 0} and log.last_stable_offset == 0


def test_follower_appends_rebuild_the_same_state(tmp_path: Path) -> None:
    leader = open_log(tmp_path / "leader")
    build_history(leader, stop_open=True)
    follower = open_log(tmp_path / "follower")
    offset = 0
    while offset < leader.log_end_offset:
        r = leader.read(offset, 700, max_offset=leader.log_end_offset)
        follower.append(r.data, as_follower=True)
        offset = r.next_offset
    follower.set_high_watermark(follower.log_end_offset)
    assert txn_state(follower)[1:] == txn_state(leader)[1:]
    assert [s.txn_index.entries for s in follower.segments if s.txn_index.entries] == [
        s.txn_index.entries for s in leader.segments if s.txn_index.entries
    ]
    assert committed_view(follower) == committed_view(leader)


def test_retention_deletes_the_index_with_its_segment(tmp_path: Path) -> None:
    config = LogConfig(segment_bytes=600, index_interval_bytes=128, retention_bytes=1)
    log = open_log(tmp_path / "p", config)
    build_history(log, stop_open=False)
    indexed = [s.base_offset for s in log.segments[:-1] if s.txn_index.entries]
    log.flush()
    files = {int(p.stem) for p in (tmp_path / "p").glob("*.txnindex")}
    assert indexed and set(indexed) <= files
    before = committed_view(log)
    result = log.apply_retention()
    assert result.deleted_segments > 0
    left = {s.base_offset for s in log.segments}
    assert {int(p.stem) for p in (tmp_path / "p").glob("*.txnindex")} <= left
    assert not set(indexed) & left  # every indexed segment went, and its index file with it
    assert committed_view(log) == [(o, v) for o, v in before if o >= log.log_start_offset]


def test_compaction_drops_aborted_data_keeps_its_markers_and_it_shadows_nothing(
    tmp_path: Path,
) -> None:
    config = LogConfig(segment_bytes=600, index_interval_bytes=128, cleanup_policy="compact")
    log = open_log(tmp_path / "p", config)

    def keyed(key: bytes, value: bytes, pid: int = -1, seq: int = -1) -> bytes:
        return build_batch(
            [Record(value, key, timestamp=T0)],
            producer_id=pid,
            producer_epoch=0 if pid >= 0 else -1,
            base_sequence=seq,
            is_transactional=pid >= 0,
        )

    for round_ in range(6):
        append(log, keyed(b"k", b"committed-%d" % round_))
        append(log, keyed(b"k", b"aborted-%d" % round_, pid=1, seq=round_), transactional=True)
        end(log, 1, commit=False)
        append(log, keyed(b"j", b"j-%d" % round_))
    log.roll_if_expired()
    log.clock.advance(1)  # type: ignore[attr-defined]
    log.flush()
    before_view = committed_view(log)
    before_index = [(s.base_offset, s.txn_index.entries) for s in log.segments]
    result = log.clean(T0 + 10)
    assert result is not None and result.swapped and result.records_removed > 0
    # The aborted batches went (see tests/core_log/test_compaction_txn.py for the rest); their
    # markers and index entries stay until delete.retention.ms after that.
    active = log.segments[-1].base_offset  # never cleaned
    assert all(
        h.base_offset >= active
        for h in stored_headers(log)
        if h.is_transactional and not h.is_control
    )
    after = committed_view(log)
    assert [v for _, v in after if v and v.startswith(b"committed")][-1] == b"committed-5"
    assert set(after) <= set(before_view)
    assert [(s.base_offset, s.txn_index.entries) for s in log.segments] == before_index
    reopened_dir = tmp_path / "p"
    log.close()
    reopened = open_log(reopened_dir, config, clean=True)
    assert [(s.base_offset, s.txn_index.entries) for s in reopened.segments] == before_index
    assert committed_view(reopened) == after


def stored_headers(log: PartitionLog) -> list[BatchHeader]:
    return [h for s in log.segments for _, h in s.batch_positions(s.base_offset)]


def test_txn_index_file_round_trip_and_checks(tmp_path: Path) -> None:
    path = tmp_path / "00000000000000000010.txnindex"
    index = TransactionIndex(path, 10)
    index.flush()
    assert not path.exists()  # no entry, no file
    entries = [AbortedTxn(1, 3, 10, 11), AbortedTxn(2, 5, 14, 12)]
    for e in entries:
        index.append(e)
    index.flush()
    again = TransactionIndex(path, 10)
    again.load(next_offset=20)
    assert again.entries == entries
    with pytest.raises(IndexCorrupt):
        again.load(next_offset=14)  # an entry past the segment's end
    path.write_bytes(path.read_bytes()[:40])
    with pytest.raises(IndexCorrupt):
        again.load(next_offset=20)
    found: list[AbortedTxn] = []
    assert index.collect(0, 11, found) and found == [entries[0]]
    index.truncate_to(14)
    assert index.entries == entries[:1]


# -- the model test ------------------------------------------------------------------------------


@dataclass
class Producer:
    epoch: int = 0
    seq: int = 0
    open: list[int] = field(default_factory=list)  # offsets of its open transaction's records


@dataclass
class Model:
    records: dict[int, bytes] = field(default_factory=dict)  # committed or plain, by offset
    producers: dict[int, Producer] = field(default_factory=dict)

    def lso(self, hw: int) -> int:
        firsts = [p.open[0] for p in self.producers.values() if p.open]
        return min([hw, *firsts])

    def view(self, hw: int) -> list[tuple[int, bytes | None]]:
        bound = self.lso(hw)
        return [(o, v) for o, v in sorted(self.records.items()) if o < bound]


def run_model(tmp_path: Path, seed: int, steps: int) -> None:
    rng = random.Random(seed)
    model = Model({}, {pid: Producer() for pid in range(3)})
    pending: dict[int, dict[int, bytes]] = {pid: {} for pid in range(3)}
    log = open_log(tmp_path / "p")
    history: list[tuple[str, tuple[object, ...]]] = []  # to build a fresh log after restarts

    def apply(target: PartitionLog, op: str, args: tuple[object, ...]) -> int:
        if op == "append":
            data, transactional = args
            assert isinstance(data, bytes) and isinstance(transactional, bool)
            return append(target, data, transactional=transactional)
        pid, epoch, commit = args
        assert isinstance(pid, int) and isinstance(epoch, int) and isinstance(commit, bool)
        return end(target, pid, commit, epoch)

    def do(op: str, *args: object) -> int:
        history.append((op, args))
        return apply(log, op, args)

    for step in range(steps):
        roll = rng.random()
        pid = rng.randrange(3)
        p = model.producers[pid]
        if roll < 0.45:
            n = rng.randint(1, 3)
            values = [b"%d-%d-%d" % (pid, step, i) for i in range(n)]
            base = do("append", txn(pid, p.seq, *values, epoch=p.epoch), True)
            p.seq += n
            for i, v in enumerate(values):
                p.open.append(base + i)
                pending[pid][base + i] = v
        elif roll < 0.65:
            value = b"plain-%d" % step
            model.records[do("append", plain(value), False)] = value
        elif roll < 0.85:
            commit = rng.random() < 0.5
            bump = rng.random() < 0.5  # KIP-890: the coordinator bumps the epoch at the end
            epoch = p.epoch + 1 if bump else p.epoch
            do("marker", pid, epoch, commit)
            if commit:
                model.records.update(pending[pid])
            pending[pid] = {}
            p.open = []
            if bump:
                p.epoch, p.seq = epoch, 0
        elif roll < 0.9:
            log.flush()
            log.write_checkpoint()
        else:
            if rng.random() < 0.5:
                log.close()
                log = open_log(tmp_path / "p", clean=True)
            else:
                log.abandon()
                log = open_log(tmp_path / "p")
            fresh_dir = tmp_path / f"fresh-{step}"
            fresh = open_log(fresh_dir)
            for op, args in history:
                apply(fresh, op, args)
            got, want = txn_state(log), txn_state(fresh)
            assert got == want, f"seed {seed} step {step}:\n{got}\n{want}"
            fresh.close()
        hw = log.high_watermark
        assert log.last_stable_offset == model.lso(hw), f"seed {seed} step {step}"
        assert committed_view(log, rng.choice([1, 200, 1 << 20])) == model.view(hw), (
            f"seed {seed} step {step}"
        )
    log.close()


@settings(derandomize=True, database=None, deadline=None, max_examples=12)
@given(seed=st.integers(0, 2**32 - 1))
def test_read_committed_matches_the_model(
    tmp_path_factory: pytest.TempPathFactory, seed: int
) -> None:
    run_model(tmp_path_factory.mktemp("model"), seed, steps=80)


@pytest.mark.slow
@pytest.mark.parametrize("seed", range(20))
def test_read_committed_matches_the_model_long(
    tmp_path: Path, seed: int, request: pytest.FixtureRequest
) -> None:
    markexpr = request.config.option.markexpr or ""
    if "slow" not in markexpr or "not slow" in markexpr:  # as test_crash_kill's soak
        pytest.skip("600-step model runs: run them with -m slow (make test-slow)")
    run_model(tmp_path, seed, steps=600)


# -- the asyncio facade ------------------------------------------------------------------------


def test_partition_facade_appends_markers_in_order_and_reads_committed(tmp_path: Path) -> None:
    async def main() -> None:
        manager = LogManager(tmp_path / "data", clock=ManualClock(T0))
        await manager.start(background=False)
        try:
            p = await manager.create("t", 0)
            with pytest.raises(InvalidRecordError):
                await p.append(txn(1, 0, b"a"))
            await p.append(txn(1, 0, b"a"), transactional=True)
            await p.append(plain(b"x"))
            assert p.last_stable_offset == 0 and p.high_watermark == 2
            assert not await p.wait_for(0, 0.01, isolation="read_committed")
            waiter = asyncio.ensure_future(p.wait_for(0, 30, isolation="read_committed"))
            await asyncio.sleep(0)
            assert not waiter.done()
            # a big append queued ahead of the marker: the marker must not overtake it
            big = asyncio.ensure_future(p.append(plain(b"y" * 1000), inline_max_bytes=10))
            await asyncio.sleep(0)  # it is queued for a worker thread now
            marker = await p.append_marker(1, 0, True, 0)
            assert (await big).base_offset == 2 and marker.base_offset == 3
            assert await waiter
            assert p.last_stable_offset == p.high_watermark == 4
            r = await p.read_committed(0, 1 << 20)
            assert isinstance(r, CommittedReadResult) and r.last_stable_offset == 4
            values = [x.value for x in committed_records(r.data, r.aborted_transactions)]
            assert values == [b"a", b"x", b"y" * 1000]
        finally:
            await manager.close()

    asyncio.run(main())


def test_a_marker_not_yet_stable_stays_unstable_across_a_restart(tmp_path: Path) -> None:
    log = PartitionLog(tmp_path / "p", LogConfig(), ManualClock(T0), HandleCache())
    log.append(plain(b"x"))
    log.append(txn(1, 0, b"a"), transactional=True)
    log.set_high_watermark(2)
    log.append_marker(1, 0, False, 0)  # at 2, past the high watermark
    assert log.last_stable_offset == 1
    log.close()  # the producer snapshot at the log end (3) holds no open transaction
    reopened = PartitionLog(
        tmp_path / "p", LogConfig(), ManualClock(T0), HandleCache(), clean_shutdown=True
    )
    assert reopened.high_watermark == 2 and reopened.last_stable_offset == 1
    reopened.set_high_watermark(3)
    assert reopened.last_stable_offset == 3
    assert committed_view(reopened) == [(0, b"x")]


def test_version_1_producer_snapshots_are_still_read(tmp_path: Path) -> None:
    body = struct.pack(">qi", 10, 1) + PRODUCER_ENTRY_V1.pack(5, 2, T0, 4, 1)
    body += BATCH_ENTRY.pack(0, 3, 4, 7, T0)
    data = struct.pack(">hI", 1, crc32c.crc32c(body)) + body
    psm = ProducerStateManager()
    assert psm.decode(data) == 10
    entry = psm.get(5)
    assert entry is not None and entry.current_txn_first_offset == 4
    assert (entry.coordinator_epoch, entry.marker_offset, entry.last_seq) == (-1, -1, 3)
    assert psm.ongoing == {5: 4}
