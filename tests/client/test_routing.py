"""The client routing layer against a fake cluster (httpx.MockTransport): 421 redirects,
failover on connection errors, bounded retries, and which failures may be sent again."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from typing import Any

import httpx
import pytest

from logbus_client.routing import (
    AsyncRouter,
    Router,
    RoutingError,
    Verdict,
    judge,
    parse_bootstrap,
)

A, B, C = "http://a:1", "http://b:2", "http://c:3"
IDS = {1: A, 2: B, 3: C}
PRODUCE = "/v1/topics/t/partitions/0/records"


def _problem(status: int, code: str, **extra: Any) -> httpx.Response:
    body = {"status": status, "code": code, "retriable": True, "detail": code, **extra}
    return httpx.Response(status, json=body)


def _answer(response: httpx.Response) -> Callable[[httpx.Request], httpx.Response]:
    return lambda request: response


class FakeCluster:
    """Three brokers; ``leader`` leads t-0; ``down`` refuse connections; ``script`` overrides
    the answer of a broker to a partition request (a list consumed one per request)."""

    def __init__(self, leader: int = 2, clustered: bool = True) -> None:
        self.leader = leader
        self.clustered = clustered
        self.down: set[str] = set()
        self.script: dict[str, list[Callable[[httpx.Request], httpx.Response]]] = {}
        self.log: list[tuple[str, str, str | None]] = []  # (base, path, Logbus-Route)

    def handle(self, request: httpx.Request) -> httpx.Response:
        base = f"{request.url.scheme}://{request.url.host}:{request.url.port}"
        self.log.append((base, request.url.path, request.headers.get("logbus-route")))
        if base in self.down:
            raise httpx.ConnectError("connection refused", request=request)
        path = request.url.path
        if path == "/v1/cluster":
            brokers = [{"broker_id": i, "url": u, "alive": True} for i, u in IDS.items()]
            return httpx.Response(200, json={"clustered": self.clustered, "brokers": brokers})
        if path == "/v1/topics/t/partitions":
            return httpx.Response(200, json=[{"partition": 0, "leader": self.leader}])
        if self.script.get(base):
            return self.script[base].pop(0)(request)
        if self.clustered and base != IDS[self.leader]:
            leader = IDS[self.leader]
            return _problem(421, "NOT_LEADER_OR_FOLLOWER", leader_id=self.leader, leader_url=leader)
        return httpx.Response(200, json={"offsets": [{"partition": 0, "offset": 7}]})

    def sends(self) -> list[tuple[str, str | None]]:
        """The partition requests (not metadata) in order: (broker, Logbus-Route)."""
        return [(b, route) for b, p, route in self.log if p == PRODUCE]


def _router(
    fake: FakeCluster, urls: str = A, warm: bool = True, **kw: Any
) -> tuple[Router, list[float]]:
    """A router on ``fake``; ``warm``: it has learnt t-0's leader (and the log is cleared)."""
    sleeps: list[float] = []
    router = Router(
        urls, transport=httpx.MockTransport(lambda r: fake.handle(r)), sleep=sleeps.append, **kw
    )
    if warm:
        assert _produce(router, idempotent=False).status_code == 200
        fake.log.clear()
    return router, sleeps


def _produce(router: Router, idempotent: bool) -> httpx.Response:
    return router.request(
        "POST", PRODUCE, partition=("t", 0), idempotent=idempotent, json={"records": []}
    )


def test_a_421_names_the_leader_and_later_requests_go_there_directly() -> None:
    fake = FakeCluster(leader=3)
    router, sleeps = _router(fake, warm=False)
    assert _produce(router, idempotent=False).status_code == 200
    assert fake.sends() == [(A, "direct"), (C, "direct")]  # the bootstrap broker said: 3
    assert _produce(router, idempotent=False).status_code == 200
    assert fake.sends()[-1] == (C, "direct") and len(fake.sends()) == 3
    assert [p for _, p, _ in fake.log].count("/v1/cluster") == 1  # learnt once
    assert sleeps == []  # a named leader needs no backoff


def test_a_partition_listing_saves_the_first_redirect() -> None:
    fake = FakeCluster(leader=3)
    router, _ = _router(fake, warm=False)
    router.view.apply_partitions("t", [{"partition": 0, "leader": 3}])
    router.refresh()
    assert _produce(router, idempotent=False).status_code == 200
    assert fake.sends() == [(C, "direct")]


def test_a_moved_leader_is_followed_at_once() -> None:
    fake = FakeCluster(leader=2)
    router, sleeps = _router(fake)
    fake.leader = 3  # leadership moves; the router still believes 2
    assert _produce(router, idempotent=False).status_code == 200
    assert fake.sends() == [(B, "direct"), (C, "direct")]
    assert sleeps == []


def test_a_dead_bootstrap_broker_is_skipped() -> None:
    fake = FakeCluster(leader=2)
    fake.down.add(A)
    router, _ = _router(fake, f"{A},{B}", warm=False)
    assert _produce(router, idempotent=False).status_code == 200
    assert fake.sends() == [(B, "direct")]


def test_connection_error_fails_over_to_the_leader_other_brokers_name() -> None:
    fake = FakeCluster(leader=3)
    router, sleeps = _router(fake, A)  # one bootstrap URL: the others come from /v1/cluster
    fake.down.update({A, C})  # the leader dies, and so does the broker the router asks
    handle = fake.handle

    def elect_later(request: httpx.Request) -> httpx.Response:
        # Broker 2 names the dead leader until the cluster elects it (after two more
        # attempts at the dead one), as a real cluster does until the lease expires.
        if fake.sends().count((C, "direct")) >= 3:
            fake.leader = 2
        return handle(request)

    fake.handle = elect_later  # type: ignore[method-assign]
    assert _produce(router, idempotent=True).status_code == 200
    assert fake.sends()[-1] == (B, "direct")
    assert (A, "direct") in fake.sends()
    assert 1 <= len(sleeps) < router.max_attempts and all(s <= 1.0 for s in sleeps)
    assert ("http://b:2", "/v1/cluster", None) in fake.log  # learnt the cluster again from B


def test_retries_are_bounded_and_back_off() -> None:
    fake = FakeCluster(leader=2)
    router, sleeps = _router(fake, max_attempts=6, backoff_s=0.1, backoff_max_s=0.5)
    fake.script[B] = [lambda r: _problem(503, "NOT_ENOUGH_REPLICAS")] * 100
    r = _produce(router, idempotent=False)  # never written: safe to retry even so
    assert r.status_code == 503 and r.json()["code"] == "NOT_ENOUGH_REPLICAS"
    assert len(fake.sends()) == 6
    assert sleeps == [0.1, 0.2, 0.4, 0.5, 0.5]


def test_unreachable_everywhere_raises_after_the_attempts() -> None:
    fake = FakeCluster()
    fake.down.update({A, B, C})
    router, sleeps = _router(fake, f"{A},{B}", warm=False, max_attempts=3)
    with pytest.raises(RoutingError) as e:
        _produce(router, idempotent=False)
    assert not e.value.maybe_written  # the connection was never made
    assert len(sleeps) == 2


def test_a_maybe_written_produce_is_resent_only_if_idempotent() -> None:
    def timeout(request: httpx.Request) -> httpx.Response:
        raise httpx.ReadTimeout("no answer", request=request)

    for idempotent in (False, True):
        fake = FakeCluster(leader=2)
        router, _ = _router(fake)
        fake.script[B] = [timeout]
        if idempotent:
            assert _produce(router, idempotent=True).status_code == 200
            sent = [b for b, _ in fake.sends()]  # B timed out: asked A, which named B again
            assert sent == [B, A, B]
        else:
            with pytest.raises(RoutingError) as e:
                _produce(router, idempotent=False)
            assert e.value.maybe_written
            assert len(fake.sends()) == 1


@pytest.mark.parametrize(
    ("answer", "resent_when_not_idempotent"),
    [
        (_problem(503, "NETWORK_EXCEPTION"), False),
        (_problem(504, "REQUEST_TIMED_OUT"), False),
        (_problem(503, "NOT_ENOUGH_REPLICAS_AFTER_APPEND"), False),
        (_problem(421, "NOT_LEADER_OR_FOLLOWER"), False),  # moved during the acks=all wait
        (_problem(421, "NOT_LEADER_OR_FOLLOWER", leader_id=-1, leader_url=None), True),
        (_problem(503, "BROKER_BUSY"), True),
        (httpx.Response(429), True),
    ],
)
def test_which_failures_a_plain_produce_may_resend(
    answer: httpx.Response, resent_when_not_idempotent: bool
) -> None:
    fake = FakeCluster(leader=2)
    router, _ = _router(fake)
    fake.script[B] = [lambda r: answer]
    r = _produce(router, idempotent=False)
    if resent_when_not_idempotent:
        assert r.status_code == 200 and len(fake.sends()) >= 2
    else:
        assert r.status_code == answer.status_code and len(fake.sends()) == 1
    fake.script[B] = [lambda r: answer]
    assert _produce(router, idempotent=True).status_code == 200  # idempotent: always resent


def test_errors_retrying_cannot_fix_are_answered_at_once() -> None:
    fake = FakeCluster(leader=2)
    for status in (400, 404, 409, 413, 416, 422):
        answer = _problem(status, "X")
        router, sleeps = _router(fake)
        fake.script[B] = [_answer(answer)]
        assert _produce(router, idempotent=True).status_code == status
        assert sleeps == []
    fake.script[B] = [lambda r: httpx.Response(500, json={"retriable": False})]
    assert _produce(router, idempotent=True).status_code == 500


def test_ping_pong_redirects_back_off_and_stop() -> None:
    fake = FakeCluster(leader=2)
    router, sleeps = _router(fake, max_attempts=5)
    for base, other in {B: C, C: B}.items():
        redirect = _problem(421, "NOT_LEADER_OR_FOLLOWER", leader_id=9, leader_url=other)
        fake.script[base] = [_answer(redirect)] * 100
    assert _produce(router, idempotent=True).status_code == 421
    assert len(fake.sends()) == 5 and len(sleeps) >= 3


def test_one_broker_is_used_at_the_url_given() -> None:
    fake = FakeCluster(clustered=False)  # advertises IDS, but is not a cluster
    router, _ = _router(fake, warm=False)
    assert _produce(router, idempotent=False).status_code == 200
    assert fake.sends() == [(A, None)]
    assert router.request("GET", "/v1/topics", idempotent=True).status_code == 200


def test_non_partition_requests_go_to_a_live_broker() -> None:
    fake = FakeCluster(leader=2)
    fake.down.add(A)
    router, _ = _router(fake, f"{A},{B}", warm=False)
    r = router.request("GET", "/v1/topics", idempotent=True)
    assert r.status_code == 200 and fake.log[-1][0] == B and fake.log[-1][2] is None


def test_bootstrap_lists() -> None:
    assert parse_bootstrap(" http://a:1/, http://b:2,,http://a:1") == ["http://a:1", "http://b:2"]
    assert parse_bootstrap(["http://a:1,http://b:2", "https://c"]) == [
        "http://a:1",
        "http://b:2",
        "https://c",
    ]
    for bad in ("", " , ", "a:1", "http://a:1,ftp://b", "http://"):
        with pytest.raises(ValueError):
            parse_bootstrap(bad)


def test_judge_reads_the_problem_body() -> None:
    body = json.dumps({"leader_id": 3, "leader_url": "http://c:3/"}).encode()
    assert judge(421, body) == (Verdict.REDIRECT, "http://c:3")
    assert judge(421, b"not json") == (Verdict.MAYBE, None)
    assert judge(200, b"") == (Verdict.DONE, None)
    assert judge(502, b"<html>") == (Verdict.MAYBE, None)


def test_async_router_redirects_and_fails_over() -> None:
    fake = FakeCluster(leader=2)

    async def handler(request: httpx.Request) -> httpx.Response:
        return fake.handle(request)

    async def run() -> None:
        async with AsyncRouter(
            f"{A},{B}", transport=httpx.MockTransport(handler), backoff_s=0.001
        ) as router:
            r = await router.request("GET", PRODUCE, partition=("t", 0), idempotent=True)
            assert r.status_code == 200
            fake.leader = 3
            r = await router.request("GET", PRODUCE, partition=("t", 0), idempotent=True)
            assert r.status_code == 200
            fake.down.add(C)
            fake.leader = 1
            r = await router.request("GET", PRODUCE, partition=("t", 0), idempotent=True)
            assert r.status_code == 200

    asyncio.run(run())
    assert fake.sends() == [
        (A, "direct"),  # the bootstrap broker names the leader (421)
        (B, "direct"),
        (B, "direct"),  # the leader moved
        (C, "direct"),
        (C, "direct"),  # the leader died: ask the bootstrap broker, which leads now
        (A, "direct"),
    ]


def test_a_producer_session_resends_the_same_sequence_and_moves_on_after_success() -> None:
    from logbus_client.producer import ProducerSession

    fake = FakeCluster(leader=2)
    seen: list[tuple[str, str | None]] = []
    handle = fake.handle

    def producers(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/v1/producers":
            return httpx.Response(201, json={"producer_id": 12, "producer_epoch": 3})
        if request.url.path == PRODUCE:
            seen.append((request.headers["logbus-producer-id"], request.headers["logbus-sequence"]))
        return handle(request)

    fake.handle = producers  # type: ignore[method-assign]
    router, _ = _router(fake, warm=False)
    session = ProducerSession(router, "t")
    assert session.init().status_code == 201
    fake.script[B] = [_answer(_problem(503, "NETWORK_EXCEPTION"))]  # may have been written
    assert session.send(0, b'{"value":1}\n{"value":2}\n', 2).status_code == 200
    assert session.send(0, b'{"value":3}\n', 1).status_code == 200
    # A (421 naming B), B (503, maybe written), B again with the same sequence, then the next.
    assert seen == [("12", "0"), ("12", "0"), ("12", "0"), ("12", "2")]


def test_leader_url_waits_for_an_election() -> None:
    fake = FakeCluster(leader=-1)
    handle = fake.handle
    listings = []

    def elect(request: httpx.Request) -> httpx.Response:
        if request.url.path.endswith("/partitions"):
            listings.append(1)
            if len(listings) == 3:
                fake.leader = 3
        return handle(request)

    fake.handle = elect  # type: ignore[method-assign]
    router, sleeps = _router(fake, warm=False)
    assert router.leader_url("t", 0) == C
    assert len(sleeps) == 2
    single, _ = _router(FakeCluster(clustered=False), warm=False)
    assert single.leader_url("t", 0) is None


def test_the_api_key_goes_with_every_request_to_every_broker() -> None:
    """Metadata, the first hop, the followed redirect and a producer session's init all carry
    it (sync and async routers)."""
    from logbus_client.producer import ProducerSession

    key = "lbk.0123456789abcdef.secret"
    seen: list[tuple[str, str | None]] = []

    def handle(fake: FakeCluster, request: httpx.Request) -> httpx.Response:
        seen.append((request.url.path, request.headers.get("authorization")))
        if request.url.path == "/v1/producers":  # answered at once (a 421 would be retried)
            return httpx.Response(201, json={"producer_id": 7, "producer_epoch": 0})
        return fake.handle(request)

    fake = FakeCluster(leader=3)
    router = Router(A, api_key=key, transport=httpx.MockTransport(lambda r: handle(fake, r)))
    assert _produce(router, idempotent=False).status_code == 200
    assert ProducerSession(router, "t").init().status_code == 201
    assert [b for b, _ in fake.sends()] == [A, C]  # a redirect was followed
    assert {path for path, _ in seen} == {"/v1/cluster", PRODUCE, "/v1/producers"}
    assert {auth for _, auth in seen} == {f"Bearer {key}"}
    assert key not in repr(router.http.headers)

    async def run_async() -> None:
        fake2 = FakeCluster(leader=2)
        transport = httpx.MockTransport(lambda r: handle(fake2, r))
        async with AsyncRouter(A, api_key=key, transport=transport) as ar:
            r = await ar.request("GET", PRODUCE, partition=("t", 0), idempotent=True)
            assert r.status_code == 200

    seen.clear()
    asyncio.run(run_async())
    assert len(seen) >= 3 and {auth for _, auth in seen} == {f"Bearer {key}"}
    with pytest.raises(ValueError, match="visible ASCII"):
        Router(A, api_key="two\nlines")
