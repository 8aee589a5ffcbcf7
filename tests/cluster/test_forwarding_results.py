"""An append's result on the forwarding wire: :func:`cluster.forwarding.result_fields` is
``dataclasses.asdict`` without the deep copy, and the forwarding broker rebuilds the same
:class:`~core_log.log.AppendResult` from it."""

from __future__ import annotations

import dataclasses

import orjson
from hypothesis import given
from hypothesis import strategies as st

from cluster.forwarding import result_fields
from core_log.log import AppendResult

offsets = st.integers(min_value=-1, max_value=2**63 - 1)
results = st.builds(
    AppendResult,
    base_offset=offsets,
    last_offset=offsets,
    batches=st.integers(min_value=0, max_value=10_000),
    records=st.integers(min_value=0, max_value=2**31 - 1),
    size_bytes=st.integers(min_value=0, max_value=2**31 - 1),
    log_append_time_ms=offsets,
    duplicate=st.booleans(),
    sync_required=st.booleans(),
)


@given(results)
def test_result_fields_equal_asdict_and_round_trip(result: AppendResult) -> None:
    fields = result_fields(result)
    assert fields == dataclasses.asdict(result)
    assert orjson.dumps(fields) == orjson.dumps(dataclasses.asdict(result))
    assert AppendResult(**orjson.loads(orjson.dumps(fields))) == result
