"""The h2c transport (cluster.h2transport): server and client over real loopback sockets.

Every limit is tested at the limit; waits are on events (or on a condition with a deadline),
never fixed sleeps.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import hashlib
import random
import socket
from collections.abc import AsyncIterator, Callable, Coroutine
from typing import Any, TypeVar

import h2.config
import h2.connection
import h2.events
import h2.settings
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cluster.h2transport import (
    H2Client,
    H2Limits,
    H2Request,
    H2Response,
    H2Server,
    H2TransportError,
    Handler,
)

MIB = 1024 * 1024
DEFAULT_LIMITS = H2Limits()
T = TypeVar("T")


def run(coro: Coroutine[Any, Any, T]) -> T:
    return asyncio.run(asyncio.wait_for(coro, 30))


async def wait_until(predicate: Callable[[], bool], timeout_s: float = 10.0) -> None:
    """Poll a condition the code under test changes on the loop; fails after timeout_s."""
    async with asyncio.timeout(timeout_s):
        while not predicate():
            await asyncio.sleep(0.005)


@contextlib.asynccontextmanager
async def serving(
    handler: Handler, limits: H2Limits = DEFAULT_LIMITS, port: int = 0
) -> AsyncIterator[H2Server]:
    server = H2Server(handler, port=port, limits=limits)
    await server.start()
    try:
        yield server
    finally:
        await server.close()


@contextlib.asynccontextmanager
async def client_of(server: H2Server, limits: H2Limits = DEFAULT_LIMITS) -> AsyncIterator[H2Client]:
    client = H2Client("127.0.0.1", server.port, limits=limits)
    try:
        yield client
    finally:
        await client.close()


async def echo(request: H2Request) -> H2Response:
    return H2Response(200, [("x-path", request.path)], request.body)


class RawPeer:
    """An HTTP/2 client driven by hand (h2 over a plain asyncio stream), to misbehave."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer
        self.h2 = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True))

    @classmethod
    async def connect(cls, port: int, *, big_windows: bool = False) -> RawPeer:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        peer = cls(reader, writer)
        peer.h2.initiate_connection()
        if big_windows:
            codes = h2.settings.SettingCodes
            peer.h2.update_settings(
                {codes.INITIAL_WINDOW_SIZE: 2**31 - 1, codes.MAX_FRAME_SIZE: 2**24 - 1}
            )
            peer.h2.increment_flow_control_window(2**31 - 1 - 65_535)
        await peer.flush()
        return peer

    async def flush(self) -> None:
        self.writer.write(self.h2.data_to_send())
        await self.writer.drain()

    def open_stream(self, path: str = "/") -> int:
        sid = self.h2.get_next_available_stream_id()
        self.h2.send_headers(
            sid,
            [(":method", "GET"), (":scheme", "http"), (":authority", "x"), (":path", path)],
            end_stream=True,
        )
        return sid

    async def events_until(
        self, done: Callable[[list[h2.events.Event]], bool]
    ) -> list[h2.events.Event]:
        seen: list[h2.events.Event] = []
        while not done(seen):
            data = await self.reader.read(65536)
            if not data:
                raise EOFError
            events = self.h2.receive_data(data)
            for event in events:
                if isinstance(event, h2.events.DataReceived) and event.stream_id:
                    self.h2.acknowledge_received_data(event.flow_controlled_length, event.stream_id)
            seen.extend(events)
            await self.flush()
        return seen

    async def read_until_eof(self) -> int:
        total = 0
        with contextlib.suppress(ConnectionError):
            while data := await self.reader.read(65536):
                total += len(data)
        return total

    def close(self) -> None:
        self.writer.close()


# -- core -------------------------------------------------------------------------------------
def test_round_trip() -> None:
    async def main() -> None:
        async with serving(echo) as server, client_of(server) as client:
            response = await client.request(
                "POST", "/a?b=1", headers=[("x-k", "v")], body=b"hello", timeout_s=5
            )
            assert response.status == 200
            assert response.body == b"hello"
            assert ("x-path", "/a?b=1") in response.headers
            empty = await client.request("GET", "/e", timeout_s=5)
            assert (empty.status, empty.body) == (200, b"")

    run(main())


def test_200_concurrent_requests_share_one_connection() -> None:
    async def main() -> None:
        async with serving(echo) as server, client_of(server) as client:
            bodies = [f"r{i}".encode() * (i + 1) for i in range(200)]
            responses = await asyncio.gather(
                *(
                    client.request("POST", f"/{i}", body=b, timeout_s=10)
                    for i, b in enumerate(bodies)
                )
            )
            assert [r.body for r in responses] == bodies
            assert server.stats.connections_open == 1

    run(main())


def test_64_mib_response_arrives_intact() -> None:
    payload = bytes(range(256)) * (64 * MIB // 256)
    digest = hashlib.sha256(payload).hexdigest()

    async def big(request: H2Request) -> H2Response:
        # several buffers, not joined, as the replication layer answers
        view = memoryview(payload)
        return H2Response(200, [], [b"", view[: 3 * MIB + 7], view[3 * MIB + 7 :]])

    async def main() -> None:
        async with serving(big) as server, client_of(server) as client:
            response = await client.request("GET", "/big", timeout_s=20)
            assert response.status == 200
            assert isinstance(response.body, bytes)
            assert len(response.body) == len(payload)
            assert hashlib.sha256(response.body).hexdigest() == digest

    run(main())


def test_request_body_at_the_limit_accepted_one_byte_over_refused_413() -> None:
    limits = H2Limits(max_request_body_bytes=64 * MIB)
    at_limit = b"\x5a" * (64 * MIB)

    async def digest(request: H2Request) -> H2Response:
        return H2Response(200, [], hashlib.sha256(request.body).hexdigest().encode())

    async def main() -> None:
        async with serving(digest, limits) as server, client_of(server) as client:
            over = await client.request("POST", "/", body=at_limit + b"!", timeout_s=20)
            assert over.status == 413
            ok = await client.request("POST", "/", body=at_limit, timeout_s=20)
            assert ok.status == 200
            assert ok.body == hashlib.sha256(at_limit).hexdigest().encode()
            assert server.stats.connections_open == 1
            assert server.stats.bodies_refused == 1

    run(main())


def _stream_finished(sid: int, events: list[h2.events.Event]) -> bool:
    return any(
        isinstance(e, h2.events.StreamEnded | h2.events.StreamReset) and e.stream_id == sid
        for e in events
    )


def test_body_over_the_limit_without_content_length_is_refused_mid_stream() -> None:
    """The cap is enforced on the DATA received, not only on content-length."""
    limits = H2Limits(max_request_body_bytes=100_000)

    async def main() -> None:
        async with serving(echo, limits) as server:
            peer = await RawPeer.connect(server.port)
            # the server's SETTINGS and connection WINDOW_UPDATE: big windows from now on
            await peer.events_until(
                lambda ev: any(isinstance(e, h2.events.WindowUpdated) for e in ev)
            )
            assert peer.h2.outbound_flow_control_window == 2**31 - 1
            for size, expected in ((100_000, 200), (100_001, 413)):
                sid = peer.h2.get_next_available_stream_id()
                peer.h2.send_headers(
                    sid,
                    [(":method", "POST"), (":scheme", "http"), (":authority", "x"), (":path", "/")],
                )
                await peer.flush()
                sent = 0
                while sent < size:
                    n = min(16_384, size - sent)
                    peer.h2.send_data(sid, b"x" * n, end_stream=sent + n == size)
                    sent += n
                    await peer.flush()
                events = await peer.events_until(functools.partial(_stream_finished, sid))
                statuses = [
                    dict(e.headers)[b":status"]
                    for e in events
                    if isinstance(e, h2.events.ResponseReceived) and e.stream_id == sid
                ]
                assert statuses == [str(expected).encode()]
            peer.close()

    run(main())


def test_handler_exception_is_a_500_and_the_connection_keeps_working(
    caplog: pytest.LogCaptureFixture,
) -> None:
    async def handler(request: H2Request) -> H2Response:
        if request.path == "/boom":
            raise ValueError("boom")
        return H2Response(200, [], b"ok")

    async def main() -> None:
        async with serving(handler) as server, client_of(server) as client:
            assert (await client.request("GET", "/boom", timeout_s=5)).status == 500
            assert (await client.request("GET", "/fine", timeout_s=5)).body == b"ok"
            assert server.stats.handler_errors == 1

    run(main())
    assert "boom" in caplog.text


def test_client_queues_requests_beyond_the_servers_max_concurrent_streams() -> None:
    limits = H2Limits(max_concurrent_streams=4)
    active = 0
    peak = 0
    gate = asyncio.Event()

    async def handler(request: H2Request) -> H2Response:
        nonlocal active, peak
        active += 1
        peak = max(peak, active)
        if active == 4:
            gate.set()
        await gate.wait()
        active -= 1
        return H2Response(200, [], request.path.encode())

    async def main() -> None:
        nonlocal gate
        gate = asyncio.Event()
        async with serving(handler, limits) as server, client_of(server) as client:
            responses = await asyncio.gather(
                *(client.request("GET", f"/{i}", timeout_s=10) for i in range(12))
            )
            assert [r.body for r in responses] == [f"/{i}".encode() for i in range(12)]
        # the server allowed 4 at once (it had to, to open the gate) and never more
        assert peak == 4

    run(main())


def test_streams_beyond_the_limit_are_refused_for_a_peer_that_ignores_it() -> None:
    limits = H2Limits(max_concurrent_streams=4)
    release = asyncio.Event()
    started = 0

    async def handler(request: H2Request) -> H2Response:
        nonlocal started
        started += 1
        await release.wait()
        return H2Response(200, [], b"ok")

    async def main() -> None:
        nonlocal release
        release = asyncio.Event()
        async with serving(handler, limits) as server:
            peer = await RawPeer.connect(server.port)
            # Six streams before reading the server's SETTINGS (the peer ignores the limit).
            sids = [peer.open_stream(f"/{i}") for i in range(6)]
            await peer.flush()
            events = await peer.events_until(
                lambda ev: sum(isinstance(e, h2.events.StreamReset) for e in ev) >= 2
            )
            refused = [e.stream_id for e in events if isinstance(e, h2.events.StreamReset)]
            assert refused == sids[4:]
            assert server.stats.streams_refused == 2
            await wait_until(lambda: started == 4)
            release.set()
            events = await peer.events_until(
                lambda ev: sum(isinstance(e, h2.events.StreamEnded) for e in ev) >= 4
            )
            assert started == 4
            peer.close()

    run(main())


# -- failures ---------------------------------------------------------------------------------
def test_server_closed_mid_long_poll_fails_the_request_promptly_and_the_client_reconnects() -> None:
    polling = asyncio.Event()
    cancelled = asyncio.Event()

    async def long_poll(request: H2Request) -> H2Response:
        if request.path == "/poll":
            polling.set()
            try:
                await asyncio.Event().wait()
            except asyncio.CancelledError:
                cancelled.set()
                raise
        return H2Response(200, [], b"second server")

    async def main() -> None:
        nonlocal polling, cancelled
        polling, cancelled = asyncio.Event(), asyncio.Event()
        first = H2Server(long_poll)
        await first.start()
        port = first.port
        client = H2Client("127.0.0.1", port)
        try:
            poll = asyncio.create_task(client.request("GET", "/poll", timeout_s=60))
            await polling.wait()
            await first.close()
            assert cancelled.is_set()
            # fails with the transport error long before its 60 s timeout (run() caps at 30)
            with pytest.raises(H2TransportError):
                await poll
            async with serving(long_poll, port=port):
                response = await client.request("GET", "/next", timeout_s=5)
                assert response.body == b"second server"
        finally:
            await client.close()

    run(main())


def test_request_timeout_resets_the_stream_and_keeps_the_connection() -> None:
    cancelled = asyncio.Event()

    async def handler(request: H2Request) -> H2Response:
        if request.path == "/slow":
            try:
                await asyncio.Event().wait()
            except asyncio.CancelledError:
                cancelled.set()
                raise
        return H2Response(200, [], b"fast")

    async def main() -> None:
        nonlocal cancelled
        cancelled = asyncio.Event()
        async with serving(handler) as server, client_of(server) as client:
            assert (await client.request("GET", "/fast", timeout_s=5)).body == b"fast"
            with pytest.raises(TimeoutError):
                await client.request("GET", "/slow", timeout_s=0.2)
            await asyncio.wait_for(cancelled.wait(), 5)  # RST_STREAM reached the handler
            assert (await client.request("GET", "/fast", timeout_s=5)).body == b"fast"
            assert server.stats.connections_open == 1

    run(main())


def test_response_over_the_clients_cap_raises_and_the_connection_keeps_working() -> None:
    cap = 1 * MIB

    async def handler(request: H2Request) -> H2Response:
        size = int(request.path.strip("/"))
        return H2Response(200, [], b"r" * size)

    async def main() -> None:
        async with serving(handler) as server:
            client = H2Client(
                "127.0.0.1", server.port, limits=H2Limits(max_response_body_bytes=cap)
            )
            try:
                assert len((await client.request("GET", f"/{cap}", timeout_s=5)).body) == cap
                with pytest.raises(H2TransportError, match="over"):
                    await client.request("GET", f"/{cap + 1}", timeout_s=5)
                assert (await client.request("GET", "/3", timeout_s=5)).body == b"rrr"
                assert server.stats.connections_open == 1
            finally:
                await client.close()

    run(main())


def test_connect_refused_is_a_transport_error() -> None:
    async def main() -> None:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        client = H2Client("127.0.0.1", port)
        with pytest.raises(H2TransportError):
            await client.request("GET", "/", timeout_s=5)
        await client.close()

    run(main())


def test_a_peer_sending_garbage_instead_of_the_preface_is_dropped() -> None:
    async def main() -> None:
        async with serving(echo) as server, client_of(server) as client:
            reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
            writer.write(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
            await writer.drain()
            with contextlib.suppress(ConnectionError):
                while await reader.read(65536):
                    pass  # the server's SETTINGS/GOAWAY, then EOF
            writer.close()
            assert server.stats.handshake_failures == 1
            assert (await client.request("POST", "/", body=b"still", timeout_s=5)).body == b"still"

    run(main())


def test_a_peer_that_never_sends_the_preface_is_dropped_after_the_handshake_timeout() -> None:
    limits = H2Limits(handshake_timeout_s=0.2)

    async def main() -> None:
        async with serving(echo, limits) as server:
            reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
            with contextlib.suppress(ConnectionError):
                while await reader.read(65536):
                    pass
            writer.close()
            assert server.stats.handshake_failures == 1
            assert server.stats.connections_open == 0

    run(main())


def test_a_peer_that_stops_reading_holds_a_bounded_buffer_and_is_dropped() -> None:
    limits = H2Limits(send_timeout_s=0.3)
    payload = b"\x00" * (64 * MIB)
    served = asyncio.Event()

    async def big(request: H2Request) -> H2Response:
        served.set()
        return H2Response(200, [], payload)

    async def main() -> None:
        nonlocal served
        served = asyncio.Event()
        async with serving(big, limits) as server:
            # Large windows: only our backpressure, not HTTP/2 flow control, stops the server.
            peer = await RawPeer.connect(server.port, big_windows=True)
            peer.open_stream("/big")
            await peer.flush()
            await served.wait()
            await wait_until(lambda: server.stats.send_timeouts == 1)
            await wait_until(lambda: server.stats.connections_open == 0)
            # what the server ever held in its own buffer: about one chunk + the high-water mark
            bound = limits.send_chunk_bytes + limits.write_buffer_high_bytes + 64 * 1024
            assert server.stats.peak_write_buffer_bytes <= bound
            received = await peer.read_until_eof()  # kernel buffers, then the reset
            assert received < 64 * MIB
            peer.close()

    run(main())


def test_connections_beyond_the_cap_are_refused_while_the_others_keep_working() -> None:
    limits = H2Limits(max_connections=3)

    async def main() -> None:
        async with serving(echo, limits) as server, client_of(server) as client:
            assert (await client.request("GET", "/", timeout_s=5)).status == 200
            peers = [await RawPeer.connect(server.port) for _ in range(2)]
            await wait_until(lambda: server.stats.connections_open == 3)
            for _ in range(5):
                refused = await RawPeer.connect(server.port)
                assert await refused.read_until_eof() == 0  # not even the server's SETTINGS
                refused.close()
            assert server.stats.connections_refused == 5
            other = H2Client("127.0.0.1", server.port)
            with pytest.raises(H2TransportError):
                await other.request("GET", "/", timeout_s=5)
            await other.close()
            assert (await client.request("POST", "/", body=b"alive", timeout_s=5)).body == b"alive"
            for peer in peers:
                peer.close()
            await wait_until(lambda: server.stats.connections_open == 1)
            third = H2Client("127.0.0.1", server.port)
            assert (await third.request("GET", "/", timeout_s=5)).status == 200
            await third.close()

    run(main())


def test_close_is_idempotent_and_a_closed_client_refuses() -> None:
    async def main() -> None:
        server = H2Server(echo)
        await server.start()
        client = H2Client("127.0.0.1", server.port)
        assert (await client.request("GET", "/", timeout_s=5)).status == 200
        await client.close()
        await client.close()
        with pytest.raises(H2TransportError):
            await client.request("GET", "/", timeout_s=5)
        await server.close()
        await server.close()

    run(main())


# -- the zero-copy DATA path over real sockets (cluster.h2frames) -----------------------------
SMALL_CHUNKS = H2Limits(send_chunk_bytes=16_384)


@pytest.mark.parametrize("limits", [DEFAULT_LIMITS, SMALL_CHUNKS], ids=["1MiB-frames", "16KiB"])
def test_body_sizes_at_the_frame_edges_round_trip_both_ways(limits: H2Limits) -> None:
    chunk = limits.send_chunk_bytes
    sizes = [0, 1, chunk - 1, chunk, chunk + 1, 5 * chunk + 3]

    async def main() -> None:
        async with (
            serving(
                echo, H2Limits(max_request_body_bytes=8 * MIB, send_chunk_bytes=chunk)
            ) as server,
            client_of(server, limits) as client,
        ):
            for size in sizes:
                body = bytes((i * 7 + size) % 251 for i in range(size))
                response = await client.request("POST", "/", body=body, timeout_s=10)
                assert (response.status, response.body) == (200, body)
            # a response cut into many frames by the server, into several parts by the handler
            assert server.stats.streams_opened == len(sizes)
            assert server.stats.body_bytes_sent == sum(sizes)

    run(main())


def test_the_zero_copy_path_under_uvloop_which_the_brokers_run_on() -> None:
    """uvloop's transports are not asyncio's: BufferedProtocol reads and memoryview writes."""
    uvloop = pytest.importorskip("uvloop")
    sizes = [0, 1, 16_384, 3 * MIB + 5]

    async def main() -> None:
        async with (
            serving(echo, H2Limits(max_request_body_bytes=4 * MIB)) as server,
            client_of(server, SMALL_CHUNKS) as client,
        ):
            assert "uvloop" in type(asyncio.get_running_loop()).__module__
            for size in sizes:
                body = hashlib.sha256(str(size).encode()).digest() * (size // 32) + b"t" * (
                    size % 32
                )
                response = await client.request("POST", "/", body=body, timeout_s=10)
                assert response.body == body

    uvloop.run(asyncio.wait_for(main(), 30))


def test_concurrent_large_responses_interleave_on_one_connection_intact() -> None:
    bodies = {i: hashlib.sha256(str(i).encode()).digest() * (40_000 + 997 * i) for i in range(8)}

    async def handler(request: H2Request) -> H2Response:
        body = bodies[int(request.path.strip("/"))]
        view = memoryview(body)
        return H2Response(200, [], [view[:1000], view[1000:]])

    async def main() -> None:
        async with serving(handler, SMALL_CHUNKS) as server, client_of(server) as client:
            responses = await asyncio.gather(
                *(client.request("GET", f"/{i}", timeout_s=20) for i in bodies)
            )
            assert [r.body for r in responses] == list(bodies.values())
            assert server.stats.connections_open == 1

    run(main())


class WindowedPeer(RawPeer):
    """A client that advertises small windows and acknowledges only when told to, counting
    what arrives per stream; stock h2 on this side raises if the server oversteps a window."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        super().__init__(reader, writer)
        self.received: dict[int, bytearray] = {}
        self.ended: set[int] = set()
        self.unacked: list[tuple[int, int]] = []

    @classmethod
    async def open(cls, port: int, *, stream_window: int) -> WindowedPeer:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        peer = cls(reader, writer)
        peer.h2.initiate_connection()
        codes = h2.settings.SettingCodes
        peer.h2.update_settings({codes.INITIAL_WINDOW_SIZE: stream_window})
        await peer.flush()
        return peer

    async def read_until(self, done: Callable[[], bool], timeout_s: float = 10.0) -> None:
        async with asyncio.timeout(timeout_s):
            while not done():
                await self._read_once()

    async def read_more_than(self, before: int, count: Callable[[], int]) -> None:
        await self.read_until(lambda: count() > before)

    async def read_briefly(self, quiet_s: float = 0.2) -> None:
        """Whatever else arrives within quiet_s: only ever finds a violation, never causes a
        failure by being slow."""
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(quiet_s):
                while True:
                    await self._read_once()

    async def _read_once(self) -> None:
        data = await self.reader.read(1 << 20)
        if not data:
            raise EOFError
        # stock h2 raises FlowControlError if the server oversteps a window
        for event in self.h2.receive_data(data):
            if isinstance(event, h2.events.DataReceived) and event.stream_id:
                assert event.data is not None
                self.received.setdefault(event.stream_id, bytearray()).extend(event.data)
                self.unacked.append((event.stream_id, event.flow_controlled_length))
            elif isinstance(event, h2.events.StreamEnded) and event.stream_id:
                self.ended.add(event.stream_id)
        await self.flush()  # SETTINGS acks etc.; no WINDOW_UPDATE unless ack() is called

    async def ack(self) -> None:
        for sid, n in self.unacked:
            self.h2.acknowledge_received_data(n, sid)
        self.unacked.clear()
        await self.flush()


def test_stream_window_exhaustion_stalls_the_sender_and_window_update_resumes_it() -> None:
    size = 300_000
    payload = bytes(range(256)) * (size // 256) + b"!" * (size % 256)

    async def handler(request: H2Request) -> H2Response:
        return H2Response(200, [], payload)

    async def main() -> None:
        async with serving(handler) as server:
            peer = await WindowedPeer.open(server.port, stream_window=50_000)
            sid = peer.open_stream("/")
            await peer.flush()
            await peer.read_until(lambda: len(peer.received.get(sid, b"")) >= 50_000)
            await peer.read_briefly()
            # exactly the stream window, not a byte more (the connection window is larger)
            assert len(peer.received[sid]) == 50_000
            assert sid not in peer.ended
            while sid not in peer.ended:
                before = len(peer.received[sid])
                await peer.ack()  # h2 sends WINDOW_UPDATE once half the window is consumed
                await peer.read_more_than(before, lambda: len(peer.received[sid]))  # resumed
            assert bytes(peer.received[sid]) == payload
            peer.close()

    run(main())


def test_connection_window_is_shared_by_streams_and_respected() -> None:
    """Stream windows large, connection window the default 65 535: two responses together
    never exceed it until the peer acknowledges (RFC 9113 §6.9.1)."""
    size = 100_000
    payload = b"c" * size

    async def handler(request: H2Request) -> H2Response:
        return H2Response(200, [], payload)

    async def main() -> None:
        async with serving(handler) as server:
            peer = await WindowedPeer.open(server.port, stream_window=2**31 - 1)
            sids = [peer.open_stream("/a"), peer.open_stream("/b")]
            await peer.flush()

            def total() -> int:
                return sum(len(v) for v in peer.received.values())

            await peer.read_until(lambda: total() >= 65_535)
            await peer.read_briefly()
            assert total() == 65_535
            while len(peer.ended) < 2:
                before = total()
                await peer.ack()
                await peer.read_more_than(before, total)
            assert [bytes(peer.received[s]) for s in sids] == [payload, payload]
            peer.close()

    run(main())


def test_a_slow_reader_gets_everything_while_the_server_buffer_stays_bounded() -> None:
    limits = H2Limits(send_chunk_bytes=256 * 1024)
    payload = hashlib.sha256(b"slow").digest() * (16 * MIB // 32)

    async def handler(request: H2Request) -> H2Response:
        return H2Response(200, [], payload)

    async def main() -> None:
        async with serving(handler, limits) as server:
            peer = await RawPeer.connect(server.port, big_windows=True)
            sid = peer.open_stream("/")
            await peer.flush()
            body = bytearray()
            reads = 0
            while True:
                data = await peer.reader.read(8192)  # small reads, a yield between them
                assert data
                reads += 1
                done = False
                for event in peer.h2.receive_data(data):
                    if isinstance(event, h2.events.DataReceived) and event.stream_id == sid:
                        assert event.data is not None
                        body += event.data
                        peer.h2.acknowledge_received_data(event.flow_controlled_length, sid)
                    done |= isinstance(event, h2.events.StreamEnded)
                await peer.flush()
                await asyncio.sleep(0)
                if done:
                    break
            assert bytes(body) == payload
            bound = limits.send_chunk_bytes + limits.write_buffer_high_bytes + 64 * 1024
            assert server.stats.peak_write_buffer_bytes <= bound
            peer.close()

    run(main())


def test_a_response_with_content_length_over_the_cap_is_refused_before_its_body() -> None:
    cap = 1 * MIB

    async def handler(request: H2Request) -> H2Response:
        return H2Response(200, [], b"ok" if request.path == "/small" else b"x" * (64 * MIB))

    async def main() -> None:
        async with serving(handler) as server:
            client = H2Client(
                "127.0.0.1", server.port, limits=H2Limits(max_response_body_bytes=cap)
            )
            try:
                with pytest.raises(H2TransportError, match="over"):
                    await client.request("GET", "/big", timeout_s=10)
                # reset at the headers: the server stops well short of 64 MiB
                await wait_until(lambda: server.stats.streams_reset == 1)
                assert server.stats.body_bytes_sent < 64 * MIB
                assert (await client.request("GET", "/small", timeout_s=10)).body == b"ok"
                assert server.stats.connections_open == 1
            finally:
                await client.close()

    run(main())


# -- requests the server did not process are sent again ----------------------------------------
class ScriptedServer:
    """A hand-driven h2c server: ``script(conn_index, h2, stream_id)`` decides per request
    whether to ``answer`` (with the path), ``refuse`` the stream, ``hold`` it or ``close`` the
    connection; the script may
    also act on the connection itself (GOAWAY)."""

    def __init__(self, script: Callable[[int, h2.connection.H2Connection, int], str]) -> None:
        self.script = script
        self.connections = 0
        self.requests: list[tuple[int, int, str]] = []  # (connection, stream, path)
        self.server: asyncio.Server | None = None

    async def start(self) -> int:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        return int(self.server.sockets[0].getsockname()[1])

    async def close(self) -> None:
        if self.server is not None:
            self.server.close()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        index = self.connections
        self.connections += 1
        conn = h2.connection.H2Connection(h2.config.H2Configuration(client_side=False))
        conn.initiate_connection()
        writer.write(conn.data_to_send())
        try:
            while data := await reader.read(65536):
                for event in conn.receive_data(data):
                    if isinstance(event, h2.events.RequestReceived):
                        assert event.stream_id is not None and event.headers is not None
                        path = dict(event.headers)[b":path"].decode()
                        self.requests.append((index, event.stream_id, path))
                        action = self.script(index, conn, event.stream_id)
                        if action == "answer":
                            body = path.encode()
                            conn.send_headers(
                                event.stream_id,
                                [(":status", "200"), ("content-length", str(len(body)))],
                            )
                            conn.send_data(event.stream_id, body, end_stream=True)
                        elif action == "refuse":
                            conn.reset_stream(event.stream_id, h2.errors.ErrorCodes.REFUSED_STREAM)
                        elif action == "close":
                            writer.write(conn.data_to_send())
                            return
                writer.write(conn.data_to_send())
                await writer.drain()
        except ConnectionError:
            pass
        finally:
            writer.close()


def test_a_refused_stream_is_sent_again_and_answered() -> None:
    refused: set[int] = set()

    def script(index: int, conn: h2.connection.H2Connection, sid: int) -> str:
        if len(refused) < 2:
            refused.add(sid)
            return "refuse"
        return "answer"

    async def main() -> None:
        scripted = ScriptedServer(script)
        port = await scripted.start()
        client = H2Client("127.0.0.1", port)
        try:
            response = await client.request("GET", "/x", timeout_s=10)
            assert response.body == b"/x"
            assert client.resends == 2
            assert [r[2] for r in scripted.requests] == ["/x"] * 3
        finally:
            await client.close()
            await scripted.close()

    run(main())


def test_streams_beyond_goaway_last_stream_id_are_sent_again_on_a_new_connection() -> None:
    seen: list[int] = []

    def script(index: int, conn: h2.connection.H2Connection, sid: int) -> str:
        if index == 0:
            seen.append(sid)
            # the first connection answers nothing until it has two streams, then processes
            # none of them: GOAWAY with last_stream_id below both
            if len(seen) == 2:
                conn.close_connection(last_stream_id=0)
            return "hold"
        return "answer"

    async def main() -> None:
        scripted = ScriptedServer(script)
        port = await scripted.start()
        client = H2Client("127.0.0.1", port)
        try:
            a, b = await asyncio.gather(
                client.request("GET", "/a", timeout_s=10), client.request("GET", "/b", timeout_s=10)
            )
            assert (a.body, b.body) == (b"/a", b"/b")
            assert client.resends == 2
            assert scripted.connections == 2
            assert sorted(p for c, _, p in scripted.requests if c == 1) == ["/a", "/b"]
        finally:
            await client.close()
            await scripted.close()

    run(main())


def test_a_stream_the_server_processed_before_goaway_is_not_sent_again() -> None:
    def script(index: int, conn: h2.connection.H2Connection, sid: int) -> str:
        if index == 0:
            conn.close_connection(last_stream_id=sid)  # taken, then the connection goes
            return "close"
        return "answer"

    async def main() -> None:
        scripted = ScriptedServer(script)
        port = await scripted.start()
        client = H2Client("127.0.0.1", port)
        try:
            with pytest.raises(H2TransportError):
                await client.request("POST", "/once", body=b"not idempotent", timeout_s=10)
            assert client.resends == 0
            assert len(scripted.requests) == 1
        finally:
            await client.close()
            await scripted.close()

    run(main())


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    part_sizes=st.lists(st.integers(0, 40_000), min_size=0, max_size=24),
    chunk=st.sampled_from([1000, 16_384, 65_536, MIB]),
    seed=st.integers(0, 2**32 - 1),
)
def test_any_parts_and_frame_size_round_trip_byte_identical(
    part_sizes: list[int], chunk: int, seed: int
) -> None:
    """Random buffers per response, cut into random frame sizes: the body arrives intact."""
    rng = random.Random(seed)
    parts = [rng.randbytes(n) for n in part_sizes]
    limits = H2Limits(send_chunk_bytes=chunk)

    async def handler(request: H2Request) -> H2Response:
        return H2Response(200, [], [memoryview(p) for p in parts])

    async def main() -> None:
        async with serving(handler, limits) as server, client_of(server) as client:
            response = await client.request("GET", "/", timeout_s=20)
            assert response.body == b"".join(parts)
            assert server.stats.body_bytes_sent == sum(part_sizes)

    run(main())
