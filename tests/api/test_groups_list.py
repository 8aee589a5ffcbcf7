"""The cluster-wide group list's merge (api.groups_list.merge): sans-I/O, every way a
coordinator can fail to answer."""

from __future__ import annotations

from typing import Any

from api.groups_list import LOADING, NOT_AVAILABLE, Answer, merge


def _doc(groups: list[str], partitions: list[int], **extra: Any) -> dict[str, Any]:
    return {
        "groups": [{"group": g, "state": "empty", "members": 0, "lag": 0} for g in groups],
        "offsets_partitions": partitions,
        **extra,
    }


def test_every_coordinator_answers_the_list_is_complete_and_sorted() -> None:
    out = merge(
        4,
        [
            Answer(1, [0, 2], _doc(["b", "d"], [0, 2])),
            Answer(2, [1, 3], _doc(["c", "a"], [1, 3])),
        ],
        limit=10,
    )
    assert [g.group for g in out.groups] == ["a", "b", "c", "d"]
    assert out.offsets_partitions == [0, 1, 2, 3] and out.unavailable == []


def test_an_unreachable_coordinator_is_named_with_its_partitions() -> None:
    out = merge(
        4,
        [
            Answer(1, [0, 2], _doc(["b"], [0, 2])),
            Answer(3, [1, 3], detail="broker 3 could not be reached"),
        ],
        limit=10,
    )
    assert [g.group for g in out.groups] == ["b"] and out.offsets_partitions == [0, 2]
    [gap] = out.unavailable
    assert (gap.partitions, gap.broker_id, gap.code) == ([1, 3], 3, NOT_AVAILABLE)
    assert "could not be reached" in gap.detail


def test_a_partition_without_leader_and_one_still_loading() -> None:
    loading = {"partitions": [1], "broker_id": 2, "code": LOADING, "detail": "loading"}
    out = merge(
        3,
        [
            Answer(None, [0], detail="no leader now"),
            Answer(2, [1, 2], _doc(["x"], [2], unavailable=[loading])),
        ],
        limit=10,
    )
    assert out.offsets_partitions == [2]
    assert [(g.partitions, g.broker_id, g.code) for g in out.unavailable] == [
        ([0], None, NOT_AVAILABLE),
        ([1], 2, LOADING),
    ]


def test_a_stale_view_partition_covered_by_another_broker_is_not_a_gap() -> None:
    # This broker thought 1 led partition 1, but it moved to 2 (which listed it) meanwhile.
    out = merge(
        2,
        [Answer(1, [0, 1], _doc(["a"], [0])), Answer(2, [], _doc(["b"], [1]))],
        limit=10,
    )
    assert [g.group for g in out.groups] == ["a", "b"] and out.unavailable == []


def test_a_broker_that_answers_without_the_partitions_asked_of_it() -> None:
    out = merge(2, [Answer(1, [0, 1], _doc(["a"], [0]))], limit=10)
    [gap] = out.unavailable
    assert gap.partitions == [1] and gap.broker_id == 1 and "moving" in gap.detail


def test_the_limit_applies_to_the_merged_list() -> None:
    out = merge(
        2,
        [Answer(1, [0], _doc(["a", "c"], [0])), Answer(2, [1], _doc(["b", "d"], [1]))],
        limit=3,
    )
    assert [g.group for g in out.groups] == ["a", "b", "c"]
