"""Admin at scale: create a topic of many partitions through a real broker, and watch it.

    python -m benchmarks.admin [--partitions 10000] [--data-dir DIR] [--json OUT]

Starts ``logbus serve`` on a fresh data directory and measures, for one
``POST /v1/topics {"partitions": N}``:

1. the answer time of the creation (issue 10's target: 10,000 partitions in <= 10 s);
2. the broker's responsiveness meanwhile: ``GET /healthz`` every 20 ms from another client,
   the slowest answer and the 99th percentile;
3. the broker's RSS before and after, hence the memory one empty partition costs;
4. a graceful restart with the N partitions (stop, then start until ``/readyz`` answers);
5. the deletion of that topic.

Figures are wall-clock on a shared machine: run it on a quiet one, and compare runs of the
same day only.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import httpx

from api.process import BrokerProcess

PROBE_INTERVAL_S = 0.02


def rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError("no VmRSS")


class Prober(threading.Thread):
    """``GET /healthz`` in a loop on its own connection; records each answer time (s)."""

    def __init__(self, url: str) -> None:
        super().__init__(daemon=True)
        self.url = url
        self.latencies_s: list[float] = []
        self.stop = threading.Event()

    def run(self) -> None:
        with httpx.Client(base_url=self.url, timeout=60) as c:
            while not self.stop.is_set():
                t = time.perf_counter()
                c.get("/healthz").raise_for_status()
                self.latencies_s.append(time.perf_counter() - t)
                self.stop.wait(PROBE_INTERVAL_S)


def run(partitions: int, data_dir: Path) -> dict[str, Any]:
    broker = BrokerProcess(data_dir / "data").start()
    try:
        assert broker.proc is not None
        with httpx.Client(base_url=broker.url, timeout=120) as c:
            rss_before = rss_bytes(broker.proc.pid)
            prober = Prober(broker.url)
            prober.start()
            time.sleep(0.2)
            t = time.perf_counter()
            r = c.post("/v1/topics", json={"name": "wide", "partitions": partitions})
            create_s = time.perf_counter() - t
            r.raise_for_status()
            prober.stop.set()
            prober.join()
            rss_after = rss_bytes(broker.proc.pid)
        t = time.perf_counter()
        broker.restart()
        restart_s = time.perf_counter() - t
        with httpx.Client(base_url=broker.url, timeout=120) as c:
            assert c.get("/v1/topics/wide").json()["partitions"] == partitions
            t = time.perf_counter()
            c.delete("/v1/topics/wide").raise_for_status()
            delete_s = time.perf_counter() - t
    finally:
        broker.stop()
    lat = sorted(prober.latencies_s)
    return {
        "partitions": partitions,
        "create_s": round(create_s, 2),
        "healthz_probes": len(lat),
        "healthz_p99_ms": round(lat[int(0.99 * (len(lat) - 1))] * 1000, 1),
        "healthz_max_ms": round(lat[-1] * 1000, 1),
        "healthz_median_ms": round(statistics.median(lat) * 1000, 1),
        "rss_before_mib": round(rss_before / 2**20, 1),
        "rss_after_mib": round(rss_after / 2**20, 1),
        "rss_per_partition_kib": round((rss_after - rss_before) / partitions / 1024, 2),
        "restart_s": round(restart_s, 2),
        "delete_s": round(delete_s, 2),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--partitions", type=int, default=10_000)
    ap.add_argument("--data-dir", type=Path, default=None)
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(dir=args.data_dir) as tmp:
        result = run(args.partitions, Path(tmp))
    print(json.dumps(result, indent=2))
    if args.json is not None:
        args.json.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
