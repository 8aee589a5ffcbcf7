"""The access log (off by default, on, or sampled) and the line a broker prints when it stops."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

import httpx
import pytest
from starlette.types import Message, Receive, Scope, Send

from api.access_log import AccessLog, parse_rate
from tests.api.conftest import start_broker


async def _answer(scope: Scope, receive: Receive, send: Send) -> None:
    await send({"type": "http.response.start", "status": 204, "headers": []})
    await send({"type": "http.response.body", "body": b""})


def _run(middleware: AccessLog, path: str, query: bytes) -> None:
    scope = {"type": "http", "method": "GET", "path": path, "query_string": query}

    async def receive() -> Message:
        return {"type": "http.request", "body": b""}

    async def send(message: Message) -> None:
        pass

    asyncio.run(middleware(scope, receive, send))


def test_a_line_per_request_without_the_query_string(caplog: pytest.LogCaptureFixture) -> None:
    ticks = iter([10.0, 10.0125])
    logger = logging.getLogger("test.access")
    middleware = AccessLog(_answer, 1.0, clock=lambda: next(ticks), logger=logger)
    with caplog.at_level(logging.INFO, logger="test.access"):
        _run(middleware, "/v1/topics/t/partitions/0/records", b"offset=0&access_token=s3cret")
    assert [r.getMessage() for r in caplog.records] == [
        "GET /v1/topics/t/partitions/0/records 204 12.5ms"
    ]


def test_sampling_logs_the_requests_below_the_rate(caplog: pytest.LogCaptureFixture) -> None:
    draws = iter([0.3, 0.7, 0.29, 0.31])
    logger = logging.getLogger("test.sampled")
    middleware = AccessLog(_answer, 0.3, sample=lambda: next(draws), logger=logger)
    with caplog.at_level(logging.INFO, logger="test.sampled"):
        for i in range(4):
            _run(middleware, f"/r{i}", b"")
    assert [r.getMessage().split()[1] for r in caplog.records] == ["/r2"]


@pytest.mark.parametrize(
    ("raw", "rate"), [("off", 0.0), ("on", 1.0), ("0.01", 0.01), ("ON", 1.0), ("1", 1.0)]
)
def test_access_log_setting(raw: str, rate: float) -> None:
    assert parse_rate(raw) == rate


@pytest.mark.parametrize("raw", ["sometimes", "1.5", "-0.1", ""])
def test_access_log_setting_rejects(raw: str) -> None:
    with pytest.raises(ValueError):
        parse_rate(raw)


def test_broker_access_log_on_and_off_and_the_stop_line(tmp_path: Path) -> None:
    for name in ("on", "off"):
        (tmp_path / name).mkdir()
    logged = start_broker(tmp_path / "on" / "data", env={"LOGBUS_ACCESS_LOG": "on"})
    quiet = start_broker(tmp_path / "off" / "data")
    try:
        for broker in (logged, quiet):
            with httpx.Client(base_url=broker.url, timeout=30) as c:
                assert c.get("/v1/topics", params={"access_token": "s3cret"}).status_code == 200
                assert c.get("/v1/topics/no-such-topic").status_code == 404
    finally:
        logged.stop()
        quiet.stop()
    on, off = logged.log(), quiet.log()
    assert "GET /v1/topics 200 " in on and "GET /v1/topics/no-such-topic 404 " in on, on
    assert "s3cret" not in on and "access_token" not in on
    assert "GET /v1/topics" not in off, off
    for text in (on, off):
        assert text.rstrip().endswith("Logbus stopped: signal SIGTERM"), text
