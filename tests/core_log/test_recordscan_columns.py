"""``batch_columns``: the C column decoder and its Python twin agree, and both agree with the
record decoder (offsets, timestamps, keys, values, headers of the records in [start, end))."""

from __future__ import annotations

import array
import itertools
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from core_log import recordscan
from core_log.batch import Record, build_batch, iter_records
from core_log.compression import Compression

native_columns: Any = getattr(recordscan, "_native_columns", None)

pytestmark = pytest.mark.skipif(
    native_columns is None, reason="the C extension was not built (no compiler at install time)"
)

records_st = st.lists(
    st.builds(
        Record,
        value=st.one_of(st.none(), st.binary(max_size=200)),
        key=st.one_of(st.none(), st.binary(max_size=30)),
        headers=st.lists(
            st.tuples(st.text(max_size=6), st.one_of(st.none(), st.binary(max_size=6))),
            max_size=3,
        ).map(tuple),
        timestamp=st.integers(0, 2**40),
    ),
    min_size=1,
    max_size=20,
)


@st.composite
def fetch_answers(draw: st.DrawFn) -> tuple[bytes, int]:
    """Batches back to back as a fetch answers them (gaps allowed, maybe a torn tail)."""
    out = b""
    offset = draw(st.integers(0, 1000))
    first = offset
    for _ in range(draw(st.integers(1, 4))):
        records = draw(records_st)
        out += build_batch(
            records,
            base_offset=offset,
            log_append_time=draw(st.booleans()),
            last_offset_delta=len(records) - 1 + draw(st.sampled_from([0, 0, 3])),
        )
        offset += len(records) + draw(st.sampled_from([0, 0, 5]))
    if draw(st.booleans()):
        out += build_batch(draw(records_st), base_offset=offset)[: draw(st.integers(0, 60))]
    return out, first


def columns_of(data: bytes, start: int, end: int, headers: bool) -> list[object]:
    """What the record decoder says the columns hold."""
    rows: list[object] = []
    for r in iter_records(data):
        if start <= r.offset < end:
            rows.append((r.offset, r.key, r.value, r.headers if headers else ()))
    return rows


def rows_of(cols: recordscan.BatchColumns, headers: bool) -> list[object]:
    n, _, offsets, _, _, koff, kdata, kvalid, voff, vdata, vvalid, hoff, hkoff, hkdata, *rest = cols
    hvoff, hvdata, hvvalid = rest

    def items(off: bytes, data: bytes, valid: bytes | None) -> list[bytes | None]:
        ends = array.array("i", off)
        return [
            None if valid is not None and not valid[i >> 3] >> (i & 7) & 1 else data[a:b]
            for i, (a, b) in enumerate(itertools.pairwise(ends))
        ]

    keys, values = items(koff, kdata, kvalid), items(voff, vdata, vvalid)
    heads: list[tuple[tuple[str, bytes | None], ...]] = [()] * n
    if headers:
        assert hoff is not None and hkoff is not None and hkdata is not None
        assert hvoff is not None and hvdata is not None
        hk = items(hkoff, hkdata, None)
        hv = items(hvoff, hvdata, hvvalid)
        ends = array.array("i", hoff)
        heads = [
            tuple((k.decode(), v) for k, v in zip(hk[a:b], hv[a:b], strict=True) if k is not None)
            for a, b in itertools.pairwise(ends)
        ]
    return list(zip(array.array("q", offsets), keys, values, heads, strict=True))


@settings(max_examples=300, deadline=None, derandomize=True)
@given(fetch_answers(), st.integers(0, 40), st.integers(0, 60), st.booleans())
def test_native_and_python_agree_with_the_record_decoder(
    answer: tuple[bytes, int], skip: int, span: int, headers: bool
) -> None:
    data, first = answer
    start, end = first + skip, first + skip + span
    native = native_columns(data, start, end, headers)
    python = recordscan.batch_columns_py(data, start, end, headers)
    assert native == python
    assert native is not None
    assert rows_of(native, headers) == [tuple(r) for r in columns_of(data, start, end, headers)]  # type: ignore[arg-type]
    assert start <= native[1] <= max(start, end)


def test_timestamps_and_types() -> None:
    create = build_batch([Record(b"a", timestamp=5), Record(b"b", timestamp=7)], base_offset=0)
    append = build_batch([Record(b"c", timestamp=1)], base_offset=2, log_append_time=True)
    cols = recordscan.batch_columns(create + append, 0, 10, False)
    assert cols is not None
    assert list(array.array("q", cols[3])) == [5000, 7000, 1000]
    assert list(array.array("i", cols[4])) == [0, 0, 1]
    assert cols[1] == 3


def test_compressed_batches_are_left_to_the_caller() -> None:
    data = build_batch([Record(b"x" * 100)], compression=Compression.GZIP)
    assert native_columns(data, 0, 1, True) is None
    assert recordscan.batch_columns_py(data, 0, 1, True) is None
