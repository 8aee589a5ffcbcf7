"""Replica state of one partition: ISR, high watermark, follower positions, truncation.

Sans-I/O: plain classes over values, after Kafka's ``Partition`` and ``AbstractFetcherThread``.
The asyncio shell (:mod:`cluster.replica_manager`) reads the local log, carries fetches over
HTTP/2 and writes ISR changes to the metadata store by compare-and-set; this module decides.

Theory of operation
-------------------
* **Leader.** One :class:`LeaderReplica` per partition this broker leads, for one leader
  epoch. Each follower fetch carries the follower's ``fetch_offset`` (its log end offset),
  ``last_fetched_epoch`` (the epoch of its last batch) and the ``current_leader_epoch`` it
  believes in. A stale epoch is fenced in both directions (``FENCED_LEADER_EPOCH`` when the
  follower is behind, ``UNKNOWN_LEADER_EPOCH`` when the leader is). If the follower's last
  epoch ends earlier in the leader's log than where the follower stands, the answer is a
  *diverging epoch* ``(epoch, end_offset)`` and no records (KIP-101, KIP-279, KIP-595): the
  follower truncates and asks again. Otherwise the fetch offset *is* the follower's log end
  offset, and records are read from there.
* **High watermark** = the smallest log end offset over the ISR (the leader's own included),
  never moving backwards, and not advancing at all while the ISR is smaller than
  ``min.insync.replicas``. A follower that has not fetched in this epoch yet holds it where it
  is. With ``durability=fsync`` it also stays within what ``min.insync.replicas`` members of the
  ISR have fsynced (each fetch reports the follower's durable offset), so losing the page cache
  of every broker at once loses nothing acknowledged.
* **ISR.** A follower leaves when it has not been caught up for ``replica.lag.time.max.ms``:
  "caught up" is Kafka's rule — its fetch reached the leader's log end offset, or reached the
  end the leader had at the follower's previous fetch (then it was caught up at that time). A
  follower joins when its log end offset reaches the high watermark and the start of this
  leader epoch (so it holds everything this leader has committed). The leader never leaves.
  Changes are *proposed* here and applied only after the metadata store accepted them; while a
  proposal that adds a member is in flight the high watermark already waits for that member
  (Kafka's "maximal ISR"): the store may accept it, and the controller elect the new member,
  before the leader hears back — a HW that moved past the member's log end meanwhile would
  have acknowledged records that the new leader lacks.
* **Follower.** :class:`FollowerReplica` turns a fetch answer into one action: append the
  batches, truncate to an offset (diverging epoch: the end of the largest epoch both logs
  share, bounded by the leader's end for it), restart the log at the leader's log start
  (fetch offset below it, no epoch in common, or a log starting past the leader's end), or
  back off (fenced / not leader: wait for new metadata). It never truncates to its own high
  watermark. Its high watermark is min(leader's, own log end).

Offsets are Kafka's: an "end offset" is the first offset *not* in the log.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Protocol

from core_log.epoch_cache import UNDEFINED_EPOCH

BrokerId = int
Epoch = int
Offset = int

NO_LEADER: BrokerId = -1  # an offline partition's leader column


class FetchError(enum.Enum):
    """Per-partition errors of a replica fetch (Kafka's names)."""

    FENCED_LEADER_EPOCH = "FENCED_LEADER_EPOCH"  # the follower's epoch is older than ours
    UNKNOWN_LEADER_EPOCH = "UNKNOWN_LEADER_EPOCH"  # the follower knows a newer epoch than ours
    NOT_LEADER_OR_FOLLOWER = "NOT_LEADER_OR_FOLLOWER"  # not led here, or not a replica
    OFFSET_OUT_OF_RANGE = "OFFSET_OUT_OF_RANGE"
    UNKNOWN_TOPIC_OR_PARTITION = "UNKNOWN_TOPIC_OR_PARTITION"
    KAFKA_STORAGE_ERROR = "KAFKA_STORAGE_ERROR"


@dataclass(frozen=True, slots=True)
class PartitionState:
    """One partition row of the metadata store, as the controller (or an ISR change) left it."""

    replicas: tuple[BrokerId, ...]
    isr: tuple[BrokerId, ...]
    leader: BrokerId
    leader_epoch: Epoch
    partition_epoch: int  # bumped by every change of the row (the compare-and-set column)


class LogView(Protocol):
    """What the state machine reads from the local log (a :class:`core_log.log.PartitionLog`
    fits it)."""

    @property
    def log_start_offset(self) -> Offset: ...

    @property
    def log_end_offset(self) -> Offset: ...

    def end_offset_for_epoch(self, epoch: Epoch) -> tuple[Epoch, Offset]: ...


@dataclass(frozen=True, slots=True)
class FetchPosition:
    """What a follower sends for one partition."""

    fetch_offset: Offset  # the follower's log end offset
    last_fetched_epoch: Epoch  # epoch of its last batch; UNDEFINED_EPOCH for an empty log
    current_leader_epoch: Epoch
    durable_offset: Offset = -1  # the follower's recovery point (``durability=fsync``)
    high_watermark: Offset = -1  # the HW the follower knows (the leader answers when it moves)


@dataclass(frozen=True, slots=True)
class FetchDecision:
    """The leader's verdict on one partition of a fetch: an error, a diverging epoch, or the
    offset to read records from (always the follower's fetch offset)."""

    error: FetchError | None = None
    diverging_epoch: Epoch = UNDEFINED_EPOCH
    diverging_end_offset: Offset = -1
    read_from: Offset | None = None

    @property
    def diverging(self) -> bool:
        return self.diverging_end_offset >= 0


@dataclass(slots=True)
class FollowerPosition:
    """The leader's view of one follower, reset when the leader epoch changes."""

    log_end_offset: Offset = -1  # unknown until its first fetch in this epoch
    durable_offset: Offset = -1
    last_caught_up_ms: int = 0
    last_fetch_ms: int = -1
    last_fetch_leader_end_offset: Offset = -1
    known_high_watermark: Offset = -1


@dataclass
class LeaderReplica:
    """The leader's state for one partition in one leader epoch."""

    me: BrokerId
    state: PartitionState
    min_insync_replicas: int
    replica_lag_time_max_ms: int
    now_ms: int
    high_watermark: Offset
    epoch_start_offset: Offset  # the log end offset when this epoch began
    fsync_durability: bool = False
    followers: dict[BrokerId, FollowerPosition] = field(default_factory=dict)
    # The ISR last proposed to the store and not yet seen applied (Kafka's pending ISR state).
    pending_isr: tuple[BrokerId, ...] | None = None

    def __post_init__(self) -> None:
        assert self.state.leader == self.me, "a LeaderReplica is built for the leader"
        for b in self.state.replicas:
            if b != self.me:
                # Kafka starts the clock for every replica at the epoch change: an ISR member
                # gets replica.lag.time.max.ms to show up before it is dropped.
                self.followers[b] = FollowerPosition(last_caught_up_ms=self.now_ms)

    @property
    def leader_epoch(self) -> Epoch:
        return self.state.leader_epoch

    @property
    def isr(self) -> tuple[BrokerId, ...]:
        return self.state.isr

    @property
    def maximal_isr(self) -> tuple[BrokerId, ...]:
        """The ISR the high watermark waits for: the current one plus any member a proposal
        in flight adds. The store may already have accepted the proposal (and the controller
        may elect the new member) before the answer comes back, so the HW must not pass it."""
        if self.pending_isr is None:
            return self.state.isr
        return self.state.isr + tuple(b for b in self.pending_isr if b not in self.state.isr)

    @property
    def enough_replicas(self) -> bool:
        """acks=all may append (else NOT_ENOUGH_REPLICAS), and the HW may advance."""
        return len(self.state.isr) >= self.min_insync_replicas

    # -- fetch -----------------------------------------------------------------------------------

    def on_fetch(
        self, follower: BrokerId, position: FetchPosition, log: LogView, now_ms: int
    ) -> FetchDecision:
        """Judge one partition of a follower's fetch and record the follower's position."""
        if follower not in self.followers:
            return FetchDecision(error=FetchError.NOT_LEADER_OR_FOLLOWER)
        if position.current_leader_epoch < self.leader_epoch:
            return FetchDecision(error=FetchError.FENCED_LEADER_EPOCH)
        if position.current_leader_epoch > self.leader_epoch:
            return FetchDecision(error=FetchError.UNKNOWN_LEADER_EPOCH)
        if position.fetch_offset < log.log_start_offset:
            # Everything the follower holds lies below our log start: it restarts its log there
            # (epochs cannot help: ours may all be newer than its last one, and a diverging
            # answer at our log start would cut nothing, so it would ask again forever).
            return FetchDecision(error=FetchError.OFFSET_OUT_OF_RANGE)
        if position.last_fetched_epoch != UNDEFINED_EPOCH:
            epoch, end = log.end_offset_for_epoch(position.last_fetched_epoch)
            if epoch == UNDEFINED_EPOCH:
                # Nothing in our log is as old as the follower's last epoch: everything the
                # follower holds past our log start diverges, and what it holds below is not
                # known to match what we deleted there. It restarts its log at our log start.
                return FetchDecision(
                    diverging_epoch=UNDEFINED_EPOCH, diverging_end_offset=log.log_start_offset
                )
            if epoch != position.last_fetched_epoch or end < position.fetch_offset:
                return FetchDecision(diverging_epoch=epoch, diverging_end_offset=end)
        leader_end = log.log_end_offset
        if not log.log_start_offset <= position.fetch_offset <= leader_end:
            return FetchDecision(error=FetchError.OFFSET_OUT_OF_RANGE)
        self._record_position(self.followers[follower], position, leader_end, now_ms)
        return FetchDecision(read_from=position.fetch_offset)

    @staticmethod
    def _record_position(
        f: FollowerPosition, position: FetchPosition, leader_end: Offset, now_ms: int
    ) -> None:
        if position.fetch_offset >= leader_end:
            f.last_caught_up_ms = now_ms
        elif position.fetch_offset >= f.last_fetch_leader_end_offset >= 0:
            f.last_caught_up_ms = max(f.last_caught_up_ms, f.last_fetch_ms)
        f.log_end_offset = position.fetch_offset
        f.durable_offset = position.durable_offset
        f.known_high_watermark = position.high_watermark
        f.last_fetch_ms = now_ms
        f.last_fetch_leader_end_offset = leader_end

    # -- high watermark --------------------------------------------------------------------------

    def high_watermark_target(self, leader_end: Offset, leader_durable: Offset) -> Offset:
        """Where the HW may go now (never below where it is)."""
        if not self.enough_replicas:
            return self.high_watermark
        ends = [leader_end]
        durable = [leader_durable]
        for b in self.maximal_isr:
            if b == self.me:
                continue
            f = self.followers.get(b)
            if f is None or f.log_end_offset < 0:
                return self.high_watermark  # not heard from in this epoch
            ends.append(f.log_end_offset)
            durable.append(f.durable_offset)
        target = min(ends)
        if self.fsync_durability:
            durable.sort(reverse=True)
            target = min(target, durable[self.min_insync_replicas - 1])
        return max(self.high_watermark, target)

    def advance_high_watermark(self, leader_end: Offset, leader_durable: Offset) -> bool:
        """Move the HW to its target; True if it moved."""
        target = self.high_watermark_target(leader_end, leader_durable)
        if target > self.high_watermark:
            self.high_watermark = target
            return True
        return False

    # -- ISR -------------------------------------------------------------------------------------

    def out_of_sync(self, now_ms: int) -> set[BrokerId]:
        """ISR followers not caught up for longer than replica.lag.time.max.ms."""
        return {
            b
            for b in self.state.isr
            if b != self.me
            and now_ms - self.followers[b].last_caught_up_ms > self.replica_lag_time_max_ms
        }

    def caught_up(self) -> set[BrokerId]:
        """Followers outside the ISR that hold everything committed in this epoch."""
        floor = max(self.high_watermark, self.epoch_start_offset)
        return {
            b
            for b, f in self.followers.items()
            if b not in self.state.isr and f.log_end_offset >= floor
        }

    def proposed_isr(
        self, now_ms: int, alive: Iterable[BrokerId] | None = None
    ) -> tuple[BrokerId, ...] | None:
        """The ISR this leader wants (None: keep it). ``alive``: brokers with a live lease; a
        fenced broker is neither kept nor added. The answer is remembered as pending (see
        :attr:`maximal_isr`) until :meth:`apply` takes a newer row: call this only when the
        shell is about to send it, and not again while it is in flight."""
        live = set(alive) if alive is not None else None
        isr = set(self.state.isr) - self.out_of_sync(now_ms)
        isr |= self.caught_up()
        if live is not None:
            isr = {b for b in isr if b == self.me or b in live}
        isr.add(self.me)
        ordered = tuple(b for b in self.state.replicas if b in isr)
        self.pending_isr = None if set(ordered) == set(self.state.isr) else ordered
        return self.pending_isr

    def apply(self, state: PartitionState) -> None:
        """Take a newer row in the same leader epoch (an ISR change the store accepted); an
        older one (the answer to our change arriving after a later row) is ignored, or the
        next change would name a stale partition epoch and be refused until the row moved."""
        assert state.leader == self.me and state.leader_epoch == self.leader_epoch
        if state.partition_epoch < self.state.partition_epoch:
            return  # an ISR change's answer overtaken by a newer row: keep the newer one
        for b in state.replicas:
            if b != self.me and b not in self.followers:
                self.followers[b] = FollowerPosition(last_caught_up_ms=self.now_ms)
        for b in list(self.followers):
            if b not in state.replicas:
                del self.followers[b]
        self.state = state
        self.pending_isr = None  # applied, or bound to fail (it names an older partition epoch)

    def followers_to_wake(self) -> set[BrokerId]:
        """Followers whose known HW is behind ours: a waiting fetch of theirs should answer."""
        return {
            b
            for b, f in self.followers.items()
            if 0 <= f.known_high_watermark < self.high_watermark
        }


class FollowerActionKind(enum.Enum):
    APPEND = "append"  # append the records as follower, then take the leader's HW
    TRUNCATE = "truncate"  # truncate to ``offset`` and fetch again
    RESTART_AT = "restart_at"  # drop the whole log, start empty at ``offset``
    BACK_OFF = "back_off"  # wait for newer metadata (fenced, unknown epoch, not leader)


@dataclass(frozen=True, slots=True)
class FollowerAction:
    kind: FollowerActionKind
    offset: Offset = -1
    error: FetchError | None = None


@dataclass(frozen=True, slots=True)
class PartitionFetchAnswer:
    """The leader's answer for one partition (records travel beside it, as raw bytes)."""

    error: FetchError | None
    high_watermark: Offset
    log_start_offset: Offset
    log_end_offset: Offset
    diverging_epoch: Epoch = UNDEFINED_EPOCH
    diverging_end_offset: Offset = -1
    records_bytes: int = 0


@dataclass
class FollowerReplica:
    """A follower's state for one partition under one leader epoch."""

    me: BrokerId
    leader: BrokerId
    leader_epoch: Epoch

    def position(
        self, log: LogView, last_epoch: Epoch, durable_offset: Offset, high_watermark: Offset
    ) -> FetchPosition:
        return FetchPosition(
            fetch_offset=log.log_end_offset,
            last_fetched_epoch=last_epoch,
            current_leader_epoch=self.leader_epoch,
            durable_offset=durable_offset,
            high_watermark=high_watermark,
        )

    def on_answer(
        self, sent: FetchPosition, answer: PartitionFetchAnswer, log: LogView
    ) -> FollowerAction:
        """What to do with the leader's answer to ``sent``."""
        if answer.error in (
            FetchError.FENCED_LEADER_EPOCH,
            FetchError.UNKNOWN_LEADER_EPOCH,
            FetchError.NOT_LEADER_OR_FOLLOWER,
            FetchError.UNKNOWN_TOPIC_OR_PARTITION,
            FetchError.KAFKA_STORAGE_ERROR,
        ):
            return FollowerAction(FollowerActionKind.BACK_OFF, error=answer.error)
        if answer.error is FetchError.OFFSET_OUT_OF_RANGE:
            if sent.fetch_offset < answer.log_start_offset:
                return FollowerAction(FollowerActionKind.RESTART_AT, answer.log_start_offset)
            if answer.log_end_offset < log.log_start_offset:
                # Our whole log lies past the leader's end (an unclean election, or a restart
                # at a log start the new leader never reached): a truncation cannot go below
                # our log start, so start again where the leader's log starts.
                return FollowerAction(FollowerActionKind.RESTART_AT, answer.log_start_offset)
            # Past the leader's end with no epoch to compare (an empty epoch cache) or in an
            # epoch the leader does not dispute: cut back to the leader's end.
            return FollowerAction(FollowerActionKind.TRUNCATE, answer.log_end_offset)
        if answer.diverging_end_offset >= 0 and answer.diverging_epoch == UNDEFINED_EPOCH:
            # No epoch in common: a cut at the leader's log start would keep our records below
            # it (unlike the ones the leader deleted, and a replica in the ISR meanwhile could
            # serve them as leader), and a log ending there would be cut to itself and ask the
            # same question forever. Start empty at the leader's log start instead.
            return FollowerAction(FollowerActionKind.RESTART_AT, answer.diverging_end_offset)
        if answer.diverging_end_offset >= 0:
            return FollowerAction(FollowerActionKind.TRUNCATE, self.truncation_offset(answer, log))
        return FollowerAction(FollowerActionKind.APPEND)

    @staticmethod
    def truncation_offset(answer: PartitionFetchAnswer, log: LogView) -> Offset:
        """Where to cut on a diverging epoch: the end of the largest epoch this log shares
        with the leader's answer, bounded by the leader's end for it (KIP-279)."""
        if answer.diverging_epoch == UNDEFINED_EPOCH:  # on_answer restarts the log instead
            return max(answer.diverging_end_offset, log.log_start_offset)
        mine, my_end = log.end_offset_for_epoch(answer.diverging_epoch)
        if mine == UNDEFINED_EPOCH:
            return log.log_start_offset
        return min(answer.diverging_end_offset, my_end)

    @staticmethod
    def high_watermark(answer: PartitionFetchAnswer, log_end_offset: Offset) -> Offset:
        return min(answer.high_watermark, log_end_offset)
