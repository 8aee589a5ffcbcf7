"""Browsers and the broker: Host (DNS rebinding), Origin (cross-origin pages), typed bodies
(no-cors POSTs) and CORS for allowed origins — the policy as values, then against a broker."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from websockets.asyncio.client import connect
from websockets.exceptions import InvalidStatus

from api import guard
from api.guard import BrowserPolicy
from tests.api.conftest import make_client, start_broker
from tests.api.helpers import JSON, assert_problem, create_topic, produce, unique
from tests.server import BrokerProcess

EVIL = "http://evil.example"


def test_media_types_are_remembered_within_their_bound() -> None:
    """Every request's Content-Type is reduced to its media type through a cache: a client
    that sends a new value each time keeps it at MEDIA_TYPE_CACHE_MAX entries, and every
    answer is what the value says."""
    for i in range(3 * guard.MEDIA_TYPE_CACHE_MAX + 1):
        raw = f"Application/JSON ; charset=utf-8; n={i}"
        assert guard.media_type(raw) == "application/json"
        assert len(guard._MEDIA_TYPES) <= guard.MEDIA_TYPE_CACHE_MAX
    assert guard.media_type(" text/Plain") == "text/plain"
    assert guard.media_type(None) == guard.media_type("") == ""


# -- the policy, as values ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("host", "ok"),
    [
        ("127.0.0.1:8080", True),
        ("localhost:8080", True),
        ("LocalHost:8080", True),
        ("[::1]:8080", True),
        ("evil.example:8080", False),  # DNS rebinding
        ("127.0.0.1:8081", False),
        ("127.0.0.1", False),  # port 80 implied
        ("", False),
        (None, False),
        ("127.0.0.1:99999", False),
        ("[::1", False),
    ],
)
def test_loopback_bind_accepts_loopback_names_with_the_port(host: str | None, ok: bool) -> None:
    assert BrowserPolicy("127.0.0.1", 8080).host_allowed(host) is ok


def test_allowed_hosts_add_names() -> None:
    p = BrowserPolicy("127.0.0.1", 8080, allowed_hosts=["broker.lan", "proxy.lan:443"])
    assert p.host_allowed("broker.lan:8080")
    assert p.host_allowed("proxy.lan:443")
    assert not p.host_allowed("proxy.lan:8080")
    assert BrowserPolicy("127.0.0.1", 8080, allowed_hosts=["*"]).host_allowed("any:1")


def test_a_specific_bind_accepts_its_own_name_and_a_wildcard_bind_any() -> None:
    p = BrowserPolicy("10.1.2.3", 8080)
    assert p.host_allowed("10.1.2.3:8080") and not p.host_allowed("localhost:8080")
    assert BrowserPolicy("0.0.0.0", 8080).host_allowed("broker:8080")
    assert not BrowserPolicy("0.0.0.0", 8080, allowed_hosts=["a.lan"]).host_allowed("b.lan:8080")


@pytest.mark.parametrize(
    ("origin", "kind"),
    [
        ("http://127.0.0.1:8080", "same"),
        ("http://127.0.0.1:8080/", "same"),
        ("http://localhost:8080", "refused"),  # another origin, even if the same machine
        (EVIL, "refused"),
        ("null", "refused"),  # sandboxed frames, file:// pages
        ("https://app.example", "cors"),
        ("HTTPS://APP.EXAMPLE", "cors"),
    ],
)
def test_origin_kinds(origin: str, kind: str) -> None:
    p = BrowserPolicy("127.0.0.1", 8080, allowed_origins=["https://app.example"])
    assert p.origin_kind(origin, "127.0.0.1:8080") == kind


@pytest.mark.parametrize(
    ("method", "headers", "status"),
    [
        ("POST", {"content-length": "5"}, 415),
        ("POST", {"content-length": "5", "content-type": "text/plain"}, 415),
        ("POST", {"transfer-encoding": "chunked", "content-type": "multipart/form-data"}, 415),
        (
            "PATCH",
            {"content-length": "5", "content-type": "application/x-www-form-urlencoded"},
            415,
        ),
        ("POST", {"content-length": "5", "content-type": "application/json; charset=utf-8"}, 0),
        ("POST", {"content-length": "0"}, 0),  # no body: nothing to misread
        ("GET", {}, 0),
    ],
)
def test_bodies_need_a_type_a_page_cannot_send_unasked(
    method: str, headers: dict[str, str], status: int
) -> None:
    p = BrowserPolicy("127.0.0.1", 8080)
    verdict = p.check("http", method, {"host": "127.0.0.1:8080", **headers})
    assert verdict.status == status


def test_a_preflight_from_an_allowed_origin_is_answered() -> None:
    p = BrowserPolicy("127.0.0.1", 8080, allowed_origins=["https://app.example"])
    headers = {
        "host": "127.0.0.1:8080",
        "origin": "https://app.example",
        "access-control-request-method": "DELETE",
    }
    verdict = p.check("http", "OPTIONS", headers)
    assert verdict.status == 204
    got = dict(verdict.headers)
    assert got[b"access-control-allow-origin"] == b"https://app.example"
    assert b"DELETE" in got[b"access-control-allow-methods"]
    refused = p.check("http", "OPTIONS", {**headers, "origin": EVIL})
    assert refused.status == 403


# -- against a broker --------------------------------------------------------------------------


@pytest.fixture(scope="module")
def cors_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    b = start_broker(
        tmp_path_factory.mktemp("cors") / "data", "--allowed-origin", "https://app.example"
    )
    try:
        yield b
    finally:
        b.stop()


def ws_url(broker: BrokerProcess) -> str:
    return broker.url.replace("http://", "ws://") + "/v1/ws"


def test_cross_origin_websocket_is_refused(shared_broker: BrokerProcess) -> None:
    async def attempt(origin: str | None) -> int:
        kwargs = {} if origin is None else {"origin": origin}
        try:
            async with connect(ws_url(shared_broker), open_timeout=10, **kwargs) as ws:  # type: ignore[arg-type]
                await ws.send('{"op":"ping","id":1}')
                await ws.recv()
                return 101
        except InvalidStatus as e:
            return e.response.status_code

    assert asyncio.run(attempt(EVIL)) == 403
    assert asyncio.run(attempt("null")) == 403
    assert asyncio.run(attempt(shared_broker.url)) == 101  # the broker's own pages
    assert asyncio.run(attempt(None)) == 101  # not a browser


def test_dns_rebinding_cannot_delete_a_topic(
    http: httpx.Client, shared_broker: BrokerProcess
) -> None:
    name = create_topic(http, "rebind")
    rebound = {"host": f"evil.example:{shared_broker.port}"}
    assert_problem(http.delete(f"/v1/topics/{name}", headers=rebound), 400, "INVALID_REQUEST")
    r = http.get(f"/v1/topics/{name}/partitions/0/records", params={"offset": 0}, headers=rebound)
    assert_problem(r, 400, "INVALID_REQUEST")  # the fast path too
    assert http.get(f"/v1/topics/{name}").status_code == 200


def test_cross_origin_requests_are_refused_before_any_work(
    http: httpx.Client, shared_broker: BrokerProcess
) -> None:
    name = create_topic(http, "xorigin")
    evil = {"origin": EVIL}
    body = b'{"records":[{"value":1}]}'
    r = http.post(
        f"/v1/topics/{name}/records", content=body, headers={**evil, "content-type": JSON}
    )
    assert_problem(r, 403, "ORIGIN_NOT_ALLOWED")
    r = http.get(
        f"/v1/topics/{name}/partitions/0/records",
        params={"offset": 0},
        headers={**evil, "accept": "text/event-stream"},
    )
    assert_problem(r, 403, "ORIGIN_NOT_ALLOWED")  # an EventSource
    assert_problem(http.delete(f"/v1/topics/{name}", headers=evil), 403, "ORIGIN_NOT_ALLOWED")
    assert "access-control-allow-origin" not in r.headers
    same = {"origin": shared_broker.url}
    r = http.post(
        f"/v1/topics/{name}/records", content=body, headers={**same, "content-type": JSON}
    )
    assert r.status_code == 200, r.text
    assert http.get(f"/v1/topics/{name}/partitions").json()[0]["log_end_offset"] == 1


@pytest.mark.parametrize("ctype", [None, "text/plain", "application/x-www-form-urlencoded"])
def test_no_cors_bodies_are_415_on_admin_routes(http: httpx.Client, ctype: str | None) -> None:
    name = unique("nocors")
    headers = {} if ctype is None else {"content-type": ctype}
    r = http.post("/v1/topics", content=b'{"name": "%s"}' % name.encode(), headers=headers)
    assert_problem(r, 415, "UNSUPPORTED_MEDIA_TYPE")
    assert http.get(f"/v1/topics/{name}").status_code == 404


def test_cors_for_an_allowed_origin(cors_broker: BrokerProcess) -> None:
    app = "https://app.example"
    with make_client(cors_broker) as c:
        name = create_topic(c, "cors")
        produce(c, name, [{"value": 1}])
        pre = c.options(
            f"/v1/topics/{name}/records",
            headers={
                "origin": app,
                "access-control-request-method": "POST",
                "access-control-request-headers": "content-type",
            },
        )
        assert pre.status_code == 204, pre.text
        assert pre.headers["access-control-allow-origin"] == app
        assert "POST" in pre.headers["access-control-allow-methods"]
        assert "content-type" in pre.headers["access-control-allow-headers"].lower()
        r = c.get(
            f"/v1/topics/{name}/partitions/0/records", params={"offset": 0}, headers={"origin": app}
        )
        assert r.status_code == 200
        assert r.headers["access-control-allow-origin"] == app
        assert "Logbus-Next-Offset" in r.headers["access-control-expose-headers"]
        r = c.get(f"/v1/topics/{name}", headers={"origin": app})  # FastAPI routes too
        assert r.headers["access-control-allow-origin"] == app
        r = c.get(f"/v1/topics/{name}", headers={"origin": EVIL})
        assert_problem(r, 403, "ORIGIN_NOT_ALLOWED")


def test_settings_come_from_the_environment(tmp_path: Path) -> None:
    b = start_broker(
        tmp_path / "data",
        env={"LOGBUS_ALLOWED_HOSTS": "broker.lan", "LOGBUS_ALLOWED_ORIGINS": "https://a.example"},
    )
    try:
        with make_client(b) as c:
            r = c.get("/v1/topics", headers={"host": f"broker.lan:{b.port}"})
            assert r.status_code == 200, r.text
            r = c.get("/v1/topics", headers={"origin": "https://a.example"})
            assert r.headers["access-control-allow-origin"] == "https://a.example"
    finally:
        b.stop()
