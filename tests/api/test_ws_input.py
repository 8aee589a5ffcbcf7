"""Bad WebSocket messages get an ``error`` message and the socket stays open; a second
subscription to one partition closes it with 4400 (as docs/api.md says)."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import httpx
import pytest
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed

from tests.api.helpers import create_topic
from tests.server import BrokerProcess

DEEP = 100_000


def ws_url(broker: BrokerProcess) -> str:
    return broker.url.replace("http://", "ws://") + "/v1/ws"


async def reply(ws: ClientConnection) -> dict[str, Any]:
    doc: dict[str, Any] = json.loads(await asyncio.wait_for(ws.recv(), 10))
    return doc


async def still_open(ws: ClientConnection) -> None:
    await ws.send(json.dumps({"op": "ping", "id": "after"}))
    assert await reply(ws) == {"type": "pong", "id": "after"}


@pytest.mark.parametrize(
    "message",
    [
        '{"op":"produce","topic":"t","records":' + "[" * DEEP + "]" * DEEP + "}",
        '{"op":"ping","id":' + "[" * DEEP + "]" * DEEP + "}",
        b'{"op":"ping","id":"\xff"}',  # a binary frame that is not UTF-8
        b"\xff\xfe",
    ],
    ids=["deep-produce", "deep-id", "binary-bad-utf8", "binary-garbage"],
)
def test_bad_messages_get_an_error_not_a_1011(
    shared_broker: BrokerProcess, message: str | bytes
) -> None:
    async def run() -> None:
        async with connect(ws_url(shared_broker), open_timeout=10, max_size=None) as ws:
            await ws.send(message)
            doc = await reply(ws)
            assert doc["type"] == "error", doc
            assert doc["code"] == "INVALID_REQUEST", doc
            await still_open(ws)

    asyncio.run(run())


def test_invalid_utf8_inside_a_produced_value_is_an_error(
    http: httpx.Client, shared_broker: BrokerProcess
) -> None:
    topic = create_topic(http, "wsutf8")

    async def run() -> None:
        async with connect(ws_url(shared_broker), open_timeout=10) as ws:
            raw = b'{"op":"produce","id":7,"topic":"%s","records":[{"value":"\xff"}]}' % (
                topic.encode()
            )
            await ws.send(raw)
            doc = await reply(ws)
            assert doc["type"] == "error" and doc["id"] == 7, doc
            await still_open(ws)

    asyncio.run(run())
    assert http.get(f"/v1/topics/{topic}/partitions").json()[0]["log_end_offset"] == 0


def test_subscribing_twice_to_a_partition_is_4400(
    http: httpx.Client, shared_broker: BrokerProcess
) -> None:
    topic = create_topic(http, "wstwice", partitions=2)
    first = {"op": "subscribe", "id": 1, "partitions": [{"topic": topic, "partition": 0}]}
    second = {"op": "subscribe", "id": 2, "topics": [topic]}  # includes partition 0 again

    async def run() -> int | None:
        async with connect(ws_url(shared_broker), open_timeout=10) as ws:
            await ws.send(json.dumps(first))
            assert (await reply(ws))["type"] == "subscribed"
            await ws.send(json.dumps(second))
            try:
                while True:
                    await reply(ws)
            except ConnectionClosed as e:
                return e.rcvd.code if e.rcvd is not None else None
        return None

    assert asyncio.run(run()) == 4400
