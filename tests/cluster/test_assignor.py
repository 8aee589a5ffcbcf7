"""The balanced sticky assignor: examples, then Hypothesis properties.

Properties checked over random subscriptions, partition counts and (possibly nonsensical)
current assignments: every partition of a subscribed topic is assigned exactly once, only to a
member subscribed to its topic; identical subscriptions give counts within one of each other;
a member leaving moves only its own partitions; a member joining moves the minimum number of
partitions; growing a topic keeps every existing owner; the result is deterministic.
"""

from __future__ import annotations

import itertools
import random
import time
from collections.abc import Mapping, Set

from hypothesis import example, given, settings
from hypothesis import strategies as st

from cluster.assignor import Assignment, TopicPartition, assign, moved_partitions

MEMBERS = [f"m{i}" for i in range(6)]
TOPICS = ["t0", "t1", "t2", "t3"]
PROPERTY_SETTINGS = settings(max_examples=100, deadline=None)

Subscriptions = dict[str, frozenset[str]]
Counts = dict[str, int]


# -- helpers -------------------------------------------------------------------------------------


def check_valid(
    subs: Mapping[str, Set[str]], counts: Mapping[str, int], result: Assignment
) -> None:
    """Every partition of a subscribed topic exactly once, to a subscriber, and nothing else."""
    assert set(result) == set(subs)
    subscribed = {t for ts in subs.values() for t in ts}
    expected = {(t, p) for t in subscribed for p in range(counts.get(t, 0))}
    owners: dict[TopicPartition, str] = {}
    for m, tps in result.items():
        for tp in tps:
            assert tp not in owners, f"{tp} assigned to {owners[tp]} and {m}"
            assert tp[0] in subs[m], f"{m} got {tp} without subscribing to {tp[0]}"
            owners[tp] = m
    assert set(owners) == expected


def spread(result: Assignment) -> int:
    sizes = [len(tps) for tps in result.values()]
    return max(sizes) - min(sizes) if sizes else 0


def min_moves_after_join(old: Assignment, members: list[str], total: int) -> int:
    """The fewest partitions that must change owner so ``members`` (old ones plus the joiner,
    which owns nothing) end within one of each other.

    A balanced result gives ``total % n`` members the ceiling and the rest the floor. A member
    keeps at most ``min(old, its new count)``; the ceiling helps only members holding more than
    the floor, so give the ceilings to them first.
    """
    n = len(members)
    floor, ceilings = divmod(total, n)
    olds = [len(old.get(m, ())) for m in members]
    kept = sum(min(o, floor) for o in olds) + min(ceilings, sum(1 for o in olds if o > floor))
    return total - kept


def optimal_sizes(subs: Mapping[str, Set[str]], counts: Mapping[str, int]) -> list[int]:
    """Brute force (small inputs only): the lexicographically smallest descending size vector
    any valid assignment reaches."""
    members = sorted(subs)
    partitions = [
        (t, p)
        for t in sorted(counts)
        for p in range(counts[t])
        if any(t in subs[m] for m in members)
    ]
    choices = [[m for m in members if tp[0] in subs[m]] for tp in partitions]
    best: list[int] | None = None
    for combo in itertools.product(*choices):
        sizes = dict.fromkeys(members, 0)
        for m in combo:
            sizes[m] += 1
        vector = sorted(sizes.values(), reverse=True)
        if best is None or vector < best:
            best = vector
    assert best is not None
    return best


# -- strategies ----------------------------------------------------------------------------------

counts_st = st.fixed_dictionaries({t: st.integers(0, 12) for t in TOPICS})
topic_set_st = st.frozensets(st.sampled_from(TOPICS), min_size=1)


@st.composite
def heterogeneous(draw: st.DrawFn) -> tuple[Subscriptions, Counts]:
    members = draw(st.lists(st.sampled_from(MEMBERS), min_size=1, max_size=6, unique=True))
    return {m: draw(topic_set_st) for m in members}, draw(counts_st)


@st.composite
def identical(draw: st.DrawFn, min_members: int = 1) -> tuple[Subscriptions, Counts]:
    members = draw(
        st.lists(st.sampled_from(MEMBERS), min_size=min_members, max_size=6, unique=True)
    )
    topics = draw(topic_set_st)
    return dict.fromkeys(members, topics), draw(counts_st)


@st.composite
def any_current(draw: st.DrawFn) -> dict[str, set[TopicPartition]]:
    """Arbitrary, even inconsistent, current assignments: shared partitions, partitions past
    the topic's end, members that are gone."""
    tp = st.tuples(st.sampled_from(TOPICS), st.integers(0, 14))
    return draw(st.dictionaries(st.sampled_from([*MEMBERS, "gone"]), st.sets(tp, max_size=10)))


# -- examples ------------------------------------------------------------------------------------


def test_even_split_of_one_topic() -> None:
    subs = dict.fromkeys(["a", "b", "c"], frozenset({"t"}))
    result = assign(subs, {"t": 6}, {})
    check_valid(subs, {"t": 6}, result)
    assert [len(result[m]) for m in "abc"] == [2, 2, 2]


def test_remainder_goes_to_some_members_only() -> None:
    subs = dict.fromkeys(["a", "b", "c"], frozenset({"t"}))
    result = assign(subs, {"t": 7}, {})
    assert sorted(len(tps) for tps in result.values()) == [2, 2, 3]


def test_more_members_than_partitions() -> None:
    subs = dict.fromkeys(["a", "b", "c", "d"], frozenset({"t"}))
    result = assign(subs, {"t": 2}, {})
    check_valid(subs, {"t": 2}, result)
    assert sorted(len(tps) for tps in result.values()) == [0, 0, 1, 1]


def test_empty_inputs() -> None:
    assert assign({}, {}, {}) == {}
    assert assign({}, {"t": 3}, {"a": {("t", 0)}}) == {}


def test_topics_without_partitions_assign_nothing() -> None:
    subs = {"a": frozenset({"zero"}), "b": frozenset({"zero", "missing"})}
    result = assign(subs, {"zero": 0}, {"a": {("zero", 0)}, "b": {("missing", 1)}})
    assert result == {"a": set(), "b": set()}


def test_current_of_members_not_subscribed_is_ignored() -> None:
    subs = {"a": frozenset({"t"})}
    result = assign(subs, {"t": 2}, {"gone": {("t", 0), ("t", 1)}})
    assert result == {"a": {("t", 0), ("t", 1)}}


def test_current_partitions_past_the_end_or_of_unsubscribed_topics_are_dropped() -> None:
    subs = {"a": frozenset({"t"}), "b": frozenset({"t"})}
    current = {"a": {("t", 0), ("t", 9), ("u", 0)}, "b": {("t", 1)}}
    result = assign(subs, {"t": 2, "u": 1}, current)
    assert result == {"a": {("t", 0)}, "b": {("t", 1)}}


def test_member_with_a_topic_others_lack_takes_all_of_it() -> None:
    subs = {"a": frozenset({"x"}), "b": frozenset({"x", "y"})}
    result = assign(subs, {"x": 2, "y": 2}, {})
    check_valid(subs, {"x": 2, "y": 2}, result)
    assert result == {"a": {("x", 0), ("x", 1)}, "b": {("y", 0), ("y", 1)}}


def test_disjoint_subscriptions_each_take_their_own_topic() -> None:
    subs = {"a": frozenset({"x"}), "b": frozenset({"y"}), "c": frozenset({"y"})}
    result = assign(subs, {"x": 3, "y": 4}, {})
    assert result["a"] == {("x", 0), ("x", 1), ("x", 2)}
    assert len(result["b"]) == len(result["c"]) == 2


def test_a_sticky_owner_keeps_its_partitions_when_still_fair() -> None:
    subs = dict.fromkeys(["a", "b"], frozenset({"t"}))
    current = {"a": {("t", 1), ("t", 3)}, "b": {("t", 0), ("t", 2)}}
    assert assign(subs, {"t": 4}, current) == current


def test_an_overloaded_owner_gives_up_only_the_excess() -> None:
    subs = dict.fromkeys(["a", "b"], frozenset({"t"}))
    current = {"a": {("t", 0), ("t", 1), ("t", 2), ("t", 3)}}
    result = assign(subs, {"t": 4}, current)
    assert len(result["a"]) == len(result["b"]) == 2
    assert moved_partitions(current, result) == 2


def test_moved_partitions_counts_changed_and_new_owners() -> None:
    before = {"a": {("t", 0), ("t", 1)}, "b": {("t", 2)}}
    after = {"a": {("t", 0)}, "b": {("t", 1), ("t", 2)}, "c": {("t", 3)}}
    assert moved_partitions(before, after) == 2  # t-1 changed owner, t-3 is new
    assert moved_partitions(before, {"a": {("t", 0), ("t", 1)}, "b": {("t", 2)}}) == 0
    assert moved_partitions({}, {}) == 0


def test_heterogeneous_imbalance_needing_a_chain_of_moves() -> None:
    # a may take only y, c only x, b either. 2/2/2 is reachable (a: y0 y1, b: y2 x0, c: x1 x2)
    # but the assignor stops at a: 3, b: 2, c: 1 since no single move goes from 3 to <= 1.
    subs = {"a": frozenset({"y"}), "b": frozenset({"x", "y"}), "c": frozenset({"x"})}
    result = assign(subs, {"x": 3, "y": 3}, {})
    check_valid(subs, {"x": 3, "y": 3}, result)
    assert sorted(len(tps) for tps in result.values()) == [2, 2, 2]


# -- properties ----------------------------------------------------------------------------------


@PROPERTY_SETTINGS
@given(heterogeneous(), any_current())
def test_every_partition_assigned_once_to_a_subscriber(
    case: tuple[Subscriptions, Counts], current: dict[str, set[TopicPartition]]
) -> None:
    subs, counts = case
    check_valid(subs, counts, assign(subs, counts, current))


@PROPERTY_SETTINGS
@given(identical(), any_current())
def test_identical_subscriptions_are_balanced_within_one(
    case: tuple[Subscriptions, Counts], current: dict[str, set[TopicPartition]]
) -> None:
    subs, counts = case
    result = assign(subs, counts, current)
    check_valid(subs, counts, result)
    assert spread(result) <= 1


@PROPERTY_SETTINGS
@given(heterogeneous(), any_current())
def test_no_single_partition_move_would_improve_balance(
    case: tuple[Subscriptions, Counts], current: dict[str, set[TopicPartition]]
) -> None:
    """Step 3's promise: no partition sits on a member holding n while a member that could
    take it holds n - 2 or fewer."""
    subs, counts = case
    result = assign(subs, counts, current)
    for src, tps in result.items():
        for topic, _ in tps:
            for dst in result:
                if topic in subs[dst]:
                    assert len(result[dst]) >= len(result[src]) - 1, (src, dst, topic)


@settings(max_examples=150, deadline=None)
@given(
    st.dictionaries(
        st.sampled_from(["a", "b", "c"]),
        st.frozensets(st.sampled_from(["x", "y"]), min_size=1),
        min_size=1,
    ),
    st.fixed_dictionaries({"x": st.integers(0, 3), "y": st.integers(0, 3)}),
)
def test_heterogeneous_balance_is_optimal(subs: Subscriptions, counts: Counts) -> None:
    """With any subscriptions, the result is as balanced as any valid assignment (checked by
    brute force): no chain of moves could even it out further."""
    result = assign(subs, counts, {})
    assert sorted((len(tps) for tps in result.values()), reverse=True) == optimal_sizes(
        subs, counts
    )


@PROPERTY_SETTINGS
@given(identical(min_members=2), any_current(), st.data())
def test_a_leaving_member_moves_only_its_own_partitions(
    case: tuple[Subscriptions, Counts], current: dict[str, set[TopicPartition]], data: st.DataObject
) -> None:
    subs, counts = case
    before = assign(subs, counts, current)
    leaver = data.draw(st.sampled_from(sorted(subs)))
    rest = {m: ts for m, ts in subs.items() if m != leaver}
    after = assign(rest, counts, before)
    check_valid(rest, counts, after)
    assert spread(after) <= 1
    assert moved_partitions(before, after) == len(before[leaver])
    for m in rest:
        assert before[m] <= after[m]


# A balanced assignment (itself a fixed point of assign) where a joiner needs 2 moves: two of
# the three members holding 3 give one each. The assignor moves 3: its even-out pass takes t-0
# from d (holding only the floor, 2) and then refills d from a.
JOIN_BEFORE: dict[str, set[TopicPartition]] = {
    "a": {("t", 1), ("u", 1), ("u", 5)},
    "b": {("t", 2), ("u", 2), ("u", 6)},
    "c": {("u", 0), ("u", 3), ("u", 7)},
    "d": {("t", 0), ("u", 4)},
}
JOIN_SUBS = dict.fromkeys("abcd", frozenset({"t", "u"}))
JOIN_COUNTS = {"t": 3, "u": 8}


@PROPERTY_SETTINGS
@given(identical(), any_current(), st.sampled_from(["j0", "j1", "zz"]))
def test_a_joining_member_keeps_the_group_balanced(
    case: tuple[Subscriptions, Counts], current: dict[str, set[TopicPartition]], joiner: str
) -> None:
    subs, counts = case
    before = assign(subs, counts, current)
    grown = {**subs, joiner: next(iter(subs.values()))}
    after = assign(grown, counts, before)
    check_valid(grown, counts, after)
    assert spread(after) <= 1
    total = sum(counts[t] for t in grown[joiner])
    assert moved_partitions(before, after) >= min_moves_after_join(before, sorted(grown), total)


def test_min_moves_after_join_helper() -> None:
    # 3, 3, 3, 2 over 5 members: floor 2 and one ceiling, so two of the 3s give one each.
    assert min_moves_after_join(JOIN_BEFORE, [*"abcdz"], 11) == 2
    assert min_moves_after_join({"a": {("t", 0), ("t", 1)}}, ["a", "b"], 2) == 1
    assert min_moves_after_join({}, ["a"], 0) == 0


def test_a_joining_member_moves_the_minimum_needed_example() -> None:
    assert assign(JOIN_SUBS, JOIN_COUNTS, JOIN_BEFORE) == JOIN_BEFORE
    after = assign({**JOIN_SUBS, "z": frozenset({"t", "u"})}, JOIN_COUNTS, JOIN_BEFORE)
    assert moved_partitions(JOIN_BEFORE, after) == 2
    for m in JOIN_SUBS:  # nobody but the joiner gains anything
        assert after[m] <= JOIN_BEFORE[m]


@PROPERTY_SETTINGS
@given(identical(), any_current(), st.sampled_from(["j0", "j1", "zz"]))
@example(case=(JOIN_SUBS, JOIN_COUNTS), current=JOIN_BEFORE, joiner="z")
def test_a_joining_member_moves_the_minimum_needed(
    case: tuple[Subscriptions, Counts], current: dict[str, set[TopicPartition]], joiner: str
) -> None:
    subs, counts = case
    before = assign(subs, counts, current)
    topics = next(iter(subs.values()))
    grown = {**subs, joiner: topics}
    after = assign(grown, counts, before)
    total = sum(counts[t] for t in topics)
    assert moved_partitions(before, after) == min_moves_after_join(before, sorted(grown), total)
    for m in subs:  # nobody but the joiner gains anything
        assert after[m] <= before[m]


@PROPERTY_SETTINGS
@given(identical(), any_current(), counts_st)
def test_partition_growth_keeps_existing_ownership(
    case: tuple[Subscriptions, Counts], current: dict[str, set[TopicPartition]], extra: Counts
) -> None:
    subs, counts = case
    before = assign(subs, counts, current)
    grown = {t: counts[t] + extra[t] for t in TOPICS}
    after = assign(subs, grown, before)
    check_valid(subs, grown, after)
    assert spread(after) <= 1
    for m in subs:
        assert before[m] <= after[m]
    new = sum(grown[t] - counts[t] for t in next(iter(subs.values())))
    assert moved_partitions(before, after) == new


@PROPERTY_SETTINGS
@given(heterogeneous(), any_current(), st.randoms(use_true_random=False))
def test_deterministic_whatever_the_input_order(
    case: tuple[Subscriptions, Counts],
    current: dict[str, set[TopicPartition]],
    rng: random.Random,
) -> None:
    subs, counts = case
    first = assign(subs, counts, current)
    assert assign(subs, counts, current) == first
    shuffled_members = list(subs.items())
    rng.shuffle(shuffled_members)
    shuffled_counts = list(counts.items())
    rng.shuffle(shuffled_counts)
    assert assign(dict(shuffled_members), dict(shuffled_counts), current) == first


@PROPERTY_SETTINGS
@given(identical(), any_current())
def test_assigning_again_from_the_result_moves_nothing(
    case: tuple[Subscriptions, Counts], current: dict[str, set[TopicPartition]]
) -> None:
    subs, counts = case
    result = assign(subs, counts, current)
    assert assign(subs, counts, result) == result


# b and c may each take one topic only; a takes the rest. Assigning again with nothing changed
# moves z-1 from c to a: step 1 caps c at its fractional share of z (2 / 2 = 1) although a is
# busy with y, and the tie for z-1 then goes to a by member id.
CHURN_SUBS = {"a": frozenset({"x", "y", "z"}), "b": frozenset({"x"}), "c": frozenset({"z"})}
CHURN_COUNTS = {"x": 1, "y": 1, "z": 2}


def test_assigning_again_with_differing_subscriptions_moves_nothing_example() -> None:
    result = assign(CHURN_SUBS, CHURN_COUNTS, {})
    assert result == {"a": {("y", 0)}, "b": {("x", 0)}, "c": {("z", 0), ("z", 1)}}
    assert assign(CHURN_SUBS, CHURN_COUNTS, result) == result


@PROPERTY_SETTINGS
@given(heterogeneous(), any_current())
@example(case=(CHURN_SUBS, CHURN_COUNTS), current={})
def test_assigning_again_with_differing_subscriptions_moves_nothing(
    case: tuple[Subscriptions, Counts], current: dict[str, set[TopicPartition]]
) -> None:
    subs, counts = case
    result = assign(subs, counts, current)
    assert assign(subs, counts, result) == result


def test_large_group_is_balanced() -> None:
    subs = {f"m{i:03}": frozenset({"a", "b"}) for i in range(200)}
    counts = {"a": 1_000, "b": 999}
    result = assign(subs, counts, {})
    check_valid(subs, counts, result)
    assert spread(result) <= 1
    leaver = "m100"
    rest = {m: ts for m, ts in subs.items() if m != leaver}
    after = assign(rest, counts, result)
    assert moved_partitions(result, after) == len(result[leaver])


def _cpu_seconds(members: int, partitions: int) -> float:
    """CPU time (best of 3) of a fresh assignment, a join and the worst sticky case (one
    member holds everything when the others join) with ``members`` x ``partitions``."""
    ids = [f"m{i:04}" for i in range(members)]
    counts = {"a": partitions // 2, "b": partitions - partitions // 2}
    subs = dict.fromkeys(ids, frozenset(counts))
    one_holds_all = {ids[0]: {(t, p) for t, n in counts.items() for p in range(n)}}
    best = float("inf")
    for _ in range(3):
        start = time.process_time()
        fresh = assign(subs, counts, {})
        assign({**subs, "new": frozenset(counts)}, counts, fresh)
        assign(subs, counts, one_holds_all)
        best = min(best, time.process_time() - start)
    return best


def test_cost_grows_near_linearly_with_group_and_partitions() -> None:
    """Members and partitions x4 (the work P · M x16): near-linear costs ~4-5x; the former
    O(P · M)-and-worse assignor cost 16x or more (71-84 s at the 1,000 x 10,000 limits). The
    bound is generous (CPU time, not wall time, on a shared machine); the figures at the limits
    are in ``python -m benchmarks.assignor``."""
    small = _cpu_seconds(100, 1_000)
    large = _cpu_seconds(400, 4_000)
    assert large < 10 * small, f"{small=:.4f}s {large=:.4f}s ratio={large / small:.1f}"
