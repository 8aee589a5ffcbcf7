"""The C records encoder (``_recordscan.encode_records``) and its Python twin
(:func:`core_log.batch.encode_records_py`) agree on every input: the same bytes, or the same
exception where the twin raises (the C loop hands every record off its typed path back to the
twin). Inputs cover the typed path (bytes / None keys and values, header tuples, timestamps
anywhere in int64 and beyond) and what is off it (bytearray, str, lists, bools, lone
surrogates in header names, attributes missing)."""

from __future__ import annotations

from typing import Any, cast

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from core_log import batch
from core_log.batch import Record, encode_records, encode_records_py, walk_records
from core_log.recordscan import NATIVE

pytestmark = pytest.mark.skipif(
    not NATIVE, reason="built with LOGBUS_PURE_PYTHON=1: no C encoder to compare"
)

INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
ints = (
    st.integers(-(2**14), 2**14)
    | st.integers(0, 2**42)
    | st.integers(INT64_MIN, INT64_MAX)
    | st.sampled_from([INT64_MIN, INT64_MAX, INT64_MAX + 1, INT64_MIN - 1, 2**70])
)
blobs = st.one_of(st.none(), st.binary(max_size=300))
odd_blobs = st.one_of(blobs, st.binary(max_size=8).map(bytearray), st.text(max_size=4))
names = st.text(max_size=8) | st.sampled_from(["\ud800", "h\udfff", "é" * 3])
header = st.tuples(names, blobs)
odd_header = st.one_of(
    header,
    st.tuples(names, odd_blobs),
    st.lists(st.one_of(names, blobs), min_size=2, max_size=2),
    st.tuples(names),
    st.tuples(st.binary(max_size=3), blobs),
)
typed = st.builds(
    Record,
    value=blobs,
    key=blobs,
    headers=st.lists(header, max_size=4).map(tuple),
    timestamp=ints,
)
readable = st.builds(
    Record,
    value=blobs,
    key=blobs,
    headers=st.lists(st.tuples(st.text(max_size=8), blobs), max_size=4).map(tuple),
    timestamp=st.integers(0, 2**40),
)
odd = st.builds(
    Record,
    value=odd_blobs,
    key=odd_blobs,
    headers=st.lists(odd_header, max_size=3).map(tuple) | st.lists(header, max_size=2),
    timestamp=ints | st.booleans() | st.none(),
)


class NotARecord:
    """No ``headers`` attribute: both encoders raise AttributeError."""

    value = b"v"
    key = None
    timestamp = 0


def outcome(f: Any, records: list[Any], base: int) -> tuple[str, Any]:
    try:
        return "ok", f(records, base)
    except Exception as e:  # the same type and message, whatever they are
        return type(e).__name__, str(e)


@settings(max_examples=400, deadline=None)
@given(st.lists(typed, min_size=0, max_size=12), ints)
def test_typed_records_encode_alike(records: list[Record], base: int) -> None:
    assert outcome(encode_records, records, base) == outcome(encode_records_py, records, base)


@settings(max_examples=400, deadline=None)
@given(st.lists(typed | odd | st.just(NotARecord()), min_size=1, max_size=8), ints)
def test_odd_records_encode_or_fail_alike(records: list[Any], base: int) -> None:
    assert outcome(encode_records, records, base) == outcome(encode_records_py, records, base)


@settings(max_examples=200, deadline=None)
@given(st.lists(readable, min_size=1, max_size=12))
def test_encoded_records_read_back(records: list[Record]) -> None:
    """What the C encoder writes, the one walk reads back as the same records."""
    base = min(r.timestamp for r in records)
    section = encode_records(records, base)
    header = batch.BatchHeader(
        0, 0, 0, 2, 0, 0, len(records) - 1, base, max(r.timestamp for r in records),
        -1, -1, -1, len(records),
    )  # fmt: skip
    read, fault = walk_records(header, section)
    assert fault is None
    assert [(r.key, r.value, r.headers, r.timestamp, r.offset) for r in read] == [
        (r.key, r.value, r.headers, r.timestamp, i) for i, r in enumerate(records)
    ]


def test_the_c_encoder_is_used() -> None:
    """The typed path is answered by C (no fall back), so the benchmark measures it."""
    assert batch._native_encode is not None
    records = [Record(b'"v"', None, (), 5), Record(None, b"k", (("h", None),), 3)]
    assert batch._native_encode(records, 4) == encode_records_py(records, 4)
    assert batch._native_encode([Record(cast(Any, bytearray(b"v")))], 0) is None
