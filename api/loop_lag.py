"""The event loop's lag: how late a 10 ms timer fires, as Prometheus metrics.

Theory of operation
-------------------
Everything the broker serves runs on one asyncio loop; anything that blocks it (an fsync, a
SQL query, a big decode, a slow assignment) delays every client at once, and only shows up in
request latencies mixed with everything else. :class:`LoopLagProbe` keeps one ``INTERVAL_S``
(10 ms) timer pending and records how much later than due each fires: ~0.1 ms on an idle
loop, the length of the stall when the loop blocks. Exported:

* ``logbus_event_loop_lag_seconds``: a histogram of the lateness (buckets from 1 ms to 10 s),
  from which a scraper takes p99 over any interval (two scrapes, bucket differences);
* ``logbus_event_loop_lag_max_seconds``: the largest lateness of the last ``WINDOW_S`` (60 s),
  kept as one maximum per second (a ring of 60), so one stall stays visible for a minute.

:class:`LagRecorder` is the sans-I/O part (it is given lags and times); the probe is its thin
asyncio shell.
"""

from __future__ import annotations

import asyncio
import bisect
from collections.abc import Iterator

from prometheus_client import CollectorRegistry
from prometheus_client.core import GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector

INTERVAL_S = 0.010  # the timer the probe schedules
WINDOW_S = 60  # the max gauge covers this many seconds (one slot per second)
LAG_BUCKETS_S = (0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10)


class LagRecorder(Collector):
    """Lags in, the histogram and the windowed maximum out (plain counters: no lock, no
    per-observation work beyond a bisect, since it runs 100 times a second)."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self._counts = [0] * (len(LAG_BUCKETS_S) + 1)  # the last one: over the largest bound
        self._sum_s = 0.0
        self._slots: list[tuple[int, float]] = [(-1, 0.0)] * WINDOW_S  # (second, max lag)
        self._now_s = 0.0
        registry.register(self)

    def record(self, lag_s: float, now_s: float) -> None:
        """One observation of ``lag_s`` made at monotonic time ``now_s``."""
        lag_s = max(0.0, lag_s)
        self._counts[bisect.bisect_left(LAG_BUCKETS_S, lag_s)] += 1
        self._sum_s += lag_s
        second = int(now_s)
        slot = second % WINDOW_S
        held_second, held = self._slots[slot]
        self._slots[slot] = (second, max(held, lag_s) if held_second == second else lag_s)
        self._now_s = now_s

    def max_s(self, now_s: float | None = None) -> float:
        """The largest lag recorded in the last WINDOW_S seconds."""
        now = int(self._now_s if now_s is None else now_s)
        return max((v for s, v in self._slots if now - WINDOW_S < s <= now), default=0.0)

    def collect(self) -> Iterator[Metric]:
        cumulative, buckets = 0, []
        for bound, n in zip((*map(str, LAG_BUCKETS_S), "+Inf"), self._counts, strict=True):
            cumulative += n
            buckets.append((bound, float(cumulative)))
        yield HistogramMetricFamily(
            "logbus_event_loop_lag_seconds",
            f"How late a {INTERVAL_S * 1000:.0f} ms timer on the event loop fires",
            buckets=buckets,
            sum_value=self._sum_s,
        )
        yield GaugeMetricFamily(
            "logbus_event_loop_lag_max_seconds",
            f"Largest event loop lag in the last {WINDOW_S} s",
            value=self.max_s(),
        )


class LoopLagProbe:
    """A chain of INTERVAL_S timers on the loop, each recording how late it fired.

    Plain timer callbacks, not a task sleeping: no future and no task step per tick, which
    lightens each tick; the wake-ups themselves still cost ~1 % of a core on the 2-core VM at
    100 a second (the ``loop_lag_interval_ms`` setting: 0 turns the probe off).
    """

    def __init__(self, recorder: LagRecorder, interval_s: float = INTERVAL_S) -> None:
        self.recorder = recorder
        self.interval_s = interval_s
        self._handle: asyncio.TimerHandle | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._schedule(self._loop.time())

    def stop(self) -> None:
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None

    def _schedule(self, now: float) -> None:
        assert self._loop is not None
        due = now + self.interval_s
        self._handle = self._loop.call_at(due, self._fire, due)

    def _fire(self, due: float) -> None:
        assert self._loop is not None
        now = self._loop.time()
        self.recorder.record(now - due, now)
        self._schedule(now)
