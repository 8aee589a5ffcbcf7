"""h2c client: one TCP connection to one peer, many concurrent requests multiplexed on it.

The connection is opened lazily by the first request and reopened by the first request after
it died; opening completes when the server's SETTINGS arrive (so its
``SETTINGS_MAX_CONCURRENT_STREAMS`` is known before any stream is opened). Requests beyond
the server's stream limit wait in a queue (at most ``max_queued_requests``; the caller's
``timeout_s`` covers the wait). When the connection dies every pending request fails at
once with :class:`H2TransportError`; after a GOAWAY the streams the server did not take fail
and the next request opens a new connection.

Requests the server provably did not process are sent again, up to ``MAX_RESENDS`` times
within the caller's ``timeout_s``: streams above a GOAWAY's last stream id and streams reset
with REFUSED_STREAM (RFC 9113 §8.7 guarantees the server took no action on them), and
requests still queued for a stream when their connection died. Everything else fails, because
a replication fetch or an admin call may not be idempotent.

A response body is joined once (``b"".join``) when the stream ends; past
``max_response_body_bytes`` the stream is reset and the request raises. ``timeout_s`` covers
connecting, queueing, sending and receiving; on expiry the stream is reset (RST_STREAM
CANCEL), the connection stays up for the other streams, and ``TimeoutError`` is raised.
"""

from __future__ import annotations

import asyncio
import collections
from collections.abc import Sequence
from dataclasses import dataclass, field

import h2.errors
import h2.events

from cluster.h2base import (
    DEFAULT_LIMITS,
    H2Limits,
    H2Protocol,
    H2Response,
    H2TransportError,
    status_of,
)
from cluster.h2frames import BodySink

# A server being restarted sends GOAWAY once; three resends ride out a restart racing a
# second one without looping against a server that refuses everything.
MAX_RESENDS = 3


class H2UnprocessedError(H2TransportError):
    """The server did not process the request (GOAWAY, REFUSED_STREAM, or it never got a
    stream): safe to send again; :class:`H2Client` does so itself."""


@dataclass
class _OutboundStream:
    response: asyncio.Future[H2Response]
    headers: list[tuple[str, str]] = field(default_factory=list)
    chunks: list[bytes | memoryview] = field(default_factory=list)
    size: int = 0
    # The body's preallocated destination when the response announced its content-length.
    sink: BodySink | None = None


class _ClientConnection(H2Protocol):
    def __init__(self, limits: H2Limits, authority: str) -> None:
        super().__init__(limits, client_side=True)
        self.authority = authority
        self.ready: asyncio.Future[None] = self._loop.create_future()
        self.goaway = False
        self._streams: dict[int, _OutboundStream] = {}
        self._active = 0
        self._slot_waiters: collections.deque[asyncio.Future[None]] = collections.deque()

    @property
    def usable(self) -> bool:
        return not self.closed and not self.goaway

    # -- streams ---------------------------------------------------------------------------
    def _stream_limit(self) -> int:
        return min(
            self.h2.remote_settings.max_concurrent_streams, self.limits.max_concurrent_streams
        )

    async def _acquire_slot(self) -> None:
        if self._active < self._stream_limit() and not self._slot_waiters:
            self._active += 1
            return
        if len(self._slot_waiters) >= self.limits.max_queued_requests:
            raise H2TransportError(
                f"{len(self._slot_waiters)} requests already queued for a stream"
            )
        waiter: asyncio.Future[None] = self._loop.create_future()
        self._slot_waiters.append(waiter)
        try:
            await waiter  # _release_slot hands its slot over (the count stays)
        except BaseException:
            if waiter.done() and not waiter.cancelled() and waiter.exception() is None:
                self._release_slot()  # handed a slot but cancelled: pass it on
            elif waiter in self._slot_waiters:
                self._slot_waiters.remove(waiter)
            raise

    def _release_slot(self) -> None:
        while self._slot_waiters and self._active <= self._stream_limit():
            waiter = self._slot_waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)
                return
        self._active -= 1

    async def request(
        self, method: str, path: str, headers: Sequence[tuple[str, str]], body: bytes
    ) -> H2Response:
        await self._acquire_slot()
        try:
            if not self.usable:
                raise H2UnprocessedError("connection closed before the request was sent")
            sid = self.h2.get_next_available_stream_id()
            stream = _OutboundStream(self._loop.create_future())
            self._streams[sid] = stream
            try:
                request_headers = [
                    (":method", method),
                    (":scheme", "http"),
                    (":authority", self.authority),
                    (":path", path),
                    *headers,
                ]
                if body:
                    request_headers.append(("content-length", str(len(body))))
                self.h2.send_headers(sid, request_headers, end_stream=not body)
                if body:  # the HEADERS go out with the body (send_body)
                    await self.send_body(sid, [body], stream.response.done)
                else:
                    self.flush()
                return await stream.response
            finally:
                self._streams.pop(sid, None)
                # Ends the stream on our side if the caller gave up or the answer came
                # before the body was sent; a no-op once both sides ended.
                self.reset_stream(sid, h2.errors.ErrorCodes.CANCEL)
        finally:
            self._release_slot()

    # -- events ----------------------------------------------------------------------------
    def on_event(self, event: h2.events.Event) -> None:
        if isinstance(event, h2.events.RemoteSettingsChanged):
            if not self.ready.done():
                self.ready.set_result(None)
            self._admit_waiters()
        elif isinstance(event, h2.events.ResponseReceived):
            stream = self._streams.get(event.stream_id or 0)
            if stream is not None and event.headers is not None:
                stream.headers = [(str(n), str(v)) for n, v in event.headers]
                self._on_response_head(event.stream_id or 0, stream)
        elif isinstance(event, h2.events.DataReceived):
            self._on_data(event)
        elif isinstance(event, h2.events.StreamEnded):
            self._on_stream_ended(event.stream_id or 0)
        elif isinstance(event, h2.events.StreamReset):
            refused = event.error_code == h2.errors.ErrorCodes.REFUSED_STREAM
            self._fail(
                event.stream_id or 0,
                f"stream reset by peer ({event.error_code!r})",
                unprocessed=refused,
            )
        elif isinstance(event, h2.events.ConnectionTerminated):
            self.goaway = True
            last = event.last_stream_id if event.last_stream_id is not None else 0
            for sid in [s for s in self._streams if s > last]:
                self._fail(
                    sid,
                    f"GOAWAY ({event.error_code!r}) before the stream was served",
                    unprocessed=True,
                )
            if not self._streams:
                self.close()

    def _on_response_head(self, sid: int, stream: _OutboundStream) -> None:
        """A body of announced length is received in place (cluster.h2frames); one over the
        cap is refused before any of it arrives."""
        length = -1
        for name, value in stream.headers:
            if name == "content-length" and value.isdigit():
                length = int(value)
        if length > self.limits.max_response_body_bytes:
            self._over_cap(sid, stream)
        elif length > 0:
            stream.sink = BodySink(length)

    def sink_for(self, stream_id: int) -> BodySink | None:
        stream = self._streams.get(stream_id)
        if stream is None or stream.response.done():
            return None
        return stream.sink

    def _on_data(self, event: h2.events.DataReceived) -> None:
        sid = event.stream_id or 0
        stream = self._streams.get(sid)
        if stream is None or stream.response.done() or event.data is None:
            return
        stream.size += len(event.data)
        if stream.size > self.limits.max_response_body_bytes:
            self._over_cap(sid, stream)
            return
        if stream.sink is not None:
            if not stream.sink.accept(event.data):
                # more than content-length: h2 rejects this itself; never grow the buffer
                self.reset_stream(sid, h2.errors.ErrorCodes.PROTOCOL_ERROR)
                self._fail(sid, "response body longer than its content-length")
            return
        stream.chunks.append(event.data)

    def _over_cap(self, sid: int, stream: _OutboundStream) -> None:
        stream.chunks.clear()
        stream.sink = None
        self.reset_stream(sid, h2.errors.ErrorCodes.CANCEL)
        self._fail(sid, f"response body over {self.limits.max_response_body_bytes} bytes")

    def _on_stream_ended(self, sid: int) -> None:
        stream = self._streams.get(sid)
        if stream is None or stream.response.done():
            return
        try:
            status = status_of(stream.headers)
        except H2TransportError as exc:
            stream.response.set_exception(exc)
            return
        chunks, stream.chunks = stream.chunks, []
        if stream.sink is not None:
            body = stream.sink.take()
            stream.sink = None
        else:
            body = b"".join(chunks)  # DATA payloads arrive as views (cluster.h2frames)
        headers = [(n, v) for n, v in stream.headers if not n.startswith(":")]
        stream.response.set_result(H2Response(status, headers, body))
        self.wake_senders()

    def _fail(self, sid: int, reason: str, *, unprocessed: bool = False) -> None:
        stream = self._streams.get(sid)
        if stream is not None and not stream.response.done():
            error = H2UnprocessedError if unprocessed else H2TransportError
            stream.response.set_exception(error(reason))
        self.wake_senders()

    def _admit_waiters(self) -> None:
        while self._slot_waiters and self._active < self._stream_limit():
            waiter = self._slot_waiters.popleft()
            if not waiter.done():
                self._active += 1
                waiter.set_result(None)

    # -- closing ---------------------------------------------------------------------------
    def close(self) -> None:
        if self.closed:
            return
        if not self.goaway:
            self.goaway = True
            self.h2.close_connection()
            self.flush()
        self.closed = True
        self.wake_senders()
        if self.transport is not None:
            self.transport.close()

    def on_closed(self, exc: Exception | None) -> None:
        reason = f"connection lost: {exc}" if exc else "connection closed by peer"
        if not self.ready.done():
            self.ready.set_exception(H2TransportError(reason))
            self.ready.exception()  # mark retrieved: nobody may be waiting any more
        for sid in list(self._streams):
            self._fail(sid, reason)
        while self._slot_waiters:
            waiter = self._slot_waiters.popleft()
            if not waiter.done():
                waiter.set_exception(H2UnprocessedError(reason))


class H2Client:
    """Requests to one peer over one h2c connection (see module docstring)."""

    def __init__(
        self,
        host: str,
        port: int,
        *,
        connect_timeout_s: float = 5.0,
        limits: H2Limits = DEFAULT_LIMITS,
    ) -> None:
        self.host = host
        self.port = port
        self.connect_timeout_s = connect_timeout_s
        self.limits = limits
        self._conn: _ClientConnection | None = None
        self._lock = asyncio.Lock()
        self._closed = False
        # Requests sent again because the server did not process them (for metrics, tests).
        self.resends = 0

    async def _connection(self) -> _ClientConnection:
        conn = self._conn
        if conn is not None and conn.usable:
            return conn
        async with self._lock:
            conn = self._conn
            if conn is not None and conn.usable:
                return conn
            if self._closed:
                raise H2TransportError("client closed")
            loop = asyncio.get_running_loop()
            authority = f"{self.host}:{self.port}"
            new: _ClientConnection | None = None
            try:
                async with asyncio.timeout(self.connect_timeout_s):
                    _, new = await loop.create_connection(
                        lambda: _ClientConnection(self.limits, authority), self.host, self.port
                    )
                    await asyncio.shield(new.ready)
            except TimeoutError:
                if new is not None:
                    new.abort()
                raise H2TransportError(
                    f"connect to {self.host}:{self.port} timed out after {self.connect_timeout_s} s"
                ) from None
            except H2TransportError:
                raise
            except OSError as exc:
                raise H2TransportError(f"connect to {self.host}:{self.port}: {exc}") from exc
            self._conn = new
            return new

    async def request(
        self,
        method: str,
        path: str,
        *,
        headers: Sequence[tuple[str, str]] = (),
        body: bytes = b"",
        timeout_s: float,
    ) -> H2Response:
        """Send one request and return its response (body joined into one ``bytes``).

        A request the server did not process is sent again (module docstring). Raises
        :class:`H2TransportError` on a network failure (connect, reset, GOAWAY, body
        over ``max_response_body_bytes``, peer not reading) and ``TimeoutError`` when
        ``timeout_s`` expires (the stream is reset, the connection kept)."""
        async with asyncio.timeout(timeout_s):
            for attempt in range(MAX_RESENDS + 1):
                conn = await self._connection()
                try:
                    return await conn.request(method, path, headers, body)
                except H2UnprocessedError:
                    if attempt == MAX_RESENDS or self._closed:
                        raise
                    self.resends += 1
            raise AssertionError("unreachable")

    async def close(self) -> None:
        self._closed = True
        conn, self._conn = self._conn, None
        if conn is not None:
            conn.close()
