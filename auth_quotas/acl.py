"""Access control lists and the one function that decides with them.

Theory of operation
-------------------
An :class:`Acl` says: *principal* is *allowed* (or *denied*) *operation* on resources of one
*type* whose name equals (``literal``) or starts with (``prefixed``) a pattern; the literal
name ``*`` matches every name of the type, and the principal ``User:*`` matches everyone.
:func:`authorize` follows Kafka's ``StandardAuthorizer`` rules:

1. a super user is allowed everything;
2. any matching DENY wins over every ALLOW;
3. otherwise any matching ALLOW allows;
4. otherwise denied (Kafka's ``allow.everyone.if.no.acl.found=false``; when that flag is set,
   a resource no ACL pattern matches at all is allowed).

An ALLOW for ``read``, ``write``, ``delete`` or ``alter`` also allows ``describe``, and an
ALLOW for ``alter_configs`` also allows ``describe_configs`` (you may see what you may change);
a DENY denies only the operation it names. ``all`` matches every operation, in both ALLOW and
DENY.

Why an index: every request asks :func:`authorize`, so with 100+ ACLs a linear scan would
cost tens of microseconds per request. :class:`AclSet` is an immutable snapshot grouped by
resource type, then by literal name, and by prefix; a name of length n probes only the prefix
lengths that exist (typically 1-3), so a decision is a handful of dict lookups no matter how
many ACLs there are. Changes build a new snapshot (copy-on-write) that the wiring swaps in
atomically, so a request never sees half an update.

Validation of ACLs coming from the API lives here too (:func:`parse_acl`), raising
:class:`~auth_quotas.errors.InvalidAclError` (400) with a message naming the bad field.
"""

from __future__ import annotations

import enum
import re
from collections.abc import Iterable, Iterator, Mapping
from collections.abc import Set as AbstractSet
from dataclasses import dataclass
from typing import Any

from core_log.errors import ErrorCode, LogbusError

from .errors import InvalidAclError
from .limits import MAX_ACLS, MAX_PRINCIPAL_CHARS, MAX_RESOURCE_NAME_CHARS

WILDCARD = "*"
WILDCARD_PRINCIPAL = "User:*"
CLUSTER_NAME = "kafka-cluster"  # Kafka's one cluster resource name
PRINCIPAL_TYPE = "User"

_NAME = re.compile(r"[a-zA-Z0-9._-]+")
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


class ResourceType(enum.StrEnum):
    TOPIC = "topic"
    GROUP = "group"
    CLUSTER = "cluster"
    TRANSACTIONAL_ID = "transactional_id"


class PatternType(enum.StrEnum):
    LITERAL = "literal"
    PREFIXED = "prefixed"


class Operation(enum.StrEnum):
    READ = "read"
    WRITE = "write"
    CREATE = "create"
    DELETE = "delete"
    ALTER = "alter"
    DESCRIBE = "describe"
    DESCRIBE_CONFIGS = "describe_configs"
    ALTER_CONFIGS = "alter_configs"
    ALL = "all"


class Permission(enum.StrEnum):
    ALLOW = "allow"
    DENY = "deny"


# Kafka: ALLOW ACLs for these operations also allow the key operation.
_IMPLIED_BY: dict[Operation, frozenset[Operation]] = {
    Operation.DESCRIBE: frozenset(
        {Operation.DESCRIBE, Operation.READ, Operation.WRITE, Operation.DELETE, Operation.ALTER}
    ),
    Operation.DESCRIBE_CONFIGS: frozenset({Operation.DESCRIBE_CONFIGS, Operation.ALTER_CONFIGS}),
}


@dataclass(frozen=True, slots=True)
class Resource:
    """What a request acts on: a resource type and one concrete name."""

    type: ResourceType
    name: str


CLUSTER = Resource(ResourceType.CLUSTER, CLUSTER_NAME)


@dataclass(frozen=True, slots=True)
class Acl:
    """One ACL binding. Build it through :func:`parse_acl` when the input is untrusted."""

    principal: str
    resource_type: ResourceType
    name: str
    pattern: PatternType
    operation: Operation
    permission: Permission

    def to_dict(self) -> dict[str, str]:
        return {
            "principal": self.principal,
            "resource_type": self.resource_type.value,
            "name": self.name,
            "pattern": self.pattern.value,
            "operation": self.operation.value,
            "permission": self.permission.value,
        }

    def grants(self, operation: Operation) -> bool:
        """Whether this ACL's operation covers ``operation`` (implication applies to ALLOW)."""
        if self.operation is Operation.ALL or self.operation is operation:
            return True
        if self.permission is Permission.DENY:
            return False
        implied = _IMPLIED_BY.get(operation)
        return implied is not None and self.operation in implied


def principal_for(user: str) -> str:
    """The principal string of a user name: ``User:<name>``."""
    return f"{PRINCIPAL_TYPE}:{user}"


# --- validation ------------------------------------------------------------------------------


def _enum(kind: type[enum.StrEnum], field: str, value: object) -> Any:
    values = [m.value for m in kind]
    if isinstance(value, str) and value in values:
        return kind(value)
    raise InvalidAclError(f"{field}: {value!r} is not one of {'|'.join(values)}")


def validate_principal(principal: object) -> str:
    """``User:<name>`` (or ``User:*``); the name is 1..255 characters without controls."""
    if not isinstance(principal, str):
        raise InvalidAclError("principal: must be a string like 'User:alice'")
    kind, sep, name = principal.partition(":")
    if not sep or kind != PRINCIPAL_TYPE or not name:
        raise InvalidAclError(f"principal: {principal!r} is not of the form 'User:<name>'")
    if len(principal) > MAX_PRINCIPAL_CHARS or _CONTROL.search(principal):
        raise InvalidAclError(
            f"principal: at most {MAX_PRINCIPAL_CHARS} characters, no control characters"
        )
    return principal


def validate_resource_name(resource_type: ResourceType, name: object, pattern: PatternType) -> str:
    """Names as the broker accepts them, so an ACL can never name an impossible resource."""
    if not isinstance(name, str) or not name:
        raise InvalidAclError("name: must be a non-empty string")
    if name == WILDCARD:
        if pattern is PatternType.PREFIXED:
            raise InvalidAclError("name: '*' matches every name only with pattern 'literal'")
        return name
    if resource_type is ResourceType.CLUSTER:
        if name != CLUSTER_NAME or pattern is not PatternType.LITERAL:
            raise InvalidAclError(f"name: a cluster ACL names literal {CLUSTER_NAME!r} or '*'")
        return name
    if len(name) > MAX_RESOURCE_NAME_CHARS or not _NAME.fullmatch(name):
        raise InvalidAclError(
            f"name: {name[:64]!r} must be 1..{MAX_RESOURCE_NAME_CHARS} of [a-zA-Z0-9._-]"
        )
    return name


_FIELDS = ("principal", "resource_type", "name", "pattern", "operation", "permission")


def parse_acl(data: Mapping[str, object]) -> Acl:
    """An :class:`Acl` from API/CLI input; raises :class:`InvalidAclError` naming the field.

    ``pattern`` defaults to ``literal`` and also accepts ``prefix`` (the issue's word) for
    ``prefixed`` (Kafka's); ``permission`` defaults to ``allow``. Unknown keys are refused so
    a misspelt field is not silently ignored."""
    if not isinstance(data, Mapping):
        raise InvalidAclError("an ACL must be a JSON object")
    unknown = sorted(set(data) - set(_FIELDS))
    if unknown:
        raise InvalidAclError(f"unknown field(s): {', '.join(map(str, unknown))}")
    for field in ("principal", "resource_type", "name", "operation"):
        if field not in data:
            raise InvalidAclError(f"{field}: required")
    raw_pattern = data.get("pattern", "literal")
    pattern = _enum(PatternType, "pattern", "prefixed" if raw_pattern == "prefix" else raw_pattern)
    resource_type = _enum(ResourceType, "resource_type", data["resource_type"])
    return Acl(
        principal=validate_principal(data["principal"]),
        resource_type=resource_type,
        name=validate_resource_name(resource_type, data["name"], pattern),
        pattern=pattern,
        operation=_enum(Operation, "operation", data["operation"]),
        permission=_enum(Permission, "permission", data.get("permission", "allow")),
    )


# --- the index -------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _TypeIndex:
    """The ACLs of one resource type: literal names (``*`` included) and prefixes, with the
    distinct prefix lengths so a lookup probes only lengths that exist."""

    literal: dict[str, tuple[Acl, ...]]
    prefixed: dict[str, tuple[Acl, ...]]
    prefix_lengths: tuple[int, ...]

    def candidates(self, name: str) -> Iterator[Acl]:
        yield from self.literal.get(name, ())
        if name != WILDCARD:
            yield from self.literal.get(WILDCARD, ())
        n = len(name)
        for length in self.prefix_lengths:
            if length > n:
                break
            yield from self.prefixed.get(name[:length], ())


def _build(acls: Iterable[Acl]) -> dict[ResourceType, _TypeIndex]:
    literal: dict[ResourceType, dict[str, list[Acl]]] = {}
    prefixed: dict[ResourceType, dict[str, list[Acl]]] = {}
    for acl in acls:
        table = literal if acl.pattern is PatternType.LITERAL else prefixed
        table.setdefault(acl.resource_type, {}).setdefault(acl.name, []).append(acl)
    index = {}
    for rtype in ResourceType:
        lit = {k: tuple(v) for k, v in literal.get(rtype, {}).items()}
        pre = {k: tuple(v) for k, v in prefixed.get(rtype, {}).items()}
        if lit or pre:
            index[rtype] = _TypeIndex(lit, pre, tuple(sorted({len(p) for p in pre})))
    return index


class AclSet:
    """An immutable, indexed set of ACLs. ``add``/``remove`` return a new set."""

    __slots__ = ("_acls", "_index")

    def __init__(self, acls: Iterable[Acl] = ()) -> None:
        self._acls = frozenset(acls)
        if len(self._acls) > MAX_ACLS:
            raise InvalidAclError(f"at most {MAX_ACLS} ACLs")
        self._index = _build(self._acls)

    def __len__(self) -> int:
        return len(self._acls)

    def __iter__(self) -> Iterator[Acl]:
        return iter(self._acls)

    def __contains__(self, acl: object) -> bool:
        return acl in self._acls

    def add(self, *acls: Acl) -> AclSet:
        return AclSet(self._acls.union(acls))

    def remove(self, *acls: Acl) -> AclSet:
        return AclSet(self._acls.difference(acls))

    def matching(self, resource: Resource) -> Iterator[Acl]:
        """Every ACL whose resource pattern matches ``resource``, of any principal."""
        index = self._index.get(resource.type)
        if index is not None:
            yield from index.candidates(resource.name)

    def select(
        self,
        *,
        principal: str | None = None,
        resource_type: ResourceType | None = None,
        name: str | None = None,
        pattern: PatternType | None = None,
    ) -> list[Acl]:
        """A listing filter (each given field must equal), sorted for stable output."""
        found = [
            a
            for a in self._acls
            if (principal is None or a.principal == principal)
            and (resource_type is None or a.resource_type is resource_type)
            and (name is None or a.name == name)
            and (pattern is None or a.pattern is pattern)
        ]
        found.sort(key=lambda a: tuple(a.to_dict().values()))
        return found


EMPTY = AclSet()


# --- the decision ----------------------------------------------------------------------------


class Reason(enum.StrEnum):
    SUPER_USER = "super_user"
    ALLOW_ACL = "allow_acl"
    DENY_ACL = "deny_acl"
    NO_MATCHING_ACL = "no_matching_acl"
    NO_ACL_FOR_RESOURCE = "no_acl_for_resource"  # allowed: allow.everyone.if.no.acl.found


@dataclass(frozen=True, slots=True)
class Decision:
    """The answer of :func:`authorize`; truthy when allowed. ``acl`` is the deciding ACL."""

    allowed: bool
    reason: Reason
    acl: Acl | None = None

    def __bool__(self) -> bool:
        return self.allowed


_SUPER = Decision(True, Reason.SUPER_USER)
_NO_MATCH = Decision(False, Reason.NO_MATCHING_ACL)
_NO_ACLS_ALLOWED = Decision(True, Reason.NO_ACL_FOR_RESOURCE)


def authorize(
    principal: str,
    operation: Operation,
    resource: Resource,
    acls: AclSet,
    super_users: AbstractSet[str] = frozenset(),
    *,
    allow_everyone_if_no_acl_found: bool = False,
) -> Decision:
    """May ``principal`` (``User:<name>``) do ``operation`` on ``resource``?

    Pure: the same arguments always give the same decision. See the module docstring for the
    rules; ``allow_everyone_if_no_acl_found`` is Kafka's config of that name (default false)."""
    if principal in super_users:
        return _SUPER
    allow: Acl | None = None
    any_for_resource = False
    for acl in acls.matching(resource):
        any_for_resource = True
        if acl.principal != principal and acl.principal != WILDCARD_PRINCIPAL:
            continue
        if not acl.grants(operation):
            continue
        if acl.permission is Permission.DENY:
            return Decision(False, Reason.DENY_ACL, acl)
        allow = allow or acl
    if allow is not None:
        return Decision(True, Reason.ALLOW_ACL, allow)
    if allow_everyone_if_no_acl_found and not any_for_resource:
        return _NO_ACLS_ALLOWED
    return _NO_MATCH


_DENIED: dict[ResourceType, ErrorCode] = {
    ResourceType.TOPIC: ErrorCode.TOPIC_AUTHORIZATION_FAILED,
    ResourceType.GROUP: ErrorCode.GROUP_AUTHORIZATION_FAILED,
    ResourceType.CLUSTER: ErrorCode.CLUSTER_AUTHORIZATION_FAILED,
    ResourceType.TRANSACTIONAL_ID: ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED,
}


def authorization_error(operation: Operation, resource: Resource) -> LogbusError:
    """The 403 a denied request gets, with Kafka's code for the resource type
    (``TOPIC_AUTHORIZATION_FAILED`` ...). Routes that hide unauthorised topics answer
    ``UNKNOWN_TOPIC_OR_PARTITION`` instead, as Kafka does for describe."""
    return LogbusError(
        f"not authorized to {operation.value} {resource.type.value} {resource.name!r}",
        code=_DENIED[resource.type],
        resource_type=resource.type.value,
        resource_name=resource.name,
        operation=operation.value,
    )


def describable(
    principal: str,
    resource_type: ResourceType,
    names: Iterable[str],
    acls: AclSet,
    super_users: AbstractSet[str] = frozenset(),
    *,
    allow_everyone_if_no_acl_found: bool = False,
) -> list[str]:
    """The names (in input order) ``principal`` may ``describe``: what a listing may show.

    Kafka hides what you may not describe, so a listing never leaks a topic's existence."""
    if principal in super_users:
        return list(names)
    return [
        name
        for name in names
        if authorize(
            principal,
            Operation.DESCRIBE,
            Resource(resource_type, name),
            acls,
            allow_everyone_if_no_acl_found=allow_everyone_if_no_acl_found,
        )
    ]
