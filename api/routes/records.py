"""Produce and fetch as FastAPI routes: they document the lean path and back it up.

With ``fast_path`` on (the default) :class:`api.fastpath.FastPath` answers these paths before
FastAPI routing; both call :mod:`api.records`.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable
from typing import Annotated, Any

from fastapi import APIRouter, Header, Query, Request, Response
from fastapi.responses import StreamingResponse

from auth_quotas.acl import Resource, ResourceType
from core_log.errors import LogbusError

from .. import records, streams
from ..access import identity_of, require_transactional
from ..params import OFFSET_MAX, Digits, PartitionPath
from ..schemas import FetchResponse, ProduceResponse
from ..state import AppState, StateDep
from ..stream_guard import guarded
from .common import ISOLATION_QUERY, errors

router = APIRouter(prefix="/v1/topics", tags=["records"])

_RECORDS_EXAMPLE = {
    "records": [
        {"key": "user-1", "value": {"page": "/home", "ms": 12}},
        {"key_b64": "AAE=", "value_b64": "aGVsbG8=", "headers": [{"name": "src", "value": "web"}]},
        {"value": "no key: sticky partition", "partition": 0, "timestamp": 1700000000000},
    ]
}

_PRODUCE_BODY: dict[str, Any] = {
    "requestBody": {
        "required": True,
        "content": {
            records.JSON: {
                "schema": {
                    "type": "object",
                    "required": ["records"],
                    "properties": {
                        "records": {
                            "type": "array",
                            "items": {
                                "type": "object",
                                "properties": {
                                    "key": {"type": ["string", "null"]},
                                    "key_b64": {"type": "string", "format": "byte"},
                                    "value": {"description": "any JSON; null = tombstone"},
                                    "value_b64": {"type": "string", "format": "byte"},
                                    "headers": {
                                        "type": "array",
                                        "items": {
                                            "type": "object",
                                            "properties": {
                                                "name": {"type": "string"},
                                                "value": {"type": ["string", "null"]},
                                                "value_b64": {"type": "string"},
                                            },
                                        },
                                    },
                                    "partition": {"type": "integer", "minimum": 0},
                                    "timestamp": {"type": "integer", "description": "ms"},
                                },
                            },
                        }
                    },
                },
                "example": _RECORDS_EXAMPLE,
            },
            records.NDJSON: {
                "schema": {"type": "string", "description": "one record object per line"},
                "example": '{"key":"a","value":1}\n{"key":"b","value":2}\n',
            },
            records.BATCH: {
                "schema": {
                    "type": "string",
                    "format": "binary",
                    "description": "Kafka record batches v2, back to back (partition path only)",
                },
            },
            records.OCTETS: {
                "schema": {
                    "type": "string",
                    "format": "binary",
                    "description": "one record: the body is its value, the Logbus-Key header "
                    "its key (optional)",
                },
                "example": "any bytes, such as a file (curl --data-binary @file)",
            },
        },
    }
}

_FETCH_CONTENT: dict[int | str, dict[str, Any]] = {
    200: {
        "description": "Records from the offset; headers Logbus-Next-Offset and "
        "Logbus-High-Watermark give the position",
        "content": {
            records.JSON: {"schema": {"$ref": "#/components/schemas/FetchResponse"}},
            records.NDJSON: {"schema": {"type": "string"}},
            records.BATCH: {"schema": {"type": "string", "format": "binary"}},
            streams.SSE: {
                "schema": {
                    "type": "string",
                    "description": "Server-Sent Events, one per record, id = next offset; "
                    "resumes from Last-Event-ID",
                },
            },
        },
    }
}

IdempotencyKey = Annotated[
    str | None,
    Header(
        alias="Idempotency-Key",
        description="retry-safe produce: a repeat within the window (24 h) answers with the "
        "original offsets and appends nothing; the same key with another body is 422",
    ),
]

RecordKey = Annotated[
    str | None,
    Header(
        alias="Logbus-Key",
        description="application/octet-stream: the record's key (its bytes as sent)",
    ),
]

Acks = Annotated[
    str | None,
    Query(
        description="0: no wait; 1: written to the log; all (default, or -1): durable (fsync)",
        json_schema_extra={"enum": ["0", "1", "all", "-1"]},  # checked by Acks.parse (its code)
    ),
]


async def _serve(
    state: AppState, route: str, method: str, topic: str, call: Awaitable[records.Reply]
) -> Response:
    """Await the shared handler, count it in the metrics like the fast path does."""
    started = time.perf_counter()
    try:
        reply = await call
    except LogbusError as e:
        state.metrics.observe(route, method, topic, e.http_status, time.perf_counter() - started)
        raise
    state.metrics.observe(
        route,
        method,
        topic,
        reply.status,
        time.perf_counter() - started,
        reply.records,
        reply.size_bytes,
    )
    assert isinstance(reply.body, bytes)
    return Response(reply.body, reply.status, reply.headers, media_type=reply.content_type)


@router.post(
    "/{topic}/records",
    summary="Produce records (partition by key hash, explicit, or sticky)",
    openapi_extra=_PRODUCE_BODY,
    responses={200: {"model": ProduceResponse}, **errors(400, 404, 409, 413, 415, 422)},
    response_model=None,
)
async def produce_records(
    topic: str,
    request: Request,
    state: StateDep,
    acks: Acks = None,
    idempotency_key: IdempotencyKey = None,
    record_key: RecordKey = None,
) -> Response:
    return await _produce(state, request, topic, None)


@router.post(
    "/{topic}/partitions/{partition}/records",
    summary="Produce records or binary batches to one partition (idempotent with a session)",
    openapi_extra=_PRODUCE_BODY,
    responses={200: {"model": ProduceResponse}, **errors(400, 404, 409, 413, 415, 422)},
    response_model=None,
)
async def produce_partition_records(
    topic: str,
    partition: PartitionPath,
    request: Request,
    state: StateDep,
    acks: Acks = None,
    idempotency_key: IdempotencyKey = None,
    record_key: RecordKey = None,
    producer_id: Annotated[
        str | None,
        Header(
            alias="Logbus-Producer-Id",
            description="idempotent produce (JSON/NDJSON): the id from POST /v1/producers",
        ),
    ] = None,
    producer_epoch: Annotated[
        str | None, Header(alias="Logbus-Producer-Epoch", description="the session's epoch")
    ] = None,
    sequence: Annotated[
        str | None,
        Header(
            alias="Logbus-Sequence",
            description="sequence of the first record; the next request adds the record count",
        ),
    ] = None,
) -> Response:
    return await _produce(state, request, topic, partition)


async def _produce(
    state: AppState, request: Request, topic: str, partition: int | None
) -> Response:
    if records.TRANSACTIONAL_ID_HEADER in request.headers:
        require_transactional(
            state.security, request.scope, request.headers[records.TRANSACTIONAL_ID_HEADER]
        )
    call = records.produce(
        state.broker,
        state.settings,
        topic,
        partition,
        request.query_params,
        request.headers,
        request.stream(),
        state.transactions,
    )
    return await _serve(state, "produce", "POST", topic, call)


@router.get(
    "/{topic}/partitions/{partition}/records",
    summary="Fetch records from an offset (long-poll with min_bytes/wait_ms)",
    responses={**_FETCH_CONTENT, **errors(400, 403, 404, 406, 416, 500, 503)},
    response_model=None,
)
async def fetch_records(
    topic: str,
    partition: PartitionPath,
    request: Request,
    state: StateDep,
    offset: Annotated[
        int | None,
        Query(
            ge=0,
            le=OFFSET_MAX,
            description="first offset to return (SSE: or the Last-Event-ID header)",
        ),
        Digits,
    ] = None,
    max_bytes: Annotated[
        int | None,
        Query(
            ge=1,
            le=OFFSET_MAX,
            description="bytes of records to answer (rendered; at least one record)",
        ),
        Digits,
    ] = None,
    max_records: Annotated[int | None, Query(ge=1, le=OFFSET_MAX), Digits] = None,
    min_bytes: Annotated[
        int | None, Query(ge=0, le=OFFSET_MAX, description="wait until this much"), Digits
    ] = None,
    wait_ms: Annotated[
        int | None, Query(ge=0, le=OFFSET_MAX, description="long-poll up to this long"), Digits
    ] = None,
    isolation: Annotated[str | None, ISOLATION_QUERY] = None,
) -> Response:
    accept = request.headers.get("accept")
    if streams.wants_sse(accept):
        level = records.isolation_of(request.query_params)
        start = streams.resume_offset(request.query_params, request.headers)
        limit = min(max_records or 1000, state.settings.max_fetch_records)
        chunk = min(max_bytes or streams.SSE_CHUNK_BYTES, state.settings.max_fetch_bytes)
        body = streams.partition_sse(
            state.broker,
            topic,
            partition,
            start,
            limit,
            state.budgets.stream,
            chunk,
            committed=level == records.READ_COMMITTED,
        )
        await anext(body)  # raises (404) before the response starts; yields the retry line
        readable = (Resource(ResourceType.TOPIC, topic),)
        body = guarded(body, state.security, identity_of(request.scope), lambda: readable)
        return StreamingResponse(
            streams.prepend(b"retry: %d\n\n" % streams.SSE_RETRY_MS, body),
            media_type=streams.SSE,
            headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
        )
    call = records.fetch(
        state.broker,
        state.settings,
        topic,
        partition,
        request.query_params,
        request.headers.get("accept"),
    )
    return await _serve(state, "fetch", "GET", topic, call)


__all__ = ["FetchResponse", "router"]
