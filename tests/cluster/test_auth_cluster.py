"""Authentication on a 3-broker cluster: one bootstrap admin, replication and forwarding with
the cluster credential, revocation, ACL and quota changes on every broker within a second.

Propagation is bounded in polls of each broker's security watcher (``logbus_security_polls``
in /metrics, one every 250 ms on an idle broker): a change must be applied (the poll count
then is ``logbus_security_applied_poll``) within 2 polls of the count read once the change
was committed, and be in force from then on (a revoked key still cached would keep passing
for minutes). Two polls are half the issue's second on a machine that keeps time, and the
bound does not fail because a loaded machine runs the watcher late. Wall time is printed,
not asserted.
"""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest

from api.process import BrokerProcess
from cluster import replica_wire
from cluster.h2transport import H2Client
from cluster.metadata import MetadataStore
from tests.cluster.test_cluster_processes import CLUSTER_ENV, eventually

# A change is applied by the first poll that starts after its commit: the second poll after a
# count read once the change was committed, at the latest (2 x 250 ms, inside the second).
MAX_POLLS = 2


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[tuple[str, dict[int, BrokerProcess]]]:
    """Three brokers with --auth, started at the same time (they race to bootstrap)."""
    url = f"sqlite:///{tmp_path / 'shared.db'}"
    brokers = {
        i: BrokerProcess(
            tmp_path / f"broker-{i}",
            None,
            "--broker-id",
            str(i),
            "--metadata-url",
            url,
            "--auth",
            env=CLUSTER_ENV,
        )
        for i in (1, 2, 3)
    }
    try:
        with ThreadPoolExecutor(3) as pool:
            list(pool.map(lambda b: b.start(), brokers.values()))
        yield url, brokers
    finally:
        for b in brokers.values():
            b.kill()


def _h(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def _polls(base: str, admin: str, metric: str = "logbus_security_polls_total") -> int:
    text = httpx.get(f"{base}/metrics", headers=_h(admin), timeout=10).text
    m = re.search(rf"^{metric} (\S+)$", text, re.M)
    assert m is not None, text[:500]
    return int(float(m[1]))


def _in_force_within_polls(
    brokers: dict[int, BrokerProcess], admin: str, change: Any, probe: Any, what: str
) -> None:
    """Make ``change`` (on broker 1), read each broker's poll count once the change is
    committed, and probe every broker in turn until ``probe(url)`` holds on each: each must
    have applied the change within MAX_POLLS polls of that count (a poll under way at the
    commit may still read the old version: the next one cannot)."""
    started = time.monotonic()
    change()
    after_commit = {i: _polls(b.url, admin) for i, b in brokers.items()}
    seen: dict[int, int] = {}

    def round_() -> bool | None:
        for i, b in brokers.items():
            if i not in seen and probe(b.url):
                seen[i] = _polls(b.url, admin, "logbus_security_applied_poll") - after_commit[i]
                took = time.monotonic() - started
                print(f"{what}: broker {i} applied {seen[i]:+d} polls after, seen in {took:.2f} s")
        return len(seen) == len(brokers) or None

    eventually(round_, f"{what} on every broker")
    assert max(seen.values()) <= MAX_POLLS, (what, seen)


def test_auth_cluster(cluster: tuple[str, dict[int, BrokerProcess]]) -> None:
    url, brokers = cluster
    # Exactly one broker created the admin and printed its key, once.
    logs = [b.log_path.read_text() for b in brokers.values()]
    keys = [k for log in logs for k in re.findall(r"^\s+(lbk\.\S+)$", log, re.M)]
    assert len(keys) == 1, logs
    admin = keys[0]
    for b in brokers.values():
        assert httpx.get(f"{b.url}/v1/topics", timeout=10).status_code == 401
    users = httpx.get(f"{brokers[2].url}/v1/users", headers=_h(admin), timeout=10).json()
    assert [u["name"] for u in users["users"]] == ["admin"]
    keys_doc = httpx.get(f"{brokers[3].url}/v1/users/admin/keys", headers=_h(admin), timeout=10)
    assert len(keys_doc.json()["keys"]) == 1

    # Replication with auth on: an RF=3 topic's followers copy the records over h2c.
    r = httpx.post(
        f"{brokers[2].url}/v1/topics",  # forwarded to the controller with the principal
        json={"name": "orders", "replication_factor": 3},
        headers=_h(admin),
        timeout=30,
    )
    assert r.status_code == 201, r.text
    r = httpx.post(f"{brokers[1].url}/v1/users", json={"name": "alice"}, headers=_h(admin))
    alice = r.json()["key"]
    grant = [
        {"principal": "User:alice", "resource_type": "topic", "name": "orders", "operation": op}
        for op in ("read", "write")
    ]
    assert httpx.post(f"{brokers[1].url}/v1/acls", json=grant, headers=_h(admin)).status_code == 201
    values = [f"v{i}" for i in range(20)]

    def produce() -> bool | None:
        for b in brokers.values():  # any broker: the produce is forwarded to the leader
            r = httpx.post(
                f"{b.url}/v1/topics/orders/records",
                params={"acks": "all"},
                json={"records": [{"value": v} for v in values]},
                headers=_h(alice),
                timeout=30,
            )
            if r.status_code != 200:
                return None
        return True

    eventually(produce, "alice's produce through every broker")
    for i, b in brokers.items():

        def copied(b: BrokerProcess = b) -> bool | None:
            r = httpx.get(f"{b.url}/v1/topics/orders/partitions", headers=_h(admin), timeout=10)
            local = r.json()[0]["local_replica"] or {}
            return local.get("log_end_offset", 0) >= 3 * len(values) or None

        eventually(copied, f"broker {i}'s replica of orders")

    # A user's credential opens nothing on the replication listener.
    store = MetadataStore(url)
    try:
        peers = {m.broker_id: m for m in store.brokers()}
    finally:
        store.close()
    assert _replica_fetch_status(peers[1].host, peers[1].replication_port, alice) == 401

    # Admin calls are forwarded to the controller with alice's principal, and judged on it.
    for b in brokers.values():
        r = httpx.post(f"{b.url}/v1/topics", json={"name": "nope"}, headers=_h(alice), timeout=30)
        assert r.status_code == 403 and r.json()["code"] == "TOPIC_AUTHORIZATION_FAILED"

    def fetch_status(base: str, key: str) -> int:
        r = httpx.get(
            f"{base}/v1/topics/orders/partitions/0/records",
            params={"offset": 0},
            headers=_h(key),
            timeout=10,
        )
        return r.status_code

    assert all(fetch_status(b.url, alice) == 200 for b in brokers.values())

    # An ACL change is in force on every broker within MAX_POLLS.
    def remove_read() -> None:
        r = httpx.delete(
            f"{brokers[1].url}/v1/acls",
            params={"principal": "User:alice", "operation": "read"},
            headers=_h(admin),
        )
        assert r.status_code == 200 and len(r.json()["removed"]) == 1

    _in_force_within_polls(
        brokers, admin, remove_read, lambda u: fetch_status(u, alice) == 403, "ACL removal"
    )

    # A quota set through one broker is in force on every broker within MAX_POLLS (each
    # answer to a client under a quota names it in RateLimit-Policy), and so is its removal.
    def produce_answer(base: str) -> httpx.Response:
        r = httpx.post(
            f"{base}/v1/topics/orders/records",
            json={"records": [{"value": "q"}]},
            headers={**_h(admin), "Logbus-Client-Id": "quota-probe"},
            timeout=30,
        )
        assert r.status_code == 200, r.text
        return r

    assert all("ratelimit-policy" not in produce_answer(b.url).headers for b in brokers.values())
    quota = {"entity": {"client_id": "quota-probe"}, "quotas": {"producer_byte_rate": 10}}

    def set_quota() -> None:
        r = httpx.put(f"{brokers[3].url}/v1/quotas", json=quota, headers=_h(admin), timeout=30)
        assert r.status_code == 200, r.text

    def limited(base: str) -> bool:
        policy = produce_answer(base).headers.get("ratelimit-policy", "")
        return '"producer_byte_rate";q=100;' in policy  # 10 B/s per 10 s

    _in_force_within_polls(brokers, admin, set_quota, limited, "quota set")

    def delete_quota() -> None:
        r = httpx.delete(
            f"{brokers[2].url}/v1/quotas", params={"client_id": "quota-probe"}, headers=_h(admin)
        )
        assert r.status_code == 204, r.text

    def unlimited(base: str) -> bool:
        return "ratelimit-policy" not in produce_answer(base).headers

    _in_force_within_polls(brokers, admin, delete_quota, unlimited, "quota removal")

    # A revoked key is refused on every broker within MAX_POLLS.
    key_id = alice.split(".")[1]

    def revoke() -> None:
        r = httpx.delete(f"{brokers[1].url}/v1/users/alice/keys/{key_id}", headers=_h(admin))
        assert r.status_code == 204

    _in_force_within_polls(
        brokers, admin, revoke, lambda u: fetch_status(u, alice) == 401, "key revocation"
    )


def _replica_fetch_status(host: str, port: int, key: str) -> int:
    async def ask() -> int:
        client = H2Client(host, port)
        try:
            r = await client.request(
                "POST",
                replica_wire.PATH,
                headers=[("authorization", f"Bearer {key}")],
                body=b"\x00\x00\x00\x02{}",
                timeout_s=10,
            )
            return r.status
        finally:
            await client.close()

    return asyncio.run(ask())
