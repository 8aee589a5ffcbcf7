"""Consumer groups over HTTP against a real broker: membership, assignment, commits, admin.

Every test uses its own topic and group names on the module's shared broker, except the ones
that restart a broker (they start their own). Members are driven by hand: a "round" is one
heartbeat (or poll) per member, which is how reconciliation moves partitions: the old owner is
told to revoke, acknowledges with its next heartbeat, and the new owner takes the partition on
its next call.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.api.conftest import make_client, start_broker
from tests.api.helpers import assert_problem, create_topic, end_offsets, produce, unique
from tests.server import BrokerProcess

TP = tuple[str, int]


# -- helpers -------------------------------------------------------------------------------------


def join(c: httpx.Client, group: str, topics: list[str], **kw: Any) -> dict[str, Any]:
    body = {"topics": topics, "session_timeout_ms": 30_000, **kw}
    r = c.post(f"/v1/groups/{group}/members", json=body)
    assert r.status_code == 201, r.text
    doc: dict[str, Any] = r.json()
    assert set(doc) == {
        "member_id",
        "generation",
        "assignment",
        "revoking",
        "pending",
        "heartbeat_interval_ms",
    }, doc
    return doc


def heartbeat(c: httpx.Client, group: str, member: str) -> dict[str, Any]:
    r = c.post(f"/v1/groups/{group}/members/{member}/heartbeat")
    assert r.status_code == 200, r.text
    doc: dict[str, Any] = r.json()
    return doc


def poll(c: httpx.Client, group: str, member: str, **params: Any) -> dict[str, Any]:
    r = c.get(f"/v1/groups/{group}/members/{member}/records", params={"wait_ms": 0, **params})
    assert r.status_code == 200, r.text
    doc: dict[str, Any] = r.json()
    return doc


def commit(
    c: httpx.Client, group: str, member: str | None, generation: int | None, offsets: dict[TP, int]
) -> httpx.Response:
    body: dict[str, Any] = {
        "offsets": [{"topic": t, "partition": p, "offset": o} for (t, p), o in offsets.items()]
    }
    if member is not None:
        body["member_id"] = member
        body["generation"] = generation
    return c.post(f"/v1/groups/{group}/offsets", json=body)


def describe(c: httpx.Client, group: str) -> dict[str, Any]:
    r = c.get(f"/v1/groups/{group}")
    assert r.status_code == 200, r.text
    doc: dict[str, Any] = r.json()
    return doc


def tps(refs: list[dict[str, Any]]) -> set[TP]:
    return {(x["topic"], x["partition"]) for x in refs}


def owned(view: dict[str, Any]) -> set[TP]:
    """assignment + revoking: what a member holds (a heartbeat answer or a described member)."""
    return tps(view["assignment"]) | tps(view["revoking"])


def server_owned(c: httpx.Client, group: str) -> dict[str, set[TP]]:
    """The server's view: member id → partitions it owns (assigned or being revoked)."""
    d = describe(c, group)
    out = {m["member_id"]: owned(m) for m in d["members"]}
    seen: set[TP] = set()
    for parts in out.values():
        assert not parts & seen, d  # never owned twice
        seen |= parts
    return out


def converge(
    c: httpx.Client, group: str, members: list[str], *, rounds: int = 30, polls: bool = False
) -> dict[str, set[TP]]:
    """Heartbeat (and, with ``polls``, poll) every member in rounds until the group is stable;
    return each member's assignment."""
    views: dict[str, dict[str, Any]] = {}
    for _ in range(rounds):
        for m in members:
            views[m] = heartbeat(c, group, m)
            if polls:
                views[m] = poll(c, group, m)
        server_owned(c, group)  # the invariant holds at every step
        if all(not v["revoking"] and not v["pending"] for v in views.values()):
            d = describe(c, group)
            if d["state"] == "stable":
                return {m: tps(v["assignment"]) for m, v in views.items()}
    raise AssertionError(f"no convergence after {rounds} rounds: {describe(c, group)}")


def all_partitions(topic: str, n: int) -> set[TP]:
    return {(topic, p) for p in range(n)}


# -- validation and errors -----------------------------------------------------------------------


@pytest.mark.parametrize(
    "body",
    [
        {"topics": []},
        {},
        {"topics": "orders"},
        {"topics": ["T"], "session_timeout_ms": 5},
        {"topics": ["T"], "session_timeout_ms": 10**9},
        {"topics": ["T"], "rebalance_timeout_ms": 0},
        {"topics": ["T"], "auto_offset_reset": "middle"},
        {"topics": ["T"], "instance_id": "x" * 250},
        {"topics": ["T"], "client_id": "x" * 250},
        {"topics": ["T"], "surprise": 1},
    ],
)
def test_join_rejects_bad_bodies(http: httpx.Client, body: dict[str, Any]) -> None:
    topic = create_topic(http, "g-bad-join")
    if isinstance(body.get("topics"), list):
        body = {**body, "topics": [topic if t == "T" else t for t in body["topics"]]}
    r = http.post(f"/v1/groups/{unique('g')}/members", json=body)
    assert_problem(r, 400, "INVALID_REQUEST")


def test_join_rejects_non_json_and_bad_group_ids(http: httpx.Client) -> None:
    topic = create_topic(http, "g-bad-ids")
    r = http.post(
        f"/v1/groups/{unique('g')}/members",
        content=b"{not json",
        headers={"content-type": "application/json"},
    )
    assert_problem(r, 400, "INVALID_REQUEST")
    for bad in ("bad id", "x" * 250, "é", "semi;colon", "star*"):
        r = http.post(f"/v1/groups/{bad}/members", json={"topics": [topic]})
        assert_problem(r, 400, "INVALID_GROUP_ID")
    for path in ("", "/offsets"):
        assert_problem(http.get(f"/v1/groups/bad%20id{path}"), 400, "INVALID_GROUP_ID")
    assert_problem(http.delete("/v1/groups/bad%20id"), 400, "INVALID_GROUP_ID")


def test_join_unknown_or_internal_topic(http: httpx.Client) -> None:
    group = unique("g")
    r = http.post(f"/v1/groups/{group}/members", json={"topics": [unique("missing")]})
    assert_problem(r, 404, "UNKNOWN_TOPIC_OR_PARTITION")
    r = http.post(f"/v1/groups/{group}/members", json={"topics": ["__consumer_offsets"]})
    assert_problem(r, 400, "INVALID_TOPIC_EXCEPTION")
    # Nothing was created by the failed joins.
    assert_problem(http.get(f"/v1/groups/{group}"), 404, "GROUP_ID_NOT_FOUND")


def test_unknown_group_and_member(http: httpx.Client) -> None:
    topic = create_topic(http, "g-unknown")
    group = unique("g")
    assert_problem(http.get(f"/v1/groups/{group}"), 404, "GROUP_ID_NOT_FOUND")
    assert_problem(http.delete(f"/v1/groups/{group}"), 404, "GROUP_ID_NOT_FOUND")
    # a group nobody joined or committed for does not exist (nor does a deleted one)
    assert_problem(http.get(f"/v1/groups/{group}/offsets"), 404, "GROUP_ID_NOT_FOUND")
    assert group not in {g["group"] for g in http.get("/v1/groups").json()["groups"]}

    me = join(http, group, [topic])["member_id"]
    base = f"/v1/groups/{group}/members/nobody"
    assert_problem(http.post(f"{base}/heartbeat"), 404, "UNKNOWN_MEMBER_ID")
    assert_problem(http.get(f"{base}/records"), 404, "UNKNOWN_MEMBER_ID")
    assert_problem(
        http.get(f"{base}/records", headers={"accept": "text/event-stream"}),
        404,
        "UNKNOWN_MEMBER_ID",
    )
    assert_problem(http.delete(base), 404, "UNKNOWN_MEMBER_ID")
    assert_problem(commit(http, group, "nobody", 1, {(topic, 0): 0}), 404, "UNKNOWN_MEMBER_ID")

    # A member that left is unknown from then on; leaving twice is a 404.
    assert http.delete(f"/v1/groups/{group}/members/{me}").status_code == 204
    other = join(http, group, [topic])["member_id"]  # keeps the group alive
    assert_problem(
        http.post(f"/v1/groups/{group}/members/{me}/heartbeat"), 404, "UNKNOWN_MEMBER_ID"
    )
    assert_problem(http.delete(f"/v1/groups/{group}/members/{me}"), 404, "UNKNOWN_MEMBER_ID")
    assert_problem(commit(http, group, me, 1, {(topic, 0): 0}), 404, "UNKNOWN_MEMBER_ID")
    assert http.delete(f"/v1/groups/{group}/members/{other}").status_code == 204


def test_poll_rejects_bad_parameters(http: httpx.Client) -> None:
    topic = create_topic(http, "g-poll-params")
    group = unique("g")
    me = join(http, group, [topic])["member_id"]
    path = f"/v1/groups/{group}/members/{me}/records"
    for params in (
        {"max_bytes": 0},
        {"max_records": 0},
        {"wait_ms": -1},
        {"max_records": "many"},
    ):
        assert_problem(http.get(path, params=params), 400, "INVALID_REQUEST")
    assert_problem(http.get(path, headers={"accept": "text/html"}), 406, "NOT_ACCEPTABLE")
    http.delete(f"/v1/groups/{group}/members/{me}")


@pytest.mark.parametrize(
    "offsets",
    [
        [],
        [{"topic": "T", "partition": 0, "offset": -1}],
        [{"topic": "T", "partition": -1, "offset": 0}],
        [{"topic": "T", "partition": 0, "offset": 0, "metadata": "m" * 4097}],
        [{"topic": "T", "partition": 0, "offset": 0, "extra": True}],
        [{"topic": "T", "partition": 0}],
    ],
)
def test_commit_rejects_bad_bodies(http: httpx.Client, offsets: list[dict[str, Any]]) -> None:
    topic = create_topic(http, "g-bad-commit")
    offsets = [{**o, "topic": topic} for o in offsets]
    r = http.post(f"/v1/groups/{unique('g')}/offsets", json={"offsets": offsets})
    assert_problem(r, 400, "INVALID_REQUEST")


def test_commit_member_and_generation_go_together(http: httpx.Client) -> None:
    topic = create_topic(http, "g-commit-pair")
    group = unique("g")
    one = [{"topic": topic, "partition": 0, "offset": 0}]
    for extra in ({"member_id": "m"}, {"generation": 1}):
        r = http.post(f"/v1/groups/{group}/offsets", json={"offsets": one, **extra})
        assert_problem(r, 400, "INVALID_REQUEST")
    r = http.post(f"/v1/groups/{group}/offsets", json={"offsets": one, "surprise": 1})
    assert_problem(r, 400, "INVALID_REQUEST")
    assert_problem(http.get(f"/v1/groups/{group}/offsets"), 404, "GROUP_ID_NOT_FOUND")


def test_commit_unknown_topic_or_partition(http: httpx.Client) -> None:
    topic = create_topic(http, "g-commit-unknown", partitions=2)
    group = unique("g")
    assert_problem(
        commit(http, group, None, None, {(topic, 2): 0}), 404, "UNKNOWN_TOPIC_OR_PARTITION"
    )
    assert_problem(
        commit(http, group, None, None, {(unique("nope"), 0): 0}), 404, "UNKNOWN_TOPIC_OR_PARTITION"
    )
    assert_problem(http.get(f"/v1/groups/{group}/offsets"), 404, "GROUP_ID_NOT_FOUND")


# -- commits -------------------------------------------------------------------------------------


def test_standalone_commit_only_without_active_members(http: httpx.Client) -> None:
    topic = create_topic(http, "g-standalone", partitions=2)
    produce(http, topic, [{"value": i} for i in range(5)], partition=0)
    group = unique("g")
    r = http.post(
        f"/v1/groups/{group}/offsets",
        json={"offsets": [{"topic": topic, "partition": 0, "offset": 3, "metadata": "tool"}]},
    )
    assert r.status_code == 200, r.text
    (o,) = r.json()["offsets"]
    assert (o["topic"], o["partition"], o["offset"], o["metadata"]) == (topic, 0, 3, "tool")
    assert abs(o["commit_ms"] - time.time() * 1000) < 60_000
    got = http.get(f"/v1/groups/{group}/offsets").json()
    assert got == {"group": group, "offsets": [o]}

    # A group known only by its offsets is listed and described as empty.
    d = describe(http, group)
    assert d["state"] == "empty" and d["members"] == []
    (row,) = d["offsets"]
    assert (row["committed_offset"], row["log_end_offset"], row["lag"]) == (3, 5, 2)
    assert row["metadata"] == "tool" and row["member_id"] is None
    listed = {g["group"]: g for g in http.get("/v1/groups").json()["groups"]}
    assert listed[group] == {"group": group, "state": "empty", "members": 0, "lag": 2}

    me = join(http, group, [topic])
    assert_problem(commit(http, group, None, None, {(topic, 0): 4}), 404, "UNKNOWN_MEMBER_ID")
    assert http.delete(f"/v1/groups/{group}/members/{me['member_id']}").status_code == 204
    r = commit(http, group, None, None, {(topic, 0): 4, (topic, 1): 0})
    assert r.status_code == 200, r.text
    assert {(x["partition"], x["offset"]) for x in r.json()["offsets"]} == {(0, 4), (1, 0)}


def test_commit_generation_and_ownership_are_checked(http: httpx.Client) -> None:
    topic = create_topic(http, "g-fence", partitions=6)
    group = unique("g")
    a = join(http, group, [topic])
    gen1 = a["generation"]
    assert owned(a) == all_partitions(topic, 6)
    r = commit(http, group, a["member_id"], gen1, {(topic, p): 0 for p in range(6)})
    assert r.status_code == 200, r.text
    assert_problem(
        commit(http, group, a["member_id"], 999, {(topic, 0): 0}), 409, "ILLEGAL_GENERATION"
    )
    assert_problem(
        commit(http, group, a["member_id"], -1, {(topic, 0): 0}), 409, "ILLEGAL_GENERATION"
    )

    # Two more members: a's epoch moves twice, so its first generation is stale.
    b = join(http, group, [topic])
    converge(http, group, [a["member_id"], b["member_id"]])
    c = join(http, group, [topic])
    assignments = converge(http, group, [a["member_id"], b["member_id"], c["member_id"]])
    now_a = heartbeat(http, group, a["member_id"])
    assert now_a["generation"] > gen1
    mine = sorted(assignments[a["member_id"]])
    theirs = sorted(assignments[b["member_id"]])
    r = commit(http, group, a["member_id"], gen1, {mine[0]: 1})
    body = assert_problem(r, 409, "ILLEGAL_GENERATION")
    assert body.get("generation") == now_a["generation"], body
    # Current generation, a partition it released to b: fenced.
    r = commit(http, group, a["member_id"], now_a["generation"], {theirs[0]: 1})
    assert_problem(r, 409, "FENCED_MEMBER_EPOCH")
    # Current generation, its own partitions: accepted.
    r = commit(http, group, a["member_id"], now_a["generation"], {tp: 1 for tp in mine})
    assert r.status_code == 200, r.text
    for m in (a, b, c):
        assert http.delete(f"/v1/groups/{group}/members/{m['member_id']}").status_code == 204


def test_revoking_member_may_commit_until_it_acknowledges(http: httpx.Client) -> None:
    topic = create_topic(http, "g-revoke-commit", partitions=2)
    group = unique("g")
    a = join(http, group, [topic])
    b = join(http, group, [topic])
    assert b["assignment"] == [] and len(b["pending"]) == 1
    assert a["heartbeat_interval_ms"] == 3_000  # a third of the session, at most 3 s
    hb = heartbeat(http, group, a["member_id"])
    (revoked,) = tps(hb["revoking"])
    assert hb["heartbeat_interval_ms"] <= 200  # sooner while a rebalance is under way
    # Still a's until it acknowledges: b cannot take it, a can commit it.
    assert tps(heartbeat(http, group, b["member_id"])["pending"]) == {revoked}
    r = commit(http, group, a["member_id"], hb["generation"], {revoked: 0})
    assert r.status_code == 200, r.text
    hb2 = heartbeat(http, group, a["member_id"])  # acknowledges
    assert revoked not in owned(hb2)
    assert_problem(
        commit(http, group, a["member_id"], hb2["generation"], {revoked: 0}),
        409,
        "FENCED_MEMBER_EPOCH",
    )
    assert tps(heartbeat(http, group, b["member_id"])["assignment"]) == {revoked}
    for m in (a, b):
        http.delete(f"/v1/groups/{group}/members/{m['member_id']}")


# -- assignment ----------------------------------------------------------------------------------


def test_three_members_converge_to_two_partitions_each(http: httpx.Client) -> None:
    topic = create_topic(http, "g-three", partitions=6)
    group = unique("g")
    members: list[str] = []
    for i in range(3):
        doc = join(http, group, [topic], client_id=f"app-{i}", auto_offset_reset="earliest")
        members.append(doc["member_id"])
        # Heartbeats and polls in rounds; every step keeps partitions single-owned.
        assignment = converge(http, group, members, polls=True)
        sizes = sorted(len(a) for a in assignment.values())
        assert max(sizes) - min(sizes) <= 1, assignment
        assert set().union(*assignment.values()) == all_partitions(topic, 6)
    assert sorted(len(a) for a in assignment.values()) == [2, 2, 2]
    d = describe(http, group)
    assert d["state"] == "stable"
    assert {m["client_id"] for m in d["members"]} == {"app-0", "app-1", "app-2"}
    for m in d["members"]:
        assert tps(m["assignment"]) == tps(m["target"]) == assignment[m["member_id"]]
        assert m["revoking"] == [] and m["departed"] is False and m["topics"] == [topic]
    for row in d["offsets"]:
        assert tps([row]) <= assignment[row["member_id"]]
    for m in members:
        assert http.delete(f"/v1/groups/{group}/members/{m}").status_code == 204


def test_session_timeout_moves_partitions_only_after_it(http: httpx.Client) -> None:
    topic = create_topic(http, "g-timeout", partitions=6)
    group = unique("g")
    session = 600
    members = [join(http, group, [topic], session_timeout_ms=session)["member_id"]]
    for _ in range(2):
        members.append(join(http, group, [topic], session_timeout_ms=session)["member_id"])
        converge(http, group, members)
    alive, dead = members[:2], members[2]
    before = server_owned(http, group)
    dead_parts = before[dead]
    assert len(dead_parts) == 2
    dead_gen = heartbeat(http, group, dead)["generation"]
    last_beat = time.time()
    heartbeat(http, group, dead)  # its last sign of life
    moved_at = None
    checked_before = 0
    deadline = time.time() + 10
    while time.time() < deadline:
        views = {m: heartbeat(http, group, m) for m in alive}
        seen_at = time.time()
        now_owned = server_owned(http, group)
        if seen_at < last_beat + (session - 100) / 1000:
            # Within the session: the silent member still owns its partitions, nobody else.
            assert now_owned.get(dead) == dead_parts, now_owned
            for m in alive:
                assert not owned(views[m]) & dead_parts, views[m]
            checked_before += 1
        if dead not in now_owned and set().union(*now_owned.values()) == all_partitions(topic, 6):
            moved_at = seen_at
            break
        time.sleep(0.05)
    assert moved_at is not None, describe(http, group)
    print(f"moved {moved_at - last_beat:.3f} s after the last heartbeat ({checked_before} checks)")
    assert checked_before >= 3
    assert moved_at - last_beat >= (session - 50) / 1000, moved_at - last_beat
    assert sorted(len(p) for p in now_owned.values()) == [3, 3]
    # The timed-out member is fenced: its commits and heartbeats are rejected.
    assert_problem(
        commit(http, group, dead, dead_gen, {next(iter(dead_parts)): 0}),
        409,
        "FENCED_MEMBER_EPOCH",
    )
    assert_problem(
        http.post(f"/v1/groups/{group}/members/{dead}/heartbeat"), 409, "FENCED_MEMBER_EPOCH"
    )
    for m in alive:
        http.delete(f"/v1/groups/{group}/members/{m}")


def test_lone_member_timed_out_is_told_to_rejoin(http: httpx.Client) -> None:
    """Regression: it got 404 GROUP_ID_NOT_FOUND once the empty group was forgotten, unlike a
    member timed out of a group with offsets or other members."""
    topic = create_topic(http, "g-lone", partitions=1)
    group = unique("g")
    me = join(http, group, [topic], session_timeout_ms=200)["member_id"]
    time.sleep(1.5)  # the session runs out; the expiry task removes the member
    r = http.post(f"/v1/groups/{group}/members/{me}/heartbeat")
    assert r.status_code in (404, 409), r.text
    assert r.json()["code"] in ("UNKNOWN_MEMBER_ID", "FENCED_MEMBER_EPOCH"), r.text


def test_static_member_rejoin_keeps_its_partitions(http: httpx.Client) -> None:
    topic = create_topic(http, "g-static", partitions=6)
    group = unique("g")
    a = join(http, group, [topic], instance_id="host-a")
    b = join(http, group, [topic], instance_id="host-b")
    assignment = converge(http, group, [a["member_id"], b["member_id"]])
    a_parts = assignment[a["member_id"]]
    assert len(a_parts) == 3

    # a restarts: leaves (not permanently); its partitions wait for it, b does not get them.
    assert http.delete(f"/v1/groups/{group}/members/{a['member_id']}").status_code == 204
    for _ in range(5):
        hb = heartbeat(http, group, b["member_id"])
        assert owned(hb) == assignment[b["member_id"]], hb
    d = describe(http, group)
    (gone,) = [m for m in d["members"] if m["instance_id"] == "host-a"]
    assert gone["departed"] is True and tps(gone["assignment"]) == a_parts
    assert_problem(
        http.post(f"/v1/groups/{group}/members/{a['member_id']}/heartbeat"),
        404,
        "UNKNOWN_MEMBER_ID",
    )
    # The group is not empty while a static member may come back.
    assert_problem(http.delete(f"/v1/groups/{group}"), 409, "NON_EMPTY_GROUP")

    a2 = join(http, group, [topic], instance_id="host-a")
    assert a2["member_id"] != a["member_id"]
    assert tps(a2["assignment"]) == a_parts and a2["revoking"] == a2["pending"] == []
    r = commit(http, group, a2["member_id"], a2["generation"], {tp: 0 for tp in a_parts})
    assert r.status_code == 200, r.text
    d = describe(http, group)
    assert len(d["members"]) == 2 and d["state"] == "stable"
    assert_problem(
        http.post(f"/v1/groups/{group}/members/{a['member_id']}/heartbeat"),
        404,
        "UNKNOWN_MEMBER_ID",
    )

    # Leaving for good hands the partitions over at once.
    r = http.delete(f"/v1/groups/{group}/members/{a2['member_id']}", params={"permanent": True})
    assert r.status_code == 204
    assert owned(heartbeat(http, group, b["member_id"])) == all_partitions(topic, 6)
    assert [m["member_id"] for m in describe(http, group)["members"]] == [b["member_id"]]
    http.delete(f"/v1/groups/{group}/members/{b['member_id']}")


def test_departed_static_member_times_out(http: httpx.Client) -> None:
    topic = create_topic(http, "g-static-timeout", partitions=4)
    group = unique("g")
    a = join(http, group, [topic], instance_id="a", session_timeout_ms=400)
    b = join(http, group, [topic], session_timeout_ms=5_000)
    converge(http, group, [a["member_id"], b["member_id"]])
    assert http.delete(f"/v1/groups/{group}/members/{a['member_id']}").status_code == 204
    deadline = time.time() + 5
    while time.time() < deadline:
        if owned(heartbeat(http, group, b["member_id"])) == all_partitions(topic, 4):
            break
        time.sleep(0.05)
    assert [m["member_id"] for m in describe(http, group)["members"]] == [b["member_id"]]
    assert owned(heartbeat(http, group, b["member_id"])) == all_partitions(topic, 4)
    # Coming back after the timeout is a fresh join: it gets a share by rebalancing.
    a2 = join(http, group, [topic], instance_id="a", session_timeout_ms=5_000)
    assignment = converge(http, group, [a2["member_id"], b["member_id"]])
    assert sorted(len(p) for p in assignment.values()) == [2, 2]
    for m in (a2, b):
        http.delete(f"/v1/groups/{group}/members/{m['member_id']}")


def test_partition_increase_triggers_a_rebalance(http: httpx.Client) -> None:
    topic = create_topic(http, "g-grow", partitions=2)
    group = unique("g")
    members = [
        join(http, group, [topic], auto_offset_reset="earliest")["member_id"] for _ in range(2)
    ]
    assignment = converge(http, group, members)
    assert sorted(len(p) for p in assignment.values()) == [1, 1]
    epoch = describe(http, group)["group_epoch"]
    r = http.post(f"/v1/topics/{topic}/partitions", json={"count": 6})
    assert r.status_code == 200, r.text
    assert describe(http, group)["group_epoch"] > epoch
    grown = converge(http, group, members)
    assert set().union(*grown.values()) == all_partitions(topic, 6)
    assert sorted(len(p) for p in grown.values()) == [3, 3]
    for m in members:  # sticky: nobody lost what it had
        assert assignment[m] <= grown[m]
    # The new partitions are consumed: records produced there reach their owner's poll.
    produce(http, topic, [{"value": "new"}], partition=5)
    owner = next(m for m in members if (topic, 5) in grown[m])
    doc = poll(http, group, owner, wait_ms=2_000)
    assert [(x["partition"], x["value"]) for x in doc["records"]] == [(5, "new")]
    for m in members:
        http.delete(f"/v1/groups/{group}/members/{m}")


def test_graceful_leave_hands_partitions_to_waiting_pollers(
    http: httpx.Client, shared_broker: BrokerProcess
) -> None:
    topic = create_topic(http, "g-leave", partitions=6)
    group = unique("g")
    members = [join(http, group, [topic])["member_id"] for _ in range(3)]
    converge(http, group, members)
    leaver, stay = members[0], members[1:]

    async def run() -> tuple[dict[str, set[TP]], float]:
        async with httpx.AsyncClient(base_url=shared_broker.url, timeout=30) as ac:

            async def long_poll(m: str) -> None:
                r = await ac.get(
                    f"/v1/groups/{group}/members/{m}/records", params={"wait_ms": 1_500}
                )
                assert r.status_code == 200, r.text

            polls = [asyncio.create_task(long_poll(m)) for m in stay]
            await asyncio.sleep(0.3)  # both polls are parked
            r = await ac.delete(f"/v1/groups/{group}/members/{leaver}")
            assert r.status_code == 204
            left = time.monotonic()
            # The waiting polls reconcile at once (the group's event wakes them): the server
            # shows the remaining members owning everything while their polls still wait.
            while True:
                d = (await ac.get(f"/v1/groups/{group}")).json()
                view = {m["member_id"]: owned(m) for m in d["members"]}
                if set().union(*view.values()) == all_partitions(topic, 6):
                    break
                if time.monotonic() - left > 1.0:
                    break
                await asyncio.sleep(0.01)
            elapsed = time.monotonic() - left
            await asyncio.gather(*polls)
            return view, elapsed

    view, elapsed = asyncio.run(run())
    print(f"rebalance after a graceful leave: {elapsed * 1000:.0f} ms")
    assert set(view) == set(stay)
    assert set().union(*view.values()) == all_partitions(topic, 6)
    assert sorted(len(p) for p in view.values()) == [3, 3]
    for m in stay:
        http.delete(f"/v1/groups/{group}/members/{m}")


def test_long_poll_returns_when_partitions_are_revoked(
    http: httpx.Client, shared_broker: BrokerProcess
) -> None:
    """Regression: a parked poll re-waited on the group event and announced the revocation only
    when wait_ms ran out."""
    topic = create_topic(http, "g-poll-revoke", partitions=2)
    group = unique("g")
    a = join(http, group, [topic])["member_id"]

    async def run() -> tuple[dict[str, Any], float]:
        async with httpx.AsyncClient(base_url=shared_broker.url, timeout=30) as ac:
            parked = asyncio.create_task(
                ac.get(f"/v1/groups/{group}/members/{a}/records", params={"wait_ms": 3_000})
            )
            await asyncio.sleep(0.3)
            joined = time.monotonic()
            r = await ac.post(f"/v1/groups/{group}/members", json={"topics": [topic]})
            assert r.status_code == 201
            reply = await parked
            return reply.json(), time.monotonic() - joined

    doc, elapsed = asyncio.run(run())
    assert len(doc["revoking"]) == 1, doc
    assert elapsed < 1.5, f"the poll answered {elapsed:.1f} s after the rebalance"


# -- polling -------------------------------------------------------------------------------------


def test_poll_reads_from_committed_offsets_and_advances_positions(http: httpx.Client) -> None:
    topic = create_topic(http, "g-poll", partitions=2)
    produce(http, topic, [{"key": f"k{i}", "value": i} for i in range(6)], partition=0)
    produce(http, topic, [{"value": i} for i in range(4)], partition=1)
    group = unique("g")
    r = commit(http, group, None, None, {(topic, 0): 2})
    assert r.status_code == 200
    me = join(http, group, [topic], auto_offset_reset="earliest")
    doc = poll(http, group, me["member_id"], max_records=100)
    got = sorted((x["partition"], x["offset"]) for x in doc["records"])
    assert got == [(0, 2), (0, 3), (0, 4), (0, 5), (1, 0), (1, 1), (1, 2), (1, 3)]
    rec = next(x for x in doc["records"] if (x["partition"], x["offset"]) == (0, 3))
    assert (rec["topic"], rec["key"], rec["value"]) == (topic, "k3", 3)
    pos = {p["partition"]: p for p in doc["positions"]}
    assert pos[0]["next_offset"] == 6 and pos[1]["next_offset"] == 4
    assert all(p["lag"] == 0 and p["topic"] == topic for p in pos.values())
    assert owned(doc) == all_partitions(topic, 2)
    # Positions moved on server-side: the next poll has nothing; new records come next.
    assert poll(http, group, me["member_id"])["records"] == []
    produce(http, topic, [{"value": "late"}], partition=1)
    doc = poll(http, group, me["member_id"], wait_ms=2_000)
    assert [(x["partition"], x["offset"], x["value"]) for x in doc["records"]] == [(1, 4, "late")]
    # max_records caps a poll; the rest comes with the next one.
    produce(http, topic, [{"value": i} for i in range(5)], partition=0)
    first = poll(http, group, me["member_id"], max_records=2)["records"]
    rest = poll(http, group, me["member_id"], max_records=100)["records"]
    assert [x["offset"] for x in first + rest] == [6, 7, 8, 9, 10]
    http.delete(f"/v1/groups/{group}/members/{me['member_id']}")


def test_poll_latest_and_none_offset_reset(http: httpx.Client) -> None:
    topic = create_topic(http, "g-reset-policy")
    produce(http, topic, [{"value": i} for i in range(3)], partition=0)
    group = unique("g")
    latest = join(http, group, [topic], auto_offset_reset="latest")
    assert poll(http, group, latest["member_id"])["records"] == []
    produce(http, topic, [{"value": "after"}], partition=0)
    assert [x["offset"] for x in poll(http, group, latest["member_id"])["records"]] == [3]
    http.delete(f"/v1/groups/{group}/members/{latest['member_id']}")

    group2 = unique("g")
    none = join(http, group2, [topic], auto_offset_reset="none")
    r = http.get(f"/v1/groups/{group2}/members/{none['member_id']}/records")
    assert_problem(r, 416, "OFFSET_OUT_OF_RANGE")
    http.delete(f"/v1/groups/{group2}/members/{none['member_id']}")


# -- admin: list, describe, reset, delete --------------------------------------------------------


def test_list_and_describe_report_lag(http: httpx.Client) -> None:
    topic = create_topic(http, "g-lag", partitions=3)
    counts = [7, 4, 0]
    for p, n in enumerate(counts):
        if n:
            produce(http, topic, [{"value": i} for i in range(n)], partition=p)
    group = unique("g")
    me = join(http, group, [topic], auto_offset_reset="earliest", client_id="lagger")
    doc = poll(http, group, me["member_id"], max_records=1000)
    assert len(doc["records"]) == sum(counts)
    r = commit(http, group, me["member_id"], doc["generation"], {(topic, 0): 5, (topic, 1): 4})
    assert r.status_code == 200, r.text
    d = describe(http, group)
    assert d["group"] == group and d["state"] == "stable" and d["group_epoch"] >= 1
    (m,) = d["members"]
    assert m["member_id"] == me["member_id"] and m["client_id"] == "lagger"
    assert m["member_epoch"] == doc["generation"] and m["instance_id"] is None
    rows = {o["partition"]: o for o in d["offsets"]}
    assert rows[0]["committed_offset"] == 5 and rows[0]["log_end_offset"] == 7
    assert rows[0]["lag"] == 2
    assert rows[1]["committed_offset"] == 4 and rows[1]["lag"] == 0
    assert rows[2]["committed_offset"] is None and rows[2]["lag"] is None
    assert rows[2]["log_end_offset"] == 0
    assert all(o["member_id"] == me["member_id"] for o in rows.values())
    assert d["lag"] == 2
    listed = {g["group"]: g for g in http.get("/v1/groups").json()["groups"]}
    assert listed[group] == {"group": group, "state": "stable", "members": 1, "lag": 2}
    # Lag follows the log end.
    produce(http, topic, [{"value": "x"}] * 3, partition=1)
    assert describe(http, group)["lag"] == 5
    assert end_offsets(http, topic) == [7, 7, 0]
    assert_problem(http.get("/v1/groups", params={"limit": 0}), 400, "INVALID_REQUEST")
    http.delete(f"/v1/groups/{group}/members/{me['member_id']}")
    assert describe(http, group)["state"] == "empty"


def test_reset_offsets_only_when_empty(http: httpx.Client) -> None:
    topic = create_topic(http, "g-reset", partitions=2)
    base = 1_700_000_000_000
    for p in range(2):
        produce(
            http,
            topic,
            [{"value": i, "timestamp": base + 1000 * i} for i in range(10)],
            partition=p,
        )
    group = unique("g")
    reset = f"/v1/groups/{group}/offsets/reset"
    me = join(http, group, [topic])
    r = http.post(reset, json={"to": "earliest", "topics": [topic]})
    assert_problem(r, 409, "NON_EMPTY_GROUP")
    assert_problem(http.delete(f"/v1/groups/{group}"), 409, "NON_EMPTY_GROUP")
    assert http.delete(f"/v1/groups/{group}/members/{me['member_id']}").status_code == 204

    def offsets(doc: dict[str, Any]) -> dict[int, int]:
        return {o["partition"]: o["offset"] for o in doc["offsets"]}

    # No offsets yet and no topics named: nothing to reset.
    assert_problem(http.post(reset, json={"to": "earliest"}), 400, "INVALID_REQUEST")
    r = http.post(reset, json={"to": "latest", "topics": [topic]})
    assert r.status_code == 200, r.text
    assert offsets(r.json()) == {0: 10, 1: 10}
    r = http.post(reset, json={"to": "earliest"})  # the topics it has offsets for
    assert offsets(r.json()) == {0: 0, 1: 0}
    r = http.post(reset, json={"to": "timestamp", "timestamp": base + 3500})
    assert offsets(r.json()) == {0: 4, 1: 4}
    r = http.post(reset, json={"to": "timestamp", "timestamp": base + 10**9})
    assert offsets(r.json()) == {0: 10, 1: 10}
    r = http.post(
        reset, json={"to": "offsets", "offsets": [{"topic": topic, "partition": 1, "offset": 7}]}
    )
    assert offsets(r.json()) == {1: 7}
    got = http.get(f"/v1/groups/{group}/offsets").json()
    assert offsets(got) == {0: 10, 1: 7}

    for body, status, code in (
        ({"to": "offsets"}, 400, "INVALID_REQUEST"),
        ({"to": "timestamp"}, 400, "INVALID_REQUEST"),
        ({"to": "yesterday"}, 400, "INVALID_REQUEST"),
        ({"to": "earliest", "surprise": 1}, 400, "INVALID_REQUEST"),
        ({"to": "earliest", "topics": [unique("nope")]}, 404, "UNKNOWN_TOPIC_OR_PARTITION"),
        (
            {"to": "offsets", "offsets": [{"topic": topic, "partition": 0, "offset": 11}]},
            416,
            "OFFSET_OUT_OF_RANGE",
        ),
        (
            {"to": "offsets", "offsets": [{"topic": topic, "partition": 2, "offset": 0}]},
            404,
            "UNKNOWN_TOPIC_OR_PARTITION",
        ),
    ):
        assert_problem(http.post(reset, json=body), status, code)
    assert offsets(http.get(f"/v1/groups/{group}/offsets").json()) == {0: 10, 1: 7}

    # A member joining now starts from the reset offsets.
    me = join(http, group, [topic], auto_offset_reset="earliest")
    doc = poll(http, group, me["member_id"], max_records=100)
    assert sorted((x["partition"], x["offset"]) for x in doc["records"]) == [(1, 7), (1, 8), (1, 9)]
    http.delete(f"/v1/groups/{group}/members/{me['member_id']}")


def test_delete_group_only_when_empty(http: httpx.Client) -> None:
    topic = create_topic(http, "g-delete")
    produce(http, topic, [{"value": i} for i in range(3)], partition=0)
    group = unique("g")
    me = join(http, group, [topic], auto_offset_reset="earliest")
    doc = poll(http, group, me["member_id"])
    assert (
        commit(http, group, me["member_id"], doc["generation"], {(topic, 0): 3}).status_code == 200
    )
    assert_problem(http.delete(f"/v1/groups/{group}"), 409, "NON_EMPTY_GROUP")
    assert http.delete(f"/v1/groups/{group}/members/{me['member_id']}").status_code == 204
    assert group in {g["group"] for g in http.get("/v1/groups").json()["groups"]}
    assert http.delete(f"/v1/groups/{group}").status_code == 204
    assert_problem(http.get(f"/v1/groups/{group}"), 404, "GROUP_ID_NOT_FOUND")
    assert_problem(http.delete(f"/v1/groups/{group}"), 404, "GROUP_ID_NOT_FOUND")
    assert_problem(http.get(f"/v1/groups/{group}/offsets"), 404, "GROUP_ID_NOT_FOUND")
    assert group not in {g["group"] for g in http.get("/v1/groups").json()["groups"]}
    # The name is free again: a new member starts from auto_offset_reset, not the old offset.
    me = join(http, group, [topic], auto_offset_reset="earliest")
    assert [x["offset"] for x in poll(http, group, me["member_id"])["records"]] == [0, 1, 2]
    http.delete(f"/v1/groups/{group}/members/{me['member_id']}")


# -- durability ----------------------------------------------------------------------------------


def test_offsets_survive_restart_and_crash(tmp_path: Path) -> None:
    broker = start_broker(tmp_path / "data")
    try:
        with make_client(broker) as c:
            topic = create_topic(c, "g-durable", partitions=2)
            for p in range(2):
                produce(c, topic, [{"value": i} for i in range(10)], partition=p)
            group, gone = unique("g"), unique("g")
            me = join(c, group, [topic], auto_offset_reset="earliest")
            doc = poll(c, group, me["member_id"], max_records=100)
            assert len(doc["records"]) == 20
            r = c.post(
                f"/v1/groups/{group}/offsets",
                json={
                    "member_id": me["member_id"],
                    "generation": doc["generation"],
                    "offsets": [
                        {"topic": topic, "partition": 0, "offset": 4, "metadata": "m0"},
                        {"topic": topic, "partition": 1, "offset": 7, "metadata": "m1"},
                    ],
                },
            )
            assert r.status_code == 200, r.text
            assert commit(c, gone, None, None, {(topic, 0): 1}).status_code == 200
            assert c.delete(f"/v1/groups/{gone}").status_code == 204
            before = c.get(f"/v1/groups/{group}/offsets").json()

        broker.restart()
        with make_client(broker) as c:
            assert c.get(f"/v1/groups/{group}/offsets").json() == before
            assert_problem(c.get(f"/v1/groups/{gone}/offsets"), 404, "GROUP_ID_NOT_FOUND")
            listed = {g["group"] for g in c.get("/v1/groups").json()["groups"]}
            assert group in listed and gone not in listed
            d = describe(c, group)
            assert d["state"] == "stable" and d["lag"] == (10 - 4) + (10 - 7)
            # Membership is persisted with the offsets: the member keeps its id, generation
            # and assignment, and reads on from its committed offsets (positions are not kept).
            hb = heartbeat(c, group, me["member_id"])
            assert owned(hb) == owned(me) and hb["generation"] == doc["generation"]
            doc = poll(c, group, me["member_id"], max_records=100)
            starts: dict[int, int] = {}
            for x in doc["records"]:
                starts.setdefault(x["partition"], x["offset"])
            assert starts == {0: 4, 1: 7}
            r = commit(c, group, me["member_id"], doc["generation"], {(topic, 0): 9})
            assert r.status_code == 200, r.text
            before = c.get(f"/v1/groups/{group}/offsets").json()

        broker.kill()  # no clean shutdown: the commit was fsynced before its 200
        broker.start()
        with make_client(broker) as c:
            assert c.get(f"/v1/groups/{group}/offsets").json() == before
    finally:
        broker.stop()


def test_deleted_topic_leaves_the_assignment(http: httpx.Client) -> None:
    keep = create_topic(http, "g-keep", partitions=2)
    gone = create_topic(http, "g-gone", partitions=2)
    group = unique("g")
    me = join(http, group, [keep, gone], auto_offset_reset="earliest")
    assert owned(me) == all_partitions(keep, 2) | all_partitions(gone, 2)
    assert http.delete(f"/v1/topics/{gone}").status_code == 204
    hb = heartbeat(http, group, me["member_id"])
    assert owned(hb) == all_partitions(keep, 2) and hb["pending"] == []
    produce(http, keep, [{"value": "still"}], partition=1)
    doc = poll(http, group, me["member_id"], wait_ms=2_000)
    assert [(x["topic"], x["value"]) for x in doc["records"]] == [(keep, "still")]
    http.delete(f"/v1/groups/{group}/members/{me['member_id']}")


def test_recreated_topic_is_read_from_its_start(http: httpx.Client) -> None:
    """Regression: offsets of a deleted topic were kept, so a topic created again under the same
    name was resumed at the old offset and its first records were skipped."""
    topic = create_topic(http, "g-recreate")
    produce(http, topic, [{"value": i} for i in range(3)], partition=0)
    group = unique("g")
    me = join(http, group, [topic], auto_offset_reset="earliest")
    doc = poll(http, group, me["member_id"])
    assert (
        commit(http, group, me["member_id"], doc["generation"], {(topic, 0): 2}).status_code == 200
    )
    assert http.delete(f"/v1/groups/{group}/members/{me['member_id']}").status_code == 204
    assert http.delete(f"/v1/topics/{topic}").status_code == 204
    r = http.post("/v1/topics", json={"name": topic, "partitions": 1})
    assert r.status_code == 201, r.text
    produce(http, topic, [{"value": f"new-{i}"} for i in range(3)], partition=0)
    me = join(http, group, [topic], auto_offset_reset="earliest")
    try:
        doc = poll(http, group, me["member_id"])
        assert [x["value"] for x in doc["records"]] == ["new-0", "new-1", "new-2"]
    finally:
        http.delete(f"/v1/groups/{group}/members/{me['member_id']}")


def test_offsets_of_an_empty_group_expire(tmp_path: Path) -> None:
    broker = start_broker(tmp_path / "data", env={"LOGBUS_OFFSETS_RETENTION_MS": "1000"})
    try:
        with make_client(broker) as c:
            topic = create_topic(c, "g-retention")
            idle, busy = unique("g"), unique("g")
            assert commit(c, idle, None, None, {(topic, 0): 0}).status_code == 200
            committed_at = time.time()
            me = join(c, busy, [topic], session_timeout_ms=30_000)
            assert (
                commit(c, busy, me["member_id"], me["generation"], {(topic, 0): 0}).status_code
                == 200
            )
            deadline = time.time() + 10
            while time.time() < deadline:
                if c.get(f"/v1/groups/{idle}/offsets").status_code == 404:
                    break
                time.sleep(0.1)
            expired_after = time.time()
            print(f"expired {expired_after - committed_at:.2f} s after the commit")
            assert_problem(c.get(f"/v1/groups/{idle}/offsets"), 404, "GROUP_ID_NOT_FOUND")
            listed = {g["group"] for g in c.get("/v1/groups").json()["groups"]}
            assert idle not in listed and busy in listed
            # A group with a member keeps its offsets however old they are.
            time.sleep(max(0.0, 1.5 - (time.time() - expired_after)))
            assert len(c.get(f"/v1/groups/{busy}/offsets").json()["offsets"]) == 1
            assert c.delete(f"/v1/groups/{busy}/members/{me['member_id']}").status_code == 204
        broker.restart()  # the expiry was written (tombstones): it survives a restart
        with make_client(broker) as c:
            assert_problem(c.get(f"/v1/groups/{idle}/offsets"), 404, "GROUP_ID_NOT_FOUND")
    finally:
        broker.stop()


def test_member_that_never_releases_is_removed_after_its_rebalance_timeout(
    http: httpx.Client,
) -> None:
    topic = create_topic(http, "g-stuck", partitions=2)
    group = unique("g")
    stuck = join(http, group, [topic], rebalance_timeout_ms=300)["member_id"]
    other = join(http, group, [topic])["member_id"]
    # The stuck member keeps polling (its session stays alive) but never acknowledges.
    doc = poll(http, group, stuck)
    assert len(doc["revoking"]) == 1
    deadline = time.time() + 5
    while time.time() < deadline:
        r = http.get(f"/v1/groups/{group}/members/{stuck}/records", params={"wait_ms": 0})
        if r.status_code != 200:
            break
        assert owned(heartbeat(http, group, other)) <= all_partitions(topic, 2)
        time.sleep(0.05)
    assert_problem(r, 409, "FENCED_MEMBER_EPOCH")
    assert owned(heartbeat(http, group, other)) == all_partitions(topic, 2)
    http.delete(f"/v1/groups/{group}/members/{other}")


def test_poll_wait_is_capped_by_the_session(http: httpx.Client) -> None:
    topic = create_topic(http, "g-poll-cap")
    group = unique("g")
    me = join(http, group, [topic], session_timeout_ms=600)["member_id"]
    started = time.monotonic()
    doc = poll(http, group, me, wait_ms=10_000)
    elapsed = time.monotonic() - started
    assert doc["records"] == [] and 0.2 <= elapsed < 2.0, elapsed
    # The poll kept the session alive: still a member.
    assert heartbeat(http, group, me)["member_id"] == me
    http.delete(f"/v1/groups/{group}/members/{me}")


def test_abandoned_poll_does_not_swallow_records(
    http: httpx.Client, shared_broker: BrokerProcess
) -> None:
    topic = create_topic(http, "g-abandoned")
    group = unique("g")
    me = join(http, group, [topic], auto_offset_reset="earliest")["member_id"]
    assert poll(http, group, me)["records"] == []  # position taken: 0
    with (
        httpx.Client(base_url=shared_broker.url, timeout=0.5) as impatient,
        pytest.raises(httpx.ReadTimeout),
    ):
        impatient.get(f"/v1/groups/{group}/members/{me}/records", params={"wait_ms": 2_000})
    produce(http, topic, [{"value": "a"}, {"value": "b"}], partition=0)
    time.sleep(2.0)  # the abandoned poll has answered into the void by now
    try:
        doc = poll(http, group, me)
        assert [x["value"] for x in doc["records"]] == ["a", "b"]
    finally:
        http.delete(f"/v1/groups/{group}/members/{me}")
