"""Partition reassignment on three real broker processes: a partition moves to another broker
while acks=all writes go on, a reassignment is cancelled, a broker is drained with the CLI, and
bad targets are refused through any broker."""

from __future__ import annotations

import os
import signal
import threading
from pathlib import Path
from typing import Any

import httpx
import pytest

from cluster.metadata import MetadataStore, PartitionMeta
from tests.pause import pause

from .test_cluster_processes import brokers_on_one_store, eventually, knows_topic

TOPIC = "moving"


def _create(base: str, replication_factor: int) -> None:
    r = httpx.post(
        f"{base}/v1/topics",
        json={
            "name": TOPIC,
            "partitions": 1,
            "replication_factor": replication_factor,
            "configs": {"min.insync.replicas": str(replication_factor)},
        },
        timeout=30,
    )
    assert r.status_code == 201, r.text


def _row(url: str) -> PartitionMeta:
    store = MetadataStore(url)
    try:
        return store.topic(TOPIC).assignments[0]
    finally:
        store.close()


def _row_of(url: str, topic: str) -> PartitionMeta:
    store = MetadataStore(url)
    try:
        return store.topic(topic).assignments[0]
    finally:
        store.close()


def _partition(base: str) -> dict[str, Any]:
    r = httpx.get(f"{base}/v1/topics/{TOPIC}/partitions", timeout=30)
    r.raise_for_status()
    part: dict[str, Any] = r.json()[0]
    return part


def _all_alive(base: str, count: int) -> bool | None:
    r = httpx.get(f"{base}/v1/cluster", timeout=30)
    alive = [b for b in r.json()["brokers"] if b["alive"]]
    return True if len(alive) == count and r.json()["controller"] > 0 else None


def _read_all(base: str, end: int) -> list[Any]:
    """Every record below ``end`` as ``base`` serves them (its own replica up to its HW)."""
    out: list[Any] = []
    offset = 0
    with httpx.Client(timeout=30) as client:
        while offset < end:
            r = client.get(
                f"{base}/v1/topics/{TOPIC}/partitions/0/records",
                params={"offset": offset, "max_records": 500},
            )
            r.raise_for_status()
            body = r.json()
            out.extend((rec["offset"], rec["value"]) for rec in body["records"])
            assert body["next_offset"] > offset, body
            offset = body["next_offset"]
    return out


class Producer(threading.Thread):
    """acks=all writes of unique values through every broker in turn, until stopped; records
    which were acknowledged (at which offset). A failed write is not acknowledged (it may or
    may not be kept), and the next one goes on."""

    def __init__(self, urls: list[str]) -> None:
        super().__init__(daemon=True)
        self.urls = urls
        self.acked: dict[str, int] = {}
        self.failures: list[str] = []
        self.stop = threading.Event()

    def run(self) -> None:
        i = 0
        with httpx.Client(timeout=30) as client:
            while not self.stop.is_set():
                value = f"v{i}"
                base = self.urls[i % len(self.urls)]
                i += 1
                try:
                    r = client.post(
                        f"{base}/v1/topics/{TOPIC}/partitions/0/records",
                        params={"acks": "all"},
                        json={"records": [{"value": value}]},
                    )
                except httpx.HTTPError as e:
                    self.failures.append(f"{value}: {e!r}")
                    continue
                if r.status_code == 200:
                    self.acked[value] = r.json()["offsets"][0]["offset"]
                else:
                    self.failures.append(f"{value}: {r.status_code} {r.text[:200]}")

    def wait_for(self, count: int) -> None:
        eventually(lambda: len(self.acked) >= count or None, f"{count} acknowledged writes")


def test_a_partition_moves_to_another_broker_while_acks_all_writes_go_on(
    tmp_path: Path,
) -> None:
    with brokers_on_one_store(tmp_path) as (url, brokers):
        eventually(lambda: _all_alive(brokers[1].url, 3), "three live brokers and a controller")
        _create(brokers[1].url, replication_factor=2)
        original = _row(url)
        # Move the leader's replica away (the test reads it as "from {1,2} to {2,3}").
        leaving, staying = (
            original.leader,
            next(b for b in original.replicas if b != original.leader),
        )
        arriving = next(b for b in brokers if b not in original.replicas)
        target = [staying, arriving]
        producer = Producer([b.url for b in brokers.values()])
        producer.start()
        try:
            producer.wait_for(20)
            r = httpx.put(
                f"{brokers[arriving].url}/v1/topics/{TOPIC}/partitions/0/replicas",
                json={"replicas": target},
                timeout=30,
            )
            assert r.status_code == 202, r.text
            started = r.json()
            assert started["replicas"] == [*target, leaving] and started["in_progress"]
            assert (started["adding_replicas"], started["removing_replicas"]) == (
                [arriving],
                [leaving],
            )
            done = eventually(
                lambda: (lambda r: r if r.replicas == target and not r.reassigning else None)(
                    _row(url)
                ),
                "the reassignment to complete",
            )
            shown = eventually(
                lambda: (lambda p: p if p["replicas"] == target else None)(
                    _partition(brokers[staying].url)
                ),
                "the listing to show the target",
            )
            assert shown["adding_replicas"] == [] and shown["removing_replicas"] == []
            acked_before = len(producer.acked)
            producer.wait_for(acked_before + 20)  # writes go on after the move
        finally:
            producer.stop.set()
            producer.join(timeout=60)
        assert not producer.is_alive()

        final = _row(url)
        assert final.leader in target and set(final.isr) <= set(target)
        assert done.leader_epoch > original.leader_epoch  # the leader moved off `leaving`
        # The arriving broker's own replica holds every acknowledged record at its offset.
        leader_part = _partition(brokers[final.leader].url)
        hw = leader_part["high_watermark"]
        eventually(
            lambda: (
                lambda p: p if (p["local_replica"] or {}).get("high_watermark") == hw else None
            )(_partition(brokers[arriving].url)),
            "the arriving replica to reach the high watermark",
        )
        stored = dict(_read_all(brokers[arriving].url, hw))
        by_value = {v: o for o, v in stored.items()}
        missing = [v for v, o in producer.acked.items() if by_value.get(v) != o]
        assert not missing, f"acknowledged records lost or moved: {missing[:10]}"
        # The leaving broker deleted its copy; the others hold one.
        eventually(
            lambda: not (brokers[leaving].data_dir / f"{TOPIC}-0").exists() or None,
            "the removed replica's data to be deleted",
        )
        assert (brokers[arriving].data_dir / f"{TOPIC}-0").is_dir()
        assert _partition(brokers[leaving].url)["local_replica"] is None


def test_a_reassignment_is_cancelled_back_to_the_original_replicas(tmp_path: Path) -> None:
    # A long session timeout: the arriving broker is paused (so it cannot catch up and the
    # reassignment stays in progress) but must count as alive when the reassignment starts.
    env = {"LOGBUS_BROKER_SESSION_TIMEOUT_MS": "60000"}
    with brokers_on_one_store(tmp_path, env=env) as (url, brokers):
        eventually(lambda: _all_alive(brokers[1].url, 3), "three live brokers and a controller")
        _create(brokers[1].url, replication_factor=1)
        original = _row(url)
        [home] = original.replicas
        controller = httpx.get(f"{brokers[1].url}/v1/cluster", timeout=30).json()["controller"]
        arriving = next(b for b in brokers if b not in (home, controller))
        base = brokers[home].url
        replicas = f"{base}/v1/topics/{TOPIC}/partitions/0/replicas"

        nothing = httpx.delete(replicas, timeout=30)
        assert nothing.status_code == 409, nothing.text
        assert nothing.json()["code"] == "NO_REASSIGNMENT_IN_PROGRESS"

        proc = brokers[arriving].proc
        assert proc is not None
        # Not inside its write to the shared SQLite file: the controller must write meanwhile.
        pause(proc.pid, url)
        try:
            r = httpx.put(replicas, json={"replicas": [home, arriving]}, timeout=30)
            assert r.status_code == 202, r.text
            assert r.json()["adding_replicas"] == [arriving] and r.json()["in_progress"]
            listed = _partition(base)
            assert listed["replicas"] == [home, arriving]
            assert listed["adding_replicas"] == [arriving]
            cancelled = httpx.delete(replicas, timeout=30)
            assert cancelled.status_code == 200, cancelled.text
            assert cancelled.json()["replicas"] == [home] and not cancelled.json()["in_progress"]
        finally:
            os.kill(proc.pid, signal.SIGCONT)
        row = _row(url)
        assert (row.replicas, row.isr, row.leader, row.reassigning) == ([home], [home], home, False)
        assert row.leader_epoch == original.leader_epoch  # the leader never moved
        w = httpx.post(
            f"{base}/v1/topics/{TOPIC}/partitions/0/records",
            params={"acks": "all"},
            json={"records": [{"value": "after"}]},
            timeout=30,
        )
        assert w.status_code == 200, w.text
        # The resumed broker learns it is no replica: it holds no copy.
        eventually(
            lambda: _partition(brokers[arriving].url)["replicas"] == [home] or None,
            "the resumed broker to see the cancellation",
        )
        assert not (brokers[arriving].data_dir / f"{TOPIC}-0").exists()


def test_drain_moves_every_replica_off_a_broker_with_the_cli(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from api.cli import main

    with brokers_on_one_store(tmp_path) as (url, brokers):
        eventually(lambda: _all_alive(brokers[1].url, 3), "three live brokers and a controller")
        r = httpx.post(
            f"{brokers[1].url}/v1/topics",
            json={"name": "drained", "partitions": 3, "replication_factor": 2},
            timeout=30,
        )
        assert r.status_code == 201, r.text
        eventually(lambda: knows_topic(brokers[2].url, "drained"), "broker 2 to know the topic")
        for p in range(3):
            w = httpx.post(
                f"{brokers[2].url}/v1/topics/drained/partitions/{p}/records",
                params={"acks": "all"},
                json={"records": [{"value": f"p{p}-{i}"} for i in range(10)]},
                timeout=30,
            )
            assert w.status_code == 200, w.text
        # A reassignment sent to another broker is forwarded to the controller; a client that
        # routes itself to a broker without the controller lease is told to retry.
        controller = httpx.get(f"{brokers[1].url}/v1/cluster", timeout=30).json()["controller"]
        other = next(b for i, b in brokers.items() if i != controller)
        current = _row_of(url, "drained").replicas
        path = f"{other.url}/v1/topics/drained/partitions/0/replicas"
        same = httpx.put(path, json={"replicas": current}, timeout=30)
        assert same.status_code == 200, same.text
        assert same.headers["Logbus-Forwarded-To"] == str(controller)
        reordered = current[::-1]  # a change (the preferred leader), so it needs the lease
        direct = httpx.put(
            path, json={"replicas": reordered}, headers={"Logbus-Route": "direct"}, timeout=30
        )
        assert direct.status_code == 503 and direct.json()["code"] == "NOT_CONTROLLER", direct.text
        # Bad targets are refused by the controller, whichever broker is asked.
        replicas = f"{brokers[2].url}/v1/topics/drained/partitions/0/replicas"
        for body, words in [
            ({"replicas": []}, "at least one broker"),
            ({"replicas": [1, 1]}, "more than once"),
            ({"replicas": [7]}, "unknown broker id(s) [7]"),
            ({"replicas": ["1"]}, "JSON number"),
            ({"nope": [1]}, "replicas"),
        ]:
            bad = httpx.put(replicas, json=body, timeout=30)
            assert bad.status_code == 400, (body, bad.text)
            assert words in bad.json()["detail"], (body, bad.text)
        missing = httpx.put(
            f"{brokers[2].url}/v1/topics/drained/partitions/5/replicas",
            json={"replicas": [1]},
            timeout=30,
        )
        assert missing.status_code == 404, missing.text
        store = MetadataStore(url)
        try:
            before = store.topic("drained").assignments
            assert any(1 in row.replicas for row in before)
            code = main(["cluster", "drain", "--broker", "1", "--wait", "--url", brokers[3].url])
            assert code == 0, capsys.readouterr().err
            after = store.topic("drained").assignments
        finally:
            store.close()
        assert "broker 1 holds no replica now" in capsys.readouterr().out
        for row in after:
            assert 1 not in row.replicas and len(row.replicas) == 2 and not row.reassigning
            assert set(row.isr) <= set(row.replicas) and row.leader in row.replicas
        eventually(
            lambda: not list(brokers[1].data_dir.glob("drained-*")) or None,
            "broker 1 to delete its copies",
        )
        for p in range(3):
            got = httpx.get(
                f"{brokers[1].url}/v1/topics/drained/partitions/{p}/records",
                params={"offset": 0},
                timeout=30,
            )
            assert [rec["value"] for rec in got.json()["records"]] == [
                f"p{p}-{i}" for i in range(10)
            ]
        # Draining a broker that holds nothing says so.
        assert main(["cluster", "drain", "--broker", "1", "--url", brokers[2].url]) == 0
        assert "holds no replica" in capsys.readouterr().out
