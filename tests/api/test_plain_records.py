"""JSON produce's records built in C (``_recordscan.plain_records``) and by the Python twin
(:func:`api.records_codec.to_record`) agree on every body: the same (partition, Record) list,
or the same 4xx with the same message. Bodies mix the common shape (the C path) with every
field that sends a record to the twin (``*_b64``, headers, empty headers), keys and values of
every JSON kind, lone surrogates, timestamps and partitions at and past their bounds, unknown
fields and broken JSON — so the single validation point (msgspec's decode, then the twin's
checks) decides alike with and without the extension."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from api import records_codec
from api.records_codec import parse_json_body, parse_ndjson_lines
from core_log.batch import Record
from core_log.errors import LogbusError

pytestmark = pytest.mark.skipif(
    records_codec._native_plain is None,
    reason="built with LOGBUS_PURE_PYTHON=1: no C record builder to compare",
)

json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**70), 2**70)
    | st.floats(allow_nan=False)
    | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=3), inner),
    max_leaves=6,
)
texts = st.text(max_size=8) | st.sampled_from(["\ud800", "a\udfff", "é", ""])
b64 = st.sampled_from(["", "dmFsdWU=", "not base64!", "AA=="])
bounds = st.sampled_from([-1, 0, 1, 2**31 - 1, 2**31, 2**63 - 1, 2**63])
field_values: dict[str, Any] = {
    "key": texts | st.none() | st.integers(0, 3),
    "key_b64": b64 | st.none(),
    "value": json_values,
    "value_b64": b64,
    "headers": st.none()
    | st.just([])
    | st.lists(st.fixed_dictionaries({"name": texts}, optional={"value": texts | st.none()})),
    "partition": st.none() | st.integers(0, 3) | bounds,
    "timestamp": st.none() | st.integers(0, 2**42) | bounds,
    "unknown": st.integers(),
}
plain = st.fixed_dictionaries(
    {},
    optional={
        "key": field_values["key"],
        "value": field_values["value"],
        "partition": field_values["partition"],
        "timestamp": field_values["timestamp"],
    },
)
anything = st.dictionaries(st.sampled_from(sorted(field_values)), st.none(), max_size=4).flatmap(
    lambda d: st.fixed_dictionaries({k: field_values[k] for k in d})
)
records = st.lists(plain | plain | anything, max_size=8)


def outcome(parse: Any, *args: Any) -> tuple[str, Any]:
    try:
        return "ok", parse(*args)
    except LogbusError as e:
        return "error", (e.http_status, str(e), e.code)


def both(monkeypatch: pytest.MonkeyPatch, parse: Any, *args: Any) -> None:
    native = outcome(parse, *args)
    with monkeypatch.context() as m:
        m.setattr(records_codec, "_native_plain", None)
        twin = outcome(parse, *args)
    assert native == twin
    if native[0] == "error":
        assert 400 <= native[1][0] < 500


@settings(max_examples=500, deadline=None)
@given(records, st.integers(0, 2**42))
def test_json_bodies_parse_alike(rs: list[dict[str, Any]], now: int) -> None:
    body = json.dumps({"records": rs}).encode()  # \\ud800 escapes kept (orjson refuses them)
    with pytest.MonkeyPatch.context() as mp:
        both(mp, parse_json_body, body, 5, now)


@settings(max_examples=300, deadline=None)
@given(records, st.integers(0, 2**42))
def test_ndjson_lines_parse_alike(rs: list[dict[str, Any]], now: int) -> None:
    lines = [json.dumps(r).encode() for r in rs]
    with pytest.MonkeyPatch.context() as mp:
        both(mp, parse_ndjson_lines, lines, 1, now)


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=40) | st.text(max_size=40).map(str.encode))
def test_broken_bodies_fail_alike(body: bytes) -> None:
    with pytest.MonkeyPatch.context() as mp:
        both(mp, parse_json_body, b'{"records": [' + body + b"]}", 100, 0)


def test_the_common_shape_is_built_in_c() -> None:
    """The benchmark's body (values, no keys) takes the C path, and so does a keyed one."""
    assert records_codec._native_plain is not None
    items = records_codec._BODY.decode(
        b'{"records": [{"value": "v"}, {"key": "k", "value": null, "timestamp": 7}, {}]}'
    ).records
    built = records_codec._native_plain(items, 5, Record, records_codec._UNSET)
    assert built == [records_codec.to_record(r, 5, "%d", i) for i, r in enumerate(items)]
    with_headers = records_codec._BODY.decode(b'{"records": [{"value": 1, "headers": []}]}')
    assert (
        records_codec._native_plain(with_headers.records, 5, Record, records_codec._UNSET) is None
    )
