"""Transactional clients over HTTP against a :class:`~tests.chaos.harness.ChaosCluster`, recording
a Jepsen history (tests/jepsen/history.py) for :func:`tests.jepsen.checker.check`.

Theory of operation
-------------------
* :class:`TxnClient` is one transactional id's client: ``begin`` (``POST
  /v1/transactions/{id}``: a new session, fencing and aborting any older one), ``produce`` (a
  partition path, the session headers and ``Logbus-Sequence``; sequences restart at 0 per
  partition in every transaction, because every end bumps the epoch), ``end`` (commit or abort:
  the answer carries the session of the next transaction). Each call goes to a broker the caller
  names, or to a running one the seeded rng picks (any broker routes a call to the coordinator
  and forwards a produce to the leader).
* :class:`TxnWorkload` runs K writers and P pollers in threads:
  - a writer loops: a transaction writes 1-3 values (integers unique in the run) to each of 2-4
    partitions of the topics, then commits, or aborts ~20 % of the time. The rules that keep the
    history sound (tests/jepsen/checker.py's docstring): a produce is retried with the *same*
    batch and sequence while the answer is retriable or lost (the partition deduplicates it) up
    to :data:`OP_RETRY_S`; if it still has no answer, or a definite refusal, or (half the time)
    at once when an answer was lost, the transaction is given up: recorded with no end (never
    committed: only a commit request commits) and the writer begins a new session, which
    fences the old epoch and aborts what it wrote. A commit
    is retried with the *same* session until answered (a retry of a decided end gets the same
    answer); one never answered, or refused after an attempt that was lost, is recorded
    ``info``; then a new session. Every transaction, aborted or given up, is recorded.
  - a poller reads every partition in turn with ``isolation=read_committed`` from a running
    broker the rng picks (a follower serves below its high watermark, the leader the rest), one
    session per poller continuing from each answer's ``next_offset``; each non-empty answer is a
    Poll.
* The nemesis (:class:`Nemesis`) SIGKILLs and restarts partition leaders and transaction
  coordinators (the leader of ``__transaction_state`` partition ``crc32(id) % N`` of a writer's
  id) and SIGSTOPs/SIGCONTs brokers, one fault at a time, waiting for every partition's ISR to be
  full again before the next (RF 3, min.insync.replicas 2: a second fault before the first
  healed would only stall writes).
* At the end: writers stop after their current transaction (none is left open: a writer ends
  with a committed/aborted transaction or a fresh session), the nemesis heals, the test waits
  until no transaction is ongoing or preparing and every replica converged, pollers catch up,
  then a :class:`~tests.jepsen.history.FinalRead` reads every partition whole at both isolation
  levels from its leader.

Everything waits by polling a condition with a generous bound (:func:`eventually`): the brokers
share 2 cores with other work.
"""

from __future__ import annotations

import contextlib
import itertools
import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Final

import httpx

from cluster.txn_state import TXN_STATE_TOPIC, txn_state_partition
from tests.chaos.harness import ROUTE_DIRECT, ChaosCluster, eventually
from tests.jepsen.answer import Answer
from tests.jepsen.checker import Report, check
from tests.jepsen.history import (
    READ_COMMITTED,
    READ_UNCOMMITTED,
    FinalRead,
    History,
    Op,
    Outcome,
    PartitionRead,
    Poll,
    Record,
    Txn,
    TxnEnd,
    Write,
)

TXN: Final = "/v1/transactions"
CLIENT_TIMEOUT_S: Final = 15.0  # > the coordinator's own retries of a moving coordinator (10 s)
OP_RETRY_S: Final = 30.0  # a produce or an end is retried this long, then given up
# A writer's new session may wait this long: past one fault's healing (the nemesis' bound is
# WAIT_S, 60 s; an overloaded SQLite store has left every partition leaderless for ~60 s).
BEGIN_WAIT_S: Final = 120.0
BACKOFF_S: Final = 0.05
FINAL_PROCESS: Final = 10_000
GIVE_UP_LOST: Final = 0.5  # how often a writer gives a transaction up at a produce's lost answer


def call(http: httpx.Client, method: str, url: str, **kw: Any) -> Answer:
    try:
        r = http.request(method, url, **kw)
    except httpx.HTTPError:
        return Answer(None)
    body: Any = None
    with contextlib.suppress(ValueError):
        body = r.json()
    return Answer(r.status_code, body)


def coordinator_of(cluster: ChaosCluster, transactional_id: str) -> int:
    """The broker the store names leader of the id's ``__transaction_state`` partition."""
    n = cluster.store.topic(TXN_STATE_TOPIC).partitions
    return cluster.leader(TXN_STATE_TOPIC, txn_state_partition(transactional_id, n))


class TxnClient:
    """One transactional id's calls (module docstring); ``session`` is (producer id, epoch)."""

    def __init__(
        self,
        cluster: ChaosCluster,
        transactional_id: str,
        rng: random.Random | None = None,
        timeout_s: float = CLIENT_TIMEOUT_S,
    ) -> None:
        self.cluster = cluster
        self.id = transactional_id
        self.rng = rng or random.Random(0)
        self.http = httpx.Client(timeout=timeout_s)
        self.session: tuple[int, int] | None = None
        self.answers: list[tuple[str, Answer]] = []  # every call's answer, for reports

    def close(self) -> None:
        self.http.close()

    def any_broker(self) -> int:
        running = [i for i in sorted(self.cluster.brokers) if self.cluster.running(i)]
        return self.rng.choice(running or sorted(self.cluster.brokers))

    def url(self, broker: int | str | None) -> str:
        if isinstance(broker, str):
            return broker
        return self.cluster.url(self.any_broker() if broker is None else broker)

    def _note(self, what: str, a: Answer) -> Answer:
        self.answers.append((what, a))
        return a

    def begin(self, broker: int | str | None = None, **body: Any) -> Answer:
        a = call(self.http, "POST", f"{self.url(broker)}{TXN}/{self.id}", json=body)
        if a.status == 201:
            self.session = (int(a.body["producer_id"]), int(a.body["producer_epoch"]))
        return self._note("begin", a)

    def begin_until_ok(self, deadline_s: float = OP_RETRY_S, **body: Any) -> tuple[int, int]:
        """A new session, retried on any broker until it is granted."""

        def attempt() -> tuple[int, int] | None:
            a = self.begin(**body)
            if a.status == 201:
                assert self.session is not None
                return self.session
            assert a.retriable, f"begin {self.id}: {a.status} {a.body}"
            return None

        return eventually(attempt, f"a session of {self.id}", deadline_s)

    def produce(
        self,
        topic: str,
        partition: int,
        values: list[int],
        seq: int = 0,
        broker: int | str | None = None,
        session: tuple[int, int] | None = None,
    ) -> Answer:
        pid, epoch = session or self.session or (0, 0)
        a = call(
            self.http,
            "POST",
            f"{self.url(broker)}/v1/topics/{topic}/partitions/{partition}/records",
            params={"acks": "all"},
            json={"records": [{"value": v} for v in values]},
            headers={
                "Logbus-Transactional-Id": self.id,
                "Logbus-Producer-Id": str(pid),
                "Logbus-Producer-Epoch": str(epoch),
                "Logbus-Sequence": str(seq),
            },
        )
        return self._note("produce", a)

    def end(
        self,
        commit: bool,
        broker: int | str | None = None,
        session: tuple[int, int] | None = None,
    ) -> Answer:
        pid, epoch = session or self.session or (0, 0)
        how = "commit" if commit else "abort"
        a = call(
            self.http,
            "POST",
            f"{self.url(broker)}{TXN}/{self.id}/{how}",
            json={"producer_id": pid, "producer_epoch": epoch},
        )
        if a.ok and (session is None or session == self.session):
            self.session = (int(a.body["producer_id"]), int(a.body["producer_epoch"]))
        return self._note(how, a)


def read_records(
    cluster: ChaosCluster, topic: str, partition: int, isolation: str, end: int
) -> list[dict[str, Any]]:
    """Every record (as the JSON fetch renders it) of the partition below ``end``, from its
    leader."""
    out: list[dict[str, Any]] = []
    position = 0
    with httpx.Client(timeout=CLIENT_TIMEOUT_S) as http:
        while position < end:

            def page(at: int = position) -> dict[str, Any] | None:
                leader = cluster.leader(topic, partition)
                if leader == -1:
                    return None
                r = http.get(
                    cluster.url(leader) + f"/v1/topics/{topic}/partitions/{partition}/records",
                    params={"offset": at, "max_records": 1000, "isolation": isolation},
                    headers=ROUTE_DIRECT,
                )
                if r.status_code != 200:
                    return None
                doc: dict[str, Any] = r.json()
                return doc

            doc = eventually(page, f"{topic}-{partition} at {position} ({isolation})")
            out.extend(doc["records"])
            nxt = int(doc["next_offset"])
            if nxt <= position:
                break
            position = nxt
    return [r for r in out if int(r["offset"]) < end]


def read_partition(
    cluster: ChaosCluster, topic: str, partition: int, isolation: str, end: int
) -> list[tuple[int, int]]:
    """(offset, value) of every record of the partition below ``end``, from its leader."""
    records = read_records(cluster, topic, partition, isolation, end)
    return [(int(r["offset"]), int(r["value"])) for r in records]


def open_transactions(cluster: ChaosCluster, broker: int) -> list[dict[str, Any]] | None:
    """Transactions ongoing or preparing, as broker ``broker`` lists them; None if some
    coordinator could not answer."""
    r = httpx.get(
        cluster.url(broker) + TXN,
        params={"state": ["ongoing", "prepare_commit", "prepare_abort"]},
        timeout=CLIENT_TIMEOUT_S,
    )
    if r.status_code != 200 or r.json()["unavailable"]:
        return None
    listed: list[dict[str, Any]] = r.json()["transactions"]
    return listed


@dataclass
class Stats:
    committed: int = 0
    aborted: int = 0
    given_up: int = 0
    uncertain_commits: int = 0
    polls: int = 0
    polled_records: int = 0
    unexpected: list[str] = field(default_factory=list)  # 500s and refusals no client expects

    def line(self) -> str:
        return (
            f"committed {self.committed}, aborted {self.aborted}, given up {self.given_up}, "
            f"commit unknown {self.uncertain_commits}, polls {self.polls} "
            f"({self.polled_records} records)"
        )


class TxnWorkload:
    """K transactional writers and P read_committed pollers (module docstring)."""

    def __init__(
        self,
        cluster: ChaosCluster,
        topics: list[str],
        partitions: int,
        *,
        writers: int = 3,
        pollers: int = 2,
        abort_ratio: float = 0.2,
        id_prefix: str = "jepsen",
    ) -> None:
        self.cluster = cluster
        self.topics = topics
        self.partitions = partitions
        self.tps = [(t, p) for t in topics for p in range(partitions)]
        self.ids = [f"{id_prefix}-{k}" for k in range(writers)]
        self.pollers = pollers
        self.abort_ratio = abort_ratio
        self.stats = Stats()
        self._ops: list[Op] = []
        self._lock = threading.Lock()
        self._values = itertools.count(1)
        self._stop_writers = threading.Event()
        self._stop_pollers = threading.Event()
        self._threads: list[threading.Thread] = []
        self._positions: dict[int, dict[tuple[str, int], int]] = {}

    # -- running ---------------------------------------------------------------------------------

    def start(self) -> None:
        for k, txn_id in enumerate(self.ids):
            self._spawn(f"writer-{k}", self._write, k, txn_id)
        for j in range(self.pollers):
            self._spawn(f"poller-{j}", self._poll, j)

    def _spawn(self, name: str, target: Callable[..., None], *args: object) -> None:
        def run() -> None:
            try:
                target(*args)
            except BaseException as e:  # a client that dies is a failure the test reports
                self._unexpected(f"{name} died: {e!r}")
                raise

        t = threading.Thread(target=run, name=name, daemon=True)
        t.start()
        self._threads.append(t)

    def _record(self, op: Op) -> None:
        with self._lock:
            self._ops.append(op)

    def _unexpected(self, what: str) -> None:
        with self._lock:
            self.stats.unexpected.append(what)

    def committed_count(self) -> int:
        with self._lock:
            return self.stats.committed

    def stop_writers(self) -> None:
        self._stop_writers.set()
        for t in self._threads:
            if t.name.startswith("writer"):
                t.join(4 * OP_RETRY_S)
                assert not t.is_alive(), f"{t.name} hangs"

    def stop_pollers(self) -> None:
        self._stop_pollers.set()
        for t in self._threads:
            t.join(4 * CLIENT_TIMEOUT_S)
            assert not t.is_alive(), f"{t.name} hangs"

    # -- writers ---------------------------------------------------------------------------------

    def _write(self, k: int, txn_id: str) -> None:
        rng = random.Random(self.cluster.seed * 1000 + k)
        client = TxnClient(self.cluster, txn_id, rng)
        try:
            client.begin_until_ok(BEGIN_WAIT_S)
            while not self._stop_writers.is_set():
                self._one_transaction(k, client, rng)
        finally:
            client.close()

    def _one_transaction(self, k: int, client: TxnClient, rng: random.Random) -> None:
        assert client.session is not None
        session = client.session
        invoke = time.monotonic_ns()
        writes: list[Write] = []
        given_up = False
        for topic, partition in rng.sample(self.tps, rng.randint(2, min(4, len(self.tps)))):
            values = [next(self._values) for _ in range(rng.randint(1, 3))]
            offsets = self._produce(client, topic, partition, values, session, rng)
            if offsets is None:
                writes.extend(Write(topic, partition, v) for v in values)
                given_up = True
                break
            writes.extend(
                Write(topic, partition, v, o) for v, o in zip(values, offsets, strict=True)
            )
        if given_up:  # never sent an end: the new session aborts it
            self._record(
                Txn(k, invoke, time.monotonic_ns(), client.id, tuple(writes), None, (), *session)
            )
            with self._lock:
                self.stats.given_up += 1
            client.begin_until_ok(BEGIN_WAIT_S)
            return
        commit = rng.random() >= self.abort_ratio
        end_invoke = time.monotonic_ns()
        outcome = self._end(client, commit, session)
        done = time.monotonic_ns()
        end = TxnEnd("commit" if commit else "abort", end_invoke, done, outcome)
        self._record(Txn(k, invoke, done, client.id, tuple(writes), end, (), *session))
        with self._lock:
            if outcome == "ok" and commit:
                self.stats.committed += 1
            elif not commit:
                self.stats.aborted += 1
            elif outcome == "info":
                self.stats.uncertain_commits += 1
        if outcome != "ok":
            client.begin_until_ok(BEGIN_WAIT_S)

    def _produce(
        self,
        client: TxnClient,
        topic: str,
        partition: int,
        values: list[int],
        session: tuple[int, int],
        rng: random.Random,
    ) -> list[int] | None:
        """The offsets once acknowledged; None when given up: no answer within
        :data:`OP_RETRY_S`, refused, or (:data:`GIVE_UP_LOST`) at once after an answer that
        was lost, as a client with a short delivery timeout does (the held or late produce then
        meets the next session's epoch)."""
        deadline = time.monotonic() + OP_RETRY_S
        while time.monotonic() < deadline:
            a = client.produce(topic, partition, values, 0, session=session)
            if a.ok:
                return [int(o["offset"]) for o in a.body["offsets"]]
            if a.lost and rng.random() < GIVE_UP_LOST:
                return None
            if a.internal_error:
                self._unexpected(f"produce {client.id} {topic}-{partition}: {a.status} {a.body}")
            if not a.retriable:
                if a.code not in ("PRODUCER_FENCED", "INVALID_PRODUCER_EPOCH"):
                    self._unexpected(
                        f"produce {client.id} {topic}-{partition}: {a.status} {a.body}"
                    )
                return None
            time.sleep(BACKOFF_S)
        return None

    def _end(self, client: TxnClient, commit: bool, session: tuple[int, int]) -> Outcome:
        """``ok`` (the end was answered), ``fail`` (definitely refused) or ``info``."""
        deadline = time.monotonic() + OP_RETRY_S
        lost = False
        while time.monotonic() < deadline:
            a = client.end(commit, session=session)
            if a.ok:
                return "ok"
            if a.internal_error:
                self._unexpected(f"end {client.id}: {a.status} {a.body}")
            if not a.retriable:
                if a.code != "PRODUCER_FENCED" or not lost:
                    self._unexpected(f"end {client.id} (lost before: {lost}): {a.status} {a.body}")
                return "info" if lost else "fail"
            lost = lost or a.lost
            time.sleep(BACKOFF_S)
        return "info"

    # -- pollers ---------------------------------------------------------------------------------

    def _poll(self, j: int) -> None:
        rng = random.Random(self.cluster.seed * 1000 + 500 + j)
        positions = dict.fromkeys(self.tps, 0)
        self._positions[j] = positions
        with httpx.Client(timeout=CLIENT_TIMEOUT_S) as http:
            while not self._stop_pollers.is_set():
                for topic, partition in self.tps:
                    self._poll_once(j, http, rng, topic, partition, positions)

    def _poll_once(
        self,
        j: int,
        http: httpx.Client,
        rng: random.Random,
        topic: str,
        partition: int,
        positions: dict[tuple[str, int], int],
    ) -> None:
        running = [i for i in sorted(self.cluster.brokers) if self.cluster.running(i)]
        if not running:
            return
        broker = rng.choice(running)
        invoke = time.monotonic_ns()
        a = call(
            http,
            "GET",
            self.cluster.url(broker) + f"/v1/topics/{topic}/partitions/{partition}/records",
            params={
                "offset": positions[(topic, partition)],
                "max_records": 200,
                "isolation": READ_COMMITTED,
                "wait_ms": 20,
            },
        )
        complete = time.monotonic_ns()
        if a.internal_error:
            self._unexpected(f"poll {topic}-{partition} on {broker}: {a.status} {a.body}")
        if not a.ok:
            return
        records = tuple(
            Record(topic, partition, int(r["offset"]), int(r["value"])) for r in a.body["records"]
        )
        positions[(topic, partition)] = max(
            positions[(topic, partition)], int(a.body["next_offset"])
        )
        if records:
            name = f"poller-{j}"
            self._record(
                Poll(1000 + j, invoke, complete, "ok", name, name, READ_COMMITTED, records)
            )
            with self._lock:
                self.stats.polls += 1
                self.stats.polled_records += len(records)

    # -- the end ---------------------------------------------------------------------------------

    def settle(self) -> dict[tuple[str, int], int]:
        """Every fault healed: wait until no transaction is open or preparing, every replica
        converged and the pollers read up to the end; the high watermarks."""
        self.cluster.heal_all()
        for i in self.cluster.brokers:
            self.cluster.resume(i)
        eventually(lambda: open_transactions(self.cluster, 1) == [] or None, "no transaction open")
        hws: dict[tuple[str, int], int] = {}
        for topic in self.topics:
            for p, hw in self.cluster.wait_converged(topic).items():
                hws[(topic, p)] = hw

        def caught_up() -> bool | None:
            return (
                all(
                    pos.get(tp, 0) >= hw
                    for pos in self._positions.values()
                    for tp, hw in hws.items()
                )
                or None
            )

        eventually(caught_up, "the pollers caught up")
        return hws

    def final_read(self, hws: dict[tuple[str, int], int]) -> None:
        invoke = time.monotonic_ns()
        parts = tuple(
            PartitionRead(
                topic,
                p,
                tuple(read_partition(self.cluster, topic, p, READ_COMMITTED, hw)),
                tuple(read_partition(self.cluster, topic, p, READ_UNCOMMITTED, hw)),
            )
            for (topic, p), hw in sorted(hws.items())
        )
        self._record(FinalRead(FINAL_PROCESS, invoke, time.monotonic_ns(), parts))

    def history(self) -> History:
        with self._lock:
            return History(tuple(self._ops))

    def check(self) -> Report:
        return check(self.history())


# -- the nemesis ---------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Fault:
    kind: str  # kill-leader, kill-coordinator, pause
    broker: int
    what: str
    at_s: float
    healed_s: float = -1.0  # when every ISR was full again


class Nemesis:
    """One fault at a time, chosen by the seeded rng: SIGKILL (then restart) a partition's leader
    or a writer's transaction coordinator, or SIGSTOP a broker for a while; then wait until every
    partition (the topics' and ``__transaction_state``'s) has a leader and a full ISR again."""

    KINDS: Final = ("kill-leader", "kill-coordinator", "pause")

    def __init__(
        self,
        cluster: ChaosCluster,
        workload: TxnWorkload,
        *,
        interval_s: tuple[float, float] = (0.5, 2.0),
        down_s: tuple[float, float] = (0.2, 1.5),
    ) -> None:
        self.cluster = cluster
        self.workload = workload
        self.interval_s = interval_s
        self.down_s = down_s
        self.rng = random.Random(cluster.seed ^ 0x5EED)
        self.faults: list[Fault] = []
        self._kinds: list[str] = []
        self.error: BaseException | None = None
        self._stop = threading.Event()
        self._started = time.monotonic()
        self._thread = threading.Thread(target=self._run, name="nemesis", daemon=True)

    def __enter__(self) -> Nemesis:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(300)
        assert not self._thread.is_alive(), "the nemesis hangs"

    def counts(self) -> dict[str, int]:
        return {k: sum(f.kind == k for f in self.faults) for k in self.KINDS}

    def _run(self) -> None:
        try:
            # the schedule is the nemesis' own: between faults it waits a random interval
            while not self._stop.wait(self.rng.uniform(*self.interval_s)):
                self._one()
        except BaseException as e:  # re-raised by the test (check_error)
            self.error = e

    def check_error(self) -> None:
        if self.error is not None:
            raise AssertionError(f"the nemesis failed: {self.error!r}") from self.error

    def _one(self) -> None:
        if not self._kinds:  # every kind once per round, in a seeded order
            self._kinds = self.rng.sample(self.KINDS, len(self.KINDS))
        kind = self._kinds.pop()
        if kind == "kill-leader":
            topic, p = self.rng.choice(self.workload.tps)
            broker, what = self.cluster.leader(topic, p), f"leader of {topic}-{p}"
        elif kind == "kill-coordinator":
            txn_id = self.rng.choice(self.workload.ids)
            broker, what = coordinator_of(self.cluster, txn_id), f"coordinator of {txn_id}"
        else:
            broker = self.rng.choice(sorted(self.cluster.brokers))
            what = f"broker {broker}"
        if broker == -1:
            return
        at = time.monotonic() - self._started
        down = self.rng.uniform(*self.down_s)
        if kind == "pause":
            self.cluster.pause(broker)
            self._stop.wait(down)
            self.cluster.resume(broker)
        else:
            self.cluster.kill(broker)
            self._stop.wait(down)
            self.cluster.restart(broker)
        for topic in [*self.workload.topics, TXN_STATE_TOPIC]:
            self.cluster.wait_healthy(topic)
        self.faults.append(Fault(kind, broker, what, at, time.monotonic() - self._started))

    def report(self) -> str:
        return "faults: " + ", ".join(
            f"{f.at_s:.1f}-{f.healed_s:.1f}s {f.kind} {f.what} (broker {f.broker})"
            for f in self.faults
        )
