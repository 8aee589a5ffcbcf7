"""Authentication and authorization of every route (api.access, api.security), in-process.

The matrix is generated from :data:`api.access.TABLE`: for every declared route, no
credential → 401, a bad credential → 401, a principal without the ACL → 403 (404 where Kafka
hides a topic the principal may not describe), the same principal given exactly the ACL the
table names → not refused. A route of the app missing from the table, or a table entry with
no sample request below, fails :func:`test_every_route_is_declared`.
"""

from __future__ import annotations

import base64
import concurrent.futures
import contextlib
import itertools
import logging
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from argon2 import PasswordHasher
from fastapi.routing import APIRoute, APIWebSocketRoute
from starlette.routing import BaseRoute, Mount, Route
from starlette.websockets import WebSocketDisconnect

from api import access
from api.access import TABLE, Kind
from api.access_log import AccessLog
from api.app import create_app, create_fastapi
from api.settings import Settings
from auth_quotas.acl import ResourceType
from auth_quotas.credentials import KEY_FAILURES_MAX, generate_api_key

with warnings.catch_warnings():  # starlette asks for httpx2; the httpx it still supports is here
    warnings.simplefilter("ignore")
    from starlette.testclient import TestClient

BASE = "http://127.0.0.1:8080"
WS = "ws://127.0.0.1:8080/v1/ws"  # absolute: TestClient joins relative ones to testserver
TOPIC = "t"
_n = itertools.count()


def _fast_hasher() -> PasswordHasher:
    return PasswordHasher(time_cost=1, memory_cost=8, parallelism=1)


def _bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


class Broker:
    """An in-process broker with auth on, an admin and a user ``alice`` without ACLs."""

    def __init__(self, client: TestClient, admin_key: str) -> None:
        self.c = client
        self.admin = _bearer(admin_key)
        r = client.post("/v1/users", json={"name": "alice"}, headers=self.admin)
        assert r.status_code == 201, r.text
        self.alice_key = r.json()["key"]
        self.alice = _bearer(self.alice_key)
        r = client.post("/v1/users", json={"name": "bob"}, headers=self.admin)
        assert r.status_code == 201, r.text
        for name in (TOPIC, "del"):
            r = client.post("/v1/topics", json={"name": name}, headers=self.admin)
            assert r.status_code == 201, r.text

    def grant(self, *acls: tuple[str, str, str]) -> None:
        body = [
            {"principal": "User:alice", "resource_type": t, "name": n, "operation": op}
            for op, t, n in acls
        ]
        if body:
            r = self.c.post("/v1/acls", json=body, headers=self.admin)
            assert r.status_code == 201, r.text

    def revoke_all(self) -> None:
        r = self.c.request("DELETE", "/v1/acls?principal=User:alice", headers=self.admin)
        assert r.status_code == 200, r.text


def _state(b: Broker) -> Any:
    """The in-process broker's AppState (its Security, for tests that look inside)."""
    app: Any = b.c.app
    return app.app.state.logbus


def _app(data_dir: Path, **settings: Any) -> Any:
    fast = create_app(Settings(data_dir=data_dir, loop_lag_interval_ms=0, **settings))
    app: Any = fast.app
    app.state.hasher_factory = _fast_hasher
    return fast


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Broker]:
    key = generate_api_key().token
    # A throttled request waits at most 0.3 s here (the quota tests' requests), not a span.
    fast = _app(
        tmp_path_factory.mktemp("auth") / "data",
        auth=True,
        bootstrap_key=key,
        quota_max_throttle_ms=300,
    )
    with TestClient(fast, base_url=BASE) as client:
        yield Broker(client, key)


# -- what each declared route is asked in the matrix ---------------------------------------------
# (path parameters, query, JSON body, extra ACLs the success needs besides the table's own)

Sample = tuple[dict[str, str], str, Any, list[tuple[str, str, str]]]
OFFSET0 = {"offsets": [{"topic": TOPIC, "partition": 0, "offset": 0}]}
RECORDS = {"records": [{"value": 1}]}
QUOTA = {"producer_byte_rate": 1048576}


TX = "/v1/transactions/{transactional_id}"
SESSION = {"producer_id": 0, "producer_epoch": 0}


def _samples() -> dict[tuple[str, str], Sample]:
    n = next(_n)
    acl = {"principal": f"User:x{n}", "resource_type": "topic", "name": "a", "operation": "read"}
    return {
        ("POST", "/v1/topics"): ({}, "", {"name": f"new{n}"}, [("create", "topic", f"new{n}")]),
        ("GET", "/v1/topics"): ({}, "", None, []),
        ("GET", access.T): ({}, "", None, []),
        ("DELETE", access.T): ({"topic": "del"}, "", None, []),
        ("GET", access.T + "/configs"): ({}, "", None, []),
        ("PATCH", access.T + "/configs"): ({}, "", {"configs": {"retention.ms": 3600000}}, []),
        ("POST", access.T + "/partitions"): ({}, "", {"count": 1 + n}, []),
        ("GET", access.T + "/partitions"): ({}, "", None, []),
        ("PUT", access.T + "/partitions/{partition}/replicas"): ({}, "", {"replicas": [1]}, []),
        ("DELETE", access.T + "/partitions/{partition}/replicas"): ({}, "", None, []),
        ("GET", access.T + "/partitions/{partition}/offsets"): ({}, "at=latest", None, []),
        ("POST", access.T + "/records"): ({}, "", RECORDS, []),
        ("POST", access.T + "/partitions/{partition}/records"): ({}, "", RECORDS, []),
        ("GET", access.T + "/partitions/{partition}/records"): ({}, "offset=0", None, []),
        ("POST", "/v1/producers"): ({}, "", {}, []),
        ("POST", access.G + "/members"): ({}, "", {"topics": [TOPIC]}, [("read", "topic", TOPIC)]),
        ("POST", access.M + "/heartbeat"): ({}, "", None, []),
        ("DELETE", access.M): ({}, "", None, []),
        ("GET", access.M + "/records"): ({}, "", None, []),
        ("POST", access.G + "/offsets"): ({}, "", OFFSET0, [("read", "topic", TOPIC)]),
        ("GET", access.G + "/offsets"): ({}, "", None, []),
        ("POST", access.G + "/offsets/reset"): ({}, "", {"to": "earliest"}, []),
        ("GET", "/v1/groups"): ({}, "", None, []),
        ("GET", access.G): ({}, "", None, []),
        ("DELETE", access.G): ({}, "", None, []),
        ("POST", TX): ({}, "", {}, []),
        ("GET", TX): ({}, "", None, []),
        ("POST", TX + "/commit"): ({}, "", SESSION, []),
        ("POST", TX + "/abort"): ({}, "", SESSION, []),
        ("GET", "/v1/transactions"): ({}, "", None, []),
        ("POST", TX + "/offsets"): (
            {},
            "",
            {
                **SESSION,
                "group_id": "g",
                "offsets": [{"topic": TOPIC, "partition": 0, "offset": 0}],
            },
            [("read", "group", "g"), ("read", "topic", TOPIC)],
        ),
        ("POST", "/v1/transactions"): (
            {},
            "",
            {"transactional_id": "tx", "records": [{"topic": TOPIC, "value": 1}]},
            [("write", "transactional_id", "tx"), ("write", "topic", TOPIC)],
        ),
        ("GET", "/v1/cluster"): ({}, "", None, []),
        ("POST", "/v1/cluster/brokers/{broker_id}/drain"): ({}, "", None, []),
        ("POST", "/v1/users"): ({}, "", {"name": f"u{n}"}, []),
        ("GET", "/v1/users"): ({}, "", None, []),
        ("DELETE", "/v1/users/{user}"): ({"user": f"nobody{n}"}, "", None, []),
        ("POST", "/v1/users/{user}/keys"): ({}, "", {"description": "ci"}, []),
        ("GET", "/v1/users/{user}/keys"): ({}, "", None, []),
        ("DELETE", "/v1/users/{user}/keys/{key_id}"): ({}, "", None, []),
        ("POST", "/v1/acls"): ({}, "", acl, []),
        ("GET", "/v1/acls"): ({}, "", None, []),
        ("DELETE", "/v1/acls"): ({}, f"principal=User:x{n}", None, []),
        ("POST", "/v1/tokens"): ({}, "", {"topics": [TOPIC]}, [("read", "topic", TOPIC)]),
        ("GET", "/v1/whoami"): ({}, "", None, []),
        ("PUT", "/v1/quotas"): ({}, "", {"entity": {"user": f"q{n}"}, "quotas": QUOTA}, []),
        ("GET", "/v1/quotas"): ({}, "", None, []),
        ("DELETE", "/v1/quotas"): ({}, f"user=q{n}", None, []),
        ("GET", "/metrics"): ({}, "", None, []),
        ("GET", "/healthz"): ({}, "", None, []),
        ("GET", "/readyz"): ({}, "", None, []),
        ("GET", "/docs"): ({}, "", None, []),
        ("GET", "/docs/oauth2-redirect"): ({}, "", None, []),
        ("GET", "/redoc"): ({}, "", None, []),
        ("GET", "/openapi.json"): ({}, "", None, []),
        ("WEBSOCKET", "/v1/ws"): ({}, "", None, []),  # test_websocket_* below
    }


PARAMS = {
    "topic": TOPIC,
    "group": "g",
    "member": "m",
    "partition": "0",
    "broker_id": "1",
    "user": "bob",
    "key_id": "0123456789abcdef",
    "transactional_id": "tx",
}
# Authenticated routes whose body names a resource: denied without an ACL for it.
BODY_DENIED = {("POST", "/v1/topics"), ("POST", "/v1/tokens"), ("POST", "/v1/transactions")}


def _routes(routes: list[BaseRoute], prefix: str = "") -> Iterator[tuple[str, str]]:
    for r in routes:
        if isinstance(r, APIWebSocketRoute):
            yield "WEBSOCKET", prefix + r.path
        elif isinstance(r, APIRoute | Route):
            for method in sorted(r.methods or ()):
                if method != "HEAD":
                    yield method, prefix + r.path
        elif isinstance(r, Mount):
            yield "MOUNT", prefix + r.path
        elif hasattr(r, "original_router"):  # an included router (FastAPI's wrapper)
            inner: Any = r
            yield from _routes(inner.original_router.routes, prefix + inner.include_context.prefix)
        elif hasattr(r, "routes"):
            yield from _routes(r.routes, prefix)


def test_every_route_is_declared() -> None:
    app = create_fastapi(Settings())
    served = set(_routes(app.routes))
    for method, path in served:
        if method == "MOUNT":
            assert path + "/" in access.PUBLIC_PREFIXES, path
        else:
            assert (method, path) in TABLE, f"{method} {path} declares no access rule"
    for path, ops in app.openapi()["paths"].items():
        for method in ops:
            assert (method.upper(), path) in TABLE, f"{method} {path} declares no access rule"
    assert set(TABLE) <= served, "declared routes the app does not serve"
    assert set(TABLE) == set(_samples()), "every declared route needs a sample request"


def test_openapi_declares_bearer_and_basic() -> None:
    doc = create_fastapi(Settings()).openapi()
    schemes = doc["components"]["securitySchemes"]
    assert schemes["bearer"] == {**schemes["bearer"], "type": "http", "scheme": "bearer"}
    assert schemes["basic"] == {**schemes["basic"], "type": "http", "scheme": "basic"}
    assert doc["paths"]["/healthz"]["get"]["security"] == []
    produce = doc["paths"]["/v1/topics/{topic}/records"]["post"]
    assert produce["security"] == [{"bearer": []}, {"basic": []}]
    assert "401" in produce["responses"]


def _call(b: Broker, key: tuple[str, str], sample: Sample, headers: dict[str, str]) -> Any:
    method, template = key
    params, query, body, _ = sample
    path = template.format(**{**PARAMS, **params})
    url = path + (f"?{query}" if query else "")
    kwargs: dict[str, Any] = {"headers": headers}
    if body is not None:
        kwargs["json"] = body
    return b.c.request(method, url, **kwargs)


BAD_KEY = "lbk.0123456789abcdef." + "A" * 43


@pytest.mark.parametrize(
    "key", [k for k, rule in TABLE.items() if k[0] != "WEBSOCKET"], ids=lambda k: " ".join(k)
)
def test_route_matrix(broker: Broker, key: tuple[str, str]) -> None:
    rule = TABLE[key]
    sample = _samples()[key]
    b = broker
    anonymous = _call(b, key, sample, {})
    bad = _call(b, key, sample, _bearer(BAD_KEY))
    if rule.kind is Kind.PUBLIC:
        assert anonymous.status_code < 400 and bad.status_code < 400
        return
    for r, reason in ((anonymous, "missing"), (bad, "invalid")):
        assert r.status_code == 401, r.text
        assert r.headers["www-authenticate"].startswith("Bearer realm=")
        assert r.json()["code"] == "SASL_AUTHENTICATION_FAILED" and r.json()["reason"] == reason
    b.revoke_all()
    denied = _call(b, key, sample, b.alice)
    if rule.kind is Kind.RESOURCE:
        assert rule.operation is not None and rule.resource_type is not None
        if rule.hides:
            assert denied.status_code == 404, denied.text
            assert denied.json()["code"] == "UNKNOWN_TOPIC_OR_PARTITION"
        else:
            assert denied.status_code == 403, denied.text
            want = f"{rule.resource_type.name}_AUTHORIZATION_FAILED"
            assert denied.json()["code"] == want
        resource = sample[0].get(rule.param or "", PARAMS.get(rule.param or "", ""))
        name = resource if rule.resource_type is not ResourceType.CLUSTER else "kafka-cluster"
        grants = [(rule.operation.value, rule.resource_type.value, name), *sample[3]]
    else:
        if key in BODY_DENIED:
            assert denied.status_code == 403, denied.text
        else:
            assert denied.status_code not in (401, 403), denied.text
        grants = sample[3]
    b.grant(*grants)
    try:
        allowed = _call(b, key, sample, b.alice)
    finally:
        b.revoke_all()
    assert allowed.status_code not in (401, 403) and allowed.status_code < 500, allowed.text
    if rule.hides:
        assert allowed.status_code != 404, allowed.text


def test_listings_show_only_what_may_be_described(broker: Broker) -> None:
    b = broker
    b.revoke_all()
    r = b.c.get("/v1/topics", headers=b.alice)
    assert r.status_code == 200 and r.json()["topics"] == []
    r = b.c.get("/v1/groups", headers=b.alice)
    assert r.status_code == 200 and r.json()["groups"] == []
    b.grant(("write", "topic", TOPIC))  # implies describe
    try:
        names = [t["name"] for t in b.c.get("/v1/topics", headers=b.alice).json()["topics"]]
    finally:
        b.revoke_all()
    assert names == [TOPIC]
    admin = [t["name"] for t in b.c.get("/v1/topics", headers=b.admin).json()["topics"]]
    assert (TOPIC in admin and "del" in admin) or TOPIC in admin


def test_basic_and_malformed_credentials(broker: Broker) -> None:
    b = broker
    good = base64.b64encode(f"alice:{b.alice_key}".encode()).decode()
    r = b.c.get("/v1/whoami", headers={"Authorization": f"Basic {good}"})
    assert r.status_code == 200 and r.json()["principal"] == "User:alice"
    wrong_user = base64.b64encode(f"bob:{b.alice_key}".encode()).decode()
    for value in (
        "Basic !!!notbase64",
        "Basic " + base64.b64encode(b"no-colon").decode(),
        "Basic " + wrong_user,
        "Bearer",
        "Bearer a b",
        "Digest abc",
        "Bearer " + "x" * 9000,  # oversized
        "Bearer lbt.e30.AAAA",  # a forged scoped token
        "Bearer eyJhbGciOiJub25lIn0.e30.",  # a JWT, no issuer configured
    ):
        r = b.c.get("/v1/whoami", headers={"Authorization": value})
        assert r.status_code == 401, (value[:40], r.text)
        assert r.json()["code"] == "SASL_AUTHENTICATION_FAILED"
    r = b.c.get("/v1/whoami?token=" + "x" * 5000)
    assert r.status_code == 401


def test_scoped_token_reads_its_topics_only(broker: Broker) -> None:
    b = broker
    b.grant(("read", "topic", TOPIC), ("read", "topic", "del"))
    try:
        r = b.c.post("/v1/tokens", json={"topics": [TOPIC], "ttl_minutes": 2}, headers=b.alice)
        assert r.status_code == 201, r.text
        token = r.json()["token"]
        ok = b.c.get(f"/v1/topics/{TOPIC}/partitions/0/records?offset=0&token={token}")
        other = b.c.get(f"/v1/topics/del/partitions/0/records?offset=0&token={token}")
        write = b.c.post(f"/v1/topics/{TOPIC}/records", json=RECORDS, headers=_bearer(token))
        mint = b.c.post("/v1/tokens", json={"topics": [TOPIC]}, headers=_bearer(token))
    finally:
        b.revoke_all()
    assert ok.status_code == 200, ok.text
    assert other.status_code == 403
    assert write.status_code == 401 and mint.status_code == 401  # a token only reads
    r = b.c.post("/v1/tokens", json={"topics": [TOPIC]}, headers=b.alice)
    assert r.status_code == 403  # no READ on the topic: no token for it


def test_forwarded_principal_header_is_not_trusted_from_users(broker: Broker) -> None:
    b = broker
    headers = {**b.alice, "Logbus-Principal": "User:admin"}
    r = b.c.get("/v1/whoami", headers=headers)
    assert r.status_code == 200 and r.json()["principal"] == "User:alice"
    r = b.c.get("/v1/users", headers=headers)
    assert r.status_code == 403
    r = b.c.get(
        "/v1/users",
        headers={"Logbus-Cluster-Credential": "0" * 64, "Logbus-Principal": "User:admin"},
    )
    assert r.status_code == 401


def test_a_forwarded_scoped_token_keeps_its_topic_limit(broker: Broker) -> None:
    """A broker forwarding a scoped token's request names the token's topics with the
    principal; the target limits the request to them (not to the user's full ACLs)."""
    b = broker
    credential = _state(b).security.credential.value()
    forwarded = {"Logbus-Cluster-Credential": credential, "Logbus-Principal": "User:alice"}
    r = b.c.post("/v1/topics", json={"name": "fwd-other"}, headers=b.admin)
    assert r.status_code in (201, 409), r.text
    b.grant(("read", "topic", TOPIC), ("read", "topic", "fwd-other"))
    try:
        for topic in (TOPIC, "fwd-other"):  # as the user: both
            path = f"/v1/topics/{topic}/partitions/0/records?offset=0"
            assert b.c.get(path, headers=forwarded).status_code == 200
        scoped = {**forwarded, "Logbus-Principal-Topics": TOPIC}
        ok = b.c.get(f"/v1/topics/{TOPIC}/partitions/0/records?offset=0", headers=scoped)
        other = b.c.get("/v1/topics/fwd-other/partitions/0/records?offset=0", headers=scoped)
        write = b.c.post(f"/v1/topics/{TOPIC}/records", json=RECORDS, headers=scoped)
        # From a user, the header is dropped (it could only narrow, but is a broker's word).
        own = b.c.get(
            "/v1/topics/fwd-other/partitions/0/records?offset=0",
            headers={**b.alice, "Logbus-Principal-Topics": TOPIC},
        )
    finally:
        b.revoke_all()
    assert ok.status_code == 200, ok.text
    assert other.status_code == 403 and write.status_code == 403, (other.text, write.text)
    assert own.status_code == 200, own.text


def test_a_user_saying_forwarded_is_still_measured_by_its_quota(broker: Broker) -> None:
    """Logbus-Forwarded-By exempts a request from the quota gate (it was measured where it
    came in), so, like Logbus-Principal, only a broker with the cluster credential may send it."""
    b = broker
    quota = {"entity": {"user": "alice"}, "quotas": {"producer_byte_rate": 2}}
    assert b.c.put("/v1/quotas", json=quota, headers=b.admin).status_code == 200
    b.grant(("write", "topic", TOPIC))
    try:
        for extra in ({}, {"Logbus-Forwarded-By": "2"}):
            r = b.c.post(f"/v1/topics/{TOPIC}/records", json=RECORDS, headers={**b.alice, **extra})
            assert r.status_code == 200, r.text
            assert int(r.headers["Logbus-Throttle-Time-Ms"]) > 0, (extra, dict(r.headers))
    finally:
        r = b.c.request("DELETE", "/v1/quotas?user=alice", headers=b.admin)
        assert r.status_code == 204
        b.revoke_all()


def test_bad_admin_input_is_400(broker: Broker) -> None:
    b = broker
    bodies: list[Any] = [
        {"name": "<default>"},
        {"name": "a:b"},
        {"name": ""},
        {"name": "x" * 300},
        [],
    ]
    for body in bodies:
        r = b.c.post("/v1/users", json=body, headers=b.admin)
        assert r.status_code == 400, (body, r.text)
    acls: list[Any] = [
        {"principal": "alice", "resource_type": "topic", "name": "a", "operation": "read"},
        {"principal": "User:a", "resource_type": "nope", "name": "a", "operation": "read"},
        {"principal": "User:a", "resource_type": "topic", "name": "a", "operation": "x"},
        {
            "principal": "User:a",
            "resource_type": "topic",
            "name": "*",
            "operation": "read",
            "pattern": "prefixed",
        },
        {
            "principal": "User:a",
            "resource_type": "topic",
            "name": "a",
            "operation": "read",
            "extra": 1,
        },
        "text",
        [],
    ]
    for body in acls:
        r = b.c.post("/v1/acls", json=body, headers=b.admin)
        assert r.status_code == 400, (body, r.text)
    for query in ("", "resource_type=nope", "principal=alice"):
        r = b.c.request("DELETE", f"/v1/acls?{query}", headers=b.admin)
        assert r.status_code == 400, (query, r.text)
    r = b.c.request("DELETE", "/v1/users/bob/keys/nothex", headers=b.admin)
    assert r.status_code == 400
    r = b.c.post("/v1/users", json={"name": "alice"}, headers=b.admin)
    assert r.status_code == 409
    tokens: list[Any] = [{"topics": []}, {"topics": ["a b"]}, {"topics": [TOPIC], "ttl_minutes": 0}]
    for body in tokens:
        r = b.c.post("/v1/tokens", json=body, headers=b.admin)
        assert r.status_code == 400, (body, r.text)


def test_guessing_a_known_key_ids_secret_is_cut_off_without_hashing(broker: Broker) -> None:
    """Brute force: after KEY_FAILURES_MAX wrong secrets for one key id, its un-cached
    presentations are refused without an argon2 hash (even the right one, until the window
    ends); a key already verified (a client's live sessions) keeps working."""
    b = broker
    security = _state(b).security
    verifier = security.verifier
    r = b.c.post("/v1/users/alice/keys", json={"description": "target"}, headers=b.admin)
    assert r.status_code == 201
    key, key_id = r.json()["key"], r.json()["key_id"]
    prefix = key.rsplit(".", 1)[0]
    hashes = 0
    check = verifier.check

    def counting(token: str, stored: Any) -> Any:
        nonlocal hashes
        hashes += 1
        return check(token, stored)

    verifier.check = counting
    try:
        assert b.c.get("/v1/whoami", headers=b.alice).status_code == 200  # cached before
        for _ in range(KEY_FAILURES_MAX):
            guess = f"{prefix}.{generate_api_key().token.rsplit('.', 1)[1]}"
            assert b.c.get("/v1/whoami", headers=_bearer(guess)).status_code == 401
        assert hashes == KEY_FAILURES_MAX
        for token in (f"{prefix}.{'A' * 43}", key):  # blocked: no hash, the right key too
            r = b.c.get("/v1/whoami", headers=_bearer(token))
            assert r.status_code == 401 and r.json()["code"] == "SASL_AUTHENTICATION_FAILED"
        assert hashes == KEY_FAILURES_MAX
        assert b.c.get("/v1/whoami", headers=b.alice).status_code == 200  # other ids: fine
        security.key_failures.succeeded(key_id)  # as the window's end does
        assert b.c.get("/v1/whoami", headers=_bearer(key)).status_code == 200
    finally:
        verifier.check = check
        b.c.request("DELETE", f"/v1/users/alice/keys/{key_id}", headers=b.admin)


def test_key_listing_never_shows_hashes(broker: Broker) -> None:
    r = broker.c.get("/v1/users/alice/keys", headers=broker.admin)
    assert r.status_code == 200
    assert "argon2" not in r.text and broker.alice_key not in r.text
    assert set(r.json()["keys"][0]) == {"key_id", "description", "created_ms"}


def test_metrics_count_failures_and_denials(broker: Broker) -> None:
    b = broker
    b.revoke_all()
    b.c.get("/v1/whoami")
    b.c.get("/v1/users", headers=b.alice)
    text = b.c.get("/metrics", headers=b.admin).text
    assert 'logbus_authentication_failures_total{reason="missing"}' in text
    assert 'logbus_authorization_denials_total{resource_type="cluster"}' in text


@contextlib.contextmanager
def _ws(b: Broker, url: str = WS, headers: dict[str, str] | None = None) -> Iterator[Any]:
    """A WebSocket session. Leaving it, TestClient cancels the app's task when the session
    is still shutting down (its own race, with or without auth): that CancelledError is not
    the test's."""
    cm = b.c.websocket_connect(url, headers=headers or {})
    ws = cm.__enter__()
    try:
        yield ws
    finally:
        with contextlib.suppress(concurrent.futures.CancelledError):
            cm.__exit__(None, None, None)


def _ws_closed(b: Broker, headers: dict[str, str], url: str = WS) -> int:
    with pytest.raises(WebSocketDisconnect) as e, _ws(b, url, headers) as ws:
        ws.receive_text()
    return e.value.code


def test_websocket_refusals(broker: Broker) -> None:
    b = broker
    b.revoke_all()
    assert _ws_closed(b, {}) == 4401
    assert _ws_closed(b, _bearer(BAD_KEY)) == 4401
    with (
        pytest.raises(WebSocketDisconnect) as e,
        _ws(b, WS, b.alice) as ws,
    ):
        ws.send_json({"op": "subscribe", "topics": [TOPIC]})
        ws.receive_text()
    assert e.value.code == 4403


# One sample of each WebSocket message that names resources (see access.WS_MESSAGES): the
# message, and the topics and group it names.
WS_SAMPLES: dict[str, tuple[dict[str, Any], list[str], str | None]] = {
    "subscribe": ({"op": "subscribe", "topics": [TOPIC]}, [TOPIC], None),
    "join": ({"op": "join", "group": "wsg", "topics": [TOPIC]}, [TOPIC], "wsg"),
    "commit": ({"op": "commit", "group": "wsg", "offsets": OFFSET0["offsets"]}, [TOPIC], "wsg"),
    "produce": ({"op": "produce", "topic": TOPIC, "records": [{"value": 1}]}, [TOPIC], None),
}


def test_every_websocket_message_is_declared() -> None:
    from api import ws_protocol

    tags = {cls.__struct_config__.tag for cls in ws_protocol._Op.__subclasses__()}
    assert tags == set(access.WS_MESSAGES), "a WebSocket message without an access rule"
    assert {m for m, needs in access.WS_MESSAGES.items() if needs} == set(WS_SAMPLES)


@pytest.mark.parametrize("message", sorted(WS_SAMPLES))
def test_websocket_message_matrix(broker: Broker, message: str) -> None:
    """Each message: refused without the ACLs WS_MESSAGES names (4403 for a subscription or
    join, an error answer otherwise), served with exactly them."""
    b = broker
    body, topics, group = WS_SAMPLES[message]
    sample = {**body, "id": 7}
    needs = access.ws_requirements(message, topics, group)
    assert needs

    def answer() -> tuple[str, Any]:
        try:
            with _ws(b, WS, b.alice) as ws:
                ws.send_json(sample)
                while True:
                    doc = ws.receive_json()
                    if doc.get("id") == 7 or doc["type"] == "error":
                        return doc["type"], doc
        except WebSocketDisconnect as e:
            return "closed", e.code

    b.revoke_all()
    kind, doc = answer()
    assert (kind, doc) == ("closed", 4403) or (
        kind == "error" and doc["code"].endswith("_AUTHORIZATION_FAILED")
    ), (kind, doc)
    b.grant(*[(op.value, r.type.value, r.name) for op, r in needs])
    try:
        kind, doc = answer()
    finally:
        b.revoke_all()
    assert kind not in ("closed", "error"), (kind, doc)


def test_revoked_key_closes_its_websocket(broker: Broker) -> None:
    b = broker
    r = b.c.post("/v1/users/alice/keys", json={"description": "ws"}, headers=b.admin)
    assert r.status_code == 201
    key, key_id = r.json()["key"], r.json()["key_id"]
    b.grant(("read", "topic", TOPIC))
    try:
        with _ws(b, WS, _bearer(key)) as ws:
            ws.send_json({"op": "subscribe", "topics": [TOPIC], "id": 1})
            assert ws.receive_json()["type"] == "subscribed"
            r = b.c.request("DELETE", f"/v1/users/alice/keys/{key_id}", headers=b.admin)
            assert r.status_code == 204
            with pytest.raises(WebSocketDisconnect) as e:
                while True:  # records may come first; the close follows
                    ws.receive_text()
            assert e.value.code == 4401
    finally:
        b.revoke_all()


def test_websocket_with_a_scoped_token(broker: Broker) -> None:
    b = broker
    b.grant(("read", "topic", TOPIC))
    try:
        token = b.c.post("/v1/tokens", json={"topics": [TOPIC]}, headers=b.alice).json()["token"]
        with _ws(b, f"{WS}?token={token}") as ws:
            ws.send_json({"op": "subscribe", "topics": [TOPIC], "id": 1})
            assert ws.receive_json()["type"] == "subscribed"
            ws.send_json({"op": "produce", "topic": TOPIC, "records": [{"value": 1}], "id": 2})
            answer = ws.receive_json()
            assert answer["type"] == "error" and answer["code"] == "TOPIC_AUTHORIZATION_FAILED"
    finally:
        b.revoke_all()


def test_token_never_logged(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    key = generate_api_key().token
    fast = _app(tmp_path / "data", auth=True, bootstrap_key=key, access_log="on")
    logged = AccessLog(fast, 1.0)
    with TestClient(logged, base_url=BASE) as c, caplog.at_level(logging.DEBUG):
        c.post("/v1/topics", json={"name": TOPIC}, headers=_bearer(key))
        token = c.post("/v1/tokens", json={"topics": [TOPIC]}, headers=_bearer(key)).json()["token"]
        secret = token.rsplit(".", 1)[1]
        for url in (
            f"/v1/topics/{TOPIC}/partitions/0/records?offset=0&token={token}",
            f"/v1/topics/{TOPIC}/partitions/0/records?offset=0&token={token}x",
            f"/v1/topics/nope/partitions/0/records?offset=0&token={token}",
        ):
            c.get(url)
    # The broker's own log lines (the test's HTTP client logs its URLs itself).
    lines = [r.getMessage() for r in caplog.records if not r.name.startswith(("httpx", "httpcore"))]
    assert any("/records" in line for line in lines), lines
    assert not [line for line in lines if secret in line]


def test_auth_off_is_anonymous_and_admin_routes_work(tmp_path: Path) -> None:
    with TestClient(_app(tmp_path / "data"), base_url=BASE) as c:
        r = c.get("/v1/whoami")
        assert r.json() == {
            "principal": "User:ANONYMOUS",
            "method": "internal",
            "authenticated": False,
        }
        r = c.post("/v1/users", json={"name": "carol"})
        assert r.status_code == 201 and r.json()["key"].startswith("lbk.")
        assert [u["name"] for u in c.get("/v1/users").json()["users"]] == ["carol"]


def test_bootstrap_key_from_a_file(tmp_path: Path) -> None:
    """LOGBUS_BOOTSTRAP_KEY_FILE (a Docker secret): the first admin's key read from a file."""
    key = generate_api_key().token
    secret = tmp_path / "bootstrap_key"
    secret.write_text(key + "\n")
    with TestClient(
        _app(tmp_path / "data", auth=True, bootstrap_key_file=secret), base_url=BASE
    ) as c:
        r = c.get("/v1/whoami", headers=_bearer(key))
        assert r.status_code == 200 and r.json()["principal"] == "User:admin", r.text
    secret.write_text("not a key")
    with pytest.raises(ValueError, match="bootstrap_key: expected an API key"):
        Settings(data_dir=tmp_path / "d2", auth=True, bootstrap_key_file=secret)


def test_jwt_bearer(tmp_path: Path) -> None:
    """JWTs from a configured issuer: the subject is the principal; expired, forged,
    wrong-audience, unsigned and oversized ones are 401."""
    import time

    import jwt
    import orjson
    from cryptography.hazmat.primitives.asymmetric import rsa
    from jwt.algorithms import RSAAlgorithm

    issuer, audience = "https://idp.example", "logbus"
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    other = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    public = RSAAlgorithm.to_jwk(key.public_key(), as_dict=True)
    jwks = tmp_path / "jwks.json"
    jwks.write_bytes(orjson.dumps({"keys": [{**public, "kid": "k1", "alg": "RS256"}]}))
    admin_key = generate_api_key().token
    fast = _app(
        tmp_path / "data",
        auth=True,
        bootstrap_key=admin_key,
        jwt_issuer=issuer,
        jwt_audience=audience,
        jwt_jwks_file=jwks,
    )
    now = int(time.time())

    def token(signer: Any = key, **over: Any) -> str:
        claims = {"sub": "carol", "iss": issuer, "aud": audience, "exp": now + 300, **over}
        return jwt.encode(claims, signer, algorithm="RS256", headers={"kid": "k1"})

    with TestClient(fast, base_url=BASE) as c:
        r = c.get("/v1/whoami", headers=_bearer(token()))
        assert r.status_code == 200 and r.json()["principal"] == "User:carol"
        assert r.json()["method"] == "jwt"
        refused = {
            "expired": token(exp=now - 3600),
            "forged": token(other),
            "wrong audience": token(aud="someone-else"),
            "wrong issuer": token(iss="https://evil.example"),
            "unsigned": jwt.encode({"sub": "carol"}, "", algorithm="none"),
            "oversized": token(pad="x" * 9000),
        }
        for what, value in refused.items():
            r = c.get("/v1/whoami", headers=_bearer(value))
            assert r.status_code == 401, (what, r.text)
            assert r.headers["www-authenticate"].startswith("Bearer realm=")
        r = c.get("/v1/whoami", headers=_bearer(token(exp=now - 3600)))
        assert r.json()["reason"] == "expired"
        r = c.get("/v1/users", headers=_bearer(token()))
        assert r.status_code == 403  # authenticated, but carol has no ACL
