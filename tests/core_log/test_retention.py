"""Model-based tests for PartitionLog.apply_retention and increment_log_start_offset.

Retention follows Kafka's ``deleteOldSegments``: walk the segments oldest first and delete
while the segment is deletable -- older than ``retention.ms`` (its largest timestamp) or not
needed to keep ``retention.bytes`` -- and wholly below the high watermark; the active segment
only goes when every segment is expired and fully replicated (it is rolled first). The tests
build logs whose segments hold one batch each (``segment.bytes`` 14), so the layout is known,
and compare every pass with a plain model of that rule.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from core_log.batch import Record, build_batch, iter_records
from core_log.clock import ManualClock
from core_log.config import LogConfig
from core_log.errors import OffsetOutOfRangeError
from core_log.handles import HandleCache
from core_log.limits import MAX_SEGMENTS_DELETED_PER_PASS
from core_log.log import PartitionLog

SETTINGS = settings(
    derandomize=True,
    database=None,
    deadline=None,
    max_examples=150,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
# Checkpoints are fsynced (file and directory); on tmpfs that costs nothing.
FAST_TMP = "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else None
NOW = 1_700_000_000_000
DAY = 86_400_000


@pytest.fixture
def tmp_path() -> Iterator[Path]:
    d = Path(tempfile.mkdtemp(prefix="logbus-retention-", dir=FAST_TMP))
    yield d
    shutil.rmtree(d, ignore_errors=True)


@dataclass
class Seg:
    base: int
    next_offset: int
    size: int
    max_ts: int


def one_batch_per_segment_log(
    directory: Path,
    specs: list[tuple[int, int, int]],
    clock: ManualClock,
    epochs: list[int] | None = None,
    /,
    **config: object,
) -> tuple[PartitionLog, list[Seg]]:
    """A log with one segment per (records, value bytes, max timestamp) spec."""
    cfg = LogConfig.from_dict({"segment.bytes": 14, **config})
    log = PartitionLog(directory, cfg, clock, HandleCache(max_open=8))
    segs = []
    for i, (n, value_len, max_ts) in enumerate(specs):
        records = [Record(b"v" * value_len, timestamp=max_ts - (n - 1 - j)) for j in range(n)]
        raw = build_batch(records)
        res = log.append(raw, leader_epoch=epochs[i] if epochs else 0)
        segs.append(Seg(res.base_offset, res.last_offset + 1, len(raw), max_ts))
    assert [s.base_offset for s in log.segments] == [s.base for s in segs]
    return log, segs


def expected_pass(
    segs: list[Seg], hw: int, now: int, retention_ms: int, retention_bytes: int
) -> tuple[list[Seg], bool]:
    """(segments deleted by one pass, whether the active segment was rolled first)."""

    def expired(s: Seg) -> bool:
        return retention_ms >= 0 and s.size > 0 and now - s.max_ts > retention_ms

    rolled = bool(segs) and all(expired(s) for s in segs) and segs[-1].next_offset <= hw
    candidates = segs if rolled else segs[:-1]  # the (new) active segment always stays
    total = sum(s.size for s in segs)
    doomed: list[Seg] = []
    for s in candidates:
        if len(doomed) == MAX_SEGMENTS_DELETED_PER_PASS or s.next_offset > hw:
            break
        over_size = retention_bytes >= 0 and total - s.size >= retention_bytes
        if not (expired(s) or over_size):
            break
        total -= s.size
        doomed.append(s)
    return doomed, rolled


def assert_range_error(log: PartitionLog, offset: int) -> None:
    with pytest.raises(OffsetOutOfRangeError) as info:
        log.read(offset, 1 << 20)
    err = info.value
    assert (err.log_start_offset, err.log_end_offset) == (log.log_start_offset, log.log_end_offset)


def offsets_from(log: PartitionLog, offset: int, upper: int) -> list[int]:
    """Every record offset from ``offset`` up to ``upper``, read batch run by batch run."""
    out: list[int] = []
    while True:
        res = log.read(offset, 1 << 20, max_offset=upper)
        if not res.data:
            return out
        out.extend(r.offset for r in iter_records(res.data))
        offset = res.next_offset


SEG_SPEC = st.tuples(
    st.integers(1, 5),  # records
    st.integers(0, 300),  # value bytes
    # max timestamp relative to now (out of order allowed), often exactly at a retention.ms
    st.integers(-3 * DAY, DAY // 2)
    | st.sampled_from([-DAY // 4, -DAY, -2 * DAY]).flatmap(lambda a: st.sampled_from([a - 1, a])),
)


@SETTINGS
@given(
    specs=st.lists(SEG_SPEC, min_size=1, max_size=14),
    retention_ms=st.sampled_from([-1, 0, DAY // 4, DAY, 2 * DAY, 10 * DAY]),
    retention_bytes=st.sampled_from([-1, -1, 0, 200, 700, 2000, 10**9]),
    data=st.data(),
)
def test_retention_against_the_model(
    tmp_path: Path,
    specs: list[tuple[int, int, int]],
    retention_ms: int,
    retention_bytes: int,
    data: st.DataObject,
) -> None:
    clock = ManualClock(NOW)
    epochs = sorted(
        data.draw(st.lists(st.integers(0, 5), min_size=len(specs), max_size=len(specs)))
    )
    directory = tmp_path / f"p{len(list(tmp_path.iterdir()))}"
    log, segs = one_batch_per_segment_log(
        directory,
        [(n, v, NOW + age) for n, v, age in specs],
        clock,
        epochs,
        **{"retention.ms": retention_ms, "retention.bytes": retention_bytes},
    )
    leo = log.log_end_offset
    edges = {0, leo} | {min(leo, max(0, s.next_offset + d)) for s in segs for d in (-1, 0, 1)}
    hw = data.draw(st.sampled_from(sorted(edges)) | st.integers(0, leo), label="hw")
    log.set_high_watermark(hw)
    lso = 0
    model_epochs = log.epochs.entries
    # A pass can leave work for the next one (e.g. retention.bytes deletes a young segment, and
    # only then is everything left expired): run passes to the fixpoint, each against the model.
    for _ in range(4):
        doomed, rolled = expected_pass(segs, hw, NOW, retention_ms, retention_bytes)
        result = log.apply_retention()
        kept = segs[len(doomed) :] + ([Seg(leo, leo, 0, -1)] if rolled else [])
        assert [s.base_offset for s in log.segments] == [s.base for s in kept]
        assert result.deleted_segments == len(doomed)
        assert result.deleted_bytes == sum(s.size for s in doomed)
        if doomed:
            lso = kept[0].base
        assert result.log_start_offset == log.log_start_offset == lso
        assert (log.log_end_offset, log.high_watermark) == (leo, hw)
        # nothing at or above the high watermark is ever deleted
        assert all(s.next_offset <= hw for s in doomed)
        for s in doomed:
            for suffix in (".log", ".index", ".timeindex"):
                assert not (directory / f"{s.base:020d}{suffix}").exists()
        for real in log.segments:
            assert (directory / f"{real.base_offset:020d}.log").exists()
        # the epoch cache starts at the log start offset
        below = [i for i, (_, o) in enumerate(model_epochs) if o <= lso]
        if below and lso > 0:
            i = below[-1]
            model_epochs = [(model_epochs[i][0], lso), *model_epochs[i + 1 :]]
        assert log.epochs.entries == model_epochs
        # retention.bytes alone keeps the log at or just above the limit (Kafka's rule)
        if retention_ms < 0 and retention_bytes >= 0:
            if doomed:
                assert log.size_bytes >= retention_bytes
            first = log.segments[0]
            if len(log.segments) > 1 and first.next_offset <= hw:  # not blocked: minimal
                assert log.size_bytes - first.size < retention_bytes
        # reads: below the log start is out of range; the log start itself is readable
        if lso > 0:
            assert_range_error(log, lso - 1)
            assert_range_error(log, 0)
        if kept[0].size and kept[0].next_offset <= hw:  # its first batch is wholly visible
            got = list(iter_records(log.read(lso, 1).data))
            assert got and got[0].offset == lso
        segs = kept
        if not doomed:
            break
    else:
        pytest.fail("retention did not reach a fixpoint")
    # appends continue at the log end offset
    assert log.append(build_batch([Record(b"next")])).base_offset == leo
    log.close()
    reopened = PartitionLog(directory, log.config, clock, HandleCache(), clean_shutdown=True)
    assert reopened.log_start_offset == lso
    assert reopened.log_end_offset == leo + 1
    reopened.close()


def test_retention_ms_deletes_old_segments_oldest_first(tmp_path: Path) -> None:
    clock = ManualClock(NOW)
    ages = [5 * DAY, 4 * DAY, 1 * DAY, 6 * DAY, 1000]  # the 4th is old but after a young one
    log, segs = one_batch_per_segment_log(
        tmp_path / "p", [(2, 10, NOW - a) for a in ages], clock, **{"retention.ms": 2 * DAY}
    )
    log.set_high_watermark(log.log_end_offset)
    result = log.apply_retention()
    assert (result.deleted_segments, result.log_start_offset) == (2, segs[2].base)
    assert [s.base_offset for s in log.segments] == [s.base for s in segs[2:]]
    assert_range_error(log, segs[2].base - 1)
    clock.advance(DAY + 1)  # now the third (1 day old) and fourth have expired too
    result = log.apply_retention()
    assert result.deleted_segments == 2
    assert [s.base_offset for s in log.segments] == [segs[4].base]
    assert log.apply_retention().deleted_segments == 0  # the active segment is young
    log.close()


def test_retention_never_deletes_at_or_above_the_high_watermark(tmp_path: Path) -> None:
    clock = ManualClock(NOW)
    log, segs = one_batch_per_segment_log(
        tmp_path / "p", [(3, 10, NOW - 10 * DAY)] * 6, clock, **{"retention.ms": DAY}
    )
    assert log.apply_retention().deleted_segments == 0  # high watermark 0: nothing may go
    log.set_high_watermark(segs[1].next_offset - 1)  # the last offset of the 2nd segment
    assert log.apply_retention().deleted_segments == 1
    assert log.log_start_offset == segs[1].base
    log.set_high_watermark(segs[2].base + 1)  # inside the third segment
    result = log.apply_retention()
    assert result.deleted_segments == 1
    assert log.log_start_offset == segs[2].base
    assert offsets_from(log, segs[2].base, 18) == list(range(segs[2].base, 18))  # all intact
    log.set_high_watermark(log.log_end_offset)
    assert log.apply_retention().deleted_segments == 4  # incl. the rolled active segment
    log.close()


def test_a_segment_exactly_retention_ms_old_is_kept(tmp_path: Path) -> None:
    clock = ManualClock(NOW)
    log, segs = one_batch_per_segment_log(
        tmp_path / "p",
        [(1, 5, NOW - DAY - 1), (1, 5, NOW - DAY), (1, 5, NOW)],
        clock,
        **{"retention.ms": DAY},
    )
    log.set_high_watermark(3)
    assert log.apply_retention().deleted_segments == 1  # older than retention.ms: deleted
    assert log.apply_retention().deleted_segments == 0  # exactly retention.ms old: kept
    clock.advance(1)
    assert log.apply_retention().deleted_segments == 1
    assert log.log_start_offset == segs[2].base
    log.close()


def test_compact_disables_deletion(tmp_path: Path) -> None:
    clock = ManualClock(NOW)
    old = [(2, 10, NOW - 30 * DAY)] * 4
    log, _ = one_batch_per_segment_log(
        tmp_path / "p",
        old,
        clock,
        **{"cleanup.policy": "compact", "retention.ms": DAY, "retention.bytes": 0},
    )
    log.set_high_watermark(log.log_end_offset)
    assert log.apply_retention().deleted_segments == 0
    assert len(log.segments) == 4
    log.update_config(LogConfig.from_dict({"cleanup.policy": "compact,delete", "retention.ms": 1}))
    assert log.apply_retention().deleted_segments == 4
    log.close()


def test_when_everything_expired_the_active_segment_goes_too(tmp_path: Path) -> None:
    clock = ManualClock(NOW)
    log, segs = one_batch_per_segment_log(
        tmp_path / "p", [(3, 50, NOW)] * 3, clock, **{"retention.ms": DAY}
    )
    log.set_high_watermark(9)
    clock.advance(DAY + 1)
    result = log.apply_retention()
    assert result.deleted_segments == 3
    assert result.deleted_bytes == sum(s.size for s in segs)
    assert (log.log_start_offset, log.log_end_offset, log.high_watermark) == (9, 9, 9)
    assert [s.base_offset for s in log.segments] == [9]
    assert log.size_bytes == 0
    assert log.read(9, 100).data == b""
    assert_range_error(log, 8)
    assert log.append(build_batch([Record(b"after", timestamp=NOW + DAY)] * 2)).base_offset == 9
    log.set_high_watermark(11)
    assert [r.offset for r in iter_records(log.read(9, 100).data)] == [9, 10]
    assert log.apply_retention().deleted_segments == 0  # the new data is young
    log.close()
    reopened = PartitionLog(tmp_path / "p", log.config, clock, HandleCache(), clean_shutdown=True)
    assert (reopened.log_start_offset, reopened.log_end_offset) == (9, 11)
    reopened.close()


def test_retention_bytes_keeps_at_least_the_limit_by_whole_segments(tmp_path: Path) -> None:
    clock = ManualClock(NOW)
    log, segs = one_batch_per_segment_log(tmp_path / "p", [(1, 100, NOW)] * 10, clock)
    size = segs[0].size
    log.set_high_watermark(log.log_end_offset)
    for limit, keep in [(10 * size, 10), (9 * size + 1, 10), (7 * size, 7), (3 * size - 1, 3)]:
        log.update_config(LogConfig.from_dict({"segment.bytes": 14, "retention.bytes": limit}))
        log.apply_retention()
        assert len(log.segments) == keep, limit
        assert log.size_bytes >= min(limit, 10 * size)
        assert log.size_bytes - size < limit  # one segment fewer would be under the limit
    log.update_config(LogConfig.from_dict({"segment.bytes": 14, "retention.bytes": 0}))
    log.apply_retention()
    assert [s.base_offset for s in log.segments] == [9]  # the active segment stays
    log.close()


def test_one_pass_deletes_at_most_the_bounded_number_of_segments(tmp_path: Path) -> None:
    clock = ManualClock(NOW)
    n = MAX_SEGMENTS_DELETED_PER_PASS + 30
    log, _ = one_batch_per_segment_log(
        tmp_path / "p", [(1, 0, NOW - 2 * DAY)] * n, clock, **{"retention.ms": DAY}
    )
    log.set_high_watermark(n)
    first = log.apply_retention()
    assert first.deleted_segments == MAX_SEGMENTS_DELETED_PER_PASS
    assert log.log_start_offset == MAX_SEGMENTS_DELETED_PER_PASS
    second = log.apply_retention()
    assert second.deleted_segments == 30  # the rest, including the rolled active segment
    assert (log.log_start_offset, log.log_end_offset) == (n, n)
    assert log.apply_retention().deleted_segments == 0
    log.close()


def test_increment_log_start_offset(tmp_path: Path) -> None:
    clock = ManualClock(NOW)
    log, _ = one_batch_per_segment_log(tmp_path / "p", [(4, 10, NOW)] * 5, clock, [1, 1, 2, 3, 3])
    # segments [0,3] [4,7] [8,11] [12,15] [16,19]
    with pytest.raises(OffsetOutOfRangeError):
        log.increment_log_start_offset(1)  # above the high watermark (0)
    log.set_high_watermark(14)
    with pytest.raises(OffsetOutOfRangeError) as info:
        log.increment_log_start_offset(15)
    assert info.value.log_end_offset == 14  # the bound is the high watermark
    log.increment_log_start_offset(6)
    assert log.log_start_offset == 6
    assert [s.base_offset for s in log.segments] == [4, 8, 12, 16]  # [0,3] is wholly below
    assert not (tmp_path / "p" / f"{0:020d}.log").exists()
    assert log.epochs.entries == [(1, 6), (2, 8), (3, 12)]
    assert_range_error(log, 5)
    assert [r.offset for r in iter_records(log.read(6, 1).data)] == [4, 5, 6, 7]
    log.increment_log_start_offset(3)  # never moves back
    assert log.log_start_offset == 6
    log.increment_log_start_offset(12)
    assert [s.base_offset for s in log.segments] == [12, 16]
    assert log.epochs.entries == [(3, 12)]
    log.increment_log_start_offset(14)
    assert log.log_start_offset == 14
    assert [s.base_offset for s in log.segments] == [12, 16]
    log.close()
    reopened = PartitionLog(tmp_path / "p", log.config, clock, HandleCache(), clean_shutdown=True)
    assert reopened.log_start_offset == 14
    assert_range_error(reopened, 13)
    reopened.close()


def test_checkpoint_and_file_deletion_happen_outside_the_partition_lock(tmp_path: Path) -> None:
    """The checkpoint write (an fsync) and the unlinks of a retention pass must not hold the
    lock appends and reads need: another thread can take it while they run."""
    clock = ManualClock(NOW)
    log, _ = one_batch_per_segment_log(
        tmp_path / "p", [(2, 10, NOW - 5 * DAY), (2, 10, NOW)], clock, **{"retention.ms": DAY}
    )
    log.set_high_watermark(log.log_end_offset)
    free_during: list[bool] = []
    write_checkpoint, doomed = log.write_checkpoint, log.segments[0]
    delete_segment = doomed.delete

    def lock_is_free() -> bool:
        free: list[bool] = []

        def probe() -> None:
            if log._lock.acquire(blocking=False):
                log._lock.release()
                free.append(True)

        t = threading.Thread(target=probe)
        t.start()
        t.join()
        return bool(free)

    def checkpoint_spy() -> None:
        free_during.append(lock_is_free())
        write_checkpoint()

    def delete_spy() -> None:
        free_during.append(lock_is_free())
        delete_segment()

    log.write_checkpoint = checkpoint_spy  # type: ignore[method-assign]
    doomed.delete = delete_spy  # type: ignore[method-assign]
    assert log.apply_retention().deleted_segments == 1
    assert free_during == [True, True]
    log.close()
