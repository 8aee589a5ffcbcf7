"""A blocking HTTP/1.1 GET client that reads each answer into one buffer allocated once.

What a Python consumer with a thread of its own would write against the broker: one
keep-alive connection on a blocking socket, the request sent whole, the answer received with
``recv_into`` straight into a ``bytearray`` kept for the connection (no asyncio buffer, no
per-answer ``bytes`` of the body: the kernel's copy is the only one), the body handed back as a
``memoryview`` of it for ``orjson.loads``. It is the Logbus counterpart of
:class:`benchmarks.redis_peer.RawRedis` (``hiredis`` on a blocking socket) and of the
blocking redis-py client the Redis rows use.

It reads only what the broker sends to a GET: a status line, headers with a Content-Length,
that many bytes of body. Anything else (chunked transfer, no length, an answer past
``MAX_ANSWER_BYTES``, bytes after the answer) is a :class:`ProtocolError`, not a guess.
"""

from __future__ import annotations

import socket

BUFFER_BYTES = 1 << 20  # a 1,000-record page of 100-byte values is ≈ 174 KB
MAX_ANSWER_BYTES = 64 << 20  # the broker's largest fetch (max_fetch_bytes) with room to spare
MAX_HEAD_BYTES = 16 << 10
TIMEOUT_S = 60.0


class ProtocolError(Exception):
    """An answer this client does not read (see the module docstring)."""


class BlockingConn:
    """One keep-alive HTTP/1.1 connection to ``127.0.0.1:port``, one GET at a time."""

    def __init__(self, port: int, timeout_s: float = TIMEOUT_S) -> None:
        self.port = port
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=timeout_s)
        self.buffer = bytearray(BUFFER_BYTES)
        self.view = memoryview(self.buffer)

    def get(self, target: str, accept: str = "application/json") -> tuple[int, memoryview]:
        """Send ``GET target``; the status and the body, a view of this connection's buffer
        that the next call overwrites."""
        self.sock.sendall(
            f"GET {target} HTTP/1.1\r\nHost: 127.0.0.1:{self.port}\r\n"
            f"Accept: {accept}\r\n\r\n".encode()
        )
        received = 0
        while (end := self.buffer.find(b"\r\n\r\n", 0, received)) < 0:
            if received >= MAX_HEAD_BYTES:
                raise ProtocolError(f"no end of the head in {received} bytes")
            received += self._recv(received)
        status, length = head_of(bytes(self.buffer[:end]))
        start = end + 4
        answer_bytes = start + length
        if answer_bytes > MAX_ANSWER_BYTES:
            raise ProtocolError(f"an answer of {answer_bytes} bytes")
        if answer_bytes > len(self.buffer):  # a new buffer: a caller may hold a view of this one
            grown = bytearray(answer_bytes)
            grown[:received] = self.view[:received]
            self.buffer, self.view = grown, memoryview(grown)
        while received < answer_bytes:
            received += self._recv(received, answer_bytes)
        if received != answer_bytes:
            raise ProtocolError(f"{received - answer_bytes} bytes after the answer")
        return status, self.view[start:answer_bytes]

    def _recv(self, at: int, upto: int | None = None) -> int:
        n = self.sock.recv_into(self.view[at:upto])
        if n == 0:
            raise ConnectionError("the broker closed the connection")
        return n

    def close(self) -> None:
        self.sock.close()


def head_of(head: bytes) -> tuple[int, int]:
    """An answer's head (status line and headers, no final blank line) → (status,
    Content-Length)."""
    status_line, *lines = head.split(b"\r\n")
    version, _, rest = status_line.partition(b" ")
    if not version.startswith(b"HTTP/1."):
        raise ProtocolError(f"not an HTTP/1.x answer: {status_line[:80]!r}")
    length: int | None = None
    for line in lines:
        name, _, value = line.partition(b":")
        name = name.strip().lower()
        if name == b"content-length":
            length = int(value)
        elif name == b"transfer-encoding":
            raise ProtocolError(f"Transfer-Encoding: {value.strip()[:40]!r}")
    if length is None:
        raise ProtocolError("no Content-Length")
    return int(rest[:3]), length
