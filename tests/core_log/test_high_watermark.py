"""The standalone high watermark never passes data that must be fsynced first (issue 10).

An append that must be fsynced before it counts (``acks=all``, or the one that reaches
``flush.messages``) stays invisible until an fsync covers it, even when a later ``acks=1``
append lands behind it; the high watermark never moves backwards. The fsync is held back with
a gate in the injected file layer, so the interleaving is deterministic.
"""

from __future__ import annotations

import asyncio
import random
import threading
import time
from pathlib import Path

import pytest

from core_log import fileio
from core_log.config import LONG_MAX, LogConfig
from core_log.manager import Partition
from tests.core_log.faults import FaultyFiles, faulty_files
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


class JitteryFsyncs(FaultyFiles):
    """Segment fsyncs that take a seeded random 0-3 ms, so fsyncs overlap appends."""

    def __init__(self, rng: random.Random) -> None:
        super().__init__()
        self.rng = rng
        self.lock = threading.Lock()

    def fdatasync(self, fd: int) -> None:
        with self.lock:
            delay = self.rng.random() * 0.003
        time.sleep(delay)
        super().fdatasync(fd)


@pytest.mark.parametrize("flush_messages", [1, 7, LONG_MAX])
@pytest.mark.parametrize("seed", [1, 2, 3])
def test_random_mix_of_acks_never_exposes_unsynced_durable_records(
    tmp_path: Path, seed: int, flush_messages: int
) -> None:
    """Concurrent appends with random acks against jittery fsyncs: whenever the high watermark
    is past the start of an append that had to be fsynced, the recovery point is past its end;
    the high watermark never goes down; every durable answer finds its records visible."""
    rng = random.Random(seed)
    print(f"seed={seed} flush.messages={flush_messages}")  # shown when the test fails
    appends = 150

    async def main() -> None:
        config = LogConfig(flush_messages=flush_messages)
        m = make_manager(tmp_path, config_for=lambda _t: config)
        await m.start(background=False)
        p = await m.create("t", 0)
        hw = Watch(p)
        samples: list[tuple[int, int]] = []  # (recovery point read first, then the HW)
        must_sync: list[tuple[int, int]] = []
        done = asyncio.Event()

        async def sample() -> None:
            while not done.is_set():
                rp = p.log.recovery_point
                samples.append((rp, hw.now()))
                await asyncio.sleep(0)

        async def produce(i: int) -> None:
            await asyncio.sleep(rng.random() * 0.02)
            durable = rng.random() < 0.3
            r = await p.append(batch(*[b"r%d" % i] * rng.randint(1, 3)), durable=durable)
            if durable or r.sync_required:
                must_sync.append((r.base_offset, r.last_offset + 1))
                assert p.high_watermark > r.last_offset  # answered: durable and visible

        with fileio.injected(JitteryFsyncs(rng)):
            sampler = asyncio.create_task(sample())
            await asyncio.gather(*(produce(i) for i in range(appends)))
            await p.sync(p.log_end_offset)
            done.set()
            await sampler
        for base, end in must_sync:
            for rp, seen in samples:
                assert seen <= base or rp >= end, (base, end, rp, seen)
        assert hw.now() == p.log_end_offset
        await m.close()

    run(main)
