"""An answer's head and body in one write (api/connections.py, :class:`HeadHeld`).

The unit tests drive :class:`HeadHeld` over a transport that records what it is handed; the
property test checks that whatever uvicorn writes, the bytes handed on are the same bytes in
the same order once the answer completes. The broker tests check the answers a client sees:
a JSON fetch, a ``HEAD`` (a head and no body write), ``Expect: 100-continue`` and an answer on
a connection the client closes.
"""

from __future__ import annotations

from typing import Any

import httpx
import orjson
from hypothesis import given
from hypothesis import strategies as st

from api.connections import HeadHeld
from tests.api.helpers import create_topic
from tests.api.rawclient import connect, read_answer, read_head
from tests.server import BrokerProcess

HEAD = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 2\r\n\r\n"
CHUNKED_HEAD = (
    b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"
)


class Recorder:
    """A transport that keeps each call: ("write", bytes) or ("writelines", [bytes, ...])."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, Any]] = []
        self.closed = False

    def write(self, data: bytes | memoryview) -> None:
        self.calls.append(("write", bytes(data)))

    def writelines(self, parts: Any) -> None:
        self.calls.append(("writelines", [bytes(p) for p in parts]))

    def close(self) -> None:
        self.closed = True

    def is_closing(self) -> bool:
        return self.closed

    def sent(self) -> bytes:
        return b"".join(data if kind == "write" else b"".join(data) for kind, data in self.calls)


def held(recorder: Recorder) -> HeadHeld:
    return HeadHeld(recorder)  # type: ignore[arg-type]


def test_a_head_with_a_content_length_goes_out_with_the_body_in_one_call() -> None:
    r = Recorder()
    t = held(r)
    t.write(HEAD)
    assert r.calls == []
    t.write(b"{}")
    assert r.calls == [("writelines", [HEAD, b"{}"])]
    t.flush()  # the answer completes: nothing is left
    assert r.calls == [("writelines", [HEAD, b"{}"])]


def test_a_head_without_a_body_write_goes_out_when_the_answer_completes() -> None:
    r = Recorder()
    t = held(r)
    t.write(HEAD)  # a HEAD request: uvicorn writes no body
    t.flush()
    assert r.calls == [("write", HEAD)]


def test_a_held_head_goes_out_before_the_connection_closes() -> None:
    r = Recorder()
    t = held(r)
    t.write(HEAD)
    t.close()
    assert r.calls == [("write", HEAD)] and r.closed


def test_streams_and_100_continue_pass_straight_through() -> None:
    r = Recorder()
    t = held(r)
    t.write(b"HTTP/1.1 100 Continue\r\n\r\n")
    t.write(CHUNKED_HEAD)
    t.write(b"5\r\nhello\r\n")
    assert [kind for kind, _ in r.calls] == ["write"] * 3


def test_the_slices_of_a_large_body_follow_the_first_one_unheld() -> None:
    r = Recorder()
    t = held(r)
    body = b"x" * 10
    t.write(HEAD.replace(b"content-length: 2", b"content-length: 10"))
    t.write(memoryview(body)[:4])
    t.write(memoryview(body)[4:])
    assert [kind for kind, _ in r.calls] == ["writelines", "write"]
    assert r.sent().endswith(body)


_writes = st.one_of(
    st.just(HEAD),
    st.just(CHUNKED_HEAD),
    st.just(b"HTTP/1.1 100 Continue\r\n\r\n"),
    st.binary(max_size=64),
    st.binary(max_size=64).map(lambda b: b"HTTP/1.1 " + b + b"\r\ncontent-length: " + b),
    st.binary(min_size=1, max_size=64).map(memoryview),
)


@given(st.lists(st.one_of(_writes, st.just("flush")), max_size=20))
def test_the_bytes_handed_on_are_the_bytes_written_in_order(
    steps: list[bytes | memoryview | str],
) -> None:
    """Whatever is written, once the answer completes (a flush) the transport has been
    handed exactly those bytes in that order; at most one write is ever held."""
    r = Recorder()
    t = held(r)
    written = b""
    for step in steps:
        if isinstance(step, str):
            t.flush()
            assert r.sent() == written
        else:
            t.write(step)
            written += bytes(step)
            assert written.startswith(r.sent())
    t.flush()
    assert r.sent() == written


# -- over a broker -----------------------------------------------------------------------------


def test_a_json_fetch_answers_whole(shared_broker: BrokerProcess, http: httpx.Client) -> None:
    """A fetch's head and body arrive together and read as before: status, headers, a body
    of Content-Length bytes holding the records."""
    topic = create_topic(http, "conn")
    with connect(shared_broker) as s:
        host = f"Host: 127.0.0.1:{shared_broker.port}\r\n"
        body = orjson.dumps({"records": [{"value": i} for i in range(50)]})
        s.sendall(
            f"POST /v1/topics/{topic}/partitions/0/records HTTP/1.1\r\n{host}"
            f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n".encode()
            + body
        )
        assert read_answer(s)[0] == 200
        s.sendall(
            f"GET /v1/topics/{topic}/partitions/0/records?offset=0 HTTP/1.1\r\n{host}\r\n".encode()
        )
        status, headers, answer = read_answer(s)
    assert status == 200
    assert headers["logbus-next-offset"] == "50"
    assert int(headers["content-length"]) == len(answer)
    assert [r["value"] for r in orjson.loads(answer)["records"]] == list(range(50))


def test_a_head_request_gets_its_head(shared_broker: BrokerProcess) -> None:
    with connect(shared_broker) as s:
        s.sendall(
            f"HEAD /healthz HTTP/1.1\r\nHost: 127.0.0.1:{shared_broker.port}\r\n\r\n".encode()
        )
        data = read_head(s)
    assert data.startswith(b"HTTP/1.1 ") and b"content-length: " in data.lower()


def test_expect_100_continue_is_answered_before_the_body(
    shared_broker: BrokerProcess, http: httpx.Client
) -> None:
    topic = create_topic(http, "conn")
    body = orjson.dumps({"records": [{"value": 1}]})
    with connect(shared_broker) as s:
        s.sendall(
            f"POST /v1/topics/{topic}/records HTTP/1.1\r\n"
            f"Host: 127.0.0.1:{shared_broker.port}\r\nExpect: 100-continue\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n".encode()
        )
        interim = read_head(s)
        assert interim.startswith(b"HTTP/1.1 100 Continue\r\n\r\n")
        s.sendall(body)
        status, _, answer = read_answer(s)
    assert status == 200 and orjson.loads(answer)["offsets"][0]["offset"] == 0


def test_an_answer_on_a_closing_connection_arrives_then_eof(shared_broker: BrokerProcess) -> None:
    with connect(shared_broker) as s:
        s.sendall(
            f"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1:{shared_broker.port}\r\n"
            "Connection: close\r\n\r\n".encode()
        )
        status, headers, _ = read_answer(s)
        assert status == 200 and headers["connection"] == "close"
        assert s.recv(65536) == b""
