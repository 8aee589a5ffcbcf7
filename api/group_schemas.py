"""Request and response bodies of the consumer-group resource."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from api.params import OFFSET_MAX, PARTITION_MAX, CheckedName, JsonInt, NameStr
from cluster.coordinator import MAX_METADATA_CHARS, MAX_OFFSETS_PER_COMMIT
from cluster.group import (
    MAX_TOPICS_PER_MEMBER,
    REBALANCE_TIMEOUT_MS_DEFAULT,
    SESSION_TIMEOUT_MS_DEFAULT,
    SESSION_TIMEOUT_MS_MAX,
    SESSION_TIMEOUT_MS_MIN,
)

_TP: dict[str, Any] = {"topic": "orders", "partition": 0}


class TopicPartitionRef(BaseModel):
    topic: str
    partition: int


class MemberJoin(BaseModel):
    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={
            "examples": [{"topics": ["orders"], "session_timeout_ms": 10000, "client_id": "app"}]
        },
    )
    topics: list[NameStr] = Field(min_length=1, max_length=MAX_TOPICS_PER_MEMBER)
    session_timeout_ms: JsonInt = Field(
        SESSION_TIMEOUT_MS_DEFAULT, ge=SESSION_TIMEOUT_MS_MIN, le=SESSION_TIMEOUT_MS_MAX
    )
    rebalance_timeout_ms: JsonInt = Field(
        REBALANCE_TIMEOUT_MS_DEFAULT,
        ge=SESSION_TIMEOUT_MS_MIN,
        le=SESSION_TIMEOUT_MS_MAX,
        description="how long the member has to release revoked partitions",
    )
    instance_id: str | None = Field(
        None, max_length=249, description="static membership: survives a quick restart"
    )
    client_id: str | None = Field(None, max_length=249)
    auto_offset_reset: Literal["earliest", "latest", "none"] = Field(
        "latest", description="where to start a partition with no committed offset"
    )


class MemberAssignment(BaseModel):
    model_config = ConfigDict(
        json_schema_extra={
            "examples": [
                {
                    "member_id": "5f0c…",
                    "generation": 3,
                    "assignment": [_TP],
                    "revoking": [],
                    "pending": [],
                    "heartbeat_interval_ms": 3000,
                }
            ]
        }
    )
    member_id: str
    generation: int = Field(description="the member epoch; commits carry it")
    assignment: list[TopicPartitionRef] = Field(description="partitions to read now")
    revoking: list[TopicPartitionRef] = Field(
        description="release these (commit, stop reading), then heartbeat"
    )
    pending: list[TopicPartitionRef] = Field(
        description="assigned to this member once their previous owner releases them"
    )
    heartbeat_interval_ms: int


class OffsetIn(BaseModel):
    model_config = ConfigDict(extra="forbid")
    topic: NameStr
    partition: JsonInt = Field(ge=0, le=PARTITION_MAX)
    offset: JsonInt = Field(
        ge=0, le=OFFSET_MAX, description="the next offset to read (Kafka's convention)"
    )
    metadata: str = Field("", max_length=MAX_METADATA_CHARS)


class OffsetCommit(BaseModel):
    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={
            "examples": [
                {
                    "member_id": "5f0c…",
                    "generation": 3,
                    "offsets": [{"topic": "orders", "partition": 0, "offset": 42}],
                }
            ]
        },
    )
    member_id: str | None = Field(None, description="omit only for a group with no members")
    generation: JsonInt | None = Field(None, ge=-1, le=2**31 - 1)
    offsets: list[OffsetIn] = Field(min_length=1, max_length=MAX_OFFSETS_PER_COMMIT)


class CommittedOffsetPublic(BaseModel):
    topic: str
    partition: int
    offset: int
    metadata: str
    commit_ms: int


class GroupOffsets(BaseModel):
    model_config = ConfigDict(
        json_schema_extra={
            "examples": [
                {
                    "group": "billing",
                    "offsets": [{**_TP, "offset": 42, "metadata": "", "commit_ms": 1700000000000}],
                }
            ]
        }
    )
    group: str
    offsets: list[CommittedOffsetPublic]


class OffsetReset(BaseModel):
    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={
            "examples": [
                {"to": "earliest", "topics": ["orders"]},
                {"to": "timestamp", "timestamp": 1700000000000, "topics": ["orders"]},
                {"to": "offsets", "offsets": [{"topic": "orders", "partition": 0, "offset": 7}]},
            ],
            # What the handler checks: each target names what it needs.
            "allOf": [
                {
                    "if": {"properties": {"to": {"const": "offsets"}}},
                    "then": {
                        "required": ["offsets"],
                        "properties": {"offsets": {"type": "array", "minItems": 1}},
                    },
                },
                {
                    "if": {"properties": {"to": {"const": "timestamp"}}},
                    "then": {
                        "required": ["timestamp"],
                        "properties": {"timestamp": {"type": "integer"}},
                    },
                },
            ],
        },
    )
    to: Literal["earliest", "latest", "timestamp", "offsets"]
    topics: list[CheckedName] | None = Field(
        None,
        max_length=1000,
        description="every partition of these topics (earliest/latest/"
        "timestamp); default: the topics the group has offsets for",
    )
    timestamp: JsonInt | None = Field(
        None, ge=0, le=OFFSET_MAX, description="with to=timestamp, in ms"
    )
    offsets: list[OffsetIn] | None = Field(None, max_length=MAX_OFFSETS_PER_COMMIT)


class PartitionLag(BaseModel):
    topic: str
    partition: int
    committed_offset: int | None
    metadata: str | None
    log_end_offset: int | None = Field(description="the high watermark")
    lag: int | None
    member_id: str | None


class MemberPublic(BaseModel):
    member_id: str
    instance_id: str | None
    client_id: str | None
    member_epoch: int
    topics: list[str]
    assignment: list[TopicPartitionRef]
    revoking: list[TopicPartitionRef]
    target: list[TopicPartitionRef]
    departed: bool = Field(description="a static member that left and may come back")


_MEMBER_EXAMPLE: dict[str, Any] = {
    "member_id": "5f0c…",
    "instance_id": None,
    "client_id": "app",
    "member_epoch": 3,
    "topics": ["orders"],
    "assignment": [_TP],
    "revoking": [],
    "target": [_TP],
    "departed": False,
}


class GroupDetail(BaseModel):
    model_config = ConfigDict(
        json_schema_extra={
            "examples": [
                {
                    "group": "billing",
                    "state": "stable",
                    "group_epoch": 3,
                    "members": [_MEMBER_EXAMPLE],
                    "offsets": [
                        {
                            **_TP,
                            "committed_offset": 40,
                            "metadata": "",
                            "log_end_offset": 42,
                            "lag": 2,
                            "member_id": "5f0c…",
                        }
                    ],
                    "lag": 2,
                }
            ]
        }
    )
    group: str
    state: Literal["empty", "reconciling", "stable"]
    group_epoch: int
    members: list[MemberPublic]
    offsets: list[PartitionLag]
    lag: int = Field(description="total lag over committed partitions")


class GroupSummary(BaseModel):
    group: str
    state: Literal["empty", "reconciling", "stable"]
    members: int
    lag: int


class UnlistedPartitions(BaseModel):
    """``__consumer_offsets`` partitions whose groups a list could not include."""

    partitions: list[int] = Field(description="partitions of __consumer_offsets")
    broker_id: int | None = Field(
        description="the broker believed to coordinate them; null when none leads them"
    )
    code: str = Field(
        description="COORDINATOR_NOT_AVAILABLE (no leader, or the coordinator did not answer "
        "in time or could not be reached) or COORDINATOR_LOAD_IN_PROGRESS (retriable)"
    )
    detail: str


class GroupList(BaseModel):
    model_config = ConfigDict(
        json_schema_extra={
            "examples": [
                {
                    "groups": [{"group": "billing", "state": "stable", "members": 2, "lag": 2}],
                    "offsets_partitions": [0, 1, 2, 3],
                    "unavailable": [],
                },
                {
                    "groups": [{"group": "billing", "state": "stable", "members": 2, "lag": 2}],
                    "offsets_partitions": [0, 1, 3],
                    "unavailable": [
                        {
                            "partitions": [2],
                            "broker_id": 3,
                            "code": "COORDINATOR_NOT_AVAILABLE",
                            "detail": "broker 3 at http://10.0.0.3:8080 could not be reached: "
                            "All connection attempts failed",
                        }
                    ],
                },
            ]
        }
    )
    groups: list[GroupSummary]
    offsets_partitions: list[int] = Field(
        default_factory=list,
        description="the __consumer_offsets partitions whose groups are listed: all of them "
        "unless some are unavailable (with Logbus-Route: direct, those this broker coordinates)",
    )
    unavailable: list[UnlistedPartitions] = Field(
        default_factory=list,
        description="partitions whose coordinator could not list its groups now (retriable): "
        "their groups are missing from groups; empty when the list is complete",
    )
