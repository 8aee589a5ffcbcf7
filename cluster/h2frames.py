"""Zero-copy DATA frames for the h2c transport: bodies move between the socket and the
caller's buffers without passing through ``h2``'s byte handling.

Why: ``h2`` is a correct HTTP/2 state machine but moves DATA payloads as Python bytes. Sending
a 1 MiB chunk, ``send_data`` copies a memoryview with ``tobytes()``, serialises the frame
(two joins) and ``data_to_send()`` copies it again; receiving, its frame buffer appends the
socket's bytes, slices the frame out, copies the payload with ``tobytes()``, and the caller
joins the chunks. Measured on this 2-core box: h2c on one connection reached 0.06 times the
throughput of a plain HTTP/1.1 read of the same bytes. Payload bytes should be touched by
memcpy at most once on each side; frames, windows and stream states stay ``h2``'s business.

Sending (:class:`ZeroCopyH2Connection`, :class:`Payload`): the body slice is wrapped in a
:class:`Payload` (a ``len()``-able box ``h2`` does not look into) and handed to the ordinary
``H2Connection.send_data``, so every check still runs there: stream state, flow-control
windows (stream and connection, RFC 9113 §6.9), maximum frame size, END_STREAM. The one hook
overridden, ``_prepare_for_sending``, writes the 9-byte DATA header itself and queues the
slice as a memoryview behind it; :meth:`ZeroCopyH2Connection.take_output` returns the
pending control bytes and payload views in wire order for ``transport.write``.

Receiving (:class:`FrameReader`): the reader sits between the socket and ``h2`` and cuts the
inbound stream at frame boundaries (9-byte headers, RFC 9113 §4.1). A DATA frame for a stream
whose owner registered a :class:`BodySink` (a preallocated ``bytearray`` the size of the
``content-length``; any other DATA frame gets a one-frame sink of its own length) is received
straight into that buffer — with ``asyncio.BufferedProtocol``
the kernel writes into it (``recv_into``), no copy at all — and then handed to ``h2`` as a
parsed ``DataFrame`` whose payload is a memoryview of the sink, so ``h2`` still accounts the
flow control, checks the stream state and the content-length, and emits the usual
``DataReceived``/``StreamEnded`` events (``DataReceived.data`` is then a memoryview, never
``bytes``). Every other frame (and DATA that is padded, on stream 0, inside a header block,
or larger than our SETTINGS_MAX_FRAME_SIZE) is passed to ``h2.receive_data`` unchanged, so
``h2`` validates and rejects exactly what it did before. Memory: a one-frame sink holds at
most one frame, as ``h2``'s own frame buffer would.

Private ``h2`` API used (pinned ``h2>=4.1,<5``; the transport tests exercise both):
``H2Connection._prepare_for_sending`` (overridden), ``H2Connection._receive_frame`` plus
``_terminate_connection`` (the two calls ``receive_data`` itself makes per frame) and
``_frame_dispatch_table`` (one entry added, see :class:`InPlaceDataFrame`).
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from typing import cast

import h2.events
import h2.exceptions
from h2.config import H2Configuration
from h2.connection import H2Connection
from hyperframe.frame import DataFrame, Frame

# RFC 9113 §4.1: length (24 bits), type, flags, stream id (31 bits + reserved bit).
FRAME_HEADER = struct.Struct(">BHBBL")
FRAME_HEADER_BYTES = FRAME_HEADER.size  # 9
TYPE_DATA = 0x0
TYPE_HEADERS = 0x1
TYPE_PUSH_PROMISE = 0x5
TYPE_CONTINUATION = 0x9
FLAG_END_STREAM = 0x1
FLAG_END_HEADERS = 0x4
FLAG_PADDED = 0x8
STREAM_ID_MASK = 0x7FFF_FFFF
# Client connection preface (RFC 9113 §3.4) that a server reads before the first frame.
CLIENT_PREFACE_BYTES = 24
# Scratch buffer for everything that is not a sink's payload: asyncio reads up to 256 KiB at
# a time (its own default), so control frames and small bodies cost one recv each.
SCRATCH_BYTES = 256 * 1024


def data_frame_header(length: int, stream_id: int, *, end_stream: bool) -> bytes:
    """The 9-byte header of an unpadded DATA frame carrying ``length`` bytes."""
    flags = FLAG_END_STREAM if end_stream else 0
    return FRAME_HEADER.pack(length >> 16, length & 0xFFFF, TYPE_DATA, flags, stream_id)


class Payload:
    """A DATA frame's payload passed through ``h2.send_data`` without being copied: ``h2``
    only asks its ``len()``; :class:`ZeroCopyH2Connection` puts the views on the wire, one
    after another behind one header (a replication answer is a JSON header and one buffer of
    batches per partition: many small buffers make one frame, not one frame each)."""

    __slots__ = ("length", "views")

    def __init__(self, views: list[memoryview]) -> None:
        self.views = views
        self.length = sum(len(v) for v in views)

    def __len__(self) -> int:
        return self.length


class InPlaceDataFrame(DataFrame):
    """A DATA frame whose payload is a view of a :class:`BodySink`.

    Exists for one reason: ``h2`` logs ``repr(frame)`` for every frame it receives, eagerly,
    and hyperframe's DATA repr serialises the body (``tobytes()`` — replacing our view with a
    copy) and hex-encodes all of it before truncating to 20 characters: ≈ 6 ms per MiB here,
    the single largest cost of the receive path. This repr names the length only."""

    def _body_repr(self) -> str:
        return f"<{len(self.data)} bytes in place>"


class ZeroCopyH2Connection(H2Connection):
    """``H2Connection`` whose DATA frames carrying a :class:`Payload` are queued as header +
    memoryview instead of being serialised (see module docstring). Use :meth:`take_output`,
    not ``data_to_send``, to collect what to write."""

    def __init__(self, config: H2Configuration | None = None) -> None:
        super().__init__(config)
        # Same handler as DataFrame: only the repr differs (see InPlaceDataFrame).
        self._frame_dispatch_table[InPlaceDataFrame] = self._frame_dispatch_table[DataFrame]
        self._views: list[bytes | memoryview] = []

    def send_payload(
        self, stream_id: int, views: memoryview | list[memoryview], *, end_stream: bool
    ) -> None:
        """``send_data`` for one frame made of body slices, with every check of
        ``send_data`` (window, frame size, stream state)."""
        payload = Payload([views] if isinstance(views, memoryview) else views)
        self.send_data(stream_id, cast(bytes, payload), end_stream=end_stream)

    def _prepare_for_sending(self, frames: list[Frame]) -> None:
        for frame in frames:
            data = getattr(frame, "data", None)
            if isinstance(frame, DataFrame) and isinstance(data, Payload):
                pending = self.data_to_send()
                if pending:
                    self._views.append(pending)
                end = "END_STREAM" in frame.flags
                self._views.append(data_frame_header(len(data), frame.stream_id, end_stream=end))
                self._views.extend(data.views)
            else:
                super()._prepare_for_sending([frame])

    def take_output(self) -> list[bytes | memoryview]:
        """Everything to write, in wire order; empties the queue."""
        views, self._views = self._views, []
        tail = self.data_to_send()
        if tail:
            views.append(tail)
        return views

    def receive_parsed_frame(self, frame: Frame) -> list[h2.events.Event]:
        """Process one already-parsed frame exactly as ``receive_data`` would."""
        try:
            return self._receive_frame(frame)
        except h2.exceptions.ProtocolError as exc:
            self._terminate_connection(exc.error_code)
            raise


class BodySink:
    """A body's destination: ``capacity`` bytes preallocated, ``filled`` of them received."""

    __slots__ = ("buffer", "filled")

    def __init__(self, capacity: int) -> None:
        self.buffer = bytearray(capacity)
        self.filled = 0

    @property
    def room(self) -> int:
        return len(self.buffer) - self.filled

    def accept(self, data: bytes | memoryview) -> bool:
        """Account a ``DataReceived`` payload: a view the reader already wrote into this
        buffer, or bytes ``h2`` parsed itself (copied in). False if it does not fit."""
        n = len(data)
        if isinstance(data, memoryview) and data.obj is self.buffer:
            self.filled += n
            return True
        if n > self.room:
            return False
        self.buffer[self.filled : self.filled + n] = data
        self.filled += n
        return True

    def take(self) -> bytes:
        """The body received, as ``bytes`` (one copy)."""
        if self.filled == len(self.buffer):
            return bytes(self.buffer)
        return bytes(memoryview(self.buffer)[: self.filled])


SinkLookup = Callable[[int], BodySink | None]
EventSink = Callable[[list[h2.events.Event]], None]


class FrameReader:
    """Cuts inbound bytes at frame boundaries; receives sink-bound DATA payloads in place and
    hands everything else to ``h2`` (see module docstring).

    Driven by ``asyncio.BufferedProtocol``: :meth:`get_buffer` gives the socket either the
    sink's next bytes (while inside a sink-bound payload, never past its end) or a scratch
    buffer; :meth:`buffer_updated` consumes what arrived. ``on_events`` receives ``h2``'s
    events in wire order, and before any DATA frame is classified, so a sink registered in
    response to a HEADERS frame is used for the DATA right behind it. ``ProtocolError``
    propagates (``h2`` has queued its GOAWAY)."""

    def __init__(
        self,
        conn: ZeroCopyH2Connection,
        sink_for: SinkLookup,
        on_events: EventSink,
        *,
        server_side: bool,
    ) -> None:
        self._conn = conn
        self._sink_for = sink_for
        self._on_events = on_events
        self._scratch = bytearray(SCRATCH_BYTES)
        self._header = bytearray()  # a frame header split across reads
        # Bytes for h2, batched until a DATA frame or the end of a read; views of the scratch
        # buffer are joined (copied) before the scratch is reused.
        self._forward: list[bytes | memoryview] = []
        self._forward_left = CLIENT_PREFACE_BYTES if server_side else 0
        self._in_header_block = False  # HEADERS without END_HEADERS: CONTINUATION must follow
        self._passthrough = False  # frame over our max size: let h2 reject it
        # The DATA frame being received into a sink.
        self._sink: BodySink | None = None
        self._sink_start = 0
        self._sink_length = 0
        self._sink_got = 0
        self._sink_stream = 0
        self._sink_end_stream = False
        self._reading_into_sink = False
        self.stopped = False  # set by the owner when the connection closed mid-batch

    # -- BufferedProtocol hooks ---------------------------------------------------------------
    def get_buffer(self) -> memoryview:
        sink = self._sink
        if sink is not None:
            self._reading_into_sink = True
            start = self._sink_start + self._sink_got
            return memoryview(sink.buffer)[start : self._sink_start + self._sink_length]
        self._reading_into_sink = False
        return memoryview(self._scratch)

    def buffer_updated(self, nbytes: int) -> None:
        if self._reading_into_sink:
            self._reading_into_sink = False
            self._sink_got += nbytes
            if self._sink_got == self._sink_length:
                self._finish_sink_frame()
            return
        self.feed(memoryview(self._scratch)[:nbytes])

    # -- parsing ------------------------------------------------------------------------------
    def feed(self, data: memoryview) -> None:
        """Consume bytes from the wire (also usable without BufferedProtocol)."""
        pos, size = 0, len(data)
        while pos < size and not self.stopped:
            if self._passthrough:
                self._forward.append(data[pos:])
                break
            if self._forward_left:
                take = min(self._forward_left, size - pos)
                self._forward.append(data[pos : pos + take])
                self._forward_left -= take
                pos += take
                continue
            sink = self._sink
            if sink is not None:
                take = min(self._sink_length - self._sink_got, size - pos)
                start = self._sink_start + self._sink_got
                sink.buffer[start : start + take] = data[pos : pos + take]
                self._sink_got += take
                pos += take
                if self._sink_got == self._sink_length:
                    self._finish_sink_frame()
                continue
            take = min(FRAME_HEADER_BYTES - len(self._header), size - pos)
            self._header += data[pos : pos + take]
            pos += take
            if len(self._header) == FRAME_HEADER_BYTES:
                header = bytes(self._header)
                self._header.clear()
                self._on_frame_header(header)
        self._flush_forward()

    def _on_frame_header(self, header: bytes) -> None:
        high, low, kind, flags, stream_id = FRAME_HEADER.unpack(header)
        length = (high << 16) | low
        stream_id &= STREAM_ID_MASK
        max_frame = self._conn.max_inbound_frame_size
        if (
            kind == TYPE_DATA
            and stream_id
            and not flags & FLAG_PADDED
            and not self._in_header_block
            and length <= max_frame
        ):
            self._flush_forward()  # h2 sees (and we act on) everything before this frame
            if self.stopped:
                return
            sink = self._sink_for(stream_id)
            if sink is None or length > sink.room:
                sink = BodySink(length)  # this frame only; h2 judges where it belongs
            self._sink = sink
            self._sink_start = sink.filled
            self._sink_length = length
            self._sink_got = 0
            self._sink_stream = stream_id
            self._sink_end_stream = bool(flags & FLAG_END_STREAM)
            if length == 0:
                self._finish_sink_frame()
            return
        if kind in (TYPE_HEADERS, TYPE_PUSH_PROMISE, TYPE_CONTINUATION):
            self._in_header_block = not flags & FLAG_END_HEADERS
        if length > max_frame:
            self._passthrough = True  # h2 answers FRAME_SIZE_ERROR
        self._forward.append(header)
        self._forward_left = length

    def _finish_sink_frame(self) -> None:
        sink = self._sink
        assert sink is not None
        self._sink = None
        start = self._sink_start
        frame = InPlaceDataFrame(self._sink_stream)
        frame.data = cast(bytes, memoryview(sink.buffer)[start : start + self._sink_length])
        if self._sink_end_stream:
            frame.flags.add("END_STREAM")
        self._on_events(self._conn.receive_parsed_frame(frame))

    def _flush_forward(self) -> None:
        if not self._forward or self.stopped:
            self._forward.clear()
            return
        chunks, self._forward = self._forward, []
        data = b"".join(chunks)
        self._on_events(self._conn.receive_data(data))
