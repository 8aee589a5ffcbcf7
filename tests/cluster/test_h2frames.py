"""The zero-copy DATA path (cluster.h2frames), sans-I/O: bytes between two HTTP/2 connections
in memory, one side ours, the other stock ``h2``, so every frame we write is parsed by an
independent implementation and every frame we read in place is checked against what stock
``h2`` makes of the same bytes.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

import h2.events
import h2.exceptions
import h2.settings
import pytest
from h2.config import H2Configuration
from h2.connection import H2Connection
from hypothesis import given, settings
from hypothesis import strategies as st

from cluster.h2frames import (
    FRAME_HEADER_BYTES,
    BodySink,
    FrameReader,
    ZeroCopyH2Connection,
    data_frame_header,
)

BIG_WINDOW = 2**31 - 1
MAX_FRAME = 2**24 - 1


def _settings(conn: H2Connection, *, window: int = BIG_WINDOW, frame: int = MAX_FRAME) -> None:
    codes = h2.settings.SettingCodes
    conn.update_settings({codes.INITIAL_WINDOW_SIZE: window, codes.MAX_FRAME_SIZE: frame})
    if window > 65_535:
        conn.increment_flow_control_window(window - 65_535)


@dataclass
class Receiver:
    """Our client side: a ZeroCopyH2Connection behind a FrameReader, with sinks for
    responses that announce a content-length, as cluster.h2client does."""

    conn: ZeroCopyH2Connection
    reader: FrameReader = field(init=False)
    sinks: dict[int, BodySink] = field(default_factory=dict)
    chunks: dict[int, list[bytes]] = field(default_factory=dict)
    ended: set[int] = field(default_factory=set)
    trace: list[tuple[str, int, int]] = field(default_factory=list)
    wire_seen: bytearray = field(default_factory=bytearray)

    def __post_init__(self) -> None:
        self.reader = FrameReader(self.conn, self.sinks.get, self.on_events, server_side=False)

    def on_events(self, events: list[h2.events.Event]) -> None:
        for event in events:
            sid = getattr(event, "stream_id", 0) or 0
            if isinstance(event, h2.events.ResponseReceived):
                headers = dict(event.headers or [])
                length = headers.get(b"content-length")
                if length is not None and int(length) > 0:
                    self.sinks[sid] = BodySink(int(length))
            elif isinstance(event, h2.events.DataReceived):
                assert event.data is not None
                self.trace.append(("data", sid, len(event.data)))
                sink = self.sinks.get(sid)
                if sink is not None:
                    assert sink.accept(event.data)
                else:
                    self.chunks.setdefault(sid, []).append(bytes(event.data))
                if event.flow_controlled_length:
                    self.conn.acknowledge_received_data(event.flow_controlled_length, sid)
                continue
            elif isinstance(event, h2.events.StreamEnded):
                self.ended.add(sid)
            self.trace.append((type(event).__name__, sid, 0))

    def body(self, sid: int) -> bytes:
        sink = self.sinks.get(sid)
        if sink is not None:
            return sink.take()
        return b"".join(self.chunks.get(sid, []))

    def pump(self, wire: bytes, reads: list[int]) -> None:
        """Deliver ``wire`` the way BufferedProtocol does: into get_buffer(), at most
        ``reads[i]`` bytes per read (cycled)."""
        self.wire_seen += wire
        pos, i = 0, 0
        while pos < len(wire):
            buf = self.reader.get_buffer()
            n = min(len(buf), reads[i % len(reads)], len(wire) - pos)
            buf[:n] = wire[pos : pos + n]
            self.reader.buffer_updated(n)
            pos += n
            i += 1


def _pair(*, client_window: int = BIG_WINDOW) -> tuple[Receiver, H2Connection]:
    client = Receiver(ZeroCopyH2Connection(H2Configuration(client_side=True)))
    server = H2Connection(H2Configuration(client_side=False))
    client.conn.initiate_connection()
    _settings(client.conn, window=client_window)
    server.initiate_connection()
    _settings(server)
    server.receive_data(client.conn.data_to_send())
    client.pump(server.data_to_send(), [1 << 20])
    server.receive_data(client.conn.data_to_send())  # SETTINGS ack
    client.pump(server.data_to_send(), [1 << 20])
    return client, server


def _request(client: Receiver, server: H2Connection) -> int:
    sid = client.conn.get_next_available_stream_id()
    client.conn.send_headers(
        sid,
        [(":method", "GET"), (":scheme", "http"), (":authority", "x"), (":path", "/")],
        end_stream=True,
    )
    server.receive_data(client.conn.data_to_send())
    return sid


def _stock_trace(wire_before: bytes, wire: bytes, streams: int) -> list[tuple[str, int, int]]:
    """What stock h2 reports for the same server bytes (its own client, same settings, the
    same requests)."""
    stock = H2Connection(H2Configuration(client_side=True))
    stock.initiate_connection()
    _settings(stock)
    trace: list[tuple[str, int, int]] = []
    stock.receive_data(wire_before)
    for _ in range(streams):
        stock.send_headers(
            stock.get_next_available_stream_id(),
            [(":method", "GET"), (":scheme", "http"), (":authority", "x"), (":path", "/")],
            end_stream=True,
        )
    for event in stock.receive_data(wire):
        sid = getattr(event, "stream_id", 0) or 0
        if isinstance(event, h2.events.DataReceived):
            assert event.data is not None
            trace.append(("data", sid, len(event.data)))
        else:
            trace.append((type(event).__name__, sid, 0))
    return trace


# -- receiving ------------------------------------------------------------------------------------
@settings(max_examples=60, deadline=None)
@given(
    seed=st.integers(0, 2**32 - 1),
    sizes=st.lists(
        st.one_of(st.integers(0, 3), st.integers(0, 70_000), st.sampled_from([16_384, 16_385])),
        min_size=1,
        max_size=4,
    ),
    reads=st.lists(st.sampled_from([1, 5, 9, 10, 100, 4096, 16_393]), min_size=1, max_size=8),
)
def test_random_bodies_frames_and_reads_arrive_byte_identical(
    seed: int, sizes: list[int], reads: list[int]
) -> None:
    """Random body sizes, cut into random frames (some padded, some streams without
    content-length), interleaved across streams, delivered in random read sizes: every body
    arrives byte-identical, and our events equal stock h2's for the same bytes."""
    rng = random.Random(seed)
    reads = [*reads, 65_536]  # odd cuts, but not a million one-byte reads per example
    client, server = _pair()
    sids = [_request(client, server) for _ in sizes]
    bodies = {sid: rng.randbytes(size) for sid, size in zip(sids, sizes, strict=True)}
    for sid, body in bodies.items():
        headers = [(":status", "200")]
        if rng.random() < 0.8:
            headers.append(("content-length", str(len(body))))
        server.send_headers(sid, headers, end_stream=not body)
    pending = {sid: 0 for sid, body in bodies.items() if body}
    while pending:
        sid = rng.choice(sorted(pending))
        body, offset = bodies[sid], pending[sid]
        n = min(rng.choice([1, 100, 16_384, 40_000]), len(body) - offset)
        pad = rng.choice([None, None, None, 0, 7])
        server.send_data(
            sid, body[offset : offset + n], end_stream=offset + n == len(body), pad_length=pad
        )
        if offset + n == len(body):
            del pending[sid]
        else:
            pending[sid] = offset + n
    wire = server.data_to_send()
    preamble = bytes(client.wire_seen)
    client.pump(wire, reads)
    for sid, body in bodies.items():
        assert client.body(sid) == body
        assert sid in client.ended
    ours = [t for t in client.trace if t[1] in bodies]
    assert ours == [t for t in _stock_trace(preamble, wire, len(sids)) if t[1] in bodies]


def test_sink_bound_data_is_received_in_place_not_copied() -> None:
    """Once past the DATA header, the socket is handed the sink's own memory."""
    client, server = _pair()
    sid = _request(client, server)
    body = bytes(range(256)) * 4096  # 1 MiB
    server.send_headers(sid, [(":status", "200"), ("content-length", str(len(body)))])
    server.send_data(sid, body, end_stream=True)
    wire = server.data_to_send()
    pos = 0
    while True:
        buf = client.reader.get_buffer()
        sink = client.sinks.get(sid)
        if sink is not None and buf.obj is sink.buffer:
            break
        buf[:1] = wire[pos : pos + 1]
        client.reader.buffer_updated(1)
        pos += 1
    assert len(buf) == len(body) == len(wire) - pos
    buf[:] = wire[pos:]
    del buf
    client.reader.buffer_updated(len(body))
    assert client.body(sid) == body
    assert sid in client.ended


def test_frames_split_one_byte_at_a_time() -> None:
    client, server = _pair()
    sid = _request(client, server)
    body = b"0123456789" * 5000
    server.send_headers(sid, [(":status", "200"), ("content-length", str(len(body)))])
    for i in range(0, len(body), 16_384):
        server.send_data(sid, body[i : i + 16_384], end_stream=i + 16_384 >= len(body))
    client.pump(server.data_to_send(), [1])
    assert client.body(sid) == body
    assert sid in client.ended


def test_zero_length_data_frame_with_end_stream() -> None:
    client, server = _pair()
    sid = _request(client, server)
    server.send_headers(sid, [(":status", "200"), ("content-length", "3")])
    server.send_data(sid, b"abc")
    server.send_data(sid, b"", end_stream=True)
    client.pump(server.data_to_send(), [7])
    assert client.body(sid) == b"abc"
    assert sid in client.ended


def test_a_body_longer_than_its_content_length_is_a_protocol_error() -> None:
    client, server = _pair()
    sid = _request(client, server)
    server.send_headers(sid, [(":status", "200"), ("content-length", "4")])
    wire = server.data_to_send()
    # stock h2 refuses to send this, so the frame is written by hand
    wire += data_frame_header(5, sid, end_stream=True) + b"12345"
    with pytest.raises(h2.exceptions.ProtocolError):
        client.pump(wire, [1 << 20])
    assert client.sinks[sid].filled == 0  # never written past its end


def test_data_beyond_the_flow_control_window_is_a_protocol_error() -> None:
    client, server = _pair(client_window=65_535)
    sid = _request(client, server)
    size = 70_000
    server.send_headers(sid, [(":status", "200"), ("content-length", str(size))])
    wire = server.data_to_send()
    # the stock server would wait for a WINDOW_UPDATE; a bad peer does not
    wire += data_frame_header(size, sid, end_stream=True) + bytes(size)
    with pytest.raises(h2.exceptions.FlowControlError):
        client.pump(wire, [1 << 20])


def test_a_frame_over_our_max_frame_size_is_refused_by_h2() -> None:
    client = Receiver(ZeroCopyH2Connection(H2Configuration(client_side=True)))
    client.conn.initiate_connection()  # default SETTINGS_MAX_FRAME_SIZE 16 384
    server = H2Connection(H2Configuration(client_side=False))
    server.initiate_connection()
    server.receive_data(client.conn.data_to_send())
    client.pump(server.data_to_send(), [1 << 20])
    sid = _request(client, server)
    server.send_headers(sid, [(":status", "200"), ("content-length", "20000")])
    wire = server.data_to_send() + data_frame_header(20_000, sid, end_stream=True)
    with pytest.raises(h2.exceptions.ProtocolError):
        client.pump(wire + bytes(20_000), [1 << 20])


def test_data_inside_a_header_block_is_left_to_h2_which_refuses_it() -> None:
    client, server = _pair()
    sid = _request(client, server)
    client.sinks[sid] = BodySink(10)  # as if announced: the reader must still not take it
    # HEADERS without END_HEADERS, then DATA instead of CONTINUATION
    headers = b"\x88"  # :status 200, HPACK static index 8
    wire = (
        bytes([0, 0, len(headers), 0x1, 0x0])
        + sid.to_bytes(4, "big")
        + headers
        + data_frame_header(10, sid, end_stream=True)
        + b"x" * 10
    )
    with pytest.raises(h2.exceptions.ProtocolError):
        client.pump(wire, [1 << 20])
    assert client.sinks[sid].buffer == bytes(10)  # not written into


# -- sending --------------------------------------------------------------------------------------
@settings(max_examples=60, deadline=None)
@given(
    seed=st.integers(0, 2**32 - 1),
    sizes=st.lists(st.integers(0, 200_000), min_size=1, max_size=4),
    max_frame=st.sampled_from([16_384, 65_536, MAX_FRAME]),
)
def test_payload_frames_parse_identically_in_stock_h2(
    seed: int, sizes: list[int], max_frame: int
) -> None:
    """Bodies sent as Payload views, in random slices, interleaved across streams: stock h2
    parses them back byte-identical, and our h2 state (windows) matches the bytes sent."""
    rng = random.Random(seed)
    stock = H2Connection(H2Configuration(client_side=True))
    ours = ZeroCopyH2Connection(H2Configuration(client_side=False))
    stock.initiate_connection()
    _settings(stock, frame=max_frame)
    ours.initiate_connection()
    _settings(ours)
    ours.receive_data(stock.data_to_send())
    stock.receive_data(b"".join(bytes(p) for p in ours.take_output()))
    ours.receive_data(stock.data_to_send())
    sids = []
    for _ in sizes:
        sid = stock.get_next_available_stream_id()
        stock.send_headers(
            sid,
            [(":method", "GET"), (":scheme", "http"), (":authority", "x"), (":path", "/")],
            end_stream=True,
        )
        sids.append(sid)
    ours.receive_data(stock.data_to_send())
    bodies = {sid: rng.randbytes(size) for sid, size in zip(sids, sizes, strict=True)}
    window_before = ours.outbound_flow_control_window
    for sid, body in bodies.items():
        ours.send_headers(sid, [(":status", "200")], end_stream=not body)
    pending = {sid: 0 for sid, body in bodies.items() if body}
    while pending:
        sid = rng.choice(sorted(pending))
        body, offset = bodies[sid], pending[sid]
        n = min(rng.randint(1, ours.max_outbound_frame_size), len(body) - offset)
        ours.send_payload(
            sid, memoryview(body)[offset : offset + n], end_stream=offset + n == len(body)
        )
        pending[sid] = offset + n
        if offset + n == len(body):
            del pending[sid]
    out = ours.take_output()
    assert ours.outbound_flow_control_window == window_before - sum(sizes)
    assert any(isinstance(p, memoryview) for p in out) or not any(sizes)
    received: dict[int, list[bytes]] = {sid: [] for sid in sids}
    ended = set()
    for event in stock.receive_data(b"".join(bytes(p) for p in out)):
        if isinstance(event, h2.events.DataReceived):
            assert event.stream_id is not None and event.data is not None
            received[event.stream_id].append(event.data)
        elif isinstance(event, h2.events.StreamEnded):
            ended.add(event.stream_id)
    assert {sid: b"".join(c) for sid, c in received.items()} == bodies
    assert ended == set(sids)


def test_payload_beyond_the_window_or_frame_size_is_refused_before_anything_is_queued() -> None:
    stock = H2Connection(H2Configuration(client_side=True))
    ours = ZeroCopyH2Connection(H2Configuration(client_side=False))
    stock.initiate_connection()  # default 65 535 window, 16 384 frames
    ours.initiate_connection()
    ours.receive_data(stock.data_to_send())
    sid = stock.get_next_available_stream_id()
    stock.send_headers(
        sid,
        [(":method", "GET"), (":scheme", "http"), (":authority", "x"), (":path", "/")],
        end_stream=True,
    )
    ours.receive_data(stock.data_to_send())
    ours.send_headers(sid, [(":status", "200")])
    ours.take_output()
    with pytest.raises(h2.exceptions.FrameTooLargeError):
        ours.send_payload(sid, memoryview(bytes(16_385)), end_stream=False)
    for _ in range(3):
        ours.send_payload(sid, memoryview(bytes(16_384)), end_stream=False)
    ours.send_payload(sid, memoryview(bytes(16_383)), end_stream=False)  # window now 0
    with pytest.raises(h2.exceptions.FlowControlError):
        ours.send_payload(sid, memoryview(b"x"), end_stream=True)
    wire = b"".join(bytes(p) for p in ours.take_output())
    assert len(wire) == 4 * FRAME_HEADER_BYTES + 65_535


def test_several_buffers_make_one_data_frame() -> None:
    """A replication answer (JSON header + one buffer per partition) leaves as one frame."""
    stock = H2Connection(H2Configuration(client_side=True))
    ours = ZeroCopyH2Connection(H2Configuration(client_side=False))
    stock.initiate_connection()
    _settings(stock)
    ours.initiate_connection()
    ours.receive_data(stock.data_to_send())
    stock.receive_data(b"".join(bytes(p) for p in ours.take_output()))
    sid = stock.get_next_available_stream_id()
    stock.send_headers(
        sid,
        [(":method", "GET"), (":scheme", "http"), (":authority", "x"), (":path", "/")],
        end_stream=True,
    )
    ours.receive_data(stock.data_to_send())
    parts = [b"header", b"", b"a" * 1000, b"b" * 70_000, b"c"]
    ours.send_headers(sid, [(":status", "200")])
    ours.send_payload(sid, [memoryview(p) for p in parts], end_stream=True)
    out = ours.take_output()
    assert [p for p in out if isinstance(p, memoryview)] == [memoryview(p) for p in parts]
    events = stock.receive_data(b"".join(bytes(p) for p in out))
    data = [e.data for e in events if isinstance(e, h2.events.DataReceived)]
    assert data == [b"".join(parts)]
