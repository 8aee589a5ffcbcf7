"""Consumer groups against any broker, with three broker processes: every broker lists every
group of the cluster (each coordinator asked for its own), a group is described through a
broker that does not coordinate it, and a coordinator that cannot answer is named in the list
instead of failing it."""

from __future__ import annotations

import functools
import json
import threading
import zlib
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest

import api.process
from tests.server import BrokerProcess

from .test_cluster_processes import (
    _row,
    brokers_on_one_store,
    eventually,
    knows_topic,
    post_until_acknowledged,
)

TOPIC = "views"
OFFSETS_PARTITIONS = 4  # the coordinator's default for __consumer_offsets
GROUPS = [f"readers-{i}" for i in range(12)]


def _partition(group: str) -> int:
    return zlib.crc32(group.encode()) % OFFSETS_PARTITIONS


def _commit(base: str, group: str, offset: int) -> bool | None:
    """A standalone commit (an empty group) through ``base``; None on a retriable answer."""
    try:
        r = httpx.post(
            f"{base}/v1/groups/{group}/offsets",
            json={"offsets": [{"topic": TOPIC, "partition": 0, "offset": offset}]},
            timeout=15,
        )
    except httpx.TransportError:
        return None
    if r.status_code in (421, 503, 504):
        return None
    assert r.status_code == 200, r.text
    return True


def _list(base: str, **headers: str) -> dict[str, Any]:
    r = httpx.get(f"{base}/v1/groups", headers=headers, timeout=30)
    assert r.status_code == 200, r.text
    doc: dict[str, Any] = r.json()
    return doc


def _complete(base: str) -> dict[str, Any] | None:
    doc = _list(base)
    return doc if not doc["unavailable"] else None


def _settled(url: str, brokers: dict[int, BrokerProcess]) -> bool | None:
    rows = [_row(url, "__consumer_offsets", p) for p in range(OFFSETS_PARTITIONS)]
    if any(r.leader != r.replicas[0] for r in rows):
        return None  # the controller's preferred-leader rebalance has not run yet
    for i, b in brokers.items():
        mine = sorted(p for p, r in enumerate(rows) if r.leader == i)
        if _list(b.url, **{"Logbus-Route": "direct"})["offsets_partitions"] != mine:
            return None
    return True


def _own_list_matches(url: str, broker_id: int, base: str) -> bool | None:
    leaders = _leaders(url)
    mine = _list(base, **{"Logbus-Route": "direct"})
    own = sorted(g for g in GROUPS if leaders[_partition(g)] == broker_id)
    led = sorted(p for p, b in leaders.items() if b == broker_id)
    ok = [g["group"] for g in mine["groups"]] == own and mine["offsets_partitions"] == led
    return ok or None


def _leaders(url: str) -> dict[int, int]:
    return {p: _row(url, "__consumer_offsets", p).leader for p in range(OFFSETS_PARTITIONS)}


@pytest.fixture
def groups_cluster(
    tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch
) -> Iterator[tuple[str, dict[int, BrokerProcess]]]:
    monkeypatch.setattr(api.process, "STARTUP_TIMEOUT_S", 120.0)  # a loaded shared machine
    with brokers_on_one_store(tmp_path_factory.mktemp("groups")) as (url, brokers):
        r = httpx.post(
            f"{brokers[1].url}/v1/topics",
            json={"name": TOPIC, "partitions": 1, "replication_factor": 3},
            timeout=15,
        )
        assert r.status_code == 201, r.text
        r = httpx.post(
            f"{brokers[1].url}/v1/topics/{TOPIC}/partitions/0/records",
            json={"records": [{"value": str(i)} for i in range(10)]},
            timeout=15,
        )
        assert r.status_code == 200, r.text
        for i, g in enumerate(GROUPS):  # all through broker 1: forwarded to each coordinator
            eventually(functools.partial(_commit, brokers[1].url, g, i % 10), f"commit of {g}")
        # Leadership settled (preferred leaders) and every coordinator has loaded its share.
        eventually(functools.partial(_settled, url, brokers), "coordinators settled")
        yield url, brokers


def test_every_broker_lists_every_group_and_describes_any(
    groups_cluster: tuple[str, dict[int, BrokerProcess]],
) -> None:
    url, brokers = groups_cluster
    leaders = _leaders(url)
    assert len(set(leaders.values())) >= 2, leaders  # leaders are spread over the brokers
    assert {_partition(g) for g in GROUPS} == set(range(OFFSETS_PARTITIONS))

    for i, b in brokers.items():
        doc = eventually(functools.partial(_complete, b.url), f"a complete list from broker {i}")
        assert [g["group"] for g in doc["groups"]] == sorted(GROUPS), (i, doc)
        assert doc["offsets_partitions"] == list(range(OFFSETS_PARTITIONS))
        # Logbus-Route: direct: this broker's own groups, as Kafka's ListGroups of one broker
        # (compared with the leaders of the moment: on a loaded machine a lease may lapse and
        # leadership move again; a broker unloads a partition within a second of losing it).
        eventually(functools.partial(_own_list_matches, url, i, b.url), f"broker {i}'s list")

    # Describe and offsets through a broker that does not coordinate the group: forwarded.
    for g in GROUPS[:4]:
        coordinator = _leaders(url)[_partition(g)]
        other = next(b for j, b in brokers.items() if j != coordinator)
        r = httpx.get(f"{other.url}/v1/groups/{g}", timeout=15)
        assert r.status_code == 200, r.text
        # Forwarded to the coordinator (unless leadership moved to ``other`` meanwhile).
        assert r.headers.get("Logbus-Forwarded-To", str(coordinator)) == str(coordinator) or (
            _leaders(url)[_partition(g)] != coordinator
        ), (r.headers, coordinator)
        assert r.json()["group"] == g and r.json()["state"] == "empty"
        committed = r.json()["offsets"][0]["committed_offset"]
        r = httpx.get(f"{other.url}/v1/groups/{g}/offsets", timeout=15)
        assert r.status_code == 200, r.text
        assert r.headers.get("Logbus-Forwarded-To") in (str(coordinator), None), r.headers
        assert r.json()["offsets"][0]["offset"] == committed == GROUPS.index(g) % 10


def test_a_coordinator_that_cannot_answer_is_named_not_fatal(
    groups_cluster: tuple[str, dict[int, BrokerProcess]],
) -> None:
    url, brokers = groups_cluster
    leaders = _leaders(url)
    victim = next(b for b in sorted(set(leaders.values())) if b != 1)
    lost = sorted(p for p, b in leaders.items() if b == victim)
    brokers[victim].kill()

    # Right after the kill broker 1 may still think the victim leads (its lease runs 2 s),
    # or the partitions may have moved already: either way the answer is 200 and exact.
    doc = _list(brokers[1].url)
    missing = {p for gap in doc["unavailable"] for p in gap["partitions"]}
    assert missing <= set(lost), doc
    assert set(doc["offsets_partitions"]) == set(range(OFFSETS_PARTITIONS)) - missing
    listed = [g["group"] for g in doc["groups"]]
    assert listed == sorted(g for g in GROUPS if _partition(g) not in missing), doc
    for gap in doc["unavailable"]:
        assert gap["code"] in ("COORDINATOR_NOT_AVAILABLE", "COORDINATOR_LOAD_IN_PROGRESS")
        assert gap["broker_id"] in (victim, None) or gap["code"] == "COORDINATOR_LOAD_IN_PROGRESS"

    # Once new coordinators have loaded the partitions, the list is whole again: no group lost.
    whole = eventually(lambda: _complete(brokers[1].url), "a complete list after the failover")
    assert [g["group"] for g in whole["groups"]] == sorted(GROUPS)


WS_TOPIC = "ws-clicks"
WS_PARTITIONS = 2


def _ws_group(leaders: dict[int, int], not_on: int) -> tuple[str, int]:
    """A group name whose coordinator is not broker ``not_on``, and that coordinator."""
    for k in range(1000):
        name = f"ws-readers-{k}"
        coordinator = leaders[_partition(name)]
        if coordinator not in (not_on, -1):
            return name, coordinator
    raise AssertionError(f"no offsets partition led elsewhere than {not_on}: {leaders}")


def _produce_ws(urls: list[str], start: int, count: int) -> None:
    """``w{i}`` for i in [start, start+count), to partition i % 2, retried through any of
    ``urls`` until acknowledged (a partition the killed broker led needs a new leader)."""
    for i in range(start, start + count):
        post_until_acknowledged(
            urls,
            f"/v1/topics/{WS_TOPIC}/partitions/{i % WS_PARTITIONS}/records",
            f"a produce of w{i}",
            params={"acks": "all"},
            headers={"Idempotency-Key": f"ws-{i}"},
            json={"records": [{"value": f"w{i}"}]},
        )


def _failover_setup(url: str, brokers: dict[int, BrokerProcess]) -> tuple[str, int, list[str]]:
    """The coordinator-kill tests' start: their RF=3 topic, a group coordinated by a broker
    other than 1 (the victim), and the URLs of the brokers that survive it."""
    r = httpx.post(
        f"{brokers[1].url}/v1/topics",
        json={"name": WS_TOPIC, "partitions": WS_PARTITIONS, "replication_factor": 3},
        timeout=15,
    )
    assert r.status_code == 201, r.text
    # Every broker must know the topic before a member joins: the group's coordinator (another
    # broker) refused the join with 4404 unknown topic when it had not polled the store yet.
    for b in brokers.values():
        eventually(functools.partial(knows_topic, b.url, WS_TOPIC), f"{b.url} knows {WS_TOPIC}")
    group, victim = _ws_group(_leaders(url), not_on=1)
    return group, victim, [b.url for i, b in brokers.items() if i != victim]


def test_a_websocket_member_keeps_receiving_when_its_coordinator_is_killed(
    groups_cluster: tuple[str, dict[int, BrokerProcess]],
) -> None:
    """3 brokers; a WebSocket member on broker 1 of a group coordinated by another broker,
    which is SIGKILLed while records keep coming: the socket stays open, the member keeps its
    id, every record arrives, and a record is delivered again only from the offsets the
    member had committed (at least once) — never from before them."""
    import asyncio

    from tests.api.test_ws import Consumer, credit, join, send

    url, brokers = groups_cluster
    group, victim, survivors = _failover_setup(url, brokers)
    ws_url = brokers[1].url.replace("http://", "ws://", 1) + "/v1/ws"

    async def scenario() -> tuple[Consumer, dict[int, int], list[str]]:
        from websockets.asyncio.client import connect

        async with connect(
            ws_url, open_timeout=15, close_timeout=2, max_size=None, ping_interval=None
        ) as ws:
            joined = await join(
                ws,
                group,
                [WS_TOPIC],
                session_timeout_ms=30_000,
                auto_offset_reset="earliest",
                auto_ack=True,
            )
            await credit(ws, 1_000_000)
            c = Consumer(ws)

            async def pump() -> None:  # always reading: the socket never backs up
                while True:
                    c._take(await ws.recv())

            async def until(done: Callable[[], bool], what: str) -> None:
                deadline = asyncio.get_running_loop().time() + 90
                while not done():
                    assert not pumping.done(), pumping
                    assert asyncio.get_running_loop().time() < deadline, (what, c.other)
                    await asyncio.sleep(0.05)

            def have(n: int) -> bool:
                return {f"w{i}" for i in range(n)} <= {v for *_, v in c.records}

            pumping = asyncio.create_task(pump())
            await asyncio.to_thread(_produce_ws, survivors, 0, 40)
            await until(lambda: have(40), "the first 40 records")
            committed = {p: 1 + max(c.offsets(WS_TOPIC, p)) for p in range(WS_PARTITIONS)}
            offsets = [
                {"topic": WS_TOPIC, "partition": p, "offset": o} for p, o in committed.items()
            ]
            await send(ws, {"op": "commit", "id": "before", "offsets": offsets})
            await until(
                lambda: any(m.get("id") == "before" for m in c.other), "the commit's answer"
            )
            assert {"type": "committed", "id": "before", "count": 2} in c.other, c.other

            brokers[victim].kill()
            await asyncio.to_thread(_produce_ws, survivors, 40, 40)
            await until(lambda: have(80), "all 80 records")
            r = await asyncio.to_thread(
                httpx.get, f"{brokers[1].url}/v1/groups/{group}", timeout=15
            )
            assert r.status_code == 200, r.text
            assert r.headers.get("Logbus-Forwarded-To", "1") != str(victim)  # a new coordinator
            assert [m["member_id"] for m in r.json()["members"]] == [joined["member_id"]]
            pumping.cancel()
            return c, committed, [joined["member_id"]]

    c, committed, _ = asyncio.run(scenario())
    # No record before the committed offsets came twice; later ones at most twice each.
    for p in range(WS_PARTITIONS):
        seen = c.offsets(WS_TOPIC, p)
        again = [o for o in set(seen) if seen.count(o) > 1]
        assert all(o >= committed[p] for o in again), (p, committed, sorted(again))
    rejoined = [m for m in c.other if m.get("type") == "joined"]
    assert not rejoined, rejoined
    notices = [m for m in c.other if m.get("type") == "error"]
    assert len(notices) <= 1 and all(m["retriable"] for m in notices), notices


def _sse_records(
    base: str, group: str, member_id: str, out: list[dict[str, Any]], stop: threading.Event
) -> None:
    """Read a member's SSE stream through ``base`` into ``out`` (records and error events)
    until ``stop``; one response, never reopened."""
    path = f"{base}/v1/groups/{group}/members/{member_id}/records"
    timeout = httpx.Timeout(15, read=60)
    with httpx.stream("GET", path, headers={"Accept": "text/event-stream"}, timeout=timeout) as r:
        out.append({"status": r.status_code})
        event = "message"
        for line in r.iter_lines():
            if stop.is_set():
                return
            if line.startswith("event: "):
                event = line[7:]
            elif line.startswith("data: "):
                out.append({"event": event, **json.loads(line[6:])})
            elif not line:
                event = "message"
    out.append({"ended": True})


def test_a_member_sse_stream_through_another_broker_survives_a_coordinator_kill(
    groups_cluster: tuple[str, dict[int, BrokerProcess]],
) -> None:
    """A member's SSE stream opened on broker 1, its coordinator elsewhere and SIGKILLed while
    records keep coming: the same response goes on (broker 1 resumes it at the new
    coordinator), every record arrives, at most one retriable error event is seen."""
    url, brokers = groups_cluster
    group, victim, survivors = _failover_setup(url, brokers)

    def join() -> dict[str, Any] | None:
        r = httpx.post(
            f"{brokers[1].url}/v1/groups/{group}/members",
            json={
                "topics": [WS_TOPIC],
                "session_timeout_ms": 30_000,
                "auto_offset_reset": "earliest",
            },
            timeout=15,
        )
        if r.status_code in (421, 503):
            return None
        assert r.status_code == 201, r.text
        doc: dict[str, Any] = r.json()
        return doc

    member = eventually(join, "a member")
    got: list[dict[str, Any]] = []
    stop = threading.Event()
    reader = threading.Thread(
        target=_sse_records, args=(brokers[1].url, group, member["member_id"], got, stop)
    )
    reader.start()
    try:

        def have(n: int) -> bool | None:
            assert not any("ended" in x for x in got), got[-5:]
            values = {x.get("value") for x in got if x.get("event") == "message"}
            return {f"w{i}" for i in range(n)} <= values or None

        _produce_ws(survivors, 0, 30)
        eventually(lambda: have(30), "30 records on the stream", timeout_s=90)
        brokers[victim].kill()
        _produce_ws(survivors, 30, 30)
        eventually(lambda: have(60), "60 records on the stream", timeout_s=90)
        # The reader looks at ``stop`` when a line arrives: one more record wakes it now, not
        # the next keepalive, up to a third of the member's 30 s session later (10 s).
        stop.set()
        _produce_ws(survivors, 60, 1)
    finally:
        stop.set()
        reader.join(timeout=90)
    assert got[0] == {"status": 200}, got[:3]
    errors = [x for x in got if x.get("event") == "error"]
    assert len(errors) <= 1 and all(e["retriable"] for e in errors), errors
