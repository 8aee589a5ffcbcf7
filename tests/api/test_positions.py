"""Where a consumer continues after a read: one rule for fetch, member polls and WebSocket."""

from __future__ import annotations

from api.records import next_offset_after


def test_past_what_was_taken_when_the_limit_cut_the_read() -> None:
    assert next_offset_after(start=10, count=5, last=14, limit=5, end=30) == 15


def test_past_the_whole_read_when_everything_there_was_taken() -> None:
    # the read's batches end at 30; records 25-29 were removed by compaction
    assert next_offset_after(start=10, count=3, last=24, limit=100, end=30) == 30


def test_a_read_with_no_record_at_or_after_start_is_a_gap_to_skip() -> None:
    assert next_offset_after(start=10, count=0, last=-1, limit=100, end=13) == 13


def test_an_empty_read_stays_put() -> None:
    assert next_offset_after(start=10, count=0, last=-1, limit=100, end=10) == 10
