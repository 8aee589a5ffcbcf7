"""Storage micro-benchmark of core_log: raw file writes vs the engine, in one run.

    python -m benchmarks.storage [--data-dir DIR] [--seconds N] [--repeats R] [--json OUT]

Everything runs in a fresh directory under ``--data-dir`` (default ``./bench-data``), so the
raw baseline and the engine use the same disk; the directory is removed afterwards. Shared
machines are noisy, so the figures that matter are the *ratios* measured in this one run: a
ratio is the median over repeats of the ratio of two figures measured in the same repeat.

Measurements (MB = 10^6 bytes):

1. raw append: ``os.write`` of a 1 MiB buffer to a new file, no fsync in the loop (the
   machine's limit); for reference also ``os.write`` + ``os.fdatasync`` per 1 MiB, and one
   ``os.fdatasync`` per 8 MiB written (what a group commit of 8 writers can hope for).
2. engine append: ``PartitionLog.append`` of a pre-built 1 MiB batch of 100-byte records
   (built once with ``build_batch``; the engine validates it and rewrites its 16-byte prefix),
   default ``LogConfig``, no fsync, no background flusher.
3. engine read: sequential ``PartitionLog.read`` (and ``await Partition.read``) of 1 MiB
   fetches of what step 2 wrote, from the page cache; records are counted from batch headers.
4. durable append: ``Partition.append`` with ``flush.messages=1`` (an fsync per append, shared
   by group commit) from 8 concurrent asyncio writers, with the 1 MiB batches and with small
   batches (10 records of 100 B), next to the same path without fsync; fsyncs are counted by
   wrapping ``PartitionLog.flush``.

The 1 MiB writers (1, 2, 4) run interleaved, each writing ``--slice-mib`` in its turn until it
has written ``--mib`` or spent ``--seconds`` (see :func:`run_interleaved` for why), twice: on
*new* page-cache pages (files kept) and on *recycled* ones (pages freed after every turn).
The small-batch writers run ``--seconds`` each. ``--profile KEY`` runs one measurement once
under cProfile (worker threads included) instead of the table.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import datetime
import gc
import json
import os
import platform
import pstats
import shutil
import statistics
import struct
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from core_log.batch import HEADER_BYTES, LOG_OVERHEAD, Record, build_batch
from core_log.clock import SystemClock
from core_log.config import LogConfig
from core_log.executors import StorageExecutors
from core_log.handles import HandleCache
from core_log.log import PartitionLog
from core_log.manager import LogManager, Partition

MiB = 1024 * 1024
MB = 1_000_000
BUFFER_BYTES = MiB  # raw write size, batch size limit and fetch max_bytes
RECORD_VALUE_BYTES = 100
SMALL_BATCH_RECORDS = 10
WRITERS = 8

# Batch header fields read without decoding (see core_log.batch): batchLength at 8 and
# recordCount at 57, both big-endian int32.
_INT32 = struct.Struct(">i")
_BATCH_LENGTH_AT = 8
_RECORD_COUNT_AT = 57

NEW, RECYCLED = "new", "recycled"  # page-cache conditions of the 1 MiB writers


# ---------------------------------------------------------------------------------------------
# samples and reporting
# ---------------------------------------------------------------------------------------------


@dataclass
class Sample:
    seconds: float
    nbytes: int
    records: int = 0
    ops: int = 0  # writes, appends or fetches
    fsyncs: int = 0  # fdatasync calls, or PartitionLog.flush calls that fsynced
    errors: int = 0  # appends that raised (not counted in nbytes, records or ops)

    @property
    def mb_per_s(self) -> float:
        return self.nbytes / self.seconds / MB if self.seconds else 0.0

    @property
    def records_per_s(self) -> float:
        return self.records / self.seconds if self.seconds else 0.0

    @property
    def ops_per_s(self) -> float:
        return self.ops / self.seconds if self.seconds else 0.0

    @property
    def ops_per_fsync(self) -> float | None:
        return self.ops / self.fsyncs if self.fsyncs else None

    def add(self, other: Sample) -> None:
        self.seconds += other.seconds
        self.nbytes += other.nbytes
        self.records += other.records
        self.ops += other.ops
        self.fsyncs += other.fsyncs
        self.errors += other.errors

    def to_dict(self) -> dict[str, Any]:
        return {
            "seconds": round(self.seconds, 6),
            "bytes": self.nbytes,
            "records": self.records,
            "ops": self.ops,
            "fsyncs": self.fsyncs,
            "errors": self.errors,
            "mb_per_s": round(self.mb_per_s, 1),
            "records_per_s": round(self.records_per_s),
            "ops_per_s": round(self.ops_per_s, 1),
        }


@dataclass(frozen=True)
class Row:
    key: str
    tag: str
    label: str
    ops_name: str
    records: bool = True
    fsyncs: bool = False
    ratio_to: str | None = None  # key of the row this one is compared with
    target_ratio: float | None = None
    target_mb_per_s: float | None = None
    target_text: str = ""


def _writer_rows(cond: str) -> list[Row]:
    p = f"{cond}."
    return [
        Row(p + "raw_append", "1a", "raw append: os.write 1 MiB, no fsync", "writes", False),
        Row(
            p + "raw_fdatasync",
            "1b",
            "raw os.write + fdatasync per 1 MiB",
            "writes",
            False,
            fsyncs=True,
            ratio_to=p + "raw_append",
        ),
        Row(
            p + "raw_fdatasync_8",
            "1c",
            "raw: fdatasync per 8 x 1 MiB written",
            "writes",
            False,
            fsyncs=True,
            ratio_to=p + "raw_append",
        ),
        Row(
            p + "engine_append",
            "2",
            "engine: PartitionLog.append 1 MiB",
            "appends",
            ratio_to=p + "raw_append",
            target_ratio=0.70,
            target_text=">= 0.70 x 1a",
        ),
        Row(
            p + "async_append",
            "4a",
            "Partition.append 1 MiB, 8 writers, no fsync",
            "appends",
            ratio_to=p + "engine_append",
        ),
        Row(
            p + "durable_append",
            "4b",
            "durable 1 MiB, 8 writers, flush.messages=1",
            "appends",
            fsyncs=True,
            ratio_to=p + "engine_append",
            target_ratio=0.50,
            target_text=">= 0.50 x 2",
        ),
    ]


READ_ROWS = [
    Row(
        "engine_read",
        "3a",
        "PartitionLog.read, 1 MiB fetches",
        "fetches",
        target_mb_per_s=1000.0,
        target_text=">= 1000 MB/s",
    ),
    Row("engine_read_async", "3b", "await Partition.read, 1 MiB fetches", "fetches"),
]
SMALL_ROWS = [
    Row("async_append_small", "4c", "Partition.append, 8 writers, no fsync", "appends"),
    Row(
        "durable_small",
        "4d",
        "durable, 8 writers, flush.messages=1",
        "appends",
        fsyncs=True,
        ratio_to="async_append_small",
    ),
    Row(
        "durable_small_1w",
        "4e",
        "durable, 1 writer, flush.messages=1",
        "appends",
        fsyncs=True,
        ratio_to="async_append_small",
    ),
]
SECTIONS: list[tuple[str, list[Row]]] = [
    ("A. 1 MiB writers on NEW page-cache pages (files kept)", _writer_rows(NEW)),
    (
        "B. 1 MiB writers on RECYCLED page-cache pages (freed after each turn)",
        _writer_rows(RECYCLED),
    ),
    ("C. reads of the engine log written in A (page cache)", READ_ROWS),
    ("D. small batches: 10 records x 100 B", SMALL_ROWS),
]
ROWS = [row for _, rows in SECTIONS for row in rows]
ROWS_BY_KEY = {r.key: r for r in ROWS}


@dataclass
class Results:
    samples: dict[str, list[Sample]] = field(default_factory=dict)

    def add(self, key: str, sample: Sample) -> None:
        self.samples.setdefault(key, []).append(sample)

    def median(self, key: str, metric: Callable[[Sample], float | None]) -> float | None:
        values = [v for v in (metric(s) for s in self.samples.get(key, [])) if v is not None]
        return statistics.median(values) if values else None

    def paired_ratio(self, key: str, ref: str) -> float | None:
        """Median over repeats of key/ref MB/s measured in the same repeat."""
        pairs = zip(self.samples.get(key, []), self.samples.get(ref, []), strict=False)
        ratios = [a.mb_per_s / b.mb_per_s for a, b in pairs if b.mb_per_s]
        return statistics.median(ratios) if ratios else None

    def verdict(self, row: Row) -> bool | None:
        if row.target_ratio is not None and row.ratio_to is not None:
            ratio = self.paired_ratio(row.key, row.ratio_to)
            return ratio is not None and ratio >= row.target_ratio
        if row.target_mb_per_s is not None:
            mbps = self.median(row.key, lambda s: s.mb_per_s)
            return mbps is not None and mbps >= row.target_mb_per_s
        return None


def _fmt(value: float | None, digits: int = 0) -> str:
    return "-" if value is None else f"{value:,.{digits}f}"


def print_table(results: Results, header: list[str]) -> None:
    print()
    for line in header:
        print(line)
    cols = (
        f"{'':3}{'measurement (median of repeats)':<46} {'MB/s':>7} {'records/s':>11} "
        f"{'ops/s':>8} {'ops/fsync':>9} {'ratio':>10}  {'target (issue)':<14} met?"
    )
    print()
    print(cols)
    for title, rows in SECTIONS:
        rows = [r for r in rows if r.key in results.samples]
        if not rows:
            continue
        print("-" * len(cols))
        print(title)
        for row in rows:
            mbps = results.median(row.key, lambda s: s.mb_per_s)
            rps = results.median(row.key, lambda s: s.records_per_s) if row.records else None
            ops = results.median(row.key, lambda s: s.ops_per_s)
            per_fsync = results.median(row.key, lambda s: s.ops_per_fsync) if row.fsyncs else None
            ratio = ""
            if row.ratio_to is not None and row.ratio_to in results.samples:
                r = results.paired_ratio(row.key, row.ratio_to)
                ratio = f"{_fmt(r, 2)} x {ROWS_BY_KEY[row.ratio_to].tag}"
            met = results.verdict(row)
            verdict = "" if met is None else ("yes" if met else "NO")
            print(
                f"{row.tag:<3}{row.label:<46} {_fmt(mbps):>7} {_fmt(rps):>11} {_fmt(ops):>8} "
                f"{_fmt(per_fsync, 1):>9} {ratio:>10}  {row.target_text:<14} {verdict}"
            )
    print()
    for row in ROWS:
        ss = results.samples.get(row.key, [])
        if row.fsyncs and ss:
            ops = sum(s.ops for s in ss)
            fsyncs = sum(s.fsyncs for s in ss)
            print(
                f"  {row.key}: {ops:,} {row.ops_name}, {fsyncs:,} fsyncs over {len(ss)} repeats "
                f"({ops / max(fsyncs, 1):.1f} {row.ops_name} per fsync)"
            )
        failed = sum(s.errors for s in ss)
        if failed:
            print(
                f"  !! {row.key}: {failed:,} appends FAILED with BufferError (core_log race "
                "between the index flush and an append; see docs/benchmarks.md)"
            )


def results_json(results: Results, meta: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = dict(meta)
    measurements: dict[str, Any] = {}
    targets = []
    for row in ROWS:
        if row.key not in results.samples:
            continue
        entry: dict[str, Any] = {
            "tag": row.tag,
            "label": row.label,
            "samples": [s.to_dict() for s in results.samples[row.key]],
            "median_mb_per_s": results.median(row.key, lambda s: s.mb_per_s),
            "median_records_per_s": (
                results.median(row.key, lambda s: s.records_per_s) if row.records else None
            ),
            "median_ops_per_s": results.median(row.key, lambda s: s.ops_per_s),
            "median_ops_per_fsync": (
                results.median(row.key, lambda s: s.ops_per_fsync) if row.fsyncs else None
            ),
        }
        if row.ratio_to is not None:
            entry["ratio_to"] = row.ratio_to
            entry["ratio"] = results.paired_ratio(row.key, row.ratio_to)
        measurements[row.key] = entry
        met = results.verdict(row)
        if met is not None:
            targets.append({"measurement": row.key, "target": row.target_text, "met": met})
    out["measurements"] = measurements
    out["targets"] = targets
    return out


# ---------------------------------------------------------------------------------------------
# data
# ---------------------------------------------------------------------------------------------


def build_fitting_batch(n_records: int, limit: int | None = None) -> bytes:
    """One uncompressed batch of ``n_records`` 100-byte random values, or as many as fit in
    ``limit`` bytes when a limit is given."""
    now = int(time.time() * 1000)
    values = [os.urandom(RECORD_VALUE_BYTES) for _ in range(n_records)]

    def build(n: int) -> bytes:
        return build_batch([Record(v) for v in values[:n]], default_timestamp=now)

    n = n_records
    batch = build(n)
    while limit is not None and len(batch) > limit:
        n = min(n - 1, n * limit // len(batch))
        batch = build(n)
    return batch


def batch_records(batch: bytes) -> int:
    return int(_INT32.unpack_from(batch, _RECORD_COUNT_AT)[0])


def count_records(data: bytes) -> int:
    """Records in a buffer of whole batches, from their headers (no decoding)."""
    pos = 0
    records = 0
    end = len(data)
    unpack = _INT32.unpack_from
    while end - pos >= HEADER_BYTES:
        records += unpack(data, pos + _RECORD_COUNT_AT)[0]
        pos += unpack(data, pos + _BATCH_LENGTH_AT)[0] + LOG_OVERHEAD
    return int(records)


# Appended to every new log before timing: the first append of a leader epoch stores the
# epoch checkpoint (write, fsync, rename, fsync of the directory), a once-per-epoch cost that
# would otherwise land in the first timed turn of every fresh log.
PRIMER = build_batch([Record(b"primer")])


def describe_source() -> str:
    """The commit under test, and whether core_log has uncommitted changes."""
    try:
        head = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=True
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "core_log"], capture_output=True, text=True
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown commit"
    return f"commit {head}" + (" + uncommitted core_log changes" if dirty else "")


def load_average() -> str:
    try:
        return " ".join(Path("/proc/loadavg").read_text().split()[:3])
    except OSError:
        return "?"


def settle() -> None:
    """Start a measurement with no garbage to collect and nothing dirty in the page cache."""
    gc.collect()
    os.sync()


# ---------------------------------------------------------------------------------------------
# writers
# ---------------------------------------------------------------------------------------------


class Writer:
    """One contestant of a write measurement: opened, run in slices (each timed on its own),
    closed. ``reset`` starts over on new files; ``close`` deletes them without a final fsync."""

    key = ""
    unit = 1  # bytes per operation

    def open(self) -> None:
        raise NotImplementedError

    def run(self, max_ops: int, deadline: float) -> Sample:
        raise NotImplementedError

    def reset(self) -> None:
        self.close()
        self.open()

    def recycle(self) -> None:
        """Free the page-cache pages of the last turn, outside the timing, so the next turn
        (of any writer) reuses them. Default: start over on new files."""
        self.reset()

    def close(self) -> None:
        raise NotImplementedError


class RawWriter(Writer):
    """``os.write`` of 1 MiB buffers to a new file; with ``sync_every`` n, an ``os.fdatasync``
    after every n writes (and at the end of a turn)."""

    def __init__(self, key: str, path: Path, buf: bytes, *, sync_every: int = 0) -> None:
        self.key, self.path, self.buf, self.sync_every = key, path, buf, sync_every
        self.unit = len(buf)
        self.fd = -1

    def open(self) -> None:
        self.fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)

    def run(self, max_ops: int, deadline: float) -> Sample:
        fd, buf, size, every = self.fd, self.buf, len(self.buf), self.sync_every
        write, now = os.write, time.perf_counter
        ops = fsyncs = 0
        start = now()
        while ops < max_ops and now() < deadline:
            if write(fd, buf) != size:
                raise OSError("short write")
            ops += 1
            if every and ops % every == 0:
                os.fdatasync(fd)
                fsyncs += 1
        if every and ops % every:
            os.fdatasync(fd)
            fsyncs += 1
        elapsed = now() - start
        return Sample(elapsed, ops * size, ops=ops, fsyncs=fsyncs)

    def recycle(self) -> None:
        if self.sync_every:  # clean pages: drop them, keep the file (no block frees)
            os.posix_fadvise(self.fd, 0, 0, os.POSIX_FADV_DONTNEED)
        else:
            self.reset()

    def close(self) -> None:
        os.close(self.fd)
        self.path.unlink()


class EngineWriter(Writer):
    """``PartitionLog.append`` of one pre-built batch on the calling thread, no fsync."""

    def __init__(self, key: str, directory: Path, batch: bytes) -> None:
        self.key, self.directory, self.batch = key, directory, batch
        self.unit = len(batch)
        self.per_batch = batch_records(batch)

    def open(self) -> None:
        self.log = PartitionLog(self.directory, LogConfig(), SystemClock(), HandleCache())
        self.log.append(PRIMER)

    def run(self, max_ops: int, deadline: float) -> Sample:
        append, batch, now = self.log.append, self.batch, time.perf_counter
        ops = 0
        start = now()
        while ops < max_ops and now() < deadline:
            append(batch)
            ops += 1
        elapsed = now() - start
        return Sample(elapsed, ops * len(batch), ops * self.per_batch, ops)

    def close(self) -> None:
        self.log.delete()


class FlushCounter:
    """Replaces ``log.flush`` to count the calls that fsynced (had data past the recovery
    point), without changing what the call does."""

    def __init__(self, log: PartitionLog) -> None:
        self.log = log
        self.calls = 0
        self.fsyncs = 0
        self._inner = log.flush
        self._lock = threading.Lock()
        log.flush = self  # type: ignore[method-assign]

    def __call__(self) -> int:
        before = self.log.recovery_point
        target = self.log.log_end_offset
        result = self._inner()
        with self._lock:
            self.calls += 1
            if target > before:
                self.fsyncs += 1
        return result


class AsyncWriter(Writer):
    """``writers`` coroutines calling ``await Partition.append`` on one partition of a
    ``LogManager`` without background tasks (only ``flush.messages`` drives fsyncs)."""

    def __init__(
        self, key: str, directory: Path, batch: bytes, *, writers: int, config: LogConfig
    ) -> None:
        self.key, self.directory, self.batch = key, directory, batch
        self.writers, self.config = writers, config
        self.unit = len(batch)
        self.per_batch = batch_records(batch)
        self.partitions = 0

    def open(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.manager = LogManager(self.directory)
        self.loop.run_until_complete(self.manager.start(background=False))
        self._new_partition()

    def _new_partition(self) -> None:
        create = self.manager.create("bench", self.partitions, self.config)
        self.part = self.loop.run_until_complete(create)
        self.partitions += 1
        self.loop.run_until_complete(self.part.append(PRIMER))
        self.counter = FlushCounter(self.part.log)

    def reset(self) -> None:  # keep the event loop and its worker threads
        self.part.log.delete()
        self._new_partition()

    def recycle(self) -> None:
        if self.config.flush_messages != 1:
            self.reset()
            return
        # Durable: every page is clean, so drop them and keep the files. Deleting fsynced
        # files would free disk blocks, and with the ``discard`` mount option the next
        # journal commit, i.e. the next fsync of *any* writer, would pay for the discards.
        for segment in self.part.log.segments:
            fd = os.open(segment.log_path, os.O_RDONLY)
            try:
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)

    def run(self, max_ops: int, deadline: float) -> Sample:
        fsyncs_before = self.counter.fsyncs
        start = time.perf_counter()
        ops, failures = self.loop.run_until_complete(self._slice(max_ops, deadline))
        elapsed = time.perf_counter() - start
        log = self.part.log
        if self.config.flush_messages == 1 and not failures:
            assert log.recovery_point == log.log_end_offset
        fsyncs = self.counter.fsyncs - fsyncs_before
        return Sample(elapsed, ops * self.unit, ops * self.per_batch, ops, fsyncs, failures)

    async def _slice(self, max_ops: int, deadline: float) -> tuple[int, int]:
        part, batch, now = self.part, self.batch, time.perf_counter
        attempts = failures = 0

        async def writer() -> None:
            nonlocal attempts, failures
            while attempts < max_ops and now() < deadline:
                attempts += 1
                try:
                    await part.append(batch)
                except BufferError:
                    # core_log race (index.py): _IndexFile.flush() runs os.write(_pending) in
                    # the fsync thread, without the log lock, while an append grows the same
                    # bytearray. Count it and go on; see docs/benchmarks.md.
                    failures += 1

        await asyncio.gather(*(writer() for _ in range(self.writers)))
        return attempts - failures, failures

    def close(self) -> None:
        self.part.log.delete()
        self.loop.run_until_complete(self.loop.shutdown_default_executor())
        self.loop.close()


def run_interleaved(
    writers: list[Writer], volume: int, slice_bytes: int, seconds: float, *, recycle: bool
) -> dict[str, Sample]:
    """Run ``writers`` in turns of ``slice_bytes`` (rotating who goes first) until each has
    written ``volume`` or spent ``seconds``; return each one's summed sample. With ``recycle``
    every writer frees the page-cache pages of its turn right after it (outside the timing):
    the next turn reuses them.

    Why: this VM hands freed guest pages back to the host (virtio-balloon free page
    reporting), so writing new page-cache pages runs at 0.4-0.6 GB/s on memory the guest has
    not touched for a few seconds and at 2-4 GB/s on pages freed a moment ago. Writers measured
    one after the other would see different machines; turns of one run see the same one.
    """
    totals = {w.key: Sample(0.0, 0) for w in writers}
    attempts = dict.fromkeys(totals, 0)
    active = list(writers)
    turn = 0
    while active:
        k = turn % len(active)
        for w in active[k:] + active[:k]:
            total = totals[w.key]
            max_ops = min(max(1, slice_bytes // w.unit), volume // w.unit - attempts[w.key])
            sample = w.run(max_ops, time.perf_counter() + seconds - total.seconds)
            total.add(sample)
            attempts[w.key] += sample.ops + sample.errors
            if recycle:
                w.recycle()
        active = [
            w
            for w in active
            if attempts[w.key] < volume // w.unit and totals[w.key].seconds < seconds
        ]
        turn += 1
    return totals


# ---------------------------------------------------------------------------------------------
# reads
# ---------------------------------------------------------------------------------------------


def engine_read(log: PartitionLog, max_bytes: int) -> Sample:
    log.set_high_watermark(log.log_end_offset)
    end = log.log_end_offset
    read = log.read
    offset = nbytes = records = fetches = 0
    start = time.perf_counter()
    while offset < end:
        r = read(offset, max_bytes)
        nbytes += len(r.data)
        records += count_records(r.data)
        fetches += 1
        offset = r.next_offset
    elapsed = time.perf_counter() - start
    assert records == end and nbytes == log.size_bytes, (records, end, nbytes)
    return Sample(elapsed, nbytes, records, fetches)


async def engine_read_async(log: PartitionLog, max_bytes: int) -> Sample:
    log.set_high_watermark(log.log_end_offset)
    pools = StorageExecutors()
    part = Partition("bench", 0, log, False, pools)
    end = log.log_end_offset
    offset = nbytes = records = fetches = 0
    start = time.perf_counter()
    while offset < end:
        r = await part.read(offset, max_bytes)
        nbytes += len(r.data)
        records += count_records(r.data)
        fetches += 1
        offset = r.next_offset
    elapsed = time.perf_counter() - start
    pools.shutdown()
    assert records == end and nbytes == log.size_bytes, (records, end, nbytes)
    return Sample(elapsed, nbytes, records, fetches)


# ---------------------------------------------------------------------------------------------
# the run
# ---------------------------------------------------------------------------------------------


@dataclass
class Plan:
    work: Path
    seconds: float
    repeats: int
    volume: int
    slice_bytes: int
    buf: bytes = b""
    big: bytes = b""
    small: bytes = b""


def _group(plan: Plan, cond: str) -> tuple[list[Writer], EngineWriter]:
    d, p = plan.work / cond, f"{cond}."
    d.mkdir(exist_ok=True)
    durable = LogConfig(flush_messages=1)
    engine = EngineWriter(p + "engine_append", d / "engine-0", plan.big)
    return [
        RawWriter(p + "raw_append", d / "raw.append", plan.buf),
        RawWriter(p + "raw_fdatasync", d / "raw.fdatasync", plan.buf, sync_every=1),
        RawWriter(p + "raw_fdatasync_8", d / "raw.fdatasync8", plan.buf, sync_every=WRITERS),
        engine,
        AsyncWriter(p + "async_append", d / "async", plan.big, writers=WRITERS, config=LogConfig()),
        AsyncWriter(p + "durable_append", d / "durable", plan.big, writers=WRITERS, config=durable),
    ], engine


def _run_group(
    plan: Plan,
    results: Results,
    cond: str,
    want: Callable[[str], bool],
    then: Callable[[EngineWriter], None] | None = None,
) -> None:
    writers, engine = _group(plan, cond)
    writers = [w for w in writers if want(w.key) or (w is engine and then is not None)]
    if not writers:
        return
    settle()
    opened: list[Writer] = []
    try:
        for w in writers:
            w.open()
            opened.append(w)
        totals = run_interleaved(
            writers, plan.volume, plan.slice_bytes, plan.seconds, recycle=cond == RECYCLED
        )
        for key, sample in totals.items():
            if want(key):
                results.add(key, sample)
        if then is not None:
            then(engine)
    finally:
        for w in opened:
            w.close()


def run_repeat(plan: Plan, results: Results, only: set[str] | None = None) -> None:
    """One repeat: A (new pages) and the reads of its engine log, B (recycled pages), D."""

    def want(key: str) -> bool:
        return only is None or key in only

    def reads(engine: EngineWriter) -> None:
        if want("engine_read"):
            results.add("engine_read", engine_read(engine.log, BUFFER_BYTES))
        if want("engine_read_async"):
            results.add("engine_read_async", asyncio.run(engine_read_async(engine.log, MiB)))

    needs_reads = want("engine_read") or want("engine_read_async")
    _run_group(plan, results, NEW, want, reads if needs_reads else None)
    _run_group(plan, results, RECYCLED, want)

    durable = LogConfig(flush_messages=1)
    w = plan.work
    small: list[Writer] = [
        AsyncWriter(
            "async_append_small", w / "s1", plan.small, writers=WRITERS, config=LogConfig()
        ),
        AsyncWriter("durable_small", w / "s2", plan.small, writers=WRITERS, config=durable),
        AsyncWriter("durable_small_1w", w / "s3", plan.small, writers=1, config=durable),
    ]
    for s in small:
        if not want(s.key):
            continue
        settle()
        s.open()
        try:
            results.add(s.key, s.run(2**62, time.perf_counter() + plan.seconds))
        finally:
            s.close()


def profile_one(plan: Plan, key: str, out: Path | None) -> None:
    """Run one measurement under cProfile (main thread and worker threads) and print it."""
    profiles: list[cProfile.Profile] = []
    lock = threading.Lock()

    def thread_profiler(*_args: Any) -> None:
        prof = cProfile.Profile()
        with lock:
            profiles.append(prof)
        prof.enable()  # replaces this hook for the rest of the thread

    main = cProfile.Profile()
    threading.setprofile(thread_profiler)
    main.enable()
    results = Results()
    try:
        run_repeat(plan, results, {key})
    finally:
        main.disable()
        threading.setprofile(None)
    stats = pstats.Stats(main)
    for p in profiles:
        p.disable()
        stats.add(p)
    if out is not None:
        stats.dump_stats(str(out))
    s = results.samples[key][0]
    print(f"profile of {key}: {s.mb_per_s:,.0f} MB/s, {s.ops_per_s:,.0f} ops/s under cProfile")
    stats.sort_stats("tottime").print_stats(30)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.storage",
        description="Storage micro-benchmark of core_log (see docs/benchmarks.md).",
    )
    parser.add_argument(
        "--data-dir",
        type=Path,
        default=Path("bench-data"),
        help="run in a fresh directory under DIR, removed afterwards (default: ./bench-data)",
    )
    parser.add_argument(
        "--seconds",
        type=float,
        default=1.0,
        help="time budget of each measurement in each repeat (default: 1.0)",
    )
    parser.add_argument("--repeats", type=int, default=3, help="repeats (default 3); medians")
    parser.add_argument(
        "--mib",
        type=int,
        default=1024,
        help="volume each 1 MiB writer appends per repeat, in MiB (default 1024)",
    )
    parser.add_argument(
        "--slice-mib",
        type=int,
        default=64,
        help="the 1 MiB writers take turns writing this many MiB (default 64)",
    )
    parser.add_argument("--json", type=Path, metavar="OUT", help="also write the results here")
    parser.add_argument(
        "--profile",
        choices=[r.key for r in ROWS],
        metavar="KEY",
        help="instead of the table, run measurement KEY once under cProfile; keys: "
        + ", ".join(r.key for r in ROWS),
    )
    parser.add_argument("--profile-out", type=Path, help="with --profile: dump pstats here")
    args = parser.parse_args(argv)

    base: Path = args.data_dir
    created_base = not base.exists()
    base.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="storage-", dir=base))
    started = time.perf_counter()
    load_before = load_average()
    try:
        free_mib = shutil.disk_usage(work).free // MiB
        volume = max(args.slice_mib, min(args.mib, free_mib // 8)) * MiB
        plan = Plan(work, args.seconds, args.repeats, volume, args.slice_mib * MiB)
        plan.buf = os.urandom(BUFFER_BYTES)
        plan.big = build_fitting_batch(BUFFER_BYTES // RECORD_VALUE_BYTES, BUFFER_BYTES)
        plan.small = build_fitting_batch(SMALL_BATCH_RECORDS)
        if args.profile:
            profile_one(plan, args.profile, args.profile_out)
            return 0
        results = Results()
        for i in range(args.repeats):
            print(f"repeat {i + 1}/{args.repeats} ...", file=sys.stderr, flush=True)
            run_repeat(plan, results)
    finally:
        shutil.rmtree(work, ignore_errors=True)
        if created_base and not any(base.iterdir()):
            base.rmdir()
    elapsed = time.perf_counter() - started
    load = f"{load_before} before, {load_average()} after"
    source = describe_source()

    date = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    big_records, small_records = batch_records(plan.big), batch_records(plan.small)
    header = [
        f"Logbus storage benchmark, {date}; Python {platform.python_version()}, "
        f"{os.cpu_count()} CPUs, {platform.system()} {platform.release()}; {source}",
        f"data dir {base.resolve()}; 1 MiB writers: up to {plan.volume // MiB} MiB or "
        f"{args.seconds:g} s each, in {args.slice_mib} MiB turns; small writers: "
        f"{args.seconds:g} s; median of {args.repeats} repeats; run took {elapsed:.0f} s",
        f"batches: 1 MiB = {len(plan.big):,} B holding {big_records:,} records of "
        f"{RECORD_VALUE_BYTES} B; small = {len(plan.small):,} B holding {small_records} "
        "records. MB = 10^6 B; ratio = median of per-repeat ratios of MB/s",
        f"load average (1/5/15 min): {load}",
    ]
    print_table(results, header)
    if args.json:
        meta = {
            "date": date,
            "command": " ".join(["python -m benchmarks.storage", *(argv or sys.argv[1:])]),
            "source": source,
            "load_average": load,
            "python": platform.python_version(),
            "platform": platform.platform(),
            "cpus": os.cpu_count(),
            "data_dir": str(base.resolve()),
            "volume_bytes": plan.volume,
            "slice_bytes": plan.slice_bytes,
            "seconds_per_measurement": args.seconds,
            "repeats": args.repeats,
            "total_seconds": round(elapsed, 1),
            "batch_bytes": len(plan.big),
            "batch_records": big_records,
            "small_batch_bytes": len(plan.small),
            "small_batch_records": small_records,
        }
        args.json.write_text(json.dumps(results_json(results, meta), indent=2) + "\n")
        print(f"\nwrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
