"""Topics, configs, partitions and offset lookups over HTTP against a real broker."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from tests.api.conftest import make_client
from tests.api.helpers import (
    BATCH,
    assert_problem,
    create_topic,
    end_offsets,
    fetch,
    fetch_all,
    kafka_batch,
    kafka_partition,
    produce,
    unique,
)
from tests.server import BrokerProcess

PARTITION_FIELDS = {
    "partition",
    "leader",
    "leader_epoch",
    "replicas",
    "isr",
    "log_start_offset",
    "high_watermark",
    "log_end_offset",
    "last_stable_offset",
    "local_replica",
    "unclean_elections",
    "adding_replicas",
    "removing_replicas",
}


# -- create --------------------------------------------------------------------------------------


def test_create_returns_201_location_and_topic(http: httpx.Client) -> None:
    name = unique("create")
    r = http.post(
        "/v1/topics",
        json={"name": name, "partitions": 3, "configs": {"retention.ms": 86400000}},
    )
    assert r.status_code == 201, r.text
    assert r.headers["location"] == f"/v1/topics/{name}"
    assert r.headers["content-type"].startswith("application/json")
    body = r.json()
    assert body["name"] == name
    assert body["partitions"] == 3
    assert body["replication_factor"] == 1
    assert body["configs"] == {"retention.ms": 86400000}
    assert isinstance(body["topic_id"], str) and body["topic_id"]
    assert isinstance(body["created_ms"], int) and body["created_ms"] > 1_600_000_000_000
    # The Location header points at the topic.
    got = http.get(r.headers["location"])
    assert got.status_code == 200
    assert got.json()["topic_id"] == body["topic_id"]


def test_create_defaults_to_one_partition_and_no_overrides(http: httpx.Client) -> None:
    name = unique("defaults")
    r = http.post("/v1/topics", json={"name": name})
    assert r.status_code == 201, r.text
    assert r.json()["partitions"] == 1
    assert r.json()["configs"] == {}
    assert end_offsets(http, name) == [0]


def test_create_accepts_configs_as_strings_like_kafka_tools(http: httpx.Client) -> None:
    name = unique("strcfg")
    r = http.post(
        "/v1/topics",
        json={
            "name": name,
            "configs": {
                "retention.ms": "3600000",
                "cleanup.policy": "compact",
                "unclean.leader.election.enable": "true",
            },
        },
    )
    assert r.status_code == 201, r.text
    configs = http.get(f"/v1/topics/{name}/configs").json()["configs"]
    assert configs["retention.ms"] == 3600000
    assert configs["cleanup.policy"] == "compact"
    assert configs["unclean.leader.election.enable"] is True


@pytest.mark.parametrize(
    "configs",
    [
        {"no.such.config": 1},
        {"retention.ms": "abc"},
        {"retention.ms": -2},
        {"retention.ms": 1.5},
        {"retention.ms": True},
        {"max.message.bytes": -1},
        {"segment.bytes": 1},
        {"cleanup.policy": "bogus"},
        {"compression.type": "brotli"},
        {"min.cleanable.dirty.ratio": 2.0},
        {"unclean.leader.election.enable": "maybe"},
    ],
    ids=lambda c: "-".join(f"{k}={v}" for k, v in c.items()),
)
def test_create_rejects_invalid_configs(http: httpx.Client, configs: dict[str, Any]) -> None:
    name = unique("badcfg")
    r = http.post("/v1/topics", json={"name": name, "configs": configs})
    body = assert_problem(r, 400, "INVALID_CONFIG")
    assert body["config"] == next(iter(configs))
    assert_problem(http.get(f"/v1/topics/{name}"), 404, "UNKNOWN_TOPIC_OR_PARTITION")


def test_create_rejects_replication_factor_above_one(http: httpx.Client) -> None:
    name = unique("rf")
    r = http.post("/v1/topics", json={"name": name, "replication_factor": 2})
    assert_problem(r, 400, "INVALID_REPLICATION_FACTOR")
    assert_problem(http.get(f"/v1/topics/{name}"), 404, "UNKNOWN_TOPIC_OR_PARTITION")


@pytest.mark.parametrize("partitions", [0, -1, 10_001, "many", None, 1.5])
def test_create_rejects_bad_partition_counts(http: httpx.Client, partitions: object) -> None:
    name = unique("parts")
    r = http.post("/v1/topics", json={"name": name, "partitions": partitions})
    assert_problem(r, 400, "INVALID_REQUEST")
    assert_problem(http.get(f"/v1/topics/{name}"), 404, "UNKNOWN_TOPIC_OR_PARTITION")


def test_create_duplicate_is_409_and_leaves_the_topic_alone(http: httpx.Client) -> None:
    name = create_topic(http, "dup", partitions=2)
    produce(http, name, [{"value": 1}], partition=0)
    before = http.get(f"/v1/topics/{name}").json()
    r = http.post("/v1/topics", json={"name": name, "partitions": 5})
    assert_problem(r, 409, "TOPIC_ALREADY_EXISTS")
    after = http.get(f"/v1/topics/{name}").json()
    assert after == before
    assert end_offsets(http, name) == [1, 0]


INVALID_NAMES = {
    "dot": ".",
    "dotdot": "..",
    "empty": "",
    "space": "a b",
    "250chars": "x" * 250,
    "umlaut": "ü",
    "slash": "a/b",
    "backslash": "a\\b",
    "colon": "a:b",
    "star": "a*",
    "tab": "tab\t",
    "nul": "nul\x00",
}


@pytest.mark.parametrize("name", list(INVALID_NAMES.values()), ids=list(INVALID_NAMES))
def test_create_rejects_invalid_names(http: httpx.Client, name: str) -> None:
    r = http.post("/v1/topics", json={"name": name})
    assert_problem(r, 400, "INVALID_TOPIC_EXCEPTION")
    listed = {t["name"] for t in http.get("/v1/topics").json()["topics"]}
    assert name not in listed


@pytest.mark.parametrize("body", [{"name": 12}, {"name": None}, {}, {"name": "x", "extra": 1}])
def test_create_rejects_wrong_body_shapes(http: httpx.Client, body: dict[str, Any]) -> None:
    assert_problem(http.post("/v1/topics", json=body), 400, "INVALID_REQUEST")


def test_create_rejects_malformed_json(http: httpx.Client) -> None:
    r = http.post("/v1/topics", content=b'{"name": ', headers={"content-type": "application/json"})
    assert_problem(r, 400, "INVALID_REQUEST")


def _longest_name(tag: str) -> str:
    return ("n" + unique(tag).replace("-", "."))[:20].ljust(249, "z")


def test_longest_legal_name_works_end_to_end(http: httpx.Client) -> None:
    # 249 characters is Kafka's limit: the partition directory "<name>-<p>" still fits in 255.
    name = _longest_name("long")
    r = http.post("/v1/topics", json={"name": name, "partitions": 2})
    assert r.status_code == 201, r.text
    offsets = produce(http, name, [{"value": "edge"}], partition=1)
    assert offsets == [{"partition": 1, "offset": 0}]
    assert [x["value"] for x in fetch_all(http, name, 1)] == ["edge"]
    assert http.get(f"/v1/topics/{name}/partitions/1/offsets").json()["offset"] == 1


def test_delete_topic_with_longest_legal_name(shared_broker: BrokerProcess) -> None:
    name = _longest_name("longdel")
    # Its own connection: uvicorn closes the connection after an unhandled 500.
    with make_client(shared_broker) as c:
        assert c.post("/v1/topics", json={"name": name, "partitions": 2}).status_code == 201
        produce(c, name, [{"value": "old"}], partition=0)
        r = c.delete(f"/v1/topics/{name}")
    with make_client(shared_broker) as c:
        assert r.status_code == 204, r.text
        assert_problem(c.get(f"/v1/topics/{name}"), 404, "UNKNOWN_TOPIC_OR_PARTITION")
        assert c.post("/v1/topics", json={"name": name, "partitions": 2}).status_code == 201
        assert end_offsets(c, name) == [0, 0]


# -- list, describe, delete ----------------------------------------------------------------------


def test_list_and_describe(http: httpx.Client) -> None:
    a = create_topic(http, "list-a", partitions=1)
    b = create_topic(http, "list-b", partitions=3, configs={"segment.ms": 3600000})
    r = http.get("/v1/topics")
    assert r.status_code == 200
    topics = {t["name"]: t for t in r.json()["topics"]}
    assert {a, b} <= set(topics)
    names = [t["name"] for t in r.json()["topics"]]
    assert names == sorted(names)
    assert topics[b]["partitions"] == 3
    assert topics[b]["configs"] == {"segment.ms": 3600000}

    produce(http, b, [{"value": i} for i in range(4)], partition=2)
    d = http.get(f"/v1/topics/{b}")
    assert d.status_code == 200
    detail = d.json()
    assert detail["name"] == b and detail["partitions"] == 3
    assert detail["topic_id"] == topics[b]["topic_id"]
    parts = detail["partition_details"]
    assert [p["partition"] for p in parts] == [0, 1, 2]
    for p in parts:
        assert set(p) == PARTITION_FIELDS
        assert p["leader"] == 1 and p["replicas"] == [1] and p["isr"] == [1]
        assert p["leader_epoch"] == 0
        assert p["log_start_offset"] == 0
        # One broker: its own replica is the leader's.
        mine = {k: p[k] for k in ("log_start_offset", "high_watermark", "log_end_offset")}
        assert p["local_replica"] == {"broker_id": 1, **mine}
    assert [(p["high_watermark"], p["log_end_offset"]) for p in parts] == [(0, 0), (0, 0), (4, 4)]


def test_describe_unknown_topic_is_404(http: httpx.Client) -> None:
    body = assert_problem(http.get("/v1/topics/no-such-topic"), 404, "UNKNOWN_TOPIC_OR_PARTITION")
    assert body["retriable"] is True


def test_delete_then_404_everywhere_and_recreate_starts_empty(http: httpx.Client) -> None:
    name = create_topic(http, "del", partitions=2)
    produce(http, name, [{"value": "old"}] * 3, partition=0)
    r = http.delete(f"/v1/topics/{name}")
    assert r.status_code == 204
    assert r.content == b""
    assert_problem(http.get(f"/v1/topics/{name}"), 404, "UNKNOWN_TOPIC_OR_PARTITION")
    assert_problem(http.get(f"/v1/topics/{name}/configs"), 404, "UNKNOWN_TOPIC_OR_PARTITION")
    assert_problem(http.get(f"/v1/topics/{name}/partitions"), 404, "UNKNOWN_TOPIC_OR_PARTITION")
    assert_problem(fetch(http, name, 0, 0), 404, "UNKNOWN_TOPIC_OR_PARTITION")
    r = http.post(f"/v1/topics/{name}/records", json={"records": [{"value": 1}]})
    assert_problem(r, 404, "UNKNOWN_TOPIC_OR_PARTITION")
    assert name not in {t["name"] for t in http.get("/v1/topics").json()["topics"]}
    assert_problem(http.delete(f"/v1/topics/{name}"), 404, "UNKNOWN_TOPIC_OR_PARTITION")

    # Same name again: a new topic with a new id and none of the old data.
    r = http.post("/v1/topics", json={"name": name, "partitions": 1})
    assert r.status_code == 201, r.text
    assert end_offsets(http, name) == [0]
    assert produce(http, name, [{"value": "new"}]) == [{"partition": 0, "offset": 0}]
    assert [x["value"] for x in fetch_all(http, name, 0)] == ["new"]


# -- configs -------------------------------------------------------------------------------------


def test_get_configs_lists_every_effective_value_and_the_overrides(http: httpx.Client) -> None:
    name = create_topic(http, "cfg", configs={"retention.ms": 86400000})
    r = http.get(f"/v1/topics/{name}/configs")
    assert r.status_code == 200
    body = r.json()
    assert body["topic"] == name
    assert body["overrides"] == {"retention.ms": 86400000}
    configs = body["configs"]
    assert configs["retention.ms"] == 86400000
    assert configs["max.message.bytes"] == 1048588  # Kafka's default
    assert configs["cleanup.policy"] == "delete"
    for key in ("segment.bytes", "segment.ms", "retention.bytes", "compression.type", "flush.ms"):
        assert key in configs


def test_patch_configs_applies_at_runtime_and_null_resets(http: httpx.Client) -> None:
    name = create_topic(http, "patch", partitions=1)
    big = {"value": "x" * 2000}
    produce(http, name, [big])  # fine with the default limit

    r = http.patch(f"/v1/topics/{name}/configs", json={"configs": {"max.message.bytes": 500}})
    assert r.status_code == 200, r.text
    assert r.json()["configs"]["max.message.bytes"] == 500
    assert r.json()["overrides"] == {"max.message.bytes": 500}
    assert http.get(f"/v1/topics/{name}/configs").json()["configs"]["max.message.bytes"] == 500

    before = end_offsets(http, name)
    r = http.post(f"/v1/topics/{name}/records", json={"records": [big]})
    body = assert_problem(r, 413, "MESSAGE_TOO_LARGE")
    assert body["max_message_bytes"] == 500
    binary = kafka_batch([b"y" * 2000])
    r = http.post(
        f"/v1/topics/{name}/partitions/0/records", content=binary, headers={"content-type": BATCH}
    )
    assert_problem(r, 413, "MESSAGE_TOO_LARGE")
    assert end_offsets(http, name) == before
    produce(http, name, [{"value": "small"}])  # small records still go through

    r = http.patch(f"/v1/topics/{name}/configs", json={"configs": {"max.message.bytes": None}})
    assert r.status_code == 200, r.text
    assert r.json()["overrides"] == {}
    assert r.json()["configs"]["max.message.bytes"] == 1048588
    produce(http, name, [big])
    assert [x["value"] for x in fetch_all(http, name, 0)] == [big["value"], "small", big["value"]]


def test_patch_merges_with_existing_overrides(http: httpx.Client) -> None:
    name = create_topic(http, "merge", configs={"retention.ms": 1000, "segment.ms": 60000})
    r = http.patch(f"/v1/topics/{name}/configs", json={"configs": {"retention.ms": 2000}})
    assert r.status_code == 200, r.text
    assert r.json()["overrides"] == {"retention.ms": 2000, "segment.ms": 60000}
    r = http.patch(f"/v1/topics/{name}/configs", json={"configs": {"segment.ms": None}})
    assert r.json()["overrides"] == {"retention.ms": 2000}
    assert http.get(f"/v1/topics/{name}").json()["configs"] == {"retention.ms": 2000}


@pytest.mark.parametrize(
    "configs",
    [{"bogus": 1}, {"retention.ms": "soon"}, {"retention.ms": 5, "bogus": 1}],
    ids=["unknown", "bad-value", "one-bad-of-two"],
)
def test_patch_rejects_invalid_configs_atomically(
    http: httpx.Client, configs: dict[str, Any]
) -> None:
    name = create_topic(http, "patchbad", configs={"retention.ms": 1000})
    r = http.patch(f"/v1/topics/{name}/configs", json={"configs": configs})
    assert_problem(r, 400, "INVALID_CONFIG")
    assert http.get(f"/v1/topics/{name}/configs").json()["overrides"] == {"retention.ms": 1000}


def test_patch_rejects_unknown_key_even_when_resetting(http: httpx.Client) -> None:
    name = create_topic(http, "resetbad")
    r = http.patch(f"/v1/topics/{name}/configs", json={"configs": {"no.such.config": None}})
    assert_problem(r, 400, "INVALID_CONFIG")


def test_patch_wrong_shapes_and_unknown_topic(http: httpx.Client) -> None:
    name = create_topic(http, "patchshape")
    for body in ({}, {"configs": []}, {"configs": {"retention.ms": [1]}}, {"configs": {}, "x": 1}):
        r = http.patch(f"/v1/topics/{name}/configs", json=body)
        assert_problem(r, 400, "INVALID_REQUEST")
    r = http.patch("/v1/topics/no-such-topic/configs", json={"configs": {"retention.ms": 1}})
    assert_problem(r, 404, "UNKNOWN_TOPIC_OR_PARTITION")


# -- partitions ----------------------------------------------------------------------------------


def test_get_partitions_fields(http: httpx.Client) -> None:
    name = create_topic(http, "pfields", partitions=2)
    produce(http, name, [{"value": 1}, {"value": 2}], partition=1)
    r = http.get(f"/v1/topics/{name}/partitions")
    assert r.status_code == 200
    parts = r.json()
    assert [p["partition"] for p in parts] == [0, 1]
    for p in parts:
        assert set(p) == PARTITION_FIELDS
        assert p["leader"] == 1 and p["isr"] == [1] and p["replicas"] == [1]
    assert parts[1]["log_start_offset"] == 0
    assert parts[1]["high_watermark"] == 2
    assert parts[1]["log_end_offset"] == 2


def test_increase_partitions_new_ones_take_records(http: httpx.Client) -> None:
    name = create_topic(http, "grow", partitions=2)
    produce(http, name, [{"value": "p0"}], partition=0)
    r = http.post(f"/v1/topics/{name}/partitions", json={"count": 5})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["partitions"] == 5
    assert [p["partition"] for p in body["partition_details"]] == [0, 1, 2, 3, 4]
    assert http.get(f"/v1/topics/{name}").json()["partitions"] == 5
    assert end_offsets(http, name) == [1, 0, 0, 0, 0]

    for p in (2, 3, 4):
        assert produce(http, name, [{"value": f"p{p}"}], partition=p) == [
            {"partition": p, "offset": 0}
        ]
        assert [x["value"] for x in fetch_all(http, name, p)] == [f"p{p}"]
    # Keys are hashed over the new partition count.
    keys = [f"key-{i}" for i in range(40)]
    offsets = produce(http, name, [{"key": k, "value": k} for k in keys])
    assert [o["partition"] for o in offsets] == [kafka_partition(k.encode(), 5) for k in keys]
    assert fetch(http, name, 4, 0).status_code == 200
    assert_problem(fetch(http, name, 5, 0), 404, "UNKNOWN_TOPIC_OR_PARTITION")


@pytest.mark.parametrize("count", [1, 3])
def test_partitions_cannot_shrink_or_stay(http: httpx.Client, count: int) -> None:
    name = create_topic(http, "shrink", partitions=3)
    r = http.post(f"/v1/topics/{name}/partitions", json={"count": count})
    assert_problem(r, 400, "INVALID_PARTITIONS")
    assert http.get(f"/v1/topics/{name}").json()["partitions"] == 3


def test_partitions_increase_bad_requests(http: httpx.Client) -> None:
    name = create_topic(http, "growbad")
    for body in ({"count": 0}, {"count": 10_001}, {}, {"count": "6x"}):
        assert_problem(
            http.post(f"/v1/topics/{name}/partitions", json=body), 400, "INVALID_REQUEST"
        )
    r = http.post("/v1/topics/no-such-topic/partitions", json={"count": 4})
    assert_problem(r, 404, "UNKNOWN_TOPIC_OR_PARTITION")


# -- offsets -------------------------------------------------------------------------------------


def _offset(http: httpx.Client, topic: str, at: object, partition: int = 0) -> int | None:
    r = http.get(f"/v1/topics/{topic}/partitions/{partition}/offsets", params={"at": at})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["topic"] == topic and body["partition"] == partition and body["at"] == str(at)
    offset: int | None = body["offset"]
    return offset


def test_offsets_of_an_empty_partition(http: httpx.Client) -> None:
    name = create_topic(http, "offempty")
    assert _offset(http, name, "earliest") == 0
    assert _offset(http, name, "latest") == 0
    assert _offset(http, name, 1_700_000_000_000) is None


def test_offsets_earliest_latest_and_by_timestamp(http: httpx.Client) -> None:
    name = create_topic(http, "offts")
    # Timestamps are not monotonic: the lookup answers the FIRST offset with timestamp >= t.
    batches = [[1000, 3000, 2000], [1500], [5000, 4000]]
    for tss in batches:
        produce(http, name, [{"value": t, "timestamp": t} for t in tss])
    # offsets: 0:1000 1:3000 2:2000 3:1500 4:5000 5:4000
    assert _offset(http, name, "earliest") == 0
    assert _offset(http, name, "latest") == 6
    r = http.get(f"/v1/topics/{name}/partitions/0/offsets")
    assert r.json()["offset"] == 6 and r.json()["at"] == "latest"
    expected = {0: 0, 1000: 0, 1001: 1, 1500: 1, 2000: 1, 3000: 1, 3001: 4, 4000: 4, 5000: 4}
    for ts, offset in expected.items():
        assert _offset(http, name, ts) == offset, ts
    assert _offset(http, name, 5001) is None  # after the last record
    # The answer agrees with the timestamps the fetch reports.
    records = fetch_all(http, name, 0)
    for ts in expected:
        first = next((r["offset"] for r in records if r["timestamp"] >= ts), None)
        assert _offset(http, name, ts) == first


@pytest.mark.parametrize("at", ["yesterday", "1.5", "", "earliest "])
def test_offsets_bad_at_is_400(http: httpx.Client, at: str) -> None:
    name = create_topic(http, "offbad")
    r = http.get(f"/v1/topics/{name}/partitions/0/offsets", params={"at": at})
    assert_problem(r, 400, "INVALID_REQUEST")


def test_offsets_unknown_partition_or_topic_is_404(http: httpx.Client) -> None:
    name = create_topic(http, "off404", partitions=2)
    r = http.get(f"/v1/topics/{name}/partitions/2/offsets", params={"at": "earliest"})
    assert_problem(r, 404, "UNKNOWN_TOPIC_OR_PARTITION")
    r = http.get("/v1/topics/no-such-topic/partitions/0/offsets", params={"at": "earliest"})
    assert_problem(r, 404, "UNKNOWN_TOPIC_OR_PARTITION")


# -- replica reassignment (a single broker: the only list is its own id) --------------------------


def test_a_single_broker_accepts_its_own_id_and_refuses_others(http: httpx.Client) -> None:
    name = create_topic(http, "reassign1")
    path = f"/v1/topics/{name}/partitions/0/replicas"
    same = http.put(path, json={"replicas": [1]})
    assert same.status_code == 200, same.text
    assert same.json()["replicas"] == [1] and not same.json()["in_progress"]
    bad = assert_problem(
        http.put(path, json={"replicas": [1, 2]}), 400, "INVALID_REPLICA_ASSIGNMENT"
    )
    assert "unknown broker id(s) [2]" in bad["detail"]
    assert_problem(http.put(path, json={"replicas": []}), 400, "INVALID_REPLICA_ASSIGNMENT")
    assert_problem(http.put(path, json={"replicas": [1, 1]}), 400, "INVALID_REPLICA_ASSIGNMENT")
    assert_problem(http.put(path, json={"replicas": [True]}), 400, "INVALID_REQUEST")
    assert_problem(http.put(path, json={"replicas": list(range(65))}), 400, "INVALID_REQUEST")
    assert_problem(http.delete(path), 409, "NO_REASSIGNMENT_IN_PROGRESS")
    gone = f"/v1/topics/{name}/partitions/1/replicas"
    assert_problem(http.put(gone, json={"replicas": [1]}), 404, "UNKNOWN_TOPIC_OR_PARTITION")
    assert_problem(
        http.put("/v1/topics/no-such-topic/partitions/0/replicas", json={"replicas": [1]}),
        404,
        "UNKNOWN_TOPIC_OR_PARTITION",
    )
    [listed] = http.get(f"/v1/topics/{name}/partitions").json()
    assert (listed["adding_replicas"], listed["removing_replicas"]) == ([], [])
