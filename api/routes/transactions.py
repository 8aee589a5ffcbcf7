"""Transactions (KIP-98 over HTTP): a session per transactional id, commit, abort, admin list.

A client begins a session (``POST /v1/transactions/{id}``: producer id and epoch, fencing any
older session of the id), produces to partitions with ``Logbus-Transactional-Id`` and its
session headers (the broker adds each partition to the transaction at the coordinator before
it appends), then commits or aborts; the answer carries the epoch of its next transaction
(the epoch is bumped at every end: KIP-890). See docs/transactions.md.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal, get_args

from fastapi import APIRouter, Query, Request

from auth_quotas.acl import CLUSTER, Operation, Resource, ResourceType
from cluster.txn_state import PERSISTED_STATES
from core_log.errors import ErrorCode, LogbusError

from .. import transactions as single
from ..access import identity_of, require, require_transactional
from ..schemas import (
    TxnAbort,
    TxnBegin,
    TxnCommitted,
    TxnDescribed,
    TxnList,
    TxnOffsets,
    TxnPublic,
    TxnSession,
)
from ..state import StateDep
from .common import errors

router = APIRouter(prefix="/v1/transactions", tags=["transactions"])

StateName = Literal[
    "empty", "ongoing", "prepare_commit", "prepare_abort", "complete_commit", "complete_abort"
]
# The query validates the states (400 for another); they are the persisted ones.
assert set(get_args(StateName)) == {s.name.lower() for s in PERSISTED_STATES}


@router.post(
    "/{transactional_id}",
    status_code=201,
    summary="Begin a transactional producer session: producer id and epoch; fences older ones",
    responses=errors(400, 403, 409, 503),
)
async def begin(
    transactional_id: str, request: Request, state: StateDep, body: TxnBegin
) -> TxnPublic:
    require_transactional(state.security, request.scope, transactional_id)
    timeout_ms = body.transaction_timeout_ms
    pid, epoch = await state.transactions.init_producer(transactional_id, timeout_ms)
    return TxnPublic(transactional_id=transactional_id, producer_id=pid, producer_epoch=epoch)


async def _end(
    transactional_id: str, request: Request, state: StateDep, session: TxnSession, commit: bool
) -> TxnPublic:
    require_transactional(state.security, request.scope, transactional_id)
    answer = await state.transactions.end(
        transactional_id, session.producer_id, session.producer_epoch, commit
    )
    return TxnPublic(transactional_id=transactional_id, **answer)


@router.post(
    "/{transactional_id}/commit",
    summary="Commit the open transaction: every partition's records become visible together",
    responses=errors(400, 403, 409, 503),
)
async def commit(
    transactional_id: str, request: Request, state: StateDep, body: TxnSession
) -> TxnPublic:
    return await _end(transactional_id, request, state, body, True)


@router.post(
    "/{transactional_id}/abort",
    summary="Abort the open transaction (with no session: an admin abort of a hanging one)",
    responses=errors(400, 403, 404, 409, 503),
)
async def abort(
    transactional_id: str, request: Request, state: StateDep, body: TxnAbort
) -> TxnPublic:
    if body.producer_id is None and body.producer_epoch is None:
        require(state.security, request.scope, Operation.ALTER, CLUSTER)
        answer = await state.transactions.admin_abort(transactional_id)
        return TxnPublic(transactional_id=transactional_id, **answer)
    if body.producer_id is None or body.producer_epoch is None:
        raise LogbusError(
            "send producer_id and producer_epoch together (or neither, for an admin abort)",
            code=ErrorCode.INVALID_REQUEST,
        )
    session = TxnSession(producer_id=body.producer_id, producer_epoch=body.producer_epoch)
    return await _end(transactional_id, request, state, session, False)


@router.get(
    "/{transactional_id}",
    summary="Describe a transactional id: its session, state and open transaction",
    responses=errors(400, 403, 404, 503),
)
async def describe(transactional_id: str, request: Request, state: StateDep) -> TxnDescribed:
    resource = Resource(ResourceType.TRANSACTIONAL_ID, transactional_id)
    require(state.security, request.scope, Operation.DESCRIBE, resource)
    return TxnDescribed(**await state.transactions.describe(transactional_id))


@router.get(
    "",
    summary="List transactions (the hanging ones: state=ongoing&min_duration_ms=...)",
    responses=errors(400, 403),
)
async def list_transactions(
    request: Request,
    state: StateDep,
    states: Annotated[
        list[StateName] | None,
        Query(alias="state", description="only these states; repeat for several"),
    ] = None,
    min_duration_ms: Annotated[int, Query(ge=0, le=2**62)] = 0,
) -> TxnList:
    listed, unavailable = await state.transactions.list_transactions(states, min_duration_ms)
    security = state.security
    if security is not None and security.enabled:
        who = identity_of(request.scope)
        listed = [
            t
            for t in listed
            if security.allowed(
                who,
                Operation.DESCRIBE,
                Resource(ResourceType.TRANSACTIONAL_ID, t["transactional_id"]),
            )
        ]
    return TxnList(transactions=[TxnDescribed(**t) for t in listed], unavailable=unavailable)


@router.post(
    "/{transactional_id}/offsets",
    summary="Add a consumer group's offsets to the open transaction (committed with it)",
    responses=errors(400, 403, 404, 409, 503),
)
async def send_offsets(
    transactional_id: str, request: Request, state: StateDep, body: TxnOffsets
) -> dict[str, str]:
    require_transactional(state.security, request.scope, transactional_id)
    group = Resource(ResourceType.GROUP, body.group_id)
    require(state.security, request.scope, Operation.READ, group)  # Kafka: READ on the group
    for o in body.offsets:
        require(
            state.security, request.scope, Operation.READ, Resource(ResourceType.TOPIC, o.topic)
        )
    offsets = {(o.topic, o.partition): (o.offset, o.metadata) for o in body.offsets}
    if len(offsets) != len(body.offsets):
        raise LogbusError("a partition is named twice", code=ErrorCode.INVALID_REQUEST)
    await state.transactions.send_offsets(
        transactional_id,
        body.producer_id,
        body.producer_epoch,
        body.group_id,
        offsets,
        member_id=body.member_id,
        generation=body.generation,
    )
    return {}


_SINGLE_BODY: dict[str, Any] = {
    "requestBody": {
        "required": True,
        "content": {
            "application/json": {
                "schema": {
                    "type": "object",
                    "required": ["transactional_id"],
                    "properties": {
                        "transactional_id": {"type": "string"},
                        "transaction_timeout_ms": {"type": "integer", "default": 60000},
                        "records": {
                            "type": "array",
                            "description": "records as in a produce, each with its topic "
                            "(and optionally partition, key, headers, timestamp)",
                            "items": {
                                "type": "object",
                                "required": ["topic"],
                                "properties": {
                                    "topic": {"type": "string"},
                                    "partition": {"type": "integer"},
                                    "key": {"type": ["string", "null"]},
                                    "value": {"description": "any JSON; null = tombstone"},
                                },
                            },
                        },
                        "offsets": {
                            "type": "object",
                            "description": "a group's offsets committed with the records",
                            "properties": {
                                "group_id": {"type": "string"},
                                "offsets": {"type": "array", "items": {"type": "object"}},
                            },
                        },
                    },
                },
                "example": {
                    "transactional_id": "orders-etl",
                    "records": [
                        {"topic": "orders", "key": "o-1", "value": {"total": 12}},
                        {"topic": "audit", "value": "o-1 placed"},
                    ],
                    "offsets": {
                        "group_id": "etl",
                        "offsets": [{"topic": "raw", "partition": 0, "offset": 42}],
                    },
                },
            }
        },
    }
}


@router.post(
    "",
    summary="Write records to several partitions (and a group's offsets) in one transaction",
    openapi_extra=_SINGLE_BODY,
    responses=errors(400, 403, 404, 409, 413, 503),
)
async def single_request(request: Request, state: StateDep) -> TxnCommitted:
    req = single.parse(state.broker, state.settings, await request.body())
    require_transactional(state.security, request.scope, req.transactional_id)
    for topic in req.topics():
        require(state.security, request.scope, Operation.WRITE, Resource(ResourceType.TOPIC, topic))
    if req.offsets is not None:
        group = Resource(ResourceType.GROUP, req.offsets.group_id)
        require(state.security, request.scope, Operation.READ, group)
        for topic in sorted({o.topic for o in req.offsets.offsets}):
            require(
                state.security, request.scope, Operation.READ, Resource(ResourceType.TOPIC, topic)
            )
    return TxnCommitted(**await single.run(state.broker, state.transactions, req))
