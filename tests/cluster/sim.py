"""A seeded, deterministic simulation of one replicated partition over several brokers.

After Kafka's raft simulation tests: the real sans-I/O state machines
(:class:`cluster.replication.LeaderReplica` / :class:`~cluster.replication.FollowerReplica` and
the controller's :func:`cluster.controller.decide`) run inside a discrete-event simulation whose
every choice comes from one ``random.Random(seed)``, so a failing seed replays exactly.

Theory of operation
-------------------
* **Time** is a simulated millisecond clock; **events** sit in a heap ordered by (time,
  sequence number). One *step* processes one event; the invariants are checked after every
  step.
* **Brokers** mirror :mod:`cluster.replica_manager`: a metadata poll turns the partition row
  into a role (leader: record the epoch at the log end, build a ``LeaderReplica``; follower: a
  ``FollowerReplica`` with one fetch in flight); heartbeats renew a lease and a broker whose
  local lease lapsed stops acting as leader, re-registering (new broker epoch) when the store
  refuses it; a leader serves fetches, moves the HW and proposes ISR changes to the store.
* **Logs** are lists of ``(offset, epoch, value)`` with the real
  :class:`core_log.epoch_cache.LeaderEpochCache`, a recovery point (what is fsynced), a
  checkpointed HW and log start, truncation and restart as :class:`core_log.log.PartitionLog`
  does them. A crash keeps the page cache (process kill) or loses everything past the recovery
  point (power loss); the restarted log recovers its HW from the checkpoint.
* **Store**: the partition row with the compare-and-sets of :mod:`cluster.metadata`
  (``change_isr`` only from the leader in its epoch with a live lease; controller changes on the
  partition epoch), broker leases and epochs. **Controller**: ``decide`` every few ms over the
  brokers whose lease is live.
* **Network**: every message between brokers, and between a broker and the store, is delayed
  (1 to 15 ms), sometimes dropped, reordered by its delay, and lost on a cut link or a restart.
* **Faults** (first part of a run): crash / power loss / restart, pause (SIGSTOP) / resume,
  cut and heal links, retention moving the log start; with ``reassign`` also partition
  reassignments (KIP-455) to random targets and their cancellation, made as the admin call
  makes them (:func:`cluster.controller.validate_target` and
  :func:`~cluster.controller.start_reassignment`, a CAS on the partition epoch) and completed
  by the controller's :func:`~cluster.controller.complete_reassignment`; a broker dropped
  from the replicas deletes its log (an empty one if it is added again later). Then a **quiet
  period** with every broker up and every link healed, after which the logs must have
  converged.

Invariants (:meth:`Simulation.check`): at most one leader per leader epoch (in the store and
among the brokers acting as leader); no replica's HW goes back within one incarnation (a restart
re-learns it from its checkpoint, so the floor restarts there); every acknowledged record is in
the log of every live ISR member at its offset with its value (above the member's log start);
any two replicas agree below the smaller of their HWs; after the quiet period every replica
holds the same log, the ISR is every replica and the HW is the log end (and no reassignment
is in progress; brokers that are not replicas hold nothing). An unclean election may
lose acknowledged records; it is counted in the row, and then only the counted loss, one leader
per epoch and convergence are required.
"""

from __future__ import annotations

import heapq
import os
import random
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from cluster.controller import (
    ReassignmentConflict,
    ReassignmentError,
    cancel_reassignment,
    complete_reassignment,
    decide,
    start_reassignment,
    validate_target,
)
from cluster.metadata import PartitionMeta
from cluster.replication import (
    NO_LEADER,
    FetchError,
    FetchPosition,
    FollowerActionKind,
    FollowerReplica,
    LeaderReplica,
    PartitionFetchAnswer,
    PartitionState,
)
from core_log.epoch_cache import LeaderEpochCache

Record = tuple[int, int, int]  # (offset, leader epoch, value); values are unique per run

SEED_ENV = "LOGBUS_SIM_SEED"  # run only this seed (replay a failure)
TRACE_ENV = "LOGBUS_SIM_TRACE"  # how many of the last events a failure prints (default 60)


class SimulationViolation(AssertionError):
    """An invariant broke; the message names the seed and the last events."""


@dataclass(frozen=True)
class SimConfig:
    """One run's parameters (all derived from the seed by :meth:`from_seed`)."""

    seed: int
    brokers: int = 3
    min_insync_replicas: int = 2
    unclean: bool = False
    fsync: bool = False
    power_loss: bool = False  # crashes may drop what is not fsynced
    rebalance: bool = True
    retention: bool = True
    steps: int = 300  # fault-phase steps; the quiet period follows
    quiet_ms: int = 4_000
    session_timeout_ms: int = 120
    heartbeat_ms: int = 30
    replica_lag_ms: int = 80
    refresh_ms: int = 15
    controller_ms: int = 20
    request_timeout_ms: int = 150
    fetch_timeout_ms: int = 60
    drop_rate: float = 0.02
    reassign: bool = False  # partition reassignments among the faults (opt-in: see tests)

    @classmethod
    def from_seed(cls, seed: int, steps: int = 300, **overrides: Any) -> SimConfig:
        rng = random.Random(seed ^ 0x5EED)
        n = rng.choice([3, 3, 3, 5])
        fields: dict[str, Any] = {
            "seed": seed,
            "brokers": n,
            "min_insync_replicas": rng.choice([1, 2, 2, 2] if n == 3 else [2, 3]),
            "unclean": rng.random() < 0.2,
            "fsync": rng.random() < 0.3,
            "rebalance": rng.random() < 0.7,
            "retention": rng.random() < 0.5,
            "steps": steps,
            "drop_rate": rng.choice([0.0, 0.02, 0.1]),
        }
        # Power loss only where durability=fsync promises to survive it; without fsync it is a
        # known gap (test_power_loss_of_one_broker_without_fsync_keeps_acknowledged_records).
        fields["power_loss"] = fields["fsync"]
        fields.update(overrides)
        return cls(**fields)


# -- the log --------------------------------------------------------------------------------------


class SimLog:
    """One replica's log, as :class:`core_log.log.PartitionLog` behaves (one record a batch)."""

    def __init__(self) -> None:
        self.start = 0
        self.records: list[Record] = []
        self.epochs = LeaderEpochCache()
        self.hw = 0
        self.recovery_point = 0
        self.checkpoint_hw = 0
        self.checkpoint_start = 0

    @property
    def log_start_offset(self) -> int:
        return self.start

    @property
    def log_end_offset(self) -> int:
        return self.start + len(self.records)

    @property
    def latest_epoch(self) -> int:
        return self.epochs.latest_epoch

    def end_offset_for_epoch(self, epoch: int) -> tuple[int, int]:
        return self.epochs.end_offset_for_epoch(epoch, self.log_end_offset)

    def record_at(self, offset: int) -> Record | None:
        if self.start <= offset < self.log_end_offset:
            return self.records[offset - self.start]
        return None

    def append(self, records: list[Record], durable: bool) -> None:
        for r in records:
            assert r[0] == self.log_end_offset, (r, self.log_end_offset)
            self.epochs.assign(r[1], r[0])
            self.records.append(r)
        if durable:
            self.recovery_point = self.log_end_offset

    def assign_leader_epoch(self, epoch: int) -> None:
        self.epochs.assign(epoch, self.log_end_offset)

    def set_high_watermark(self, offset: int) -> None:
        offset = min(offset, self.log_end_offset)
        if offset > self.hw:
            self.hw = offset

    def truncate_to(self, offset: int) -> None:
        if offset >= self.log_end_offset:
            self.epochs.truncate_from_end(self.log_end_offset)  # an epoch begun with no data
            return
        offset = max(offset, self.start)
        del self.records[offset - self.start :]
        leo = self.log_end_offset
        self.epochs.truncate_from_end(leo)
        self.start = min(self.start, leo)
        self.hw = min(self.hw, leo)
        self.recovery_point = min(self.recovery_point, leo)

    def truncate_fully_and_start_at(self, offset: int) -> None:
        self.records = []
        self.start = self.hw = self.recovery_point = offset
        self.epochs.clear()
        self.checkpoint()

    def increment_log_start_offset(self, offset: int) -> bool:
        if offset > self.hw:
            return False  # the real log raises OffsetOutOfRangeError; the caller ignores it
        if offset > self.start:
            del self.records[: offset - self.start]
            self.start = offset
            self.epochs.truncate_from_start(offset)
            self.checkpoint()
        return True

    def flush(self) -> None:
        self.recovery_point = self.log_end_offset

    def checkpoint(self) -> None:
        self.checkpoint_hw = self.hw
        self.checkpoint_start = self.start

    def crash(self, lose_unflushed: bool) -> None:
        """Process death (page cache kept) or power loss (only the fsynced prefix kept), then
        recovery as ``PartitionLog._open`` does it."""
        if lose_unflushed and self.recovery_point < self.log_end_offset:
            del self.records[max(0, self.recovery_point - self.start) :]
        leo = self.log_end_offset
        self.epochs.truncate_from_end(leo)  # the recovery re-derives entries from batches
        self.start = min(max(self.checkpoint_start, self.start), leo)
        self.hw = max(min(self.checkpoint_hw, leo), self.start)
        self.recovery_point = leo


# -- the store ------------------------------------------------------------------------------------


@dataclass
class SimStore:
    """The metadata store's partition row and broker leases, with its compare-and-sets."""

    row: PartitionMeta
    session_timeout_ms: int
    broker_epochs: dict[int, int] = field(default_factory=dict)
    lease_expires_ms: dict[int, int] = field(default_factory=dict)
    version: int = 1
    leader_of_epoch: dict[int, int] = field(default_factory=dict)

    def alive(self, now: int) -> set[int]:
        return {b for b, t in self.lease_expires_ms.items() if t > now}

    def register(self, broker: int, now: int) -> int:
        epoch = self.broker_epochs.get(broker, 0) + 1
        self.broker_epochs[broker] = epoch
        self.lease_expires_ms[broker] = now + self.session_timeout_ms
        self.version += 1
        return epoch

    def heartbeat(self, broker: int, epoch: int, now: int) -> bool:
        if self.broker_epochs.get(broker) != epoch or self.lease_expires_ms[broker] <= now:
            return False
        self.lease_expires_ms[broker] = now + self.session_timeout_ms
        return True

    def change_isr(
        self, seen: PartitionMeta, isr: list[int], broker: int, broker_epoch: int, now: int
    ) -> PartitionMeta | None:
        r = self.row
        lease_live = (
            self.broker_epochs.get(broker) == broker_epoch and self.lease_expires_ms[broker] > now
        )
        if (
            r.partition_epoch != seen.partition_epoch
            or r.leader != broker
            or r.leader_epoch != seen.leader_epoch
            or not lease_live
        ):
            return None
        self.row = replace(r, isr=list(isr), partition_epoch=r.partition_epoch + 1)
        self.version += 1
        return self.row

    def apply_controller_change(self, seen_partition_epoch: int, new: PartitionMeta) -> bool:
        if self.row.partition_epoch != seen_partition_epoch:
            return False
        self.row = new
        self.version += 1
        if new.leader != NO_LEADER:
            self.leader_of_epoch.setdefault(new.leader_epoch, new.leader)
        return True


# -- brokers --------------------------------------------------------------------------------------


@dataclass(eq=False)
class Leading:
    replica: LeaderReplica
    active: bool = True
    isr_change_in_flight: bool = False


@dataclass(eq=False)
class Following:
    replica: FollowerReplica
    backoff: bool = False
    in_flight: int | None = None  # id of the fetch awaiting its answer
    sent: FetchPosition | None = None


@dataclass(eq=False)
class SimBroker:
    id: int
    log: SimLog = field(default_factory=SimLog)
    up: bool = True
    paused: bool = False
    incarnation: int = 0
    broker_epoch: int = 0
    last_heartbeat_ms: int = 0
    metadata_version: int = -1
    row: PartitionMeta | None = None
    view_alive: set[int] = field(default_factory=set)
    view_epochs: dict[int, int] = field(default_factory=dict)
    leading: Leading | None = None
    following: Following | None = None
    deferred: list[tuple[Callable[..., None], tuple[Any, ...]]] = field(default_factory=list)
    hw_floor: int = 0  # the HW this incarnation has reached (the invariant's memory)


@dataclass
class Pending:
    """An acks=all produce waiting for the HW."""

    broker: int
    incarnation: int
    leading: Leading
    offset: int
    value: int
    deadline_ms: int


# -- the simulation -------------------------------------------------------------------------------


class Simulation:
    """Run with :meth:`run`; raises :class:`SimulationViolation` naming the seed."""

    # Hooks a negative-control test may replace to prove the checks catch a broken rule.
    follower_truncation: Callable[[PartitionFetchAnswer, SimLog], int] = staticmethod(
        FollowerReplica.truncation_offset
    )
    elect: Callable[[PartitionMeta, set[int], bool, bool], PartitionMeta | None] = staticmethod(
        decide
    )
    complete: Callable[[PartitionMeta, set[int], int], PartitionMeta | None] = staticmethod(
        complete_reassignment
    )

    truncate_to_hw_on_follow = False  # the pre-KIP-101 rule, for a negative control

    def __init__(self, config: SimConfig) -> None:
        self.config = c = config
        self.rng = random.Random(c.seed)
        self.now = 0
        self.step_no = 0
        self._seq = 0
        self._events: list[tuple[int, int, Callable[..., None], tuple[Any, ...]]] = []
        self.trace: deque[str] = deque(maxlen=int(os.environ.get(TRACE_ENV, "60")))
        ids = list(range(1, c.brokers + 1))
        self.brokers = {b: SimBroker(b) for b in ids}
        self.store = SimStore(
            PartitionMeta("t", 0, list(ids), list(ids), ids[0], 0, 0), c.session_timeout_ms
        )
        self.store.leader_of_epoch[0] = ids[0]
        self.cut: set[frozenset[int]] = set()  # cut links; 0 is the store
        self.faults = True
        self.next_value = 0
        self.next_fetch_id = 0
        self.pending: list[Pending] = []
        self.acked: dict[int, int] = {}  # offset -> value of every acknowledged record
        self.acked_lost: dict[int, int] = {}  # lost after an unclean election (reported)
        self.stats = dict.fromkeys(
            ("produced", "acked", "failed", "crashes", "elections", "isr_changes",
             "truncations", "restarts_at", "reassignments", "reassigned", "cancelled",
             "deleted"), 0,
        )  # fmt: skip
        for b in self.brokers.values():
            b.broker_epoch = self.store.register(b.id, 0)
            self._start_timers(b)
        self.schedule(0, self._controller_tick)
        self.schedule(1, self._produce)
        self.schedule(5, self._fault)

    # -- plumbing ----------------------------------------------------------------------------------

    def schedule(self, delay_ms: int, fn: Callable[..., None], *args: Any) -> None:
        self._seq += 1
        heapq.heappush(self._events, (self.now + delay_ms, self._seq, fn, args))

    def log(self, text: str) -> None:
        self.trace.append(f"[{self.step_no} t={self.now}] {text}")

    def fail(self, what: str) -> None:
        trace = "\n  ".join(self.trace)
        brokers = "\n  ".join(self.describe(b) for b in self.brokers.values())
        raise SimulationViolation(
            f"{what}\n  seed={self.config.seed} step={self.step_no} t={self.now}ms "
            f"config={self.config}\n  replay: {SEED_ENV}={self.config.seed} pytest "
            f"tests/cluster/test_replication_sim.py\n  row: {self.store.row}\n  {brokers}"
            f"\n  last events:\n  {trace}"
        )

    @staticmethod
    def describe(b: SimBroker) -> str:
        lg = b.log
        role = "leader" if b.leading else "follower" if b.following else "-"
        state = "up" if b.up and not b.paused else "paused" if b.up else "down"
        return (
            f"b{b.id} {state} {role}: log {lg.start}..{lg.log_end_offset} hw {lg.hw} "
            f"fsynced {lg.recovery_point} epochs {lg.epochs.entries} tail {lg.records[-6:]}"
        )

    def jitter(self, ms: int) -> int:
        return max(1, int(ms * self.rng.uniform(0.7, 1.3)))

    def on_broker(self, b: SimBroker, inc: int, fn: Callable[..., None], *args: Any) -> None:
        """Run ``fn`` as broker ``b`` (incarnation ``inc``) would: not when it died or
        restarted since, later when it is paused."""
        if not b.up or b.incarnation != inc:
            return
        if b.paused:
            b.deferred.append((fn, args))
            return
        fn(*args)

    def send(self, src: int, dst: int, fn: Callable[..., None], *args: Any) -> None:
        """A message from ``src`` to ``dst`` (0 = the store), lost on a cut link or drop."""
        if frozenset((src, dst)) in self.cut or self.rng.random() < self._drop_rate():
            return
        self.schedule(self.rng.randint(1, 15), fn, *args)

    def _drop_rate(self) -> float:
        return self.config.drop_rate if self.faults else 0.0

    def lease_lapsed(self, b: SimBroker) -> bool:
        return self.now - b.last_heartbeat_ms > self.config.session_timeout_ms

    # -- timers --------------------------------------------------------------------------------

    def _start_timers(self, b: SimBroker) -> None:
        inc = b.incarnation
        c = self.config
        self.schedule(self.jitter(c.heartbeat_ms), self.on_broker, b, inc, self._heartbeat, b)
        self.schedule(0, self.on_broker, b, inc, self._refresh, b)
        self.schedule(self.jitter(c.replica_lag_ms // 2), self.on_broker, b, inc, self._isr_tick, b)
        self.schedule(self.jitter(50), self.on_broker, b, inc, self._housekeeping, b)

    def _heartbeat(self, b: SimBroker) -> None:
        self.schedule(
            self.jitter(self.config.heartbeat_ms), self.on_broker, b, b.incarnation,
            self._heartbeat, b,
        )  # fmt: skip
        started, inc, epoch = self.now, b.incarnation, b.broker_epoch

        def at_store() -> None:
            ok = self.store.heartbeat(b.id, epoch, self.now)
            self.send(0, b.id, self.on_broker, b, inc, reply, ok)

        def reply(ok: bool) -> None:
            if b.broker_epoch != epoch:
                return
            if ok:
                b.last_heartbeat_ms = max(b.last_heartbeat_ms, started)
                return
            self.log(f"b{b.id}: lease refused (epoch {epoch}): fenced, registering again")
            self._step_down(b)
            self.send(b.id, 0, register)

        def register() -> None:
            new_epoch = self.store.register(b.id, self.now)
            self.send(0, b.id, self.on_broker, b, inc, registered, new_epoch, started)

        def registered(new_epoch: int, at: int) -> None:
            if new_epoch > b.broker_epoch:
                b.broker_epoch = new_epoch
                b.last_heartbeat_ms = at
                b.metadata_version = -1
                self.log(f"b{b.id}: registered as epoch {new_epoch}")

        self.send(b.id, 0, at_store)

    def _housekeeping(self, b: SimBroker) -> None:
        """Background flush, checkpoint, retention."""
        self.schedule(self.jitter(50), self.on_broker, b, b.incarnation, self._housekeeping, b)
        lg = self.rng.random()
        if lg < 0.5:
            b.log.flush()
        elif lg < 0.8:
            b.log.checkpoint()
        elif self.config.retention and self.faults and b.log.hw > b.log.start:
            new_start = self.rng.randint(b.log.start, b.log.hw)
            b.log.increment_log_start_offset(new_start)
            self.log(f"b{b.id}: retention moves log start to {new_start}")

    # -- metadata (ReplicaManager.apply) -------------------------------------------------------

    def _refresh(self, b: SimBroker) -> None:
        self.schedule(
            self.jitter(self.config.refresh_ms), self.on_broker, b, b.incarnation, self._refresh, b
        )
        if b.metadata_version == self.store.version:
            return
        row = self.store.row
        b.metadata_version = self.store.version
        b.row = row
        b.view_alive = self.store.alive(self.now)
        b.view_epochs = dict(self.store.broker_epochs)
        if b.id not in row.replicas:
            self._stop_roles(b)
            if b.log.records or b.log.start:  # reassigned away: the copy is deleted
                self.log(f"b{b.id}: not a replica any more: deletes its log")
                self.stats["deleted"] += 1
                b.log = SimLog()
                b.hw_floor = 0
            return
        if row.leader == b.id:
            self._lead(b, row)
        elif row.leader != NO_LEADER:
            self._follow(b, row)
        else:
            self._stop_roles(b)

    def _stop_roles(self, b: SimBroker) -> None:
        if b.leading is not None:
            b.leading.active = False
        b.leading = None
        b.following = None

    def _lead(self, b: SimBroker, row: PartitionMeta) -> None:
        state = _state(row)
        cur = b.leading
        if cur is not None and cur.replica.leader_epoch == row.leader_epoch:
            if row.partition_epoch > cur.replica.state.partition_epoch:
                cur.replica.apply(state)
                self._advance(b, cur)
            return
        self._stop_roles(b)
        b.log.assign_leader_epoch(row.leader_epoch)
        replica = LeaderReplica(
            me=b.id,
            state=state,
            min_insync_replicas=self.config.min_insync_replicas,
            replica_lag_time_max_ms=self.config.replica_lag_ms,
            now_ms=self.now,
            high_watermark=b.log.hw,
            epoch_start_offset=b.log.log_end_offset,
            fsync_durability=self.config.fsync,
        )
        b.leading = Leading(replica)
        self.log(
            f"b{b.id}: leads epoch {row.leader_epoch} isr {row.isr} hw {b.log.hw} "
            f"leo {b.log.log_end_offset}"
        )
        self._advance(b, b.leading)

    def _follow(self, b: SimBroker, row: PartitionMeta) -> None:
        cur = b.following
        if cur is not None and (cur.replica.leader, cur.replica.leader_epoch) == (
            row.leader,
            row.leader_epoch,
        ):
            cur.backoff = False
            return
        self._stop_roles(b)
        if self.truncate_to_hw_on_follow:
            b.log.truncate_to(b.log.hw)
        b.following = Following(FollowerReplica(b.id, row.leader, row.leader_epoch))
        self.schedule(0, self.on_broker, b, b.incarnation, self._fetch, b, b.following)

    def _step_down(self, b: SimBroker) -> None:
        if b.leading is not None:
            self.log(f"b{b.id}: steps down from epoch {b.leading.replica.leader_epoch}")
            b.leading.active = False
            b.leading = None

    # -- leader --------------------------------------------------------------------------------

    def _advance(self, b: SimBroker, leading: Leading) -> None:
        lg = b.log
        if leading.replica.advance_high_watermark(lg.log_end_offset, lg.recovery_point):
            lg.set_high_watermark(leading.replica.high_watermark)

    def _acting_leader(self, b: SimBroker) -> Leading | None:
        leading = b.leading
        if leading is None or not leading.active or self.lease_lapsed(b):
            return None
        return leading

    def _produce(self) -> None:
        if self.faults or self.rng.random() < 0.2:
            self.schedule(self.jitter(6), self._produce)
        live = [b for b in self.brokers.values() if b.up and not b.paused]
        if not live:
            return
        b = self.rng.choice(live)
        leading = self._acting_leader(b)
        if leading is None:
            return
        replica = leading.replica
        if not replica.enough_replicas:
            return  # NOT_ENOUGH_REPLICAS
        self.next_value += 1
        offset = b.log.log_end_offset
        b.log.append([(offset, replica.leader_epoch, self.next_value)], durable=self.config.fsync)
        self.stats["produced"] += 1
        self.pending.append(
            Pending(
                b.id, b.incarnation, leading, offset, self.next_value,
                self.now + self.config.request_timeout_ms,
            )
        )  # fmt: skip
        self._advance(b, leading)

    def _resolve_pending(self) -> None:
        keep = []
        for p in self.pending:
            b = self.brokers[p.broker]
            if not b.up or b.incarnation != p.incarnation:
                self.stats["failed"] += 1
                continue
            if b.paused:
                keep.append(p)
                continue
            if not p.leading.active or self.lease_lapsed(b):
                self.stats["failed"] += 1  # NOT_LEADER_OR_FOLLOWER
            elif b.log.hw > p.offset:
                old = self.acked.get(p.offset, p.value)
                if old != p.value and self.store.row.unclean_elections:
                    self.acked_lost[p.offset] = old  # overwritten after an unclean election
                elif old != p.value:
                    self.fail(
                        f"offset {p.offset} acknowledged twice: values {self.acked[p.offset]} "
                        f"and {p.value}"
                    )
                self.acked[p.offset] = p.value
                self.stats["acked"] += 1
                self.log(f"b{b.id}: ack offset {p.offset} value {p.value}")
            elif not p.leading.replica.enough_replicas or self.now > p.deadline_ms:
                self.stats["failed"] += 1
            else:
                keep.append(p)
        self.pending = keep

    def _serve_fetch(
        self, b: SimBroker, follower: int, follower_epoch: int, pos: FetchPosition, fid: int,
        reply_inc: int, max_records: int,
    ) -> None:  # fmt: skip
        fb = self.brokers[follower]
        if follower_epoch < b.view_epochs.get(follower, 0):
            return  # 409 stale broker epoch: the fetcher backs off and retries
        leading = self._acting_leader(b)
        lg = b.log
        records: list[Record] = []
        if leading is None:
            answer = PartitionFetchAnswer(FetchError.NOT_LEADER_OR_FOLLOWER, -1, -1, -1)
        else:
            decision = leading.replica.on_fetch(follower, pos, lg, self.now)
            if decision.read_from is not None:
                self._advance(b, leading)
                self._schedule_isr_change(b, leading)
                lo = decision.read_from - lg.start
                records = lg.records[lo : lo + max_records]
            answer = PartitionFetchAnswer(
                decision.error,
                leading.replica.high_watermark,
                lg.log_start_offset,
                lg.log_end_offset,
                decision.diverging_epoch,
                decision.diverging_end_offset,
                len(records),
            )
        self.send(b.id, follower, self.on_broker, fb, reply_inc, self._on_answer, fb, fid,
                  answer, records)  # fmt: skip

    def _schedule_isr_change(self, b: SimBroker, leading: Leading) -> None:
        if leading.isr_change_in_flight:
            return
        proposed = leading.replica.proposed_isr(self.now, b.view_alive)
        if proposed is None:
            return
        leading.isr_change_in_flight = True
        state = leading.replica.state
        seen = PartitionMeta(
            "t", 0, list(state.replicas), list(state.isr), state.leader, state.leader_epoch,
            state.partition_epoch,
        )  # fmt: skip
        epoch, inc = b.broker_epoch, b.incarnation

        def at_store() -> None:
            row = self.store.change_isr(seen, list(proposed), b.id, epoch, self.now)
            self.send(0, b.id, self.on_broker, b, inc, done, row)

        def done(row: PartitionMeta | None) -> None:
            leading.isr_change_in_flight = False
            if row is None:
                return
            if leading.active and leading.replica.leader_epoch == row.leader_epoch:
                self.log(f"b{b.id}: ISR {list(state.isr)} -> {row.isr}")
                self.stats["isr_changes"] += 1
                leading.replica.apply(_state(row))
                self._advance(b, leading)

        def timeout() -> None:  # the store call failed (KafkaStorageError)
            leading.isr_change_in_flight = False

        self.send(b.id, 0, at_store)
        self.schedule(self.config.request_timeout_ms, timeout)

    def _isr_tick(self, b: SimBroker) -> None:
        self.schedule(
            self.jitter(self.config.replica_lag_ms // 2), self.on_broker, b, b.incarnation,
            self._isr_tick, b,
        )  # fmt: skip
        if b.leading is not None and b.leading.active:
            self._schedule_isr_change(b, b.leading)

    # -- follower ------------------------------------------------------------------------------

    def _fetch(self, b: SimBroker, f: Following) -> None:
        if b.following is not f or f.in_flight is not None:
            return
        if f.backoff:
            return  # until a metadata change names the leader again (_follow clears it)
        lg = b.log
        pos = f.replica.position(lg, lg.latest_epoch, lg.recovery_point, lg.hw)
        self.next_fetch_id += 1
        fid = f.in_flight = self.next_fetch_id
        f.sent = pos
        leader = self.brokers[f.replica.leader]
        self.send(
            b.id, leader.id, self.on_broker, leader, leader.incarnation, self._serve_fetch,
            leader, b.id, b.broker_epoch, pos, fid, b.incarnation, self.rng.randint(1, 4),
        )  # fmt: skip
        self.schedule(self.config.fetch_timeout_ms, self.on_broker, b, b.incarnation,
                      self._fetch_timeout, b, f, fid)  # fmt: skip

    def _fetch_timeout(self, b: SimBroker, f: Following, fid: int) -> None:
        if f.in_flight == fid:
            f.in_flight = None
            self._fetch(b, f)

    def _on_answer(
        self, b: SimBroker, fid: int, answer: PartitionFetchAnswer, records: list[Record]
    ) -> None:
        f = b.following
        if f is None or f.in_flight != fid or f.sent is None:
            return  # timed out, or the role changed while the fetch was out
        f.in_flight = None
        lg = b.log
        action = f.replica.on_answer(f.sent, answer, lg)
        again = self.rng.randint(1, 10)
        if action.kind is FollowerActionKind.BACK_OFF:
            if action.error in (FetchError.FENCED_LEADER_EPOCH, FetchError.NOT_LEADER_OR_FOLLOWER):
                f.backoff = True
                b.metadata_version = -1
            again = 30
        elif action.kind is FollowerActionKind.TRUNCATE:
            offset = action.offset
            if answer.diverging_end_offset >= 0:
                offset = type(self).follower_truncation(answer, lg)
            self.log(
                f"b{b.id}: truncate to {offset} (leo {lg.log_end_offset}, hw {lg.hw}, "
                f"diverging {answer.diverging_epoch}@{answer.diverging_end_offset})"
            )
            lg.truncate_to(offset)
            self.stats["truncations"] += 1
        elif action.kind is FollowerActionKind.RESTART_AT:
            self.log(f"b{b.id}: restart log at {action.offset} (leo {lg.log_end_offset})")
            lg.truncate_fully_and_start_at(action.offset)
            self.stats["restarts_at"] += 1
        else:
            if records:
                lg.append(list(records), durable=self.config.fsync)
            lg.set_high_watermark(FollowerReplica.high_watermark(answer, lg.log_end_offset))
            if answer.log_start_offset > lg.log_start_offset:  # after the HW, as the shell does
                lg.increment_log_start_offset(answer.log_start_offset)
            if not records:
                again = self.rng.randint(5, 20)  # the long poll came back empty
        self.schedule(again, self.on_broker, b, b.incarnation, self._fetch, b, f)

    # -- controller ----------------------------------------------------------------------------

    def _controller_tick(self) -> None:
        self.schedule(self.jitter(self.config.controller_ms), self._controller_tick)
        row = self.store.row
        live = self.store.alive(self.now)
        rebalance = self.config.rebalance and self.rng.random() < 0.1
        new = type(self).elect(row, live, self.config.unclean, rebalance)
        new = type(self).complete(new or row, live, self.config.min_insync_replicas) or new
        if new is not None:
            # The pass writes a little later (its own transaction): the row may have moved
            # meanwhile (the CAS refuses it) and a broker it saw live may have expired since.
            self.schedule(self.rng.randint(0, 10), self._controller_apply, row, new, live)

    def _controller_apply(self, row: PartitionMeta, new: PartitionMeta, live: set[int]) -> None:
        if self.store.apply_controller_change(row.partition_epoch, new):
            if new.leader_epoch != row.leader_epoch:
                self.stats["elections"] += 1
            if row.reassigning and not new.reassigning:
                self.stats["reassigned"] += 1
            self.log(
                f"controller: leader {row.leader}->{new.leader} epoch {new.leader_epoch} "
                f"isr {row.isr}->{new.isr} replicas {row.replicas}->{new.replicas} "
                f"live {sorted(live)}"
                + (" UNCLEAN" if new.unclean_elections > row.unclean_elections else "")
            )

    def _reassign(self) -> None:
        """An admin call: a new target (validated as the broker does), or a cancellation."""
        row = self.store.row
        live = self.store.alive(self.now)
        min_isr = self.config.min_insync_replicas
        if row.reassigning and self.rng.random() < 0.3:
            try:
                new = cancel_reassignment(row, live, min_isr)
            except ReassignmentConflict as e:
                self.log(f"admin: cancel refused: {e}")
                return
            self.stats["cancelled"] += 1
        else:
            ids = list(self.brokers)
            size = self.rng.randint(min(min_isr, len(ids)), len(ids))
            target = self.rng.sample(ids, size)
            brokers = {b: b in live for b in ids}
            try:
                validate_target(row, target, brokers, min_isr)
            except ReassignmentError as e:
                self.log(f"admin: reassignment to {target} refused: {e}")
                return
            started = start_reassignment(row, target)
            if started is None:
                return
            new = started
            self.stats["reassignments"] += 1
        self.log(
            f"admin: replicas {row.replicas}->{new.replicas} adding {new.adding_replicas} "
            f"removing {new.removing_replicas}"
        )
        self.schedule(self.rng.randint(0, 10), self._controller_apply, row, new, live)

    # -- faults --------------------------------------------------------------------------------

    def _fault(self) -> None:
        if not self.faults:
            return
        self.schedule(self.jitter(40), self._fault)
        if self.config.reassign and self.rng.random() < 0.25:
            self._reassign()
            return
        r = self.rng.random()
        up = [b for b in self.brokers.values() if b.up]
        down = [b for b in self.brokers.values() if not b.up]
        if r < 0.25 and len(up) > 1:
            self._crash(self.rng.choice(up))
        elif r < 0.5 and down:
            self._restart(self.rng.choice(down))
        elif r < 0.6:
            b = self.rng.choice(list(self.brokers.values()))
            if b.paused:
                self._resume(b)
            elif b.up:
                self.log(f"b{b.id}: paused")
                b.paused = True
        elif r < 0.75:
            ends = [0, *self.brokers]
            x, y = self.rng.sample(ends, 2)
            self.cut.add(frozenset((x, y)))
            self.log(f"link {x}-{y} cut")
        elif r < 0.9 and self.cut:
            link = self.rng.choice(sorted(self.cut, key=sorted))
            self.cut.discard(link)
            self.log(f"link {'-'.join(map(str, sorted(link)))} healed")
        elif self.config.power_loss and self.config.fsync and r < 0.93:
            self.log("power loss of every broker")
            for b in up:
                self._crash(b, power=True)

    def _crash(self, b: SimBroker, power: bool | None = None) -> None:
        if power is None:
            power = self.config.power_loss and self.rng.random() < 0.5
        before = b.log.log_end_offset
        b.log.crash(lose_unflushed=power)
        self.log(
            f"b{b.id}: {'power loss' if power else 'crash'} (leo {before} -> "
            f"{b.log.log_end_offset}, hw {b.log.hw})"
        )
        self.stats["crashes"] += 1
        self._stop_roles(b)
        b.up = False
        b.paused = False
        b.deferred.clear()
        b.incarnation += 1

    def _restart(self, b: SimBroker) -> None:
        b.up = True
        b.incarnation += 1
        b.broker_epoch = self.store.register(b.id, self.now)
        b.last_heartbeat_ms = self.now
        b.metadata_version = -1
        b.hw_floor = b.log.hw
        self.log(f"b{b.id}: restarted (epoch {b.broker_epoch}, leo {b.log.log_end_offset})")
        self._start_timers(b)

    def _resume(self, b: SimBroker) -> None:
        b.paused = False
        self.log(f"b{b.id}: resumed")
        for fn, args in b.deferred:
            self.schedule(0, self.on_broker, b, b.incarnation, fn, *args)
        b.deferred.clear()

    def _heal(self) -> None:
        self.faults = False
        self.cut.clear()
        for b in self.brokers.values():
            if not b.up:
                self._restart(b)
            elif b.paused:
                self._resume(b)
        self.log("quiet: every broker up, every link healed")

    # -- invariants ----------------------------------------------------------------------------

    def check(self) -> None:
        store = self.store
        row = store.row
        if row.leader != NO_LEADER and store.leader_of_epoch.get(row.leader_epoch) != row.leader:
            self.fail(f"epoch {row.leader_epoch} has two leaders in the store")
        acting: dict[int, int] = {}
        for b in self.brokers.values():
            if b.up and b.leading is not None and b.leading.active:
                e = b.leading.replica.leader_epoch
                if acting.setdefault(e, b.id) != b.id:
                    self.fail(f"brokers {acting[e]} and {b.id} both lead epoch {e}")
                if store.leader_of_epoch.get(e) != b.id:
                    self.fail(f"b{b.id} leads epoch {e}, which the store gave to another")
        if row.unclean_elections:
            return  # loss allowed (and reported); convergence is checked at the end
        for b in self.brokers.values():
            if not b.up:
                continue
            if b.log.hw < b.hw_floor:
                self.fail(f"b{b.id}: HW went back from {b.hw_floor} to {b.log.hw}")
            b.hw_floor = b.log.hw
        live_isr = [self.brokers[i] for i in row.isr if self.brokers[i].up]
        for b in live_isr:
            self._check_holds_acked(b)
        up = [b for b in self.brokers.values() if b.up]
        for i, a in enumerate(up):
            for b in up[i + 1 :]:
                lo = max(a.log.start, b.log.start)
                hi = min(a.log.hw, b.log.hw)
                if hi > lo and (
                    a.log.records[lo - a.log.start : hi - a.log.start]
                    != b.log.records[lo - b.log.start : hi - b.log.start]
                ):
                    self.fail(f"b{a.id} and b{b.id} differ below their HWs ({lo}..{hi})")

    def _check_holds_acked(self, b: SimBroker) -> None:
        lg = b.log
        for offset, value in self.acked.items():
            if offset < lg.start:
                continue
            rec = lg.record_at(offset)
            if rec is None or rec[2] != value:
                self.fail(
                    f"ISR member b{b.id} lost acknowledged offset {offset} (value {value}): "
                    f"has {rec}, log {lg.start}..{lg.log_end_offset} hw {lg.hw}"
                )

    def converged(self) -> bool:
        row = self.store.row
        bs = [self.brokers[i] for i in row.replicas]
        if sorted(row.isr) != sorted(row.replicas) or row.leader == NO_LEADER:
            return False
        if row.reassigning:
            return False
        for other in self.brokers.values():
            if other.id not in row.replicas and (not other.up or other.log.records):
                return False  # a removed replica has not deleted its copy yet
        first = bs[0].log
        for b in bs:
            lg = b.log
            if not b.up or lg.hw != lg.log_end_offset or lg.log_end_offset != first.log_end_offset:
                return False
            lo = max(lg.start, first.start)
            if lg.records[lo - lg.start :] != first.records[lo - first.start :]:
                return False
        leader = self.brokers[row.leader]
        return leader.leading is not None and leader.leading.active

    def final_check(self) -> None:
        if not self.converged():
            desc = "; ".join(
                f"b{b.id}: start {b.log.start} hw {b.log.hw} leo {b.log.log_end_offset} "
                f"epochs {b.log.epochs.entries}"
                for b in self.brokers.values()
            )
            self.fail(f"no convergence after the quiet period: row {self.store.row}; {desc}")
        leader = self.brokers[self.store.row.leader].log
        for offset, value in self.acked.items():
            rec = leader.record_at(offset)
            if offset >= leader.start and (rec is None or rec[2] != value):
                self.acked_lost[offset] = value
        if self.acked_lost and not self.store.row.unclean_elections:
            self.fail(f"acknowledged records lost without an unclean election: {self.acked_lost}")

    # -- driver --------------------------------------------------------------------------------

    def step(self) -> None:
        t, _, fn, args = heapq.heappop(self._events)
        self.now = t
        self.step_no += 1
        fn(*args)
        self._resolve_pending()
        self.check()

    def run(self) -> Simulation:
        for _ in range(self.config.steps):
            self.step()
        self._heal()
        quiet_until = self.now + self.config.quiet_ms
        while self.now < quiet_until:
            self.step()
            if not self.pending and self.converged() and not self.faults:
                break
        self.final_check()
        return self


def _state(row: PartitionMeta) -> PartitionState:
    return PartitionState(
        tuple(row.replicas), tuple(row.isr), row.leader, row.leader_epoch, row.partition_epoch
    )


def seeds(default: range) -> list[int]:
    """The seeds to run: ``LOGBUS_SIM_SEED`` (one seed, to replay a failure) or ``default``."""
    one = os.environ.get(SEED_ENV)
    return [int(one)] if one else list(default)


def run_seed(seed: int, steps: int = 300, **overrides: Any) -> Simulation:
    return Simulation(SimConfig.from_seed(seed, steps, **overrides)).run()
