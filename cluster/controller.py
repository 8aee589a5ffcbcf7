"""The controller: replica placement, leader election, fenced brokers, preferred leaders.

One broker at a time holds the controller lease (a row in the metadata store renewed by
compare-and-set, judged by the database's clock). Its decisions are pure functions of the
partition rows and the live brokers, written back in one transaction per pass, each row a
compare-and-set on the partition epoch it was computed from and the whole pass valid only under
a live lease (:meth:`cluster.metadata.MetadataStore.apply_controller_changes`) — a controller
that lost its lease, or a row that moved meanwhile, changes nothing.

Rules (Kafka's KRaft controller):

* **Placement** (:func:`assign_replicas`): replicas of each partition on distinct brokers,
  spread over racks first (Kafka's rack-alternated broker list), the first replica — the
  preferred leader — rotating so leaders are balanced.
* **Fenced broker** (lease expired): removed from every ISR it is in (the ISR never becomes
  empty); where it led, a new leader is elected from the rest of the ISR in replica order.
* **No live ISR member**: with ``unclean.leader.election.enable=false`` (the default) the
  partition goes offline (leader -1) keeping its last ISR, so the replica that has every
  committed record leads when it returns. With it on, the first live replica leads with an ISR
  of itself, and the row counts the unclean election (data may have been lost).
* **Offline partition** whose ISR member is back: that member leads.
* **Preferred leader** (``auto.leader.rebalance.enable``): a partition led by another broker
  while its first replica is live and in the ISR moves back to it.
* **Reassignment** (KIP-455; the admin call ``PUT …/partitions/{p}/replicas`` is answered by
  the controller's broker): from original replicas O to target T in two steps, each one
  compare-and-set on the partition epoch.

  1. :func:`start_reassignment`: replicas = T followed by O - T, ``adding_replicas`` = T - O,
     ``removing_replicas`` = O - T; ISR and leader unchanged. Every broker in the replicas
     keeps (or creates) a replica and follows the leader, so the new ones copy the log.
  2. :func:`complete_reassignment`, on a controller pass once every adding replica is in the
     ISR (the leader added it: it holds everything committed): replicas = T, ISR = ISR ∩ T, and
     a leader outside T hands over to the first live member of ISR ∩ T (new leader epoch).
     Brokers no longer in the replicas stop following and delete their copy.

  A step that would leave fewer in-sync replicas than ``min.insync.replicas`` (or than the
  ISR had, if it was already below) waits instead, so no acknowledged record depends on a
  replica the reassignment removes. A new reassignment of a partition that is being
  reassigned starts over from its current replicas, keeping every in-sync one until the new
  target is in sync; :func:`cancel_reassignment` goes back to O (refused while that would
  drop the ISR below the minimum).

Every leader change bumps the leader epoch; every change bumps the partition epoch.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterable, Mapping
from dataclasses import replace

from .metadata import BrokerMeta, ConcurrentUpdateError, MetadataStore, PartitionMeta
from .replication import NO_LEADER

log = logging.getLogger("logbus.controller")


def assign_replicas(
    brokers: list[tuple[int, str | None]], partitions: int, replication_factor: int, start: int
) -> list[list[int]]:
    """Replica lists for ``partitions`` new partitions over ``brokers`` ((id, rack) pairs).

    Raises ValueError when there are fewer brokers than ``replication_factor``."""
    if replication_factor > len(brokers):
        raise ValueError(
            f"replication factor {replication_factor} is larger than the "
            f"{len(brokers)} available brokers"
        )
    ordered = _rack_alternated(brokers)
    rack_of = dict(brokers)
    n = len(ordered)
    out = []
    for p in range(partitions):
        first = (start + p) % n
        # Kafka shifts followers by a per-round offset so they are spread as well as leaders.
        shift = 1 + ((start + p) // n) % max(1, n - 1)
        replicas = [ordered[first]]
        racks = {rack_of[ordered[first]]}
        all_racks = len(set(rack_of.values()))
        j = first
        while len(replicas) < replication_factor:
            j = (j + shift) % n
            for k in range(n):  # the next broker not chosen, on an unused rack if any is left
                candidate = ordered[(j + k) % n]
                fresh_rack = rack_of[candidate] not in racks or len(racks) == all_racks
                if candidate not in replicas and fresh_rack:
                    break
            replicas.append(candidate)
            racks.add(rack_of[candidate])
            j = (j + k) % n
        out.append(replicas)
    return out


def _rack_alternated(brokers: list[tuple[int, str | None]]) -> list[int]:
    """Broker ids ordered so consecutive ones sit on different racks where possible."""
    by_rack: dict[str | None, list[int]] = {}
    for broker_id, rack in sorted(brokers):
        by_rack.setdefault(rack, []).append(broker_id)
    racks = [by_rack[r] for r in sorted(by_rack, key=lambda r: (r is None, r or ""))]
    out: list[int] = []
    for i in range(max(len(r) for r in racks)):
        out.extend(r[i] for r in racks if i < len(r))
    return out


def decide(
    row: PartitionMeta, live: set[int], unclean_allowed: bool, rebalance: bool
) -> PartitionMeta | None:
    """The controller's new row for ``row`` given the live brokers, or None to keep it."""
    isr = [b for b in row.isr if b in live]
    leader_live = row.leader in live
    if leader_live and row.leader in isr:
        if rebalance:
            preferred = row.replicas[0]
            if preferred != row.leader and preferred in isr:
                return _lead(row, preferred, isr)
        if isr != row.isr:  # only followers were fenced
            return replace(row, isr=isr, partition_epoch=row.partition_epoch + 1)
        return None
    candidates = [b for b in row.replicas if b in isr]
    if candidates:
        return _lead(row, candidates[0], isr)
    if unclean_allowed:
        live_replicas = [b for b in row.replicas if b in live]
        if live_replicas:
            new = _lead(row, live_replicas[0], [live_replicas[0]])
            return replace(new, unclean_elections=row.unclean_elections + 1)
    if row.leader == NO_LEADER:
        return None  # already offline; its last ISR is kept for the member's return
    last_isr = row.isr if row.isr else [row.leader]
    return replace(
        row,
        leader=NO_LEADER,
        isr=list(last_isr),
        leader_epoch=row.leader_epoch + 1,
        partition_epoch=row.partition_epoch + 1,
    )


class ReassignmentError(ValueError):
    """A target replica list that cannot be used (the API answers 400 with the message)."""


class ReassignmentConflict(ValueError):
    """A cancellation that cannot be made now (none in progress, or it would shrink the ISR
    below ``min.insync.replicas``); the message says which."""

    def __init__(self, message: str, *, in_progress: bool) -> None:
        super().__init__(message)
        self.in_progress = in_progress


def validate_target(
    row: PartitionMeta, target: list[int], brokers: Mapping[int, bool], min_insync: int
) -> None:
    """Raise :class:`ReassignmentError` unless ``target`` may become the partition's replicas.

    ``brokers``: every registered broker id → whether its lease is live. A broker being added
    must be live (it has to copy the log from the leader); one the partition has already may be
    down (it catches up when it returns). Any replication factor is allowed, as in Kafka, but
    not one below ``min.insync.replicas``: ``acks=all`` could never succeed again."""
    if not target:
        raise ReassignmentError("replicas must name at least one broker")
    twice = sorted({b for b in target if target.count(b) > 1})
    if twice:
        raise ReassignmentError(f"replicas {target} name broker(s) {twice} more than once")
    unknown = [b for b in target if b not in brokers]
    if unknown:
        raise ReassignmentError(
            f"unknown broker id(s) {unknown}; registered brokers are {sorted(brokers)}"
        )
    dead = [b for b in target if b not in row.replicas and not brokers[b]]
    if dead:
        raise ReassignmentError(
            f"broker(s) {dead} are not alive: a new replica copies the log from the leader, "
            f"so it must be running"
        )
    if len(target) < min_insync:
        raise ReassignmentError(
            f"{len(target)} replica(s) is fewer than the topic's min.insync.replicas="
            f"{min_insync}: acks=all writes could never succeed"
        )


def start_reassignment(row: PartitionMeta, target: list[int]) -> PartitionMeta | None:
    """Step 1: the row with ``target`` being reassigned to (None: nothing to change).

    A reassignment already in progress is replaced: its adding replicas that are not in sync
    yet are dropped (they hold nothing anybody depends on); the in-sync ones count as original
    replicas, removed only once the new target is in sync. So the ISR and the leader never
    change here. A new order of the same brokers is applied at once."""
    if target == row.target_replicas:
        return None
    original = [b for b in row.replicas if b not in row.adding_replicas or b in row.isr]
    adding = [b for b in target if b not in original]
    removing = [b for b in original if b not in target]
    return replace(
        row,
        replicas=[*target, *removing],
        adding_replicas=adding,
        removing_replicas=removing,
        partition_epoch=row.partition_epoch + 1,
    )


def complete_reassignment(
    row: PartitionMeta, live: set[int], min_insync: int
) -> PartitionMeta | None:
    """Step 2, once every adding replica is in the ISR: the row with the target replicas only
    (None: not yet, or nothing in progress)."""
    if not row.reassigning or any(b not in row.isr for b in row.adding_replicas):
        return None
    return _shrink(row, row.target_replicas, live, min_insync)


def cancel_reassignment(row: PartitionMeta, live: set[int], min_insync: int) -> PartitionMeta:
    """The row back on its original replicas (Kafka's revert: replicas - adding)."""
    if not row.reassigning:
        raise ReassignmentConflict(
            f"{row.topic}-{row.partition} has no reassignment in progress", in_progress=False
        )
    original = [b for b in row.replicas if b not in row.adding_replicas]
    new = _shrink(row, original, live, min_insync)
    if new is None:
        raise ReassignmentConflict(
            f"cancelling would leave {row.topic}-{row.partition} with in-sync replicas "
            f"{[b for b in row.isr if b in original]} of {original} (ISR now {row.isr}, "
            f"min.insync.replicas={min_insync}) or no live leader; wait for the original "
            f"replicas to catch up, or reassign to another target",
            in_progress=True,
        )
    return new


def _shrink(
    row: PartitionMeta, replicas: list[int], live: set[int], min_insync: int
) -> PartitionMeta | None:
    """``row`` reduced to ``replicas`` (no reassignment in progress), or None while that would
    take the ISR below min(its size, ``min_insync``) or leave a led partition no live leader."""
    isr = [b for b in replicas if b in row.isr]
    if not isr or len(isr) < min(len(row.isr), min_insync):
        return None
    leader, leader_epoch = row.leader, row.leader_epoch
    if leader != NO_LEADER and leader not in replicas:
        candidates = [b for b in isr if b in live]
        if not candidates:
            return None
        leader, leader_epoch = candidates[0], leader_epoch + 1
    return replace(
        row,
        replicas=list(replicas),
        isr=isr,
        leader=leader,
        leader_epoch=leader_epoch,
        partition_epoch=row.partition_epoch + 1,
        adding_replicas=[],
        removing_replicas=[],
    )


def drain_plan(
    rows: Iterable[PartitionMeta], broker_id: int, brokers: list[tuple[int, str | None]]
) -> dict[tuple[str, int], list[int]]:
    """New target replicas moving every replica off ``broker_id`` (``logbus cluster drain``).

    Each replica on it is replaced, in place (so a preferred leader's replacement is preferred
    in turn), by the live broker of ``brokers`` ((id, rack) pairs) not already a replica that
    holds the fewest replicas so far, on the drained broker's rack if one is free there. Raises
    :class:`ReassignmentError` when a partition has no broker left to move to."""
    rows = list(rows)
    rack_of = dict(brokers)
    load = {b: 0 for b, _ in brokers if b != broker_id}
    for row in rows:
        for b in row.target_replicas:
            if b in load:
                load[b] += 1
    plan: dict[tuple[str, int], list[int]] = {}
    for row in rows:
        target = row.target_replicas
        if broker_id not in target:
            continue
        free = [b for b in load if b not in target]
        if not free:
            raise ReassignmentError(
                f"{row.topic}-{row.partition} has replicas {target}: no other live broker "
                f"can take the replica on broker {broker_id}"
            )
        same_rack = [b for b in free if rack_of.get(b) == rack_of.get(broker_id)]
        pick = min(same_rack or free, key=lambda b: (load[b], b))
        load[pick] += 1
        plan[(row.topic, row.partition)] = [pick if b == broker_id else b for b in target]
    return plan


def _lead(row: PartitionMeta, leader: int, isr: list[int]) -> PartitionMeta:
    return replace(
        row,
        leader=leader,
        isr=list(isr),
        leader_epoch=row.leader_epoch + 1,
        partition_epoch=row.partition_epoch + 1,
    )


class Controller:
    """The controller loop of one broker: try for the lease, and while holding it, look at
    every partition each ``interval_ms``.

    ``unclean_for(topic)`` says whether the topic allows unclean elections."""

    def __init__(
        self,
        store: MetadataStore,
        broker_id: int,
        *,
        lease_ms: int,
        interval_ms: int,
        rebalance_interval_ms: int,
        auto_rebalance: bool,
        unclean_for: Callable[[str], bool],
        monotonic_ms: Callable[[], int],
        min_insync_for: Callable[[str], int] = lambda _topic: 1,
    ) -> None:
        self.store = store
        self.broker_id = broker_id
        self.lease_ms = lease_ms
        self.interval_ms = interval_ms
        self.rebalance_interval_ms = rebalance_interval_ms
        self.auto_rebalance = auto_rebalance
        self.unclean_for = unclean_for
        self.min_insync_for = min_insync_for
        self.monotonic_ms = monotonic_ms
        self.epoch: int | None = None  # the controller epoch while this broker holds the lease
        self._last_rebalance_ms = monotonic_ms()
        self.changed = asyncio.Event()  # set when a pass changed rows (tests wait on it)

    @property
    def active(self) -> bool:
        return self.epoch is not None

    async def run(self) -> None:
        while True:
            try:
                await self.tick()
            except asyncio.CancelledError:
                raise
            except Exception:  # the store is down: keep trying; the lease decides
                log.warning("controller pass failed", exc_info=True)
                self.epoch = None
            await asyncio.sleep(self.interval_ms / 1000)

    async def tick(self) -> None:
        """One pass: hold (or take) the lease, then decide."""
        if self.epoch is not None and not await asyncio.to_thread(
            self.store.renew_controller, self.broker_id, self.epoch, self.lease_ms
        ):
            log.warning("controller lease lost (epoch %d)", self.epoch)
            self.epoch = None
        if self.epoch is None:
            self.epoch = await asyncio.to_thread(
                self.store.acquire_controller, self.broker_id, self.lease_ms
            )
            if self.epoch is None:
                return
            log.info("broker %d is the controller (epoch %d)", self.broker_id, self.epoch)
        await self.decide_all()

    async def decide_all(self) -> list[PartitionMeta]:
        assert self.epoch is not None
        brokers, topics = await asyncio.gather(
            asyncio.to_thread(self.store.brokers), asyncio.to_thread(self.store.topics)
        )
        live = {b.broker_id for b in brokers if b.alive}
        now = self.monotonic_ms()
        rebalance = (
            self.auto_rebalance and now - self._last_rebalance_ms >= self.rebalance_interval_ms
        )
        if rebalance:
            self._last_rebalance_ms = now
        changes: list[tuple[int, PartitionMeta]] = []
        for topic in topics:
            unclean = self.unclean_for(topic.name)
            min_insync = self.min_insync_for(topic.name)
            for row in topic.assignments:
                new = decide(row, live, unclean, rebalance)
                new = complete_reassignment(new or row, live, min_insync) or new
                if new is not None:
                    changes.append((row.partition_epoch, new))
        if not changes:
            return []
        try:
            applied = await asyncio.to_thread(
                self.store.apply_controller_changes, (self.broker_id, self.epoch), changes
            )
        except ConcurrentUpdateError:
            self.epoch = None
            return []
        for row in applied:
            log.info(
                "%s-%d: replicas %s, leader %d (epoch %d), isr %s%s%s",
                row.topic,
                row.partition,
                row.replicas,
                row.leader,
                row.leader_epoch,
                row.isr,
                " (unclean)" if row.unclean_elections else "",
                " (reassigning)" if row.reassigning else "",
            )
        if applied:
            self.changed.set()
        return applied

    async def change(self, seen: PartitionMeta, new: PartitionMeta) -> bool:
        """Write an admin decision about one partition (a reassignment's start or cancellation)
        as the controller: a compare-and-set on ``seen``'s partition epoch under this
        controller's lease. False if the row moved meanwhile; ConcurrentUpdateError if the
        lease is lost, or this broker does not hold it."""
        if self.epoch is None:
            raise ConcurrentUpdateError(f"broker {self.broker_id} is not the controller")
        try:
            applied = await asyncio.to_thread(
                self.store.apply_controller_changes,
                (self.broker_id, self.epoch),
                [(seen.partition_epoch, new)],
            )
        except ConcurrentUpdateError:
            self.epoch = None
            raise
        if applied:
            log.info(
                "%s-%d: replicas %s (adding %s, removing %s)",
                new.topic,
                new.partition,
                new.replicas,
                new.adding_replicas,
                new.removing_replicas,
            )
            self.changed.set()
        return bool(applied)

    async def resign(self) -> None:
        if self.epoch is not None:
            await asyncio.to_thread(self.store.resign_controller, self.broker_id, self.epoch)
            self.epoch = None


def live_placement(brokers: Iterable[BrokerMeta]) -> list[tuple[int, str | None]]:
    """(id, rack) of the live brokers, for :func:`assign_replicas`."""
    return [(b.broker_id, b.rack) for b in brokers if b.alive]
