"""Transactions on a 3-broker cluster of real processes, Jepsen-style (issue 13's tests).

* ``test_jepsen_*``: transactional writers (each its own transactional id; every transaction
  writes unique values to 2-4 partitions of 2 topics, then commits, or aborts ~20 % of the time)
  and ``read_committed`` pollers, over HTTP to random brokers, while a nemesis SIGKILLs and
  restarts partition leaders and transaction coordinators and SIGSTOPs brokers
  (tests/jepsen/harness.py); the history goes to tests/jepsen/checker.py, which must find zero
  anomalies of every kind. The default variant runs ~15 s of workload on SQLite; the ``slow``
  one minutes on each store.
* The scenarios of the issue, each on purpose: a delayed end-transaction (a commit held in a
  stalled TCP proxy arrives after the next session began: refused, and it decides nothing), a
  delayed produce (held the same way, it arrives once the next transaction writes the same
  partition: refused, never written),
  zombie fencing, the transaction timeout, coordinator failover mid-commit, and an abort after
  partial writes on several partitions.

Measured on this 2-core machine (``pytest -m "not slow" tests/jepsen/test_txn_cluster.py``):
at load ~1 the short Jepsen run took 35 s (start 5, nemesis 15, settle and final read 5;
51 commits, 3 faults), the failover test 26 s, each other scenario 3-5 s; at load 10-14 (other
test runs) the file took 83-132 s, the short run 40-65 s. The slow run (180 s of nemesis, about
20 faults, 200-250 commits) took ~200 s per store. No anomaly in any run; the pipeline does
catch one: pollers reading read_uncommitted while recording read_committed gave G1a and
precommitted-read at once.

A failing run prints its seed (``LOGBUS_CHAOS_SEED`` replays the rng's choices), the brokers'
logs and the saved history (``python -m tests.jepsen.checker history.jsonl`` re-checks it).
"""

from __future__ import annotations

import os
import random
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from concurrent.futures import wait as futures_wait
from pathlib import Path
from urllib.parse import urlsplit

import httpx
import pytest

from cluster.txn_state import TXN_STATE_TOPIC
from tests.chaos.harness import ChaosCluster, chaos_seed, eventually, running_cluster
from tests.chaos.proxy import ThreadedLinkProxy
from tests.jepsen.harness import (
    TXN,
    Answer,
    Nemesis,
    TxnClient,
    TxnWorkload,
    coordinator_of,
    open_transactions,
    read_partition,
)
from tests.jepsen.history import READ_COMMITTED, READ_UNCOMMITTED

TOPICS = ["txa", "txb"]
PARTITIONS = 3
SHORT_RUN_S = float(os.environ.get("LOGBUS_JEPSEN_SECONDS", "15"))
LONG_RUN_S = 180.0
CLEANUP_INTERVAL_MS = 200  # the timeout test's abort task; Kafka's default is 10 s
FENCED = ("PRODUCER_FENCED", "INVALID_PRODUCER_EPOCH")


# -- the Jepsen runs -----------------------------------------------------------------------------


def run_jepsen(
    tmp_path: Path, metadata_url: str, seed: int, report: list[str], duration_s: float
) -> None:
    cluster = ChaosCluster(tmp_path, metadata_url, seed=seed)
    report.append(cluster.failure_report())
    t0 = time.monotonic()
    phases: dict[str, float] = {}

    def phase(name: str) -> None:
        phases[name] = round(time.monotonic() - t0 - sum(phases.values()), 1)

    with running_cluster(cluster):
        phase("start")
        for t in TOPICS:
            cluster.create_topic(t, PARTITIONS)
        phase("topics")
        workload = TxnWorkload(cluster, TOPICS, PARTITIONS, writers=3, pollers=2)
        nemesis = Nemesis(cluster, workload)
        path = tmp_path / "history.jsonl"
        started = time.monotonic()
        try:
            workload.start()
            # the first commits create __transaction_state; the nemesis kills its leaders too
            eventually(lambda: workload.committed_count() >= 3 or None, "the first commits")
            cluster.wait_healthy(TXN_STATE_TOPIC)
            phase("first-commits")
            with nemesis:
                threading.Event().wait(duration_s)  # the run's length, not a synchronisation
            phase("nemesis")
            nemesis.check_error()
            workload.stop_writers()
            phase("stop-writers")
            hws = workload.settle()
            phase("settle")
            workload.stop_pollers()
            workload.final_read(hws)
            phase("final-read")
        finally:  # what happened so far, whatever failed
            workload.history().save(path)
            report += [
                f"history: {path}",
                f"workload: {workload.stats.line()} in {time.monotonic() - started:.1f} s",
                nemesis.report(),
            ]
        result = workload.check()
        print(report[-2], report[-1], f"phases (s): {phases}", sep="\n")
        assert result.valid, result.render()
        assert not workload.stats.unexpected, workload.stats.unexpected[:10]
        assert nemesis.faults, "the nemesis never struck"
        assert workload.stats.committed >= 3 and result.never_polled == 0, result.render()


def test_jepsen_short(tmp_path: Path, seed: int, failure_report: list[str]) -> None:
    run_jepsen(tmp_path, f"sqlite:///{tmp_path / 'shared.db'}", seed, failure_report, SHORT_RUN_S)


@pytest.mark.slow
def test_jepsen_long(
    tmp_path: Path, metadata_url: str, seed: int, failure_report: list[str]
) -> None:
    run_jepsen(tmp_path, metadata_url, seed, failure_report, LONG_RUN_S)


# -- the scenarios, on one cluster ---------------------------------------------------------------


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ChaosCluster]:
    """One cluster for the scenarios that kill nothing; the timeout task runs every 200 ms."""
    tmp = tmp_path_factory.mktemp("txn-scenarios")
    c = ChaosCluster(
        tmp,
        f"sqlite:///{tmp / 'shared.db'}",
        seed=chaos_seed(),
        env={
            "LOGBUS_TRANSACTION_ABORT_TIMED_OUT_TRANSACTION_CLEANUP_INTERVAL_MS": str(
                CLEANUP_INTERVAL_MS
            )
        },
    )
    with running_cluster(c):
        yield c


def _topic(cluster: ChaosCluster, name: str, partitions: int = 3) -> str:
    cluster.create_topic(name, partitions)
    return name


def _committed(cluster: ChaosCluster, topic: str, partition: int) -> list[int]:
    return _values(cluster, topic, partition, READ_COMMITTED)


def _values(cluster: ChaosCluster, topic: str, partition: int, isolation: str) -> list[int]:
    hw = cluster.describe(cluster.leader(topic, partition), topic)[partition]["high_watermark"]
    return [v for _, v in read_partition(cluster, topic, partition, isolation, hw)]


def _ok(a: Answer, what: str) -> Answer:
    assert a.ok, f"{what}: {a.status} {a.body}"
    return a


def _fenced(a: Answer, what: str) -> None:
    assert a.status == 409 and a.code in FENCED, f"{what}: {a.status} {a.body}"


def _state_of(cluster: ChaosCluster, txn_id: str) -> dict[str, object] | None:
    r = httpx.get(cluster.url(1) + TXN, timeout=10)
    assert r.status_code == 200, r.text
    return next((t for t in r.json()["transactions"] if t["transactional_id"] == txn_id), None)


def test_delayed_end_transaction_cannot_decide_the_next(
    cluster: ChaosCluster, failure_report: list[str]
) -> None:
    """KAFKA-17754: txn 1's commit is held in a stalled proxy in front of broker 1 while the
    client gives up on it, begins a new session (fencing and aborting txn 1) and writes txn 2.
    Released, the held commit is refused and commits nothing; txn 2 stays invisible until its
    own session commits it, and then only txn 2 is visible."""
    failure_report.append(cluster.failure_report())
    topic = _topic(cluster, "delayed", 2)
    port = urlsplit(cluster.url(1)).port
    assert port is not None
    client = TxnClient(cluster, "delayed-app")
    slow = httpx.Client(timeout=120, headers={"Host": f"127.0.0.1:{port}"})  # the broker's
    with ThreadedLinkProxy("127.0.0.1", port) as proxy, ThreadPoolExecutor(1) as pool:
        via_proxy = f"http://127.0.0.1:{proxy.port}"
        s1 = client.begin_until_ok()
        _ok(client.produce(topic, 0, [101], broker=2), "txn 1 -> p0")
        _ok(client.produce(topic, 1, [102], broker=3), "txn 1 -> p1")
        # a connection through the proxy first, so the commit is held mid-connection
        assert slow.get(f"{via_proxy}/readyz").status_code == 200
        proxy.stall()
        held = pool.submit(
            slow.post,
            f"{via_proxy}{TXN}/{client.id}/commit",
            json={"producer_id": s1[0], "producer_epoch": s1[1]},
        )
        with pytest.raises(FutureTimeout):
            held.result(timeout=1.0)  # the client's own timeout: it gives up on the commit
        s2 = client.begin_until_ok()  # a new session: fences s1, aborts txn 1
        assert s2[0] == s1[0] and s2[1] > s1[1]
        _ok(client.produce(topic, 0, [201], broker=3), "txn 2 -> p0")
        _ok(client.produce(topic, 1, [202], broker=2), "txn 2 -> p1")
        proxy.heal()
        late = held.result(timeout=60)
        body = late.json()
        assert late.status_code == 409 and body["code"] in FENCED, late.text
        assert _committed(cluster, topic, 0) == [] and _committed(cluster, topic, 1) == []
        state = _state_of(cluster, client.id)
        assert state is not None and state["state"] == "ongoing", state
        assert state["producer_epoch"] == s2[1]
        _ok(client.end(True, broker=3), "txn 2 commit")
        assert _committed(cluster, topic, 0) == [201] and _committed(cluster, topic, 1) == [202]
        assert _values(cluster, topic, 0, READ_UNCOMMITTED) == [101, 201]
    slow.close()
    client.close()


def test_delayed_produce_cannot_join_the_next(
    cluster: ChaosCluster, failure_report: list[str]
) -> None:
    """KIP-890's other half: a produce of txn 1 is held in a stalled proxy in front of broker 1;
    the client gives up on it, aborts txn 1 (the epoch is bumped) and writes and commits txn 2 on
    the same partitions. Released, the held produce is refused: it joins no transaction and is
    never written."""
    failure_report.append(cluster.failure_report())
    topic = _topic(cluster, "late-produce", 2)
    port = urlsplit(cluster.url(1)).port
    assert port is not None
    client = TxnClient(cluster, "late-produce-app")
    slow = TxnClient(cluster, "late-produce-app", timeout_s=120)
    slow.http.headers["Host"] = f"127.0.0.1:{port}"  # the broker's own name, not the proxy's
    with ThreadedLinkProxy("127.0.0.1", port) as proxy, ThreadPoolExecutor(1) as pool:
        via_proxy = f"http://127.0.0.1:{proxy.port}"
        s1 = client.begin_until_ok()
        _ok(client.produce(topic, 0, [1], broker=2), "txn 1 -> p0")
        assert slow.http.get(f"{via_proxy}/readyz").status_code == 200
        proxy.stall()
        held = pool.submit(slow.produce, topic, 1, [666], 0, via_proxy, s1)
        with pytest.raises(FutureTimeout):
            held.result(timeout=1.0)  # the client's own timeout: it gives up on the produce
        _ok(client.end(False, broker=3, session=s1), "abort txn 1")
        s2 = client.session
        assert s2 is not None and s2 != s1
        _ok(client.produce(topic, 1, [2], broker=2), "txn 2 -> p1")
        _ok(client.produce(topic, 0, [3], broker=3), "txn 2 -> p0")
        proxy.heal()
        late = held.result(timeout=60)
        _fenced(late, "the held produce of txn 1")
        _ok(client.end(True, broker=2), "commit txn 2")
        assert _committed(cluster, topic, 0) == [3] and _committed(cluster, topic, 1) == [2]
        assert _values(cluster, topic, 1, READ_UNCOMMITTED) == [2]  # never written
    slow.close()
    client.close()


def test_zombie_is_fenced_and_never_visible(
    cluster: ChaosCluster, failure_report: list[str]
) -> None:
    """Two sessions of one id: the newer fences the older everywhere (its produce to a partition
    it wrote, to a new partition, its commit); the older's data is never visible."""
    failure_report.append(cluster.failure_report())
    topic = _topic(cluster, "zombie", 3)
    zombie = TxnClient(cluster, "zombie-app")
    fresh = TxnClient(cluster, "zombie-app")
    zombie.begin_until_ok()
    _ok(zombie.produce(topic, 0, [1], broker=1), "zombie -> p0")
    _ok(zombie.produce(topic, 1, [2], broker=2), "zombie -> p1")
    fresh.begin_until_ok()
    _fenced(zombie.produce(topic, 0, [3], seq=1, broker=3), "zombie again -> p0")
    _fenced(zombie.produce(topic, 2, [4], broker=1), "zombie -> new p2")
    _fenced(zombie.end(True, broker=2), "zombie commit")
    _ok(fresh.produce(topic, 1, [10], broker=3), "fresh -> p1")
    _ok(fresh.produce(topic, 2, [11], broker=1), "fresh -> p2")
    _fenced(zombie.end(True, broker=3), "zombie commit after the fresh writes")
    _ok(fresh.end(True, broker=1), "fresh commit")
    assert [_committed(cluster, topic, p) for p in range(3)] == [[], [10], [11]]
    assert _values(cluster, topic, 0, READ_UNCOMMITTED) == [1]  # written, aborted, hidden
    _fenced(zombie.end(False, broker=2), "zombie abort")
    assert [_committed(cluster, topic, p) for p in range(3)] == [[], [10], [11]]
    zombie.close()
    fresh.close()


def test_transaction_timeout_aborts_and_fences(
    cluster: ChaosCluster, failure_report: list[str]
) -> None:
    """A transaction open past its transaction_timeout_ms is aborted by the coordinator (its
    cleanup task runs every 200 ms here), with an epoch bump: the producer's produce and commit
    are fenced, nothing it wrote is visible, the partitions' LSO moves on."""
    failure_report.append(cluster.failure_report())
    topic = _topic(cluster, "timeout", 2)
    client = TxnClient(cluster, "slow-app")
    s = client.begin_until_ok(transaction_timeout_ms=1000)
    _ok(client.produce(topic, 0, [1], broker=2), "p0")
    _ok(client.produce(topic, 1, [2], broker=3), "p1")
    eventually(
        lambda: (lambda t: t if t is not None and t["state"] == "complete_abort" else None)(
            _state_of(cluster, client.id)
        ),
        "the coordinator aborted the timed-out transaction",
    )
    _fenced(client.produce(topic, 0, [3], seq=1, session=s, broker=1), "produce after timeout")
    _fenced(client.end(True, session=s, broker=1), "commit after timeout")
    # the LSO moved past the aborted records: a later plain record is visible
    r = httpx.post(
        cluster.url(1) + f"/v1/topics/{topic}/partitions/0/records",
        params={"acks": "all"},
        json={"records": [{"value": 9}]},
        timeout=10,
    )
    assert r.status_code == 200, r.text
    assert _committed(cluster, topic, 0) == [9] and _committed(cluster, topic, 1) == []
    s2 = client.begin_until_ok()
    assert s2[0] != s[0] or s2[1] > s[1] + 1  # the timeout bumped the epoch, init again
    client.close()


def test_abort_after_partial_writes(cluster: ChaosCluster, failure_report: list[str]) -> None:
    """Writes to several partitions of two topics, one produce refused midway (a partition that
    does not exist): the abort hides every write that succeeded; the next transaction of the
    same session commits on the same partitions and only its values are visible."""
    failure_report.append(cluster.failure_report())
    a, b = _topic(cluster, "partial-a", 3), _topic(cluster, "partial-b", 2)
    client = TxnClient(cluster, "partial-app")
    client.begin_until_ok()
    _ok(client.produce(a, 0, [1, 2], broker=1), "a0")
    _ok(client.produce(a, 2, [3], broker=2), "a2")
    _ok(client.produce(b, 1, [4], broker=3), "b1")
    missing = client.produce(b, 7, [5], broker=1)
    assert missing.status == 404, (missing.status, missing.body)
    _ok(client.end(False, broker=2), "abort")
    for t, p in ((a, 0), (a, 2), (b, 1)):
        assert _committed(cluster, t, p) == []
    assert _values(cluster, a, 0, READ_UNCOMMITTED) == [1, 2]
    _ok(client.produce(a, 0, [10], broker=3), "a0 again")
    _ok(client.produce(b, 1, [11], broker=2), "b1 again")
    _ok(client.end(True, broker=1), "commit")
    assert _committed(cluster, a, 0) == [10] and _committed(cluster, a, 2) == []
    assert _committed(cluster, b, 1) == [11]
    client.close()


# -- coordinator failover mid-commit -------------------------------------------------------------

FAILOVER_ROUNDS = 2  # ~10 s each under load (election 2 s, restart, ISRs full again)


def test_coordinator_failover_mid_commit(
    tmp_path: Path, seed: int, failure_report: list[str]
) -> None:
    """Each round: a transaction writes to 3 partitions of 2 topics, its commit is sent to a
    broker that is not the coordinator, and the coordinator is SIGKILLed right after: in even
    rounds it was SIGSTOPped before the commit was sent (the commit reaches it, it never
    answers, it dies), in odd ones the kill lands a random 0-300 ms after the send.
    A commit without an answer (or a retriable one) is retried with the same epoch, as a client
    must. Once the coordinator restarted and every transaction ended, the
    transaction is visible read_committed on all its partitions or on none — all if the client
    got a 200 — and the id begins and commits again."""
    cluster = ChaosCluster(tmp_path, f"sqlite:///{tmp_path / 'shared.db'}", seed=seed)
    failure_report.append(cluster.failure_report())
    rng = random.Random(seed)
    with running_cluster(cluster), ThreadPoolExecutor(1) as pool:
        for t in TOPICS:
            cluster.create_topic(t, PARTITIONS)
        client = TxnClient(cluster, "failover-app", rng)
        client.begin_until_ok()
        cluster.wait_healthy(TXN_STATE_TOPIC)
        outcomes = []
        for rnd in range(FAILOVER_ROUNDS):
            if client.session is None or rnd:
                client.begin_until_ok()
            coord = coordinator_of(cluster, client.id)
            others = [i for i in cluster.brokers if i != coord]
            writes = {
                (t, p): [1000 * rnd + 10 * i + p]
                for i, t in enumerate(TOPICS)
                for p in range(PARTITIONS)
                if (i + p + rnd) % 2 == 0
            }
            for (t, p), vals in writes.items():
                _ok(client.produce(t, p, vals, broker=rng.choice(others)), f"{t}-{p}")
            session = client.session
            if rnd % 2 == 0:  # the commit reaches a stopped coordinator, which then dies
                cluster.pause(coord)
                commit = pool.submit(client.end, True, rng.choice(others), session)
                futures_wait([commit], timeout=1.0)  # sent, held by the stopped coordinator
            else:  # the kill lands anywhere in the commit: persist, markers, complete
                commit = pool.submit(client.end, True, rng.choice(others), session)
                threading.Event().wait(rng.uniform(0, 0.3))
            cluster.kill(coord)
            answer = commit.result(timeout=120)
            cluster.restart(coord)
            first = answer
            retry_until = time.monotonic() + 60
            while answer.retriable and time.monotonic() < retry_until:
                time.sleep(0.05)  # a client's retry backoff: retry with the same epoch
                answer = client.end(True, session=session)
            assert not answer.retriable, f"round {rnd}: commit unanswered: {answer}"
            eventually(lambda: open_transactions(cluster, 1) == [] or None, "all ended")
            for t in TOPICS:
                cluster.wait_healthy(t)
            visible = {tp: _committed(cluster, *tp) for tp in writes}
            got = {tp for tp, vals in writes.items() if set(vals) <= set(visible[tp])}
            outcomes.append((first.status, first.code, answer.status, len(got)))
            assert got in (set(), set(writes)), f"round {rnd}: partly committed: {visible}"
            if answer.ok:
                assert got == set(writes), f"round {rnd}: acknowledged, not visible: {visible}"
            cluster.wait_healthy(TXN_STATE_TOPIC)
        print("failover rounds (first answer, code, final answer, partitions visible):", outcomes)
        client.begin_until_ok()
        _ok(client.produce(TOPICS[0], 0, [99_999]), "after the failovers")
        _ok(client.end(True), "commit after the failovers")
        assert 99_999 in _committed(cluster, TOPICS[0], 0)
        client.close()
