"""LogManager and Partition: the asyncio face of the storage engine.

Every test is a plain function running its scenario with ``asyncio.run`` (no pytest-asyncio).
Covered: partition lifecycle and topic-name rules, restarts with and without the clean-shutdown
marker, group commit under concurrent durable writers, long-poll waiters, the broker-wide bound
on open segment files, retention and ``segment.ms`` rolls, and ``flush.ms``, the last two driven
by a :class:`ManualClock`.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import threading
import time
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any, TypeVar

import pytest

from core_log import fileio
from core_log.batch import Record, build_batch, decode_records, scan_batches
from core_log.clock import ManualClock
from core_log.compression import Compression
from core_log.config import LogConfig
from core_log.datadir import LOCK_FILE
from core_log.errors import (
    CorruptRecordError,
    InvalidTopicError,
    OffsetOutOfRangeError,
    TopicAlreadyExistsError,
    UnknownTopicOrPartitionError,
)
from core_log.handles import HandleCache
from core_log.log import PartitionLog
from core_log.manager import CLEAN_SHUTDOWN_FILE, LogManager, Partition

T = TypeVar("T")
T0 = 1_700_000_000_000


def run(main: Callable[[], Coroutine[Any, Any, T]]) -> T:
    return asyncio.run(main())


def batch(*values: bytes, timestamp: int = T0) -> bytes:
    return build_batch([Record(v, timestamp=timestamp) for v in values])


async def read_values(p: Partition, start: int | None = None) -> list[tuple[int, bytes | None]]:
    """(offset, value) of every record from ``start`` (default: log start) to the log end."""
    offset = p.log_start_offset if start is None else start
    out: list[tuple[int, bytes | None]] = []
    while offset < p.log_end_offset:
        r = await p.read(offset, 1 << 20, max_offset=p.log_end_offset)
        assert r.data
        for pos, _h in scan_batches(r.data):
            out.extend((rec.offset, rec.value) for rec in decode_records(r.data, pos))
        offset = r.next_offset
    return out


def abandon(manager: LogManager) -> None:
    """Forget ``manager`` as a killed broker would: no close, no checkpoint, no marker. Only
    the descriptors are closed so the test process does not leak them, and the data
    directory's lock goes as the kernel drops it when a process dies."""
    for p in manager.partitions():
        for segment in p.log.segments:
            manager.handles.close(segment._handle)
    manager.dir_lock.release()


def make_manager(path: Path, **kwargs: Any) -> LogManager:
    kwargs.setdefault("clock", ManualClock(T0))
    return LogManager(path, **kwargs)


# -------------------------------------------------------------------------------------------
# partitions: create, get, delete, names
# -------------------------------------------------------------------------------------------


def test_create_get_delete(tmp_path: Path) -> None:
    async def main() -> None:
        m = make_manager(tmp_path)
        await m.start(background=False)
        p0 = await m.create("orders", 0)
        p1 = await m.create("orders", 1)
        await m.create("a.b_c-d", 3)
        assert m.get("orders", 0) is p0 and m.get("orders", 1) is p1
        assert m.topics() == {"a.b_c-d": [3], "orders": [0, 1]}
        assert (tmp_path / "orders-0").is_dir() and (tmp_path / "orders-1").is_dir()
        with pytest.raises(TopicAlreadyExistsError):
            await m.create("orders", 0)
        with pytest.raises(UnknownTopicOrPartitionError):
            m.get("orders", 2)
        with pytest.raises(UnknownTopicOrPartitionError):
            await m.create("orders", -1)

        r = await p0.append(batch(b"a", b"b"))
        assert (r.base_offset, r.last_offset) == (0, 1)
        await m.delete("orders", 0)
        with pytest.raises(UnknownTopicOrPartitionError):
            m.get("orders", 0)
        with pytest.raises(UnknownTopicOrPartitionError):
            await m.delete("orders", 0)
        assert not (tmp_path / "orders-0").exists()
        assert not [e for e in tmp_path.iterdir() if e.name.endswith("-delete")]
        assert m.topics() == {"a.b_c-d": [3], "orders": [1]}

        # The name is free again and the new partition starts empty.
        again = await m.create("orders", 0)
        assert again.log_end_offset == 0
        assert (await again.append(batch(b"new"))).base_offset == 0
        await m.close()

        # A deleted partition does not come back after a restart.
        m2 = make_manager(tmp_path)
        await m2.start(background=False)
        assert m2.topics() == {"a.b_c-d": [3], "orders": [0, 1]}
        assert await read_values(m2.get("orders", 0)) == [(0, b"new")]
        await m2.delete("a.b_c-d", 3)
        await m2.close()
        m3 = make_manager(tmp_path)
        await m3.start(background=False)
        assert m3.topics() == {"orders": [0, 1]}
        await m3.close()

    run(main)


@pytest.mark.parametrize(
    "name",
    ["", ".", "..", "a/b", "../x", "a b", "a\\b", "é", "a*", "a" * 250, "x\x00y", "a:b"],
)
def test_invalid_topic_names(tmp_path: Path, name: str) -> None:
    async def main() -> None:
        m = make_manager(tmp_path)
        await m.start(background=False)
        with pytest.raises(InvalidTopicError):
            await m.create(name, 0)
        assert m.topics() == {}
        await m.close()

    run(main)
    assert sorted(e.name for e in tmp_path.iterdir()) == [CLEAN_SHUTDOWN_FILE, LOCK_FILE]


def test_topic_name_with_trailing_newline_is_invalid(tmp_path: Path) -> None:
    async def main() -> None:
        m = make_manager(tmp_path)
        await m.start(background=False)
        try:
            with pytest.raises(InvalidTopicError):
                await m.create("abc\n", 0)
        finally:
            await m.close()

    run(main)


def test_longest_topic_name_is_valid(tmp_path: Path) -> None:
    async def main() -> None:
        m = make_manager(tmp_path)
        await m.start(background=False)
        p = await m.create("t" * 249, 0)
        await p.append(batch(b"x"))
        await m.close()

    run(main)


def test_delete_partition_of_longest_topic_name(tmp_path: Path) -> None:
    """The rename that makes a delete crash-safe must fit in a file name (255 bytes) even for
    a 249-character topic."""

    async def main() -> None:
        m = make_manager(tmp_path)
        await m.start(background=False)
        await m.create("t" * 249, 0)
        try:
            await m.delete("t" * 249, 0)
        finally:
            await m.close()
        assert sorted(e.name for e in tmp_path.iterdir()) == [CLEAN_SHUTDOWN_FILE, LOCK_FILE]

    run(main)


# -------------------------------------------------------------------------------------------
# restarts
# -------------------------------------------------------------------------------------------


def test_restart_clean_and_unclean(tmp_path: Path) -> None:
    config = LogConfig(segment_bytes=2048, index_interval_bytes=256)

    async def main() -> None:
        m = make_manager(tmp_path, config_for=lambda _t: config)
        await m.start(background=False)
        assert not m.was_clean_shutdown  # a fresh directory has no marker
        expected: dict[tuple[str, int], list[tuple[int, bytes | None]]] = {}
        for part in range(3):
            p = await m.create("t", part)
            expected[("t", part)] = []
            for i in range(40):
                r = await p.append(batch(b"v%d-%d" % (part, i), b"w" * 100), durable=i % 5 == 0)
                expected[("t", part)] += [
                    (r.base_offset, b"v%d-%d" % (part, i)),
                    (r.base_offset + 1, b"w" * 100),
                ]
        assert len(m.get("t", 0).log.segments) > 1
        await m.close()
        assert (tmp_path / CLEAN_SHUTDOWN_FILE).exists()

        # 1. Clean restart: the marker is seen, then removed; data and offsets intact.
        m = make_manager(tmp_path, config_for=lambda _t: config)
        await m.start(background=False)
        assert m.was_clean_shutdown
        assert not (tmp_path / CLEAN_SHUTDOWN_FILE).exists()
        for (topic, part), values in expected.items():
            p = m.get(topic, part)
            assert await read_values(p) == values
            assert p.high_watermark == p.log_end_offset == 80
            r = await p.append(batch(b"after-clean"))
            assert r.base_offset == 80
            values.append((80, b"after-clean"))
        # 2. Crash (no close): unflushed appends are in the page cache and survive.
        for (topic, part), values in expected.items():
            r = await m.get(topic, part).append(batch(b"unflushed"))
            values.append((r.base_offset, b"unflushed"))
        abandon(m)

        m = make_manager(tmp_path, config_for=lambda _t: config)
        await m.start(background=False)
        assert not m.was_clean_shutdown
        for (topic, part), values in expected.items():
            p = m.get(topic, part)
            assert await read_values(p) == values
            assert p.high_watermark == p.log_end_offset == 82
            assert p.log.recovery_point == 82
        # 3. A crash leaving a torn tail: recovery cuts it and appends continue.
        p = m.get("t", 1)
        tail = p.log.segments[-1].log_path
        abandon(m)
        with tail.open("ab") as f:
            f.write(batch(b"torn")[:40])
        m = make_manager(tmp_path, config_for=lambda _t: config)
        await m.start(background=False)
        assert not m.was_clean_shutdown
        p = m.get("t", 1)
        assert p.log.recovered_bytes_truncated == 40
        assert await read_values(p) == expected[("t", 1)]
        assert (await p.append(batch(b"next"))).base_offset == 82
        await m.close()

    run(main)


def test_start_removes_leftovers_of_deletes(tmp_path: Path) -> None:
    """A crash in the middle of a delete leaves a renamed directory: start() erases it and
    ignores directories that are not partitions."""

    async def main() -> None:
        leftover = tmp_path / "gone-0.0123456789abcdef0123456789abcdef-delete"
        leftover.mkdir(parents=True)
        (leftover / "00000000000000000000.log").write_bytes(b"x" * 100)
        (tmp_path / "not a partition").mkdir()
        m = make_manager(tmp_path)
        await m.start(background=False)
        assert not leftover.exists()
        assert m.topics() == {}
        await m.close()

    run(main)


# -------------------------------------------------------------------------------------------
# group commit
# -------------------------------------------------------------------------------------------


def test_group_commit_shares_fsyncs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """flush.messages=1: every append is acknowledged only once fsynced, yet eight concurrent
    writers share fsyncs: far fewer flushes than appends, and offsets are unique and
    contiguous."""
    flushes = 0
    real_flush = PartitionLog.flush

    def counting_flush(self: PartitionLog) -> int:
        nonlocal flushes
        flushes += 1
        return real_flush(self)

    monkeypatch.setattr(PartitionLog, "flush", counting_flush)
    # A small index interval: appends add index entries while flushes write index files.
    config = LogConfig(flush_messages=1, index_interval_bytes=64)
    writers, per_writer = 8, 40

    async def main() -> None:
        m = make_manager(tmp_path, config_for=lambda _t: config)
        await m.start(background=False)
        p = await m.create("t", 0)

        async def writer(w: int) -> list[tuple[int, int]]:
            acks = []
            for i in range(per_writer):
                n = 1 + (w + i) % 3
                r = await p.append(batch(*(b"w%d-%d-%d" % (w, i, j) for j in range(n))))
                assert r.last_offset - r.base_offset + 1 == n
                # Acknowledged means durable, and the high watermark never passes it.
                assert p.log.recovery_point > r.last_offset
                assert p.high_watermark <= p.log.recovery_point
                acks.append((r.base_offset, r.last_offset))
            return acks

        results = await asyncio.gather(*(writer(w) for w in range(writers)))
        ranges = sorted(r for acks in results for r in acks)
        expected_start = 0
        for base, last in ranges:
            assert base == expected_start, "offsets must be unique and contiguous"
            expected_start = last + 1
        assert expected_start == p.log_end_offset == p.high_watermark == p.log.recovery_point
        appends = writers * per_writer
        assert len(ranges) == appends
        assert 0 < flushes < appends / 2, f"{flushes} fsyncs for {appends} appends"
        values = dict(await read_values(p))
        for w, acks in enumerate(results):
            for i, (base, _last) in enumerate(acks):
                assert values[base] == b"w%d-%d-0" % (w, i)
        await m.close()

    run(main)


def test_durable_append_waits_for_fsync(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """durable=True returns only after a flush covering the batch; without it (and the default
    flush.messages) no flush happens on append."""
    flushes: list[int] = []
    real_flush = PartitionLog.flush

    def counting_flush(self: PartitionLog) -> int:
        result = real_flush(self)
        flushes.append(result)
        return result

    monkeypatch.setattr(PartitionLog, "flush", counting_flush)

    async def main() -> None:
        m = make_manager(tmp_path)
        await m.start(background=False)
        p = await m.create("t", 0)
        await p.append(batch(b"a"))
        assert flushes == [] and p.log.recovery_point == 0
        assert p.high_watermark == 1  # standalone: visible at once under the default policy
        await p.append(batch(b"b", b"c"), durable=True)
        assert flushes == [3] and p.log.recovery_point == 3
        await m.close()

    run(main)


def test_compressed_producer_batches_are_appended_off_the_loop(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Validating a compressed batch decompresses it, and its size on the wire says nothing of
    that cost (512 bytes of zstd can expand to 16 MiB): it runs in a worker thread however
    small the batch. Small uncompressed batches stay inline."""
    threads: list[bool] = []
    real_append = PartitionLog._append  # behind both the inline try_append and append

    def recording_append(self: PartitionLog, *args: Any, **kwargs: Any) -> Any:
        threads.append(threading.current_thread() is threading.main_thread())
        return real_append(self, *args, **kwargs)

    monkeypatch.setattr(PartitionLog, "_append", recording_append)

    async def main() -> None:
        m = make_manager(tmp_path)
        await m.start(background=False)
        p = await m.create("t", 0)
        packed = build_batch([Record(bytes(4 * 1024 * 1024))], compression=Compression.ZSTD)
        assert len(packed) < 1024
        await p.append(batch(b"first"))  # stores leader epoch 0 (an fsync): off the loop
        threads.clear()
        await p.append(batch(b"a"))
        await p.append(packed)
        await p.append(batch(b"b") + packed)
        await m.close()

    run(main)
    assert threads == [True, False, False]  # inline, worker, worker


def test_appends_queued_behind_a_blocked_one_drain_in_order_then_run_inline_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An append that must wait for a worker (here: held in the thread) queues the appends
    that arrive meanwhile. When it returns, the queued ones run in arrival order, inline (not
    one thread hop each), a cancelled one is never written, a bad one fails alone; and once
    the queue is empty the next append runs inline without queueing: under steady load the
    queue does not stay (it did: each queued append took a lock in turn, and later ones kept
    queueing behind them). The small appends that arrive together go as one run
    (:meth:`Partition._gather`): one queued append, written inline."""
    held = threading.Event()
    release = threading.Event()
    threads: list[bool] = []
    real_worker_append = PartitionLog.append
    real_append = PartitionLog._append

    def held_worker_append(self: PartitionLog, *args: Any, **kwargs: Any) -> Any:
        if not held.is_set():
            held.set()
            release.wait(10)
        return real_worker_append(self, *args, **kwargs)

    def recording_append(self: PartitionLog, *args: Any, **kwargs: Any) -> Any:
        threads.append(threading.current_thread() is threading.main_thread())
        return real_append(self, *args, **kwargs)

    async def main() -> None:
        m = make_manager(tmp_path)
        await m.start(background=False)
        p = await m.create("t", 0)
        await p.append(batch(b"warm"))  # stores leader epoch 0 (a worker, before the hold)
        monkeypatch.setattr(PartitionLog, "append", held_worker_append)
        monkeypatch.setattr(PartitionLog, "_append", recording_append)
        big = batch(bytes(512 * 1024))  # past the inline bound: a worker
        first = asyncio.create_task(p.append(big))
        assert await asyncio.to_thread(held.wait, 10)
        queued = [asyncio.create_task(p.append(batch(b"q%d" % i))) for i in range(20)]
        bad = asyncio.create_task(p.append(b"\x00" * 70))  # no valid batch
        gone = asyncio.create_task(p.append(batch(b"cancelled")))
        tail = asyncio.create_task(p.append(batch(b"last")))
        await asyncio.sleep(0)  # each task runs up to its wait for the run
        gone.cancel()
        await asyncio.sleep(0)  # the run is written: queued behind the held append
        assert len(p._pending) == 2 and not any(t.done() for t in queued)
        release.set()
        offsets = [(await t).base_offset for t in [first, *queued]]
        assert offsets == sorted(offsets) == list(range(1, 22))
        with pytest.raises(CorruptRecordError):
            await bad
        assert (await tail).base_offset == 22
        assert threads == [False, True]  # the big one in a worker, the run inline
        assert not p._pending and p._drainer is not None and p._drainer.done()
        threads.clear()
        await p.append(batch(b"after"))
        assert threads == [True] and p._drainer.done()  # inline, not through the queue
        values = [v for _, v in await read_values(p)]
        assert b"cancelled" not in values and values[-2:] == [b"last", b"after"]
        await m.close()

    run(main)


def test_flush_concurrent_with_appends(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """PartitionLog.flush runs without the log lock (so appends continue during an fsync, as
    the group commit does from a worker thread). An append that adds an index entry while the
    flush is inside os.write of the index file must neither fail nor lose the entry.

    The race is made deterministic: the index write holds its buffer (as os.write does while
    the GIL is released) and lets another thread append meanwhile. (While the flush wrote the
    pending bytearray itself, the append raised BufferError after its batch was written.)
    """
    config = LogConfig(index_interval_bytes=0)  # every batch gets an index entry
    log = PartitionLog(tmp_path / "log", config, ManualClock(T0), HandleCache())
    log.append(batch(b"first"))
    errors: list[BaseException] = []
    real_write = os.write
    raced = False

    def racing_write(fd: int, data: Any) -> int:
        nonlocal raced
        if raced or not isinstance(data, bytearray):
            return real_write(fd, data)
        raced = True
        with memoryview(data) as held:  # what os.write holds during the syscall

            def append() -> None:
                try:
                    log.append(batch(b"during-flush"))
                except BaseException as e:  # reported below
                    errors.append(e)

            t = threading.Thread(target=append)
            t.start()
            t.join(10)
            return real_write(fd, held)

    class RacingFiles(fileio.FileOps):
        def write(self, fd: int, data: Any) -> int:
            return racing_write(fd, data)

    with fileio.injected(RacingFiles()):
        log.flush()
    assert raced
    assert errors == [], f"append during flush failed: {errors!r}"
    log.close()
    entries = (tmp_path / "log" / "00000000000000000000.index").read_bytes()
    assert len(entries) == 2 * 8, "an index entry added during the flush was lost"


# -------------------------------------------------------------------------------------------
# long polls
# -------------------------------------------------------------------------------------------


def test_wait_for_wakes_on_append(tmp_path: Path) -> None:
    async def main() -> None:
        m = make_manager(tmp_path)
        await m.start(background=False)
        p = await m.create("t", 0)
        waiter = asyncio.create_task(p.wait_for(0, 10.0))
        await asyncio.sleep(0.02)
        assert not waiter.done() and p.waiter_count == 1
        started = time.monotonic()
        await p.append(batch(b"x"))
        assert await asyncio.wait_for(waiter, 2.0) is True
        assert time.monotonic() - started < 2.0
        assert p.waiter_count == 0
        # Data already there: True at once, no waiter parked.
        assert await asyncio.wait_for(p.wait_for(0, 10.0), 2.0) is True
        # Waiting past the end needs one more append.
        waiter = asyncio.create_task(p.wait_for(1, 10.0))
        await asyncio.sleep(0.01)
        await p.append(batch(b"y", b"z"))
        assert await asyncio.wait_for(waiter, 2.0) is True
        await m.close()

    run(main)


def test_wait_for_times_out(tmp_path: Path) -> None:
    async def main() -> None:
        m = make_manager(tmp_path)
        await m.start(background=False)
        p = await m.create("t", 0)
        await p.append(batch(b"x"))
        started = time.monotonic()
        assert await p.wait_for(1, 0.1) is False
        elapsed = time.monotonic() - started
        assert 0.05 <= elapsed < 2.0
        assert p.waiter_count == 0
        assert await p.wait_for(1, 0) is False
        await m.close()

    run(main)


def test_thousand_waiters_wake_on_one_append(tmp_path: Path) -> None:
    async def main() -> None:
        m = make_manager(tmp_path)
        await m.start(background=False)
        p = await m.create("t", 0)
        other = await m.create("t", 1)
        waiters = [asyncio.create_task(p.wait_for(0, 10.0)) for _ in range(1000)]
        bystander = asyncio.create_task(other.wait_for(0, 10.0))
        for _ in range(100):
            if p.waiter_count == 1000:
                break
            await asyncio.sleep(0.01)
        assert p.waiter_count == 1000
        started = time.monotonic()
        await p.append(batch(b"x"))
        results = await asyncio.wait_for(asyncio.gather(*waiters), 2.0)
        assert results == [True] * 1000
        assert time.monotonic() - started < 2.0
        assert p.waiter_count == 0
        assert not bystander.done(), "an append elsewhere must not wake this partition"
        await other.append(batch(b"y"))
        assert await asyncio.wait_for(bystander, 2.0) is True
        await m.close()

    run(main)


def test_wait_for_follows_the_high_watermark(tmp_path: Path) -> None:
    """Replicated mode: appends do not wake waiters, moving the high watermark does."""

    async def main() -> None:
        m = make_manager(tmp_path, auto_high_watermark=False)
        await m.start(background=False)
        p = await m.create("t", 0)
        waiter = asyncio.create_task(p.wait_for(0, 10.0))
        await p.append(batch(b"a", b"b"))
        await asyncio.sleep(0.05)
        assert not waiter.done() and p.high_watermark == 0
        p.set_high_watermark(1)
        assert await asyncio.wait_for(waiter, 2.0) is True
        p.set_high_watermark(100)  # clamped to the log end
        assert p.high_watermark == 2
        await m.close()

    run(main)


@pytest.mark.parametrize("how", ["delete", "close"])
def test_waiters_released_on_delete_and_close(tmp_path: Path, how: str) -> None:
    """A long-poll on a partition being deleted, or on a broker closing, is answered (False)
    at once instead of sitting until its timeout."""

    async def main() -> None:
        m = make_manager(tmp_path)
        await m.start(background=False)
        p = await m.create("t", 0)
        waiter = asyncio.create_task(p.wait_for(0, 5.0))
        await asyncio.sleep(0.02)
        assert p.waiter_count == 1
        if how == "delete":
            await m.delete("t", 0)
        else:
            await m.close()
        done, _ = await asyncio.wait({waiter}, timeout=1.0)
        if waiter not in done:
            waiter.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await waiter
        if how == "delete":
            await m.close()
        assert waiter in done, f"the waiter was not released by {how}()"
        assert waiter.result() is False

    run(main)


# -------------------------------------------------------------------------------------------
# the bound on open segment files
# -------------------------------------------------------------------------------------------


def test_open_handles_stay_bounded(tmp_path: Path) -> None:
    bound, partitions = 4, 3
    config = LogConfig(segment_bytes=1024, index_interval_bytes=256)

    async def main() -> None:
        m = make_manager(tmp_path, max_open_handles=bound, config_for=lambda _t: config)
        await m.start(background=False)
        parts = [await m.create("t", i) for i in range(partitions)]
        peak = 0
        for i in range(40):
            for k, p in enumerate(parts):
                await p.append(batch(b"%d-%d" % (k, i), b"x" * 300))
                peak = max(peak, m.handles.open_count)
        assert all(len(p.log.segments) >= 10 for p in parts)
        assert peak <= bound + partitions  # the active (pinned) segments may exceed the bound

        # Reads of old segments, interleaved across partitions, reopen evicted files.
        rng = random.Random(7)
        for _ in range(200):
            k = rng.randrange(partitions)
            p = parts[k]
            offset = rng.randrange(p.log_end_offset)
            r = await p.read(offset, 1)
            values = [rec.value for rec in decode_records(r.data)]
            assert r.first_offset <= offset < r.next_offset
            assert values[0] == b"%d-%d" % (k, r.first_offset // 2)
            assert m.handles.open_count <= bound + partitions
        for k, p in enumerate(parts):
            got = await read_values(p)
            assert [v for _, v in got][::2] == [b"%d-%d" % (k, i) for i in range(40)]
            assert m.handles.open_count <= bound + partitions
        await m.close()
        assert m.handles.open_count == 0

        # Recovery after a crash opens every segment, one after another, within the bound.
        m = make_manager(tmp_path, max_open_handles=bound, config_for=lambda _t: config)
        await m.start(background=False)
        assert m.handles.open_count <= bound + partitions
        for k in range(partitions):
            assert len(await read_values(m.get("t", k))) == 80
        abandon(m)
        m = make_manager(tmp_path, max_open_handles=bound, config_for=lambda _t: config)
        await m.start(background=False)
        assert not m.was_clean_shutdown
        assert m.handles.open_count <= bound + partitions
        for k in range(partitions):
            assert len(await read_values(m.get("t", k))) == 80
        await m.close()

    run(main)


# -------------------------------------------------------------------------------------------
# background work with a manual clock: retention, segment.ms, flush.ms, checkpoints
# -------------------------------------------------------------------------------------------


def test_retention_by_time(tmp_path: Path) -> None:
    clock = ManualClock(T0)
    config = LogConfig(segment_bytes=1024, retention_ms=10_000)

    async def main() -> None:
        m = LogManager(tmp_path, clock=clock, config_for=lambda _t: config)
        await m.start(background=False)
        p = await m.create("t", 0)
        for i in range(20):  # old data: ~6 segments
            await p.append(batch(b"old-%d" % i, b"x" * 200, timestamp=clock.now_ms()))
        old_end = p.log_end_offset
        clock.advance(6_000)
        for i in range(20):  # newer data
            await p.append(batch(b"new-%d" % i, b"x" * 200, timestamp=clock.now_ms()))
        segments_before = [s.base_offset for s in p.log.segments]
        files_before = {s.log_path for s in p.log.segments}

        assert [r.deleted_segments for r in await m.run_retention()] == [0]  # nothing is old yet
        clock.advance(5_000)  # old data is now 11 s old, new data 5 s
        (result,) = await m.run_retention()
        assert result.deleted_segments > 0
        start = p.log_start_offset
        assert result.log_start_offset == start == p.log.segments[0].base_offset
        assert start <= old_end, "only segments wholly older than retention.ms go"
        assert all(s.base_offset in segments_before for s in p.log.segments)
        for path in files_before - {s.log_path for s in p.log.segments}:
            assert not path.exists() and not path.with_suffix(".index").exists()
        with pytest.raises(OffsetOutOfRangeError):
            await p.read(start - 1, 1 << 20)
        values = [v for _, v in await read_values(p)]
        assert values[-40::2] == [b"new-%d" % i for i in range(20)]

        # Everything expired: the active segment is rolled and deleted too; appends continue.
        clock.advance(60_000)
        await m.run_retention()
        end = p.log_end_offset
        assert p.log_start_offset == end == 80
        assert p.log.size_bytes == 0
        assert (await p.append(batch(b"fresh", timestamp=clock.now_ms()))).base_offset == 80
        await m.close()

        # The new log start survives a restart (it is checkpointed).
        m = LogManager(tmp_path, clock=clock, config_for=lambda _t: config)
        await m.start(background=False)
        assert m.get("t", 0).log_start_offset == 80
        assert await read_values(m.get("t", 0)) == [(80, b"fresh")]
        await m.close()

    run(main)


def test_retention_by_size_and_high_watermark(tmp_path: Path) -> None:
    clock = ManualClock(T0)
    config = LogConfig(segment_bytes=1024, retention_bytes=3000, retention_ms=-1)

    async def main() -> None:
        m = LogManager(
            tmp_path, clock=clock, config_for=lambda _t: config, auto_high_watermark=False
        )
        await m.start(background=False)
        p = await m.create("t", 0)
        for i in range(30):
            await p.append(batch(b"%d" % i, b"x" * 300, timestamp=clock.now_ms()))
        assert p.log.size_bytes > 3000
        # Nothing below the high watermark (0): nothing may go.
        assert (await m.run_retention())[0].deleted_segments == 0
        p.set_high_watermark(p.log_end_offset)
        (result,) = await m.run_retention()
        assert result.deleted_segments > 0
        assert 3000 <= p.log.size_bytes < 3000 + 1024
        values = [v for _, v in await read_values(p)][::2]
        assert values == [b"%d" % i for i in range(p.log_start_offset // 2, 30)]
        await m.close()

    run(main)


@pytest.mark.skipif(not Path("/proc/self/fd").is_dir(), reason="needs /proc/self/fd")
def test_retention_while_a_flush_is_running(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The flusher and the janitor run concurrently in worker threads. A segment can be both
    unflushed (above the recovery point) and deletable (below the high watermark, which a
    standalone broker moves at once, and older than retention.ms, e.g. replayed old data).
    A slow fsync of such a segment must not make retention fail."""
    clock = ManualClock(T0)
    config = LogConfig(segment_bytes=1024, retention_ms=1000)
    entered, release = threading.Event(), threading.Event()

    def slow_first_segment_sync(real: Callable[[int], None]) -> Callable[[int], None]:
        """Wrap os.fsync/os.fdatasync: the first sync of a .log file off the event loop
        thread blocks until ``release`` (a slow disk), with the segment's handle in use."""

        def sync(fd: int) -> None:
            off_loop = threading.current_thread() is not threading.main_thread()
            first = off_loop and not entered.is_set()
            if first and os.readlink(f"/proc/self/fd/{fd}").endswith(".log"):
                entered.set()
                release.wait(10)
            real(fd)

        return sync

    async def main() -> None:
        m = LogManager(tmp_path, clock=clock, config_for=lambda _t: config)
        await m.start(background=False)
        p = await m.create("t", 0)
        for i in range(10):
            await p.append(batch(b"%d" % i, b"x" * 300, timestamp=clock.now_ms()))
        files = [s.log_path for s in p.log.segments]
        assert p.log.recovery_point == 0 and p.high_watermark == 20 and len(files) > 3
        monkeypatch.setattr(os, "fsync", slow_first_segment_sync(os.fsync))
        monkeypatch.setattr(os, "fdatasync", slow_first_segment_sync(os.fdatasync))
        clock.advance(2000)  # flush.ms (1 s) and retention.ms (1 s) have both passed
        flushing = asyncio.create_task(m.flush_due())
        assert await asyncio.to_thread(entered.wait, 10)
        try:
            (result,) = await m.run_retention()
        finally:
            release.set()
            await flushing
        assert result.deleted_segments == len(files)
        assert p.log_start_offset == p.log_end_offset == 20
        assert not any(f.exists() for f in files)
        await m.close()

    run(main)


def test_segment_ms_roll(tmp_path: Path) -> None:
    clock = ManualClock(T0)
    config = LogConfig(segment_ms=60_000)

    async def main() -> None:
        m = LogManager(tmp_path, clock=clock, config_for=lambda _t: config)
        await m.start(background=False)
        p = await m.create("t", 0)
        await p.append(batch(b"a", timestamp=clock.now_ms()))
        await m.run_retention()
        assert len(p.log.segments) == 1
        clock.advance(60_000)
        await m.run_retention()
        assert [s.base_offset for s in p.log.segments] == [0, 1]
        await m.run_retention()  # an empty active segment is never rolled
        assert len(p.log.segments) == 2
        await m.close()

    run(main)


def test_flush_due_honours_flush_ms(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    clock = ManualClock(T0)
    flushes = 0
    real_flush = PartitionLog.flush

    def counting_flush(self: PartitionLog) -> int:
        nonlocal flushes
        flushes += 1
        return real_flush(self)

    monkeypatch.setattr(PartitionLog, "flush", counting_flush)

    async def main() -> None:
        m = LogManager(
            tmp_path,
            clock=clock,
            config_for=lambda t: LogConfig(flush_ms=0 if t == "eager" else 1000),
        )
        await m.start(background=False)
        p = await m.create("t", 0)
        assert await m.flush_due() == 0  # nothing to flush
        await p.append(batch(b"a"))
        assert p.log.unflushed_records == 1
        assert await m.flush_due() == 0 and flushes == 0
        clock.advance(999)
        assert await m.flush_due() == 0 and flushes == 0
        clock.advance(1)
        assert await m.flush_due() == 1 and flushes == 1
        assert p.log.recovery_point == 1 and p.log.unflushed_records == 0
        assert await m.flush_due() == 0  # flushed: not due however late
        clock.advance(5000)
        assert await m.flush_due() == 0 and flushes == 1
        # The interval counts from the last flush.
        await p.append(batch(b"b"))
        assert await m.flush_due() == 1  # 5 s since the last flush
        await p.append(batch(b"c"))
        clock.advance(500)
        assert await m.flush_due() == 0
        clock.advance(500)
        assert await m.flush_due() == 1 and p.log.recovery_point == 3
        # flush.ms=0: due at once, and only the partitions that need it.
        eager = await m.create("eager", 0)
        await eager.append(batch(b"x"))
        assert await m.flush_due() == 1 and eager.log.recovery_point == 1
        await m.close()

    run(main)


def test_write_checkpoints_only_when_changed(tmp_path: Path) -> None:
    async def main() -> None:
        m = make_manager(tmp_path)
        await m.start(background=False)
        p = await m.create("t", 0)
        await m.create("t", 1)
        assert await m.write_checkpoints() == 2
        assert await m.write_checkpoints() == 0
        await p.append(batch(b"x"), durable=True)
        assert await m.write_checkpoints() == 1
        assert await m.write_checkpoints() == 0
        await m.close()

    run(main)


def test_background_tasks_start_and_stop(tmp_path: Path) -> None:
    """With real background tasks (flusher every 10 ms, flush.ms=0) unflushed data gets
    flushed without anyone asking; close() cancels the tasks cleanly."""

    async def main() -> None:
        m = LogManager(
            tmp_path, config_for=lambda _t: LogConfig(flush_ms=0), flush_check_interval_ms=10
        )
        await m.start()
        p = await m.create("t", 0)
        await p.append(batch(b"x"))
        for _ in range(200):
            if p.log.recovery_point == 1:
                break
            await asyncio.sleep(0.01)
        assert p.log.recovery_point == 1
        await m.close()
        assert not m.started

    run(main)


def test_waiters_beyond_the_bound_answer_at_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("core_log.manager.MAX_WAITERS_PER_PARTITION", 3)

    async def main() -> None:
        manager = LogManager(tmp_path)
        await manager.start(background=False)
        p = await manager.create("bounded", 0)
        parked = [asyncio.create_task(p.wait_for(0, 30)) for _ in range(3)]
        await asyncio.sleep(0.05)
        assert p.waiter_count == 3
        started = time.monotonic()
        assert await p.wait_for(0, 30) is False  # over the bound: no fourth parked future
        assert time.monotonic() - started < 5
        await p.append(build_batch([Record(b"x")]))
        assert await asyncio.gather(*parked) == [True, True, True]
        await manager.close()

    asyncio.run(main())


# -------------------------------------------------------------------------------------------
# the event loop never waits for storage: busy locks, rolls, timestamp lookups, pools
# -------------------------------------------------------------------------------------------

HOLD_S = 5.0  # how long a stand-in "fsync" holds the partition lock at most


def hold_lock(log: PartitionLog, release: threading.Event) -> None:
    """Hold ``log``'s lock in another thread (as a roll or a compaction swap does across an
    fsync) until ``release`` is set or HOLD_S passes; return once it is held."""
    held = threading.Event()

    def hold() -> None:
        with log._lock:
            held.set()
            release.wait(HOLD_S)

    threading.Thread(target=hold, daemon=True).start()
    held.wait()


@pytest.mark.parametrize("op", ["append", "read", "high_watermark", "retention", "config"])
def test_the_loop_never_waits_for_a_busy_partition_lock(tmp_path: Path, op: str) -> None:
    """A small append or read, moving the high watermark, or a retention pass (rolls, deletes,
    producer expiry) while a worker holds the lock:
    the loop stays free (the work goes to a worker, or takes no lock) and the result is right
    once the lock is free. Before, the loop blocked until the worker let go (HOLD_S here)."""

    async def main() -> None:
        manager = make_manager(tmp_path)
        await manager.start(background=False)
        p = await manager.create("t", 0)
        await p.append(batch(b"a"))
        release = threading.Event()
        hold_lock(p.log, release)
        start = time.monotonic()
        task: asyncio.Future[object]
        if op == "append":
            task = asyncio.ensure_future(p.append(batch(b"b")))
        elif op == "read":
            task = asyncio.ensure_future(p.read(0, 1000))
        elif op == "retention":
            task = asyncio.ensure_future(manager.run_retention())
        elif op == "config":  # PATCH /v1/topics/{t}/configs
            changed = LogConfig.from_dict({"retention.ms": 1234})
            task = asyncio.ensure_future(manager.update_config("t", changed))
        else:
            p.log._high_watermark = 0
            p.set_high_watermark(1)
            assert p.high_watermark == 1
            task = asyncio.ensure_future(asyncio.sleep(0))
        await asyncio.sleep(0.05)
        assert time.monotonic() - start < HOLD_S / 2, "the event loop waited for the lock"
        release.set()
        await task
        assert [v for _, v in await read_values(p)] == ([b"a", b"b"] if op == "append" else [b"a"])
        if op == "config":
            assert p.log.config.retention_ms == 1234
        await manager.close()

    run(main)


def test_a_segment_roll_during_a_small_append_runs_off_the_loop(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A roll writes the producer snapshot and fsyncs it: never on the event loop thread."""

    async def main() -> None:
        manager = make_manager(tmp_path)
        await manager.start(background=False)
        p = await manager.create("t", 0, LogConfig.from_dict({"segment.bytes": 100}))
        threads: list[int] = []
        roll = p.log._roll

        def spy(base_offset: int) -> object:
            threads.append(threading.get_ident())
            return roll(base_offset)

        monkeypatch.setattr(p.log, "_roll", spy)
        for i in range(5):
            await p.append(batch(b"x" * 60, str(i).encode()))
        assert len(p.log.segments) >= 3 and threads
        assert threading.get_ident() not in threads
        assert [v for _, v in await read_values(p)][-1] == b"4"
        await manager.close()

    run(main)


def test_timestamp_lookups_run_in_the_reads_pool(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async def main() -> None:
        manager = make_manager(tmp_path)
        await manager.start(background=False)
        p = await manager.create("t", 0)
        await p.append(batch(b"a", timestamp=T0))
        await p.append(batch(b"b", timestamp=T0 + 10))
        names: list[str] = []
        lookup = p.log.offset_for_timestamp

        def spy(ts: int) -> int | None:
            names.append(threading.current_thread().name)
            return lookup(ts)

        monkeypatch.setattr(p.log, "offset_for_timestamp", spy)
        assert await p.offset_for_timestamp(T0 + 5) == 1
        assert await p.offset_for_timestamp(T0 + 11) is None
        assert all(n.startswith("logbus-reads") for n in names) and len(names) == 2
        await manager.close()

    run(main)


def test_storage_work_has_its_own_pools_and_no_other_work_starves_it(tmp_path: Path) -> None:
    """Every thread of asyncio's default pool busy (here: blocked) — fsyncs, large reads,
    compaction and off-loop appends still run, each in its named pool; closing the manager
    stops the pools. Before, all of them queued behind the default pool's workers."""

    async def main() -> None:
        manager = make_manager(tmp_path)
        await manager.start(background=False)
        p = await manager.create("t", 0, LogConfig.from_dict({"cleanup.policy": "compact"}))
        unblock = threading.Event()
        loop = asyncio.get_running_loop()
        default_workers = min(32, (os.cpu_count() or 1) + 4)
        blockers = [asyncio.to_thread(unblock.wait, HOLD_S) for _ in range(default_workers + 2)]
        blocked = asyncio.gather(*blockers)
        await asyncio.sleep(0.05)
        start = loop.time()
        big = batch(*[os.urandom(1024) for _ in range(300)])  # > OFF_LOOP_IO_BYTES: off the loop
        await p.append(big, durable=True)
        assert len((await p.read(0, 1 << 20)).data) == len(big)
        await manager.run_cleaner()
        assert loop.time() - start < HOLD_S / 2, "storage work waited for the default pool"
        unblock.set()
        await blocked
        names = {t.name.split("_")[0] for t in threading.enumerate()}
        assert {"logbus-fsync", "logbus-reads", "logbus-appends", "logbus-compaction"} <= names
        await manager.close()
        assert manager.pools.closed

    run(main)


def test_a_retention_pass_takes_no_partition_lock_on_the_loop(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Rolls, deletions and producer expiry all take the partition lock: none on the loop."""

    async def main() -> None:
        manager = make_manager(tmp_path)
        await manager.start(background=False)
        p = await manager.create("t", 0)
        await p.append(batch(b"a"))
        threads: list[int] = []
        for name in ("roll_if_expired", "apply_retention", "expire_producers"):
            method = getattr(p.log, name)

            def spy(*args: Any, _method: Any = method) -> Any:
                threads.append(threading.get_ident())
                return _method(*args)

            monkeypatch.setattr(p.log, name, spy)
        await manager.run_retention()
        assert len(threads) == 3 and threading.get_ident() not in threads
        await manager.close()

    run(main)
