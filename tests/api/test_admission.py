"""Remembered admissions (api/admission.py) against the long way, through the front door itself.

Two :class:`api.fastpath.FastPath` doors over twin state (the same snapshots, quotas and
clocks): one remembers admissions, the other always takes the long way (access, then the quota
gate's whole decision). Every request must be answered the same by both, with the same
identity handed on and the same quota fields, across key revocations, ACL changes, quota
changes, dropped sensors and credentials past their TTL. Then the specific promises: a repeat
takes one lookup, what is never remembered, and the bound.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from api import admission
from api.access import IDENTITY_KEY
from api.admission import Admissions, Admitted
from api.budgets import Budgets
from api.fastpath import FastPath
from api.quota_state import QuotaState
from api.security import Security
from api.settings import Settings
from auth_quotas.limits import VERIFIED_KEY_CACHE_TTL_MS
from auth_quotas.quotas import QuotaConfig
from cluster.security_store import AclRow, QuotaRow
from tests.api.test_access_admit import _ACLS, _HASHER, ALICE, BOB, _basic, _snapshot

# A throttle waits at most 1 ms here (the doors run on a real event loop).
_CONFIG = QuotaConfig(11, 1000, 1)
QUOTAS: list[tuple[QuotaRow, ...]] = [
    (),
    (QuotaRow("alice", "c", "producer_byte_rate", 300.0),),
    (
        QuotaRow("alice", None, "producer_byte_rate", 5_000.0),
        QuotaRow("alice", None, "request_percentage", 1e6),  # never throttles: deterministic
    ),
    (
        QuotaRow(None, "c", "producer_byte_rate", 200.0),
        QuotaRow("<default>", None, "consumer_byte_rate", 50.0),
    ),
    (QuotaRow(None, "<default>", "producer_byte_rate", 250.0),),  # a sensor per client id
    (QuotaRow("<default>", None, "producer_byte_rate", 400.0),),  # a sensor per user
]
ACL_SETS = [
    _ACLS,
    _ACLS[1:],
    (*_ACLS, AclRow("User:bob", "topic", "t-", "prefixed", "write", "allow")),
]


class _App:
    """What the front door hands a request on to: it reads the body and answers ``{}``."""

    def __init__(self) -> None:
        self.seen: list[str | None] = []

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        more = True
        while more:
            message = await receive()
            more = message.get("more_body", False)
        identity = scope.get(IDENTITY_KEY)
        self.seen.append(None if identity is None else identity.user)
        fields = [(b"content-type", b"application/json"), (b"content-length", b"2")]
        await send({"type": "http.response.start", "status": 200, "headers": fields})
        await send({"type": "http.response.body", "body": b"{}"})


class _Forgetful(Admissions):
    """Remembers nothing: every request takes the long way."""

    def find(self, scope: Any, security: Any, quotas: Any) -> Admitted | None:
        return None

    def learn(self, scope: Any, security: Any, quotas: Any) -> None:
        return None


class _Spied(Admissions):
    """Remembers, and keeps each admission found."""

    __slots__ = ("hits",)

    def __init__(self, hits: list[Admitted]) -> None:
        super().__init__()
        self.hits = hits

    def find(self, scope: Any, security: Any, quotas: QuotaState) -> Admitted | None:
        hit = super().find(scope, security, quotas)
        if hit is not None:
            self.hits.append(hit)
        return hit


@dataclass
class _Door:
    door: FastPath
    app: _App
    security: Security
    quotas: QuotaState
    hits: list[Admitted] = field(default_factory=list)


def _door(tmp_path: Path, clock: list[int], remembers: bool, max_sensors: int = 10_000) -> _Door:
    settings = Settings(data_dir=tmp_path, auth=True, fast_path=False)
    app = _App()
    door = FastPath(app, settings, Budgets.from_settings(settings))
    security = Security(settings, hasher_factory=lambda: _HASHER, now_ms=lambda: clock[0])
    security.apply(_snapshot(1))
    quotas = QuotaState(_CONFIG, clock=lambda: clock[0], max_sensors=max_sensors)
    door.access.security = security
    state: Any = _State(settings, quotas, security)
    door.state = state
    made = _Door(door, app, security, quotas)
    door.admissions = _Spied(made.hits) if remembers else _Forgetful()
    return made


@dataclass
class _State:
    settings: Settings
    quotas: QuotaState
    security: Security
    proxy: None = None

    def partition_count(self, topic: str) -> int:
        return 0


def _request(
    runner: asyncio.Runner,
    door: _Door,
    method: str,
    path: str,
    headers: list[tuple[bytes, bytes]],
    body: bytes,
) -> list[dict[str, Any]]:
    """The messages the door sent for one request."""
    scope = {
        "type": "http",
        "method": method,
        "path": path,
        "query_string": b"",
        "headers": list(headers),
    }
    sent: list[dict[str, Any]] = []
    chunks = iter([body])

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": next(chunks, b""), "more_body": False}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    runner.run(door.door(scope, receive, send))
    return sent


def _answer(sent: list[dict[str, Any]]) -> tuple[int, list[tuple[bytes, bytes]], bytes]:
    start = sent[0]
    return (
        start["status"],
        list(start.get("headers", [])),
        b"".join(m.get("body", b"") for m in sent[1:]),
    )


AUTHORIZATIONS = [
    f"Bearer {ALICE.token}".encode(),
    f"Bearer {BOB.token}".encode(),
    _basic("alice", ALICE.token),
    b"Bearer not-a-key",
    None,
]
CLIENT_IDS: list[list[bytes]] = [[], [b"c"], [b"d"], [b"not a client id"], [b"c", b"c"]]
EXTRAS: list[list[tuple[bytes, bytes]]] = [
    [],
    [(b"accept", b"text/event-stream")],
    [(b"accept", b"*/*")],
    [(b"logbus-forwarded-by", b"2")],
    [(b"logbus-principal", b"User:admin")],
]
TARGETS = [
    ("POST", "/v1/topics/t-a/records"),
    ("POST", "/v1/topics/t-b/partitions/0/records"),
    ("POST", "/v1/topics/t-secret/records"),
    ("GET", "/v1/topics/t-a"),
    ("GET", "/v1/topics/t-a/partitions/0/records"),
    ("POST", "/v1/groups/g/offsets"),
]
# A few requests per example, sent again and again (a repeat is what is remembered).
_shapes = st.lists(
    st.one_of(
        st.tuples(  # anything
            st.sampled_from(TARGETS),
            st.sampled_from(AUTHORIZATIONS),
            st.sampled_from(CLIENT_IDS),
            st.sampled_from(EXTRAS),
        ),
        st.tuples(  # what is admitted and may be remembered
            st.sampled_from(TARGETS[:2]),
            st.sampled_from(AUTHORIZATIONS[:3]),
            st.sampled_from(CLIENT_IDS[:3]),
            st.sampled_from(EXTRAS[:1] + EXTRAS[2:3]),
        ),
    ),
    min_size=1,
    max_size=3,
)
_events = st.lists(
    st.one_of(
        st.tuples(st.just("none")),
        st.tuples(st.just("advance"), st.sampled_from([1, 700, 5_000, VERIFIED_KEY_CACHE_TTL_MS])),
        st.tuples(st.just("keys"), st.sampled_from([("alice", "bob"), ("bob",), ("alice",)])),
        st.tuples(st.just("acls"), st.integers(0, len(ACL_SETS) - 1)),
        st.tuples(st.just("quotas"), st.integers(0, len(QUOTAS) - 1)),
    ),
    min_size=1,
    max_size=12,
)
_bodies = st.lists(st.tuples(st.integers(0, 400), st.booleans()), min_size=1, max_size=4)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    shapes=_shapes,
    events=_events,
    bodies=_bodies,
    repeats=st.integers(1, 2),
    max_sensors=st.sampled_from([1, 10_000]),
)
def test_remembered_admissions_answer_as_the_long_way(
    tmp_path_factory: Any,
    shapes: list[tuple[Any, ...]],
    events: list[tuple[Any, ...]],
    bodies: list[tuple[int, bool]],
    repeats: int,
    max_sensors: int,
) -> None:
    """After each event (a clock advance, a snapshot, a quota table), every request of the
    example is sent ``repeats`` times to both doors (body size and whether it is declared
    taken in turn from ``bodies``)."""
    clock = [1_000_000]
    fast = _door(tmp_path_factory.mktemp("fast"), clock, True, max_sensors)
    slow = _door(tmp_path_factory.mktemp("slow"), clock, False, max_sensors)
    version = itertools.count(2)
    keys: tuple[str, ...] = ("alice", "bob")
    acls = ACL_SETS[0]
    sizes = itertools.cycle(bodies)
    with asyncio.Runner() as runner:
        for event in events:
            if event[0] == "advance":
                clock[0] += event[1]
            elif event[0] in ("keys", "acls"):
                if event[0] == "keys":
                    keys = event[1]
                else:
                    acls = ACL_SETS[event[1]]
                snapshot = _snapshot(next(version), keys=keys, acls=acls)
                fast.security.apply(snapshot)
                slow.security.apply(snapshot)
            elif event[0] == "quotas":
                fast.quotas.apply(QUOTAS[event[1]])
                slow.quotas.apply(QUOTAS[event[1]])
            for (method, path), authorization, client_ids, extra in shapes * repeats:
                size, declared = next(sizes)
                body = b"x" * size if method == "POST" else b""
                headers = [(b"host", b"127.0.0.1")]
                if authorization is not None:
                    headers.append((b"authorization", authorization))
                headers += [(b"logbus-client-id", c) for c in client_ids] + extra
                if declared:
                    headers.append((b"content-length", str(len(body)).encode()))
                seen_before = (len(fast.app.seen), len(slow.app.seen))
                a = _answer(_request(runner, fast, method, path, headers, body))
                b = _answer(_request(runner, slow, method, path, headers, body))
                assert a == b, (event, method, path, headers)
                assert fast.app.seen[seen_before[0] :] == slow.app.seen[seen_before[1] :]
    assert len(fast.door.admissions) <= admission.ADMISSIONS_MAX


ALICE_WRITES = (
    "POST",
    "/v1/topics/t-a/records",
    [
        (b"authorization", f"Bearer {ALICE.token}".encode()),
        (b"logbus-client-id", b"c"),
        (b"content-length", b"10"),
    ],
    b"x" * 10,
)


@pytest.fixture
def alice(tmp_path: Path) -> Iterator[tuple[asyncio.Runner, _Door, list[int]]]:
    clock = [1_000_000]
    door = _door(tmp_path, clock, True)
    with asyncio.Runner() as runner:
        yield runner, door, clock


def test_a_repeat_is_admitted_by_one_lookup(alice: tuple[asyncio.Runner, _Door, list[int]]) -> None:
    runner, door, _ = alice
    door.quotas.apply(QUOTAS[1])
    assert _answer(_request(runner, door, *ALICE_WRITES))[0] == 200
    assert len(door.door.admissions) == 1 and not door.hits

    def no_long_way(scope: Any) -> bool:
        raise AssertionError("a remembered request took the long way")

    door.door.access.admit = no_long_way  # type: ignore[method-assign]
    status, fields, _ = _answer(_request(runner, door, *ALICE_WRITES))
    assert status == 200 and len(door.hits) == 1
    assert door.app.seen == ["alice", "alice"]
    assert door.hits[0].meter is not None and door.hits[0].produce
    names = {k for k, _ in fields}
    assert {b"logbus-throttle-time-ms", b"ratelimit-policy", b"ratelimit"} <= names


def test_a_revoked_key_or_a_removed_acl_is_refused_at_once(
    alice: tuple[asyncio.Runner, _Door, list[int]],
) -> None:
    runner, door, _ = alice
    for _ in range(2):
        assert _answer(_request(runner, door, *ALICE_WRITES))[0] == 200
    assert len(door.hits) == 1
    door.security.apply(_snapshot(2, acls=_ACLS[1:]))  # no WRITE on t- any more
    assert _answer(_request(runner, door, *ALICE_WRITES))[0] == 403
    door.security.apply(_snapshot(3))
    assert _answer(_request(runner, door, *ALICE_WRITES))[0] == 200
    assert _answer(_request(runner, door, *ALICE_WRITES))[0] == 200
    door.security.apply(_snapshot(4, keys=("bob",)))  # alice's key revoked
    assert _answer(_request(runner, door, *ALICE_WRITES))[0] == 401
    assert len(door.hits) == 2  # only the request between the changes was remembered


def test_a_verification_past_its_ttl_is_verified_again(
    alice: tuple[asyncio.Runner, _Door, list[int]],
) -> None:
    runner, door, clock = alice
    _request(runner, door, *ALICE_WRITES)
    clock[0] += VERIFIED_KEY_CACHE_TTL_MS - 1
    _request(runner, door, *ALICE_WRITES)
    assert len(door.hits) == 1
    clock[0] += 1
    verified = door.security.verifier.cached
    calls: list[str] = []

    def counted(token: str, now: int) -> Any:
        calls.append(token)
        return verified(token, now)

    door.security.verifier.cached = counted  # type: ignore[method-assign]
    assert _answer(_request(runner, door, *ALICE_WRITES))[0] == 200
    assert len(door.hits) == 1 and set(calls) == {ALICE.token}  # the long way: verified again


def test_a_quota_change_applies_to_the_next_request(
    alice: tuple[asyncio.Runner, _Door, list[int]],
) -> None:
    runner, door, _ = alice
    door.quotas.apply(QUOTAS[1])
    _request(runner, door, *ALICE_WRITES)
    _, fields, _ = _answer(_request(runner, door, *ALICE_WRITES))
    assert b";q=3000;" in dict(fields)[b"ratelimit-policy"]  # 300 B/s over its 10 s policy
    door.quotas.apply(QUOTAS[2])
    _, fields, _ = _answer(_request(runner, door, *ALICE_WRITES))
    assert b";q=50000;" in dict(fields)[b"ratelimit-policy"]
    door.quotas.apply(QUOTAS[0])
    _, fields, _ = _answer(_request(runner, door, *ALICE_WRITES))
    assert b"ratelimit-policy" not in dict(fields)
    assert len(door.hits) == 1  # one repeat under an unchanged table


_KEY = (b"authorization", f"Bearer {ALICE.token}".encode())
_RECORDS = "/v1/topics/t-a/records"


@pytest.mark.parametrize(
    ("case", "method", "path", "headers", "status"),
    [
        ("a bad key", "POST", _RECORDS, [(b"authorization", b"Bearer not-a-key")], 401),
        ("no key", "POST", _RECORDS, [], 401),
        ("a fetch", "GET", "/v1/topics/t-a/partitions/0/records", [_KEY], 200),
        ("client id twice", "POST", _RECORDS, [_KEY, (b"logbus-client-id", b"c")] * 2, 400),
        ("a bad client id", "POST", _RECORDS, [_KEY, (b"logbus-client-id", b"no way")], 400),
        ("an event stream", "POST", _RECORDS, [_KEY, (b"accept", b"Text/Event-Stream")], 200),
        ("a broker's field", "POST", _RECORDS, [_KEY, (b"logbus-principal", b"User:admin")], 200),
    ],
)
def test_what_is_never_remembered(
    alice: tuple[asyncio.Runner, _Door, list[int]],
    case: str,
    method: str,
    path: str,
    headers: list[tuple[bytes, bytes]],
    status: int,
) -> None:
    runner, door, _ = alice
    reads = AclRow("User:alice", "topic", "t-a", "literal", "read", "allow")
    door.security.apply(_snapshot(2, acls=(*_ACLS, reads)))
    for _ in range(3):
        assert _answer(_request(runner, door, method, path, headers, b""))[0] == status, case
    assert not door.hits, case
    # A broker's field is dropped from a user's request, which may then be remembered without
    # it (as a request that never carried it); a request carrying it is never looked up.
    assert len(door.door.admissions) == (case == "a broker's field"), case


def test_the_remembered_admissions_stay_bounded(
    alice: tuple[asyncio.Runner, _Door, list[int]], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(admission, "ADMISSIONS_MAX", 3)
    runner, door, _ = alice
    bearer = [(b"authorization", f"Bearer {ALICE.token}".encode())]
    for i in range(10):
        for _ in range(2):
            assert (
                _answer(_request(runner, door, "POST", f"/v1/topics/t-{i}/records", bearer, b""))[0]
                == 200
            )
        assert 0 < len(door.door.admissions) <= 3
    assert len(door.hits) == 10  # each path's repeat found its entry


def test_a_dropped_sensor_is_not_charged_again(tmp_path: Path) -> None:
    """A remembered meter holds its caller's sensors; once other callers' sensors pushed
    them out (the sensor cap), the next request is measured afresh, as on the long way."""
    clock = [1_000_000]
    fast = _door(tmp_path / "fast", clock, True, max_sensors=2)
    slow = _door(tmp_path / "slow", clock, False, max_sensors=2)
    key = (b"authorization", f"Bearer {ALICE.token}".encode())
    answers: dict[str, list[Any]] = {"fast": [], "slow": []}
    with asyncio.Runner() as runner:
        for name, door in (("fast", fast), ("slow", slow)):
            door.quotas.apply(QUOTAS[4])  # a sensor per client id
            for client in (b"c", b"c", b"d", b"e", b"c"):
                headers = [key, (b"logbus-client-id", client), (b"content-length", b"100")]
                sent = _request(runner, door, "POST", "/v1/topics/t-a/records", headers, b"x" * 100)
                answers[name].append(_answer(sent))
    assert answers["fast"] == answers["slow"]
    assert len(fast.hits) == 1  # c's repeat; after d and e, c's sensor was gone: the long way


def test_a_meter_never_holds_a_sensor_its_own_making_dropped(tmp_path: Path) -> None:
    """With the cap at one sensor, a caller measured by two quotas (bytes and request time)
    still gets both sensors: the cap is at least the two a meter holds (a meter born with a
    dropped sensor failed its first full charge with a KeyError, found by the differential
    test above)."""
    clock = [1_000_000]
    door = _door(tmp_path, clock, True, max_sensors=1)
    door.quotas.apply(QUOTAS[2])  # alice: producer bytes and request time
    with asyncio.Runner() as runner:
        for _ in range(3):
            assert _answer(_request(runner, door, *ALICE_WRITES))[0] == 200
            clock[0] += 2_000  # past the LRU refresh: the full charge reorders both sensors
    assert len(door.quotas.sensors) == 2
