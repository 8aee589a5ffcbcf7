"""The data directory lock (core_log.datadir) and its use by LogManager."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest

from core_log.datadir import LOCK_FILE, DataDirInUseError, DataDirLock
from core_log.manager import CLEAN_SHUTDOWN_FILE, LogManager


def test_second_lock_fails_at_once_naming_the_holder(tmp_path: Path) -> None:
    first = DataDirLock(tmp_path / "d")
    first.acquire()
    with pytest.raises(DataDirInUseError) as e:
        DataDirLock(tmp_path / "d").acquire()
    assert f"pid {os.getpid()}" in str(e.value)
    assert str((tmp_path / "d").resolve()) in str(e.value)
    first.acquire()  # idempotent for the holder
    first.release()
    with DataDirLock(tmp_path / "d") as again:
        assert again.held
    assert (tmp_path / "d" / LOCK_FILE).exists()


def test_log_manager_on_a_locked_dir_touches_nothing(tmp_path: Path) -> None:
    async def scenario() -> None:
        first = LogManager(tmp_path, flush_check_interval_ms=10)
        await first.start(background=False)
        await first.create("t", 0)
        await first.close()
        assert (tmp_path / CLEAN_SHUTDOWN_FILE).exists()
        holder = DataDirLock(tmp_path)
        holder.acquire()
        second = LogManager(tmp_path)
        with pytest.raises(DataDirInUseError):
            await second.start(background=False)
        assert (tmp_path / CLEAN_SHUTDOWN_FILE).exists()  # not consumed by the loser
        holder.release()
        third = LogManager(tmp_path)
        await third.start(background=False)
        assert third.was_clean_shutdown
        with pytest.raises(DataDirInUseError):  # held by a started manager until close
            DataDirLock(tmp_path).acquire()
        await third.close()
        with DataDirLock(tmp_path) as free:
            assert free.held

    asyncio.run(scenario())
