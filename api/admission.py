"""A repeated request admitted by one lookup: who sends it and what measures it.

Theory of operation
-------------------
Clients repeat themselves: a producer sends the same credential, client id, method and path
with every request. The first is decided the long way: :class:`api.access.Access`
authenticates and authorizes it, and :func:`api.quota_gate.serve` checks its client id and
finds the meter its quotas measure it with. :class:`Admissions` remembers the outcome, keyed by
(``Authorization``, ``Logbus-Client-Id``, method, path): the identity, and the meter (None:
no quota applies). A repeat is admitted by one lookup and handed to
:func:`api.quota_gate.serve_known`, which does only what varies from request to request: the
body's declared size, and a throttle the caller may owe. On the benchmark's secured produce
(``python -m benchmarks.request_cost --server --callgrind --auth quota``) the secured request
went from 324 k to 311 k instructions with this and the C clocks, against 284-289 k for the
same request without authentication or quota (docs/benchmarks.md).

What an admission was decided on, and stays valid only while it is unchanged:

* the security snapshot (users, keys, ACLs: :attr:`api.security.Security.generation`), the
  quota table (:attr:`api.quota_state.QuotaState.generation`) and the quota sensors (a dropped
  one: :attr:`auth_quotas.quotas.QuotaSensors.evictions`). A change to any of them makes every
  entry stale at once, so a revocation is as prompt as on the long way;
* the credential's verification, while within its TTL (the entry expires with it, as the
  security layer's own caches do).

What is never remembered, so always takes the long way: a credential the security layer does
not remember by its header value (a scoped token, a JWT, which is validated every time since
it expires, a client certificate, no credential at all when authentication is on); a fetch (it
is clamped and paced: :func:`api.quota_gate.serve`'s whole way) and anything but HTTP. A
request carrying a header only a broker sends, a header name twice, or asking for an event
stream (which may name its client id in the query) is looked up in no memo at all.

Bounded: :data:`ADMISSIONS_MAX` entries, all dropped when full (clients repeat theirs).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from starlette.types import Scope

from auth_quotas.credentials import Identity
from auth_quotas.limits import VERIFIED_KEY_CACHE_TTL_MS
from auth_quotas.quotas import Meter
from core_log.errors import LogbusError

from . import quota_gate
from .access import FROM_A_BROKER_NAMES, IDENTITY_KEY
from .guard import HEADERS_KEY, request_headers
from .quota_state import QuotaState, client_id, quota_user
from .security import Security

ADMISSIONS_MAX: Final = 4096  # distinct (credential, client id, method, path) remembered


@dataclass(frozen=True, slots=True)
class Admitted:
    """One remembered admission. ``identity`` None: authentication is off (the quota user is
    ``ANONYMOUS``); ``expires_ms``: when the credential's verification expires, on the
    security clock; ``meter`` None: no quota applies; ``produce``: the meter charges the
    body's declared size (else 0, as the quota gate charges requests that are no produce)."""

    identity: Identity | None
    expires_ms: int
    meter: Meter | None
    produce: bool
    security_generation: int
    quota_generation: int
    evictions: int


class Admissions:
    """The remembered admissions (see the module docstring)."""

    __slots__ = ("_entries",)

    def __init__(self) -> None:
        self._entries: dict[tuple[str, str, str, str], Admitted] = {}

    def __len__(self) -> int:
        return len(self._entries)

    def find(self, scope: Scope, security: Security | None, quotas: QuotaState) -> Admitted | None:
        """The admission of this HTTP request if it repeats one remembered and nothing it was
        decided on changed since; None: decide it the long way. ``security`` None:
        authentication is off."""
        headers = scope.get(HEADERS_KEY)
        if headers is None:
            headers = request_headers(scope)
        if not _repeatable(scope, headers):
            return None
        entry = self._entries.get(
            (
                headers.get("authorization", ""),
                headers.get("logbus-client-id", ""),
                scope["method"],
                scope["path"],
            )
        )
        if (
            entry is None
            or entry.quota_generation != quotas.generation
            or entry.evictions != quotas.sensors.evictions
        ):
            return None
        if security is not None and (
            entry.security_generation != security.generation
            or security.now_ms() >= entry.expires_ms
        ):
            return None
        return entry

    def learn(self, scope: Scope, security: Security | None, quotas: QuotaState) -> None:
        """Remember the admission of an HTTP request the long way has just admitted (its
        identity, if any, is in the scope), when a repeat of it may be admitted by
        :meth:`find`. Everything is decided again here, from the same state the long way
        read, so what is remembered is what the long way decided."""
        method: str = scope["method"]
        path: str = scope["path"]
        kind = quota_gate.request_kind(method, path)
        if kind not in ("produce", "other"):
            return  # a fetch or a mutation: serve's whole way, every time
        headers = request_headers(scope)
        if not _repeatable(scope, headers):
            return
        authorization = headers.get("authorization", "")
        identity = None
        expires_ms = 0
        security_generation = 0
        if security is not None:
            known = security.known(authorization) if authorization else None
            # Only a credential remembered by its value, the very identity admitted, unscoped.
            if known is None or known[0] is not scope.get(IDENTITY_KEY):
                return
            identity = known[0]
            if identity.topics is not None:
                return
            expires_ms = known[1] + VERIFIED_KEY_CACHE_TTL_MS
            security_generation = security.generation
        try:
            client = client_id(scope, query_too=False)
        except LogbusError:
            return  # refused by the quota gate
        produce = kind == "produce"
        meter = None
        if quotas.active:
            meter = quotas.meter(quota_user(scope), client, quota_gate.P if produce else None)
        if len(self._entries) >= ADMISSIONS_MAX:
            self._entries.clear()
        key = (authorization, headers.get("logbus-client-id", ""), method, path)
        self._entries[key] = Admitted(
            identity,
            expires_ms,
            meter,
            produce,
            security_generation,
            quotas.generation,
            quotas.sensors.evictions,  # after meter(): making its sensors may drop others
        )


def _repeatable(scope: Scope, headers: dict[str, str]) -> bool:
    """Whether a request may be looked up at all: no header name twice (the decoded headers
    are then the raw list, so the client id is the one sent), none only a broker sends, and
    no event stream asked for (its client id may be in the query)."""
    raw = scope["headers"]
    return (
        len(headers) == len(raw)
        and FROM_A_BROKER_NAMES.isdisjoint(headers)
        and not quota_gate.asks_event_stream(headers, raw)
    )
