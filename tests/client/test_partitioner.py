"""The broker (cluster.partitioner: the client's murmur2, cached) and the client agree."""

from __future__ import annotations

import random

from cluster import partitioner as broker
from logbus_client import partitioner as client


def test_murmur2_and_partitions_agree_with_the_broker() -> None:
    rng = random.Random(13)
    keys = [b"", b"a", b"ab", b"abc", b"abcd", "ключ".encode()]
    keys += [rng.randbytes(rng.randrange(0, 64)) for _ in range(2000)]
    for key in keys:
        assert client.murmur2(key) == broker.murmur2(key), key
        for n in (1, 2, 3, 7, 50):
            assert client.partition_for_key(key, n) == broker.partition_for_key(key, n)
    # Kafka's own vector: murmur2("21") is -973932308 (Kafka's UtilsTest)
    assert client.murmur2(b"21") == -973932308
