"""The broker's event loop never stalls: the lag probe, and SQL kept off the loop.

The loop-lag figure under load (retention, compaction, segment rolls and timestamp lookups
while producing) is measured against a real broker in :mod:`tests.api.test_loop_lag`.
"""

from __future__ import annotations

import asyncio
import threading
from types import SimpleNamespace
from typing import Any

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from api.loop_lag import INTERVAL_S, WINDOW_S, LagRecorder, LoopLagProbe
from api.routes.cluster import cluster
from cluster.broker import Broker
from cluster.metadata import BrokerMeta


def test_recorder_histogram_and_windowed_max() -> None:
    registry = CollectorRegistry()
    rec = LagRecorder(registry)
    rec.record(0.0004, 100.2)
    rec.record(0.030, 100.9)
    rec.record(-0.001, 101.5)  # a timer firing early counts as no lag
    assert rec.max_s() == 0.030
    rec.record(0.002, 100.0 + WINDOW_S + 0.5)  # the 30 ms stall is now older than the window
    assert rec.max_s() == 0.002
    text = generate_latest(registry).decode()
    assert 'logbus_event_loop_lag_seconds_bucket{le="0.001"} 2.0' in text
    assert 'logbus_event_loop_lag_seconds_bucket{le="0.05"} 4.0' in text
    assert "logbus_event_loop_lag_seconds_count 4.0" in text
    assert "logbus_event_loop_lag_max_seconds 0.002" in text


def test_probe_sees_a_blocked_loop() -> None:
    """A 200 ms block of the loop shows as one lag of about 200 ms."""

    async def main() -> float:
        rec = LagRecorder(CollectorRegistry())
        probe = LoopLagProbe(rec)
        probe.start()
        await asyncio.sleep(3 * INTERVAL_S)
        threading.Event().wait(0.2)  # block the loop
        await asyncio.sleep(3 * INTERVAL_S)
        probe.stop()
        return rec.max_s()

    assert asyncio.run(main()) >= 0.15


def test_cluster_route_runs_its_sql_off_the_loop(monkeypatch: pytest.MonkeyPatch) -> None:
    threads: list[int] = []
    monkeypatch.setattr("api.routes.cluster.limits", lambda _state: {})

    def brokers() -> list[BrokerMeta]:
        threads.append(threading.get_ident())
        return [BrokerMeta(1, "127.0.0.1", 8080, None)]

    def nothing() -> list[Any]:
        threads.append(threading.get_ident())
        return []

    fake: Any = SimpleNamespace(
        store=SimpleNamespace(brokers=brokers, controller=lambda: None, topics=nothing),
        config=SimpleNamespace(broker_id=1, clustered=False),
    )
    fake.cluster_view = lambda: Broker.cluster_view(fake)  # the real method, a fake store
    answer = asyncio.run(cluster(SimpleNamespace(broker=fake)))
    assert answer.controller == 1 and [b.port for b in answer.brokers] == [8080]
    assert threads and threads[0] != threading.get_ident()
