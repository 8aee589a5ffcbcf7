"""Long-poll fetch: wait_ms and min_bytes, wake-up on produce, many waiters at once."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

from tests.api.conftest import make_client, start_broker
from tests.api.helpers import (
    BATCH,
    NDJSON,
    PROBLEM,
    create_topic,
    fetch,
    ndjson_lines,
    produce,
)
from tests.server import BrokerProcess


@pytest.fixture(scope="module")
def pool() -> Iterator[ThreadPoolExecutor]:
    with ThreadPoolExecutor(max_workers=4) as p:
        yield p


def timed_fetch(
    url: str, topic: str, offset: int, accept: str = "application/json", **params: object
) -> tuple[httpx.Response, float]:
    """A fetch on its own connection; returns the answer and the monotonic time it arrived."""
    with httpx.Client(base_url=url, timeout=70) as c:
        r = c.get(
            f"/v1/topics/{topic}/partitions/0/records",
            params={"offset": offset, **params},
            headers={"accept": accept},
        )
        return r, time.monotonic()


def wait_pending(future: Future[tuple[httpx.Response, float]], seconds: float) -> None:
    """Give a long-poll time to park, and check it is still waiting."""
    time.sleep(seconds)
    assert not future.done(), future.result()[0].text


def test_long_poll_wakes_soon_after_a_produce(
    http: httpx.Client, shared_broker: BrokerProcess, pool: ThreadPoolExecutor
) -> None:
    topic = create_topic(http, "wake")
    produce(http, topic, [{"value": "old"}])
    started = time.monotonic()
    future = pool.submit(timed_fetch, shared_broker.url, topic, 1, wait_ms=10_000)
    wait_pending(future, 0.5)
    produce(http, topic, [{"value": "new"}])
    produced = time.monotonic()
    r, arrived = future.result(timeout=15)
    assert r.status_code == 200, r.text
    assert [x["value"] for x in r.json()["records"]] == ["new"]
    assert r.headers["logbus-next-offset"] == "2"
    assert r.headers["logbus-high-watermark"] == "2"
    latency = arrived - produced
    assert latency < 2.0, f"woke {latency:.3f}s after the produce"
    assert arrived - started < 8.0  # did not sit out the 10 s


@pytest.mark.parametrize("accept", [NDJSON, BATCH])
def test_long_poll_in_every_format(
    http: httpx.Client, shared_broker: BrokerProcess, pool: ThreadPoolExecutor, accept: str
) -> None:
    topic = create_topic(http, "wakefmt")
    future = pool.submit(timed_fetch, shared_broker.url, topic, 0, accept, wait_ms=10_000)
    wait_pending(future, 0.3)
    produce(http, topic, [{"value": "v"}])
    produced = time.monotonic()
    r, arrived = future.result(timeout=15)
    assert r.status_code == 200
    assert arrived - produced < 2.0
    if accept == NDJSON:
        assert [x["value"] for x in ndjson_lines(r.text)] == ["v"]
    else:
        assert len(r.content) > 61 and int.from_bytes(r.content[:8], "big") == 0
    assert r.headers["logbus-next-offset"] == "1"


def test_long_poll_without_produce_returns_empty_after_wait_ms(
    http: httpx.Client, shared_broker: BrokerProcess
) -> None:
    topic = create_topic(http, "timeout")
    produce(http, topic, [{"value": 1}, {"value": 2}])
    wait_ms = 1500
    started = time.monotonic()
    r, arrived = timed_fetch(shared_broker.url, topic, 2, wait_ms=wait_ms)
    elapsed = arrived - started
    assert r.status_code == 200
    assert r.json() == {
        "records": [],
        "next_offset": 2,
        "high_watermark": 2,
        "log_start_offset": 0,
        "lag": 0,
    }
    assert r.headers["logbus-next-offset"] == "2"
    assert elapsed >= wait_ms / 1000 * 0.9, elapsed
    assert elapsed < wait_ms / 1000 + 3.0, elapsed


def test_no_wait_when_data_is_there_or_wait_ms_is_zero(
    http: httpx.Client, shared_broker: BrokerProcess
) -> None:
    topic = create_topic(http, "nowait")
    produce(http, topic, [{"value": 1}])
    started = time.monotonic()
    r, arrived = timed_fetch(shared_broker.url, topic, 0, wait_ms=10_000)
    assert [x["value"] for x in r.json()["records"]] == [1]
    assert arrived - started < 2.0
    started = time.monotonic()
    r, arrived = timed_fetch(shared_broker.url, topic, 1)  # wait_ms defaults to 0
    assert r.json()["records"] == []
    assert arrived - started < 2.0
    started = time.monotonic()
    r, arrived = timed_fetch(shared_broker.url, topic, 1, wait_ms=10_000, min_bytes=0)
    assert r.json()["records"] == []
    assert arrived - started < 2.0


def test_min_bytes_waits_until_enough_bytes(
    http: httpx.Client, shared_broker: BrokerProcess, pool: ThreadPoolExecutor
) -> None:
    topic = create_topic(http, "minbytes")
    started = time.monotonic()
    future = pool.submit(timed_fetch, shared_broker.url, topic, 0, wait_ms=15_000, min_bytes=4000)
    wait_pending(future, 0.3)
    produce(http, topic, [{"value": "small"}])  # ~80 bytes: not enough
    wait_pending(future, 0.7)
    produce(http, topic, [{"value": "x" * 1500}])  # still below 4000 in all
    wait_pending(future, 0.7)
    produce(http, topic, [{"value": "y" * 5000}])
    produced = time.monotonic()
    r, arrived = future.result(timeout=20)
    assert r.status_code == 200
    values = [x["value"] for x in r.json()["records"]]
    assert values == ["small", "x" * 1500, "y" * 5000]
    assert arrived - produced < 2.0
    assert arrived - started < 12.0
    # Already enough bytes: no wait.
    started = time.monotonic()
    r, arrived = timed_fetch(shared_broker.url, topic, 0, wait_ms=10_000, min_bytes=4000)
    assert len(r.json()["records"]) == 3
    assert arrived - started < 2.0


def test_min_bytes_not_reached_returns_what_there_is_after_wait_ms(
    http: httpx.Client, shared_broker: BrokerProcess
) -> None:
    topic = create_topic(http, "minbytes2")
    produce(http, topic, [{"value": "a"}])
    started = time.monotonic()
    r, arrived = timed_fetch(shared_broker.url, topic, 0, wait_ms=1000, min_bytes=1_000_000)
    assert [x["value"] for x in r.json()["records"]] == ["a"]
    assert 0.9 <= arrived - started < 5.0


def test_500_concurrent_long_polls_all_wake_on_one_produce(
    http: httpx.Client, shared_broker: BrokerProcess
) -> None:
    topic = create_topic(http, "herd")
    n = 500
    wait_ms = 40_000  # a timed-out fetch also returns the record: only timing tells

    async def run() -> tuple[list[tuple[httpx.Response, float]], float, int]:
        limits = httpx.Limits(max_connections=n + 10, max_keepalive_connections=n + 10)
        async with httpx.AsyncClient(
            base_url=shared_broker.url, limits=limits, timeout=60
        ) as client:

            async def poll() -> tuple[httpx.Response, float]:
                r = await client.get(
                    f"/v1/topics/{topic}/partitions/0/records",
                    params={"offset": 0, "wait_ms": wait_ms},
                )
                return r, time.monotonic()

            tasks = [asyncio.create_task(poll()) for _ in range(n)]
            await asyncio.sleep(3.0)  # let every connection open and park
            done_early = sum(t.done() for t in tasks)
            await asyncio.to_thread(produce, http, topic, [{"value": "wake up"}])
            produced = time.monotonic()
            results = await asyncio.gather(*tasks)
            return results, produced, done_early

    results, produced, done_early = asyncio.run(run())
    assert done_early == 0, f"{done_early} long-polls answered before any data"
    assert len(results) == n
    for r, _ in results:
        assert r.status_code == 200, r.text
        assert [x["value"] for x in r.json()["records"]] == ["wake up"]
    slowest = max(arrived for _, arrived in results) - produced
    # The broker wakes them all within ~0.1 s; most of this bound is httpx handling 500
    # answers at once on a small machine. Far below wait_ms: none of them timed out.
    assert slowest < 20.0, f"the last long-poll woke {slowest:.2f}s after the produce"


def test_long_poll_on_a_deleted_topic_answers_404_promptly(
    http: httpx.Client, shared_broker: BrokerProcess, pool: ThreadPoolExecutor
) -> None:
    topic = create_topic(http, "delwait")
    future = pool.submit(timed_fetch, shared_broker.url, topic, 0, wait_ms=4000)
    wait_pending(future, 0.5)
    assert http.delete(f"/v1/topics/{topic}").status_code == 204
    deleted = time.monotonic()
    r, arrived = future.result(timeout=15)
    assert r.status_code == 404, (r.status_code, r.text)
    assert r.json()["code"] == "UNKNOWN_TOPIC_OR_PARTITION"
    assert arrived - deleted < 1.5


def test_graceful_stop_answers_pending_long_polls_promptly(tmp_path: Path) -> None:
    broker = start_broker(tmp_path / "data")
    try:
        with make_client(broker) as c:
            topic = create_topic(c, "stopwait")
        with ThreadPoolExecutor(max_workers=1) as pool:
            future = pool.submit(timed_fetch, broker.url, topic, 0, wait_ms=30_000)
            wait_pending(future, 0.5)
            started = time.monotonic()
            broker.stop()
            stopped = time.monotonic() - started
            try:
                r, _ = future.result(timeout=30)
                answer: str = f"{r.status_code} {r.headers.get('content-type')} {r.text[:80]}"
                ok = r.status_code == 200 or r.headers.get("content-type", "") == PROBLEM
            except httpx.TransportError as e:
                answer, ok = repr(e), False
        assert stopped < 5.0, f"stop took {stopped:.1f}s"
        assert ok, answer
    finally:
        broker.kill()


def test_fetch_beyond_wait_limit_is_rejected(http: httpx.Client) -> None:
    topic = create_topic(http, "waitlimit")
    r = fetch(http, topic, 0, 0, wait_ms=60_001)
    assert r.status_code == 400
