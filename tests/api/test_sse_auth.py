"""SSE streams end when their credential is revoked or their read ACL removed (api.stream_guard).

Against a real broker with ``--auth``: alice streams a partition and a group member's records;
the admin revokes her key or removes an ACL; the stream's next event is an ``error`` carrying
the 401/403 problem, then it ends, and the browser's reconnect is refused (so an EventSource
stops). The wall time from the change to the error is printed, not asserted: the change is
applied by the broker's next security poll (250 ms). :func:`guarded` is also driven directly
with a fake security state, for token expiry and for a stream parked between records.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from typing import Any

import httpx
import orjson
import pytest

from api.stream_guard import guarded
from auth_quotas.acl import Operation, Resource, ResourceType
from auth_quotas.credentials import Identity, generate_api_key
from tests.api.test_sse import SSE, parse
from tests.server import BrokerProcess

READ_TIMEOUT_S = 10.0


@dataclass
class Cluster:
    url: str
    admin: dict[str, str]

    def user(self, name: str) -> dict[str, str]:
        r = httpx.post(f"{self.url}/v1/users", json={"name": name}, headers=self.admin)
        assert r.status_code == 201, r.text
        return {"authorization": f"Bearer {r.json()['key']}"}

    def grant(self, user: str, *acls: tuple[str, str, str]) -> None:
        body = [
            {"principal": f"User:{user}", "resource_type": t, "name": n, "operation": op}
            for op, t, n in acls
        ]
        r = httpx.post(f"{self.url}/v1/acls", json=body, headers=self.admin)
        assert r.status_code == 201, r.text


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    key = generate_api_key().token
    tmp = tmp_path_factory.mktemp("sse-auth")
    b = BrokerProcess(tmp / "data", None, "--auth", env={"LOGBUS_BOOTSTRAP_KEY": key})
    b.start()
    try:
        c = Cluster(b.url, {"authorization": f"Bearer {key}"})
        for topic in ("s1", "s2", "s3"):
            r = httpx.post(f"{b.url}/v1/topics", json={"name": topic}, headers=c.admin)
            assert r.status_code == 201, r.text
            r = httpx.post(
                f"{b.url}/v1/topics/{topic}/records",
                json={"records": [{"value": 1}]},
                headers=c.admin,
            )
            assert r.status_code == 200, r.text
        yield c
    finally:
        b.kill()


def _stream_until_error(
    url: str, path: str, headers: dict[str, str], change: Any
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """Open the stream, wait for its first record, make ``change``, and return the error event
    that ends the stream and the events before it (the stream must end after it)."""
    timeout = httpx.Timeout(10.0, read=READ_TIMEOUT_S)
    seen: list[dict[str, Any]] = []
    with (
        httpx.Client(timeout=timeout) as client,
        client.stream("GET", url + path, headers={**SSE, **headers}) as r,
    ):
        assert r.status_code == 200, r.read()
        events = parse(r.iter_lines())
        for event in events:
            seen.append(event)
            if "id" in event:
                break
        started = time.monotonic()
        change()
        for event in events:
            if event.get("event") == "error":
                print(f"stream ended {time.monotonic() - started:.3f} s after the change")
                assert list(events) == [], "the stream ends after its error event"
                return orjson.loads(event["data"]), seen
            seen.append(event)
    raise AssertionError(f"the stream ended without an error event: {seen}")


def test_revoked_key_ends_a_partition_stream(broker: Cluster) -> None:
    c = broker
    r = httpx.post(f"{c.url}/v1/users", json={"name": "sse-a"}, headers=c.admin)
    assert r.status_code == 201, r.text
    key, key_id = r.json()["key"], r.json()["key_id"]
    alice = {"authorization": f"Bearer {key}"}
    c.grant("sse-a", ("read", "topic", "s1"))
    path = "/v1/topics/s1/partitions/0/records?offset=0"

    def revoke() -> None:
        r = httpx.delete(f"{c.url}/v1/users/sse-a/keys/{key_id}", headers=c.admin)
        assert r.status_code == 204, r.text

    error, _ = _stream_until_error(c.url, path, alice, revoke)
    assert error["status"] == 401 and error["code"] == "SASL_AUTHENTICATION_FAILED", error
    # The EventSource's reconnect is refused: it stops there.
    r = httpx.get(c.url + path, headers={**SSE, **alice})
    assert r.status_code == 401


def test_removed_acl_ends_a_partition_stream(broker: Cluster) -> None:
    c = broker
    bob = c.user("sse-b")
    c.grant("sse-b", ("read", "topic", "s2"), ("describe", "topic", "s2"))
    path = "/v1/topics/s2/partitions/0/records?offset=0"

    def remove_read() -> None:
        r = httpx.delete(
            f"{c.url}/v1/acls",
            params={"principal": "User:sse-b", "operation": "read"},
            headers=c.admin,
        )
        assert r.status_code == 200 and len(r.json()["removed"]) == 1, r.text

    error, seen = _stream_until_error(c.url, path, bob, remove_read)
    assert error["status"] == 403 and error["code"] == "TOPIC_AUTHORIZATION_FAILED", error
    assert any("id" in e for e in seen)
    assert httpx.get(c.url + path, headers={**SSE, **bob}).status_code == 403


def test_removed_group_acl_ends_a_member_stream(broker: Cluster) -> None:
    c = broker
    carol = c.user("sse-c")
    c.grant("sse-c", ("read", "topic", "s3"), ("read", "group", "g-sse"))
    r = httpx.post(
        f"{c.url}/v1/groups/g-sse/members",
        json={"topics": ["s3"], "auto_offset_reset": "earliest"},
        headers=carol,
    )
    assert r.status_code in (200, 201), r.text
    member = r.json()["member_id"]

    def remove_group() -> None:
        r = httpx.delete(
            f"{c.url}/v1/acls",
            params={"principal": "User:sse-c", "resource_type": "group"},
            headers=c.admin,
        )
        assert r.status_code == 200 and len(r.json()["removed"]) == 1, r.text

    path = f"/v1/groups/g-sse/members/{member}/records"
    error, _ = _stream_until_error(c.url, path, carol, remove_group)
    assert error["status"] == 403 and error["code"] == "GROUP_AUTHORIZATION_FAILED", error


def test_sse_refusals_matrix(broker: Cluster) -> None:
    """Both SSE routes: no credential, a bad one, a principal without the ACL, one with it →
    401 / 401 / 403 / a stream, as the route matrix of tests/api/test_access.py for HTTP."""
    c = broker
    dave = c.user("sse-d")
    r = httpx.post(f"{c.url}/v1/groups/g-sse-d/members", json={"topics": ["s1"]}, headers=c.admin)
    assert r.status_code in (200, 201), r.text
    member = r.json()["member_id"]
    paths = {
        "/v1/topics/s1/partitions/0/records?offset=0": [("read", "topic", "s1")],
        f"/v1/groups/g-sse-d/members/{member}/records": [("read", "group", "g-sse-d")],
    }
    bad = {"authorization": "Bearer lbk.0123456789abcdef." + "A" * 43}
    for path, acls in paths.items():
        statuses = [
            httpx.get(c.url + path, headers={**SSE, **h}, timeout=10).status_code
            for h in ({}, bad, dave)
        ]
        assert statuses == [401, 401, 403], (path, statuses)
        c.grant("sse-d", *acls)
        with httpx.stream("GET", c.url + path, headers={**SSE, **dave}, timeout=10) as r:
            assert r.status_code == 200 and r.headers["content-type"].startswith(SSE["accept"])


# -- guarded() on its own: expiry and a parked stream -----------------------------------------


@dataclass
class FakeSecurity:
    enabled: bool = True
    valid: bool = True
    readable: set[str] = field(default_factory=lambda: {"t"})
    listeners: set[Any] = field(default_factory=set)

    def now_ms(self) -> int:
        return int(time.time() * 1000)

    def still_valid(self, identity: Identity) -> bool:
        expired = identity.expires_ms is not None and self.now_ms() >= identity.expires_ms
        return self.valid and not expired

    def allowed(self, identity: Identity, op: Operation, resource: Resource) -> bool:
        return op is Operation.READ and resource.name in self.readable

    def changed(self) -> None:
        for listener in list(self.listeners):
            listener()


async def _parked(first: asyncio.Event, closed: asyncio.Event) -> AsyncIterator[bytes]:
    """One chunk, then waits for ever (a quiet partition) until closed."""
    try:
        yield b"id: 1\ndata: {}\n\n"
        first.set()
        await asyncio.Event().wait()
        yield b"never"
    finally:
        closed.set()


def _reads() -> list[Resource]:
    return [Resource(ResourceType.TOPIC, "t")]


async def _collect(body: AsyncIterator[bytes]) -> list[bytes]:
    return [chunk async for chunk in body]


def test_guard_ends_a_parked_stream_on_an_acl_change() -> None:
    async def run() -> list[bytes]:
        security = FakeSecurity()
        first, closed = asyncio.Event(), asyncio.Event()
        identity = Identity("u", "api_key", key_id="k")
        body = guarded(_parked(first, closed), security, identity, _reads)  # type: ignore[arg-type]
        task = asyncio.create_task(_collect(body))
        await first.wait()
        security.readable.clear()
        security.changed()
        chunks = await asyncio.wait_for(task, 10)
        assert closed.is_set(), "the inner stream is closed"
        assert not security.listeners, "the listener is removed"
        return chunks

    chunks = asyncio.run(run())
    assert chunks[0].startswith(b"id: 1")
    assert chunks[1].startswith(b"event: error\n") and b"TOPIC_AUTHORIZATION_FAILED" in chunks[1]
    assert len(chunks) == 2


def test_guard_ends_a_stream_when_its_token_expires() -> None:
    async def run() -> list[bytes]:
        security = FakeSecurity()
        first, closed = asyncio.Event(), asyncio.Event()
        identity = Identity(
            "u", "scoped", topics=frozenset({"t"}), expires_ms=security.now_ms() + 50
        )
        body = guarded(_parked(first, closed), security, identity, _reads)  # type: ignore[arg-type]
        chunks = await asyncio.wait_for(_collect(body), 10)  # no security change at all
        assert closed.is_set()
        return chunks

    chunks = asyncio.run(run())
    assert b"SASL_AUTHENTICATION_FAILED" in chunks[-1] and chunks[-1].startswith(b"event: error")


def test_guard_passes_a_stream_through_when_nothing_changes_or_auth_is_off() -> None:
    async def inner() -> AsyncIterator[bytes]:
        for i in range(3):
            yield b"%d" % i

    async def run() -> tuple[list[bytes], list[bytes], bool]:
        security = FakeSecurity()
        identity = Identity("u", "api_key", key_id="k")
        on = await _collect(guarded(inner(), security, identity, _reads))  # type: ignore[arg-type]
        body = inner()
        off = guarded(body, FakeSecurity(enabled=False), identity, _reads)  # type: ignore[arg-type]
        return on, await _collect(off), off is body

    on, off, same = asyncio.run(run())
    assert on == off == [b"0", b"1", b"2"]
    assert same, "without auth the body is not wrapped"
