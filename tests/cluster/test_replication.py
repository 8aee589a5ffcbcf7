"""Focused tests of cluster.replication, one per rule the simulation (tests/cluster/sim.py)
found broken; each names the seed that found it."""

from __future__ import annotations

import asyncio
from pathlib import Path

from cluster.replica_manager import Following, ReplicaManager
from cluster.replication import (
    FetchError,
    FetchPosition,
    FollowerActionKind,
    FollowerReplica,
    LeaderReplica,
    PartitionFetchAnswer,
    PartitionState,
)
from core_log.batch import Record, build_batch
from core_log.clock import ManualClock
from core_log.config import LogConfig
from core_log.epoch_cache import UNDEFINED_EPOCH
from core_log.executors import StorageExecutors
from core_log.handles import HandleCache
from core_log.log import PartitionLog
from core_log.manager import Partition
from tests.cluster.sim import SimLog


def _log(records: list[tuple[int, int]], start: int = 0) -> SimLog:
    """A log holding ``records`` = (offset, epoch) pairs from ``start``."""
    log = SimLog()
    log.truncate_fully_and_start_at(start)
    log.append([(o, e, o) for o, e in records], durable=True)
    return log


def _leader(isr: tuple[int, ...], hw: int, epoch_start: int, min_isr: int = 2) -> LeaderReplica:
    return LeaderReplica(
        me=1,
        state=PartitionState((1, 2, 3), isr, 1, 5, 10),
        min_insync_replicas=min_isr,
        replica_lag_time_max_ms=1_000,
        now_ms=0,
        high_watermark=hw,
        epoch_start_offset=epoch_start,
    )


def _fetch(offset: int, last_epoch: int, leader_epoch: int = 5) -> FetchPosition:
    return FetchPosition(offset, last_epoch, leader_epoch)


# -- the leader ---------------------------------------------------------------------------------


def test_high_watermark_waits_for_a_member_whose_isr_expansion_is_in_flight() -> None:
    # Seed 43: the store accepted ISR [1, 2, 3] while the leader still used [1, 2] and moved the
    # HW past follower 3's log end; the controller could then elect 3 without those records.
    log = _log([(o, 5) for o in range(10)])
    leader = _leader((1, 2), hw=4, epoch_start=4)
    assert leader.on_fetch(3, _fetch(4, 5), log, now_ms=1).read_from == 4
    assert leader.on_fetch(2, _fetch(10, 5), log, now_ms=1).read_from == 10
    assert leader.proposed_isr(now_ms=1) == (1, 2, 3)
    assert leader.maximal_isr == (1, 2, 3)
    assert leader.high_watermark_target(10, 10) == 4  # not 10: follower 3 holds only 4
    leader.on_fetch(3, _fetch(7, 5), log, now_ms=2)
    assert leader.high_watermark_target(10, 10) == 7
    # The store answered (or a newer row came): the pending proposal is gone.
    leader.apply(PartitionState((1, 2, 3), (1, 2, 3), 1, 5, 11))
    assert leader.pending_isr is None and leader.maximal_isr == (1, 2, 3)


def test_a_pending_shrink_keeps_the_current_isr_for_the_high_watermark() -> None:
    log = _log([(o, 5) for o in range(10)])
    leader = _leader((1, 2, 3), hw=2, epoch_start=2)
    leader.on_fetch(3, _fetch(3, 5), log, now_ms=0)
    leader.on_fetch(2, _fetch(10, 5), log, now_ms=5_000)
    assert leader.proposed_isr(now_ms=5_000) == (1, 2)  # 3 lags: proposed out
    assert leader.maximal_isr == (1, 2, 3)
    assert leader.high_watermark_target(10, 10) == 3  # until the store took the shrink


def test_an_older_row_does_not_replace_a_newer_one() -> None:
    # The answer to our ISR change (partition epoch 11) can arrive after the metadata poll
    # applied the controller's next change (12); going back to 11 would make every later
    # change name a stale partition epoch.
    leader = _leader((1, 2, 3), hw=0, epoch_start=0)
    leader.apply(PartitionState((1, 2, 3), (1, 2), 1, 5, 12))
    leader.apply(PartitionState((1, 2, 3), (1, 2, 3), 1, 5, 11))
    assert (leader.isr, leader.state.partition_epoch) == ((1, 2), 12)


def test_a_fetch_below_the_log_start_is_out_of_range_whatever_its_epoch() -> None:
    # Seed 88: a follower whose whole log lay below the leader's log start, with an epoch older
    # than any the leader knows, was told to "diverge at the log start", cut nothing, and asked
    # again forever.
    log = _log([(o, 2) for o in range(23, 30)], start=23)
    log.epochs.assign(2, 23)
    leader = _leader((1, 2), hw=30, epoch_start=30)
    decision = leader.on_fetch(2, _fetch(1, 0), log, now_ms=0)
    assert decision.error is FetchError.OFFSET_OUT_OF_RANGE
    answer = PartitionFetchAnswer(decision.error, 30, 23, 30)
    follower_log = _log([(0, 0)])
    action = FollowerReplica(2, 1, 5).on_answer(_fetch(1, 0), answer, follower_log)
    assert (action.kind, action.offset) == (FollowerActionKind.RESTART_AT, 23)


def test_no_shared_epoch_restarts_the_follower_at_the_leader_log_start() -> None:
    # Seed 1291: a follower ending at the leader's log start with an epoch older than any the
    # leader knows was told to cut there, cut nothing and asked again forever. Seed 2087
    # (1,000 steps): one ending past it cut there but kept records below it that differ from
    # the ones the leader had deleted, joined the ISR, and could have served them as leader.
    log = _log([(o, 1) for o in range(5, 9)], start=5)
    log.epochs.truncate_from_start(5)
    leader = _leader((1, 2), hw=9, epoch_start=9)
    for fetch_offset in (5, 7):
        sent = _fetch(fetch_offset, 0)
        decision = leader.on_fetch(2, sent, log, now_ms=0)
        assert (decision.diverging_epoch, decision.diverging_end_offset) == (UNDEFINED_EPOCH, 5)
        answer = PartitionFetchAnswer(None, 9, 5, 9, UNDEFINED_EPOCH, 5)
        follower_log = _log([(o, 0) for o in range(fetch_offset)])
        action = FollowerReplica(2, 1, 5).on_answer(sent, answer, follower_log)
        assert (action.kind, action.offset) == (FollowerActionKind.RESTART_AT, 5)
    # After the restart the follower's epoch cache is empty: it fetches on from 5.
    assert leader.on_fetch(2, _fetch(5, UNDEFINED_EPOCH), log, now_ms=0).read_from == 5


# -- the follower -------------------------------------------------------------------------------


def test_a_follower_whose_log_starts_past_the_leader_end_restarts_at_the_leader_start() -> None:
    # Seed 754: after an unclean election the new leader ended at 1 while the follower's log
    # had restarted empty at 5; truncating to 1 cannot go below the log start 5, so it looped.
    follower_log = SimLog()
    follower_log.truncate_fully_and_start_at(5)
    answer = PartitionFetchAnswer(FetchError.OFFSET_OUT_OF_RANGE, 1, 0, 1)
    action = FollowerReplica(2, 1, 5).on_answer(_fetch(5, UNDEFINED_EPOCH), answer, follower_log)
    assert (action.kind, action.offset) == (FollowerActionKind.RESTART_AT, 0)
    # A log that still reaches down to the leader's end is cut there, as before.
    longer = _log([(o, 1) for o in range(5)])
    action = FollowerReplica(2, 1, 5).on_answer(_fetch(5, UNDEFINED_EPOCH), answer, longer)
    assert (action.kind, action.offset) == (FollowerActionKind.TRUNCATE, 1)


def test_an_epoch_begun_without_records_goes_when_the_follower_truncates(tmp_path: Path) -> None:
    # Seed 42: a broker led epoch 3 without appending, then followed epoch 4. Its fetches named
    # epoch 3 as the last one, the leader answered "diverging at 5" (the end of epoch 0), the
    # cut to its own log end changed nothing, and the same answer came back forever.
    clock = ManualClock()
    log = PartitionLog(tmp_path / "p", LogConfig(), clock, HandleCache())
    log.append(build_batch([Record(b"x", timestamp=clock.now_ms())] * 5), leader_epoch=0)
    log.assign_leader_epoch(3)
    assert log.latest_epoch == 3
    leader_log = _log([(o, 0) for o in range(5)] + [(5, 4)])
    leader = _leader((1, 2), hw=5, epoch_start=5)
    sent = _fetch(5, log.latest_epoch)
    decision = leader.on_fetch(2, sent, leader_log, now_ms=0)
    assert (decision.diverging_epoch, decision.diverging_end_offset) == (0, 5)
    answer = PartitionFetchAnswer(None, 5, 0, 6, decision.diverging_epoch, 5)
    action = FollowerReplica(2, 1, 5).on_answer(sent, answer, log)
    assert (action.kind, action.offset) == (FollowerActionKind.TRUNCATE, 5)
    assert log.truncate_to(action.offset) == 5
    assert log.latest_epoch == 0  # the empty epoch 3 is gone: the next fetch reads on
    assert leader.on_fetch(2, _fetch(5, log.latest_epoch), leader_log, now_ms=0).read_from == 5
    log.close()


def test_a_follower_takes_the_high_watermark_before_the_leader_log_start(tmp_path: Path) -> None:
    # Seed 579 (1,000 steps): the log start was moved before the HW, refused (it may not pass
    # the HW), and records below the leader's log start that differ from the ones the leader
    # deleted stayed a while below the follower's new HW.
    async def main() -> None:
        clock = ManualClock()
        log = PartitionLog(tmp_path / "p", LogConfig(), clock, HandleCache())
        log.append(build_batch([Record(b"x", timestamp=clock.now_ms())] * 3), leader_epoch=1)
        pools = StorageExecutors()
        try:
            following = Following(
                Partition("t", 0, log, False, pools), FollowerReplica(2, 1, 5), False
            )
            answer = PartitionFetchAnswer(None, 4, 2, 4)
            sent = _fetch(3, 1)
            manager = ReplicaManager.__new__(ReplicaManager)
            await manager._apply_answer(following, sent, answer, memoryview(b""))
            assert (log.log_start_offset, log.high_watermark) == (2, 3)
        finally:
            log.close()
            pools.shutdown()

    asyncio.run(main())
