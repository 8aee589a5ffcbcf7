"""Client quota arithmetic (Kafka's KIP-13, KIP-124, KIP-219, KIP-599), sans-I/O.

Theory of operation
-------------------
*Which quota applies.* Quotas are configured per entity: a user, a client id, or both, where
either part may be the *default* (``<default>``). :func:`resolve` walks Kafka's eight levels,
most specific first, separately for each quota type (a user with only ``consumer_byte_rate``
set falls through to lower levels for ``producer_byte_rate``)::

    1 user + client id      2 user + <default> client   3 user
    4 <default> user + client id    5 <default> user + <default> client   6 <default> user
    7 client id             8 <default> client id

The level also decides who *shares* the measured rate (Kafka's metric tags): a named
``user`` quota (3) is shared by all that user's clients, while a ``<default>`` part is a
template instantiated per concrete user or client id. :class:`Resolution.sensor_key` is that
sharing key; the wiring keeps one sensor per key. :class:`QuotaTable` is an immutable snapshot
of all configured quotas that memoises resolutions (one dict lookup per request).

*Measuring.* :class:`SampledRate` is Kafka's ``Rate`` over a ``WindowedSum``: values are
added to the current of ``quota.window.num`` (11) samples of ``quota.window.size.seconds``
(1 s); the rate is the sum over live samples divided by the elapsed span, which counts at least
one full window, so a client's first second does not read as a burst (1 s of traffic at the
quota measures as the quota, not as ``num`` times it).

*Why one window, not Kafka's ``num - 1``.* Kafka's client quotas pad the span to ``num - 1``
windows (its "fixed" window policy; its replication quotas use the elapsed span instead, as
padding underestimates a young rate and lets a load spike through). That padding is a credit:
a new or long-idle client may send ``(num - 1) * quota`` at once (10 s of quota by default).
A windowed sum then never forgets the burst: when the burst's sample expires the measured rate
drops by exactly that much, and a flooding client (greedy, or obeying the throttle time; both
send again as soon as the rate is back under quota) fills the room at once, so the burst comes
back once per span. Measured on a real broker with 11 x 1 s windows: a flooder at up to 10x
its quota for one second, then held for ten, every 11-12 s; its rate over any 11 s ranged
0.31-1.39x the quota, while over whole spans it was 1.01x. Padding to one window gives a new
client one window's worth of credit, and a flooder then runs flat at the quota from its
second window on (the same run: 0.97-1.03x over every 10 s interval, greedy or obedient; 1 s
samples mostly within 4 %, a few 12-16 % off as a request lands in the next second).

*Throttling.* When the observed rate O exceeds the quota T, the response is delayed by the
time X that brings the average back to T if nothing more arrives: ``O*W / (W + X) = T``, so
``X = (O - T) / T * W``, with W the span the rate was measured over (11-12 s by default
once a client has a span of history; 1 s at least before). The formula counts on nothing
leaving the window during X, so after a quota cut it overshoots: at twice the new quota the
next request is held a whole span (the cap), while half of one would do.
Kafka does not cap the byte-rate delay and caps the request-time delay at one window (1 s);
Logbus caps both (:attr:`QuotaConfig.max_throttle_ms`, default one full measurement span,
11 s) so an HTTP client is never held past the point the measurement can justify. A client
that obeys the delay converges to T (see the tests: within ±15 % in simulated time), and so
does one that ignores it, since the gate holds its next request that long.

*Request time.* ``request_percentage`` is a share of one handler thread: a request that kept
the handler busy for n ns records ``n * 100 / 1e9`` "percent-seconds", so a rate of 50 means
half a thread (:func:`request_time_percent`). Its throttle is capped at one window (Kafka).

*Mutations (KIP-599).* Topic creation/deletion and partition increases draw from a
:class:`TokenBucket` refilled at ``controller_mutation_rate`` per second with a burst of
``rate * num * window_s`` tokens. In strict mode a request is accepted while the bucket is not
negative (it may drive it negative: one large request is never starved), and refused with
``THROTTLING_QUOTA_EXCEEDED`` and ``throttle = -tokens / rate`` once it is.

*Per broker.* :class:`QuotaSensors` holds the sensors (bounded LRU, idle ones expire after an
hour as in Kafka) and turns a :class:`Resolution` and a recorded value into a
:class:`Throttle`, which renders the response fields (``Logbus-Throttle-Time-Ms``,
``Retry-After``, and the IETF ``RateLimit``/``RateLimit-Policy`` draft fields).

All of it takes ``now_ms`` from the caller: no clock is read here.
"""

from __future__ import annotations

import enum
import math
import re
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Final, Literal

from .errors import InvalidQuotaError, ThrottlingQuotaExceededError
from .limits import MAX_QUOTA_SENSORS

QUOTA_WINDOW_NUM_DEFAULT: Final = 11  # Kafka's quota.window.num
QUOTA_WINDOW_SIZE_SECONDS_DEFAULT: Final = 1  # Kafka's quota.window.size.seconds


class QuotaType(enum.StrEnum):
    """The quota configs, with Kafka's names (units: bytes/s, bytes/s, %, mutations/s)."""

    PRODUCER_BYTE_RATE = "producer_byte_rate"
    CONSUMER_BYTE_RATE = "consumer_byte_rate"
    REQUEST_PERCENTAGE = "request_percentage"
    CONTROLLER_MUTATION_RATE = "controller_mutation_rate"


@dataclass(frozen=True, slots=True)
class QuotaConfig:
    """Sample windows and the throttle cap. ``max_throttle_ms`` ``None`` means one full
    measurement span (``window_num * window_size_ms``)."""

    window_num: int = QUOTA_WINDOW_NUM_DEFAULT
    window_size_ms: int = QUOTA_WINDOW_SIZE_SECONDS_DEFAULT * 1000
    max_throttle_ms: int | None = None

    def __post_init__(self) -> None:
        if self.window_num < 1 or self.window_size_ms < 1:
            raise InvalidQuotaError("quota.window.num and quota.window.size.seconds must be >= 1")

    @property
    def throttle_cap_ms(self) -> int:
        if self.max_throttle_ms is not None:
            return self.max_throttle_ms
        return self.window_num * self.window_size_ms


DEFAULT_CONFIG: Final = QuotaConfig()


# --- entities and precedence -------------------------------------------------------------------


class _Default(enum.Enum):
    DEFAULT = "<default>"

    def __repr__(self) -> str:
        return "DEFAULT"


DEFAULT: Final = _Default.DEFAULT
"""The ``<default>`` user or client id of a quota entity."""

EntityPart = str | Literal[_Default.DEFAULT] | None


@dataclass(frozen=True, slots=True)
class QuotaEntity:
    """Who a quota is configured for: ``user`` and/or ``client_id``, each a name, ``DEFAULT``
    or absent (``None``). At least one part is present."""

    user: EntityPart = None
    client_id: EntityPart = None

    def __post_init__(self) -> None:
        if self.user is None and self.client_id is None:
            raise InvalidQuotaError("a quota entity names a user, a client id, or both")
        for part in (self.user, self.client_id):
            if isinstance(part, str) and not part:
                raise InvalidQuotaError("a quota entity's user or client id cannot be empty")

    def to_dict(self) -> dict[str, str | None]:
        """``{"user": "alice"}``; a default part is ``null`` (Kafka's AlterClientQuotas)."""
        out: dict[str, str | None] = {}
        if self.user is not None:
            out["user"] = None if self.user is DEFAULT else self.user
        if self.client_id is not None:
            out["client_id"] = None if self.client_id is DEFAULT else self.client_id
        return out

    @staticmethod
    def from_dict(data: Mapping[str, object]) -> QuotaEntity:
        """The inverse of :meth:`to_dict`; ``null`` (or ``"<default>"``) is the default."""
        if not isinstance(data, Mapping) or not data:
            raise InvalidQuotaError("entity: an object with 'user' and/or 'client_id'")
        unknown = set(data) - {"user", "client_id"}
        if unknown:
            raise InvalidQuotaError(f"entity: unknown field(s): {', '.join(sorted(unknown))}")

        def part(key: str) -> EntityPart:
            if key not in data:
                return None
            value = data[key]
            if value is None or value == DEFAULT.value:
                return DEFAULT
            if not isinstance(value, str) or not value or len(value) > 255:
                raise InvalidQuotaError(f"entity.{key}: a name of 1..255 characters, or null")
            if key == "client_id" and not is_client_id(value):
                raise InvalidQuotaError(
                    f"entity.client_id: {value[:64]!r} is not a client id: 1..255 of "
                    "[A-Za-z0-9._-] (what Logbus-Client-Id accepts), or null"
                )
            return value

        return QuotaEntity(part("user"), part("client_id"))


# What a client id may be (the Logbus-Client-Id header, the client_id query parameter, a
# quota entity's client id): one rule, so every quota set can match some client.
CLIENT_ID_PATTERN: Final = re.compile(r"[A-Za-z0-9._-]{1,255}")


def is_client_id(value: str) -> bool:
    return CLIENT_ID_PATTERN.fullmatch(value) is not None


def validate_quotas(data: Mapping[str, object]) -> dict[QuotaType, float]:
    """Quota values from API input: known keys, finite numbers ``>= 0`` (a rate of 0 blocks
    the entity: everything it sends is over quota); raises :class:`InvalidQuotaError`."""
    if not isinstance(data, Mapping):
        raise InvalidQuotaError("quotas: an object of quota name -> number")
    out: dict[QuotaType, float] = {}
    names = [q.value for q in QuotaType]
    for key, value in data.items():
        if key not in names:
            raise InvalidQuotaError(f"quotas: unknown quota {key!r}; one of {'|'.join(names)}")
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise InvalidQuotaError(f"quotas.{key}: a finite number >= 0")
        number = float(value)
        if not math.isfinite(number) or number < 0:
            raise InvalidQuotaError(f"quotas.{key}: a finite number >= 0")
        out[QuotaType(key)] = number
    return out


_Slot = Literal["name", "default", "absent"]

# Kafka's order: (user part, client-id part, sensor keyed by user, sensor keyed by client id).
_LEVELS: Final[tuple[tuple[_Slot, _Slot, bool, bool], ...]] = (
    ("name", "name", True, True),  # 1 /config/users/<user>/clients/<client-id>
    ("name", "default", True, True),  # 2 /config/users/<user>/clients/<default>
    ("name", "absent", True, False),  # 3 /config/users/<user>
    ("default", "name", True, True),  # 4 /config/users/<default>/clients/<client-id>
    ("default", "default", True, True),  # 5 /config/users/<default>/clients/<default>
    ("default", "absent", True, False),  # 6 /config/users/<default>
    ("absent", "name", False, True),  # 7 /config/clients/<client-id>
    ("absent", "default", False, True),  # 8 /config/clients/<default>
)


def _part(slot: _Slot, name: str) -> EntityPart:
    if slot == "name":
        return name
    return DEFAULT if slot == "default" else None


@dataclass(frozen=True, slots=True)
class Resolution:
    """The quota that applies: the configured entity it came from (``None``: no quota, the
    limit is ``inf``), its level 1..8 (9: none), and the key of the sensor that measures it.

    ``sensor_key`` is (user or "", client id or ""), Kafka's metric tags: callers with equal
    keys share one measured rate."""

    limit: float
    entity: QuotaEntity | None
    level: int
    sensor_key: tuple[str, str]


def resolve(
    configs: Mapping[QuotaEntity, Mapping[QuotaType, float]],
    quota_type: QuotaType,
    user: str,
    client_id: str,
) -> Resolution:
    """The ``quota_type`` quota of a caller, by Kafka's 8-level precedence.

    ``user`` is the authenticated user's name (Kafka uses ``ANONYMOUS`` when authentication is
    off); ``client_id`` is what the client sent (``""`` when it sent none: only the ``<default>``
    client-id levels can match it).
    At most 8 dict lookups."""
    for level, (u, c, by_user, by_client) in enumerate(_LEVELS, start=1):
        if (u == "name" and not user) or (c == "name" and not client_id):
            continue  # no entity can name "" (QuotaEntity refuses it)
        entity = QuotaEntity(_part(u, user), _part(c, client_id))
        quotas = configs.get(entity)
        if quotas is not None and quota_type in quotas:
            key = (user if by_user else "", client_id if by_client else "")
            return Resolution(quotas[quota_type], entity, level, key)
    return Resolution(math.inf, None, 9, ("", client_id))


class QuotaTable:
    """An immutable snapshot of every configured quota, with memoised resolution.

    :func:`resolve` costs up to 8 entity lookups; a broker asks once per request and quota
    type, so the table remembers answers (bounded; the snapshot never changes, so a memo is
    never stale). A quota change builds a new table (:meth:`set`, :meth:`delete`) that the
    wiring swaps in: the next request sees it."""

    __slots__ = ("_configs", "_memo")

    def __init__(self, configs: Mapping[QuotaEntity, Mapping[QuotaType, float]] = {}) -> None:
        self._configs: dict[QuotaEntity, dict[QuotaType, float]] = {
            e: dict(q) for e, q in configs.items() if q
        }
        self._memo: dict[tuple[QuotaType, str, str], Resolution] = {}

    def __len__(self) -> int:
        return len(self._configs)

    def items(self) -> list[tuple[QuotaEntity, dict[QuotaType, float]]]:
        return [(e, dict(q)) for e, q in self._configs.items()]

    def get(self, entity: QuotaEntity) -> dict[QuotaType, float]:
        return dict(self._configs.get(entity, {}))

    def set(self, entity: QuotaEntity, quotas: Mapping[QuotaType, float]) -> QuotaTable:
        """A table with ``entity``'s quotas updated (merged: unnamed types stay)."""
        return QuotaTable({**self._configs, entity: {**self._configs.get(entity, {}), **quotas}})

    def delete(self, entity: QuotaEntity, *types: QuotaType) -> QuotaTable:
        """A table without ``entity``'s quotas of ``types`` (all of them when none named)."""
        kept = {t: v for t, v in self._configs.get(entity, {}).items() if types and t not in types}
        return QuotaTable({**self._configs, entity: kept})

    def resolve(self, quota_type: QuotaType, user: str, client_id: str) -> Resolution:
        key = (quota_type, user, client_id)
        hit = self._memo.get(key)
        if hit is None:
            if len(self._memo) >= MAX_QUOTA_SENSORS:
                self._memo.clear()
            hit = self._memo[key] = resolve(self._configs, quota_type, user, client_id)
        return hit


# --- measuring --------------------------------------------------------------------------------


@dataclass(slots=True)
class _Sample:
    start_ms: int
    last_ms: int
    value: float = 0.0


class SampledRate:
    """Kafka's ``Rate`` over ``WindowedSum``: a per-second rate over ``window_num`` samples.

    Not thread-safe; the wiring owns one per sensor key on one event loop. ``now_ms`` must not
    go backwards by more than a window (a backwards step is treated as "now")."""

    __slots__ = (
        "_config",
        "_current",
        "_samples",
        "fresh_until",
        "head",
        "oldest",
        "others",
        "window_size_ms",
    )

    def __init__(self, config: QuotaConfig = DEFAULT_CONFIG) -> None:
        self._config = config
        self.window_size_ms = config.window_size_ms
        self._samples: list[_Sample] = []
        self._current = 0
        self.head: _Sample | None = None  # the current sample (None before the first record)
        # What a full pass over the samples found, valid until a sample could expire or the
        # current one rolls (``fresh_until``): the sum of the samples other than the current
        # one, and the oldest start. Most requests then read the rate in O(1): see
        # :meth:`observe`, whose fast path QuotaSensors.charge inlines (it runs on every
        # request under quota).
        self.others = 0.0
        self.oldest = 0
        self.fresh_until: float = -math.inf

    def record(self, value: float, now_ms: int) -> None:
        if not self._samples:
            self.head = _Sample(now_ms, now_ms)
            self._samples.append(self.head)
            self.fresh_until = -math.inf
        sample = self._samples[self._current]
        if now_ms - sample.start_ms >= self._config.window_size_ms:
            # one spare slot: the oldest sample may overlap the start of the window
            self._current = (self._current + 1) % (self._config.window_num + 1)
            if self._current >= len(self._samples):
                sample = _Sample(now_ms, now_ms)
                self._samples.append(sample)
            else:
                sample = self._samples[self._current]
                sample.start_ms = sample.last_ms = now_ms
                sample.value = 0.0
            self.head = sample
            self.fresh_until = -math.inf
        sample.value += value
        sample.last_ms = now_ms

    def snapshot(self, now_ms: int) -> tuple[float, int]:
        """(sum of live samples, the span the rate divides by): the span is the time since
        the oldest live sample, at least one full window (see the module docstring for why
        not Kafka's ``window_num - 1``)."""
        if now_ms < self.fresh_until:
            current = self._samples[self._current].value
            return self.others + current, max(now_ms - self.oldest, self._config.window_size_ms)
        expire_ms = self._config.window_num * self._config.window_size_ms
        total = 0.0
        oldest = now_ms
        first_expiry = math.inf
        for s in self._samples:
            if now_ms - s.last_ms >= expire_ms:  # purge: no event within the whole window
                s.start_ms = s.last_ms = now_ms
                s.value = 0.0
            total += s.value
            if s.start_ms < oldest:
                oldest = s.start_ms
            if s.last_ms + expire_ms < first_expiry:
                first_expiry = s.last_ms + expire_ms
        if self._samples:
            # Until then no sample expires (the current one's last_ms only grows) and only
            # record() changes a sample (it invalidates this on a roll).
            self.others = total - self._samples[self._current].value
            self.oldest = oldest
            self.fresh_until = first_expiry
        return total, max(now_ms - oldest, self._config.window_size_ms)

    def observe(self, value: float, now_ms: int) -> tuple[float, int]:
        """:meth:`record` then :meth:`snapshot`, in one call (the per-request path: within
        the current sample and before any expiry, two additions)."""
        head = self.head
        size_ms = self.window_size_ms
        if now_ms < self.fresh_until and head is not None and now_ms - head.start_ms < size_ms:
            head.value += value
            head.last_ms = now_ms
            window_ms = now_ms - self.oldest
            return self.others + head.value, window_ms if window_ms > size_ms else size_ms
        self.record(value, now_ms)
        return self.snapshot(now_ms)

    def window_ms(self, now_ms: int) -> int:
        return self.snapshot(now_ms)[1]

    def total(self, now_ms: int) -> float:
        return self.snapshot(now_ms)[0]

    def measure(self, now_ms: int) -> float:
        """The rate per second at ``now_ms``."""
        total, window_ms = self.snapshot(now_ms)
        return total * 1000.0 / window_ms


def throttle_time_ms(observed: float, limit: float, window_ms: int, cap_ms: int) -> int:
    """``(O - T) / T * W``, rounded, 0 when ``O <= T``, at most ``cap_ms``; a limit of 0
    (everything blocked) gives ``cap_ms``."""
    if observed <= limit:
        return 0
    if limit <= 0:
        return cap_ms
    return min(round((observed - limit) / limit * window_ms), cap_ms)


@dataclass(slots=True)
class RateSensor:
    """One entity's measured rate against its quota (the limit is passed per call, so a quota
    changed at runtime applies to the next request)."""

    config: QuotaConfig = DEFAULT_CONFIG
    rate: SampledRate = field(init=False)
    # When the throttle the recorded values earned ends (the ``now_ms`` clock): a request
    # arriving before then waits it out (QuotaSensors.owed_ms; Kafka mutes the channel).
    due_ms: int = field(init=False, default=0)
    limit: float = field(init=False, default=math.inf)  # the last limit, ``due_ms``'s
    throttled_ms: float = field(init=False, default=0.0)  # throttle time handed out, in all
    used_ms: int = field(init=False, default=0)  # when last used (QuotaSensors' LRU)
    # The quiet path of QuotaSensors.charge: until ``quiet_until`` (ms), a request adding less
    # than ``room`` under ``limit`` cannot be throttled, so only its value is added (see
    # QuotaSensors.charge; while what is left of ``room`` is above the meter's
    # ``policy_floor``, RateLimit's r is the whole policy). Any other recording (observe)
    # ends it; charge's inlined path sets it again.
    quiet_until: float = field(init=False, default=0)
    room: float = field(init=False, default=0.0)

    def __post_init__(self) -> None:
        self.rate = SampledRate(self.config)

    def record(self, value: float, now_ms: int, limit: float, cap_ms: int | None = None) -> int:
        """Record ``value`` (bytes, or percent-seconds) and return the throttle time in ms
        (0 when within quota). ``cap_ms`` overrides the config's cap (request time: 1 window)."""
        return self.observe(value, now_ms, limit, cap_ms)[0]

    def observe(
        self, value: float, now_ms: int, limit: float, cap_ms: int | None = None
    ) -> tuple[int, float, int]:
        """:meth:`record`, also returning the window's total and span for the caller's
        ``remaining`` (one pass over the samples per request)."""
        self.quiet_until = 0  # the quiet path's room no longer counts this value
        total, window_ms = self.rate.observe(value, now_ms)
        if limit == math.inf:
            return 0, total, window_ms
        throttle = 0
        if total * 1000.0 > limit * window_ms:  # over quota (rarely: only then the formula)
            cap = self.config.throttle_cap_ms if cap_ms is None else cap_ms
            throttle = throttle_time_ms(total * 1000.0 / window_ms, limit, window_ms, cap)
        if limit != self.limit:  # a changed quota: what was earned under the old one goes
            self.due_ms, self.limit = 0, limit
        if throttle:
            self.throttled_ms += throttle
            if now_ms + throttle > self.due_ms:
                self.due_ms = now_ms + throttle
        return throttle, total, window_ms

    def record_request_time(self, handler_ns: int, now_ms: int, limit_percent: float) -> int:
        """``request_percentage``: record handler time; the throttle is capped at one window."""
        return self.record(
            request_time_percent(handler_ns), now_ms, limit_percent, self.config.window_size_ms
        )

    def measure(self, now_ms: int) -> float:
        return self.rate.measure(now_ms)


def request_time_percent(handler_ns: int) -> float:
    """Handler time as Kafka records it for ``request_percentage``: 1 s busy = 100."""
    return handler_ns / 1e7  # * 100 / 1e9, in one correctly rounded step


def max_value_in_window(limit: float, config: QuotaConfig = DEFAULT_CONFIG) -> float:
    """The most a single response may carry and still be within quota even if nothing else was
    recorded (Kafka caps fetch sizes with it): ``limit * window_s``, one window's worth (the
    span counts at least one window). The wiring answers a throttled long-poll later, not
    larger, with it."""
    return limit * config.window_size_ms / 1000.0


# --- mutations (KIP-599) -----------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class MutationDecision:
    """``accepted`` and, when not, how long to wait (the response's throttle time)."""

    accepted: bool
    throttle_time_ms: int

    def raise_if_refused(self) -> None:
        if not self.accepted:
            raise ThrottlingQuotaExceededError(self.throttle_time_ms)


class TokenBucket:
    """KIP-599's token bucket: refills at ``rate``/s up to a burst of
    ``rate * window_num * window_size_s``; starts full."""

    __slots__ = ("_config", "_last_ms", "_tokens")

    def __init__(self, config: QuotaConfig = DEFAULT_CONFIG) -> None:
        self._config = config
        self._tokens: float | None = None  # None: full at first use
        self._last_ms = 0

    def burst(self, rate: float) -> float:
        return rate * self._config.window_num * self._config.window_size_ms / 1000.0

    def tokens(self, now_ms: int, rate: float) -> float:
        burst = self.burst(rate)
        if self._tokens is None:
            self._tokens = burst
        else:
            elapsed_ms = max(now_ms - self._last_ms, 0)
            self._tokens = min(burst, self._tokens + rate * elapsed_ms / 1000.0)
        self._last_ms = now_ms
        return self._tokens

    def acquire(
        self, permits: float, now_ms: int, rate: float, *, strict: bool = True
    ) -> MutationDecision:
        """Take ``permits`` (e.g. partitions created). Strict (Kafka's for current request
        versions): refuse while the bucket is negative, accept otherwise even if this takes it
        negative. Permissive: always accept and report the throttle the debt implies."""
        if math.isinf(rate):
            return MutationDecision(True, 0)
        tokens = self.tokens(now_ms, rate)
        if strict and tokens < 0:
            return MutationDecision(False, self._throttle_ms(tokens, rate))
        self._tokens = min(self.burst(rate), tokens - permits)
        if strict:
            return MutationDecision(True, 0)
        return MutationDecision(True, self._throttle_ms(self._tokens, rate))

    def _throttle_ms(self, tokens: float, rate: float) -> int:
        if tokens >= 0:
            return 0
        if rate <= 0:
            return self._config.throttle_cap_ms
        return round(-tokens / rate * 1000.0)


# --- one broker's sensors and what a throttled response says --------------------------------

SENSOR_IDLE_EXPIRY_MS: Final = 3_600_000  # Kafka's InactiveSensorExpirationTimeSeconds (1 h)
# RateLimit quota units (draft-ietf-httpapi-ratelimit-headers); request time has none.
_QUOTA_UNITS: Final = {
    QuotaType.PRODUCER_BYTE_RATE: "content-bytes",
    QuotaType.CONSUMER_BYTE_RATE: "content-bytes",
}


@dataclass(frozen=True, slots=True)
class Throttle:
    """The outcome of recording one request against its quota.

    ``remaining`` is how much more could be recorded now without a throttle (``inf`` without
    a quota); ``window_ms`` the span the rate was measured over."""

    quota_type: QuotaType
    limit: float
    throttle_time_ms: int
    remaining: float
    window_ms: int
    sensor_key: tuple[str, str]

    def headers(self, config: QuotaConfig = DEFAULT_CONFIG) -> dict[str, str]:
        """Response fields: ``Logbus-Throttle-Time-Ms`` always; ``Retry-After`` (whole
        seconds, rounded up) when throttled; for byte quotas the IETF draft's
        ``RateLimit-Policy`` (quota ``q`` per window ``w`` of ``num - 1`` windows: the policy
        over the span an established client is measured over) and ``RateLimit`` (remaining
        ``r``, seconds to wait ``t``)."""
        out = {"Logbus-Throttle-Time-Ms": str(self.throttle_time_ms)}
        if self.throttle_time_ms > 0:
            out["Retry-After"] = str(-(-self.throttle_time_ms // 1000))
        if self.quota_type in _QUOTA_UNITS and math.isfinite(self.limit):
            policy, q = _rate_limit_policy(self.quota_type, self.limit, config)
            r = max(0, min(q, int(self.remaining)))
            t = -(-self.throttle_time_ms // 1000)
            out["RateLimit-Policy"] = policy
            out["RateLimit"] = f'"{self.quota_type.value}";r={r};t={t}'
        return out


_POLICIES: dict[tuple[QuotaType, float, int, int], tuple[str, int]] = {}
_POLICIES_MAX: Final = 1024  # distinct (type, limit, config): configured quotas, not callers


def _rate_limit_policy(quota_type: QuotaType, limit: float, config: QuotaConfig) -> tuple[str, int]:
    """The ``RateLimit-Policy`` value of a byte quota and its ``q``: the same for every answer
    under that quota, so formatted once (it was ~1 µs of every throttled-path answer)."""
    key = (quota_type, limit, config.window_num, config.window_size_ms)
    hit = _POLICIES.get(key)
    if hit is None:
        w = max((config.window_num - 1) * config.window_size_ms // 1000, 1)
        q = int(limit * w)
        hit = (f'"{quota_type.value}";q={q};qu="{_QUOTA_UNITS[quota_type]}";w={w}', q)
        if len(_POLICIES) >= _POLICIES_MAX:
            _POLICIES.clear()
        _POLICIES[key] = hit
    return hit


# How stale a sensor's place in the LRU may be (QuotaSensors.charge refreshes it at most this
# often): idle expiry is an hour and eviction only needs "recent", not "this millisecond".
LRU_REFRESH_MS: Final = 1000
_THROTTLE_FIELD: Final = b"logbus-throttle-time-ms"
_RETRY_AFTER_FIELD: Final = b"retry-after"
_POLICY_FIELD: Final = b"ratelimit-policy"
_RATE_LIMIT_FIELD: Final = b"ratelimit"
_NOT_THROTTLED: Final = (_THROTTLE_FIELD, b"0")


@dataclass(slots=True)
class Meter:
    """The sensors and limits one caller's requests of one kind are measured against
    (:meth:`QuotaSensors.meter`): a byte quota (producer or consumer) and request time, either
    absent when no quota of that type applies, and the byte quota's ``RateLimit-Policy``."""

    byte_limit: float = math.inf
    byte_res: Resolution | None = None
    byte_key: tuple[QuotaType, tuple[str, str]] = (QuotaType.PRODUCER_BYTE_RATE, ("", ""))
    byte_sensor: RateSensor | None = None
    byte_cap_ms: int = 0
    policy_field: tuple[bytes, bytes] | None = None  # ("ratelimit-policy", its value)
    policy_quota: int = 0
    rate_limit_prefix: bytes = b""  # the RateLimit field's value up to ``r``'s number
    time_limit: float = math.inf
    time_key: tuple[QuotaType, tuple[str, str]] = (QuotaType.REQUEST_PERCENTAGE, ("", ""))
    time_sensor: RateSensor | None = None
    time_cap_ms: int = 0
    # The answer's fields when neither sensor throttles and RateLimit's r is the whole policy
    # (QuotaSensors.charge's quiet path); ``policy_floor``: while a byte sensor's quiet room
    # (what is left less 1 for rounding) stays above it, r is the whole policy (it is the
    # policy's quota; none: always); ``rate_limit_format``: the RateLimit value of an answer
    # not throttled, ``%`` r (the quiet path of a young caller, whose r moves with every
    # request).
    quiet_fields: tuple[tuple[bytes, bytes], ...] = ((b"logbus-throttle-time-ms", b"0"),)
    policy_floor: float = -math.inf
    rate_limit_format: bytes = b""


# A meter holds a byte sensor and a request-time sensor: made one after the other, both must
# stay in the LRU (a meter whose own sensor was dropped would be charged into nothing).
SENSORS_OF_A_METER: Final = 2


class QuotaSensors:
    """Every measured rate of one broker, keyed by (quota type, sensor key).

    Bounded: past ``max_sensors`` (at least :data:`SENSORS_OF_A_METER`, the sensors one
    caller's :class:`Meter` holds, so making a meter never drops its own first sensor) the
    least recently used sensor is dropped, and sensors idle
    for ``idle_expiry_ms`` (Kafka: 1 h) are dropped as they reach the LRU head. Dropping a
    sensor forgets that client's recent rate, which errs in the client's favour. On the
    per-request path (:meth:`charge`) a sensor's place in the LRU is refreshed at most once
    per :data:`LRU_REFRESH_MS`: recency is exact to that, and a request pays no reordering."""

    def __init__(
        self,
        config: QuotaConfig = DEFAULT_CONFIG,
        *,
        max_sensors: int = MAX_QUOTA_SENSORS,
        idle_expiry_ms: int = SENSOR_IDLE_EXPIRY_MS,
    ) -> None:
        self.config = config
        self._max = max(max_sensors, SENSORS_OF_A_METER)
        self._idle_ms = idle_expiry_ms
        self._sensors: OrderedDict[tuple[QuotaType, tuple[str, str]], RateSensor] = OrderedDict()
        self.evictions = 0  # sensors dropped so far: a Meter holding one is stale

    def __len__(self) -> int:
        return len(self._sensors)

    def sensor(self, quota_type: QuotaType, key: tuple[str, str], now_ms: int) -> RateSensor:
        sensors = self._sensors
        k = (quota_type, key)
        sensor = sensors.get(k)
        if sensor is None:
            sensor = sensors[k] = RateSensor(self.config)
        else:
            sensors.move_to_end(k)  # most recently used last
        sensor.used_ms = now_ms
        while sensors:
            oldest = next(iter(sensors.values()))
            if len(sensors) <= self._max and now_ms - oldest.used_ms < self._idle_ms:
                break
            sensors.popitem(last=False)
            self.evictions += 1
        return sensor

    def meter(
        self,
        byte_type: QuotaType | None,
        byte_res: Resolution | None,
        time_res: Resolution | None,
        now_ms: int,
    ) -> Meter:
        """What one caller's requests are measured against, resolved once (a caller memoises
        it per table and while :attr:`evictions` is unchanged): :meth:`charge` then records a
        request with a few additions."""
        m = Meter()
        if byte_type is not None and byte_res is not None:
            m.byte_res, m.byte_limit = byte_res, byte_res.limit
            m.byte_cap_ms = self.config.throttle_cap_ms
            m.byte_key = (byte_type, byte_res.sensor_key)
            m.byte_sensor = self._fresh(byte_type, byte_res, now_ms)
            if byte_type in _QUOTA_UNITS:
                policy, m.policy_quota = _rate_limit_policy(byte_type, byte_res.limit, self.config)
                m.policy_field = (_POLICY_FIELD, policy.encode())
                m.rate_limit_prefix = f'"{byte_type.value}";r='.encode()
                m.policy_floor = float(m.policy_quota)
                m.rate_limit_format = m.rate_limit_prefix + b"%d;t=0"
                full = m.rate_limit_format % m.policy_quota
                m.quiet_fields = (_NOT_THROTTLED, m.policy_field, (_RATE_LIMIT_FIELD, full))
        if time_res is not None:
            m.time_limit = time_res.limit
            m.time_cap_ms = self.config.window_size_ms  # request time: one window (Kafka)
            m.time_key = (QuotaType.REQUEST_PERCENTAGE, time_res.sensor_key)
            m.time_sensor = self._fresh(QuotaType.REQUEST_PERCENTAGE, time_res, now_ms)
        return m

    def _fresh(self, quota_type: QuotaType, res: Resolution, now_ms: int) -> RateSensor:
        """The sensor of ``res``; if its quota changed, what it owes is recomputed under the
        new limit (a raised quota frees the caller at once)."""
        sensor = self.sensor(quota_type, res.sensor_key, now_ms)
        if sensor.limit != res.limit and not math.isinf(sensor.limit):
            self.observe(quota_type, res, 0, now_ms)
        return sensor

    def charge(
        self,
        meter: Meter,
        value: float,
        handler_ns: int,
        now_ms: int,
        fields: list[tuple[bytes, bytes]] | None = None,
    ) -> list[tuple[bytes, bytes]]:
        """Record one request (``value`` bytes of the meter's byte quota, ``handler_ns`` of
        handler time) and return its response fields, as :meth:`Throttle.headers` renders
        them for the largest throttle (the byte quota's ``RateLimit`` fields besides),
        appended to ``fields`` when given (the answer's own). The
        per-request path: no objects but the fields themselves, and no call but the sensors'
        (it runs on every request under quota; each call or format here was measured).

        A caller below its quota takes the quiet path: while every sensor of the meter is
        quiet (see :class:`RateSensor`: within the sample and the summary the last full charge
        read, the same limit, and this value smaller than the room that charge left) no
        throttle can come of it, so the value is added to the current sample and the room.
        The fields are the meter's ``quiet_fields`` while the byte sensor's room stays above
        the meter's ``policy_floor`` (RateLimit's r is the whole policy: a caller with a span
        of history); for a young caller r (what is left of its quota over the time since its
        first sample, at least one window: it moves with every request) is computed from the
        sample summary as the full path computes it. Either way the answer is the full
        path's (tests/auth_quotas/test_quotas.py checks both paths against each other and
        against recording). Measured with callgrind (``python -m benchmarks.quota_charge``:
        charge alone, the benchmark's quota): ≈ 3.5k instructions a request for an
        established caller, ≈ 8k for a young one, whose requests took the full path
        (≈ 10.2k) before r was computed here."""
        byte_sensor = meter.byte_sensor
        time_sensor = meter.time_sensor
        percent = handler_ns / 1e7  # request_time_percent
        # Not quiet: the full path, a call away, so that every jump here stays short (CPython
        # 3.11 specializes a comparison only when its jump needs no EXTENDED_ARG).
        if not (
            (
                byte_sensor is None
                or (
                    now_ms < byte_sensor.quiet_until
                    and value < byte_sensor.room
                    and meter.byte_limit == byte_sensor.limit
                )
            )
            and (
                time_sensor is None
                or (
                    now_ms < time_sensor.quiet_until
                    and percent < time_sensor.room
                    and meter.time_limit == time_sensor.limit
                )
            )
        ):
            return self._charge_full(meter, value, percent, now_ms, fields)
        if time_sensor is not None:
            head = time_sensor.rate.head
            assert head is not None  # quiet only after a sample was recorded
            head.value += percent
            head.last_ms = now_ms
            time_sensor.room -= percent
        if fields is None:
            fields = []
        if byte_sensor is None:
            fields.extend(meter.quiet_fields)
            return fields
        rate = byte_sensor.rate
        head = rate.head
        assert head is not None
        head.value += value
        head.last_ms = now_ms
        room = byte_sensor.room - value
        byte_sensor.room = room
        if room > meter.policy_floor:  # r is still the whole policy
            fields.extend(meter.quiet_fields)
            return fields
        # r as the full path's inlined branch computes it (the same operations, in the same
        # order, on the same summary: the same float).
        window_ms = now_ms - rate.oldest
        if window_ms < rate.window_size_ms:
            window_ms = rate.window_size_ms
        left = meter.byte_limit * window_ms / 1000 - (rate.others + head.value)
        quota = meter.policy_quota
        policy = meter.policy_field
        assert policy is not None  # else the floor is -inf: r is never computed
        fields.append(_NOT_THROTTLED)
        fields.append(policy)
        # r: left itself when between 0 and the quota (%d truncates it as the full path's
        # int() does, without the call).
        r = quota if left >= quota else left if left > 0 else 0
        fields.append((_RATE_LIMIT_FIELD, meter.rate_limit_format % r))
        return fields

    def _charge_full(
        self,
        meter: Meter,
        value: float,
        percent: float,
        now_ms: int,
        fields: list[tuple[bytes, bytes]] | None,
    ) -> list[tuple[bytes, bytes]]:
        """:meth:`charge` when a sensor is not quiet (``percent``: the handler time as
        :func:`request_time_percent` records it): each sensor read and recorded, its quiet
        room set again when it is far enough below its quota."""
        byte_sensor = meter.byte_sensor
        time_sensor = meter.time_sensor
        # Each sensor's commonest case is RateSensor.observe inlined (a call is most of what
        # it costs): within the current sample, the same limit, under quota (throttle 0).
        # Anything else goes through observe (which records nothing more with value 0).
        worst = byte_throttle = left_units = 0
        policy = None
        sensor = byte_sensor
        if sensor is not None:
            rate = sensor.rate
            head = rate.head
            limit = meter.byte_limit
            size_ms = rate.window_size_ms
            if (
                now_ms < rate.fresh_until
                and head is not None
                and now_ms - head.start_ms < size_ms
                and limit == sensor.limit
            ):
                head.value += value
                head.last_ms = now_ms
                total = rate.others + head.value
                window_ms = now_ms - rate.oldest
                if window_ms < size_ms:
                    window_ms = size_ms
                if total * 1000.0 > limit * window_ms:
                    byte_throttle, total, window_ms = sensor.observe(
                        0, now_ms, limit, meter.byte_cap_ms
                    )
                    quiet_from = None
                else:
                    quiet_from = head
            else:
                byte_throttle, total, window_ms = sensor.observe(
                    value, now_ms, limit, meter.byte_cap_ms
                )
                quiet_from = None
            worst = byte_throttle
            if now_ms - sensor.used_ms >= LRU_REFRESH_MS:
                self._sensors.move_to_end(meter.byte_key)
                sensor.used_ms = now_ms
            left = limit * window_ms / 1000 - total
            if quiet_from is not None and left > 1.0:
                # The room the next requests may take quietly (1 kept back for rounding),
                # until the sample or the summary of the others rolls or the LRU place is due.
                sensor.room = left - 1.0
                until: float = quiet_from.start_ms + size_ms
                if rate.fresh_until < until:
                    until = rate.fresh_until
                if sensor.used_ms + LRU_REFRESH_MS < until:
                    until = sensor.used_ms + LRU_REFRESH_MS
                sensor.quiet_until = until
            policy = meter.policy_field
            if policy is not None:  # RateLimit's r: what is left of the policy's quota
                quota = meter.policy_quota
                left_units = quota if left >= quota else 0 if left <= 0 else int(left)
        sensor = time_sensor
        if (
            sensor is not None
            and now_ms < sensor.quiet_until
            and percent < sensor.room
            and meter.time_limit == sensor.limit
        ):  # the time sensor alone is quiet (a young byte sensor): its value only
            head = sensor.rate.head
            assert head is not None
            head.value += percent
            head.last_ms = now_ms
            sensor.room -= percent
        elif sensor is not None:
            rate = sensor.rate
            head = rate.head
            limit = meter.time_limit
            size_ms = rate.window_size_ms
            if (
                now_ms < rate.fresh_until
                and head is not None
                and now_ms - head.start_ms < size_ms
                and limit == sensor.limit
            ):
                head.value += percent
                head.last_ms = now_ms
                window_ms = now_ms - rate.oldest
                if window_ms < size_ms:
                    window_ms = size_ms
                used = rate.others + head.value
                if used * 1000.0 > limit * window_ms:
                    throttle = sensor.observe(0, now_ms, limit, meter.time_cap_ms)[0]
                    if throttle > worst:
                        worst = throttle
                    quiet_from = None
                else:
                    quiet_from = head
            else:
                throttle = sensor.observe(percent, now_ms, limit, meter.time_cap_ms)[0]
                if throttle > worst:
                    worst = throttle
                quiet_from = None
            if now_ms - sensor.used_ms >= LRU_REFRESH_MS:
                self._sensors.move_to_end(meter.time_key)
                sensor.used_ms = now_ms
            if quiet_from is not None:
                room = limit * window_ms / 1000 - used - 1.0
                if room > 0:
                    sensor.room = room
                    until = quiet_from.start_ms + size_ms
                    if rate.fresh_until < until:
                        until = rate.fresh_until
                    if sensor.used_ms + LRU_REFRESH_MS < until:
                        until = sensor.used_ms + LRU_REFRESH_MS
                    sensor.quiet_until = until
        if fields is None:
            fields = []
        if worst:
            fields.append((_THROTTLE_FIELD, b"%d" % worst))
            fields.append((_RETRY_AFTER_FIELD, b"%d" % -(-worst // 1000)))
        else:
            fields.append(_NOT_THROTTLED)
        if policy is not None:
            fields.append(policy)
            t = -(-byte_throttle // 1000)
            fields.append(
                (_RATE_LIMIT_FIELD, meter.rate_limit_prefix + b"%d;t=%d" % (left_units, t))
            )
        return fields

    def owed(self, meter: Meter, now_ms: int) -> int:
        """How long the caller of ``meter`` must wait now (:meth:`owed_ms` of its sensors)."""
        owed = 0
        if meter.byte_sensor is not None:
            owed = meter.byte_sensor.due_ms - now_ms
        if meter.time_sensor is not None and meter.time_sensor.due_ms - now_ms > owed:
            owed = meter.time_sensor.due_ms - now_ms
        return owed if owed > 0 else 0

    def owed_ms(self, quota_type: QuotaType, resolution: Resolution, now_ms: int) -> int:
        """How much longer the throttle the caller's recorded traffic earned lasts (0: none):
        the wait of a request arriving now. O(1), unlike reading the rate; after a quota
        change, the rate is read again against the new limit."""
        sensor = self._sensors.get((quota_type, resolution.sensor_key))
        if sensor is None:
            return 0
        if resolution.limit != sensor.limit:
            return self.observe(quota_type, resolution, 0, now_ms)[0]
        owed = sensor.due_ms - now_ms
        return owed if owed > 0 else 0

    def record(
        self, quota_type: QuotaType, resolution: Resolution, value: float, now_ms: int
    ) -> Throttle:
        """Record ``value`` (bytes; for ``request_percentage`` handler nanoseconds) for the
        caller ``resolution`` describes and say how long to delay its response."""
        throttle, total, window_ms = self.observe(quota_type, resolution, value, now_ms)
        limit = resolution.limit
        remaining = math.inf if math.isinf(limit) else max(limit * window_ms / 1000 - total, 0.0)
        return Throttle(quota_type, limit, throttle, remaining, window_ms, resolution.sensor_key)

    def observe(
        self, quota_type: QuotaType, resolution: Resolution, value: float, now_ms: int
    ) -> tuple[int, float, int]:
        """:meth:`record` without building its :class:`Throttle`: (throttle time in ms, the
        window's total, its span in ms). For asking how throttled a caller is now (``value``
        0) on every request."""
        sensor = self.sensor(quota_type, resolution.sensor_key, now_ms)
        if quota_type is QuotaType.REQUEST_PERCENTAGE:
            return sensor.observe(
                request_time_percent(int(value)),
                now_ms,
                resolution.limit,
                self.config.window_size_ms,
            )
        return sensor.observe(value, now_ms, resolution.limit, None)

    def recent(self, limit: int) -> list[tuple[tuple[QuotaType, tuple[str, str]], RateSensor]]:
        """The ``limit`` most recently used sensors, newest first (``/metrics`` shows these,
        so its label cardinality is bounded whatever the sensor cap)."""
        out: list[tuple[tuple[QuotaType, tuple[str, str]], RateSensor]] = []
        for k, s in reversed(self._sensors.items()):
            if len(out) >= limit:
                break
            out.append((k, s))
        return out

    def rates(self, now_ms: int) -> dict[tuple[QuotaType, tuple[str, str]], float]:
        """The current rate of every sensor (for ``/metrics``)."""
        return {k: s.measure(now_ms) for k, s in self._sensors.items()}
