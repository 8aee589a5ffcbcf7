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
  transport's drain) keeps a slow reader from piling up output, and ``send_timeout_ms`` closes
  a reader that takes nothing. All streams together hold at most ``max_queued_stream_bytes``
  (:mod:`api.budgets`): each read is counted (:func:`sse_held_bytes`) until its events are sent,
  and a stream waits for room before it reads.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping
from itertools import chain
from typing import Any

import orjson

from cluster.broker import Broker, check_readable
from cluster.coordinator import Coordinator, Fetched
from cluster.group import Reconciled
from core_log.errors import LogbusError, OffsetOutOfRangeError, UnreadableRecordError
from core_log.isolation import committed_bytes
from core_log.recordjson import read_on_from

from .budgets import ByteBudget
from .params import OFFSET_MAX, parse_uint
from .problems import problem_body
from .records import (
    JSON,
    NDJSON,
    READ_COMMITTED,
    Reply,
    int_param,
    isolation_of,
    media_range,
    next_offset_after,
)
from .rendering import encode_json_within
from .settings import Settings

SSE = "text/event-stream"
KEEPALIVE_S = 15.0
SSE_READ_BYTES = 256 * 1024
# Events sent per write unless the request says max_bytes: as a fetch's default, so a stream of
# highly compressed records (16 MiB of records in a few KB read) stays one bounded write.
SSE_CHUNK_BYTES = 1024 * 1024


def sse_held_bytes(max_bytes: int) -> int:
    """Held against max_queued_stream_bytes per read in flight: the read and its rendered
    events (at most ``max_bytes``, plus one record past it)."""
    return SSE_READ_BYTES + max_bytes


SSE_RETRY_MS = 1_000
# A member's SSE stream whose only readable data is stuck at unreadable records waits this
# long between polls instead of spinning on them until the member skips them.
UNREADABLE_BACKOFF_S = 1.0


def _rendered(
    f: Fetched, max_records: int, max_bytes: int, first: bool, *, extra: bytes, sep: bytes
) -> tuple[bytes, int, int]:
    """The records of ``f`` rendered within ``max_bytes`` (but one if ``first``), how many,
    and the offset after them: after the last one sent when the budget cut the answer, never
    past an unreadable record not yet named (raises :class:`UnreadableRecordError` when it is
    the first)."""
    r = encode_json_within(
        f.result.data, f.offset, max_records, max_bytes, extra=extra, sep=sep, at_least_one=first
    )
    if r.full:
        return r.body, r.count, r.next_offset(f.offset)
    return r.body, r.count, _next_offset(f, r.count, r.last_offset, max_records, r.stop)


def _taken_sse(f: Fetched, max_records: int, max_bytes: int, first: bool) -> tuple[bytes, int, int]:
    """The events for the records of ``f`` (at most ``max_bytes`` of rendered records, but one
    if ``first``), how many, and the offset after them (the member SSE stream)."""
    body, count, next_offset = _rendered(f, max_records, max_bytes, first, extra=b"", sep=b"\n")
    return sse_events(body, count, f.topic, f.partition), count, next_offset


def _taken_json(
    f: Fetched, max_records: int, max_bytes: int, sep: bytes, first: bool
) -> tuple[bytes, int, int]:
    """The records of ``f`` to send as JSON objects joined by ``sep`` (each with its topic and
    partition; at most ``max_bytes`` of them, but one if ``first``), how many, and the offset
    after them."""
    extra = b',"topic":%s,"partition":%d' % (orjson.dumps(f.topic), f.partition)
    return _rendered(f, max_records, max_bytes, first, extra=extra, sep=sep)


def unreadable_doc(topic: str, partition: int, e: UnreadableRecordError) -> dict[str, Any]:
    """A partition stopped at a record no reader can serve: the problem, with where it is and
    how to skip it (read on from ``next_offset``: a member commits it)."""
    return {**problem_body(e), "topic": topic, "partition": partition}


def _next_offset(f: Fetched, count: int, last: int, max_records: int, stop: int | None) -> int:
    end = read_on_from(int(f.result.next_offset), stop)
    return next_offset_after(f.offset, count, last, max_records, end)


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
    committed = isolation_of(query) == READ_COMMITTED
    member = coordinator.member(group_id, member_id)
    wait_ms = min(wait_ms, member.session_timeout_ms // 2)  # a poll must not outlive a session
    reconciled, fetched = await coordinator.poll(
        group_id, member_id, max_bytes, wait_ms, committed=committed
    )
    if fetched and disconnected is not None and await disconnected():
        fetched = []  # nobody to deliver to: leave the positions where they are
    sep = b"\n" if kind == NDJSON else b","
    bodies: list[bytes] = []
    count = 0
    positions = []
    budget = max_records
    rendered_bytes = 0
    unreadable: list[dict[str, Any]] = []
    for f in fetched:
        if budget <= 0 or (count and rendered_bytes >= max_bytes):
            break
        room = max_bytes - rendered_bytes
        try:
            body, taken, next_offset = _taken_json(f, budget, room, sep, not count)
        except UnreadableRecordError as e:  # this partition waits for the member to skip it
            unreadable.append(unreadable_doc(f.topic, f.partition, e))
            continue
        budget -= taken
        count += taken
        if taken:
            rendered_bytes += len(body) + len(sep)
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
    if unreadable:
        headers["Logbus-Unreadable"] = ",".join(
            f"{u['topic']}/{u['partition']}@{u['offset']}" for u in unreadable
        )
    if kind == NDJSON:
        body = b"".join(b + b"\n" for b in bodies)
        return Reply(200, body, NDJSON, headers, count, len(body))
    doc: dict[str, Any] = {"positions": positions, **assignment_doc(reconciled, interval)}
    if unreadable:
        doc["unreadable"] = unreadable
    tail = orjson.dumps(doc)
    body = b'{"records":[' + b",".join(bodies) + b"]," + tail[1:]
    return Reply(200, body, JSON, headers, count, len(body))


# -- SSE -----------------------------------------------------------------------------------------


def wants_sse(accept: str | None) -> bool:
    """Whether Accept asks for an event stream (named, with q above 0)."""
    if not accept or SSE not in accept.lower():
        return False
    try:
        ranges = [media_range(part) for part in accept.split(",")]
    except LogbusError:
        return False  # a malformed Accept: the fetch answers 400 for it
    return any(kind == SSE and q > 0 for kind, q in ranges)


async def prepend(first: bytes, rest: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
    yield first
    async for chunk in rest:
        yield chunk


def resume_offset(query: Mapping[str, str], headers: Mapping[str, str]) -> int:
    """``Last-Event-ID`` (the next offset, sent back by EventSource) wins over ``offset``."""
    last = headers.get("last-event-id")
    if last:
        return parse_uint(last, "Last-Event-ID", 0, OFFSET_MAX)
    return int_param(query, "offset", None, 0, 2**63 - 1)


def sse_events(body: bytes, count: int, topic: str | None = None, partition: int = -1) -> bytes:
    """SSE events of ``count`` records rendered by :func:`encode_json` with ``sep=b"\\n"``
    (one object a line: rendered records hold no raw line break). ``id`` is the next offset;
    a member's events carry topic and partition, and their ids name them too.

    No Python runs per record: the events are one ``bytes %`` of a repeated template over the
    lines and their ids (a range when the offsets are consecutive, else read off the lines by
    one regex). A loop slicing and formatting each line cost 0.86 µs a record, 45 % of the
    event loop's time pushing a backlog over SSE; this costs 0.31."""
    if not count:
        return b""
    if topic is not None:
        # Each line ends with its object's "}" and "}\n" occurs only there (no raw line breaks).
        tail = b',"topic":%s,"partition":%d}' % (orjson.dumps(topic), partition)
        body = body[:-1].replace(b"}\n", tail + b"\n") + tail
        prefix = b"id: %s/%d/" % (topic.encode().replace(b"%", b"%%"), partition)
    else:
        prefix = b"id: "
    lines = body.split(b"\n")
    n = len(lines)
    first = int(body[10 : body.index(b",", 10)])  # {"offset":N,...
    last_line = lines[-1]
    last = int(last_line[10 : last_line.index(b",", 10)])
    ids: Iterable[int]
    if last - first == n - 1:  # consecutive offsets: the usual case
        ids = range(first + 1, last + 2)
    else:  # gaps (compaction, transaction markers): read each line's offset
        ids = [int(o) + 1 for o in _LINE_OFFSET.findall(body)]
    template = (prefix + b"%d\ndata: %s\n\n") * n
    return template % tuple(chain.from_iterable(zip(ids, lines, strict=True)))


_LINE_OFFSET = re.compile(rb'^\{"offset":(\d+),', re.M)


def sse_event(event: str, doc: Any) -> bytes:
    return b"event: %s\ndata: %s\n\n" % (event.encode(), orjson.dumps(doc))


async def partition_sse(
    broker: Broker,
    topic: str,
    partition: int,
    offset: int,
    max_records: int,
    budget: ByteBudget,
    max_bytes: int = SSE_CHUNK_BYTES,
    *,
    committed: bool = False,
) -> AsyncIterator[bytes]:
    """Records of one partition from ``offset``, forever (until the partition goes away).
    An unknown partition (404) or an offset outside the log (416) raise before the first
    yield, so they are answered as errors — an EventSource stops on those, where it would
    reconnect to a stream that merely ended. ``committed``: at ``read_committed``."""
    check_readable(topic)
    p = await broker.synced_reader(topic, partition)
    if not p.log_start_offset <= offset <= p.high_watermark:
        raise OffsetOutOfRangeError(offset, p.log_start_offset, p.high_watermark)
    # The first read is answered before the stream starts: a record no reader can serve at
    # ``offset`` is an HTTP error then (500, not retriable), on which an EventSource stops
    # instead of reconnecting for ever; the client skips it by asking from its next_offset.
    # Each read and its events are held against max_queued_stream_bytes until sent.
    held = sse_held_bytes(max_bytes)
    await budget.wait_reserve(held)
    reserved = True
    try:
        step: tuple[bytes, int, int] | None = await _sse_step(
            p, offset, max_records, max_bytes, committed
        )
        yield b"retry: %d\n\n" % SSE_RETRY_MS
        while True:
            if step is None:
                await budget.wait_reserve(held)
                reserved = True
                try:
                    p = broker.reader(topic, partition)
                    if p.released:
                        return
                    step = await _sse_step(p, offset, max_records, max_bytes, committed)
                except LogbusError as e:  # an unreadable record too: the reconnect then stops
                    yield sse_event("error", problem_body(e))
                    return
            events, next_offset, hw = step
            step = None
            if events:
                yield events
            budget.release(held)
            reserved = False
            if events:
                offset = next_offset
                continue
            if next_offset > offset:
                offset = next_offset  # a compacted gap, aborted data, markers
                continue
            # Until the high watermark passes what the read saw (at read_committed the last
            # stable offset moves only with it; past ``offset`` alone it may already be).
            if not await p.wait_for(max(offset, hw) if committed else offset, KEEPALIVE_S):
                yield b": keepalive\n\n"
    finally:
        if reserved:
            budget.release(held)


async def _sse_step(
    p: Any, offset: int, max_records: int, max_bytes: int, committed: bool
) -> tuple[bytes, int, int]:
    """Events of the records from ``offset`` (b"" if none), at most ``max_bytes`` of rendered
    records but at least one, where the stream goes on, and the high watermark read."""
    if committed:
        result = await p.read_committed(offset, SSE_READ_BYTES)
        data = committed_bytes(result.data, result.aborted_transactions)
    else:
        result = await p.read(offset, SSE_READ_BYTES)
        data = result.data
    r = encode_json_within(data, offset, max_records, max_bytes, sep=b"\n")
    if r.full:
        return sse_events(r.body, r.count), r.next_offset(offset), result.high_watermark
    end = read_on_from(int(result.next_offset) if result.data else offset, r.stop)
    next_offset = next_offset_after(offset, r.count, r.last_offset, max_records, end)
    return sse_events(r.body, r.count), next_offset, result.high_watermark


async def member_sse(
    coordinator: Coordinator,
    group_id: str,
    member_id: str,
    max_records: int,
    budget: ByteBudget,
    max_bytes: int = SSE_CHUNK_BYTES,
    *,
    committed: bool = False,
) -> AsyncIterator[bytes]:
    """A member's records as events; assignment changes as ``assignment`` events. The stream
    is the member's heartbeat: revocations are acknowledged once announced (SSE cannot commit;
    commits go to ``POST /v1/groups/{group}/offsets``). ``committed``: at read_committed."""
    member = coordinator.member(group_id, member_id)
    wait_ms = int(min(KEEPALIVE_S * 1000, member.session_timeout_ms / 3))
    yield b"retry: %d\n\n" % SSE_RETRY_MS
    last: tuple[frozenset[tuple[str, int]], frozenset[tuple[str, int]]] | None = None
    reported: dict[tuple[str, int], int] = {}  # unreadable offsets already announced
    while True:
        try:
            reconciled, fetched = await coordinator.poll(
                group_id,
                member_id,
                SSE_READ_BYTES,
                0 if last is None else wait_ms,
                committed=committed,
            )
        except LogbusError as e:
            yield sse_event("error", problem_body(e))
            return
        held = sse_held_bytes(max_bytes) if fetched else 0
        if not budget.try_reserve(held):
            # No room: drop the read (positions move only on advance), wait for room while
            # holding nothing, and poll again (the records are there: it answers at once).
            del fetched
            await budget.wait_reserve(held)
            budget.release(held)
            continue
        try:
            if (reconciled.assigned, reconciled.revoking) != last:
                last = (reconciled.assigned, reconciled.revoking)
                yield sse_event("assignment", assignment_doc(reconciled, wait_ms))
            if reconciled.revoking:
                coordinator.heartbeat(group_id, member_id, ack=True)
            out, stuck = _member_events(
                coordinator, group_id, member_id, fetched, max_records, max_bytes, reported
            )
            if out:
                yield out
            elif not fetched:
                yield b": keepalive\n\n"
        finally:
            budget.release(held)
        if fetched and stuck == len(fetched):
            # only stuck partitions have data: do not spin on them
            await asyncio.sleep(UNREADABLE_BACKOFF_S)


def _member_events(
    coordinator: Coordinator,
    group_id: str,
    member_id: str,
    fetched: list[Fetched],
    max_records: int,
    max_bytes: int,
    reported: dict[tuple[str, int], int],
) -> tuple[bytes, int]:
    """Events for up to ``max_records`` of ``fetched`` within ``max_bytes`` rendered (at least
    one record), the member's positions moved past them; and how many partitions are stuck at
    a record no reader can serve (announced once each, as an ``unreadable`` event; such a
    partition waits until the member commits the error's ``next_offset``)."""
    out = []
    left = max_records
    rendered_bytes = 0
    stuck = 0
    for f in fetched:
        tp = (f.topic, f.partition)
        try:
            events, count, next_offset = _taken_sse(
                f, left, max_bytes - rendered_bytes, not rendered_bytes
            )
        except UnreadableRecordError as e:
            stuck += 1
            if reported.get(tp) != e.offset:
                reported[tp] = e.offset
                out.append(sse_event("unreadable", unreadable_doc(*tp, e)))
            continue
        reported.pop(tp, None)
        left -= count
        rendered_bytes += len(events)
        coordinator.advance(group_id, member_id, tp, next_offset)
        out.append(events)
        if left <= 0 or rendered_bytes >= max_bytes:
            break
    return b"".join(out), stuck
