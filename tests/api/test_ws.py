"""``/v1/ws`` against a real broker, with a real client library (``websockets``).

Every test is a plain function that runs one coroutine with :func:`asyncio.run`. Every receive
has a timeout (:func:`recv`), so a server that stops delivering fails the test instead of
hanging it; "nothing arrives" is asserted by a short receive that must time out
(:func:`quiet`). Records are produced over HTTP with the module's shared broker.

Credit is checked from the client's side, the only side a client can trust: the records (and
the payload bytes of record frames) received never exceed what was granted so far.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed

from api.ws_protocol import parse_binary_frame
from core_log.batch import decode_records, iter_records, scan_batches
from tests.api.helpers import BATCH, create_topic, kafka_batch, produce, unique
from tests.server import BrokerProcess

RECV_TIMEOUT_S = 5.0
QUIET_S = 0.3  # "nothing arrives": nothing within this long
Msg = dict[str, Any]


# -- a small client ------------------------------------------------------------------------------


def ws_url(broker: BrokerProcess) -> str:
    return broker.url.replace("http://", "ws://", 1) + "/v1/ws"


@asynccontextmanager
async def session(broker: BrokerProcess) -> AsyncIterator[ClientConnection]:
    async with connect(ws_url(broker), open_timeout=5, close_timeout=2, max_size=None) as ws:
        yield ws


async def send(ws: ClientConnection, doc: Msg) -> None:
    await ws.send(json.dumps(doc))


async def recv(ws: ClientConnection, timeout: float = RECV_TIMEOUT_S) -> str | bytes:
    return await asyncio.wait_for(ws.recv(), timeout)


async def recv_json(ws: ClientConnection, timeout: float = RECV_TIMEOUT_S) -> Msg:
    raw = await recv(ws, timeout)
    assert isinstance(raw, str), f"expected a text frame, got {raw[:60]!r}"
    doc: Msg = json.loads(raw)
    return doc


async def expect(ws: ClientConnection, kind: str, timeout: float = RECV_TIMEOUT_S) -> Msg:
    """The next message, which must be of type ``kind``."""
    doc = await recv_json(ws, timeout)
    assert doc.get("type") == kind, doc
    return doc


async def expect_error(
    ws: ClientConnection, ident: Any, code: str, status: int, timeout: float = RECV_TIMEOUT_S
) -> Msg:
    """The next message, which must be an error about message ``ident``. Its ``type`` is not
    checked here: see test_broker_errors_are_typed_error_messages (a known bug)."""
    doc = await recv_json(ws, timeout)
    assert (doc.get("id"), doc.get("code"), doc.get("status")) == (ident, code, status), doc
    assert isinstance(doc.get("detail"), str) and doc["detail"], doc
    return doc


async def quiet(ws: ClientConnection, seconds: float = QUIET_S) -> None:
    """Nothing arrives for ``seconds``."""
    try:
        raw = await asyncio.wait_for(ws.recv(), seconds)
    except TimeoutError:
        return
    pytest.fail(f"unexpected message: {raw[:200]!r}")


async def closed_with(ws: ClientConnection) -> tuple[int, str]:
    """Wait for the server to close the socket; (code, reason)."""
    with pytest.raises(ConnectionClosed) as info:
        while True:
            await recv(ws)
    assert info.value.rcvd is not None, "closed without a close frame"
    return info.value.rcvd.code, info.value.rcvd.reason


async def ping(ws: ClientConnection, ident: Any = "p") -> None:
    """The socket is open and answering (every message before the pong is a failure)."""
    await send(ws, {"op": "ping", "id": ident})
    assert await expect(ws, "pong") == {"type": "pong", "id": ident}


def _json_or_bytes(value: bytes | None) -> Any:
    """A stored value as the JSON records frame would show it: parsed JSON, else the bytes."""
    if value is None:
        return None
    try:
        return json.loads(value)
    except ValueError:
        return value


class Consumer:
    """Receives record frames (JSON or binary), keeping count of records and payload bytes
    and of every other message, in order."""

    def __init__(self, ws: ClientConnection) -> None:
        self.ws = ws
        self.records: list[tuple[str, int, int, Any]] = []  # topic, partition, offset, value
        self.frame_bytes = 0
        self.frames = 0
        self.binary_batches: list[tuple[str, int, bytes]] = []
        self.other: list[Msg] = []

    def _take(self, raw: str | bytes) -> None:
        if isinstance(raw, bytes):
            topic, partition, data = parse_binary_frame(raw)
            self.frames += 1
            self.frame_bytes += len(raw)
            end = 0
            for pos, h in scan_batches(data):
                assert pos == end
                end = pos + h.size_bytes
                self.binary_batches.append((topic, partition, data[pos:end]))
            assert end == len(data), "a frame carries whole batches only"
            for r in iter_records(data):
                value = _json_or_bytes(r.value)
                self.records.append((topic, partition, r.offset, value))
            return
        doc = json.loads(raw)
        if doc.get("type") != "records":
            self.other.append(doc)
            return
        self.frames += 1
        self.frame_bytes += len(raw.encode())
        assert doc["records"], doc
        assert doc["next_offset"] > doc["records"][-1]["offset"], doc
        for r in doc["records"]:
            self.records.append((doc["topic"], doc["partition"], r["offset"], r.get("value")))

    async def until(self, n: int, timeout: float = RECV_TIMEOUT_S) -> None:
        """Receive until at least ``n`` records in all."""
        deadline = time.monotonic() + timeout
        while len(self.records) < n:
            left = deadline - time.monotonic()
            assert left > 0, f"{len(self.records)} of {n} records; other: {self.other}"
            self._take(await recv(self.ws, left))

    async def drain(self, seconds: float = QUIET_S) -> None:
        """Receive until nothing arrives for ``seconds``."""
        while True:
            try:
                raw = await asyncio.wait_for(self.ws.recv(), seconds)
            except TimeoutError:
                return
            self._take(raw)

    async def until_message(self, kind: str, timeout: float = RECV_TIMEOUT_S) -> Msg:
        """Receive (keeping records) until a message of type ``kind``; returns it."""
        deadline = time.monotonic() + timeout
        seen = len(self.other)
        while True:
            for doc in self.other[seen:]:
                if doc.get("type") == kind:
                    self.other.remove(doc)
                    return doc
            seen = len(self.other)
            left = deadline - time.monotonic()
            assert left > 0, f"no {kind!r} message; other: {self.other}"
            self._take(await recv(self.ws, left))

    def offsets(self, topic: str | None = None, partition: int | None = None) -> list[int]:
        return [
            o
            for t, p, o, _ in self.records
            if (topic is None or t == topic) and (partition is None or p == partition)
        ]

    def partitions(self) -> set[int]:
        return {p for _, p, _, _ in self.records}


async def credit(ws: ClientConnection, records: int, nbytes: int | None = None) -> None:
    doc: Msg = {"op": "credit", "records": records}
    if nbytes is not None:
        doc["bytes"] = nbytes
    await send(ws, doc)


async def subscribe(ws: ClientConnection, **body: Any) -> Msg:
    await send(ws, {"op": "subscribe", "id": "sub", **body})
    return await expect(ws, "subscribed")


async def join(ws: ClientConnection, group: str, topics: list[str], **body: Any) -> Msg:
    await send(ws, {"op": "join", "id": "join", "group": group, "topics": topics, **body})
    doc = await expect(ws, "joined")
    assert doc["group"] == group and doc["id"] == "join", doc
    assert isinstance(doc["member_id"], str) and doc["member_id"], doc
    return doc


def tps(doc: Msg) -> set[tuple[str, int]]:
    return {(x["topic"], x["partition"]) for x in doc["partitions"]}


def members(http: httpx.Client, group: str) -> list[Msg]:
    """The group's members; none for a group the broker forgot (empty, no offsets)."""
    r = http.get(f"/v1/groups/{group}")
    if r.status_code == 404:
        return []
    assert r.status_code == 200, r.text
    found: list[Msg] = r.json()["members"]
    return found


def values(n: int, prefix: str = "v") -> list[Msg]:
    return [{"value": f"{prefix}{i}"} for i in range(n)]


def run(coro: Any) -> Any:
    return asyncio.run(coro)


# -- malformed messages --------------------------------------------------------------------------


def test_malformed_messages_get_errors_and_the_socket_stays_usable(
    shared_broker: BrokerProcess, http: httpx.Client
) -> None:
    topic = create_topic(http, "ws-malformed")
    produce(http, topic, values(3), partition=0)

    async def main() -> None:
        async with session(shared_broker) as ws:
            bad: list[tuple[str | bytes, Any]] = [
                ("not json", None),
                (b"\x00\x01binary", None),
                ("[1, 2]", None),
                (json.dumps({"id": 1}), 1),  # no op
                (json.dumps({"op": "dance", "id": "x"}), "x"),
                (json.dumps({"op": "credit", "records": -1, "id": 3}), 3),
                (json.dumps({"op": "credit", "records": 2**41, "id": 4}), 4),
                (json.dumps({"op": "ping", "id": 5, "extra": True}), 5),
                (json.dumps({"op": "subscribe", "partitions": [{"topic": topic}], "id": 6}), 6),
                (json.dumps({"op": "join", "group": "g", "topics": [], "id": 7}), 7),
                (json.dumps({"op": "commit", "offsets": [], "group": "g", "id": 8}), 8),
                (json.dumps({"op": "produce", "topic": topic, "id": 9}), 9),  # no records
                (json.dumps({"op": "subscribe", "format": "xml", "id": 10}), 10),
            ]
            for raw, ident in bad:
                await ws.send(raw)
                doc = await expect(ws, "error")
                assert doc["id"] == ident, (raw, doc)
                assert doc["code"] == "INVALID_REQUEST", (raw, doc)
                assert doc["status"] == 400, (raw, doc)
                assert isinstance(doc["detail"], str) and doc["detail"], (raw, doc)
            # A well-formed message the server cannot act on: an error too, not a close.
            await send(
                ws,
                {
                    "op": "commit",
                    "id": "c",
                    "offsets": [{"topic": topic, "partition": 0, "offset": 1}],
                },
            )
            await expect_error(ws, "c", "INVALID_REQUEST", 400)
            # Still usable: it answers, subscribes and delivers.
            await ping(ws, 42)
            await subscribe(ws, partitions=[{"topic": topic, "partition": 0, "offset": 0}])
            c = Consumer(ws)
            await credit(ws, 10)
            await c.until(3)
            assert c.offsets() == [0, 1, 2]

    run(main())


# -- explicit subscriptions ----------------------------------------------------------------------


def test_subscribe_from_offset_earliest_latest_and_timestamp(
    shared_broker: BrokerProcess, http: httpx.Client
) -> None:
    topic = create_topic(http, "ws-sub", partitions=4)
    t0 = 1_700_000_000_000
    for p in range(4):
        produce(
            http,
            topic,
            [{"value": f"p{p}-{i}", "timestamp": t0 + 1000 * i} for i in range(5)],
            partition=p,
        )

    async def main() -> None:
        async with session(shared_broker) as ws:
            sub = await subscribe(
                ws,
                partitions=[
                    {"topic": topic, "partition": 0, "offset": 2},
                    {"topic": topic, "partition": 1, "from": "earliest"},
                    {"topic": topic, "partition": 2, "from": "latest"},
                    {"topic": topic, "partition": 3, "timestamp": t0 + 2500},
                ],
            )
            assert sub["id"] == "sub"
            assert sub["partitions"] == [
                {"topic": topic, "partition": 0, "offset": 2},
                {"topic": topic, "partition": 1, "offset": 0},
                {"topic": topic, "partition": 2, "offset": 5},
                {"topic": topic, "partition": 3, "offset": 3},  # first at or after t0 + 2.5 s
            ]
            c = Consumer(ws)
            await credit(ws, 1000)
            await c.until(3 + 5 + 2)
            await c.drain()
            assert c.offsets(topic, 0) == [2, 3, 4]
            assert c.offsets(topic, 1) == [0, 1, 2, 3, 4]
            assert c.offsets(topic, 2) == []
            assert c.offsets(topic, 3) == [3, 4]
            assert {(p, o): v for _, p, o, v in c.records}[(3, 4)] == "p3-4"
            # "latest" means records appended from now on.
            produce(http, topic, [{"value": "new"}], partition=2)
            await c.until(11)
            assert c.records[-1] == (topic, 2, 5, "new")

        # Whole topics, with a default start for all their partitions.
        async with session(shared_broker) as ws:
            sub = await subscribe(ws, topics=[topic], **{"from": "earliest"})
            assert [(x["partition"], x["offset"]) for x in sub["partitions"]] == [
                (0, 0),
                (1, 0),
                (2, 0),
                (3, 0),
            ]
            c = Consumer(ws)
            await credit(ws, 1000)
            await c.until(21)
            await c.drain()
            assert len(c.records) == 21
            for p in range(4):
                assert c.offsets(topic, p) == list(range(6 if p == 2 else 5))
        async with session(shared_broker) as ws:
            sub = await subscribe(ws, topics=[topic], timestamp=t0 + 4000)
            assert [x["offset"] for x in sub["partitions"]] == [4, 4, 4, 4]
        async with session(shared_broker) as ws:  # a partition is subscribed once per socket
            # A timestamp past every record: the end of the log.
            sub2 = await subscribe(ws, topics=[topic], timestamp=2**62)
            assert [x["offset"] for x in sub2["partitions"]] == [5, 5, 6, 5]

    run(main())


def test_records_are_pushed_as_they_are_appended(
    shared_broker: BrokerProcess, http: httpx.Client
) -> None:
    topic = create_topic(http, "ws-live", partitions=2)

    async def main() -> list[float]:
        async with session(shared_broker) as ws:
            await subscribe(ws, topics=[topic])  # from latest
            c = Consumer(ws)
            await credit(ws, 100)
            await quiet(ws)
            latencies = []
            for i in range(5):
                sent = time.monotonic()
                produce(http, topic, [{"value": i}], partition=i % 2)
                await c.until(i + 1)
                latencies.append(time.monotonic() - sent)
            assert [(p, o, v) for _, p, o, v in c.records] == [
                (0, 0, 0),
                (1, 0, 1),
                (0, 1, 2),
                (1, 1, 3),
                (0, 2, 4),
            ]
            return latencies

    latencies = run(main())
    # Far sooner than any keepalive timer (15 s): pushed on append, not polled.
    assert max(latencies) < 1.0, latencies


# -- credit --------------------------------------------------------------------------------------


@pytest.mark.parametrize("fmt", ["json", "binary"])
def test_record_credit_is_never_exceeded(
    shared_broker: BrokerProcess, http: httpx.Client, fmt: str
) -> None:
    topic = create_topic(http, f"ws-credit-{fmt}", partitions=2)
    for i in range(10):  # 10 batches of 3 records on each partition
        for p in range(2):
            produce(http, topic, values(3, f"{p}-{i}-"), partition=p)

    async def main() -> None:
        async with session(shared_broker) as ws:
            await subscribe(ws, topics=[topic], format=fmt, **{"from": "earliest"})
            c = Consumer(ws)
            await quiet(ws)  # no credit: nothing
            granted = 0
            # Binary frames carry whole batches: 7 records of credit carry two batches of 3.
            for grant, expected in [(7, 6), (2, 9), (1, 9), (0, 9), (20, 30), (1000, 60)]:
                await credit(ws, grant)
                granted += grant
                if fmt == "json":
                    expected = min(granted, 60)
                await c.until(expected)
                await c.drain()
                assert len(c.records) == expected, (grant, c.records[-5:], c.other)
                assert len(c.records) <= granted
            for p in range(2):
                assert c.offsets(topic, p) == list(range(30))
            stalled = [m for m in c.other if m["type"] == "stalled"]
            assert all(m["type"] == "stalled" for m in c.other), c.other
            if fmt == "binary":
                # Credit 1 left after two batches: the next batch needs 3. Said once per grant.
                assert stalled, c.other
                assert all(m["needed_records"] == 3 for m in stalled), stalled
                assert stalled[0]["credit_records"] == 1, stalled
            else:
                assert not stalled, stalled
            # More credit, more records as they come; never more than granted.
            produce(http, topic, values(5), partition=0)
            await c.until(65)
            await c.drain()
            assert len(c.records) == 65

    run(main())


@pytest.mark.parametrize("fmt", ["json", "binary"])
def test_byte_credit_is_never_exceeded(
    shared_broker: BrokerProcess, http: httpx.Client, fmt: str
) -> None:
    topic = create_topic(http, f"ws-bytes-{fmt}")
    n = 40
    for i in range(n // 2):  # batches of 2 records of ~100 bytes
        produce(http, topic, [{"value": f"{i}-{j}-" + "x" * 100} for j in range(2)], partition=0)

    async def main() -> None:
        async with session(shared_broker) as ws:
            await subscribe(
                ws, partitions=[{"topic": topic, "partition": 0, "offset": 0}], format=fmt
            )
            c = Consumer(ws)
            granted_bytes = 0
            await credit(ws, 10_000, 0)  # records, but zero bytes: nothing
            await quiet(ws)
            rounds = 0
            while len(c.records) < n:
                rounds += 1
                assert rounds < 100, "no progress"
                await credit(ws, 0, 700)
                granted_bytes += 700
                await c.drain(0.2)
                assert c.frame_bytes <= granted_bytes, (c.frame_bytes, granted_bytes)
                assert len(c.records) <= 10_000
            assert c.offsets() == list(range(n))
            # Several rounds were needed: the byte credit did limit the frames.
            assert rounds >= 5, rounds
            assert c.frames >= 5

    run(main())


def test_zero_credit_sends_nothing(shared_broker: BrokerProcess, http: httpx.Client) -> None:
    topic = create_topic(http, "ws-zero")
    produce(http, topic, values(5), partition=0)

    async def main() -> None:
        async with session(shared_broker) as ws:
            await subscribe(ws, topics=[topic], **{"from": "earliest"})
            await quiet(ws, 0.5)
            await credit(ws, 0)
            await quiet(ws)
            await credit(ws, 0, 1_000_000)  # bytes alone carry no records
            await quiet(ws)
            produce(http, topic, values(2), partition=0)  # appends don't open the window
            await quiet(ws)
            await ping(ws)
            c = Consumer(ws)
            await credit(ws, 1)
            await c.until(1)
            await c.drain()
            assert c.offsets() == [0]

    run(main())


@pytest.mark.parametrize("fmt", ["json", "binary"])
def test_stalled_when_byte_credit_cannot_carry_one_record(
    shared_broker: BrokerProcess, http: httpx.Client, fmt: str
) -> None:
    topic = create_topic(http, f"ws-stalled-{fmt}")
    produce(http, topic, [{"value": "y" * 500}], partition=0)
    produce(http, topic, [{"value": "z" * 500}], partition=0)

    async def main() -> None:
        async with session(shared_broker) as ws:
            await subscribe(ws, topics=[topic], format=fmt, **{"from": "earliest"})
            await credit(ws, 10, 100)
            stalled = await expect(ws, "stalled")
            assert stalled["topic"] == topic and stalled["partition"] == 0, stalled
            assert stalled["needed_records"] == 1, stalled
            assert stalled["needed_bytes"] > 500, stalled
            assert (stalled["credit_records"], stalled["credit_bytes"]) == (10, 100), stalled
            await quiet(ws)  # said once, and nothing sent past the credit
            # Exactly the bytes needed: the record comes; the next one stalls again.
            c = Consumer(ws)
            await credit(ws, 0, stalled["needed_bytes"] - 100)
            await c.until(1)
            assert c.frame_bytes == stalled["needed_bytes"]
            await c.drain()
            assert c.offsets() == [0] and not c.other, c.other  # credit used up: silence
            # A grant still too small for the next record: stalled again, once.
            await credit(ws, 0, 50)
            again = await c.until_message("stalled")
            assert (again["credit_records"], again["credit_bytes"]) == (9, 50), again
            await c.drain()
            assert c.offsets() == [0] and not c.other, c.other

    run(main())


# -- binary frames -------------------------------------------------------------------------------


def test_binary_frames_carry_the_stored_batches(
    shared_broker: BrokerProcess, http: httpx.Client
) -> None:
    topic = create_topic(http, "ws-binary", partitions=2)
    sent = [
        kafka_batch([b"a0", b"a1", b"a2", b"a3", b"a4"], keys=[b"k"] * 5),
        kafka_batch([b"b0", None], headers=[[("h", b"1")], []]),
        kafka_batch([b"c0"], codec=1),  # gzip, kept compressed
    ]
    for batch in sent:
        r = http.post(
            f"/v1/topics/{topic}/partitions/1/records",
            content=batch,
            headers={"content-type": BATCH},
        )
        assert r.status_code == 200, r.text
    stored = http.get(
        f"/v1/topics/{topic}/partitions/1/records",
        params={"offset": 0},
        headers={"accept": BATCH},
    )
    assert stored.status_code == 200
    stored_batches = [
        stored.content[pos : pos + h.size_bytes] for pos, h in scan_batches(stored.content)
    ]
    assert len(stored_batches) == 3

    async def main() -> None:
        async with session(shared_broker) as ws:
            # From the middle of the first batch: the whole batch comes, to be skipped by offset.
            await subscribe(
                ws, partitions=[{"topic": topic, "partition": 1, "offset": 3}], format="binary"
            )
            c = Consumer(ws)
            await credit(ws, 100)
            await c.until(8)
            await c.drain()
            assert [b for _, _, b in c.binary_batches] == stored_batches
            assert {(t, p) for t, p, _ in c.binary_batches} == {(topic, 1)}
            assert c.offsets() == list(range(8))
            recs = [r for _, _, b in c.binary_batches for r in decode_records(b)]
            assert [r.value for r in recs] == [
                b"a0",
                b"a1",
                b"a2",
                b"a3",
                b"a4",
                b"b0",
                None,
                b"c0",
            ]
            assert [r.key for r in recs[:5]] == [b"k"] * 5
            assert recs[5].headers == (("h", b"1"),)
            # Live appends come as the batch that was stored.
            produce(http, topic, values(2, "live"), partition=1)
            await c.until(10)
            assert [v for *_, v in c.records[-2:]] == ["live0", "live1"]
            assert c.offsets()[-2:] == [8, 9]

    run(main())


# -- groups --------------------------------------------------------------------------------------


def test_join_gets_joined_assigned_and_records(
    shared_broker: BrokerProcess, http: httpx.Client
) -> None:
    topic = create_topic(http, "ws-join", partitions=3)
    for p in range(3):
        produce(http, topic, values(4, f"{p}-"), partition=p)
    group = unique("g")

    async def main() -> None:
        async with session(shared_broker) as ws:
            joined = await join(ws, group, [topic], auto_offset_reset="earliest")
            assert joined["generation"] >= 1
            assigned = await expect(ws, "assigned")
            assert tps(assigned) == {(topic, p) for p in range(3)}
            c = Consumer(ws)
            await credit(ws, 100)
            await c.until(12)
            for p in range(3):
                assert c.offsets(topic, p) == [0, 1, 2, 3]
            assert len(members(http, group)) == 1

    run(main())


def test_two_sockets_split_partitions_and_a_closed_one_leaves(
    shared_broker: BrokerProcess, http: httpx.Client
) -> None:
    topic = create_topic(http, "ws-split", partitions=4)
    group = unique("g")
    everything = {(topic, p) for p in range(4)}

    async def main() -> None:
        async with session(shared_broker) as a:
            await join(a, group, [topic])  # from latest
            ca = Consumer(a)
            assert tps(await ca.until_message("assigned")) == everything
            await credit(a, 1000)
            async with session(shared_broker) as b:
                await join(b, group, [topic])
                cb = Consumer(b)
                await credit(b, 1000)
                revoked = await ca.until_message("revoked")
                assert len(tps(revoked)) == 2, revoked
                await quiet(b)  # not before a released them
                await send(a, {"op": "ack"})
                got_b = await cb.until_message("assigned")
                assert tps(got_b) == tps(revoked)
                assert got_b["generation"] >= revoked["generation"]
                kept = everything - tps(revoked)
                for p in range(4):
                    produce(http, topic, values(3, f"{p}-"), partition=p)
                await ca.until(6)
                await cb.until(6)
                await ca.drain()
                await cb.drain()
                assert {(topic, p) for p in ca.partitions()} == kept
                assert {(topic, p) for p in cb.partitions()} == tps(got_b)
                for _, p, _, v in ca.records + cb.records:
                    assert v.startswith(f"{p}-")
            # b closed: a gets its partitions back, and their records.
            back = await ca.until_message("assigned")
            assert tps(back) == tps(got_b)
            for p in range(4):
                produce(http, topic, values(1, f"{p}-after-"), partition=p)
            await ca.until(10)
            await ca.drain()
            assert sorted(p for _, p, _, v in ca.records if "after" in v) == [0, 1, 2, 3]
            assert len(members(http, group)) == 1
        # a closed too: the group is empty.
        deadline = time.monotonic() + 5
        while members(http, group):
            assert time.monotonic() < deadline, "closing a socket did not leave the group"
            await asyncio.sleep(0.05)

    run(main())


def test_auto_ack_releases_revoked_partitions(
    shared_broker: BrokerProcess, http: httpx.Client
) -> None:
    topic = create_topic(http, "ws-autoack", partitions=2)
    group = unique("g")

    async def main() -> None:
        async with session(shared_broker) as a, session(shared_broker) as b:
            await join(a, group, [topic], auto_ack=True)
            assert len(tps(await expect(a, "assigned"))) == 2
            await join(b, group, [topic], auto_ack=True)
            revoked = await expect(a, "revoked")  # and released without an ack
            assigned = await expect(b, "assigned")
            assert tps(assigned) == tps(revoked) and len(tps(revoked)) == 1

    run(main())


def test_commit_then_a_new_socket_resumes_from_the_committed_offset(
    shared_broker: BrokerProcess, http: httpx.Client
) -> None:
    topic = create_topic(http, "ws-resume", partitions=2)
    for p in range(2):
        produce(http, topic, values(10, f"{p}-"), partition=p)
    group = unique("g")

    async def main() -> None:
        async with session(shared_broker) as ws:
            await join(ws, group, [topic], auto_offset_reset="earliest", format="binary")
            c = Consumer(ws)
            await credit(ws, 1000)
            await c.until(20)
            # Processed 0..5 of p0 and 0..3 of p1: commit the next offsets.
            await send(
                ws,
                {
                    "op": "commit",
                    "id": 1,
                    "offsets": [
                        {"topic": topic, "partition": 0, "offset": 6, "metadata": "m"},
                        {"topic": topic, "partition": 1, "offset": 4},
                    ],
                },
            )
            assert await c.until_message("committed") == {"type": "committed", "id": 1, "count": 2}
        offsets = http.get(f"/v1/groups/{group}/offsets").json()["offsets"]
        assert {(o["partition"], o["offset"], o["metadata"]) for o in offsets} == {
            (0, 6, "m"),
            (1, 4, ""),
        }
        produce(http, topic, [{"value": "0-new"}], partition=0)
        async with session(shared_broker) as ws:
            await join(ws, group, [topic], auto_offset_reset="earliest")
            c = Consumer(ws)
            await credit(ws, 1000)
            await c.until(5 + 6)
            await c.drain()
            assert c.offsets(topic, 0) == [6, 7, 8, 9, 10]
            assert c.offsets(topic, 1) == [4, 5, 6, 7, 8, 9]

    run(main())


def test_explicit_subscription_commits_to_a_named_group(
    shared_broker: BrokerProcess, http: httpx.Client
) -> None:
    topic = create_topic(http, "ws-commit")
    produce(http, topic, values(5), partition=0)
    group = unique("g")
    busy = unique("g")

    async def main() -> None:
        async with session(shared_broker) as member:
            await join(member, busy, [topic])
            async with session(shared_broker) as ws:
                await subscribe(ws, topics=[topic], **{"from": "earliest"})
                c = Consumer(ws)
                await credit(ws, 10)
                await c.until(5)
                await send(
                    ws,
                    {
                        "op": "commit",
                        "id": "c1",
                        "group": group,
                        "offsets": [{"topic": topic, "partition": 0, "offset": 5}],
                    },
                )
                assert await c.until_message("committed") == {
                    "type": "committed",
                    "id": "c1",
                    "count": 1,
                }
                # A group with active members takes no standalone commit.
                await send(
                    ws,
                    {
                        "op": "commit",
                        "id": "c2",
                        "group": busy,
                        "offsets": [{"topic": topic, "partition": 0, "offset": 1}],
                    },
                )
                await expect_error(ws, "c2", "UNKNOWN_MEMBER_ID", 404)
                await ping(ws)

    run(main())
    r = http.get(f"/v1/groups/{group}/offsets")
    assert r.status_code == 200, r.text
    assert [(o["topic"], o["partition"], o["offset"]) for o in r.json()["offsets"]] == [
        (topic, 0, 5)
    ]
    assert http.get(f"/v1/groups/{busy}/offsets").json()["offsets"] == []


# -- produce -------------------------------------------------------------------------------------


def test_produce_over_the_socket(shared_broker: BrokerProcess, http: httpx.Client) -> None:
    topic = create_topic(http, "ws-produce", partitions=2)

    async def main() -> None:
        async with session(shared_broker) as ws:
            await send(
                ws,
                {
                    "op": "produce",
                    "id": "p1",
                    "topic": topic,
                    "partition": 1,
                    "records": [{"key": "k", "value": {"n": 1}}, {"value": "two"}],
                },
            )
            doc = await expect(ws, "produced")
            assert doc["id"] == "p1"
            assert doc["offsets"] == [{"partition": 1, "offset": 0}, {"partition": 1, "offset": 1}]
            await send(
                ws,
                {
                    "op": "produce",
                    "id": "p2",
                    "topic": topic,
                    "acks": "all",
                    "records": [{"value": "x", "partition": 0}],
                },
            )
            assert (await expect(ws, "produced"))["offsets"] == [{"partition": 0, "offset": 0}]
            # Bad produces: an error message with the problem's code; the socket stays open.
            bad: list[tuple[Msg, str, int]] = [
                (
                    {"topic": unique("nope"), "records": [{"value": 1}]},
                    "UNKNOWN_TOPIC_OR_PARTITION",
                    404,
                ),
                (
                    {"topic": topic, "partition": 9, "records": [{"value": 1}]},
                    "UNKNOWN_TOPIC_OR_PARTITION",
                    404,
                ),
                ({"topic": topic, "records": "nope"}, "INVALID_REQUEST", 400),
                ({"topic": topic, "records": [{"value_b64": "!!"}]}, "INVALID_REQUEST", 400),
                ({"topic": topic, "records": [{"bogus": 1}]}, "INVALID_REQUEST", 400),
                ({"topic": topic, "acks": "2", "records": [{"value": 1}]}, "INVALID_REQUEST", 400),
            ]
            for body, code, status in bad:
                await send(ws, {"op": "produce", "id": "bad", **body})
                await expect_error(ws, "bad", code, status)
            await ping(ws)
            # The same socket consumes what it produced.
            await subscribe(ws, partitions=[{"topic": topic, "partition": 1, "offset": 0}])
            c = Consumer(ws)
            await credit(ws, 10)
            await c.until(2)
            assert [v for *_, v in c.records] == [{"n": 1}, "two"]

    run(main())
    r = http.get(f"/v1/topics/{topic}/partitions/1/records", params={"offset": 0})
    assert [x["value"] for x in r.json()["records"]] == [{"n": 1}, "two"]


# -- close codes ---------------------------------------------------------------------------------


def test_close_codes(shared_broker: BrokerProcess, http: httpx.Client) -> None:
    topic = create_topic(http, "ws-close", partitions=2)
    produce(http, topic, values(3), partition=0)
    missing = unique("missing")
    cases: list[tuple[str, list[Msg], int]] = [
        ("unknown topic", [{"op": "subscribe", "topics": [missing]}], 4404),
        (
            "unknown topic partition",
            [{"op": "subscribe", "partitions": [{"topic": missing, "partition": 0}]}],
            4404,
        ),
        ("join unknown topic", [{"op": "join", "group": "g", "topics": [missing]}], 4404),
        (
            "unknown partition",
            [{"op": "subscribe", "partitions": [{"topic": topic, "partition": 2}]}],
            4400,
        ),
        (
            "offset past the end",
            [{"op": "subscribe", "partitions": [{"topic": topic, "partition": 0, "offset": 4}]}],
            4400,
        ),
        ("nothing to subscribe to", [{"op": "subscribe"}], 4400),
        (
            "subscribe after join",
            [
                {"op": "join", "group": unique("g"), "topics": [topic]},
                {"op": "subscribe", "topics": [topic]},
            ],
            4400,
        ),
        (
            "join after subscribe",
            [
                {"op": "subscribe", "topics": [topic]},
                {"op": "join", "group": unique("g"), "topics": [topic]},
            ],
            4400,
        ),
    ]

    async def one(name: str, messages: list[Msg], code: int) -> None:
        async with session(shared_broker) as ws:
            for m in messages:
                await send(ws, m)
            got, reason = await closed_with(ws)
            assert got == code, (name, got, reason)
            assert reason, name

    async def main() -> None:
        await asyncio.gather(*(one(*case) for case in cases))

    run(main())

    # An offset at the end of the log is fine (the next record's).
    async def at_end() -> None:
        async with session(shared_broker) as ws:
            sub = await subscribe(ws, partitions=[{"topic": topic, "partition": 0, "offset": 3}])
            assert sub["partitions"][0]["offset"] == 3

    run(at_end())


def test_an_idle_member_socket_keeps_its_session(
    shared_broker: BrokerProcess, http: httpx.Client
) -> None:
    """No credit, no messages from the client: the socket still heartbeats for the member."""
    topic = create_topic(http, "ws-idle")
    group = unique("g")

    async def main() -> None:
        async with session(shared_broker) as ws:
            await join(ws, group, [topic], session_timeout_ms=300)
            await expect(ws, "assigned")
            await quiet(ws, 1.2)  # four session timeouts
            (m,) = members(http, group)
            assert m["assignment"] == [{"topic": topic, "partition": 0}], m
            await send(ws, {"op": "unsubscribe", "id": "u"})
            assert await expect(ws, "unsubscribed") == {"type": "unsubscribed", "id": "u"}
            assert members(http, group) == []
            # No longer a member: it may subscribe now.
            await subscribe(ws, topics=[topic])

    run(main())


# -- known bugs ----------------------------------------------------------------------------------


def broker_reads(broker: BrokerProcess) -> int:
    """Read syscalls the broker process made so far (Linux /proc/PID/io): a busy loop over a
    partition shows as thousands a second, an idle broker as none, however loaded the machine
    (CPU time would depend on how much of it the busy loop gets)."""
    assert broker.proc is not None
    io = Path(f"/proc/{broker.proc.pid}/io").read_text()
    fields = dict(line.split(": ") for line in io.splitlines())
    return int(fields["syscr"])


def test_broker_errors_are_typed_error_messages(
    shared_broker: BrokerProcess, http: httpx.Client
) -> None:
    topic = create_topic(http, "ws-errtype")

    async def main() -> None:
        async with session(shared_broker) as ws:
            await send(ws, {"op": "produce", "id": 1, "topic": unique("nope"), "records": []})
            doc = await recv_json(ws)
            assert doc["code"] == "UNKNOWN_TOPIC_OR_PARTITION", doc
            assert doc["type"] == "error", doc
            await send(
                ws,
                {
                    "op": "commit",
                    "id": 2,
                    "offsets": [{"topic": topic, "partition": 0, "offset": 0}],
                },
            )
            doc = await recv_json(ws)
            assert doc["code"] == "INVALID_REQUEST", doc
            assert doc["type"] == "error", doc

    run(main())


@pytest.mark.parametrize("fmt", ["json", "binary"])
def test_a_stalled_session_is_idle(
    shared_broker: BrokerProcess, http: httpx.Client, fmt: str
) -> None:
    topic = create_topic(http, f"ws-stall-cpu-{fmt}")
    produce(http, topic, [{"value": "x" * 500} for _ in range(3)], partition=0)

    async def main() -> int:
        async with session(shared_broker) as ws:
            await subscribe(ws, topics=[topic], format=fmt, **{"from": "earliest"})
            if fmt == "json":
                await credit(ws, 10, 100)  # bytes for no record
            else:
                await credit(ws, 2)  # records for less than the batch of 3
            await expect(ws, "stalled")
            before = broker_reads(shared_broker)
            await quiet(ws, 1.0)
            return broker_reads(shared_broker) - before

    reads = run(main())
    assert reads < 200, f"the broker made {reads} read syscalls in 1 s waiting for credit"


def test_a_deleted_topic_is_reported_not_an_internal_error(
    shared_broker: BrokerProcess, http: httpx.Client
) -> None:
    topic = create_topic(http, "ws-deleted")
    other = create_topic(http, "ws-deleted-other")

    async def main() -> None:
        async with session(shared_broker) as ws:
            await subscribe(ws, topics=[topic, other])
            await credit(ws, 100)
            await quiet(ws)
            assert http.delete(f"/v1/topics/{topic}").status_code == 204
            try:
                # An error message about the deleted topic (the socket goes on with the
                # rest), or a close with the unknown-topic code; never 1011.
                doc = await recv_json(ws)
            except ConnectionClosed as e:
                assert e.rcvd is not None and e.rcvd.code == 4404, e
                return
            assert doc.get("code") == "UNKNOWN_TOPIC_OR_PARTITION", doc
            await ping(ws)
            c = Consumer(ws)
            produce(http, other, values(1), partition=0)
            await c.until(1)

    run(main())


def test_no_committed_offset_and_reset_none_is_an_error_message(
    shared_broker: BrokerProcess, http: httpx.Client
) -> None:
    topic = create_topic(http, "ws-reset-none")
    produce(http, topic, values(3), partition=0)
    group = unique("g")

    async def main() -> None:
        async with session(shared_broker) as ws:
            await join(ws, group, [topic], auto_offset_reset="none")
            await expect(ws, "assigned")
            await credit(ws, 100)
            doc = await recv_json(ws)
            assert doc.get("code") == "OFFSET_OUT_OF_RANGE", doc
            assert (doc.get("topic"), doc.get("partition")) == (topic, 0), doc
            await ping(ws)

    run(main())


def test_compression_is_declined_by_default(shared_broker: BrokerProcess) -> None:
    """permessage-deflate costs 2.3-2.7x the broker's CPU for binary push; it is off unless
    LOGBUS_WS_COMPRESSION is set, even for clients (browsers) that offer it."""

    async def handshake() -> str | None:
        async with connect(ws_url(shared_broker), compression="deflate", open_timeout=10) as ws:
            assert ws.response is not None
            return ws.response.headers.get("Sec-WebSocket-Extensions")

    assert asyncio.run(handshake()) is None
