"""Balanced, sticky assignment of partitions to group members (a pure function).

Theory of operation
-------------------
The coordinator calls :func:`assign` whenever the group's membership, subscriptions or the
partition counts of subscribed topics change. It returns the *target* assignment; members reach
it through revocation and reconciliation (:mod:`cluster.group`), never directly.

1. **Keep** every partition its current owner may still own (subscribed, partition exists) —
   this is what makes a rebalance move as few partitions as it can.
2. **Place** every unowned partition on the eligible member with the fewest partitions (ties go
   to the member id, so the result is deterministic).
3. **Move directly**, always from the most loaded member: give its highest partition of a topic
   to the least loaded member that may hold that topic if that one holds at least two fewer.
   With identical subscriptions this alone balances the group (counts within one), and each
   partition moves at most once: a taker never becomes a giver.
4. **Even out along chains**, always from the most loaded member: find the shortest chain of
   moves ``src → … → dst`` (each link a partition the one member holds and the next may hold)
   that ends at a member holding at least two fewer, and shift one partition along each link —
   only ``src`` loses and only ``dst`` gains. Each shift lowers the sum of squared counts, so
   this ends; it stops when no member can shed a partition that way, which is the optimum (no
   valid assignment has a smaller largest count, then second largest, …).

Cost, for P partitions, M members, T subscribed topics with partitions and E ≤ M·T the
(member, subscribed topic) pairs: steps 1-3 take O((P + E) · log M) — members live in lazy
heaps keyed by (count, id), one per set of members eligible for a topic, and a member's
partitions of a topic in a heap, so no step scans the group. Step 4 costs one breadth-first
search over members and topics, O(E + M · log M) (each topic expands once; members proven
unable to shed in this pass are skipped), per shift plus one for the final check; it only
shifts when subscriptions differ in ways step 3 cannot resolve. Measured with
``python -m benchmarks.assignor``: the group limit (:data:`cluster.group.MAX_MEMBERS`, 1,000)
x 10,000 partitions assigns in well under a second (it took 71-84 s before these heaps).
"""

from __future__ import annotations

import heapq
from collections.abc import Mapping, Set

TopicPartition = tuple[str, int]
Assignment = dict[str, set[TopicPartition]]
Link = tuple[TopicPartition, str, str]  # (partition, giver, taker)


def assign(
    subscriptions: Mapping[str, Set[str]],
    partition_counts: Mapping[str, int],
    current: Mapping[str, Set[TopicPartition]],
) -> Assignment:
    """The target assignment.

    ``subscriptions``: member id → topics it subscribes to; ``partition_counts``: topic →
    partition count (topics missing here have no partitions to assign); ``current``: member id
    → partitions it holds in the present target (for stickiness; members not in
    ``subscriptions`` are ignored). Returns member id → partitions, every member present.
    """
    members = sorted(subscriptions)
    if not members:
        return {}
    eligible: dict[str, tuple[str, ...]] = {}
    for topic in sorted({t for ts in subscriptions.values() for t in ts}):
        if partition_counts.get(topic, 0) > 0:
            eligible[topic] = tuple(m for m in members if topic in subscriptions[m])
    loads = _Loads(members, eligible)
    owned: set[TopicPartition] = set()
    for m in members:
        for tp in sorted(current.get(m, ())):
            valid = tp[0] in subscriptions[m] and tp[1] < partition_counts.get(tp[0], 0)
            if valid and tp not in owned:
                owned.add(tp)
                loads.keep(m, tp)
    loads.index()
    for topic in eligible:
        for p in range(partition_counts[topic]):
            if (topic, p) not in owned:
                loads.give(loads.least_loaded(topic), (topic, p))
    loads.move_directly()
    loads.move_along_chains()
    return loads.result


class _Loads:
    """The assignment being built, with the indexes that keep every step off a full scan.

    ``held[m][topic]`` is a max-heap (negated partition numbers) of m's partitions of
    ``topic``: a member always gives away its highest. ``_pools`` holds, per distinct set of
    members eligible for a topic, a lazy min-heap of (count, member) entries: an entry is live
    while its count is the member's count; every change of a count pushes a fresh entry.
    """

    def __init__(self, members: list[str], eligible: Mapping[str, tuple[str, ...]]) -> None:
        self.members = members
        self.eligible = eligible
        self.result: Assignment = {m: set() for m in members}
        self.held: dict[str, dict[str, list[int]]] = {m: {} for m in members}
        self._pool_of: dict[str, list[tuple[int, str]]] = {}
        self._pools_of_member: dict[str, list[list[tuple[int, str]]]] = {m: [] for m in members}

    def keep(self, member: str, tp: TopicPartition) -> None:
        """Step 1: record a kept partition (the indexes are built once, by :meth:`index`)."""
        self.result[member].add(tp)
        self.held[member].setdefault(tp[0], []).append(-tp[1])

    def index(self) -> None:
        """Build the heaps once every kept partition is in (one heapify each, no pushes)."""
        for by_topic in self.held.values():
            for heap in by_topic.values():
                heapq.heapify(heap)
        pools: dict[tuple[str, ...], list[tuple[int, str]]] = {}
        for topic, who in self.eligible.items():
            if who not in pools:
                pools[who] = [(self.count(m), m) for m in who]
                heapq.heapify(pools[who])
                for m in who:
                    self._pools_of_member[m].append(pools[who])
            self._pool_of[topic] = pools[who]

    def count(self, member: str) -> int:
        return len(self.result[member])

    def give(self, member: str, tp: TopicPartition) -> None:
        self.result[member].add(tp)
        heapq.heappush(self.held[member].setdefault(tp[0], []), -tp[1])
        self._refresh(member)

    def take_highest(self, member: str, topic: str) -> TopicPartition:
        tp = (topic, -heapq.heappop(self.held[member][topic]))
        if not self.held[member][topic]:
            del self.held[member][topic]
        self.result[member].discard(tp)
        self._refresh(member)
        return tp

    def highest(self, member: str, topic: str) -> TopicPartition:
        return (topic, -self.held[member][topic][0])

    def _refresh(self, member: str) -> None:
        entry = (self.count(member), member)
        for pool in self._pools_of_member[member]:
            heapq.heappush(pool, entry)

    def least_loaded(self, topic: str) -> str:
        """The eligible member of ``topic`` with the fewest partitions (ties: lowest id)."""
        pool = self._pool_of[topic]
        while pool[0][0] != self.count(pool[0][1]):
            heapq.heappop(pool)  # stale: a fresher entry of that member is in the heap
        return pool[0][1]

    def move_directly(self) -> None:
        """Step 3: from the most loaded member to the least loaded one that may take it."""
        top = [(-self.count(m), m) for m in self.members]
        heapq.heapify(top)
        while top:
            negative, src = heapq.heappop(top)
            if -negative != self.count(src):
                continue  # stale entry
            goal = self.count(src) - 2
            best: tuple[int, str, str] | None = None
            for topic in sorted(self.held[src]):
                taker = self.least_loaded(topic)
                if self.count(taker) <= goal and (best is None or self.count(taker) < best[0]):
                    best = (self.count(taker), topic, taker)
            if best is None:
                continue  # stuck for now; step 4 has the last word
            _, topic, taker = best
            self.give(taker, self.take_highest(src, topic))
            heapq.heappush(top, (-self.count(src), src))
            heapq.heappush(top, (-self.count(taker), taker))

    def move_along_chains(self) -> None:
        """Step 4: shift along shortest chains, most loaded source first, until none is left."""
        while True:
            dead: set[str] = set()
            for src in sorted(self.members, key=lambda m: (-self.count(m), m)):
                if self.count(src) < 2:
                    return
                if src in dead:
                    continue
                path = self._chain(src, dead)
                if path:
                    for tp, giver, taker in path:
                        self.give(taker, self.take_highest(giver, tp[0]))
                    break
            else:
                return

    def _chain(self, src: str, dead: set[str]) -> list[Link] | None:
        """The shortest chain from ``src`` to a member holding ≤ count(src) - 2 (BFS).

        On failure every member reached joins ``dead``: all it reaches holds ≥ count(src) - 1,
        so no source visited later in the pass (holding ≤ count(src)) can end a chain there.
        """
        goal = self.count(src) - 2
        came_from: dict[str, tuple[TopicPartition, str] | None] = {src: None}
        expanded: set[str] = set()  # topics whose eligible members were all reached already
        frontier = [src]
        while frontier:
            nxt: list[str] = []
            for giver in frontier:
                for topic in sorted(self.held[giver]):
                    if topic in expanded:
                        continue
                    expanded.add(topic)
                    tp = self.highest(giver, topic)
                    for taker in self.eligible[topic]:
                        if taker in came_from or taker in dead:
                            continue
                        came_from[taker] = (tp, giver)
                        if self.count(taker) <= goal:
                            return _unwind(came_from, taker)
                        nxt.append(taker)
            frontier = nxt
        dead.update(came_from)
        return None


def _unwind(came_from: dict[str, tuple[TopicPartition, str] | None], end: str) -> list[Link]:
    path = []
    node = end
    while (step := came_from[node]) is not None:
        tp, giver = step
        path.append((tp, giver, node))
        node = giver
    return path[::-1]


def moved_partitions(before: Mapping[str, Set[TopicPartition]], after: Assignment) -> int:
    """How many partitions changed owner (a partition newly assigned counts too)."""
    old = {tp: m for m, tps in before.items() for tp in tps}
    return sum(1 for m, tps in after.items() for tp in tps if old.get(tp) != m)
