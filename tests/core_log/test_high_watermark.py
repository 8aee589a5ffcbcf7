"""The standalone high watermark never passes data that must be fsynced first (issue 10).

An append that must be fsynced before it counts (``acks=all``, or the one that reaches
``flush.messages``) stays invisible until an fsync covers it, even when a later ``acks=1``
append lands behind it; the high watermark never moves backwards. The fsync is held back with
a gate in the injected file layer, so the interleaving is deterministic.
"""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path

from core_log.config import LogConfig
from core_log.manager import Partition
from tests.core_log.faults import faulty_files
from tests.core_log.test_manager import batch, make_manager, run


class Watch:
    """Every high watermark the partition shows, checked to never go down."""

    def __init__(self, p: Partition) -> None:
        self.p = p
        self.seen = [p.high_watermark]

    def now(self) -> int:
        hw = self.p.high_watermark
        assert hw >= self.seen[-1], f"high watermark moved back: {self.seen} -> {hw}"
        self.seen.append(hw)
        return hw


def test_acks1_append_does_not_expose_an_acks_all_append_waiting_for_its_fsync(
    tmp_path: Path,
) -> None:
    async def main() -> None:
        m = make_manager(tmp_path)
        await m.start(background=False)
        p = await m.create("t", 0)
        hw = Watch(p)
        with faulty_files() as files:
            files.gate = gate = threading.Event()
            durable = asyncio.create_task(p.append(batch(b"all-0", b"all-1"), durable=True))
            await asyncio.to_thread(files.wait_for_datasync)  # its fsync is running
            leader_only = await p.append(batch(b"one"))  # acks=1: answered without fsync
            assert leader_only.base_offset == 2
            # Offsets 0-1 are not on disk yet: nothing may be visible, however far the log is.
            assert p.log_end_offset == 3 and hw.now() == 0 and p.log.recovery_point == 0
            assert (await p.read(0, 1 << 20)).data == b""
            assert not await p.wait_for(0, 0.01)
            assert not durable.done()
            gate.set()
            result = await durable
        assert result.base_offset == 0
        # The acks=all answer comes with its records durable and visible; the acks=1 record
        # behind them needs no fsync under the default flush policy.
        assert p.log.recovery_point >= 2 and hw.now() == 3
        await m.close()

    run(main)


def test_flush_messages_one_keeps_the_high_watermark_at_the_recovery_point(
    tmp_path: Path,
) -> None:
    """``flush.messages=1``: every record is fsynced before it is visible, whatever the acks;
    an acks=1 or acks=0 answer then also waits for the fsync."""

    async def main() -> None:
        config = LogConfig(flush_messages=1)
        m = make_manager(tmp_path, config_for=lambda _t: config)
        await m.start(background=False)
        p = await m.create("t", 0)
        hw = Watch(p)
        with faulty_files() as files:
            files.gate = gate = threading.Event()
            first = asyncio.create_task(p.append(batch(b"a")))
            await asyncio.to_thread(files.wait_for_datasync)
            second = asyncio.create_task(p.append(batch(b"b")))
            await asyncio.sleep(0.01)
            assert p.log_end_offset == 2 and hw.now() == 0
            assert not first.done() and not second.done()
            gate.set()
            await asyncio.gather(first, second)
        assert hw.now() == p.log.recovery_point == 2
        await m.close()

    run(main)


def test_flush_messages_threshold_batch_waits_for_its_fsync_before_it_is_visible(
    tmp_path: Path,
) -> None:
    """``flush.messages=3``: the records before the threshold are visible at once (they are
    fsynced later, by ``flush.ms`` or the threshold); the append that reaches it is not until
    the fsync, and an acks=1 append behind it does not expose it."""

    async def main() -> None:
        config = LogConfig(flush_messages=3)
        m = make_manager(tmp_path, config_for=lambda _t: config)
        await m.start(background=False)
        p = await m.create("t", 0)
        hw = Watch(p)
        await p.append(batch(b"a"))
        assert hw.now() == 1 and p.log.recovery_point == 0
        with faulty_files() as files:
            files.gate = gate = threading.Event()
            threshold = asyncio.create_task(p.append(batch(b"b", b"c")))
            await asyncio.to_thread(files.wait_for_datasync)
            assert hw.now() == 1
            gate.set()
            await threshold
        assert hw.now() == 3 == p.log.recovery_point
        await m.close()

    run(main)
