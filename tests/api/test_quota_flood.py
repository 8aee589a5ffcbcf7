"""The issue's flood test: a flooding producer and a flooding consumer are each held to their
byte quota while a second client's produce latency stays near its unloaded value.

A real broker process and real time. To be robust on a shared 2-core machine:

* the flooders ignore the throttle fields (the worst client): the broker holds them. Their rate
  is measured in steady state, after one measurement span of warm-up (the first span lets a
  new client burst up to ``quota * span``, by design), over the client's own requests: bytes
  between its first and last answer in the interval, over that time;
* the second client's latency is sampled unloaded before and after the flood and loaded in
  between, in the same run; the loaded p99 is compared with the larger unloaded one.

The default variant uses 3 x 1 s windows and a 6 s measurement, and allows
2x the unloaded p99 plus 20 ms for scheduler noise. The ``slow`` variant is the issue's
letter: Kafka's 11 x 1 s windows, 11 s measured, p99 within exactly 2x.

Why whole spans: a flooder's rate is periodic with the span. When its oldest sample expires the
measured rate drops by that sample and the flooder may send that much again at once, then is
held until the average is back at the quota; the average over a whole span is the quota, over
part of one it is not (4 s of a 6 s span measured 54 % over in a trial run).
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest

from tests.server import BrokerProcess

QUOTA = 512 * 1024  # bytes/s for each flooder: far below what one flooder can do here
PRODUCE_BYTES = 16 * 1024  # one flooding produce
FETCH_BYTES = 32 * 1024  # one flooding fetch's max_bytes
PROBE_REQUESTS = 150


@dataclass
class Flooder:
    samples: list[tuple[float, int]] = field(default_factory=list)  # (answer time, total bytes)
    errors: list[str] = field(default_factory=list)

    def rate(self, start: float, end: float) -> float:
        inside = [(t, b) for t, b in self.samples if start <= t <= end]
        assert len(inside) >= 3, self.samples[-5:]
        (t0, b0), (t1, b1) = inside[0], inside[-1]
        return (b1 - b0) / (t1 - t0)


def _produce_flood(url: str, stop: threading.Event, out: Flooder) -> None:
    body = {"records": [{"value": "p" * (PRODUCE_BYTES // 4)} for _ in range(4)]}
    total = 0
    with httpx.Client(base_url=url, timeout=60.0, headers={"Logbus-Client-Id": "flood-p"}) as c:
        while not stop.is_set():
            request = c.build_request("POST", "/v1/topics/in/records", json=body)
            size = len(request.content)
            r = c.send(request)
            if r.status_code != 200:
                out.errors.append(r.text)
                return
            total += size
            out.samples.append((time.monotonic(), total))


def _fetch_flood(url: str, stop: threading.Event, out: Flooder) -> None:
    total = 0
    offset = 0
    with httpx.Client(base_url=url, timeout=60.0, headers={"Logbus-Client-Id": "flood-c"}) as c:
        while not stop.is_set():
            r = c.get(
                "/v1/topics/src/partitions/0/records",
                params={"offset": offset, "max_bytes": FETCH_BYTES},
            )
            if r.status_code != 200:
                out.errors.append(r.text)
                return
            total += len(r.content)
            out.samples.append((time.monotonic(), total))
            offset = int(r.headers["logbus-next-offset"])
            if offset >= int(r.headers["logbus-high-watermark"]):
                offset = 0


def _probe(c: httpx.Client, n: int) -> list[float]:
    out = []
    for i in range(n):
        started = time.perf_counter()
        r = c.post("/v1/topics/probe/records", json={"records": [{"value": i}]})
        out.append(time.perf_counter() - started)
        assert r.status_code == 200
    return out


def p99(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))]


def _flood(tmp_path: Path, window_num: int, measure_s: float, slack_s: float) -> None:
    broker = BrokerProcess(
        tmp_path / "data",
        env={
            "LOGBUS_QUOTA_WINDOW_NUM": str(window_num),
            "LOGBUS_LOOP_LAG_INTERVAL_MS": "0",
        },
    ).start()
    try:
        with httpx.Client(base_url=broker.url, timeout=60.0) as c:
            for name in ("in", "src", "probe"):
                assert c.post("/v1/topics", json={"name": name}).status_code == 201
            chunk = {"records": [{"value": "c" * 1000} for _ in range(1000)]}  # ~1 MB
            for _ in range(4):
                assert c.post("/v1/topics/src/records", json=chunk).status_code == 200
            for cid, quota in (
                ("flood-p", "producer_byte_rate"),
                ("flood-c", "consumer_byte_rate"),
            ):
                body = {"entity": {"client_id": cid}, "quotas": {quota: QUOTA}}
                assert c.put("/v1/quotas", json=body).status_code == 200
            _probe(c, 20)  # warm the probe's path
            unloaded = _probe(c, PROBE_REQUESTS)
            stop = threading.Event()
            producer, consumer = Flooder(), Flooder()
            threads = [
                threading.Thread(target=_produce_flood, args=(broker.url, stop, producer)),
                threading.Thread(target=_fetch_flood, args=(broker.url, stop, consumer)),
            ]
            for t in threads:
                t.start()
            try:
                time.sleep(window_num + 1)  # warm-up: one measurement span, then steady state
                start = time.monotonic()
                loaded: list[float] = []
                while time.monotonic() - start < measure_s:
                    loaded.extend(_probe(c, 10))
                end = time.monotonic()
            finally:
                stop.set()
                for t in threads:
                    t.join(timeout=90)
            unloaded += _probe(c, PROBE_REQUESTS)
        assert not producer.errors and not consumer.errors, (producer.errors, consumer.errors)
        for name, flooder in (("producer", producer), ("consumer", consumer)):
            rate = flooder.rate(start, end)
            assert 0.85 * QUOTA <= rate <= 1.15 * QUOTA, (name, rate, QUOTA)
        assert p99(loaded) <= 2 * p99(unloaded) + slack_s, (p99(loaded), p99(unloaded))
    finally:
        broker.stop()


@pytest.mark.slow  # real time on a shared machine: not yet reliable (see the report)
def test_flooders_are_held_to_their_quota_and_others_keep_their_latency(tmp_path: Path) -> None:
    _flood(tmp_path, window_num=3, measure_s=6.0, slack_s=0.020)


@pytest.mark.slow
def test_flood_over_ten_seconds_with_kafkas_windows(tmp_path: Path) -> None:
    _flood(tmp_path, window_num=11, measure_s=11.0, slack_s=0.0)
