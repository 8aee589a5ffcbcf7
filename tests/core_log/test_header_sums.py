"""The sums over batch headers taken by field position (core_log.batch) against the same sums
taken through the headers' properties, as the append path computed them before."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from core_log.batch import (
    BatchHeader,
    any_producer_id,
    bytes_taken,
    largest_batch,
    offsets_spanned,
    records_in,
)

INT32 = st.integers(-(2**31), 2**31 - 1)
INT64 = st.integers(-(2**63), 2**63 - 1)

headers = st.builds(
    BatchHeader,
    base_offset=st.integers(0, 2**62),
    batch_length=st.integers(49, 2**31 - 1),
    partition_leader_epoch=INT32,
    magic=st.just(2),
    crc=st.integers(0, 2**32 - 1),
    attributes=st.integers(0, 2**15 - 1),
    last_offset_delta=st.integers(0, 2**31 - 1),
    base_timestamp=INT64,
    max_timestamp=INT64,
    producer_id=st.integers(-1, 2**40),
    producer_epoch=st.integers(-1, 2**15 - 1),
    base_sequence=INT32,
    record_count=st.integers(0, 2**31 - 1),
)


@given(st.lists(headers, max_size=70))
def test_the_sums_by_field_are_the_sums_by_property(hs: list[BatchHeader]) -> None:
    assert offsets_spanned(hs) == sum(h.next_offset - h.base_offset for h in hs)
    assert bytes_taken(hs) == sum(h.size_bytes for h in hs)
    assert records_in(hs) == sum(h.record_count for h in hs)
    assert largest_batch(hs) == max((h.size_bytes for h in hs), default=0)
    assert any_producer_id(hs) == any(h.producer_id >= 0 for h in hs)
