"""Compaction benchmark of core_log: one cleaning pass over a compacted log, no HTTP.

    python -m benchmarks.compaction [--gib 1.0] [--keys 1000000] [--map-mib 128]
                                    [--segment-mib 64] [--data-dir DIR] [--profile]

Builds a ``cleanup.policy=compact`` :class:`PartitionLog` of ``--gib`` GiB of records with
100-byte values over ``--keys`` distinct keys (``b"key-%07d"``), appended as batches of 1,000
records (built once with ``build_batch`` per key block and appended again for every overwrite
round, so every key is overwritten ``records / keys - 1`` times and cleaning removes most).
The active segment is rolled (``PartitionLog._roll``, benchmark only) so everything written is
cleanable, the high watermark is set to the LEO and the log is flushed. Then one pass
(``PartitionLog.clean``) is timed with ``max_keys`` bounded so the key map fits in
``--map-mib``: the bytes per map entry are measured with tracemalloc on a small map built the
way the cleaner builds it (``dict[bytes, int]``, keys sliced out of a batch, offsets > 2^30).

Reported: MB/s cleaned (bytes of the cleaned range before the pass / seconds), records/s
(records read in the cleaned range / seconds), bytes before/after, the peak RSS growth of the
pass (``VmHWM`` reset through ``/proc/self/clear_refs`` just before the pass, minus ``VmRSS``
then; falls back to ``ru_maxrss``), and the passes needed when the map is full (each further
pass is run and timed too). MB = 10^6 bytes. ``--profile`` runs the first pass under cProfile.
"""

from __future__ import annotations

import argparse
import cProfile
import datetime
import gc
import os
import platform
import pstats
import resource
import shutil
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path

from core_log.batch import Record, build_batch, decode_records
from core_log.clock import SystemClock
from core_log.config import LogConfig
from core_log.handles import HandleCache
from core_log.log import PartitionLog

MiB = 1024 * 1024
GiB = 1024 * MiB
MB = 1_000_000
VALUE_BYTES = 100
BATCH_RECORDS = 1000
TARGET_MB_S = 50.0


def key_of(i: int) -> bytes:
    return b"key-%07d" % i


def bytes_per_map_entry(n: int = 200_000) -> float:
    """tracemalloc bytes per entry of a ``dict[bytes, int]`` as the cleaner's map holds it."""
    value = b"v" * VALUE_BYTES
    batches = [
        build_batch([Record(value, key_of(i), timestamp=0) for i in range(b, b + BATCH_RECORDS)])
        for b in range(0, n, BATCH_RECORDS)
    ]
    base = 10**10  # offsets of a large log: ints that are not cached
    gc.collect()
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    offset_map: dict[bytes, int] = {}
    for j, raw in enumerate(batches):
        for r in decode_records(raw):
            assert r.key is not None
            offset_map[r.key] = base + j * BATCH_RECORDS + r.offset
    gc.collect()
    after = tracemalloc.get_traced_memory()[0]
    tracemalloc.stop()
    return (after - before) / len(offset_map)


def _proc_status_kib(field: str) -> int | None:
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1])
    except OSError:
        pass
    return None


def _reset_peak_rss() -> bool:
    try:
        Path("/proc/self/clear_refs").write_text("5")
        return True
    except OSError:
        return False


def build_log(directory: Path, total_bytes: int, keys: int, segment_bytes: int) -> PartitionLog:
    config = LogConfig(cleanup_policy="compact", segment_bytes=segment_bytes)
    log = PartitionLog(directory, config, SystemClock(), HandleCache())
    value = b"v" * VALUE_BYTES
    blocks = [
        build_batch(
            [Record(value, key_of(i), timestamp=0) for i in range(b, min(b + BATCH_RECORDS, keys))]
        )
        for b in range(0, keys, BATCH_RECORDS)
    ]
    written = 0
    while written < total_bytes:
        for raw in blocks:
            log.append(raw)
            written += len(raw)
            if written >= total_bytes:
                break
    with log._lock:  # benchmark only: make everything written cleanable
        log._roll(log.log_end_offset)
    log.set_high_watermark(log.log_end_offset)
    log.flush()
    return log


def run(args: argparse.Namespace) -> int:
    started = datetime.datetime.now(datetime.UTC)
    print(f"# compaction benchmark, {started:%Y-%m-%d %H:%M:%S} UTC")
    print(
        f"# {platform.node()} {platform.machine()} cpus={os.cpu_count()} "
        f"python={platform.python_version()} loadavg={os.getloadavg()}"
    )
    per_entry = bytes_per_map_entry()
    max_keys = int(args.map_mib * MiB / per_entry)
    print(
        f"key map: {per_entry:.1f} bytes/entry (tracemalloc, dict[bytes, int], 11-byte keys) "
        f"-> max_keys = {max_keys:,} for {args.map_mib} MiB"
    )
    total = int(args.gib * GiB)
    args.data_dir.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="compaction-", dir=args.data_dir))
    try:
        t0 = time.perf_counter()
        log = build_log(work / "topic-0", total, args.keys, args.segment_mib * MiB)
        build_s = time.perf_counter() - t0
        size0 = log.size_bytes
        records0 = log.log_end_offset
        print(
            f"built: {size0 / MB:,.1f} MB, {records0:,} records, {args.keys:,} keys, "
            f"{len(log.segments)} segments of {args.segment_mib} MiB in {build_s:.1f} s "
            f"({size0 / MB / build_s:.1f} MB/s append)"
        )
        passes = 0
        total_s = 0.0
        total_before = 0
        total_after = 0
        total_removed = 0
        while True:
            gc.collect()
            rss0 = _proc_status_kib("VmRSS")
            hwm_ok = _reset_peak_rss() and rss0 is not None
            sizes = [(seg.base_offset, seg.size) for seg in log.segments[:-1]]
            maxrss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
            prof = cProfile.Profile() if args.profile and passes == 0 else None
            t = time.perf_counter()
            if prof is not None:
                prof.enable()
            result = log.clean(max_keys=max_keys)
            if prof is not None:
                prof.disable()
            s = time.perf_counter() - t
            assert result is not None
            if not result.swapped and result.clean_point == result.first_dirty_offset:
                break
            passes += 1
            if hwm_ok:
                hwm = _proc_status_kib("VmHWM")
                assert hwm is not None and rss0 is not None
                peak = f"{(hwm - rss0) / 1024:.1f} MiB (VmHWM after - VmRSS before)"
            else:
                grow = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - maxrss0
                peak = f"{grow / 1024:.1f} MiB (ru_maxrss delta)"
            records = result.clean_point - result.first_dirty_offset
            # The cleaned range: every cleanable segment below the clean point (all are read,
            # unchanged ones are not rewritten and not counted in bytes_before).
            cleaned_in = sum(size for b, size in sizes if b < result.clean_point)
            mb_s = cleaned_in / MB / s
            print(
                f"pass {passes}: offsets {result.first_dirty_offset:,}..{result.clean_point:,} "
                f"in {s:.2f} s: {mb_s:.1f} MB/s, {records / s:,.0f} records/s; "
                f"range {cleaned_in / MB:,.1f} MB; rewritten segments "
                f"{result.bytes_before / MB:,.1f} MB -> {result.bytes_after / MB:,.1f} MB, "
                f"{result.records_removed:,} records removed, "
                f"{result.segments_rewritten} rewritten, {result.segments_removed} removed; "
                f"peak memory +{peak}"
            )
            total_s += s
            total_before += cleaned_in
            total_after += result.bytes_after
            total_removed += result.records_removed
            if prof is not None:
                pstats.Stats(prof).sort_stats("tottime").print_stats(12)
            if result.clean_point >= log.segments[-1].base_offset or passes >= args.max_passes:
                break
        size1 = log.size_bytes
        print(
            f"total: {passes} pass(es), {total_s:.2f} s, {total_before / MB / total_s:.1f} MB/s "
            f"(target {TARGET_MB_S:.0f}), {records0 / total_s:,.0f} records/s; log "
            f"{size0 / MB:,.1f} MB -> {size1 / MB:,.1f} MB, {total_removed:,} records removed"
        )
        print(f"# loadavg after: {os.getloadavg()}")
        log.close()
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--gib", type=float, default=1.0, help="log size to build (GiB)")
    p.add_argument("--keys", type=int, default=1_000_000, help="distinct keys")
    p.add_argument("--map-mib", type=float, default=128.0, help="key map memory bound (MiB)")
    p.add_argument("--segment-mib", type=int, default=64, help="segment.bytes (MiB)")
    p.add_argument("--max-passes", type=int, default=20)
    p.add_argument("--data-dir", type=Path, default=Path("bench-data"))
    p.add_argument("--profile", action="store_true", help="cProfile the first pass")
    return run(p.parse_args())


if __name__ == "__main__":
    sys.exit(main())
