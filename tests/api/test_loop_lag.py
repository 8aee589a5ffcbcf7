"""The broker's event loop stays responsive while retention, compaction, segment rolls and
timestamp lookups run under produce load (issue 10, "the event loop never stalls").

The load and the figures come from :mod:`benchmarks.loop_lag` (a broker process with a 200 ms
retention tick and a 100 ms cleaner backoff; two producers, one on 64 KiB segments with a
256 KiB retention, one on a compacted topic; lookups that each land on a 100,000-record
batch). The target is p99 under 50 ms, which ``python -m benchmarks.loop_lag`` measures: on
this shared 2-core machine the broker met it in 12 of 12 runs (0.2-0.9 % of samples over
50 ms; the machine's own scheduling adds the rest). The test's bound is p99 under 250 ms —
loose enough for a noisy neighbour, while the code before this change (timestamp lookups
decoding on the loop, fsyncs under the lock the loop takes) measured p99 above 1 s (15-19 %
of samples over 50 ms, 1.7 s max).
"""

from __future__ import annotations

from pathlib import Path

from benchmarks.loop_lag import broker, measure

SECONDS = 5.0
P99_BOUND_S = 0.25


def test_loop_lag_p99_under_storage_load(tmp_path: Path) -> None:
    with broker(tmp_path / "data") as b:
        result = measure(b.url, SECONDS)
    assert result.produced > 0 and result.lookups > 0, result
    assert result.samples > 0.2 * SECONDS / 0.010, f"the loop barely ran: {result}"
    assert result.p99_le_s <= P99_BOUND_S, str(result)
