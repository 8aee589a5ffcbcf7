"""The link proxy (tests/chaos/proxy.py) forwards, cuts, stalls and heals, on a loop and from a
thread, in front of a plain TCP server and in front of PostgreSQL.

Stalls are checked by a read that must time out while stalled (a short bound: a false pass would
need the proxy to be slower than the bound, not faster) and complete after heal (a long bound)."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import socketserver
import threading
from collections.abc import Awaitable, Callable, Iterator

import psycopg
import pytest

from tests.chaos.proxy import LinkProxy, ThreadedLinkProxy
from tests.pg import PostgresServer

HELD_S = 0.3  # "nothing arrives" is checked this long
ARRIVES_S = 10.0  # "it arrives" is given this long


class _Target:
    """An asyncio server that queues what it receives and can write to its clients."""

    def __init__(self) -> None:
        self.received: asyncio.Queue[bytes] = asyncio.Queue()
        self.writers: list[asyncio.StreamWriter] = []
        self.server: asyncio.Server | None = None

    async def start(self, echo: bool) -> int:
        async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            self.writers.append(writer)
            with contextlib.suppress(OSError):
                while data := await reader.read(65536):
                    await self.received.put(data)
                    if echo:
                        writer.write(data)
                        await writer.drain()
            writer.close()

        self.server = await asyncio.start_server(handle, "127.0.0.1", 0)
        return int(self.server.sockets[0].getsockname()[1])

    async def close(self) -> None:
        assert self.server is not None
        self.server.close()
        for w in self.writers:
            w.close()


def _run(body: Callable[[_Target, LinkProxy], Awaitable[None]], echo: bool = True) -> None:
    async def main() -> None:
        target = _Target()
        port = await target.start(echo)
        async with LinkProxy("127.0.0.1", port) as proxy:
            await body(target, proxy)
        await target.close()

    asyncio.run(main())


async def _connect(proxy: LinkProxy) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    return await asyncio.open_connection("127.0.0.1", proxy.port)


async def _read_exactly(reader: asyncio.StreamReader, n: int) -> bytes:
    return await asyncio.wait_for(reader.readexactly(n), ARRIVES_S)


async def _is_dead(reader: asyncio.StreamReader) -> bool:
    """The connection was reset or closed: a read ends in an error or EOF, not a timeout."""
    try:
        data = await asyncio.wait_for(reader.read(1), ARRIVES_S)
    except (ConnectionResetError, BrokenPipeError):
        return True
    return data == b""


def test_bytes_flow_both_ways_and_are_counted() -> None:
    async def body(target: _Target, proxy: LinkProxy) -> None:
        payload = bytes(range(256)) * 1024  # 256 KiB: several chunks
        reader, writer = await _connect(proxy)
        writer.write(payload)
        await writer.drain()
        assert await _read_exactly(reader, len(payload)) == payload
        stats = proxy.stats()
        assert stats.bytes_to_target == len(payload)
        assert stats.bytes_to_client == len(payload)
        assert stats.connections_accepted == 1
        assert stats.connections_open == 1
        writer.close()

    _run(body)


def test_cut_resets_live_connections_refuses_new_ones_and_heal_restores() -> None:
    async def body(target: _Target, proxy: LinkProxy) -> None:
        reader, writer = await _connect(proxy)
        writer.write(b"ping")
        assert await _read_exactly(reader, 4) == b"ping"

        await proxy.cut()
        assert proxy.state == "cut"
        assert proxy.stats().connections_open == 0
        assert await _is_dead(reader)
        reader2, writer2 = await _connect(proxy)  # the kernel accepts; the proxy resets
        assert await _is_dead(reader2)
        assert proxy.stats().connections_refused == 1
        writer.close()
        writer2.close()

        await proxy.heal()
        reader3, writer3 = await _connect(proxy)
        writer3.write(b"again")
        assert await _read_exactly(reader3, 5) == b"again"
        writer3.close()

    _run(body)


def test_stall_holds_bytes_both_ways_and_heal_delivers_them_in_order() -> None:
    async def body(target: _Target, proxy: LinkProxy) -> None:
        reader, writer = await _connect(proxy)
        writer.write(b"hello")
        assert await asyncio.wait_for(target.received.get(), ARRIVES_S) == b"hello"
        (server_side,) = target.writers

        await proxy.stall()
        assert proxy.state == "stalled"
        writer.write(b"to-target")
        server_side.write(b"to-client")
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(target.received.get(), HELD_S)
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(reader.read(1), HELD_S)
        assert proxy.stats().connections_open == 1  # still connected

        await proxy.heal()
        got = b""
        while len(got) < len(b"to-target"):
            got += await asyncio.wait_for(target.received.get(), ARRIVES_S)
        assert got == b"to-target"
        assert await _read_exactly(reader, len(b"to-client")) == b"to-client"
        writer.close()

    _run(body, echo=False)


def test_a_connection_opened_during_a_stall_connects_on_heal() -> None:
    async def body(target: _Target, proxy: LinkProxy) -> None:
        await proxy.stall()
        _reader, writer = await _connect(proxy)
        writer.write(b"early")
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(target.received.get(), HELD_S)
        assert target.writers == []  # not even connected upstream
        await proxy.heal()
        assert await asyncio.wait_for(target.received.get(), ARRIVES_S) == b"early"
        writer.close()

    _run(body, echo=False)


def test_half_close_is_passed_on() -> None:
    """A client that shuts down its sending side still gets the whole answer."""

    async def body(target: _Target, proxy: LinkProxy) -> None:
        reader, writer = await _connect(proxy)
        writer.write(b"last words")
        writer.write_eof()
        assert await asyncio.wait_for(reader.read(), ARRIVES_S) == b"last words"
        writer.close()

    _run(body)


# -- the threaded wrapper, for synchronous tests -----------------------------------------------


class _EchoHandler(socketserver.BaseRequestHandler):
    def handle(self) -> None:
        with contextlib.suppress(OSError):
            while data := self.request.recv(65536):
                self.request.sendall(data)


@pytest.fixture
def echo_port() -> Iterator[int]:
    server = socketserver.ThreadingTCPServer(("127.0.0.1", 0), _EchoHandler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield int(server.server_address[1])
    finally:
        server.shutdown()
        server.server_close()


def _echo_roundtrip(port: int, payload: bytes) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=ARRIVES_S) as s:
        s.sendall(payload)
        got = b""
        while len(got) < len(payload):
            chunk = s.recv(65536)
            if not chunk:
                break
            got += chunk
        return got


def test_threaded_proxy_forwards_cuts_stalls_and_heals(echo_port: int) -> None:
    with ThreadedLinkProxy("127.0.0.1", echo_port) as proxy:
        assert _echo_roundtrip(proxy.port, b"abc" * 10000) == b"abc" * 10000
        assert proxy.stats().bytes_to_client == 30000

        live = socket.create_connection(("127.0.0.1", proxy.port), timeout=ARRIVES_S)
        live.sendall(b"x")
        assert live.recv(1) == b"x"
        proxy.stall()
        live.sendall(b"held")
        live.settimeout(HELD_S)
        with pytest.raises(TimeoutError):
            live.recv(4)
        proxy.heal()
        live.settimeout(ARRIVES_S)
        got = b""
        while len(got) < 4:
            got += live.recv(4)
        assert got == b"held"

        proxy.cut()
        assert proxy.state == "cut"
        try:
            dead = live.recv(1) == b""
        except ConnectionResetError:
            dead = True
        assert dead
        live.close()
        try:  # accepted, then reset: the send or the read fails, or the read sees EOF
            refused = _echo_roundtrip(proxy.port, b"no") == b""
        except OSError:
            refused = True
        assert refused
        proxy.heal()
        assert _echo_roundtrip(proxy.port, b"yes") == b"yes"
    proxy.close()  # idempotent


def test_threaded_proxy_in_front_of_postgresql(postgres_server: PostgresServer) -> None:
    """A broker cut off from the database: its connection fails, new ones fail, heal helps."""

    def connect(port: int) -> psycopg.Connection[tuple[object, ...]]:
        return psycopg.connect(
            host="127.0.0.1", port=port, user="postgres", dbname="postgres", connect_timeout=5
        )

    with ThreadedLinkProxy("127.0.0.1", postgres_server.port) as proxy:
        with connect(proxy.port) as conn:
            assert conn.execute("SELECT 1").fetchone() == (1,)
            proxy.cut()
            with pytest.raises(psycopg.OperationalError):
                conn.execute("SELECT 2")
        with pytest.raises(psycopg.OperationalError):
            connect(proxy.port)
        proxy.heal()
        with connect(proxy.port) as conn:
            assert conn.execute("SELECT 3").fetchone() == (3,)
        assert proxy.stats().connections_refused >= 1
