"""Request and response models of the admin API (one family per resource).

The record paths do not use these for parsing (see :mod:`api.records_codec`); their models here
only describe the bodies in the OpenAPI document.
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, WithJsonSchema
from pydantic.config import JsonDict

from core_log.config import KEYS_BY_NAME

from .params import JsonInt, NameStr

ConfigValue = str | int | float | bool


def config_schema(nullable: bool) -> dict[str, Any]:
    """Topic configs as the broker checks them: known keys only, each with its type and range
    (integers may also be sent as decimal text, as Kafka tools do)."""
    props: dict[str, Any] = {}
    for name, key in KEYS_BY_NAME.items():
        one: dict[str, Any]
        if key.kind is bool:
            one = {"type": "boolean"}
        elif key.kind is str:
            one = {"type": "string", "enum": list(key.choices)}
        else:
            one = {"type": "integer" if key.kind is int else "number"}
            one.update(minimum=key.low, maximum=key.high)
        props[name] = {"anyOf": [one, {"type": "null"}]} if nullable else one
    return {"type": "object", "properties": props, "additionalProperties": False}


_PARTITION_EXAMPLE: JsonDict = {
    "partition": 0,
    "leader": 1,
    "leader_epoch": 0,
    "replicas": [1],
    "isr": [1],
    "log_start_offset": 0,
    "high_watermark": 42,
    "log_end_offset": 42,
    "last_stable_offset": 42,
    "unclean_elections": 0,
    "adding_replicas": [],
    "removing_replicas": [],
}
_TOPIC_EXAMPLE: JsonDict = {
    "name": "orders",
    "topic_id": "5f0c2a7e9b1d4c3e8f6a2b1c0d9e8f7a",
    "partitions": 3,
    "replication_factor": 1,
    "configs": {"retention.ms": 86400000},
    "created_ms": 1700000000000,
}


class TopicCreate(BaseModel):
    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={
            "examples": [{"name": "orders", "partitions": 3, "configs": {"retention.ms": 86400000}}]
        },
    )
    name: NameStr = Field(description="1..249 of [a-zA-Z0-9._-], not '.' or '..'")
    partitions: JsonInt = Field(1, ge=1, le=10_000)
    replication_factor: Annotated[JsonInt, Field(ge=1, le=16)] | None = Field(
        None,
        description="copies of each partition; default: the broker's default_replication_factor",
    )
    configs: Annotated[dict[str, ConfigValue], WithJsonSchema(config_schema(False))] = Field(
        default_factory=dict, max_length=100
    )


class ReplicaPublic(BaseModel):
    """The answering broker's own replica of a partition (it may lag the leader)."""

    broker_id: int
    log_start_offset: int
    high_watermark: int
    log_end_offset: int


class PartitionPublic(BaseModel):
    model_config = ConfigDict(json_schema_extra={"examples": [_PARTITION_EXAMPLE]})

    partition: int
    leader: int
    leader_epoch: int
    replicas: list[int]
    isr: list[int]
    log_start_offset: int = Field(description="the leader's; -1 when it cannot be reached")
    high_watermark: int = Field(description="the leader's; -1 when it cannot be reached")
    log_end_offset: int = Field(description="the leader's; -1 when it cannot be reached")
    last_stable_offset: int = Field(
        default=-1,
        description="the leader's: where read_committed readers stop (the first offset of a "
        "transaction still open, else the high watermark); -1 when it cannot be reached",
    )
    local_replica: ReplicaPublic | None = Field(
        None, description="this broker's replica, if it holds one"
    )
    unclean_elections: int = Field(
        0,
        description="leaders elected from outside the ISR so far "
        "(unclean.leader.election.enable): each may have lost acknowledged records",
    )
    adding_replicas: list[int] = Field(
        default_factory=list,
        description="a reassignment in progress: replicas copying the log (not in the ISR "
        "yet, or not confirmed); empty when none runs",
    )
    removing_replicas: list[int] = Field(
        default_factory=list,
        description="a reassignment in progress: replicas deleted once every adding one is "
        "in the ISR",
    )


# The largest replica list a reassignment may name (Kafka caps nothing; 64 is far beyond any
# useful replication factor and keeps the request small).
MAX_REASSIGN_REPLICAS = 64


class ReplicasChange(BaseModel):
    model_config = ConfigDict(
        extra="forbid", json_schema_extra={"examples": [{"replicas": [2, 3]}]}
    )
    replicas: list[JsonInt] = Field(
        max_length=MAX_REASSIGN_REPLICAS,
        description="the target broker ids, preferred leader first; the count may differ from "
        "the current replication factor (not below min.insync.replicas)",
    )


_REASSIGNMENT_EXAMPLE: JsonDict = {
    "topic": "orders",
    "partition": 0,
    "replicas": [2, 3, 1],
    "adding_replicas": [3],
    "removing_replicas": [1],
    "isr": [1, 2],
    "leader": 1,
    "leader_epoch": 4,
    "in_progress": True,
}


class ReassignmentPublic(BaseModel):
    """A partition's replica set as the reassignment call left it."""

    model_config = ConfigDict(json_schema_extra={"examples": [_REASSIGNMENT_EXAMPLE]})

    topic: str
    partition: int
    replicas: list[int] = Field(description="target replicas first, then the removing ones")
    adding_replicas: list[int]
    removing_replicas: list[int]
    isr: list[int]
    leader: int
    leader_epoch: int
    in_progress: bool = Field(
        description="true until every adding replica is in sync and the removing ones are gone"
    )


class DrainPublic(BaseModel):
    """The reassignments a drain started (one per partition that had a replica there)."""

    model_config = ConfigDict(
        json_schema_extra={
            "examples": [
                {
                    "broker_id": 1,
                    "reassignments": [_REASSIGNMENT_EXAMPLE],
                }
            ]
        }
    )

    broker_id: int
    reassignments: list[ReassignmentPublic]


class TopicPublic(BaseModel):
    model_config = ConfigDict(json_schema_extra={"examples": [_TOPIC_EXAMPLE]})

    name: str
    topic_id: str
    partitions: int
    replication_factor: int
    configs: dict[str, Any] = Field(description="non-default configs")
    created_ms: int


class TopicDetail(TopicPublic):
    model_config = ConfigDict(
        json_schema_extra={
            "examples": [{**_TOPIC_EXAMPLE, "partition_details": [_PARTITION_EXAMPLE]}]
        }
    )

    partition_details: list[PartitionPublic]


class TopicList(BaseModel):
    model_config = ConfigDict(json_schema_extra={"examples": [{"topics": [_TOPIC_EXAMPLE]}]})

    topics: list[TopicPublic]


class ConfigsPublic(BaseModel):
    model_config = ConfigDict(
        json_schema_extra={
            "examples": [
                {
                    "topic": "orders",
                    "configs": {"retention.ms": 86400000, "cleanup.policy": "delete"},
                    "overrides": {"retention.ms": 86400000},
                }
            ]
        }
    )

    topic: str
    configs: dict[str, Any] = Field(description="every effective config")
    overrides: dict[str, Any] = Field(description="configs set on this topic")


class ConfigsPatch(BaseModel):
    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={
            "examples": [{"configs": {"retention.ms": 3600000, "segment.bytes": None}}]
        },
    )
    configs: Annotated[dict[str, ConfigValue | None], WithJsonSchema(config_schema(True))] = Field(
        max_length=100, description="new values; null resets a key to its default"
    )


class PartitionsIncrease(BaseModel):
    model_config = ConfigDict(extra="forbid", json_schema_extra={"examples": [{"count": 6}]})
    count: JsonInt = Field(ge=1, le=10_000, description="the new total number of partitions")


class ProducerInit(BaseModel):
    model_config = ConfigDict(
        extra="forbid", json_schema_extra={"examples": [{}, {"transactional_id": "orders-app-1"}]}
    )
    transactional_id: NameStr | None = Field(
        None,
        description="a stable name: re-initialising it bumps the epoch and fences older sessions",
    )


class ProducerPublic(BaseModel):
    model_config = ConfigDict(
        json_schema_extra={"examples": [{"producer_id": 4021, "producer_epoch": 0}]}
    )
    producer_id: int
    producer_epoch: int


class OffsetPublic(BaseModel):
    model_config = ConfigDict(
        json_schema_extra={
            "examples": [{"topic": "orders", "partition": 0, "at": "earliest", "offset": 0}]
        }
    )

    topic: str
    partition: int
    at: str
    offset: int | None = Field(description="null when no record is at or after the timestamp")


class BrokerPublic(BaseModel):
    broker_id: int
    host: str
    port: int
    rack: str | None
    url: str = Field(description="where clients reach it (its advertised URL)")
    alive: bool = Field(description="its lease is live: it heartbeats within the session timeout")
    broker_epoch: int = Field(description="bumped by every registration (each restart)")


class PartitionHealthPublic(BaseModel):
    """Partition counts over every topic, from the metadata store."""

    total: int
    under_replicated: int = Field(
        description="ISR smaller than the replica set (the target set while reassigning)"
    )
    under_min_isr: int = Field(
        description="ISR below min.insync.replicas: acks=all writes answer NOT_ENOUGH_REPLICAS"
    )
    offline: int = Field(description="no leader: no live in-sync replica to elect")
    unclean_elections: int = Field(
        description="leaders elected from outside the ISR so far (acknowledged data may be lost)"
    )


class ClusterPublic(BaseModel):
    model_config = ConfigDict(
        json_schema_extra={
            "examples": [
                {
                    "broker_id": 1,
                    "clustered": False,
                    "controller": 1,
                    "brokers": [
                        {
                            "broker_id": 1,
                            "host": "127.0.0.1",
                            "port": 8080,
                            "rack": None,
                            "url": "http://127.0.0.1:8080",
                            "alive": True,
                            "broker_epoch": 1,
                        }
                    ],
                    "partitions": {
                        "total": 3,
                        "under_replicated": 0,
                        "under_min_isr": 0,
                        "offline": 0,
                        "unclean_elections": 0,
                    },
                    "limits": {"max_connections": 10000, "max_request_bytes": 67108864},
                }
            ]
        }
    )

    broker_id: int = Field(description="the broker that answered")
    clustered: bool = Field(description="started with a shared metadata store (--metadata-url)")
    controller: int = Field(description="the broker holding the controller lease; -1 if none")
    brokers: list[BrokerPublic]
    partitions: PartitionHealthPublic
    limits: dict[str, int] = Field(
        default_factory=dict,
        description="The broker's caps and timeouts in force, named as its settings "
        "(bytes, ms or counts as the name says); see docs/operations.md",
    )


class Problem(BaseModel):
    """An error (RFC 9457) with a stable Kafka-style code."""

    model_config = ConfigDict(
        json_schema_extra={
            "examples": [
                {
                    "type": "about:blank",
                    "title": "OFFSET_OUT_OF_RANGE",
                    "status": 416,
                    "code": "OFFSET_OUT_OF_RANGE",
                    "retriable": False,
                    "detail": "offset 99 is outside the valid range [0, 42]",
                }
            ]
        }
    )

    type: str = "about:blank"
    title: str
    status: int
    code: str
    retriable: bool
    detail: str


class ProduceOffset(BaseModel):
    partition: int
    offset: int


class ProduceResponse(BaseModel):
    model_config = ConfigDict(
        json_schema_extra={
            "examples": [
                {"offsets": [{"partition": 1, "offset": 41}, {"partition": 0, "offset": 17}]}
            ]
        }
    )

    offsets: list[ProduceOffset]


class RecordPublic(BaseModel):
    offset: int
    timestamp: int
    key: str | None = None
    key_b64: str | None = None
    value: Any = None
    value_b64: str | None = None
    headers: list[dict[str, Any]] = []


class FetchResponse(BaseModel):
    model_config = ConfigDict(
        json_schema_extra={
            "examples": [
                {
                    "records": [
                        {
                            "offset": 41,
                            "timestamp": 1700000000000,
                            "key": "user-1",
                            "value": {"page": "/home"},
                            "headers": [{"name": "src", "value": "web"}],
                        }
                    ],
                    "next_offset": 42,
                    "high_watermark": 42,
                    "log_start_offset": 0,
                    "lag": 0,
                }
            ]
        }
    )

    records: list[RecordPublic]
    next_offset: int
    high_watermark: int
    log_start_offset: int
    lag: int


# -- transactions ---------------------------------------------------------------------------------


class TxnBegin(BaseModel):
    model_config = ConfigDict(
        extra="forbid", json_schema_extra={"examples": [{}, {"transaction_timeout_ms": 30000}]}
    )
    transaction_timeout_ms: JsonInt = Field(
        default=60_000,
        ge=1,
        le=2**31 - 1,
        description="an open transaction older than this is aborted by the coordinator "
        "(Kafka's transaction.timeout.ms; at most the broker's transaction.max.timeout.ms)",
    )


class TxnSession(BaseModel):
    """The producer session a transaction's calls carry."""

    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={"examples": [{"producer_id": 4021, "producer_epoch": 3}]},
    )
    producer_id: JsonInt = Field(ge=0, le=2**63 - 1)
    producer_epoch: JsonInt = Field(ge=0, le=2**15 - 1)


class TxnAbort(BaseModel):
    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={"examples": [{"producer_id": 4021, "producer_epoch": 3}, {}]},
    )
    producer_id: JsonInt | None = Field(default=None, ge=0, le=2**63 - 1)
    producer_epoch: JsonInt | None = Field(
        default=None,
        ge=0,
        le=2**15 - 1,
        description="omit both to abort as an admin whatever is open (ALTER on the cluster)",
    )


class TxnPublic(BaseModel):
    model_config = ConfigDict(
        json_schema_extra={
            "examples": [
                {
                    "transactional_id": "orders-app-1",
                    "producer_id": 4021,
                    "producer_epoch": 4,
                    "completed": True,
                }
            ]
        }
    )
    transactional_id: str
    producer_id: int = Field(description="the session for the next transaction")
    producer_epoch: int = Field(description="bumped at every commit and abort (KIP-890)")
    completed: bool = Field(
        default=True,
        description="false: the decision is durable but some markers are still written",
    )


class TxnPartitions(BaseModel):
    topic: str
    partitions: list[int]


_TXN_LISTED: dict[str, Any] = {
    "transactional_id": "orders-app-1",
    "producer_id": 4021,
    "producer_epoch": 3,
    "state": "ongoing",
    "timeout_ms": 60000,
    "start_ms": 1764180000000,
    "duration_ms": 91250,
    "partitions": [{"topic": "orders", "partitions": [0, 2]}],
    "groups": ["billing"],
}


class TxnDescribed(BaseModel):
    model_config = ConfigDict(json_schema_extra={"examples": [_TXN_LISTED]})
    transactional_id: str
    producer_id: int
    producer_epoch: int
    state: str = Field(
        description="empty, ongoing, prepare_commit, prepare_abort, complete_commit, complete_abort"
    )
    timeout_ms: int
    start_ms: int | None
    duration_ms: int
    partitions: list[TxnPartitions]
    groups: list[str]


class TxnList(BaseModel):
    model_config = ConfigDict(
        json_schema_extra={"examples": [{"transactions": [_TXN_LISTED], "unavailable": []}]}
    )
    transactions: list[TxnDescribed]
    unavailable: list[int] = Field(
        description="__transaction_state partitions whose coordinator did not answer: their "
        "transactions are missing from the list"
    )


class TxnOffset(BaseModel):
    model_config = ConfigDict(extra="forbid")
    topic: NameStr
    partition: JsonInt = Field(ge=0, le=2**31 - 1)
    offset: JsonInt = Field(ge=0, le=2**63 - 1, description="the next offset to consume")
    metadata: str = Field(default="", max_length=4096)


class TxnOffsets(TxnSession):
    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={
            "examples": [
                {
                    "producer_id": 4021,
                    "producer_epoch": 3,
                    "group_id": "etl",
                    "offsets": [{"topic": "raw", "partition": 0, "offset": 42}],
                }
            ]
        },
    )
    group_id: NameStr
    offsets: list[TxnOffset] = Field(min_length=1, max_length=10_000)
    member_id: str | None = Field(
        default=None, description="the member committing (checked like a group commit)"
    )
    generation: JsonInt | None = Field(default=None, ge=0, le=2**31 - 1)


class TxnRecordOffset(BaseModel):
    topic: str
    partition: int
    offset: int


class TxnCommitted(TxnPublic):
    model_config = ConfigDict(
        json_schema_extra={
            "examples": [
                {
                    "transactional_id": "orders-etl",
                    "producer_id": 4022,
                    "producer_epoch": 1,
                    "completed": True,
                    "offsets": [
                        {"topic": "orders", "partition": 1, "offset": 310},
                        {"topic": "audit", "partition": 0, "offset": 77},
                    ],
                }
            ]
        }
    )
    offsets: list[TxnRecordOffset] = Field(description="each record's offset, in request order")
