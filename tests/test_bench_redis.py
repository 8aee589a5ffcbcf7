"""``python -m benchmarks.redis_peer``: a tiny run end to end against a real redis-server.

No timing is asserted (the figures depend on the machine and its load): the run itself refuses
to report unless every produce answered 200 and every consume read back exactly the records
written; this checks the shape of what it reports.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

# redis and hiredis come with the bench extra, not the test one
pytest.importorskip("redis", reason="redis-py not installed (pip install -e '.[bench]')")
pytest.importorskip("hiredis", reason="hiredis not installed (pip install -e '.[bench]')")

from benchmarks.redis_peer import (
    CONSUME_READS,
    CONSUME_TARGET,
    PRODUCE_TARGET,
    main,
    redis_server_path,
)

pytestmark = pytest.mark.skipif(
    redis_server_path() is None, reason="redis-server not installed (make bench installs it)"
)


def test_tiny_run_reports_every_ratio(tmp_path: Path) -> None:
    out = tmp_path / "bench-redis.json"
    argv = ["--seconds", "0.3", "--rounds", "2", "--records", "3000", "--concurrency", "2"]
    assert main([*argv, "--json", str(out)]) == 0
    doc = json.loads(out.read_text())
    ratios = doc["ratios"]
    assert len(ratios) == 9
    targets = [r["target"] for r in ratios]
    assert targets == [PRODUCE_TARGET] * 3 + [CONSUME_TARGET] * 6
    for r in ratios:
        assert len(r["rounds"]) == 2 and all(x > 0 for x in r["rounds"])
        assert r["met"] == (r["value"] >= r["target"])
        for side in ("logbus", "redis"):
            passes = r["detail"][side]
            assert len(passes) == 2
            assert all(p["records"] > 0 and p["records"] % 1000 == 0 for p in passes)
    read = 3000 * CONSUME_READS  # each pass reads the whole stream CONSUME_READS times
    for consume in ratios[3:]:  # every Logbus client (blocking, asyncio, http.client, ahead)
        passes = consume["detail"]["logbus"] + consume["detail"]["redis"]
        assert [p["records"] for p in passes] == [read] * 4, consume["name"]
    tried = ratios[0]["detail"]["concurrency_tried"]
    assert set(tried["logbus"]) == set(tried["redis"]) == {"2"}  # the one candidate given
