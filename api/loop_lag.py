"""The event loop's lag: how late a 10 ms timer fires, as Prometheus metrics.

Theory of operation
-------------------
Everything the broker serves runs on one asyncio loop; anything that blocks it (an fsync, a
SQL query, a big decode, a slow assignment) delays every client at once, and only shows up in
request latencies mixed with everything else. :class:`LoopLagProbe` sleeps ``INTERVAL_S``
(10 ms) in a loop and records how much later than asked each sleep ended: ~0.1 ms on an idle
loop, the length of the stall when the loop blocks. 100 wake-ups a second cost ~0.3 % of a
core. Exported:

* ``logbus_event_loop_lag_seconds``: a histogram of the lateness (buckets from 1 ms to 10 s),
  from which a scraper takes p99 over any interval (two scrapes, bucket differences);
* ``logbus_event_loop_lag_max_seconds``: the largest lateness of the last ``WINDOW_S`` (60 s),
  kept as one maximum per second (a ring of 60), so one stall stays visible for a minute.

:class:`LagRecorder` is the sans-I/O part (it is given lags and times); the probe is its thin
asyncio shell.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator

from prometheus_client import CollectorRegistry, Histogram
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

INTERVAL_S = 0.010  # the timer the probe schedules; Kafka-like brokers measure the same way
WINDOW_S = 60  # the max gauge covers this many seconds (one slot per second)
LAG_BUCKETS_S = (0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10)


class LagRecorder(Collector):
    """Lags in, the histogram and the windowed maximum out."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.histogram = Histogram(
            "logbus_event_loop_lag_seconds",
            f"How late a {INTERVAL_S * 1000:.0f} ms timer on the event loop fires",
            buckets=LAG_BUCKETS_S,
            registry=registry,
        )
        self._slots: list[tuple[int, float]] = [(-1, 0.0)] * WINDOW_S  # (second, max lag)
        self._now_s = 0.0
        registry.register(self)

    def record(self, lag_s: float, now_s: float) -> None:
        """One observation of ``lag_s`` made at monotonic time ``now_s``."""
        lag_s = max(0.0, lag_s)
        self.histogram.observe(lag_s)
        second = int(now_s)
        slot = second % WINDOW_S
        held_second, held = self._slots[slot]
        self._slots[slot] = (second, max(held, lag_s) if held_second == second else lag_s)
        self._now_s = now_s

    def max_s(self, now_s: float | None = None) -> float:
        """The largest lag recorded in the last WINDOW_S seconds."""
        now = int(self._now_s if now_s is None else now_s)
        return max((v for s, v in self._slots if now - WINDOW_S < s <= now), default=0.0)

    def collect(self) -> Iterator[GaugeMetricFamily]:
        yield GaugeMetricFamily(
            "logbus_event_loop_lag_max_seconds",
            f"Largest event loop lag in the last {WINDOW_S} s",
            value=self.max_s(),
        )


class LoopLagProbe:
    """Sleeps INTERVAL_S forever and records how late each sleep ends."""

    def __init__(self, recorder: LagRecorder, clock: Callable[[], float] | None = None) -> None:
        self.recorder = recorder
        self._clock = clock

    async def run(self) -> None:
        clock = self._clock or asyncio.get_running_loop().time
        while True:
            start = clock()
            await asyncio.sleep(INTERVAL_S)
            now = clock()
            self.recorder.record(now - start - INTERVAL_S, now)
