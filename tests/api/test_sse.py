"""Server-Sent Events against a real broker: a partition's records and a group member's records.

A stream is read with httpx's streaming API and parsed as the SSE spec says (fields, blank line
ends an event, ``:`` starts a comment). Every read has a timeout, so a stream that stops
delivering fails the test instead of hanging it.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx
import pytest

from tests.api.helpers import assert_problem, create_topic, produce, unique
from tests.server import BrokerProcess

SSE = {"accept": "text/event-stream"}
READ_TIMEOUT_S = 5.0


def parse(lines: Iterator[str]) -> Iterator[dict[str, Any]]:
    """Events (dicts of their fields, ``data`` joined by newlines) from SSE lines; comments
    are dropped, an event of only comments is not yielded."""
    event: dict[str, Any] = {}
    for line in lines:
        if line == "":
            if event:
                yield event
            event = {}
            continue
        if line.startswith(":"):
            continue
        name, _, value = line.partition(":")
        value = value.removeprefix(" ")
        if name == "data" and "data" in event:
            event["data"] += "\n" + value
        else:
            event[name] = value


async def aparse(lines: AsyncIterator[str]) -> AsyncIterator[dict[str, Any]]:
    event: dict[str, Any] = {}
    async for line in lines:
        if line == "":
            if event:
                yield event
            event = {}
            continue
        if line.startswith(":"):
            continue
        name, _, value = line.partition(":")
        event[name] = value.removeprefix(" ")


def take(events: Iterator[dict[str, Any]], n: int) -> list[dict[str, Any]]:
    out = []
    for _ in range(n):
        out.append(next(events))
    return out


@pytest.fixture(scope="module")
def sse_client(shared_broker: BrokerProcess) -> Iterator[httpx.Client]:
    timeout = httpx.Timeout(10.0, read=READ_TIMEOUT_S)
    with httpx.Client(base_url=shared_broker.url, timeout=timeout) as c:
        yield c


def records_path(topic: str, partition: int = 0) -> str:
    return f"/v1/topics/{topic}/partitions/{partition}/records"


# -- partition streams ---------------------------------------------------------------------------


def test_partition_stream_events_and_ids(http: httpx.Client, sse_client: httpx.Client) -> None:
    topic = create_topic(http, "sse-ids")
    produce(
        http,
        topic,
        [
            {"key": "k0", "value": {"n": 0}},
            {"key": "k1", "value": "one", "headers": [{"name": "h", "value": "v"}]},
            {"value": None},
            {"key": "k3", "value": 3, "timestamp": 1_700_000_000_000},
        ],
        partition=0,
    )
    with sse_client.stream("GET", records_path(topic), params={"offset": 0}, headers=SSE) as r:
        assert r.status_code == 200
        assert r.headers["content-type"].startswith("text/event-stream")
        assert r.headers["cache-control"] == "no-cache"
        events = parse(r.iter_lines())
        assert next(events) == {"retry": "1000"}
        got = take(events, 4)
    assert [e["id"] for e in got] == ["1", "2", "3", "4"]
    assert all(set(e) == {"id", "data"} for e in got), got
    docs = [json.loads(e["data"]) for e in got]
    assert [d["offset"] for d in docs] == [0, 1, 2, 3]
    assert (docs[0]["key"], docs[0]["value"]) == ("k0", {"n": 0})
    assert docs[1]["headers"] == [{"name": "h", "value": "v"}]
    assert docs[2]["value"] is None and docs[2].get("key") is None
    assert docs[3]["timestamp"] == 1_700_000_000_000

    # From the middle of the log.
    with sse_client.stream("GET", records_path(topic), params={"offset": 2}, headers=SSE) as r:
        events = parse(r.iter_lines())
        next(events)
        assert [e["id"] for e in take(events, 2)] == ["3", "4"]


def test_partition_stream_pushes_live_records(http: httpx.Client, sse_client: httpx.Client) -> None:
    topic = create_topic(http, "sse-live", partitions=2)
    produce(http, topic, [{"value": "old"}], partition=1)
    sent: list[float] = []

    def producer() -> None:
        for i in range(3):
            time.sleep(0.3)
            sent.append(time.monotonic())
            produce(http, topic, [{"value": f"live-{i}"}], partition=1)

    with sse_client.stream("GET", records_path(topic, 1), params={"offset": 1}, headers=SSE) as r:
        assert r.status_code == 200
        events = parse(r.iter_lines())
        assert next(events) == {"retry": "1000"}
        thread = threading.Thread(target=producer)
        thread.start()
        try:
            got = []
            for _ in range(3):
                event = next(events)
                got.append((event, time.monotonic()))
        finally:
            thread.join()
    assert [json.loads(e["data"])["value"] for e, _ in got] == ["live-0", "live-1", "live-2"]
    assert [e["id"] for e, _ in got] == ["2", "3", "4"]
    # Pushed as appended: far sooner than the 15 s keepalive a polling stream would need.
    latencies = [arrived - sent[i] for i, (_, arrived) in enumerate(got)]
    assert max(latencies) < 1.0, latencies


def test_partition_stream_resumes_from_last_event_id(
    http: httpx.Client, sse_client: httpx.Client
) -> None:
    topic = create_topic(http, "sse-resume")
    produce(http, topic, [{"value": i} for i in range(10)], partition=0)
    seen: list[int] = []
    last_id: str | None = None
    total = 10
    # Reconnect after a few events each time, as EventSource does after a dropped connection;
    # records keep arriving while nobody is connected. Last-Event-ID wins over ?offset.
    for round_, take_n in enumerate([3, 1, 4, 2, 5, 5]):
        headers = dict(SSE)
        if last_id is not None:
            headers["last-event-id"] = last_id
        with sse_client.stream(
            "GET", records_path(topic), params={"offset": 0}, headers=headers
        ) as r:
            assert r.status_code == 200
            events = parse(r.iter_lines())
            assert next(events) == {"retry": "1000"}
            for e in take(events, take_n):
                doc = json.loads(e["data"])
                assert int(e["id"]) == doc["offset"] + 1
                seen.append(doc["value"])
                last_id = e["id"]
        produce(http, topic, [{"value": total + i} for i in range(round_ + 1)], partition=0)
        total += round_ + 1
    assert seen == list(range(len(seen)))  # no loss, no duplicate, in order
    assert len(seen) == 20


def test_partition_stream_errors_before_the_stream(http: httpx.Client) -> None:
    topic = create_topic(http, "sse-errors")
    r = http.get(records_path(unique("nope")), params={"offset": 0}, headers=SSE)
    assert_problem(r, 404, "UNKNOWN_TOPIC_OR_PARTITION")
    assert_problem(
        http.get(records_path(topic, 3), params={"offset": 0}, headers=SSE),
        404,
        "UNKNOWN_TOPIC_OR_PARTITION",
    )
    assert_problem(http.get(records_path(topic), headers=SSE), 400, "INVALID_REQUEST")
    assert_problem(
        http.get(records_path(topic), params={"offset": -1}, headers=SSE), 400, "INVALID_REQUEST"
    )
    for bad in ("abc", "-1", "1.5", "9" * 25):
        r = http.get(
            records_path(topic), params={"offset": 0}, headers={**SSE, "last-event-id": bad}
        )
        assert_problem(r, 400, "INVALID_REQUEST")


def test_partition_stream_offset_out_of_range_is_416(
    http: httpx.Client, sse_client: httpx.Client
) -> None:
    """A 416 problem before the stream, with the valid range: an EventSource stops on an error
    status, where it would reconnect every second to a 200 stream that merely ended."""
    topic = create_topic(http, "sse-range")
    produce(http, topic, [{"value": i} for i in range(3)], partition=0)
    for params, headers in (({"offset": 10}, SSE), ({"offset": 0}, {**SSE, "last-event-id": "4"})):
        with sse_client.stream("GET", records_path(topic), params=params, headers=headers) as r:
            r.read()
            body = assert_problem(r, 416, "OFFSET_OUT_OF_RANGE")
        assert (body["log_start_offset"], body["log_end_offset"]) == (0, 3)


def test_partition_stream_at_log_end_waits(http: httpx.Client, sse_client: httpx.Client) -> None:
    """The log end itself is a valid start: the stream waits there for the next record."""
    topic = create_topic(http, "sse-end")
    produce(http, topic, [{"value": i} for i in range(3)], partition=0)
    with sse_client.stream("GET", records_path(topic), params={"offset": 3}, headers=SSE) as r:
        assert r.status_code == 200
        events = parse(r.iter_lines())
        assert next(events) == {"retry": "1000"}
        produce(http, topic, [{"value": "next"}], partition=0)
        e = next(events)
    assert e["id"] == "4" and json.loads(e["data"])["value"] == "next"


def test_partition_stream_accept_is_case_insensitive(
    http: httpx.Client, sse_client: httpx.Client
) -> None:
    """Media types are case-insensitive (RFC 9110); the fast path once answered 406 here."""
    topic = create_topic(http, "sse-case")
    produce(http, topic, [{"value": 1}], partition=0)
    with sse_client.stream(
        "GET", records_path(topic), params={"offset": 0}, headers={"accept": "Text/Event-Stream"}
    ) as r:
        assert r.status_code == 200
        events = parse(r.iter_lines())
        next(events)
        assert next(events)["id"] == "1"


# -- member streams ------------------------------------------------------------------------------


def test_member_stream_assignment_then_records(
    http: httpx.Client, shared_broker: BrokerProcess
) -> None:
    topic = create_topic(http, "sse-member", partitions=2)
    for p in range(2):
        produce(http, topic, [{"key": f"p{p}-{i}", "value": i} for i in range(3)], partition=p)
    group = unique("g")
    r = http.post(
        f"/v1/groups/{group}/members",
        json={"topics": [topic], "session_timeout_ms": 600, "auto_offset_reset": "earliest"},
    )
    assert r.status_code == 201
    me = r.json()["member_id"]

    async def run() -> list[dict[str, Any]]:
        timeout = httpx.Timeout(10.0, read=READ_TIMEOUT_S)
        async with httpx.AsyncClient(base_url=shared_broker.url, timeout=timeout) as ac:
            path = f"/v1/groups/{group}/members/{me}/records"
            async with ac.stream("GET", path, headers=SSE) as resp:
                assert resp.status_code == 200
                assert resp.headers["content-type"].startswith("text/event-stream")
                events: list[dict[str, Any]] = []
                stream = aparse(resp.aiter_lines())
                async for e in stream:
                    events.append(e)
                    if sum(1 for x in events if "id" in x) == 6:
                        break
                # The stream is the member's heartbeat: well past its 600 ms session it is
                # still a member, and records produced now are pushed.
                await asyncio.sleep(1.5)
                produce(http, topic, [{"key": "late", "value": "late"}], partition=1)
                async for e in stream:
                    events.append(e)
                    if "id" in e:
                        break
                d = (await ac.get(f"/v1/groups/{group}")).json()
                assert [m["member_id"] for m in d["members"]] == [me], d
            return events

    events = asyncio.run(run())
    assert events[0] == {"retry": "1000"}
    assert events[1]["event"] == "assignment"
    doc = json.loads(events[1]["data"])
    assert doc["member_id"] == me
    assert {(x["topic"], x["partition"]) for x in doc["assignment"]} == {(topic, 0), (topic, 1)}
    assert doc["revoking"] == [] and doc["pending"] == []
    records = [e for e in events if "id" in e]
    assert all(set(e) == {"id", "data"} for e in records), records
    got = []
    for e in records:
        rec = json.loads(e["data"])
        assert e["id"] == f"{topic}/{rec['partition']}/{rec['offset'] + 1}"
        assert rec["topic"] == topic
        got.append((rec["partition"], rec["offset"], rec["key"]))
    assert sorted(got[:6]) == [(p, i, f"p{p}-{i}") for p in range(2) for i in range(3)]
    assert got[6] == (1, 3, "late")
    # Positions moved with the stream: a JSON poll has nothing left.
    r = http.get(f"/v1/groups/{group}/members/{me}/records", params={"wait_ms": 0})
    assert r.status_code == 200 and r.json()["records"] == []
    http.delete(f"/v1/groups/{group}/members/{me}")


def test_member_stream_announces_a_rebalance(
    http: httpx.Client, shared_broker: BrokerProcess
) -> None:
    topic = create_topic(http, "sse-member-rebalance", partitions=4)
    group = unique("g")
    body = {"topics": [topic], "session_timeout_ms": 900, "auto_offset_reset": "earliest"}
    r = http.post(f"/v1/groups/{group}/members", json=body)
    me = r.json()["member_id"]

    async def run() -> tuple[list[dict[str, Any]], set[tuple[str, int]]]:
        timeout = httpx.Timeout(10.0, read=READ_TIMEOUT_S)
        async with httpx.AsyncClient(base_url=shared_broker.url, timeout=timeout) as ac:
            path = f"/v1/groups/{group}/members/{me}/records"
            assignments: list[dict[str, Any]] = []

            async def read() -> None:
                async with ac.stream("GET", path, headers=SSE) as resp:
                    async for e in aparse(resp.aiter_lines()):
                        if e.get("event") == "assignment":
                            assignments.append(json.loads(e["data"]))

            reader = asyncio.create_task(read())
            await asyncio.sleep(0.3)
            r = await ac.post(f"/v1/groups/{group}/members", json=body)
            other = r.json()["member_id"]
            got: set[tuple[str, int]] = set()
            deadline = time.monotonic() + 5
            while time.monotonic() < deadline and len(got) < 2:
                hb = (await ac.post(f"/v1/groups/{group}/members/{other}/heartbeat")).json()
                got = {(x["topic"], x["partition"]) for x in hb["assignment"]}
                await asyncio.sleep(0.1)
            await asyncio.sleep(0.5)  # the stream's next poll reports the smaller assignment
            reader.cancel()
            await asyncio.gather(reader, return_exceptions=True)
            await ac.delete(f"/v1/groups/{group}/members/{other}")
            return assignments, got

    assignments, other_got = asyncio.run(run())
    assert len(other_got) == 2, (assignments, other_got)
    # Announced: the partitions to release, then (the stream acknowledged) the smaller set.
    assert any(a["revoking"] for a in assignments), assignments
    last = {(x["topic"], x["partition"]) for x in assignments[-1]["assignment"]}
    assert assignments[-1]["revoking"] == []
    assert last == {(topic, p) for p in range(4)} - other_got
    http.delete(f"/v1/groups/{group}/members/{me}")


def test_member_stream_announces_its_assignment_at_once(
    http: httpx.Client, sse_client: httpx.Client
) -> None:
    """Regression: on an idle topic the first `assignment` event came only when the stream's
    first poll returned, min(15 s, session/3) later."""
    topic = create_topic(http, "sse-member-idle", partitions=2)
    group = unique("g")
    body = {"topics": [topic], "session_timeout_ms": 3_000}
    me = http.post(f"/v1/groups/{group}/members", json=body).json()["member_id"]
    try:
        started = time.monotonic()
        path = f"/v1/groups/{group}/members/{me}/records"
        with sse_client.stream("GET", path, headers=SSE) as r:
            events = parse(r.iter_lines())
            assert next(events) == {"retry": "1000"}
            e = next(events)
            elapsed = time.monotonic() - started
        assert e["event"] == "assignment" and len(json.loads(e["data"])["assignment"]) == 2
        assert elapsed < 0.5, f"first assignment event after {elapsed:.2f} s"
    finally:
        http.delete(f"/v1/groups/{group}/members/{me}")
