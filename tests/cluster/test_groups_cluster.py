"""Consumer groups against any broker, with three broker processes: every broker lists every
group of the cluster (each coordinator asked for its own), a group is described through a
broker that does not coordinate it, and a coordinator that cannot answer is named in the list
instead of failing it."""

from __future__ import annotations

import functools
import zlib
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from api.process import BrokerProcess

from .test_cluster_processes import _row, brokers_on_one_store, eventually

TOPIC = "views"
OFFSETS_PARTITIONS = 4  # the coordinator's default for __consumer_offsets
GROUPS = [f"readers-{i}" for i in range(12)]


def _partition(group: str) -> int:
    return zlib.crc32(group.encode()) % OFFSETS_PARTITIONS


def _commit(base: str, group: str, offset: int) -> bool | None:
    """A standalone commit (an empty group) through ``base``; None on a retriable answer."""
    try:
        r = httpx.post(
            f"{base}/v1/groups/{group}/offsets",
            json={"offsets": [{"topic": TOPIC, "partition": 0, "offset": offset}]},
            timeout=15,
        )
    except httpx.TransportError:
        return None
    if r.status_code in (421, 503, 504):
        return None
    assert r.status_code == 200, r.text
    return True


def _list(base: str, **headers: str) -> dict[str, Any]:
    r = httpx.get(f"{base}/v1/groups", headers=headers, timeout=30)
    assert r.status_code == 200, r.text
    doc: dict[str, Any] = r.json()
    return doc


def _complete(base: str) -> dict[str, Any] | None:
    doc = _list(base)
    return doc if not doc["unavailable"] else None


def _leaders(url: str) -> dict[int, int]:
    return {p: _row(url, "__consumer_offsets", p).leader for p in range(OFFSETS_PARTITIONS)}


@pytest.fixture
def groups_cluster(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[tuple[str, dict[int, BrokerProcess]]]:
    with brokers_on_one_store(tmp_path_factory.mktemp("groups")) as (url, brokers):
        r = httpx.post(
            f"{brokers[1].url}/v1/topics",
            json={"name": TOPIC, "partitions": 1, "replication_factor": 3},
            timeout=15,
        )
        assert r.status_code == 201, r.text
        r = httpx.post(
            f"{brokers[1].url}/v1/topics/{TOPIC}/partitions/0/records",
            json={"records": [{"value": str(i)} for i in range(10)]},
            timeout=15,
        )
        assert r.status_code == 200, r.text
        for i, g in enumerate(GROUPS):  # all through broker 1: forwarded to each coordinator
            eventually(functools.partial(_commit, brokers[1].url, g, i % 10), f"commit of {g}")
        yield url, brokers


def test_every_broker_lists_every_group_and_describes_any(
    groups_cluster: tuple[str, dict[int, BrokerProcess]],
) -> None:
    url, brokers = groups_cluster
    leaders = _leaders(url)
    assert len(set(leaders.values())) >= 2, leaders  # leaders are spread over the brokers
    assert {_partition(g) for g in GROUPS} == set(range(OFFSETS_PARTITIONS))

    for i, b in brokers.items():
        doc = eventually(functools.partial(_complete, b.url), f"a complete list from broker {i}")
        assert [g["group"] for g in doc["groups"]] == sorted(GROUPS), (i, doc)
        assert doc["offsets_partitions"] == list(range(OFFSETS_PARTITIONS))
        # Logbus-Route: direct: this broker's own groups, as Kafka's ListGroups of one broker.
        mine = _list(b.url, **{"Logbus-Route": "direct"})
        own = sorted(g for g in GROUPS if leaders[_partition(g)] == i)
        assert [g["group"] for g in mine["groups"]] == own, (i, leaders, mine)
        assert mine["offsets_partitions"] == sorted(p for p, b in leaders.items() if b == i)

    # Describe and offsets through a broker that does not coordinate the group: forwarded.
    for g in GROUPS[:4]:
        coordinator = leaders[_partition(g)]
        other = next(b for j, b in brokers.items() if j != coordinator)
        r = httpx.get(f"{other.url}/v1/groups/{g}", timeout=15)
        assert r.status_code == 200, r.text
        assert r.headers["Logbus-Forwarded-To"] == str(coordinator)
        assert r.json()["group"] == g and r.json()["state"] == "empty"
        committed = r.json()["offsets"][0]["committed_offset"]
        r = httpx.get(f"{other.url}/v1/groups/{g}/offsets", timeout=15)
        assert r.status_code == 200 and r.headers["Logbus-Forwarded-To"] == str(coordinator)
        assert r.json()["offsets"][0]["offset"] == committed == GROUPS.index(g) % 10


def test_a_coordinator_that_cannot_answer_is_named_not_fatal(
    groups_cluster: tuple[str, dict[int, BrokerProcess]],
) -> None:
    url, brokers = groups_cluster
    leaders = _leaders(url)
    victim = next(b for b in sorted(set(leaders.values())) if b != 1)
    lost = sorted(p for p, b in leaders.items() if b == victim)
    brokers[victim].kill()

    # Right after the kill broker 1 may still think the victim leads (its lease runs 2 s),
    # or the partitions may have moved already: either way the answer is 200 and exact.
    doc = _list(brokers[1].url)
    missing = {p for gap in doc["unavailable"] for p in gap["partitions"]}
    assert missing <= set(lost), doc
    assert set(doc["offsets_partitions"]) == set(range(OFFSETS_PARTITIONS)) - missing
    listed = [g["group"] for g in doc["groups"]]
    assert listed == sorted(g for g in GROUPS if _partition(g) not in missing), doc
    for gap in doc["unavailable"]:
        assert gap["code"] in ("COORDINATOR_NOT_AVAILABLE", "COORDINATOR_LOAD_IN_PROGRESS")
        assert gap["broker_id"] in (victim, None) or gap["code"] == "COORDINATOR_LOAD_IN_PROGRESS"

    # Once new coordinators have loaded the partitions, the list is whole again: no group lost.
    whole = eventually(lambda: _complete(brokers[1].url), "a complete list after the failover")
    assert [g["group"] for g in whole["groups"]] == sorted(GROUPS)
