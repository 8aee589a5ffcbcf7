"""h2c server (HTTP/2 over cleartext TCP, prior knowledge): requests in, handler, responses out.

Knows nothing of replication: each complete request (headers + body up to
``max_request_body_bytes``) is handed to the ``Handler`` in its own task, and what it returns
is sent back with flow control and backpressure (:mod:`cluster.h2base`). Per connection:

* a body over the cap is answered ``413`` and the stream reset (NO_ERROR) — the connection
  keeps serving; a ``content-length`` over the cap is refused before any body arrives;
* a handler exception is logged and answered ``500`` on that stream only;
* streams beyond ``max_concurrent_streams`` (advertised in SETTINGS) are refused with
  RST_STREAM(REFUSED_STREAM); once the peer acknowledged our SETTINGS, h2 itself treats a
  violation as a connection error;
* a peer that does not send the preface and SETTINGS within ``handshake_timeout_s``, sends
  garbage, or stays idle (no stream, no bytes) for ``idle_timeout_s`` is dropped;
* connections beyond ``max_connections`` are aborted as soon as they are accepted.

:meth:`H2Server.close` stops accepting, cancels running handlers (long-polls), sends GOAWAY
and closes every connection, so clients' pending requests fail at once.
"""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass, field
from typing import cast

import h2.errors
import h2.events

from cluster.h2base import (
    DEFAULT_LIMITS,
    H2Limits,
    H2Protocol,
    H2Request,
    H2Response,
    Handler,
    log,
)


@dataclass
class H2ServerStats:
    """Counters for metrics and tests (plain ints, updated on the event loop)."""

    connections_open: int = 0
    connections_refused: int = 0
    handshake_failures: int = 0
    send_timeouts: int = 0
    streams_refused: int = 0
    bodies_refused: int = 0
    handler_errors: int = 0
    streams_opened: int = 0
    # Streams the peer reset (RST_STREAM) before their response was complete.
    streams_reset: int = 0
    # Response body bytes handed to the transport (DATA payloads, without frame headers).
    body_bytes_sent: int = 0
    # The largest transport write buffer seen after a write, across connections.
    peak_write_buffer_bytes: int = 0


@dataclass
class _InboundStream:
    method: str
    path: str
    headers: list[tuple[str, str]]
    chunks: list[bytes | memoryview] = field(default_factory=list)
    size: int = 0
    refused: bool = False  # answered 413 already; ignore the rest
    task: asyncio.Task[None] | None = None


class _ServerConnection(H2Protocol):
    def __init__(self, server: H2Server) -> None:
        super().__init__(server.limits, client_side=False)
        self._server = server
        self._streams: dict[int, _InboundStream] = {}
        self._handshake_timer: asyncio.TimerHandle | None = None
        self._idle_timer: asyncio.TimerHandle | None = None
        self._last_activity = 0.0
        self._handshaken = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        server = self._server
        if len(server.connections) >= self.limits.max_connections or server.closing:
            server.stats.connections_refused += 1
            self.closed = True
            self.reader.stopped = True
            # uvloop's transports are not asyncio.Transport subclasses: no isinstance check.
            cast(asyncio.Transport, transport).abort()
            return
        server.connections.add(self)
        server.stats.connections_open = len(server.connections)
        super().connection_made(transport)
        self._last_activity = self._loop.time()
        self._handshake_timer = self._loop.call_later(
            self.limits.handshake_timeout_s, self._handshake_expired
        )
        self._idle_timer = self._loop.call_later(self.limits.idle_timeout_s, self._idle_check)

    def buffer_updated(self, nbytes: int) -> None:
        self._last_activity = self._loop.time()
        super().buffer_updated(nbytes)
        if self.closed and not self._handshaken:
            self._server.stats.handshake_failures += 1

    def flush(self) -> None:
        super().flush()
        if self.transport is not None:
            stats = self._server.stats
            size = self.transport.get_write_buffer_size()
            if size > stats.peak_write_buffer_bytes:
                stats.peak_write_buffer_bytes = size

    def _handshake_expired(self) -> None:
        if not self._handshaken and not self.closed:
            log.info(
                "h2 peer %s sent no preface within %.1f s",
                self.peer,
                self.limits.handshake_timeout_s,
            )
            self._server.stats.handshake_failures += 1
            self.abort()

    def _idle_check(self) -> None:
        if self.closed:
            return
        deadline = self._last_activity + self.limits.idle_timeout_s
        if not self._streams and self._loop.time() >= deadline:
            self.shutdown()
            return
        self._idle_timer = self._loop.call_later(
            max(deadline - self._loop.time(), 0.0) or self.limits.idle_timeout_s, self._idle_check
        )

    def on_send_timeout(self) -> None:
        self._server.stats.send_timeouts += 1

    def on_body_sent(self, nbytes: int) -> None:
        self._server.stats.body_bytes_sent += nbytes

    # -- events ----------------------------------------------------------------------------
    def on_event(self, event: h2.events.Event) -> None:
        if isinstance(event, h2.events.RemoteSettingsChanged):
            if not self._handshaken and self._handshake_timer is not None:
                self._handshake_timer.cancel()
            self._handshaken = True
        elif isinstance(event, h2.events.RequestReceived):
            self._on_request(event)
        elif isinstance(event, h2.events.DataReceived):
            self._on_data(event)
        elif isinstance(event, h2.events.StreamEnded):
            self._on_request_complete(event.stream_id)
        elif isinstance(event, h2.events.StreamReset):
            stream = self._streams.pop(event.stream_id, None)
            if stream is not None:
                self._server.stats.streams_reset += 1
            if stream is not None and stream.task is not None:
                stream.task.cancel()
            self.wake_senders()
        elif isinstance(event, h2.events.ConnectionTerminated):
            self.shutdown()

    def _on_request(self, event: h2.events.RequestReceived) -> None:
        assert event.stream_id is not None and event.headers is not None
        sid = event.stream_id
        if len(self._streams) >= self.limits.max_concurrent_streams:
            self._server.stats.streams_refused += 1
            self.reset_stream(sid, h2.errors.ErrorCodes.REFUSED_STREAM)
            return
        method = path = ""
        headers: list[tuple[str, str]] = []
        content_length = 0
        for raw_name, raw_value in event.headers:
            name, value = str(raw_name), str(raw_value)
            if name == ":method":
                method = value
            elif name == ":path":
                path = value
            elif not name.startswith(":"):
                headers.append((name, value))
                if name == "content-length" and value.isdigit():
                    content_length = int(value)
        stream = _InboundStream(method, path, headers)
        self._streams[sid] = stream
        self._server.stats.streams_opened += 1
        if content_length > self.limits.max_request_body_bytes:
            self._refuse_body(sid, stream, remote_ended=event.stream_ended is not None)

    def _on_data(self, event: h2.events.DataReceived) -> None:
        assert event.stream_id is not None and event.data is not None
        stream = self._streams.get(event.stream_id)
        if stream is None or stream.refused:
            return
        stream.size += len(event.data)
        if stream.size > self.limits.max_request_body_bytes:
            stream.chunks.clear()
            self._refuse_body(event.stream_id, stream, remote_ended=event.stream_ended is not None)
            return
        stream.chunks.append(event.data)

    def _refuse_body(self, sid: int, stream: _InboundStream, *, remote_ended: bool) -> None:
        self._server.stats.bodies_refused += 1
        stream.refused = True
        self._streams.pop(sid, None)
        self.h2.send_headers(sid, [(":status", "413"), ("content-length", "0")], end_stream=True)
        if not remote_ended:
            # Tell the peer to stop sending the rest (RFC 9113 §8.1).
            self.h2.reset_stream(sid, h2.errors.ErrorCodes.NO_ERROR)
        self.flush()

    def _on_request_complete(self, sid: int) -> None:
        stream = self._streams.get(sid)
        if stream is None or stream.refused or stream.task is not None:
            return
        body = b"".join(stream.chunks)  # DATA payloads arrive as views (cluster.h2frames)
        stream.chunks = []
        request = H2Request(stream.method, stream.path, stream.headers, body)
        stream.task = self._loop.create_task(self._serve(sid, request))
        self._server.tasks.add(stream.task)
        stream.task.add_done_callback(self._server.tasks.discard)

    # -- handlers --------------------------------------------------------------------------
    async def _serve(self, sid: int, request: H2Request) -> None:
        try:
            try:
                response = await self._server.handler(request)
            except asyncio.CancelledError:
                self.reset_stream(sid, h2.errors.ErrorCodes.CANCEL)
                raise
            except Exception:
                log.exception("h2 handler failed on %s %s", request.method, request.path)
                self._server.stats.handler_errors += 1
                response = H2Response(500, [], b"")
            await self._respond(sid, response)
        except OSError:
            pass  # the connection died or stalled; already logged and closed
        finally:
            self._streams.pop(sid, None)
            self.wake_senders()

    async def _respond(self, sid: int, response: H2Response) -> None:
        if self.closed or sid not in self._streams:
            return
        body = response.body
        parts = [body] if isinstance(body, bytes) else list(body)
        headers = [
            (":status", str(response.status)),
            ("content-length", str(response.body_bytes)),
            *response.headers,
        ]
        try:
            self.h2.send_headers(sid, headers, end_stream=response.body_bytes == 0)
        except h2.exceptions.StreamClosedError:
            return
        except h2.exceptions.ProtocolError:
            log.exception("h2 handler returned invalid headers for %s", sid)
            self.reset_stream(sid, h2.errors.ErrorCodes.INTERNAL_ERROR)
            return
        if response.body_bytes:  # the HEADERS go out with the body (send_body)
            await self.send_body(sid, parts, lambda: sid not in self._streams)
        else:
            self.flush()

    # -- closing ---------------------------------------------------------------------------
    def shutdown(self) -> None:
        """Cancel handlers, send GOAWAY and close (graceful for the bytes already queued)."""
        if self.closed:
            return
        for stream in list(self._streams.values()):
            if stream.task is not None:
                stream.task.cancel()
        with contextlib.suppress(h2.exceptions.ProtocolError):
            self.h2.close_connection()
        self.flush()
        self.closed = True
        self.wake_senders()
        if self.transport is not None:
            if self.transport.get_write_buffer_size():
                self.transport.abort()  # a peer not reading would hold close() forever
            else:
                self.transport.close()

    def on_closed(self, exc: Exception | None) -> None:
        for timer in (self._handshake_timer, self._idle_timer):
            if timer is not None:
                timer.cancel()
        for stream in self._streams.values():
            if stream.task is not None:
                stream.task.cancel()
        self._server.connections.discard(self)
        self._server.stats.connections_open = len(self._server.connections)


class H2Server:
    """An h2c listener that hands each request to ``handler``.

    ``await start()`` binds (``port=0`` picks an ephemeral port, see :attr:`port`);
    ``await close()`` stops it (idempotent)."""

    def __init__(
        self,
        handler: Handler,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        limits: H2Limits = DEFAULT_LIMITS,
    ) -> None:
        self.handler = handler
        self.limits = limits
        self.stats = H2ServerStats()
        self.connections: set[_ServerConnection] = set()
        self.tasks: set[asyncio.Task[None]] = set()
        self.closing = False
        self._host = host
        self._port = port
        self._server: asyncio.Server | None = None

    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(
            lambda: _ServerConnection(self), self._host, self._port, reuse_address=True
        )

    @property
    def port(self) -> int:
        if self._server is None or not self._server.sockets:
            raise RuntimeError("H2Server is not started")
        return int(self._server.sockets[0].getsockname()[1])

    async def close(self) -> None:
        self.closing = True
        server, self._server = self._server, None
        if server is not None:
            server.close()
        for connection in list(self.connections):
            connection.shutdown()
        tasks = list(self.tasks)
        if tasks:
            await asyncio.wait(tasks, timeout=self.limits.send_timeout_s)
        if server is not None:
            await server.wait_closed()
