"""``benchmarks.blocking_http``: the blocking GET client of the consume rows, against a socket
that sends canned answers (no broker): what it reads, and what it refuses."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator

import pytest

from benchmarks.blocking_http import BUFFER_BYTES, BlockingConn, ProtocolError, head_of


@pytest.fixture
def canned() -> Iterator[tuple[int, list[bytes], list[bytes]]]:
    """A one-connection server on a free port: for each request it reads (up to the blank line)
    it sends the next answer of ``answers`` in pieces of 7,000 bytes, and keeps the requests."""
    listener = socket.create_server(("127.0.0.1", 0))
    answers: list[bytes] = []
    requests: list[bytes] = []

    def serve() -> None:
        conn, _ = listener.accept()
        with conn:
            pending = b""
            while answers:
                while b"\r\n\r\n" not in pending:
                    chunk = conn.recv(4096)
                    if not chunk:
                        return
                    pending += chunk
                request, _, pending = pending.partition(b"\r\n\r\n")
                requests.append(request)
                answer = answers.pop(0)
                for at in range(0, len(answer), 7000):
                    conn.sendall(answer[at : at + 7000])

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    yield listener.getsockname()[1], answers, requests
    listener.close()
    thread.join(timeout=10)


def answer(body: bytes, status: bytes = b"200 OK", extra: bytes = b"") -> bytes:
    head = b"HTTP/1.1 " + status + b"\r\ncontent-type: application/json\r\n" + extra
    return head + b"content-length: %d\r\n\r\n" % len(body) + body


def test_reads_answers_in_turn_on_one_connection(
    canned: tuple[int, list[bytes], list[bytes]],
) -> None:
    port, answers, requests = canned
    big = b"[" + b"1," * (BUFFER_BYTES // 2 + 10) + b"1]"  # past the first buffer: it grows
    answers += [answer(b'{"a":1}'), answer(big), answer(b"", b"404 Not Found"), answer(b"[]")]
    conn = BlockingConn(port)
    try:
        status, body = conn.get("/one")
        assert (status, bytes(body)) == (200, b'{"a":1}')
        status, body = conn.get("/two")
        assert (status, bytes(body)) == (200, big)
        status, body = conn.get("/three")
        assert (status, bytes(body)) == (404, b"")
        status, body = conn.get("/four")
        assert (status, bytes(body)) == (200, b"[]")
    finally:
        conn.close()
    assert [r.split(b"\r\n")[0] for r in requests] == [
        b"GET /one HTTP/1.1",
        b"GET /two HTTP/1.1",
        b"GET /three HTTP/1.1",
        b"GET /four HTTP/1.1",
    ]
    assert all(f"Host: 127.0.0.1:{port}".encode() in r for r in requests)


def test_bytes_after_the_answer_are_refused(canned: tuple[int, list[bytes], list[bytes]]) -> None:
    port, answers, _ = canned
    answers.append(answer(b"{}") + b"HTTP/1.1 200 OK\r\n")
    conn = BlockingConn(port)
    try:
        with pytest.raises(ProtocolError, match="after the answer"):
            conn.get("/")
    finally:
        conn.close()


def test_a_closed_connection_is_an_error(canned: tuple[int, list[bytes], list[bytes]]) -> None:
    port, answers, _ = canned
    answers.append(b"HTTP/1.1 200 OK\r\ncontent-length: 10\r\n\r\n{}")  # 2 of 10 bytes, closed
    conn = BlockingConn(port)
    try:
        with pytest.raises(ConnectionError):
            conn.get("/")
    finally:
        conn.close()


def test_head_of() -> None:
    assert head_of(b"HTTP/1.1 200 OK\r\nContent-Length: 17\r\nx: y") == (200, 17)
    assert head_of(b"HTTP/1.0 503 Service Unavailable\r\ncontent-length:0") == (503, 0)
    with pytest.raises(ProtocolError, match="Content-Length"):
        head_of(b"HTTP/1.1 200 OK\r\ncontent-type: application/json")
    with pytest.raises(ProtocolError, match="Transfer-Encoding"):
        head_of(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\ncontent-length: 3")
    with pytest.raises(ProtocolError, match="HTTP/1"):
        head_of(b"ICY 200 OK\r\ncontent-length: 3")
