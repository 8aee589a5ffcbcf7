"""Topics, their configs and partitions: the admin resource."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query, Response

from cluster.broker import INTERNAL_TOPICS, Broker
from cluster.metadata import TopicMeta
from core_log.config import LogConfig

from ..params import UINT_PATTERN, PartitionPath
from ..schemas import (
    ConfigsPatch,
    ConfigsPublic,
    OffsetPublic,
    PartitionPublic,
    PartitionsIncrease,
    ReplicaPublic,
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
        lso, hw, leo = offsets or (-1, -1, -1)
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
                log_start_offset=lso,
                high_watermark=hw,
                log_end_offset=leo,
                local_replica=local,
            )
        )
    return out


@router.post(
    "",
    status_code=201,
    summary="Create a topic",
    responses=errors(400, 409),
)
async def create_topic(body: TopicCreate, broker: BrokerDep, response: Response) -> TopicPublic:
    t = await broker.create_topic(body.name, body.partitions, body.replication_factor, body.configs)
    response.headers["Location"] = f"/v1/topics/{t.name}"
    return _public(t)


@router.get("", summary="List topics (internal ones such as __consumer_offsets on request)")
async def list_topics(
    broker: BrokerDep,
    internal: Annotated[bool, Query(description="include internal topics")] = False,
) -> TopicList:
    return TopicList(
        topics=[_public(t) for t in broker.topics() if internal or t.name not in INTERNAL_TOPICS]
    )


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
