"""Consumer groups: members join, heartbeat, poll and leave; offsets are committed and reset.

Thin routes over :class:`cluster.coordinator.Coordinator`; record polling is in
:mod:`api.streams`.
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Header, Query, Request, Response
from fastapi.responses import StreamingResponse

from auth_quotas.acl import Operation, Resource, ResourceType
from cluster.assignor import TopicPartition
from cluster.coordinator import Coordinator, validate_group_id
from cluster.forwarding import direct_route
from core_log.errors import ErrorCode, LogbusError

from .. import groups_list, streams
from ..access import identity_of, require
from ..group_schemas import (
    CommittedOffsetPublic,
    GroupDetail,
    GroupList,
    GroupOffsets,
    MemberAssignment,
    MemberJoin,
    OffsetCommit,
    OffsetReset,
)
from ..params import OFFSET_MAX, Digits
from ..problems import bad_request
from ..proxy import FORWARDED_BY
from ..records import JSON, NDJSON, READ_COMMITTED, isolation_of, negotiate
from ..state import CoordinatorDep, StateDep
from ..stream_guard import guarded
from .common import ISOLATION_QUERY, errors

router = APIRouter(prefix="/v1/groups", tags=["groups"])

MAX_GROUPS_LISTED = 10_000

_POLL_CONTENT: dict[int | str, dict[str, Any]] = {
    200: {
        "description": "Records from the member's partitions, its positions and assignment; "
        "NDJSON gives records only; text/event-stream streams them (SSE)",
        "content": {
            JSON: {"schema": {"type": "object"}},
            NDJSON: {"schema": {"type": "string"}},
            streams.SSE: {"schema": {"type": "string"}},
        },
    }
}


def _assignment(coordinator: Coordinator, group: str, member_id: str, r: Any) -> MemberAssignment:
    member = coordinator.member(group, member_id)
    interval = streams.heartbeat_interval_ms(member.session_timeout_ms, r)
    return MemberAssignment.model_validate(streams.assignment_doc(r, interval))


@router.post(
    "/{group}/members",
    status_code=201,
    summary="Join a group: a member id, generation and assignment",
    # 409: the new member's session ran out before its membership was written (a session
    # timeout shorter than a write of the group record).
    responses=errors(400, 404, 409, 503),
)
async def join(
    group: str, body: MemberJoin, coordinator: CoordinatorDep, request: Request, state: StateDep
) -> MemberAssignment:
    for topic in body.topics:  # Kafka: READ on what a member consumes
        require(state.security, request.scope, Operation.READ, Resource(ResourceType.TOPIC, topic))
    r = coordinator.join(
        group,
        body.topics,
        session_timeout_ms=body.session_timeout_ms,
        rebalance_timeout_ms=body.rebalance_timeout_ms,
        instance_id=body.instance_id,
        client_id=body.client_id,
        auto_offset_reset=body.auto_offset_reset,
    )
    await coordinator.durable(group)  # a failover after this answer keeps the member
    return _assignment(coordinator, group, r.member_id, r)


@router.post(
    "/{group}/members/{member}/heartbeat",
    summary="Keep the session; acknowledge released partitions; get the current assignment",
    responses=errors(400, 404),
)
async def heartbeat(
    group: str,
    member: str,
    coordinator: CoordinatorDep,
    ack: Annotated[
        bool,
        Query(
            description="false: keep revoked partitions (they are released by a later "
            "heartbeat with ack=true, once their offsets are committed)"
        ),
    ] = True,
) -> MemberAssignment:
    r = coordinator.heartbeat(group, member, ack=ack)
    await coordinator.durable(group, member_id=member)
    return _assignment(coordinator, group, member, r)


@router.delete(
    "/{group}/members/{member}",
    status_code=204,
    summary="Leave the group (a static member's partitions wait for it unless permanent)",
    responses=errors(400, 404),
)
async def leave(
    group: str,
    member: str,
    coordinator: CoordinatorDep,
    permanent: Annotated[bool, Query(description="static members: leave for good")] = False,
) -> Response:
    coordinator.leave(group, member, permanent=permanent)
    await coordinator.durable(group, member_id=member)
    return Response(status_code=204)


@router.get(
    "/{group}/members/{member}/records",
    summary="Long-poll records from the member's assigned partitions (JSON, NDJSON or SSE)",
    responses={**_POLL_CONTENT, **errors(400, 404, 406)},
    response_model=None,
)
async def poll(
    group: str,
    member: str,
    request: Request,
    state: StateDep,
    max_bytes: Annotated[int | None, Query(ge=1, le=OFFSET_MAX), Digits] = None,
    max_records: Annotated[int | None, Query(ge=1, le=OFFSET_MAX), Digits] = None,
    wait_ms: Annotated[
        int | None, Query(ge=0, le=OFFSET_MAX, description="long-poll up to this long"), Digits
    ] = None,
    isolation: Annotated[str | None, ISOLATION_QUERY] = None,
    accept: Annotated[str | None, Header()] = None,
) -> Response:
    kind = negotiate(accept, [JSON, NDJSON, streams.SSE])
    coordinator = state.coordinator
    if kind == streams.SSE:
        level = isolation_of(request.query_params)
        coordinator.member(group, member)  # unknown member: 404 before the stream
        max_records = min(max_records or 1000, state.settings.max_fetch_records)
        chunk = min(max_bytes or streams.SSE_CHUNK_BYTES, state.settings.max_fetch_bytes)
        stream_budget = state.budgets.stream
        body = streams.member_sse(
            coordinator,
            group,
            member,
            max_records,
            stream_budget,
            chunk,
            committed=level == READ_COMMITTED,
        )
        return _sse(
            guarded(
                body,
                state.security,
                identity_of(request.scope),
                lambda: _member_reads(coordinator, group, member),
            )
        )
    reply = await streams.member_poll(
        coordinator,
        state.settings,
        group,
        member,
        request.query_params,
        kind,
        request.is_disconnected,
    )
    assert isinstance(reply.body, bytes)
    return Response(reply.body, reply.status, reply.headers, media_type=reply.content_type)


def _member_reads(coordinator: Coordinator, group: str, member: str) -> list[Resource]:
    """What a member's stream reads: its group and its subscribed topics (none once the
    member is gone: its stream ends by itself)."""
    try:
        topics = coordinator.member(group, member).topics
    except LogbusError:
        return []
    reads = [Resource(ResourceType.GROUP, group)]
    return reads + [Resource(ResourceType.TOPIC, t) for t in sorted(topics)]


def _sse(body: Any) -> StreamingResponse:
    return StreamingResponse(
        body,
        media_type=streams.SSE,
        headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
    )


@router.post(
    "/{group}/offsets",
    summary="Commit offsets (from a member at its generation, or standalone for an empty group)",
    responses=errors(400, 404, 409),
)
async def commit(
    group: str, body: OffsetCommit, coordinator: CoordinatorDep, request: Request, state: StateDep
) -> GroupOffsets:
    for topic in sorted({o.topic for o in body.offsets}):  # Kafka's OffsetCommit: READ topic
        require(state.security, request.scope, Operation.READ, Resource(ResourceType.TOPIC, topic))
    if (body.member_id is None) != (body.generation is None):
        raise bad_request("member_id and generation go together")
    offsets = {(o.topic, o.partition): (o.offset, o.metadata) for o in body.offsets}
    await coordinator.commit(group, body.member_id, body.generation, offsets)
    return _offsets(coordinator, group, set(offsets))


def _offsets(
    coordinator: Coordinator, group: str, only: set[TopicPartition] | None = None
) -> GroupOffsets:
    committed = coordinator.committed(group)
    return GroupOffsets(
        group=group,
        offsets=[
            CommittedOffsetPublic(
                topic=t, partition=p, offset=c.offset, metadata=c.metadata, commit_ms=c.commit_ms
            )
            for (t, p), c in sorted(committed.items())
            if only is None or (t, p) in only
        ],
    )


@router.get(
    "/{group}/offsets",
    summary="The group's committed offsets (404 for a group with neither members nor offsets)",
    responses=errors(400, 404),
)
async def get_offsets(group: str, coordinator: CoordinatorDep) -> GroupOffsets:
    coordinator.require_known(group)
    return _offsets(coordinator, group)


@router.post(
    "/{group}/offsets/reset",
    summary="Reset an empty group's offsets to earliest, latest, a timestamp or given offsets",
    responses=errors(400, 404, 409, 416),
)
async def reset_offsets(
    group: str, body: OffsetReset, state: StateDep, request: Request
) -> GroupOffsets:
    coordinator = state.coordinator
    validate_group_id(group)  # a bad name is 400 before any offset is looked at
    targets = await _reset_targets(state, group, body)
    for topic in sorted({t for t, _ in targets}):  # Kafka's AlterConsumerGroupOffsets
        require(state.security, request.scope, Operation.READ, Resource(ResourceType.TOPIC, topic))
    await coordinator.reset(group, targets)
    return _offsets(coordinator, group, set(targets))


async def _reset_targets(state: Any, group: str, body: OffsetReset) -> dict[TopicPartition, int]:
    broker = state.broker
    if body.to == "offsets":
        if not body.offsets:
            raise bad_request("to=offsets needs offsets")
        out = {}
        for o in body.offsets:
            p = await broker.synced_reader(o.topic, o.partition)
            if not p.log_start_offset <= o.offset <= p.high_watermark:
                raise LogbusError(
                    f"offset {o.offset} of {o.topic}[{o.partition}] is outside "
                    f"[{p.log_start_offset}, {p.high_watermark}]",
                    code=ErrorCode.OFFSET_OUT_OF_RANGE,
                    log_start_offset=p.log_start_offset,
                    log_end_offset=p.high_watermark,
                )
            out[(o.topic, o.partition)] = o.offset
        return out
    if body.to == "timestamp" and body.timestamp is None:
        raise bad_request("to=timestamp needs timestamp (ms)")
    topics = body.topics or sorted({t for t, _ in state.coordinator.committed(group)})
    if not topics:
        state.coordinator.require_known(group)  # 404 for a group that does not exist
        raise bad_request("the group has no offsets; name the topics to reset")
    out = {}
    for topic in topics:
        for partition in range(broker.topic(topic).partitions):
            p = await broker.synced_reader(topic, partition)
            if body.to == "earliest":
                out[(topic, partition)] = p.log_start_offset
            elif body.to == "latest":
                out[(topic, partition)] = p.high_watermark
            else:
                assert body.timestamp is not None
                found = await p.offset_for_timestamp(body.timestamp)
                out[(topic, partition)] = p.high_watermark if found is None else found
    return out


@router.get(
    "",
    summary="List every group of the cluster with state, member count and lag",
    description="In a cluster the broker asks every coordinator for its groups and merges "
    "the lists; partitions whose coordinator could not answer are named in `unavailable` "
    "(their groups are missing). With `Logbus-Route: direct`: this broker's groups only.",
    responses=errors(400),
)
async def list_groups(
    request: Request,
    state: StateDep,
    limit: Annotated[int, Query(ge=1, le=MAX_GROUPS_LISTED)] = 1000,
) -> GroupList:
    if direct_route.get() or FORWARDED_BY.decode() in request.headers:
        found = groups_list.local_list(state.coordinator, limit)
    else:
        found = await groups_list.cluster_list(state, limit, request.scope)
    security = state.security
    if security is not None and security.enabled:  # only what the principal may describe
        names = {g.group for g in found.groups}
        shown = set(security.visible(identity_of(request.scope), ResourceType.GROUP, names))
        found.groups = [g for g in found.groups if g.group in shown]
    return found


@router.get(
    "/{group}",
    summary="Describe a group: state, members, assignment, committed offsets, log end, lag",
    responses=errors(400, 404),
)
async def describe_group(group: str, coordinator: CoordinatorDep) -> GroupDetail:
    return GroupDetail.model_validate(coordinator.describe(group))


@router.delete(
    "/{group}",
    status_code=204,
    summary="Delete an empty group and its offsets",
    responses=errors(400, 404, 409),
)
async def delete_group(group: str, coordinator: CoordinatorDep) -> Response:
    await coordinator.delete(group)
    return Response(status_code=204)
