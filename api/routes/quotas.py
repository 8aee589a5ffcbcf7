"""``/v1/quotas``: Kafka's client quotas (AlterClientQuotas / DescribeClientQuotas) over HTTP.

Quotas live in the metadata store, so any broker can change them and every broker enforces
them within about a second (:mod:`api.quota_state`). This broker reloads at once after its own
change, so a client reads its write here.
"""

from __future__ import annotations

import asyncio
from typing import Annotated, Any

from fastapi import APIRouter, Query, Response
from pydantic import BaseModel, ConfigDict, Field, JsonValue

from auth_quotas.quotas import DEFAULT, EntityPart, QuotaEntity, QuotaType, validate_quotas
from cluster.security_store import DEFAULT_ENTITY, QuotaRow
from core_log.errors import ErrorCode, LogbusError

from ..state import AppState, StateDep
from .common import errors

router = APIRouter(prefix="/v1/quotas", tags=["quotas"])

_PART_DOC = 'a name (1..255 characters), or "<default>" (or null): Kafka\'s default entity'
_TYPES: list[JsonValue] = [q.value for q in QuotaType]


class QuotaEntityBody(BaseModel):
    """Who a quota is for: a user, a client id, or both."""

    model_config = ConfigDict(extra="forbid", json_schema_extra={"minProperties": 1})
    user: str | None = Field(
        default=None, min_length=1, max_length=255, description="the user: " + _PART_DOC
    )
    client_id: str | None = Field(
        default=None, min_length=1, max_length=255, description="the client id: " + _PART_DOC
    )


class QuotaSet(BaseModel):
    """Set (merge) quota values of an entity; other types of the entity are kept."""

    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={
            "examples": [
                {"entity": {"user": "alice"}, "quotas": {"producer_byte_rate": 1048576}},
                {
                    "entity": {"user": "<default>", "client_id": "<default>"},
                    "quotas": {"consumer_byte_rate": 2097152, "request_percentage": 50},
                },
            ]
        },
    )
    entity: QuotaEntityBody
    quotas: dict[str, Any] = Field(
        description="quota name -> value >= 0: producer_byte_rate and consumer_byte_rate "
        "(bytes/s), request_percentage (% of one event loop), controller_mutation_rate "
        "(partitions created/deleted/added per second)",
        json_schema_extra={"propertyNames": {"enum": list(_TYPES)}},
    )


class QuotaEntry(BaseModel):
    entity: dict[str, str] = Field(
        description='{"user": …, "client_id": …}; "<default>" is the default entity'
    )
    quotas: dict[str, float]


class QuotaList(BaseModel):
    model_config = ConfigDict(
        json_schema_extra={
            "examples": [
                {
                    "quotas": [
                        {"entity": {"user": "alice"}, "quotas": {"producer_byte_rate": 1048576}}
                    ],
                    "version": 7,
                }
            ]
        }
    )
    quotas: list[QuotaEntry]
    version: int = Field(description="the security version these quotas are at")


def _store_part(part: EntityPart) -> str | None:
    if part is None:
        return None
    return DEFAULT_ENTITY if part is DEFAULT else str(part)


def _entity(user: str | None, client_id: str | None, *, given: set[str]) -> QuotaEntity:
    data: dict[str, object] = {}
    if "user" in given:
        data["user"] = user
    if "client_id" in given:
        data["client_id"] = client_id
    return QuotaEntity.from_dict(data)


def _entries(rows: list[QuotaRow]) -> list[QuotaEntry]:
    grouped: dict[tuple[str | None, str | None], dict[str, float]] = {}
    for row in rows:
        grouped.setdefault((row.user, row.client_id), {})[row.quota_type] = row.value
    out = []
    for (user, client), values in grouped.items():
        entity = {"user": user, "client_id": client}
        out.append(
            QuotaEntry(entity={k: v for k, v in entity.items() if v is not None}, quotas=values)
        )
    return out


async def _reload(state: AppState) -> int:
    """Apply the store's state here now (the watcher would within 250 ms)."""
    if state.security is not None and state.security.watcher is not None:
        return (await state.security.watcher.refresh()).version
    snapshot = await asyncio.to_thread(state.broker.store.security.snapshot)
    state.quotas.apply_snapshot(snapshot)
    return snapshot.version


async def _listing(state: AppState, user: str | None, client_id: str | None) -> QuotaList:
    store = state.broker.store.security
    rows = await asyncio.to_thread(store.quotas)
    if user is not None:
        rows = [r for r in rows if r.user == user]
    if client_id is not None:
        rows = [r for r in rows if r.client_id == client_id]
    return QuotaList(quotas=_entries(rows), version=state.quotas.version)


@router.put(
    "",
    summary="Set quotas of a user, a client id, or both (Kafka's AlterClientQuotas)",
    description="Merges the given values into the entity's quotas; in force on every broker "
    "within about a second. A value of 0 blocks the entity (every request is throttled).",
    responses=errors(400),
)
async def set_quotas(body: QuotaSet, state: StateDep) -> QuotaList:
    entity = _entity(body.entity.user, body.entity.client_id, given=body.entity.model_fields_set)
    values = validate_quotas(body.quotas)
    if not values:
        raise LogbusError("quotas: name at least one quota", code=ErrorCode.INVALID_CONFIG)
    user, client = _store_part(entity.user), _store_part(entity.client_id)
    await asyncio.to_thread(
        state.broker.store.security.set_quotas,
        user,
        client,
        {t.value: v for t, v in values.items()},
    )
    version = await _reload(state)
    rows = await asyncio.to_thread(state.broker.store.security.quotas)
    mine = [r for r in rows if (r.user, r.client_id) == (user, client)]
    return QuotaList(quotas=_entries(mine), version=version)


# The entity of a listing or a deletion, by its parts (exact names; "<default>" is Kafka's
# default entity).
UserQuery = Annotated[
    str | None, Query(min_length=1, max_length=255, description='user name or "<default>"')
]
ClientIdQuery = Annotated[
    str | None, Query(min_length=1, max_length=255, description='client id or "<default>"')
]


@router.get(
    "",
    summary="List quotas (Kafka's DescribeClientQuotas), optionally of one user / client id",
    responses=errors(400),
)
async def list_quotas(
    state: StateDep, user: UserQuery = None, client_id: ClientIdQuery = None
) -> QuotaList:
    return await _listing(state, user, client_id)


@router.delete(
    "",
    status_code=204,
    summary="Delete quotas of an entity (all of them, or the named types)",
    responses=errors(400),
)
async def delete_quotas(
    state: StateDep,
    user: UserQuery = None,
    client_id: ClientIdQuery = None,
    quota: Annotated[
        list[str] | None,
        Query(
            description="quota types to delete (repeat); none: all of the entity's",
            json_schema_extra={"items": {"type": "string", "enum": _TYPES}},
        ),
    ] = None,
) -> Response:
    given = {name for name, v in (("user", user), ("client_id", client_id)) if v is not None}
    entity = _entity(user, client_id, given=given)
    types = None
    if quota is not None:
        types = [t.value for t in validate_quotas(dict.fromkeys(quota, 0))]
    await asyncio.to_thread(
        state.broker.store.security.delete_quotas,
        _store_part(entity.user),
        _store_part(entity.client_id),
        types,
    )
    await _reload(state)
    return Response(status_code=204)
