"""Connections, bodies and answers under limits (api/connections.py, api/budgets.py).

Each test drives a real broker over raw sockets with its limits set small, so a timeout or a
budget is reached in well under a second; every wait has a generous deadline.
"""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import orjson
import pytest

from tests.api.conftest import make_client, start_broker
from tests.api.helpers import BATCH, PROBLEM, create_topic
from tests.api.rawclient import DEADLINE_S, closed_by_peer, connect, read_answer, ws_open, ws_send
from tests.server import BrokerProcess

MIB = 1024 * 1024

SMALL_LIMITS = {
    "LOGBUS_HEADER_TIMEOUT_MS": "400",
    "LOGBUS_KEEP_ALIVE_TIMEOUT_MS": "400",
    "LOGBUS_BODY_TIMEOUT_MS": "400",
    "LOGBUS_SEND_TIMEOUT_MS": "1000",
    "LOGBUS_MAX_REQUEST_BYTES": str(1 * MIB),
    "LOGBUS_MAX_INFLIGHT_BODY_BYTES": str(1 * MIB),
    "LOGBUS_MAX_FETCH_BYTES": str(16 * MIB),
    "LOGBUS_MAX_INFLIGHT_RESPONSE_BYTES": str(16 * MIB),
}


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    b = start_broker(tmp_path_factory.mktemp("limits") / "data", env=SMALL_LIMITS)
    try:
        yield b
    finally:
        b.stop()


@pytest.fixture(scope="module")
def http(broker: BrokerProcess) -> Iterator[httpx.Client]:
    with make_client(broker) as c:
        yield c


# -- connections -------------------------------------------------------------------------------


def test_a_connection_that_sends_nothing_is_closed(broker: BrokerProcess) -> None:
    with connect(broker) as s:
        assert closed_by_peer(s)


def test_half_a_request_head_is_closed(broker: BrokerProcess) -> None:
    with connect(broker) as s:
        s.sendall(f"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1:{broker.port}\r\n".encode())
        assert closed_by_peer(s)


def test_a_second_head_half_sent_on_a_keep_alive_connection_is_closed(
    broker: BrokerProcess,
) -> None:
    """The head timeout's timer outlives a request (it is moved, not re-created): the next
    request's head is timed from its own first byte all the same."""
    with connect(broker) as s:
        for _ in range(3):
            s.sendall(f"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1:{broker.port}\r\n\r\n".encode())
            status, _, _ = read_answer(s)
            assert status == 200
        s.sendall(f"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1:{broker.port}\r\n".encode())
        assert closed_by_peer(s)


def test_a_head_trickled_byte_by_byte_is_closed(broker: BrokerProcess) -> None:
    """The head timeout runs from the first byte, not from the last one."""
    head = (
        f"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1:{broker.port}\r\nX-Pad: ".encode() + b"a" * 200
    )
    started = time.monotonic()
    with connect(broker) as s:
        try:
            for i in range(len(head)):
                s.sendall(head[i : i + 1])
                time.sleep(0.05)  # 200 bytes take 10 s; the head timeout is 0.4 s
        except (BrokenPipeError, ConnectionResetError):
            pass
        assert closed_by_peer(s)
    assert time.monotonic() - started < 9, "closed only once the client stopped sending"


def test_an_idle_keep_alive_connection_still_answers_then_is_closed(
    broker: BrokerProcess,
) -> None:
    with connect(broker) as s:
        for _ in range(2):
            s.sendall(f"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1:{broker.port}\r\n\r\n".encode())
            status, _, _ = read_answer(s)
            assert status == 200
        assert closed_by_peer(s)  # keep_alive_timeout_ms


def test_a_busy_keep_alive_connection_outlives_its_first_idle_deadline(
    broker: BrokerProcess,
) -> None:
    """The keep-alive timeout's one timer is moved by each answer, not re-created: requests
    every 50 ms for three timeouts (400 ms) keep the connection open, and it closes once idle.
    A try in which the client itself was idle 300 ms or more before a request (a stalled
    machine) tells nothing and is given up before that request, then tried again."""
    for _ in range(5):
        with connect(broker) as s:
            last = started = time.monotonic()
            stalled = False
            while time.monotonic() - started < 1.2:
                if time.monotonic() - last >= 0.3:
                    stalled = True
                    break
                s.sendall(
                    f"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1:{broker.port}\r\n\r\n".encode()
                )
                status, _, _ = read_answer(s)
                assert status == 200
                last = time.monotonic()
                time.sleep(0.05)
            if stalled:
                continue
            assert closed_by_peer(s)
            return
    pytest.fail("the client stalled for 300 ms or more in every try")


def test_idle_connections_at_the_cap_give_way_to_new_clients(tmp_path: Path) -> None:
    """At max_connections a new client is served and the oldest idle connection closes;
    nobody gets 503 (uvicorn's limit_concurrency answered 503 to everyone)."""
    b = start_broker(tmp_path / "data", env={"LOGBUS_MAX_CONNECTIONS": "20"})
    idle: list[socket.socket] = []
    try:
        for _ in range(30):
            idle.append(connect(b))
        with make_client(b) as c:
            for _ in range(5):
                assert c.get("/healthz").status_code == 200
            r = c.post("/v1/topics", json={"name": "capped", "partitions": 1})
            assert r.status_code == 201, r.text
            r = c.post("/v1/topics/capped/records", json={"records": [{"value": 1}]})
            assert r.status_code == 200, r.text
            metrics = c.get("/metrics").text
        assert closed_by_peer(idle[0])  # the oldest idle one gave way
        assert _metric(metrics, "logbus_connections_evicted_total") >= 10
        assert _metric(metrics, "logbus_open_connections") <= 21
    finally:
        for s in idle:
            s.close()
        b.stop()


def _metric(text: str, name: str) -> float:
    for line in text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    raise AssertionError(f"{name} not in /metrics")


# -- request bodies ----------------------------------------------------------------------------


def test_a_body_that_stops_arriving_gets_408(broker: BrokerProcess, http: httpx.Client) -> None:
    topic = create_topic(http, "slow-body")
    with connect(broker) as s:
        s.sendall(
            f"POST /v1/topics/{topic}/records HTTP/1.1\r\nHost: 127.0.0.1:{broker.port}\r\n"
            "Content-Type: application/json\r\nContent-Length: 1000\r\n\r\n".encode()
            + b'{"records": ['
        )
        status, headers, body = read_answer(s)
        assert status == 408
        assert headers["content-type"] == PROBLEM
        assert orjson.loads(body)["code"] == "REQUEST_TIMEOUT"
        assert closed_by_peer(s)
    assert http.get(f"/v1/topics/{topic}/partitions/0/records?offset=0").json()["records"] == []


def test_an_admin_body_that_stops_arriving_gets_408_quietly(broker: BrokerProcess) -> None:
    """FastAPI routes too; the app's complaint about the vanished body is not logged as an
    error."""
    with connect(broker) as s:
        s.sendall(
            f"POST /v1/topics HTTP/1.1\r\nHost: 127.0.0.1:{broker.port}\r\n".encode()
            + b"Content-Type: application/json\r\n"
            b'Content-Length: 100\r\n\r\n{"name": '
        )
        status, _, body = read_answer(s)
        assert status == 408
        assert orjson.loads(body)["code"] == "REQUEST_TIMEOUT"
        assert closed_by_peer(s)
    assert "Exception in ASGI application" not in broker.log()


def test_the_body_budget_is_shared_by_all_requests(tmp_path: Path) -> None:
    """An upload that has sent nearly the whole body budget (1 MiB) and stalls: the next
    produce gets 503 + Retry-After; once the stalled one goes, produce works again."""
    env = {**SMALL_LIMITS, "LOGBUS_BODY_TIMEOUT_MS": "60000"}
    b = start_broker(tmp_path / "data", env=env)
    try:
        with make_client(b) as http:
            topic = create_topic(http, "budget")
            sent = MIB - 10
            with connect(b) as s:
                s.sendall(
                    f"POST /v1/topics/{topic}/records HTTP/1.1\r\nHost: 127.0.0.1:{b.port}\r\n"
                    f"Content-Type: application/json\r\nContent-Length: {MIB}\r\n\r\n".encode()
                    + b" " * sent
                )
                _wait_for_metric(http, "logbus_inflight_body_bytes", sent)
                r = http.post(f"/v1/topics/{topic}/records", json={"records": [{"value": 1}]})
                assert r.status_code == 503, r.text
                assert r.headers["content-type"] == PROBLEM
                assert r.headers["retry-after"] == "1"
                assert r.json()["code"] == "BROKER_BUSY" and r.json()["retriable"] is True
            _wait_for_metric(http, "logbus_inflight_body_bytes", 0)
            r = http.post(f"/v1/topics/{topic}/records", json={"records": [{"value": 1}]})
            assert r.status_code == 200, r.text
    finally:
        b.stop()


def test_an_admin_body_over_max_request_bytes_gets_413(http: httpx.Client) -> None:
    """FastAPI routes read their whole body: the cap applies to them too."""
    r = http.post(
        "/v1/topics",
        content=b" " * (MIB + 1),
        headers={"content-type": "application/json"},
    )
    assert r.status_code == 413, r.text
    assert r.json()["code"] == "PAYLOAD_TOO_LARGE"


def _wait_for_metric(http: httpx.Client, name: str, value: float) -> None:
    deadline = time.monotonic() + DEADLINE_S
    while (got := _metric(http.get("/metrics").text, name)) != value:
        assert time.monotonic() < deadline, f"{name} = {got}, waited for {value}"
        time.sleep(0.05)


# -- answers to clients that do not read -------------------------------------------------------


def test_clients_that_never_read_pin_a_bounded_amount(
    broker: BrokerProcess, http: httpx.Client
) -> None:
    """A 12 MiB fetch that its client never reads holds most of the answer budget (16 MiB;
    the kernel's socket buffers take at most 4 MiB of it): a second one gets 503 + Retry-After
    instead of pinning 12 MiB more; once ``send_timeout_ms`` passes the stalled connection is
    aborted and the budget is free again."""
    topic = create_topic(http, "unread")
    value = "x" * (256 * 1024)
    for _ in range(16):
        records = [{"value": value}] * 3
        r = http.post(f"/v1/topics/{topic}/records", json={"records": records})
        assert r.status_code == 200, r.text
    path = f"/v1/topics/{topic}/partitions/0/records?offset=0&max_bytes={12 * MIB}"
    with connect(broker, rcvbuf=4096) as stuck:
        stuck.sendall(
            f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1:{broker.port}\r\n"
            f"Accept: {BATCH}\r\n\r\n".encode()
        )
        _wait_for_metric_above(http, "logbus_inflight_response_bytes", 8 * MIB)
        r = http.get(path, headers={"accept": BATCH})
        assert r.status_code == 503
        assert r.headers["retry-after"] == "1"
        assert r.json()["code"] == "BROKER_BUSY"
        _wait_for_metric(http, "logbus_inflight_response_bytes", 0)
        assert closed_by_peer(stuck)
    r = http.get(path, headers={"accept": BATCH})
    assert r.status_code == 200 and len(r.content) > 8 * MIB


def _wait_for_metric_above(http: httpx.Client, name: str, value: float) -> None:
    deadline = time.monotonic() + DEADLINE_S
    while (got := _metric(http.get("/metrics").text, name)) <= value:
        assert time.monotonic() < deadline, f"{name} = {got}, waited for > {value}"
        time.sleep(0.05)


def test_a_websocket_consumer_that_never_reads_holds_one_read_then_is_closed(
    broker: BrokerProcess, http: httpx.Client
) -> None:
    """Pushes to a consumer that never reads its socket: the broker holds at most one read
    for it (max_queued_stream_bytes counts it), and aborts it after send_timeout_ms, which
    frees that read; the WebSocket ping timeout alone could not (close waits for a drain)."""
    topic = create_topic(http, "ws-unread")
    value = "x" * (256 * 1024)
    for _ in range(16):
        r = http.post(f"/v1/topics/{topic}/records", json={"records": [{"value": value}] * 3})
        assert r.status_code == 200, r.text
    with ws_open(broker, rcvbuf=4096) as s:
        partitions = [{"topic": topic, "partition": 0, "offset": 0}]
        ws_send(s, {"op": "subscribe", "partitions": partitions, "format": "binary"})
        ws_send(s, {"op": "credit", "records": 1_000_000})
        _wait_for_metric_above(http, "logbus_queued_stream_bytes", 0)
        assert _metric(http.get("/metrics").text, "logbus_queued_stream_bytes") <= MIB
        # not read meanwhile: reading would let the broker go on
        _wait_for_metric(http, "logbus_queued_stream_bytes", 0)
        assert closed_by_peer(s)


def test_an_sse_reader_that_never_reads_is_closed(
    broker: BrokerProcess, http: httpx.Client
) -> None:
    topic = create_topic(http, "sse-unread")
    value = "x" * (256 * 1024)
    for _ in range(16):
        r = http.post(f"/v1/topics/{topic}/records", json={"records": [{"value": value}] * 3})
        assert r.status_code == 200, r.text
    with connect(broker, rcvbuf=4096) as s:
        s.sendall(
            f"GET /v1/topics/{topic}/partitions/0/records?offset=0 HTTP/1.1\r\n"
            f"Host: 127.0.0.1:{broker.port}\r\nAccept: text/event-stream\r\n\r\n".encode()
        )
        _wait_for_metric_above(http, "logbus_queued_stream_bytes", 0)
        _wait_for_metric(http, "logbus_queued_stream_bytes", 0)  # not read meanwhile
        assert closed_by_peer(s)


def test_the_limits_are_published(http: httpx.Client) -> None:
    limits = http.get("/v1/cluster").json()["limits"]
    assert limits["header_timeout_ms"] == 400
    assert limits["send_timeout_ms"] == 1000
    assert limits["max_inflight_body_bytes"] == MIB == limits["max_request_bytes"]
    assert limits["max_inflight_response_bytes"] == 16 * MIB
    assert limits["max_queued_stream_bytes"] == 128 * MIB
    assert 0 < limits["max_connections"] <= 10_000
    metrics = http.get("/metrics").text
    assert _metric(metrics, "logbus_open_connections") >= 1
    for name in ("logbus_inflight_body_bytes", "logbus_connections_refused_total"):
        assert _metric(metrics, name) >= 0
