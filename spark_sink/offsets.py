"""Offset arithmetic of the source, over plain values (no Spark, no network).

A source offset is the next offset to read of every partition, as Spark's Kafka source keeps
it: ``{"topic": {"partition": next_offset}}``. Topics are written in name order and partitions
in numeric order, so the same offsets always serialise to the same JSON (Spark compares
offsets by their JSON text to decide whether there is new data).

Rate limiting splits ``maxOffsetsPerTrigger`` across partitions in proportion to what each has
pending, like Kafka's source, but never exceeds the limit: shares are rounded down and the rest
goes by largest remainder; then every partition with data that got nothing takes one record
from the largest share, so a small partition is never starved by large ones. When the limit is
smaller than the number of partitions with data, the partitions with the most pending get one
record each.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from .errors import OptionError

TopicPartition = tuple[str, int]
PartitionOffsets = dict[TopicPartition, int]

EARLIEST = -2  # in startingOffsets/endingOffsets JSON, as in Kafka
LATEST = -1


def to_json_dict(offsets: Mapping[TopicPartition, int]) -> dict[str, dict[str, int]]:
    """``{topic: {"partition": offset}}``, topics by name and partitions by number."""
    out: dict[str, dict[str, int]] = {}
    for topic, partition in sorted(offsets):
        out.setdefault(topic, {})[str(partition)] = offsets[(topic, partition)]
    return out


def from_json_dict(doc: Mapping[str, Any], what: str = "offsets") -> PartitionOffsets:
    """The inverse of :func:`to_json_dict`; raises :class:`OptionError` on a bad shape."""
    if not isinstance(doc, Mapping):
        raise OptionError(f"{what} must be a JSON object of topics, got {doc!r}")
    out: PartitionOffsets = {}
    for topic, parts in doc.items():
        if not isinstance(topic, str) or not isinstance(parts, Mapping):
            raise OptionError(f'{what}: expected {{"topic": {{"partition": offset}}}}')
        for p, off in parts.items():
            try:
                partition = int(p)
            except (TypeError, ValueError):
                raise OptionError(f"{what}: partition {p!r} of {topic} is not a number") from None
            if isinstance(off, bool) or not isinstance(off, int):
                raise OptionError(f"{what}: offset {off!r} of {topic}-{p} is not an integer")
            out[(topic, partition)] = off
    return out


def parse_json_offsets(text: str, what: str) -> PartitionOffsets:
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as e:
        raise OptionError(f"{what} is not valid JSON: {e}") from None
    return from_json_dict(doc, what)


def rate_limit(
    start: Mapping[TopicPartition, int], latest: Mapping[TopicPartition, int], limit: int
) -> PartitionOffsets:
    """End offsets that admit at most ``limit`` records in all from ``start`` towards
    ``latest`` (partitions missing from ``start`` start at 0)."""
    assert limit >= 0
    pending = {tp: max(0, end - start.get(tp, 0)) for tp, end in latest.items()}
    total = sum(pending.values())
    if total <= limit:
        return dict(latest)
    quota = split_budget(pending, limit)
    return {
        tp: start.get(tp, 0) + quota.get(tp, 0) if pending[tp] else end
        for tp, end in latest.items()
    }


def split_budget(pending: Mapping[TopicPartition, int], limit: int) -> dict[TopicPartition, int]:
    """Share ``limit`` (< the sum of ``pending``) across partitions; see the module doc."""
    busy = sorted((tp for tp, n in pending.items() if n > 0), key=lambda tp: (-pending[tp], tp))
    if limit < len(busy):
        return {tp: 1 for tp in busy[:limit]}
    total = sum(pending[tp] for tp in busy)
    quota: dict[TopicPartition, int] = {}
    remainders: list[tuple[int, TopicPartition]] = []
    for tp in busy:
        quota[tp], remainder = divmod(limit * pending[tp], total)
        remainders.append((-remainder, tp))
    for _, tp in sorted(remainders)[: limit - sum(quota.values())]:
        quota[tp] += 1
    for tp in busy:  # one record for every partition with data, from the largest quotas
        if quota[tp] == 0:
            donor = max(busy, key=lambda d: (quota[d], pending[d]))
            quota[donor] -= 1
            quota[tp] = 1
    return quota


@dataclass(frozen=True)
class OffsetRange:
    """Records [start, end) of one partition: the work of one Spark task."""

    topic: str
    partition: int
    start: int
    end: int

    @property
    def size(self) -> int:
        return self.end - self.start


def split_ranges(
    ranges: Iterable[OffsetRange], min_partitions: int | None, max_records: int | None
) -> list[OffsetRange]:
    """Cut large ranges so there are at least ``min_partitions`` tasks (Kafka's
    ``minPartitions``: ranges are cut in proportion to their size, here by largest remainder so
    the count is reached even when rounding would fall short) and no task reads more than
    ``max_records`` (Kafka's ``maxRecordsPerPartition``). Deterministic."""
    items = [r for r in ranges if r.size > 0]
    if max_records is not None:
        items = [piece for r in items for piece in _cut(r, -(-r.size // max_records))]
    total = sum(r.size for r in items)
    if min_partitions is None or len(items) >= min_partitions or total == 0:
        return items
    pieces = [max(1, r.size * min_partitions // total) for r in items]
    by_remainder = sorted(
        range(len(items)), key=lambda i: (-(items[i].size * min_partitions % total), i)
    )
    for i in by_remainder[: max(0, min_partitions - sum(pieces))]:
        pieces[i] += 1
    return [piece for r, n in zip(items, pieces, strict=True) for piece in _cut(r, n)]


def _cut(r: OffsetRange, pieces: int) -> list[OffsetRange]:
    pieces = max(1, min(pieces, r.size))
    bounds = [r.start + r.size * i // pieces for i in range(pieces + 1)]
    return [OffsetRange(r.topic, r.partition, a, b) for a, b in itertools.pairwise(bounds)]
