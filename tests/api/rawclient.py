"""Raw-socket clients for tests of misbehaving peers: they never read unless asked to."""

from __future__ import annotations

import base64
import os
import socket

import orjson

from tests.server import BrokerProcess

DEADLINE_S = 20.0  # generous on a shared 2-core machine


def connect(broker: BrokerProcess, rcvbuf: int | None = None) -> socket.socket:
    """A connected socket; ``rcvbuf`` shrinks its receive buffer (a client that reads little)."""
    s = socket.socket()
    if rcvbuf is not None:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
    s.connect(("127.0.0.1", broker.port))
    s.settimeout(DEADLINE_S)
    return s


def closed_by_peer(s: socket.socket) -> bool:
    """Read until EOF (True) or the deadline (False); answers before EOF are skipped."""
    try:
        while s.recv(65536):
            pass
    except TimeoutError:
        return False
    except ConnectionResetError:
        return True
    return True


def read_head(s: socket.socket) -> bytes:
    """What arrives up to the end of an answer's head (and whatever came with it)."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = s.recv(65536)
        assert chunk, f"closed before an answer: {data!r}"
        data += chunk
    return data


def read_answer(s: socket.socket) -> tuple[int, dict[str, str], bytes]:
    """One HTTP answer with a Content-Length: (status, lower-cased headers, body)."""
    head, _, body = read_head(s).partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split()[1])
    headers = {k.lower(): v.strip() for k, _, v in (ln.partition(":") for ln in lines[1:])}
    length = int(headers.get("content-length", "0"))
    while len(body) < length:
        chunk = s.recv(65536)
        assert chunk
        body += chunk
    return status, headers, body


def ws_open(broker: BrokerProcess, rcvbuf: int | None = None) -> socket.socket:
    """A WebSocket (``/v1/ws``) on a raw socket, past its handshake."""
    s = connect(broker, rcvbuf)
    key = base64.b64encode(os.urandom(16)).decode()
    s.sendall(
        (
            f"GET /v1/ws HTTP/1.1\r\nHost: 127.0.0.1:{broker.port}\r\nUpgrade: websocket\r\n"
            f"Connection: Upgrade\r\nSec-WebSocket-Key: {key}\r\n"
            "Sec-WebSocket-Version: 13\r\n\r\n"
        ).encode()
    )
    head = b""
    while b"\r\n\r\n" not in head:
        head += s.recv(1)
    assert head.startswith(b"HTTP/1.1 101"), head
    return s


def ws_send(s: socket.socket, doc: dict[str, object]) -> None:
    """One masked text frame holding ``doc`` as JSON (under 126 bytes)."""
    payload = orjson.dumps(doc)
    mask = os.urandom(4)
    assert len(payload) < 126
    masked = bytes(b ^ mask[i % 4] for i, b in enumerate(payload))
    s.sendall(bytes([0x81, 0x80 | len(payload)]) + mask + masked)
