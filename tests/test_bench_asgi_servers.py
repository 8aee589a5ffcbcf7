"""``python -m benchmarks.asgi_servers``: the uvicorn candidates (no extra installs) run end to
end with tiny parameters and the output has its shape. No timing is asserted: the figures
depend on the machine."""

from __future__ import annotations

import importlib.util
import json
import math
import os
import shutil
import sys
from pathlib import Path

import pytest

from benchmarks.asgi_servers import BASELINE, CANDIDATES, main, select, tree_cpu_seconds

pytestmark = pytest.mark.skipif(shutil.which("wrk") is None, reason="wrk is not installed")

UVICORN = [c.name for c in CANDIDATES if c.name.startswith("uvicorn")]


def test_select_keeps_the_baseline() -> None:
    assert [c.name for c in select("uvicorn-h11")] == [BASELINE, "uvicorn-h11-uvloop"]
    assert [c.name for c in select("uvicorn")] == UVICORN
    assert len(select(None)) == len(CANDIDATES)


def test_tree_cpu_seconds_counts_this_process() -> None:
    assert tree_cpu_seconds(os.getpid()) > 0


def test_uvicorn_candidates_end_to_end(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # hypercorn is asked for too: this interpreter has none, so it is skipped with a line.
    hypercorn = importlib.util.find_spec("hypercorn") is not None
    out = tmp_path / "servers.json"
    argv = ["--only", "uvicorn,hypercorn", "--rounds", "1", "--seconds", "1", "--warmup", "0"]
    # --python is the interpreter for granian and hypercorn; the uvicorn ones never use it.
    argv += ["--python", sys.executable, "--data-dir", str(tmp_path), "--json", str(out)]
    if hypercorn:
        argv[1] = "uvicorn"
    assert main(argv) == 0
    doc = json.loads(out.read_text())
    assert doc["baseline"] == BASELINE and doc["connections"] == 64 and doc["rounds"] == 1
    assert set(doc["load_average"]) == {"start", "end"}
    assert [s["name"] for s in doc["servers"]] == UVICORN
    for s in doc["servers"]:
        assert len(s["requests_per_s"]) == len(s["cpu_us_per_request"]) == 1
        assert s["median_requests_per_s"] > 0
        assert math.isfinite(s["median_cpu_us_per_request"])
        assert s["median_cpu_us_per_request"] > 0
    ratios = doc["ratios"]
    assert [r["numerator"] for r in ratios] == UVICORN[1:]
    base = doc["servers"][0]["requests_per_s"][0]
    for r, s in zip(ratios, doc["servers"][1:], strict=True):
        assert r["denominator"] == BASELINE and r["target"] == 1.0
        assert r["rounds"] == pytest.approx([s["requests_per_s"][0] / base])
    printed = capsys.readouterr().out
    assert "requests/s" in printed and "load average:" in printed
    for name in UVICORN:
        assert name in printed
    if not hypercorn:
        assert len(doc["skipped"]) == 1 and "hypercorn-uvloop: skipped" in doc["skipped"][0]
        assert "hypercorn-uvloop: skipped" in printed
