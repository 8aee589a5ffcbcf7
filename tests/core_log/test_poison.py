"""Records already in a log that no reader can serve (written before produce checked what it
checks now, or corrupt): compaction and timestamp lookups step over them instead of failing on
that log for ever."""

from __future__ import annotations

from pathlib import Path

from core_log.batch import Record, assemble_batch, build_batch, encode_records, scan_batches
from core_log.clock import ManualClock
from core_log.config import LogConfig
from core_log.handles import HandleCache
from core_log.limits import MAX_HEADER_KEY_BYTES
from core_log.log import PartitionLog

NOW = 1_700_000_000_000
LONG_KEY = "h" * (MAX_HEADER_KEY_BYTES + 1)


def raw_batch(records: list[Record], base_offset: int, base_ts: int, max_ts: int) -> bytes:
    """A batch as it may lie on disk, built without produce's checks."""
    return assemble_batch(
        encode_records(records, base_ts),
        base_offset=base_offset,
        partition_leader_epoch=0,
        attributes=0,
        last_offset_delta=len(records) - 1,
        base_timestamp=base_ts,
        max_timestamp=max_ts,
        producer_id=-1,
        producer_epoch=-1,
        base_sequence=-1,
        record_count=len(records),
    )


def header_poison(base_offset: int, keys: list[bytes]) -> bytes:
    """Records whose first carries a header name over the cap."""
    rs = [Record(b"v", k, ((LONG_KEY, b"x"),) if i == 0 else (), NOW) for i, k in enumerate(keys)]
    return raw_batch(rs, base_offset, NOW, NOW)


def open_log(tmp_path: Path, clock: ManualClock, **cfg: object) -> PartitionLog:
    config = LogConfig.from_dict(
        {"segment.bytes": 400, "segment.ms": 1000, "min.cleanable.dirty.ratio": 0.0, **cfg}
    )
    return PartitionLog(tmp_path, config, clock, HandleCache(max_open=4))


def test_compaction_keeps_an_unreadable_batch_and_cleans_the_rest(tmp_path: Path) -> None:
    clock = ManualClock(NOW)
    log = open_log(tmp_path, clock, **{"cleanup.policy": "compact"})
    log.append(build_batch([Record(b"1", b"a", timestamp=NOW)], base_offset=0), as_follower=True)
    # an unreadable batch holding a record that a later one supersedes: a rewrite would decode it
    log.append(header_poison(1, [b"p", b"b"]), as_follower=True)
    log.append(build_batch([Record(b"2", b"a", timestamp=NOW)], base_offset=3), as_follower=True)
    log.append(build_batch([Record(b"3", b"b", timestamp=NOW)], base_offset=4), as_follower=True)
    clock.advance(1000)
    log.roll_if_expired()
    log.flush()
    log.set_high_watermark(log.log_end_offset)
    result = log.clean()
    assert result is not None and result.swapped
    bases: list[int] = []
    offset = log.log_start_offset
    while offset < log.high_watermark:
        res = log.read(offset, 1 << 20)
        bases += [h.base_offset for _, h in scan_batches(res.data)]
        offset = res.next_offset
    assert 0 not in bases  # "a" at 0 was compacted away
    assert 1 in bases and 3 in bases and 4 in bases  # the unreadable batch is kept whole
    log.close()


def test_a_timestamp_lookup_steps_over_an_unreadable_batch(tmp_path: Path) -> None:
    clock = ManualClock(NOW)
    log = open_log(tmp_path, clock)
    log.append(header_poison(0, [b"p"]), as_follower=True)
    later = Record(b"ok", None, (), NOW + 5)
    log.append(build_batch([later], base_offset=1), as_follower=True)
    log.set_high_watermark(log.log_end_offset)
    assert log.offset_for_timestamp(NOW + 1) == 1
    assert log.offset_for_timestamp(NOW) == 1  # the unreadable record is stepped over
    log.close()
