"""encode_json_within: the records encode_json would render, cut at the byte budget."""

from __future__ import annotations

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from api.rendering import Rendered, encode_json_within
from core_log.batch import Record, build_batch
from core_log.compression import Compression
from core_log.recordjson import encode_json

EXTRA = b',"topic":"t","partition":3'


def log_of(
    batches: list[list[int]], codec: Compression, compressed: list[bool] | None = None
) -> bytes:
    """Batches back to back as the log stores them; record i of the log has a value of the
    given size (JSON text for even offsets, bytes that render as value_b64 for odd)."""
    out = []
    offset = 0
    for sizes in batches:
        records = [
            Record(b'"' + b"j" * size + b'"' if (offset + i) % 2 == 0 else b"\xff" * size, b"k")
            for i, size in enumerate(sizes)
        ]
        packed = compressed is None or compressed[len(out) % len(compressed)]
        batch_codec = codec if packed else Compression.NONE
        out.append(build_batch(records, base_offset=offset, compression=batch_codec))
        offset += len(sizes)
    return b"".join(out)


# up to 8 batches of 12 records of 3 KB: runs of uncompressed batches pass RUN_BYTES (64 KiB)
layouts = st.lists(st.lists(st.integers(0, 3000), min_size=1, max_size=12), min_size=1, max_size=8)


@settings(max_examples=150, deadline=None)
@given(
    layout=layouts,
    codec=st.sampled_from([Compression.NONE, Compression.ZSTD]),
    compressed=st.lists(st.booleans(), min_size=1, max_size=5),
    start=st.integers(0, 30),
    max_records=st.integers(1, 100),
    max_bytes=st.integers(1, 150_000),
    sep=st.sampled_from([b",", b"\n"]),
    at_least_one=st.booleans(),
)
def test_the_answer_is_the_longest_prefix_within_the_budget(
    layout: list[list[int]],
    codec: Compression,
    compressed: list[bool],
    start: int,
    max_records: int,
    max_bytes: int,
    sep: bytes,
    at_least_one: bool,
) -> None:
    data = log_of(layout, codec, compressed)
    r = encode_json_within(
        data, start, max_records, max_bytes, extra=EXTRA, sep=sep, at_least_one=at_least_one
    )
    # exactly what encode_json renders for that many records
    body, count, last = encode_json(data, start, r.count, extra=EXTRA, sep=sep)
    assert (r.body, r.count, r.last_offset) == ((body, count, last) if r.count else (b"", 0, -1))
    available = encode_json(data, start, max_records, extra=EXTRA, sep=sep)
    if not r.full:
        assert r.count == available[1]
        assert r.body == available[0]
        return
    assert r.count < available[1]
    # within the budget, or the one record a consumer must get to progress
    assert len(r.body) <= max_bytes or (at_least_one and r.count == 1)
    # and the next record would not have fitted
    more = encode_json(data, start, r.count + 1, extra=EXTRA, sep=sep)[0]
    assert len(more) > max_bytes
    assert r.next_offset(start) == (r.last_offset + 1 if r.count else start)


def test_a_large_first_record_is_sent_alone() -> None:
    data = log_of([[50_000, 10, 10]], Compression.ZSTD)
    r = encode_json_within(data, 0, 100, 1000)
    assert (r.count, r.last_offset, r.full) == (1, 0, True)
    assert len(r.body) > 50_000
    r = encode_json_within(data, 0, 100, 1000, at_least_one=False)
    assert (r.body, r.count, r.full, r.next_offset(0)) == (b"", 0, True, 0)


@pytest.mark.parametrize("sep", [b",", b"\n"])
def test_a_compressible_log_renders_within_max_bytes(sep: bytes) -> None:
    """Twenty batches of 2 MiB of records in ~20 KB: a 1 MiB answer, not 40 MiB."""
    big = [Record(b"a" * (256 * 1024)) for _ in range(8)]
    data = b"".join(
        build_batch(big, base_offset=8 * i, compression=Compression.ZSTD) for i in range(20)
    )
    assert len(data) < 64 * 1024
    r = encode_json_within(data, 0, 10_000, 1024 * 1024, sep=sep)
    assert r.full and r.count == 2  # 2 x 350 KB of base64 fit in 1 MiB, 3 do not
    assert len(r.body) <= 1024 * 1024
    assert r.next_offset(0) == 2


@given(
    st.lists(st.binary(min_size=1, max_size=20), max_size=5),
    st.sampled_from([b",", b"\n"]),
    st.binary(max_size=15),
    st.binary(max_size=15),
)
def test_joined_is_head_body_tail(parts: list[bytes], sep: bytes, head: bytes, tail: bytes) -> None:
    """What a fetch answers: the pieces joined once with the document's head and tail, byte
    for byte what joining the body first gave."""
    r = Rendered(parts, sep, len(parts), len(parts) - 1, False)
    assert r.body == sep.join(parts)
    assert r.joined(head, tail) == head + sep.join(parts) + tail


def test_a_page_of_two_pieces_answers_as_one_document() -> None:
    """A 1,000-record page of two batches (a JSON produce splits at 64 KiB): the fetch's
    document holds every record once, in order."""
    value = b'"' + b"v" * 98 + b'"'
    data = build_batch([Record(value)] * 528) + build_batch([Record(value)] * 472, base_offset=528)
    r = encode_json_within(data, 0, 1000, 1 << 20)
    assert len(r.parts) == 2 and r.count == 1000
    doc = orjson.loads(r.joined(b'{"records":[', b'],"next_offset":1000}'))
    assert [x["offset"] for x in doc["records"]] == list(range(1000))
    assert doc["records"][0]["value"] == "v" * 98
