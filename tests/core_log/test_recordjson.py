"""Records as JSON: the C walk and its Python twin agree byte for byte, both equal
``record_to_json`` (what the API answered before), and both reject corrupt batches."""

from __future__ import annotations

import json
from typing import Any

import orjson
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from api.records_codec import record_to_json
from core_log import recordjson
from core_log.batch import RECORDS_OFFSET, Record, build_batch, iter_records
from core_log.compression import Compression
from core_log.errors import CorruptRecordError, UnreadableRecordError
from core_log.recordjson import MAX_DEPTH, encode_json, encode_section_py, is_json_py

pytestmark = pytest.mark.skipif(
    not recordjson.NATIVE, reason="the C extension was not built (no compiler at install time)"
)

C = recordjson.encode_section
PY = encode_section_py

json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**70), 2**70)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=10),
    lambda kids: (
        st.lists(kids, max_size=4) | st.dictionaries(st.text(max_size=5), kids, max_size=4)
    ),
    max_leaves=12,
)


def _dumped(v: Any, indent: bool) -> bytes:
    return json.dumps(v, ensure_ascii=False, indent=1 if indent else None).encode()


values = st.one_of(
    st.none(),
    st.binary(max_size=60),
    st.text(max_size=30).map(str.encode),
    st.builds(_dumped, json_values, st.booleans()),
    st.builds(
        lambda v: b" \n" + json.dumps(v, separators=(",", ":")).encode() + b"\t", json_values
    ),
    st.sampled_from(
        [b"NaN", b"[1,]", b'"\\ud800"', b'"\\ud83d\\ude00"', b"1e999", b"-0", b"01", b'"\x01"']
    ),
    # the edges of the one JSON rule: numbers around what a double holds, nesting at the
    # limit +-1, invalid UTF-8, lone surrogate escapes
    st.from_regex(r"-?(0|[1-9][0-9]{0,320})(\.[0-9]{1,4})?([eE][+-]?[0-9]{1,4})?", fullmatch=True)
    .map(str.encode)
    .filter(lambda b: b"\n" not in b),
    st.sampled_from(
        [
            b"-1e999",
            b"1e308",
            b"[1e309]",
            b"1.7976931348623159e308",
            b"[" * (MAX_DEPTH - 1) + b"]" * (MAX_DEPTH - 1),
            b"[" * MAX_DEPTH + b"]" * MAX_DEPTH,
            b"[" * (MAX_DEPTH + 1) + b"]" * (MAX_DEPTH + 1),
            b'"\xff"',
            b'"\\udc00"',
            b'["\\ud800x"]',
        ]
    ),
)
texts = st.one_of(st.text(max_size=12), st.text(st.characters(max_codepoint=0x3F), max_size=12))
keys = st.one_of(st.none(), st.binary(max_size=12), texts.map(str.encode))
headers = st.lists(
    st.tuples(texts, st.one_of(st.none(), st.binary(max_size=8), texts.map(str.encode))),
    max_size=3,
).map(tuple)
records = st.builds(
    Record, value=values, key=keys, headers=headers, timestamp=st.integers(0, 2**41)
)
batch_specs = st.lists(
    st.tuples(
        st.lists(records, min_size=1, max_size=12),
        st.sampled_from(list(Compression)),
        st.booleans(),  # LogAppendTime
        st.integers(0, 3),  # gap before the batch (compaction)
    ),
    min_size=1,
    max_size=4,
)


def build(specs: list[tuple[list[Record], Compression, bool, int]]) -> bytes:
    out = []
    offset = 0
    for rs, codec, append_time, gap in specs:
        offset += gap
        out.append(
            build_batch(rs, base_offset=offset, compression=codec, log_append_time=append_time)
        )
        offset += len(rs)
    return b"".join(out)


def reference(r: Record) -> dict[str, Any]:
    """record_to_json (what SSE and the CLI render), parsed back."""
    doc: dict[str, Any] = json.loads(orjson.dumps(record_to_json(r)))
    return doc


def expected(data: bytes, start: int, limit: int, extra: dict[str, Any]) -> list[dict[str, Any]]:
    docs = [{**reference(r), **extra} for r in iter_records(data) if r.offset >= start]
    return docs[:limit]


EXTRA = b',"topic":"t\\n\xc3\xa9","partition":3'
EXTRA_DOC = {"topic": "t\né", "partition": 3}


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(batch_specs, st.integers(0, 60), st.integers(1, 60), st.booleans())
def test_c_and_twin_agree_and_match_record_to_json(
    specs: list[tuple[list[Record], Compression, bool, int]], start: int, limit: int, extra: bool
) -> None:
    data = build(specs)
    ex, ex_doc = (EXTRA, EXTRA_DOC) if extra else (b"", {})
    got_c = encode_json(data, start, limit, extra=ex, encoder=C)
    got_py = encode_json(data, start, limit, extra=ex, encoder=PY)
    assert got_c == got_py
    body, count, last = got_c
    want = expected(data, start, limit, ex_doc)
    assert json.loads(b"[" + body + b"]") == want
    assert count == len(want)
    assert last == (want[-1]["offset"] if want else -1)


@settings(max_examples=100, deadline=None)
@given(st.lists(records, min_size=1, max_size=10))
def test_bytes_equal_orjson_dumps(rs: list[Record]) -> None:
    """Byte for byte what orjson writes for record_to_json, NDJSON separator included."""
    assume(all(r.value is None or is_json_py(r.value) == orjson_accepts(r.value) for r in rs))
    data = build_batch(rs, base_offset=5)
    body, count, _ = encode_json(data, 0, 100, sep=b"\n")
    assert body == b"\n".join(orjson.dumps(record_to_json(r)) for r in iter_records(data))
    assert count == len(rs)


def orjson_accepts(raw: bytes) -> bool:
    try:
        orjson.loads(raw)
    except orjson.JSONDecodeError:
        return False
    return True


# Timestamps drawn from a few values, so records of a batch repeat, alternate and change
# them (the C walk copies a repeated timestamp's digits); offsets up to the largest there is.
_few_timestamps = st.sampled_from([-1, 0, 9, 10, 99, 100, 1_700_000_000_000, 253402300799999])


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.tuples(_few_timestamps, st.binary(max_size=4)), min_size=1, max_size=12),
    st.integers(0, 2**63 - 13),
    st.booleans(),
)
def test_integers_written_as_the_twin_writes_them(
    stamped: list[tuple[int, bytes]], base_offset: int, append_time: bool
) -> None:
    rs = [Record(v, None, (), ts) for ts, v in stamped]
    data = build_batch(rs, base_offset=base_offset, log_append_time=append_time)
    got_c = encode_json(data, 0, 100, encoder=C)
    assert got_c == encode_json(data, 0, 100, encoder=PY)
    docs = json.loads(b"[" + got_c[0] + b"]")
    assert [d["offset"] for d in docs] == list(range(base_offset, base_offset + len(rs)))


# String values whose odd byte (quote, backslash, control, non-ASCII, invalid UTF-8, an
# escape) falls anywhere around the C scan's 16- and 8-byte blocks, with or without
# whitespace around them or text after them.
_odd = st.sampled_from(
    [
        *(b'"', b"\\", b"\x01", b"\x1f", b"\n", b"\xc3\xa9", b"\xff", b"\x7f"),
        *(b"\\n", b"\\u00e9", b"\\q", b"\\u12", b"\\ud800", b"\xed\xa0\x80"),
    ]
)
string_values = st.builds(
    lambda head, odd, tail, before, after: (
        before + b'"' + b"a" * head + odd + b"b" * tail + b'"' + after
    ),
    st.integers(0, 40),
    _odd,
    st.integers(0, 40),
    st.sampled_from([b"", b" ", b"\n"]),
    st.sampled_from([b"", b" ", b"\r\n", b',"x"']),
)


@settings(max_examples=300, deadline=None)
@given(st.lists(string_values, min_size=1, max_size=6))
def test_string_values_render_as_the_twin_renders_them(raws: list[bytes]) -> None:
    data = build_batch([Record(v) for v in raws], base_offset=3)
    assert encode_json(data, 0, 100, encoder=C) == encode_json(data, 0, 100, encoder=PY)
    for raw in raws:
        assert recordjson.is_json(raw) == is_json_py(raw), raw


@pytest.mark.parametrize(
    "value",
    [
        b'"' + b"v" * 98 + b'"',  # a page of the benchmarks (a JSON string, copied)
        b"\x01" * 100,  # text escaped as \u0001: 6x its stored bytes
        bytes(range(256)),  # not UTF-8: base64
    ],
)
@pytest.mark.parametrize(("start", "limit"), [(0, 1000), (0, 1), (990, 1000), (500, 3)])
def test_large_sections_render_as_the_twin_renders_them(
    value: bytes, start: int, limit: int
) -> None:
    """Pages of a 1,000-record batch, from its start, middle and end: the bytes are the
    twin's (the output buffer grows many times over for these)."""
    data = build_batch([Record(value, key=b"k%d" % i) for i in range(1000)])
    got = encode_json(data, start, limit, encoder=C)
    assert got == encode_json(data, start, limit, encoder=PY)
    assert got[1] == min(limit, 1000 - start)


def test_timestamps_log_append_time_and_create_time() -> None:
    rs = [Record(b"1", timestamp=100), Record(b"2", timestamp=250)]
    create = build_batch(rs)
    stamped = build_batch(rs, log_append_time=True)
    docs = orjson.loads(b"[" + encode_json(create + stamped, 0, 10)[0] + b"]")
    assert [d["timestamp"] for d in docs] == [100, 250, 250, 250]
    assert [d["offset"] for d in docs] == [0, 1, 0, 1]


def test_skips_batches_before_start_and_ignores_a_partial_tail() -> None:
    a = build_batch([Record(b"1"), Record(b"2")], base_offset=0)
    b = build_batch([Record(b"3"), Record(b"4")], base_offset=2)
    for enc in (C, PY):
        body, count, last = encode_json(a + b + b[:30], 3, 10, encoder=enc)
        assert (body, count, last) == (
            b'{"offset":3,"timestamp":0,"key":null,"value":4,"headers":[]}',
            1,
            3,
        )
        assert encode_json(a, 5, 10, encoder=enc) == (b"", 0, -1)


# -- the validator --------------------------------------------------------------------------


def _finite(text: str) -> float:
    f = float(text)
    if f in (float("inf"), float("-inf")):
        raise ValueError("overflows a double")
    return f


def strict_loads(raw: bytes) -> bool:
    """The reference: stdlib json, strict, no NaN/Infinity, no number a double cannot hold;
    valid UTF-8 only."""
    try:
        json.loads(
            raw.decode(), parse_constant=lambda c: 1 / 0, parse_int=_finite, parse_float=_finite
        )
    except (ValueError, ZeroDivisionError, RecursionError):
        return False
    return True


json_alphabet = st.sampled_from([*'{}[]:," \\\n\t-+.0123456789eEtrufalsn/u', "\x01", "é"])


@settings(max_examples=1500, deadline=None)
@given(st.one_of(st.binary(max_size=30), st.text(json_alphabet, max_size=30).map(str.encode)))
def test_validator_never_accepts_what_a_strict_parser_rejects(raw: bytes) -> None:
    ok = recordjson.is_json(raw)
    assert ok == is_json_py(raw)
    if ok:
        assert strict_loads(raw)
    elif b"\\u" not in raw:  # no escapes, so no lone surrogates: only the parser decides
        assert not strict_loads(raw)


@settings(max_examples=500, deadline=None)
@given(json_values, st.booleans(), st.booleans())
def test_validator_accepts_any_dumped_json(v: Any, ensure_ascii: bool, indent: bool) -> None:
    raw = json.dumps(v, ensure_ascii=ensure_ascii, indent=2 if indent else None).encode()
    assert recordjson.is_json(raw)
    assert is_json_py(raw)


@pytest.mark.parametrize(
    ("raw", "ok"),
    [
        # one rule: a number a double cannot hold is not a value (JSON.parse gives Infinity,
        # orjson refuses it): sent as value_b64 by every renderer
        (b"1e999", False),
        (b"-1e999", False),
        (b'[1,{"a":1e999}]', False),
        (b"1E+309", False),
        (b"1e308", True),
        (b"1.7976931348623157e308", True),  # DBL_MAX
        (b"-1.7976931348623158e308", True),  # rounds down to DBL_MAX
        (b"1.7976931348623159e308", False),  # rounds up to infinity
        (str(2**1024 - 2**970).encode(), False),  # the midpoint: rounds to infinity
        (str(2**1024 - 2**970 - 1).encode(), True),
        (b"1" + b"0" * 308, True),
        (b"1" + b"0" * 309, False),
        (b"0." + b"0" * 400 + b"1e709", True),
        (b"1e-999", True),  # underflow is 0: a value
        (b"0e999999999999999999999", True),
        (b"123456789012345678901234567890", True),
        (b'"\\ud83d\\ude00"', True),
        (b'"\\ud800"', False),  # a lone surrogate escape
        (b'"\\udc00\\ud800"', False),
        (b'"\\ud800\\u0041"', False),
        (b'{"a":"\\ud800","a":1}', False),  # duplicate keys: every value is checked
        (b"\xef\xbb\xbf1", False),  # a BOM
        (b'"\xed\xa0\x80"', False),  # an encoded surrogate
        (b'"\xc0\xaf"', False),  # overlong
        (b'"\xf4\x90\x80\x80"', False),  # above U+10FFFF
        (b"NaN", False),
        (b"-Infinity", False),
        (b"[1,]", False),
        (b"1 2", False),
        (b"", False),
        (b" ", False),
        (b"01", False),
        (b"1.", False),
        (b"-", False),
        (b'{"a" 1}', False),
        (b"\x0c1", False),  # form feed is not JSON whitespace
        (b"[" * MAX_DEPTH + b"]" * MAX_DEPTH, True),
        (b"[" * (MAX_DEPTH + 1) + b"]" * (MAX_DEPTH + 1), False),
        (b'{"a":' * MAX_DEPTH + b"1" + b"}" * MAX_DEPTH, True),
        (b'{"a":' * (MAX_DEPTH + 1) + b"1" + b"}" * (MAX_DEPTH + 1), False),
        (b"[" * 100_000, False),
    ],
)
def test_validator_cases(raw: bytes, ok: bool) -> None:
    assert recordjson.is_json(raw) is ok
    assert is_json_py(raw) is ok


# -- corrupt input ---------------------------------------------------------------------------


def read_all(enc: Any, data: bytes) -> list[tuple[Any, ...]]:
    """What a consumer that skips unreadable records sees, reading from 0 to the end."""
    trace: list[tuple[Any, ...]] = []
    start = 0
    for _ in range(1_000):
        try:
            body, count, last = encode_json(data, start, 10_000, encoder=enc)
        except UnreadableRecordError as e:
            assert e.next_offset > e.offset >= start
            trace.append(("unreadable", e.offset, e.next_offset, e.retriable, e.http_status))
            start = e.next_offset
            continue
        if count == 0:
            return trace
        trace.append(("records", body, count, last))
        start = last + 1
    raise AssertionError("a consumer that skips unreadable records never got to the end")


def verdict(enc: Any, data: bytes) -> str:
    trace = read_all(enc, data)
    return "corrupt" if any(t[0] == "unreadable" for t in trace) else "ok"


@settings(max_examples=300, deadline=None)
@given(
    st.lists(records, min_size=1, max_size=8),
    st.data(),
)
def test_corrupt_records_raise_in_both(rs: list[Record], data: st.DataObject) -> None:
    batch = bytearray(build_batch(rs))
    section_len = len(batch) - RECORDS_OFFSET
    kind = data.draw(st.sampled_from(["truncate", "garbage", "flip"]))
    if kind == "truncate":  # the section loses its tail; the header still claims every record
        cut = data.draw(st.integers(0, section_len - 1))
        head = bytearray(batch[:RECORDS_OFFSET])
        head[8:12] = (RECORDS_OFFSET - 12 + cut).to_bytes(4, "big")
        bad = bytes(head) + bytes(batch[RECORDS_OFFSET : RECORDS_OFFSET + cut])
        assert read_all(C, bad) == read_all(PY, bad)
        assert verdict(C, bad) == "corrupt"
        return
    if kind == "garbage":  # random bytes in place of the records
        body = data.draw(st.binary(min_size=1, max_size=section_len))
        head = bytearray(batch[:RECORDS_OFFSET])
        head[8:12] = (RECORDS_OFFSET - 12 + len(body)).to_bytes(4, "big")
        bad = bytes(head) + body
    else:  # one byte changed: may still be a well-formed batch; both must agree
        at = data.draw(st.integers(RECORDS_OFFSET, len(batch) - 1))
        batch[at] = data.draw(st.integers(0, 255))
        bad = bytes(batch)
    assert read_all(C, bad) == read_all(PY, bad)


@pytest.mark.parametrize("enc", [C, PY], ids=["c", "py"])
def test_corrupt_compressed_and_codec(enc: Any) -> None:
    batch = bytearray(build_batch([Record(b"x" * 100)] * 5, compression=Compression.ZSTD))
    batch[RECORDS_OFFSET + 10] ^= 0xFF
    with pytest.raises(CorruptRecordError):
        encode_json(bytes(batch), 0, 10, encoder=enc)
    batch = bytearray(build_batch([Record(b"1")]))
    batch[22] |= 0x07  # attributes: codec 7
    with pytest.raises(CorruptRecordError):
        encode_json(bytes(batch), 0, 10, encoder=enc)


@pytest.mark.parametrize("enc", [C, PY], ids=["c", "py"])
def test_wrong_record_count_raises(enc: Any) -> None:
    """The records before the fault are served; reading on from the fault raises, naming the
    offset, not retriable, and where to skip to (past the batch: its bytes are unreadable)."""
    batch = bytearray(build_batch([Record(b"1"), Record(b"2")], last_offset_delta=2))
    batch[57:61] = (3).to_bytes(4, "big")  # claims 3 records
    assert encode_json(bytes(batch), 0, 10, encoder=enc)[1:] == (2, 1)
    with pytest.raises(UnreadableRecordError) as e:
        encode_json(bytes(batch), 2, 10, encoder=enc)
    assert (e.value.offset, e.value.next_offset, e.value.retriable) == (2, 3, False)
    batch[57:61] = (1).to_bytes(4, "big")  # claims 1: trailing bytes
    assert encode_json(bytes(batch), 0, 10, encoder=enc)[1:] == (1, 0)
    with pytest.raises(UnreadableRecordError) as e:
        encode_json(bytes(batch), 1, 10, encoder=enc)
    assert (e.value.offset, e.value.next_offset) == (1, 3)


# -- the one JSON rule for numbers ---------------------------------------------------------

_THRESHOLD = 2**1024 - 2**970  # the smallest magnitude that rounds to infinity


def _near_threshold(n: int, shift: int, neg: bool) -> bytes:
    """n written as digits moved ``shift`` places across the point, and the exponent back."""
    digits = str(n)
    text = f"0.{digits}e{len(digits)}" if shift == 0 else f"{digits}e0"
    if shift > 0:
        text = f"{digits[:-shift] or '0'}.{digits[-shift:]}e{shift}"
    return (("-" if neg else "") + text).encode()


numbers = st.one_of(
    st.from_regex(r"-?(0|[1-9][0-9]{0,330})(\.[0-9]{1,330})?([eE][+-]?[0-9]{1,5})?", fullmatch=True)
    .map(str.encode)
    .filter(lambda b: b"\n" not in b),
    st.builds(
        _near_threshold,
        st.integers(_THRESHOLD - 10**6, _THRESHOLD + 10**6),
        st.integers(0, 300),
        st.booleans(),
    ),
)


@settings(max_examples=1500, deadline=None, derandomize=True)
@given(numbers)
def test_a_number_is_a_json_value_iff_a_double_holds_it(raw: bytes) -> None:
    """C, the Python twin and Python's float (correctly rounded) agree, around 2^1024 too."""
    finite = float(raw) not in (float("inf"), float("-inf"))
    assert recordjson.is_json(raw) is finite
    assert is_json_py(raw) is finite
    assert recordjson.is_json(b"[%s]" % raw) is finite


def test_every_renderer_sends_an_overflowing_number_as_base64() -> None:
    """fetch/NDJSON/WebSocket (encode_json, C), SSE and the CLI (record_to_json): one answer."""
    batch = build_batch([Record(b"1e999"), Record(b"[" * 513 + b"]" * 513), Record(b"1e308")])
    body, count, _ = encode_json(batch, 0, 10, sep=b"\n")
    docs = [json.loads(line) for line in body.split(b"\n")]
    assert count == len(docs) == 3
    assert ["value_b64" in d for d in docs] == [True, True, False]
    for r, d in zip(iter_records(batch), docs, strict=True):
        assert json.loads(orjson.dumps(record_to_json(r))) == d


@pytest.mark.parametrize("enc", [C, PY], ids=["c", "py"])
def test_an_answer_stops_before_an_unreadable_record_and_says_where(enc: Any) -> None:
    """Whatever else the read held, a reader goes on from the unreadable record, not past it."""
    good = build_batch([Record(b"1")], base_offset=0)
    bad = build_batch([Record(b"2", timestamp=2**62)], base_offset=1)  # past year 9999
    after = build_batch([Record(b"3")], base_offset=2)
    data = good + bad + after
    _, count, last, stop = recordjson.encode_json_upto(data, 0, 100, encoder=enc)
    assert (count, last, stop) == (1, 0, 1)
    assert recordjson.read_on_from(3, stop) == 1
    assert recordjson.encode_json_upto(after, 2, 100, encoder=enc)[3] is None
