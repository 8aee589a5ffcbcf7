"""Compression amplification: a few KB on the wire must not become hundreds of MB in the broker.

Produce caps the records a compressed batch expands to (``LogConfig.max_decompressed_bytes``:
16 x max.message.bytes, at most 64 MiB) and decompresses off the event loop; JSON, NDJSON and
SSE answers and WebSocket JSON frames stop once they hold ``max_bytes`` of rendered records
(at least one record). The figures, before and after: ``python -m benchmarks.amplification``.
"""

from __future__ import annotations

import asyncio
import base64
import json
import threading
import time

import httpx
import pytest
from websockets.asyncio.client import connect

from benchmarks.amplification import peak_rss_bytes, zstd_bomb
from core_log.batch import Record, build_batch
from core_log.compression import Compression
from core_log.limits import MAX_DECOMPRESSED_BATCH_RATIO
from tests.api.helpers import BATCH, NDJSON, assert_problem, create_topic
from tests.server import BrokerProcess


@pytest.fixture(scope="module")
def bomb() -> bytes:
    data = zstd_bomb()
    assert len(data) < 16 * 1024, len(data)
    return data


def log_end(http: httpx.Client, topic: str) -> int:
    r = http.get(f"/v1/topics/{topic}/partitions/0/records", params={"offset": 0})
    assert r.status_code == 200, r.text
    return int(r.headers["Logbus-High-Watermark"])


@pytest.mark.parametrize("idempotency_key", [None, "bomb-1"])
def test_a_zstd_bomb_is_rejected_at_produce_and_appends_nothing(
    http: httpx.Client, bomb: bytes, idempotency_key: str | None
) -> None:
    topic = create_topic(http, "bomb")
    headers = {"content-type": BATCH}
    if idempotency_key is not None:
        headers["idempotency-key"] = f"{idempotency_key}-{topic}"
    r = http.post(f"/v1/topics/{topic}/partitions/0/records", content=bomb, headers=headers)
    body = assert_problem(r, 413, "MESSAGE_TOO_LARGE")
    assert "decompresses to more than" in body["detail"]
    assert str(MAX_DECOMPRESSED_BATCH_RATIO) in body["detail"]
    assert log_end(http, topic) == 0
    # a compressed batch within the cap is still welcome
    ok = build_batch([Record(b"y" * 1_000_000)], compression=Compression.ZSTD)
    r = http.post(f"/v1/topics/{topic}/partitions/0/records", content=ok, headers=headers)
    assert r.status_code == 200, r.text
    assert log_end(http, topic) == 1


def test_a_topic_with_a_larger_max_message_bytes_takes_larger_decompressed_batches(
    http: httpx.Client,
) -> None:
    topic = create_topic(http, "bomb-big", configs={"max.message.bytes": 2_000_000})
    two_mib_cap = zstd_bomb(20 * 1024 * 1024)  # over 16 x 1 MiB, under 16 x 2 MB
    r = http.post(
        f"/v1/topics/{topic}/partitions/0/records",
        content=two_mib_cap,
        headers={"content-type": BATCH},
    )
    assert r.status_code == 200, r.text


def test_healthz_stays_responsive_while_bombs_are_produced(
    http: httpx.Client, shared_broker: BrokerProcess, bomb: bytes
) -> None:
    """Before the cap and the worker thread, each bomb blocked the loop 1-2 s (four in one
    request: 4-8 s); a generous 2 s bound still catches that without timing the machine."""
    topic = create_topic(http, "bomb-loop")
    body = bomb * 4  # four batches back to back: validated whole before anything is appended
    done = threading.Event()
    sampled = threading.Event()  # /healthz answered 3 times while bombs were being sent
    answers: list[int] = []

    def send() -> None:
        # At least 3 requests, and on until /healthz was asked 3 times meanwhile: on a fast
        # machine 3 bombs were refused before the loop below had asked twice.
        try:
            with httpx.Client(base_url=shared_broker.url, timeout=60.0) as c:
                while len(answers) < 3 or (not sampled.is_set() and len(answers) < 200):
                    r = c.post(
                        f"/v1/topics/{topic}/partitions/0/records",
                        content=body,
                        headers={"content-type": BATCH},
                    )
                    answers.append(r.status_code)
        finally:
            done.set()

    sender = threading.Thread(target=send, daemon=True)
    sender.start()
    worst = 0.0
    samples = 0
    while not done.is_set():
        t0 = time.monotonic()
        assert http.get("/healthz").status_code == 200
        worst = max(worst, time.monotonic() - t0)
        samples += 1
        if samples >= 3:
            sampled.set()
        done.wait(0.02)
    sender.join()
    assert len(answers) >= 3 and set(answers) == {413}, answers
    assert samples >= 3
    assert worst < 2.0, f"/healthz took {worst:.2f}s while bombs were produced"


# -- answers bounded in rendered bytes ----------------------------------------------------------

MIB = 1024 * 1024
BATCHES = 60
RECORDS_PER_BATCH = 8  # of 1 MiB each: 8 MiB of records per 438-byte batch, 480 MiB in all
# What one answer may add to the broker's peak RSS: one batch decompressed (8 MiB), its records
# rendered (11 MiB of base64), the answer and allocator slack. Before the budget a 1 MiB fetch
# rendered all 480 MiB (640 MB of JSON), the SSE stream decoded them all into records.
RSS_GROWTH_MAX_BYTES = 200 * MIB
ENVELOPE_BYTES = 1024  # the JSON answer's members besides the records


@pytest.fixture(scope="module")
def compressible(http: httpx.Client) -> str:
    """A topic of 480 records of 1 MiB that take 26 KB on disk."""
    topic = create_topic(http, "compressible", configs={"max.message.bytes": MIB})
    body = b"".join(
        build_batch(
            [Record(b"a" * MIB) for _ in range(RECORDS_PER_BATCH)],
            base_offset=RECORDS_PER_BATCH * i,
            compression=Compression.ZSTD,
        )
        for i in range(BATCHES)
    )
    assert len(body) < 64 * 1024
    r = http.post(
        f"/v1/topics/{topic}/partitions/0/records", content=body, headers={"content-type": BATCH}
    )
    assert r.status_code == 200, r.text
    return topic


# 1 MiB of 'a' is 1,398,104 bytes of base64: one record passes max_bytes=1 MiB by itself.
ONE_RECORD_JSON_BYTES = 1_398_104 + 200


@pytest.mark.parametrize("accept", ["application/json", "application/x-ndjson"])
def test_a_fetch_answers_max_bytes_of_rendered_records(
    http: httpx.Client, shared_broker: BrokerProcess, compressible: str, accept: str
) -> None:
    url = f"/v1/topics/{compressible}/partitions/0/records"
    before = peak_rss_bytes(shared_broker, reset=True)
    for max_bytes, expected in [(MIB, 1), (3 * MIB, 2)]:
        r = http.get(url, params={"offset": 0, "max_bytes": max_bytes}, headers={"accept": accept})
        assert r.status_code == 200, r.text
        assert int(r.headers["Logbus-Next-Offset"]) == expected
        if accept == NDJSON:
            records = [json.loads(line) for line in r.content.splitlines()]
        else:
            records = r.json()["records"]
            assert r.json()["next_offset"] == expected
        assert [rec["offset"] for rec in records] == list(range(expected))
        assert base64.b64decode(records[0]["value_b64"]) == b"a" * MIB
        # within max_bytes, or the one record a consumer needs to progress
        assert len(r.content) <= max(max_bytes, ONE_RECORD_JSON_BYTES) + ENVELOPE_BYTES
    # a consumer walks on from next_offset to the end
    r = http.get(url, params={"offset": 470, "max_bytes": 4 * MIB}, headers={"accept": accept})
    assert int(r.headers["Logbus-Next-Offset"]) == 472
    growth = peak_rss_bytes(shared_broker) - before
    assert growth < RSS_GROWTH_MAX_BYTES, f"peak RSS grew {growth / MIB:.0f} MiB"


def test_a_member_poll_answers_max_bytes_of_rendered_records(
    http: httpx.Client, shared_broker: BrokerProcess, compressible: str
) -> None:
    group = f"g-{compressible}"
    r = http.post(
        f"/v1/groups/{group}/members",
        json={
            "topics": [compressible],
            "session_timeout_ms": 30_000,
            "auto_offset_reset": "earliest",
        },
    )
    assert r.status_code == 201, r.text
    member = r.json()["member_id"]
    before = peak_rss_bytes(shared_broker, reset=True)
    url = f"/v1/groups/{group}/members/{member}/records"
    seen: list[int] = []
    for _ in range(2):
        r = http.get(url, params={"max_bytes": 3 * MIB})
        assert r.status_code == 200, r.text
        doc = r.json()
        seen += [rec["offset"] for rec in doc["records"]]
        assert len(r.content) <= 3 * MIB + ENVELOPE_BYTES
    assert seen == [0, 1, 2, 3]
    assert doc["positions"][0]["next_offset"] == 4
    growth = peak_rss_bytes(shared_broker) - before
    assert growth < RSS_GROWTH_MAX_BYTES, f"peak RSS grew {growth / MIB:.0f} MiB"


def test_an_sse_stream_sends_bounded_chunks_and_every_record_once(
    shared_broker: BrokerProcess, compressible: str
) -> None:
    before = peak_rss_bytes(shared_broker, reset=True)
    ids: list[str] = []
    url = f"{shared_broker.url}/v1/topics/{compressible}/partitions/0/records"
    with (
        httpx.Client(timeout=30.0) as c,
        c.stream(
            "GET",
            url,
            params={"offset": 0, "max_bytes": MIB},
            headers={"accept": "text/event-stream"},
        ) as r,
    ):
        assert r.status_code == 200
        for line in r.iter_lines():
            if line.startswith("id: "):
                ids.append(line[4:])
            if len(ids) == 12:
                break
    assert ids == [str(i + 1) for i in range(12)]
    growth = peak_rss_bytes(shared_broker) - before
    assert growth < RSS_GROWTH_MAX_BYTES, f"peak RSS grew {growth / MIB:.0f} MiB"


def test_a_websocket_json_frame_holds_a_bounded_number_of_rendered_bytes(
    shared_broker: BrokerProcess, compressible: str
) -> None:
    """Without byte credit a JSON frame holds about 1 MiB of records (at least one), not the
    100 records the credit allows (140 MB here)."""
    before = peak_rss_bytes(shared_broker, reset=True)
    url = shared_broker.url.replace("http://", "ws://", 1) + "/v1/ws"
    start = {"topic": compressible, "partition": 0, "offset": 0}
    subscribe = {"op": "subscribe", "partitions": [start]}

    async def main() -> list[tuple[int, list[int]]]:
        frames = []
        async with connect(url, open_timeout=5, close_timeout=2, max_size=None) as ws:
            await ws.send(json.dumps(subscribe))
            assert json.loads(await asyncio.wait_for(ws.recv(), 10))["type"] == "subscribed"
            await ws.send(json.dumps({"op": "credit", "records": 100}))
            while sum(len(offsets) for _, offsets in frames) < 4:
                raw = await asyncio.wait_for(ws.recv(), 10)
                doc = json.loads(raw)
                assert doc["type"] == "records", doc
                frames.append((len(raw), [r["offset"] for r in doc["records"]]))
        return frames

    frames = asyncio.run(main())
    assert [o for _, offsets in frames for o in offsets][:4] == [0, 1, 2, 3]
    for size, offsets in frames:
        assert len(offsets) == 1 and size <= ONE_RECORD_JSON_BYTES + ENVELOPE_BYTES, (size, offsets)
    growth = peak_rss_bytes(shared_broker) - before
    assert growth < RSS_GROWTH_MAX_BYTES, f"peak RSS grew {growth / MIB:.0f} MiB"
