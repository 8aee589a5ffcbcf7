"""The C record scanner and its Python twin agree on every input; both reject bad records."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from core_log import recordscan
from core_log.batch import RECORDS_OFFSET, Record, build_batch
from core_log.errors import CorruptRecordError

pytestmark = pytest.mark.skipif(
    not recordscan.NATIVE, reason="the C extension was not built (no compiler at install time)"
)

records_st = st.lists(
    st.builds(
        Record,
        value=st.one_of(st.none(), st.binary(max_size=300)),
        key=st.one_of(st.none(), st.binary(max_size=40)),
        headers=st.lists(
            st.tuples(st.text(max_size=8), st.one_of(st.none(), st.binary(max_size=8))),
            max_size=3,
        ).map(tuple),
        timestamp=st.integers(0, 2**40),
    ),
    min_size=1,
    max_size=40,
)


def verdict(scan: object, data: bytes, count: int) -> str:
    try:
        scan(data, count, 1024)  # type: ignore[operator]
    except ValueError as e:
        return f"rejected: {e}"
    return "accepted"


@settings(max_examples=200, deadline=None, derandomize=True)
@given(records_st)
def test_both_accept_every_valid_records_section(records: list[Record]) -> None:
    body = build_batch(records)[RECORDS_OFFSET:]
    assert verdict(recordscan._native_scan, body, len(records)) == "accepted"
    assert verdict(recordscan.scan_records_py, body, len(records)) == "accepted"


@settings(max_examples=300, deadline=None, derandomize=True)
@given(records_st, st.data())
def test_both_give_the_same_verdict_on_damaged_sections(
    records: list[Record], data: st.DataObject
) -> None:
    body = bytearray(build_batch(records)[RECORDS_OFFSET:])
    i = data.draw(st.integers(0, len(body) - 1))
    body[i] = data.draw(st.integers(0, 255))
    count = len(records) + data.draw(st.sampled_from([0, 0, 0, -1, 1]))
    native = verdict(recordscan._native_scan, bytes(body), count)
    python = verdict(recordscan.scan_records_py, bytes(body), count)
    assert native == python


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


@settings(max_examples=200, deadline=None, derandomize=True)
@given(records_st)
def test_key_scan_agrees_with_its_python_twin(records: list[Record]) -> None:
    body = build_batch(records)[RECORDS_OFFSET:]
    native = recordscan._native_keys(body, len(records))
    assert native == recordscan.scan_keys_py(body, len(records))
    assert native == [(r.key, i, r.value is None) for i, r in enumerate(records)]


def test_key_scan_rejects_a_damaged_section() -> None:
    with pytest.raises(CorruptRecordError):
        recordscan.record_keys(b"\x7f\x00", 1)
