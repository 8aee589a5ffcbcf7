"""Coordinator failover with three broker processes: SIGKILL the broker coordinating a group of
two members; the new leader of the group's ``__consumer_offsets`` partition loads it and the
members carry on with their member ids, generations and assignments, after one retriable
episode each (their calls in the meantime answer 421/503 or fail to connect, never 404/409);
offsets committed before and after the kill are kept."""

from __future__ import annotations

import time
import zlib
from typing import Any

import httpx

from tests.cluster.test_cluster_processes import _row, cluster, eventually, post_until_acknowledged
from tests.server import BrokerProcess

__all__ = ["cluster"]  # the fixture, imported for this module's tests
GROUP = "clicks-readers"
TOPIC = "clicks"
PARTITIONS = 4
RETRY_S = 0.1
RETRIABLE_STATUS = (421, 503)


class Consumer:
    """A member's client as a Kafka consumer behaves: it talks to the coordinator directly
    (``Logbus-Route: direct``), follows a 421's ``coordinator_url``, and retries retriable
    answers and connection failures (another broker) with a short backoff. Every call that did
    not succeed at once is one *episode*; every failed attempt is recorded."""

    def __init__(self, urls: list[str]) -> None:
        self.urls = list(urls)
        self.base = urls[0]
        self.member_id = ""
        self.generation = -1
        self.attempts: list[str] = []  # what each failed attempt saw
        self.episodes = 0

    def call(self, method: str, path: str, **kw: Any) -> httpx.Response:
        deadline = time.monotonic() + 60
        failed = False
        while True:
            try:
                r = httpx.request(
                    method,
                    self.base + path,
                    headers={"Logbus-Route": "direct"},
                    timeout=15,
                    **kw,
                )
            except httpx.TransportError as e:
                self.attempts.append(f"{type(e).__name__} at {self.base}")
                self.base = self._next()
            else:
                if r.status_code not in RETRIABLE_STATUS:
                    self.episodes += failed
                    return r
                doc = r.json()
                assert doc["retriable"], doc
                self.attempts.append(doc["code"])
                url = doc.get("coordinator_url")
                if url in self.urls:
                    self.base = url
                else:
                    self.base = self._next()
            failed = True
            assert time.monotonic() < deadline, self.attempts[-20:]
            time.sleep(RETRY_S)

    def _next(self) -> str:
        """The broker after the current one (the first, if the current one is gone)."""
        if self.base not in self.urls:
            return self.urls[0]
        return self.urls[(self.urls.index(self.base) + 1) % len(self.urls)]

    def join(self) -> dict[str, Any]:
        r = self.call(
            "POST",
            f"/v1/groups/{GROUP}/members",
            json={
                "topics": [TOPIC],
                "session_timeout_ms": 30_000,
                "rebalance_timeout_ms": 30_000,
                "auto_offset_reset": "earliest",
            },
        )
        assert r.status_code == 201, r.text
        doc: dict[str, Any] = r.json()
        self.member_id, self.generation = doc["member_id"], doc["generation"]
        return doc

    def heartbeat(self) -> dict[str, Any]:
        r = self.call("POST", f"/v1/groups/{GROUP}/members/{self.member_id}/heartbeat")
        assert r.status_code == 200, r.text
        doc: dict[str, Any] = r.json()
        self.generation = doc["generation"]
        return doc

    def poll(self) -> dict[str, Any]:
        r = self.call(
            "GET",
            f"/v1/groups/{GROUP}/members/{self.member_id}/records",
            params={"wait_ms": 0, "max_records": 1000},
        )
        assert r.status_code == 200, r.text
        doc: dict[str, Any] = r.json()
        return doc

    def commit(self, offsets: dict[tuple[str, int], int]) -> None:
        body = {
            "member_id": self.member_id,
            "generation": self.generation,
            "offsets": [{"topic": t, "partition": p, "offset": o} for (t, p), o in offsets.items()],
        }
        r = self.call("POST", f"/v1/groups/{GROUP}/offsets", json=body)
        assert r.status_code == 200, r.text


def owned(doc: dict[str, Any]) -> set[tuple[str, int]]:
    return {(x["topic"], x["partition"]) for x in doc["assignment"] + doc["revoking"]}


def produce(urls: list[str], per_partition: int, start: int) -> None:
    """Through any broker (forwarded to each partition's leader), retried until a leader takes
    it: after a kill, the partitions it led need a new leader first."""
    for p in range(PARTITIONS):
        values = [{"value": f"p{p}-{start + i}"} for i in range(per_partition)]
        post_until_acknowledged(
            urls,
            f"/v1/topics/{TOPIC}/partitions/{p}/records",
            f"a produce to {TOPIC}[{p}]",
            json={"records": values},
        )


def read_all(consumer: Consumer, want: int) -> dict[tuple[str, int], list[str]]:
    got: dict[tuple[str, int], list[str]] = {}

    def more() -> bool | None:
        for r in consumer.poll()["records"]:
            got.setdefault((r["topic"], r["partition"]), []).append(r["value"])
        return True if sum(map(len, got.values())) >= want else None

    eventually(more, "the member's records")
    return got


def test_members_keep_ids_and_assignments_when_their_coordinator_is_killed(
    cluster: tuple[str, dict[int, BrokerProcess]],
) -> None:
    url, brokers = cluster
    urls = [b.url for b in brokers.values()]
    r = httpx.post(
        f"{urls[0]}/v1/topics",
        json={"name": TOPIC, "partitions": PARTITIONS, "replication_factor": 2},
        timeout=15,
    )
    assert r.status_code == 201, r.text
    produce(urls, 10, 0)

    a, b = Consumer(urls), Consumer(urls[1:] + urls[:1])
    a.join()
    b.join()
    for _ in range(20):  # reconcile: revocations acknowledged, partitions handed over
        va, vb = a.heartbeat(), b.heartbeat()
        if len(owned(va)) == len(owned(vb)) == 2 and not va["revoking"] + vb["revoking"]:
            break
    before = {a.member_id: owned(va), b.member_id: owned(vb)}
    assert sorted(map(len, before.values())) == [2, 2] and not owned(va) & owned(vb)

    # The group's offsets partition has three replicas: all brokers were up at its creation.
    p = zlib.crc32(GROUP.encode()) % 4
    row = _row(url, "__consumer_offsets", p)
    assert len(row.replicas) == 3, row

    # Each member reads its 20 records and commits half of each partition.
    for c, mine in ((a, before[a.member_id]), (b, before[b.member_id])):
        got = read_all(c, 20)
        assert set(got) == mine and all(len(v) == 10 for v in got.values())
        c.commit({tp: 5 for tp in mine})

    coordinator = row.leader
    brokers[coordinator].kill()
    survivors = [b.url for i, b in brokers.items() if i != coordinator]
    for c in (a, b):
        c.urls = survivors  # its base may still be the dead one: the first call finds out
        c.attempts.clear()
        c.episodes = 0
    new = eventually(
        lambda: (lambda r: r if r.leader not in (coordinator, -1) else None)(
            _row(url, "__consumer_offsets", p)
        ),
        "a new leader of the group's offsets partition",
    )
    assert new.leader != coordinator
    produce(survivors, 3, 10)

    for c in (a, b):
        doc = c.heartbeat()
        assert owned(doc) == before[c.member_id] and not doc["revoking"], doc
        assert doc["member_id"] == c.member_id
        # Positions are not persisted: a member reads on from its committed offsets.
        got = read_all(c, 2 * (5 + 3))
        for tp in before[c.member_id]:
            assert got[tp][0] == f"p{tp[1]}-5" and len(got[tp]) == 8, got
        c.commit({tp: 13 for tp in before[c.member_id]})
        assert c.episodes == 1, c.attempts  # its coordinator died under it: one episode
        assert all(
            x in ("NOT_COORDINATOR", "COORDINATOR_LOAD_IN_PROGRESS") or "Error" in x
            for x in c.attempts
        ), c.attempts

    r = httpx.get(f"{a.base}/v1/groups/{GROUP}/offsets", timeout=15)
    assert r.status_code == 200, r.text
    committed = {(o["topic"], o["partition"]): o["offset"] for o in r.json()["offsets"]}
    assert committed == {(TOPIC, q): 13 for q in range(PARTITIONS)}
