"""Chaos: cut links with TCP proxies (tests/chaos/proxy.py).

* A leader cut off from its followers (the proxy every follower fetches through, in front of
  its replication listener, resets every connection): no follower can report a position, so
  the high watermark cannot pass what was replicated before the cut and no acks=all write sent
  to it afterwards is acknowledged (they time out, or fail with NOT_ENOUGH_REPLICAS once the
  ISR shrank). It keeps its lease, so it stays leader; the followers leave the ISR by the
  leader's compare-and-set on the store's row (the row shows ISR = [leader]), and come back
  the same way after the link heals.
* A broker cut off from PostgreSQL (a proxy between it and the server): its heartbeats fail,
  so it stops leading within the session timeout (plus a margin for a loaded machine) — it
  answers 421 — the controller elects a new leader in a higher epoch, writes go on there; once
  healed the broker registers again and rejoins every ISR.

Throughout, each broker's view of the leadership is sampled: no two brokers ever claim one
partition in one leader epoch. Afterwards the checker finds no anomaly and the replicas are
byte-identical up to the high watermark.
"""

from __future__ import annotations

import time
from pathlib import Path

import httpx
import pytest

from tests.chaos.harness import (
    ROUTE_DIRECT,
    SESSION_TIMEOUT_S,
    ChaosClient,
    ChaosCluster,
    LeadershipSampler,
    check_replicas_identical,
    eventually,
    running_cluster,
)


@pytest.fixture(params=[pytest.param("sqlite", marks=pytest.mark.slow), "postgresql"])
def metadata_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """tests/chaos/conftest.py's, with SQLite's run slow-marked: the links cut here are
    between brokers, the same on either store, and PostgreSQL's run is the one whose store is
    itself cut off below (and the production store); SQLite's took 11 s of the default suite."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'shared.db'}"
    url: str = request.getfixturevalue("postgres_db_url")
    return url


TOPIC = "links"
PARTITIONS = 2
FENCE_MARGIN_S = 20.0  # beyond the session timeout: a loaded 2-core machine, not the protocol


def _finish(cluster: ChaosCluster, client: ChaosClient, sampler: LeadershipSampler) -> None:
    hws = cluster.wait_converged(TOPIC)
    client.final_read(hws)
    anomalies = client.check()
    assert anomalies is None, f"{anomalies}\n" + cluster.failure_report()
    assert sampler.samples > 0
    two_leaders = sampler.violations()
    assert not two_leaders, f"{two_leaders}\n" + cluster.failure_report()
    diff = check_replicas_identical(cluster, TOPIC, hws)
    assert diff is None, f"{diff}\n" + cluster.failure_report()


def test_leader_cut_off_from_its_followers_stops_acknowledging(
    tmp_path: Path, metadata_url: str, seed: int, failure_report: list[str]
) -> None:
    cluster = ChaosCluster(tmp_path, metadata_url, seed=seed, replication_proxies=True)
    failure_report.append(cluster.failure_report())
    with running_cluster(cluster):
        cluster.create_topic(TOPIC, PARTITIONS)
        client = ChaosClient(cluster, TOPIC, PARTITIONS, writers_per_partition=2)
        failure_report.append(f"history: {client.history_path}")
        with LeadershipSampler(cluster, TOPIC) as sampler:
            try:
                client.start()
                p = cluster.rng.randrange(PARTITIONS)
                client.wait_acked(20, f"writes to partition {p}", partition=p)
                leader = cluster.leader(TOPIC, p)
                cluster.replication_link(leader).cut()
                cut_at = time.monotonic()

                # The followers leave the ISR through the store; the leader keeps leading.
                shrunk = eventually(
                    lambda: (lambda r: r if r.isr == [leader] else None)(cluster.row(TOPIC, p)),
                    f"the ISR of {p} shrunk to its leader {leader}",
                )
                assert shrunk.leader == leader
                eventually(
                    lambda: cluster.describe(leader, TOPIC)[p]["isr"] == [leader] or None,
                    f"broker {leader} applied the shrunk ISR",
                )

                # Writes sent after the cut were refused (NOT_ENOUGH_REPLICAS) or timed out.
                def refused_after_cut() -> list[int] | None:
                    statuses = [
                        a.status
                        for a in client.attempts_to(leader)
                        if a.partition == p and a.started > cut_at and a.status is not None
                    ]
                    return statuses if len(statuses) >= 5 else None

                eventually(refused_after_cut, f"answers from the cut-off leader {leader}")
                acked_after_cut = [
                    a
                    for a in client.attempts_to(leader)
                    if a.partition == p and a.started > cut_at and a.status == 200
                ]
                assert not acked_after_cut, acked_after_cut

                cluster.replication_link(leader).heal()
                cluster.wait_healthy(TOPIC)
                client.wait_acked(10, f"writes to {p} after the link healed", partition=p)
            finally:
                client.stop()
        try:
            _finish(cluster, client, sampler)
        finally:
            client.close()


def test_broker_cut_off_from_postgresql_is_fenced(
    tmp_path: Path, postgres_db_url: str, seed: int, failure_report: list[str]
) -> None:
    """PostgreSQL only: on SQLite the store is a file every broker opens, there is no link."""
    cluster = ChaosCluster(tmp_path, postgres_db_url, seed=seed, db_proxies=True)
    failure_report.append(cluster.failure_report())
    with running_cluster(cluster):
        cluster.create_topic(TOPIC, PARTITIONS)
        client = ChaosClient(cluster, TOPIC, PARTITIONS, writers_per_partition=2)
        failure_report.append(f"history: {client.history_path}")
        with LeadershipSampler(cluster, TOPIC) as sampler:
            try:
                client.start()
                p = cluster.rng.randrange(PARTITIONS)
                client.wait_acked(20, f"writes to partition {p}", partition=p)
                before = cluster.row(TOPIC, p)
                cut = before.leader
                epoch_before = _broker_epoch(cluster, cut)
                cluster.db_link(cut).cut()

                cut_url = cluster.url(cut)

                def not_leading() -> bool | None:
                    r = httpx.get(
                        f"{cut_url}/v1/topics/{TOPIC}/partitions/{p}/records",
                        params={"offset": 0, "max_records": 1},
                        headers=ROUTE_DIRECT,
                        timeout=5,
                    )
                    return r.status_code == 421 or None

                eventually(
                    not_leading,
                    f"broker {cut}, cut off from the database, to stop leading {p}",
                    SESSION_TIMEOUT_S + FENCE_MARGIN_S,
                )
                after = eventually(
                    lambda: (lambda r: r if r.leader not in (cut, -1) else None)(
                        cluster.row(TOPIC, p)
                    ),
                    f"a new leader of {p}",
                )
                assert after.leader_epoch > before.leader_epoch
                client.wait_acked(10, f"writes to {p} at the new leader", partition=p)

                cluster.db_link(cut).heal()
                eventually(
                    lambda: _broker_epoch(cluster, cut) > epoch_before or None,
                    f"broker {cut} registered again",
                )
                cluster.wait_healthy(TOPIC)
                client.wait_acked(10, "writes with the full ISR back")
            finally:
                client.stop()
        try:
            _finish(cluster, client, sampler)
        finally:
            client.close()


def _broker_epoch(cluster: ChaosCluster, broker: int) -> int:
    return next(b.broker_epoch for b in cluster.store.brokers() if b.broker_id == broker)


def test_a_retried_write_is_acknowledged_only_once_committed(
    tmp_path: Path, metadata_url: str, seed: int, failure_report: list[str]
) -> None:
    """An idempotent retry of a batch the leader holds but the ISR does not must wait for the
    high watermark like the first attempt: answering it at once (it is a duplicate, nothing is
    appended) acknowledged records that a leader change then lost. The replication link is
    stalled (followers stay in the ISR for the long lag time but cannot fetch)."""
    env = {"LOGBUS_REPLICA_LAG_TIME_MAX_MS": "120000", "LOGBUS_REQUEST_TIMEOUT_MS": "1500"}
    cluster = ChaosCluster(tmp_path, metadata_url, seed=seed, replication_proxies=True, env=env)
    failure_report.append(cluster.failure_report())
    with running_cluster(cluster):
        cluster.create_topic(TOPIC, 1)
        leader = cluster.leader(TOPIC, 0)
        base = cluster.url(leader)
        url = f"{base}/v1/topics/{TOPIC}/partitions/0/records"
        r = httpx.post(f"{base}/v1/producers", json={}, timeout=10)
        assert r.status_code == 201, r.text
        session = r.json()
        headers = {
            **ROUTE_DIRECT,
            "Logbus-Producer-Id": str(session["producer_id"]),
            "Logbus-Producer-Epoch": str(session["producer_epoch"]),
            "Logbus-Sequence": "0",
        }

        def send() -> httpx.Response:
            return httpx.post(
                url,
                params={"acks": "all"},
                json={"records": [{"value": f"stalled-{seed}"}]},
                headers=headers,
                timeout=30,
            )

        cluster.replication_link(leader).stall()
        first = send()
        assert first.status_code == 504, first.text  # REQUEST_TIMED_OUT: not committed
        retried = send()
        view = cluster.describe(leader, TOPIC)
        assert retried.status_code != 200, (
            f"a retry of an uncommitted batch was acknowledged: {retried.text}; "
            + f"leader view {view}"
        )
        cluster.replication_link(leader).heal()
        done = eventually(
            lambda: (lambda r: r if r.status_code == 200 else None)(send()),
            "the retry acknowledged once the link healed",
        )
        assert done.json()["offsets"] == [{"partition": 0, "offset": 0}]
        assert done.headers.get("Logbus-Duplicate") == "true"
