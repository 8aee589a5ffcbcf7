"""The README's "Try it with curl" walkthrough, run as written against a real broker."""

from __future__ import annotations

import json
import shutil
import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.api.conftest import make_client
from tests.api.helpers import kafka_partition
from tests.server import BrokerProcess

README = Path(__file__).resolve().parents[2] / "README.md"
SECTION = "## Try it with curl"
README_ADDRESS = "localhost:8080"


def walkthrough() -> list[tuple[str, str]]:
    """(comment, script) for each commented step of the section's shell block."""
    text = README.read_text()
    start = text.index(SECTION)
    block_start = text.index("```sh\n", start) + len("```sh\n")
    block = text[block_start : text.index("```", block_start)]
    steps: list[tuple[str, str]] = []
    comment, lines = "", []
    for line in block.splitlines():
        if line.startswith("#"):
            if lines:
                steps.append((comment, "\n".join(lines)))
            comment, lines = line.lstrip("#").strip(), []
        elif line.strip():
            lines.append(line)
    if lines:
        steps.append((comment, "\n".join(lines)))
    return steps


def json_docs(out: str) -> list[Any]:
    """Every JSON document curl printed, back to back (several commands may share a step)."""
    decoder = json.JSONDecoder()
    docs: list[Any] = []
    pos = 0
    while True:
        while pos < len(out) and out[pos].isspace():
            pos += 1
        if pos == len(out):
            return docs
        doc, pos = decoder.raw_decode(out, pos)
        docs.append(doc)


def values(records: list[dict[str, Any]]) -> list[Any]:
    return [r["value"] for r in records]


def test_readme_curl_walkthrough(shared_broker: BrokerProcess) -> None:
    if shutil.which("curl") is None:
        pytest.skip("curl is not installed: the README walkthrough needs it")
    steps = walkthrough()
    assert len(steps) >= 10, steps
    assert all(README_ADDRESS in script for _, script in steps)
    port = shared_broker.port
    p_user1 = kafka_partition(b"user-1", 3)
    p_user2 = kafka_partition(b"user-2", 3)
    keyed_on_0 = [p_user1, p_user2].count(0)

    def late_produce() -> None:
        time.sleep(0.7)
        with make_client(shared_broker) as c:
            r = c.post(
                "/v1/topics/clicks/partitions/0/records", json={"records": [{"value": "late"}]}
            )
            assert r.status_code == 200, r.text

    def create(docs: list[Any], _: str) -> None:
        (topic,) = docs
        assert topic["name"] == "clicks" and topic["partitions"] == 3
        assert topic["configs"] == {"retention.ms": 86400000}

    def produce_json(docs: list[Any], _: str) -> None:
        (answer,) = docs
        parts = [o["partition"] for o in answer["offsets"]]
        assert parts == [p_user1, p_user2]

    def produce_ndjson(docs: list[Any], _: str) -> None:
        (answer,) = docs
        assert answer["offsets"] == [
            {"partition": 0, "offset": keyed_on_0},
            {"partition": 0, "offset": keyed_on_0 + 1},
        ]

    def fetch_json(docs: list[Any], _: str) -> None:
        (answer,) = docs
        assert values(answer["records"])[-2:] == ["a", "b"]
        assert answer["next_offset"] == answer["high_watermark"] == keyed_on_0 + 2

    def long_poll(docs: list[Any], _: str) -> None:
        (answer,) = docs
        assert "late" in values(answer["records"])

    def fetch_ndjson(_: list[Any], out: str) -> None:
        lines = [json.loads(line) for line in out.splitlines()]
        assert values(lines)[-3:] == ["a", "b", "late"]

    def partitions(docs: list[Any], _: str) -> None:
        (parts,) = docs
        assert [p["partition"] for p in parts] == [0, 1, 2]
        assert parts[0]["high_watermark"] == keyed_on_0 + 3
        assert sum(p["log_end_offset"] for p in parts) == 5

    def offsets(docs: list[Any], _: str) -> None:
        earliest, by_time = docs
        assert earliest["offset"] == 0 and earliest["at"] == "earliest"
        assert by_time["offset"] == 0  # every record is younger than 2023-11-14

    def configs(docs: list[Any], _: str) -> None:
        patched, got = docs
        assert patched["configs"]["retention.ms"] == 3600000
        assert got["configs"]["retention.ms"] == 3600000
        assert got["overrides"] == {"retention.ms": 3600000}

    def topics(docs: list[Any], _: str) -> None:
        grown, listed, described = docs
        assert grown["partitions"] == 6
        assert "clicks" in [t["name"] for t in listed["topics"]]
        assert described["partitions"] == 6 and len(described["partition_details"]) == 6

    def groups(docs: list[Any], _: str) -> None:
        polled, committed, described = docs
        assert len(polled["assignment"]) == 6
        got = sorted(values(polled["records"]), key=str)
        assert sorted(["a", "b", "late", {"page": "/home"}, {"page": "/cart"}], key=str) == got
        # What was committed is where the next read starts: last processed offset + 1 on
        # every partition that gave records, nothing skipped and nothing read twice.
        last = {}
        for r in polled["records"]:
            tp = (r["topic"], r["partition"])
            last[tp] = max(last.get(tp, -1), r["offset"])
        commits = {(o["topic"], o["partition"]): o["offset"] for o in committed["offsets"]}
        assert {tp: o for tp, o in commits.items() if tp in last} == {
            tp: o + 1 for tp, o in last.items()
        }
        assert commits[("clicks", 0)] == keyed_on_0 + 3  # a, b, late and the keyed records
        assert described["state"] == "stable" and len(described["members"]) == 1
        committed_lags = [
            o["lag"] for o in described["offsets"] if o["committed_offset"] is not None
        ]
        assert committed_lags == [0] * len(commits), described["offsets"]

    def errors(docs: list[Any], _: str) -> None:
        (problem,) = docs
        assert problem["code"] == "OFFSET_OUT_OF_RANGE" and problem["status"] == 416
        assert problem["log_end_offset"] == keyed_on_0 + 3

    def health(_: list[Any], out: str) -> None:
        # healthz and readyz print no newline: the metrics lines follow on the same line.
        decoder = json.JSONDecoder()
        ok, pos = decoder.raw_decode(out)
        ready, pos = decoder.raw_decode(out, pos)
        assert (ok, ready) == ({"status": "ok"}, {"status": "ready"})
        metrics, _, cluster = out[pos:].rstrip("\n").rpartition("\n")
        hw = f'logbus_partition_high_watermark{{partition="0",topic="clicks"}} {keyed_on_0 + 3}'
        assert hw in metrics, metrics
        assert any(b["port"] == port for b in json.loads(cluster)["brokers"])

    def delete(_: list[Any], out: str) -> None:
        assert out == ""
        with make_client(shared_broker) as c:
            assert c.get("/v1/topics/clicks").status_code == 404

    checks: dict[str, Callable[[list[Any], str], None]] = {
        "Create a topic": create,
        "Produce JSON": produce_json,
        "Produce NDJSON": produce_ndjson,
        "Fetch from an offset": fetch_json,
        "Long-poll": long_poll,
        "Stream the records as NDJSON": fetch_ndjson,
        "Partitions": partitions,
        "Offsets by position or by time": offsets,
        "Change a config": configs,
        "Add partitions": topics,
        "Consumer groups": groups,
        "Errors are": errors,
        "Health": health,
        "Delete the topic": delete,
    }
    ran: list[str] = []
    for comment, script in steps:
        script = script.replace(README_ADDRESS, f"127.0.0.1:{port}")
        check = next((f for k, f in checks.items() if comment.startswith(k)), None)
        waker = None
        if check is long_poll:
            waker = threading.Thread(target=late_produce)
            waker.start()
        started = time.monotonic()
        proc = subprocess.run(
            ["bash", "-c", "set -eo pipefail\n" + script],
            capture_output=True,
            text=True,
            timeout=60,
        )
        elapsed = time.monotonic() - started
        if waker is not None:
            waker.join()
            assert elapsed < 4.5, f"the long-poll did not wake up ({elapsed:.1f}s)"
        assert proc.returncode == 0, (comment, script, proc.stdout, proc.stderr)
        out = proc.stdout
        if check is None:
            json_docs(out)  # an unknown step: at least it answers JSON
            continue
        docs = [] if check in (fetch_ndjson, health, delete) else json_docs(out)
        try:
            check(docs, out)
        except Exception as e:
            raise AssertionError(f"README step {comment!r} printed:\n{out}") from e
        ran.append(comment)
    missing = [k for k in checks if not any(c.startswith(k) for c in ran)]
    assert not missing, f"README steps not found: {missing}"


def test_readme_walkthrough_parses() -> None:
    steps = walkthrough()
    commands = sum(script.count("curl ") for _, script in steps)
    assert commands >= 20
    for comment, script in steps:
        assert comment, script
        assert "curl -s" in script
