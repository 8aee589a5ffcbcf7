"""Choosing a partition for a record, as Kafka's producer does. Pure functions.

* Keyed records: ``(murmur2(key) & 0x7fffffff) % partitions`` with Kafka's murmur2 (seed
  0x9747b28c), so a key lands on the same partition a Kafka producer would pick.
* Keyless records: sticky — every keyless record of one request goes to one partition, and the
  next request moves on (round robin); this keeps batches large, as KIP-480 does.
"""

from __future__ import annotations

import functools
import itertools

from logbus_client.partitioner import murmur2 as client_murmur2

# One murmur2 for the broker and its clients (the Spark sink places records itself): the pure
# function lives in the client package, which imports nothing of the server's; the broker adds
# a cache, since keys repeat.
murmur2 = functools.lru_cache(maxsize=65_536)(client_murmur2)


def partition_for_key(key: bytes, partitions: int) -> int:
    return (murmur2(key) & 0x7FFFFFFF) % partitions


class StickyPartitioner:
    """Round robin over requests for keyless records."""

    def __init__(self) -> None:
        self._counter = itertools.count()

    def next_partition(self, partitions: int) -> int:
        return next(self._counter) % partitions
