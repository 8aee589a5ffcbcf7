"""``/v1/ws``: push consumers (explicit partitions or a group member), commits and produce.

Theory of operation
-------------------
One session per socket, two tasks:

* the **reader** parses client messages (:mod:`api.ws_protocol`) and acts on them: subscribe,
  join (the socket becomes a group member; closing it leaves the group), grant credit, commit,
  acknowledge revocations, produce. A malformed message gets an ``error`` message and the
  socket stays open; a subscription to an unknown topic closes it with 4404, an impossible one
  with 4400, a member refused by the coordinator with 4409, one that found no coordinator for
  its session timeout with 4503. A member's calls go through :class:`api.ws_member.GroupLink`,
  to the coordinator wherever it is (this broker or another, and the next one on failover).
* the **pusher** sends records while there is credit: it reads each source partition from its
  position and builds frames that fit the credit left. With nothing to send it waits — on the
  partitions' high-watermark events, the group's event and the session's own (credit or
  subscription changed) — never on a timer, except to keep a member's session alive.

Memory per idle session: two tasks and the socket's buffers; nothing is queued for a client
beyond the frame being sent (uvicorn's ``send`` waits for the transport to drain). Each read
is held against the broker's ``max_queued_stream_bytes`` from before the read until its frame
is sent (:mod:`api.budgets`), so all pushers together hold a bounded amount; a client that
never reads its socket holds one read until ``send_timeout_ms`` aborts it.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
from collections.abc import Awaitable, Iterable
from typing import Any

import orjson
from starlette.websockets import WebSocket, WebSocketDisconnect

from auth_quotas.acl import Operation, Resource, ResourceType
from cluster.assignor import TopicPartition
from cluster.broker import check_readable
from cluster.coordinator import first_of
from core_log.batch import scan_batches
from core_log.errors import (
    ErrorCode,
    LogbusError,
    UnknownTopicOrPartitionError,
    UnreadableRecordError,
)
from core_log.isolation import committed_bytes
from core_log.log import CommittedReadResult
from core_log.recordjson import read_on_from

from . import records
from . import ws_protocol as proto
from .access import (
    CLOSE_FORBIDDEN,
    CLOSE_UNAUTHENTICATED,
    identity_of,
    require,
    ws_requirements,
)
from .problems import problem_body
from .rendering import encode_json_within
from .security import refusal
from .state import AppState
from .ws_member import GroupLink

log = logging.getLogger("logbus.ws")

# Reads per partition start small (inline on the event loop: a consumer keeping up reads a
# few records at a time) and double while they come back full, up to READ_BYTES (a consumer
# catching up reads big, off the loop). A 1 MiB read for every record pushed cost a thread
# hop each time: 2.5x the CPU of a long-poll at 1,000 records/s.
READ_BYTES = 1024 * 1024
FIRST_READ_BYTES = 64 * 1024
MAX_RECORDS_PER_FRAME = 10_000
# Rendered records per JSON frame when the client grants no byte credit: as a fetch's default
# max_bytes (a 1 MiB read of well-compressed batches can hold gigabytes of records).
FRAME_JSON_BYTES = 1024 * 1024
KEEPALIVE_S = 15.0

# Bytes of rendered records a re-render may produce (bounded by the records it takes).
MAX_RENDER_BYTES = 1 << 62


class Close(Exception):
    def __init__(self, code: int, reason: str) -> None:
        super().__init__(reason)
        self.code = code
        self.reason = reason[:120]  # a close reason is at most 123 bytes


class Session:
    def __init__(self, ws: WebSocket, state: AppState) -> None:
        self.ws = ws
        self.state = state
        self.broker = state.broker
        self.credit = proto.CreditWindow()
        self.format: proto.Format = "json"
        self.committed = False  # isolation read_committed (the last subscribe/join says)
        self._seen_hw: dict[TopicPartition, int] = {}  # the high watermark each read saw
        self._passed = False  # a position moved past aborted data this round
        self.positions: dict[TopicPartition, int] = {}  # explicit subscriptions
        self.link: GroupLink | None = None  # a group member's link to its coordinator
        self._rejoins_sent = 0
        self.auto_ack = False
        self.announced: tuple[frozenset[TopicPartition], frozenset[TopicPartition]] = (
            frozenset(),
            frozenset(),
        )
        self.changed = asyncio.Event()
        self.stalled_sent = False
        self.blocked: set[TopicPartition] = set()  # stalled or failed: not waited on
        self._read_bytes: dict[TopicPartition, int] = {}
        self._cursor = 0
        self.identity = identity_of(ws.scope)
        self._killed: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._pending_notes: list[
            tuple[int, frozenset[TopicPartition], frozenset[TopicPartition]]
        ] = []

    async def run(self) -> None:
        await self.ws.accept()
        loop = asyncio.get_running_loop()
        security = self.state.security
        expiry: asyncio.TimerHandle | None = None
        if security is not None and security.enabled:
            security.listeners.add(self._recheck)
            if self.identity.expires_ms is not None:
                delay_s = max(0.0, (self.identity.expires_ms - security.now_ms()) / 1000)
                expiry = loop.call_later(delay_s, self.kill, CLOSE_UNAUTHENTICATED, "expired")
        pusher = asyncio.create_task(self._push_loop(), name="ws-push")
        reader = asyncio.create_task(self._read_loop(), name="ws-read")
        try:
            done, _ = await asyncio.wait(
                {pusher, reader, self._killed}, return_when=asyncio.FIRST_COMPLETED
            )
            for task in done:
                exc = task.exception()
                if isinstance(exc, Close):
                    with contextlib.suppress(Exception):
                        await self.ws.close(exc.code, exc.reason)
                elif exc is not None and not isinstance(exc, WebSocketDisconnect):
                    log.error("websocket session failed", exc_info=exc)
                    with contextlib.suppress(Exception):
                        await self.ws.close(1011, "internal error")
        finally:
            if security is not None:
                security.listeners.discard(self._recheck)
            if expiry is not None:
                expiry.cancel()
            self._killed.cancel()
            for task in (pusher, reader):
                task.cancel()
            await asyncio.gather(pusher, reader, return_exceptions=True)
            self._leave()

    # -- authorization ---------------------------------------------------------------------------

    def kill(self, code: int, reason: str) -> None:
        """Close the socket from outside its tasks (a revoked key, an expired token)."""
        if not self._killed.done():
            self._killed.set_exception(Close(code, reason))

    def _recheck(self) -> None:
        """After every security change: the credential still holds, and the group and every
        subscribed topic are still readable (Kafka checks each fetch)."""
        security = self.state.security
        if security is None:
            return
        topics = {t for t, _ in self.positions}
        reads = []
        if self.link is not None:
            topics.update(self.link.params.topics)
            reads.append(Resource(ResourceType.GROUP, self.link.group))
        reads += [Resource(ResourceType.TOPIC, t) for t in sorted(topics)]
        refused = refusal(security, self.identity, reads)
        if refused is not None:
            code = CLOSE_UNAUTHENTICATED if refused.http_status == 401 else CLOSE_FORBIDDEN
            self.kill(code, refused.message)

    def _authorize(
        self, message: str, topics: Iterable[str], group: str | None, *, close: bool
    ) -> None:
        """What ``message`` needs (:data:`api.access.WS_MESSAGES`) on the names it carries."""
        for op, resource in ws_requirements(message, topics, group):
            self._require(op, resource, close)

    def _require(self, op: Operation, resource: Resource, close: bool) -> None:
        """Raise when denied: a :class:`Close` (4403) for a subscription, else the 403 error
        (answered as an ``error`` message; the socket stays open)."""
        try:
            require(self.state.security, self.ws.scope, op, resource)
        except LogbusError as e:
            if close:
                raise Close(CLOSE_FORBIDDEN, e.message) from None
            raise

    def _leave(self) -> None:
        if self.link is not None:
            self.link.close()
            self.link = None

    async def send(self, doc: dict[str, Any]) -> None:
        await self.ws.send_text(orjson.dumps(doc).decode())

    # -- client messages -------------------------------------------------------------------------

    async def _read_loop(self) -> None:
        while True:
            message = await self.ws.receive()
            if message["type"] == "websocket.disconnect":
                raise WebSocketDisconnect(message.get("code", 1000))
            raw = message.get("text")
            if raw is None:
                raw = message.get("bytes") or b""
            try:
                msg = proto.parse(raw)
            except ValueError as e:
                await self._error(proto.message_id(raw), ErrorCode.INVALID_REQUEST, str(e))
                continue
            try:
                await self._handle(msg)
            except LogbusError as e:
                await self.send({**problem_body(e), "type": "error", "id": msg.id})

    async def _error(self, msg_id: int | str | None, code: ErrorCode, detail: str) -> None:
        await self.send(
            {
                "type": "error",
                "id": msg_id,
                "code": code.name,
                "status": code.http_status,
                "detail": detail,
            }
        )

    async def _handle(self, msg: proto.Message) -> None:
        if isinstance(msg, proto.Credit):
            self.credit.grant(msg.records, msg.bytes)
            self.stalled_sent = False
            self.blocked.clear()
            self.changed.set()
        elif isinstance(msg, proto.Subscribe):
            await self._subscribe(msg)
        elif isinstance(msg, proto.Join):
            await self._join(msg)
        elif isinstance(msg, proto.Commit):
            await self._commit(msg)
        elif isinstance(msg, proto.Ack):
            if self.link is not None:
                self._reconcile(ack=True)
                self.changed.set()
        elif isinstance(msg, proto.Produce):
            await self._produce(msg)
        elif isinstance(msg, proto.Unsubscribe):
            self._leave()
            self.positions.clear()
            self.changed.set()
            await self.send({"type": "unsubscribed", "id": msg.id})
        else:
            await self.send({"type": "pong", "id": msg.id})

    async def _subscribe(self, msg: proto.Subscribe) -> None:
        if self.link is not None:
            raise Close(proto.CLOSE_BAD_SUBSCRIPTION, "this socket is a group member already")
        wanted: dict[TopicPartition, int] = {}
        topics = {spec.topic for spec in msg.partitions} | set(msg.topics)
        self._authorize("subscribe", topics, None, close=True)
        try:
            for spec in msg.partitions:
                wanted[(spec.topic, spec.partition)] = await self._start(
                    spec.topic, spec.partition, spec.offset, spec.timestamp, spec.start
                )
            for topic in msg.topics:
                for p in range(self.broker.topic(topic).partitions):
                    wanted[(topic, p)] = await self._start(topic, p, None, msg.timestamp, msg.start)
        except UnknownTopicOrPartitionError as e:
            code = proto.CLOSE_UNKNOWN_TOPIC if e.detail.get("partition") is None else 4400
            raise Close(code, e.message) from None
        except LogbusError as e:
            raise Close(proto.CLOSE_BAD_SUBSCRIPTION, e.message) from None
        if again := sorted(wanted.keys() & self.positions.keys()):
            topic, partition = again[0]
            raise Close(proto.CLOSE_BAD_SUBSCRIPTION, f"subscribed to {topic}[{partition}] already")
        if not wanted or len(self.positions) + len(wanted) > proto.MAX_SUBSCRIPTIONS:
            raise Close(proto.CLOSE_BAD_SUBSCRIPTION, "subscribe to 1..10000 partitions")
        self.positions.update(wanted)
        self.blocked.difference_update(wanted)
        self.format = msg.format
        self.committed = msg.isolation == "read_committed"
        self.changed.set()
        await self.send(
            {
                "type": "subscribed",
                "id": msg.id,
                "partitions": [
                    {"topic": t, "partition": p, "offset": o}
                    for (t, p), o in sorted(wanted.items())
                ],
            }
        )

    async def _start(
        self, topic: str, partition: int, offset: int | None, ts: int | None, start: str | None
    ) -> int:
        check_readable(topic)
        p = await self.broker.synced_reader(topic, partition)
        if offset is not None:
            if not p.log_start_offset <= offset <= p.high_watermark:
                raise LogbusError(
                    f"offset {offset} of {topic}[{partition}] is outside "
                    f"[{p.log_start_offset}, {p.high_watermark}]",
                    code=ErrorCode.OFFSET_OUT_OF_RANGE,
                )
            return offset
        if ts is not None:
            found = await p.offset_for_timestamp(ts)
            return p.high_watermark if found is None else found
        return p.log_start_offset if start == "earliest" else p.high_watermark

    async def _join(self, msg: proto.Join) -> None:
        if self.link is not None or self.positions:
            raise Close(proto.CLOSE_BAD_SUBSCRIPTION, "this socket is subscribed already")
        self._authorize("join", msg.topics, msg.group, close=True)
        link = GroupLink(self.state, msg, self.changed.set)
        link.scope = self.ws.scope
        try:
            await link.join()
        except LogbusError as e:
            if e.code is ErrorCode.UNKNOWN_TOPIC_OR_PARTITION:
                raise Close(proto.CLOSE_UNKNOWN_TOPIC, e.message) from None
            raise
        self.link = link
        self.auto_ack = msg.auto_ack
        self.format = msg.format
        self.committed = msg.isolation == "read_committed"
        await self.send(
            {
                "type": "joined",
                "id": msg.id,
                "group": msg.group,
                "member_id": link.member_id,
                "generation": link.view.epoch,
            }
        )
        self.changed.set()

    async def _commit(self, msg: proto.Commit) -> None:
        offsets = {(o.topic, o.partition): (o.offset, o.metadata) for o in msg.offsets}
        group = self.link.group if self.link is not None else msg.group
        self._authorize("commit", [o.topic for o in msg.offsets], group, close=False)
        if self.link is not None:
            await self.link.commit(offsets)
            self.blocked.difference_update(offsets)  # e.g. past an unreadable record
            self.changed.set()
        elif msg.group is not None:
            link = GroupLink.standalone(self.state, msg.group)
            link.scope = self.ws.scope
            await link.commit(offsets)
        else:
            raise LogbusError(
                "commit needs a group: join one, or name it", code=ErrorCode.INVALID_REQUEST
            )
        await self.send({"type": "committed", "id": msg.id, "count": len(offsets)})

    async def _produce(self, msg: proto.Produce) -> None:
        self._authorize("produce", [msg.topic], None, close=False)

        async def body() -> Any:
            yield b'{"records":' + bytes(msg.records) + b"}"

        query = {"acks": msg.acks} if msg.acks is not None else {}
        reply = await records.produce(
            self.broker,
            self.state.settings,
            msg.topic,
            msg.partition,
            query,
            {"content-type": records.JSON},
            body(),
        )
        assert isinstance(reply.body, bytes)
        doc = orjson.loads(reply.body)
        await self.send({"type": "produced", "id": msg.id, **doc})

    # -- pushing records -------------------------------------------------------------------------

    def _reconcile(self, *, ack: bool) -> None:
        """A member's view: announce assignment changes; auto-ack revocations if asked."""
        assert self.link is not None
        try:
            r = self.link.reconcile(ack=ack)
        except LogbusError as e:
            self._leave()
            code = proto.CLOSE_COORDINATOR_UNAVAILABLE if e.retriable else proto.CLOSE_FENCED
            raise Close(code, e.message) from None
        assigned, revoking = r.assigned, r.revoking
        old_assigned, old_revoking = self.announced
        self.announced = (assigned, revoking)
        self._pending_notes.append((r.epoch, assigned - old_assigned, revoking - old_revoking))
        if revoking and self.auto_ack and not ack:
            self._reconcile(ack=True)

    async def _announce(self) -> None:
        link = self.link
        if link is not None and link.rejoins > self._rejoins_sent:
            self._rejoins_sent = link.rejoins
            await self.send(
                {
                    "type": "joined",
                    "group": link.group,
                    "member_id": link.member_id,
                    "generation": link.view.epoch,
                    "rejoined": True,
                }
            )
        notes, self._pending_notes = self._pending_notes, []
        for epoch, added, revoked in notes:
            if revoked:
                await self.send(
                    {"type": "revoked", "generation": epoch, "partitions": _tps(revoked)}
                )
            if added:
                await self.send(
                    {"type": "assigned", "generation": epoch, "partitions": _tps(added)}
                )

    def _sources(self) -> list[TopicPartition]:
        if self.link is not None:
            self._reconcile(ack=False)
            return sorted(self.announced[0])
        return sorted(self.positions)

    def _position(self, tp: TopicPartition) -> int | None:
        """Where ``tp`` is read next (None: a member's starting offset is not known yet)."""
        if self.link is not None:
            return self.link.position(tp)
        return self.positions[tp]

    def _advance(self, tp: TopicPartition, next_offset: int) -> None:
        if self.link is not None:
            self.link.advance(tp, next_offset)
        else:
            self.positions[tp] = next_offset

    async def _push_loop(self) -> None:
        while True:
            self.changed.clear()
            group_event = self.link.event() if self.link is not None else None
            sources = self._sources() if (self.link is not None or self.positions) else []
            await self._announce()
            sent = 0
            self._passed = False
            if self.credit.open and sources:
                sent = await self._push_round(sources)
            if sent or self._passed:  # a position passed aborted data: read on from it
                continue
            waits: list[Awaitable[Any]] = [self.changed.wait()]
            if group_event is not None:
                waits.append(group_event.wait())
            timeout = KEEPALIVE_S
            if self.link is not None:
                timeout = min(timeout, self.link.interval_s)
            if self.credit.open:
                for tp in sources:
                    if tp in self.blocked:
                        continue  # waits for credit (stalled) or for good (failed)
                    try:
                        p = await self.broker.known_reader(*tp)
                        pos = self._position(tp)
                        if pos is not None:
                            if self.committed:  # the LSO moves only with the high watermark
                                pos = max(pos, self._seen_hw.get(tp, pos))
                            waits.append(p.wait_for(pos, timeout))
                    except LogbusError as e:
                        await self._source_failed(tp, e)
            await first_of(waits, timeout)

    async def _source_failed(self, tp: TopicPartition, e: LogbusError) -> None:
        """A partition that cannot be read (deleted, no position): say so once; an explicit
        subscription drops it, a member waits for its reassignment."""
        if tp not in self.blocked:
            self.blocked.add(tp)
            await self.send(
                {**problem_body(e), "type": "error", "topic": tp[0], "partition": tp[1]}
            )
        if self.link is None:
            self.positions.pop(tp, None)

    async def _push_round(self, sources: list[TopicPartition]) -> int:
        """One pass over the sources from a rotating start; returns records sent."""
        start = self._cursor % len(sources)
        self._cursor += 1
        sent = 0
        for tp in sources[start:] + sources[:start]:
            if not self.credit.open:
                break
            if tp in self.blocked:
                continue
            budget = self._read_bytes.get(tp, FIRST_READ_BYTES)
            if self.credit.bytes is not None:
                budget = max(1, min(budget, self.credit.bytes))
            try:
                p = await self.broker.known_reader(*tp)
                pos = self._position(tp)
                if pos is None or pos >= p.high_watermark:
                    continue
            except LogbusError as e:
                await self._source_failed(tp, e)
                continue
            async with self.state.budgets.stream.held(budget):  # until the frame is sent
                sent += await self._push_partition(tp, pos, budget)
        return sent

    async def _push_partition(self, tp: TopicPartition, pos: int, budget: int) -> int:
        """Read ``budget`` bytes of ``tp`` from ``pos`` and send what the credit allows."""
        try:
            reader = self.broker.reader(*tp)
            result = await (reader.read_committed if self.committed else reader.read)(pos, budget)
        except LogbusError as e:
            await self._source_failed(tp, e)
            return 0
        if isinstance(result, CommittedReadResult):
            self._seen_hw[tp] = result.high_watermark
            data = committed_bytes(result.data, result.aborted_transactions)
            if not data and result.data:  # aborted data and markers only: pass over them
                self._advance(tp, result.next_offset)
                self._passed = True
                return 0
            result = dataclasses.replace(result, data=data)
        full = len(result.data) >= budget // 2
        self._read_bytes[tp] = min(READ_BYTES, budget * 2) if full else FIRST_READ_BYTES
        if self.format == "binary":
            return await self._send_binary(tp, pos, result.data, result.high_watermark)
        try:
            return await self._send_json(tp, pos, result, result.high_watermark)
        except UnreadableRecordError as e:
            # said once (offset, next_offset); the partition waits for the client to skip it:
            # a member commits next_offset, a subscriber subscribes from it
            await self._source_failed(tp, e)
            return 0

    async def _send_json(self, tp: TopicPartition, pos: int, result: Any, hw: int) -> int:
        limit = min(self.credit.records, MAX_RECORDS_PER_FRAME)
        room = FRAME_JSON_BYTES if self.credit.bytes is None else self.credit.bytes
        rendered = encode_json_within(result.data, pos, limit, room)
        body, count, last = rendered.body, rendered.count, rendered.last_offset
        end = read_on_from(result.next_offset, rendered.stop)
        if rendered.full and count:
            limit = count  # stopped by bytes: go on right after the last record sent
        if not count:
            if result.next_offset > pos:
                self._advance(tp, result.next_offset)  # a compacted gap
            return 0
        head = b'{"type":"records","topic":%s,"partition":%d,"records":[' % (
            orjson.dumps(tp[0]),
            tp[1],
        )
        while True:
            next_offset = records.next_offset_after(pos, count, last, limit, end)
            frame = b'%s%s],"next_offset":%d,"high_watermark":%d}' % (head, body, next_offset, hw)
            if self.credit.fits(count, len(frame)):
                break
            if count == 1:
                await self._stalled(tp, 1, len(frame))
                return 0
            limit = count // 2  # fewer records than were read: stop right after them
            again = encode_json_within(result.data, pos, limit, MAX_RENDER_BYTES)
            body, count, last = again.body, again.count, again.last_offset
            end = read_on_from(result.next_offset, again.stop)
        self.credit.use(count, len(frame))
        self._advance(tp, next_offset)
        await self.ws.send_text(frame.decode())
        return count

    async def _send_binary(self, tp: TopicPartition, pos: int, data: bytes, hw: int) -> int:
        overhead = len(proto.binary_frame(tp[0], tp[1], b""))
        count = 0
        end = 0
        next_offset = pos
        for at, h in scan_batches(data):
            size = at + h.size_bytes
            if not self.credit.fits(count + h.record_count, overhead + size):
                if count == 0:
                    await self._stalled(tp, h.record_count, overhead + size)
                break
            count += h.record_count
            end = size
            next_offset = h.next_offset
        if count == 0:
            return 0
        frame = proto.binary_frame(tp[0], tp[1], data[:end])
        self.credit.use(count, len(frame))
        self._advance(tp, next_offset)
        await self.ws.send_bytes(frame)
        return count

    async def _stalled(self, tp: TopicPartition, needed_records: int, needed_bytes: int) -> None:
        """The credit left cannot carry the next frame: say so once per grant, and stop
        reading the partition until the next grant."""
        self.blocked.add(tp)
        if not self.stalled_sent:
            self.stalled_sent = True
            await self.send(
                {
                    "type": "stalled",
                    "topic": tp[0],
                    "partition": tp[1],
                    "needed_records": needed_records,
                    "needed_bytes": needed_bytes,
                    "credit_records": self.credit.records,
                    "credit_bytes": self.credit.bytes,
                }
            )


def _tps(tps: frozenset[TopicPartition]) -> list[dict[str, Any]]:
    return [{"topic": t, "partition": p} for t, p in sorted(tps)]
