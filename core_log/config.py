"""Per-topic log configuration with Kafka's names, defaults and validation.

One table declares every key: its type, default and allowed range. ``LogConfig.from_dict``
turns user input (strings or numbers, as Kafka tools send them) into a typed, validated config
or raises :class:`InvalidConfigError` naming the key; unknown keys are rejected, never ignored.

Defaults follow Kafka except for ``flush.ms``: Kafka leaves flushing to the OS and relies on
replication for durability; a single broker cannot, so Logbus flushes at least every second.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from .errors import InvalidConfigError
from .limits import (
    MAX_BATCH_BYTES,
    MAX_DECOMPRESSED_BATCH_RATIO,
    MAX_PRODUCED_DECOMPRESSED_BYTES,
    MAX_SEGMENT_BYTES,
    MIN_MESSAGE_BYTES,
)

LONG_MAX = 2**63 - 1
# An integer config given as text: plain digits, "-1" allowed (Kafka's "unlimited"); not "+1",
# "01", "1_0" or " 1", which int() would take.
_INT_TEXT = re.compile(r"-?(0|[1-9][0-9]{0,18})")
COMPRESSION_TYPES = ("producer", "uncompressed", "none", "gzip", "snappy", "lz4", "zstd")
CLEANUP_POLICIES = ("delete", "compact", "compact,delete")
TIMESTAMP_TYPES = ("CreateTime", "LogAppendTime")
# ``durability`` (beyond Kafka): when a replicated record counts as committed.
# "replicated" (default, Kafka's rule): once min.insync.replicas brokers hold it, in memory (the
#   page cache); disks catch up per flush.ms / flush.messages. Survives losing brokers, not a
#   power loss of all of them at once. Not called "none": the data is durable by replication.
# "fsync": once min.insync.replicas brokers have fsynced it (the high watermark waits for
#   their fsyncs), so even a simultaneous power loss of every broker keeps what was
#   acknowledged with acks=all; costs an fsync per follower fetch and per acks=all append.
DURABILITY_MODES = ("replicated", "fsync")


@dataclass(frozen=True)
class _Key:
    name: str
    attr: str
    kind: type
    default: Any
    low: int | float | None = None
    high: int | float | None = None
    choices: tuple[str, ...] = ()


_KEYS = (
    _Key("cleanup.policy", "cleanup_policy", str, "delete", choices=CLEANUP_POLICIES),
    _Key("compression.type", "compression_type", str, "producer", choices=COMPRESSION_TYPES),
    _Key("delete.retention.ms", "delete_retention_ms", int, 86_400_000, 0, LONG_MAX),
    _Key("durability", "durability", str, "replicated", choices=DURABILITY_MODES),
    _Key("flush.messages", "flush_messages", int, LONG_MAX, 1, LONG_MAX),
    _Key("flush.ms", "flush_ms", int, 1000, 0, LONG_MAX),
    _Key("index.interval.bytes", "index_interval_bytes", int, 4096, 0, 2**31 - 1),
    _Key("max.compaction.lag.ms", "max_compaction_lag_ms", int, LONG_MAX, 1, LONG_MAX),
    _Key(
        "max.message.bytes",
        "max_message_bytes",
        int,
        1_048_588,
        MIN_MESSAGE_BYTES,
        MAX_BATCH_BYTES,
    ),
    _Key("message.timestamp.type", "timestamp_type", str, "CreateTime", choices=TIMESTAMP_TYPES),
    _Key("min.cleanable.dirty.ratio", "min_cleanable_dirty_ratio", float, 0.5, 0.0, 1.0),
    _Key("min.compaction.lag.ms", "min_compaction_lag_ms", int, 0, 0, LONG_MAX),
    _Key("min.insync.replicas", "min_insync_replicas", int, 1, 1, 2**31 - 1),
    _Key("retention.bytes", "retention_bytes", int, -1, -1, LONG_MAX),
    _Key("retention.ms", "retention_ms", int, 604_800_000, -1, LONG_MAX),
    _Key("segment.bytes", "segment_bytes", int, 1_073_741_824, 14, MAX_SEGMENT_BYTES),
    _Key("segment.index.bytes", "segment_index_bytes", int, 10_485_760, 8, 2**31 - 1),
    _Key("segment.ms", "segment_ms", int, 604_800_000, 1, LONG_MAX),
    _Key("unclean.leader.election.enable", "unclean_leader_election", bool, False),
)
KEYS_BY_NAME = {k.name: k for k in _KEYS}


@dataclass(frozen=True)
class LogConfig:
    cleanup_policy: str = "delete"
    compression_type: str = "producer"
    delete_retention_ms: int = 86_400_000
    durability: str = "replicated"
    flush_messages: int = LONG_MAX
    flush_ms: int = 1000
    index_interval_bytes: int = 4096
    max_compaction_lag_ms: int = LONG_MAX
    max_message_bytes: int = 1_048_588
    timestamp_type: str = "CreateTime"
    min_cleanable_dirty_ratio: float = 0.5
    min_compaction_lag_ms: int = 0
    min_insync_replicas: int = 1
    retention_bytes: int = -1
    retention_ms: int = 604_800_000
    segment_bytes: int = 1_073_741_824
    segment_index_bytes: int = 10_485_760
    segment_ms: int = 604_800_000
    unclean_leader_election: bool = False

    @property
    def compact(self) -> bool:
        return "compact" in self.cleanup_policy

    @property
    def delete(self) -> bool:
        return "delete" in self.cleanup_policy

    @property
    def fsync_durability(self) -> bool:
        """``durability=fsync``: the high watermark covers only what min ISR replicas fsynced."""
        return self.durability == "fsync"

    @property
    def log_append_time(self) -> bool:
        return self.timestamp_type == "LogAppendTime"

    @property
    def max_decompressed_bytes(self) -> int:
        """The most records one compressed producer batch may expand to (limits.py says why)."""
        return min(
            MAX_DECOMPRESSED_BATCH_RATIO * self.max_message_bytes, MAX_PRODUCED_DECOMPRESSED_BYTES
        )

    @classmethod
    def from_dict(cls, values: Mapping[str, Any], base: LogConfig | None = None) -> LogConfig:
        """``base`` (default: Kafka defaults) overridden by ``values``; validated."""
        changes = {}
        for name, raw in values.items():
            key = KEYS_BY_NAME.get(name)
            if key is None:
                raise InvalidConfigError(f"unknown config {name!r}", config=name)
            changes[key.attr] = _parse(key, raw)
        return dataclasses.replace(base or cls(), **changes)

    def to_dict(self) -> dict[str, Any]:
        return {k.name: getattr(self, k.attr) for k in _KEYS}

    def overrides(self) -> dict[str, Any]:
        """Only the keys that differ from the defaults."""
        default = LogConfig()
        return {
            k.name: getattr(self, k.attr)
            for k in _KEYS
            if getattr(self, k.attr) != getattr(default, k.attr)
        }


def _parse(key: _Key, raw: Any) -> Any:
    bad = f"invalid value {raw!r} for {key.name}"
    if key.kind is bool:
        if isinstance(raw, bool):
            return raw
        if isinstance(raw, str) and raw.lower() in ("true", "false"):
            return raw.lower() == "true"
        raise InvalidConfigError(bad, config=key.name)
    if key.kind is str:
        if isinstance(raw, str) and raw.replace(" ", "") in key.choices:
            return raw.replace(" ", "")
        raise InvalidConfigError(f"{bad}: one of {', '.join(key.choices)}", config=key.name)
    if isinstance(raw, bool):
        raise InvalidConfigError(bad, config=key.name)
    if key.kind is int and isinstance(raw, str) and not _INT_TEXT.fullmatch(raw):
        raise InvalidConfigError(f"{bad}: an integer in plain digits", config=key.name)
    try:
        value = key.kind(raw)
    except (TypeError, ValueError, OverflowError):
        raise InvalidConfigError(bad, config=key.name) from None
    if isinstance(raw, float) and key.kind is int and raw != value:
        raise InvalidConfigError(bad, config=key.name)
    assert key.low is not None and key.high is not None
    if not key.low <= value <= key.high:
        raise InvalidConfigError(f"{bad}: allowed [{key.low}, {key.high}]", config=key.name)
    return value
