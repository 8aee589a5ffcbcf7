"""``/v1/users``, ``/v1/acls``, ``/v1/tokens``: users and their API keys, ACLs, scoped tokens.

Every change goes to the metadata store (so every broker learns it within a second, through
its :class:`cluster.security_watcher.SecurityWatcher`) and is then loaded here at once, so the
caller's next request to this broker already sees it. What each route needs is declared in
:data:`api.access.TABLE` (Kafka's: ALTER on the cluster to change users, keys and ACLs,
DESCRIBE on it to list them).

With authentication off these routes work too (everyone is allowed everything then): an
operator prepares users, keys and ACLs on a loopback broker before switching ``--auth`` on.
Keys are shown once, in the answer that creates them; listings show ids, descriptions and
creation times, never hashes.
"""

from __future__ import annotations

import asyncio
import re
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Body, Depends, Path, Query, Request, Response
from pydantic import BaseModel, ConfigDict, Field

from auth_quotas.acl import (
    Operation,
    PatternType,
    Permission,
    Resource,
    ResourceType,
    parse_acl,
    principal_for,
    validate_principal,
)
from auth_quotas.credentials import generate_api_key, hash_api_key
from auth_quotas.errors import InvalidAclError
from auth_quotas.limits import MAX_SCOPED_TOKEN_TOPICS
from cluster.security_store import DEFAULT_ENTITY, AclFilter, UnknownUserError
from core_log.errors import ErrorCode, LogbusError

from ..access import identity_of, require
from ..params import NameStr
from ..problems import bad_request
from ..security import Security, acl_row
from ..state import SecurityDep
from .common import errors

router = APIRouter(tags=["security"])

# User names: what fits a principal, a Basic login (no ':') and a URL path segment.
USER_PATTERN = "^[A-Za-z0-9._@+-]{1,200}$"
USER_NAME = re.compile(USER_PATTERN[1:-1])
KEY_ID = re.compile(r"[0-9a-f]{16}")
MAX_ACLS_PER_REQUEST = 1000  # one request's ACLs are one store transaction
MAX_DESCRIPTION_CHARS = 1024


def check_user_name(name: str) -> str:
    if name == DEFAULT_ENTITY or not USER_NAME.fullmatch(name) or name == "*":
        raise bad_request(
            f"user name {name[:64]!r}: 1..200 of [A-Za-z0-9._@+-] (not '<default>')", user=name
        )
    try:
        validate_principal(principal_for(name))
    except InvalidAclError as e:
        raise bad_request(e.message) from None
    return name


_ACL_EXAMPLE: dict[str, Any] = {
    "principal": "User:alice",
    "resource_type": "topic",
    "name": "orders",
    "pattern": "literal",
    "operation": "write",
    "permission": "allow",
}


class UserCreate(BaseModel):
    model_config = ConfigDict(
        json_schema_extra={"examples": [{"name": "alice", "description": "billing service"}]}
    )

    name: str = Field(description="1..200 of [A-Za-z0-9._@+-]", pattern=USER_PATTERN)
    description: str = Field("", max_length=MAX_DESCRIPTION_CHARS, description="of the first key")


class KeyCreate(BaseModel):
    model_config = ConfigDict(json_schema_extra={"examples": [{"description": "laptop"}]})

    description: str = Field("", max_length=MAX_DESCRIPTION_CHARS)


class UserCreated(BaseModel):
    model_config = ConfigDict(
        json_schema_extra={
            "examples": [
                {
                    "name": "alice",
                    "key": "lbk.9d2f4c1a0b3e5d7f.Qm9vTmV2ZXJTaG93bkFnYWluQnV0SGVyZUl0SXNPaw",
                    "key_id": "9d2f4c1a0b3e5d7f",
                }
            ]
        }
    )

    name: str
    key: str = Field(description="the API key: shown once, never again")
    key_id: str


class KeyCreated(BaseModel):
    model_config = ConfigDict(
        json_schema_extra={
            "examples": [
                {
                    "user": "alice",
                    "key": "lbk.0a1b2c3d4e5f6a7b.Qm9vTmV2ZXJTaG93bkFnYWluQnV0SGVyZUl0SXNPaw",
                    "key_id": "0a1b2c3d4e5f6a7b",
                }
            ]
        }
    )

    user: str
    key: str = Field(description="the API key: shown once, never again")
    key_id: str


class UserPublic(BaseModel):
    name: str
    created_ms: int


class UserList(BaseModel):
    model_config = ConfigDict(
        json_schema_extra={
            "examples": [{"users": [{"name": "alice", "created_ms": 1700000000000}]}]
        }
    )

    users: list[UserPublic]


class KeyPublic(BaseModel):
    key_id: str
    description: str
    created_ms: int


class KeyList(BaseModel):
    model_config = ConfigDict(
        json_schema_extra={
            "examples": [
                {
                    "user": "alice",
                    "keys": [
                        {
                            "key_id": "9d2f4c1a0b3e5d7f",
                            "description": "",
                            "created_ms": 1700000000000,
                        }
                    ],
                }
            ]
        }
    )

    user: str
    keys: list[KeyPublic]


class AclIn(BaseModel):
    """One ACL (``auth_quotas.acl.parse_acl`` checks what a schema cannot: a cluster ACL
    names ``kafka-cluster``, ``*`` only with ``literal``)."""

    model_config = ConfigDict(extra="forbid", json_schema_extra={"examples": [_ACL_EXAMPLE]})
    principal: str = Field(pattern="^User:[^:\\x00-\\x1f\\x7f]{1,250}$", examples=["User:alice"])
    resource_type: Literal["topic", "group", "cluster", "transactional_id"]
    name: str = Field(min_length=1, max_length=249, examples=["orders"])
    pattern: Literal["literal", "prefixed", "prefix"] = "literal"
    operation: Literal[
        "read",
        "write",
        "create",
        "delete",
        "alter",
        "describe",
        "describe_configs",
        "alter_configs",
        "all",
    ]
    permission: Literal["allow", "deny"] = "allow"


class AclPublic(BaseModel):
    principal: str
    resource_type: str
    name: str
    pattern: str
    operation: str
    permission: str


class AclList(BaseModel):
    model_config = ConfigDict(json_schema_extra={"examples": [{"acls": [_ACL_EXAMPLE]}]})

    acls: list[AclPublic]


class AclsAdded(BaseModel):
    model_config = ConfigDict(
        json_schema_extra={"examples": [{"added": 1, "acls": [_ACL_EXAMPLE]}]}
    )

    added: int = Field(description="how many were new (adding an existing ACL changes nothing)")
    acls: list[AclPublic]


class AclsRemoved(BaseModel):
    model_config = ConfigDict(json_schema_extra={"examples": [{"removed": [_ACL_EXAMPLE]}]})

    removed: list[AclPublic]


class TokenRequest(BaseModel):
    model_config = ConfigDict(
        json_schema_extra={"examples": [{"topics": ["orders"], "ttl_minutes": 10}]}
    )

    topics: list[NameStr] = Field(min_length=1, max_length=MAX_SCOPED_TOKEN_TOPICS)
    ttl_minutes: int | None = Field(None, ge=1, le=60, description="default: the broker's")


class TokenPublic(BaseModel):
    model_config = ConfigDict(
        json_schema_extra={
            "examples": [
                {
                    "token": "lbt.eyJ2IjoxfQ.c2ln",
                    "user": "alice",
                    "topics": ["orders"],
                    "expires_ms": 1700000600000,
                }
            ]
        }
    )

    token: str = Field(description="for ?token= of an SSE or WebSocket URL (or as a Bearer)")
    user: str
    topics: list[str]
    expires_ms: int


class WhoAmI(BaseModel):
    model_config = ConfigDict(
        json_schema_extra={
            "examples": [{"principal": "User:alice", "method": "api_key", "authenticated": True}]
        }
    )

    principal: str
    method: str
    authenticated: bool


def _store(security: Security) -> Any:
    if security.store is None:
        raise LogbusError("the security store is not open", code=ErrorCode.BROKER_BUSY)
    return security.store


async def _hash(security: Security, token: str) -> str:
    return await asyncio.to_thread(hash_api_key, token, security.hasher)


# -- users and keys ----------------------------------------------------------------------------


@router.post(
    "/v1/users",
    status_code=201,
    summary="Create a user and its first API key (shown once)",
    responses=errors(400, 403, 409),
)
async def create_user(body: UserCreate, security: SecurityDep, response: Response) -> UserCreated:
    name = check_user_name(body.name)
    store = _store(security)
    new = generate_api_key()
    digest = await _hash(security, new.token)
    now = security.now_ms()
    await asyncio.to_thread(store.create_user, name, now)
    await asyncio.to_thread(store.add_key, name, new.key_id, digest, body.description, now)
    await security.refresh()
    response.headers["Location"] = f"/v1/users/{name}"
    return UserCreated(name=name, key=new.token, key_id=new.key_id)


@router.get("/v1/users", summary="List users", responses=errors(403))
async def list_users(security: SecurityDep) -> UserList:
    rows = await asyncio.to_thread(_store(security).users)
    return UserList(users=[UserPublic(name=u.name, created_ms=u.created_ms) for u in rows])


@router.delete(
    "/v1/users/{user}",
    status_code=204,
    summary="Delete a user and revoke its keys (its ACLs stay, as in Kafka)",
    responses=errors(400, 403, 404),
)
async def delete_user(user: UserPath, security: SecurityDep) -> Response:
    check_user_name(user)
    if not await asyncio.to_thread(_store(security).delete_user, user):
        raise UnknownUserError(f"unknown user {user!r}", user=user)
    await security.refresh()
    return Response(status_code=204)


@router.post(
    "/v1/users/{user}/keys",
    status_code=201,
    summary="Create another API key for a user (shown once)",
    responses=errors(400, 403, 404),
)
async def create_key(
    user: UserPath,
    security: SecurityDep,
    body: Annotated[KeyCreate | None, Body(examples=[{"description": "laptop"}])] = None,
) -> KeyCreated:
    check_user_name(user)
    new = generate_api_key()
    digest = await _hash(security, new.token)
    description = body.description if body is not None else ""
    await asyncio.to_thread(
        _store(security).add_key, user, new.key_id, digest, description, security.now_ms()
    )
    await security.refresh()
    return KeyCreated(user=user, key=new.token, key_id=new.key_id)


@router.get(
    "/v1/users/{user}/keys",
    summary="A user's API keys: ids, descriptions, creation times (never the keys or hashes)",
    responses=errors(400, 403, 404),
)
async def list_keys(user: UserPath, security: SecurityDep) -> KeyList:
    check_user_name(user)
    rows = await asyncio.to_thread(_store(security).keys, user)
    return KeyList(
        user=user,
        keys=[
            KeyPublic(key_id=k.key_id, description=k.description, created_ms=k.created_ms)
            for k in rows
        ],
    )


@router.delete(
    "/v1/users/{user}/keys/{key_id}",
    status_code=204,
    summary="Revoke an API key (in force on every broker within a second)",
    responses=errors(400, 403, 404),
)
async def revoke_key(user: UserPath, key_id: KeyIdPath, security: SecurityDep) -> Response:
    check_user_name(user)
    if not KEY_ID.fullmatch(key_id):
        raise bad_request(f"key id {key_id[:64]!r}: 16 hex characters")
    if not await asyncio.to_thread(_store(security).revoke_key, user, key_id):
        raise LogbusError(
            f"user {user!r} has no key {key_id!r}", code=ErrorCode.RESOURCE_NOT_FOUND, user=user
        )
    await security.refresh()
    return Response(status_code=204)


# -- ACLs --------------------------------------------------------------------------------------


@router.post(
    "/v1/acls",
    status_code=201,
    summary="Add ACLs (one object or a list); adding an existing one changes nothing",
    responses=errors(400, 403),
)
async def add_acls(
    security: SecurityDep,
    body: Annotated[
        AclIn | Annotated[list[AclIn], Field(min_length=1, max_length=MAX_ACLS_PER_REQUEST)],
        Body(examples=[_ACL_EXAMPLE]),
    ],
) -> AclsAdded:
    items = body if isinstance(body, list) else [body]
    acls = []
    for i, item in enumerate(items):
        try:
            acls.append(parse_acl(item.model_dump()))
        except InvalidAclError as e:
            raise bad_request(f"ACL {i}: {e.message}" if len(items) > 1 else e.message) from None
    rows = [acl_row(a) for a in acls]
    added = await asyncio.to_thread(_store(security).add_acls, rows, security.now_ms())
    await security.refresh()
    return AclsAdded(added=added, acls=[AclPublic(**a.to_dict()) for a in acls])


def _enum_param(kind: type[Any], field: str, value: str | None) -> str | None:
    if value is None:
        return None
    if field == "pattern" and value == "prefix":
        value = "prefixed"
    values = [m.value for m in kind]
    if value not in values:
        raise bad_request(f"{field}: {value[:64]!r} is not one of {'|'.join(values)}")
    return value


def _choices(kind: type[Any], *extra: str) -> str:
    return "^(" + "|".join([m.value for m in kind] + list(extra)) + ")$"


PrincipalQ = Annotated[str | None, Query(pattern="^User:[^\\x00-\\x1f\\x7f]+$", max_length=255)]
NameQ = Annotated[str | None, Query(min_length=1, max_length=249)]
TypeQ = Annotated[str | None, Query(pattern=_choices(ResourceType))]
PatternQ = Annotated[str | None, Query(pattern=_choices(PatternType, "prefix"))]
OperationQ = Annotated[str | None, Query(pattern=_choices(Operation))]
PermissionQ = Annotated[str | None, Query(pattern=_choices(Permission))]


def _filter(
    principal: PrincipalQ = None,
    resource_type: TypeQ = None,
    name: NameQ = None,
    pattern: PatternQ = None,
    operation: OperationQ = None,
    permission: PermissionQ = None,
) -> AclFilter:
    """The ACL filter of a listing or a removal, from its query (each given field must equal)."""
    if principal is not None:
        try:
            validate_principal(principal)
        except InvalidAclError as e:
            raise bad_request(e.message) from None
    if name is not None and not 1 <= len(name) <= 249:
        raise bad_request("name: 1..249 characters")
    return AclFilter(
        principal=principal,
        resource_type=_enum_param(ResourceType, "resource_type", resource_type),
        name=name,
        pattern=_enum_param(PatternType, "pattern", pattern),
        operation=_enum_param(Operation, "operation", operation),
        permission=_enum_param(Permission, "permission", permission),
    )


AclFilterDep = Annotated[AclFilter, Depends(_filter)]
UserPath = Annotated[str, Path(pattern=USER_PATTERN)]
KeyIdPath = Annotated[str, Path(pattern="^[0-9a-f]{16}$")]


@router.get(
    "/v1/acls", summary="List ACLs (each given field must equal)", responses=errors(400, 403)
)
async def list_acls(security: SecurityDep, where: AclFilterDep) -> AclList:
    rows = await asyncio.to_thread(_store(security).acls)
    return AclList(
        acls=[AclPublic(**_row_dict(r)) for r in rows if where.matches(r)],
    )


@router.delete(
    "/v1/acls",
    summary="Remove the ACLs a filter matches (at least one field); returns them",
    responses=errors(400, 403),
)
async def remove_acls(security: SecurityDep, where: AclFilterDep) -> AclsRemoved:
    if where == AclFilter():
        raise bad_request("name at least one field to match (a filter matching every ACL)")
    gone = await asyncio.to_thread(_store(security).remove_acls, where)
    await security.refresh()
    return AclsRemoved(removed=[AclPublic(**_row_dict(r)) for r in gone])


def _row_dict(row: Any) -> dict[str, str]:
    return {f: getattr(row, f) for f in AclPublic.model_fields}


# -- scoped tokens, whoami -----------------------------------------------------------------------


@router.post(
    "/v1/tokens",
    status_code=201,
    summary="A short-lived token for reading topics from a browser (SSE/WebSocket ?token=)",
    responses=errors(400, 401, 403),
)
async def create_token(body: TokenRequest, request: Request, security: SecurityDep) -> TokenPublic:
    identity = identity_of(request.scope)
    for topic in body.topics:
        require(security, request.scope, Operation.READ, Resource(ResourceType.TOPIC, topic))
    if security.signer is None:
        raise LogbusError("no cluster secret loaded yet", code=ErrorCode.BROKER_BUSY)
    ttl_ms = (body.ttl_minutes or security.settings.token_ttl_minutes) * 60_000
    now = security.now_ms()
    token = security.signer.issue(identity.user, body.topics, now, ttl_ms)
    return TokenPublic(
        token=token, user=identity.user, topics=sorted(set(body.topics)), expires_ms=now + ttl_ms
    )


@router.get("/v1/whoami", summary="The principal this request authenticated as")
async def whoami(request: Request, security: SecurityDep) -> WhoAmI:
    identity = identity_of(request.scope)
    return WhoAmI(
        principal=identity.principal,
        method=identity.method,
        authenticated=security.enabled,
    )
