"""Every record produce accepts, every reader serves; a stored record no reader can serve
wedges no consumer.

Produce rejects (400, not retriable) what a reader could not render: a header name over
64 KiB, a timestamp outside -1 / 0..year 9999. A record already in the log that no reader can
serve (written by an older broker, or corrupt) is written straight into the partition's files
here, bypassing produce; every reader then names it (CORRUPT_MESSAGE, 500, retriable false,
``offset`` and ``next_offset``) instead of answering a retriable error for ever, and a consumer
skips it explicitly: a fetch asks from ``next_offset``, a member commits it, an SSE client
reconnects from it, a WebSocket subscriber subscribes from it.
"""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from websockets.asyncio.client import connect

from core_log.batch import Record, assemble_batch, build_batch, encode_records
from core_log.clock import SystemClock
from core_log.config import LogConfig
from core_log.handles import HandleCache
from core_log.limits import MAX_HEADER_KEY_BYTES
from core_log.log import PartitionLog
from tests import zygote
from tests.api.conftest import make_client, start_broker
from tests.api.helpers import BATCH, assert_problem, create_topic, end_offsets, produce, unique
from tests.server import BrokerProcess

T0 = 1_700_000_000_000
BAD_TS = 2**63 - 1
TIMEOUT_S = 20.0


def poison_batch(base_offset: int) -> bytes:
    """One record whose timestamp no reader can render, as an older broker stored it."""
    return assemble_batch(
        encode_records([Record(b'"poison"', None, (), BAD_TS)], BAD_TS),
        base_offset=base_offset,
        partition_leader_epoch=0,
        attributes=0,
        last_offset_delta=0,
        base_timestamp=BAD_TS,
        max_timestamp=BAD_TS,
        producer_id=-1,
        producer_epoch=-1,
        base_sequence=-1,
        record_count=1,
    )


def header_poison(base_offset: int) -> bytes:
    """One record with a header name over the cap, as an older broker stored it."""
    record = Record(b'"h"', None, (("h" * (MAX_HEADER_KEY_BYTES + 1), b"v"),), T0 + 3)
    return assemble_batch(
        encode_records([record], T0 + 3),
        base_offset=base_offset,
        partition_leader_epoch=0,
        attributes=0,
        last_offset_delta=0,
        base_timestamp=T0 + 3,
        max_timestamp=T0 + 3,
        producer_id=-1,
        producer_epoch=-1,
        base_sequence=-1,
        record_count=1,
    )


@pytest.fixture(scope="module")
def poisoned(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[BrokerProcess, str]]:
    """A broker whose topic has, on partition 0: a good record at 0, one whose timestamp no
    reader renders at 1, a good record at 2, one whose header name is over the cap at 3 and a
    good record at 4; partition 1 holds good records only."""
    data_dir = tmp_path_factory.mktemp("poison") / "data"
    broker = start_broker(data_dir)
    with make_client(broker) as c:
        topic = create_topic(c, "poison", partitions=2)
        produce(c, topic, [{"value": "a", "timestamp": T0}], partition=0)
        produce(c, topic, [{"value": "p1-0", "timestamp": T0}], partition=1)
    broker.stop()
    log = PartitionLog(
        data_dir / f"{topic}-0", LogConfig.from_dict({}), SystemClock(), HandleCache(4)
    )
    log.append(poison_batch(1), as_follower=True)
    log.append(
        build_batch([Record(b'"c"', None, (), T0 + 2)], base_offset=2, partition_leader_epoch=0),
        as_follower=True,
    )
    log.append(header_poison(3), as_follower=True)
    log.append(
        build_batch([Record(b'"e"', None, (), T0 + 4)], base_offset=4, partition_leader_epoch=0),
        as_follower=True,
    )
    log.flush()
    log.close()
    broker.start()
    try:
        yield broker, topic
    finally:
        broker.stop()


@pytest.fixture(scope="module")
def http(poisoned: tuple[BrokerProcess, str]) -> Iterator[httpx.Client]:
    with make_client(poisoned[0]) as c:
        yield c


def values(doc: dict[str, Any]) -> list[Any]:
    return [r.get("value") for r in doc["records"]]


def assert_unreadable(r: httpx.Response, offset: int) -> dict[str, Any]:
    body = assert_problem(r, 500, "CORRUPT_MESSAGE")
    assert body["retriable"] is False
    assert (body["offset"], body["next_offset"]) == (offset, offset + 1), body
    return body


# -- produce ---------------------------------------------------------------------------------


def test_produce_rejects_a_timestamp_no_reader_renders(http: httpx.Client) -> None:
    topic = create_topic(http, "ts")
    for ts in (BAD_TS, 253_402_300_800_000):
        r = http.post(
            f"/v1/topics/{topic}/records", json={"records": [{"value": 1, "timestamp": ts}]}
        )
        assert assert_problem(r, 400, "INVALID_TIMESTAMP")["retriable"] is False
    batch = build_batch([Record(b"1", None, (), BAD_TS)])
    r = http.post(
        f"/v1/topics/{topic}/partitions/0/records", content=batch, headers={"content-type": BATCH}
    )
    assert_problem(r, 400, "INVALID_TIMESTAMP")
    assert end_offsets(http, topic) == [0]


def test_produce_rejects_a_header_name_no_reader_serves(http: httpx.Client) -> None:
    topic = create_topic(http, "hdr")
    name = "h" * (MAX_HEADER_KEY_BYTES + 1)
    r = http.post(
        f"/v1/topics/{topic}/records",
        json={"records": [{"value": 1, "headers": [{"name": name, "value": "v"}]}]},
    )
    assert assert_problem(r, 400, "INVALID_RECORD")["retriable"] is False
    batch = build_batch([Record(b"1", None, ((name, b"v"),), T0)])
    r = http.post(
        f"/v1/topics/{topic}/partitions/0/records", content=batch, headers={"content-type": BATCH}
    )
    assert_problem(r, 400, "INVALID_RECORD")
    ok = "h" * MAX_HEADER_KEY_BYTES
    produce(http, topic, [{"value": 2, "headers": [{"name": ok, "value": "v"}]}], partition=0)
    got = http.get(f"/v1/topics/{topic}/partitions/0/records", params={"offset": 0}).json()
    assert [r["value"] for r in got["records"]] == [2]  # only the accepted one, served


# -- a stored record no reader can serve ----------------------------------------------------


def test_fetch_serves_up_to_it_names_it_and_skips_on_request(
    poisoned: tuple[BrokerProcess, str], http: httpx.Client
) -> None:
    _, topic = poisoned
    url = f"/v1/topics/{topic}/partitions/0/records"
    for accept in ("application/json", "application/x-ndjson"):
        r = http.get(url, params={"offset": 0}, headers={"accept": accept})
        assert r.headers["logbus-next-offset"] == "1"  # not past what it has not named
    doc = http.get(url, params={"offset": 0}).json()
    assert values(doc) == ["a"] and doc["next_offset"] == 1
    assert_unreadable(http.get(url, params={"offset": 1}), 1)
    r = http.get(url, params={"offset": 1}, headers={"accept": "application/x-ndjson"})
    assert_unreadable(r, 1)
    doc = http.get(url, params={"offset": 2}).json()  # its read holds 2, 3 (unreadable), 4
    assert values(doc) == ["c"] and doc["next_offset"] == 3  # not past what it did not name
    assert_unreadable(http.get(url, params={"offset": 3}), 3)  # the header name over the cap
    assert values(http.get(url, params={"offset": 4}).json()) == ["e"]


def test_offsets_by_timestamp_step_over_it(
    poisoned: tuple[BrokerProcess, str], http: httpx.Client
) -> None:
    _, topic = poisoned
    r = http.get(f"/v1/topics/{topic}/partitions/0/offsets", params={"at": T0 + 3})
    assert r.status_code == 200, r.text
    assert r.json()["offset"] == 4, r.json()
    group = unique("g-ts")
    r = http.post(
        f"/v1/groups/{group}/offsets/reset",
        json={"to": "timestamp", "timestamp": T0 + 3, "topics": [topic]},
    )
    assert r.status_code == 200, r.text
    assert {o["partition"]: o["offset"] for o in r.json()["offsets"]}[0] == 4


def test_member_poll_delivers_other_partitions_and_skips_by_commit(
    poisoned: tuple[BrokerProcess, str], http: httpx.Client
) -> None:
    _, topic = poisoned
    group = unique("g")
    r = http.post(
        f"/v1/groups/{group}/members", json={"topics": [topic], "auto_offset_reset": "earliest"}
    )
    assert r.status_code in (200, 201), r.text
    member, generation = r.json()["member_id"], r.json()["generation"]
    poll_url = f"/v1/groups/{group}/members/{member}/records"
    seen: list[tuple[int, int]] = []
    stuck: list[dict[str, Any]] = []
    for _ in range(6):
        doc = http.get(poll_url, params={"wait_ms": 0}).json()
        seen += [(x["partition"], x["offset"]) for x in doc["records"]]
        stuck = doc.get("unreadable", [])
        if stuck and (1, 0) in seen:
            break
    assert (0, 0) in seen and (1, 0) in seen  # good records of both partitions delivered
    assert [(u["partition"], u["offset"], u["next_offset"]) for u in stuck] == [(0, 1, 2)]
    assert stuck[0]["retriable"] is False and stuck[0]["code"] == "CORRUPT_MESSAGE"
    produce(http, topic, [{"value": "p1-1"}], partition=1)
    doc = http.get(poll_url, params={"wait_ms": 0}).json()
    if not doc["records"]:
        doc = http.get(poll_url, params={"wait_ms": 0}).json()
    assert (1, 1) in [(x["partition"], x["offset"]) for x in doc["records"]]
    # skip it: commit next_offset
    r = http.post(
        f"/v1/groups/{group}/offsets",
        json={
            "member_id": member,
            "generation": generation,
            "offsets": [{"topic": topic, "partition": 0, "offset": 2}],
        },
    )
    assert r.status_code == 200, r.text
    doc = http.get(poll_url, params={"wait_ms": 0}).json()
    assert (0, 2) in [(x["partition"], x["offset"]) for x in doc["records"]]
    assert "unreadable" not in doc
    # the next one (3) is named too, not stepped over silently
    doc = http.get(poll_url, params={"wait_ms": 0}).json()
    assert [(u["partition"], u["offset"]) for u in doc.get("unreadable", [])] == [(0, 3)]


def sse_lines(http: httpx.Client, url: str, params: dict[str, Any], until: str) -> list[str]:
    lines: list[str] = []
    with http.stream(
        "GET", url, params=params, headers={"accept": "text/event-stream"}, timeout=TIMEOUT_S
    ) as r:
        assert r.status_code == 200
        for line in r.iter_lines():
            lines.append(line)
            if line.startswith(until):
                break
    return lines


def test_sse_names_it_then_a_reconnect_is_an_error_not_a_loop(
    poisoned: tuple[BrokerProcess, str], http: httpx.Client
) -> None:
    _, topic = poisoned
    url = f"/v1/topics/{topic}/partitions/0/records"
    lines = sse_lines(http, url, {"offset": 0}, 'data: {"type"')
    assert "id: 1" in lines and "event: error" in lines
    error = json.loads(lines[-1][len("data: ") :])
    assert (error["offset"], error["next_offset"], error["retriable"]) == (1, 2, False)
    # EventSource reconnects with Last-Event-ID: 1 -> an HTTP error, on which it stops
    r = http.get(url, headers={"accept": "text/event-stream", "last-event-id": "1"})
    assert_unreadable(r, 1)
    lines = sse_lines(http, url, {"offset": 2}, 'data: {"offset":2')  # the explicit skip
    assert '"value":"c"' in lines[-1] and "id: 3" in lines


def test_websocket_names_it_stays_open_and_resubscribes_past_it(
    poisoned: tuple[BrokerProcess, str],
) -> None:
    broker, topic = poisoned
    url = broker.url.replace("http://", "ws://") + "/v1/ws"

    async def main() -> None:
        async with connect(url, open_timeout=5, close_timeout=2) as ws:

            async def send(doc: dict[str, Any]) -> None:
                await ws.send(json.dumps(doc))

            async def until(kind: str) -> dict[str, Any]:
                while True:
                    doc = json.loads(await asyncio.wait_for(ws.recv(), TIMEOUT_S))
                    if doc.get("type") == kind:
                        return doc

            await send({"op": "credit", "records": 100})
            part = {"topic": topic, "partition": 0, "offset": 0}
            await send({"op": "subscribe", "id": 1, "partitions": [part]})
            first = await until("records")
            assert [x["offset"] for x in first["records"]] == [0]
            assert first["next_offset"] == 1
            error = await until("error")
            assert (error["offset"], error["next_offset"], error["retriable"]) == (1, 2, False)
            await send({"op": "ping", "id": 2})
            await until("pong")  # still open: no 1011
            await send({"op": "subscribe", "id": 3, "partitions": [{**part, "offset": 2}]})
            after = await until("records")
            assert [x["offset"] for x in after["records"]] == [2]
            assert after["next_offset"] == 3
            error = await until("error")  # the next one, a header name over the cap
            assert (error["offset"], error["next_offset"]) == (3, 4)
            # WebSocket produce shares produce's one check
            long_name = "h" * (MAX_HEADER_KEY_BYTES + 1)
            bad = [{"value": 1, "headers": [{"name": long_name, "value": "v"}]}]
            await send({"op": "produce", "id": 4, "topic": topic, "partition": 1, "records": bad})
            rejected = await until("error")
            assert (rejected["id"], rejected["code"]) == (4, "INVALID_RECORD"), rejected
            bad = [{"value": 1, "timestamp": BAD_TS}]
            await send({"op": "produce", "id": 5, "topic": topic, "partition": 1, "records": bad})
            rejected = await until("error")
            assert (rejected["id"], rejected["code"]) == (5, "INVALID_TIMESTAMP"), rejected

    asyncio.run(main())


def test_nothing_was_lost_to_a_restart(poisoned: tuple[BrokerProcess, str]) -> None:
    """The fixture's surgery survived the broker's restart (a guard for the tests above)."""
    broker, topic = poisoned
    p = Path(broker.data_dir) / f"{topic}-0"
    assert p.is_dir()


def test_member_sse_says_it_once_and_streams_the_other_partitions(
    poisoned: tuple[BrokerProcess, str], http: httpx.Client
) -> None:
    _, topic = poisoned
    group = unique("g-sse")
    r = http.post(
        f"/v1/groups/{group}/members", json={"topics": [topic], "auto_offset_reset": "earliest"}
    )
    assert r.status_code in (200, 201), r.text
    member = r.json()["member_id"]
    url = f"/v1/groups/{group}/members/{member}/records"
    events: list[tuple[str, dict[str, Any]]] = []
    with http.stream(
        "GET", url, headers={"accept": "text/event-stream"}, timeout=TIMEOUT_S
    ) as response:
        assert response.status_code == 200
        event = "message"
        for line in response.iter_lines():
            if line.startswith("event: "):
                event = line[len("event: ") :]
            elif line.startswith("data: "):
                events.append((event, json.loads(line[len("data: ") :])))
                event = "message"
                records = {(d["partition"], d["offset"]) for e, d in events if e == "message"}
                if any(e == "unreadable" for e, _ in events) and {(0, 0), (1, 0)} <= records:
                    break
    stuck = [d for e, d in events if e == "unreadable"]
    assert [(d["partition"], d["offset"], d["next_offset"]) for d in stuck] == [(0, 1, 2)]
    assert stuck[0]["retriable"] is False


def test_websocket_member_skips_it_by_committing(poisoned: tuple[BrokerProcess, str]) -> None:
    broker, topic = poisoned
    url = broker.url.replace("http://", "ws://") + "/v1/ws"
    group = unique("g-ws")

    async def main() -> None:
        async with connect(url, open_timeout=5, close_timeout=2) as ws:
            got: list[dict[str, Any]] = []

            async def send(doc: dict[str, Any]) -> None:
                await ws.send(json.dumps(doc))

            async def until(kind: str) -> dict[str, Any]:
                while True:
                    doc = json.loads(await asyncio.wait_for(ws.recv(), TIMEOUT_S))
                    if doc.get("type") == "records":
                        got.extend({"partition": doc["partition"], **r} for r in doc["records"])
                    if doc.get("type") == kind:
                        return doc

            await send({"op": "credit", "records": 100})
            await send(
                {
                    "op": "join",
                    "id": 1,
                    "group": group,
                    "topics": [topic],
                    "auto_offset_reset": "earliest",
                }
            )
            joined = await until("joined")
            error = await until("error")
            assert (error["partition"], error["offset"], error["next_offset"]) == (0, 1, 2)
            offsets = [{"topic": topic, "partition": 0, "offset": 2}]
            await send({"op": "commit", "id": 2, "offsets": offsets})
            await until("committed")
            while (0, 2) not in {(r["partition"], r["offset"]) for r in got}:
                await until("records")
            assert joined["member_id"]

    asyncio.run(main())


def test_the_cli_prints_what_it_can_then_names_the_unreadable_record(
    poisoned: tuple[BrokerProcess, str],
) -> None:
    """``logbus consume`` decodes binary batches itself: it prints the records before an
    unreadable one, then one line naming it and how to skip it (exit 1, no traceback)."""
    broker, topic = poisoned
    env = {**os.environ, "LOGBUS_URL": broker.url}
    cmd = ["consume", topic, "--partition", "0"]
    result = zygote.run([*cmd, "--from", "earliest"], timeout=60, env=env)
    assert result.returncode == 1, (result.stdout, result.stderr)
    assert "Traceback" not in result.stderr, result.stderr
    assert result.stdout.split() == ["a"]
    assert "offsets 1..1" in result.stderr and "--from 2" in result.stderr, result.stderr
    skipped = zygote.run([*cmd, "--from", "2"], timeout=60, env=env)
    assert skipped.returncode == 1 and skipped.stdout.split() == ["c"], skipped
    assert "--from 4" in skipped.stderr, skipped.stderr
