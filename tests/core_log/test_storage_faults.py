"""Disk faults, injected through core_log.fileio (issue 10: nothing acknowledged is lost).

* A full disk on an append is undone: that append fails (retriable), nothing changes, and the
  partition works again once space is freed.
* A failed fsync (or a write that cannot be undone) takes the log directory offline: every
  partition answers KAFKA_STORAGE_ERROR, pending acknowledgements fail, the recovery point
  never moves past the failure, and the next start recovers.
"""

from __future__ import annotations

import asyncio
import logging
import os
import threading
from pathlib import Path

import pytest

from core_log.batch import Record, build_batch
from core_log.config import LogConfig
from core_log.errors import ErrorCode, KafkaStorageError, StorageFullError
from core_log.manager import CLEAN_SHUTDOWN_FILE, LogManager
from tests.core_log.faults import EDQUOT, EIO, ENOSPC, faulty_files
from tests.core_log.test_manager import T0, batch, make_manager, read_values, run


def segment_bytes(m: LogManager, topic: str, partition: int) -> int:
    return sum(os.path.getsize(s.log_path) for s in m.get(topic, partition).log.segments)


@pytest.mark.parametrize("code", [ENOSPC, EDQUOT])
def test_full_disk_append_fails_alone_and_changes_nothing(tmp_path: Path, code: int) -> None:
    async def main() -> None:
        m = make_manager(tmp_path)
        await m.start(background=False)
        p = await m.create("t", 0)
        await p.append(batch(b"a0", b"a1"), durable=True)
        size = segment_bytes(m, "t", 0)
        with faulty_files() as files:
            files.write_errors = [code]
            with pytest.raises(StorageFullError) as e:
                await p.append(batch(b"lost"), durable=True)
            assert e.value.code is ErrorCode.KAFKA_STORAGE_ERROR and e.value.retriable
            assert (p.log_end_offset, p.high_watermark) == (2, 2)
            assert segment_bytes(m, "t", 0) == size
            assert not m.offline and m.log_dir.storage_errors == 1
            # Space freed: the same partition takes the next append at the next offset.
            r = await p.append(batch(b"b"), durable=True)
        assert r.base_offset == 2
        assert await read_values(p) == [(0, b"a0"), (1, b"a1"), (2, b"b")]
        await m.close()
        assert (tmp_path / CLEAN_SHUTDOWN_FILE).exists()

    run(main)


@pytest.mark.parametrize("rolls", [False, True])
def test_full_disk_in_the_middle_of_a_request_undoes_the_whole_request(
    tmp_path: Path, rolls: bool
) -> None:
    """Batches that fit the active segment go in one write, which fails whole. With segments
    of 160 bytes the second batch needs a new one: the first lands in the old segment, the
    second fails in the new, and the request is undone across the roll."""
    config = LogConfig(segment_bytes=160) if rolls else LogConfig()

    async def main() -> None:
        m = make_manager(tmp_path, config_for=lambda _t: config)
        await m.start(background=False)
        p = await m.create("t", 0)
        await p.append(batch(b"a"))
        size = segment_bytes(m, "t", 0)
        with faulty_files() as files:
            # the first batch lands, the second does not (or the one write fails)
            files.write_errors = [None, ENOSPC] if rolls else [ENOSPC]
            with pytest.raises(StorageFullError):
                await p.append(batch(b"x1", b"x2") + batch(b"x3"))
            assert files.write_errors == []  # as many writes as planned
        assert (p.log_end_offset, p.high_watermark) == (1, 1)
        assert segment_bytes(m, "t", 0) == size
        r = await p.append(batch(b"b"))
        assert r.base_offset == 1
        assert await read_values(p) == [(0, b"a"), (1, b"b")]
        await m.close()

    run(main)


def test_write_failure_that_cannot_be_undone_takes_the_directory_offline(
    tmp_path: Path,
) -> None:
    async def main() -> None:
        m = make_manager(tmp_path)
        await m.start(background=False)
        p = await m.create("t", 0)
        await p.append(batch(b"a"))
        with faulty_files() as files:
            files.write_errors = [ENOSPC]
            files.truncate_error = EIO
            with pytest.raises(KafkaStorageError) as e:
                await p.append(batch(b"torn"))
            assert not isinstance(e.value, StorageFullError)
        assert m.offline
        with pytest.raises(KafkaStorageError, match="offline"):
            await p.append(batch(b"later"))
        await m.close()

    run(main)


def test_failed_fsync_takes_the_directory_offline_until_restart(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    async def main() -> None:
        m = make_manager(tmp_path)
        await m.start(background=False)
        p0, p1 = await m.create("t", 0), await m.create("t", 1)
        await p0.append(batch(b"acked"), durable=True)
        await p1.append(batch(b"acked"), durable=True)
        recovery_point = p0.log.recovery_point
        with faulty_files() as files:
            files.datasync_errors = [EIO]
            with pytest.raises(KafkaStorageError):
                await p0.append(batch(b"unsynced"), durable=True)
        assert m.offline
        # The disk "works" again: no fsync may now claim what the failed one lost.
        assert p0.log.recovery_point == recovery_point
        for call in (
            p0.append(batch(b"x"), durable=True),
            p1.append(batch(b"x")),
            p0.sync(p0.log_end_offset),
            p1.read(0, 1 << 20),
            p1.wait_for(5, 0.01),
        ):
            with pytest.raises(KafkaStorageError) as e:
                await call
            assert e.value.retriable
        assert await m.flush_due() == 0 and await m.write_checkpoints() == 0
        assert p0.log.recovery_point == recovery_point
        with pytest.raises(KafkaStorageError):
            await m.create("u", 0)
        await m.close()
        assert not (tmp_path / CLEAN_SHUTDOWN_FILE).exists()  # the next start recovers

        m = make_manager(tmp_path)
        await m.start(background=False)
        assert not m.was_clean_shutdown and not m.offline
        p0 = m.get("t", 0)
        assert (await read_values(p0))[0] == (0, b"acked")
        assert (await p0.append(batch(b"after"), durable=True)).base_offset == p0.log_end_offset - 1
        await m.close()

    with caplog.at_level(logging.ERROR, logger="logbus.storage"):
        run(main)
    offline_lines = [r for r in caplog.records if "is offline" in r.getMessage()]
    assert len(offline_lines) == 1 and offline_lines[0].levelno == logging.ERROR
    assert "Input/output error" in offline_lines[0].getMessage()


def test_pending_acks_fail_when_the_directory_goes_offline(tmp_path: Path) -> None:
    """Appends waiting for one shared fsync all fail with it; a durable append on another
    partition whose own fsync succeeds after the failure is not acknowledged either, and a
    long-poll is answered at once."""

    async def main() -> None:
        m = make_manager(tmp_path)
        await m.start(background=False)
        p0, p1 = await m.create("t", 0), await m.create("t", 1)
        with faulty_files() as files:
            files.datasync_errors = [EIO]
            files.datasync_match = "t-"  # one of the two fsyncs fails, the other succeeds
            files.gate = gate = threading.Event()
            first = asyncio.create_task(p0.append(batch(b"1"), durable=True))
            await asyncio.to_thread(files.wait_for_datasync)  # p0's fsync started
            second = asyncio.create_task(p0.append(batch(b"2"), durable=True))
            other = asyncio.create_task(p1.append(batch(b"3"), durable=True))
            await asyncio.to_thread(files.wait_for_datasync)  # p1's fsync started
            poll = asyncio.create_task(p1.wait_for(10, 30))
            await asyncio.sleep(0)
            gate.set()
            results = await asyncio.gather(first, second, other, poll, return_exceptions=True)
        assert all(isinstance(r, KafkaStorageError) for r in results), results
        assert m.offline
        await m.close()

    run(main)


def test_background_flush_failure_is_logged_once_and_takes_the_directory_offline(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    async def main() -> None:
        m = make_manager(tmp_path)
        await m.start(background=False)
        p = await m.create("t", 0)
        await p.append(batch(b"a"))
        m.clock.advance(5_000)  # type: ignore[attr-defined]
        with faulty_files() as files:
            files.datasync_errors = [EIO]
            assert await m.flush_due() == 1  # no exception out of the flusher
        assert m.offline and m.log_dir.storage_errors == 1
        assert await m.flush_due() == 0
        await m.close()

    with caplog.at_level(logging.ERROR, logger="logbus.storage"):
        run(main)
    assert len([r for r in caplog.records if "is offline" in r.getMessage()]) == 1


def test_full_disk_on_an_index_write_keeps_the_directory_online(tmp_path: Path) -> None:
    """An index only speeds lookups up: its entries wait for the next flush."""

    async def main() -> None:
        every_batch_indexed = LogConfig(index_interval_bytes=0)
        m = make_manager(tmp_path, config_for=lambda _t: every_batch_indexed)
        await m.start(background=False)
        p = await m.create("t", 0)
        await p.append(batch(b"a"), durable=True)
        await p.append(batch(b"b"))
        index = p.log.segments[0].offset_index.path
        assert os.path.getsize(index) == 8
        with faulty_files() as files:
            files.index_write_errors = [ENOSPC]
            await p.sync(p.log_end_offset)
            assert files.index_write_errors == []  # the index write did fail
        assert not m.offline and p.log.recovery_point == 2
        assert os.path.getsize(index) == 8  # cut back to whole entries
        await m.close()  # the pending entry goes out now
        assert os.path.getsize(index) == 16

    run(main)


def test_io_error_on_an_append_takes_the_directory_offline_even_when_undone(
    tmp_path: Path,
) -> None:
    """EIO says the disk is failing, not full: the append is cut off, but nothing written to
    that directory before can be trusted either."""

    async def main() -> None:
        m = make_manager(tmp_path)
        await m.start(background=False)
        p = await m.create("t", 0)
        size = segment_bytes(m, "t", 0)
        with faulty_files() as files:
            files.write_errors = [EIO]
            with pytest.raises(KafkaStorageError) as e:
                await p.append(batch(b"x"))
            assert not isinstance(e.value, StorageFullError)
        assert m.offline and segment_bytes(m, "t", 0) == size
        await m.close()

    run(main)


def test_full_disk_on_the_producer_snapshot_of_a_roll_fails_only_that_append(
    tmp_path: Path,
) -> None:
    async def main() -> None:
        tiny_segments = LogConfig(segment_bytes=200)
        m = make_manager(tmp_path, config_for=lambda _t: tiny_segments)
        await m.start(background=False)
        p = await m.create("t", 0)

        def idempotent(seq: int) -> bytes:
            records = [Record(b"v" * 100, timestamp=T0)]
            return build_batch(records, producer_id=7, producer_epoch=0, base_sequence=seq)

        await p.append(idempotent(0))
        with faulty_files() as files:
            files.index_write_errors = [ENOSPC]  # the snapshot written when the segment rolls
            with pytest.raises(StorageFullError):
                await p.append(idempotent(1))
            assert files.index_write_errors == []
        assert not m.offline and p.log_end_offset == 1
        assert (await p.append(idempotent(1))).base_offset == 1  # space freed: same sequence
        assert [v for _, v in await read_values(p)] == [b"v" * 100] * 2
        await m.close()

    run(main)
