"""The leader's "recently appended" window (reads it serves on the loop) and LedLog's
lock-free answer for the latest epoch (cluster.replica_manager)."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any, cast

from cluster.replica_manager import HOT_STEP_BYTES, REPLICA_HOT_BYTES, Leading, LedLog
from core_log.clock import ManualClock
from core_log.config import LogConfig
from core_log.epoch_cache import UNDEFINED_EPOCH
from core_log.handles import HandleCache
from core_log.log import PartitionLog

MIB = 1_048_576


def _leading() -> Leading:
    none = cast(Any, None)
    return Leading(none, none, False, none)


def test_nothing_is_hot_before_the_first_append() -> None:
    assert not _leading().hot(0)


def test_the_window_covers_the_last_64_mib_appended_to_within_one_step() -> None:
    lead = _leading()
    offset = 0
    for _ in range(100):  # 100 appends of 1 MiB, 10 records each
        lead.appended(offset, MIB)
        offset += 10
    start = lead.recent[0][0]
    assert lead.hot(offset - 10) and lead.hot(start) and not lead.hot(start - 1)
    covered = lead.appended_bytes - lead.recent[0][1]
    assert REPLICA_HOT_BYTES - HOT_STEP_BYTES <= covered <= REPLICA_HOT_BYTES
    assert not lead.hot(0)  # 100 MiB ago: read off the loop


def test_small_appends_keep_one_entry_per_step() -> None:
    lead = _leading()
    for i in range(100_000):  # 100,000 appends of 1 KiB: ~98 MiB
        lead.appended(i, 1024)
    assert len(lead.recent) <= REPLICA_HOT_BYTES // HOT_STEP_BYTES + 1
    assert lead.hot(99_999) and not lead.hot(0)


def test_led_log_answers_the_latest_epoch_without_the_lock(tmp_path: Path) -> None:
    log = PartitionLog(
        tmp_path / "t-0", LogConfig(), ManualClock(1_700_000_000_000), HandleCache(4)
    )
    try:
        log.assign_leader_epoch(3)
        led = LedLog(log)
        assert led.end_offset_for_epoch(3) == log.end_offset_for_epoch(3)
        held, release = threading.Event(), threading.Event()
        released_in_time: list[bool] = []

        def hold() -> None:
            with log._lock:
                held.set()
                released_in_time.append(release.wait(10))

        t = threading.Thread(target=hold)
        t.start()
        assert held.wait(10)
        try:  # an append in the pool holds the lock: the latest epoch still answers at once
            assert led.end_offset_for_epoch(3) == (3, log.log_end_offset)
        finally:
            release.set()
            t.join()
        assert released_in_time == [True]  # the answer did not wait for the lock
        assert led.end_offset_for_epoch(2) == log.end_offset_for_epoch(2)  # older: locked path
        assert led.end_offset_for_epoch(UNDEFINED_EPOCH) == log.end_offset_for_epoch(
            UNDEFINED_EPOCH
        )
    finally:
        log.close()
