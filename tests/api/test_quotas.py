"""Client quotas wired into the broker (api/quota_state.py, api/quota_gate.py, /v1/quotas).

In-process apps (httpx's ASGI transport): the routes, precedence through the wiring, the
response fields, a change made in the store reaching the broker through its watcher, the
KIP-599 mutation quota, and the bounds on sensors. The real-time flood test is in
tests/api/test_quota_flood.py.
"""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import Callable, Coroutine
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import httpx
import pytest

from api import quota_state
from api.quota_state import ANONYMOUS, QuotaState, client_id, quota_user
from auth_quotas.quotas import QuotaConfig, QuotaType
from cluster.security_store import QuotaRow
from core_log.errors import LogbusError
from tests.api.inprocess import app_client

P = "producer_byte_rate"
C = "consumer_byte_rate"
POLICY = re.compile(r'^"(producer|consumer)_byte_rate";q=\d+;qu="content-bytes";w=\d+$')
RATELIMIT = re.compile(r'^"(producer|consumer)_byte_rate";r=\d+;t=\d+$')
# Delays are capped low so a throttled request in these tests waits at most this long.
FAST = {"quota_max_throttle_ms": 300, "loop_lag_interval_ms": 0}


def synchronous(test: Callable[[Path], Coroutine[Any, Any, None]]) -> Callable[[Path], None]:
    """A test run with ``asyncio.run`` (the suite has no async plugin)."""

    def run(tmp_path: Path) -> None:
        asyncio.run(test(tmp_path))

    run.__name__ = test.__name__
    return run


async def _produce(c: httpx.AsyncClient, topic: str, size: int, cid: str | None) -> httpx.Response:
    headers = {"Logbus-Client-Id": cid} if cid else {}
    body = {"records": [{"value": "x" * size}]}
    return await c.post(f"/v1/topics/{topic}/records", json=body, headers=headers)


def _limit(r: httpx.Response) -> int | None:
    """The quota a RateLimit-Policy field names, per second (q is per w seconds)."""
    policy = r.headers.get("ratelimit-policy")
    if policy is None:
        return None
    q = int(re.search(r";q=(\d+)", policy)[1])  # type: ignore[index]
    w = int(re.search(r";w=(\d+)", policy)[1])  # type: ignore[index]
    return q // w


@synchronous
async def test_routes_round_trip_and_refuse_bad_input(tmp_path: Path) -> None:
    async with app_client(tmp_path / "d", **FAST) as (c, _):
        r = await c.put("/v1/quotas", json={"entity": {"user": "alice"}, "quotas": {P: 1048576}})
        assert r.status_code == 200
        assert r.json()["quotas"] == [{"entity": {"user": "alice"}, "quotas": {P: 1048576.0}}]
        body = {"entity": {"user": None, "client_id": "<default>"}, "quotas": {C: 5, P: 7}}
        assert (await c.put("/v1/quotas", json=body)).status_code == 200
        listed = (await c.get("/v1/quotas")).json()["quotas"]
        assert {
            "entity": {"user": "<default>", "client_id": "<default>"},
            "quotas": {C: 5.0, P: 7.0},
        } in listed
        assert len(listed) == 2
        only = (await c.get("/v1/quotas", params={"user": "alice"})).json()["quotas"]
        assert [e["entity"] for e in only] == [{"user": "alice"}]
        bad: list[Any] = [
            {"entity": {}, "quotas": {P: 1}},
            {"entity": {"user": ""}, "quotas": {P: 1}},
            {"entity": {"group": "x"}, "quotas": {P: 1}},
            {"entity": {"user": "a" * 256}, "quotas": {P: 1}},
            {"entity": {"client_id": "bad id!"}, "quotas": {P: 1}},  # no client could send it
            {"entity": {"client_id": "é"}, "quotas": {P: 1}},
            {"entity": {"user": "a"}, "quotas": {"bogus": 1}},
            {"entity": {"user": "a"}, "quotas": {P: -1}},
            {"entity": {"user": "a"}, "quotas": {P: "fast"}},
            {"entity": {"user": "a"}, "quotas": {P: True}},
            {"entity": {"user": "a"}, "quotas": {}},
            {"entity": {"user": "a"}},
            [1, 2],
        ]
        for doc in bad:
            r = await c.put("/v1/quotas", json=doc)
            assert r.status_code == 400, (doc, r.text)
        assert (await c.delete("/v1/quotas")).status_code == 400  # no entity
        r = await c.delete("/v1/quotas", params={"user": "alice", "quota": "bogus"})
        assert r.status_code == 400
        r = await c.delete(
            "/v1/quotas", params={"user": "<default>", "client_id": "<default>", "quota": C}
        )
        assert r.status_code == 204
        listed = (await c.get("/v1/quotas", params={"client_id": "<default>"})).json()["quotas"]
        assert listed == [
            {"entity": {"user": "<default>", "client_id": "<default>"}, "quotas": {P: 7.0}}
        ]
        assert (await c.delete("/v1/quotas", params={"user": "alice"})).status_code == 204
        assert len((await c.get("/v1/quotas")).json()["quotas"]) == 1


# (configured entities, client id sent, the producer quota that applies) for ANONYMOUS:
# Kafka's precedence, user levels before client-id-only levels.
PRECEDENCE = [
    ([({"client_id": "<default>"}, 1000)], "a", 1000),
    ([({"client_id": "<default>"}, 1000), ({"client_id": "a"}, 2000)], "a", 2000),
    ([({"client_id": "a"}, 2000), ({"user": "<default>"}, 3000)], "a", 3000),
    ([({"user": "<default>"}, 3000), ({"user": "<default>", "client_id": "a"}, 4000)], "a", 4000),
    ([({"user": "<default>"}, 3000), ({"user": ANONYMOUS}, 5000)], "a", 5000),
    (
        [({"user": ANONYMOUS}, 5000), ({"user": ANONYMOUS, "client_id": "<default>"}, 6000)],
        "b",
        6000,
    ),
    (
        [
            ({"user": ANONYMOUS, "client_id": "<default>"}, 6000),
            ({"user": ANONYMOUS, "client_id": "a"}, 7000),
        ],
        "a",
        7000,
    ),
    ([({"client_id": "a"}, 2000)], "b", None),
    ([({"client_id": "a"}, 2000)], None, None),
    # no client id is "": no level names it, the <default> client levels take it
    ([({"client_id": "<default>"}, 1000)], None, 1000),
    ([({"user": "<default>", "client_id": "<default>"}, 8000)], None, 8000),
    ([({"user": "<default>"}, 3000)], None, 3000),
]


@synchronous
async def test_precedence_through_the_wiring(tmp_path: Path) -> None:
    async with app_client(tmp_path / "d", **FAST) as (c, state):
        assert (await c.post("/v1/topics", json={"name": "t", "partitions": 1})).status_code == 201
        for configured, cid, expected in PRECEDENCE:
            for entity, value in configured:
                r = await c.put("/v1/quotas", json={"entity": entity, "quotas": {P: value}})
                assert r.status_code == 200
            r = await _produce(c, "t", 10, cid)
            assert r.status_code == 200
            assert _limit(r) == expected, (configured, cid)
            for entity, _ in configured:
                params = {k: v for k, v in entity.items()}
                assert (await c.delete("/v1/quotas", params=params)).status_code == 204
        # The user comes from the identity the authentication layer sets, else ANONYMOUS.
        assert quota_user({"logbus.identity": SimpleNamespace(user="alice")}) == "alice"
        assert quota_user({}) == ANONYMOUS
        state.quotas.apply([QuotaRow("alice", None, P, 9000.0)])
        res = state.quotas.resolve(QuotaType.PRODUCER_BYTE_RATE, "alice", "x")
        assert res is not None and res.limit == 9000.0 and res.level == 3


def test_client_ids_are_checked() -> None:
    def scope(headers: list[tuple[bytes, bytes]], query: bytes = b"") -> dict[str, Any]:
        return {"headers": headers, "query_string": query}

    assert client_id(scope([(b"logbus-client-id", b"app-1.x_y")]), query_too=False) == "app-1.x_y"
    assert client_id(scope([], b"client_id=web"), query_too=True) == "web"
    assert client_id(scope([], b"client_id=web"), query_too=False) == ""
    for bad in (b"", b"a b", b"x" * 256, "é".encode(), b"a/b"):
        with pytest.raises(LogbusError) as info:
            client_id(scope([(b"logbus-client-id", bad)]), query_too=False)
        assert getattr(info.value, "http_status", None) == 400
    with pytest.raises(LogbusError):
        client_id(scope([], b"client_id=a&client_id=b"), query_too=True)


@synchronous
async def test_bad_client_id_is_400_with_or_without_quotas(tmp_path: Path) -> None:
    async with app_client(tmp_path / "d", **FAST) as (c, _):
        await c.post("/v1/topics", json={"name": "t", "partitions": 1})
        for _ in range(2):
            r = await _produce(c, "t", 1, "not ok!")
            assert r.status_code == 400 and r.json()["code"] == "INVALID_REQUEST"
            r = await c.get("/v1/topics", headers={"Logbus-Client-Id": "x" * 300})
            assert r.status_code == 400
            await c.put("/v1/quotas", json={"entity": {"client_id": "<default>"}, "quotas": {P: 1}})


@synchronous
async def test_valid_client_ids_are_remembered_within_their_bound(tmp_path: Path) -> None:
    """client_id checks a Logbus-Client-Id once and remembers it (at most
    CLIENT_ID_CACHE_ENTRIES); an invalid one is never remembered, so it is refused every
    time, and two of them are refused even when each alone is known."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(quota_state, "CLIENT_ID_CACHE_ENTRIES", 8)
        mp.setattr(quota_state, "_VALID_CLIENT_IDS", set())
        await _client_ids_remembered(tmp_path)


async def _client_ids_remembered(tmp_path: Path) -> None:
    async with app_client(tmp_path / "d", **FAST) as (c, _):
        await c.post("/v1/topics", json={"name": "t", "partitions": 1})
        for i in range(20):
            assert (await _produce(c, "t", 1, f"c-{i}")).status_code == 200
            assert 0 < len(quota_state._VALID_CLIENT_IDS) <= 8
        assert "c-19" in quota_state._VALID_CLIENT_IDS
        for _ in range(2):
            assert (await _produce(c, "t", 1, "c-19")).status_code == 200  # remembered
            assert (await _produce(c, "t", 1, "not ok!")).status_code == 400
            assert "not ok!" not in quota_state._VALID_CLIENT_IDS
        twice = [("Logbus-Client-Id", "c-19"), ("Logbus-Client-Id", "c-19")]
        r = await c.post("/v1/topics/t/records", json={"records": [{"value": 1}]}, headers=twice)
        assert r.status_code == 400 and "sent twice" in r.json()["detail"]


@synchronous
async def test_throttle_fields_are_well_formed_and_delay_is_bounded(tmp_path: Path) -> None:
    async with app_client(tmp_path / "d", **FAST) as (c, state):
        await c.post("/v1/topics", json={"name": "t", "partitions": 1})
        r = await _produce(c, "t", 100, "p")
        assert "logbus-throttle-time-ms" not in r.headers  # no quota: nothing measured
        await c.put("/v1/quotas", json={"entity": {"client_id": "p"}, "quotas": {P: 1000, C: 1000}})
        r = await _produce(c, "t", 100, "p")
        assert r.headers["logbus-throttle-time-ms"] == "0" and "retry-after" not in r.headers
        assert POLICY.match(r.headers["ratelimit-policy"]), r.headers["ratelimit-policy"]
        assert RATELIMIT.match(r.headers["ratelimit"]), r.headers["ratelimit"]
        assert _limit(r) == 1000
        r = await _produce(c, "t", 50_000, "p")  # 50 KB against 1000 B/s * 10 s: over
        throttle = int(r.headers["logbus-throttle-time-ms"])
        assert throttle == 300  # the configured cap
        assert r.headers["retry-after"] == "1"
        assert re.fullmatch(r'"producer_byte_rate";r=0;t=1', r.headers["ratelimit"])
        started = time.monotonic()
        r = await _produce(c, "t", 10, "p")  # held by what it owes, at most the cap
        assert time.monotonic() - started >= 0.25
        assert r.status_code == 200
        # A fetch over quota: held, and never asked for more than one window's worth.
        r = await c.get(
            "/v1/topics/t/partitions/0/records",
            params={"offset": 2, "max_bytes": 10_000_000},
            headers={"Logbus-Client-Id": "p"},
        )
        # max_bytes lowered to 1 s of quota (1 KB): the one 50 KB record (at least one is
        # always answered), not the rest of the partition
        assert r.status_code == 200 and len(r.json()["records"]) == 1
        assert r.headers["ratelimit-policy"].startswith('"consumer_byte_rate";q=10000;')
        assert int(r.headers["logbus-throttle-time-ms"]) > 0, (len(r.content), r.headers)
        metrics = (await c.get("/metrics")).text
        line = re.search(
            r'logbus_quota_throttle_time_ms_total\{client_id="p",quota_type="producer_byte_rate",'
            r'user=""\} ([0-9.e+]+)',
            metrics,
        )
        assert line is not None and float(line[1]) >= 300
        assert (
            'logbus_quota_limit{client_id="p",quota_type="consumer_byte_rate",user=""} 1000.0'
            in metrics
        )
        assert len(state.quotas) >= 2


@synchronous
async def test_a_produce_is_charged_the_body_it_sent(tmp_path: Path) -> None:
    """Declared (Content-Length): that many bytes; chunked: what was read; refused as too
    large (413, never read): nothing. A request-time quota alone measures no bytes."""
    async with app_client(tmp_path / "d", max_request_bytes=10_000, **FAST) as (c, state):
        await c.post("/v1/topics", json={"name": "t", "partitions": 1})
        await c.put("/v1/quotas", json={"entity": {"client_id": "p"}, "quotas": {P: 1e9}})

        def charged() -> float:
            now = state.quotas.clock()
            return sum(
                sensor.rate.total(now)
                for (quota_type, _), sensor in state.quotas.sensors.recent(100)
                if quota_type is QuotaType.PRODUCER_BYTE_RATE
            )

        headers = {"Logbus-Client-Id": "p", "Content-Type": "application/json"}
        body = b'{"records": [{"value": "' + b"x" * 100 + b'"}]}'
        r = await c.post("/v1/topics/t/records", content=body, headers=headers)
        assert r.status_code == 200 and r.headers["logbus-throttle-time-ms"] == "0"
        assert charged() == len(body)

        async def chunks() -> Any:
            yield body[:50]
            yield body[50:]

        r = await c.post("/v1/topics/t/records", content=chunks(), headers=headers)
        assert r.request.headers.get("transfer-encoding") == "chunked"
        assert r.status_code == 200 and charged() == 2 * len(body)
        big = b'{"records": [{"value": "' + b"x" * 10_000 + b'"}]}'
        r = await c.post("/v1/topics/t/records", content=big, headers=headers)
        assert r.status_code == 413 and r.headers["logbus-throttle-time-ms"] == "0"
        assert charged() == 2 * len(body)
        exact = b'{"records": [{"value": "' + b"y" * (10_000 - len(body) + 100) + b'"}]}'
        assert len(exact) == 10_000  # at the limit: accepted, and charged
        r = await c.post("/v1/topics/t/records", content=exact, headers=headers)
        assert r.status_code == 200 and charged() == 2 * len(body) + 10_000


@synchronous
async def test_a_change_in_the_store_applies_without_restart(tmp_path: Path) -> None:
    """As another broker or the CLI would: write the store; this broker's watcher picks it up."""
    async with app_client(tmp_path / "d", **FAST) as (c, state):
        await c.post("/v1/topics", json={"name": "t", "partitions": 1})
        store = state.broker.store.security

        async def limit_seen() -> int | None:
            return _limit(await _produce(c, "t", 1, "app"))

        async def eventually(expected: int | None) -> None:
            deadline = time.monotonic() + 10
            while (seen := await limit_seen()) != expected:
                assert time.monotonic() < deadline, (seen, expected)
                await asyncio.sleep(0.05)

        assert await limit_seen() is None
        await asyncio.to_thread(store.set_quotas, None, "app", {P: 4096})
        await eventually(4096)
        await asyncio.to_thread(store.set_quotas, None, "app", {P: 8192})
        await eventually(8192)
        await asyncio.to_thread(store.delete_quotas, None, "app", None)
        await eventually(None)


@synchronous
async def test_mutation_quota_refuses_with_429(tmp_path: Path) -> None:
    async with app_client(tmp_path / "d", **FAST) as (c, state):
        # 0.5 partitions/s: a burst of 0.5 * 11 = 5.5 partitions, then refusals.
        body = {"entity": {"user": ANONYMOUS}, "quotas": {"controller_mutation_rate": 0.5}}
        assert (await c.put("/v1/quotas", json=body)).status_code == 200
        assert (await c.post("/v1/topics", json={"name": "a", "partitions": 4})).status_code == 201
        # 1.5 tokens left: accepted, and it may take the bucket negative (never starved)
        r = await c.post("/v1/topics/a/partitions", json={"count": 8})
        assert r.status_code == 200, r.text
        r = await c.post("/v1/topics", json={"name": "b", "partitions": 1})
        assert r.status_code == 429
        assert r.json()["code"] == "THROTTLING_QUOTA_EXCEEDED" and r.json()["retriable"] is True
        throttle = int(r.headers["logbus-throttle-time-ms"])
        assert 4000 <= throttle <= 5000  # -2.5 tokens at 0.5/s
        assert int(r.headers["retry-after"]) == -(-throttle // 1000)
        assert (await c.delete("/v1/topics/a")).status_code == 429
        assert (await c.get("/v1/topics/b")).status_code == 404  # refused: nothing changed
        # Another client id is the same ANONYMOUS user: the same bucket.
        r = await c.post("/v1/topics", json={"name": "b"}, headers={"Logbus-Client-Id": "x"})
        assert r.status_code == 429
        # Time refills the bucket (injected clock): 5 s later it is positive again.
        now = state.quotas.clock()
        state.quotas.clock = lambda: now + 5_500
        assert (await c.post("/v1/topics", json={"name": "b", "partitions": 1})).status_code == 201


@synchronous
async def test_a_flood_of_client_ids_costs_bounded_memory(tmp_path: Path) -> None:
    async with app_client(tmp_path / "d", quota_max_sensors=50, **FAST) as (c, state):
        await c.post("/v1/topics", json={"name": "t", "partitions": 1})
        body = {
            "entity": {"client_id": "<default>"},
            "quotas": {P: 1e9, "request_percentage": 1000},
        }
        await c.put("/v1/quotas", json=body)
        for i in range(300):
            r = await _produce(c, "t", 1, f"client-{i}")
            assert r.status_code == 200
            assert len(state.quotas) <= 50
            assert len(state.quotas._meters) <= 50  # the per-caller memo is bounded too
        assert len(state.quotas) == 50
        metrics = (await c.get("/metrics")).text
        assert metrics.count("logbus_quota_rate{") == 50
        assert 'client_id="client-299"' in metrics and 'client_id="client-0"' not in metrics
        # Callers no quota applies to are remembered too (as "none applies"): bounded alike.
        await c.put("/v1/quotas", json={"entity": {"client_id": "someone"}, "quotas": {P: 1e9}})
        await c.delete("/v1/quotas", params={"client_id": "<default>"})
        for _ in range(1000):  # the security poll applies the change (FAST: within ~0.1 s)
            if len(state.quotas.table) == 1:
                break
            await asyncio.sleep(0.01)
        assert len(state.quotas.table) == 1
        for i in range(300):
            assert (await _produce(c, "t", 1, f"free-{i}")).status_code == 200
            assert len(state.quotas._meters) <= 50


def test_sensors_and_buckets_expire_when_idle() -> None:
    now = [0]
    quotas = QuotaState(QuotaConfig(), clock=lambda: now[0], max_sensors=100)
    quotas.apply(
        [
            QuotaRow(None, "<default>", P, 100.0),
            QuotaRow(None, "<default>", "controller_mutation_rate", 1.0),
        ]
    )
    res_a = quotas.resolve(QuotaType.PRODUCER_BYTE_RATE, ANONYMOUS, "a")
    assert res_a is not None
    quotas.record(QuotaType.PRODUCER_BYTE_RATE, res_a, 10)
    quotas.mutation_done(ANONYMOUS, "a", 1)
    assert len(quotas) == 1 and len(quotas._buckets) == 1
    now[0] = 3_600_001  # Kafka's one-hour inactivity
    res_b = quotas.resolve(QuotaType.PRODUCER_BYTE_RATE, ANONYMOUS, "b")
    assert res_b is not None
    quotas.record(QuotaType.PRODUCER_BYTE_RATE, res_b, 10)
    quotas.mutation_done(ANONYMOUS, "b", 1)
    assert len(quotas) == 1 and len(quotas._buckets) == 1
    assert [e.client_id for e in quotas.stats()] == ["b"]
    # A quota type this version does not know (a newer broker stored it) is skipped.
    quotas.apply([QuotaRow(None, "a", "future_rate", 1.0)])
    assert not quotas.active


def test_meters_follow_the_table_and_the_sensors() -> None:
    """A caller's Meter is resolved once per table: a quota change gives a new one (a raised
    quota frees a throttled caller at once); a dropped sensor is never measured into."""
    now = [0]
    quotas = QuotaState(QuotaConfig(), clock=lambda: now[0], max_sensors=2)
    quotas.apply([QuotaRow(None, "c", P, 100.0)])
    meter = quotas.meter(ANONYMOUS, "c", QuotaType.PRODUCER_BYTE_RATE)
    assert meter is not None and meter.byte_limit == 100.0 and meter.time_sensor is None
    assert quotas.meter(ANONYMOUS, "c", QuotaType.PRODUCER_BYTE_RATE) is meter
    assert quotas.meter(ANONYMOUS, "other", QuotaType.PRODUCER_BYTE_RATE) is None
    fields = dict(quotas.charge(meter, 1000, 0))
    assert fields[b"logbus-throttle-time-ms"] == b"9000"  # (1000 - 100) / 100 x 1 s
    assert quotas.owed(meter) == 9000
    quotas.apply([QuotaRow(None, "c", P, 10_000.0)])
    raised = quotas.meter(ANONYMOUS, "c", QuotaType.PRODUCER_BYTE_RATE)
    assert raised is not None and raised is not meter and raised.byte_limit == 10_000.0
    assert quotas.owed(raised) == 0
    # Two more callers with their own (default) sensors push the first one out.
    quotas.apply([QuotaRow(None, "<default>", P, 10_000.0)])
    first = quotas.meter(ANONYMOUS, "c", QuotaType.PRODUCER_BYTE_RATE)
    assert first is not None
    for client in ("d", "e"):
        now[0] += 1
        assert quotas.meter(ANONYMOUS, client, QuotaType.PRODUCER_BYTE_RATE) is not None
    again = quotas.meter(ANONYMOUS, "c", QuotaType.PRODUCER_BYTE_RATE)
    assert again is not None and again is not first
    quotas.charge(again, 1, 0)
    assert next(e.client_id for e in quotas.stats()) == "c"  # measured in the live sensor


def test_an_answer_is_recorded_when_it_starts_not_when_the_request_came() -> None:
    """An acks=all produce may wait many sample windows: its bytes count at the time of its
    answer, so a later window holds them and the rate is not read backwards in time."""
    from api import quota_gate

    now = [1_000]
    quotas = QuotaState(QuotaConfig(), clock=lambda: now[0])
    quotas.apply([QuotaRow(None, "c", P, 100.0)])
    body = b"x" * 50
    sent: list[dict[str, Any]] = []

    async def app(scope: Any, receive: Any, send: Any) -> None:
        await receive()
        now[0] += 30_000  # the wait for the replicas
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"{}"})

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": body, "more_body": False}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    scope = {
        "type": "http",
        "method": "POST",
        "path": "/v1/topics/t/records",
        "query_string": b"",
        "headers": [(b"content-length", b"50"), (b"logbus-client-id", b"c")],
    }
    asyncio.run(quota_gate.serve(quotas, scope, receive, send, app))  # type: ignore[arg-type]
    fields = dict(sent[0]["headers"])
    assert fields[b"logbus-throttle-time-ms"] == b"0"
    ((key, sensor),) = quotas.sensors.recent(1)
    assert key == (QuotaType.PRODUCER_BYTE_RATE, ("", "c"))
    assert sensor.rate.head is not None and sensor.rate.head.last_ms == 31_000
    assert sensor.rate.total(31_000) == 50
    # Recorded at the answer's time: 10 s later the 50 bytes are still in the window (the
    # 11 windows of 1 s); had they been recorded when the request came, they would have
    # expired at 12 s, before the answer was even sent.
    assert sensor.rate.total(41_000) == 50
    assert sensor.rate.total(42_000) == 0
