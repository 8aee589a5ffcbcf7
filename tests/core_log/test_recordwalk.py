"""The one record walk: its C visitors and the Python twin agree on every input, and what
produce accepts is exactly what every reader (JSON, compaction keys, Arrow columns) serves.

Inputs are valid sections, sections with a byte changed, bytes inserted or cut, and random
bytes, under base offsets and timestamps at the edges of their ranges (2^63, year 9999).
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from core_log import recordjson, recordscan
from core_log.batch import (
    RECORDS_OFFSET,
    TIMESTAMP_TYPE_MASK,
    Record,
    assemble_batch,
    build_batch,
    encode_records,
    encode_varint,
    validate_batch,
)
from core_log.errors import CorruptRecordError, InvalidRecordError, InvalidTimestampError
from core_log.limits import MAX_HEADER_KEY_BYTES, MAX_TIMESTAMP_MS

pytestmark = pytest.mark.skipif(
    not recordscan.NATIVE, reason="built with LOGBUS_PURE_PYTHON=1: no C walk to compare"
)

INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
edge_ints = st.sampled_from(
    [-1, 0, 1, MAX_TIMESTAMP_MS - 5, MAX_TIMESTAMP_MS, MAX_TIMESTAMP_MS + 1, INT64_MAX - 3]
)
timestamps = st.integers(0, MAX_TIMESTAMP_MS) | edge_ints | st.integers(INT64_MIN, INT64_MAX)
records_st = st.lists(
    st.builds(
        Record,
        value=st.one_of(st.none(), st.binary(max_size=60)),
        key=st.one_of(st.none(), st.binary(max_size=20)),
        headers=st.lists(
            st.tuples(st.text(max_size=6), st.one_of(st.none(), st.binary(max_size=6))),
            max_size=3,
        ).map(tuple),
        timestamp=st.integers(0, 2**42),
    ),
    min_size=1,
    max_size=12,
)


def mutate(body: bytes, data: st.DataObject) -> bytes:
    kind = data.draw(st.sampled_from(["none", "flip", "insert", "cut", "random"]))
    b = bytearray(body)
    if kind == "flip" and b:
        b[data.draw(st.integers(0, len(b) - 1))] = data.draw(st.integers(0, 255))
    elif kind == "insert":
        at = data.draw(st.integers(0, len(b)))
        b[at:at] = data.draw(st.binary(min_size=1, max_size=11))
    elif kind == "cut" and b:
        at = data.draw(st.integers(0, len(b) - 1))
        del b[at : at + data.draw(st.integers(1, 10))]
    elif kind == "random":
        return data.draw(st.binary(max_size=80))
    return bytes(b)


def scan(fn: Any, body: bytes, count: int, h: tuple[int, int, int, bool], strict: bool) -> Any:
    base, base_ts, max_ts, lat = h
    return fn(body, count, base, base_ts, max_ts, lat, strict)


def columns_verdict(body: bytes, count: int, h: tuple[int, int, int, bool]) -> str:
    base, base_ts, max_ts, lat = h
    batch = assemble_batch(
        body,
        base_offset=base,
        partition_leader_epoch=0,
        attributes=TIMESTAMP_TYPE_MASK if lat else 0,
        last_offset_delta=max(count - 1, 0),
        base_timestamp=base_ts,
        max_timestamp=max_ts,
        producer_id=-1,
        producer_epoch=-1,
        base_sequence=-1,
        record_count=count,
    )
    end = base + count + 1_000
    try:
        c = recordscan._native_columns(batch, INT64_MIN, end, True)
    except ValueError as e:
        c = ("rejected", str(e))
    try:
        py = recordscan.batch_columns_py(batch, INT64_MIN, end, True)
    except ValueError as e:
        py = ("rejected", str(e))
    assert c == py
    return "rejected" if c[0] == "rejected" else "ok"


def keys_verdict(body: bytes, count: int) -> str:
    try:
        c = recordscan._native_keys(body, count)
    except ValueError as e:
        c = str(e)
    try:
        py = recordscan.scan_keys_py(body, count)
    except ValueError as e:
        py = str(e)
    assert c == py
    return "rejected" if isinstance(c, str) else "ok"


def json_fault(body: bytes, count: int, h: tuple[int, int, int, bool]) -> Any:
    base, base_ts, max_ts, lat = h
    args = (body, count, base, base_ts, lat, max_ts, INT64_MIN, 10**6, b"", b",")
    c = recordjson._recordjson.encode_section(*args)
    py = recordjson.encode_section_py(*args)
    assert c == py
    return c[3]


@settings(
    max_examples=500, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck)
)
@given(
    records_st,
    st.data(),
    st.integers(0, 2**40) | st.sampled_from([INT64_MAX - 20, INT64_MAX]),
    timestamps,
    timestamps,
    st.booleans(),
    st.sampled_from([0, 0, 0, 1, -1]),
)
def test_every_visitor_and_its_twin_accept_the_same_sections(
    records: list[Record],
    data: st.DataObject,
    base: int,
    base_ts: int,
    max_ts: int,
    log_append_time: bool,
    count_change: int,
) -> None:
    body = mutate(build_batch(records)[RECORDS_OFFSET:], data)
    count = max(0, len(records) + count_change)
    h = (base, base_ts, max_ts, log_append_time)
    for strict in (False, True):
        native = scan(recordscan._native_scan, body, count, h, strict)
        assert native == scan(recordscan.scan_records_py, body, count, h, strict)
    fault = scan(recordscan._native_scan, body, count, h, False)
    # produce's verdict (deltas aside) is every reader's verdict
    assert (fault is None) == (json_fault(body, count, h) is None)
    if base + count < INT64_MAX - 1_000:  # else the batch is past any end offset a reader asks
        assert (fault is None) == (columns_verdict(body, count, h) == "ok")
    # compaction needs no timestamps (nor absolute offsets): it rejects only what is
    # structurally unreadable
    if base < 2**40:
        keys = keys_verdict(body, count)
        assert keys == "ok" if fault is None else True
        assert keys == "rejected" if fault is not None and fault[3] else True
    if fault is not None:
        assert json_fault(body, count, h) == fault[1:]


def test_valid_sections_are_accepted_by_all() -> None:
    records = [Record(b'{"a":1}', b"k", (("h", b"v"), ("n", None)), 1_700_000_000_000)]
    body = encode_records(records, 1_700_000_000_000)
    h = (5, 1_700_000_000_000, 1_700_000_000_000, False)
    assert scan(recordscan._native_scan, body, 1, h, True) is None
    assert json_fault(body, 1, h) is None
    assert columns_verdict(body, 1, h) == "ok"
    assert keys_verdict(body, 1) == "ok"


def one_record(headers: tuple[tuple[str, bytes | None], ...], ts: int) -> bytes:
    return build_batch([Record(b"v", None, headers, 0)], default_timestamp=0)[:0] + (
        assemble_batch(
            encode_records([Record(b"v", None, headers, ts)], ts),
            base_offset=0,
            partition_leader_epoch=-1,
            attributes=0,
            last_offset_delta=0,
            base_timestamp=ts,
            max_timestamp=ts,
            producer_id=-1,
            producer_epoch=-1,
            base_sequence=-1,
            record_count=1,
        )
    )


def test_produce_rejects_a_header_key_no_reader_serves() -> None:
    ok = one_record((("k" * MAX_HEADER_KEY_BYTES, b"v"),), 0)
    validate_batch(ok, strict=True)
    with pytest.raises(InvalidRecordError, match="header key"):
        validate_batch(one_record((("k" * (MAX_HEADER_KEY_BYTES + 1), b"v"),), 0), strict=True)


@pytest.mark.parametrize("ts", [MAX_TIMESTAMP_MS + 1, 2**63 - 1, -2, -(2**63)])
def test_produce_rejects_timestamps_no_reader_renders(ts: int) -> None:
    with pytest.raises(InvalidTimestampError) as e:
        validate_batch(one_record((), ts), strict=True)
    assert not e.value.retriable and e.value.http_status == 400


@pytest.mark.parametrize("ts", [-1, 0, MAX_TIMESTAMP_MS])
def test_produce_accepts_the_documented_timestamp_range(ts: int) -> None:
    validate_batch(one_record((), ts), strict=True)


def test_a_record_delta_past_the_range_is_rejected_though_the_header_is_fine() -> None:
    """baseTimestamp and maxTimestamp in range, one record's delta takes it past year 9999."""
    body = (
        encode_varint(0)  # attributes  (a hand-built record: length prefix added below)
        + encode_varint(MAX_TIMESTAMP_MS)  # timestamp delta
        + encode_varint(0)
        + encode_varint(-1)
        + encode_varint(1)
        + b"v"
        + encode_varint(0)
    )
    section = encode_varint(len(body)) + body
    with pytest.raises(InvalidTimestampError):
        recordscan.check_records(section, 1, 0, 10, 10, False)


@pytest.mark.parametrize(
    ("body", "count", "why"),
    [
        (b"", 1, "bad record length varint"),
        (b"\x02\x00", 1, "bad timestamp delta"),
        (b"\x0c\x00\x00\x02\x01\x01\x00", 1, "offset deltas"),
        (b"\x0c\x00\x00\x00\x01\x01\x00extra", 1, "trailing bytes"),
    ],
)
def test_check_records_raises_corrupt_record(body: bytes, count: int, why: str) -> None:
    with pytest.raises(CorruptRecordError, match=why):
        recordscan.check_records(body, count)


def hand_record(key_len: int, value_len: int, header_value_len: int | None = None) -> bytes:
    """One record whose key/value (and header value) lengths are what we say, whatever the
    bytes after them."""
    v = encode_varint
    fields = v(0) + v(0) + v(key_len) + b"k" * max(key_len, 0) + v(value_len)
    fields += b"v" * max(value_len, 0)
    if header_value_len is None:
        fields += v(0)
    else:
        fields += v(1) + v(1) + b"h" + v(header_value_len) + b"x" * max(header_value_len, 0)
    body = b"\x00" + fields
    return v(len(body)) + body


@pytest.mark.parametrize(
    ("section", "why"),
    [
        (hand_record(-2, 1), "key runs past the record"),
        (hand_record(-5, 1), "key runs past the record"),
        (hand_record(-64, 1), "key runs past the record"),
        (hand_record(1, -2), "value runs past the record"),
        (hand_record(1, -4000), "value runs past the record"),
        (hand_record(1, 1, -3), "header value runs past the record"),
    ],
)
def test_negative_lengths_other_than_null_are_rejected_by_all(section: bytes, why: str) -> None:
    h = (0, 0, 0, False)
    fault = scan(recordscan._native_scan, section, 1, h, True)
    assert fault == scan(recordscan.scan_records_py, section, 1, h, True)
    assert fault is not None and fault[1] == why
    assert json_fault(section, 1, h) == fault[1:]
    assert keys_verdict(section, 1) == columns_verdict(section, 1, h) == "rejected"
