"""Model-based tests for core_log.log.PartitionLog: appends, reads, rolls and timestamps.

A Hypothesis state machine drives a real log (tiny segments and index intervals, so there are
many segments and index entries, and a tiny descriptor cache) next to a naive in-memory model:
a list of segments, each a list of batches holding the exact bytes the log must store. After
every step the segment layout, files, offsets and epochs must match the model; a full check
reads at every offset with several ``max_bytes``, iterates the whole log with ``next_offset``
and asks ``offset_for_timestamp`` for many timestamps. Targeted tests follow for roll
conditions, errors, topic compression, LogAppendTime, size limits and follower appends.
"""

from __future__ import annotations

import bisect
import os
import random
import shutil
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)

from core_log.batch import (
    PREFIX,
    Record,
    assemble_batch,
    build_batch,
    iter_records,
    parse_header,
    scan_batches,
)
from core_log.clock import ManualClock
from core_log.compression import Compression
from core_log.config import LogConfig
from core_log.errors import (
    CorruptRecordError,
    InvalidRecordError,
    OffsetOutOfRangeError,
    RecordTooLargeError,
)
from core_log.handles import HandleCache
from core_log.limits import MAX_FETCH_BYTES, MAX_RELATIVE_OFFSET
from core_log.log import PartitionLog
from core_log.segment import segment_name

SETTINGS = settings(
    derandomize=True,
    database=None,
    deadline=None,
    suppress_health_check=[
        HealthCheck.too_slow,
        HealthCheck.filter_too_much,
        HealthCheck.data_too_large,
        HealthCheck.large_base_example,
    ],
)

# The engine fsyncs checkpoints (file and directory); on tmpfs that is free, so the logs live
# there when the machine has one. Nothing here depends on the file system otherwise.
FAST_TMP = "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else None

START_MS = 1_700_000_000_000


def make_tmpdir(prefix: str) -> Path:
    return Path(tempfile.mkdtemp(prefix=f"logbus-{prefix}-", dir=FAST_TMP))


@pytest.fixture
def tmp_path() -> Iterator[Path]:
    d = make_tmpdir("test")
    yield d
    shutil.rmtree(d, ignore_errors=True)


def open_log(
    directory: Path, clock: ManualClock | None = None, /, **config: object
) -> PartitionLog:
    return PartitionLog(
        directory, LogConfig.from_dict(config), clock or ManualClock(START_MS), HandleCache()
    )


def batch(records: list[Record], **kwargs: object) -> bytes:
    """build_batch with records stamped at START_MS unless they carry a timestamp: segment.ms
    counts from the first batch's timestamp, so 1970 timestamps would roll at every batch."""
    return build_batch(records, default_timestamp=START_MS, **kwargs)  # type: ignore[arg-type]


def records_of(data: bytes) -> list[Record]:
    return list(iter_records(data))


def offsets_of(data: bytes) -> list[int]:
    return [r.offset for r in iter_records(data)]


def batch_spans(data: bytes) -> list[tuple[int, int]]:
    return [(h.base_offset, h.last_offset) for _, h in scan_batches(data)]


# ---------------------------------------------------------------------------------------------
# the model
# ---------------------------------------------------------------------------------------------


@dataclass
class MBatch:
    base: int
    last: int
    epoch: int
    records: list[Record]  # with absolute offsets and timestamps
    data: bytes  # exactly what the log must store and return

    @property
    def size(self) -> int:
        return len(self.data)

    @property
    def max_ts(self) -> int:
        return max(r.timestamp for r in self.records)


@dataclass
class MSeg:
    base: int
    batches: list[MBatch] = field(default_factory=list)
    # Recovery re-indexes every index.interval.bytes from position 0, which can give more
    # entries than the appends did (their byte counter restarts at a reopen), so the
    # segment.index.bytes bound is only checked for segments recovery has not rebuilt.
    rebuilt: bool = False
    first_append_ms: int | None = None  # the clock when its first batch was appended

    @property
    def size(self) -> int:
        return sum(b.size for b in self.batches)

    @property
    def next_offset(self) -> int:
        return self.batches[-1].last + 1 if self.batches else self.base

    def _rolling_bases(self) -> list[int]:
        """When segment.ms may start counting: the broker's time of the first append (known
        until a reopen or a truncation re-reads the segment) or its first batch's timestamp."""
        bases = [self.batches[0].max_ts]
        if self.first_append_ms is not None:
            bases.append(self.first_append_ms)
        return bases

    def must_roll_by_time(self, now: int, segment_ms: int) -> bool:
        """Old by every reading of segment.ms (the model does not pin down which one)."""
        return bool(self.batches) and now - max(self._rolling_bases()) >= segment_ms

    def may_roll_by_time(self, now: int, segment_ms: int) -> bool:
        return bool(self.batches) and now - min(self._rolling_bases()) >= segment_ms


class EpochModel:
    def __init__(self) -> None:
        self.entries: list[tuple[int, int]] = []

    def assign(self, epoch: int, offset: int) -> None:
        if epoch < 0 or (self.entries and epoch <= self.entries[-1][0]):
            return
        self.entries = [(e, o) for e, o in self.entries if o < offset]
        self.entries.append((epoch, offset))

    def truncate_from_end(self, end: int) -> None:
        self.entries = [(e, o) for e, o in self.entries if o < end]


def random_records(
    rng: random.Random, n: int, max_value: int, ts_mode: str, cursor: int
) -> tuple[list[Record], int]:
    """``n`` records with random keys/values/headers; timestamps per ``ts_mode``."""
    out = []
    for i in range(n):
        if ts_mode == "increasing":
            cursor += rng.choice([0, 0, 1, 2, 7])
            ts = cursor
        elif ts_mode == "same":
            ts = cursor
        else:  # out of order, before and after the cursor
            ts = max(0, cursor + rng.randint(-5000, 5000))
        key = None if rng.random() < 0.3 else rng.randbytes(rng.randint(0, 8))
        value = None if rng.random() < 0.05 else rng.randbytes(rng.randint(0, max_value))
        headers: tuple[tuple[str, bytes | None], ...] = ()
        if rng.random() < 0.1:
            headers = (("h", b"%d" % i), ("n", None))
        out.append(Record(value, key, headers, ts))
    return out, cursor


def with_offsets(records: list[Record], base: int) -> list[Record]:
    return [Record(r.value, r.key, r.headers, r.timestamp, base + i) for i, r in enumerate(records)]


BATCH_SPEC = st.tuples(
    st.integers(1, 50),  # records
    st.sampled_from([0, 5, 40, 120]),  # max value length
    st.sampled_from(["increasing", "increasing", "same", "out-of-order"]),
    st.sampled_from([Compression.NONE] * 4 + list(Compression)),  # the producer's codec
    st.integers(0, 2**32),  # content seed
)


class LogMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.root = make_tmpdir("log")
        self.dir = self.root / "topic-0"
        self.clock = ManualClock(START_MS)
        self.epoch = 0
        self.epochs = EpochModel()
        self.hw = 0
        self.ts_cursor = START_MS
        self.log: PartitionLog

    # -- setup ------------------------------------------------------------------------------

    @initialize(
        segment_bytes=st.sampled_from([300, 1500, 6000, 100_000]),
        interval=st.sampled_from([0, 100, 1000, 4096]),
        index_bytes=st.sampled_from([16, 40, 10_485_760]),
        segment_ms=st.sampled_from([50, 5000, 604_800_000]),
        max_open=st.sampled_from([1, 3, 64]),
    )
    def open(
        self, segment_bytes: int, interval: int, index_bytes: int, segment_ms: int, max_open: int
    ) -> None:
        self.config = LogConfig.from_dict(
            {
                "segment.bytes": segment_bytes,
                "index.interval.bytes": interval,
                "segment.index.bytes": index_bytes,
                "segment.ms": segment_ms,
            }
        )
        self.max_open = max_open
        self.log = PartitionLog(self.dir, self.config, self.clock, HandleCache(max_open))
        self.segs = [MSeg(0)]

    # -- model helpers -------------------------------------------------------------------------

    @property
    def batches(self) -> list[MBatch]:
        return [b for s in self.segs for b in s.batches]

    @property
    def leo(self) -> int:
        return self.segs[-1].next_offset

    def _place(self, new: list[MBatch]) -> None:
        """Put appended batches into model segments, checking every roll the log made.

        A roll must happen when the active segment is non-empty and full by bytes or old by
        every reading of segment.ms, or when the batch's relative offset would overflow; the
        other allowed reasons are being old by some reading of segment.ms and a full index
        (checked on the real rolled segment).
        """
        real = {s.base_offset: s for s in self.log.segments}
        bases = sorted(real)
        now = self.clock.now_ms()
        c = self.config
        for b in new:
            active = self.segs[-1]
            must_roll = (
                active.size > 0
                and (
                    active.must_roll_by_time(now, c.segment_ms)
                    or active.size + b.size > c.segment_bytes
                )
            ) or b.last - active.base > MAX_RELATIVE_OFFSET
            holder = bases[bisect.bisect_right(bases, b.base) - 1]
            rolled = holder != active.base
            assert rolled or not must_roll, f"batch {b.base} should have started a segment"
            if rolled:
                assert holder == b.base, "a new segment is named after its first batch"
                if not must_roll and not active.may_roll_by_time(now, c.segment_ms):
                    old = real.get(active.base)
                    assert active.size > 0 and old is not None
                    assert old.offset_index.is_full or old.time_index.is_full, (
                        f"unexpected roll before batch {b.base}"
                    )
                if active.size == 0:
                    self.segs.pop()  # an empty active segment is replaced, not kept
                self.segs.append(MSeg(b.base))
            if not self.segs[-1].batches:
                self.segs[-1].first_append_ms = now
            self.segs[-1].batches.append(b)
            self.epochs.assign(b.epoch, b.base)

    def _make(self, spec: tuple[int, int, str, Compression, int]) -> list[Record]:
        n, max_value, ts_mode, _, seed = spec
        # Timestamps follow the clock (the cursor never goes back), some out of order by up to
        # 5 s either way, so segment.ms (50 ms, 5 s, 7 days) matters.
        self.ts_cursor = max(self.ts_cursor, self.clock.now_ms())
        records, self.ts_cursor = random_records(
            random.Random(seed), n, max_value, ts_mode, self.ts_cursor
        )
        return records

    # -- appends --------------------------------------------------------------------------------

    @rule(
        specs=st.lists(BATCH_SPEC, min_size=1, max_size=3),
        new_epoch=st.booleans(),
    )
    def append_as_leader(
        self, specs: list[tuple[int, int, str, Compression, int]], new_epoch: bool
    ) -> None:
        if new_epoch or self.epoch == 0:
            self.epoch += 1
        raws, recs = [], []
        for spec in specs:
            records = self._make(spec)
            raws.append(build_batch(records, compression=spec[3]))
            recs.append(records)
        request = b"".join(raws)
        leo = self.leo
        result = self.log.append(request, leader_epoch=self.epoch)
        new = []
        offset = leo
        for raw, records in zip(raws, recs, strict=True):
            h = parse_header(raw)
            data = PREFIX.pack(offset, h.batch_length, self.epoch) + raw[PREFIX.size :]
            n = len(records)
            new.append(
                MBatch(offset, offset + n - 1, self.epoch, with_offsets(records, offset), data)
            )
            offset += n
        assert (result.base_offset, result.last_offset) == (leo, offset - 1)
        assert (result.batches, result.records) == (len(specs), offset - leo)
        assert result.size_bytes == len(request)
        assert result.log_append_time_ms == -1
        self._place(new)

    @rule(
        specs=st.lists(BATCH_SPEC, min_size=1, max_size=2),
        gap=st.sampled_from([0, 0, 0, 1, 17]),
        jump=st.booleans(),
        new_epoch=st.booleans(),
    )
    def append_as_follower(
        self,
        specs: list[tuple[int, int, str, Compression, int]],
        gap: int,
        jump: bool,
        new_epoch: bool,
    ) -> None:
        """Replicated batches keep the leader's offsets (gaps allowed) and epochs."""
        if new_epoch or self.epoch == 0:
            self.epoch += 1
        if jump and self.batches:  # past the 32-bit relative offset of the active segment
            gap = MAX_RELATIVE_OFFSET + 1 + gap
        base = self.leo + gap
        new, raws = [], []
        for spec in specs:
            records = self._make(spec)
            raw = build_batch(
                records, base_offset=base, partition_leader_epoch=self.epoch, compression=spec[3]
            )
            raws.append(raw)
            new.append(
                MBatch(base, base + len(records) - 1, self.epoch, with_offsets(records, base), raw)
            )
            base += len(records)
        result = self.log.append(b"".join(raws), as_follower=True)
        assert (result.base_offset, result.last_offset) == (new[0].base, new[-1].last)
        self._place(new)

    @precondition(lambda self: self.leo > 0)
    @rule(back=st.integers(1, 5))
    def follower_batch_below_the_leo_is_rejected(self, back: int) -> None:
        base = max(0, self.leo - back)
        raw = build_batch([Record(b"late")], base_offset=base, partition_leader_epoch=self.epoch)
        size = self.log.size_bytes
        with pytest.raises(InvalidRecordError):
            self.log.append(raw, as_follower=True)
        assert self.log.size_bytes == size

    # -- offsets, time, truncation, reopen ------------------------------------------------------

    @rule(data=st.data())
    def set_high_watermark(self, data: st.DataObject) -> None:
        boundaries = [b.last + 1 for b in self.batches]
        target = data.draw(
            st.sampled_from([self.hw, self.leo, *boundaries[-3:]]) | st.integers(0, self.leo + 5)
        )
        expected = max(self.hw, min(target, self.leo))
        assert self.log.set_high_watermark(target) == expected
        self.hw = expected

    @rule(ms=st.sampled_from([0, 1, 10, 49, 50, 51, 1000, 5000, 86_400_000]))
    def advance_clock(self, ms: int) -> None:
        self.clock.advance(ms)

    @rule()
    def roll_if_expired(self) -> None:
        active = self.segs[-1]
        now, segment_ms = self.clock.now_ms(), self.config.segment_ms
        rolled = self.log.roll_if_expired()
        if active.must_roll_by_time(now, segment_ms):
            assert rolled
        if not active.may_roll_by_time(now, segment_ms):
            assert not rolled
        if rolled:
            self.segs.append(MSeg(active.next_offset))

    @rule(data=st.data())
    def truncate_to(self, data: st.DataObject) -> None:
        batches = self.batches
        candidates = [0, self.leo] + [b.base for b in batches[-4:]] + [b.last for b in batches[-4:]]
        target = data.draw(st.sampled_from(candidates) | st.integers(0, self.leo + 1))
        new_leo = self.log.truncate_to(target)
        if target < self.leo:
            while len(self.segs) > 1 and self.segs[-1].base >= target:
                self.segs.pop()
            active = self.segs[-1]
            kept = [b for b in active.batches if b.last < target]
            if kept != active.batches:
                active.first_append_ms = None  # the segment is re-read from its file
            active.batches = kept
            self.epochs.truncate_from_end(self.leo)
            self.hw = min(self.hw, self.leo)
        assert new_leo == self.leo

    @rule(crash=st.booleans())
    def reopen(self, crash: bool) -> None:
        """Close and reopen (clean), or reopen after a checkpoint without closing (unclean)."""
        if crash:
            self.log.write_checkpoint()
            for s in self.log.segments:  # release descriptors, as the dying process would
                s.close()
        else:
            self.log.close()
        self.log = PartitionLog(
            self.dir, self.config, self.clock, HandleCache(self.max_open), clean_shutdown=not crash
        )
        if crash and len(self.segs) > 1 and not self.segs[-1].batches:
            # Recovery drops an empty active segment after a non-empty one. After a follower
            # gap the LEO was that empty segment's base, so it moves back to the end of the
            # last batch, and the high watermark and epochs are clamped to it.
            self.segs.pop()
            self.hw = min(self.hw, self.leo)
            self.epochs.truncate_from_end(self.leo)
        for m in self.segs:
            m.rebuilt = m.rebuilt or crash
            m.first_append_ms = None  # only the files are left
        if not crash:
            assert self.log.recovered_bytes_truncated == 0

    # -- checks ------------------------------------------------------------------------------

    @invariant()
    def layout_matches_model(self) -> None:
        log = self.log
        assert log.log_end_offset == self.leo
        assert log.high_watermark == self.hw
        assert log.log_start_offset == 0
        assert log.epochs.entries == self.epochs.entries
        real = log.segments
        assert [s.base_offset for s in real] == [m.base for m in self.segs]
        assert [s.size for s in real] == [m.size for m in self.segs]
        assert [s.next_offset for s in real] == [m.next_offset for m in self.segs]
        assert log.size_bytes == sum(m.size for m in self.segs)
        max_entries = max(1, self.config.segment_index_bytes // 8)
        for s, m in zip(real, self.segs, strict=True):
            assert s.size <= self.config.segment_bytes or len(m.batches) == 1
            assert m.rebuilt or len(s.offset_index) <= max_entries
            assert s.log_path.name == f"{m.base:020d}.log"
        assert all(m.batches for m in self.segs[:-1]), "only the active segment may be empty"
        names = sorted(p.name for p in self.dir.iterdir())
        logs = [n for n in names if n.endswith(".log")]
        assert logs == [f"{segment_name(m.base)}.log" for m in self.segs]
        assert all(len(n) == len("00000000000000000000.log") for n in logs)
        for n in names:
            stem, _, suffix = n.partition(".")
            if suffix in ("index", "timeindex"):
                assert f"{stem}.log" in logs, f"stray index file {n}"

    @rule(data=st.data())
    def full_check(self, data: st.DataObject) -> None:
        self._full_check(random.Random(data.draw(st.integers(0, 2**32))))

    def _full_check(self, rng: random.Random) -> None:
        batches = self.batches
        seg_of = [i for i, s in enumerate(self.segs) for _ in s.batches]
        lasts = [b.last for b in batches]
        leo, hw = self.leo, self.hw
        log = self.log

        def expected_run(
            offset: int, max_bytes: int, upper: int, max_records: int | None = None
        ) -> list[int]:
            max_bytes = max(1, min(max_bytes, MAX_FETCH_BYTES))
            # with max_records: no batch after the one holding the last offset wanted
            last_wanted = leo if max_records is None else offset + max_records - 1
            if offset >= upper:
                return []
            i = bisect.bisect_left(lasts, offset)
            if i == len(batches) or batches[i].last >= upper:
                return []
            run, total = [i], batches[i].size
            j = i + 1
            while (
                j < len(batches)
                and seg_of[j] == seg_of[i]
                and batches[j].last < upper
                and total + batches[j].size <= max_bytes
                and batches[j].base <= last_wanted
            ):
                run.append(j)
                total += batches[j].size
                j += 1
            return run

        def check_read(
            offset: int, max_bytes: int, max_offset: int | None, max_records: int | None = None
        ) -> None:
            upper = hw if max_offset is None else min(max_offset, leo)
            res = log.read(offset, max_bytes, max_offset=max_offset, max_records=max_records)
            assert (res.high_watermark, res.log_start_offset, res.log_end_offset) == (hw, 0, leo)
            run = expected_run(offset, max_bytes, upper, max_records)
            if not run:
                assert (res.data, res.first_offset, res.next_offset) == (b"", offset, offset)
                return
            first, last = batches[run[0]], batches[run[-1]]
            assert res.data == b"".join(batches[i].data for i in run), (offset, max_bytes, upper)
            assert res.first_offset == first.base
            assert first.base <= offset <= first.last or offset < first.base
            after = batches[run[-1] + 1].base if run[-1] + 1 < len(batches) else last.last + 1
            assert last.last + 1 <= res.next_offset <= after
            assert last.last < upper

        # (a) a read at every offset (sampled when a follower jump made the range huge)
        if leo <= 2000:
            offsets = list(range(leo + 1))
        else:
            probe = {0, leo, hw, max(0, hw - 1), leo - 1}
            for b in batches:
                probe.update({b.base, b.last, (b.base + b.last) // 2, b.base - 1, b.last + 1})
            offsets = sorted(o for o in probe if 0 <= o <= leo)
        sizes = [1, 100, 700, 3000, 1 << 20, 0, -5]
        for offset in offsets:
            check_read(offset, rng.choice(sizes), None)
            if rng.random() < 0.3:
                check_read(offset, rng.choice(sizes), leo)
            if rng.random() < 0.1:
                check_read(offset, rng.choice(sizes), rng.randint(0, leo + 3))
            if rng.random() < 0.5:
                wanted = rng.choice([1, 2, 5, 17, 100, 10**6])
                ends = [b.last for b in batches if b.last >= offset]
                if ends and rng.random() < 0.5:  # up to a batch's end: the next one is out
                    wanted = rng.choice(ends) - offset + 1 + rng.choice([0, 0, 1])
                max_offset = rng.choice([None, None, leo, rng.randint(0, leo + 3)])
                check_read(offset, rng.choice(sizes), max_offset, wanted)

        # (a) iterate with next_offset: every record below the high watermark, once, in order
        for max_bytes in (1, 2500, 1 << 20):
            offset, got = 0, []
            while True:
                res = log.read(offset, max_bytes)
                if not res.data:
                    break
                assert res.next_offset > offset
                got.extend(records_of(res.data))
                offset = res.next_offset
            expected = [r for b in batches if b.last < hw for r in b.records]
            assert got == expected

        # (d) reading at the high watermark answers no data; outside [start, LEO] is an error
        assert log.read(hw, 1 << 20).data == b""
        for bad in (-1, leo + 1, leo + 1000):
            with pytest.raises(OffsetOutOfRangeError) as info:
                log.read(bad, 100)
            assert (info.value.log_start_offset, info.value.log_end_offset) == (0, leo)
            assert info.value.offset == bad

        # (b) offset_for_timestamp == the first record whose timestamp is >= ts
        stamped = [(r.offset, r.timestamp) for b in batches for r in b.records]
        stamps = sorted({t for _, t in stamped})
        probes = {0, -1, START_MS * 2}
        if stamps:
            probes.update({stamps[0] - 1, stamps[0], stamps[-1], stamps[-1] + 1})
            for t in rng.sample(stamps, min(len(stamps), 40)):
                probes.update({t - 1, t, t + 1})
        for ts in sorted(probes):
            want = next((o for o, t in stamped if t >= ts), None)
            assert log.offset_for_timestamp(ts) == want, ts

    def teardown(self) -> None:
        try:
            if hasattr(self, "log"):
                self._full_check(random.Random(0))
        finally:
            if hasattr(self, "log"):
                self.log.close()
            shutil.rmtree(self.root, ignore_errors=True)


TestLogModel = LogMachine.TestCase
TestLogModel.settings = settings(SETTINGS, max_examples=80, stateful_step_count=40)


# ---------------------------------------------------------------------------------------------
# a seeded random workload at a larger scale (no shrinking, but long logs)
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_seeded_workload_reads_and_timestamps(tmp_path: Path, seed: int) -> None:
    rng = random.Random(seed)
    clock = ManualClock(START_MS)
    cfg = {"segment.bytes": rng.choice([500, 2000]), "index.interval.bytes": rng.choice([0, 200])}
    log = open_log(tmp_path / "p", clock, **cfg)
    expected: list[Record] = []
    cursor = START_MS
    for _ in range(150):
        n = rng.randint(1, 50)
        mode = rng.choice(["increasing", "increasing", "out-of-order"])
        records, cursor = random_records(rng, n, rng.choice([0, 20, 80]), mode, cursor)
        appended = log.append(batch(records), leader_epoch=1)
        expected.extend(with_offsets(records, appended.base_offset))
        if rng.random() < 0.2:
            clock.advance(rng.randint(0, 10))
    log.set_high_watermark(log.log_end_offset)
    assert len(log.segments) > 10
    for max_bytes in (1, 4000):
        offset, got = 0, []
        while offset < log.high_watermark:
            res = log.read(offset, max_bytes)
            got.extend(records_of(res.data))
            offset = res.next_offset
        assert got == expected
    for offset in range(0, log.log_end_offset, 7):
        res = log.read(offset, 1)
        (base, last), *_ = batch_spans(res.data)
        assert base <= offset <= last
    stamps = sorted({r.timestamp for r in expected})
    for ts in [stamps[0] - 1, *rng.sample(stamps, 60), stamps[-1], stamps[-1] + 1]:
        want = next((r.offset for r in expected if r.timestamp >= ts), None)
        assert log.offset_for_timestamp(ts) == want
    log.close()


# ---------------------------------------------------------------------------------------------
# (a) reads
# ---------------------------------------------------------------------------------------------


def test_read_returns_whole_batches_within_max_bytes_but_at_least_one(tmp_path: Path) -> None:
    log = open_log(tmp_path / "p")
    sizes = []
    for n in (3, 4, 5):
        raw = batch([Record(b"x" * 100)] * n)
        sizes.append(len(raw))
        log.append(raw)
    log.set_high_watermark(12)
    assert batch_spans(log.read(0, 1).data) == [(0, 2)]  # one batch even though it is too big
    assert batch_spans(log.read(0, sizes[0] + sizes[1] - 1).data) == [(0, 2)]
    assert batch_spans(log.read(0, sizes[0] + sizes[1]).data) == [(0, 2), (3, 6)]
    res = log.read(5, sizes[1] + sizes[2])  # starts with the batch holding 5
    assert batch_spans(res.data) == [(3, 6), (7, 11)]
    assert (res.first_offset, res.next_offset) == (3, 12)
    assert log.read(4, 10**12).data == res.data  # max_bytes is capped, not an error
    log.close()


def test_reads_stop_after_the_batch_holding_the_last_record_wanted(tmp_path: Path) -> None:
    log = open_log(tmp_path / "p")
    for _ in range(4):
        log.append(batch([Record(b"v")] * 5))  # [0,4] [5,9] [10,14] [15,19]
    log.set_high_watermark(20)
    assert batch_spans(log.read(0, 1 << 20, max_records=5).data) == [(0, 4)]
    assert batch_spans(log.read(0, 1 << 20, max_records=6).data) == [(0, 4), (5, 9)]
    assert batch_spans(log.read(0, 1 << 20, max_records=10).data) == [(0, 4), (5, 9)]
    res = log.read(3, 1 << 20, max_records=8)  # 3..10: the batch holding 10 too
    assert batch_spans(res.data) == [(0, 4), (5, 9), (10, 14)]
    assert res.next_offset == 15
    assert batch_spans(log.read(3, 1, max_records=100).data) == [(0, 4)]  # max_bytes first
    assert log.read(0, 1 << 20, max_records=10**6).data == log.read(0, 1 << 20).data
    committed = log.read_committed(6, 1 << 20, max_records=1)
    assert batch_spans(committed.data) == [(5, 9)]
    log.close()


def test_reads_stop_at_the_high_watermark_or_max_offset(tmp_path: Path) -> None:
    log = open_log(tmp_path / "p")
    for _ in range(4):
        log.append(batch([Record(b"v")] * 5))  # [0,4] [5,9] [10,14] [15,19]
    assert log.read(0, 1 << 20).data == b""  # high watermark 0: nothing is visible yet
    log.set_high_watermark(10)
    res = log.read(0, 1 << 20)
    assert batch_spans(res.data) == [(0, 4), (5, 9)]
    assert res.next_offset == 10
    at_hw = log.read(10, 1 << 20)
    assert (at_hw.data, at_hw.first_offset, at_hw.next_offset) == (b"", 10, 10)
    assert log.read(19, 1 << 20).data == b""  # between the HW and the LEO: nothing either
    assert log.read(20, 1 << 20).data == b""  # at the LEO
    follower = log.read(0, 1 << 20, max_offset=log.log_end_offset)
    assert offsets_of(follower.data) == list(range(20))
    assert batch_spans(log.read(0, 1 << 20, max_offset=15).data) == [(0, 4), (5, 9), (10, 14)]
    assert log.read(0, 1 << 20, max_offset=12).data == log.read(0, 1 << 20).data  # mid-batch
    assert log.read(0, 1 << 20, max_offset=10**9).data == follower.data
    log.set_high_watermark(3)  # the high watermark never moves back
    assert log.high_watermark == 10
    assert log.set_high_watermark(10**6) == 20  # clamped to the LEO
    log.close()


def test_offset_out_of_range_carries_the_valid_range(tmp_path: Path) -> None:
    log = open_log(tmp_path / "p", **{"segment.bytes": 200})
    for _ in range(10):
        log.append(batch([Record(b"x" * 40)] * 3))
    log.set_high_watermark(30)
    log.increment_log_start_offset(12)
    assert log.log_start_offset == 12
    for bad, lso, leo in [(11, 12, 30), (0, 12, 30), (31, 12, 30), (-1, 12, 30)]:
        with pytest.raises(OffsetOutOfRangeError) as info:
            log.read(bad, 100)
        err = info.value
        assert (err.offset, err.log_start_offset, err.log_end_offset) == (bad, lso, leo)
        assert err.detail == {"offset": bad, "log_start_offset": lso, "log_end_offset": leo}
        assert err.code.http_status == 416
    assert offsets_of(log.read(12, 1).data) == [12, 13, 14]
    assert log.read(30, 100).data == b""
    log.close()


# ---------------------------------------------------------------------------------------------
# (b) offset_for_timestamp
# ---------------------------------------------------------------------------------------------


def test_offset_for_timestamp_examples(tmp_path: Path) -> None:
    log = open_log(tmp_path / "p", **{"segment.bytes": 300, "index.interval.bytes": 0})
    assert log.offset_for_timestamp(0) is None  # empty log
    stamps = [100, 100, 90, 200, 150, 150, 300, 50, 301, 301]
    for i in range(0, len(stamps), 2):
        log.append(batch([Record(b"x" * 50, timestamp=t) for t in stamps[i : i + 2]]))
    assert len(log.segments) > 2
    for ts in [-1, 0, 50, 51, 90, 99, 100, 101, 150, 151, 200, 201, 299, 300, 301]:
        want = next(o for o, t in enumerate(stamps) if t >= ts)
        assert log.offset_for_timestamp(ts) == want, ts
    assert log.offset_for_timestamp(302) is None
    log.close()


def test_offset_for_timestamp_ignores_records_below_the_log_start(tmp_path: Path) -> None:
    log = open_log(tmp_path / "p")
    log.append(batch([Record(b"a", timestamp=1000), Record(b"b", timestamp=10)]))
    log.append(batch([Record(b"c", timestamp=20)]))
    log.set_high_watermark(3)
    log.increment_log_start_offset(1)  # record 0 (timestamp 1000) is deleted
    try:
        assert log.offset_for_timestamp(5) == 1
        assert log.offset_for_timestamp(15) == 2  # record 1 (timestamp 10) is too old
        assert log.offset_for_timestamp(500) is None  # only the deleted record was that new
    finally:
        log.close()


# ---------------------------------------------------------------------------------------------
# (c) roll conditions and file names
# ---------------------------------------------------------------------------------------------


def bases(log: PartitionLog) -> list[int]:
    return [s.base_offset for s in log.segments]


def test_roll_on_segment_bytes(tmp_path: Path) -> None:
    raw = batch([Record(b"x" * 50)])
    log = open_log(tmp_path / "p", **{"segment.bytes": 3 * len(raw)})
    for _ in range(10):
        log.append(raw)
    assert bases(log) == [0, 3, 6, 9]
    assert all(s.size <= 3 * len(raw) for s in log.segments)
    big = batch([Record(b"y" * 2000)])  # bigger than a segment: alone in its own
    log.append(big)
    log.append(raw)
    assert bases(log) == [0, 3, 6, 9, 10, 11]
    assert log.segments[-2].size == len(big)
    log.close()


def test_roll_on_segment_ms(tmp_path: Path) -> None:
    clock = ManualClock(START_MS)
    log = open_log(tmp_path / "p", clock, **{"segment.ms": 1000})

    def now_batch() -> bytes:  # a producer stamping records with the current time
        return batch([Record(b"x", timestamp=clock.now_ms())])

    log.append(now_batch())
    clock.advance(999)
    log.append(now_batch())
    assert bases(log) == [0]
    assert not log.roll_if_expired()
    clock.advance(1)
    log.append(now_batch())  # segment.ms has passed: the append starts a new segment
    assert bases(log) == [0, 2]
    clock.advance(5000)
    assert log.roll_if_expired()  # the timer rolls without an append
    assert bases(log) == [0, 2, 3]
    assert not log.roll_if_expired()  # an empty active segment never rolls
    clock.advance(5000)
    assert not log.roll_if_expired()
    log.append(now_batch())
    assert bases(log) == [0, 2, 3]
    assert not log.roll_if_expired()
    assert all((tmp_path / "p" / f"{b:020d}.log").exists() for b in bases(log))
    log.close()


def test_old_create_times_do_not_roll_a_segment_per_batch(tmp_path: Path) -> None:
    clock = ManualClock(START_MS)
    log = open_log(tmp_path / "p", clock, **{"segment.ms": 3_600_000})  # one hour
    day_ago = START_MS - 86_400_000
    for i in range(5):  # five minutes of day-old data, appended now
        log.append(batch([Record(b"old", timestamp=day_ago + i * 60_000)]))
    try:
        assert bases(log) == [0]
    finally:
        log.close()


def test_segment_ms_counts_from_the_first_batch_of_a_segment_created_empty(
    tmp_path: Path,
) -> None:
    clock = ManualClock(START_MS)
    log = open_log(tmp_path / "p", clock, **{"segment.ms": 1000})
    log.append(batch([Record(b"a", timestamp=clock.now_ms())]))
    clock.advance(1000)
    assert log.roll_if_expired()  # the janitor rolls: segment 1 is created, empty
    clock.advance(10_000)  # the partition is idle for a while
    log.append(batch([Record(b"b", timestamp=clock.now_ms())]))
    log.append(batch([Record(b"c", timestamp=clock.now_ms())]))  # same millisecond
    try:
        assert bases(log) == [0, 1], "a 0 ms old segment was rolled"
        assert not log.roll_if_expired()
    finally:
        log.close()


def test_segment_ms_survives_a_restart(tmp_path: Path) -> None:
    clock = ManualClock(START_MS)
    log = open_log(tmp_path / "p", clock, **{"segment.ms": 1000})
    log.append(batch([Record(b"a", timestamp=clock.now_ms())]))
    log.close()
    clock.advance(900)
    reopened = PartitionLog(tmp_path / "p", log.config, clock, HandleCache(), clean_shutdown=True)
    clock.advance(200)  # the first batch is now 1100 ms old
    reopened.append(batch([Record(b"b", timestamp=clock.now_ms())]))
    try:
        assert bases(reopened) == [0, 1]
    finally:
        reopened.close()


def test_roll_when_the_offset_index_is_full(tmp_path: Path) -> None:
    # segment.index.bytes 16: two 8-byte entries; index.interval.bytes 0: one entry per batch.
    log = open_log(tmp_path / "p", **{"segment.index.bytes": 16, "index.interval.bytes": 0})
    for _ in range(7):
        log.append(batch([Record(b"x")] * 2))
    assert bases(log) == [0, 4, 8, 12]
    for s in log.segments:
        assert len(s.offset_index) <= 2
    log.set_high_watermark(14)
    assert offsets_of(log.read(0, 1 << 20, max_offset=14).data) == [0, 1, 2, 3]
    log.close()


def test_roll_when_the_relative_offset_would_overflow(tmp_path: Path) -> None:
    log = open_log(tmp_path / "p")
    log.append(batch([Record(b"a")] * 3, partition_leader_epoch=1), as_follower=True)
    far = 3 + 2**31 + 10  # more than 2**31 past the active segment's base
    log.append(
        batch([Record(b"b")] * 2, base_offset=far, partition_leader_epoch=2),
        as_follower=True,
    )
    assert bases(log) == [0, far]
    assert log.log_end_offset == far + 2
    names = sorted(p.name for p in (tmp_path / "p").glob("*.log"))
    assert names == [f"{0:020d}.log", f"{far:020d}.log"]
    assert all(len(n) == 24 for n in names)
    log.set_high_watermark(far + 2)
    assert offsets_of(log.read(3, 1 << 20).data) == [far, far + 1]  # across the gap
    assert offsets_of(log.read(far + 1, 1).data) == [far, far + 1]
    log.append(batch([Record(b"c")]), leader_epoch=3)
    assert log.log_end_offset == far + 3
    assert log.epochs.entries == [(1, 0), (2, far), (3, far + 2)]
    log.close()
    reopened = PartitionLog(
        tmp_path / "p", LogConfig(), ManualClock(START_MS), HandleCache(), clean_shutdown=True
    )
    assert bases(reopened) == [0, far]
    assert reopened.log_end_offset == far + 3
    reopened.close()


# ---------------------------------------------------------------------------------------------
# (e) topic configs, limits, bad requests, followers
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("codec", ["lz4", "gzip", "snappy", "zstd", "uncompressed"])
@pytest.mark.parametrize("producer", [Compression.NONE, Compression.GZIP])
def test_topic_compression_recompresses_producer_batches(
    tmp_path: Path, codec: str, producer: Compression
) -> None:
    log = open_log(tmp_path / "p", **{"compression.type": codec})
    rng = random.Random(7)
    records, _ = random_records(rng, 30, 60, "out-of-order", START_MS)
    records += [Record(b"z" * 500, b"k", timestamp=START_MS)] * 5  # compressible
    log.append(batch(records[:20], compression=producer), leader_epoch=3)
    log.append(batch(records[20:], compression=producer), leader_epoch=3)
    log.set_high_watermark(log.log_end_offset)
    data = log.read(0, 1 << 20).data
    target = Compression.NONE if codec == "uncompressed" else Compression.from_name(codec)
    headers = [h for _, h in scan_batches(data)]
    assert [h.compression for h in headers] == [target, target]
    assert [h.partition_leader_epoch for h in headers] == [3, 3]
    assert records_of(data) == with_offsets(records, 0)
    assert log.offset_for_timestamp(START_MS) == next(
        i for i, r in enumerate(records) if r.timestamp >= START_MS
    )
    log.close()


def test_log_append_time_stamps_the_clock(tmp_path: Path) -> None:
    clock = ManualClock(START_MS)
    log = open_log(tmp_path / "p", clock, **{"message.timestamp.type": "LogAppendTime"})
    first = log.append(batch([Record(b"a", timestamp=5), Record(b"b", timestamp=9)]))
    assert first.log_append_time_ms == START_MS
    clock.advance(250)
    second = log.append(batch([Record(b"c", timestamp=START_MS * 2)]))
    assert second.log_append_time_ms == START_MS + 250
    log.set_high_watermark(3)
    data = log.read(0, 1 << 20).data
    assert [(r.offset, r.timestamp) for r in records_of(data)] == [
        (0, START_MS),
        (1, START_MS),
        (2, START_MS + 250),
    ]
    assert all(h.log_append_time for _, h in scan_batches(data))
    assert log.offset_for_timestamp(START_MS + 1) == 2
    assert log.offset_for_timestamp(START_MS * 2) is None  # the producer's time is gone
    # Followers keep the leader's stamps.
    follower = log.append(batch([Record(b"d", timestamp=42)], base_offset=3), as_follower=True)
    assert follower.log_append_time_ms == -1
    log.set_high_watermark(4)
    assert [r.timestamp for r in records_of(log.read(3, 100).data)] == [42]
    log.close()


def test_max_message_bytes_rejects_the_request_and_appends_nothing(tmp_path: Path) -> None:
    small = batch([Record(b"x")])
    big = batch([Record(b"y" * 400)])
    log = open_log(tmp_path / "p", **{"max.message.bytes": len(big) - 1})
    log.append(small)
    size = log.size_bytes
    for request in (big, small + big, big + small):
        with pytest.raises(RecordTooLargeError) as info:
            log.append(request)
        assert info.value.detail["max_message_bytes"] == len(big) - 1
    assert log.log_end_offset == 1
    assert log.size_bytes == size
    log.append(batch([Record(b"y" * (400 - 1))]))  # exactly at the limit: accepted
    assert log.log_end_offset == 2
    log.close()


def test_max_message_bytes_applies_to_the_batch_as_stored(tmp_path: Path) -> None:
    log = open_log(
        tmp_path / "p", **{"compression.type": "uncompressed", "max.message.bytes": 10_000}
    )
    raw = batch([Record(b"z" * 100_000)], compression=Compression.GZIP)
    assert len(raw) < 10_000  # small on the wire, 100 kB once decompressed
    try:
        with pytest.raises(RecordTooLargeError):
            log.append(raw)
        assert log.size_bytes == 0
    finally:
        log.close()


def test_a_batch_whose_compressed_records_are_garbage_appends_nothing(tmp_path: Path) -> None:
    """The CRC covers the compressed bytes, so a valid CRC says nothing about the records."""
    garbage = assemble_batch(
        b"\x1f\x8b not really gzip",
        base_offset=0,
        partition_leader_epoch=-1,
        attributes=int(Compression.GZIP),
        last_offset_delta=0,
        base_timestamp=0,
        max_timestamp=0,
        producer_id=-1,
        producer_epoch=-1,
        base_sequence=-1,
        record_count=1,
    )
    for codec in ("producer", "lz4"):
        log = open_log(tmp_path / codec, **{"compression.type": codec})
        with pytest.raises(CorruptRecordError):
            log.append(batch([Record(b"fine")]) + garbage)
        assert (log.log_end_offset, log.size_bytes) == (0, 0)
        log.close()


@pytest.mark.parametrize("where", ["crc", "length", "truncated", "magic"])
def test_a_corrupt_batch_anywhere_in_a_request_appends_nothing(tmp_path: Path, where: str) -> None:
    log = open_log(tmp_path / "p")
    log.append(batch([Record(b"first")]))
    good = [batch([Record(b"v%d" % i)] * (i + 1)) for i in range(3)]
    bad = bytearray(good[1])
    if where == "crc":
        bad[-1] ^= 0xFF
    elif where == "length":
        bad[8:12] = (len(bad) - 12 + 1000).to_bytes(4, "big")
    elif where == "magic":
        bad[16] = 1
    else:
        bad = bad[:-3]
    request = good[0] + bytes(bad) + (good[2] if where != "truncated" else b"")
    size, leo = log.size_bytes, log.log_end_offset
    with pytest.raises(CorruptRecordError):
        log.append(request)
    assert (log.size_bytes, log.log_end_offset) == (size, leo)
    assert log.epochs.entries == [(0, 0)]
    with pytest.raises(InvalidRecordError):
        log.append(b"")
    log.close()


def test_producer_batches_must_be_well_formed(tmp_path: Path) -> None:
    log = open_log(tmp_path / "p")
    gapped = batch([Record(b"a"), Record(b"b")], last_offset_delta=5)  # compacted shape
    with pytest.raises(InvalidRecordError):
        log.append(gapped)
    control = batch([Record(b"c")], is_control=True)
    with pytest.raises(InvalidRecordError):
        log.append(control)
    assert log.log_end_offset == 0
    log.append(gapped, as_follower=True)  # replication keeps the leader's batches as they are
    assert log.log_end_offset == 6
    log.close()


def test_follower_append_keeps_offsets_and_epochs(tmp_path: Path) -> None:
    log = open_log(tmp_path / "p")
    b1 = batch([Record(b"a")] * 4, base_offset=0, partition_leader_epoch=2)
    b2 = batch([Record(b"b")] * 2, base_offset=4, partition_leader_epoch=2)
    b3 = batch([Record(b"c")] * 3, base_offset=10, partition_leader_epoch=5)  # a gap
    res = log.append(b1 + b2 + b3, as_follower=True, leader_epoch=99)  # leader_epoch unused
    assert (res.base_offset, res.last_offset, res.batches, res.records) == (0, 12, 3, 9)
    assert log.log_end_offset == 13
    assert log.epochs.entries == [(2, 0), (5, 10)]
    log.set_high_watermark(13)
    data = log.read(0, 1 << 20).data
    assert data == b1 + b2 + b3  # byte for byte
    assert offsets_of(log.read(6, 1).data) == [10, 11, 12]  # the gap reads as the next batch
    for base in (0, 12):  # below the LEO: rejected, nothing written
        with pytest.raises(InvalidRecordError):
            log.append(batch([Record(b"x")], base_offset=base), as_follower=True)
    overlapping = batch([Record(b"y")], base_offset=13) + batch([Record(b"z")], base_offset=13)
    with pytest.raises(InvalidRecordError):
        log.append(overlapping, as_follower=True)
    assert log.log_end_offset == 13
    assert log.size_bytes == len(data)
    log.close()


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.integers(0, 50), min_size=1, max_size=20_000),
    st.integers(-1, 52),
    st.integers(0, 20_000),
    st.sampled_from([Compression.NONE, Compression.ZSTD]),
)
def test_first_at_or_after_agrees_with_decoding(
    stamps: list[int], target: int, min_offset: int, compression: Compression
) -> None:
    """The timestamp search (a C column walk in chunks) finds what decoding every record
    finds, whatever the order of timestamps, across chunk boundaries, compressed or not."""
    from core_log.batch import decode_records, parse_header
    from core_log.segment import first_at_or_after

    base = 1_700_000_000_000
    data = build_batch(
        [Record(b"v", timestamp=base + t) for t in stamps], base_offset=7, compression=compression
    )
    expected = next(
        (
            r.offset
            for r in decode_records(data)
            if r.timestamp >= base + target and r.offset >= min_offset
        ),
        None,
    )
    assert first_at_or_after(data, parse_header(data), base + target, min_offset) == expected


def test_try_append_declines_whatever_would_roll_or_store(tmp_path: Path) -> None:
    """The event loop's append gives up (None, nothing written) when the append would roll a
    segment — by size, by ``segment.ms``, or because a later batch of the request would find
    the index full — or store a new leader epoch; otherwise it appends."""
    clock = ManualClock(1_700_000_000_000)
    cfg = LogConfig.from_dict(
        {"segment.index.bytes": 32, "index.interval.bytes": 1, "segment.bytes": 1000}
    )
    log = PartitionLog(tmp_path / "p", cfg, clock, HandleCache(max_open=8))

    def one(v: bytes) -> bytes:
        return build_batch([Record(v, timestamp=clock.now_ms())])

    assert log.try_append(one(b"a")) is None  # the first append stores leader epoch 0
    log.append(one(b"a"))  # the index (4 entries) has room for 3 more batches
    assert log.try_append(one(b"b") * 4) is None
    assert log.try_append(one(b"b") + one(b"c")) is not None
    assert log.try_append(one(b"x" * 1000)) is None  # past segment.bytes
    assert log.try_append(one(b"d"), leader_epoch=1) is None
    clock.advance(cfg.segment_ms)
    assert log.try_append(one(b"e")) is None  # segment.ms
    assert log.log_end_offset == 3 and len(log.segments) == 1
    log.close()
