"""One broker's client quotas: who is asking, which quota applies, and how far over it they are.

Theory of operation
-------------------
*Who.* A quota names a user, a client id, or both (Kafka's entities). The user is the
authenticated identity the authentication layer leaves in the ASGI scope
(``scope["logbus.identity"]``, an :class:`auth_quotas.credentials.Identity`); without one (auth
off) it is Kafka's ``ANONYMOUS``. :func:`quota_user` is the one place that reads it. The client
id is the ``Logbus-Client-Id`` header, or for WebSockets and Server-Sent Events (a browser
cannot set headers there) the ``client_id`` query parameter; it is checked (1..255 of
``[A-Za-z0-9._-]``, Kafka's legal name characters) and anything else is 400, whether or not a
quota is configured, so a client does not start failing the day an operator sets one.

*Which quota.* :class:`QuotaState` holds an immutable :class:`~auth_quotas.quotas.QuotaTable`
rebuilt from every security snapshot the broker's
:class:`~cluster.security_watcher.SecurityWatcher` delivers (polled every 250 ms): a quota set
through any broker, or the CLI, is in force on every broker within about a second, without a
restart. With no quota configured at all (the default) :attr:`QuotaState.active` is false and
requests pay nothing but the client-id check.

*How far over.* Rates are measured per :attr:`~auth_quotas.quotas.Resolution.sensor_key`
(Kafka's sharing rule) in :class:`~auth_quotas.quotas.QuotaSensors`: at most
``quota_max_sensors`` (10 000 by default, ~2 KB each: ~20 MB), least recently used dropped
first, and any idle for an hour (Kafka's sensor expiry) dropped as they come to the head. A
flood of made-up client ids therefore costs bounded memory; dropping a sensor forgets a
client's recent rate, which errs in the client's favour for at most one window. Only callers
that a finite quota applies to are measured at all. KIP-599 mutation buckets live in a bounded
LRU of the same size.

*Metrics.* Per sensor: the measured rate and the throttle time handed out, for the
:data:`METRICS_MAX_ENTITIES` most recently active sensors (Prometheus label cardinality stays
bounded whatever the sensor cap).

Every method takes its time from the injected ``clock`` (milliseconds, monotonic, never
negative: a sensor that never throttled, due at 0, owes nothing).
"""

from __future__ import annotations

import math
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any, Final
from urllib.parse import parse_qsl

from auth_quotas.quotas import (
    DEFAULT,
    DEFAULT_CONFIG,
    SENSOR_IDLE_EXPIRY_MS,
    EntityPart,
    Meter,
    QuotaConfig,
    QuotaEntity,
    QuotaSensors,
    QuotaTable,
    QuotaType,
    Resolution,
    Throttle,
    TokenBucket,
    is_client_id,
)
from cluster.security_store import DEFAULT_ENTITY, QuotaRow, SecuritySnapshot
from core_log.errors import ErrorCode, LogbusError

ANONYMOUS: Final = "ANONYMOUS"  # Kafka's KafkaPrincipal.ANONYMOUS user name
IDENTITY_SCOPE_KEY: Final = "logbus.identity"  # set by the authentication layer
CLIENT_ID_HEADER: Final = b"logbus-client-id"
CLIENT_ID_QUERY: Final = "client_id"
MAX_CLIENT_ID_CHARS: Final = 255  # a quota entity part's limit (QuotaEntity.from_dict)
# Sensors one broker keeps (Kafka has no cap; 10k ~2 KB sensors is ~20 MB).
MAX_SENSORS_DEFAULT: Final = 10_000
# Entities exposed in /metrics: the most recently active ones (label cardinality).
METRICS_MAX_ENTITIES: Final = 1000


def quota_user(scope: dict[str, Any] | Any) -> str:
    """The quota user of a request: the authenticated user, else ``ANONYMOUS`` (Kafka)."""
    identity = scope.get(IDENTITY_SCOPE_KEY)
    user = getattr(identity, "user", None)
    return user if isinstance(user, str) and user else ANONYMOUS


def bad_client_id(detail: str) -> LogbusError:
    return LogbusError(
        f"Logbus-Client-Id (or client_id): {detail}; 1..{MAX_CLIENT_ID_CHARS} of [A-Za-z0-9._-]",
        code=ErrorCode.INVALID_REQUEST,
    )


# Logbus-Client-Id values found valid: at most this many remembered. Only valid ones are: an
# invalid one is checked (and refused) every time.
CLIENT_ID_CACHE_ENTRIES: Final = 4096
_VALID_CLIENT_IDS: set[str] = set()


def client_id(
    scope: dict[str, Any] | Any, *, query_too: bool, values: list[str] | None = None
) -> str:
    """The client id a request gives (``""``: none). ``query_too``: a WebSocket or an SSE
    stream, which may give it as the ``client_id`` query parameter. ``values``: its
    Logbus-Client-Id values (latin-1) when the caller has them (else read from the scope).
    Raises 400 when bad."""
    if values is None:
        values = [v.decode("latin-1") for k, v in scope["headers"] if k == CLIENT_ID_HEADER]
    if len(values) > 1:
        raise bad_client_id("sent twice")
    if values:
        sent = values[0]
        if sent in _VALID_CLIENT_IDS:  # a client sends its id with every request: checked once
            return sent
        _checked_client_id(sent)
        if len(_VALID_CLIENT_IDS) >= CLIENT_ID_CACHE_ENTRIES:
            _VALID_CLIENT_IDS.clear()
        _VALID_CLIENT_IDS.add(sent)
        return sent
    if not query_too or b"client_id" not in scope.get("query_string", b""):
        return ""
    values = [
        v
        for k, v in parse_qsl(scope["query_string"].decode("latin-1"), keep_blank_values=True)
        if k == CLIENT_ID_QUERY
    ]
    if len(values) > 1:
        raise bad_client_id("sent twice")
    return _checked_client_id(values[0]) if values else ""


def _checked_client_id(raw: str) -> str:
    if not is_client_id(raw):
        raise bad_client_id(f"{raw[:64]!r} is not a client id")
    return raw


def _part(raw: str | None) -> EntityPart:
    if raw is None:
        return None
    return DEFAULT if raw == DEFAULT_ENTITY else raw


def entity_of(row: QuotaRow) -> QuotaEntity:
    return QuotaEntity(_part(row.user), _part(row.client_id))


def table_of(rows: Iterable[QuotaRow]) -> QuotaTable:
    """The quota table of stored rows; a type this version does not know is skipped (a newer
    broker may have stored it)."""
    known = {q.value for q in QuotaType}
    configs: dict[QuotaEntity, dict[QuotaType, float]] = {}
    for row in rows:
        if row.quota_type in known:
            configs.setdefault(entity_of(row), {})[QuotaType(row.quota_type)] = row.value
    return QuotaTable(configs)


def _monotonic_ms() -> int:
    return time.monotonic_ns() // 1_000_000


monotonic_ms: Callable[[], int]
try:  # the C twin: no Python frame on every measured request (QuotaSensors.charge's clock)
    from ._steptimer import monotonic_ms
except ImportError:  # built with LOGBUS_PURE_PYTHON=1
    monotonic_ms = _monotonic_ms


@dataclass(frozen=True, slots=True)
class EntityStats:
    """One sensor's line in /metrics."""

    quota_type: QuotaType
    user: str
    client_id: str
    rate: float
    limit: float
    throttle_ms_total: float


class QuotaState:
    """The quota table in force on this broker and the rates measured against it."""

    def __init__(
        self,
        config: QuotaConfig = DEFAULT_CONFIG,
        *,
        clock: Callable[[], int] = monotonic_ms,
        max_sensors: int = MAX_SENSORS_DEFAULT,
        idle_expiry_ms: int = SENSOR_IDLE_EXPIRY_MS,
    ) -> None:
        self.config = config
        self.clock = clock
        self.table = QuotaTable()
        # Whether any quota is configured (no: nothing is measured). Kept with the table:
        # every request reads it.
        self.active = False
        # Tables applied: a meter found for an earlier one is stale (api.admission).
        self.generation = 0
        self.version = -1
        self.max_sensors = max_sensors
        self._idle_ms = idle_expiry_ms
        self.sensors = QuotaSensors(config, max_sensors=max_sensors, idle_expiry_ms=idle_expiry_ms)
        self._buckets: OrderedDict[tuple[str, str], tuple[TokenBucket, int]] = OrderedDict()
        # (user, client id, byte quota type) -> its Meter, or None when no quota applies; for
        # the table in force and while no sensor was dropped (_meters_evictions)
        self._meters: dict[tuple[str, str, QuotaType | None], Meter | None] = {}
        self._meters_evictions = 0

    def apply_snapshot(self, snapshot: SecuritySnapshot) -> None:
        """The security watcher's callback: the quotas of ``snapshot`` are in force now."""
        self.apply(snapshot.quotas, snapshot.version)

    def apply(self, rows: Iterable[QuotaRow], version: int = -1) -> None:
        self.table = table_of(rows)
        self.active = len(self.table) > 0
        self.generation += 1
        self.version = version
        self._meters.clear()
        if not self.active:
            self._buckets.clear()

    # -- the per-request path ----------------------------------------------------------------

    def meter(self, user: str, client: str, byte_type: QuotaType | None) -> Meter | None:
        """What a request of ``user``/``client`` is measured against: its ``byte_type`` quota
        (producer or consumer bytes; None: the request moves no record bytes) and request
        time. None when neither applies. Resolved once per caller and table."""
        if self._meters_evictions != self.sensors.evictions:
            self._meters.clear()  # a meter may hold a dropped sensor
            self._meters_evictions = self.sensors.evictions
        key = (user, client, byte_type)
        try:
            return self._meters[key]
        except KeyError:
            pass
        byte_res = None if byte_type is None else self.resolve(byte_type, user, client)
        time_res = self.resolve(QuotaType.REQUEST_PERCENTAGE, user, client)
        meter = None
        if byte_res is not None or time_res is not None:
            meter = self.sensors.meter(byte_type, byte_res, time_res, self.clock())
            self._meters_evictions = self.sensors.evictions  # made it: it holds live sensors
        if len(self._meters) >= self.max_sensors:
            self._meters.clear()
        self._meters[key] = meter
        return meter

    def owed(self, meter: Meter) -> int:
        """How long the request must wait before it is served (ms): what remains of the
        throttle its caller's traffic earned, at most ``max_throttle_ms``."""
        return min(self.sensors.owed(meter, self.clock()), self.config.throttle_cap_ms)

    def charge(self, meter: Meter, value: float, handler_ns: int) -> list[tuple[bytes, bytes]]:
        """Record the request (``value`` bytes; ``handler_ns`` of handler time); its answer's
        throttle fields."""
        return self.sensors.charge(meter, value, handler_ns, self.clock())

    # -- byte rates and request time ---------------------------------------------------------

    def resolve(self, quota_type: QuotaType, user: str, client: str) -> Resolution | None:
        """The quota of ``quota_type`` that applies, None when none does."""
        res = self.table.resolve(quota_type, user, client)
        return None if math.isinf(res.limit) else res

    def record(
        self, quota_type: QuotaType, res: Resolution, value: float, now_ms: int | None = None
    ) -> Throttle:
        """Record ``value`` (bytes; request time: handler nanoseconds) against ``res``;
        ``value`` 0 asks how throttled the caller is now."""
        now = self.clock() if now_ms is None else now_ms
        return self.sensors.record(quota_type, res, value, now)

    # -- controller mutations (KIP-599) ------------------------------------------------------

    def mutation_bucket(self, user: str, client: str) -> tuple[TokenBucket, float] | None:
        res = self.resolve(QuotaType.CONTROLLER_MUTATION_RATE, user, client)
        if res is None:
            return None
        now = self.clock()
        entry = self._buckets.pop(res.sensor_key, None)
        bucket = TokenBucket(self.config) if entry is None else entry[0]
        self._buckets[res.sensor_key] = (bucket, now)
        while self._buckets:
            _, (_, last) = next(iter(self._buckets.items()))
            if len(self._buckets) <= self.max_sensors and now - last < self._idle_ms:
                break
            self._buckets.popitem(last=False)
        return bucket, res.limit

    def mutation_refused_ms(self, user: str, client: str) -> int:
        """Strict KIP-599: the throttle time when the caller's bucket is negative (refuse),
        0 when a mutation may go ahead."""
        found = self.mutation_bucket(user, client)
        if found is None:
            return 0
        bucket, rate = found
        now = self.clock()
        if bucket.tokens(now, rate) >= 0:
            return 0
        # ask without taking: a strict acquire of 0 permits refuses with the throttle
        return bucket.acquire(0, now, rate, strict=True).throttle_time_ms

    def mutation_done(self, user: str, client: str, permits: int) -> None:
        """Take ``permits`` (partitions created, deleted or added) from the caller's bucket;
        it may go negative (one large request is never starved)."""
        found = self.mutation_bucket(user, client)
        if found is not None and permits > 0:
            bucket, rate = found
            bucket.acquire(permits, self.clock(), rate, strict=False)

    # -- metrics -----------------------------------------------------------------------------

    def stats(self, limit: int = METRICS_MAX_ENTITIES) -> Iterator[EntityStats]:
        """The most recently active sensors, at most ``limit``."""
        now = self.clock()
        for (quota_type, (user, client)), sensor in self.sensors.recent(limit):
            yield EntityStats(
                quota_type, user, client, sensor.measure(now), sensor.limit, sensor.throttled_ms
            )

    def __len__(self) -> int:
        return len(self.sensors)


def quota_config(window_num: int, window_size_seconds: int, max_throttle_ms: int) -> QuotaConfig:
    """The config from settings; ``max_throttle_ms`` 0 means one full span (the default)."""
    return QuotaConfig(window_num, window_size_seconds * 1000, max_throttle_ms or None)
