"""Floods against a real broker: its memory stays bounded and other clients keep being served.

Each test starts its own broker, opens one flood of raw sockets that misbehave (and never read
what the broker sends), then measures from another client the latency of ``GET /healthz`` and
of a one-record produce, and samples the broker's RSS (``VmRSS``). The default sizes are small
enough for the suite; ``-m slow`` runs the sizes of the issue (10,100 idle sockets, 20 clients
that never read a 64 MiB fetch, ...).

The assertions are generous (a shared 2-core machine is 2-5x noisy): p99 under
``P99_BOUND_S`` catches a lockout or a multi-second stall, not a slow millisecond. Each test
prints its figures (``pytest tests/api/test_floods.py -s -m "slow or not slow"``); those
measured when this was written are in docs/operations.md ("Memory and time bounds").
"""

from __future__ import annotations

import resource
import socket
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from tests.api.conftest import make_client, start_broker
from tests.api.helpers import BATCH, create_topic
from tests.api.rawclient import connect, ws_open, ws_send
from tests.server import BrokerProcess

MIB = 1024 * 1024
P99_BOUND_S = 2.0  # a lockout answers never (or 503), a stalled loop takes seconds
PROBES = 100  # /healthz and produce requests measured per flood
ABSORB_DEADLINE_S = 60.0
RSS_BASE_BOUND_BYTES = 300 * MIB  # an idle broker is ~80 MiB; floods may add what they hold


@pytest.fixture(autouse=True)
def open_files() -> None:
    """Floods need more descriptors than a default soft limit of 1,024."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


@pytest.fixture
def broker(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[BrokerProcess]:
    env: dict[str, str] = getattr(request, "param", {})
    b = start_broker(tmp_path / "data", env=env)
    try:
        yield b
    finally:
        b.stop()


@dataclass
class Figures:
    healthz_p99_s: float
    produce_p99_s: float
    rss_max_bytes: int

    def report(self, flood: str) -> None:
        print(
            f"\nFLOOD {flood}: /healthz p99 {self.healthz_p99_s * 1000:.1f} ms, "
            f"produce p99 {self.produce_p99_s * 1000:.1f} ms, "
            f"broker RSS max {self.rss_max_bytes / MIB:.0f} MiB"
        )


def rss_bytes(broker: BrokerProcess) -> int:
    assert broker.proc is not None
    for line in Path(f"/proc/{broker.proc.pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


def p99(samples: list[float]) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))]


def absorbed(c: httpx.Client, connections: int) -> None:
    """Wait until the broker has accepted the flood's connections (the steady state)."""
    deadline = time.monotonic() + ABSORB_DEADLINE_S
    while time.monotonic() < deadline:
        for line in c.get("/metrics").text.splitlines():
            if line.startswith("logbus_open_connections ") and float(line.split()[1]) > connections:
                return
        time.sleep(0.1)
    raise AssertionError(f"the broker did not accept {connections} connections")


def metric(name: str, c: httpx.Client, at_least: float) -> None:
    """Wait until the gauge ``name`` reaches ``at_least``."""
    deadline = time.monotonic() + ABSORB_DEADLINE_S
    while time.monotonic() < deadline:
        for line in c.get("/metrics").text.splitlines():
            if line.startswith(name + " ") and float(line.split()[1]) >= at_least:
                return
        time.sleep(0.1)
    raise AssertionError(f"{name} never reached {at_least}")


def probe(broker: BrokerProcess, topic: str, flood_connections: int, rss_seen: int = 0) -> Figures:
    """Once the flood is in place, time /healthz and a produce from another client,
    ``PROBES`` times each."""
    healthz: list[float] = []
    produce: list[float] = []
    rss = max(rss_seen, rss_bytes(broker))
    with make_client(broker) as c:
        absorbed(c, flood_connections)
        for i in range(PROBES):
            t = time.perf_counter()
            r = c.get("/healthz")
            healthz.append(time.perf_counter() - t)
            assert r.status_code == 200, r.text
            t = time.perf_counter()
            r = c.post(f"/v1/topics/{topic}/records", json={"records": [{"value": i}]})
            produce.append(time.perf_counter() - t)
            assert r.status_code == 200, r.text
            if i % 10 == 0:
                rss = max(rss, rss_bytes(broker))
    return Figures(p99(healthz), p99(produce), max(rss, rss_bytes(broker)))


def check(figures: Figures, flood: str, rss_bound_bytes: int = RSS_BASE_BOUND_BYTES) -> None:
    figures.report(flood)
    assert figures.healthz_p99_s < P99_BOUND_S, figures
    assert figures.produce_p99_s < P99_BOUND_S, figures
    assert figures.rss_max_bytes < rss_bound_bytes, figures


def close_all(sockets: list[socket.socket]) -> None:
    for s in sockets:
        s.close()


# -- idle connections --------------------------------------------------------------------------


@pytest.mark.parametrize("count", [2_000, pytest.param(10_100, marks=pytest.mark.slow)])
def test_idle_connections(broker: BrokerProcess, count: int) -> None:
    """Half send nothing, half half a request head (10,100 used to make everyone get 503)."""
    with make_client(broker) as c:
        topic = create_topic(c, "idle")
    socks: list[socket.socket] = []
    try:
        for i in range(count):
            s = connect(broker)
            if i % 2:
                s.sendall(f"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1:{broker.port}\r\n".encode())
            socks.append(s)
        check(
            probe(broker, topic, min(count, 9_000)),
            f"{count} idle connections",
            RSS_BASE_BOUND_BYTES,
        )
    finally:
        close_all(socks)


# -- long-polls --------------------------------------------------------------------------------


@pytest.mark.parametrize("count", [500, pytest.param(5_000, marks=pytest.mark.slow)])
def test_long_polls(broker: BrokerProcess, count: int) -> None:
    with make_client(broker) as c:
        topic = create_topic(c, "probe")
        waited = create_topic(c, "waited")
    request = (
        f"GET /v1/topics/{waited}/partitions/0/records?offset=0&wait_ms=60000 HTTP/1.1\r\n"
        f"Host: 127.0.0.1:{broker.port}\r\n\r\n"
    ).encode()
    socks: list[socket.socket] = []
    try:
        for _ in range(count):
            s = connect(broker)
            s.sendall(request)
            socks.append(s)
        check(probe(broker, topic, count), f"{count} long-polls")
    finally:
        close_all(socks)


# -- WebSockets that never grant credit --------------------------------------------------------


@pytest.mark.parametrize("count", [200, pytest.param(2_000, marks=pytest.mark.slow)])
def test_websockets_without_credit(broker: BrokerProcess, count: int) -> None:
    with make_client(broker) as c:
        topic = create_topic(c, "probe")
        pushed = create_topic(c, "pushed")
        for _ in range(10):
            c.post(f"/v1/topics/{pushed}/records", json={"records": [{"value": "x" * 1000}]})
    socks: list[socket.socket] = []
    try:
        for _ in range(count):
            s = ws_open(broker)
            ws_send(s, {"op": "subscribe", "partitions": [{"topic": pushed, "offset": 0}]})
            socks.append(s)
        check(probe(broker, topic, count), f"{count} WebSockets without credit")
    finally:
        close_all(socks)


# -- consumers that never read their socket ----------------------------------------------------


def fill(c: httpx.Client, topic: str, size_bytes: int) -> None:
    value = "x" * (256 * 1024)
    for _ in range(size_bytes // (3 * 256 * 1024)):
        r = c.post(f"/v1/topics/{topic}/records", json={"records": [{"value": value}] * 3})
        assert r.status_code == 200, r.text


@pytest.mark.parametrize(
    ("clients", "fetch_bytes"),
    [(20, 16 * MIB), pytest.param(20, 64 * MIB, marks=pytest.mark.slow)],
)
def test_consumers_that_never_read(broker: BrokerProcess, clients: int, fetch_bytes: int) -> None:
    """20 binary fetches of up to 64 MiB and one WebSocket with unbounded credit, none ever
    read (20 x 64 MiB used to take the broker to 1.4 GB). Answers in flight are capped by
    max_inflight_response_bytes (256 MiB); the rest get 503 at once. Probed once the reads
    are done: while 256 MiB are read, a produce waits behind them for the default executor
    (up to 1.8 s measured; the dedicated executors of issue 10 are to fix that)."""
    with make_client(broker) as c:
        topic = create_topic(c, "probe")
        big = create_topic(c, "big")
        fill(c, big, fetch_bytes)
    path = f"/v1/topics/{big}/partitions/0/records?offset=0&max_bytes={fetch_bytes}"
    socks: list[socket.socket] = []
    try:
        rss = 0
        for _ in range(clients):
            s = connect(broker, rcvbuf=4096)
            s.sendall(
                f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1:{broker.port}\r\n"
                f"Accept: {BATCH}\r\n\r\n".encode()
            )
            socks.append(s)
            rss = max(rss, rss_bytes(broker))
        ws = ws_open(broker, rcvbuf=4096)
        socks.append(ws)
        ws_send(ws, {"op": "subscribe", "partitions": [{"topic": big, "offset": 0}]})
        ws_send(ws, {"op": "credit", "records": 1_000_000})
        with make_client(broker) as c:  # the reads are done: the answers wait on the clients
            metric("logbus_inflight_response_bytes", c, at_least=256 * MIB - fetch_bytes)
        bound = RSS_BASE_BOUND_BYTES + 256 * MIB + 2 * fetch_bytes
        flood = f"{clients} unread {fetch_bytes // MIB} MiB fetches"
        check(probe(broker, topic, clients, rss), flood, bound)
    finally:
        close_all(socks)


# -- slow uploads ------------------------------------------------------------------------------


@pytest.mark.parametrize("count", [200, pytest.param(2_000, marks=pytest.mark.slow)])
def test_slow_uploads(broker: BrokerProcess, count: int) -> None:
    """Uploads that declare 8 MiB, send 64 KiB and stall: they hold what they sent, not what
    they declared, so a produce from another client is still served."""
    with make_client(broker) as c:
        topic = create_topic(c, "probe")
    head = (
        f"POST /v1/topics/{topic}/records HTTP/1.1\r\nHost: 127.0.0.1:{broker.port}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {8 * MIB}\r\n\r\n"
    ).encode()
    socks: list[socket.socket] = []
    try:
        for _ in range(count):
            s = connect(broker)
            s.sendall(head + b" " * (64 * 1024))
            socks.append(s)
        check(probe(broker, topic, count), f"{count} slow uploads")
    finally:
        close_all(socks)
