"""The broker's security state: who a request is, and what it may do.

Theory of operation
-------------------
Users, keys, ACLs and the cluster secrets live in the metadata store
(:mod:`cluster.security_store`); a :class:`cluster.security_watcher.SecurityWatcher` polls its
version every 250 ms and hands each new snapshot to :meth:`Security.apply`, which swaps in, in
one step on the event loop:

* an :class:`~auth_quotas.acl.AclSet` (the indexed ACLs: a decision is a few dict lookups);
* ``key_id → StoredKey`` (the argon2 hashes); keys that are gone (revoked, their user deleted)
  or changed are evicted from the :class:`~auth_quotas.credentials.ApiKeyVerifier`'s cache, so
  a revocation is in force on every broker within a poll interval plus one snapshot read;
* a :class:`~auth_quotas.credentials.ScopedTokenSigner` over the cluster secrets, and the
  :class:`cluster.interbroker.ClusterCredential` the broker's h2c link and proxy use;
* and tells the listeners (live WebSocket sessions) so they re-check their identity and
  subscriptions.

*Costs* per request (:meth:`Security.authenticate`, :meth:`Security.allowed`): an API key's
``Authorization`` value is looked up in a dict of the values verified since the last snapshot
(bounded, and emptied by every snapshot, so a revocation is never outlived); a first sight
goes through the verifier's cache (a BLAKE2b of the token) and, on a miss, looks the key id up
in the in-memory snapshot (no store read) and runs argon2 in a worker thread (~0.1 s, once per
key per 5 minutes). Scoped tokens are one HMAC, JWTs one signature check. A decision of
:func:`auth_quotas.acl.authorize` is remembered per (principal, operation, resource) until the
next snapshot. So a repeat request costs a few dict lookups (measured: the whole check, rule
match included, ~6 µs against ~60 µs uncached on the loaded 2-core VM). The front door's
:meth:`api.access.Access.admit` goes one step further: a request it admitted (same
``Authorization`` value, method and path) is remembered, until the next snapshot and within
the credential's verification TTL, so a repeat is one lookup and one clock read (callgrind,
in-process: ≈ 10k instructions a request against ≈ 34k for the coroutine check).

*Bootstrap* (:meth:`Security.bootstrap`): with authentication on and no user in the store, the
broker creates user ``admin`` with one ALLOW ``all`` ACL per resource type on ``*`` — stored
ACLs, not a per-broker super-user setting, so every broker of the cluster agrees and an
operator can later narrow or remove them like any other ACL. The key is ``bootstrap_key``
(automation: every broker is given the same one and adds it idempotently) or a generated key
printed once on stderr by the one broker whose ``create_user`` won: the store serialises
security writes (a row lock on PostgreSQL, the write lock on SQLite), so three brokers starting
at once create exactly one admin and print exactly one key.

With authentication off, every request is ``User:ANONYMOUS`` and allowed: the state is still
loaded (the ``/v1/users`` and ``/v1/acls`` routes work, so an operator can prepare users and
ACLs before switching authentication on).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import sys
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Final

from argon2 import PasswordHasher

from auth_quotas.acl import (
    Acl,
    AclSet,
    Operation,
    PatternType,
    Resource,
    ResourceType,
    authorization_error,
    authorize,
    describable,
    parse_acl,
    principal_for,
)
from auth_quotas.credentials import (
    ApiKeyVerifier,
    BasicCredentials,
    Identity,
    JwtValidator,
    KeyFailureLimiter,
    ScopedTokenSigner,
    StoredKey,
    default_hasher,
    generate_api_key,
    hash_api_key,
    parse_api_key,
    parse_authorization,
)
from auth_quotas.errors import (
    AuthenticationError,
    InvalidAclError,
    InvalidCredentialsError,
    MalformedCredentialsError,
    MissingCredentialsError,
)
from auth_quotas.limits import VERIFIED_KEY_CACHE_ENTRIES, VERIFIED_KEY_CACHE_TTL_MS
from cluster.interbroker import ClusterCredential
from cluster.security_store import (
    AclRow,
    DuplicateResourceError,
    SecuritySnapshot,
    SecurityStore,
)
from cluster.security_watcher import SecurityWatcher
from core_log.errors import LogbusError

from .settings import Settings

log = logging.getLogger("logbus.security")

ANONYMOUS: Final = "ANONYMOUS"
# Decisions remembered until the next snapshot: (principal, operation, resource) triples a
# broker sees; ~150 bytes each, so the cap is ~15 MB at worst (cleared when reached).
DECISION_CACHE_ENTRIES: Final = 100_000
MAX_CONCURRENT_HASHES: Final = 1
ANONYMOUS_IDENTITY: Final = Identity(ANONYMOUS, "internal")
BOOTSTRAP_USER: Final = "admin"
# The header a forwarding broker names the original principal in; trusted only together with a
# valid cluster credential (api.access strips it otherwise).
PRINCIPAL_HEADER: Final = "logbus-principal"
# With it, for a scoped token's request: the token's topics (comma-separated; topic names hold
# no comma), so the target limits the forwarded request as the token is limited here.
PRINCIPAL_TOPICS_HEADER: Final = "logbus-principal-topics"
# What a scoped token may do besides its topics' read/describe: join and read as a group
# member (an SSE member stream). Nothing else: no writes, no admin.
_SCOPED_OPERATIONS: Final = frozenset({Operation.READ, Operation.DESCRIBE})


def bootstrap_acls(user: str = BOOTSTRAP_USER) -> list[AclRow]:
    """ALLOW ``all`` on every resource of every type: a super user every broker agrees on."""
    principal = principal_for(user)
    return [
        AclRow(principal, t.value, "*", PatternType.LITERAL.value, "all", "allow")
        for t in ResourceType
    ]


def acl_from_row(row: AclRow) -> Acl | None:
    try:
        return parse_acl(
            {
                "principal": row.principal,
                "resource_type": row.resource_type,
                "name": row.name,
                "pattern": row.pattern,
                "operation": row.operation,
                "permission": row.permission,
            }
        )
    except InvalidAclError:
        return None  # written by a newer broker; ignored (logged once per snapshot)


def acl_row(acl: Acl) -> AclRow:
    return AclRow(
        acl.principal,
        acl.resource_type.value,
        acl.name,
        acl.pattern.value,
        acl.operation.value,
        acl.permission.value,
    )


@dataclass
class AuthStats:
    """Counters for /metrics: authentication failures by reason, denials by resource type."""

    failures: dict[str, int]
    denials: dict[str, int]


def _wall_ms() -> int:
    """Wall-clock milliseconds (keys and tokens expire by the wall clock)."""
    return time.time_ns() // 1_000_000


wall_ms: Callable[[], int]
try:  # the C twin: no Python frame on every repeated request (api.admission reads it)
    from ._steptimer import wall_ms
except ImportError:  # built with LOGBUS_PURE_PYTHON=1
    wall_ms = _wall_ms


class Security:
    """See the module docstring. ``enabled`` False: everyone is ``User:ANONYMOUS``, allowed."""

    def __init__(
        self,
        settings: Settings,
        *,
        hasher_factory: Callable[[], PasswordHasher] = default_hasher,
        now_ms: Callable[[], int] = wall_ms,
    ) -> None:
        self.settings = settings
        self.enabled = settings.auth
        self.super_users = frozenset(settings.super_users)
        self.allow_everyone = settings.allow_everyone_if_no_acl_found
        self.hasher = hasher_factory()
        self.verifier = ApiKeyVerifier(self.hasher)
        # Guessing a known key id's secret: see auth_quotas.credentials.KEY_FAILURES_MAX.
        self.key_failures = KeyFailureLimiter()
        # argon2 verifications at once (~0.1 s of a core each): a burst of new connections
        # with un-cached keys queues here instead of taking every core from the event loop.
        self._hashing = asyncio.Semaphore(MAX_CONCURRENT_HASHES)
        self.now_ms = now_ms
        self.acls: AclSet = AclSet()
        self.keys: dict[str, StoredKey] = {}
        self.users: frozenset[str] = frozenset()
        self.signer: ScopedTokenSigner | None = None
        self.credential = ClusterCredential() if self.enabled else None
        self.version = -1
        self.applied_at_poll = 0
        self.jwt: JwtValidator | None = None
        if settings.jwt_jwks_file is not None:
            assert settings.jwt_issuer is not None and settings.jwt_audience is not None
            self.jwt = JwtValidator.from_jwks_file(
                settings.jwt_jwks_file, issuer=settings.jwt_issuer, audience=settings.jwt_audience
            )
        self.listeners: set[Callable[[], None]] = set()
        # Told every snapshot applied, with it (api.quota_state takes the quotas from it).
        self.snapshot_listeners: list[Callable[[SecuritySnapshot], None]] = []
        # The per-request path in dict lookups (see "Costs" in the module docstring); all
        # are emptied by every snapshot applied, so no change outlives a reload.
        self._by_header: dict[str, tuple[Identity, int]] = {}
        # (Authorization value, method, path) -> (identity, when verified): requests the
        # front door admitted (api.access.Access.admit), so a repeat is one lookup.
        self._admitted: dict[tuple[str, str, str], tuple[Identity, int]] = {}
        # (user, operation, resource type, resource name) -> allowed
        self._decisions: dict[tuple[str, Operation, ResourceType, str], bool] = {}
        # Snapshots applied: what the front door decided from the caches above is stale when
        # this moved (api.admission).
        self.generation = 0
        self.stats = AuthStats({}, {})
        self.store: SecurityStore | None = None
        self.watcher: SecurityWatcher | None = None
        self.applied = asyncio.Event()  # set after every snapshot applied (tests wait on it)

    # -- lifecycle -------------------------------------------------------------------------------

    async def start(self, store: SecurityStore) -> None:
        """Make the cluster secret, bootstrap the admin if needed, load, and watch."""
        self.store = store
        await asyncio.to_thread(store.ensure_cluster_secret)
        watcher = SecurityWatcher(store, self.apply)
        snapshot = await watcher.refresh()
        if self.enabled and not snapshot.users:
            await self.bootstrap(store)
            await watcher.refresh()
        self.watcher = watcher
        watcher.start()

    async def refresh(self) -> None:
        """Load the store's state now (after a change made here: read your writes)."""
        if self.watcher is not None:
            await self.watcher.refresh()

    async def stop(self) -> None:
        if self.watcher is not None:
            await self.watcher.stop()

    async def bootstrap(self, store: SecurityStore) -> None:
        """Create the first admin (see the module docstring); exactly one broker wins."""
        given = self.settings.bootstrap_key
        now = self.now_ms()
        try:
            await asyncio.to_thread(store.create_user, BOOTSTRAP_USER, now)
            won = True
        except DuplicateResourceError:
            won = False
        if given is None and not won:
            return
        await asyncio.to_thread(store.add_acls, bootstrap_acls(), now)
        if given is not None:
            key_id = parse_api_key(given)
            digest = await asyncio.to_thread(hash_api_key, given, self.hasher)
            # Another broker given the same key may have added it first.
            with contextlib.suppress(DuplicateResourceError):
                await asyncio.to_thread(
                    store.add_key, BOOTSTRAP_USER, key_id, digest, "bootstrap", now
                )
            if won:
                log.warning("bootstrap: created user %r with the key from bootstrap_key", "admin")
            return
        new = generate_api_key()
        digest = await asyncio.to_thread(hash_api_key, new.token, self.hasher)
        await asyncio.to_thread(store.add_key, BOOTSTRAP_USER, new.key_id, digest, "bootstrap", now)
        # Printed once, on stderr, never logged: the only copy of the key.
        print(
            f"Bootstrap admin created: user {BOOTSTRAP_USER!r}, API key (shown once):\n"
            f"    {new.token}\n"
            "Keep it; create your own users and keys with it, then revoke it.",
            file=sys.stderr,
            flush=True,
        )

    def apply(self, snapshot: SecuritySnapshot) -> None:
        """Swap in a snapshot (on the event loop; see the module docstring)."""
        acls = []
        ignored = 0
        for row in snapshot.acls:
            acl = acl_from_row(row)
            if acl is None:
                ignored += 1
            else:
                acls.append(acl)
        if ignored:
            log.warning("%d stored ACLs not understood by this broker: ignored", ignored)
        keys = {k.key_id: StoredKey(k.key_id, k.user, k.hash) for k in snapshot.keys}
        for key_id, old in self.keys.items():
            if keys.get(key_id) != old:
                self.verifier.invalidate(key_id)
        self.keys = keys
        self.users = frozenset(u.name for u in snapshot.users)
        self.acls = AclSet(acls)
        self._by_header = {}
        self._admitted = {}
        self._decisions = {}
        self.generation += 1
        if snapshot.secrets:
            self.signer = ScopedTokenSigner(snapshot.secrets[0], snapshot.secrets[1:])
            if self.credential is not None:
                self.credential.set_secrets(snapshot.secrets)
        self.version = snapshot.version
        # The watcher's poll count when this state was applied (tests bound propagation in
        # polls: exact, however late a loaded machine runs the watcher or the test's probe).
        self.applied_at_poll = self.watcher.polls if self.watcher is not None else 0
        for on_snapshot in self.snapshot_listeners:
            try:
                on_snapshot(snapshot)
            except Exception:
                log.exception("security snapshot listener failed")
        for listener in list(self.listeners):
            try:
                listener()
            except Exception:
                log.exception("security listener failed")
        self.applied.set()
        self.applied = asyncio.Event()

    # -- authentication --------------------------------------------------------------------------

    async def authenticate(self, authorization: str | None, query_token: str | None) -> Identity:
        """The identity of a request's ``Authorization`` header, or (none given) of a scoped
        token from the query string. Raises :class:`AuthenticationError` (401)."""
        if not self.enabled:
            return ANONYMOUS_IDENTITY
        if not authorization:
            if query_token:
                return self.verify_scoped(query_token)
            raise MissingCredentialsError("no credentials: send Authorization: Bearer <key>")
        now = self.now_ms()
        hit = self._by_header.get(authorization)
        if hit is not None and now - hit[1] < VERIFIED_KEY_CACHE_TTL_MS:
            return hit[0]
        creds = parse_authorization(authorization)
        if isinstance(creds, BasicCredentials):
            identity = await self._api_key(creds.password, now)
            if identity.user != creds.user:
                raise InvalidCredentialsError("unknown or revoked API key")
            return self._remember(
                authorization, Identity(identity.user, "basic", identity.key_id), now
            )
        kind = creds.kind
        if kind == "api_key":
            return self._remember(authorization, await self._api_key(creds.token, now), now)
        if kind == "scoped":
            return self.verify_scoped(creds.token)
        if self.jwt is None:
            raise MalformedCredentialsError("not an API key or scoped token (no JWT issuer set)")
        return self.jwt.validate(creds.token, now)

    def known(self, authorization: str) -> tuple[Identity, int] | None:
        """The identity of an ``Authorization`` value :meth:`authenticate` verified since
        the last snapshot and within the verifier's TTL, and when it was verified; None
        otherwise (then authenticate it): the entry, and the expiry, that
        :meth:`authenticate` answers from."""
        hit = self._by_header.get(authorization)
        if hit is None or self.now_ms() - hit[1] >= VERIFIED_KEY_CACHE_TTL_MS:
            return None
        return hit

    def admitted(self, authorization: str, method: str, path: str) -> Identity | None:
        """The identity of a request :meth:`admit_again` remembered (its credential verified
        and its rule passed since the last snapshot), while the credential's verification is
        within its TTL; None otherwise."""
        hit = self._admitted.get((authorization, method, path))
        if hit is None or self.now_ms() - hit[1] >= VERIFIED_KEY_CACHE_TTL_MS:
            return None
        return hit[0]

    def admit_again(
        self, authorization: str, method: str, path: str, identity: Identity, verified_ms: int
    ) -> None:
        """Remember that this request was admitted (``verified_ms``: when its credential was
        verified, so the entry expires with it), until the next snapshot; bounded like the
        verifier's cache."""
        if len(self._admitted) >= VERIFIED_KEY_CACHE_ENTRIES:
            self._admitted.clear()
        self._admitted[(authorization, method, path)] = (identity, verified_ms)

    def _remember(self, header: str, identity: Identity, now: int) -> Identity:
        """An API key's header value → its identity, until the next snapshot (a revocation
        is one) or the verifier's TTL; bounded like the verifier's cache."""
        if len(self._by_header) >= VERIFIED_KEY_CACHE_ENTRIES:
            self._by_header.clear()
        self._by_header[header] = (identity, now)
        return identity

    def verify_scoped(self, token: str) -> Identity:
        if self.signer is None:
            raise InvalidCredentialsError("scoped tokens are not available yet")
        return self.signer.verify(token, self.now_ms()).identity()

    async def _api_key(self, token: str, now: int) -> Identity:
        hit = self.verifier.cached(token, now)
        if hit is not None:
            return hit
        key_id = parse_api_key(token)
        if key_id not in self.keys or self.key_failures.blocked(key_id, now):
            raise InvalidCredentialsError("unknown or revoked API key")  # no hash
        async with self._hashing:
            # Many connections of one client arrive at once (a restart): the first verifies,
            # the others find it cached here instead of hashing in turn. Guesses queued
            # behind the ones that reached the limit, and a key revoked meanwhile, are
            # refused here without a hash.
            hit = self.verifier.cached(token, now)
            if hit is not None:
                return hit
            epoch = self.verifier.epoch
            stored = self.keys.get(key_id)
            if stored is None or self.key_failures.blocked(key_id, self.now_ms()):
                raise InvalidCredentialsError("unknown or revoked API key")
            try:
                identity = await asyncio.to_thread(self.verifier.check, token, stored)
            except InvalidCredentialsError:
                self.key_failures.failed(key_id, self.now_ms())
                raise
        self.key_failures.succeeded(key_id)
        self.verifier.remember(token, identity, now, epoch=epoch)
        return identity

    def still_valid(self, identity: Identity) -> bool:
        """Whether a long-lived connection's identity still holds (key not revoked, token or
        JWT not expired)."""
        if not self.enabled or identity.method == "internal":
            return True
        if identity.key_id is not None:
            stored = self.keys.get(identity.key_id)
            if stored is None or stored.user != identity.user:
                return False
        return identity.expires_ms is None or self.now_ms() < identity.expires_ms

    # -- authorization ---------------------------------------------------------------------------

    def allowed(self, identity: Identity, operation: Operation, resource: Resource) -> bool:
        if not self.enabled:
            return True
        if identity.topics is not None:  # a scoped token: its topics, reads only
            if operation not in _SCOPED_OPERATIONS:
                return False
            if resource.type is ResourceType.TOPIC and resource.name not in identity.topics:
                return False
            if resource.type not in (ResourceType.TOPIC, ResourceType.GROUP):
                return False
        # By user: a principal is User:<user> (principal_for), one string less to build.
        key = (identity.user, operation, resource.type, resource.name)
        decision = self._decisions.get(key)
        if decision is None:
            decision = bool(
                authorize(
                    identity.principal,
                    operation,
                    resource,
                    self.acls,
                    self.super_users,
                    allow_everyone_if_no_acl_found=self.allow_everyone,
                )
            )
            if len(self._decisions) >= DECISION_CACHE_ENTRIES:
                self._decisions.clear()
            self._decisions[key] = decision
        return decision

    def visible(
        self, identity: Identity, resource_type: ResourceType, names: Iterable[str]
    ) -> list[str]:
        """The names ``identity`` may describe, in input order (what a listing shows)."""
        if not self.enabled:
            return list(names)
        if identity.topics is not None:
            op = Operation.DESCRIBE
            return [n for n in names if self.allowed(identity, op, Resource(resource_type, n))]
        return describable(
            identity.principal,
            resource_type,
            names,
            self.acls,
            self.super_users,
            allow_everyone_if_no_acl_found=self.allow_everyone,
        )

    def count_failure(self, error: AuthenticationError) -> None:
        reason = str(error.detail.get("reason", "invalid"))
        self.stats.failures[reason] = self.stats.failures.get(reason, 0) + 1

    def count_denial(self, resource_type: ResourceType) -> None:
        key = resource_type.value
        self.stats.denials[key] = self.stats.denials.get(key, 0) + 1


def refusal(
    security: Security, identity: Identity, reads: Iterable[Resource]
) -> LogbusError | None:
    """Why a long-lived reader (a WebSocket, an SSE stream) may not go on after a security
    change: its credential no longer holds (401), or it may no longer read one of ``reads``
    (403); None when it may."""
    if not security.still_valid(identity):
        return InvalidCredentialsError("credential revoked or expired")
    for resource in reads:
        if not security.allowed(identity, Operation.READ, resource):
            return authorization_error(Operation.READ, resource)
    return None
