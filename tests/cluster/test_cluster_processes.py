"""Three broker processes sharing a SQLite metadata store: replication, acks=all, failover."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import httpx
import pytest

from cluster.metadata import MetadataStore, PartitionMeta
from tests.server import BrokerProcess

T = TypeVar("T")
# Small leases so a killed broker is fenced within seconds (defaults: 2 s / 9 s / 30 s).
CLUSTER_ENV = {
    "LOGBUS_BROKER_HEARTBEAT_INTERVAL_MS": "200",
    "LOGBUS_BROKER_SESSION_TIMEOUT_MS": "2000",
    "LOGBUS_REPLICA_LAG_TIME_MAX_MS": "3000",
    "LOGBUS_METADATA_REFRESH_INTERVAL_MS": "50",
    "LOGBUS_REPLICA_FETCH_WAIT_MAX_MS": "200",
}
WAIT_S = 30.0  # an upper bound for a condition a healthy cluster reaches in well under 5 s


def eventually(probe: Callable[[], T | None], what: str, timeout_s: float = WAIT_S) -> T:
    """Poll ``probe`` until it returns a value (not None): the cluster's state lives in other
    processes, so there is no event to wait on; the bound is generous and only fails a hang."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = probe()
        if value is not None:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


def post_until_acknowledged(urls: list[str], path: str, what: str, **request: Any) -> None:
    """POST ``path`` to the first of ``urls`` that answers 200, again until one does (a
    partition a killed broker led needs a new leader first)."""

    def send() -> bool | None:
        for url in urls:
            try:
                r = httpx.post(f"{url}{path}", timeout=15, **request)
            except httpx.TransportError:
                continue
            if r.status_code == 200:
                return True
        return None

    eventually(send, what)


@contextlib.contextmanager
def brokers_on_one_store(
    directory: Path, count: int = 3, env: dict[str, str] | None = None
) -> Iterator[tuple[str, dict[int, BrokerProcess]]]:
    """``count`` broker processes (ids 1..count) sharing a SQLite store in ``directory``,
    started with :data:`CLUSTER_ENV` (``env`` overrides some of it) and SIGKILLed at the end:
    (metadata URL, brokers)."""
    url = f"sqlite:///{directory / 'shared.db'}"
    brokers = {
        i: BrokerProcess(
            directory / f"broker-{i}",
            None,
            "--broker-id",
            str(i),
            "--metadata-url",
            url,
            env={**CLUSTER_ENV, **(env or {})},
        )
        for i in range(1, count + 1)
    }
    try:
        for b in brokers.values():
            b.start()
        yield url, brokers
    finally:
        for b in brokers.values():
            b.kill()


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[tuple[str, dict[int, BrokerProcess]]]:
    with brokers_on_one_store(tmp_path) as running:
        yield running


def _row(url: str, topic: str, partition: int = 0) -> PartitionMeta:
    store = MetadataStore(url)
    try:
        return store.topic(topic).assignments[partition]
    finally:
        store.close()


def _produce(base: str, topic: str, values: list[str], acks: str = "all") -> Any:
    r = httpx.post(
        f"{base}/v1/topics/{topic}/partitions/0/records",
        params={"acks": acks},
        json={"records": [{"value": v} for v in values]},
        headers={"Logbus-Route": "direct"},  # 421 from a broker that does not lead
        timeout=30,
    )
    return r


def _local(base: str, topic: str) -> dict[str, Any]:
    r = httpx.get(f"{base}/v1/topics/{topic}/partitions", timeout=10)
    r.raise_for_status()
    part: dict[str, Any] = r.json()[0]
    return {**part, **(part["local_replica"] or {})}  # this broker's own replica's offsets


def knows_topic(base: str, topic: str) -> bool | None:
    """Whether the broker at ``base`` has seen ``topic`` in the store yet (a broker learns of
    a topic created elsewhere at its next metadata poll: until then it answers a retriable
    404); None while not, for :func:`eventually`."""
    r = httpx.get(f"{base}/v1/topics/{topic}/partitions", timeout=10)
    if r.status_code == 404:
        return None
    r.raise_for_status()
    return True


def _values(base: str, topic: str) -> list[Any]:
    r = httpx.get(
        f"{base}/v1/topics/{topic}/partitions/0/records", params={"offset": 0}, timeout=10
    )
    r.raise_for_status()
    return [rec["value"] for rec in r.json()["records"]]


def test_rf3_topic_replicates_and_survives_its_leader_being_killed(
    cluster: tuple[str, dict[int, BrokerProcess]],
) -> None:
    url, brokers = cluster
    r = httpx.post(
        f"{brokers[1].url}/v1/topics",
        json={
            "name": "orders",
            "partitions": 1,
            "replication_factor": 3,
            "configs": {"min.insync.replicas": "2"},
        },
        timeout=10,
    )
    assert r.status_code == 201, r.text
    row = _row(url, "orders")
    assert sorted(row.replicas) == [1, 2, 3] and row.leader in (1, 2, 3)
    leader = brokers[row.leader]

    # A broker that does not lead the partition says so, naming the leader.
    other = next(b for i, b in brokers.items() if i != row.leader)
    eventually(lambda: knows_topic(other.url, "orders"), "the topic known everywhere")
    eventually(lambda: _local(other.url, "orders")["leader"] == row.leader or None, "metadata")
    misdirected = _produce(other.url, "orders", ["nope"])
    assert misdirected.status_code == 421, misdirected.text
    assert misdirected.json()["code"] == "NOT_LEADER_OR_FOLLOWER"

    acked = [f"v{i}" for i in range(50)]
    r = _produce(leader.url, "orders", acked)
    assert r.status_code == 200, r.text

    # acks=all answered: every ISR replica holds the records (its log end is past them).
    for b in brokers.values():
        eventually(lambda b=b: _local(b.url, "orders")["log_end_offset"] >= 50 or None, "copy")

    leader.kill()
    new = eventually(
        lambda: (lambda r: r if r.leader not in (row.leader, -1) else None)(_row(url, "orders")),
        "a new leader",
    )
    assert new.leader_epoch > row.leader_epoch and row.leader not in new.isr
    survivor = brokers[new.leader]
    r2 = eventually(
        lambda: (lambda r: r if r.status_code == 200 else None)(
            _produce(survivor.url, "orders", ["after"])
        ),
        "an acks=all write on the new leader",
    )
    assert r2.json()["offsets"][0]["offset"] == 50 if "offsets" in r2.json() else True
    assert _values(survivor.url, "orders")[:51] == [*acked, "after"]

    # The old leader comes back as a follower, catches up and rejoins the ISR.
    leader.start()
    eventually(
        lambda: (lambda r: r if sorted(r.isr) == [1, 2, 3] else None)(_row(url, "orders")),
        "the old leader back in the ISR",
    )
    assert eventually(
        lambda: _local(leader.url, "orders")["log_end_offset"] == 51 or None, "catch up"
    )
