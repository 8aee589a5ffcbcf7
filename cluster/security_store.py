"""Users, API keys, ACLs, client quotas and the cluster secret, in the metadata store.

Theory of operation
-------------------
Security configuration lives in the same SQL database as the topics (SQLite for one broker,
PostgreSQL for a cluster), so every broker agrees on it. The store deals in plain rows and
strings (:class:`UserRow`, :class:`KeyRow`, :class:`AclRow`, :class:`QuotaRow`): the api layer
turns a :class:`SecuritySnapshot` into ``auth_quotas`` objects (an ``AclSet``, a
``QuotaTable``, ``StoredKey``\\ s); ``cluster`` never imports ``auth_quotas``.

*Propagation.* Every change bumps the ``security_version`` counter in its own transaction
(separate from ``metadata_version``, so topic churn does not reload auth state, and a change
that changes nothing bumps nothing). Brokers poll the counter (``cluster/security_watcher.py``,
every 250 ms) and reload a snapshot when it moved: a revoked key stops working on every broker
within about a poll interval plus one snapshot read, well inside the issue's one second.

*Serialised writers.* The counter row exists from migration 0004 on. Every change first locks
it (``SELECT … FOR UPDATE`` on PostgreSQL; SQLite writes begin ``IMMEDIATE`` and hold the whole
database's write lock), so security changes of all brokers run one at a time: the caps below
are counted exactly, and "insert if absent" (the first cluster secret) needs no retry loop.
Security changes are rare admin operations; serialising them costs nothing that matters.

*Consistent snapshots.* :meth:`SecurityStore.snapshot` reads the version and every table in
one transaction that sees one committed state: ``REPEATABLE READ`` on PostgreSQL (its default
``READ COMMITTED`` gives every statement a fresh view), the write lock on SQLite (Python's
sqlite3 runs SELECTs outside any transaction). A snapshot's rows are exactly the state its
version names.

*Representation.* An ACL is its six strings, which are also its primary key: adding one twice
is a no-op, as in Kafka. A quota entity part is a name, ``"<default>"`` (Kafka's default
entity; ``auth_quotas.quotas.DEFAULT``'s value) or absent (``None``); absent is stored as
``""`` because SQL unique keys treat NULLs as distinct. Deleting a user deletes its keys (an
explicit DELETE plus ``ON DELETE CASCADE``: SQLite enforces foreign keys only when asked) but
keeps its ACLs and quotas, as Kafka does.

*Cluster secrets.* 32 random bytes (``secrets``), made once by whichever broker asks first
(:meth:`SecurityStore.ensure_cluster_secret`), used for scoped-token HMACs and as the
inter-broker credential. Rotation adds a new current secret and keeps a few previous ones so
tokens signed a moment ago still verify (scoped tokens live at most an hour). They are stored
in the clear: whoever can read the metadata database already controls the cluster.

Errors are :class:`~core_log.errors.LogbusError`\\ s: an existing user or key id is
``DUPLICATE_RESOURCE`` (409), an unknown user ``RESOURCE_NOT_FOUND`` (404), a cap reached
``POLICY_VIOLATION`` (400), an over-long or empty field ``INVALID_REQUEST`` (400), and a
storage failure ``KAFKA_STORAGE_ERROR`` (503, nothing changed).
"""

from __future__ import annotations

import secrets
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Final

import sqlalchemy as sa
from sqlalchemy.exc import IntegrityError

from core_log.errors import ErrorCode, LogbusError

from .metadata import _bump_version, _storage_errors
from .schema import (
    acls_table,
    api_keys_table,
    cluster_secrets_table,
    counters_table,
    db_now_ms,
    quotas_table,
    users_table,
)

SECURITY_VERSION: Final = "security_version"  # the counter row created by migration 0004
DEFAULT_ENTITY: Final = "<default>"  # Kafka's default quota entity (auth_quotas DEFAULT.value)
_ABSENT: Final = ""  # how an absent quota entity part is stored (see the module docstring)

# -- caps, each with its reason ---------------------------------------------------------------
# Every broker holds the whole snapshot in memory and reloads it on every change, so the caps
# bound that memory and the reload time (~100 bytes a row: 100k rows is ~10 MB, a reload well
# under a second on PostgreSQL).
#: The same number as ``auth_quotas.limits.MAX_ACLS`` (a test keeps them equal): an ACL set past
#: it is a configuration mistake, and the authorizer's index is built for this size.
MAX_ACLS: Final = 100_000
#: Users with their own keys; tenants beyond this belong in an external identity provider (JWT).
MAX_USERS: Final = 100_000
#: Keys one user holds at once: one per application or machine plus one being rotated in.
MAX_KEYS_PER_USER: Final = 100
#: Keys altogether (2 per user at the user cap): bounds the snapshot like the ACL cap does.
MAX_API_KEYS: Final = 200_000
#: Quota rows (entity x quota type; 4 types): 25k entities with every quota set.
MAX_QUOTA_ROWS: Final = 100_000
#: Secrets kept after a rotation besides the new one: tokens signed with them still verify.
#: Scoped tokens live at most an hour, so a few rotations' worth is plenty.
MAX_PREVIOUS_SECRETS: Final = 3
CLUSTER_SECRET_BYTES: Final = 32  # HMAC-SHA256 key size; auth_quotas requires >= 32
_IN_CHUNK: Final = 500  # values per SQL IN list (SQLite allows 32766 parameters, PG 65535)

# Field sizes: the columns of cluster/schema.py. Longer input is refused (400), never truncated
# or left to the database (PostgreSQL would fail the statement: a 500).
_USER_CHARS: Final = 255
_KEY_ID_CHARS: Final = 64
_HASH_CHARS: Final = 512
_DESCRIPTION_CHARS: Final = 1024
_ACL_CHARS: Final = {
    "principal": 255,
    "resource_type": 32,
    "name": 249,
    "pattern": 16,
    "operation": 32,
    "permission": 16,
}
_QUOTA_TYPE_CHARS: Final = 64


class DuplicateResourceError(LogbusError):
    """A user or an API key id that already exists."""

    code = ErrorCode.DUPLICATE_RESOURCE


class UnknownUserError(LogbusError):
    code = ErrorCode.RESOURCE_NOT_FOUND


class SecurityLimitError(LogbusError):
    """A cap of this module reached; nothing was changed."""

    code = ErrorCode.POLICY_VIOLATION


class InvalidSecurityRowError(LogbusError):
    """An empty or over-long field."""

    code = ErrorCode.INVALID_REQUEST


@dataclass(frozen=True, slots=True)
class UserRow:
    name: str
    created_ms: int


@dataclass(frozen=True, slots=True)
class KeyRow:
    key_id: str
    user: str
    hash: str
    description: str
    created_ms: int


@dataclass(frozen=True, slots=True, order=True)
class AclRow:
    """One ACL binding, field for field ``auth_quotas.acl.Acl`` (enum values as strings)."""

    principal: str
    resource_type: str
    name: str
    pattern: str
    operation: str
    permission: str


@dataclass(frozen=True, slots=True)
class AclFilter:
    """Which ACLs :meth:`SecurityStore.remove_acls` removes: each field equal, ``None`` = any."""

    principal: str | None = None
    resource_type: str | None = None
    name: str | None = None
    pattern: str | None = None
    operation: str | None = None
    permission: str | None = None

    def matches(self, row: AclRow) -> bool:
        return all(
            want is None or want == getattr(row, name) for name, want in self._fields().items()
        )

    def _fields(self) -> dict[str, str | None]:
        return {f: getattr(self, f) for f in _ACL_CHARS}


@dataclass(frozen=True, slots=True)
class QuotaRow:
    """One quota value. ``user``/``client_id``: a name, ``"<default>"``, or ``None`` (absent)."""

    user: str | None
    client_id: str | None
    quota_type: str
    value: float


@dataclass(frozen=True, slots=True)
class SecuritySnapshot:
    """Everything at one ``version``, read in one transaction; rows in a stable order.
    ``secrets``: the cluster secrets, newest (current) first; empty before the first one."""

    version: int
    users: tuple[UserRow, ...]
    keys: tuple[KeyRow, ...]
    acls: tuple[AclRow, ...]
    quotas: tuple[QuotaRow, ...]
    secrets: tuple[bytes, ...] = field(default=(), repr=False)  # never in a log line


@dataclass(frozen=True, slots=True)
class SecurityLimits:
    """The caps (the module constants by default; tests pass small ones)."""

    max_users: int = MAX_USERS
    max_keys_per_user: int = MAX_KEYS_PER_USER
    max_api_keys: int = MAX_API_KEYS
    max_acls: int = MAX_ACLS
    max_quota_rows: int = MAX_QUOTA_ROWS


class SecurityStore:
    """The security tables of the metadata store at ``engine`` (reads) and ``writer`` (writes;
    on SQLite an engine whose transactions begin IMMEDIATE). ``MetadataStore.security`` is one
    sharing the metadata store's engines. Synchronous: async callers use a worker thread."""

    def __init__(
        self,
        engine: sa.Engine,
        writer: sa.Engine | None = None,
        *,
        limits: SecurityLimits | None = None,
        token_bytes: Callable[[int], bytes] = secrets.token_bytes,
    ) -> None:
        self._engine = engine
        self._writer = writer or engine
        self.limits = limits or SecurityLimits()
        self._token_bytes = token_bytes

    # -- reads -----------------------------------------------------------------------------------

    @_storage_errors
    def version(self) -> int:
        """The security version: it moves with every change (brokers poll it)."""
        with self._engine.connect() as c:
            return _version(c)

    @_storage_errors
    def snapshot(self) -> SecuritySnapshot:
        """Every row and the version they are at, from one consistent read."""
        with self._consistent_read() as c:
            return SecuritySnapshot(
                version=_version(c),
                users=tuple(_users(c)),
                keys=tuple(_keys(c)),
                acls=tuple(_acls(c)),
                quotas=tuple(_quotas(c)),
                secrets=tuple(_secrets(c)),
            )

    @_storage_errors
    def users(self) -> list[UserRow]:
        with self._engine.connect() as c:
            return _users(c)

    @_storage_errors
    def keys(self, user: str) -> list[KeyRow]:
        """The keys of ``user`` (oldest first); :class:`UnknownUserError` if there is none."""
        with self._consistent_read() as c:
            if not _user_exists(c, user):
                raise UnknownUserError(f"unknown user {user!r}", user=user)
            return _keys(c, user)

    @_storage_errors
    def key(self, key_id: str) -> KeyRow | None:
        """The key ``key_id`` (an authentication cache miss), or None if revoked or unknown."""
        with self._engine.connect() as c:
            rows = _keys(c, key_id=key_id)
        return rows[0] if rows else None

    @_storage_errors
    def acls(self) -> list[AclRow]:
        with self._engine.connect() as c:
            return _acls(c)

    @_storage_errors
    def quotas(self) -> list[QuotaRow]:
        with self._engine.connect() as c:
            return _quotas(c)

    @_storage_errors
    def cluster_secrets(self) -> list[bytes]:
        """The cluster secrets, newest (the one to sign with) first; empty before the first."""
        with self._engine.connect() as c:
            return _secrets(c)

    # -- users and keys ----------------------------------------------------------------------------

    @_storage_errors
    def create_user(self, name: str, now_ms: int) -> UserRow:
        _check("user", name, _USER_CHARS)
        with self._change() as c:
            if _user_exists(c, name):
                raise DuplicateResourceError(f"user {name!r} already exists", user=name)
            _under_cap(c, users_table, self.limits.max_users, 1, "users")
            c.execute(users_table.insert().values(name=name, created_ms=now_ms))
            _bump_version(c, SECURITY_VERSION)
        return UserRow(name, now_ms)

    @_storage_errors
    def delete_user(self, name: str) -> bool:
        """Delete ``name`` and its keys (its ACLs and quotas stay, as in Kafka); False if there
        was no such user."""
        with self._change() as c:
            c.execute(api_keys_table.delete().where(api_keys_table.c.user_name == name))
            deleted = c.execute(users_table.delete().where(users_table.c.name == name)).rowcount
            if deleted:
                _bump_version(c, SECURITY_VERSION)
        return bool(deleted)

    @_storage_errors
    def add_key(self, user: str, key_id: str, hash: str, description: str, now_ms: int) -> KeyRow:
        """Store a new key of ``user`` (its argon2 ``hash``; the key itself is never stored)."""
        _check("key_id", key_id, _KEY_ID_CHARS)
        _check("hash", hash, _HASH_CHARS)
        _check("description", description, _DESCRIPTION_CHARS, empty=True)
        k = api_keys_table.c
        with self._change() as c:
            if not _user_exists(c, user):
                raise UnknownUserError(f"unknown user {user!r}", user=user)
            if c.execute(sa.select(k.key_id).where(k.key_id == key_id)).first() is not None:
                raise DuplicateResourceError(f"key id {key_id!r} already exists", key_id=key_id)
            held = c.execute(
                sa.select(sa.func.count()).select_from(api_keys_table).where(k.user_name == user)
            ).scalar_one()
            if held >= self.limits.max_keys_per_user:
                raise SecurityLimitError(
                    f"user {user!r} holds {held} keys, the most allowed "
                    f"({self.limits.max_keys_per_user}); revoke one first",
                    user=user,
                )
            _under_cap(c, api_keys_table, self.limits.max_api_keys, 1, "API keys")
            c.execute(
                api_keys_table.insert().values(
                    key_id=key_id,
                    user_name=user,
                    hash=hash,
                    description=description,
                    created_ms=now_ms,
                )
            )
            _bump_version(c, SECURITY_VERSION)
        return KeyRow(key_id, user, hash, description, now_ms)

    @_storage_errors
    def revoke_key(self, user: str, key_id: str) -> bool:
        """Delete key ``key_id`` of ``user``; False if ``user`` holds no such key."""
        k = api_keys_table.c
        with self._change() as c:
            deleted = c.execute(
                api_keys_table.delete().where(k.user_name == user, k.key_id == key_id)
            ).rowcount
            if deleted:
                _bump_version(c, SECURITY_VERSION)
        return bool(deleted)

    # -- ACLs ------------------------------------------------------------------------------------

    @_storage_errors
    def add_acls(self, rows: Iterable[AclRow], now_ms: int) -> int:
        """Add the ACLs not already present; return how many were added (0: nothing changed).
        All or nothing: past :attr:`SecurityLimits.max_acls` none is added."""
        wanted = set(rows)
        for row in wanted:
            for name, limit in _ACL_CHARS.items():
                _check(name, getattr(row, name), limit)
        if not wanted:
            return 0
        a = acls_table.c
        with self._change() as c:
            principals = sorted({r.principal for r in wanted})
            present: set[AclRow] = set()
            for chunk in _chunks(principals):
                present.update(_acls(c, sa.select(acls_table).where(a.principal.in_(chunk))))
            new = sorted(wanted - present)
            if not new:
                return 0
            _under_cap(c, acls_table, self.limits.max_acls, len(new), "ACLs")
            c.execute(acls_table.insert(), [{**_acl_dict(r), "created_ms": now_ms} for r in new])
            _bump_version(c, SECURITY_VERSION)
        return len(new)

    @_storage_errors
    def remove_acls(self, where: AclFilter) -> list[AclRow]:
        """Remove the ACLs ``where`` matches; return them (sorted; empty: nothing changed)."""
        a = acls_table.c
        conditions = [a[f] == want for f, want in where._fields().items() if want is not None]
        with self._change() as c:
            gone = _acls(c, sa.select(acls_table).where(sa.true(), *conditions))
            if gone:
                c.execute(acls_table.delete().where(sa.true(), *conditions))
                _bump_version(c, SECURITY_VERSION)
        return gone

    # -- quotas ----------------------------------------------------------------------------------

    @_storage_errors
    def set_quotas(
        self, user: str | None, client_id: str | None, values: Mapping[str, float]
    ) -> bool:
        """Set (insert or update) quota values of the entity (``user``, ``client_id``): each
        a name, ``"<default>"`` or None (absent), not both absent. True if anything changed."""
        u, cid = _entity(user, client_id)
        for quota_type in values:
            _check("quota_type", quota_type, _QUOTA_TYPE_CHARS)
        q = quotas_table.c
        where = (q.user_name == u, q.client_id == cid)
        with self._change() as c:
            seen = {
                r.quota_type: float(r.value)
                for r in c.execute(sa.select(q.quota_type, q.value).where(*where))
            }
            new = [t for t in values if t not in seen]
            changed = [t for t in values if t in seen and seen[t] != float(values[t])]
            if not new and not changed:
                return False
            if new:
                _under_cap(c, quotas_table, self.limits.max_quota_rows, len(new), "quota values")
                c.execute(
                    quotas_table.insert(),
                    [
                        {"user_name": u, "client_id": cid, "quota_type": t, "value": values[t]}
                        for t in new
                    ],
                )
            for t in changed:
                c.execute(
                    quotas_table.update()
                    .where(*where, q.quota_type == t)
                    .values(value=float(values[t]))
                )
            _bump_version(c, SECURITY_VERSION)
        return True

    @_storage_errors
    def delete_quotas(
        self, user: str | None, client_id: str | None, types: Iterable[str] | None = None
    ) -> bool:
        """Delete the entity's quota values of ``types`` (None: all of them); True if any
        existed."""
        u, cid = _entity(user, client_id)
        q = quotas_table.c
        where = [q.user_name == u, q.client_id == cid]
        if types is not None:
            wanted = sorted(set(types))
            if not wanted:
                return False
            where.append(q.quota_type.in_(wanted))
        with self._change() as c:
            deleted = c.execute(quotas_table.delete().where(*where)).rowcount
            if deleted:
                _bump_version(c, SECURITY_VERSION)
        return bool(deleted)

    # -- cluster secrets -------------------------------------------------------------------------

    @_storage_errors
    def ensure_cluster_secret(self) -> bytes:
        """The current cluster secret, made now if there is none yet. Brokers calling this at
        once all get the same one (the first writer makes it; the rest find it)."""
        with self._engine.connect() as c:
            existing = _secrets(c)
        if existing:
            return existing[0]
        with self._change() as c:
            existing = _secrets(c)  # made meanwhile by another broker?
            if existing:
                return existing[0]
            secret = self._new_secret()
            try:
                with c.begin_nested():
                    c.execute(
                        cluster_secrets_table.insert().values(
                            generation=1, secret=secret, created_ms=db_now_ms()
                        )
                    )
            except IntegrityError:  # only a writer not holding the lock could get here
                return _secrets(c)[0]
            _bump_version(c, SECURITY_VERSION)
        return secret

    @_storage_errors
    def rotate_cluster_secret(self, keep_previous: int = MAX_PREVIOUS_SECRETS) -> bytes:
        """Make a new current cluster secret; keep the ``keep_previous`` newest older ones
        (they still verify) and delete the rest (``keep_previous=0`` after a leak)."""
        if keep_previous < 0:
            raise InvalidSecurityRowError("keep_previous must be >= 0")
        s = cluster_secrets_table.c
        secret = self._new_secret()
        with self._change() as c:
            newest = c.execute(sa.select(sa.func.max(s.generation))).scalar_one_or_none()
            generation = int(newest or 0) + 1
            c.execute(
                cluster_secrets_table.insert().values(
                    generation=generation, secret=secret, created_ms=db_now_ms()
                )
            )
            c.execute(
                cluster_secrets_table.delete().where(s.generation < generation - keep_previous)
            )
            _bump_version(c, SECURITY_VERSION)
        return secret

    # -- plumbing --------------------------------------------------------------------------------

    def _new_secret(self) -> bytes:
        secret = self._token_bytes(CLUSTER_SECRET_BYTES)
        assert len(secret) == CLUSTER_SECRET_BYTES
        return secret

    @contextmanager
    def _change(self) -> Iterator[sa.Connection]:
        """A write transaction holding the security lock (see the module docstring)."""
        with self._writer.begin() as c:
            _lock(c)
            yield c

    @contextmanager
    def _consistent_read(self) -> Iterator[sa.Connection]:
        if self._engine.dialect.name == "sqlite":
            # Python's sqlite3 runs SELECTs outside a transaction; the write lock (BEGIN
            # IMMEDIATE on the writer) holds still the one state every statement reads.
            with self._writer.begin() as c:
                yield c
        else:
            with (
                self._engine.connect().execution_options(isolation_level="REPEATABLE READ") as c,
                c.begin(),
            ):
                yield c


def _check(what: str, value: object, limit: int, *, empty: bool = False) -> None:
    if not isinstance(value, str):
        raise InvalidSecurityRowError(f"{what}: a string")
    if (not value and not empty) or len(value) > limit:
        raise InvalidSecurityRowError(f"{what}: {0 if empty else 1}..{limit} characters")


def _entity(user: str | None, client_id: str | None) -> tuple[str, str]:
    if user is None and client_id is None:
        raise InvalidSecurityRowError("a quota entity names a user, a client id, or both")
    if user is not None:
        _check("user", user, _USER_CHARS)
    if client_id is not None:
        _check("client_id", client_id, _USER_CHARS)
    return user or _ABSENT, client_id or _ABSENT


def _lock(c: sa.Connection) -> None:
    """Lock the ``security_version`` row for the rest of the transaction (PostgreSQL; SQLite
    holds its database write lock already). Created if missing, so there is a row to lock."""
    counter = counters_table.c
    query = sa.select(counter.value).where(counter.name == SECURITY_VERSION).with_for_update()
    if c.execute(query).first() is None:
        try:
            with c.begin_nested():
                c.execute(counters_table.insert().values(name=SECURITY_VERSION, value=0))
        except IntegrityError:  # another broker made it first
            pass
        c.execute(query)


def _under_cap(c: sa.Connection, table: sa.Table, cap: int, adding: int, what: str) -> None:
    count = int(c.execute(sa.select(sa.func.count()).select_from(table)).scalar_one())
    if count + adding > cap:
        raise SecurityLimitError(
            f"{count} {what} stored; adding {adding} would pass the limit of {cap}", limit=cap
        )


def _chunks(values: list[str]) -> Iterator[list[str]]:
    for i in range(0, len(values), _IN_CHUNK):
        yield values[i : i + _IN_CHUNK]


def _version(c: sa.Connection) -> int:
    counter = counters_table.c
    value = c.execute(
        sa.select(counter.value).where(counter.name == SECURITY_VERSION)
    ).scalar_one_or_none()
    return int(value or 0)


def _user_exists(c: sa.Connection, name: str) -> bool:
    query = sa.select(users_table.c.name).where(users_table.c.name == name)
    return c.execute(query).first() is not None


def _users(c: sa.Connection) -> list[UserRow]:
    rows = c.execute(sa.select(users_table).order_by(users_table.c.name))
    return [UserRow(r.name, int(r.created_ms)) for r in rows]


def _keys(c: sa.Connection, user: str | None = None, key_id: str | None = None) -> list[KeyRow]:
    k = api_keys_table.c
    query = sa.select(api_keys_table).order_by(k.user_name, k.created_ms, k.key_id)
    if user is not None:
        query = query.where(k.user_name == user)
    if key_id is not None:
        query = query.where(k.key_id == key_id)
    return [
        KeyRow(r.key_id, r.user_name, r.hash, r.description, int(r.created_ms))
        for r in c.execute(query)
    ]


def _acls(c: sa.Connection, query: sa.Select[Any] | None = None) -> list[AclRow]:
    rows = c.execute(query if query is not None else sa.select(acls_table))
    return sorted(
        AclRow(r.principal, r.resource_type, r.name, r.pattern, r.operation, r.permission)
        for r in rows
    )


def _acl_dict(row: AclRow) -> dict[str, str]:
    return {f: getattr(row, f) for f in _ACL_CHARS}


def _quotas(c: sa.Connection) -> list[QuotaRow]:
    q = quotas_table.c
    rows = c.execute(sa.select(quotas_table).order_by(q.user_name, q.client_id, q.quota_type))
    return [
        QuotaRow(r.user_name or None, r.client_id or None, r.quota_type, float(r.value))
        for r in rows
    ]


def _secrets(c: sa.Connection) -> list[bytes]:
    s = cluster_secrets_table.c
    rows = c.execute(sa.select(s.secret).order_by(s.generation.desc()))
    return [bytes(r.secret) for r in rows]
