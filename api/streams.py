"""Records for consumers that stay: a group member's poll, and Server-Sent Events streams.

Theory of operation
-------------------
* **Member poll** (``GET /v1/groups/{g}/members/{m}/records``): the coordinator reads from the
  member's assigned partitions, from its positions (:meth:`Coordinator.poll`); this module
  encodes at most ``max_records`` as JSON (:func:`core_log.recordjson.encode_json`, in C),
  moves the positions to just past what it returns, and answers JSON or NDJSON with the
  member's assignment, so a client learns of a rebalance from the poll it is waiting on anyway.
* **SSE** (``Accept: text/event-stream``): an endless response of ``id:``/``data:`` events,
  one per record, ``id`` being the *next* offset. A browser's ``EventSource`` sends the last id
  back as ``Last-Event-ID`` when it reconnects, and the stream resumes there — no record lost
  or repeated across the reconnect. The stream waits on the partition's high-watermark event
  and sends a comment line every ``KEEPALIVE_S`` so proxies keep the connection. Memory per
  stream is one read (``SSE_READ_BYTES``); the socket's flow control (uvicorn awaits the
  transport's drain) keeps a slow reader from piling up output.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from typing import Any

import orjson

from cluster.broker import Broker, check_readable
from cluster.coordinator import Coordinator, Fetched
from cluster.group import Reconciled
from core_log.batch import Record
from core_log.errors import LogbusError, OffsetOutOfRangeError
from core_log.recordjson import encode_json

from .problems import bad_request, problem_body
from .records import (
    JSON,
    NDJSON,
    Reply,
    decode_from,
    int_param,
    media_type,
    next_offset_after,
)
from .records_codec import record_to_json
from .settings import Settings

SSE = "text/event-stream"
KEEPALIVE_S = 15.0
SSE_READ_BYTES = 256 * 1024
SSE_RETRY_MS = 1_000


def _taken(f: Fetched, max_records: int) -> tuple[list[Record], int]:
    """The records of ``f`` to send and the offset after them (the SSE streams)."""
    records = decode_from(f.result.data, f.offset, max_records)
    last = records[-1].offset if records else -1
    return records, _next_offset(f, len(records), last, max_records)


def _taken_json(f: Fetched, max_records: int, sep: bytes) -> tuple[bytes, int, int]:
    """The records of ``f`` to send as JSON objects joined by ``sep`` (each with its topic and
    partition), how many, and the offset after them."""
    extra = b',"topic":%s,"partition":%d' % (orjson.dumps(f.topic), f.partition)
    body, count, last = encode_json(f.result.data, f.offset, max_records, extra=extra, sep=sep)
    return body, count, _next_offset(f, count, last, max_records)


def _next_offset(f: Fetched, count: int, last: int, max_records: int) -> int:
    return next_offset_after(f.offset, count, last, max_records, f.result.next_offset)


def assignment_doc(r: Reconciled, heartbeat_interval_ms: int) -> dict[str, Any]:
    return {
        "member_id": r.member_id,
        "generation": r.epoch,
        "assignment": _tps(r.assigned),
        "revoking": _tps(r.revoking),
        "pending": _tps(r.pending),
        "heartbeat_interval_ms": heartbeat_interval_ms,
    }


def _tps(tps: frozenset[tuple[str, int]]) -> list[dict[str, Any]]:
    return [{"topic": t, "partition": p} for t, p in sorted(tps)]


def heartbeat_interval_ms(session_timeout_ms: int, r: Reconciled) -> int:
    """A third of the session; short while the member has partitions to release or take."""
    interval = min(session_timeout_ms // 3, 3_000)
    return min(interval, 200) if r.revoking or r.pending else interval


async def member_poll(
    coordinator: Coordinator,
    settings: Settings,
    group_id: str,
    member_id: str,
    query: Mapping[str, str],
    kind: str,
    disconnected: Callable[[], Awaitable[bool]] | None = None,
) -> Reply:
    max_bytes = int_param(
        query, "max_bytes", settings.default_fetch_bytes, 1, settings.max_fetch_bytes
    )
    max_records = int_param(
        query, "max_records", settings.default_fetch_records, 1, settings.max_fetch_records
    )
    wait_ms = int_param(query, "wait_ms", 0, 0, settings.max_wait_ms)
    member = coordinator.member(group_id, member_id)
    wait_ms = min(wait_ms, member.session_timeout_ms // 2)  # a poll must not outlive a session
    reconciled, fetched = await coordinator.poll(group_id, member_id, max_bytes, wait_ms)
    if fetched and disconnected is not None and await disconnected():
        fetched = []  # nobody to deliver to: leave the positions where they are
    sep = b"\n" if kind == NDJSON else b","
    bodies: list[bytes] = []
    count = 0
    positions = []
    budget = max_records
    for f in fetched:
        if budget <= 0:
            break
        body, taken, next_offset = _taken_json(f, budget, sep)
        budget -= taken
        count += taken
        coordinator.advance(group_id, member_id, (f.topic, f.partition), next_offset)
        if taken:
            bodies.append(body)
        hw = f.result.high_watermark
        positions.append(
            {
                "topic": f.topic,
                "partition": f.partition,
                "next_offset": next_offset,
                "high_watermark": hw,
                "lag": max(0, hw - next_offset),
            }
        )
    interval = heartbeat_interval_ms(member.session_timeout_ms, reconciled)
    headers = {"Logbus-Generation": str(reconciled.epoch)}
    if reconciled.revoking:
        headers["Logbus-Rebalance"] = "revoking"
    if kind == NDJSON:
        body = b"".join(b + b"\n" for b in bodies)
        return Reply(200, body, NDJSON, headers, count, len(body))
    tail = orjson.dumps({"positions": positions, **assignment_doc(reconciled, interval)})
    body = b'{"records":[' + b",".join(bodies) + b"]," + tail[1:]
    return Reply(200, body, JSON, headers, count, len(body))


# -- SSE -----------------------------------------------------------------------------------------


def wants_sse(accept: str | None) -> bool:
    return bool(accept) and any(media_type(part) == SSE for part in (accept or "").split(","))


async def prepend(first: bytes, rest: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
    yield first
    async for chunk in rest:
        yield chunk


def resume_offset(query: Mapping[str, str], headers: Mapping[str, str]) -> int:
    """``Last-Event-ID`` (the next offset, sent back by EventSource) wins over ``offset``."""
    last = headers.get("last-event-id")
    if last:
        if not last.isdigit() or len(last) > 19:
            raise bad_request("Last-Event-ID must be an offset (a non-negative integer)")
        return int(last)
    return int_param(query, "offset", None, 0, 2**63 - 1)


def sse_records(records: list[Record], topic: str | None = None, partition: int = -1) -> bytes:
    parts = []
    for r in records:
        doc = record_to_json(r)
        if topic is not None:
            doc["topic"] = topic
            doc["partition"] = partition
            event_id = f"{topic}/{partition}/{r.offset + 1}"
        else:
            event_id = str(r.offset + 1)
        parts.append(b"id: %s\ndata: %s\n\n" % (event_id.encode(), orjson.dumps(doc)))
    return b"".join(parts)


def sse_event(event: str, doc: Any) -> bytes:
    return b"event: %s\ndata: %s\n\n" % (event.encode(), orjson.dumps(doc))


async def partition_sse(
    broker: Broker, topic: str, partition: int, offset: int, max_records: int
) -> AsyncIterator[bytes]:
    """Records of one partition from ``offset``, forever (until the partition goes away).
    An unknown partition (404) or an offset outside the log (416) raise before the first
    yield, so they are answered as errors — an EventSource stops on those, where it would
    reconnect to a stream that merely ended."""
    check_readable(topic)
    p = broker.partition(topic, partition)
    if not p.log_start_offset <= offset <= p.high_watermark:
        raise OffsetOutOfRangeError(offset, p.log_start_offset, p.high_watermark)
    yield b"retry: %d\n\n" % SSE_RETRY_MS
    while True:
        try:
            p = broker.partition(topic, partition)
            if p.released:
                return
            result = await p.read(offset, SSE_READ_BYTES)
        except LogbusError as e:
            yield sse_event("error", problem_body(e))
            return
        records = decode_from(result.data, offset, max_records)
        if records:
            yield sse_records(records)
            offset = records[-1].offset + 1
            continue
        if result.data and result.next_offset > offset:
            offset = result.next_offset  # a compacted gap
            continue
        if not await p.wait_for(offset, KEEPALIVE_S):
            yield b": keepalive\n\n"


async def member_sse(
    coordinator: Coordinator, group_id: str, member_id: str, max_records: int
) -> AsyncIterator[bytes]:
    """A member's records as events; assignment changes as ``assignment`` events. The stream
    is the member's heartbeat: revocations are acknowledged once announced (SSE cannot commit;
    commits go to ``POST /v1/groups/{group}/offsets``)."""
    member = coordinator.member(group_id, member_id)
    wait_ms = int(min(KEEPALIVE_S * 1000, member.session_timeout_ms / 3))
    yield b"retry: %d\n\n" % SSE_RETRY_MS
    last: tuple[frozenset[tuple[str, int]], frozenset[tuple[str, int]]] | None = None
    while True:
        try:
            reconciled, fetched = await coordinator.poll(
                group_id, member_id, SSE_READ_BYTES, 0 if last is None else wait_ms
            )
        except LogbusError as e:
            yield sse_event("error", problem_body(e))
            return
        if (reconciled.assigned, reconciled.revoking) != last:
            last = (reconciled.assigned, reconciled.revoking)
            yield sse_event("assignment", assignment_doc(reconciled, wait_ms))
        if reconciled.revoking:
            coordinator.heartbeat(group_id, member_id, ack=True)
        out = []
        budget = max_records
        for f in fetched:
            records, next_offset = _taken(f, budget)
            budget -= len(records)
            coordinator.advance(group_id, member_id, (f.topic, f.partition), next_offset)
            out.append(sse_records(records, f.topic, f.partition))
            if budget <= 0:
                break
        if out:
            yield b"".join(out)
        elif not fetched:
            yield b": keepalive\n\n"
