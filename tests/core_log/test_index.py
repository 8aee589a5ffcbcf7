"""Model-based tests for core_log.index: OffsetIndex and TimeIndex against naive list models.

Each index is driven by a Hypothesis state machine next to a plain list of entries; after every
step the index must answer every lookup exactly as a linear scan of the list does, and a fresh
index loaded from the file must hold exactly the entries that were last flushed or rewritten.
``load`` must refuse every kind of insane file with ``IndexCorrupt``.
"""

from __future__ import annotations

import itertools
import shutil
import struct
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)

from core_log.index import OFFSET_ENTRY, TIME_ENTRY, IndexCorrupt, OffsetIndex, TimeIndex

SETTINGS = settings(
    derandomize=True,
    database=None,
    deadline=None,
    max_examples=60,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
STATEFUL = settings(SETTINGS, max_examples=40, stateful_step_count=40)

BASES = st.sampled_from([0, 1, 100, 4096, 2**31 - 1, 2**40])
REL = st.integers(0, 5000)
POS = st.integers(0, 200_000)
BIG_LOG = 2**31 - 1  # a log size larger than every position the tests use


# ---------------------------------------------------------------------------------------------
# naive models
# ---------------------------------------------------------------------------------------------


def model_offset_lookup(base: int, entries: list[tuple[int, int]], offset: int) -> tuple[int, int]:
    best = (base, 0)
    for rel, pos in entries:
        if base + rel <= offset:
            best = (base + rel, pos)
    return best


def model_position_lookup(
    base: int, entries: list[tuple[int, int]], position: int
) -> tuple[int, int]:
    best = (base, 0)
    for rel, pos in entries:
        if pos <= position:
            best = (base + rel, pos)
    return best


def model_time_lookup(base: int, entries: list[tuple[int, int]], timestamp: int) -> int:
    best = base
    for ts, rel in entries:
        if ts < timestamp:
            best = base + rel
    return best


def offset_file(entries: list[tuple[int, int]]) -> bytes:
    return b"".join(OFFSET_ENTRY.pack(r, p) for r, p in entries)


def time_file(entries: list[tuple[int, int]]) -> bytes:
    return b"".join(TIME_ENTRY.pack(t, r) for t, r in entries)


def file_entries(path: Path, entry: struct.Struct) -> list[tuple[int, ...]]:
    if not path.exists():
        return []
    return list(entry.iter_unpack(path.read_bytes()))


@pytest.fixture
def tmp(tmp_path: Path) -> Path:
    return tmp_path


# ---------------------------------------------------------------------------------------------
# OffsetIndex state machine
# ---------------------------------------------------------------------------------------------


class OffsetIndexMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.dir = Path(tempfile.mkdtemp(prefix="offset-index-"))
        self.base = 0
        self.entries: list[tuple[int, int]] = []
        self.persisted: list[tuple[int, int]] | None = None  # None: no file written yet
        self.index: OffsetIndex

    @initialize(base=BASES)
    def start(self, base: int) -> None:
        self.base = base
        self.index = OffsetIndex(self.dir / "x.index", base, max_entries=10)

    @rule(rel_step=st.integers(-3, 300), pos_step=st.integers(-3, 5000))
    def append(self, rel_step: int, pos_step: int) -> None:
        """Mostly increasing entries, sometimes non-monotonic ones that must be ignored."""
        last_rel, last_pos = self.entries[-1] if self.entries else (-1, -1)
        rel = max(0, last_rel + rel_step)
        pos = max(0, last_pos + pos_step)
        self.index.append(self.base + rel, pos)
        if not self.entries or (rel > last_rel and pos > last_pos):
            self.entries.append((rel, pos))

    @rule(data=st.data())
    def truncate_to_position(self, data: st.DataObject) -> None:
        candidates = [p for _, p in self.entries] + [0, 10**6]
        pos = data.draw(st.sampled_from(candidates) | POS)
        pos += data.draw(st.sampled_from([-1, 0, 0, 1]))
        self.index.truncate_to_position(pos)
        kept = [(r, p) for r, p in self.entries if p < pos]
        if kept != self.entries:
            self.persisted = list(kept)  # truncation rewrites the file
        self.entries = kept

    @rule()
    def flush(self) -> None:
        self.index.flush(fsync=False)
        if self.entries or self.persisted is not None:
            self.persisted = list(self.entries)

    @rule()
    def reset(self) -> None:
        self.index.reset()
        self.entries = []
        self.persisted = []

    @rule()
    def reload_from_file(self) -> None:
        """A new index loaded from the file holds exactly what was last flushed/rewritten."""
        fresh = OffsetIndex(self.index.path, self.base, max_entries=10)
        if self.persisted is None:
            with pytest.raises(IndexCorrupt):
                fresh.load(BIG_LOG)
            return
        fresh.load(BIG_LOG)
        assert len(fresh) == len(self.persisted)
        for rel, pos in self.persisted:
            assert fresh.lookup(self.base + rel) == (self.base + rel, pos)
        assert file_entries(self.index.path, OFFSET_ENTRY) == self.persisted

    @precondition(lambda self: bool(self.entries))
    @rule()
    def flush_then_load_round_trip(self) -> None:
        self.flush()
        fresh = OffsetIndex(self.index.path, self.base, max_entries=10)
        max_pos = max(p for _, p in self.entries)
        fresh.load(max_pos + 1)  # the smallest log size that holds every position
        for probe in self._probes():
            assert fresh.lookup(probe) == self.index.lookup(probe)
        with pytest.raises(IndexCorrupt):
            OffsetIndex(self.index.path, self.base, max_entries=10).load(max_pos)

    def _probes(self) -> list[int]:
        probes = {self.base - 1, self.base, self.base + 10**6}
        for rel, _ in self.entries:
            probes.update({self.base + rel - 1, self.base + rel, self.base + rel + 1})
        return sorted(probes)

    @invariant()
    def lookups_match_model(self) -> None:
        assert len(self.index) == len(self.entries)
        assert self.index.is_full == (len(self.entries) >= 10)
        for probe in self._probes():
            assert self.index.lookup(probe) == model_offset_lookup(self.base, self.entries, probe)
        positions = {0, 10**7}
        for _, pos in self.entries:
            positions.update({pos - 1, pos, pos + 1})
        for pos in positions:
            assert self.index.lookup_position(pos) == model_position_lookup(
                self.base, self.entries, pos
            )

    def teardown(self) -> None:
        shutil.rmtree(self.dir, ignore_errors=True)


TestOffsetIndexModel = OffsetIndexMachine.TestCase
TestOffsetIndexModel.settings = STATEFUL


# ---------------------------------------------------------------------------------------------
# TimeIndex state machine
# ---------------------------------------------------------------------------------------------


class TimeIndexMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.dir = Path(tempfile.mkdtemp(prefix="time-index-"))
        self.base = 0
        self.entries: list[tuple[int, int]] = []  # (timestamp, relative offset)
        self.persisted: list[tuple[int, int]] | None = None
        self.next_rel = 0  # offsets handed to maybe_append never go back
        self.index: TimeIndex

    @initialize(base=BASES)
    def start(self, base: int) -> None:
        self.base = base
        self.index = TimeIndex(self.dir / "x.timeindex", base, max_entries=8)

    @rule(ts=st.integers(-5, 10_000), rel_step=st.integers(0, 50))
    def maybe_append(self, ts: int, rel_step: int) -> None:
        self.next_rel += rel_step
        self.index.maybe_append(ts, self.base + self.next_rel)
        if not self.entries or ts > self.entries[-1][0]:
            self.entries.append((ts, self.next_rel))
        timestamps = [t for t, _ in self.entries]
        assert timestamps == sorted(set(timestamps)), "timestamps must stay strictly increasing"

    @rule(data=st.data())
    def truncate_to_offset(self, data: st.DataObject) -> None:
        candidates = [self.base + r for _, r in self.entries] + [self.base]
        offset = data.draw(st.sampled_from(candidates)) + data.draw(st.integers(-1, 1))
        self.index.truncate_to_offset(offset)
        kept = [(t, r) for t, r in self.entries if self.base + r < offset]
        if kept != self.entries:
            self.persisted = list(kept)
        self.entries = kept
        # Later offsets come after what the (truncated) segment still holds.
        self.next_rel = self.entries[-1][1] if self.entries else 0

    @rule()
    def flush(self) -> None:
        self.index.flush(fsync=False)
        if self.entries or self.persisted is not None:
            self.persisted = list(self.entries)

    @rule()
    def reset(self) -> None:
        self.index.reset()
        self.entries = []
        self.persisted = []

    @rule()
    def reload_from_file(self) -> None:
        fresh = TimeIndex(self.index.path, self.base, max_entries=8)
        next_offset = self.base + 10**9
        if self.persisted is None:
            with pytest.raises(IndexCorrupt):
                fresh.load(next_offset)
            return
        fresh.load(next_offset)
        assert len(fresh) == len(self.persisted)
        expected_last = (
            (self.persisted[-1][0], self.base + self.persisted[-1][1]) if self.persisted else None
        )
        assert fresh.last_entry == expected_last
        assert file_entries(self.index.path, TIME_ENTRY) == self.persisted
        if self.persisted:  # an entry at or past the log end offset is insane
            last_offset = self.base + self.persisted[-1][1]
            with pytest.raises(IndexCorrupt):
                TimeIndex(self.index.path, self.base, max_entries=8).load(last_offset)
            TimeIndex(self.index.path, self.base, max_entries=8).load(last_offset + 1)

    @invariant()
    def lookups_match_model(self) -> None:
        assert len(self.index) == len(self.entries)
        assert self.index.is_full == (len(self.entries) >= 8)
        expected_last = (
            (self.entries[-1][0], self.base + self.entries[-1][1]) if self.entries else None
        )
        assert self.index.last_entry == expected_last
        probes = {-(2**40), -6, 0, 10**6}
        for ts, _ in self.entries:
            probes.update({ts - 1, ts, ts + 1})
        for ts in probes:
            assert self.index.lookup(ts) == model_time_lookup(self.base, self.entries, ts)

    def teardown(self) -> None:
        shutil.rmtree(self.dir, ignore_errors=True)


TestTimeIndexModel = TimeIndexMachine.TestCase
TestTimeIndexModel.settings = STATEFUL


# ---------------------------------------------------------------------------------------------
# load: sanity checks on the file
# ---------------------------------------------------------------------------------------------


@st.composite
def offset_entries(draw: st.DrawFn, min_size: int = 0) -> list[tuple[int, int]]:
    rels = draw(st.lists(REL, min_size=min_size, max_size=30, unique=True))
    poss = draw(st.lists(POS, min_size=len(rels), max_size=len(rels), unique=True))
    return list(zip(sorted(rels), sorted(poss), strict=True))


@st.composite
def time_entries(draw: st.DrawFn, min_size: int = 0) -> list[tuple[int, int]]:
    ts = draw(st.lists(st.integers(-(2**40), 2**40), min_size=min_size, max_size=30, unique=True))
    rels = draw(st.lists(REL, min_size=len(ts), max_size=len(ts)))
    return list(zip(sorted(ts), sorted(rels), strict=True))


@SETTINGS
@given(entries=offset_entries(), base=BASES, slack=st.integers(1, 1000))
def test_offset_index_load_accepts_sane_files(
    tmp: Path, entries: list[tuple[int, int]], base: int, slack: int
) -> None:
    path = tmp / "sane.index"
    path.write_bytes(offset_file(entries))
    log_size = max((p for _, p in entries), default=0) + slack
    idx = OffsetIndex(path, base, max_entries=100)
    idx.load(log_size)
    assert len(idx) == len(entries)
    for rel, pos in entries:
        assert idx.lookup(base + rel) == (base + rel, pos)
        assert idx.lookup_position(pos) == (base + rel, pos)


@SETTINGS
@given(entries=offset_entries(min_size=1), extra=st.integers(1, 7))
def test_offset_index_load_rejects_a_partial_entry(
    tmp: Path, entries: list[tuple[int, int]], extra: int
) -> None:
    path = tmp / "partial.index"
    path.write_bytes(offset_file(entries) + b"\x00" * extra)
    with pytest.raises(IndexCorrupt, match="partial"):
        OffsetIndex(path, 0, 100).load(BIG_LOG)


@SETTINGS
@given(entries=offset_entries(min_size=2), data=st.data())
def test_offset_index_load_rejects_out_of_order_entries(
    tmp: Path, entries: list[tuple[int, int]], data: st.DataObject
) -> None:
    i = data.draw(st.integers(1, len(entries) - 1))
    rel, pos = entries[i]
    prev_rel, prev_pos = entries[i - 1]
    kind = data.draw(st.sampled_from(["rel-equal", "rel-down", "pos-equal", "pos-down", "swap"]))
    if kind == "rel-equal":
        entries[i] = (prev_rel, pos)
    elif kind == "rel-down":
        entries[i] = (max(0, prev_rel - data.draw(st.integers(1, 100))), pos)
    elif kind == "pos-equal":
        entries[i] = (rel, prev_pos)
    elif kind == "pos-down":
        entries[i] = (rel, max(0, prev_pos - data.draw(st.integers(1, 100))))
    else:
        entries[i - 1], entries[i] = entries[i], entries[i - 1]
    path = tmp / "disorder.index"
    path.write_bytes(offset_file(entries))
    with pytest.raises(IndexCorrupt):
        OffsetIndex(path, 0, 100).load(BIG_LOG)


@SETTINGS
@given(entries=offset_entries(min_size=1), data=st.data())
def test_offset_index_load_rejects_positions_at_or_past_the_log_size(
    tmp: Path, entries: list[tuple[int, int]], data: st.DataObject
) -> None:
    max_pos = max(p for _, p in entries)
    log_size = data.draw(st.integers(0, max_pos))  # some entry points at or past the log end
    path = tmp / "past-end.index"
    path.write_bytes(offset_file(entries))
    with pytest.raises(IndexCorrupt):
        OffsetIndex(path, 0, 100).load(log_size)


def test_offset_index_load_rejects_a_negative_relative_offset_and_a_missing_file(
    tmp: Path,
) -> None:
    path = tmp / "neg.index"
    path.write_bytes(offset_file([(-1, 0)]))
    with pytest.raises(IndexCorrupt):
        OffsetIndex(path, 10, 100).load(BIG_LOG)
    with pytest.raises(IndexCorrupt, match="missing"):
        OffsetIndex(tmp / "absent.index", 0, 100).load(BIG_LOG)
    path.write_bytes(b"")
    empty = OffsetIndex(path, 7, 100)
    empty.load(0)
    assert len(empty) == 0
    assert empty.lookup(100) == (7, 0)


def test_a_failed_load_leaves_the_index_empty_and_usable(tmp: Path) -> None:
    path = tmp / "bad.index"
    path.write_bytes(offset_file([(5, 10), (3, 20)]))
    idx = OffsetIndex(path, 0, 100)
    with pytest.raises(IndexCorrupt):
        idx.load(BIG_LOG)
    assert len(idx) == 0
    idx.reset()  # what recovery does next
    idx.append(4, 0)
    idx.flush(fsync=False)
    assert file_entries(path, OFFSET_ENTRY) == [(4, 0)]


@SETTINGS
@given(entries=time_entries(), base=BASES)
def test_time_index_load_accepts_sane_files(
    tmp: Path, entries: list[tuple[int, int]], base: int
) -> None:
    path = tmp / "sane.timeindex"
    path.write_bytes(time_file(entries))
    idx = TimeIndex(path, base, max_entries=100)
    next_offset = base + max((r for _, r in entries), default=0) + 1
    idx.load(next_offset)
    assert len(idx) == len(entries)
    for ts, _ in entries:
        for probe in (ts - 1, ts, ts + 1):
            assert idx.lookup(probe) == model_time_lookup(base, entries, probe)


@SETTINGS
@given(entries=time_entries(min_size=1), extra=st.integers(1, 11))
def test_time_index_load_rejects_a_partial_entry(
    tmp: Path, entries: list[tuple[int, int]], extra: int
) -> None:
    path = tmp / "partial.timeindex"
    path.write_bytes(time_file(entries) + b"\x01" * extra)
    with pytest.raises(IndexCorrupt, match="partial"):
        TimeIndex(path, 0, 100).load(2**62)


@SETTINGS
@given(entries=time_entries(min_size=2), data=st.data())
def test_time_index_load_rejects_out_of_order_entries(
    tmp: Path, entries: list[tuple[int, int]], data: st.DataObject
) -> None:
    i = data.draw(st.integers(1, len(entries) - 1))
    ts, rel = entries[i]
    prev_ts, prev_rel = entries[i - 1]
    kind = data.draw(st.sampled_from(["ts-equal", "ts-down", "rel-down"]))
    if kind == "ts-equal":
        entries[i] = (prev_ts, rel)
    elif kind == "ts-down":
        entries[i] = (prev_ts - data.draw(st.integers(1, 100)), rel)
    else:
        assume(prev_rel > 0)
        entries[i] = (ts, prev_rel - data.draw(st.integers(1, prev_rel)))
    path = tmp / "disorder.timeindex"
    path.write_bytes(time_file(entries))
    with pytest.raises(IndexCorrupt):
        TimeIndex(path, 0, 100).load(2**62)


@SETTINGS
@given(entries=time_entries(min_size=1), data=st.data(), base=BASES)
def test_time_index_load_rejects_offsets_at_or_past_the_log_end(
    tmp: Path, entries: list[tuple[int, int]], data: st.DataObject, base: int
) -> None:
    last = base + max(r for _, r in entries)
    next_offset = data.draw(st.integers(base, last))
    path = tmp / "past-end.timeindex"
    path.write_bytes(time_file(entries))
    with pytest.raises(IndexCorrupt):
        TimeIndex(path, base, 100).load(next_offset)


def test_time_index_load_rejects_a_negative_relative_offset(tmp: Path) -> None:
    path = tmp / "neg.timeindex"
    path.write_bytes(time_file([(5, -1)]))
    with pytest.raises(IndexCorrupt):
        TimeIndex(path, 100, 10).load(1000)
    with pytest.raises(IndexCorrupt, match="missing"):
        TimeIndex(tmp / "absent.timeindex", 0, 10).load(1000)


@SETTINGS
@given(
    appends=st.lists(st.tuples(st.integers(-100, 100), st.integers(0, 20)), max_size=60),
)
def test_time_index_maybe_append_keeps_timestamps_strictly_increasing(
    tmp: Path, appends: list[tuple[int, int]]
) -> None:
    idx = TimeIndex(tmp / "inc.timeindex", 50, max_entries=1000)
    idx.reset()  # a fresh, empty file for every example
    offset = 50
    largest: int | None = None
    for ts, step in appends:
        offset += step
        before = len(idx)
        idx.maybe_append(ts, offset)
        grew = largest is None or ts > largest
        assert len(idx) == before + (1 if grew else 0)
        if grew:
            largest = ts
            assert idx.last_entry == (ts, offset)
    idx.flush(fsync=False)
    stored = file_entries(idx.path, TIME_ENTRY)
    timestamps = [t for t, _ in stored]
    assert all(a < b for a, b in itertools.pairwise(timestamps))
