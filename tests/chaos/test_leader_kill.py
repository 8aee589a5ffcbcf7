"""Chaos: SIGKILL the leader of partitions being written, restart it, many times.

3 brokers, a topic of 3 partitions with RF=3 and min.insync.replicas=2, idempotent producers
writing with acks=all (retrying the same batch and sequence until acknowledged), per partition
one that routes itself to the leader (``Logbus-Route: direct``) and one that sends each attempt
to any running broker, which forwards it to the leader (cluster/forwarding.py). Each cycle
kills the leader of a partition chosen by the seed, waits for a new leader in a higher epoch,
restarts the killed broker at once while waiting for writes to that partition to resume, and
waits until every ISR is full again. Afterwards: the checker finds no anomaly (every
acknowledged record present exactly once, no offset holding two values, consumers never went
back or skipped), no broker answered a 500, writes through non-leaders were acknowledged, and
every replica's log is byte-identical up to the high watermark.

Where a cycle's time goes (phases printed at the end of each run, median/max in s):
``elect`` (kill -> the store names a new leader: the 2 s session timeout), ``start`` (the
restarted broker answers /readyz), ``resume`` (writes to the partition acknowledged again),
``rejoin`` (every ISR full again, every broker applied the rows). Brokers are forked from a
preloaded zygote (tests/zygote.py): a fresh interpreter spent 2 s importing when the
machine was idle and 10-24 s at load 10-20, most of a cycle. Measured on this 2-core machine
shared with other test runs, 20 cycles, medians: SQLite at load 15 elect 2.1, start 3.9, rejoin
1.8, cycle 7.9 s; PostgreSQL at load 20 elect 2.4, start 7.5, rejoin 3.6, cycle 14.3 s, and at
load 40 start 10.6, rejoin 6.4, cycle 20.8 s (the session timeout is the only fixed part).

The default (CI) suite runs 6 cycles on PostgreSQL — the multi-host deployment, whose store is
the one reached over a network. The SQLite run (3 cycles) is ``slow``: its broker-side code is
the same (the store's SQL is shared; only the engine differs), and the suite must stay under
twenty minutes (20 PostgreSQL cycles took 78 s of a 22-minute suite; 12 PostgreSQL and 5
SQLite cycles took 48 s and 20 s of a 21-minute one). Every cycle passes through every phase,
and the first acknowledgement wait plus 6 cycles at ~3.5 s keep the PostgreSQL run near 25 s;
the seed picks each cycle's partition, so successive CI runs kill different brokers. The
longer counts the default variant used to run, and the soak, are one command each:

    LOGBUS_CHAOS_CYCLES=12 pytest tests/chaos/test_leader_kill.py -k "not soak"  # both backends
    LOGBUS_CHAOS_CYCLES=200 pytest tests/chaos/test_leader_kill.py -k "not soak"
    pytest -m slow tests/chaos/test_leader_kill.py   # SQLite's 3 cycles, and 200 on each backend

``LOGBUS_CHAOS_CYCLES=N`` sets both counts; the soak runs 200 cycles on each backend
(``make test-slow``, about 30-70 min each).

A failing run prints its seed (``LOGBUS_CHAOS_SEED`` replays its choices), the brokers' logs and
the history (tests/chaos/checker.py).
"""

from __future__ import annotations

import collections
import functools
import os
import statistics
import time
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import pytest

from cluster.metadata import PartitionMeta
from tests.chaos.harness import (
    ChaosClient,
    ChaosCluster,
    check_replicas_identical,
    eventually,
    running_cluster,
)

TOPIC = "chaos"
PARTITIONS = 3
# 6 on PostgreSQL, 3 on SQLite (slow-marked; module docstring): 12 and 5 took 48 s and 20 s in
# CI, 20 on PostgreSQL 245-560 s at load 15-40 before the zygote.
DEFAULT_CYCLES = {"postgresql": 6, "sqlite": 3}
CYCLES_OVERRIDE = os.environ.get("LOGBUS_CHAOS_CYCLES")
SOAK_CYCLES = 200


def run_leader_kills(
    tmp_path: Path, metadata_url: str, seed: int, report: list[str], cycles: int
) -> list[dict[str, float]]:
    """The scenario; each cycle's phase durations (s), for the report and for tuning."""
    cluster = ChaosCluster(tmp_path, metadata_url, seed=seed)
    report.append(cluster.failure_report())
    timings: list[dict[str, float]] = []
    with running_cluster(cluster):
        cluster.create_topic(TOPIC, PARTITIONS)
        client = ChaosClient(
            cluster, TOPIC, PARTITIONS, writers_per_partition=1, any_broker_writers_per_partition=1
        )
        report.append(f"history: {client.history_path}")
        try:
            client.start()
            client.wait_acked(30, "the first acknowledgements")
            for cycle in range(cycles):
                p = cluster.rng.randrange(PARTITIONS)
                before = cluster.row(TOPIC, p)
                victim = before.leader
                t0 = time.monotonic()
                cluster.kill(victim)
                after = eventually(
                    functools.partial(_new_leader, cluster, p, victim),
                    f"cycle {cycle}: a new leader of partition {p} after killing {victim}",
                )
                t_elected = time.monotonic()
                assert after.leader_epoch > before.leader_epoch
                assert victim not in after.isr
                # The victim starts again at once, while the writes to p resume.
                restarted = _restart_in_background(cluster, victim)
                client.wait_acked(3, f"cycle {cycle}: writes to {p} resume", partition=p)
                t_resumed = time.monotonic()
                t_ready = restarted.result()
                cluster.wait_healthy(TOPIC)
                t_healthy = time.monotonic()
                timings.append(
                    {
                        "elect": t_elected - t0,
                        "resume": t_resumed - t_elected,
                        "start": t_ready - t_elected,
                        "rejoin": t_healthy - max(t_ready, t_resumed),
                        "cycle": t_healthy - t0,
                    }
                )
        finally:
            client.stop()
            report.append(_summary(timings) + "; any-broker answers: " + _codes(client))
            print(report[-1])
        try:
            assert client.acked_count() > 0
            forwarded_ok = [a for a in client.attempts if not a.direct and a.status == 200]
            assert forwarded_ok, "no write sent to any broker was acknowledged"
            hws = cluster.wait_converged(TOPIC)
            client.final_read(hws)
            anomalies = client.check()
            assert anomalies is None, f"{anomalies}\n" + cluster.failure_report()
            diff = check_replicas_identical(cluster, TOPIC, hws)
            assert diff is None, f"{diff}\n" + cluster.failure_report()
        finally:
            client.close()
    return timings


@pytest.fixture(params=[pytest.param("sqlite", marks=pytest.mark.slow), "postgresql"])
def metadata_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """tests/chaos/conftest.py's, with SQLite's run slow-marked (module docstring); the soak
    is slow on both."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'shared.db'}"
    url: str = request.getfixturevalue("postgres_db_url")
    return url


@pytest.mark.timeout(1200)  # 20 cycles took 560 s at load 40; a hang still ends
def test_leader_kill(
    tmp_path: Path, metadata_url: str, seed: int, failure_report: list[str]
) -> None:
    backend = "postgresql" if metadata_url.startswith("postgresql") else "sqlite"
    cycles = int(CYCLES_OVERRIDE) if CYCLES_OVERRIDE else DEFAULT_CYCLES[backend]
    run_leader_kills(tmp_path, metadata_url, seed, failure_report, cycles)


@pytest.mark.slow
@pytest.mark.timeout(6 * 3600)  # 200 cycles of 5-20 s, up to 60 s on a loaded machine
def test_leader_kill_soak(
    tmp_path: Path, metadata_url: str, seed: int, failure_report: list[str]
) -> None:
    run_leader_kills(tmp_path, metadata_url, seed, failure_report, SOAK_CYCLES)


def _restart_in_background(cluster: ChaosCluster, broker: int) -> Future[float]:
    """Start ``broker`` again in a thread; the future's value: when it was ready."""

    def restart() -> float:
        cluster.restart(broker)
        return time.monotonic()

    pool = ThreadPoolExecutor(1, thread_name_prefix=f"restart-{broker}")
    try:
        return pool.submit(restart)
    finally:
        pool.shutdown(wait=False)


def _summary(timings: list[dict[str, float]]) -> str:
    """Per phase: median and max over the cycles, in seconds."""
    if not timings:
        return "no cycle completed"
    parts = []
    for phase in timings[0]:
        values = sorted(t[phase] for t in timings)
        parts.append(f"{phase} {statistics.median(values):.2f}/{values[-1]:.2f}")
    return f"{len(timings)} cycles, s (median/max): " + ", ".join(parts)


def _codes(client: ChaosClient) -> str:
    """How often each answer came back to the any-broker writers (status/code)."""
    seen = collections.Counter(
        f"{a.status}/{a.code}" if a.code else str(a.status) for a in client.attempts if not a.direct
    )
    return ", ".join(f"{k} x{n}" for k, n in seen.most_common())


def _new_leader(cluster: ChaosCluster, partition: int, old: int) -> PartitionMeta | None:
    row = cluster.row(TOPIC, partition)
    return row if row.leader not in (old, -1) else None
