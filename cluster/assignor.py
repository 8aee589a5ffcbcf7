"""Balanced, sticky assignment of partitions to group members (a pure function).

Theory of operation
-------------------
The coordinator calls :func:`assign` whenever the group's membership, subscriptions or the
partition counts of subscribed topics change. It returns the *target* assignment; members reach
it through revocation and reconciliation (:mod:`cluster.group`), never directly.

1. **Keep** every partition its current owner may still own (subscribed, partition exists),
   up to the owner's fair share — this is what makes a rebalance move as few partitions as it
   can.
2. **Place** every unowned partition on the eligible member with the fewest partitions (ties go
   to the member id, so the result is deterministic).
3. **Even out**: while some partition could move from a member holding ``n`` to an eligible
   member holding ``≤ n - 2``, move it. Each move lowers the sum of squared counts, so this ends.

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
    fair = _fair_shares(members, eligible, partition_counts)

    owner: dict[TopicPartition, str] = {}
    for m in members:
        keep = sorted(
            tp
            for tp in current.get(m, ())
            if tp[0] in subscriptions[m] and tp[1] < partition_counts.get(tp[0], 0)
        )
        for tp in keep[: fair[m]]:
            if tp not in owner:
                owner[tp] = m
                result[m].add(tp)

    for tp in partitions:
        if tp not in owner:
            m = min(eligible[tp[0]], key=lambda c: (len(result[c]), c))
            owner[tp] = m
            result[m].add(tp)

    _even_out(result, owner, eligible, partitions)
    return result


def _fair_shares(
    members: list[str], eligible: Mapping[str, list[str]], counts: Mapping[str, int]
) -> dict[str, int]:
    """An upper bound on what each member keeps in step 1: the ceiling of an even split of
    the partitions it could hold among the members that could hold them."""
    share = {m: 0.0 for m in members}
    for topic, ms in eligible.items():
        for m in ms:
            share[m] += counts[topic] / len(ms)
    return {m: -int(-share[m] // 1) for m in members}


def _even_out(
    result: Assignment,
    owner: dict[TopicPartition, str],
    eligible: Mapping[str, list[str]],
    partitions: list[TopicPartition],
) -> None:
    moved = True
    budget = len(partitions) * max(1, len(result))
    while moved and budget > 0:
        moved = False
        for tp in partitions:
            src = owner[tp]
            dst = min(eligible[tp[0]], key=lambda c: (len(result[c]), c))
            if len(result[dst]) + 1 < len(result[src]):
                result[src].discard(tp)
                result[dst].add(tp)
                owner[tp] = dst
                moved = True
                budget -= 1


def moved_partitions(before: Mapping[str, Set[TopicPartition]], after: Assignment) -> int:
    """How many partitions changed owner (a partition newly assigned counts too)."""
    old = {tp: m for m, tps in before.items() for tp in tps}
    return sum(1 for m, tps in after.items() for tp in tps if old.get(tp) != m)
