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

Every leader change bumps the leader epoch; every change bumps the partition epoch.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterable
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
    ) -> None:
        self.store = store
        self.broker_id = broker_id
        self.lease_ms = lease_ms
        self.interval_ms = interval_ms
        self.rebalance_interval_ms = rebalance_interval_ms
        self.auto_rebalance = auto_rebalance
        self.unclean_for = unclean_for
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
            for row in topic.assignments:
                new = decide(row, live, unclean, rebalance)
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
                "%s-%d: leader %d (epoch %d), isr %s%s",
                row.topic,
                row.partition,
                row.leader,
                row.leader_epoch,
                row.isr,
                " (unclean)" if row.unclean_elections else "",
            )
        if applied:
            self.changed.set()
        return applied

    async def resign(self) -> None:
        if self.epoch is not None:
            await asyncio.to_thread(self.store.resign_controller, self.broker_id, self.epoch)
            self.epoch = None


def live_placement(brokers: Iterable[BrokerMeta]) -> list[tuple[int, str | None]]:
    """(id, rack) of the live brokers, for :func:`assign_replicas`."""
    return [(b.broker_id, b.rack) for b in brokers if b.alive]
