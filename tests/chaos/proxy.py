"""A TCP proxy that a test can cut or stall: the network faults of the cluster tests.

Put one in front of a broker's replication listener or of PostgreSQL and hand the broker the
proxy's port instead. Three states:

* open — bytes are copied both ways, ``CHUNK_BYTES`` at a time.
* cut — every live connection is reset (RST: SO_LINGER 0, then close) on both sides, and new
  connections are accepted and reset at once, until :meth:`LinkProxy.heal`. This is a link
  whose peer says "gone" at once: clients see ``ConnectionResetError``/EOF immediately.
* stalled — sockets stay open but no byte moves in either direction, and new connections are
  accepted but not connected upstream, until :meth:`LinkProxy.heal`. This is a partition that
  only timeouts can notice: what was sent after :meth:`LinkProxy.stall` returned is held (one
  chunk per direction in the proxy, the rest in kernel buffers, which then push back on the
  sender) and delivered, in order, after :meth:`LinkProxy.heal`.

:class:`LinkProxy` runs on the caller's event loop; :class:`ThreadedLinkProxy` runs one on its own
loop in a daemon thread, with the same controls as plain blocking, thread-safe methods, for
synchronous tests driving broker processes. Each control returns once it has taken effect
(after :meth:`cut`, every connection that was live is closed).
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import struct
import threading
from collections.abc import Coroutine
from dataclasses import dataclass
from typing import Any, Final, TypeVar

CHUNK_BYTES: Final = 64 * 1024  # one read per direction; what a stall holds in the proxy
MAX_CONNECTIONS: Final = 1024  # more than 3 brokers' pools; beyond it new ones are reset
CONNECT_TIMEOUT_S: Final = 10.0  # upstream connect, so a dead target cannot hang a handler
CONTROL_TIMEOUT_S: Final = 30.0  # ThreadedLinkProxy waits this long for its loop to act

_T = TypeVar("_T")


@dataclass(frozen=True, slots=True)
class LinkStats:
    """Counters since start. Bytes count what was forwarded, not what was held by a stall."""

    bytes_to_target: int
    bytes_to_client: int
    connections_accepted: int
    connections_open: int
    connections_refused: int


def _reset(writer: asyncio.StreamWriter) -> None:
    """Close with RST rather than FIN, so the peer sees the link die, not a clean goodbye."""
    sock = writer.get_extra_info("socket")
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    writer.transport.abort()


class _Connection:
    """One client connection and, once connected, its upstream connection."""

    def __init__(self, client: asyncio.StreamWriter, task: asyncio.Task[None]) -> None:
        self.client = client
        self.upstream: asyncio.StreamWriter | None = None
        self.task = task

    def reset(self) -> None:
        _reset(self.client)
        if self.upstream is not None:
            _reset(self.upstream)
        self.task.cancel()


class LinkProxy:
    """An asyncio TCP proxy from ``listen_host``:(ephemeral) to ``target_host``:``target_port``.

    :meth:`start` returns the listening port. All methods run on the loop that called
    :meth:`start`.
    """

    def __init__(self, target_host: str, target_port: int, listen_host: str = "127.0.0.1") -> None:
        self.target_host = target_host
        self.target_port = target_port
        self.listen_host = listen_host
        self._server: asyncio.Server | None = None
        self._port: int | None = None
        self._cut = False
        self._flowing = asyncio.Event()
        self._flowing.set()
        self._connections: set[_Connection] = set()
        self._bytes_to_target = 0
        self._bytes_to_client = 0
        self._accepted = 0
        self._refused = 0

    async def __aenter__(self) -> LinkProxy:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    @property
    def port(self) -> int:
        if self._port is None:
            raise RuntimeError("LinkProxy.start() has not run")
        return self._port

    @property
    def state(self) -> str:
        """``open``, ``cut`` or ``stalled``."""
        if self._cut:
            return "cut"
        return "open" if self._flowing.is_set() else "stalled"

    def stats(self) -> LinkStats:
        return LinkStats(
            bytes_to_target=self._bytes_to_target,
            bytes_to_client=self._bytes_to_client,
            connections_accepted=self._accepted,
            connections_open=len(self._connections),
            connections_refused=self._refused,
        )

    async def start(self) -> int:
        """Listen on an ephemeral port; returns it."""
        self._server = await asyncio.start_server(self._handle, self.listen_host, 0)
        self._port = int(self._server.sockets[0].getsockname()[1])
        return self._port

    async def cut(self) -> None:
        """Reset every live connection and every new one until :meth:`heal`."""
        self._cut = True
        await self._reset_all()

    async def stall(self) -> None:
        """Stop moving bytes both ways (sockets stay open) until :meth:`heal`."""
        self._flowing.clear()

    async def heal(self) -> None:
        """Back to open: new connections work, stalled bytes are delivered."""
        self._cut = False
        self._flowing.set()

    async def close(self) -> None:
        """Stop listening and reset every connection."""
        if self._server is not None:
            self._server.close()
        await self._reset_all()
        self._flowing.set()
        if self._server is not None:
            await self._server.wait_closed()
            self._server = None

    async def _reset_all(self) -> None:
        live = list(self._connections)
        for conn in live:
            conn.reset()
        # Wait for the handlers to finish so that "cut() returned" means "they are gone".
        await asyncio.gather(*(c.task for c in live), return_exceptions=True)

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self._cut or len(self._connections) >= MAX_CONNECTIONS:
            self._refused += 1
            _reset(writer)
            return
        task = asyncio.current_task()
        assert task is not None
        conn = _Connection(writer, task)
        self._connections.add(conn)
        self._accepted += 1
        graceful = False
        try:
            await self._flowing.wait()  # stalled: not even the upstream handshake happens
            up_reader, up_writer = await asyncio.wait_for(
                asyncio.open_connection(self.target_host, self.target_port), CONNECT_TIMEOUT_S
            )
            conn.upstream = up_writer
            async with asyncio.TaskGroup() as pumps:  # one fails: the other is cancelled
                pumps.create_task(self._pump(reader, up_writer, to_target=True))
                pumps.create_task(self._pump(up_reader, writer, to_target=False))
            graceful = True
        except* OSError:  # includes TimeoutError and the resets of either peer
            pass
        finally:
            self._connections.discard(conn)
            for side in (writer, conn.upstream):
                if side is None:
                    continue
                if graceful:  # both directions saw EOF: a FIN keeps bytes still in flight
                    side.close()
                else:
                    _reset(side)

    async def _pump(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, *, to_target: bool
    ) -> None:
        """Copy one direction; on EOF pass the half-close on and return."""
        while True:
            data = await reader.read(CHUNK_BYTES)
            await self._flowing.wait()
            if not data:
                if writer.can_write_eof():
                    writer.write_eof()
                return
            writer.write(data)
            if to_target:
                self._bytes_to_target += len(data)
            else:
                self._bytes_to_client += len(data)
            await writer.drain()


class ThreadedLinkProxy:
    """A :class:`LinkProxy` on its own event loop in a daemon thread; blocking, thread-safe
    controls for synchronous tests. Use as a context manager or call :meth:`close`."""

    def __init__(self, target_host: str, target_port: int, listen_host: str = "127.0.0.1") -> None:
        self._loop = asyncio.new_event_loop()
        self._proxy: LinkProxy | None = None
        self._args = (target_host, target_port, listen_host)
        self._thread = threading.Thread(
            target=self._loop.run_forever, name=f"link-proxy->{target_port}", daemon=True
        )

    def __enter__(self) -> ThreadedLinkProxy:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def port(self) -> int:
        return self._get().port

    @property
    def state(self) -> str:
        return self._call(self._state())

    def start(self) -> int:
        """Start the loop thread and the proxy; returns the listening port."""
        self._thread.start()
        return self._call(self._start())

    def cut(self) -> None:
        self._call(self._get().cut())

    def stall(self) -> None:
        self._call(self._get().stall())

    def heal(self) -> None:
        self._call(self._get().heal())

    def stats(self) -> LinkStats:
        return self._call(self._stats())

    def close(self) -> None:
        """Close the proxy, stop the loop and join its thread (idempotent)."""
        if not self._thread.is_alive():
            return
        if self._proxy is not None:
            self._call(self._proxy.close())
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(CONTROL_TIMEOUT_S)
        self._loop.close()

    async def _start(self) -> int:
        # The proxy's asyncio.Event must be made on its own loop's thread.
        self._proxy = LinkProxy(*self._args)
        return await self._proxy.start()

    async def _state(self) -> str:
        return self._get().state

    async def _stats(self) -> LinkStats:
        return self._get().stats()

    def _get(self) -> LinkProxy:
        if self._proxy is None:
            raise RuntimeError("ThreadedLinkProxy.start() has not run")
        return self._proxy

    def _call(self, coro: Coroutine[Any, Any, _T]) -> _T:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(CONTROL_TIMEOUT_S)
