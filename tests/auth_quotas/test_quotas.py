"""Quota arithmetic: Kafka's precedence as a table, the sampled rate and its throttle formula,
KIP-599's token bucket, and (Hypothesis, simulated time) that a client obeying the throttle
converges to its quota."""

from __future__ import annotations

import math
import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from auth_quotas.errors import InvalidQuotaError, ThrottlingQuotaExceededError
from auth_quotas.quotas import (
    DEFAULT,
    Meter,
    MutationDecision,
    QuotaConfig,
    QuotaEntity,
    QuotaSensors,
    QuotaTable,
    QuotaType,
    RateSensor,
    Resolution,
    SampledRate,
    TokenBucket,
    max_value_in_window,
    request_time_percent,
    resolve,
    throttle_time_ms,
    validate_quotas,
)
from core_log.errors import ErrorCode

P = QuotaType.PRODUCER_BYTE_RATE
C = QuotaType.CONSUMER_BYTE_RATE
E = QuotaEntity

# One config holding all eight levels, each with a distinct producer rate = its level.
ALL_LEVELS = {
    E("alice", "app"): {P: 1.0},
    E("alice", DEFAULT): {P: 2.0},
    E("alice"): {P: 3.0},
    E(DEFAULT, "app"): {P: 4.0},
    E(DEFAULT, DEFAULT): {P: 5.0},
    E(DEFAULT): {P: 6.0},
    E(client_id="app"): {P: 7.0},
    E(client_id=DEFAULT): {P: 8.0},
}


def without(*levels: int) -> dict[QuotaEntity, dict[QuotaType, float]]:
    return {e: q for e, q in ALL_LEVELS.items() if q[P] not in levels}


# (configs, user, client id, expected level, expected sensor key)
PRECEDENCE = [
    (ALL_LEVELS, "alice", "app", 1, ("alice", "app")),
    (without(1), "alice", "app", 2, ("alice", "app")),
    (without(1, 2), "alice", "app", 3, ("alice", "")),
    (without(1, 2, 3), "alice", "app", 4, ("alice", "app")),
    (without(1, 2, 3, 4), "alice", "app", 5, ("alice", "app")),
    (without(1, 2, 3, 4, 5), "alice", "app", 6, ("alice", "")),
    (without(1, 2, 3, 4, 5, 6), "alice", "app", 7, ("", "app")),
    (without(1, 2, 3, 4, 5, 6, 7), "alice", "app", 8, ("", "app")),
    (without(1, 2, 3, 4, 5, 6, 7, 8), "alice", "app", 9, ("", "app")),
    # another user: alice's entries do not apply, the <default> user ones do
    (ALL_LEVELS, "bob", "app", 4, ("bob", "app")),
    (ALL_LEVELS, "bob", "other", 5, ("bob", "other")),
    (without(4, 5), "bob", "other", 6, ("bob", "")),
    # another client of alice: <default> client of alice wins over her plain user entry
    (ALL_LEVELS, "alice", "other", 2, ("alice", "other")),
    # a specific client-id entry loses to any user level, even a default one
    ({E(client_id="app"): {P: 7.0}, E(DEFAULT): {P: 6.0}}, "carol", "app", 6, ("carol", "")),
    ({E(client_id="app"): {P: 7.0}}, "carol", "app", 7, ("", "app")),
    # a client that sent no client id matches only the <default> client-id levels
    (ALL_LEVELS, "alice", "", 2, ("alice", "")),
    (without(2, 3, 5, 6), "dave", "", 8, ("", "")),
]


@pytest.mark.parametrize(("configs", "user", "client", "level", "key"), PRECEDENCE)
def test_precedence_follows_kafkas_eight_levels(
    configs: dict[QuotaEntity, dict[QuotaType, float]],
    user: str,
    client: str,
    level: int,
    key: tuple[str, str],
) -> None:
    r = resolve(configs, P, user, client)
    assert r.level == level
    assert r.sensor_key == key
    if level <= 8:
        assert r.limit == float(level)
        assert r.entity is not None and configs[r.entity][P] == float(level)
    else:
        assert r.limit == math.inf and r.entity is None


def test_precedence_is_per_quota_type() -> None:
    configs = {E("alice"): {C: 100.0}, E(DEFAULT): {P: 50.0, C: 60.0}}
    assert resolve(configs, C, "alice", "x").limit == 100.0
    assert resolve(configs, P, "alice", "x").limit == 50.0  # falls through to <default> user


def test_entity_and_quota_validation() -> None:
    assert E.from_dict({"user": "alice"}) == E("alice")
    assert E.from_dict({"user": None, "client_id": "app"}) == E(DEFAULT, "app")
    assert E.from_dict({"client_id": "<default>"}) == E(client_id=DEFAULT)
    for e in ALL_LEVELS:
        assert E.from_dict(e.to_dict()) == e
    assert E.from_dict({"user": "CN=alice,O=eng"}) == E("CN=alice,O=eng")  # an mTLS user
    assert E.from_dict({"client_id": "a" * 255}) == E(client_id="a" * 255)  # at the limit
    bad_entities: list[dict[str, object]] = [
        {},
        {"user": ""},
        {"user": 3},
        {"group": "x"},
        {"user": "x" * 256},
        {"client_id": "a" * 256},
        {"client_id": "a b"},  # what Logbus-Client-Id refuses, a quota refuses
        {"client_id": "a/b"},
    ]
    for bad in bad_entities:
        with pytest.raises(InvalidQuotaError) as info:
            E.from_dict(bad)
        assert info.value.http_status == 400
    with pytest.raises(InvalidQuotaError):
        E()
    assert validate_quotas({"producer_byte_rate": 1048576}) == {P: 1048576.0}
    for bad_q in ({"bytes": 1}, {"producer_byte_rate": -1}, {"producer_byte_rate": True},
                  {"producer_byte_rate": "1"}, {"producer_byte_rate": math.inf}):  # fmt: skip
        with pytest.raises(InvalidQuotaError):
            validate_quotas(bad_q)
    with pytest.raises(InvalidQuotaError):
        QuotaConfig(window_num=0)


# --- the sampled rate ------------------------------------------------------------------------


def test_rate_counts_at_least_one_window() -> None:
    rate = SampledRate()  # 11 x 1 s
    rate.record(1000, now_ms=0)
    assert rate.window_ms(0) == 1000
    assert rate.measure(0) == pytest.approx(1000.0)
    rate.record(1000, now_ms=500)
    assert rate.measure(500) == pytest.approx(2000.0)  # still one window: the first second
    assert rate.window_ms(1500) == 1500
    assert rate.measure(1500) == pytest.approx(2000 / 1.5)


def test_samples_expire_after_the_full_window() -> None:
    rate = SampledRate()
    rate.record(5000, now_ms=0)
    assert rate.measure(10_999) > 0
    assert rate.measure(11_000) == 0.0
    # a steady stream keeps a full window: 1000 B every 100 ms is 10 kB/s
    steady = SampledRate()
    for t in range(0, 60_000, 100):
        steady.record(1000, t)
    assert steady.measure(59_900) == pytest.approx(10_000, rel=0.02)


def _full_pass(rate: SampledRate, now_ms: int) -> tuple[float, int]:
    """The snapshot recomputed from the samples, as a fresh rate would see them."""
    expire_ms = QuotaConfig().window_num * QuotaConfig().window_size_ms
    live = [s for s in rate._samples if now_ms - s.last_ms < expire_ms]
    oldest = min([now_ms, *(s.start_ms for s in live)])
    return sum(s.value for s in live), max(now_ms - oldest, QuotaConfig().window_size_ms)


@settings(max_examples=300, deadline=None)
@given(
    st.lists(
        st.tuples(st.integers(0, 4000), st.integers(0, 10_000), st.booleans()),
        min_size=1,
        max_size=120,
    )
)
def test_the_cached_snapshot_equals_a_full_pass(steps: list[tuple[int, int, bool]]) -> None:
    """snapshot() answers most calls from what its last full pass found; whatever the
    sequence of records, reads and idle gaps (past a sample's expiry, past the whole span),
    it says what a full pass over the samples says."""
    rate = SampledRate()
    now = 0
    for gap, value, read_only in steps:
        now += gap
        if not read_only:
            rate.record(value, now)
        total, span = rate.snapshot(now)
        want_total, want_span = _full_pass(rate, now)
        assert span == want_span
        assert total == pytest.approx(want_total, abs=1e-6)


def test_throttle_is_the_time_the_bytes_take_at_the_quota() -> None:
    """Q=5/s, 100 windows of 1 s, one burst of 560 at t=0: (560/1 - 5)/5 x 1 s = 111 s, the
    time 560 takes at 5/s less the one window of credit (Kafka's padding to 99 windows says
    13 s; see the module docstring for why one window)."""
    sensor = RateSensor(QuotaConfig(window_num=100, max_throttle_ms=10**9))
    assert sensor.record(560, now_ms=0, limit=5.0) == 111_000


def test_throttle_formula_and_bounds() -> None:
    assert throttle_time_ms(observed=150, limit=100, window_ms=10_000, cap_ms=99_999) == 5000
    assert throttle_time_ms(observed=100, limit=100, window_ms=10_000, cap_ms=99_999) == 0
    assert throttle_time_ms(observed=1e9, limit=100, window_ms=10_000, cap_ms=11_000) == 11_000
    assert throttle_time_ms(observed=1, limit=0, window_ms=10_000, cap_ms=11_000) == 11_000
    sensor = RateSensor()
    assert sensor.record(10**12, now_ms=0, limit=1.0) == 11_000  # default cap: 11 x 1 s
    assert RateSensor().record(10**12, now_ms=0, limit=math.inf) == 0


def test_request_time_quota_is_capped_at_one_window() -> None:
    assert request_time_percent(1_000_000_000) == 100.0
    sensor = RateSensor()
    # 5 s of handler time at once against a 10 % quota: far over, capped at 1 s (Kafka)
    assert sensor.record_request_time(5_000_000_000, now_ms=0, limit_percent=10.0) == 1000


def test_a_quota_change_applies_to_the_next_record() -> None:
    sensor = RateSensor()
    assert sensor.record(50_000, 0, limit=1000.0) > 0
    assert sensor.record(1, 1, limit=1e9) == 0


def test_max_value_in_window() -> None:
    assert max_value_in_window(1000.0) == 1000.0
    sensor = RateSensor()
    assert sensor.record(max_value_in_window(1000.0), 0, limit=1000.0) == 0
    assert sensor.record(1, 0, limit=1000.0) > 0


def simulate(
    limit: float, size: float, interval_ms: float, duration_ms: int, percent: bool = False
) -> float:
    """A client that wants to send ``size`` every ``interval_ms`` and waits out each throttle
    before its next request; returns its achieved rate after a warm-up of two full windows."""
    sensor = RateSensor()
    t = 0.0
    warmup_ms = 22_000
    sent = 0.0
    while t < duration_ms:
        now = int(t)
        if percent:
            throttle = sensor.record_request_time(int(size * 1e7), now, limit)
        else:
            throttle = sensor.record(size, now, limit)
        if t >= warmup_ms:
            sent += size
        t += max(interval_ms, throttle)
    return sent / ((duration_ms - warmup_ms) / 1000)


@settings(max_examples=25, deadline=None)
@given(
    limit=st.floats(1e3, 1e8),
    over=st.floats(1.25, 20.0),
    fraction=st.floats(0.05, 1.0),
)
def test_an_obedient_client_above_quota_converges_to_it(
    limit: float, over: float, fraction: float
) -> None:
    """Requests of up to one window's worth of quota, wanted at 1.25-20x the quota: over
    100 s of simulated time the achieved rate is within +-15 % of the quota."""
    size = limit * fraction  # bytes per request
    interval_ms = size / (limit * over) * 1000
    achieved = simulate(limit, size, interval_ms, duration_ms=122_000)
    assert achieved == pytest.approx(limit, rel=0.15)


@settings(max_examples=10, deadline=None)
@given(limit=st.floats(5.0, 80.0), over=st.floats(1.25, 5.0))
def test_request_time_share_converges_too(limit: float, over: float) -> None:
    """Requests of 40 ms handler time (4 percent-seconds each)."""
    interval_ms = 4 / (limit * over) * 1000
    achieved = simulate(limit, 4.0, interval_ms, duration_ms=122_000, percent=True)
    assert achieved == pytest.approx(limit, rel=0.15)


@settings(max_examples=20, deadline=None)
@given(limit=st.floats(1e3, 1e6), under=st.floats(0.1, 0.9), fraction=st.floats(0.02, 0.5))
def test_a_client_under_quota_is_never_throttled(
    limit: float, under: float, fraction: float
) -> None:
    """Requests of up to half a window's worth of quota, sent at 10-90 % of it: never
    throttled once the rate has ``num - 1`` windows of history; before that (the span counts
    one window at least, not Kafka's ``num - 1``) only if one request exceeds the room the
    client leaves, ``(1 - under)`` of a window's worth."""
    size = limit * fraction
    interval_ms = size / (limit * under) * 1000
    sensor = RateSensor()
    t = 0.0
    while t < 60_000:
        throttle = sensor.record(size, int(t), limit)
        if t >= 10_000 or fraction <= 1 - under:
            assert throttle == 0, t
        t += interval_ms


@settings(max_examples=10, deadline=None)
@given(num=st.sampled_from([3, 11]), speed=st.floats(2.0, 20.0), greedy=st.booleans())
def test_a_flooding_client_runs_flat_at_its_quota(num: int, speed: float, greedy: bool) -> None:
    """A client that can send ``speed`` x its quota, as the gate serves it (each request waits
    out what the past earned, then is recorded), greedy or waiting out each answer's throttle:
    every 2 s (two windows; one may carry a few
    requests of the next) is within +-15 % of 2 s of quota. With Kafka's padding to
    ``num - 1`` windows the first second takes the whole credit and that burst comes back once
    per span (windows at ``speed`` x the quota, then at 0)."""
    limit = 512 * 1024.0
    size = limit / 32
    sensor = RateSensor(QuotaConfig(window_num=num))
    per_window = [0.0] * 40
    t = 0.0
    while t < 40_000:
        t += sensor.record(0, int(t), limit)  # owed before it is served
        throttle = sensor.record(size, int(t), limit)
        if t < 40_000:
            per_window[int(t // 1000)] += size
        t += size / (limit * speed) * 1000 + (0 if greedy else throttle)
    for second in range(0, 38, 2):
        sent = per_window[second] + per_window[second + 1]
        assert sent == pytest.approx(2 * limit, rel=0.15), (second, per_window)


# --- KIP-599 token bucket ----------------------------------------------------------------------


def test_token_bucket_strict() -> None:
    bucket = TokenBucket()  # rate 2/s -> burst 2 x 11 x 1 s = 22
    assert bucket.burst(2.0) == 22.0
    assert bucket.acquire(20, now_ms=0, rate=2.0).accepted
    # not negative yet (2 left): accepted even though it takes the bucket to -8
    assert bucket.acquire(10, now_ms=0, rate=2.0) == MutationDecision(True, 0)
    refused = bucket.acquire(1, now_ms=0, rate=2.0)
    assert not refused.accepted and refused.throttle_time_ms == 4000  # -(-8) / 2 per s
    with pytest.raises(ThrottlingQuotaExceededError) as info:
        refused.raise_if_refused()
    assert info.value.code is ErrorCode.THROTTLING_QUOTA_EXCEEDED
    assert info.value.http_status == 429 and info.value.detail["throttle_time_ms"] == 4000
    assert bucket.acquire(1, now_ms=3000, rate=2.0).throttle_time_ms == 1000
    assert bucket.acquire(1, now_ms=4000, rate=2.0).accepted
    # refills only up to the burst
    assert bucket.tokens(now_ms=10**9, rate=2.0) == 22.0


def test_token_bucket_permissive_and_unlimited() -> None:
    bucket = TokenBucket()
    decision = bucket.acquire(30, now_ms=0, rate=2.0, strict=False)
    assert decision.accepted and decision.throttle_time_ms == 4000
    assert bucket.acquire(1, now_ms=0, rate=2.0, strict=False).accepted
    assert TokenBucket().acquire(10**9, 0, math.inf) == MutationDecision(True, 0)
    zero = TokenBucket()
    assert zero.acquire(1, 0, 0.0).accepted  # an empty bucket is not negative ...
    refused = zero.acquire(1, 5000, 0.0)  # ... the next is refused; no refill ever: the cap
    assert not refused.accepted and refused.throttle_time_ms == 11_000


@settings(max_examples=30, deadline=None)
@given(
    rate=st.floats(0.5, 50.0),
    requests=st.lists(st.tuples(st.integers(0, 2000), st.integers(1, 20)), max_size=200),
)
def test_token_bucket_never_admits_more_than_burst_plus_refill_plus_one_request(
    rate: float, requests: list[tuple[int, int]]
) -> None:
    bucket = TokenBucket()
    now = 0
    admitted = 0
    for gap_ms, permits in requests:
        now += gap_ms
        if bucket.acquire(permits, now, rate).accepted:
            admitted += permits
    assert admitted <= bucket.burst(rate) + rate * now / 1000 + 20 + 1e-6


# --- sensors and response fields -------------------------------------------------------------


def test_sensors_share_by_resolution_key_and_render_headers() -> None:
    configs = {E("alice"): {P: 1000.0}}
    sensors = QuotaSensors()
    a = resolve(configs, P, "alice", "app-1")
    b = resolve(configs, P, "alice", "app-2")
    assert a.sensor_key == b.sensor_key == ("alice", "")
    first = sensors.record(P, a, 600, now_ms=0)
    assert first.throttle_time_ms == 0 and first.remaining == pytest.approx(400)
    assert first.headers() == {
        "Logbus-Throttle-Time-Ms": "0",
        "RateLimit-Policy": '"producer_byte_rate";q=10000;qu="content-bytes";w=10',
        "RateLimit": '"producer_byte_rate";r=400;t=0',
    }
    second = sensors.record(P, b, 1600, now_ms=0)  # the same user's other client: shared
    assert second.throttle_time_ms == 1200  # (2200 - 1000) / 1000 * 1 s (one window so far)
    headers = second.headers()
    assert headers["Retry-After"] == "2" and headers["Logbus-Throttle-Time-Ms"] == "1200"
    assert headers["RateLimit"] == '"producer_byte_rate";r=0;t=2'
    assert len(sensors) == 1


def test_owed_is_what_remains_of_the_announced_throttle() -> None:
    """The wait of the next request is the throttle the last answer announced, less the time
    since; a quota changed meanwhile is read against the new limit at once."""
    sensors = QuotaSensors()
    res = resolve({E("alice"): {P: 1000.0}}, P, "alice", "app")
    assert sensors.owed_ms(P, res, now_ms=0) == 0  # no sensor yet: nothing owed
    assert sensors.record(P, res, 3000, now_ms=0).throttle_time_ms == 2000
    assert sensors.owed_ms(P, res, now_ms=500) == 1500
    assert sensors.owed_ms(P, res, now_ms=2000) == 0
    assert sensors.record(P, res, 1000, now_ms=2000).throttle_time_ms > 0
    raised = resolve({E("alice"): {P: 10**6}}, P, "alice", "app")
    assert sensors.owed_ms(P, raised, now_ms=2001) == 0  # the new limit, not the old due time
    cut = resolve({E("alice"): {P: 10.0}}, P, "alice", "app")
    assert sensors.owed_ms(P, cut, now_ms=2002) == QuotaConfig().throttle_cap_ms  # far over


@settings(max_examples=200, deadline=None)
@given(
    byte_type=st.sampled_from([P, C, None]),
    byte_limit=st.sampled_from([100.0, 5000.0, 1e9, None]),
    time_limit=st.sampled_from([0.5, 50.0, 1e6, None]),
    steps=st.lists(
        st.tuples(st.integers(0, 3000), st.integers(0, 20_000), st.integers(0, 10**8)),
        min_size=1,
        max_size=40,
    ),
)
def test_a_meter_charges_what_record_and_headers_say(
    byte_type: QuotaType | None,
    byte_limit: float | None,
    time_limit: float | None,
    steps: list[tuple[int, int, int]],
) -> None:
    """The per-request path (Meter, charge, owed) gives the fields and waits that recording
    each quota and rendering Throttle.headers give: the largest throttle's time, the byte
    quota's RateLimit fields."""
    R = QuotaType.REQUEST_PERCENTAGE
    configs: dict[QuotaEntity, dict[QuotaType, float]] = {E("u"): {}}
    if byte_type is not None and byte_limit is not None:
        configs[E("u")][byte_type] = byte_limit
    if time_limit is not None:
        configs[E("u")][R] = time_limit
    byte_res = resolve(configs, byte_type, "u", "c") if byte_type is not None else None
    byte_res = byte_res if byte_res is not None and math.isfinite(byte_res.limit) else None
    time_res = resolve(configs, R, "u", "c")
    time_res = time_res if math.isfinite(time_res.limit) else None
    fast, slow = QuotaSensors(), QuotaSensors()
    meter = fast.meter(byte_type, byte_res, time_res, now_ms=0)
    now = 0
    for gap, size, handler_ns in steps:
        now += gap
        want_owed = max(
            [slow.owed_ms(t, r, now) for t, r in ((byte_type, byte_res), (R, time_res)) if r] + [0]
        )
        assert fast.owed(meter, now) == want_owed
        throttles = []
        if byte_res is not None and byte_type is not None:
            throttles.append(slow.record(byte_type, byte_res, size, now))
        if time_res is not None:
            throttles.append(slow.record(R, time_res, handler_ns, now))
        got = fast.charge(meter, size, handler_ns, now)
        if not throttles:
            assert got == [(b"logbus-throttle-time-ms", b"0")]
            continue
        worst = max(throttles, key=lambda t: t.throttle_time_ms)
        want = worst.headers()
        for t in throttles:
            if t.quota_type is not R:
                want |= {k: v for k, v in t.headers().items() if k.startswith("RateLimit")}
        assert dict(got) == {k.lower().encode(): v.encode() for k, v in want.items()}


def _resolutions(
    byte_type: QuotaType | None, byte_limit: float, time_limit: float | None
) -> tuple[Resolution | None, Resolution | None]:
    """What user u / client c resolves to under a byte quota of ``byte_type`` (if any) and a
    request-time quota (if ``time_limit``)."""
    R = QuotaType.REQUEST_PERCENTAGE
    configs: dict[QuotaEntity, dict[QuotaType, float]] = {E("u"): {}}
    if byte_type is not None:
        configs[E("u")][byte_type] = byte_limit
    if time_limit is not None:
        configs[E("u")][R] = time_limit
    byte_res = resolve(configs, byte_type, "u", "c") if byte_type is not None else None
    time_res = resolve(configs, R, "u", "c") if time_limit is not None else None
    return byte_res, time_res


# uvicorn 0.54's checks of an answer's field names and values (httptools_impl.HEADER_RE,
# HEADER_VALUE_RE), as they are: a whole answer writes the quota's fields without them.
_NAME_REFUSED = re.compile(b'[\x00-\x1f\x7f()<>@,;:\\[\\]={} \t\\\\"]')
_VALUE_REFUSED = re.compile(b"[\x00-\x08\x0a-\x1f\x7f]")


@settings(max_examples=200, deadline=None)
@given(
    byte_type=st.sampled_from([P, C, None]),
    byte_limit=st.sampled_from([0.001, 1.0, 100.0, 1e9, 1e300]),
    time_limit=st.sampled_from([0.001, 50.0, 1e300, None]),
    steps=st.lists(
        st.tuples(st.integers(0, 3000), st.integers(0, 10**7), st.integers(0, 10**10)),
        min_size=1,
        max_size=40,
    ),
)
def test_the_fields_charge_gives_pass_the_servers_checks(
    byte_type: QuotaType | None,
    byte_limit: float,
    time_limit: float | None,
    steps: list[tuple[int, int, int]],
) -> None:
    """Every field of every answer the quota charges (quiet or full path, throttled or not,
    any limit) is one the server would accept as it is: a lower-case name and a value
    uvicorn's checks pass, and none of the fields uvicorn acts on. api.connections' whole
    answers write them unchecked (``BUILT_FIELDS_KEY``)."""
    byte_res, time_res = _resolutions(byte_type, byte_limit, time_limit)
    sensors = QuotaSensors()
    meter = sensors.meter(byte_type, byte_res, time_res, now_ms=0)
    now = 0
    for gap, size, handler_ns in steps:
        now += gap
        for name, value in sensors.charge(meter, size, handler_ns, now):
            assert name == name.lower() and not _NAME_REFUSED.search(name), name
            assert not _VALUE_REFUSED.search(value), value
            assert name not in (b"content-length", b"connection", b"transfer-encoding")


@settings(max_examples=200, deadline=None)
@given(
    byte_type=st.sampled_from([P, C, None]),
    byte_limit=st.sampled_from([2000.0, 1e5, 1e12]),
    time_limit=st.sampled_from([5.0, 1e6, None]),
    steps=st.lists(
        st.tuples(st.integers(0, 400), st.integers(0, 5000), st.integers(0, 10**7)),
        min_size=1,
        max_size=120,
    ),
    shared=st.booleans(),
    history_ms=st.sampled_from([0, 12_000]),
)
def test_the_quiet_path_answers_as_the_full_path(
    byte_type: QuotaType | None,
    byte_limit: float,
    time_limit: float | None,
    steps: list[tuple[int, int, int]],
    shared: bool,
    history_ms: int,
) -> None:
    """charge with its quiet path (a caller below its quota) against charge without it
    (the sensors' quiet state dropped before every request): the same fields, the same
    waits, the same measured rates; ``shared``: a second meter on the same sensors
    (two clients of one user) charges in turn; ``history_ms``: the steps start young (r
    moves with every request) or after that long of steady traffic (a span of history: r
    is the whole policy when far from the quota)."""
    byte_res, time_res = _resolutions(byte_type, byte_limit, time_limit)
    if byte_res is None and time_res is None:
        return
    quiet, full = QuotaSensors(), QuotaSensors()
    meters = [quiet.meter(byte_type, byte_res, time_res, 0) for _ in range(2 if shared else 1)]
    twins = [full.meter(byte_type, byte_res, time_res, 0) for _ in meters]
    now = 0
    steady = [(20, 10, 1000)] * (history_ms // 20)
    for i, (gap, size, handler_ns) in enumerate(steady + steps):
        now += gap
        meter, twin = meters[i % len(meters)], twins[i % len(twins)]
        for s in (twin.byte_sensor, twin.time_sensor):
            if s is not None:
                s.quiet_until = 0  # never quiet: the full path every time
        assert quiet.owed(meter, now) == full.owed(twin, now)
        assert quiet.charge(meter, size, handler_ns, now) == full.charge(
            twin, size, handler_ns, now
        )
        assert quiet.rates(now) == full.rates(now)


def _benchmark_twins() -> tuple[QuotaSensors, QuotaSensors, Meter, Meter]:
    """Two sensor sets and their meters for the benchmark's quota (never throttles): the
    first charged as it comes (quiet when it may), the second always the full way (the
    test clears its quiet marks before each charge)."""
    R = QuotaType.REQUEST_PERCENTAGE
    configs = {E("u", "c"): {P: 1e12, R: 1e6}}
    byte_res, time_res = resolve(configs, P, "u", "c"), resolve(configs, R, "u", "c")
    quiet, full = QuotaSensors(), QuotaSensors()
    meter, twin = quiet.meter(P, byte_res, time_res, 0), full.meter(P, byte_res, time_res, 0)
    assert twin.byte_sensor is not None and twin.time_sensor is not None
    return quiet, full, meter, twin


def test_a_caller_far_below_its_quota_takes_the_quiet_path() -> None:
    """The benchmark's quota (never throttles) on a steady client: after its first span most
    requests are quiet, and answer what the full path answers."""
    quiet, full, meter, twin = _benchmark_twins()
    took_quiet = 0
    for now in range(0, 20_000, 10):
        twin.byte_sensor.quiet_until = twin.time_sensor.quiet_until = 0
        sensors = (meter.byte_sensor, meter.time_sensor)
        took_quiet += all(s is not None and now < s.quiet_until for s in sensors)
        assert quiet.charge(meter, 120, 30_000, now) == full.charge(twin, 120, 30_000, now)
    assert quiet.rates(20_000) == full.rates(20_000)
    assert took_quiet > 800  # of the 1,000 requests after the first 10 s


def test_a_young_caller_takes_the_quiet_path_with_its_own_r() -> None:
    """A client in its first seconds (as in every phase of benchmarks.per_request): RateLimit's
    r moves with every request, yet most requests are quiet and answer what the full path
    answers, r included."""
    quiet, full, meter, twin = _benchmark_twins()
    took_quiet = 0
    rs = set()
    for now in range(0, 4_000, 2):
        twin.byte_sensor.quiet_until = twin.time_sensor.quiet_until = 0
        sensors = (meter.byte_sensor, meter.time_sensor)
        took_quiet += all(s is not None and now < s.quiet_until for s in sensors)
        got = quiet.charge(meter, 120, 30_000, now)
        assert got == full.charge(twin, 120, 30_000, now)
        rs.add(dict(got)[b"ratelimit"])
    assert quiet.rates(4_000) == full.rates(4_000)
    assert len(rs) > 1_900  # r moved with (nearly) every request: a young caller's
    assert took_quiet > 1_900  # of 2,000: all but the first of each sample and LRU refresh


def test_unlimited_and_request_time_records() -> None:
    sensors = QuotaSensors()
    free = sensors.record(C, resolve({}, C, "bob", "x"), 10**9, now_ms=0)
    assert free.throttle_time_ms == 0 and free.remaining == math.inf
    assert free.headers() == {"Logbus-Throttle-Time-Ms": "0"}
    R = QuotaType.REQUEST_PERCENTAGE
    busy = sensors.record(R, resolve({E("bob"): {R: 10.0}}, R, "bob", "x"), 5e9, now_ms=0)
    assert busy.throttle_time_ms == 1000  # capped at one window
    assert "RateLimit" not in busy.headers() and busy.headers()["Retry-After"] == "1"
    assert set(sensors.rates(0)) == {(C, ("", "x")), (R, ("bob", ""))}


def test_sensors_are_bounded_and_expire_when_idle() -> None:
    sensors = QuotaSensors(max_sensors=3, idle_expiry_ms=1000)
    for i in range(5):
        sensors.record(P, resolve({}, P, "u", f"c{i}"), 1, now_ms=i)
    assert len(sensors) == 3
    assert {k[1][1] for k in sensors.rates(10)} == {"c2", "c3", "c4"}
    sensors.record(P, resolve({}, P, "u", "late"), 1, now_ms=5000)
    assert len(sensors) == 1


def test_quota_table_memoises_and_changes_by_copy() -> None:
    table = QuotaTable(ALL_LEVELS)
    for configs, user, client, level, key in PRECEDENCE:
        if configs is ALL_LEVELS:
            r = table.resolve(P, user, client)
            assert (r.level, r.sensor_key) == (level, key)
            assert table.resolve(P, user, client) is r  # memoised
    changed = table.set(E("alice", "app"), {C: 5.0})
    assert changed.get(E("alice", "app")) == {P: 1.0, C: 5.0}
    assert table.get(E("alice", "app")) == {P: 1.0}  # the old snapshot is untouched
    assert changed.resolve(C, "alice", "app").limit == 5.0
    assert table.resolve(C, "alice", "app").limit == math.inf
    partly = changed.delete(E("alice", "app"), C)
    assert partly.get(E("alice", "app")) == {P: 1.0}
    gone = changed.delete(E("alice", "app"))
    assert gone.resolve(P, "alice", "app").level == 2 and len(gone) == len(table) - 1
    assert dict(QuotaTable().items()) == {}
