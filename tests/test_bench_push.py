"""``python -m benchmarks.push``: its parts run end to end against real brokers and return
well-formed ratios. No timing is asserted: the figures depend on the machine."""

from __future__ import annotations

import json
import math
import statistics
from pathlib import Path

import pytest

from benchmarks.push import main, measure_push
from benchmarks.ratios import Ratio


def _well_formed(r: Ratio, rounds: int) -> None:
    assert r.name and r.target > 0
    assert len(r.rounds) == rounds
    assert all(math.isfinite(x) and x > 0 for x in r.rounds)
    assert r.met is not None and r.value == pytest.approx(statistics.median(r.rounds))
    json.dumps(r.as_dict())  # what --json writes


def test_measure_push_end_to_end(tmp_path: Path) -> None:
    # 2 rounds: the ABBA order runs each side first once. The latency run is slowed to 50
    # records/s so that a loaded machine cannot make the producer fall behind its schedule.
    push, latency = measure_push(2, 3.0, tmp_path, records=5_000, latency_rate=50)
    _well_formed(push, 2)
    assert push.target == 0.5 and not push.lower_is_better and push.unit == "x"
    sides = push.detail["sides"]
    assert push.detail["records"] >= 5_000
    for side in ("sse", "ws"):
        assert len(sides[side]) == 2
        assert all(
            t["records_per_s"] > 0 and t["broker_cpu_us_per_record"] >= 0 for t in sides[side]
        )
    assert push.rounds == pytest.approx(
        [
            s["records_per_s"] / w["records_per_s"]
            for s, w in zip(sides["sse"], sides["ws"], strict=True)
        ]
    )
    _well_formed(latency, 2)
    assert latency.lower_is_better and latency.unit == "ms" and latency.target == 5
    assert [r["p99_ms"] for r in latency.detail["rounds"]] == latency.rounds
    assert all(r["records"] == 150 for r in latency.detail["rounds"])


@pytest.mark.slow
def test_cluster_part_through_main(tmp_path: Path) -> None:
    out = tmp_path / "push.json"
    argv = ["--only", "cluster", "--rounds", "1", "--seconds", "1", "--json", str(out)]
    assert main([*argv, "--data-dir", str(tmp_path)]) == 0
    doc = json.loads(out.read_text())
    assert len(doc["ratios"]) == 2 and len(doc["load_average"]) == 2
    for r in doc["ratios"]:
        assert r["target"] == 0.7 and len(r["rounds"]) == 1 and r["value"] > 0
        d = r["detail"]
        assert d["leader"] != d["forwarded_via"]
        assert all(len(v) == 1 and v[0] > 0 for v in d["records_per_s"].values())
