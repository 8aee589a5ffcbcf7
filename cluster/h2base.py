"""Shared pieces of the h2c transport: values, limits, the error, and the asyncio shell.

The HTTP/2 protocol itself is the sans-I/O ``h2`` library (``H2Connection`` takes bytes and
returns events); this module is the thin asyncio shell around it that both ends share:
flushing frames to the transport, honouring the transport's ``pause_writing`` /
``resume_writing`` and the peer's flow-control windows when sending a body, and acknowledging
received data at once so the peer's windows refill.

Why the windows are raised: HTTP/2 starts every stream and the connection at a 64 KiB window
and 16 KiB frames. A replication fetch answers up to 64 MiB; at a 64 KiB window the sender
stalls once per 64 KiB for a round trip (≈ 1 000 stalls per 64 MiB). Both ends advertise
``SETTINGS_INITIAL_WINDOW_SIZE`` = 2^31-1, raise the connection window by WINDOW_UPDATE to
2^31-1 and accept 16 MiB frames; memory stays bounded by the body caps (``H2Limits``), not by
the windows, because a receiver drops or resets anything past its cap.

Bodies do not pass through ``h2``'s byte handling (:mod:`cluster.h2frames`): a DATA frame
is written as a 9-byte header plus a memoryview of the caller's buffer, and the protocol is an
``asyncio.BufferedProtocol`` whose reads land directly in the preallocated body of a response
that announced its ``content-length``; ``h2`` still owns every window and stream state.
Without this, h2c on one connection ran at 0.06 times an HTTP/1.1 read of the same bytes;
with it, 0.5-0.75 times with 1 MiB bodies and 0.8-0.95 with 16 MiB on a loaded 2-core box
(``python -m benchmarks.h2_fetch``, docs/benchmarks.md).

Backpressure: a body is sent ``send_chunk_bytes`` (1 MiB) per DATA frame (small buffers of
one body share frames); after each frame the
sender waits while the transport is paused (its buffer is over ``write_buffer_high_bytes``),
so a peer that stops reading holds at most about one chunk plus the high-water mark in our
buffer. A send that cannot progress (paused transport or exhausted window) for
``send_timeout_s`` aborts the connection: a peer that stops reading is treated as dead.

Errors: :class:`H2TransportError` (a ``ConnectionError``, hence an ``OSError``) for every
network failure; a caller's deadline raises the builtin ``TimeoutError`` (also an ``OSError``).
"""

from __future__ import annotations

import asyncio
import logging
import sys
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import cast

import h2.events
import h2.exceptions
import h2.settings
from h2.config import H2Configuration

from cluster.h2frames import BodySink, FrameReader, ZeroCopyH2Connection

log = logging.getLogger("logbus.cluster.h2")

KIB = 1024
MIB = 1024 * KIB

# HTTP/2's own maxima (RFC 9113 §6.5.2, §6.9.1).
H2_MAX_WINDOW_BYTES = 2**31 - 1
H2_MAX_FRAME_BYTES = 2**24 - 1
H2_DEFAULT_WINDOW_BYTES = 65_535

Body = bytes | list[bytes | memoryview]
# asyncio's own transports gather ``writelines`` without copying from Python 3.12 on.
_VECTORED_WRITES = sys.version_info >= (3, 12)


@dataclass(frozen=True)
class H2Request:
    """One request as the server's handler sees it (pseudo-headers taken out)."""

    method: str
    path: str
    headers: list[tuple[str, str]]
    body: bytes


@dataclass(frozen=True)
class H2Response:
    """A response. The server may answer with several buffers (a header and raw batches)
    without joining them; the client always hands back one ``bytes``. Header names must be
    lower case (HTTP/2 forbids upper case)."""

    status: int
    headers: list[tuple[str, str]]
    body: Body = b""

    @property
    def body_bytes(self) -> int:
        if isinstance(self.body, bytes):
            return len(self.body)
        return sum(len(part) for part in self.body)


Handler = Callable[[H2Request], Awaitable[H2Response]]


@dataclass(frozen=True)
class H2Limits:
    """Every bound of the transport, with its reason. Defaults suit replication between
    brokers: few connections, long-polls, responses up to 64 MiB."""

    # A replication fetch request lists partitions and offsets: ~100 bytes each, so 1 MiB is
    # ~10 000 partitions; the server answers 413 past it and keeps the connection.
    max_request_body_bytes: int = 1 * MIB
    # A replication fetch answers at most ~64 MiB (max_bytes); 256 MiB leaves room for
    # any caller asking more, and past it the client resets the stream and raises.
    max_response_body_bytes: int = 256 * MIB
    # One follower holds one long-poll per leader, plus admin calls: 100 is Kafka-like and
    # the RFC's recommended minimum. Advertised in SETTINGS and enforced.
    max_concurrent_streams: int = 100
    # Connections the server accepts at once; every broker needs one or two per peer, 256
    # covers a 100-broker cluster; extra connections are closed at once.
    max_connections: int = 256
    # Requests a client queues while all streams are taken; the caller's timeout bounds the
    # wait, this bounds the memory.
    max_queued_requests: int = 1024
    # A connection with no open stream and no traffic for this long is closed (GOAWAY);
    # replication keeps a long-poll open, so only dead peers hit this.
    idle_timeout_s: float = 300.0
    # A peer must send its connection preface and SETTINGS within this after connecting.
    handshake_timeout_s: float = 10.0
    # A send that cannot progress (peer not reading, no WINDOW_UPDATE) for this long aborts
    # the connection. 30 s is generous for 64 MiB over a slow link (≥ 2 MB/s).
    send_timeout_s: float = 30.0
    # Stream and connection windows we advertise: HTTP/2's maximum, see module docstring.
    window_bytes: int = H2_MAX_WINDOW_BYTES
    # Largest frame we accept (advertised SETTINGS_MAX_FRAME_SIZE): HTTP/2's maximum.
    max_frame_bytes: int = H2_MAX_FRAME_BYTES
    # Largest DATA frame we send (also capped by the peer's max frame size): 1 MiB makes the
    # per-frame Python cost negligible (64 frames per 64 MiB) and bounds what one write adds
    # to the transport buffer.
    send_chunk_bytes: int = 1 * MIB
    # Transport buffer high/low-water marks for pause_writing/resume_writing.
    write_buffer_high_bytes: int = 1 * MIB
    write_buffer_low_bytes: int = 256 * KIB
    # Header block (HPACK-decoded) we accept: 64 KiB, h2's default.
    max_header_list_bytes: int = 64 * KIB


DEFAULT_LIMITS = H2Limits()


class H2TransportError(ConnectionError):
    """The connection or stream failed: connect refused or timed out, reset, GOAWAY, a peer
    that stopped reading, a response over its cap. Callers treat it as a network failure."""


def _settings(limits: H2Limits, *, client_side: bool) -> dict[h2.settings.SettingCodes | int, int]:
    codes = h2.settings.SettingCodes
    settings: dict[h2.settings.SettingCodes | int, int] = {
        codes.INITIAL_WINDOW_SIZE: limits.window_bytes,
        codes.MAX_FRAME_SIZE: limits.max_frame_bytes,
        codes.MAX_CONCURRENT_STREAMS: limits.max_concurrent_streams,
        codes.MAX_HEADER_LIST_SIZE: limits.max_header_list_bytes,
    }
    if client_side:
        settings[codes.ENABLE_PUSH] = 0
    return settings


class H2Protocol(asyncio.BufferedProtocol):
    """The asyncio shell shared by server and client connections.

    Subclasses handle the stream events (:meth:`on_event`) and may receive bodies in place
    (:meth:`sink_for`); this class owns the transport, the flush, the flow control for
    sending and the send timeout. Single-threaded: every method runs on the event loop.
    """

    def __init__(self, limits: H2Limits, *, client_side: bool) -> None:
        self.limits = limits
        self.h2 = ZeroCopyH2Connection(
            H2Configuration(client_side=client_side, header_encoding="utf-8")
        )
        self.reader = FrameReader(
            self.h2, self.sink_for, self._on_h2_events, server_side=not client_side
        )
        self.transport: asyncio.Transport | None = None
        self.closed = False
        self._loop = asyncio.get_running_loop()
        self._writable = asyncio.Event()
        self._writable.set()
        # Resolved (and replaced) whenever a send may progress: WINDOW_UPDATE, new SETTINGS,
        # a stream ending, the connection closing.
        self._progress: asyncio.Future[None] = self._loop.create_future()
        self._client_side = client_side
        self._vectored = _VECTORED_WRITES

    # -- asyncio.Protocol ------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports are not asyncio.Transport subclasses: no isinstance check.
        transport = cast(asyncio.Transport, transport)
        self.transport = transport
        self._vectored = _VECTORED_WRITES or type(transport).__module__.startswith("uvloop")
        transport.set_write_buffer_limits(
            high=self.limits.write_buffer_high_bytes, low=self.limits.write_buffer_low_bytes
        )
        self.h2.initiate_connection()
        self.h2.update_settings(_settings(self.limits, client_side=self._client_side))
        increment = self.limits.window_bytes - H2_DEFAULT_WINDOW_BYTES
        if increment > 0:
            self.h2.increment_flow_control_window(increment)
        self.flush()

    def get_buffer(self, sizehint: int) -> memoryview:
        return self.reader.get_buffer()

    def buffer_updated(self, nbytes: int) -> None:
        try:
            self.reader.buffer_updated(nbytes)
        except h2.exceptions.ProtocolError as exc:
            log.info("h2 protocol error from %s: %s", self.peer, exc)
            self.flush()  # h2 queued a GOAWAY
            self.abort()
            return
        if not self.closed:
            self.flush()

    def _on_h2_events(self, events: list[h2.events.Event]) -> None:
        for event in events:
            if isinstance(event, h2.events.DataReceived):
                # Acknowledge at once (h2 sends a WINDOW_UPDATE once half a window is
                # consumed): memory is bounded by the body caps, not by the window.
                if event.flow_controlled_length and event.stream_id:
                    self.h2.acknowledge_received_data(event.flow_controlled_length, event.stream_id)
            elif isinstance(event, h2.events.WindowUpdated | h2.events.RemoteSettingsChanged):
                self.wake_senders()
            self.on_event(event)
            if self.closed:
                self.reader.stopped = True
                return

    def pause_writing(self) -> None:
        self._writable.clear()

    def resume_writing(self) -> None:
        self._writable.set()

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self.reader.stopped = True
        self._writable.set()
        self.wake_senders()
        self.on_closed(exc)

    # -- for subclasses --------------------------------------------------------------------
    def on_event(self, event: h2.events.Event) -> None:
        raise NotImplementedError

    def sink_for(self, stream_id: int) -> BodySink | None:
        """Where DATA on ``stream_id`` is received in place; None: ``h2`` parses it."""
        return None

    def on_body_sent(self, nbytes: int) -> None:
        """Hook for statistics."""

    def on_closed(self, exc: Exception | None) -> None:
        raise NotImplementedError

    @property
    def peer(self) -> object:
        return None if self.transport is None else self.transport.get_extra_info("peername")

    def flush(self) -> None:
        """Write what ``h2`` queued: one ``writelines`` (one ``writev``, no copy) where the
        transport gathers without copying (uvloop's, asyncio's from Python 3.12), else one
        ``write`` per piece (asyncio's ``writelines`` joins, i.e. copies, a body before 3.12).

        uvloop sends each ``write`` at once when its buffer is empty: a frame's pieces written
        one by one were one ``send`` each, and the peer could wake for each of them."""
        out = self.h2.take_output()
        if out and not self.closed and self.transport is not None:
            if len(out) == 1:
                self.transport.write(out[0])
            elif self._vectored:
                self.transport.writelines(out)
            else:
                for piece in out:
                    self.transport.write(piece)

    def abort(self) -> None:
        """Drop the connection at once (no graceful close)."""
        if self.transport is not None:
            self.transport.abort()
        self.closed = True
        self.wake_senders()

    def wake_senders(self) -> None:
        if not self._progress.done():
            self._progress.set_result(None)
        self._progress = self._loop.create_future()

    async def _wait_progress(self, waiter: Awaitable[object]) -> None:
        try:
            async with asyncio.timeout(self.limits.send_timeout_s):
                await waiter
        except TimeoutError:
            log.warning(
                "h2 peer %s made no send progress for %.1f s: closing",
                self.peer,
                self.limits.send_timeout_s,
            )
            self.on_send_timeout()
            self.abort()
            raise H2TransportError("peer stopped reading (send timeout)") from None

    def on_send_timeout(self) -> None:
        """Hook for statistics."""

    def reset_stream(self, stream_id: int, code: h2.errors.ErrorCodes) -> None:
        """Reset a stream if it is still open; a no-op otherwise."""
        if self.closed:
            return
        try:
            self.h2.reset_stream(stream_id, code)
        except (h2.exceptions.StreamClosedError, h2.exceptions.ProtocolError):
            return
        self.flush()

    async def send_body(
        self, stream_id: int, parts: Sequence[bytes | memoryview], is_done: Callable[[], bool]
    ) -> bool:
        """Send ``parts`` as DATA frames on ``stream_id`` and end the stream.

        Waits for the transport to drain and for the peer's windows, never sends more than the
        peer allows. Returns False if the stream ended meanwhile (``is_done`` or a reset by the
        peer); raises :class:`H2TransportError` if the connection closed or stalled.

        The caller need not flush the stream's HEADERS first: they go out with the first DATA
        frame in one write, or before any wait here (a small request or answer is then one
        ``writev``, and the peer wakes once for it, not for its HEADERS and again for its
        body)."""
        chunk_cap = self.limits.send_chunk_bytes
        views = [memoryview(p).cast("B") for p in parts if len(p)]
        total = sum(len(v) for v in views)
        sent = index = offset = 0  # bytes sent; position: views[index][offset]
        while sent < total:
            if not self._writable.is_set():
                self.flush()
                await self._wait_progress(self._writable.wait())
            if self.closed:
                raise H2TransportError("connection closed while sending")
            if is_done():
                self.flush()
                return False
            try:
                window = self.h2.local_flow_control_window(stream_id)
            except h2.exceptions.StreamClosedError:
                self.flush()
                return False
            n = min(total - sent, window, self.h2.max_outbound_frame_size, chunk_cap)
            if n <= 0:
                self.flush()
                await self._wait_progress(asyncio.shield(self._progress))
                continue
            frame: list[memoryview] = []
            need = n
            while need:
                view = views[index]
                take = min(len(view) - offset, need)
                frame.append(view if take == len(view) else view[offset : offset + take])
                need -= take
                offset += take
                if offset == len(view):
                    index, offset = index + 1, 0
            try:
                self.h2.send_payload(stream_id, frame, end_stream=sent + n == total)
            except h2.exceptions.StreamClosedError:
                self.flush()
                return False
            sent += n
            self.flush()
            self.on_body_sent(n)
        if not views:
            try:
                self.h2.end_stream(stream_id)
            except h2.exceptions.StreamClosedError:
                self.flush()
                return False
            self.flush()
        return True


def status_of(headers: Sequence[tuple[str, str]]) -> int:
    for name, value in headers:
        if name == ":status":
            return int(value)
    raise H2TransportError("response without :status")
