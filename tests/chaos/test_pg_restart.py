"""Chaos: restart PostgreSQL (the metadata store) while producers write with acks=all.

While the server is down every heartbeat, metadata refresh and controller call fails; if the
outage outlasts the session timeout the leaders step down (their leases cannot be renewed)
and writes are refused with 421 until the brokers register again and a controller re-elects
leaders. The brokers must ride it out: no process exits, writes are acknowledged again after
the restart, nothing acknowledged is lost (checker), and the replicas end byte-identical up to
the high watermark. A fast restart (``pg_ctl stop -m fast``) and a crash (``-m immediate``)
are both run.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.chaos.harness import ChaosClient, ChaosCluster, check_replicas_identical, running_cluster
from tests.pg import PostgresServer

TOPIC = "pgrestart"
PARTITIONS = 3


@pytest.mark.parametrize("mode", ["fast", "immediate"])
def test_brokers_ride_out_a_postgresql_restart(
    tmp_path: Path,
    postgres_server: PostgresServer,
    postgres_db_url: str,
    mode: str,
    seed: int,
    failure_report: list[str],
) -> None:
    cluster = ChaosCluster(tmp_path, postgres_db_url, seed=seed)
    failure_report.append(cluster.failure_report())
    failure_report.append(f"PostgreSQL log: {postgres_server.log_path}")
    with running_cluster(cluster):
        cluster.create_topic(TOPIC, PARTITIONS)
        client = ChaosClient(cluster, TOPIC, PARTITIONS)
        failure_report.append(f"history: {client.history_path}")
        try:
            client.start()
            client.wait_acked(30, "writes before the restart")
            for _ in range(2):
                postgres_server.restart(mode)
                for p in range(PARTITIONS):
                    client.wait_acked(5, f"writes to {p} after the restart", partition=p)
            for i, b in cluster.brokers.items():
                assert b.proc is not None and b.proc.poll() is None, f"broker {i} exited"
            cluster.wait_healthy(TOPIC)
        finally:
            client.stop()
        hws = cluster.wait_converged(TOPIC)
        client.final_read(hws)
        anomalies = client.check()
        assert anomalies is None, f"{anomalies}\n" + cluster.failure_report()
        diff = check_replicas_identical(cluster, TOPIC, hws)
        assert diff is None, f"{diff}\n" + cluster.failure_report()
