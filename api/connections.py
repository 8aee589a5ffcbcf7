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
* **Send timeout** (``send_timeout_ms``, 30 s): an answer whose client takes no bytes for that
  long (the transport stays above its high-water mark) is aborted, which frees the buffer it
  pinned — for HTTP answers, SSE streams and WebSockets alike.
* **Connection cap** (``max_connections``, Kafka's ``max.connections``): a new connection
  past it closes the connection that has been idle longest (no request in flight); if every
  connection is busy the new one is refused at accept. A flood of idle sockets thus never
  locks out a new client, and nobody is answered 503 for it.

:class:`ConnectionGate` is the sans-I/O part (who is idle, who gives way); the protocol
classes are thin subclasses of uvicorn's httptools and websockets-sansio protocols.
"""

from __future__ import annotations

import asyncio
import resource
from asyncio import TimerHandle
from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
from uvicorn.protocols.websockets.websockets_sansio_impl import WebSocketsSansIOProtocol

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


class LimitedWebSocketProtocol(WebSocketsSansIOProtocol):
    """uvicorn's WebSocket protocol with a send timeout (set per broker by the factory)."""

    send_timeout_s: float = 30.0
    gate: ConnectionGate | None = None

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._stall = _StallTimer(self.send_timeout_s)

    def connection_lost(self, exc: Exception | None) -> None:
        self._stall.resumed()
        if self.gate is not None:
            self.gate.closed(self)
        super().connection_lost(exc)

    def pause_writing(self) -> None:
        self._stall.paused(self.loop, self.transport)
        super().pause_writing()

    def resume_writing(self) -> None:
        self._stall.resumed()
        super().resume_writing()


class LimitedHttpProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol with a head timeout, a send timeout and the gate."""

    header_timeout_s: float = 10.0
    send_timeout_s: float = 30.0
    gate: ConnectionGate = ConnectionGate(10_000)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._head_timer: TimerHandle | None = None
        self._in_head = True  # no request head complete since the last answer
        self._admitted = False
        self._stall = _StallTimer(self.send_timeout_s)

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        admitted, victim = self.gate.admit()
        if not admitted:
            transport.abort()
            return
        self._admitted = True
        if victim is not None:
            victim.transport.close()
        super().connection_made(transport)
        self.gate.idle(self)
        self._arm_head_timer()

    def connection_lost(self, exc: Exception | None) -> None:
        if not self._admitted:
            return
        self._admitted = False
        self._cancel_head_timer()
        self._stall.resumed()
        self.gate.closed(self)
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self._in_head and self._head_timer is None:
            self._arm_head_timer()
        super().data_received(data)

    def on_headers_complete(self) -> None:
        self._in_head = False
        self._cancel_head_timer()
        self.gate.busy(self)
        super().on_headers_complete()

    def on_response_complete(self) -> None:
        pipelined = bool(self.pipeline)  # the next request starts now: not idle
        super().on_response_complete()
        if self.transport.is_closing() or pipelined:
            return
        self._in_head = True
        self.gate.idle(self)

    def handle_websocket_upgrade(self) -> None:
        """The socket becomes a WebSocket: its protocol tells the gate when it closes."""
        self._cancel_head_timer()
        self._stall.resumed()
        self.gate.busy(self)
        self._admitted = False
        super().handle_websocket_upgrade()

    def pause_writing(self) -> None:
        self._stall.paused(self.loop, self.transport)
        super().pause_writing()

    def resume_writing(self) -> None:
        self._stall.resumed()
        super().resume_writing()

    def _arm_head_timer(self) -> None:
        self._cancel_head_timer()
        self._head_timer = self.loop.call_later(self.header_timeout_s, self._head_timed_out)

    def _cancel_head_timer(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def _head_timed_out(self) -> None:
        self._head_timer = None
        if self._in_head and not self.transport.is_closing():
            self.transport.close()


def protocols(
    gate: ConnectionGate, header_timeout_ms: int, send_timeout_ms: int
) -> tuple[type[LimitedHttpProtocol], type[LimitedWebSocketProtocol]]:
    """Protocol classes bound to one broker's gate and timeouts (uvicorn takes classes)."""
    ws = type(
        "BrokerWebSocketProtocol",
        (LimitedWebSocketProtocol,),
        {"gate": gate, "send_timeout_s": send_timeout_ms / 1000},
    )
    http = type(
        "BrokerHttpProtocol",
        (LimitedHttpProtocol,),
        {
            "gate": gate,
            "header_timeout_s": header_timeout_ms / 1000,
            "send_timeout_s": send_timeout_ms / 1000,
        },
    )
    return http, ws
