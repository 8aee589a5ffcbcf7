"""Bad input is a 4xx problem that changes nothing, through the fast path and FastAPI alike.

Each case here was a 5xx (a plain-text 500, or a reset connection) or was accepted leniently
(two spellings for one partition, a string for a number) before issue 10.
"""

from __future__ import annotations

import base64
from collections.abc import Iterator

import httpx
import pytest

from tests.api.conftest import FAST_PATH, FASTAPI_ROUTES, both_paths_broker
from tests.api.helpers import (
    JSON,
    NDJSON,
    OCTETS,
    assert_problem,
    create_topic,
    end_offsets,
    fetch,
    two_partition_topic,
    unique,
)
from tests.server import BrokerProcess


@pytest.fixture(scope="module", params=[FAST_PATH, FASTAPI_ROUTES])
def shared_broker(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[BrokerProcess]:
    yield from both_paths_broker(request, tmp_path_factory)


@pytest.fixture
def topic(http: httpx.Client) -> str:
    return two_partition_topic(http, "bad")


def post(
    http: httpx.Client, path: str, body: bytes, ctype: str | None = JSON, **headers: str
) -> httpx.Response:
    if ctype is not None:
        headers["content-type"] = ctype
    return http.post(path, content=body, headers=headers)


# -- 5xx on bad input ------------------------------------------------------------------------------

DEEP = b"[" * 1500 + b"]" * 1500


@pytest.mark.parametrize(
    ("body", "ctype"),
    [
        (b'{"records":[{"key":"\xff","value":1}]}', JSON),  # raw 0xff in a key: was 500
        (b'{"records":[{"value":"\xff"}]}', JSON),  # inside a JSON string value: was stored
        (b'{"records":[{"value":"ok","headers":[{"name":"\xc3","value":"v"}]}]}', JSON),
        (b'{"value":"\xff"}\n', NDJSON),
        (b'{"records":[{"value":' + DEEP + b"}]}", JSON),  # RecursionError: was 500
        (b'{"value":' + DEEP + b"}\n", NDJSON),
    ],
    ids=["key-xff", "value-xff", "header-name", "ndjson-xff", "deep-json", "deep-ndjson"],
)
def test_malformed_bodies_are_400(http: httpx.Client, topic: str, body: bytes, ctype: str) -> None:
    for path in (f"/v1/topics/{topic}/records", f"/v1/topics/{topic}/partitions/0/records"):
        assert_problem(post(http, path, body, ctype), 400, "INVALID_REQUEST")
    assert end_offsets(http, topic) == [1, 1]


BAD_PARTITIONS = ["1" * 23, "2147483648", "+1", "%201", "01", "-0", "1_0", "\u0661"]


@pytest.mark.parametrize("partition", BAD_PARTITIONS)
def test_partition_paths_are_plain_digits(http: httpx.Client, topic: str, partition: str) -> None:
    base = f"/v1/topics/{topic}/partitions/{partition}"
    r = post(http, f"{base}/records", b'{"records":[{"value":1}]}')
    assert_problem(r, 400, "INVALID_REQUEST")
    assert_problem(http.get(f"{base}/records", params={"offset": 0}), 400, "INVALID_REQUEST")
    assert_problem(http.get(f"{base}/offsets"), 400, "INVALID_REQUEST")
    assert end_offsets(http, topic) == [1, 1]


@pytest.mark.parametrize("value", ["1_0", "+1", " 1", "01", "1e1", "0x1", "9" * 20])
@pytest.mark.parametrize("param", ["offset", "max_bytes", "max_records", "wait_ms"])
def test_query_numbers_are_plain_digits(
    http: httpx.Client, topic: str, param: str, value: str
) -> None:
    params = {"offset": "0", param: value}
    r = http.get(f"/v1/topics/{topic}/partitions/0/records", params=params)
    assert_problem(r, 400, "INVALID_REQUEST")


@pytest.mark.parametrize("at", ["+1", "1_0", " 1", "01", "9" * 25, "soon"])
def test_offset_lookup_at_is_strict(http: httpx.Client, topic: str, at: str) -> None:
    r = http.get(f"/v1/topics/{topic}/partitions/0/offsets", params={"at": at})
    assert_problem(r, 400, "INVALID_REQUEST")


@pytest.mark.parametrize("offset", [2**63, 2**64, 2**70, "5", 1.5])
def test_commit_offsets_are_int64_json_numbers(
    http: httpx.Client, topic: str, offset: object
) -> None:
    group = unique("g")
    body = {"offsets": [{"topic": topic, "partition": 0, "offset": offset}]}
    assert_problem(http.post(f"/v1/groups/{group}/offsets", json=body), 400, "INVALID_REQUEST")
    r = http.get(f"/v1/groups/{group}/offsets")
    assert r.status_code in (200, 404) and not r.json().get("offsets"), r.text


def test_largest_commit_offset_is_accepted(http: httpx.Client, topic: str) -> None:
    body = {"offsets": [{"topic": topic, "partition": 0, "offset": 2**63 - 1}]}
    r = http.post(f"/v1/groups/{unique('g')}/offsets", json=body)
    assert r.status_code == 200, r.text


@pytest.mark.parametrize(
    "body",
    [
        {"partitions": "3"},
        {"partitions": 3.5},
        {"partitions": True},
        {"replication_factor": "1"},
        {"configs": {"max.message.bytes": 0}},
        {"configs": {"retention.ms": "1_000"}},
        {"configs": {"segment.bytes": "+1048576"}},
    ],
)
def test_topic_create_is_strict(http: httpx.Client, body: dict[str, object]) -> None:
    name = unique("strict")
    r = http.post("/v1/topics", json={"name": name, **body})
    assert r.status_code == 400, r.text
    assert http.get(f"/v1/topics/{name}").status_code == 404


def test_partition_count_increase_is_strict(http: httpx.Client, topic: str) -> None:
    r = http.post(f"/v1/topics/{topic}/partitions", json={"count": "4"})
    assert_problem(r, 400, "INVALID_REQUEST")
    assert end_offsets(http, topic) == [1, 1]


# -- content negotiation -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("accept", "expected"),
    [
        ("application/x-ndjson;q=0, application/json", JSON),
        ("application/x-ndjson;q=0, */*", JSON),
        ("application/json;q=0.5, application/x-ndjson", NDJSON),
        ("application/json;q=0.5, application/x-ndjson;q=0.9", NDJSON),
        ("*/*;q=0.1, application/x-ndjson", NDJSON),
    ],
)
def test_accept_honours_q(http: httpx.Client, topic: str, accept: str, expected: str) -> None:
    r = http.get(
        f"/v1/topics/{topic}/partitions/0/records", params={"offset": 0}, headers={"accept": accept}
    )
    assert r.status_code == 200, r.text
    assert r.headers["content-type"].startswith(expected)


@pytest.mark.parametrize(
    "accept", ["application/x-ndjson;q=0", "application/json;q=0, application/x-ndjson;q=0"]
)
def test_accept_q0_alone_is_406(http: httpx.Client, topic: str, accept: str) -> None:
    r = http.get(
        f"/v1/topics/{topic}/partitions/0/records", params={"offset": 0}, headers={"accept": accept}
    )
    assert_problem(r, 406, "NOT_ACCEPTABLE")


def test_accept_bad_q_is_400(http: httpx.Client, topic: str) -> None:
    r = http.get(
        f"/v1/topics/{topic}/partitions/0/records",
        params={"offset": 0},
        headers={"accept": "application/json;q=2"},
    )
    assert_problem(r, 400, "INVALID_REQUEST")


def test_produce_without_content_type_is_415(http: httpx.Client, topic: str) -> None:
    """A browser's no-cors fetch sends no Content-Type (or text/plain): never parsed as JSON."""
    for path in (f"/v1/topics/{topic}/records", f"/v1/topics/{topic}/partitions/0/records"):
        r = post(http, path, b'{"records":[{"value":1}]}', None)
        assert_problem(r, 415, "UNSUPPORTED_MEDIA_TYPE")
    assert end_offsets(http, topic) == [1, 1]


# -- Idempotency-Key ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "bad",
    [
        b'{"records":[{"value":1,"partition":7}]}',  # no such partition
        b'{"records":[{"value":1,"bogus":true}]}',  # unknown field
        b'{"records":[{"value":"' + b"x" * 2000 + b'"}]}',  # over max.message.bytes
    ],
    ids=["partition", "field", "too-large"],
)
def test_rejected_request_does_not_burn_its_idempotency_key(http: httpx.Client, bad: bytes) -> None:
    name = create_topic(http, "idem", partitions=2, configs={"max.message.bytes": 1000})
    key = unique("key")
    r = post(http, f"/v1/topics/{name}/records", bad, **{"idempotency-key": key})
    assert 400 <= r.status_code < 500 and r.status_code != 422, r.text
    assert end_offsets(http, name) == [0, 0]
    good = b'{"records":[{"value":1}]}'
    first = post(http, f"/v1/topics/{name}/records", good, **{"idempotency-key": key})
    assert first.status_code == 200, first.text
    again = post(http, f"/v1/topics/{name}/records", good, **{"idempotency-key": key})
    assert again.status_code == 200, again.text
    assert again.json() == first.json()
    assert again.headers.get("logbus-duplicate") == "true"
    assert sum(end_offsets(http, name)) == 1


def test_rejected_octet_body_does_not_burn_its_idempotency_key(http: httpx.Client) -> None:
    name = create_topic(http, "idemb", configs={"max.message.bytes": 1000})
    key = unique("key")
    big = OCTETS
    r = post(
        http,
        f"/v1/topics/{name}/partitions/0/records",
        b"x" * 2000,
        big,
        **{"idempotency-key": key},
    )
    assert_problem(r, 413, "MESSAGE_TOO_LARGE")
    r = post(
        http, f"/v1/topics/{name}/partitions/0/records", b"x" * 20, big, **{"idempotency-key": key}
    )
    assert r.status_code == 200, r.text
    assert end_offsets(http, name) == [1]


# -- application/octet-stream ----------------------------------------------------------------


def test_octet_stream_body_is_one_record(http: httpx.Client) -> None:
    name = create_topic(http, "octets", partitions=4)
    value = bytes(range(256)) * 4
    r = post(http, f"/v1/topics/{name}/records", value, OCTETS, **{"logbus-key": "user-7"})
    assert r.status_code == 200, r.text
    [where] = r.json()["offsets"]
    got = fetch(http, name, where["partition"], where["offset"]).json()["records"]
    assert len(got) == 1
    assert got[0]["key"] == "user-7"
    assert base64.b64decode(got[0]["value_b64"]) == value
    # keyed like any producer would key it
    again = post(http, f"/v1/topics/{name}/records", b"2", OCTETS, **{"logbus-key": "user-7"})
    assert again.json()["offsets"][0]["partition"] == where["partition"]


def test_octet_stream_without_key_and_to_a_partition(http: httpx.Client) -> None:
    name = create_topic(http, "octets", partitions=2)
    r = post(http, f"/v1/topics/{name}/partitions/1/records", b"hello", OCTETS)
    assert r.status_code == 200, r.text
    assert r.json()["offsets"] == [{"partition": 1, "offset": 0}]
    [record] = fetch(http, name, 1, 0).json()["records"]
    assert record["key"] is None
    assert record["value_b64"] == "aGVsbG8="


def test_octet_stream_over_max_message_bytes_is_413(http: httpx.Client) -> None:
    name = create_topic(http, "octets", configs={"max.message.bytes": 1000})
    r = post(http, f"/v1/topics/{name}/records", b"x" * 2000, OCTETS)
    assert_problem(r, 413, "MESSAGE_TOO_LARGE")
    assert end_offsets(http, name) == [0]


# -- what the OpenAPI document promises --------------------------------------------------------


@pytest.mark.parametrize(
    ("method", "path", "allow"),
    [
        ("PUT", "/v1/topics/{topic}", {"GET", "DELETE"}),
        ("PUT", "/v1/topics/{topic}/partitions/0/records", {"GET", "POST"}),
        ("DELETE", "/v1/topics/{topic}/records", {"POST"}),
        ("POST", "/v1/topics/{topic}/configs", {"GET", "PATCH"}),
    ],
)
def test_405_names_the_allowed_methods(
    http: httpx.Client, topic: str, method: str, path: str, allow: set[str]
) -> None:
    r = http.request(method, path.format(topic=topic))
    assert_problem(r, 405, "METHOD_NOT_ALLOWED")
    got = {m.strip() for m in r.headers["allow"].split(",")}
    assert allow <= got and method not in got, got
