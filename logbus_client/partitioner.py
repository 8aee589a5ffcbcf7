"""Which partition a client sends a record to, as Kafka's producer chooses. Pure functions.

The broker's own rules (``cluster/partitioner.py`` uses this murmur2), here so that clients
(the Spark sink) place records exactly where the broker would, without importing server
packages:

* keyed records: ``(murmur2(key) & 0x7fffffff) % partitions`` with Kafka's murmur2 (seed
  0x9747b28c) — the partition a Kafka producer picks for the same key;
* keyless records: the caller's choice (the Spark sink sticks to one partition per request and
  moves on round robin, as KIP-480's sticky partitioner does).

``tests/client/test_partitioner.py`` checks it against Kafka's published values.
"""

from __future__ import annotations

_M = 0x5BD1E995
_SEED = 0x9747B28C
_MASK = 0xFFFFFFFF


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
    """The partition of a keyed record among ``partitions`` (> 0)."""
    return (murmur2(key) & 0x7FFFFFFF) % partitions
