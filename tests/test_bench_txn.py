"""``python -m benchmarks.transactions``: a tiny run end to end.

No timing is asserted (the figures depend on the machine): the run itself refuses to report
unless every request succeeded, every commit answered with its markers written, and
read_committed read exactly the records read_uncommitted read (all were committed).
"""

from __future__ import annotations

import json
from pathlib import Path

from benchmarks.transactions import main


def test_tiny_run_reports_both_ratios(tmp_path: Path) -> None:
    out = tmp_path / "bench-transactions.json"
    argv = ["--seconds", "0.5", "--rounds", "1", "--fetch-rounds", "1", "--json", str(out)]
    argv += ["--data-dir", str(tmp_path)]
    assert main(argv) == 0
    doc = json.loads(out.read_text())
    (rnd,) = doc["produce_rounds"]
    assert rnd["transactional"]["commits"] >= 1
    assert rnd["transactional"]["records"] % 1000 == 0 and rnd["transactional"]["records"] > 0
    assert doc["produce_ratio"] > 0 and doc["produce_target"] == 0.7
    (fetch,) = doc["fetch_rounds"]
    assert fetch["read_committed"]["records"] == fetch["read_uncommitted"]["records"] > 0
    assert doc["fetch_ratio"] > 0 and doc["fetch_target"] == 0.9
