"""Admin guards: the internal offsets topic stays as the coordinator needs it, Kafka's offset
sentinels, and topic names that collide once '.' and '_' are equated."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import httpx
import pytest
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed

from core_log.limits import MAX_PARTITIONS_PER_TOPIC
from tests.api.conftest import make_client, start_broker
from tests.api.helpers import BATCH, assert_problem, create_topic, produce, unique
from tests.server import BrokerProcess

OFFSETS = "__consumer_offsets"


def _describe(http: httpx.Client, topic: str) -> dict[str, object]:
    r = http.get(f"/v1/topics/{topic}")
    assert r.status_code == 200, r.text
    doc: dict[str, object] = r.json()
    return doc


# -- internal topics -----------------------------------------------------------------------------


def test_internal_topic_partition_count_is_fixed(http: httpx.Client) -> None:
    before = _describe(http, OFFSETS)["partitions"]
    assert isinstance(before, int)
    r = http.post(f"/v1/topics/{OFFSETS}/partitions", json={"count": before + 4})
    body = assert_problem(r, 400, "POLICY_VIOLATION")
    assert "internal" in body["detail"]
    assert _describe(http, OFFSETS)["partitions"] == before


@pytest.mark.parametrize(
    "configs",
    [
        {"cleanup.policy": "delete", "retention.ms": 1},
        {"cleanup.policy": "compact,delete"},
        {"cleanup.policy": None},  # a reset to the default (delete) is a change as well
    ],
)
def test_internal_topic_cleanup_policy_is_fixed(
    http: httpx.Client, configs: dict[str, object]
) -> None:
    before = http.get(f"/v1/topics/{OFFSETS}/configs").json()
    r = http.patch(f"/v1/topics/{OFFSETS}/configs", json={"configs": configs})
    assert_problem(r, 400, "POLICY_VIOLATION")
    after = http.get(f"/v1/topics/{OFFSETS}/configs").json()
    assert after == before
    assert after["configs"]["cleanup.policy"] == "compact"


def test_internal_topic_cannot_be_deleted(http: httpx.Client) -> None:
    assert_problem(http.delete(f"/v1/topics/{OFFSETS}"), 400, "INVALID_TOPIC_EXCEPTION")
    _describe(http, OFFSETS)


@pytest.mark.parametrize("accept", ["application/json", "application/x-ndjson", BATCH])
def test_internal_topic_records_are_not_fetched(http: httpx.Client, accept: str) -> None:
    group = unique("g")
    topic = create_topic(http, "commit-src")
    r = http.post(
        f"/v1/groups/{group}/offsets",
        json={"offsets": [{"topic": topic, "partition": 0, "offset": 0}]},
    )
    assert r.status_code == 200, r.text
    for p in range(int(str(_describe(http, OFFSETS)["partitions"]))):
        r = http.get(
            f"/v1/topics/{OFFSETS}/partitions/{p}/records",
            params={"offset": 0},
            headers={"accept": accept},
        )
        body = assert_problem(r, 403, "TOPIC_AUTHORIZATION_FAILED")
        assert "/v1/groups" in body["detail"]


def test_internal_topic_records_are_not_streamed(http: httpx.Client) -> None:
    r = http.get(
        f"/v1/topics/{OFFSETS}/partitions/0/records",
        params={"offset": 0},
        headers={"accept": "text/event-stream"},
    )
    assert_problem(r, 403, "TOPIC_AUTHORIZATION_FAILED")


def test_internal_topic_takes_no_produce(http: httpx.Client) -> None:
    r = http.post(f"/v1/topics/{OFFSETS}/records", json={"records": [{"value": 1}]})
    assert_problem(r, 400, "INVALID_TOPIC_EXCEPTION")


def test_the_transaction_state_topic_is_internal_too(http: httpx.Client) -> None:
    """``__transaction_state`` (the transaction coordinators' log) takes no client write,
    read, deletion or change, and is not listed — as ``__consumer_offsets``."""
    state = "__transaction_state"
    assert http.post("/v1/transactions/guard-probe", json={}).status_code == 201  # it exists
    before = _describe(http, state)
    assert "__transaction_state" not in {t["name"] for t in http.get("/v1/topics").json()["topics"]}
    r = http.post(f"/v1/topics/{state}/partitions/0/records", json={"records": [{"value": 1}]})
    assert_problem(r, 400, "INVALID_TOPIC_EXCEPTION")
    r = http.get(f"/v1/topics/{state}/partitions/0/records", params={"offset": 0})
    assert "/v1/transactions" in assert_problem(r, 403, "TOPIC_AUTHORIZATION_FAILED")["detail"]
    assert_problem(http.delete(f"/v1/topics/{state}"), 400, "INVALID_TOPIC_EXCEPTION")
    r = http.post(f"/v1/topics/{state}/partitions", json={"count": 40})
    assert_problem(r, 400, "POLICY_VIOLATION")
    r = http.patch(f"/v1/topics/{state}/configs", json={"configs": {"cleanup.policy": "delete"}})
    assert_problem(r, 400, "POLICY_VIOLATION")
    assert _describe(http, state) == before


def test_internal_topic_over_websocket(shared_broker: BrokerProcess) -> None:
    url = shared_broker.url.replace("http://", "ws://", 1) + "/v1/ws"

    async def main() -> None:
        async with connect(url, open_timeout=5, close_timeout=2) as ws:
            produce_op = {"op": "produce", "id": "p", "topic": OFFSETS, "partition": 0}
            await ws.send(json.dumps({**produce_op, "records": [{"value": 1}]}))
            doc = json.loads(await asyncio.wait_for(ws.recv(), 5))
            assert doc["code"] == "INVALID_TOPIC_EXCEPTION", doc
        async with connect(url, open_timeout=5, close_timeout=2) as ws:
            sub = {"topic": OFFSETS, "partition": 0, "offset": 0}
            await ws.send(json.dumps({"op": "subscribe", "id": "s", "partitions": [sub]}))
            with pytest.raises(ConnectionClosed) as closed:
                await asyncio.wait_for(ws.recv(), 5)
            assert closed.value.rcvd is not None and closed.value.rcvd.code == 4400
            assert "internal" in closed.value.rcvd.reason

    asyncio.run(main())


def test_committed_offsets_survive_a_restart_after_refused_admin(tmp_path: Path) -> None:
    """The reproduction: growing the offsets topic moved commits to other partitions (committed
    90, read 10 after a restart); a delete policy with retention.ms=1 erased them."""
    broker = start_broker(tmp_path / "data")
    try:
        with make_client(broker) as http:
            topic = create_topic(http, "src")
            groups = [unique("g") for _ in range(8)]
            for g in groups:
                r = http.post(
                    f"/v1/groups/{g}/offsets",
                    json={"offsets": [{"topic": topic, "partition": 0, "offset": 10}]},
                )
                assert r.status_code == 200, r.text
            http.post(f"/v1/topics/{OFFSETS}/partitions", json={"count": 40})
            http.patch(
                f"/v1/topics/{OFFSETS}/configs",
                json={"configs": {"cleanup.policy": "delete", "retention.ms": 1}},
            )
            for g in groups:
                r = http.post(
                    f"/v1/groups/{g}/offsets",
                    json={"offsets": [{"topic": topic, "partition": 0, "offset": 90}]},
                )
                assert r.status_code == 200, r.text
        broker.restart()
        with make_client(broker) as http:
            for g in groups:
                offsets = http.get(f"/v1/groups/{g}/offsets").json()["offsets"]
                assert [o["offset"] for o in offsets] == [90], (g, offsets)
    finally:
        broker.stop()


# -- offsets?at= ---------------------------------------------------------------------------------


def test_offsets_at_kafka_sentinels(http: httpx.Client) -> None:
    """Kafka's ListOffsets: -1 is the latest offset, -2 the earliest (not timestamps)."""
    name = create_topic(http, "sentinel")
    produce(http, name, [{"value": i, "timestamp": 1000 + i} for i in range(5)])
    url = f"/v1/topics/{name}/partitions/0/offsets"
    latest = http.get(url, params={"at": "-1"}).json()
    earliest = http.get(url, params={"at": "-2"}).json()
    assert (latest["offset"], latest["at"]) == (5, "-1")
    assert (earliest["offset"], earliest["at"]) == (0, "-2")
    assert http.get(url, params={"at": "latest"}).json()["offset"] == 5
    for at in ("-3", "-1000"):
        assert_problem(http.get(url, params={"at": at}), 400, "INVALID_REQUEST")


# -- topic name collisions -----------------------------------------------------------------------


@pytest.mark.parametrize(("first", "second"), [("a.b", "a_b"), ("a_b", "a.b"), ("x.y_z", "x_y.z")])
def test_topic_names_colliding_on_dot_and_underscore(
    http: httpx.Client, first: str, second: str
) -> None:
    base = unique("col").replace("-", "")
    a, b = f"{base}{first}", f"{base}{second}"
    assert http.post("/v1/topics", json={"name": a}).status_code == 201
    body = assert_problem(http.post("/v1/topics", json={"name": b}), 400, "INVALID_TOPIC_EXCEPTION")
    assert a in body["detail"] and "collides" in body["detail"]
    assert http.get(f"/v1/topics/{b}").status_code == 404
    # Once the first is gone the name is free.
    assert http.delete(f"/v1/topics/{a}").status_code == 204
    assert http.post("/v1/topics", json={"name": b}).status_code == 201


def test_internal_topic_name_collides_too(http: httpx.Client) -> None:
    r = http.post("/v1/topics", json={"name": "__consumer.offsets"})
    assert_problem(r, 400, "INVALID_TOPIC_EXCEPTION")


def test_the_partition_caps_are_published_in_limits(tmp_path: Path) -> None:
    """Both partition caps are in GET /v1/cluster's limits, as the ones enforced."""
    b = start_broker(tmp_path / "data", env={"LOGBUS_MAX_BROKER_PARTITIONS": "123"})
    try:
        with make_client(b) as c:
            limits = c.get("/v1/cluster").json()["limits"]
    finally:
        b.stop()
    assert limits["max_broker_partitions"] == 123
    assert limits["max_partitions_per_topic"] == MAX_PARTITIONS_PER_TOPIC
