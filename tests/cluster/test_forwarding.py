"""Clients against any broker: requests for partitions led elsewhere are forwarded to the leader,
reads are served by followers up to their high watermark, and ``Logbus-Route: direct`` gets 421.

Three broker processes share a SQLite store; the topic has RF=2, so for each partition one
broker leads, one follows and one holds no replica — every path is exercised.
"""

from __future__ import annotations

import asyncio
import json
import re
import threading
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from cluster.metadata import MetadataStore, PartitionMeta

from .test_cluster_processes import brokers_on_one_store, eventually

TOPIC = "clicks"
PARTITIONS = 3


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, dict[int, str]]]:
    with brokers_on_one_store(tmp_path_factory.mktemp("fwd")) as (url, brokers):
        r = httpx.post(
            f"{brokers[1].url}/v1/topics",
            json={"name": TOPIC, "partitions": PARTITIONS, "replication_factor": 2},
            timeout=10,
        )
        assert r.status_code == 201, r.text
        urls = {i: b.url for i, b in brokers.items()}
        # Every broker knows every partition's leader, and each follower is in the ISR.
        for p in range(PARTITIONS):
            eventually(lambda p=p: len(_row(url, p).isr) == 2 or None, "full ISR")
            for base in urls.values():
                eventually(lambda base=base, p=p: _knows_leader(base, url, p), "metadata")
        yield url, urls


def _row(url: str, partition: int) -> PartitionMeta:
    store = MetadataStore(url)
    try:
        return store.topic(TOPIC).assignments[partition]
    finally:
        store.close()


def _knows_leader(base: str, url: str, partition: int) -> bool | None:
    r = httpx.get(f"{base}/v1/topics/{TOPIC}/partitions", timeout=10)
    if r.status_code == 404:  # the topic not seen there yet (its next metadata poll)
        return None
    return r.json()[partition]["leader"] == _row(url, partition).leader or None


def _roles(url: str, urls: dict[int, str], partition: int) -> tuple[str, str, str]:
    """(leader, follower, broker holding no replica) base URLs for ``partition``."""
    row = _row(url, partition)
    follower = next(r for r in row.replicas if r != row.leader)
    outsider = next(i for i in urls if i not in row.replicas)
    return urls[row.leader], urls[follower], urls[outsider]


def _produce(base: str, partition: int, values: list[str], **headers: str) -> httpx.Response:
    return httpx.post(
        f"{base}/v1/topics/{TOPIC}/partitions/{partition}/records",
        params={"acks": "all"},
        json={"records": [{"value": v} for v in values]},
        headers=headers,
        timeout=30,
    )


def _fetch(base: str, partition: int, offset: int, **params: Any) -> httpx.Response:
    return httpx.get(
        f"{base}/v1/topics/{TOPIC}/partitions/{partition}/records",
        params={"offset": offset, **params},
        timeout=30,
    )


def test_produce_through_any_broker_reaches_the_leader(
    cluster: tuple[str, dict[int, str]],
) -> None:
    url, urls = cluster
    leader, follower, outsider = _roles(url, urls, 0)
    before = _fetch(leader, 0, 0).json()["high_watermark"]
    for base in (follower, outsider, leader):
        r = _produce(base, 0, [f"via-{base[-5:]}"])
        assert r.status_code == 200, r.text
    after = _fetch(leader, 0, before).json()
    assert [rec["value"] for rec in after["records"]] == [
        f"via-{b[-5:]}" for b in (follower, outsider, leader)
    ]
    assert after["high_watermark"] == before + 3


def test_direct_route_gets_421_naming_the_leader(cluster: tuple[str, dict[int, str]]) -> None:
    url, urls = cluster
    leader, follower, outsider = _roles(url, urls, 1)
    for base in (follower, outsider):
        r = _produce(base, 1, ["x"], **{"Logbus-Route": "direct"})
        assert r.status_code == 421, r.text
        body = r.json()
        assert body["code"] == "NOT_LEADER_OR_FOLLOWER"
        assert body["leader_id"] == _row(url, 1).leader and body["leader_url"] == leader
        read = httpx.get(
            f"{base}/v1/topics/{TOPIC}/partitions/1/records",
            params={"offset": 0},
            headers={"Logbus-Route": "direct"},
            timeout=10,
        )
        assert read.status_code == 421, read.text
    assert _produce(leader, 1, ["y"], **{"Logbus-Route": "direct"}).status_code == 200


def test_a_bad_route_header_is_400_and_changes_nothing(
    cluster: tuple[str, dict[int, str]],
) -> None:
    url, urls = cluster
    leader, _, outsider = _roles(url, urls, 2)
    hw = _fetch(leader, 2, 0).json()["high_watermark"]
    r = _produce(outsider, 2, ["nope"], **{"Logbus-Route": "sideways"})
    assert r.status_code == 400 and "Logbus-Route" in r.json()["detail"]
    assert _fetch(leader, 2, 0).json()["high_watermark"] == hw


def test_reads_from_any_broker_see_acknowledged_writes_at_once(
    cluster: tuple[str, dict[int, str]],
) -> None:
    url, urls = cluster
    leader, follower, outsider = _roles(url, urls, 2)
    start = _fetch(leader, 2, 0).json()["high_watermark"]
    r = _produce(leader, 2, [f"r{i}" for i in range(20)])
    assert r.status_code == 200, r.text
    for base in (leader, follower, outsider):
        got = _fetch(base, 2, start).json()
        assert [rec["value"] for rec in got["records"]] == [f"r{i}" for i in range(20)], base
        assert got["high_watermark"] == start + 20
        binary = httpx.get(
            f"{base}/v1/topics/{TOPIC}/partitions/2/records",
            params={"offset": start},
            headers={"Accept": "application/vnd.logbus.batch"},
            timeout=10,
        )
        assert binary.status_code == 200, binary.text
        assert (
            binary.content
            == httpx.get(
                f"{leader}/v1/topics/{TOPIC}/partitions/2/records",
                params={"offset": start},
                headers={"Accept": "application/vnd.logbus.batch"},
                timeout=10,
            ).content
        )


def test_a_page_of_max_records_reads_alike_from_every_broker(
    cluster: tuple[str, dict[int, str]],
) -> None:
    """A JSON page bounded by max_records (the log reads up to the batch holding its last
    record: locally, or by the leader for a broker without the records) answers the same
    records and next offset from the leader, a follower and a broker without a replica."""
    url, urls = cluster
    leader, follower, outsider = _roles(url, urls, 1)
    start = _fetch(leader, 1, 0).json()["high_watermark"]
    for k in range(4):  # four batches of five records
        r = _produce(leader, 1, [f"b{k}r{i}" for i in range(5)])
        assert r.status_code == 200, r.text
    values = [f"b{k}r{i}" for k in range(4) for i in range(5)]
    for offset, wanted in ((start, 7), (start + 3, 5), (start + 5, 10), (start + 19, 3)):
        pages = [
            _fetch(b, 1, offset, max_records=wanted).json() for b in (leader, follower, outsider)
        ]
        want = values[offset - start : offset - start + wanted]
        for page in pages:
            assert [rec["value"] for rec in page["records"]] == want, (offset, wanted)
            assert page["next_offset"] == offset + len(want)


def test_long_poll_through_a_broker_without_a_replica_wakes_on_a_write(
    cluster: tuple[str, dict[int, str]],
) -> None:
    url, urls = cluster
    leader, follower, outsider = _roles(url, urls, 0)
    hw = _fetch(leader, 0, 0).json()["high_watermark"]
    answers: dict[str, Any] = {}

    def poll(base: str) -> None:
        answers[base] = _fetch(base, 0, hw, wait_ms=20_000).json()

    pollers = [threading.Thread(target=poll, args=(b,)) for b in (outsider, follower)]
    for t in pollers:
        t.start()
    # Both long-polls are parked at the leader (or the follower's replica) before the write:
    # the leader's waiter count is not visible, so the write simply comes after the start; a
    # poll that started late still finds the record (it reads from hw).
    assert _produce(leader, 0, ["wake"]).status_code == 200
    for t in pollers:
        t.join(timeout=30)
        assert not t.is_alive()
    for base in (outsider, follower):
        assert [r["value"] for r in answers[base]["records"]] == ["wake"], base


def test_offsets_and_sse_through_a_broker_without_a_replica(
    cluster: tuple[str, dict[int, str]],
) -> None:
    url, urls = cluster
    leader, _, outsider = _roles(url, urls, 1)
    r = httpx.get(
        f"{outsider}/v1/topics/{TOPIC}/partitions/1/offsets", params={"at": "latest"}, timeout=10
    )
    assert r.status_code == 200, r.text
    latest = r.json()["offset"]
    assert latest == _fetch(leader, 1, 0).json()["high_watermark"]
    assert _produce(outsider, 1, ["sse-1", "sse-2"]).status_code == 200
    seen: list[Any] = []
    with httpx.stream(
        "GET",
        f"{outsider}/v1/topics/{TOPIC}/partitions/1/records",
        params={"offset": latest},
        headers={"Accept": "text/event-stream"},
        timeout=30,
    ) as stream:
        assert stream.status_code == 200
        for line in stream.iter_lines():
            if line.startswith("data:"):
                seen.append(json.loads(line[5:])["value"])
            if len(seen) == 2:
                break
    assert seen == ["sse-1", "sse-2"]


def test_idempotent_retry_through_another_broker_is_deduplicated(
    cluster: tuple[str, dict[int, str]],
) -> None:
    url, urls = cluster
    _, follower, outsider = _roles(url, urls, 1)
    session = httpx.post(f"{outsider}/v1/producers", json={}, timeout=10).json()
    headers = {
        "Logbus-Producer-Id": str(session["producer_id"]),
        "Logbus-Producer-Epoch": str(session["producer_epoch"]),
        "Logbus-Sequence": "0",
    }
    first = _produce(outsider, 1, ["once"], **headers)
    assert first.status_code == 200, first.text
    again = _produce(follower, 1, ["once"], **headers)
    assert again.status_code == 200, again.text
    assert again.headers.get("Logbus-Duplicate") == "true"
    assert again.json()["offsets"] == first.json()["offsets"]


def test_framed_bodies_and_errors_cross_the_wire_intact() -> None:
    from cluster import replica_wire as wire
    from cluster.forwarding import decode_error, encode_error
    from core_log.errors import ErrorCode, LogbusError, OffsetOutOfRangeError

    with pytest.raises(wire.ReplicaWireError):
        wire.unframe(b"\x00\x00\x00\x10{}")  # shorter than its length says
    with pytest.raises(wire.ReplicaWireError):
        wire.unframe(b"\x00\x00\x00\x02[]")  # not an object
    header, rest = wire.unframe(wire.frame({"a": 1}, b"xyz"))
    assert header == {"a": 1} and bytes(rest) == b"xyz"

    def through(e: LogbusError) -> LogbusError:
        body = encode_error(e).body
        assert isinstance(body, bytes)
        return decode_error(wire.unframe(body)[0]["error"])

    out = through(OffsetOutOfRangeError(7, 10, 20))
    assert isinstance(out, OffsetOutOfRangeError)
    assert (out.offset, out.log_start_offset, out.log_end_offset) == (7, 10, 20)
    timed_out = through(LogbusError("slow", code=ErrorCode.REQUEST_TIMED_OUT, isr=[1, 2]))
    assert timed_out.code is ErrorCode.REQUEST_TIMED_OUT and timed_out.detail == {"isr": [1, 2]}
    assert timed_out.http_status == 504 and timed_out.retriable


def test_cluster_view_lists_brokers_controller_and_partition_health(
    cluster: tuple[str, dict[int, str]],
) -> None:
    url, urls = cluster
    store = MetadataStore(url)
    try:
        controller = store.controller()
    finally:
        store.close()
    assert controller is not None
    for i, base in urls.items():
        body = httpx.get(f"{base}/v1/cluster", timeout=10).json()
        assert body["broker_id"] == i and body["clustered"] is True
        assert body["controller"] == controller.broker_id
        assert [(b["broker_id"], b["url"], b["alive"]) for b in body["brokers"]] == [
            (j, urls[j], True) for j in sorted(urls)
        ]
        health = body["partitions"]
        assert health["total"] >= PARTITIONS and health["offline"] == 0
        assert health["unclean_elections"] == 0


def test_admin_changes_are_made_by_the_controller(cluster: tuple[str, dict[int, str]]) -> None:
    url, urls = cluster
    store = MetadataStore(url)
    try:
        controller = store.controller()
    finally:
        store.close()
    assert controller is not None and controller.alive
    other = next(base for i, base in urls.items() if i != controller.broker_id)
    r = httpx.post(
        f"{other}/v1/topics",
        json={"name": "admin-fwd", "partitions": 2, "replication_factor": 2},
        timeout=30,
    )
    assert r.status_code == 201, r.text
    assert r.headers["Logbus-Forwarded-To"] == str(controller.broker_id)
    assert r.headers["Location"] == "/v1/topics/admin-fwd"
    # Routed by the client: answered where asked (the store transaction is safe anywhere).
    direct = httpx.post(
        f"{other}/v1/topics/admin-fwd/partitions",
        json={"count": 3},
        headers={"Logbus-Route": "direct"},
        timeout=30,
    )
    assert direct.status_code == 200, direct.text
    assert "Logbus-Forwarded-To" not in direct.headers
    gone = httpx.delete(f"{other}/v1/topics/admin-fwd", timeout=30)
    assert gone.status_code == 204, gone.text


def test_group_calls_through_any_broker_reach_the_coordinator(
    cluster: tuple[str, dict[int, str]],
) -> None:
    url, urls = cluster
    leader, _, _ = _roles(url, urls, 0)
    group = "fwd-group"
    # Every call goes to a different broker; each is answered by the coordinator.
    bases = list(urls.values())
    # The offsets topic is created at the first group call (503 COORDINATOR_NOT_AVAILABLE,
    # retriable, until it is and its partitions are loaded), then every broker must learn its
    # leaders: retry like a Kafka client until each broker answers a group call.
    for base in bases:
        eventually(
            lambda base=base: (lambda r: r if r.status_code in (200, 404) else None)(
                httpx.get(f"{base}/v1/groups/{group}/offsets", timeout=30)
            ),
            f"{base} reaching the coordinator",
        )
    joined = httpx.post(
        f"{bases[0]}/v1/groups/{group}/members",
        json={"topics": [TOPIC], "auto_offset_reset": "earliest"},
        timeout=30,
    )
    assert joined.status_code == 201, joined.text
    member = joined.json()["member_id"]
    beat = httpx.post(f"{bases[1]}/v1/groups/{group}/members/{member}/heartbeat", timeout=30)
    assert beat.status_code == 200, beat.text
    assert {(a["topic"], a["partition"]) for a in beat.json()["assignment"]} == {
        (TOPIC, p) for p in range(PARTITIONS)
    }
    committed = httpx.post(
        f"{bases[2]}/v1/groups/{group}/offsets",
        json={
            "member_id": member,
            "generation": beat.json()["generation"],
            "offsets": [{"topic": TOPIC, "partition": 0, "offset": 1}],
        },
        timeout=30,
    )
    assert committed.status_code == 200, committed.text
    for base in bases:
        got = httpx.get(f"{base}/v1/groups/{group}/offsets", timeout=30)
        assert got.status_code == 200, got.text
        assert [(o["partition"], o["offset"]) for o in got.json()["offsets"]] == [(0, 1)]
    polled = httpx.get(
        f"{bases[1]}/v1/groups/{group}/members/{member}/records",
        params={"wait_ms": 5000},
        timeout=30,
    )
    assert polled.status_code == 200, polled.text
    assert _fetch(leader, 0, 0).json()["high_watermark"] > 0


def test_partition_listing_gives_the_leaders_offsets_on_every_broker(
    cluster: tuple[str, dict[int, str]],
) -> None:
    url, urls = cluster
    leader, _, outsider = _roles(url, urls, 0)
    assert _produce(leader, 0, ["listed"]).status_code == 200
    hw = _fetch(leader, 0, 0).json()["high_watermark"]
    for i, base in urls.items():
        [p0] = [
            p
            for p in httpx.get(f"{base}/v1/topics/{TOPIC}/partitions", timeout=10).json()
            if p["partition"] == 0
        ]
        assert p0["high_watermark"] == hw and p0["log_end_offset"] == hw, base
        if base == outsider:
            assert p0["local_replica"] is None
        else:
            assert p0["local_replica"]["broker_id"] == i


def test_the_leader_exports_isr_and_follower_lag_metrics(
    cluster: tuple[str, dict[int, str]],
) -> None:
    url, urls = cluster
    row = _row(url, 2)
    leader = urls[row.leader]
    follower = next(r for r in row.replicas if r != row.leader)
    assert _produce(leader, 2, ["m"]).status_code == 200
    text = httpx.get(f"{leader}/metrics", timeout=10).text
    assert f'logbus_partition_isr_size{{partition="2",topic="{TOPIC}"}} 2.0' in text
    assert f'logbus_partition_under_replicated{{partition="2",topic="{TOPIC}"}} 0.0' in text
    lag = re.search(
        rf'logbus_replica_lag_records{{follower="{follower}",partition="2",topic="{TOPIC}"}} (\S+)',
        text,
    )
    assert lag is not None and float(lag[1]) >= 0  # acks=all: the follower has fetched


def test_websocket_through_a_broker_without_a_replica_streams_new_records(
    cluster: tuple[str, dict[int, str]],
) -> None:
    from websockets.asyncio.client import connect

    from tests.api.test_ws import Consumer, credit, subscribe

    url, urls = cluster
    leader, _, outsider = _roles(url, urls, 1)
    start = _fetch(leader, 1, 0).json()["high_watermark"]

    async def main() -> list[Any]:
        ws_url = outsider.replace("http://", "ws://", 1) + "/v1/ws"
        async with connect(ws_url, open_timeout=10, close_timeout=2, max_size=None) as ws:
            await subscribe(ws, partitions=[{"topic": TOPIC, "partition": 1, "offset": start}])
            await credit(ws, 100)
            # Written after the subscription: the outsider's long-poll at the leader wakes.
            r = await asyncio.to_thread(_produce, leader, 1, ["ws-1", "ws-2", "ws-3"])
            assert r.status_code == 200, r.text
            c = Consumer(ws)
            await c.until(3)
            return [(o, v) for _, _, o, v in c.records]

    got = asyncio.run(main())
    assert got == [(start, "ws-1"), (start + 1, "ws-2"), (start + 2, "ws-3")]


def test_concurrent_forwarded_produces_each_get_their_own_committed_offset(
    cluster: tuple[str, dict[int, str]],
) -> None:
    """Many acks=all produces reaching a follower and a broker without a replica at once go to
    the leader in groups (``/partition/produce-many``), appended and waited for together
    (``ReplicaManager.append_many``): each is still answered its own offset, once committed."""
    url, urls = cluster
    leader, follower, outsider = _roles(url, urls, 2)
    before = _fetch(leader, 2, 0).json()["high_watermark"]
    values = [f"group-{i}" for i in range(40)]

    async def send_all() -> list[httpx.Response]:
        async with httpx.AsyncClient(timeout=30) as client:
            return list(
                await asyncio.gather(
                    *(
                        client.post(
                            f"{(follower, outsider)[i % 2]}/v1/topics/{TOPIC}/partitions/2/records",
                            params={"acks": "all"},
                            json={"records": [{"value": v}]},
                        )
                        for i, v in enumerate(values)
                    )
                )
            )

    answers = asyncio.run(send_all())
    assert all(r.status_code == 200 for r in answers), [r.text for r in answers]
    offsets = [r.json()["offsets"][0]["offset"] for r in answers]
    assert sorted(offsets) == list(range(before, before + len(values)))
    read = _fetch(leader, 2, before).json()
    assert read["high_watermark"] >= before + len(values)  # acknowledged: committed
    by_offset = {rec["offset"]: rec["value"] for rec in read["records"]}
    assert [by_offset[o] for o in offsets] == values
