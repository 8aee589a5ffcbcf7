"""The broker's event loop stays responsive while retention, compaction, segment rolls and
timestamp lookups run under produce load (issue 10, "the event loop never stalls").

The load and the figures come from :mod:`benchmarks.loop_lag` (a broker process with a 200 ms
retention tick and a 100 ms cleaner backoff; two producers, one on 64 KiB segments with a
256 KiB retention, one on a compacted topic; back-to-back timestamp lookups that each land on a
200,000-record batch). The target, p99 under 50 ms, is what ``python -m benchmarks.loop_lag``
measures; on this shared 2-core machine it holds while the machine's load average stays under
~10 and slips to the 100-250 ms buckets when it reaches 13-15 (a timer thread then waits for a
core, whatever the broker does; an idle broker measured the same way shows 0-0.3 % of samples
over 50 ms). The test's bounds are generous for that: p99 at most 500 ms, and the loop woke
for at least a fifth of its 10 ms timers. The code before this change (timestamp lookups
decoding on the loop, fsyncs under the lock the loop takes, producer expiry on the loop)
failed both: p99 over 1 s (up to 2.5 s), 34-47 wake-ups in 5 s.
"""

from __future__ import annotations

from pathlib import Path

from benchmarks.loop_lag import broker, measure

SECONDS = 5.0
P99_BOUND_S = 0.5
INTERVAL_S = 0.010


def test_loop_lag_p99_under_storage_load(tmp_path: Path) -> None:
    with broker(tmp_path / "data") as b:
        result = measure(b.url, SECONDS)
    assert result.produced > 0 and result.lookups > 0, result
    assert result.samples > 0.2 * SECONDS / INTERVAL_S, f"the loop barely ran: {result}"
    assert result.p99_le_s <= P99_BOUND_S, str(result)
