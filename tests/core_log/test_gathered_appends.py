"""Small producer appends that arrive together are written together (Partition._gather).

Each request still gets its own offsets, its own validation error, and — with ``durable`` —
returns only once fsynced; a run that cannot go inline is queued in order."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from core_log import fileio
from core_log.batch import (
    COMPRESSION_MASK,
    Record,
    any_compressed,
    any_compressed_or_producer,
    build_batch,
    scan_batches,
)
from core_log.compression import Compression
from core_log.config import LogConfig
from core_log.errors import (
    CorruptRecordError,
    KafkaStorageError,
    RecordTooLargeError,
    StorageFullError,
)
from core_log.log import AppendResult, PartitionLog
from core_log.manager import LogManager, Partition
from tests.core_log.faults import EIO, ENOSPC, faulty_files
from tests.core_log.test_manager import T0, batch, make_manager, read_values, run


async def started(tmp_path: Path, config: LogConfig | None = None) -> tuple[LogManager, Partition]:
    """A started manager and its partition ``t-0`` with one batch in it: the leader epoch is
    stored, so small appends go inline (and gather) from now on."""
    m = (
        make_manager(tmp_path)
        if config is None
        else make_manager(tmp_path, config_for=lambda _t: config)
    )
    await m.start(background=False)
    p = await m.create("t", 0)
    await p.append(batch(b"first"))
    return m, p


class CountingFiles(fileio.FileOps):
    def __init__(self) -> None:
        self.writes = 0

    def pwritev(self, fd: int, buffers: Any, offset: int) -> int:
        self.writes += 1
        return super().pwritev(fd, buffers, offset)


def test_concurrent_appends_share_one_write_and_keep_their_offsets(tmp_path: Path) -> None:
    async def main() -> None:
        m, p = await started(tmp_path)
        with fileio.injected(CountingFiles()) as files:
            assert isinstance(files, CountingFiles)
            sizes = [1 + i % 3 for i in range(64)]
            results = await asyncio.gather(
                *(
                    p.append(batch(*(b"r%d-%d" % (i, j) for j in range(n))))
                    for i, n in enumerate(sizes)
                )
            )
            assert files.writes == 1, f"{files.writes} writes for 64 appends"
        values = dict(await read_values(p))
        spans = sorted((r.base_offset, r.last_offset) for r in results)
        expected = 1
        for base, last in spans:
            assert base == expected
            expected = last + 1
        assert expected == p.log_end_offset == p.high_watermark
        for i, (n, r) in enumerate(zip(sizes, results, strict=True)):
            assert (r.records, r.batches, r.last_offset - r.base_offset + 1) == (n, 1, n)
            assert [values[r.base_offset + j] for j in range(n)] == [
                b"r%d-%d" % (i, j) for j in range(n)
            ]
        await m.close()

    run(main)


def test_a_bad_request_fails_alone(tmp_path: Path) -> None:
    """A corrupt batch and one over max.message.bytes among good ones: only they fail."""
    config = LogConfig(max_message_bytes=200)

    async def main() -> None:
        m, p = await started(tmp_path, config)
        corrupt = bytearray(batch(b"x"))
        corrupt[-1] ^= 0xFF
        large = batch(b"y" * 300)
        outcomes = await asyncio.gather(
            p.append(batch(b"a")),
            p.append(bytes(corrupt)),
            p.append(batch(b"b")),
            p.append(large),
            p.append(batch(b"c")),
            return_exceptions=True,
        )
        assert isinstance(outcomes[1], CorruptRecordError)
        assert isinstance(outcomes[3], RecordTooLargeError)
        values = dict(await read_values(p))
        assert sorted(values.values()) == [b"a", b"b", b"c", b"first"]
        for i, value in ((0, b"a"), (2, b"b"), (4, b"c")):
            result = outcomes[i]
            assert not isinstance(result, BaseException)
            assert values[result.base_offset] == value
        await m.close()

    run(main)


def test_idempotent_batches_keep_their_own_append(tmp_path: Path) -> None:
    """A producer's batch in the same turn as plain ones: its duplicate is still recognised
    and answered with the original offsets."""

    def producer_batch(seq: int) -> bytes:
        return build_batch(
            [Record(b"p%d" % seq, timestamp=T0)], producer_id=7, producer_epoch=0, base_sequence=seq
        )

    async def main() -> None:
        m, p = await started(tmp_path)
        first = await asyncio.gather(
            p.append(batch(b"a")), p.append(producer_batch(0)), p.append(batch(b"b"))
        )
        again = await asyncio.gather(p.append(batch(b"c")), p.append(producer_batch(0)))
        assert again[1].duplicate and again[1].base_offset == first[1].base_offset
        values = dict(await read_values(p))
        assert sorted(values.values()) == [b"a", b"b", b"c", b"first", b"p0"]
        await m.close()

    run(main)


def test_durable_and_plain_appends_in_one_turn(tmp_path: Path) -> None:
    """Durable appends return only once fsynced and share fsyncs; plain ones beside them are
    appended too, and the high watermark never passes what is unsynced."""
    flushes = 0
    real_flush = PartitionLog.flush

    def counting_flush(self: PartitionLog) -> int:
        nonlocal flushes
        flushes += 1
        return real_flush(self)

    async def main() -> None:
        m, p = await started(tmp_path)

        async def durable(i: int) -> None:
            r = await p.append(batch(b"d%d" % i), durable=True)
            assert p.log.recovery_point > r.last_offset

        await asyncio.gather(
            *(durable(i) for i in range(32)), *(p.append(batch(b"p%d" % i)) for i in range(32))
        )
        assert 0 < flushes <= 4, f"{flushes} fsyncs for 32 durable appends"
        assert p.log_end_offset == 65
        assert p.high_watermark <= p.log.recovery_point or p.high_watermark == p.log_end_offset
        await m.close()

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(PartitionLog, "flush", counting_flush)
        run(main)


def test_a_run_that_must_roll_is_queued_in_order(tmp_path: Path) -> None:
    """Segments of ~1 KiB: a run of appends that does not fit the active segment goes through
    the queue (a roll), in arrival order, each with its own offsets."""
    config = LogConfig(segment_bytes=1024)

    async def main() -> None:
        m, p = await started(tmp_path, config)
        for round_ in range(5):
            results = await asyncio.gather(
                *(p.append(batch(b"%d-%d" % (round_, i) + b"x" * 40)) for i in range(30))
            )
            values = dict(await read_values(p))
            for i, r in enumerate(results):
                assert values[r.base_offset] == b"%d-%d" % (round_, i) + b"x" * 40
        assert len(p.log.segments) > 5
        assert p.log_end_offset == 151
        await m.close()

    run(main)


def test_a_full_disk_fails_the_whole_run_and_appends_nothing(tmp_path: Path) -> None:
    async def main() -> None:
        m, p = await started(tmp_path)
        with faulty_files() as files:
            files.write_errors = [ENOSPC]
            outcomes = await asyncio.gather(
                *(p.append(batch(b"v%d" % i)) for i in range(10)), return_exceptions=True
            )
        assert all(isinstance(o, StorageFullError) for o in outcomes), outcomes
        assert m.log_dir.storage_errors == 1  # one failed write, counted once for its run
        assert p.log_end_offset == 1
        r = await p.append(batch(b"after"))
        assert r.base_offset == 1
        assert dict(await read_values(p)) == {0: b"first", 1: b"after"}
        await m.close()

    run(main)


async def durable_append(p: Partition, value: bytes) -> AppendResult:
    """A durable append that checks, the moment it is answered, that an fsync covers it and
    the high watermark passed it."""
    r = await p.append(batch(value), durable=True)
    assert p.log.recovery_point > r.last_offset
    assert p.high_watermark > r.last_offset
    return r


def test_a_durable_run_is_answered_after_the_fsync_that_covers_it(tmp_path: Path) -> None:
    """While the run's one fsync is held, no request of it is answered and the high watermark
    stays below it; once it ends every request has its own offsets, with no wait of its own
    (``Partition.sync``: the shield, callback and second resume each request used to pay)."""
    syncs = 0
    real_sync = Partition.sync

    async def counting_sync(self: Partition, offset: int) -> None:
        nonlocal syncs
        syncs += 1
        await real_sync(self, offset)

    async def main() -> None:
        m, p = await started(tmp_path)
        with faulty_files() as files:
            files.gate = gate = threading.Event()
            tasks = [asyncio.create_task(durable_append(p, b"d%d" % i)) for i in range(16)]
            await asyncio.to_thread(files.wait_for_datasync)
            assert p.log_end_offset == 17  # written as one run ...
            assert p.high_watermark == 1 and not any(t.done() for t in tasks)  # ... not acked
            gate.set()
            results = await asyncio.gather(*tasks)
            assert files.datasyncs == 1
        assert syncs == 0
        assert [(r.base_offset, r.last_offset) for r in results] == [(i, i) for i in range(1, 17)]
        values = dict(await read_values(p))
        assert [values[r.base_offset] for r in results] == [b"d%d" % i for i in range(16)]
        await m.close()

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(Partition, "sync", counting_sync)
        run(main)


def test_a_run_written_during_an_fsync_waits_for_the_next_one(tmp_path: Path) -> None:
    async def main() -> None:
        m, p = await started(tmp_path)
        with faulty_files() as files:
            files.gate = gate = threading.Event()
            first = [asyncio.create_task(durable_append(p, b"a%d" % i)) for i in range(4)]
            await asyncio.to_thread(files.wait_for_datasync)  # the first run's fsync
            second = [asyncio.create_task(durable_append(p, b"b%d" % i)) for i in range(4)]
            plain = asyncio.create_task(p.append(batch(b"plain")))
            assert (await plain).base_offset == 9  # acks=1 beside it: answered, not visible
            assert p.log_end_offset == 10 and p.high_watermark == 1
            gate.set()
            results = await asyncio.gather(*first, *second)
            assert files.datasyncs == 2
        assert [r.base_offset for r in results] == list(range(1, 9))
        assert p.high_watermark == p.log.recovery_point == 10
        await m.close()

    run(main)


def test_a_cancelled_waiter_leaves_the_shared_fsync_to_the_others(tmp_path: Path) -> None:
    """A caller that goes away while the fsync runs (a closed connection) is not answered;
    the fsync goes on, and the others of its run and a ``sync`` beside them are answered."""

    async def main() -> None:
        m, p = await started(tmp_path)
        with faulty_files() as files:
            files.gate = gate = threading.Event()
            tasks = [asyncio.create_task(durable_append(p, b"d%d" % i)) for i in range(4)]
            await asyncio.to_thread(files.wait_for_datasync)
            syncs = [asyncio.create_task(p.sync(p.log_end_offset)) for _ in range(2)]
            await asyncio.sleep(0)  # both wait on the fsync in flight
            tasks[1].cancel()
            syncs[0].cancel()
            gate.set()
            outcomes = await asyncio.gather(*tasks, *syncs, return_exceptions=True)
            assert files.datasyncs == 1
        assert isinstance(outcomes[1], asyncio.CancelledError)
        assert isinstance(outcomes[4], asyncio.CancelledError) and outcomes[5] is None
        assert [r.base_offset for r in outcomes[:4] if isinstance(r, AppendResult)] == [1, 3, 4]
        assert p.log.recovery_point == p.high_watermark == 5
        await m.close()

    run(main)


def test_a_failed_fsync_fails_every_request_waiting_for_one(tmp_path: Path) -> None:
    """The run the failing fsync covered and the run waiting behind it fail; what an earlier
    fsync covered stays acknowledged, and a plain append was answered at once."""

    async def main() -> None:
        m = make_manager(tmp_path)
        await m.start(background=False)
        p = await m.create("t", 0)
        acked = await asyncio.gather(*(durable_append(p, b"ok%d" % i) for i in range(4)))
        with faulty_files() as files:
            files.gate = gate = threading.Event()
            files.datasync_errors = [EIO]
            covered = [
                asyncio.create_task(p.append(batch(b"x%d" % i), durable=True)) for i in range(4)
            ]
            await asyncio.to_thread(files.wait_for_datasync)
            behind = [
                asyncio.create_task(p.append(batch(b"y%d" % i), durable=True)) for i in range(4)
            ]
            plain = await p.append(batch(b"plain"))
            gate.set()
            outcomes = await asyncio.gather(*covered, *behind, return_exceptions=True)
        assert all(isinstance(o, KafkaStorageError) for o in outcomes), outcomes
        assert m.offline and m.log_dir.storage_errors == 1
        assert [r.base_offset for r in acked] == [0, 1, 2, 3] and plain.base_offset == 8
        assert p.log.recovery_point == 4 and p.high_watermark == 4
        await m.close()

    run(main)


@given(
    st.lists(
        st.tuples(
            st.binary(max_size=40),
            st.sampled_from([Compression.NONE, Compression.GZIP]),
            st.sampled_from([-1, 0, 7]),
        ),
        max_size=4,
    ),
    st.integers(0, 400),
    st.binary(max_size=80),
)
def test_header_walks_read_headers_as_scan_batches_does(
    specs: list[tuple[bytes, Compression, int]], cut: int, noise: bytes
) -> None:
    """The two- and three-field header walks that every small produce takes agree with the
    full one, on whole, cut and random buffers."""

    def by_scan(buf: bytes, producer: bool) -> bool:
        return any(
            h.attributes & COMPRESSION_MASK or (producer and h.producer_id >= 0)
            for _, h in scan_batches(buf)
        )

    def one(value: bytes, codec: Compression, pid: int) -> bytes:
        record = [Record(value, timestamp=T0)]
        if pid < 0:
            return build_batch(record, compression=codec)
        return build_batch(
            record, compression=codec, producer_id=pid, producer_epoch=0, base_sequence=0
        )

    whole = b"".join(one(v, c, pid) for v, c, pid in specs)
    for buf in (whole, whole[:cut], noise, whole + noise):
        assert any_compressed(buf) == by_scan(buf, False)
        assert any_compressed_or_producer(buf) == by_scan(buf, True)
