"""The issue-14 benchmark plumbing: ratios, the in-process request cost, the part selection."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest

from benchmarks import per_request, request_cost
from benchmarks.ratios import Ratio, alternate, plotted, print_table


def test_a_ratio_is_the_median_of_its_rounds_against_its_target(
    capsys: pytest.CaptureFixture[str],
) -> None:
    up = Ratio("throughput", 0.5, [0.4, 0.7, 0.6])
    assert up.value == 0.6 and up.met is True
    down = Ratio("p99", 10, [12.0, 9.0, 11.0], unit="ms", lower_is_better=True)
    assert down.value == 11.0 and down.met is False
    empty = Ratio("never measured", 1.0)
    assert empty.met is None
    shown = Ratio("shown beside the others", None, [0.4, 0.45, 0.5])
    assert shown.value == 0.45 and shown.met is None and shown.as_dict()["target"] is None
    assert up.as_dict()["met"] is True and down.as_dict()["value"] == 11.0
    print_table([up, down, empty, shown])
    out = capsys.readouterr().out
    assert "MISSED" in out and "met" in out
    (line,) = [x for x in out.splitlines() if x.startswith("shown beside the others")]
    assert "none" in line and "MISSED" not in line and "met" not in line


def test_the_plot_leaves_out_a_figure_without_a_target() -> None:
    """A figure shown without a target has no achieved ÷ target to draw: the plot draws the
    measured figures that have one (matplotlib is a benchmark dependency, not a test one)."""
    with_target = Ratio("with", 0.5, [0.6])
    unmeasured = Ratio("never measured", 0.5)
    assert plotted([with_target, Ratio("without", None, [0.4]), unmeasured]) == [with_target]
    assert alternate(4) == [(0, True), (1, False), (2, True), (3, False)]


def test_request_cost_serves_produces_in_process(capsys: pytest.CaptureFixture[str]) -> None:
    assert request_cost.main(["--requests", "256", "--concurrency", "16"]) == 0
    assert "µs CPU per request (16 concurrent callers)" in capsys.readouterr().out


def test_request_cost_serves_json_fetches_in_process(capsys: pytest.CaptureFixture[str]) -> None:
    """Every measured fetch answers a full page (a short one raises)."""
    assert request_cost.main(["--fetch", "--requests", "60"]) == 0
    assert "µs CPU per 1,000-record JSON fetch" in capsys.readouterr().out


def test_request_cost_serves_the_secured_broker(capsys: pytest.CaptureFixture[str]) -> None:
    """--auth quota: every produce answered 200 by the user bench, its ACLs and its quota
    (request_cost raises on any other answer)."""
    assert request_cost.main(["--requests", "64", "--concurrency", "8", "--auth", "quota"]) == 0
    assert "µs CPU per request (8 concurrent callers)" in capsys.readouterr().out


@pytest.mark.parametrize(("cut", "auth"), [("none", "none"), ("app", "none"), ("none", "quota")])
def test_request_cost_serves_produces_through_the_brokers_server(
    cut: str, auth: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """--server: every request goes as HTTP/1.1 bytes through uvicorn and the broker's
    protocol and is answered 200 (the in-memory client stops the run on any other answer:
    with --auth quota, the user's key, ACLs and quota admit every one); the broker's
    collector settings are put back."""
    import gc

    before = gc.get_threshold()
    args = ["--server", "--requests", "64", "--concurrency", "8", "--cut", cut, "--auth", auth]
    assert request_cost.main(args) == 0
    assert "µs CPU per request (8 concurrent callers)" in capsys.readouterr().out
    assert gc.get_threshold() == before


def test_the_in_memory_client_stops_on_an_answer_that_is_not_200() -> None:
    """A refused request fails the run at once instead of leaving it waiting forever."""
    asyncio.run(_stops_on_a_refusal())


async def _stops_on_a_refusal() -> None:
    outcomes: list[Exception | None] = []
    wire = request_cost._Wire(b"GET / HTTP/1.1\r\n\r\n", 2, outcomes.append, 50000)
    wire.start(asyncio.Protocol())
    wire.write(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\n{}")
    assert outcomes == [] and wire.left == 1
    wire.write(b"HTTP/1.1 404 Not Found\r\ncontent-length: 2\r\n\r\n{}")
    assert len(outcomes) == 1 and "404" in str(outcomes[0])


def test_an_unknown_part_is_refused(tmp_path: Path) -> None:
    with pytest.raises(SystemExit) as e:
        per_request.main(["--only", "nothing", "--data-dir", str(tmp_path)])
    assert e.value.code == 2


def test_a_failing_part_is_reported_and_the_others_kept(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def works(rounds: int, seconds: float, workdir: Path) -> list[Ratio]:
        return [Ratio("works", 1.0, [1.5] * rounds)]

    def fails(rounds: int, seconds: float, workdir: Path) -> list[Ratio]:
        raise RuntimeError("no server")

    monkeypatch.setattr(per_request, "_parts", lambda: {"small": works, "latency": fails})
    out = tmp_path / "out.json"
    code = per_request.main(
        [
            "--only",
            "small,latency",
            "--rounds",
            "2",
            "--json",
            str(out),
            "--data-dir",
            str(tmp_path),
        ]
    )
    assert code == 1
    doc = json.loads(out.read_text())
    assert doc["failed_parts"] == ["latency"]
    assert [(r["name"], r["value"], r["met"]) for r in doc["ratios"]] == [("works", 1.5, True)]


@pytest.mark.parametrize("cut", request_cost.CUTS)
def test_request_cost_stops_each_produce_at_its_cut(
    cut: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """Every cut answers each produce 200 (request_cost raises on any other answer), and
    leaves api.records as it found it."""
    from api import records

    before = (records.produce, records._produce_parsed)
    assert request_cost.main(["--requests", "32", "--concurrency", "4", "--cut", cut]) == 0
    assert "µs CPU per request (4 concurrent callers)" in capsys.readouterr().out
    assert (records.produce, records._produce_parsed) == before


def test_the_long_poll_latency_client_sees_every_record(broker: Any, client: Any) -> None:
    """``benchmarks.http.produce_to_consume_latency`` (the long-poll row of ``per_request``
    and ``logbus bench``) against a real broker: every record produced is received by the
    long-polling consumer and timed once, and the percentiles are ordered."""
    from benchmarks.http import produce_to_consume_latency

    client.post("/v1/topics", json={"name": "lat"}).raise_for_status()
    p50, p99, n = asyncio.run(produce_to_consume_latency(broker.url, "lat", 200, 0.5))
    assert n == 100  # 200 records/s for 0.5 s, each seen once
    assert 0 < p50 <= p99
    end = client.get("/v1/topics/lat/partitions/0/offsets").json()["offset"]
    assert end == 100
