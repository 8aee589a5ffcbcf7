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
3. **Even out**, always from the most loaded member: find the shortest chain of moves
   ``src → … → dst`` (each link a partition the one member holds and the next may hold) that
   ends at a member holding at least two fewer, and shift one partition along each link —
   only ``src`` loses and only ``dst`` gains. Each shift lowers the sum of squared counts, so
   this ends; it stops when no member can shed a partition that way.

With identical subscriptions the counts differ by at most one, and a member that leaves has only
its own partitions spread over the others. With differing subscriptions the result is balanced
as far as eligibility allows. The cost is O(P · M) for P partitions and M members, bounded by
the group and partition limits (:data:`cluster.group.MAX_MEMBERS`, 10,000 partitions a topic).
"""

from __future__ import annotations

from collections.abc import Mapping, Set

TopicPartition = tuple[str, int]
Assignment = dict[str, set[TopicPartition]]


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
    result: Assignment = {m: set() for m in members}
    if not members:
        return result
    eligible: dict[str, list[str]] = {}
    for topic in sorted({t for ts in subscriptions.values() for t in ts}):
        if partition_counts.get(topic, 0) > 0:
            eligible[topic] = [m for m in members if topic in subscriptions[m]]
    partitions = [(t, p) for t in eligible for p in range(partition_counts[t])]
    owner: dict[TopicPartition, str] = {}
    for m in members:
        for tp in sorted(current.get(m, ())):
            valid = tp[0] in subscriptions[m] and tp[1] < partition_counts.get(tp[0], 0)
            if valid and tp not in owner:
                owner[tp] = m
                result[m].add(tp)

    for tp in partitions:
        if tp not in owner:
            m = min(eligible[tp[0]], key=lambda c: (len(result[c]), c))
            owner[tp] = m
            result[m].add(tp)

    _even_out(result, eligible, len(partitions))
    return result


def _even_out(result: Assignment, eligible: Mapping[str, list[str]], partitions: int) -> None:
    budget = partitions * max(1, len(result))  # a bound; each shift lowers Σ count²
    while budget > 0:
        budget -= 1
        for src in sorted(result, key=lambda m: (-len(result[m]), m)):
            path = _chain(result, eligible, src)
            if path:
                for tp, giver, taker in path:
                    result[giver].discard(tp)
                    result[taker].add(tp)
                break
        else:
            return


def _chain(
    result: Assignment, eligible: Mapping[str, list[str]], src: str
) -> list[tuple[TopicPartition, str, str]] | None:
    """The shortest chain of moves from ``src`` to a member holding ≤ len(src) - 2 (BFS)."""
    goal = len(result[src]) - 2
    if goal < 0:
        return None
    came_from: dict[str, tuple[TopicPartition, str] | None] = {src: None}
    frontier = [src]
    while frontier:
        nxt: list[str] = []
        for giver in frontier:
            by_topic: dict[str, TopicPartition] = {}
            for tp in result[giver]:
                if tp[0] not in by_topic or tp > by_topic[tp[0]]:
                    by_topic[tp[0]] = tp  # move the highest partition of each topic
            for topic in sorted(by_topic):
                for taker in eligible[topic]:
                    if taker in came_from:
                        continue
                    came_from[taker] = (by_topic[topic], giver)
                    if len(result[taker]) <= goal:
                        return _unwind(came_from, taker)
                    nxt.append(taker)
        frontier = nxt
    return None


def _unwind(
    came_from: dict[str, tuple[TopicPartition, str] | None], end: str
) -> list[tuple[TopicPartition, str, str]]:
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
