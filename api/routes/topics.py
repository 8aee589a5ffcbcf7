"""Topics, their configs and partitions: the admin resource."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query, Request, Response

from auth_quotas.acl import CLUSTER, Operation, Resource, ResourceType
from cluster.broker import INTERNAL_TOPICS, Broker
from cluster.metadata import PartitionMeta, TopicMeta
from core_log.config import LogConfig

from ..access import identity_of, require
from ..params import UINT_PATTERN, PartitionPath
from ..schemas import (
    ConfigsPatch,
    ConfigsPublic,
    OffsetPublic,
    PartitionPublic,
    PartitionsIncrease,
    ReassignmentPublic,
    ReplicaPublic,
    ReplicasChange,
    TopicCreate,
    TopicDetail,
    TopicList,
    TopicPublic,
)
from ..state import BrokerDep, StateDep
from .common import errors

router = APIRouter(prefix="/v1/topics", tags=["topics"])

LATEST_TIMESTAMP = -1  # Kafka's ListOffsetsRequest.LATEST_TIMESTAMP
EARLIEST_TIMESTAMP = -2  # Kafka's ListOffsetsRequest.EARLIEST_TIMESTAMP
AT_PATTERN = "^(earliest|latest|-1|-2|" + UINT_PATTERN[2:-2] + ")$"


def _public(t: TopicMeta) -> TopicPublic:
    return TopicPublic(
        name=t.name,
        topic_id=t.topic_id,
        partitions=t.partitions,
        replication_factor=t.replication_factor,
        configs=t.configs,
        created_ms=t.created_ms,
    )


def _configs(t: TopicMeta) -> ConfigsPublic:
    return ConfigsPublic(
        topic=t.name, configs=LogConfig.from_dict(t.configs).to_dict(), overrides=t.configs
    )


async def _partitions(broker: Broker, t: TopicMeta) -> list[PartitionPublic]:
    """Each partition's row, the leader's offsets (asked of it where it is another broker)
    and this broker's replica."""
    leaders = await broker.leader_offsets(t.name, [a.partition for a in t.assignments])
    out = []
    for a, offsets in zip(t.assignments, leaders, strict=True):
        p = broker.local_partition(t.name, a.partition)
        start, hw, leo, stable = offsets or (-1, -1, -1, -1)
        local = None
        if p is not None:
            local = ReplicaPublic(
                broker_id=broker.config.broker_id,
                log_start_offset=p.log_start_offset,
                high_watermark=p.high_watermark,
                log_end_offset=p.log_end_offset,
            )
        out.append(
            PartitionPublic(
                partition=a.partition,
                leader=a.leader,
                leader_epoch=a.leader_epoch,
                replicas=a.replicas,
                isr=a.isr,
                log_start_offset=start,
                high_watermark=hw,
                log_end_offset=leo,
                last_stable_offset=stable,
                local_replica=local,
                unclean_elections=a.unclean_elections,
                adding_replicas=a.adding_replicas,
                removing_replicas=a.removing_replicas,
            )
        )
    return out


def reassignment(row: PartitionMeta) -> ReassignmentPublic:
    return ReassignmentPublic(
        topic=row.topic,
        partition=row.partition,
        replicas=row.replicas,
        adding_replicas=row.adding_replicas,
        removing_replicas=row.removing_replicas,
        isr=row.isr,
        leader=row.leader,
        leader_epoch=row.leader_epoch,
        in_progress=row.reassigning,
    )


@router.post(
    "",
    status_code=201,
    summary="Create a topic",
    responses=errors(400, 409),
)
async def create_topic(
    body: TopicCreate, broker: BrokerDep, response: Response, request: Request, state: StateDep
) -> TopicPublic:
    security = state.security
    if security is not None and security.enabled:
        identity = identity_of(request.scope)
        if not security.allowed(identity, Operation.CREATE, CLUSTER):  # Kafka: either one
            require(
                security, request.scope, Operation.CREATE, Resource(ResourceType.TOPIC, body.name)
            )
    t = await broker.create_topic(body.name, body.partitions, body.replication_factor, body.configs)
    response.headers["Location"] = f"/v1/topics/{t.name}"
    return _public(t)


@router.get("", summary="List topics (internal ones such as __consumer_offsets on request)")
async def list_topics(
    broker: BrokerDep,
    request: Request,
    state: StateDep,
    internal: Annotated[bool, Query(description="include internal topics")] = False,
) -> TopicList:
    topics = [t for t in broker.topics() if internal or t.name not in INTERNAL_TOPICS]
    if state.security is not None and state.security.enabled:  # only what it may describe
        names = set(
            state.security.visible(
                identity_of(request.scope), ResourceType.TOPIC, [t.name for t in topics]
            )
        )
        topics = [t for t in topics if t.name in names]
    return TopicList(topics=[_public(t) for t in topics])


@router.get("/{topic}", summary="Describe a topic and its partitions", responses=errors(404))
async def describe_topic(topic: str, broker: BrokerDep) -> TopicDetail:
    t = broker.topic(topic)
    return TopicDetail(**_public(t).model_dump(), partition_details=await _partitions(broker, t))


@router.delete(
    "/{topic}", status_code=204, summary="Delete a topic and its data", responses=errors(404)
)
async def delete_topic(topic: str, state: StateDep) -> Response:
    await state.broker.delete_topic(topic)
    state.metrics.forget_topic(topic)
    return Response(status_code=204)


@router.get("/{topic}/configs", summary="Effective configs of a topic", responses=errors(404))
async def get_configs(topic: str, broker: BrokerDep) -> ConfigsPublic:
    return _configs(broker.topic(topic))


@router.patch(
    "/{topic}/configs",
    summary="Change topic configs at runtime (no restart)",
    responses=errors(400, 404, 409),
)
async def patch_configs(topic: str, body: ConfigsPatch, broker: BrokerDep) -> ConfigsPublic:
    return _configs(await broker.alter_configs(topic, dict(body.configs)))


@router.post(
    "/{topic}/partitions",
    summary="Increase the number of partitions",
    responses=errors(400, 404, 409),
)
async def add_partitions(topic: str, body: PartitionsIncrease, broker: BrokerDep) -> TopicDetail:
    t = await broker.add_partitions(topic, body.count)
    return TopicDetail(**_public(t).model_dump(), partition_details=await _partitions(broker, t))


@router.get(
    "/{topic}/partitions",
    summary="Partitions: leader, replicas, ISR, log start, high watermark, log end",
    responses=errors(404),
)
async def list_partitions(topic: str, broker: BrokerDep) -> list[PartitionPublic]:
    return await _partitions(broker, broker.topic(topic))


@router.put(
    "/{topic}/partitions/{partition}/replicas",
    status_code=202,
    summary="Reassign a partition's replicas (Kafka's kafka-reassign-partitions, KIP-455)",
    description="Starts moving the partition to the given brokers: the new replicas copy the "
    "log, and once all are in the ISR the controller drops the ones not named (moving the "
    "leader if it is one of them). 202 while the move runs (watch `adding_replicas` / "
    "`removing_replicas` in `GET /v1/topics/{topic}/partitions`); 200 when nothing had to be "
    "copied (the same brokers, or a new order of them). A reassignment of a partition being "
    "reassigned replaces it. Any broker forwards the call to the controller.",
    responses={
        200: {"description": "applied at once (nothing to copy)", "model": ReassignmentPublic},
        **errors(400, 404, 409, 503),
    },
)
async def reassign_partition(
    topic: str,
    partition: PartitionPath,
    body: ReplicasChange,
    broker: BrokerDep,
    response: Response,
) -> ReassignmentPublic:
    row = await broker.reassign_partition(topic, partition, list(body.replicas))
    if not row.reassigning:
        response.status_code = 200
    return reassignment(row)


@router.delete(
    "/{topic}/partitions/{partition}/replicas",
    summary="Cancel a partition's reassignment: back to its original replicas",
    description="409 `NO_REASSIGNMENT_IN_PROGRESS` when none runs; 409 "
    "`REASSIGNMENT_IN_PROGRESS` (retriable) while going back would leave fewer in-sync "
    "replicas than min.insync.replicas.",
    responses=errors(404, 409, 503),
)
async def cancel_reassignment(
    topic: str, partition: PartitionPath, broker: BrokerDep
) -> ReassignmentPublic:
    return reassignment(await broker.cancel_reassignment(topic, partition))


@router.get(
    "/{topic}/partitions/{partition}/offsets",
    summary="Look up an offset: earliest (or -2), latest (or -1), or the first at/after a "
    "timestamp (ms)",
    responses=errors(400, 404),
)
async def get_offset(
    topic: str,
    partition: PartitionPath,
    broker: BrokerDep,
    at: Annotated[
        str,
        Query(
            pattern=AT_PATTERN,
            examples=["earliest", "latest", "-1", "-2", "1700000000000"],
            description="earliest (or Kafka's -2), latest (or -1), or a timestamp in ms",
        ),
    ] = "latest",
) -> OffsetPublic:
    p = await broker.synced_reader(topic, partition)
    offset: int | None
    # Kafka's ListOffsets sentinels: -1 is the latest offset, -2 the earliest.
    if at in ("earliest", str(EARLIEST_TIMESTAMP)):
        offset = p.log_start_offset
    elif at in ("latest", str(LATEST_TIMESTAMP)):
        offset = p.high_watermark
    else:
        ts = int(at)  # AT_PATTERN admits -1, -2 (taken above) and plain digits only
        found = await p.offset_for_timestamp(ts)
        offset = found if found is not None and found < p.high_watermark else None
    return OffsetPublic(topic=topic, partition=partition, at=at, offset=offset)
