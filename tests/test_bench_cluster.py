"""``python -m benchmarks.cluster`` (make bench-cluster): its definitions, and a smoke run.

No timing is asserted: the figures depend on the machine. What is checked is that each part
runs end to end against real broker processes and reports sane, complete figures.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from benchmarks.cluster import Sample, lag_ms, main, percentile


def test_percentile_is_nearest_rank() -> None:
    values = [float(v) for v in range(1, 101)]
    assert percentile(values, 50) == 50
    assert percentile(values, 99) == 99
    assert percentile(values, 100) == 100
    assert percentile([7.0], 99) == 7


def test_lag_ms_is_time_until_the_follower_reaches_the_sampled_leader_offset() -> None:
    samples = [
        Sample(0.00, leader_leo=100, follower_leo=100),  # caught up: 0 ms
        Sample(0.05, leader_leo=200, follower_leo=100),  # reaches 200 at 0.125 (interpolated)
        Sample(0.10, leader_leo=300, follower_leo=150),  # reaches 300 at 0.20
        Sample(0.15, leader_leo=300, follower_leo=250),
        Sample(0.20, leader_leo=400, follower_leo=300),  # never reaches 400 in the run
    ]
    lags, unresolved = lag_ms(samples)
    assert unresolved == 1
    assert lags == pytest.approx([0.0, 75.0, 100.0, 50.0])


def _run(tmp_path: Path, *argv: str) -> dict[str, Any]:
    out = tmp_path / "bench.json"
    rc = main(["--json", str(out), "--plot", "", "--data-dir", str(tmp_path), *argv])
    assert rc == 0
    doc: dict[str, Any] = json.loads(out.read_text())
    return doc


def test_lag_part_samples_both_followers(tmp_path: Path) -> None:
    doc = _run(tmp_path, "--quick", "--only", "lag", "--lag-seconds", "1", "--lag-rate", "5000")
    lag = doc["extra"]["lag"]
    assert lag["samples"] > 2 and lag["rate_achieved_records_s"] > 0
    names = {f["name"] for f in doc["figures"]}
    assert {"replication lag p99", "replication lag p99 (time to catch up)"} <= names
    assert all(f["value"] >= 0 for f in doc["figures"])


@pytest.mark.slow
def test_quick_run_end_to_end(tmp_path: Path) -> None:
    doc = _run(tmp_path, "--quick")
    figures = {f["name"]: f for f in doc["figures"]}
    for kind in ("binary", "json"):
        ratio = figures[f"{kind} produce RF=3 acks=all / RF=1 one broker"]
        assert ratio["value"] > 0 and ratio["target"] == 0.33
        rounds = doc["extra"]["throughput_rounds"][kind]
        assert len(rounds) == 1
        assert set(rounds[0]) == {"rf1_standalone", "rf3_direct", "rf3_forwarded", "rf1_cluster"}
    assert len(doc["extra"]["failover_ms_test timings"]) == 2
    assert figures["failover p99, test timings"]["target"] == 3000
    assert doc["extra"]["lag"]["samples"] > 0
    assert "h2_fetch" in doc["extra"]
    assert doc["machine"]["load_average_during"] >= 0
