"""Model-based tests for core_log.epoch_cache.LeaderEpochCache and PartitionLog.truncate_to.

The cache is compared with a list of (epoch, start_offset) pairs after every operation; the
follower truncation path of PartitionLog is compared with a list of batches tagged with the
leader epoch that wrote them.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from core_log.batch import Record, build_batch, iter_records, scan_batches
from core_log.clock import ManualClock
from core_log.config import LogConfig
from core_log.epoch_cache import UNDEFINED_EPOCH, UNDEFINED_OFFSET, LeaderEpochCache
from core_log.errors import KafkaStorageError
from core_log.handles import HandleCache
from core_log.log import EPOCH_FILE, PartitionLog

SETTINGS = settings(
    derandomize=True,
    database=None,
    deadline=None,
    max_examples=60,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)


# The engine fsyncs every checkpoint (file and directory); on a real disk that dominates the
# run time, so the logs live on tmpfs when there is one (fsync is a no-op there).
FAST_TMP = "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else None


def make_tmpdir(prefix: str) -> Path:
    return Path(tempfile.mkdtemp(prefix=f"logbus-{prefix}-", dir=FAST_TMP))


@pytest.fixture
def tmp_path() -> Iterator[Path]:
    d = make_tmpdir("test")
    yield d
    shutil.rmtree(d, ignore_errors=True)


# ---------------------------------------------------------------------------------------------
# the model
# ---------------------------------------------------------------------------------------------


class EpochModel:
    """KIP-101 semantics written as plainly as possible."""

    def __init__(self) -> None:
        self.entries: list[tuple[int, int]] = []

    def assign(self, epoch: int, offset: int) -> bool:
        if epoch < 0 or (self.entries and epoch <= self.entries[-1][0]):
            return False
        self.entries = [(e, o) for e, o in self.entries if o < offset]
        self.entries.append((epoch, offset))
        return True

    def end_offset_for_epoch(self, epoch: int, leo: int) -> tuple[int, int]:
        floor = [i for i, (e, _) in enumerate(self.entries) if e <= epoch]
        if not floor:
            return UNDEFINED_EPOCH, UNDEFINED_OFFSET
        i = floor[-1]
        if i == len(self.entries) - 1:
            return self.entries[i][0], leo  # the latest epoch is still being written
        return self.entries[i][0], self.entries[i + 1][1]

    def epoch_for_offset(self, offset: int) -> int:
        found = [e for e, o in self.entries if o <= offset]
        return found[-1] if found else UNDEFINED_EPOCH

    def truncate_from_end(self, end: int) -> bool:
        kept = [(e, o) for e, o in self.entries if o < end]
        changed = kept != self.entries
        self.entries = kept
        return changed

    def truncate_from_start(self, start: int) -> bool:
        below = [i for i, (_, o) in enumerate(self.entries) if o <= start]
        if not below:
            return False
        i = below[-1]
        kept = [(self.entries[i][0], start), *self.entries[i + 1 :]]
        changed = kept != self.entries
        self.entries = kept
        return changed


def probe_epochs(entries: list[tuple[int, int]]) -> list[int]:
    probes = {-1, 0, 1}
    for e, _ in entries:
        probes.update({e - 1, e, e + 1})
    return sorted(probes)


def probe_offsets(entries: list[tuple[int, int]]) -> list[int]:
    probes = {-1, 0, 10**9}
    for _, o in entries:
        probes.update({o - 1, o, o + 1})
    return sorted(probes)


# ---------------------------------------------------------------------------------------------
# LeaderEpochCache state machine
# ---------------------------------------------------------------------------------------------


class EpochCacheMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.dir = make_tmpdir("epochs")
        self.cache = LeaderEpochCache(self.dir / EPOCH_FILE)
        self.model = EpochModel()
        self.stored: list[tuple[int, int]] | None = None

    def _next_epoch(self, step: int) -> int:
        return (self.model.entries[-1][0] if self.model.entries else 0) + step

    def _next_offset(self, step: int) -> int:
        return (self.model.entries[-1][1] if self.model.entries else 0) + step

    @rule(epoch_step=st.integers(-2, 3), offset_step=st.integers(-30, 40))
    def assign(self, epoch_step: int, offset_step: int) -> None:
        """Mostly newer epochs at later offsets; also stale epochs and rewinds (new leader)."""
        epoch = self._next_epoch(epoch_step)
        offset = max(0, self._next_offset(offset_step))
        assert self.cache.assign(epoch, offset) == self.model.assign(epoch, offset)

    @rule(data=st.data())
    def truncate_from_end(self, data: st.DataObject) -> None:
        offset = data.draw(st.sampled_from(probe_offsets(self.model.entries)))
        assert self.cache.truncate_from_end(offset) == self.model.truncate_from_end(offset)

    @rule(data=st.data())
    def truncate_from_start(self, data: st.DataObject) -> None:
        offset = data.draw(st.sampled_from(probe_offsets(self.model.entries)))
        offset = max(0, min(offset, 10**6))
        assert self.cache.truncate_from_start(offset) == self.model.truncate_from_start(offset)

    @rule()
    def store(self) -> None:
        self.cache.store()
        self.stored = list(self.model.entries)

    @rule()
    def load_into_a_new_cache(self) -> None:
        fresh = LeaderEpochCache(self.dir / EPOCH_FILE)
        fresh.load()
        assert fresh.entries == (self.stored or [])

    @rule()
    def reload_self(self) -> None:
        """load() replaces what is in memory with the stored file (no file: a no-op)."""
        self.cache.load()
        if self.stored is not None:
            self.model.entries = list(self.stored)

    @rule()
    def clear(self) -> None:
        self.cache.clear()
        self.model.entries = []

    @invariant()
    def matches_model(self) -> None:
        entries = self.model.entries
        assert self.cache.entries == entries
        assert self.cache.latest_epoch == (entries[-1][0] if entries else UNDEFINED_EPOCH)
        epochs = [e for e, _ in entries]
        offsets = [o for _, o in entries]
        assert epochs == sorted(set(epochs)) and offsets == sorted(set(offsets))
        leo = (entries[-1][1] if entries else 0) + 7
        for epoch in probe_epochs(entries):
            assert self.cache.end_offset_for_epoch(epoch, leo) == self.model.end_offset_for_epoch(
                epoch, leo
            )
        for offset in probe_offsets(entries):
            assert self.cache.epoch_for_offset(offset) == self.model.epoch_for_offset(offset)

    def teardown(self) -> None:
        shutil.rmtree(self.dir, ignore_errors=True)


TestEpochCacheModel = EpochCacheMachine.TestCase
TestEpochCacheModel.settings = settings(SETTINGS, max_examples=50, stateful_step_count=40)


# ---------------------------------------------------------------------------------------------
# end_offset_for_epoch: the KIP-101 answers, spelled out
# ---------------------------------------------------------------------------------------------


def test_end_offset_for_epoch_examples() -> None:
    cache = LeaderEpochCache()
    assert cache.end_offset_for_epoch(0, 100) == (UNDEFINED_EPOCH, UNDEFINED_OFFSET)
    for epoch, offset in [(2, 10), (4, 25), (7, 40)]:
        assert cache.assign(epoch, offset)
    leo = 55
    assert cache.end_offset_for_epoch(7, leo) == (7, leo)  # latest epoch -> LEO
    assert cache.end_offset_for_epoch(4, leo) == (4, 40)  # ends where epoch 7 starts
    assert cache.end_offset_for_epoch(5, leo) == (4, 40)  # unknown: largest epoch <= 5
    assert cache.end_offset_for_epoch(6, leo) == (4, 40)
    assert cache.end_offset_for_epoch(2, leo) == (2, 25)
    assert cache.end_offset_for_epoch(3, leo) == (2, 25)
    assert cache.end_offset_for_epoch(1, leo) == (UNDEFINED_EPOCH, UNDEFINED_OFFSET)
    assert cache.end_offset_for_epoch(UNDEFINED_EPOCH, leo) == (UNDEFINED_EPOCH, UNDEFINED_OFFSET)
    assert cache.end_offset_for_epoch(9, leo) == (7, leo)  # newer than known: the latest's end


def test_assign_ignores_stale_epochs_and_a_new_leader_overwrites_later_offsets() -> None:
    cache = LeaderEpochCache()
    assert cache.assign(1, 0)
    assert not cache.assign(1, 5)  # same epoch again
    assert not cache.assign(0, 9)  # older epoch
    assert not cache.assign(-1, 9)
    assert cache.assign(3, 20)
    assert cache.assign(4, 30)
    assert cache.assign(5, 20)  # new leader whose log diverged at 20
    assert cache.entries == [(1, 0), (5, 20)]
    assert cache.assign(6, 0)
    assert cache.entries == [(6, 0)]


def test_truncate_from_start_moves_the_covering_epoch_to_the_new_start() -> None:
    cache = LeaderEpochCache()
    for e, o in [(1, 0), (2, 10), (3, 20)]:
        cache.assign(e, o)
    assert not cache.truncate_from_start(0)
    assert cache.truncate_from_start(15)
    assert cache.entries == [(2, 15), (3, 20)]
    assert cache.truncate_from_start(20)
    assert cache.entries == [(3, 20)]
    assert not cache.truncate_from_start(20)
    assert cache.truncate_from_start(100)
    assert cache.entries == [(3, 100)]


# ---------------------------------------------------------------------------------------------
# persistence
# ---------------------------------------------------------------------------------------------


@SETTINGS
@given(
    steps=st.lists(st.tuples(st.integers(1, 5), st.integers(0, 10**12)), max_size=30),
)
def test_store_load_round_trip(tmp_path: Path, steps: list[tuple[int, int]]) -> None:
    path = tmp_path / EPOCH_FILE
    path.unlink(missing_ok=True)
    cache = LeaderEpochCache(path)
    epoch = 0
    offset = 0
    for epoch_step, offset_step in steps:
        epoch += epoch_step
        offset += offset_step
        cache.assign(epoch, offset)
    cache.store()
    lines = path.read_text().split("\n")
    assert lines[0] == "0"
    assert lines[1] == str(len(cache.entries))
    fresh = LeaderEpochCache(path)
    fresh.load()
    assert fresh.entries == cache.entries
    assert not path.with_name(path.name + ".tmp").exists()


def test_load_of_a_missing_file_is_an_empty_cache(tmp_path: Path) -> None:
    cache = LeaderEpochCache(tmp_path / "absent")
    cache.load()
    assert cache.entries == []


@pytest.mark.parametrize(
    "content",
    [
        b"",
        b"\n",
        b"0\n",
        b"1\n1\n0 0\n",  # unknown version
        b"zero\n1\n0 0\n",
        b"0\ntwo\n0 0\n",
        b"0\n2\n0 0\n",  # fewer entries than the count
        b"0\n1\n0\n",  # an entry without its offset
        b"0\n1\n0 0 0\n",  # three fields
        b"0\n1\n0 x\n",
        b"0\n1\n\n",
        b"0\n-1\n",
        b"0\n2\n1 0\n\n2 10\n",
    ],
)
def test_a_corrupt_checkpoint_is_a_storage_error(tmp_path: Path, content: bytes) -> None:
    path = tmp_path / EPOCH_FILE
    path.write_bytes(content)
    cache = LeaderEpochCache(path)
    cache.assign(9, 90)
    with pytest.raises(KafkaStorageError, match="corrupt leader epoch checkpoint"):
        cache.load()
    assert cache.entries == [(9, 90)]  # a failed load changes nothing


@pytest.mark.parametrize("content", [b"\xff\xfe0\n1\n", b"0\n1\n1 \x80\n"])
def test_a_checkpoint_that_is_not_text_is_a_storage_error(tmp_path: Path, content: bytes) -> None:
    path = tmp_path / EPOCH_FILE
    path.write_bytes(content)
    with pytest.raises(KafkaStorageError):
        LeaderEpochCache(path).load()


def test_a_corrupt_epoch_checkpoint_fails_the_log_open(tmp_path: Path) -> None:
    d = tmp_path / "p0"
    d.mkdir()
    (d / EPOCH_FILE).write_text("0\n3\n1 0\n")
    with pytest.raises(KafkaStorageError):
        PartitionLog(d, LogConfig(), ManualClock(), HandleCache())


# ---------------------------------------------------------------------------------------------
# PartitionLog.truncate_to against a model
# ---------------------------------------------------------------------------------------------


class TruncationMachine(RuleBasedStateMachine):
    """A leader's log with epochs 1, 2, 3...; truncated like a follower after an election."""

    def __init__(self) -> None:
        super().__init__()
        self.root = make_tmpdir("truncate")
        self.clock = ManualClock()
        self.handles = HandleCache(max_open=4)
        self.batches: list[tuple[int, int, int]] = []  # (base, last, epoch)
        self.model = EpochModel()
        self.epoch = 1
        self.hw = 0
        self.log: PartitionLog

    @initialize(segment_bytes=st.sampled_from([300, 700, 2000]), interval=st.sampled_from([0, 150]))
    def open(self, segment_bytes: int, interval: int) -> None:
        self.config = LogConfig.from_dict(
            {"segment.bytes": segment_bytes, "index.interval.bytes": interval}
        )
        self.log = PartitionLog(self.root / "p0", self.config, self.clock, self.handles)

    @property
    def leo(self) -> int:
        return self.batches[-1][1] + 1 if self.batches else 0

    @rule(n=st.integers(1, 12), new_epoch=st.booleans(), size=st.integers(0, 40))
    def append(self, n: int, new_epoch: bool, size: int) -> None:
        if new_epoch:
            self.epoch += 1
        now = self.clock.now_ms()  # stamped now: segment.ms counts from the first batch
        records = [Record(b"v" * size, key=b"k%d" % i, timestamp=now) for i in range(n)]
        result = self.log.append(build_batch(records), leader_epoch=self.epoch)
        assert result.base_offset == self.leo
        self.batches.append((self.leo, self.leo + n - 1, self.epoch))
        self.model.assign(self.epoch, result.base_offset)
        assert result.last_offset == self.leo - 1

    @rule(data=st.data())
    def set_high_watermark(self, data: st.DataObject) -> None:
        target = data.draw(st.integers(self.hw, self.leo + 3))
        self.hw = max(self.hw, min(target, self.leo))
        assert self.log.set_high_watermark(target) == self.hw

    @rule(data=st.data())
    def truncate_to(self, data: st.DataObject) -> None:
        boundaries = [b for b, _, _ in self.batches]
        target = data.draw(st.integers(0, self.leo + 2) | st.sampled_from([0, *boundaries]))
        new_leo = self.log.truncate_to(target)
        if target < self.leo:
            self.batches = [b for b in self.batches if b[1] < target]
            self.model.truncate_from_end(self.leo)
            self.hw = min(self.hw, self.leo)
        assert new_leo == self.leo == self.log.log_end_offset
        assert all(o < self.leo for _, o in self.log.epochs.entries)
        # A new leader epoch after the election; appends continue at the LEO.
        self.epoch += 1

    @rule()
    def reopen(self) -> None:
        self.log.close()
        self.log = PartitionLog(
            self.root / "p0", self.config, self.clock, self.handles, clean_shutdown=True
        )

    @invariant()
    def log_matches_model(self) -> None:
        log = self.log
        assert log.log_end_offset == self.leo
        assert log.high_watermark == self.hw
        assert log.log_start_offset == 0
        assert log.epochs.entries == self.model.entries
        for epoch in range(-1, self.epoch + 2):
            assert log.end_offset_for_epoch(epoch) == self.model.end_offset_for_epoch(
                epoch, self.leo
            )
        # Every batch is still there, stamped with the epoch that wrote it.
        got: list[tuple[int, int, int]] = []
        offsets: list[int] = []
        offset = 0
        while offset < self.leo:
            res = log.read(offset, 1 << 20, max_offset=self.leo)
            assert res.data, f"no data at {offset} below the LEO {self.leo}"
            for _, h in scan_batches(res.data):
                got.append((h.base_offset, h.last_offset, h.partition_leader_epoch))
            offsets.extend(r.offset for r in iter_records(res.data))
            offset = res.next_offset
        assert got == self.batches
        assert offsets == list(range(self.leo))

    def teardown(self) -> None:
        try:
            self.log.close()
        finally:
            shutil.rmtree(self.root, ignore_errors=True)


TestTruncationModel = TruncationMachine.TestCase
TestTruncationModel.settings = settings(SETTINGS, max_examples=60, stateful_step_count=40)


def test_truncate_to_example(tmp_path: Path) -> None:
    clock = ManualClock()
    cfg = LogConfig.from_dict({"segment.bytes": 200})
    log = PartitionLog(tmp_path / "p", cfg, clock, HandleCache())
    for epoch, n in [(1, 5), (1, 5), (2, 5), (3, 5)]:  # batches [0,4] [5,9] [10,14] [15,19]
        records = [Record(b"x" * 30, timestamp=clock.now_ms())] * n
        log.append(build_batch(records), leader_epoch=epoch)
    assert log.epochs.entries == [(1, 0), (2, 10), (3, 15)]
    log.set_high_watermark(20)
    assert log.end_offset_for_epoch(1) == (1, 10)
    assert log.truncate_to(12) == 10  # batch [10, 14] holds 12: it goes as a whole
    assert log.log_end_offset == 10
    assert log.high_watermark == 10
    assert log.epochs.entries == [(1, 0)]
    assert log.end_offset_for_epoch(1) == (1, 10)
    assert log.end_offset_for_epoch(2) == (1, 10)
    assert log.truncate_to(25) == 10  # past the LEO: nothing happens
    assert log.append(build_batch([Record(b"y")]), leader_epoch=4).base_offset == 10
    assert log.epochs.entries == [(1, 0), (4, 10)]
    assert log.end_offset_for_epoch(1) == (1, 10)
    assert log.end_offset_for_epoch(3) == (1, 10)
    assert log.end_offset_for_epoch(4) == (4, 11)
    log.close()
    reopened = PartitionLog(tmp_path / "p", cfg, clock, HandleCache(), clean_shutdown=True)
    assert reopened.epochs.entries == [(1, 0), (4, 10)]
    assert reopened.log_end_offset == 11
    reopened.close()


def test_truncation_never_leaves_the_log_start_above_the_log_end(tmp_path: Path) -> None:
    log = PartitionLog(tmp_path / "p", LogConfig(), ManualClock(), HandleCache())
    log.append(build_batch([Record(b"x")] * 10), leader_epoch=1)  # one batch [0, 9]
    log.set_high_watermark(10)
    log.increment_log_start_offset(5)  # DeleteRecords up to 5: inside the batch
    log.truncate_to(7)
    try:
        assert log.log_start_offset <= log.high_watermark <= log.log_end_offset
        log.read(log.log_start_offset, 1 << 20)  # the log start must stay readable
    finally:
        log.close()
