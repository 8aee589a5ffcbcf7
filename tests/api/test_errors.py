"""Errors: problem+json with a stable code, the right HTTP status, and nothing appended.

Like the produce/fetch tests, these run through the lean fast path and the FastAPI routes.
"""

from __future__ import annotations

import base64
import json
import struct
from collections.abc import Iterator
from typing import Any

import crc32c
import httpx
import pytest

from tests.api.conftest import (
    FAST_PATH,
    FASTAPI_ROUTES,
    both_paths_broker,
    make_client,
    start_broker,
)
from tests.api.helpers import (
    BATCH,
    JSON,
    NDJSON,
    OCTETS,
    assert_problem,
    create_topic,
    end_offsets,
    fetch,
    kafka_batch,
    produce,
    two_partition_topic,
)
from tests.server import BrokerProcess

MAX_REQUEST_BYTES = 100_000
MAX_RECORDS = 100


@pytest.fixture(scope="module", params=[FAST_PATH, FASTAPI_ROUTES])
def shared_broker(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[BrokerProcess]:
    yield from both_paths_broker(request, tmp_path_factory)


@pytest.fixture
def topic(http: httpx.Client) -> str:
    return two_partition_topic(http, "err")


def post(http: httpx.Client, path: str, body: bytes | str, ctype: str = JSON) -> httpx.Response:
    return http.post(path, content=body, headers={"content-type": ctype})


def resign(batch: bytes | bytearray) -> bytes:
    """Recompute the CRC-32C of a batch after editing bytes under it."""
    b = bytearray(batch)
    b[17:21] = struct.pack(">I", crc32c.crc32c(bytes(b[21:])))
    return bytes(b)


# -- unknown topic / partition -------------------------------------------------------------------


def test_unknown_topic_is_404_for_every_record_route(http: httpx.Client) -> None:
    paths = ["/v1/topics/no-such-topic/records", "/v1/topics/no-such-topic/partitions/0/records"]
    for path in paths:
        body = assert_problem(
            post(http, path, json.dumps({"records": [{"value": 1}]})),
            404,
            "UNKNOWN_TOPIC_OR_PARTITION",
        )
        assert body["retriable"] is True and body["topic"] == "no-such-topic"
        assert_problem(
            post(http, path, '{"value": 1}\n', NDJSON), 404, "UNKNOWN_TOPIC_OR_PARTITION"
        )
    assert_problem(
        post(http, paths[1], kafka_batch([b"x"]), BATCH), 404, "UNKNOWN_TOPIC_OR_PARTITION"
    )
    assert_problem(fetch(http, "no-such-topic", 0, 0), 404, "UNKNOWN_TOPIC_OR_PARTITION")


def test_unknown_partition_is_404_and_appends_nothing(http: httpx.Client, topic: str) -> None:
    body = assert_problem(
        post(http, f"/v1/topics/{topic}/partitions/2/records", '{"records": [{"value": 1}]}'),
        404,
        "UNKNOWN_TOPIC_OR_PARTITION",
    )
    assert body["partition"] == 2
    assert_problem(
        post(http, f"/v1/topics/{topic}/partitions/7/records", kafka_batch([b"x"]), BATCH),
        404,
        "UNKNOWN_TOPIC_OR_PARTITION",
    )
    assert_problem(fetch(http, topic, 2, 0), 404, "UNKNOWN_TOPIC_OR_PARTITION")
    # A record naming a missing partition fails the whole request, valid records included.
    mixed = {"records": [{"value": 1, "partition": 0}, {"value": 2}, {"value": 3, "partition": 9}]}
    r = http.post(f"/v1/topics/{topic}/records", json=mixed)
    assert_problem(r, 404, "UNKNOWN_TOPIC_OR_PARTITION")
    assert end_offsets(http, topic) == [1, 1]


# -- offsets -------------------------------------------------------------------------------------


def test_offset_out_of_range_is_416_with_the_valid_range(http: httpx.Client, topic: str) -> None:
    produce(http, topic, [{"value": i} for i in range(4)], partition=0)
    for offset in (6, 999, 2**62):
        body = assert_problem(fetch(http, topic, 0, offset), 416, "OFFSET_OUT_OF_RANGE")
        assert body["retriable"] is False
        assert body["offset"] == offset
        assert body["log_start_offset"] == 0
        assert body["log_end_offset"] == 5
    # The log end itself is in range: an empty answer (a long-poll position).
    assert fetch(http, topic, 0, 5).json()["records"] == []
    for accept in (NDJSON, BATCH):
        r = http.get(
            f"/v1/topics/{topic}/partitions/0/records",
            params={"offset": 6},
            headers={"accept": accept},
        )
        assert_problem(r, 416, "OFFSET_OUT_OF_RANGE")


@pytest.mark.parametrize(
    "params",
    [
        {},
        {"offset": "-1"},
        {"offset": "abc"},
        {"offset": "1.5"},
        {"offset": "0", "max_bytes": "0"},
        {"offset": "0", "max_bytes": "x"},
        {"offset": "0", "max_records": "0"},
        {"offset": "0", "min_bytes": "-1"},
        {"offset": "0", "wait_ms": "-1"},
        {"offset": "0", "wait_ms": "60001"},
        {"offset": "0", "isolation": "dirty"},
    ],
    ids=lambda p: "&".join(f"{k}={v}" for k, v in p.items()) or "no-offset",
)
def test_bad_fetch_parameters_are_400(
    http: httpx.Client, topic: str, params: dict[str, str]
) -> None:
    r = http.get(f"/v1/topics/{topic}/partitions/0/records", params=params)
    assert_problem(r, 400, "INVALID_REQUEST")


def test_blank_query_values_are_rejected(
    http: httpx.Client, topic: str, shared_broker: BrokerProcess, request: pytest.FixtureRequest
) -> None:
    r = http.post(f"/v1/topics/{topic}/records?acks=", json={"records": [{"value": 1}]})
    assert_problem(r, 400, "INVALID_REQUIRED_ACKS")
    assert end_offsets(http, topic) == [1, 1]
    r = http.get(f"/v1/topics/{topic}/partitions/0/records?offset=0&max_records=")
    assert_problem(r, 400, "INVALID_REQUEST")


# -- malformed and wrongly shaped JSON -----------------------------------------------------------


@pytest.mark.parametrize(
    "body",
    [
        b"",
        b"{",
        b'{"records": [{"value": 1}]',
        b'{"records": [{"value": 1},]}',
        b"{'records': []}",
        b'{"records": [{"value": NaN}]}',
        b"\xff\xfe",
        b'{"records": [{"value": "\\ud800"}]}',
        b'{"value": 1}\n{"value": 2}\n',
    ],
    ids=[
        "empty",
        "open-brace",
        "unclosed",
        "trailing-comma",
        "single-quotes",
        "nan",
        "not-utf8",
        "lone-surrogate",
        "ndjson-as-json",
    ],
)
def test_malformed_json_is_400(http: httpx.Client, topic: str, body: bytes) -> None:
    for path in (f"/v1/topics/{topic}/records", f"/v1/topics/{topic}/partitions/0/records"):
        assert_problem(post(http, path, body), 400, "INVALID_REQUEST")
    assert end_offsets(http, topic) == [1, 1]


GOOD = {"key": "k", "value": {"ok": True}}

BAD_SHAPES: dict[str, Any] = {
    "body-is-a-list": [GOOD],
    "body-is-a-string": "records",
    "records-missing": {"record": [GOOD]},
    "records-not-a-list": {"records": GOOD},
    "records-null": {"records": None},
    "records-empty": {"records": []},
    "record-not-an-object": {"records": [GOOD, "value"]},
    "record-null": {"records": [GOOD, None]},
    "key-not-a-string": {"records": [GOOD, {"key": 12, "value": 1}]},
    "key-an-object": {"records": [GOOD, {"key": {"a": 1}, "value": 1}]},
    "key-and-key_b64": {"records": [GOOD, {"key": "a", "key_b64": "YQ==", "value": 1}]},
    "key_b64-not-base64": {"records": [GOOD, {"key_b64": "not base64!", "value": 1}]},
    "key_b64-bad-padding": {"records": [GOOD, {"key_b64": "YQ", "value": 1}]},
    "key_b64-not-a-string": {"records": [GOOD, {"key_b64": 5, "value": 1}]},
    "value_b64-not-base64": {"records": [GOOD, {"value_b64": "%%%"}]},
    "value_b64-null": {"records": [GOOD, {"value_b64": None}]},
    "value-and-value_b64": {"records": [GOOD, {"value": 1, "value_b64": "YQ=="}]},
    "unknown-field": {"records": [GOOD, {"value": 1, "topic": "other"}]},
    "misspelt-field": {"records": [GOOD, {"vaule": 1}]},
    "headers-not-a-list": {"records": [GOOD, {"value": 1, "headers": {"h": "v"}}]},
    "header-not-an-object": {"records": [GOOD, {"value": 1, "headers": ["h"]}]},
    "header-without-name": {"records": [GOOD, {"value": 1, "headers": [{"value": "v"}]}]},
    "header-name-not-a-string": {"records": [GOOD, {"headers": [{"name": 1, "value": "v"}]}]},
    "header-value-not-a-string": {"records": [GOOD, {"headers": [{"name": "h", "value": 1}]}]},
    "header-value_b64-bad": {"records": [GOOD, {"headers": [{"name": "h", "value_b64": "?"}]}]},
    "timestamp-negative": {"records": [GOOD, {"value": 1, "timestamp": -1}]},
    "timestamp-string": {"records": [GOOD, {"value": 1, "timestamp": "1700000000000"}]},
    "timestamp-float": {"records": [GOOD, {"value": 1, "timestamp": 1.5}]},
    "timestamp-bool": {"records": [GOOD, {"value": 1, "timestamp": True}]},
    "timestamp-too-large": {"records": [GOOD, {"value": 1, "timestamp": 2**63}]},
    "partition-negative": {"records": [GOOD, {"value": 1, "partition": -1}]},
    "partition-string": {"records": [GOOD, {"value": 1, "partition": "0"}]},
    "partition-float": {"records": [GOOD, {"value": 1, "partition": 0.5}]},
    "partition-bool": {"records": [GOOD, {"value": 1, "partition": True}]},
}


@pytest.mark.parametrize("shape", list(BAD_SHAPES))
def test_wrong_shapes_are_400_and_append_nothing(
    http: httpx.Client, topic: str, shape: str
) -> None:
    body = json.dumps(BAD_SHAPES[shape])
    assert_problem(post(http, f"/v1/topics/{topic}/records", body), 400, "INVALID_REQUEST")
    assert end_offsets(http, topic) == [1, 1]


def test_unknown_top_level_field_is_400(http: httpx.Client, topic: str) -> None:
    body = json.dumps({"records": [{"value": 1}], "partition": 1})
    assert_problem(post(http, f"/v1/topics/{topic}/records", body), 400, "INVALID_REQUEST")
    assert end_offsets(http, topic) == [1, 1]


def test_record_too_large_for_one_partition_fails_the_whole_request(
    http: httpx.Client,
) -> None:
    name = create_topic(http, "toolarge", partitions=2, configs={"max.message.bytes": 1000})
    records = [
        {"value": "small", "partition": 0},
        {"value": "x" * 5000, "partition": 1},
        {"value": "small", "partition": 0},
    ]
    r = http.post(f"/v1/topics/{name}/records", json={"records": records})
    body = assert_problem(r, 413, "MESSAGE_TOO_LARGE")
    assert body["max_message_bytes"] == 1000
    assert end_offsets(http, name) == [0, 0]


# -- NDJSON --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("body", "line"),
    [
        (b'{"value": 1}\n{"value": \n{"value": 3}\n', 2),
        (b'{"value": 1}\n\n[1, 2]\n', 3),
        (b'{"value": 1}\n{"value": 2, "bogus": 1}\n', 2),
        (b'{"value": 1}\n{"value": 2}\n{"key": 7}', 3),
    ],
    ids=["malformed", "not-an-object", "unknown-field", "bad-key-last-line"],
)
def test_bad_ndjson_line_is_400_and_appends_nothing(
    http: httpx.Client, topic: str, body: bytes, line: int
) -> None:
    r = post(http, f"/v1/topics/{topic}/records", body, NDJSON)
    problem = assert_problem(r, 400, "INVALID_REQUEST")
    assert f"line {line}" in problem["detail"]
    assert end_offsets(http, topic) == [1, 1]


@pytest.mark.parametrize("body", [b"", b"\n\n  \n"], ids=["empty", "blank-lines"])
def test_ndjson_without_records_is_400(http: httpx.Client, topic: str, body: bytes) -> None:
    assert_problem(post(http, f"/v1/topics/{topic}/records", body, NDJSON), 400, "INVALID_REQUEST")


# -- binary batches ------------------------------------------------------------------------------


def _corruptions() -> dict[str, bytes]:
    good = kafka_batch([b"record-%d" % i for i in range(5)], keys=[b"k"] * 5)
    gz = kafka_batch([b"record-%d" % i * 20 for i in range(5)], codec=1)
    out: dict[str, bytes] = {}
    flipped = bytearray(good)
    flipped[-3] ^= 0x01
    out["flipped-record-byte"] = bytes(flipped)
    flipped = bytearray(gz)
    flipped[70] ^= 0xFF
    out["flipped-compressed-byte"] = bytes(flipped)
    flipped = bytearray(good)
    flipped[18] ^= 0x10
    out["flipped-crc"] = bytes(flipped)
    flipped = bytearray(good)
    flipped[22] ^= 0x04  # attributes: under the CRC
    out["flipped-attributes"] = bytes(flipped)
    out["truncated"] = good[:-4]
    out["truncated-header"] = good[:40]
    out["trailing-garbage"] = good + b"\x00\x01\x02"
    out["second-batch-corrupt"] = good + out["flipped-record-byte"]
    out["second-batch-truncated"] = good + good[:-1]
    wrong_magic = bytearray(good)
    wrong_magic[16] = 1
    out["magic-1"] = bytes(wrong_magic)
    huge_length = bytearray(good)
    huge_length[8:12] = struct.pack(">i", 2**31 - 1)
    out["length-beyond-limit"] = bytes(huge_length)
    negative_length = bytearray(good)
    negative_length[8:12] = struct.pack(">i", -5)
    out["negative-length"] = bytes(negative_length)
    out["not-a-batch"] = b"hello, this is not a kafka record batch at all, just some text!!"
    return out


CORRUPTIONS = _corruptions()


@pytest.mark.parametrize("name", list(CORRUPTIONS))
def test_corrupt_binary_batch_is_400_and_appends_nothing(
    http: httpx.Client, topic: str, name: str
) -> None:
    r = post(http, f"/v1/topics/{topic}/partitions/0/records", CORRUPTIONS[name], BATCH)
    body = assert_problem(r, 400, "CORRUPT_MESSAGE")
    assert body["retriable"] is True
    assert end_offsets(http, topic) == [1, 1]


def test_invalid_producer_batches_are_400(http: httpx.Client, topic: str) -> None:
    good = bytearray(kafka_batch([b"a", b"b", b"c"]))
    # lastOffsetDelta says 5 records' worth while the batch holds 3.
    gap = bytearray(good)
    gap[23:27] = struct.pack(">i", 4)
    # A control batch (attributes bit 5) from a producer.
    control = bytearray(good)
    control[21:23] = struct.pack(">h", 0x20)
    for bad in (resign(gap), resign(control)):
        r = post(http, f"/v1/topics/{topic}/partitions/0/records", bad, BATCH)
        assert_problem(r, 400, "INVALID_RECORD")
    r = post(http, f"/v1/topics/{topic}/partitions/0/records", b"", BATCH)
    assert_problem(r, 400, "INVALID_REQUEST")
    assert end_offsets(http, topic) == [1, 1]


@pytest.mark.parametrize("kind", ["garbage-gzip", "garbage-records", "count-too-high"])
def test_batch_with_valid_crc_but_undecodable_records_is_rejected(
    http: httpx.Client, topic: str, kind: str
) -> None:
    good = bytearray(kafka_batch([b"a", b"b", b"c"]))
    if kind == "garbage-gzip":
        bad = good[:61] + b"this is not gzip data"
        bad[21:23] = struct.pack(">h", 1)
    elif kind == "garbage-records":
        bad = good[:61] + b"\x7f\x01\x02\x03\x04"
    else:
        bad = good.copy()
        bad[57:61] = struct.pack(">i", 5)  # recordCount 5 while 3 are encoded
        bad[23:27] = struct.pack(">i", 4)
    bad[8:12] = struct.pack(">i", len(bad) - 12)
    # The CRC is right, so only decoding the records can tell: the broker must, or JSON
    # consumers of the partition would fail on it forever.
    r = post(http, f"/v1/topics/{topic}/partitions/0/records", resign(bad), BATCH)
    assert_problem(r, 400, "CORRUPT_MESSAGE")
    assert end_offsets(http, topic) == [1, 1]
    assert fetch(http, topic, 0, 0).status_code == 200


# -- content negotiation and routing -------------------------------------------------------------


@pytest.mark.parametrize(
    "ctype",
    [
        "text/plain",
        "application/xml",
        "application/x-www-form-urlencoded",
        "multipart/form-data; boundary=x",
        "application/jsonl",
    ],
)
def test_unsupported_content_type_is_415(http: httpx.Client, topic: str, ctype: str) -> None:
    for path in (f"/v1/topics/{topic}/records", f"/v1/topics/{topic}/partitions/0/records"):
        r = post(http, path, b'{"records": [{"value": 1}]}', ctype)
        body = assert_problem(r, 415, "UNSUPPORTED_MEDIA_TYPE")
        assert set(body["supported"]) == {JSON, NDJSON, BATCH, OCTETS}
    assert end_offsets(http, topic) == [1, 1]


@pytest.mark.parametrize("accept", ["text/html", "application/xml", "image/png, text/*"])
def test_unacceptable_accept_on_fetch_is_406(http: httpx.Client, topic: str, accept: str) -> None:
    r = http.get(
        f"/v1/topics/{topic}/partitions/0/records", params={"offset": 0}, headers={"accept": accept}
    )
    assert_problem(r, 406, "NOT_ACCEPTABLE")


@pytest.mark.parametrize(
    "path", ["/nope", "/v1", "/v1/nope", "/v1/topics/x/nope", "/v1/topics/x/partitions/0/nope"]
)
def test_unknown_route_is_404_problem(http: httpx.Client, path: str) -> None:
    assert_problem(http.get(path), 404, "NOT_FOUND")


def test_wrong_method_is_405_problem(http: httpx.Client, topic: str) -> None:
    assert_problem(
        http.put(
            f"/v1/topics/{topic}/partitions/0/records",
            content=b"{}",
            headers={"content-type": JSON},  # untyped, the body would be 415 first
        ),
        405,
        "METHOD_NOT_ALLOWED",
    )
    assert_problem(http.delete("/v1/topics"), 405, "METHOD_NOT_ALLOWED")
    assert_problem(http.get(f"/v1/topics/{topic}/records"), 405, "METHOD_NOT_ALLOWED")


# -- request limits ------------------------------------------------------------------------------


@pytest.fixture(scope="module", params=[FAST_PATH, FASTAPI_ROUTES])
def limited(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[httpx.Client]:
    """A broker with LOGBUS_MAX_REQUEST_BYTES and LOGBUS_MAX_RECORDS_PER_REQUEST lowered."""
    args = ("--no-fast-path",) if request.param == FASTAPI_ROUTES else ()
    env = {
        "LOGBUS_MAX_REQUEST_BYTES": str(MAX_REQUEST_BYTES),
        "LOGBUS_MAX_RECORDS_PER_REQUEST": str(MAX_RECORDS),
    }
    b = start_broker(tmp_path_factory.mktemp("limited") / "data", *args, env=env)
    try:
        with make_client(b) as c:
            yield c
    finally:
        b.stop()


def _chunks(data: bytes, size: int = 8192) -> Iterator[bytes]:
    for i in range(0, len(data), size):
        yield data[i : i + size]


def test_body_over_the_limit_is_413(limited: httpx.Client) -> None:
    name = create_topic(limited, "limit")
    big_json = json.dumps({"records": [{"value": "x" * 2000} for _ in range(60)]}).encode()
    big_ndjson = b"".join(json.dumps({"value": "x" * 2000}).encode() + b"\n" for _ in range(60))
    big_batch = kafka_batch([b"y" * 2000 for _ in range(60)])
    assert min(len(big_json), len(big_ndjson), len(big_batch)) > MAX_REQUEST_BYTES
    cases = [
        (f"/v1/topics/{name}/records", big_json, JSON),
        (f"/v1/topics/{name}/records", big_ndjson, NDJSON),
        (f"/v1/topics/{name}/partitions/0/records", big_batch, BATCH),
    ]
    for path, data, ctype in cases:
        # With a Content-Length (refused before reading) and streamed without one.
        for content in (data, _chunks(data)):
            r = limited.post(path, content=content, headers={"content-type": ctype})
            body = assert_problem(r, 413, "PAYLOAD_TOO_LARGE")
            assert body["max_request_bytes"] == MAX_REQUEST_BYTES
    assert end_offsets(limited, name) == [0]
    # Just under the limit is fine.
    ok = json.dumps({"records": [{"value": "x" * 1000} for _ in range(90)]}).encode()
    assert len(ok) < MAX_REQUEST_BYTES
    r = limited.post(f"/v1/topics/{name}/records", content=ok, headers={"content-type": JSON})
    assert r.status_code == 200, r.text
    assert end_offsets(limited, name) == [90]


def test_too_many_records_is_413(limited: httpx.Client) -> None:
    name = create_topic(limited, "toomany")
    too_many_json = json.dumps({"records": [{"value": i} for i in range(MAX_RECORDS + 1)]})
    too_many_ndjson = "".join(f'{{"value": {i}}}\n' for i in range(MAX_RECORDS + 1))
    for data, ctype in ((too_many_json, JSON), (too_many_ndjson, NDJSON)):
        r = post(limited, f"/v1/topics/{name}/records", data, ctype)
        body = assert_problem(r, 413, "RECORD_LIST_TOO_LARGE")
        assert body["max_records_per_request"] == MAX_RECORDS
    assert end_offsets(limited, name) == [0]
    exactly = "".join(f'{{"value": {i}}}\n\n' for i in range(MAX_RECORDS))  # blank lines free
    r = post(limited, f"/v1/topics/{name}/records", exactly, NDJSON)
    assert r.status_code == 200, r.text
    assert end_offsets(limited, name) == [MAX_RECORDS]


def test_the_connection_stays_usable_after_a_413(limited: httpx.Client) -> None:
    name = create_topic(limited, "after413")
    big = b'{"records": [{"value": "' + b"x" * (MAX_REQUEST_BYTES * 3) + b'"}]}'
    for _ in range(3):
        r = limited.post(f"/v1/topics/{name}/records", content=big, headers={"content-type": JSON})
        assert_problem(r, 413, "PAYLOAD_TOO_LARGE")
        assert produce(limited, name, [{"value": "fine"}])[0]["partition"] == 0
    assert end_offsets(limited, name) == [3]


def test_base64_payloads_decode_to_what_was_sent(http: httpx.Client) -> None:
    # Guard for the 400 cases above: valid base64 of every byte value is accepted.
    name = create_topic(http, "b64ok")
    raw = bytes(range(256))
    produce(http, name, [{"key_b64": base64.b64encode(raw).decode(), "value_b64": "AA=="}])
    got = fetch(http, name, 0, 0).json()["records"][0]
    assert base64.b64decode(got["key_b64"]) == raw
