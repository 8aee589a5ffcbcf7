"""Crash recovery of a partition log: torn tails, garbage, damaged indexes, flipped bits.

Every test writes a log of random batches (random record counts, sizes, keys, tombstones,
codecs, leader epochs) over several small segments, closes it uncleanly (``flush()`` and then
drop it: no checkpoint, no index flush on close — only the descriptors are closed so the test
process does not leak them), damages the files, reopens it and checks with
:func:`check_recovered` that

* every batch wholly before the damage reads back byte-identical, in order, and nothing after
  it is served; ``log_end_offset`` is the end of the last intact batch;
* reads from random offsets (through the rebuilt or reloaded indexes) return the batch holding
  the offset; timestamp lookups find the first record at or after a timestamp;
* the leader-epoch cache describes exactly the surviving batches;
* the segment files on disk are exactly the log's segments, and after a close every index
  entry points at a batch boundary with the right offset;
* a new append gets exactly the recovered log end offset, and a clean reopen sees the same.

Random cases are generated from fixed seeds, which every assertion message names; set
``LOGBUS_RECOVERY_SEED`` to an integer to run the randomized loops with other seeds.
"""

from __future__ import annotations

import os
import random
import shutil
import struct
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from core_log.batch import (
    HEADER_BYTES,
    LOG_OVERHEAD,
    PREFIX,
    Record,
    build_batch,
    parse_header,
    scan_batches,
)
from core_log.clock import ManualClock
from core_log.compression import Compression
from core_log.config import LogConfig
from core_log.errors import OffsetOutOfRangeError
from core_log.handles import HandleCache
from core_log.log import CHECKPOINT_FILE, PartitionLog
from core_log.segment import LogSegment, segment_name

CONFIG = LogConfig(segment_bytes=8 * 1024, index_interval_bytes=1024)
T0 = 1_700_000_000_000
BIG = 1 << 20
OFFSET_ENTRY = struct.Struct(">ii")
TIME_ENTRY = struct.Struct(">qi")
SEED = int(os.environ.get("LOGBUS_RECOVERY_SEED", "20240611"))
CODECS = (
    Compression.NONE,
    Compression.NONE,
    Compression.NONE,
    Compression.GZIP,
    Compression.SNAPPY,
    Compression.LZ4,
    Compression.ZSTD,
)

FAST = settings(
    derandomize=True,
    database=None,
    deadline=None,
    max_examples=25,
    suppress_health_check=[HealthCheck.too_slow],
)


# -------------------------------------------------------------------------------------------
# writing a log and looking at it
# -------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Stored:
    """One batch as the log stores it."""

    base: int
    next: int
    data: bytes
    epoch: int
    first_timestamp: int
    segment: int  # base offset of the segment holding it (when written)
    position: int  # byte position in that segment


def abandon(log: PartitionLog, cache: HandleCache) -> None:
    """Drop ``log`` as a crash would: only close the descriptors (no checkpoint, no index
    flush), so the process does not leak them."""
    for segment in log.segments:
        cache.close(segment._handle)


def read_all(log: PartitionLog) -> list[tuple[int, bytes]]:
    """(base offset, bytes) of every batch from the log start to the log end, via ``read``."""
    out: list[tuple[int, bytes]] = []
    offset, end = log.log_start_offset, log.log_end_offset
    while offset < end:
        r = log.read(offset, BIG, max_offset=end)
        assert r.data, f"no data at {offset} below the log end {end}"
        assert r.first_offset <= offset < r.next_offset
        for pos, h in scan_batches(r.data):
            out.append((h.base_offset, r.data[pos : pos + h.size_bytes]))
        offset = r.next_offset
    return out


def random_records(rng: random.Random, timestamp: int) -> list[Record]:
    n = rng.randint(1, 12)
    big = rng.random() < 0.04  # now and then a batch larger than a whole segment
    out = []
    for j in range(n):
        size = rng.randint(700, 1200) if big else rng.randint(0, 300)
        value = None if rng.random() < 0.05 else rng.randbytes(size)
        key = None if rng.random() < 0.3 else b"key-%d" % rng.randrange(50)
        headers = (("h", rng.randbytes(4)),) if rng.random() < 0.2 else ()
        out.append(Record(value, key, headers, timestamp + j))
    return out


def write_log(directory: Path, seed: int, n_batches: int = 70) -> list[Stored]:
    """Write ``n_batches`` random batches, flush, and abandon the log; return what it holds."""
    rng = random.Random(seed)
    clock = ManualClock(T0)
    cache = HandleCache()
    log = PartitionLog(directory, CONFIG, clock, cache)
    stored: list[Stored] = []
    epoch = 0
    # At least ``n_batches``, and on until the last segment has a few index entries.
    while len(stored) < n_batches or log.segments[-1].size < 4 * CONFIG.index_interval_bytes:
        if rng.random() < 0.1:
            epoch += rng.randint(1, 3)
        timestamp = clock.now_ms()
        raw = build_batch(random_records(rng, timestamp), compression=rng.choice(CODECS))
        result = log.append(raw, leader_epoch=epoch)
        segment = log.segments[-1]
        data = PREFIX.pack(result.base_offset, len(raw) - LOG_OVERHEAD, epoch) + raw[16:]
        stored.append(
            Stored(
                result.base_offset,
                result.last_offset + 1,
                data,
                epoch,
                timestamp,
                segment.base_offset,
                segment.size - len(raw),
            )
        )
        clock.advance(rng.randint(20, 60))  # batches never share a timestamp
    log.flush()
    assert read_all(log) == [(s.base, s.data) for s in stored], "append changed batch bytes"
    assert len(log.segments) >= 5, "the test needs several segments"
    abandon(log, cache)
    return stored


def segment_bases(stored: list[Stored]) -> list[int]:
    return sorted({s.segment for s in stored})


def log_path(directory: Path, base: int, suffix: str = ".log") -> Path:
    return directory / f"{segment_name(base)}{suffix}"


def open_log(directory: Path, *, clean: bool = False) -> tuple[PartitionLog, HandleCache]:
    cache = HandleCache()
    return PartitionLog(
        directory, CONFIG, ManualClock(T0 + 10**7), cache, clean_shutdown=clean
    ), cache


def expected_epochs(prefix: list[Stored]) -> list[tuple[int, int]]:
    out: list[tuple[int, int]] = []
    for s in prefix:
        if not out or s.epoch > out[-1][0]:
            out.append((s.epoch, s.base))
    return out


def check_index_files(directory: Path) -> None:
    """Every ``.index`` entry points at a batch boundary holding its offset as last offset;
    every ``.timeindex`` entry names the largest timestamp so far and the batch holding it."""
    for log_file in sorted(directory.glob("*.log")):
        base = int(log_file.stem)
        data = log_file.read_bytes()
        batches = {pos: h for pos, h in scan_batches(data)}
        index = log_file.with_suffix(".index").read_bytes()
        assert len(index) % OFFSET_ENTRY.size == 0, log_file.name
        last = (-1, -1)
        for rel, pos in OFFSET_ENTRY.iter_unpack(index):
            assert (rel, pos) > last and rel > last[0] and pos > last[1], log_file.name
            assert pos in batches, f"{log_file.name}: entry ({rel}, {pos}) is off a batch"
            assert batches[pos].last_offset == base + rel, f"{log_file.name}: ({rel}, {pos})"
            last = (rel, pos)
        timeindex = log_file.with_suffix(".timeindex").read_bytes()
        assert len(timeindex) % TIME_ENTRY.size == 0, log_file.name
        by_last_offset = {h.last_offset: h for h in batches.values()}
        last_ts = -(2**63)
        for ts, rel in TIME_ENTRY.iter_unpack(timeindex):
            assert ts > last_ts, log_file.name
            h = by_last_offset.get(base + rel)
            assert h is not None, f"{log_file.name}: time entry ({ts}, {rel}) is off a batch"
            assert h.max_timestamp == ts
            assert ts == max(
                b.max_timestamp for b in batches.values() if b.last_offset <= base + rel
            )
            last_ts = ts


def check_recovered(
    log: PartitionLog,
    cache: HandleCache,
    stored: list[Stored],
    survivors: int,
    ctx: str,
    *,
    rng_seed: int = 0,
) -> None:
    """The log holds exactly ``stored[:survivors]`` and behaves; then it is closed."""
    prefix = stored[:survivors]
    leo = prefix[-1].next if prefix else 0
    directory = log.directory
    assert log.log_end_offset == leo, ctx
    assert log.log_start_offset == 0, ctx
    assert log.recovery_point == leo, ctx
    assert read_all(log) == [(s.base, s.data) for s in prefix], ctx

    # Nothing at or past the log end is served.
    r = log.read(leo, BIG, max_offset=leo + 10_000)
    assert r.data == b"" and r.next_offset == leo, ctx
    with pytest.raises(OffsetOutOfRangeError):
        log.read(leo + 1, BIG, max_offset=leo + 10_000)

    # Offset lookups through the (rebuilt) indexes land on the batch holding the offset.
    rng = random.Random(rng_seed)
    if prefix:
        for offset in [0, leo - 1, *(rng.randrange(leo) for _ in range(40))]:
            want = next(s for s in prefix if s.base <= offset < s.next)
            r = log.read(offset, 1, max_offset=leo)
            assert r.first_offset <= offset < r.next_offset, f"{ctx}: read({offset})"
            assert r.data == want.data, f"{ctx}: read({offset})"
        # Timestamp lookups (time indexes): a batch's first timestamp finds its base offset.
        for s in rng.sample(prefix, min(15, len(prefix))):
            assert log.offset_for_timestamp(s.first_timestamp) == s.base, ctx
        assert log.offset_for_timestamp(prefix[-1].first_timestamp + 10_000) is None, ctx

    assert log.epochs.entries == expected_epochs(prefix), ctx
    files = sorted(p.name for p in directory.glob("*.log"))
    assert files == [f"{segment_name(s.base_offset)}.log" for s in log.segments], ctx

    # Appends continue at exactly the recovered end.
    extra = build_batch([Record(b"after-recovery", timestamp=T0 + 10**8)])
    result = log.append(extra, leader_epoch=1000)
    assert result.base_offset == leo, ctx
    r = log.read(leo, BIG, max_offset=leo + 1)
    assert r.first_offset == leo and parse_header(r.data).base_offset == leo, ctx
    after = [(s.base, s.data) for s in prefix] + [(leo, r.data)]
    log.close()

    # What recovery decided is on disk: indexes are sane and a clean reopen agrees.
    check_index_files(directory)
    again, _ = open_log(directory, clean=True)
    try:
        assert again.log_end_offset == leo + 1, ctx
        assert read_all(again) == after, ctx
        assert again.epochs.entries == [*expected_epochs(prefix), (1000, leo)], ctx
    finally:
        again.close()


@pytest.fixture(scope="module")
def template(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[Stored]]:
    """One abandoned log (no checkpoint) shared by the cases; each case damages a copy."""
    directory = tmp_path_factory.mktemp("template") / "log"
    return directory, write_log(directory, SEED)


def copy_of(template: tuple[Path, list[Stored]], tmp_path: Path, name: str) -> Path:
    target = tmp_path / name
    shutil.copytree(template[0], target)
    return target


# -------------------------------------------------------------------------------------------
# (a) garbage after the last batch
# -------------------------------------------------------------------------------------------


def _next_batch(stored: list[Stored], rng: random.Random) -> bytes:
    """A valid batch with the offset and epoch the log would give the next append."""
    last = stored[-1]
    raw = build_batch([Record(rng.randbytes(200), timestamp=T0 + 10**6)] * 3)
    return PREFIX.pack(last.next, len(raw) - LOG_OVERHEAD, last.epoch) + raw[16:]


def _garbage_cases(stored: list[Stored]) -> dict[str, tuple[bytes, int]]:
    """name -> (bytes appended, batches of ``stored`` + extra valid ones that survive)."""
    rng = random.Random(SEED + 1)
    n = len(stored)
    nxt = _next_batch(stored, rng)
    flipped = bytearray(nxt)
    flipped[len(flipped) // 2] ^= 0x40
    huge = bytearray(nxt[:HEADER_BYTES])
    struct.pack_into(">i", huge, 8, 2**31 - 1)
    short = bytearray(nxt)
    struct.pack_into(">i", short, 8, 20)  # shorter than a header
    wrong_magic = bytearray(nxt)
    wrong_magic[16] = 1
    cases = {f"random-{k}": (rng.randbytes(k), n) for k in (1, 11, 12, 60, 61, 62, 700, 9000)}
    cases |= {
        "zeros": (bytes(4096), n),
        "ones": (b"\xff" * 100, n),
        "copy-of-last-batch": (stored[-1].data, n),
        "copy-of-first-batch": (stored[0].data, n),
        "torn-next-batch": (nxt[: len(nxt) - 1], n),
        "torn-next-header": (nxt[:30], n),
        "next-batch-bad-crc": (bytes(flipped), n),
        "next-batch-huge-length": (bytes(huge) + rng.randbytes(500), n),
        "next-batch-tiny-length": (bytes(short), n),
        "next-batch-wrong-magic": (bytes(wrong_magic), n),
        "valid-next-batch-then-garbage": (nxt + rng.randbytes(300), n + 1),
        "valid-next-batch-then-torn": (nxt + nxt[:100], n + 1),
    }
    return cases


def test_garbage_after_the_last_batch_is_cut(
    template: tuple[Path, list[Stored]], tmp_path: Path
) -> None:
    _, stored = template
    last_base = segment_bases(stored)[-1]
    nxt = _next_batch(stored, random.Random(SEED + 1))
    for name, (garbage, survivors) in _garbage_cases(stored).items():
        ctx = f"garbage case {name!r} (seed {SEED})"
        directory = copy_of(template, tmp_path, name)
        with log_path(directory, last_base).open("ab") as f:
            f.write(garbage)
        log, cache = open_log(directory)
        expect = list(stored)
        if survivors > len(stored):  # the valid next batch is kept, like any other
            h = parse_header(nxt)
            expect.append(
                Stored(
                    h.base_offset,
                    h.next_offset,
                    nxt,
                    h.partition_leader_epoch,
                    T0 + 10**6,
                    last_base,
                    0,
                )
            )
            kept = len(nxt)
        else:
            kept = 0
        assert log.recovered_bytes_truncated == len(garbage) - kept, ctx
        check_recovered(log, cache, expect, survivors, ctx)


@FAST
@given(garbage=st.binary(min_size=1, max_size=400))
def test_any_garbage_tail_is_cut(template: tuple[Path, list[Stored]], garbage: bytes) -> None:
    _, stored = template
    with tempfile.TemporaryDirectory() as tmp:
        directory = Path(tmp) / "log"
        shutil.copytree(template[0], directory)
        with log_path(directory, segment_bases(stored)[-1]).open("ab") as f:
            f.write(garbage)
        log, cache = open_log(directory)
        assert log.recovered_bytes_truncated == len(garbage)
        check_recovered(log, cache, stored, len(stored), f"garbage {garbage!r}")


# -------------------------------------------------------------------------------------------
# (b) the last segment cut at any byte
# -------------------------------------------------------------------------------------------


def _cut_positions(stored: list[Stored], base: int, size: int, rng: random.Random) -> list[int]:
    boundaries = [s.position for s in stored if s.segment == base] + [size]
    picks = {0, 1, size - 1, HEADER_BYTES - 1, HEADER_BYTES, HEADER_BYTES + 1}
    for b in rng.sample(boundaries, min(6, len(boundaries))):
        picks |= {b, b + 1, b - 1, b + 12, b + HEADER_BYTES - 1}
    while len(picks) < 36:
        picks.add(rng.randrange(size + 1))
    return sorted(p for p in picks if 0 <= p <= size)


def test_last_segment_cut_at_random_positions(
    template: tuple[Path, list[Stored]], tmp_path: Path
) -> None:
    _, stored = template
    bases = segment_bases(stored)
    last = bases[-1]
    size = log_path(template[0], last).stat().st_size
    rng = random.Random(SEED + 2)
    positions = _cut_positions(stored, last, size, rng)
    assert len(positions) >= 30
    print(f"cut positions (seed {SEED}): {positions}")
    for cut in positions:
        ctx = f"last segment {last} cut at {cut} of {size} (seed {SEED})"
        directory = copy_of(template, tmp_path, f"cut-{cut}")
        os.truncate(log_path(directory, last), cut)
        log, cache = open_log(directory)
        survivors = [s for s in stored if s.segment < last or s.position + len(s.data) <= cut]
        in_last = [s for s in survivors if s.segment == last]
        intact_end = in_last[-1].position + len(in_last[-1].data) if in_last else 0
        assert log.recovered_bytes_truncated == cut - intact_end, ctx
        check_recovered(log, cache, stored, len(survivors), ctx, rng_seed=cut)


def test_middle_segment_cut_drops_everything_after_it(
    template: tuple[Path, list[Stored]], tmp_path: Path
) -> None:
    _, stored = template
    bases = segment_bases(stored)
    rng = random.Random(SEED + 3)
    for i in range(6):
        base = bases[rng.randrange(1, len(bases) - 1)]
        size = log_path(template[0], base).stat().st_size
        cut = rng.randrange(size)
        ctx = f"middle segment {base} cut at {cut} of {size} (seed {SEED})"
        directory = copy_of(template, tmp_path, f"mid-{i}")
        os.truncate(log_path(directory, base), cut)
        log, cache = open_log(directory)
        survivors = [
            s
            for s in stored
            if s.segment < base or (s.segment == base and s.position + len(s.data) <= cut)
        ]
        assert not any(log_path(directory, b).exists() for b in bases if b > base), ctx
        check_recovered(log, cache, stored, len(survivors), ctx, rng_seed=i)


# -------------------------------------------------------------------------------------------
# (c) damaged or missing indexes
# -------------------------------------------------------------------------------------------


def _entries(path: Path, entry: struct.Struct) -> list[tuple[int, ...]]:
    return list(entry.iter_unpack(path.read_bytes()))


def _write_entries(path: Path, entry: struct.Struct, entries: list[tuple[int, ...]]) -> None:
    path.write_bytes(b"".join(entry.pack(*e) for e in entries))


def _swap_first_two(path: Path, entry: struct.Struct) -> None:
    e = _entries(path, entry)
    assert len(e) >= 2, f"{path.name} needs two entries"
    e[0], e[1] = e[1], e[0]
    _write_entries(path, entry, e)


def _duplicate_last(path: Path, entry: struct.Struct) -> None:
    e = _entries(path, entry)
    _write_entries(path, entry, [*e, e[-1]])


def _position_past_end(path: Path) -> None:
    e = _entries(path, OFFSET_ENTRY)
    size = path.with_suffix(".log").stat().st_size
    e[-1] = (e[-1][0], size + 100)
    _write_entries(path, OFFSET_ENTRY, e)


def _time_offset_past_end(path: Path) -> None:
    e = _entries(path, TIME_ENTRY)
    e[-1] = (e[-1][0], 10**6)
    _write_entries(path, TIME_ENTRY, e)


def _truncate_partial(path: Path, entry_bytes: int) -> None:
    size = path.stat().st_size
    assert size >= entry_bytes
    os.truncate(path, size - entry_bytes // 2)


def _delete(path: Path, *suffixes: str) -> None:
    for suffix in suffixes:
        path.with_suffix(suffix).unlink()


def _random_bytes(path: Path, n: int) -> None:
    path.write_bytes(random.Random(SEED + n).randbytes(n))


IndexDamage = Callable[[Path], None]

INDEX_DAMAGE: dict[str, IndexDamage] = {
    "delete-index": lambda p: p.with_suffix(".index").unlink(),
    "delete-timeindex": lambda p: p.with_suffix(".timeindex").unlink(),
    "delete-both": lambda p: _delete(p, ".index", ".timeindex"),
    "index-random-bytes": lambda p: _random_bytes(p.with_suffix(".index"), 64),
    "index-random-odd-size": lambda p: _random_bytes(p.with_suffix(".index"), 29),
    "index-partial-entry": lambda p: _truncate_partial(p.with_suffix(".index"), 8),
    "index-out-of-order": lambda p: _swap_first_two(p.with_suffix(".index"), OFFSET_ENTRY),
    "index-duplicate-entry": lambda p: _duplicate_last(p.with_suffix(".index"), OFFSET_ENTRY),
    "index-position-past-end": lambda p: _position_past_end(p.with_suffix(".index")),
    "index-emptied": lambda p: p.with_suffix(".index").write_bytes(b""),
    "timeindex-random-bytes": lambda p: _random_bytes(p.with_suffix(".timeindex"), 120),
    "timeindex-partial-entry": lambda p: _truncate_partial(p.with_suffix(".timeindex"), 12),
    "timeindex-out-of-order": lambda p: _swap_first_two(p.with_suffix(".timeindex"), TIME_ENTRY),
    "timeindex-offset-past-end": lambda p: _time_offset_past_end(p.with_suffix(".timeindex")),
    "timeindex-emptied": lambda p: p.with_suffix(".timeindex").write_bytes(b""),
}


@pytest.fixture(scope="module")
def closed_templates(
    tmp_path_factory: pytest.TempPathFactory,
) -> dict[str, tuple[Path, list[Stored]]]:
    """Logs left three ways: closed cleanly; flushed with a checkpoint (recovery point = log
    end) and abandoned; abandoned without any checkpoint."""
    out = {}
    for mode in ("clean", "checkpoint", "none"):
        directory = tmp_path_factory.mktemp(f"indexes-{mode}") / "log"
        stored = write_log(directory, SEED + 10)
        if mode != "none":
            log, cache = open_log(directory)
            if mode == "clean":
                log.close()
            else:
                log.flush()
                log.write_checkpoint()
                abandon(log, cache)
        out[mode] = (directory, stored)
    return out


@pytest.mark.parametrize("mode", ["clean", "checkpoint", "none"])
@pytest.mark.parametrize("which", ["middle", "last"])
@pytest.mark.parametrize("damage", sorted(INDEX_DAMAGE))
def test_damaged_indexes_are_detected_and_rebuilt(
    closed_templates: dict[str, tuple[Path, list[Stored]]],
    tmp_path: Path,
    mode: str,
    which: str,
    damage: str,
) -> None:
    """Index damage never loses data: insane indexes are rebuilt from the log, with a clean
    shutdown too (where segments are loaded, not re-validated)."""
    template = closed_templates[mode]
    _, stored = template
    bases = segment_bases(stored)
    rich = [
        b
        for b in bases[1:-1]
        if len(_entries(log_path(template[0], b, ".timeindex"), TIME_ENTRY)) >= 2
    ]
    base = {"middle": rich[len(rich) // 2], "last": bases[-1]}[which]
    directory = copy_of(template, tmp_path, "log")
    INDEX_DAMAGE[damage](log_path(directory, base))
    log, cache = open_log(directory, clean=mode == "clean")
    ctx = f"{damage} on the {which} segment {base}, {mode} (seed {SEED + 10})"
    assert log.recovered_bytes_truncated == 0, ctx
    check_recovered(log, cache, stored, len(stored), ctx, rng_seed=base)
    for suffix in (".index", ".timeindex"):
        assert log_path(directory, base, suffix).exists(), ctx


def test_misaligned_last_index_entry_after_clean_shutdown(tmp_path: Path) -> None:
    """An ``.index`` whose last entry points inside a batch passes the sanity check (entries
    increase, positions are inside the file). Opening after a clean shutdown must still either
    detect it and rebuild, or at least not fail: every shift of the entry inside the batch is
    tried, and the log must open with the right end offset and serve every batch."""
    directory = tmp_path / "template"
    stored = write_log(directory, SEED + 20, n_batches=30)
    log, _ = open_log(directory)
    log.close()
    base = segment_bases(stored)[-2]
    index_path = log_path(directory, base, ".index")
    entries = _entries(index_path, OFFSET_ENTRY)
    assert len(entries) >= 2
    rel, pos = entries[1]
    size = next(len(s.data) for s in stored if s.segment == base and s.position == pos)
    failures = []
    rng = random.Random(SEED + 21)
    shifts = sorted(set(range(1, HEADER_BYTES + 4)) | set(rng.sample(range(1, size), 40)))
    for shift in shifts:
        case = tmp_path / f"shift-{shift}"
        shutil.copytree(directory, case)
        _write_entries(
            log_path(case, base, ".index"), OFFSET_ENTRY, [entries[0], (rel, pos + shift)]
        )
        try:
            log, _ = open_log(case, clean=True)
            try:
                assert log.log_end_offset == stored[-1].next
                assert read_all(log) == [(s.base, s.data) for s in stored]
                for s in stored:
                    assert log.read(s.base, 1, max_offset=log.log_end_offset).data == s.data
            finally:
                log.close()
        except (AssertionError, OSError) as e:
            failures.append((shift, repr(e)[:60]))
        shutil.rmtree(case)
    kinds = sorted({kind for _, kind in failures})
    assert not failures, f"{len(failures)} of {len(shifts)} shifts fail: {kinds}; {failures[:3]}"


# -------------------------------------------------------------------------------------------
# (d) a flipped byte in the middle of the log
# -------------------------------------------------------------------------------------------


def test_flipped_byte_in_a_middle_segment(
    template: tuple[Path, list[Stored]], tmp_path: Path
) -> None:
    """CRC-32C catches the flip: the log ends before the damaged batch and every later segment
    is deleted."""
    _, stored = template
    bases = segment_bases(stored)
    rng = random.Random(SEED + 4)
    cases = 14
    for i in range(cases):
        base = bases[rng.randrange(1, len(bases) - 1)]
        in_segment = [k for k, s in enumerate(stored) if s.segment == base]
        k = in_segment[0] if i < 2 else rng.choice(in_segment)  # the first batch twice
        victim = stored[k]
        # Byte 16 on is the magic, the CRC and what it covers (0-15: offset, length, epoch).
        at = victim.position + rng.randrange(16, len(victim.data))
        ctx = f"case {i}: byte {at} of segment {base} (batch {k}) flipped (seed {SEED})"
        directory = copy_of(template, tmp_path, f"flip-{i}")
        path = log_path(directory, base)
        with path.open("r+b") as f:
            f.seek(at)
            byte = f.read(1)[0]
            f.seek(at)
            f.write(bytes([byte ^ (1 << rng.randrange(8))]))
        sizes_after = (
            sum(log_path(directory, b).stat().st_size for b in bases if b > base)
            + path.stat().st_size
            - victim.position
        )
        log, cache = open_log(directory)
        assert log.recovered_bytes_truncated == sizes_after, ctx
        for b in bases:
            if b > base:
                for suffix in (".log", ".index", ".timeindex"):
                    assert not log_path(directory, b, suffix).exists(), ctx
        check_recovered(log, cache, stored, k, ctx, rng_seed=i)


def test_offset_going_backwards_is_corruption(
    template: tuple[Path, list[Stored]], tmp_path: Path
) -> None:
    """The base offset is outside the CRC; recovery still refuses a batch that goes back."""
    _, stored = template
    k = len(stored) // 2
    directory = copy_of(template, tmp_path, "backwards")
    path = log_path(directory, stored[k].segment)
    with path.open("r+b") as f:
        f.seek(stored[k].position)
        f.write(struct.pack(">q", stored[k - 1].base))
    log, cache = open_log(directory)
    check_recovered(log, cache, stored, k, "base offset rewound")


# -------------------------------------------------------------------------------------------
# recovery of a recovered log, and a crash during recovery
# -------------------------------------------------------------------------------------------


def test_recovery_is_repeatable(template: tuple[Path, list[Stored]], tmp_path: Path) -> None:
    """Recover, write, crash again, recover again: nothing is lost or duplicated."""
    _, stored = template
    directory = copy_of(template, tmp_path, "again")
    last = segment_bases(stored)[-1]
    with log_path(directory, last).open("ab") as f:
        f.write(b"\x00" * 100)
    rng = random.Random(SEED + 5)
    expect = list(stored)
    for round_ in range(5):
        log, cache = open_log(directory)
        assert read_all(log) == [(s.base, s.data) for s in expect], f"round {round_}"
        for _ in range(10):
            raw = build_batch(random_records(rng, T0 + 10**7 + round_ * 1000))
            r = log.append(raw, leader_epoch=100 + round_)
            data = PREFIX.pack(r.base_offset, len(raw) - LOG_OVERHEAD, 100 + round_) + raw[16:]
            seg = log.segments[-1]
            expect.append(
                Stored(
                    r.base_offset,
                    r.last_offset + 1,
                    data,
                    100 + round_,
                    0,
                    seg.base_offset,
                    seg.size - len(raw),
                )
            )
        log.flush()
        if round_ % 2:
            log.write_checkpoint()
        abandon(log, cache)
        tail = segment_bases(expect)[-1]
        with log_path(directory, tail).open("ab") as f:
            f.write(rng.randbytes(rng.randint(1, 200)))
    log, cache = open_log(directory)
    assert read_all(log) == [(s.base, s.data) for s in expect]
    assert log.epochs.entries == expected_epochs(expect)
    log.close()


class SimulatedCrash(BaseException):
    """Stands for the process dying at this point (nothing after it runs)."""


def test_crash_while_recovery_deletes_later_segments(
    template: tuple[Path, list[Stored]], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _, stored = template
    bases = segment_bases(stored)
    base = bases[2]
    victim_k = next(k for k, s in enumerate(stored) if s.segment == base) + 1
    victim = stored[victim_k]
    directory = copy_of(template, tmp_path, "crash-in-recovery")
    with log_path(directory, base).open("r+b") as f:
        f.seek(victim.position + len(victim.data) - 1)
        byte = f.read(1)[0]
        f.seek(victim.position + len(victim.data) - 1)
        f.write(bytes([byte ^ 1]))

    real_delete = LogSegment.delete
    calls = 0

    def crash_on_second_delete(self: LogSegment) -> None:
        nonlocal calls
        calls += 1
        if calls == 2:
            raise SimulatedCrash
        real_delete(self)

    monkeypatch.setattr(LogSegment, "delete", crash_on_second_delete)
    cache = HandleCache()
    with pytest.raises(SimulatedCrash):
        PartitionLog(directory, CONFIG, ManualClock(T0), cache)
    for handle in list(cache._open):
        cache.close(handle)
    monkeypatch.setattr(LogSegment, "delete", real_delete)

    log, _cache = open_log(directory)
    try:
        segments = [(s.base_offset, s.next_offset) for s in log.segments]
        assert log.log_end_offset == victim.base, f"data after the damage came back: {segments}"
        assert read_all(log) == [(s.base, s.data) for s in stored[:victim_k]]
    finally:
        log.close()


def test_empty_and_missing_files(tmp_path: Path) -> None:
    """A log directory with no segment (only a checkpoint), and one whose only segment is
    empty, recover to an empty log at the checkpointed start."""
    directory = tmp_path / "empty"
    log, cache = open_log(directory)
    assert log.log_end_offset == 0
    abandon(log, cache)
    log, cache = open_log(directory)
    check_recovered(log, cache, [], 0, "empty log")

    directory = tmp_path / "no-segments"
    directory.mkdir()
    (directory / CHECKPOINT_FILE).write_bytes(
        b'{"high_watermark":0,"log_start_offset":0,"recovery_point":0}'
    )
    log, cache = open_log(directory)
    check_recovered(log, cache, [], 0, "only a checkpoint")


def test_whole_last_segment_lost(template: tuple[Path, list[Stored]], tmp_path: Path) -> None:
    """A last segment emptied by the crash (a roll whose first write never landed) goes away;
    the log ends where the previous segment ends and the next append starts a new one."""
    _, stored = template
    bases = segment_bases(stored)
    directory = copy_of(template, tmp_path, "lost-last")
    os.truncate(log_path(directory, bases[-1]), 0)
    log, cache = open_log(directory)
    survivors = sum(1 for s in stored if s.segment < bases[-1])
    assert [s.base_offset for s in log.segments] == bases[:-1]
    check_recovered(log, cache, stored, survivors, "last segment emptied")
