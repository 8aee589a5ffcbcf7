"""Transactions over HTTP are being built (issue 13), and the broker says what it does not do
yet instead of pretending.

A transactional (or control) batch is refused at produce — its records would otherwise be
visible at once, before any commit, and no coordinator exists yet to decide them.
``isolation=read_committed`` is served on every read path (tests/api/test_read_committed.py);
an unknown level is refused.
"""

from __future__ import annotations

import asyncio
import json
import struct
from collections.abc import Iterator

import httpx
import pytest
from kafka.record.default_records import DefaultRecordBatchBuilder
from websockets.asyncio.client import connect

from core_log.batch import Record, build_batch
from tests.api.conftest import both_paths_broker, make_client
from tests.api.helpers import BATCH, assert_problem, create_topic, kafka_batch, unique
from tests.server import BrokerProcess


@pytest.fixture(scope="module", params=["fast_path", "fastapi_routes"])
def shared_broker(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[BrokerProcess]:
    yield from both_paths_broker(request, tmp_path_factory)


@pytest.fixture(scope="module")
def http(shared_broker: BrokerProcess) -> Iterator[httpx.Client]:
    with make_client(shared_broker) as c:
        yield c


def transactional_batch() -> bytes:
    """What a Kafka transactional producer sends (kafka-python's builder)."""
    b = DefaultRecordBatchBuilder(
        magic=2,
        compression_type=0,
        is_transactional=1,
        producer_id=7,
        producer_epoch=0,
        base_sequence=0,
        batch_size=1024 * 1024,
    )
    assert b.append(0, timestamp=1_700_000_000_000, key=b"k", value=b"v", headers=[]) is not None
    return bytes(b.build())


def control_batch() -> bytes:
    commit_marker = Record(value=struct.pack(">hi", 0, 0), key=struct.pack(">hh", 0, 1))
    return build_batch(
        [commit_marker], is_control=True, is_transactional=True, producer_id=7, producer_epoch=0
    )


def high_watermark(http: httpx.Client, topic: str) -> int:
    r = http.get(f"/v1/topics/{topic}/partitions/0/records", params={"offset": 0})
    assert r.status_code == 200, r.text
    return int(r.headers["Logbus-High-Watermark"])


@pytest.mark.parametrize("idempotency_key", [False, True], ids=["plain", "idempotency-key"])
def test_transactional_and_control_batches_are_rejected_at_produce(
    http: httpx.Client, idempotency_key: bool
) -> None:
    topic = create_topic(http, "txn")
    url = f"/v1/topics/{topic}/partitions/0/records"
    for name, batch in [("transactional", transactional_batch()), ("control", control_batch())]:
        headers = {"content-type": BATCH}
        if idempotency_key:
            headers["idempotency-key"] = unique(name)
        body = assert_problem(http.post(url, content=batch, headers=headers), 400, "INVALID_RECORD")
        if name == "transactional":
            assert "transactions are not supported yet" in body["detail"], body
        # behind a valid batch in the same request: the whole request is refused
        if not idempotency_key:
            both = kafka_batch([b"ok"]) + batch
            assert_problem(http.post(url, content=both, headers=headers), 400, "INVALID_RECORD")
    assert high_watermark(http, topic) == 0
    ok = http.post(url, content=kafka_batch([b"ok"]), headers={"content-type": BATCH})
    assert ok.status_code == 200, ok.text


def test_fetch_serves_read_committed_and_sse_refuses_it(http: httpx.Client) -> None:
    topic = create_topic(http, "txn-fetch")
    url = f"/v1/topics/{topic}/partitions/0/records"
    ok = http.post(url, content=kafka_batch([b"ok"]), headers={"content-type": BATCH})
    assert ok.status_code == 200, ok.text
    for accept in ["application/json", "application/x-ndjson", BATCH]:
        r = http.get(
            url, params={"offset": 0, "isolation": "read_committed"}, headers={"accept": accept}
        )
        assert r.status_code == 200, (accept, r.text)
        # no transaction: the last stable offset is the high watermark
        assert r.headers["Logbus-Last-Stable-Offset"] == r.headers["Logbus-High-Watermark"] == "1"
        assert r.headers["Logbus-Next-Offset"] == "1", accept
    with http.stream(
        "GET",
        url,
        params={"offset": 0, "isolation": "read_committed"},
        headers={"accept": "text/event-stream"},
    ) as r:
        assert r.status_code == 200
        lines = r.iter_lines()
        assert next(lines).startswith("retry:")
        ids = (line for line in lines if line.startswith("id:"))
        assert next(ids) == "id: 1"  # the record at 0, whose event id is the next offset
    for bad in ["READ_COMMITTED", "serializable", ""]:
        r = http.get(url, params={"offset": 0, "isolation": bad})
        assert_problem(r, 400, "INVALID_REQUEST")
    r = http.get(url, params={"offset": 0, "isolation": "read_uncommitted"})
    assert r.status_code == 200, r.text


def test_member_poll_takes_read_committed_and_refuses_a_bad_level(http: httpx.Client) -> None:
    topic = create_topic(http, "txn-group")
    ok = http.post(
        f"/v1/topics/{topic}/partitions/0/records",
        content=kafka_batch([b"ok"]),
        headers={"content-type": BATCH},
    )
    assert ok.status_code == 200, ok.text
    group = unique("g")
    r = http.post(
        f"/v1/groups/{group}/members",
        json={"topics": [topic], "session_timeout_ms": 30_000, "auto_offset_reset": "earliest"},
    )
    assert r.status_code == 201, r.text
    member = r.json()["member_id"]
    url = f"/v1/groups/{group}/members/{member}/records"
    r = http.get(url, params={"isolation": "read_committed", "wait_ms": 5000})
    assert r.status_code == 200, r.text
    assert [rec["offset"] for rec in r.json()["records"]] == [0]
    for accept in ["application/json", "application/x-ndjson", "text/event-stream"]:
        r = http.get(url, params={"isolation": "snapshot"}, headers={"accept": accept})
        body = assert_problem(r, 400, "INVALID_REQUEST")
        assert "isolation must be" in body["detail"], (accept, body)


def test_websocket_takes_read_committed_and_refuses_a_bad_level(
    shared_broker: BrokerProcess, http: httpx.Client
) -> None:
    topic = create_topic(http, "txn-ws")
    url = shared_broker.url.replace("http://", "ws://", 1) + "/v1/ws"
    messages = [
        {"op": "subscribe", "id": 1, "topics": [topic], "isolation": "snapshot"},
        {"op": "join", "id": 2, "group": unique("g"), "topics": [topic], "isolation": "x"},
        {"op": "subscribe", "id": 3, "topics": [topic], "isolation": "read_committed"},
    ]

    async def main() -> list[dict[str, object]]:
        out = []
        async with connect(url, open_timeout=5, close_timeout=2) as ws:
            for m in messages:
                await ws.send(json.dumps(m))
                out.append(json.loads(await asyncio.wait_for(ws.recv(), 5)))
        return out

    refused_subscribe, refused_join, subscribed = asyncio.run(main())
    for doc, ident in [(refused_subscribe, 1), (refused_join, 2)]:
        assert (doc["type"], doc["id"], doc["code"]) == ("error", ident, "INVALID_REQUEST"), doc
        assert "isolation" in str(doc["detail"]), doc
    assert (subscribed["type"], subscribed["id"]) == ("subscribed", 3), subscribed
