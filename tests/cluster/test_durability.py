"""``durability=fsync``: the config key, the high-watermark rule, the follower's fsync before it
reports an offset durable, and the page-cache-loss hook of :mod:`core_log.fileio`."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest

from cluster.metadata import MetadataStore
from cluster.replica_manager import Following, ReplicaManager, ReplicationConfig
from cluster.replication import (
    FollowerReplica,
    LeaderReplica,
    PartitionFetchAnswer,
    PartitionState,
)
from core_log import fileio
from core_log.batch import Record, build_batch
from core_log.clock import ManualClock
from core_log.config import LogConfig
from core_log.errors import InvalidConfigError
from core_log.manager import LogManager

# -- the config key ------------------------------------------------------------------------------


def test_durability_defaults_to_replicated_and_accepts_fsync() -> None:
    assert LogConfig().durability == "replicated" and not LogConfig().fsync_durability
    assert LogConfig.from_dict({"durability": "fsync"}).fsync_durability
    assert LogConfig.from_dict({"durability": "replicated"}).overrides() == {}
    assert LogConfig.from_dict({"durability": "fsync"}).to_dict()["durability"] == "fsync"


@pytest.mark.parametrize("bad", ["none", "FSYNC", "", "sync", 1, True])
def test_durability_rejects_anything_else(bad: object) -> None:
    with pytest.raises(InvalidConfigError) as e:
        LogConfig.from_dict({"durability": bad})
    assert "durability" in str(e.value)


# -- the high-watermark rule ---------------------------------------------------------------------


class _Log:
    log_start_offset = 0

    def __init__(self, end: int) -> None:
        self.log_end_offset = end

    def end_offset_for_epoch(self, epoch: int) -> tuple[int, int]:
        return (epoch, self.log_end_offset) if epoch == 0 else (-1, -1)


def _leader(isr: tuple[int, ...], min_isr: int, fsync: bool) -> LeaderReplica:
    return LeaderReplica(
        me=1,
        state=PartitionState((1, 2, 3), isr, 1, 0, 0),
        min_insync_replicas=min_isr,
        replica_lag_time_max_ms=30_000,
        now_ms=0,
        high_watermark=0,
        epoch_start_offset=0,
        fsync_durability=fsync,
    )


def _fetch(leader: LeaderReplica, follower: int, end: int, durable: int, leader_end: int) -> None:
    pos = FollowerReplica(follower, 1, 0).position(_Log(end), 0, durable, 0)
    assert leader.on_fetch(follower, pos, _Log(leader_end), 1).read_from == end


def test_fsync_hw_stays_within_what_min_isr_replicas_fsynced() -> None:
    leader = _leader((1, 2, 3), 2, fsync=True)
    _fetch(leader, 2, end=100, durable=40, leader_end=100)
    _fetch(leader, 3, end=100, durable=70, leader_end=100)
    # Every ISR member holds 100 in memory; the 2nd most durable replica has fsynced 70.
    assert leader.high_watermark_target(leader_end=100, leader_durable=100) == 70
    # The leader's own durable offset counts as one of the min ISR.
    assert leader.high_watermark_target(leader_end=100, leader_durable=20) == 40
    assert leader.advance_high_watermark(100, 20) and leader.high_watermark == 40
    # Never backwards, even when the durable offsets are reported lower later.
    _fetch(leader, 2, end=100, durable=10, leader_end=100)
    assert leader.high_watermark_target(100, 10) == 40


def test_without_fsync_the_hw_ignores_durable_offsets() -> None:
    leader = _leader((1, 2, 3), 2, fsync=False)
    _fetch(leader, 2, end=100, durable=0, leader_end=100)
    _fetch(leader, 3, end=90, durable=0, leader_end=100)
    assert leader.high_watermark_target(100, 0) == 90


def test_fsync_hw_with_min_isr_one_needs_only_the_most_durable_in_memory_copy() -> None:
    leader = _leader((1, 2), 1, fsync=True)
    _fetch(leader, 2, end=100, durable=100, leader_end=100)
    assert leader.advance_high_watermark(100, 30)  # the follower fsynced everything
    assert leader.high_watermark == 100
    _fetch(leader, 2, end=100, durable=50, leader_end=100)
    assert leader.high_watermark_target(100, 30) == 100  # never backwards
    leader2 = _leader((1, 2), 1, fsync=True)
    _fetch(leader2, 2, end=100, durable=50, leader_end=100)
    assert leader2.high_watermark_target(100, 30) == 50


# -- the follower fsyncs before it reports an offset durable ------------------------------------


class _CountingOps(fileio.FileOps):
    def __init__(self) -> None:
        self.syncs = 0

    def fdatasync(self, fd: int) -> None:  # what a segment's fsync uses
        self.syncs += 1
        super().fdatasync(fd)


@pytest.mark.parametrize("durability", ["fsync", "replicated"])
def test_follower_fsyncs_appends_before_reporting_them_durable(
    tmp_path: Path, durability: str
) -> None:
    # flush.ms so large that only durability=fsync can cause the fsync
    config = LogConfig.from_dict({"durability": durability, "flush.ms": 3_600_000})

    async def main() -> None:
        logs = LogManager(
            tmp_path / "data",
            clock=ManualClock(1_700_000_000_000),
            config_for=lambda _t: config,
            auto_high_watermark=False,
        )
        await logs.start(background=False)
        store = MetadataStore(f"sqlite:///{tmp_path / 'meta.db'}")
        try:
            await logs.create_many("t", [0], config)
            part = logs.get("t", 0)
            rm = ReplicaManager(
                ReplicationConfig(broker_id=2), logs, store, ManualClock(0), lambda _t: config
            )
            following = Following(part, FollowerReplica(2, 1, 0), config.fsync_durability)
            sent = following.replica.position(part.log, -1, part.log.recovery_point, 0)
            data = build_batch([Record(b"v%d" % i) for i in range(5)], partition_leader_epoch=0)
            answer = PartitionFetchAnswer(None, 0, 0, 5, records_bytes=len(data))
            ops = _CountingOps()
            with fileio.injected(ops):
                await rm._apply_answer(following, sent, answer, memoryview(data))
            assert part.log_end_offset == 5
            nxt = following.replica.position(part.log, 0, part.log.recovery_point, 0)
            if durability == "fsync":
                assert ops.syncs >= 1 and nxt.durable_offset == 5
            else:
                assert ops.syncs == 0 and nxt.durable_offset == 0
        finally:
            await logs.close()
            store.close()

    asyncio.run(main())


# -- the page-cache-loss hook --------------------------------------------------------------------


def test_drop_unsynced_cuts_files_back_to_their_last_fsync(tmp_path: Path) -> None:
    journal = tmp_path / "journal"
    ops = fileio.SyncJournal(str(journal))
    root = tmp_path / "data"
    root.mkdir()
    synced, never, cut, renamed = (root / n for n in ("synced", "never", "cut", "renamed.tmp"))
    fds = {p: os.open(p, os.O_RDWR | os.O_CREAT, 0o644) for p in (synced, never, cut, renamed)}
    try:
        ops.write(fds[synced], b"a" * 100)
        ops.fdatasync(fds[synced])
        ops.write(fds[synced], b"b" * 50)  # after the fsync: lost
        ops.write(fds[never], b"c" * 10)  # never fsynced: lost
        ops.write(fds[cut], b"d" * 100)
        ops.fsync(fds[cut])
        ops.ftruncate(fds[cut], 30)  # cut below what was synced, then rewritten unsynced
        ops.pwrite(fds[cut], b"e" * 70, 30)
        ops.write(fds[renamed], b"f" * 20)
        ops.fsync(fds[renamed])
        dir_fd = os.open(root, os.O_RDONLY)
        ops.fsync(dir_fd)  # a directory: not modelled
        os.close(dir_fd)
    finally:
        for fd in fds.values():
            os.close(fd)
    os.replace(renamed, root / "renamed")  # the identity follows the file
    assert fileio.drop_unsynced(root, journal) == 50 + 10 + 70
    assert (root / "synced").read_bytes() == b"a" * 100
    assert (root / "never").read_bytes() == b""
    assert (root / "cut").read_bytes() == b"d" * 30
    assert (root / "renamed").read_bytes() == b"f" * 20
    # A new file on a recycled inode number does not inherit an old file's record.
    (root / "synced").unlink()
    fresh = root / "fresh"
    fresh.write_bytes(b"g" * 100)
    assert fileio.drop_unsynced(root, journal) == 100
