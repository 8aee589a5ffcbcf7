"""The lean lane's two shortcuts in the broker's server (api/connections.py :class:`WholeCycle`,
api/fastpath.py ``FastPath._enter``).

A whole answer (one ``http.response.start`` message carrying its body) must put on the wire
exactly the bytes uvicorn writes for the same answer sent as its two messages, refuse what
uvicorn refuses, and fall back to uvicorn's ``send`` where it cannot write at once. A body
handed over by :meth:`WholeCycle.take_body` is the body ``receive`` would have given. Over a
broker: a produce whose body comes with its head (the lean lane) and one whose body comes
later (the guarded way) are answered alike, and the body limit holds at the limit in both.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import socket
from collections.abc import Iterator
from typing import Any

import httpx
import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from uvicorn.protocols.http.httptools_impl import RequestResponseCycle

from api.connections import (
    BUILT_FIELDS_KEY,
    WHOLE_BODY_KEY,
    HeadHeld,
    WholeCycle,
    remember_header_checks,
)
from benchmarks import request_cost
from tests.api.conftest import make_client, start_broker
from tests.api.helpers import create_topic
from tests.api.rawclient import connect, read_answer
from tests.api.test_connections import Recorder
from tests.server import BrokerProcess

DATE = (b"date", b"Fri, 27 Nov 2026 07:00:00 GMT")


class Flow:
    """uvicorn's FlowControl as a cycle uses it, with the write side pausable."""

    def __init__(self, write_paused: bool = False) -> None:
        self.write_paused = write_paused
        self.read_paused = False

    def resume_reading(self) -> None:
        self.read_paused = False

    def pause_reading(self) -> None:
        self.read_paused = True

    async def drain(self) -> None:
        self.write_paused = False


def cycle_of(
    kind: type[RequestResponseCycle],
    method: str = "POST",
    keep_alive: bool = True,
    write_paused: bool = False,
) -> tuple[RequestResponseCycle, Recorder, list[int]]:
    """A cycle as the broker's protocol makes one (its transport a :class:`HeadHeld`), the
    recorder under it and a list that counts its ``on_response`` calls."""
    remember_header_checks()  # as the broker's server runs
    recorder = Recorder()
    completed: list[int] = []
    cycle = kind(
        scope={"type": "http", "method": method, "path": "/", "headers": []},  # type: ignore[typeddict-item]
        transport=HeadHeld(recorder),  # type: ignore[arg-type]
        flow=Flow(write_paused),  # type: ignore[arg-type]
        logger=logging.getLogger("test"),
        access_logger=logging.getLogger("test.access"),
        access_log=False,
        default_headers=[DATE],
        message_event=asyncio.Event(),
        expect_100_continue=False,
        keep_alive=keep_alive,
        on_response=lambda: completed.append(1),
    )
    return cycle, recorder, completed


def whole(
    status: int,
    fields: list[tuple[bytes, bytes]],
    body: bytes,
    built: list[tuple[bytes, bytes]] | None = None,
) -> dict[str, Any]:
    message = {"type": "http.response.start", "status": status, "headers": fields}
    message[WHOLE_BODY_KEY] = body
    if built is not None:
        message[BUILT_FIELDS_KEY] = built
    return message


async def uvicorns(
    status: int,
    fields: list[tuple[bytes, bytes]],
    body: bytes,
    method: str = "POST",
    keep_alive: bool = True,
) -> tuple[bytes, bool, int]:
    """What uvicorn's cycle writes for the answer as two messages: bytes, closed, completions."""
    cycle, recorder, completed = cycle_of(RequestResponseCycle, method, keep_alive)
    await cycle.send({"type": "http.response.start", "status": status, "headers": fields})
    await cycle.send({"type": "http.response.body", "body": body})
    assert isinstance(cycle.transport, HeadHeld)
    cycle.transport.flush()  # what the protocol does when the answer completes
    return recorder.sent(), recorder.closed, len(completed)


async def wholes(
    status: int,
    fields: list[tuple[bytes, bytes]],
    body: bytes,
    method: str = "POST",
    keep_alive: bool = True,
    write_paused: bool = False,
    built: list[tuple[bytes, bytes]] | None = None,
) -> tuple[bytes, bool, int, Recorder]:
    cycle, recorder, completed = cycle_of(WholeCycle, method, keep_alive, write_paused)
    await cycle.send(whole(status, fields, body, built))  # type: ignore[arg-type]
    assert isinstance(cycle.transport, HeadHeld)
    cycle.transport.flush()
    assert cycle.response_complete
    return recorder.sent(), recorder.closed, len(completed), recorder


def run(coro: Any) -> Any:
    return asyncio.run(coro)


_NAMES = st.sampled_from(
    [b"retry-after", b"ratelimit", b"ratelimit-policy", b"X-Custom", b"logbus-next-offset"]
)
_BUILT_NAMES = st.sampled_from([b"logbus-throttle-time-ms", b"ratelimit", b"retry-after"])
_VALUES = st.binary(min_size=0, max_size=40).map(
    lambda b: bytes(c for c in b if 0x20 <= c < 0x7F or c == 0x09)
)


@settings(max_examples=150, deadline=None)
@given(
    status=st.sampled_from([200, 201, 204, 400, 404, 413, 429, 500, 503]),
    extra=st.lists(st.tuples(_NAMES, _VALUES), max_size=4),
    body=st.binary(max_size=3000),
    keep_alive=st.booleans(),
    built=st.none() | st.lists(st.tuples(_BUILT_NAMES, st.integers(0, 10**12)), max_size=3),
    write_paused=st.booleans(),
    length_given=st.booleans(),
)
def test_a_whole_answer_writes_the_bytes_uvicorn_writes_for_its_two_messages(
    status: int,
    extra: list[tuple[bytes, bytes]],
    body: bytes,
    keep_alive: bool,
    built: list[tuple[bytes, int]] | None,
    write_paused: bool,
    length_given: bool,
) -> None:
    """At once, or through uvicorn's send when the client takes nothing now; with fields
    the broker built (``BUILT_FIELDS_KEY``) written after the others, and without a
    Content-Length the body's written last: as uvicorn writes them when they are the last
    of the start message's."""
    length = (b"content-length", str(len(body)).encode())
    fields = [(b"content-type", b"application/json"), *([length] if length_given else []), *extra]
    built_fields = None if built is None else [(k, str(v).encode()) for k, v in built]
    as_uvicorn = [*fields, *(built_fields or ()), *([] if length_given else [length])]
    expected, closed, completions = run(uvicorns(status, as_uvicorn, body, keep_alive=keep_alive))
    got, got_closed, got_completions, recorder = run(
        wholes(
            status,
            fields,
            body,
            keep_alive=keep_alive,
            write_paused=write_paused,
            built=built_fields,
        )
    )
    assert got == expected
    assert (got_closed, got_completions) == (closed, completions) == (not keep_alive, 1)
    assert recorder.calls[0][0] == "writelines"  # one call: head and body together


@pytest.mark.parametrize(
    "fields",
    [
        [(b"x-bad", b"a\r\nb")],  # a value that would split the head
        [(b"bad name", b"1")],
    ],
)
def test_a_whole_answer_refuses_a_field_uvicorn_refuses(fields: list[tuple[bytes, bytes]]) -> None:
    body = b"{}"
    fields = [(b"content-length", b"2"), *fields]
    with pytest.raises(RuntimeError, match="Invalid HTTP header"):
        run(uvicorns(200, fields, body))
    with pytest.raises(RuntimeError, match="Invalid HTTP header"):
        run(wholes(200, fields, body))


@pytest.mark.parametrize("length", [b"1", b"3", b"x"])
def test_a_whole_answer_whose_length_is_wrong_goes_through_uvicorn(length: bytes) -> None:
    """A Content-Length that is not the body's is uvicorn's error, said as uvicorn says it."""
    body = b"{}"
    fields = [(b"content-length", length)]

    def outcome(coro: Any) -> Any:
        try:
            return run(coro)[:3]
        except (RuntimeError, ValueError) as e:
            return f"{type(e).__name__}: {e}"

    assert outcome(wholes(200, fields, body)) == outcome(uvicorns(200, fields, body))


@pytest.mark.parametrize(
    ("method", "fields", "write_paused"),
    [
        ("HEAD", [(b"content-length", b"2")], False),
        ("POST", [(b"content-length", b"2"), (b"connection", b"close")], False),
        ("POST", [(b"content-length", b"2"), (b"Transfer-Encoding", b"identity")], False),
        ("POST", [(b"content-length", b"2")], True),  # the client takes nothing now
    ],
)
def test_what_uvicorn_decides_goes_through_uvicorn(
    method: str, fields: list[tuple[bytes, bytes]], write_paused: bool
) -> None:
    body = b"{}"
    expected = run(uvicorns(200, fields, body, method=method))
    got = run(wholes(200, fields, body, method=method, write_paused=write_paused))
    assert got[:3] == expected
    assert got[3].calls[0][0] == "writelines" or method == "HEAD"


def test_a_message_without_a_body_is_uvicorns_send() -> None:
    async def two() -> tuple[bytes, int]:
        cycle, recorder, completed = cycle_of(WholeCycle)
        await cycle.send(
            {"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"2")]}
        )
        await cycle.send({"type": "http.response.body", "body": b"{}"})
        return recorder.sent(), len(completed)

    sent, completions = run(two())
    assert sent == run(uvicorns(200, [(b"content-length", b"2")], b"{}"))[0]
    assert completions == 1


def test_a_body_is_handed_over_only_once_it_has_all_arrived() -> None:
    async def check() -> None:
        cycle, _, _ = cycle_of(WholeCycle)
        assert isinstance(cycle, WholeCycle)
        cycle.body += b'{"records"'
        assert cycle.arrived() == -1  # more to come
        cycle.body += b": []}"
        cycle.more_body = False
        assert cycle.arrived() == len(b'{"records": []}')
        assert cycle.take_body() == b'{"records": []}'
        assert cycle.body == bytearray()
        waiting, _, _ = cycle_of(WholeCycle)
        assert isinstance(waiting, WholeCycle)
        waiting.more_body = False
        waiting.waiting_for_100_continue = True  # the client waits to be asked for it
        assert waiting.arrived() == -1
        gone, _, _ = cycle_of(WholeCycle)
        assert isinstance(gone, WholeCycle)
        gone.more_body = False
        gone.disconnected = True
        assert gone.arrived() == -1

    run(check())


# -- over a broker -----------------------------------------------------------------------------


def _produce_head(port: int, topic: str, length: int) -> bytes:
    return (
        f"POST /v1/topics/{topic}/partitions/0/records HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {length}\r\n\r\n"
    ).encode()


def test_a_body_with_its_head_and_one_sent_later_are_answered_alike(
    shared_broker: BrokerProcess, http: httpx.Client
) -> None:
    topic = create_topic(http, "whole")
    body = orjson.dumps({"records": [{"value": "v"}]})
    head = _produce_head(shared_broker.port, topic, len(body))
    answers = []
    with connect(shared_broker) as s:
        s.sendall(head + body)  # the lean lane: the body is there when the request starts
        answers.append(read_answer(s))
        s.sendall(head)  # the guarded way: the request starts before its body
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        s.sendall(body)
        answers.append(read_answer(s))
    (status_a, headers_a, body_a), (status_b, headers_b, body_b) = answers
    assert status_a == status_b == 200
    for h in (headers_a, headers_b):
        h.pop("date")
    assert headers_a == headers_b
    assert [o["offset"] for o in orjson.loads(body_a)["offsets"]] == [0]
    assert [o["offset"] for o in orjson.loads(body_b)["offsets"]] == [1]


LIMIT = 4096


@pytest.fixture(scope="module")
def limited(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    b = start_broker(
        tmp_path_factory.mktemp("whole") / "data", env={"LOGBUS_MAX_REQUEST_BYTES": str(LIMIT)}
    )
    try:
        yield b
    finally:
        b.stop()


def _body_of(size: int) -> bytes:
    frame = b'{"records": [{"value": ""}]}'
    body = frame[:-4] + b"x" * (size - len(frame)) + frame[-4:]
    assert len(body) == size
    return body


@pytest.mark.parametrize("later", [False, True], ids=["with-head", "after-head"])
def test_the_body_limit_holds_at_the_limit(limited: BrokerProcess, later: bool) -> None:
    with make_client(limited) as http:
        topic = create_topic(http, "wholelimit")
    with connect(limited) as s:
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        for size, status in ((LIMIT, 200), (LIMIT + 1, 413)):
            body = _body_of(size)
            head = _produce_head(limited.port, topic, size)
            if later:
                s.sendall(head)
                s.sendall(body)
            else:
                s.sendall(head + body)
            got, headers, answer = read_answer(s)
            assert got == status, answer
            if status == 413:
                assert orjson.loads(answer)["max_request_bytes"] == LIMIT
            else:
                assert int(headers["content-length"]) == len(answer)


def test_the_brokers_server_takes_the_lean_lane_and_leaves_nothing_to_collect(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Every one-record produce through the broker's server (``request_cost --server``'s
    in-memory connections) has its body handed over, and none of its request cycles outlives
    it: with the collector off, no more cycles are left than connections hold (a cycle that
    its scope referred back to stayed until a collection: memory and collection time grew)."""
    taken: list[int] = []
    original = WholeCycle.take_body

    def counted(self: WholeCycle) -> bytes:
        taken.append(1)
        return original(self)

    monkeypatch.setattr(WholeCycle, "take_body", counted)
    requests, connections = 256, 16
    gc.collect()
    gc.disable()
    try:
        asyncio.run(request_cost.serve_http(requests, connections, "1", False))
        left = sum(1 for o in gc.get_objects() if type(o) is WholeCycle)
    finally:
        gc.enable()
    assert len(taken) == requests + request_cost.WARMUP_PER_CALLER * connections
    # Each run's connections (warm-up and measured) keep their last request's cycle until
    # the collector frees them (a protocol and its transport refer to each other).
    assert left <= 2 * connections


def test_the_fast_paths_whole_answer_builds_its_content_type_once_and_checks_a_bad_one() -> None:
    """The broker's own media types are built fields (checked once, remembered); one that
    fails uvicorn's check stays with the checked fields, where the cycle refuses it."""
    from api import fastpath
    from api.records import Reply

    good = fastpath._whole_start(Reply(200, b"{}", "application/json"))
    assert good[BUILT_FIELDS_KEY] == [(b"content-type", b"application/json")]
    assert good["headers"] == [] and good[WHOLE_BODY_KEY] == b"{}"
    assert fastpath._CONTENT_TYPES["application/json"] == ((b"content-type", b"application/json"),)
    bad = fastpath._whole_start(Reply(503, b"{}", "a\r\nb", headers={"Retry-After": "1"}))
    assert bad[BUILT_FIELDS_KEY] == []
    assert bad["headers"] == [(b"retry-after", b"1"), (b"content-type", b"a\r\nb")]
    with pytest.raises(RuntimeError, match="Invalid HTTP header value"):
        run(wholes(503, bad["headers"], b"{}"))
    sent = run(wholes(200, good["headers"], b"{}", built=good[BUILT_FIELDS_KEY]))[0]
    assert sent.endswith(b"content-type: application/json\r\ncontent-length: 2\r\n\r\n{}")


def test_a_whole_fetch_answer_is_charged_to_its_consume_quota(
    shared_broker: BrokerProcess, http: httpx.Client
) -> None:
    """A fetch answered whole has no Content-Length among its fields (the server writes
    it): the quota gate charges its body's size all the same, which RateLimit's r (what
    is left of the quota) shows going down by about a page from one fetch to the next."""
    topic = create_topic(http, "wholequota")
    records = [{"value": "v" * 1000} for _ in range(20)]
    assert http.post(f"/v1/topics/{topic}/records", json={"records": records}).status_code == 200
    body = {"entity": {"client_id": "whole-c"}, "quotas": {"consumer_byte_rate": 100_000}}
    assert http.put("/v1/quotas", json=body).status_code == 200
    try:
        left = []
        for offset in (0, 5):
            r = http.get(
                f"/v1/topics/{topic}/partitions/0/records",
                params={"offset": offset, "max_records": 5},
                headers={"Logbus-Client-Id": "whole-c"},
            )
            assert r.status_code == 200 and len(r.content) > 5000
            left.append(int(r.headers["ratelimit"].split(";r=")[1].split(";")[0]))
        assert left[0] - left[1] >= 4000, left  # a page of ≈ 5.7 KB, less a few ms' refill
    finally:
        http.delete("/v1/quotas", params={"client_id": "whole-c"})


def test_the_remembered_content_types_stay_within_their_bound(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """At most CONTENT_TYPES_MAX media types are remembered, at the limit and past it."""
    from api import fastpath
    from api.records import Reply

    monkeypatch.setattr(fastpath, "_CONTENT_TYPES", {})
    for i in range(fastpath.CONTENT_TYPES_MAX):
        fastpath._whole_start(Reply(200, b"{}", f"application/x-{i}"))
    assert len(fastpath._CONTENT_TYPES) == fastpath.CONTENT_TYPES_MAX  # at the limit
    fastpath._whole_start(Reply(200, b"{}", "application/one-more"))
    assert 0 < len(fastpath._CONTENT_TYPES) <= fastpath.CONTENT_TYPES_MAX
    assert "application/one-more" in fastpath._CONTENT_TYPES
