"""Quota enforcement at the front door: every HTTP request, WebSocket and SSE stream.

Theory of operation
-------------------
:class:`api.fastpath.FastPath` hands each request to :func:`serve` when a quota is configured
(:attr:`api.quota_state.QuotaState.active`); it wraps the request's ``send`` (and ``receive``
where a body must be counted as it is read), so the fast path, the FastAPI routes, forwarded
admin calls and streams are all measured in one place, by what actually crossed the wire. The
common case (a caller under quota sending a produce or an admin read) takes a lean path,
:func:`_metered`: every Python call and frame there was counted
(``benchmarks.auth_callgrind``). Each broker measures what its own clients send and receive
(Kafka: every broker enforces its share); a request another broker forwarded
(``Logbus-Forwarded-By``) was measured where it came in and is not measured again.

What is measured (Kafka's quota types):

* ``producer_byte_rate``: request body bytes of a produce (``POST …/records``): its
  ``Content-Length`` (none when refused unread as too large, 413), or for a chunked body what
  was read; on a WebSocket, every message the client sends.
* ``consumer_byte_rate``: response body bytes of a fetch (``GET …/records``: partition fetches,
  long-polls, group polls, SSE streams); on a WebSocket, every message the broker sends.
* ``request_percentage``: the time the request's own task ran on the event loop (its handler
  time; time spent waiting — a long-poll, a disk read in a thread — is not counted), as a
  share of one second (100 = one event loop; Kafka: one handler thread).
* ``controller_mutation_rate``: partitions created, deleted or added (KIP-599, strict): while
  the caller's bucket is negative the request is refused with 429
  ``THROTTLING_QUOTA_EXCEEDED`` and its throttle time; an accepted one takes its partitions.

How a client over quota is slowed (never refused, mutations aside):

* **HTTP.** Before a request is served, the broker waits out the throttle its past traffic
  earned (``(O - T) / T * W``, at most ``max_throttle_ms``), with ``asyncio.sleep``: the
  request holds no broker memory while it waits (its body stays in the socket), and other
  clients are not affected. The answer carries ``Logbus-Throttle-Time-Ms`` (the throttle after
  this request: how long the client should pause before the next one; a client that obeys it
  is never held), ``Retry-After`` when that is positive, and for byte quotas the IETF draft's
  ``RateLimit-Policy`` / ``RateLimit`` fields. A throttled fetch is answered later, not
  larger: it reads at most what the quota allows in one sample window
  (``max_value_in_window``: ``max_bytes`` is lowered to it), and the long-poll's ``wait_ms``
  counts from when the request came, so the throttle does not add to the wait.
* **Streams (SSE, WebSocket pushes).** Each chunk sent is recorded; the chunk after it waits
  out the throttle before it goes. The stream's producer is blocked in ``send`` meanwhile, so
  it reads nothing more: pushes slow down, nothing queues. A WebSocket client's messages are
  read only after their throttle, so a flooding producer is slowed by TCP backpressure.

Every delay is bounded (``max_throttle_ms``; request time: one window), so a connection holds
at most one chunk or one message while it waits.
"""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import Awaitable, Callable, Coroutine, Generator
from typing import Any, Final
from urllib.parse import parse_qsl, urlencode

import orjson
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from auth_quotas.errors import ThrottlingQuotaExceededError
from auth_quotas.quotas import Meter, QuotaType, Resolution, Throttle, max_value_in_window
from core_log.errors import LogbusError

from .connections import BUILT_FIELDS_KEY, WHOLE_BODY_KEY
from .guard import request_headers
from .problems import PROBLEM_JSON, problem_bytes
from .quota_state import CLIENT_ID_HEADER, QuotaState, client_id, quota_user

_PRODUCE: Final = re.compile(r"^/v1/topics/[^/]+(?:/partitions/[^/]+)?/records/?$")
_FETCH: Final = re.compile(r"^/v1/(?:topics|groups)/[^/]+/(?:partitions|members)/[^/]+/records/?$")
_CREATE: Final = re.compile(r"^/v1/topics/?$")
_TOPIC: Final = re.compile(r"^/v1/topics/([^/]+)/?$")
_ADD_PARTITIONS: Final = re.compile(r"^/v1/topics/([^/]+)/partitions/?$")
MAX_CAPTURED_BYTES: Final = 64 * 1024  # an admin answer read back for its partition count
_FORWARDED_BY_NAME: Final = "logbus-forwarded-by"
_CLIENT_ID_NAME: Final = CLIENT_ID_HEADER.decode()

P = QuotaType.PRODUCER_BYTE_RATE
C = QuotaType.CONSUMER_BYTE_RATE
R = QuotaType.REQUEST_PERCENTAGE


class _TimedPy:
    """Awaits a coroutine, adding up the time its own steps ran (``ns``): the request's
    handler time on the event loop, without the time it waited. The Python twin of
    ``api._steptimer.StepTimer`` (C, used when built: this trampoline costs a Python frame per
    step and a StopIteration at the end, ~26k instructions of every request under
    ``request_percentage``)."""

    __slots__ = ("_coro", "_step_start", "ns")

    def __init__(self, coro: Coroutine[Any, Any, Any]) -> None:
        self._coro = coro
        self.ns = 0
        self._step_start = 0

    def so_far(self) -> int:
        """Handler time including the step running now."""
        return self.ns + (time.perf_counter_ns() - self._step_start if self._step_start else 0)

    def __await__(self) -> Generator[Any, Any, Any]:
        coro = self._coro
        clock = time.perf_counter_ns
        value: Any = None
        error: BaseException | None = None
        while True:
            self._step_start = clock()
            try:
                yielded = coro.send(value) if error is None else coro.throw(error)
            except StopIteration as stop:
                return stop.value
            finally:
                self.ns += clock() - self._step_start
                self._step_start = 0
            value, error = None, None
            try:
                value = yield yielded
            except BaseException as e:  # cancellation, passed on into the handler
                error = e


_Timed: type[_TimedPy] | type[StepTimer]
try:
    from ._steptimer import StepTimer

    _Timed = StepTimer
except ImportError:  # built with LOGBUS_PURE_PYTHON=1
    _Timed = _TimedPy


class _Pacer:
    """A stream's throttle: each chunk recorded when sent; the next waits out what it owes."""

    __slots__ = ("_due", "_quotas", "_res", "_type", "last")

    def __init__(self, quotas: QuotaState, quota_type: QuotaType, res: Resolution) -> None:
        self._quotas = quotas
        self._type = quota_type
        self._res = res
        self._due = 0.0  # loop time before which the next chunk waits
        self.last: Throttle | None = None

    async def before(self) -> None:
        loop = asyncio.get_running_loop()
        wait = self._due - loop.time()
        if wait > 0:
            await asyncio.sleep(wait)

    def sent(self, size: int) -> None:
        self.last = t = self._quotas.record(self._type, self._res, size)
        if t.throttle_time_ms:
            self._due = asyncio.get_running_loop().time() + t.throttle_time_ms / 1000


def _no_partitions(topic: str) -> int:
    return 0


def serve(
    quotas: QuotaState,
    scope: Scope,
    receive: Receive,
    send: Send,
    app: ASGIApp,
    *,
    partitions: Callable[[str], int] = _no_partitions,
    default_fetch_bytes: int = 1024 * 1024,
) -> Awaitable[None]:
    """Serve one request or socket through ``app``, measured and throttled: what to await.
    ``partitions``: a topic's partition count (0 unknown), for the permits of a deletion or
    partition increase; ``default_fetch_bytes``: what a fetch without ``max_bytes`` reads.
    Not a coroutine, nor is what it returns when nothing is measured: the gate adds no frame
    to a request's stack, which every step of its handler would pass through."""
    # What the gate reads, from the headers as the front door decoded them (the last of a
    # repeated one); the raw list only for those that may come more than once.
    headers = request_headers(scope)
    if _FORWARDED_BY_NAME in headers:  # measured where it came in
        return app(scope, receive, send)
    raw = scope["headers"]
    is_ws = scope["type"] == "websocket"
    query_too = is_ws or asks_event_stream(headers, raw)
    client = ""  # what client_id says of a request that names none
    if _CLIENT_ID_NAME in headers or query_too:
        values = None  # client_id reads them from the raw list, where a name may repeat
        if _CLIENT_ID_NAME in headers and len(headers) == len(raw):  # no name repeats
            values = [headers[_CLIENT_ID_NAME]]
        try:
            client = client_id(scope, query_too=query_too, values=values)
        except LogbusError as e:  # refused with or without quotas
            return _refuse(scope, send, e, {})
    if not quotas.active:
        return app(scope, receive, send)
    declared = _declared(headers)
    user = quota_user(scope)
    if is_ws:
        return _websocket(quotas, user, client, scope, receive, send, app)
    return _http(
        quotas, user, client, declared, scope, receive, send, app, partitions, default_fetch_bytes
    )


def _http(
    quotas: QuotaState,
    user: str,
    client: str,
    declared: int | None,
    scope: Scope,
    receive: Receive,
    send: Send,
    app: ASGIApp,
    partitions: Callable[[str], int],
    default_fetch_bytes: int,
) -> Awaitable[None]:
    """What serves an HTTP request: the app itself when no quota applies to the caller, the
    lean :func:`_metered` for the common case (no mutation, no fetch, a declared body, not
    throttled now), else :func:`_gated`. ``declared``: the body's declared size."""
    method, path = scope["method"], scope["path"]
    kind = _KINDS.get((method, path)) or request_kind(method, path)  # its memo, inlined
    if kind in ("produce", "other"):
        byte_type = P if kind == "produce" else None
        meter = quotas.meter(user, client, byte_type)
        if meter is None:
            return app(scope, receive, send)  # no quota applies: nothing to measure
        if byte_type is None:
            declared = 0
        if declared is not None:
            metered = _metered(quotas, meter, scope, receive, send, app, declared)
            if metered is not None:
                return metered
    return _gated(
        quotas, user, client, kind, scope, receive, send, app, partitions, default_fetch_bytes
    )


def serve_known(
    quotas: QuotaState,
    meter: Meter | None,
    produce: bool,
    scope: Scope,
    receive: Receive,
    send: Send,
    app: ASGIApp,
) -> Awaitable[None] | None:
    """What :func:`serve` serves an HTTP request with, for a request whose caller was
    admitted before (:mod:`api.admission`: its client id checked, ``meter`` found, None when
    no quota applies; ``produce``: a produce, else a request that is no fetch and no
    mutation). None: this request needs :func:`serve` (its body's size is not declared, or
    its caller owes a wait). Only what varies between a caller's requests is looked at."""
    if meter is None:
        return app(scope, receive, send)
    declared = _declared(request_headers(scope)) if produce else 0
    if declared is None:
        return None
    return _metered(quotas, meter, scope, receive, send, app, declared)


def asks_event_stream(headers: dict[str, str], raw: list[tuple[bytes, bytes]]) -> bool:
    """Whether a request (its decoded ``headers``, its ``raw`` list) asks for an event
    stream, which may name its client id in the query."""
    return "accept" in headers and any(
        k == b"accept" and b"text/event-stream" in v.lower() for k, v in raw
    )


def _declared(headers: dict[str, str]) -> int | None:
    """The body's declared size, None when not declared (isdecimal: latin-1's "²" is a
    digit to isdigit, not to int)."""
    length = headers.get("content-length", "")
    return int(length) if length.isdecimal() and len(length) < 20 else None


async def _refuse(scope: Scope, send: Send, error: LogbusError, headers: dict[str, str]) -> None:
    if scope["type"] == "websocket":
        await send({"type": "websocket.close", "code": 4400 if error.http_status == 400 else 4429})
        return
    body = problem_bytes(error)
    raw = [
        (b"content-type", PROBLEM_JSON.encode()),
        (b"content-length", str(len(body)).encode()),
        *((k.lower().encode(), v.encode()) for k, v in headers.items()),
    ]
    await send({"type": "http.response.start", "status": error.http_status, "headers": raw})
    await send({"type": "http.response.body", "body": body})


async def _websocket(
    quotas: QuotaState,
    user: str,
    client: str,
    scope: Scope,
    receive: Receive,
    send: Send,
    app: ASGIApp,
) -> None:
    produce = quotas.resolve(P, user, client)
    consume = quotas.resolve(C, user, client)
    cap_s = quotas.config.throttle_cap_ms / 1000

    async def paced_receive() -> Message:
        message = await receive()
        if produce is not None and message["type"] == "websocket.receive":
            data = message.get("bytes") or message.get("text") or b""
            t = quotas.record(P, produce, len(data))
            if t.throttle_time_ms:  # read on only after the throttle: TCP pushes back
                await asyncio.sleep(min(t.throttle_time_ms / 1000, cap_s))
        return message

    pacer = None if consume is None else _Pacer(quotas, C, consume)

    async def paced_send(message: Message) -> None:
        if pacer is not None and message["type"] == "websocket.send":
            await pacer.before()
            data = message.get("bytes") or message.get("text") or b""
            await send(message)
            pacer.sent(len(data))
            return
        await send(message)

    await app(scope, paced_receive if produce is not None else receive, paced_send)


_KINDS: dict[tuple[str, str], str] = {}
KIND_CACHE_ENTRIES: Final = 4096  # distinct (method, path) remembered; clients repeat theirs


def request_kind(method: str, path: str) -> str:
    """What a request is to the quotas (produce, fetch, a mutation or other), remembered per
    (method, path): the patterns cost more than the lookup (measured with callgrind:
    ≈ 3.1k instructions a request matched, ≈ 0.6k remembered)."""
    key = (method, path)
    found = _KINDS.get(key)
    if found is None:
        found = _kind_of(method, path)
        if len(_KINDS) >= KIND_CACHE_ENTRIES:
            _KINDS.clear()
        _KINDS[key] = found
    return found


def _kind_of(method: str, path: str) -> str:
    if method == "POST" and _PRODUCE.match(path):
        return "produce"
    if method == "GET" and _FETCH.match(path):
        return "fetch"
    if method == "POST" and _CREATE.match(path):
        return "create"
    if method == "DELETE" and _TOPIC.match(path):
        return "delete"
    if method == "POST" and _ADD_PARTITIONS.match(path):
        return "add"
    return "other"


async def _gated(
    quotas: QuotaState,
    user: str,
    client: str,
    kind: str,
    scope: Scope,
    receive: Receive,
    send: Send,
    app: ASGIApp,
    partitions: Callable[[str], int],
    default_fetch_bytes: int,
) -> None:
    """Any request, measured and throttled: waits out what the caller owes, counts a body
    as it is read, paces a streamed answer, takes a mutation's permits."""
    mutation = kind in ("create", "delete", "add")
    if mutation:
        refused_ms = quotas.mutation_refused_ms(user, client)
        if refused_ms:
            error = ThrottlingQuotaExceededError(refused_ms)
            headers = {
                "Logbus-Throttle-Time-Ms": str(refused_ms),
                "Retry-After": str(-(-refused_ms // 1000)),
            }
            await _refuse(scope, send, error, headers)
            return
    byte_type = P if kind == "produce" else C if kind == "fetch" else None
    meter = quotas.meter(user, client, byte_type)
    if meter is None and not mutation:
        await app(scope, receive, send)  # no quota applies to this caller: nothing to measure
        return
    owed = 0
    if meter is not None:
        # Wait out what past traffic earned, holding nothing (the body is still in the socket).
        owed = quotas.owed(meter)
        if owed:
            await asyncio.sleep(owed / 1000)
        if kind == "fetch" and meter.byte_sensor is not None:
            scope = _clamped_fetch(scope, meter.byte_limit, quotas, owed, default_fetch_bytes)
    before = 0
    if kind in ("delete", "add"):
        named = (_TOPIC if kind == "delete" else _ADD_PARTITIONS).match(scope["path"])
        before = partitions(named[1]) if named is not None else 0

    received = 0

    async def counted_receive() -> Message:
        nonlocal received
        message = await receive()
        if message["type"] == "http.request":
            received += len(message.get("body", b""))
        return message

    status = 0
    captured: list[bytes] = []
    captured_size = 0
    pacer: _Pacer | None = None
    timed: _TimedPy | StepTimer | None = None
    byte_res = None if meter is None else meter.byte_res

    async def gated_send(message: Message) -> None:
        nonlocal status, pacer, captured_size
        if message["type"] == "http.response.start":
            status = message["status"]
            whole: bytes | None = message.get(WHOLE_BODY_KEY)  # a whole answer's body
            if meter is not None:
                value = received
                if byte_type is C and byte_res is not None:
                    length = _content_length(message.get("headers", ()))
                    if whole is not None:  # its Content-Length is the server's to write
                        value = len(whole)
                    elif length is not None and length.isdigit():
                        value = int(length)
                    else:  # a stream: measured chunk by chunk
                        pacer = _Pacer(quotas, C, byte_res)
                        value = 0
                fields = quotas.charge(meter, value, 0 if timed is None else timed.so_far())
                message = {**message, "headers": [*message.get("headers", ()), *fields]}
            if whole is not None and mutation and 200 <= status < 300:
                captured.append(whole[:MAX_CAPTURED_BYTES])
                captured_size += len(captured[-1])
        elif message["type"] == "http.response.body":
            body = message.get("body", b"")
            if pacer is not None and body:
                await pacer.before()
                await send(message)
                pacer.sent(len(body))
                return
            if mutation and 200 <= status < 300 and captured_size < MAX_CAPTURED_BYTES:
                captured.append(bytes(body))
                captured_size += len(body)
        await send(message)

    # Only what a quota reads is wrapped: the body count (produce), the handler's time.
    measured = meter is not None and byte_type is P and meter.byte_sensor is not None
    handler = app(scope, counted_receive if measured else receive, gated_send)
    try:
        if meter is not None and meter.time_sensor is not None:
            timed = _Timed(handler)  # type: ignore[arg-type]  # the app's coroutine
            await timed
        else:
            await handler
    finally:
        if mutation and 200 <= status < 300:
            quotas.mutation_done(user, client, _permits(kind, before, b"".join(captured)))


def _metered(
    quotas: QuotaState,
    meter: Meter,
    scope: Scope,
    receive: Receive,
    send: Send,
    app: ASGIApp,
    body_bytes: int,
) -> Awaitable[None] | None:
    """The common case, kept lean (it runs on every produce of a caller under quota): a
    request that is no mutation and no fetch, whose body size is declared (``body_bytes``,
    0 when it is not a produce), from a caller who owes no wait (None when it owes one: then
    :func:`_gated` serves it). Its answer is recorded with
    ``body_bytes`` (refused as too large: 0, it was never read) when it starts, at the time it
    starts (an ``acks=all`` produce may wait many sample windows). Nothing but that one
    message is touched, and no frame of the gate's stays on the request's stack."""
    # Owes no wait (QuotaSensors.owed, inlined): a sensor that never throttled (due 0) owes
    # nothing on a clock that starts at 0, so the clock is read only for one that did.
    byte, time_ = meter.byte_sensor, meter.time_sensor
    if (byte is not None and byte.due_ms) or (time_ is not None and time_.due_ms):
        now = quotas.clock()
        if (byte is not None and byte.due_ms > now) or (time_ is not None and time_.due_ms > now):
            return None
    timed: _TimedPy | StepTimer | None = None

    def gated_send(message: Message) -> Awaitable[None]:
        # Not a coroutine: the app awaits ``send``'s own. (``quotas`` read here rather than
        # its charge and clock captured: two cells fewer to make per request, ≈ 0.6k
        # instructions, benchmarks.quota_charge.)
        if WHOLE_BODY_KEY in message:  # a whole answer, made for this send: no copy
            value = 0 if message["status"] == 413 else body_bytes
            handler_ns = 0 if timed is None else timed.so_far()
            built = message.get(BUILT_FIELDS_KEY)  # the server writes these unchecked
            fields = quotas.sensors.charge(meter, value, handler_ns, quotas.clock(), built)
            if built is None:
                message[BUILT_FIELDS_KEY] = fields
            return send(message)
        if message["type"] == "http.response.start":
            value = 0 if message["status"] == 413 else body_bytes
            headers = [*message.get("headers", ())]
            handler_ns = 0 if timed is None else timed.so_far()
            quotas.sensors.charge(meter, value, handler_ns, quotas.clock(), headers)
            message = dict(message)  # the app's own message left as it was (≈ 0.5k fewer
            message["headers"] = headers  # instructions than {**message, "headers": …})
        return send(message)

    handler = app(scope, receive, gated_send)
    if meter.time_sensor is None:
        return handler
    timed = _Timed(handler)  # type: ignore[arg-type]  # the app's coroutine
    return timed


def _content_length(headers: list[tuple[bytes, bytes]]) -> bytes | None:
    return next((v for k, v in headers if k.lower() == b"content-length"), None)


def _permits(kind: str, before: int, answer: bytes) -> int:
    """Partitions a successful mutation created, deleted or added (Kafka's permits)."""
    if kind == "delete":
        return max(before, 1)
    try:
        doc = orjson.loads(answer)
        count = int(doc["partitions"]) if isinstance(doc, dict) else 0
    except (orjson.JSONDecodeError, KeyError, TypeError, ValueError):
        count = 0
    if kind == "create":
        return max(count, 1)
    return max(count - before, 1)


def _clamped_fetch(
    scope: Scope, limit: float, quotas: QuotaState, owed_ms: int, default_bytes: int
) -> Scope:
    """A throttled fetch reads no more than the quota allows in one window, and its long-poll
    wait counts from when it came (the throttle already spent part of it)."""
    cap = max(1, int(max_value_in_window(limit, quotas.config)))
    query = parse_qsl(scope["query_string"].decode("latin-1"), keep_blank_values=True)
    out: list[tuple[str, str]] = []
    seen = False
    for k, v in query:
        if k == "max_bytes" and v.isdigit() and len(v) < 20:
            seen = True
            v = str(min(int(v), cap))
        elif k == "wait_ms" and owed_ms and v.isdigit() and len(v) < 20:
            v = str(max(int(v) - owed_ms, 0))
        out.append((k, v))
    if not seen and cap < default_bytes:
        out.append(("max_bytes", str(cap)))
    return {**scope, "query_string": urlencode(out).encode("latin-1")}
