"""``python -m benchmarks.auth``: its ACL set, and a tiny run end to end.

No timing is asserted: the figures depend on the machine. What is checked is that the three
brokers (no auth, auth + ACLs, auth + quota) run as real processes, the configuration is in
force (the run itself refuses to measure otherwise: 401 without a key, 403 on a denied topic,
``Logbus-Throttle-Time-Ms: 0`` from the quota), and that every ratio is reported with its
target.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

from benchmarks.auth import CONFIGS, RATIOS, USER, bench_acls, main


def test_acls_all_apply_to_the_user_and_mix_kinds() -> None:
    acls = bench_acls(100)
    assert len(acls) == 100
    assert len({json.dumps(a, sort_keys=True) for a in acls}) == 100  # no duplicates
    assert {a["principal"] for a in acls} == {f"User:{USER}", "User:*"}
    kinds = Counter((a["resource_type"], a["pattern"], a["permission"]) for a in acls)
    for kind in (
        ("topic", "literal", "allow"),
        ("topic", "prefixed", "allow"),
        ("topic", "literal", "deny"),
        ("topic", "prefixed", "deny"),
        ("group", "literal", "allow"),
        ("group", "prefixed", "allow"),
    ):
        assert kinds[kind] >= 5, (kind, kinds)


def test_tiny_run_reports_every_ratio(tmp_path: Path) -> None:
    out = tmp_path / "bench-auth.json"
    argv = ["--quick", "--warmup-seconds", "0", "--json", str(out), "--data-dir", str(tmp_path)]
    assert main(argv) == 0
    doc = json.loads(out.read_text())
    figures = {f["name"]: f for f in doc["figures"]}
    for kind in ("small", "json"):
        for spec in RATIOS:
            f = figures[f"{kind}: {spec.name.format(acls=100)}"]
            assert f["unit"] == "ratio" and f["value"] > 0
            assert f["target"] == spec.target
            assert (f["met"] is None) == (spec.target is None)
        rounds = doc["extra"]["rounds"][kind]
        assert len(rounds) == 1 and set(rounds[0]) == set(CONFIGS)
        assert all(v > 0 for v in rounds[0].values())
        assert set(doc["extra"]["cpu_us_per_request_rounds"][kind][0]) == set(CONFIGS)
    assert doc["extra"]["configured"]["acls_for_bench_user"] == 100
    assert doc["extra"]["throttled_ms"] == 0  # the quota measured, never throttled
    assert doc["machine"]["load_average_during"] >= 0
