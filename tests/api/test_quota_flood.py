"""The issue's flood test: flooding producers and consumers are each held within +-15 % of
their byte quota, while a second client's produce latency p99 stays within 2x its unloaded
value.

A real broker process and real time. Four flooders, each with its own client id and a quota
of 64 KiB/s: a producer and a consumer in each of the two styles that matter, *greedy* (sends
its next request as soon as the answer comes, ignoring ``Logbus-Throttle-Time-Ms``: the broker
must hold it) and *obedient* (waits the throttle time first, as KIP-219 clients do: it should
get its quota and never be held).

Why it is reliable now (it measured 62-70 % of the quota in 2 of 5 runs before): the broker's
rate used to count at least ``num - 1`` windows, Kafka's padding, which let a new client send
that many windows' worth of quota at once; a windowed sum gives such a burst back once per
span, so a flooder's rate was periodic with the span (measured with Kafka's windows: up to 10x
the quota for a second, then held for ten) and a measurement not covering whole periods missed
or caught bursts (0.31-1.39x over 11 s). The span now counts at least one window
(:mod:`auth_quotas.quotas`) and a flooder runs flat at its quota from its second window on
(measured: 0.97-1.03x over every 10 s interval, both styles). So:

* each flooder's rate is measured after a warm-up of two windows, over its own requests: the
  bytes between its first and last answer inside the interval, over that time;
* the flooders run in a child process, so their threads do not compete with the latency probe
  for this process's GIL (that would be measured as broker latency);
* the latency is compared in interleaved blocks, flooders paused / flooding, each after a
  settling time (requests in flight finish; on resuming, each flooder spends the pause's
  credit at once), about a thousand probes per side, so both sides see the same outside load
  on this shared machine. Ratios only.

Request sizes: each flood request costs the broker's event loop a few ms however small it is,
and a probe that arrives meanwhile waits; the p99 stays near the unloaded one only if flood
requests are few (4 per second per flooder here: 16 KiB at 64 KiB/s). With 32 requests per
second per flooder the loaded p99 was 2.2-2.5x the unloaded one, whatever the bytes.

The default variant uses 3 x 1 s windows, 6 s measured, 6 latency block pairs (~23 s); the
``slow`` one is the issue's letter: Kafka's 11 x 1 s windows, one whole span of warm-up, 10 s
measured, 10 block pairs (~42 s).
"""

from __future__ import annotations

import multiprocessing
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.server import BrokerProcess

QUOTA = 64 * 1024  # bytes/s for each flooder: far below what one flooder can do here
PRODUCE_BYTES = 16 * 1024  # one flooding produce: a quarter of a second's quota
FETCH_BYTES = 16 * 1024  # one flooding fetch's max_bytes: the same
FLOODERS = {  # client id -> (kind, obeys the throttle time)
    "flood-p-greedy": ("produce", False),
    "flood-p-obey": ("produce", True),
    "flood-c-greedy": ("fetch", False),
    "flood-c-obey": ("fetch", True),
}
BLOCK_S, SETTLE_S = 0.6, 0.2  # phase 2: unloaded and loaded blocks, each after a settling


@dataclass
class Flooder:
    samples: list[tuple[float, int]] = field(default_factory=list)  # (answer time, total bytes)
    throttles: list[int] = field(default_factory=list)  # Logbus-Throttle-Time-Ms per answer
    errors: list[str] = field(default_factory=list)

    def rate(self, start: float, end: float) -> float:
        inside = [(t, b) for t, b in self.samples if start <= t <= end]
        assert len(inside) >= 3, self.samples[-5:]
        (t0, b0), (t1, b1) = inside[0], inside[-1]
        return (b1 - b0) / (t1 - t0)


def _flood_one(url: str, cid: str, stop: Any, running: Any, out: Flooder) -> None:
    kind, obey = FLOODERS[cid]
    body = {"records": [{"value": "p" * (PRODUCE_BYTES // 4)} for _ in range(4)]}
    total = 0
    offset = 0
    with httpx.Client(base_url=url, timeout=60.0, headers={"Logbus-Client-Id": cid}) as c:
        while not stop.is_set():
            if not running.wait(0.1):
                continue  # paused: the probe samples "unloaded"
            if kind == "produce":
                request = c.build_request("POST", "/v1/topics/in/records", json=body)
                size = len(request.content)
            else:
                query = {"offset": offset, "max_bytes": FETCH_BYTES}
                request = c.build_request(
                    "GET", "/v1/topics/src/partitions/0/records", params=query
                )
            r = c.send(request)
            if r.status_code != 200:
                out.errors.append(f"{r.status_code} {r.text}")
                return
            if kind == "fetch":
                size = len(r.content)
                offset = int(r.headers["logbus-next-offset"])
                if offset >= int(r.headers["logbus-high-watermark"]):
                    offset = 0
            total += size
            out.samples.append((time.monotonic(), total))
            throttle_ms = int(r.headers["logbus-throttle-time-ms"])
            out.throttles.append(throttle_ms)
            if obey and throttle_ms:
                stop.wait(throttle_ms / 1000)


def _flood_process(url: str, stop: Any, running: Any, results: Any) -> None:
    """Child process: every flooder in a thread, sending while ``running``, until ``stop``;
    their logs to ``results``."""
    logs = {cid: Flooder() for cid in FLOODERS}
    threads = [
        threading.Thread(target=_flood_one, args=(url, cid, stop, running, logs[cid]))
        for cid in FLOODERS
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    results.put({cid: (f.samples, f.throttles, f.errors) for cid, f in logs.items()})


def _probe(c: httpx.Client, seconds: float, gap_s: float = 0.0) -> list[float]:
    """Produce one small record after another for ``seconds`` (``gap_s`` apart: a paced
    second client rather than a load generator); the latency of each."""
    out: list[float] = []
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        started = time.perf_counter()
        r = c.post("/v1/topics/probe/records", json={"records": [{"value": len(out)}]})
        out.append(time.perf_counter() - started)
        assert r.status_code == 200
        if gap_s:
            time.sleep(gap_s)
    return out


def p99(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))]


def _flood(
    tmp_path: Path, window_num: int, warmup_s: float, measure_s: float, latency_blocks: int
) -> None:
    broker = BrokerProcess(
        tmp_path / "data",
        env={"LOGBUS_QUOTA_WINDOW_NUM": str(window_num), "LOGBUS_LOOP_LAG_INTERVAL_MS": "0"},
    ).start()
    ctx = multiprocessing.get_context("spawn")
    stop, running = ctx.Event(), ctx.Event()
    results = ctx.Queue()
    child = ctx.Process(
        target=_flood_process, args=(broker.url, stop, running, results), daemon=True
    )
    try:
        with httpx.Client(base_url=broker.url, timeout=60.0) as c:
            for name in ("in", "src", "probe"):
                assert c.post("/v1/topics", json={"name": name}).status_code == 201
            chunk = {"records": [{"value": "c" * 1000} for _ in range(1000)]}  # ~1 MB
            for _ in range(3):
                assert c.post("/v1/topics/src/records", json=chunk).status_code == 200
            for cid, (kind, _) in FLOODERS.items():
                quota = "producer_byte_rate" if kind == "produce" else "consumer_byte_rate"
                body = {"entity": {"client_id": cid}, "quotas": {quota: QUOTA}}
                assert c.put("/v1/quotas", json=body).status_code == 200
            _probe(c, 0.3)  # warm the probe's path
            child.start()
            running.set()
            ready = time.monotonic() + 60  # poll: the child's interpreter takes a while
            while not all(cid.encode() in c.get("/metrics").content for cid in FLOODERS):
                assert time.monotonic() < ready and child.is_alive(), "flooders did not start"
                time.sleep(0.05)
            time.sleep(warmup_s)  # steady state: the first window may carry a request more
            # Phase 1, the quotas: a continuous flood of measure_s.
            start = time.monotonic()
            # The second client goes on, paced: a probe in a tight loop would take a core the
            # flooders need on a loaded 2-core machine (an obedient flooder measured 0.84x).
            _probe(c, measure_s, gap_s=0.01)
            end = time.monotonic()
            # Phase 2, the latency: unloaded blocks (flooders paused) between loaded ones, so
            # both see the same outside load on this shared machine.
            unloaded: list[float] = []
            loaded: list[float] = []
            for _ in range(latency_blocks):
                running.clear()
                _probe(c, SETTLE_S)  # requests in flight finish
                unloaded += _probe(c, BLOCK_S)
                running.set()
                _probe(c, SETTLE_S)  # the pause's credit is spent at once (a request each)
                loaded += _probe(c, BLOCK_S)
            stop.set()
            logs = results.get(timeout=90)
            child.join(timeout=90)
        for cid, (samples, throttles, errors) in logs.items():
            assert not errors, (cid, errors)
            flooder = Flooder(samples, throttles)
            rate = flooder.rate(start, end)
            assert 0.85 * QUOTA <= rate <= 1.15 * QUOTA, (cid, rate / QUOTA, throttles[-20:])
            assert max(throttles) > 0, cid  # it was over quota: held, not merely slow
        assert p99(loaded) <= 2 * p99(unloaded), (p99(loaded), p99(unloaded))
    finally:
        stop.set()
        if child.is_alive():
            child.join(timeout=10)
            if child.is_alive():
                child.kill()
        broker.stop()


def test_flooders_are_held_to_their_quota_and_others_keep_their_latency(tmp_path: Path) -> None:
    _flood(tmp_path, window_num=3, warmup_s=2.0, measure_s=6.0, latency_blocks=6)


@pytest.mark.slow
def test_flood_over_ten_seconds_with_kafkas_windows(tmp_path: Path) -> None:
    _flood(tmp_path, window_num=11, warmup_s=11.0, measure_s=10.0, latency_blocks=10)
