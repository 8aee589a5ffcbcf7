"""``logbus produce`` and ``logbus consume`` against three brokers, with the partition's leader
SIGKILLed while records are being produced: every record is acknowledged, stored exactly once
and in order, and read back through a URL list whose first broker is the dead one."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.cluster.test_cluster_processes import brokers_on_one_store, eventually
from tests.server import BrokerProcess

ROOT = Path(__file__).resolve().parents[2]
TOPIC = "cli-failover"
N = 4000
CHUNK = 100  # lines written to the CLI's stdin at a time


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[dict[int, BrokerProcess]]:
    with brokers_on_one_store(tmp_path) as (_, brokers):
        yield brokers


def _partition(base: str) -> dict[str, Any] | None:
    try:
        r = httpx.get(f"{base}/v1/topics/{TOPIC}/partitions", timeout=5)
    except httpx.TransportError:
        return None
    if r.status_code != 200:
        return None
    p: dict[str, Any] = r.json()[0]
    return p


def _ready(base: str) -> bool | None:
    p = _partition(base)
    return (p is not None and len(p["isr"]) == 3 and p["leader"] > 0) or None


def _values(base: str) -> list[str]:
    out: list[str] = []
    while True:
        r = httpx.get(
            f"{base}/v1/topics/{TOPIC}/partitions/0/records",
            params={"offset": len(out), "max_records": 1000},
            timeout=30,
        )
        r.raise_for_status()
        doc = r.json()
        out.extend(rec["value"] for rec in doc["records"])
        if len(out) >= doc["high_watermark"]:
            return out


def test_cli_produce_rides_out_a_leader_kill_exactly_once(
    cluster: dict[int, BrokerProcess], tmp_path: Path
) -> None:
    r = httpx.post(
        f"{cluster[1].url}/v1/topics",
        json={
            "name": TOPIC,
            "partitions": 1,
            "replication_factor": 3,
            "configs": {"min.insync.replicas": "2"},
        },
        timeout=30,
    )
    assert r.status_code == 201, r.text
    for b in cluster.values():
        eventually(lambda b=b: _ready(b.url), "a full ISR known everywhere")  # type: ignore[misc]
    leader = _partition(cluster[1].url)["leader"]  # type: ignore[index]
    urls = ",".join(b.url for b in cluster.values())
    stderr = open(tmp_path / "produce.err", "wb")  # noqa: SIM115 - handed to the child
    cli = subprocess.Popen(
        [sys.executable, "-m", "api.cli", "produce", TOPIC, "--url", urls, "--batch-size", "50"],
        stdin=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        stderr=stderr,
        cwd=ROOT,
    )
    stderr.close()
    assert cli.stdin is not None
    written = threading.Event()

    def feed() -> None:
        assert cli.stdin is not None
        for start in range(0, N, CHUNK):
            cli.stdin.write(b"".join(b"v%d\n" % i for i in range(start, start + CHUNK)))
            cli.stdin.flush()
            time.sleep(0.01)  # pacing, so the kill lands while records are still flowing
        cli.stdin.close()
        written.set()

    feeder = threading.Thread(target=feed, daemon=True)
    feeder.start()
    eventually(
        lambda: ((p := _partition(cluster[leader].url)) and p["high_watermark"] >= N // 4) or None,
        "a quarter of the records acknowledged",
    )
    cluster[leader].kill()
    assert written.wait(120), "the CLI stopped reading its input"
    cli.wait(timeout=120)
    err = (tmp_path / "produce.err").read_text()
    assert cli.returncode == 0, err
    assert f"produced {N} record(s)" in err, err

    survivor = next(b for i, b in cluster.items() if i != leader)
    assert _values(survivor.url) == [f"v{i}" for i in range(N)]  # each once, in order

    # Consume through a URL list that starts with the dead broker.
    dead_first = ",".join(
        [cluster[leader].url, *(b.url for i, b in cluster.items() if i != leader)]
    )
    consumed = subprocess.run(
        [sys.executable, "-m", "api.cli", "consume", TOPIC, "--url", dead_first],
        capture_output=True,
        timeout=120,
        cwd=ROOT,
    )
    assert consumed.returncode == 0, consumed.stderr.decode()
    assert consumed.stdout.decode().splitlines() == [f"v{i}" for i in range(N)]
