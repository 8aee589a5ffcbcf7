"""WebSocket and SSE pushes to a client over its ``consumer_byte_rate`` slow down to the quota.

A real broker with short quota windows (3 x 1 s): a topic holds far more than the client may
read in the test, and a consumer with a quota reads it from the start over a WebSocket and
over SSE. The broker paces each chunk it sends (:class:`api.quota_gate._Pacer`: the push waits
out the throttle before its next send, so it does not read ahead or buffer for the client).

What is asserted, with no absolute timing: at every moment, what the client has received is at
most what its quota allows since the stream began — a burst (a new client may take one
window's worth at once; the bound allows the whole span's, 3 windows, for a loaded machine)
plus the rate times the time elapsed, and 25 % for clocks — before the message that carried
it over; and the stream keeps delivering past the
burst (it is slowed, not stopped). Without pacing the whole topic arrives at once, far above
the bound (checked by the first assertion's message on failure).
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterator

import httpx
import pytest
from websockets.asyncio.client import connect

from tests.server import BrokerProcess

RATE = 40_000  # consumer_byte_rate, bytes/s
WINDOWS = 3
RECORD = 4_000  # value bytes per record
RECORDS = 200  # 800 KB in the topic: 20 s of quota, far more than a test reads
CHUNK = 16_384  # max_bytes of a push (what one send may carry)
PAST_BURST = 2  # read until this many bursts' worth has arrived


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    tmp = tmp_path_factory.mktemp("quota-streams")
    env = {"LOGBUS_QUOTA_WINDOW_NUM": str(WINDOWS), "LOGBUS_QUOTA_WINDOW_SIZE_SECONDS": "1"}
    b = BrokerProcess(tmp / "data", None, env=env)
    b.start()
    try:
        assert httpx.post(f"{b.url}/v1/topics", json={"name": "big"}).status_code == 201
        for _ in range(RECORDS // 20):
            body = {"records": [{"value": "v" * RECORD} for _ in range(20)]}
            assert httpx.post(f"{b.url}/v1/topics/big/records", json=body).status_code == 200
        yield b
    finally:
        b.kill()


def _set_quota(b: BrokerProcess, client_id: str) -> None:
    quota = {"entity": {"client_id": client_id}, "quotas": {"consumer_byte_rate": RATE}}
    assert httpx.put(f"{b.url}/v1/quotas", json=quota).status_code == 200


def _check(arrivals: list[tuple[float, int]]) -> None:
    """Each message was sent while the client was within its allowance: the bytes received
    before it are at most the burst plus the rate times the time since the first arrival (one
    message may carry the client over, as one Kafka response may; the next waits); and
    delivery went on past the burst."""
    burst = RATE * WINDOWS
    t0 = arrivals[0][0]
    before = 0
    for t, total in arrivals:
        allowed = (burst + RATE * (t - t0)) * 1.25
        assert before <= allowed, (
            f"{before} bytes before {t - t0:.2f} s, allowed {allowed:.0f}: {arrivals[:8]}"
        )
        before = total
    assert arrivals[-1][1] >= PAST_BURST * burst


def test_a_websocket_push_slows_to_the_quota(broker: BrokerProcess) -> None:
    _set_quota(broker, "ws-slow")
    url = f"ws://127.0.0.1:{broker.port}/v1/ws?client_id=ws-slow"

    async def read() -> list[tuple[float, int]]:
        arrivals: list[tuple[float, int]] = []
        total = 0
        async with connect(url, max_size=None, open_timeout=10) as ws:
            subscribe = {"op": "subscribe", "id": 1, "topics": ["big"], "from": "earliest"}
            await ws.send(json.dumps(subscribe))
            await ws.send(json.dumps({"op": "credit", "records": 10**6}))
            while total < PAST_BURST * RATE * WINDOWS:
                message = await asyncio.wait_for(ws.recv(), 30)
                if isinstance(message, str) and '"records"' not in message[:40]:
                    continue  # subscribed, pong...
                total += len(message)
                arrivals.append((time.monotonic(), total))
        return arrivals

    _check(asyncio.run(read()))


def test_an_sse_push_slows_to_the_quota(broker: BrokerProcess) -> None:
    _set_quota(broker, "sse-slow")
    params = {"offset": 0, "client_id": "sse-slow", "max_bytes": CHUNK}
    arrivals: list[tuple[float, int]] = []
    total = 0
    timeout = httpx.Timeout(10.0, read=30.0)
    with httpx.stream(
        "GET",
        f"{broker.url}/v1/topics/big/partitions/0/records",
        params=params,
        headers={"accept": "text/event-stream"},
        timeout=timeout,
    ) as r:
        assert r.status_code == 200
        for chunk in r.iter_raw():
            total += len(chunk)
            arrivals.append((time.monotonic(), total))
            if total >= PAST_BURST * RATE * WINDOWS:
                break
    _check(arrivals)
