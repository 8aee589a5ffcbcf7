"""Offset arithmetic: JSON form, rate limiting across partitions, range splitting."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from spark_sink.errors import OptionError
from spark_sink.offsets import (
    OffsetRange,
    from_json_dict,
    parse_json_offsets,
    rate_limit,
    split_budget,
    split_ranges,
    to_json_dict,
)


def test_json_form_sorts_topics_by_name_and_partitions_by_number() -> None:
    offsets = {("b", 10): 5, ("b", 2): 7, ("a", 0): 1}
    doc = to_json_dict(offsets)
    assert json.dumps(doc) == '{"a": {"0": 1}, "b": {"2": 7, "10": 5}}'
    assert from_json_dict(json.loads(json.dumps(doc))) == offsets


@pytest.mark.parametrize(
    "text", ['{"t": {"x": 1}}', '{"t": {"0": "1"}}', '{"t": 3}', "[1]", '{"t": {"0": true}}', "{"]
)
def test_bad_offsets_json_is_an_option_error(text: str) -> None:
    with pytest.raises(OptionError):
        parse_json_offsets(text, "startingOffsets")


def test_rate_limit_is_proportional_to_pending() -> None:
    start = {("t", 0): 0, ("t", 1): 100, ("t", 2): 0}
    latest = {("t", 0): 600, ("t", 1): 400, ("t", 2): 100}
    end = rate_limit(start, latest, 100)
    taken = {tp: end[tp] - start[tp] for tp in start}
    assert sum(taken.values()) == 100
    assert taken == {("t", 0): 60, ("t", 1): 30, ("t", 2): 10}


def test_rate_limit_never_starves_a_small_partition() -> None:
    start = {("t", 0): 0, ("t", 1): 0}
    latest = {("t", 0): 1_000_000, ("t", 1): 3}
    end = rate_limit(start, latest, 1000)
    assert end[("t", 1)] >= 1
    assert end[("t", 0)] + end[("t", 1)] == 1000


def test_rate_limit_admits_everything_under_the_limit_and_new_partitions_start_at_zero() -> None:
    start = {("t", 0): 5}
    latest = {("t", 0): 10, ("t", 1): 4}
    assert rate_limit(start, latest, 100) == latest
    assert rate_limit(start, latest, 3)[("t", 1)] >= 1


def test_a_limit_below_the_partition_count_goes_to_the_fullest() -> None:
    pending = {("t", 0): 5, ("t", 1): 50, ("t", 2): 7}
    assert split_budget(pending, 2) == {("t", 1): 1, ("t", 2): 1}


@settings(max_examples=300, deadline=None, derandomize=True)
@given(
    st.dictionaries(st.integers(0, 20), st.tuples(st.integers(0, 10**6), st.integers(0, 10**6))),
    st.integers(0, 10**6),
)
def test_rate_limit_invariants(parts: dict[int, tuple[int, int]], limit: int) -> None:
    start = {("t", p): a for p, (a, _) in parts.items()}
    latest = {("t", p): a + n for p, (a, n) in parts.items()}
    end = rate_limit(start, latest, limit)
    assert set(end) == set(latest)
    taken = {tp: end[tp] - start[tp] for tp in start}
    pending = {tp: latest[tp] - start[tp] for tp in start}
    assert all(0 <= taken[tp] <= pending[tp] for tp in start)
    assert sum(taken.values()) == min(limit, sum(pending.values()))
    busy = [tp for tp in pending if pending[tp] > 0]
    if limit >= len(busy):
        assert all(taken[tp] >= 1 for tp in busy)  # nobody starves


def test_split_ranges_min_partitions_and_max_records() -> None:
    ranges = [OffsetRange("t", 0, 0, 1000), OffsetRange("t", 1, 0, 10), OffsetRange("t", 2, 5, 5)]
    assert split_ranges(ranges, None, None) == ranges[:2]
    cut = split_ranges(ranges, 4, None)
    assert len(cut) >= 4
    assert [r for r in cut if r.partition == 1] == [ranges[1]]
    assert sum(r.size for r in cut) == 1010
    equal = [OffsetRange("t", p, 0, 300) for p in range(3)]
    assert [r.size for r in split_ranges(equal, 4, None)] == [150, 150, 300, 300]
    capped = split_ranges(ranges, None, 300)
    assert max(r.size for r in capped) <= 300
    assert [(r.start, r.end) for r in capped if r.partition == 0] == [
        (0, 250),
        (250, 500),
        (500, 750),
        (750, 1000),
    ]


@settings(max_examples=200, deadline=None, derandomize=True)
@given(
    st.lists(st.integers(0, 10_000), max_size=8),
    st.one_of(st.none(), st.integers(1, 20)),
    st.one_of(st.none(), st.integers(1, 5_000)),
)
def test_split_ranges_invariants(
    sizes: list[int], min_partitions: int | None, max_records: int | None
) -> None:
    ranges = [OffsetRange("t", p, 100, 100 + n) for p, n in enumerate(sizes)]
    cut = split_ranges(ranges, min_partitions, max_records)
    for p, n in enumerate(sizes):  # every range is covered exactly, in order, by its pieces
        pieces = [(r.start, r.end) for r in cut if r.partition == p]
        assert [a for a, _ in pieces[1:]] == [b for _, b in pieces[:-1]]
        assert (pieces[0][0], pieces[-1][1]) == (100, 100 + n) if n else pieces == []
    assert all(r.size > 0 for r in cut)
    if max_records is not None:
        assert all(r.size <= max_records for r in cut)
    if min_partitions is not None:
        assert len(cut) >= min(min_partitions, sum(sizes))
