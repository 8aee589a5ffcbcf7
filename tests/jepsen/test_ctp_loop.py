"""Issue 13's consume-transform-produce test: a loop over HTTP (tests/jepsen/ctp_loop.py) reads
topic A and writes topic B plus the group's offsets in one transaction per chunk; it is SIGKILLed
at random moments and restarted, and at the end B holds exactly one committed output per input.

Theory of operation
-------------------
* A 3-broker cluster of real processes (tests/chaos/harness.py), topics A and B with 3
  partitions each (RF 3, min.insync.replicas 2). A is filled with N records, integer values
  1..N, before the loop starts; whenever an incarnation finishes A before the kills are done,
  another batch is appended, so every kill lands in a running loop.
* The loop is a separate process (``tests.jepsen.ctp_loop.main``, forked from the test run's
  zygote, tests/zygote.py, as a fresh ``python -m tests.jepsen.ctp_loop`` would run it, without
  its ~1 s of imports), restarted after every kill; incarnations alternate between the two
  transactional forms (a session: begin, produce, add offsets, commit; and the one-request
  ``POST /v1/transactions``), both with the same ``transactional_id``, so each one fences the
  previous. A kill comes a seeded-random 0.1-1.5 s
  after the incarnation logged its start, so kills land before, during and after transactions
  (the report counts those that left a transaction without an answer). After the last kill, the
  last incarnation runs to completion: the group's offsets equal A's high watermarks.
* Then: no transaction is open, B is read whole at both isolation levels, and
  - ``read_committed`` B holds, per input (partition p, offset o), exactly one output: key
    ``"p/o"`` in partition p, value ``input + OUTPUT_BASE``; nothing missing, nothing else;
  - ``read_uncommitted`` B holds at least that (aborted leftovers of killed incarnations);
  - the loop's event log becomes a Jepsen history (its reads of A as polls, each transaction
    with its outcome: ok, fail, or info when the process died not knowing) and
    tests/jepsen/checker.py, with the ``output-mismatch`` check of this loop, finds nothing.
* ``slow``: 50 kills, and a nemesis thread that SIGKILLs (and restarts) the coordinator of the
  transactional id or a leader of A or B a few times during the loop.

Measured on this 2-core machine shared with other test runs (load 4-10), ``pytest -m "not slow"
tests/jepsen/test_ctp_loop.py``: 49-67 s (5 runs, all passing; 20 kills, 18-20 of them with a
transaction unanswered, 21-23 incarnations, 40-88 commits, 0-2 refills of A). Most of it is the
loop's restarts: an incarnation takes a median 0.6-1.0 s to start (the interpreter and httpx's
imports, under that load) before its 0.1-1.5 s to the kill. The ``slow`` run (50 kills, 11 broker
kills) took 199 s. A mutant loop that commits the group's offsets after its transaction instead
of in it fails here (duplicated outputs), as it should.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import httpx
import pytest

from cluster.txn_state import TXN_STATE_TOPIC
from tests import zygote
from tests.chaos.harness import ChaosCluster, eventually, running_cluster
from tests.jepsen.checker import Transform, check
from tests.jepsen.ctp_loop import OUTPUT_BASE, transform
from tests.jepsen.harness import (
    CLIENT_TIMEOUT_S,
    coordinator_of,
    open_transactions,
    read_records,
)
from tests.jepsen.history import (
    READ_COMMITTED,
    READ_UNCOMMITTED,
    FinalRead,
    GroupOffset,
    History,
    Op,
    PartitionRead,
    Poll,
    Record,
    Txn,
    TxnEnd,
    Write,
)

A, B, GROUP, TXN_ID = "ctp-in", "ctp-out", "ctp-group", "ctp"
PARTITIONS = 3
REPO = Path(__file__).resolve().parents[2]
START_WAIT_S = 60.0  # an interpreter start on a loaded machine: well under 10 s
FINISH_WAIT_S = 240.0  # the last incarnation consumes what is left (seconds when healthy)
KILL_AFTER_S = (0.1, 1.5)
LOOP_MAIN = "tests.jepsen.ctp_loop:main"  # forked from the zygote (tests/zygote.py)


@dataclass
class Run:
    """What the test did: incarnations, kills (pid -> monotonic ns), input appended."""

    kills: dict[int, int] = field(default_factory=dict)
    spawned: dict[int, int] = field(default_factory=dict)  # pid -> monotonic ns
    incarnations: list[tuple[int, str]] = field(default_factory=list)  # (pid, mode)
    inputs: int = 0
    refills: int = 0
    broker_kills: list[str] = field(default_factory=list)


def fill(cluster: ChaosCluster, first: int, n: int) -> None:
    """Append values first..first+n-1 to A, round-robin over its partitions, acks=all; each
    batch retried (as a new batch: a non-idempotent retry could duplicate an input, which the
    test would then report, so retry only when no answer could have written it)."""
    per: dict[int, list[int]] = defaultdict(list)
    for v in range(first, first + n):
        per[v % PARTITIONS].append(v)
    with httpx.Client(timeout=CLIENT_TIMEOUT_S) as http:
        for p, values in per.items():
            for i in range(0, len(values), 500):
                body = {"records": [{"value": v} for v in values[i : i + 500]]}
                key = f"fill-{p}-{values[i]}"

                def send(body: dict[str, Any] = body, key: str = key, p: int = p) -> bool | None:
                    broker = cluster.leader(A, p)
                    if broker == -1:
                        return None
                    r = http.post(
                        cluster.url(broker) + f"/v1/topics/{A}/partitions/{p}/records",
                        params={"acks": "all"},
                        json=body,
                        headers={"Idempotency-Key": key},
                    )
                    return True if r.status_code == 200 else None

                eventually(send, f"input batch {key}")


def read_all(
    cluster: ChaosCluster, topic: str, partition: int, isolation: str, end: int
) -> list[tuple[int, str | None, int]]:
    """(offset, key, value) of every record below ``end``, from the partition's leader."""
    records = read_records(cluster, topic, partition, isolation, end)
    return [(int(r["offset"]), r.get("key"), int(r["value"])) for r in records]


def group_offsets(cluster: ChaosCluster) -> dict[int, int]:
    def probe() -> dict[int, int] | None:
        r = httpx.get(cluster.url(1) + f"/v1/groups/{GROUP}/offsets", timeout=CLIENT_TIMEOUT_S)
        if r.status_code == 404:
            return {}
        if r.status_code != 200:
            return None
        return {int(o["partition"]): int(o["offset"]) for o in r.json()["offsets"]}

    return eventually(probe, "the group's offsets")


def events(log: Path) -> list[dict[str, Any]]:
    """The loop's event log; a line cut by a kill (the last of a killed incarnation) is
    dropped: its event did not finish happening."""
    out = []
    for line in log.read_text(encoding="utf-8").splitlines():
        try:
            out.append(json.loads(line))
        except ValueError:
            continue
    return out


def started(log: Path, pid: int) -> bool | None:
    if not log.exists():
        return None
    return any(e["kind"] == "start" and e["pid"] == pid for e in events(log)) or None


def history_of(evs: list[dict[str, Any]], run: Run, final: FinalRead) -> History:
    """The loop's events as a Jepsen history (module docstring)."""
    ops: list[Op] = []
    txns: dict[tuple[int, int], dict[str, Any]] = {}
    for e in evs:
        pid = e["pid"]
        if e["kind"] == "poll":
            records = tuple(Record(A, e["partition"], o, v) for o, v in e["records"])
            ops.append(
                Poll(
                    pid,
                    e["invoke_ns"],
                    e["complete_ns"],
                    "ok",
                    "ctp",
                    f"{pid}-{e['session']}",
                    READ_COMMITTED,
                    records,
                )
            )
        elif e["kind"] == "txn":
            txns[(pid, e["n"])] = {"txn": e}
        elif e["kind"] in ("commit", "end"):
            txns[(pid, e["n"])][e["kind"]] = e
    for (pid, _), t in txns.items():
        start, commit, end = t["txn"], t.get("commit"), t.get("end")
        offsets = end.get("offsets") if end is not None else None
        writes = tuple(
            Write(topic, p, v, offsets[i] if offsets else None)
            for i, (topic, p, v) in enumerate(start["writes"])
        )
        killed = run.kills.get(pid, 0)
        if end is not None and end["outcome"] == "none":
            txn_end, complete = None, end["complete_ns"]
        elif end is not None:
            txn_end = TxnEnd("commit", end["invoke_ns"], end["complete_ns"], end["outcome"])
            complete = end["complete_ns"]
        elif commit is not None:  # killed with its commit sent, or about to be: unknown
            assert killed, f"transaction {start} of pid {pid} has no end and was not killed"
            txn_end, complete = TxnEnd("commit", commit["invoke_ns"], killed, "info"), killed
        else:  # killed before its commit was sent: never committed
            assert killed, f"transaction {start} of pid {pid} has no end and was not killed"
            txn_end, complete = None, killed
        ops.append(
            Txn(
                pid,
                start["invoke_ns"],
                complete,
                TXN_ID,
                writes,
                txn_end,
                tuple(GroupOffset(GROUP, topic, p, o) for topic, p, o in start["offsets"]),
                start["session"][0],
                start["session"][1],
            )
        )
    ops.sort(key=lambda op: op.invoke_ns)
    return History((*ops, final))


class BrokerKiller:
    """SIGKILL (then restart) the transaction coordinator of the loop's id or a leader of A or
    B, one at a time, every 2-5 s, waiting for full ISRs in between."""

    def __init__(self, cluster: ChaosCluster, run: Run, rng: random.Random) -> None:
        self.cluster, self.run, self.rng = cluster, run, rng
        self.stop = threading.Event()
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._loop, name="broker-killer", daemon=True)

    def _loop(self) -> None:
        try:
            while not self.stop.wait(self.rng.uniform(2.0, 5.0)):
                if self.rng.random() < 0.5:
                    broker, what = coordinator_of(self.cluster, TXN_ID), "coordinator"
                else:
                    topic, p = self.rng.choice([A, B]), self.rng.randrange(PARTITIONS)
                    broker, what = self.cluster.leader(topic, p), f"leader of {topic}-{p}"
                if broker == -1:
                    continue
                self.cluster.kill(broker)
                self.stop.wait(self.rng.uniform(0.2, 1.5))
                self.cluster.restart(broker)
                self.run.broker_kills.append(f"{what} (broker {broker})")
                for topic in (A, B, TXN_STATE_TOPIC, "__consumer_offsets"):
                    self.cluster.wait_healthy(topic)
        except BaseException as e:  # re-raised in the test
            self.error = e


Loop = zygote.ZygoteChild | subprocess.Popen[bytes]


def _start_loop(argv: list[str], env: dict[str, str], log: Path) -> Loop:
    """One incarnation of the loop, forked from the zygote (``LOGBUS_TEST_FORK=0``: a fresh
    ``python -m tests.jepsen.ctp_loop``), its stdout and stderr appended to ``log``."""
    if zygote.forking():
        return zygote.shared().spawn(argv, env, log, str(REPO), main=LOOP_MAIN, stdout=log)
    module = LOOP_MAIN.partition(":")[0]
    with log.open("ab") as out:
        return subprocess.Popen(
            [sys.executable, "-m", module, *argv], cwd=REPO, env=env, stdout=out, stderr=out
        )


def run_ctp(
    tmp_path: Path, seed: int, report: list[str], *, kills: int, n: int, kill_brokers: bool
) -> None:
    cluster = ChaosCluster(tmp_path, f"sqlite:///{tmp_path / 'shared.db'}", seed=seed)
    report.append(cluster.failure_report())
    rng = random.Random(seed)
    log = tmp_path / "ctp-events.jsonl"
    report.append(f"loop events: {log}")
    run = Run()
    t0 = time.monotonic()
    with running_cluster(cluster):
        cluster.create_topic(A, PARTITIONS)
        cluster.create_topic(B, PARTITIONS)
        fill(cluster, 1, n)
        run.inputs = n
        env = {**os.environ, "PYTHONPATH": str(REPO)}
        killer = BrokerKiller(cluster, run, random.Random(seed ^ 0xB0B)) if kill_brokers else None
        stderr_log = tmp_path / "ctp-stderr.log"
        proc: Loop | None = None
        try:
            while True:
                mode = ("session", "single")[len(run.incarnations) % 2]
                argv = ["--in", A, "--out", B]
                argv += ["--group", GROUP, "--txn-id", TXN_ID, "--mode", mode, "--log", str(log)]
                argv += ["--seed", str(rng.randrange(2**32))]
                for i in sorted(cluster.brokers):
                    argv += ["--url", cluster.url(i)]
                spawned = time.monotonic_ns()
                proc = _start_loop(argv, env, stderr_log)
                run.incarnations.append((proc.pid, mode))
                run.spawned[proc.pid] = spawned
                last = len(run.kills) >= kills
                if last:
                    if killer is not None and killer.thread.is_alive():
                        killer.stop.set()
                        killer.thread.join(120)
                    rc = proc.wait(FINISH_WAIT_S)
                    assert rc == 0, f"the last incarnation exited {rc} (see {stderr_log.name})"
                    break
                try:
                    eventually(partial(started, log, proc.pid), "the loop's start", START_WAIT_S)
                    if killer is not None and killer.thread.ident is None and run.kills:
                        killer.thread.start()
                    rc = proc.wait(rng.uniform(*KILL_AFTER_S))
                except subprocess.TimeoutExpired:
                    proc.send_signal(signal.SIGKILL)
                    proc.wait(30)
                    run.kills[proc.pid] = time.monotonic_ns()
                    continue
                assert rc == 0, f"incarnation {proc.pid} exited {rc} (see {stderr_log.name})"
                fill(cluster, run.inputs + 1, n // 2)  # it finished A: more, for the next kills
                run.inputs += n // 2
                run.refills += 1
        finally:
            if proc is not None and proc.poll() is None:  # a failed run leaves no loop behind
                proc.kill()
                proc.wait(30)
            if killer is not None:
                killer.stop.set()
                killer.thread.join(120)
        if killer is not None and killer.error is not None:
            raise AssertionError(f"the broker killer failed: {killer.error!r}")
        looped = time.monotonic() - t0

        # -- the end: nothing open, then B whole -----------------------------------------------
        eventually(lambda: open_transactions(cluster, 1) == [] or None, "no transaction open")
        hw_a = cluster.wait_converged(A)
        hw_b = cluster.wait_converged(B)
        committed = group_offsets(cluster)
        assert committed == hw_a, f"the group's offsets {committed}, A's ends {hw_a}"
        reads = {
            (topic, p, iso): read_all(cluster, topic, p, iso, hws[p])
            for topic, hws in ((A, hw_a), (B, hw_b))
            for p in range(PARTITIONS)
            for iso in (READ_COMMITTED, READ_UNCOMMITTED)
        }
    evs = events(log)
    unexpected = [e for e in evs if e["kind"] == "unexpected"]
    mid_txn = sum(_open_at_kill(evs, pid) for pid in run.kills)
    first = {}  # pid -> (start logged, first position read): seconds after the spawn
    for e in evs:
        if e["kind"] in ("start", "position") and (e["pid"], e["kind"]) not in first:
            first[(e["pid"], e["kind"])] = (e["ns"] - run.spawned[e["pid"]]) / 1e9
    starts = sorted(v for (_, k), v in first.items() if k == "start")
    fenced = sorted(v for (_, k), v in first.items() if k == "position")
    summary = (
        f"{len(run.kills)} loop kills ({mid_txn} with a transaction unanswered), "
        f"{len(run.incarnations)} incarnations, {run.inputs} inputs ({run.refills} refills), "
        f"{sum(e['kind'] == 'end' and e['outcome'] == 'ok' for e in evs)} commits, "
        f"broker kills: {run.broker_kills}, loop phase {looped:.1f} s; median start "
        f"{starts[len(starts) // 2]:.2f} s, position read {fenced[len(fenced) // 2]:.2f} s"
    )
    report.append(summary)
    print(summary)
    assert not unexpected, unexpected[:5]

    # -- exactly one committed output per input ----------------------------------------------------
    inputs = {
        f"{p}/{o}": (p, v) for p in range(PARTITIONS) for o, _, v in reads[(A, p, READ_COMMITTED)]
    }
    assert len(inputs) == run.inputs
    outputs: Counter[str] = Counter()
    for p in range(PARTITIONS):
        for o, key, v in reads[(B, p, READ_COMMITTED)]:
            assert key is not None and key in inputs, f"{B}/{p}/{o}: output {key}={v} of no input"
            in_p, in_v = inputs[key]
            assert (in_p, transform(in_v)) == (p, v), f"{B}/{p}/{o}: {key}={v}, input {in_v}"
            outputs[key] += 1
    missing = sorted(set(inputs) - set(outputs))
    duplicated = sorted(k for k, c in outputs.items() if c > 1)
    assert not missing and not duplicated, f"missing {missing[:10]}, duplicated {duplicated[:10]}"
    # read_uncommitted may hold more (the aborted outputs of killed incarnations), each still
    # an output of an input; read_committed holds nothing it does not
    committed_b = {(p, o) for p in range(PARTITIONS) for o, _, _ in reads[(B, p, READ_COMMITTED)]}
    all_b = {(p, o) for p in range(PARTITIONS) for o, _, _ in reads[(B, p, READ_UNCOMMITTED)]}
    assert committed_b <= all_b, "read_committed returned a record read_uncommitted does not"
    for p in range(PARTITIONS):
        for o, key, v in reads[(B, p, READ_UNCOMMITTED)]:
            assert key in inputs and transform(inputs[key][1]) == v, f"{B}/{p}/{o}: {key}={v}"
    leftovers = f"B: {len(committed_b)} committed records, {len(all_b) - len(committed_b)} aborted"
    report.append(leftovers)
    print(leftovers)

    # -- the Jepsen checker over the loop's history ----------------------------------------------
    final = FinalRead(
        10_000_000,
        time.monotonic_ns(),
        time.monotonic_ns(),
        tuple(
            PartitionRead(
                topic,
                p,
                tuple((o, v) for o, _, v in reads[(topic, p, READ_COMMITTED)]),
                tuple((o, v) for o, _, v in reads[(topic, p, READ_UNCOMMITTED)]),
            )
            for topic in (A, B)
            for p in range(PARTITIONS)
        ),
        tuple(GroupOffset(GROUP, A, p, o) for p, o in sorted(committed.items())),
    )
    history = history_of(evs, run, final)
    history.save(tmp_path / "history.jsonl")
    result = check(history, [Transform(A, B, GROUP, lambda v: v + OUTPUT_BASE)])
    assert result.valid, result.render()
    assert len(run.kills) == kills


def _open_at_kill(evs: list[dict[str, Any]], pid: int) -> bool:
    """Whether the killed incarnation ``pid`` had a transaction without an end line."""
    ns = {e["n"] for e in evs if e["pid"] == pid and e["kind"] == "txn"}
    ended = {e["n"] for e in evs if e["pid"] == pid and e["kind"] == "end"}
    return bool(ns - ended)


def test_ctp_loop_killed_20_times(tmp_path: Path, seed: int, failure_report: list[str]) -> None:
    run_ctp(tmp_path, seed, failure_report, kills=20, n=3000, kill_brokers=False)


@pytest.mark.slow
def test_ctp_loop_killed_50_times_with_broker_kills(
    tmp_path: Path, seed: int, failure_report: list[str]
) -> None:
    run_ctp(tmp_path, seed, failure_report, kills=50, n=6000, kill_brokers=True)
