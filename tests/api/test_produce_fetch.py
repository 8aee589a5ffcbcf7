"""Produce and fetch in every content type, against a real broker.

Every test runs twice: through the lean ASGI fast path and through the FastAPI routes that
document it and back it up (``logbus serve --no-fast-path``); both must behave the same.
"""

from __future__ import annotations

import base64
import itertools
import json
import random
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.api.conftest import FAST_PATH, FASTAPI_ROUTES, both_paths_broker
from tests.api.helpers import (
    BATCH,
    JSON,
    NDJSON,
    MemoryRecords,
    assert_problem,
    create_topic,
    end_offsets,
    fetch,
    fetch_all,
    kafka_batch,
    kafka_partition,
    ndjson_lines,
    produce,
)
from tests.server import BrokerProcess


@pytest.fixture(scope="module", params=[FAST_PATH, FASTAPI_ROUTES])
def shared_broker(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[BrokerProcess]:
    yield from both_paths_broker(request, tmp_path_factory)


def canonical(value: Any) -> str:
    """JSON text that tells 1 from 1.0 and true from 1: 'the same JSON value', strictly."""
    return json.dumps(value, sort_keys=True, ensure_ascii=False)


def b64(raw: bytes) -> str:
    return base64.b64encode(raw).decode()


def position_headers(r: httpx.Response) -> dict[str, int]:
    return {
        k: int(r.headers[f"logbus-{k}"])
        for k in ("next-offset", "high-watermark", "log-start-offset", "lag")
    }


def split_batches(data: bytes) -> list[bytes]:
    out = []
    pos = 0
    while pos < len(data):
        size = int.from_bytes(data[pos + 8 : pos + 12], "big") + 12
        out.append(data[pos : pos + size])
        pos += size
    assert pos == len(data)
    return out


# -- JSON ----------------------------------------------------------------------------------------

JSON_VALUES: list[Any] = [
    {"page": "/home", "nested": {"list": [1, 2.5, None, True, "x"], "empty": {}}},
    [1, [2, [3, []]], {"a": None}],
    0,
    -17,
    9223372036854775807,
    -9223372036854775808,
    18446744073709551615,
    3.141592653589793,
    1.0,
    -0.0,
    1e300,
    True,
    False,
    "",
    "plain text",
    '{"looks": "like json"}',
    "null",
    "unicode: é ü 😀 \u0000 \n \t \u2028",
    [],
    {},
]


def test_json_values_round_trip_exactly(http: httpx.Client) -> None:
    topic = create_topic(http, "jsonvals")
    offsets = produce(http, topic, [{"value": v} for v in JSON_VALUES])
    assert offsets == [{"partition": 0, "offset": i} for i in range(len(JSON_VALUES))]
    got = fetch_all(http, topic, 0)
    assert [r["offset"] for r in got] == list(range(len(JSON_VALUES)))
    for sent, record in zip(JSON_VALUES, got, strict=True):
        assert "value_b64" not in record
        assert canonical(record["value"]) == canonical(sent)


def test_json_integers_beyond_64_bits_round_trip(http: httpx.Client) -> None:
    topic = create_topic(http, "bigint")
    raw = b'{"records": [{"value": 18446744073709551616}, {"value": [100000000000000000000000]}]}'
    r = http.post(f"/v1/topics/{topic}/records", content=raw, headers={"content-type": JSON})
    assert r.status_code == 200, r.text
    got = http.get(f"/v1/topics/{topic}/partitions/0/records", params={"offset": 0})
    assert [x["value"] for x in got.json()["records"]] == [2**64, [10**23]]


def test_json_record_fields_round_trip(http: httpx.Client) -> None:
    topic = create_topic(http, "jsonfields")
    before = int(time.time() * 1000)
    records: list[dict[str, Any]] = [
        {"key": "user-1", "value": {"a": 1}},
        {"key": "", "value": "empty key is not a null key"},
        {"key": None, "value": "null key"},
        {"key_b64": b64(b"\xff\xfe\x00binary key"), "value": 1},
        {"key_b64": b64(b"utf8 key"), "value": 2},
        {"value_b64": b64(b"\x00\xffnot json")},
        {"value_b64": b64(b"")},
        {"value": None},  # tombstone
        {"key": "tomb"},  # missing value: also a tombstone
        {
            "value": "headers",
            "headers": [
                {"name": "text", "value": "web"},
                {"name": "bin", "value_b64": b64(b"\xff\x00")},
                {"name": "null", "value": None},
                {"name": "empty", "value": ""},
                {"name": "text", "value": "duplicate names keep their order"},
                {"name": "ñame ü", "value": "unicode name"},
            ],
        },
        {"value": "fixed time", "timestamp": 1_700_000_000_123},
        {"value": "epoch", "timestamp": 0},
    ]
    produce(http, topic, records)
    after = int(time.time() * 1000)
    got = fetch_all(http, topic, 0)
    assert len(got) == len(records)
    by_value = {json.dumps(r.get("value")): r for r in got if "value" in r}

    assert got[0]["key"] == "user-1" and got[0]["value"] == {"a": 1}
    assert got[1]["key"] == "" and got[2]["key"] is None
    assert got[3]["key_b64"] == b64(b"\xff\xfe\x00binary key") and "key" not in got[3]
    assert got[4]["key"] == "utf8 key"  # bytes that are UTF-8 come back as text
    assert got[5]["value_b64"] == b64(b"\x00\xffnot json") and "value" not in got[5]
    assert got[6]["value_b64"] == ""  # empty bytes are not a tombstone
    assert got[7]["value"] is None and "value_b64" not in got[7]
    assert got[8]["key"] == "tomb" and got[8]["value"] is None
    assert got[9]["headers"] == [
        {"name": "text", "value": "web"},
        {"name": "bin", "value_b64": b64(b"\xff\x00")},
        {"name": "null", "value": None},
        {"name": "empty", "value": ""},
        {"name": "text", "value": "duplicate names keep their order"},
        {"name": "ñame ü", "value": "unicode name"},
    ]
    assert all(r["headers"] == [] for i, r in enumerate(got) if i != 9)
    assert by_value['"fixed time"']["timestamp"] == 1_700_000_000_123
    assert by_value['"epoch"']["timestamp"] == 0
    for r in got[:10]:
        assert before - 5 <= r["timestamp"] <= after + 5, r  # broker time when not given


def test_value_b64_that_is_json_comes_back_as_value(http: httpx.Client) -> None:
    # Documented in api/records_codec.py: bytes that parse as JSON are answered as `value`.
    topic = create_topic(http, "b64json")
    produce(http, topic, [{"value_b64": b64(b'{"a": [1, 2]}')}, {"value_b64": b64(b'"s"')}])
    assert [r["value"] for r in fetch_all(http, topic, 0)] == [{"a": [1, 2]}, "s"]


def test_keyed_records_land_on_kafkas_murmur2_partition(http: httpx.Client) -> None:
    partitions = 7
    topic = create_topic(http, "murmur", partitions=partitions)
    rng = random.Random(7)
    keys: list[bytes] = [f"user-{i}".encode() for i in range(150)]
    keys += ["ключ-é-😀".encode(), b"", b"a", b"ab", b"abc", b"abcd", b"abcde"]
    keys += [rng.randbytes(rng.randrange(1, 40)) for _ in range(60)]
    records: list[dict[str, Any]] = []
    for i, k in enumerate(keys):
        try:
            records.append({"key": k.decode(), "value": i})
        except UnicodeDecodeError:
            records.append({"key_b64": b64(k), "value": i})
    offsets = produce(http, topic, records)
    expected = [kafka_partition(k, partitions) for k in keys]
    assert [o["partition"] for o in offsets] == expected
    assert len(set(expected)) == partitions  # the sample spreads over every partition
    # Each record is where the answer said, with its key.
    for p in range(partitions):
        got = {r["offset"]: r for r in fetch_all(http, topic, p)}
        for i, o in enumerate(offsets):
            if o["partition"] == p:
                assert got[o["offset"]]["value"] == i


def test_keyed_ndjson_and_path_partition(http: httpx.Client) -> None:
    topic = create_topic(http, "murmurnd", partitions=5)
    keys = [f"k{i}" for i in range(30)]
    body = "".join(json.dumps({"key": k, "value": k}) + "\n" for k in keys)
    r = http.post(f"/v1/topics/{topic}/records", content=body, headers={"content-type": NDJSON})
    assert r.status_code == 200, r.text
    assert [o["partition"] for o in r.json()["offsets"]] == [
        kafka_partition(k.encode(), 5) for k in keys
    ]
    # The partition path overrides the key.
    offsets = produce(http, topic, [{"key": k, "value": k} for k in keys], partition=3)
    assert {o["partition"] for o in offsets} == {3}


def test_explicit_partition_wins_over_key_and_offsets_follow_request_order(
    http: httpx.Client,
) -> None:
    topic = create_topic(http, "order", partitions=3)
    records: list[dict[str, Any]] = [
        {"value": 0, "partition": 2},
        {"value": 1, "partition": 0, "key": "same"},
        {"value": 2, "partition": 2, "key": "same"},
        {"value": 3, "partition": 1},
        {"value": 4, "partition": 2},
        {"value": 5, "partition": 0},
    ]
    offsets = produce(http, topic, records)
    assert offsets == [
        {"partition": 2, "offset": 0},
        {"partition": 0, "offset": 0},
        {"partition": 2, "offset": 1},
        {"partition": 1, "offset": 0},
        {"partition": 2, "offset": 2},
        {"partition": 0, "offset": 1},
    ]
    assert [r["value"] for r in fetch_all(http, topic, 2)] == [0, 2, 4]
    assert [r["value"] for r in fetch_all(http, topic, 0)] == [1, 5]
    # A second request continues where the first ended, still in request order.
    offsets = produce(http, topic, [{"value": 6, "partition": 2}, {"value": 7, "partition": 0}])
    assert offsets == [{"partition": 2, "offset": 3}, {"partition": 0, "offset": 2}]


def test_mixed_keyed_request_offsets_in_request_order(http: httpx.Client) -> None:
    topic = create_topic(http, "mixed", partitions=4)
    keys = [f"order-{i % 9}" for i in range(60)]
    offsets = produce(http, topic, [{"key": k, "value": i} for i, k in enumerate(keys)])
    next_offset = [0, 0, 0, 0]
    for i, (k, o) in enumerate(zip(keys, offsets, strict=True)):
        p = kafka_partition(k.encode(), 4)
        assert o == {"partition": p, "offset": next_offset[p]}, i
        next_offset[p] += 1
    assert end_offsets(http, topic) == next_offset


def test_keyless_records_are_sticky_per_request_and_rotate(http: httpx.Client) -> None:
    topic = create_topic(http, "sticky", partitions=4)
    chosen = []
    for i in range(8):
        offsets = produce(http, topic, [{"value": f"{i}-{j}"} for j in range(5)])
        parts = {o["partition"] for o in offsets}
        assert len(parts) == 1, offsets  # one request, one partition
        chosen.append(parts.pop())
    assert all(a != b for a, b in itertools.pairwise(chosen)), chosen
    assert set(chosen[:4]) == {0, 1, 2, 3}, chosen  # round robin over requests
    # NDJSON requests are sticky too.
    body = "".join(json.dumps({"value": j}) + "\n" for j in range(5))
    r = http.post(f"/v1/topics/{topic}/records", content=body, headers={"content-type": NDJSON})
    assert len({o["partition"] for o in r.json()["offsets"]}) == 1


def test_record_partition_conflicting_with_path_is_400(http: httpx.Client) -> None:
    topic = create_topic(http, "conflict", partitions=2)
    r = http.post(
        f"/v1/topics/{topic}/partitions/0/records",
        json={"records": [{"value": 1}, {"value": 2, "partition": 1}]},
    )
    assert_problem(r, 400, "INVALID_REQUEST")
    assert end_offsets(http, topic) == [0, 0]
    # The same partition as the path is fine.
    offsets = produce(http, topic, [{"value": 1, "partition": 1}], partition=1)
    assert offsets == [{"partition": 1, "offset": 0}]


def test_large_json_request_is_split_into_batches_and_read_back(http: httpx.Client) -> None:
    topic = create_topic(http, "bigjson")
    records = [{"key": f"k{i}", "value": {"i": i, "pad": "p" * 200}} for i in range(8000)]
    offsets = produce(http, topic, records)
    assert [o["offset"] for o in offsets] == list(range(8000))
    r = fetch(http, topic, 0, 0, max_bytes=64 * 1024 * 1024)
    raw = http.get(
        f"/v1/topics/{topic}/partitions/0/records",
        params={"offset": 0, "max_bytes": 64 * 1024 * 1024},
        headers={"accept": BATCH},
    )
    batches = split_batches(raw.content)
    assert len(batches) > 1  # ~1.7 MB of records: more than one batch below max.message.bytes
    assert all(len(b) <= 1048588 for b in batches)
    got = r.json()["records"]
    assert [x["value"]["i"] for x in got] == list(range(8000))


# -- NDJSON --------------------------------------------------------------------------------------


def test_ndjson_produce_ignores_blank_lines(http: httpx.Client) -> None:
    topic = create_topic(http, "ndblank")
    body = (
        b"\n"
        b'{"key": "a", "value": 1}\n'
        b"   \n"
        b"\n"
        b'{"value": [1, {"b": 2}]}\r\n'
        b'{"value_b64": "AP8=", "headers": [{"name": "h", "value": "v"}]}\n'
        b"\t\n"
        b'{"value": "last line without newline"}'
    )
    r = http.post(f"/v1/topics/{topic}/records", content=body, headers={"content-type": NDJSON})
    assert r.status_code == 200, r.text
    assert [o["offset"] for o in r.json()["offsets"]] == [0, 1, 2, 3]
    got = fetch_all(http, topic, 0)
    assert got[0]["key"] == "a" and got[0]["value"] == 1
    assert got[1]["value"] == [1, {"b": 2}]
    assert got[2]["value_b64"] == "AP8=" and got[2]["headers"] == [{"name": "h", "value": "v"}]
    assert got[3]["value"] == "last line without newline"


def test_ndjson_large_streamed_body(http: httpx.Client) -> None:
    topic = create_topic(http, "ndbig", partitions=2)
    n = 50_000

    def body() -> Iterator[bytes]:
        chunk = []
        for i in range(n):
            chunk.append(b'{"key": "k%d", "value": {"i": %d}}\n' % (i, i))
            if i % 997 == 0:
                chunk.append(b"\n")  # blank lines anywhere
            if len(chunk) >= 300:
                # Chunk boundaries fall mid-line: the parser must stitch lines together.
                data = b"".join(chunk)
                yield data[:7]
                yield data[7:]
                chunk = []
        yield b"".join(chunk)

    r = http.post(
        f"/v1/topics/{topic}/partitions/1/records",
        content=body(),
        headers={"content-type": NDJSON},
        timeout=120,
    )
    assert r.status_code == 200, r.text
    offsets = r.json()["offsets"]
    assert offsets == [{"partition": 1, "offset": i} for i in range(n)]
    # Read it back as NDJSON, following Logbus-Next-Offset: every record exactly once.
    seen: list[int] = []
    offset = 0
    while offset < n:
        f = http.get(
            f"/v1/topics/{topic}/partitions/1/records",
            params={"offset": offset, "max_records": 20_000},
            headers={"accept": NDJSON},
        )
        assert f.status_code == 200
        assert f.headers["content-type"].startswith(NDJSON)
        lines = ndjson_lines(f.text)
        assert lines, offset
        assert [x["offset"] for x in lines] == list(range(offset, offset + len(lines)))
        seen.extend(x["value"]["i"] for x in lines)
        assert int(f.headers["logbus-next-offset"]) == offset + len(lines)
        offset = int(f.headers["logbus-next-offset"])
    assert seen == list(range(n))
    assert end_offsets(http, topic) == [0, n]


def test_ndjson_fetch_lines_match_json_fetch(http: httpx.Client) -> None:
    topic = create_topic(http, "ndfetch")
    produce(
        http,
        topic,
        [
            {"key": "a", "value": {"x": 1}, "headers": [{"name": "h", "value": "1"}]},
            {"key_b64": b64(b"\xff"), "value_b64": b64(b"\xfe")},
            {"value": None},
        ],
    )
    j = fetch(http, topic, 0, 0)
    n = http.get(
        f"/v1/topics/{topic}/partitions/0/records",
        params={"offset": 0},
        headers={"accept": NDJSON},
    )
    assert n.status_code == 200
    assert ndjson_lines(n.text) == j.json()["records"]
    assert n.text.endswith("\n") and len(n.text.splitlines()) == 3
    assert (
        position_headers(n)
        == position_headers(j)
        == {
            "next-offset": 3,
            "high-watermark": 3,
            "log-start-offset": 0,
            "lag": 0,
        }
    )


# -- binary batches ------------------------------------------------------------------------------

CODECS = {0: "none", 1: "gzip", 2: "snappy", 3: "lz4", 4: "zstd"}


@pytest.mark.parametrize("codec", list(CODECS), ids=list(CODECS.values()))
def test_binary_batch_round_trip_every_codec(http: httpx.Client, codec: int) -> None:
    topic = create_topic(http, f"bin-{CODECS[codec]}", partitions=2)
    produce(http, topic, [{"value": "before"}] * 3, partition=1)  # the batch lands at offset 3
    values: list[bytes | None] = [b"value-%d-" % i + b"z" * (i * 37) for i in range(30)]
    values[5] = None  # a tombstone
    values[6] = b""
    values[7] = b"\x00\xff\xfe binary"
    keys: list[bytes | None] = [b"key-%d" % i for i in range(30)]
    keys[3] = None
    headers = [[("h", b"%d" % i), ("bin", b"\xff")] if i % 3 == 0 else [] for i in range(30)]
    batch = kafka_batch(values, codec=codec, keys=keys, headers=headers)

    r = http.post(
        f"/v1/topics/{topic}/partitions/1/records", content=batch, headers={"content-type": BATCH}
    )
    assert r.status_code == 200, r.text
    assert r.json() == {"offsets": [{"partition": 1, "offset": 3}]}
    assert end_offsets(http, topic) == [0, 33]

    f = http.get(
        f"/v1/topics/{topic}/partitions/1/records",
        params={"offset": 3},
        headers={"accept": BATCH},
    )
    assert f.status_code == 200
    assert f.headers["content-type"] == BATCH
    assert position_headers(f) == {
        "next-offset": 33,
        "high-watermark": 33,
        "log-start-offset": 0,
        "lag": 0,
    }
    stored = f.content
    assert len(stored) == len(batch)
    # Identical but for baseOffset (assigned) and partitionLeaderEpoch (stamped by the leader).
    assert int.from_bytes(stored[:8], "big") == 3
    assert stored[8:12] == batch[8:12]
    assert int.from_bytes(stored[12:16], "big", signed=True) == 0
    assert stored[16:] == batch[16:]

    # kafka-python decodes what we serve.
    mr = MemoryRecords(stored)
    kb = mr.next_batch()
    assert kb is not None and kb.validate_crc()
    assert kb.compression_type == codec
    assert kb.base_offset == 3
    decoded = list(kb)
    assert [r.offset for r in decoded] == list(range(3, 33))
    assert [r.value for r in decoded] == values
    assert [r.key for r in decoded] == keys
    assert [list(r.headers) for r in decoded] == headers
    assert [r.timestamp for r in decoded] == [1_700_000_000_000 + i for i in range(30)]
    assert mr.next_batch() is None

    # The same records as JSON.
    got = fetch(http, topic, 1, 3).json()["records"]
    assert len(got) == 30
    assert got[5]["value"] is None
    assert got[6]["value_b64"] == ""
    assert got[7]["value_b64"] == b64(b"\x00\xff\xfe binary")
    assert got[0]["value_b64"] == b64(values[0] or b"")
    assert got[3]["key"] is None and got[4]["key"] == "key-4"
    assert got[0]["headers"] == [{"name": "h", "value": "0"}, {"name": "bin", "value_b64": "/w=="}]


def test_several_batches_in_one_body(http: httpx.Client) -> None:
    topic = create_topic(http, "binmulti")
    batches = [kafka_batch([b"b%d-r%d" % (c, i) for i in range(c + 2)], codec=c) for c in range(5)]
    body = b"".join(batches)
    r = http.post(
        f"/v1/topics/{topic}/partitions/0/records", content=body, headers={"content-type": BATCH}
    )
    assert r.status_code == 200, r.text
    assert r.json() == {"offsets": [{"partition": 0, "offset": 0}]}
    total = sum(c + 2 for c in range(5))
    assert end_offsets(http, topic) == [total]
    f = http.get(
        f"/v1/topics/{topic}/partitions/0/records", params={"offset": 0}, headers={"accept": BATCH}
    )
    stored = split_batches(f.content)
    assert len(stored) == 5
    base = 0
    for sent, got in zip(batches, stored, strict=True):
        assert int.from_bytes(got[:8], "big") == base
        assert got[8:12] == sent[8:12] and got[16:] == sent[16:]
        base += int.from_bytes(sent[23:27], "big") + 1
    values = [r["value_b64"] for r in fetch_all(http, topic, 0)]
    assert [base64.b64decode(v) for v in values] == [
        b"b%d-r%d" % (c, i) for c in range(5) for i in range(c + 2)
    ]
    # A second request continues the offsets.
    r = http.post(
        f"/v1/topics/{topic}/partitions/0/records",
        content=batches[0],
        headers={"content-type": BATCH},
    )
    assert r.json() == {"offsets": [{"partition": 0, "offset": total}]}


def test_binary_batch_to_the_topic_path_is_400(http: httpx.Client) -> None:
    topic = create_topic(http, "bintopic")
    r = http.post(
        f"/v1/topics/{topic}/records", content=kafka_batch([b"x"]), headers={"content-type": BATCH}
    )
    assert_problem(r, 400, "INVALID_REQUEST")
    assert end_offsets(http, topic) == [0]


def test_topic_compression_type_recompresses_stored_batches(http: httpx.Client) -> None:
    topic = create_topic(http, "recompress", configs={"compression.type": "gzip"})
    produce(http, topic, [{"value": {"i": i, "pad": "a" * 100}} for i in range(50)])
    r = http.post(
        f"/v1/topics/{topic}/partitions/0/records",
        content=kafka_batch([b"zstd-%d" % i for i in range(5)], codec=4),
        headers={"content-type": BATCH},
    )
    assert r.status_code == 200, r.text
    f = http.get(
        f"/v1/topics/{topic}/partitions/0/records", params={"offset": 0}, headers={"accept": BATCH}
    )
    mr = MemoryRecords(f.content)
    codecs = []
    while (kb := mr.next_batch()) is not None:
        assert kb.validate_crc()
        codecs.append(kb.compression_type)
    assert codecs and set(codecs) == {1}
    got = fetch_all(http, topic, 0)
    assert [x["value"]["i"] for x in got[:50]] == list(range(50))
    assert [base64.b64decode(x["value_b64"]) for x in got[50:]] == [
        b"zstd-%d" % i for i in range(5)
    ]


def test_log_append_time_topic_stamps_broker_time(http: httpx.Client) -> None:
    topic = create_topic(http, "appendtime", configs={"message.timestamp.type": "LogAppendTime"})
    before = int(time.time() * 1000)
    produce(http, topic, [{"value": 1, "timestamp": 1_000}, {"value": 2, "timestamp": 2_000}])
    after = int(time.time() * 1000)
    for r in fetch_all(http, topic, 0):
        assert before - 5 <= r["timestamp"] <= after + 5


# -- fetch parameters ----------------------------------------------------------------------------


def _fill(http: httpx.Client, topic: str, sizes: list[int]) -> int:
    """One request (one batch) per size; returns the record count."""
    n = 0
    for size in sizes:
        produce(http, topic, [{"value": n + i} for i in range(size)])
        n += size
    return n


def test_max_bytes_returns_at_least_one_batch(http: httpx.Client) -> None:
    topic = create_topic(http, "maxbytes")
    _fill(http, topic, [5, 3, 4])
    f = http.get(
        f"/v1/topics/{topic}/partitions/0/records",
        params={"offset": 0, "max_bytes": 1},
        headers={"accept": BATCH},
    )
    assert len(split_batches(f.content)) == 1
    assert int(f.headers["logbus-next-offset"]) == 5
    # JSON counts max_bytes in rendered records: at least one record, so a consumer progresses.
    j = fetch(http, topic, 0, 0, max_bytes=1).json()
    assert [r["value"] for r in j["records"]] == [0]
    assert j["next_offset"] == 1 and j["high_watermark"] == 12 and j["lag"] == 11
    # Mid-batch: JSON starts at the offset asked for, binary gives the whole batch.
    j = fetch(http, topic, 0, 6, max_bytes=1).json()
    assert [r["value"] for r in j["records"]] == [6]
    assert j["next_offset"] == 7
    f = http.get(
        f"/v1/topics/{topic}/partitions/0/records",
        params={"offset": 6, "max_bytes": 1},
        headers={"accept": BATCH},
    )
    assert int.from_bytes(f.content[:8], "big") == 5
    assert int(f.headers["logbus-next-offset"]) == 8
    # A large max_bytes gets everything.
    j = fetch(http, topic, 0, 0, max_bytes=10_000_000).json()
    assert len(j["records"]) == 12 and j["next_offset"] == 12 and j["lag"] == 0


def test_max_records_limits_json_and_ndjson(http: httpx.Client) -> None:
    topic = create_topic(http, "maxrec")
    _fill(http, topic, [10])
    j = fetch(http, topic, 0, 2, max_records=3).json()
    assert [r["offset"] for r in j["records"]] == [2, 3, 4]
    assert j["next_offset"] == 5 and j["lag"] == 5
    n = http.get(
        f"/v1/topics/{topic}/partitions/0/records",
        params={"offset": 2, "max_records": 3},
        headers={"accept": NDJSON},
    )
    assert [r["offset"] for r in ndjson_lines(n.text)] == [2, 3, 4]
    assert n.headers["logbus-next-offset"] == "5"


@pytest.mark.parametrize(
    ("max_bytes", "max_records"),
    [(1, 100_000), (300, 1), (700, 7), (5000, 13), (1_000_000, 10_000)],
)
@pytest.mark.parametrize("accept", [JSON, NDJSON, BATCH])
def test_next_offset_continuation_reads_every_record_once(
    http: httpx.Client, max_bytes: int, max_records: int, accept: str
) -> None:
    topic = create_topic(http, "cont")
    rng = random.Random(max_bytes * 31 + max_records)
    total = _fill(http, topic, [rng.randrange(1, 25) for _ in range(12)])
    seen: list[int] = []
    offset = 0
    for _ in range(10_000):
        if offset >= total:
            break
        f = http.get(
            f"/v1/topics/{topic}/partitions/0/records",
            params={"offset": offset, "max_bytes": max_bytes, "max_records": max_records},
            headers={"accept": accept},
        )
        assert f.status_code == 200, f.text
        if accept == BATCH:
            for batch in split_batches(f.content):
                for r in MemoryRecords(batch).next_batch():
                    if r.offset >= offset:  # a batch may start before the offset asked for
                        seen.append(json.loads(r.value))
        elif accept == NDJSON:
            seen.extend(r["value"] for r in ndjson_lines(f.text))
        else:
            seen.extend(r["value"] for r in f.json()["records"])
        nxt = int(f.headers["logbus-next-offset"])
        assert nxt > offset
        offset = nxt
    assert seen == list(range(total))


def test_position_headers_on_every_fetch_answer(http: httpx.Client) -> None:
    topic = create_topic(http, "headers")
    for accept in (JSON, NDJSON, BATCH):
        empty = http.get(
            f"/v1/topics/{topic}/partitions/0/records",
            params={"offset": 0},
            headers={"accept": accept},
        )
        assert empty.status_code == 200
        assert position_headers(empty) == {
            "next-offset": 0,
            "high-watermark": 0,
            "log-start-offset": 0,
            "lag": 0,
        }
    _fill(http, topic, [4, 4])
    for accept in (JSON, NDJSON, BATCH):
        for offset, nxt in ((0, 8), (8, 8)):
            f = http.get(
                f"/v1/topics/{topic}/partitions/0/records",
                params={"offset": offset},
                headers={"accept": accept},
            )
            h = position_headers(f)
            assert h == {
                "next-offset": nxt,
                "high-watermark": 8,
                "log-start-offset": 0,
                "lag": 8 - nxt,
            }, (accept, offset)
    body = fetch(http, topic, 0, 8).json()
    assert body == {
        "records": [],
        "next_offset": 8,
        "high_watermark": 8,
        "log_start_offset": 0,
        "lag": 0,
    }


@pytest.mark.parametrize(
    ("accept", "expected"),
    [
        ("*/*", JSON),
        ("application/*", JSON),
        ("application/json; charset=utf-8", JSON),
        ("application/x-ndjson, application/json", NDJSON),
        ("text/html, application/vnd.logbus.batch", BATCH),
    ],
)
def test_accept_negotiation(http: httpx.Client, accept: str, expected: str) -> None:
    topic = create_topic(http, "accept")
    produce(http, topic, [{"value": 1}])
    f = http.get(
        f"/v1/topics/{topic}/partitions/0/records", params={"offset": 0}, headers={"accept": accept}
    )
    assert f.status_code == 200
    assert f.headers["content-type"].split(";")[0] == expected


def test_content_type_parameters_and_no_default(http: httpx.Client) -> None:
    topic = create_topic(http, "ctype")
    body = json.dumps({"records": [{"value": 1}]}).encode()
    for ctype in ("application/json; charset=utf-8", "Application/JSON"):
        r = http.post(f"/v1/topics/{topic}/records", content=body, headers={"content-type": ctype})
        assert r.status_code == 200, (ctype, r.text)
    # No content type at all: refused (a browser's no-cors POST sends none), not read as JSON.
    req = http.build_request("POST", f"/v1/topics/{topic}/records", content=body)
    assert "content-type" not in req.headers
    r = http.send(req)
    assert r.status_code == 415, r.text
    r = http.post(
        f"/v1/topics/{topic}/records",
        content=b'{"value": 2}\n',
        headers={"content-type": "application/x-ndjson; charset=utf-8"},
    )
    assert r.status_code == 200, r.text
    assert len(fetch_all(http, topic, 0)) == 3


# -- acks ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("acks", ["1", "all", "-1"])
def test_acks_1_and_all_answer_offsets(http: httpx.Client, acks: str) -> None:
    topic = create_topic(http, "acks")
    r = http.post(
        f"/v1/topics/{topic}/records",
        json={"records": [{"value": 1}, {"value": 2}]},
        params={"acks": acks},
    )
    assert r.status_code == 200, r.text
    assert r.json() == {"offsets": [{"partition": 0, "offset": 0}, {"partition": 0, "offset": 1}]}
    assert [x["value"] for x in fetch_all(http, topic, 0)] == [1, 2]


def test_acks_0_answers_202_without_offsets(http: httpx.Client) -> None:
    topic = create_topic(http, "acks0")
    r = http.post(
        f"/v1/topics/{topic}/records",
        json={"records": [{"value": 1}, {"value": 2}, {"value": 3}]},
        params={"acks": "0"},
    )
    assert r.status_code == 202, r.text
    assert "offsets" not in r.json()
    assert r.headers["logbus-record-count"] == "3"
    r = http.post(
        f"/v1/topics/{topic}/partitions/0/records",
        content=kafka_batch([b"a", b"b"]),
        headers={"content-type": BATCH},
        params={"acks": "0"},
    )
    assert r.status_code == 202, r.text
    deadline = time.monotonic() + 5
    while end_offsets(http, topic) != [5] and time.monotonic() < deadline:
        time.sleep(0.05)
    assert len(fetch_all(http, topic, 0)) == 5


@pytest.mark.parametrize("acks", ["2", "none", "ALL", "-2"])
def test_bad_acks_is_400_and_appends_nothing(http: httpx.Client, acks: str) -> None:
    topic = create_topic(http, "acksbad")
    r = http.post(
        f"/v1/topics/{topic}/records", json={"records": [{"value": 1}]}, params={"acks": acks}
    )
    assert_problem(r, 400, "INVALID_REQUIRED_ACKS")
    assert end_offsets(http, topic) == [0]


# -- metrics of the record paths -----------------------------------------------------------------


def _metric(text: str, name: str, **labels: str) -> float:
    total = 0.0
    for line in text.splitlines():
        if not line.startswith(name + "{"):
            continue
        if all(f'{k}="{v}"' in line for k, v in labels.items()):
            total += float(line.rsplit(" ", 1)[1])
    return total


def test_produce_and_fetch_are_counted_in_metrics(
    http: httpx.Client, shared_broker: BrokerProcess, request: pytest.FixtureRequest
) -> None:
    topic = create_topic(http, "metrics")
    before = http.get("/metrics").text
    produce(http, topic, [{"value": i} for i in range(7)])
    fetch_all(http, topic, 0)
    after = http.get("/metrics").text
    assert _metric(after, "logbus_records_in_total", topic=topic) == 7
    assert _metric(after, "logbus_records_out_total", topic=topic) >= 7
    assert _metric(after, "logbus_bytes_in_total", topic=topic) > 0
    for route, method in (("produce", "POST"), ("fetch", "GET")):
        labels = {"route": route, "method": method, "status": "200"}
        assert _metric(after, "logbus_http_requests_total", **labels) > _metric(
            before, "logbus_http_requests_total", **labels
        )
