"""Connections under limits: uvicorn's protocols, plus timeouts for heads, idleness and stalls.

Theory of operation
-------------------
uvicorn times out an idle keep-alive connection only *after* a first answer, and nothing
else: 10,100 connections that sent nothing (or half a request head) stayed open forever, and
its ``limit_concurrency`` then answered 503 to every request of every client. Here:

* **Head timeout** (``header_timeout_ms``, 10 s): from the moment a connection opens, or the
  first byte of its next request arrives, the request head must be complete in time, or the
  connection is closed (as nginx's ``client_header_timeout``).
* **Idle timeout** (``keep_alive_timeout_ms``, 5 s, uvicorn's default): between requests.
* **Body timeout** (``body_timeout_ms``, 30 s): a request body that stops arriving for that
  long is answered ``408 REQUEST_TIMEOUT`` (problem+json, ``Connection: close``) and the app
  sees the client go away. One timer per stalled body, none for a body that arrives with its
  head (a per-``receive`` ``asyncio.timeout`` cost 25-35 µs per request on this machine).
* **Send timeout** (``send_timeout_ms``, 30 s): an answer whose client takes no bytes for that
  long (the transport stays above its high-water mark) is aborted, which frees the buffer it
  pinned — for HTTP answers, SSE streams and WebSockets alike.
* **Client certificates** (mTLS): with TLS and a client CA, the verified certificate's user
  (:func:`peer_user`) is read once per connection and put in each request's scope, where
  :mod:`api.access` takes it as the principal when the request sends no other credential.
* **One write per answer**: uvicorn writes an answer's head and its body with two
  ``transport.write`` calls, and uvloop sends each at once: two ``send`` syscalls, and on
  loopback the client may wake for the head alone. :class:`HeadHeld` (the transport as each
  request's cycle sees it) holds the head of an answer with a Content-Length until the
  body's first bytes and sends both with one ``writelines`` (one ``writev``). The bytes on
  the wire are the same.
* **Connection cap** (``max_connections``, Kafka's ``max.connections``): a new connection
  past it closes the connection that has been idle longest (no request in flight); if every
  connection is busy the new one is refused at accept. A flood of idle sockets thus never
  locks out a new client, and nobody is answered 503 for it.

:class:`ConnectionGate` is the sans-I/O part (who is idle, who gives way); the protocol
classes are thin subclasses of uvicorn's httptools and websockets-sansio protocols.
"""

from __future__ import annotations

import asyncio
import re
import resource
from asyncio import TimerHandle
from collections.abc import Awaitable, Generator
from typing import Any, Literal

import httptools
from uvicorn.protocols.http import httptools_impl
from uvicorn.protocols.http.flow_control import HIGH_WATER_LIMIT
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
from uvicorn.protocols.websockets.websockets_sansio_impl import WebSocketsSansIOProtocol

from auth_quotas.credentials import PEER_USER_SCOPE_KEY, AuthenticationError, user_from_peercert
from core_log.errors import ErrorCode, LogbusError

from .problems import PROBLEM_JSON, problem_bytes

# File descriptors kept for everything but client sockets when the cap is clamped to the
# process's open-file limit: segment handles (max_open_handles) plus this many for SQLite,
# the listening socket, pipes and the executors' files.
RESERVED_FDS = 256


def raise_open_file_limit() -> int:
    """Raise the soft RLIMIT_NOFILE to the hard limit (as many servers do at start); return it."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY:
        hard = max(soft, 1 << 20)
    if soft < hard:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
            soft = hard
        except (ValueError, OSError):
            pass
    return soft


def connection_cap(max_connections: int, open_files: int, segment_handles: int) -> int:
    """``max_connections``, lowered so that accepting never fails for want of a descriptor."""
    return max(1, min(max_connections, open_files - segment_handles - RESERVED_FDS))


class ConnectionGate:
    """Counts open connections and picks which one gives way at the cap.

    A connection is *idle* from when it opens or finishes an answer until its next request
    head is complete; the dict keeps idle connections in the order they became idle.
    """

    def __init__(self, cap: int) -> None:
        self.cap = cap
        self.open = 0
        self.refused = 0  # connections refused at accept (every other one was busy)
        self.evicted = 0  # idle connections closed to make room
        self._idle: dict[Any, None] = {}

    def admit(self) -> tuple[bool, Any | None]:
        """A connection arrives: (admitted, idle connection to close first or None)."""
        if self.open < self.cap:
            self.open += 1
            return True, None
        if self._idle:
            victim = next(iter(self._idle))
            del self._idle[victim]
            self.evicted += 1
            self.open += 1
            return True, victim
        self.refused += 1
        return False, None

    def idle(self, conn: Any) -> None:
        self._idle.pop(conn, None)
        self._idle[conn] = None

    def busy(self, conn: Any) -> None:
        self._idle.pop(conn, None)

    def closed(self, conn: Any) -> None:
        self._idle.pop(conn, None)
        self.open -= 1


class _StallTimer:
    """Aborts a transport whose write buffer stays above its high-water mark too long."""

    def __init__(self, timeout_s: float) -> None:
        self.timeout_s = timeout_s
        self.handle: TimerHandle | None = None

    def paused(self, loop: asyncio.AbstractEventLoop, transport: asyncio.Transport) -> None:
        if self.handle is None:
            self.handle = loop.call_later(self.timeout_s, transport.abort)

    def resumed(self) -> None:
        if self.handle is not None:
            self.handle.cancel()
            self.handle = None


class _StallOnPause:
    """Flow control arms the send timeout: the transport's buffer filled up (the client takes
    nothing) starts the timer, draining it stops the timer. For both protocols below."""

    _stall: _StallTimer
    loop: asyncio.AbstractEventLoop
    transport: asyncio.Transport

    def pause_writing(self) -> None:
        self._stall.paused(self.loop, self.transport)
        super().pause_writing()  # type: ignore[misc]

    def resume_writing(self) -> None:
        self._stall.resumed()
        super().resume_writing()  # type: ignore[misc]


def peer_user(transport: asyncio.BaseTransport, mapping: Literal["dn", "cn"] | None) -> str | None:
    """The user a TLS connection's verified client certificate names (mTLS), or None: no
    mapping configured, no TLS, no certificate, or one without a usable subject (the request
    then needs another credential). Read once per connection, at the handshake."""
    if mapping is None:
        return None
    cert = transport.get_extra_info("peercert")
    if not cert:
        return None
    try:
        return user_from_peercert(cert, mapping)
    except AuthenticationError:
        return None


class LimitedWebSocketProtocol(_StallOnPause, WebSocketsSansIOProtocol):
    """uvicorn's WebSocket protocol with a send timeout (set per broker by the factory)."""

    send_timeout_s: float = 30.0
    gate: ConnectionGate | None = None
    peer_mapping: Literal["dn", "cn"] | None = None

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._stall = _StallTimer(self.send_timeout_s)
        self._peer_user: str | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        self._peer_user = peer_user(transport, self.peer_mapping)

    def handle_connect(self, event: Any) -> None:
        super().handle_connect(event)  # builds the scope; the app's task runs later
        if self._peer_user is not None and getattr(self, "scope", None) is not None:
            self.scope[PEER_USER_SCOPE_KEY] = self._peer_user  # type: ignore[literal-required]

    def connection_lost(self, exc: Exception | None) -> None:
        self._stall.resumed()
        if self.gate is not None:
            self.gate.closed(self)
        super().connection_lost(exc)


class HeadHeld:
    """The connection's transport as uvicorn's request cycle sees it: the head of an answer
    with a Content-Length is held and goes out with the body's first bytes in one
    ``writelines`` (one ``writev``). A held head goes out alone when the answer completes with
    no body write (HEAD, an empty body) or the cycle closes the connection. Heads without a
    Content-Length (chunked streams: SSE), ``100 Continue`` and bodies pass straight through.
    One per connection; the protocol calls :meth:`flush` when an answer completes."""

    __slots__ = ("held", "transport")

    def __init__(self, transport: asyncio.Transport) -> None:
        self.transport = transport
        self.held: bytes | None = None  # a head waiting for its body

    def write(self, data: bytes | memoryview) -> None:
        held = self.held
        if held is not None:
            self.held = None
            self.transport.writelines((held, data))
        elif type(data) is bytes and data.startswith(_STATUS_LINE) and _CONTENT_LENGTH in data:
            self.held = data
        else:
            self.transport.write(data)

    def writelines(self, data: tuple[bytes, ...]) -> None:
        """Write ``data`` after a held head, in one ``writelines``."""
        held, self.held = self.held, None
        self.transport.writelines(data if held is None else (held, *data))

    def flush(self) -> None:
        """Send a held head, if any."""
        held, self.held = self.held, None
        if held is not None:
            self.transport.write(held)

    def close(self) -> None:
        self.flush()
        self.transport.close()

    def is_closing(self) -> bool:
        return self.transport.is_closing()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.transport, name)


# How uvicorn writes a head: its status line, then each header lowered with ": " after. A
# body written while nothing is held is held too only if it looks the same; it then goes out
# with the next write or when the answer completes, in order either way (a chunked stream's
# writes start with a hex length, never like this).
_STATUS_LINE = b"HTTP/1.1 "
_CONTENT_LENGTH = b"\r\ncontent-length: "


# The scope key by which the broker's protocol says a request's cycle is a :class:`WholeCycle`
# (True), and the key of an ``http.response.start`` message that carries the whole answer's
# body. (Not the cycle itself in the scope: its scope would then hold it, a reference cycle
# per request that only the collector frees; the lean lane finds it as ``receive``'s owner.)
WHOLE_ANSWERS_KEY = "logbus.whole_answers"
WHOLE_BODY_KEY = "logbus.body"
# A whole answer's fields that the broker built itself from constants and numbers (the
# quota's throttle fields: api.quota_gate): lower-case names, valid by construction
# (tests/auth_quotas/test_quotas.py), none that uvicorn acts on (Content-Length,
# Connection, Transfer-Encoding). Written as they are, after the checked ones.
BUILT_FIELDS_KEY = "logbus.built_fields"
_WHOLE_KEYS = frozenset((WHOLE_BODY_KEY, BUILT_FIELDS_KEY))


class _Done:
    """An awaitable that is already done (what :meth:`WholeCycle.send` hands back when it
    wrote the answer at once): no coroutine to make and run."""

    __slots__ = ()

    def __await__(self) -> Generator[None, None, None]:
        return iter(())  # type: ignore[return-value]


_DONE = _Done()

# Fields whose meaning uvicorn's ``send`` acts on besides Content-Length; an answer with one
# goes through it.
_UVICORNS_FIELDS = frozenset((b"transfer-encoding", b"connection"))


class WholeCycle(httptools_impl.RequestResponseCycle):
    """uvicorn's request cycle, with the two shortcuts of the broker's lean lane
    (:mod:`api.fastpath`) for a request whose body has all arrived with its head (most
    small produces):

    * :meth:`arrived` and :meth:`take_body` hand over the body that has arrived, without
      ``receive``'s event and message dict;
    * :meth:`send` writes a whole answer from one ``http.response.start`` message that
      carries its body under ``WHOLE_BODY_KEY`` (and, under ``BUILT_FIELDS_KEY``, fields
      the broker built itself, written unchecked; a Content-Length the body's when the
      message has none): head and body in one ``writelines``, no second message, no
      second trip through every ``send`` wrapper (the quota's, the CORS headers', the
      access log's pass the message on as it is, keys included).

    Everything else is uvicorn's: a message without the key, and a whole answer that cannot
    go out at once (the transport's buffer is full, an answer already started, a HEAD
    request), take uvicorn's ``send`` (the latter as two messages). The fields are checked
    as uvicorn checks them (an invalid name or value raises), ``Connection: close`` ends a
    connection as it does, and the bytes on the wire are those uvicorn writes for the same
    two messages.
    """

    def arrived(self) -> int:
        """The size of the request's body if it has all arrived and none of it has been
        received, else -1 (then the app reads it with ``receive``)."""
        if (
            self.more_body
            or self.disconnected
            or self.response_complete
            or self.waiting_for_100_continue
        ):
            return -1
        return len(self.body)

    def take_body(self) -> bytes:
        """The body :meth:`arrived` measured, handed over: ``receive`` then has none."""
        body = bytes(self.body)
        self.body = bytearray()
        return body

    def send(self, message: Any) -> Awaitable[None]:  # type: ignore[override]
        body: bytes | None = message.get(WHOLE_BODY_KEY)
        if body is None:
            return super().send(message)
        if (
            self.response_started
            or self.disconnected
            or self.flow.write_paused
            or self.scope["method"] == "HEAD"
        ):
            return self._send_two(message, body)
        status: int = message["status"]
        content = [httptools_impl.STATUS_LINE[status]]
        length: bytes | None = None
        close = not self.keep_alive
        # The server's own fields (its date: the broker configures no others) as it wrote
        # them, then the answer's, checked, then those the broker built.
        for name, value in self.default_headers:
            content.extend((name, b": ", value, b"\r\n"))
        header_re, value_re = httptools_impl.HEADER_RE, httptools_impl.HEADER_VALUE_RE
        for name, value in message.get("headers", ()):
            if header_re.search(name):
                raise RuntimeError("Invalid HTTP header name.")
            if value_re.search(value):
                raise RuntimeError("Invalid HTTP header value.")
            name = name.lower()
            if name == b"content-length":
                length = value if length is None else length
            elif name in _UVICORNS_FIELDS:
                return self._send_two(message, body)  # its rules, not repeated here
            content.extend((name, b": ", value, b"\r\n"))
        for name, value in message.get(BUILT_FIELDS_KEY, ()):
            content.extend((name, b": ", value, b"\r\n"))
        if length is None:  # the body's, last, as _send_two hands it to uvicorn
            content.append(b"content-length: %d\r\n" % len(body))
        elif not length.isdigit() or int(length) != len(body):
            return self._send_two(message, body)  # uvicorn says what is wrong with it
        if close:
            content.append(b"connection: close\r\n")
        content.append(b"\r\n")
        self.response_started = True
        self.waiting_for_100_continue = False
        self.response_complete = True
        self.transport.writelines((b"".join(content), body))
        self.message_event.set()
        if close:
            self.transport.close()
        self.on_response()
        return _DONE

    async def _send_two(self, message: Any, body: bytes) -> None:
        start: Any = {k: v for k, v in message.items() if k not in _WHOLE_KEYS}
        fields = [*message.get("headers", ()), *message.get(BUILT_FIELDS_KEY, ())]
        if not any(name.lower() == b"content-length" for name, _ in fields):
            fields.append((b"content-length", b"%d" % len(body)))
        start["headers"] = fields
        await super().send(start)
        await super().send({"type": "http.response.body", "body": body, "more_body": False})


class LimitedHttpProtocol(_StallOnPause, HttpToolsProtocol):
    """uvicorn's httptools protocol with a head timeout, a send timeout and the gate."""

    header_timeout_s: float = 10.0
    body_timeout_s: float = 30.0
    send_timeout_s: float = 30.0
    gate: ConnectionGate = ConnectionGate(10_000)
    peer_mapping: Literal["dn", "cn"] | None = None

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._peer_user: str | None = None
        # The head timeout's one timer per connection, re-armed lazily: a request moves the
        # deadline (a float) instead of creating and cancelling a timer (≈ 4.5 µs under uvloop).
        self._head_timer: TimerHandle | None = None
        self._head_deadline = 0.0
        self._head_armed = False  # a head is being awaited: the deadline applies
        self._in_head = True  # no request head complete since the last answer
        self._admitted = False
        self._stall = _StallTimer(self.send_timeout_s)
        self._body_pending = False  # a request head is complete, its body is not
        self._body_progress = 0.0  # loop time of the last body bytes (or of the head)
        self._body_timer: TimerHandle | None = None
        self._head_held: HeadHeld | None = None
        # The keep-alive timeout's one timer, re-armed lazily as the head timer is.
        self._idle_timer: TimerHandle | None = None
        self._idle_deadline = 0.0
        self._idle_armed = False

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        admitted, victim = self.gate.admit()
        if not admitted:
            transport.abort()
            return
        self._admitted = True
        if victim is not None:
            victim.transport.close()
        super().connection_made(transport)
        self._head_held = HeadHeld(transport)
        self._peer_user = peer_user(transport, self.peer_mapping)
        self.gate.idle(self)
        self._arm_head_timer()

    def connection_lost(self, exc: Exception | None) -> None:
        if not self._admitted:
            return
        self._admitted = False
        self._drop_head_timer()
        self._cancel_body_timer()
        self._idle_armed = False
        if self._idle_timer is not None:
            self._idle_timer.cancel()
            self._idle_timer = None
        self._stall.resumed()
        self.gate.closed(self)
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        """uvicorn's, in one call (its keep-alive timer is never made here: see
        :meth:`_unset_keepalive_if_required`), plus the head and body timers."""
        if self._in_head and not self._head_armed:
            self._arm_head_timer()
        self._idle_armed = False
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError:
            self.logger.warning(_INVALID_REQUEST)
            self.send_400_response(_INVALID_REQUEST)
        except httptools.HttpParserUpgrade:
            if self._should_upgrade():
                self.handle_websocket_upgrade()
            else:
                self._unsupported_upgrade_warning()
        if self._body_pending and self._body_timer is None and not self.transport.is_closing():
            self._body_timer = self.loop.call_at(
                self._body_progress + self.body_timeout_s, self._body_timed_out
            )

    def on_headers_complete(self) -> None:
        self._in_head = False
        self._head_armed = False  # _cancel_head_timer, inlined: every request passes here
        self.gate.busy(self)
        self._body_pending = True
        self._body_progress = self.loop.time()
        if self._peer_user is not None:  # before the app's task starts (in the super call)
            self.scope[PEER_USER_SCOPE_KEY] = self._peer_user  # type: ignore[literal-required]
        super().on_headers_complete()
        cycle = self.cycle
        if cycle is not None and cycle.scope is self.scope:  # not a WebSocket upgrade
            if self._head_held is not None:
                cycle.transport = self._head_held  # type: ignore[assignment]
            if type(cycle) is WholeCycle:
                self.scope[WHOLE_ANSWERS_KEY] = True  # type: ignore[literal-required]

    def on_body(self, body: bytes) -> None:
        """uvicorn's, in one call, noting when body bytes last came."""
        self._body_progress = self.loop.time()
        if self.parser.should_upgrade() and self._should_upgrade():
            return  # an upgrade's head made no cycle
        cycle = self.cycle
        if cycle.response_complete:
            return
        cycle.body += body
        if len(cycle.body) > HIGH_WATER_LIMIT:
            self.flow.pause_reading()
        cycle.message_event.set()

    def on_message_complete(self) -> None:
        """uvicorn's, in one call, with the body timer stopped."""
        self._body_pending = False
        if self._body_timer is not None:
            self._body_timer.cancel()
            self._body_timer = None
        if self.parser.should_upgrade() and self._should_upgrade():
            return  # an upgrade's head made no cycle
        cycle = self.cycle
        if cycle.response_complete:
            return
        cycle.more_body = False
        cycle.message_event.set()

    def on_response_complete(self) -> None:
        """What uvicorn's does — count the request, read again, start a pipelined request —
        but the keep-alive timeout moves the deadline of one timer per connection instead of
        creating a timer for each answer (which the next request's first bytes then cancel):
        a timer made and cancelled costs ≈ 1-6 µs under uvloop, a deadline moved a float."""
        head_held = self._head_held
        if head_held is not None and head_held.held is not None:
            head_held.flush()
        self.server_state.total_requests += 1
        if self.transport.is_closing():
            return
        if self.flow.read_paused:  # its resume_reading's own test, without the call
            self.flow.resume_reading()
        if self.pipeline:  # the next request starts now: not idle
            cycle, app = self.pipeline.pop()
            self._start_asgi_task(cycle, app)
            return
        self._in_head = True
        self.gate.idle(self)
        self._idle_deadline = self.loop.time() + self.timeout_keep_alive
        self._idle_armed = True
        if self._idle_timer is None:
            self._idle_timer = self.loop.call_at(self._idle_deadline, self._idle_timed_out)

    def _unset_keepalive_if_required(self) -> None:
        """uvicorn calls this when the connection is lost (and its ``data_received``, which
        :meth:`data_received` replaces, when bytes arrive): the connection is no longer idle.
        uvicorn's own cancels its keep-alive timer, which only its ``on_response_complete``
        makes: :meth:`on_response_complete` replaces that, so there is none."""
        self._idle_armed = False

    def _idle_timed_out(self) -> None:
        self._idle_timer = None
        if not self._idle_armed:
            return  # a request came since; its answer arms the deadline again
        if self.loop.time() < self._idle_deadline:  # a later answer moved the deadline
            self._idle_timer = self.loop.call_at(self._idle_deadline, self._idle_timed_out)
            return
        self.timeout_keep_alive_handler()

    def handle_websocket_upgrade(self) -> None:
        """The socket becomes a WebSocket: its protocol tells the gate when it closes."""
        self._drop_head_timer()
        self._body_pending = False
        self._cancel_body_timer()
        self._stall.resumed()
        self.gate.busy(self)
        self._admitted = False
        super().handle_websocket_upgrade()

    def _arm_head_timer(self) -> None:
        self._head_deadline = self.loop.time() + self.header_timeout_s
        self._head_armed = True
        if self._head_timer is None:
            self._head_timer = self.loop.call_at(self._head_deadline, self._head_timed_out)

    def _cancel_head_timer(self) -> None:
        """The head came: the deadline no longer applies (its timer, if it fires, re-arms or
        drops itself)."""
        self._head_armed = False

    def _drop_head_timer(self) -> None:
        self._head_armed = False
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def _cancel_body_timer(self) -> None:
        if self._body_timer is not None:
            self._body_timer.cancel()
            self._body_timer = None

    def _body_timed_out(self) -> None:
        """No body bytes for ``body_timeout_s``: 408 if no answer started, and close."""
        self._body_timer = None
        if not self._body_pending or self.transport.is_closing():
            return
        if self.flow.read_paused:  # the app has not taken what came: not the client's fault
            self._body_progress = self.loop.time()
        due = self._body_progress + self.body_timeout_s
        if self.loop.time() < due:  # bytes came meanwhile: wait for the rest
            self._body_timer = self.loop.call_at(due, self._body_timed_out)
            return
        self._body_pending = False
        cycle = self.cycle
        if cycle is not None and not cycle.response_started:
            self.transport.write(_answer_408(int(self.body_timeout_s * 1000)))
        if cycle is not None:
            cycle.disconnected = True  # the app's receive answers http.disconnect
            cycle.message_event.set()
        self.transport.close()

    def _head_timed_out(self) -> None:
        self._head_timer = None
        if not self._head_armed:
            return  # the head it waited for came; the next one arms a timer again
        if self.loop.time() < self._head_deadline:  # a later head moved the deadline
            self._head_timer = self.loop.call_at(self._head_deadline, self._head_timed_out)
            return
        if self._in_head and not self.transport.is_closing():
            self.transport.close()


_INVALID_REQUEST = "Invalid HTTP request received."  # uvicorn's words for it


def _answer_408(timeout_ms: int) -> bytes:
    error = LogbusError(
        f"no request body bytes for {timeout_ms} ms", code=ErrorCode.REQUEST_TIMEOUT
    )
    body = problem_bytes(error)
    head = (
        "HTTP/1.1 408 Request Timeout\r\n"
        f"content-type: {PROBLEM_JSON}\r\ncontent-length: {len(body)}\r\n"
        "connection: close\r\n\r\n"
    )
    return head.encode() + body


# Header names and values whose check is remembered, per pattern, and the longest value
# remembered: an answer's fields mostly repeat (its content type, a client's RateLimit-Policy,
# the date within a second).
HEADER_CHECKS_MAX = 4096
HEADER_CHECK_MAX_BYTES = 256


class RememberedSearch(dict[bytes, "re.Match[bytes] | None"]):
    """A compiled pattern whose ``search`` remembers its answer for each short subject.

    uvicorn checks every field of every answer with two regular-expression searches (an
    invalid name or value raises), ≈ 1.6 k instructions for a one-byte value and ≈ 4.8 k for
    a 60-byte one (callgrind): the three fields of an answer under a quota cost ≈ 28 k. A
    remembered answer is one lookup, in C (``search`` is the dict's ``__getitem__``); a
    subject seen first, or longer than ``HEADER_CHECK_MAX_BYTES``, is searched as before.
    Same answers, invalid ones included. A one-record produce (date, content type and
    length): 361 k → 354 k instructions (``benchmarks.request_cost --server --callgrind``)."""

    def __init__(self, pattern: re.Pattern[bytes]) -> None:
        super().__init__()
        self.pattern = pattern
        self.search = self.__getitem__

    def __missing__(self, subject: bytes) -> re.Match[bytes] | None:
        found = self.pattern.search(subject)
        if len(subject) <= HEADER_CHECK_MAX_BYTES:
            if len(self) >= HEADER_CHECKS_MAX:
                self.clear()
            self[subject] = found
        return found


def field_passes(name: bytes, value: bytes) -> bool:
    """Whether uvicorn's checks of an answer's field (remembered or not) let it through."""
    return not httptools_impl.HEADER_RE.search(name) and not httptools_impl.HEADER_VALUE_RE.search(
        value
    )


def remember_header_checks() -> None:
    """Make uvicorn's answer-field checks :class:`RememberedSearch` es (once per process; its
    httptools protocol reads the two patterns as module globals at every answer)."""
    for name in ("HEADER_RE", "HEADER_VALUE_RE"):
        pattern = getattr(httptools_impl, name)
        if not isinstance(pattern, RememberedSearch):
            setattr(httptools_impl, name, RememberedSearch(pattern))


def use_whole_cycles() -> None:
    """Make uvicorn's httptools protocol start each request with a :class:`WholeCycle` (once
    per process; the protocol reads the class as a module global at every request head)."""
    if httptools_impl.RequestResponseCycle is not WholeCycle:
        httptools_impl.RequestResponseCycle = WholeCycle  # type: ignore[misc]


def protocols(
    gate: ConnectionGate,
    header_timeout_ms: int,
    body_timeout_ms: int,
    send_timeout_ms: int,
    peer_mapping: Literal["dn", "cn"] | None = None,
) -> tuple[type[LimitedHttpProtocol], type[LimitedWebSocketProtocol]]:
    """Protocol classes bound to one broker's gate, timeouts and client-certificate mapping
    (uvicorn takes classes). Remembers uvicorn's checks of answer fields
    (:func:`remember_header_checks`) and makes its request cycles :class:`WholeCycle` s
    (:func:`use_whole_cycles`)."""
    remember_header_checks()
    use_whole_cycles()
    ws = type(
        "BrokerWebSocketProtocol",
        (LimitedWebSocketProtocol,),
        {"gate": gate, "send_timeout_s": send_timeout_ms / 1000, "peer_mapping": peer_mapping},
    )
    http = type(
        "BrokerHttpProtocol",
        (LimitedHttpProtocol,),
        {
            "gate": gate,
            "header_timeout_s": header_timeout_ms / 1000,
            "body_timeout_s": body_timeout_ms / 1000,
            "send_timeout_s": send_timeout_ms / 1000,
            "peer_mapping": peer_mapping,
        },
    )
    return http, ws
