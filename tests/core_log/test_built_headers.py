"""Batches the broker builds from a produce's records skip the log's second walk only where
that walk could not refuse them (:func:`core_log.batch.built_headers`): differential against
:func:`core_log.batch.split_batches` ``strict``, and end to end through a partition."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from api.records import build_batches
from core_log import batch as batch_module
from core_log.batch import Record, build_batch, build_plain, built_headers, split_batches
from core_log.errors import InvalidRecordError, InvalidTimestampError, RecordTooLargeError
from core_log.limits import MAX_HEADER_KEY_BYTES, MAX_TIMESTAMP_MS
from tests.core_log.test_manager import make_manager, read_values

optional_bytes = st.one_of(st.none(), st.binary(max_size=64))
# JSON accepts any timestamp 0..2**63-1; the log serves 0..MAX_TIMESTAMP_MS.
timestamps = st.one_of(
    st.integers(0, MAX_TIMESTAMP_MS),
    st.integers(MAX_TIMESTAMP_MS - 2, MAX_TIMESTAMP_MS + 2),
    st.integers(MAX_TIMESTAMP_MS + 1, 2**63 - 1),
)
header_keys = st.one_of(
    st.text(max_size=8),
    st.sampled_from(["k" * MAX_HEADER_KEY_BYTES, "k" * (MAX_HEADER_KEY_BYTES + 1)]),
)
records = st.builds(
    Record,
    optional_bytes,
    optional_bytes,
    st.one_of(
        st.just(()),
        st.lists(st.tuples(header_keys, optional_bytes), max_size=2).map(tuple),
    ),
    timestamps,
)


@settings(max_examples=300)
@given(st.lists(records, min_size=1, max_size=20), st.sampled_from([200, 1024, 1_048_588]))
def test_built_headers_are_what_the_strict_check_returns_or_none(
    rs: list[Record], max_message_bytes: int
) -> None:
    try:
        data = build_batches(rs, max_message_bytes)
    except RecordTooLargeError:
        return  # a record too large for the limit: refused before any batch exists
    trusted = built_headers(data, rs)
    try:
        strict = split_batches(data, strict=True)
    except (InvalidRecordError, InvalidTimestampError):
        strict = None
    if trusted is not None:
        # Never trusted where the strict check refuses, and the same headers where it passes.
        assert strict == trusted
    elif all(not r.headers for r in rs):
        # Without record headers, only what the strict check refuses is left to it.
        assert strict is None


@settings(max_examples=300)
@given(st.lists(records, min_size=1, max_size=5))
def test_the_c_plain_batch_is_build_batch_and_built_headers(rs: list[Record]) -> None:
    """``build_plain`` (C) against its twin: the same bytes and header where the records have
    no headers and timestamps in range, None (the Python path) otherwise."""
    plain = build_plain(rs)
    data = build_batch(rs)
    trusted = built_headers(data, rs)
    if batch_module._native_plain_batch is None:
        assert plain is None  # built with LOGBUS_PURE_PYTHON=1
        return
    if trusted is None:
        assert plain is None
    else:
        assert plain is not None
        assert plain[0] == data and [plain[1]] == trusted


@pytest.mark.parametrize(
    "odd",
    [
        Record("text", None, (), 0),  # type: ignore[arg-type]
        Record(None, bytearray(b"k"), (), 0),  # type: ignore[arg-type]
        Record(b"v", None, (), 1.5),  # type: ignore[arg-type]
        Record(b"v", None, [], 0),  # type: ignore[arg-type]
        Record(b"v", None, (), -1),
    ],
)
def test_the_c_plain_batch_leaves_records_off_its_path_to_python(odd: Record) -> None:
    assert build_plain([odd]) is None
    assert build_plain([]) is None


def test_a_built_batch_appends_with_its_offsets_and_an_out_of_range_one_is_refused(
    tmp_path: Path,
) -> None:
    async def main() -> None:
        m = make_manager(tmp_path)
        await m.start(background=False)
        p = await m.create("t", 0)
        rs = [Record(b"v%d" % i, None, (), 1_700_000_000_000) for i in range(3)]
        data = build_batches(rs, 1_048_588)
        checked = built_headers(data, rs)
        assert checked is not None
        results = await asyncio.gather(
            *(p.append(data, checked=checked) for _ in range(4)), p.append(data)
        )
        assert sorted(r.base_offset for r in results) == [0, 3, 6, 9, 12]
        assert [v for _, v in await read_values(p)] == [b"v0", b"v1", b"v2"] * 5
        late = [Record(b"x", None, (), MAX_TIMESTAMP_MS + 1)]
        built = build_batches(late, 1_048_588)
        assert built_headers(built, late) is None  # so the log checks it, and refuses it
        with pytest.raises(InvalidTimestampError):
            await p.append(built)
        await m.close()

    asyncio.run(main())
