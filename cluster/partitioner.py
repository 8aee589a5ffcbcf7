"""Choosing a partition for a record, as Kafka's producer does. Pure functions.

* Keyed records: ``(murmur2(key) & 0x7fffffff) % partitions`` with Kafka's murmur2 (seed
  0x9747b28c), so a key lands on the same partition a Kafka producer would pick.
* Keyless records: sticky — every keyless record of one request goes to one partition, and the
  next request moves on (round robin); this keeps batches large, as KIP-480 does.
"""

from __future__ import annotations

import functools
import itertools

_M = 0x5BD1E995
_SEED = 0x9747B28C
_MASK = 0xFFFFFFFF


@functools.lru_cache(maxsize=65_536)
def murmur2(data: bytes) -> int:
    """Kafka's ``Utils.murmur2`` as a signed 32-bit int."""
    length = len(data)
    h = (_SEED ^ length) & _MASK
    n4 = length // 4
    for i in range(n4):
        k = int.from_bytes(data[i * 4 : i * 4 + 4], "little")
        k = (k * _M) & _MASK
        k ^= k >> 24
        k = (k * _M) & _MASK
        h = (h * _M) & _MASK
        h ^= k
    rest = length % 4
    tail = n4 * 4
    if rest == 3:
        h ^= data[tail + 2] << 16
    if rest >= 2:
        h ^= data[tail + 1] << 8
    if rest >= 1:
        h ^= data[tail]
        h = (h * _M) & _MASK
    h ^= h >> 13
    h = (h * _M) & _MASK
    h ^= h >> 15
    return h - (1 << 32) if h & 0x80000000 else h


def partition_for_key(key: bytes, partitions: int) -> int:
    return (murmur2(key) & 0x7FFFFFFF) % partitions


class StickyPartitioner:
    """Round robin over requests for keyless records."""

    def __init__(self) -> None:
        self._counter = itertools.count()

    def next_partition(self, partitions: int) -> int:
        return next(self._counter) % partitions
