"""A cluster of real broker processes on loopback for the chaos tests, and a chaos client.

Theory of operation
-------------------
* :class:`ChaosCluster` starts N brokers (``logbus serve`` child processes, api.process) that
  share one metadata store: a SQLite file in the test's tmp dir, or a database on the test
  run's throwaway PostgreSQL server (tests/pg.py). Leases are small (``CLUSTER_ENV``: session
  timeout 2 s) so a dead broker is fenced within seconds. Each broker can be SIGKILLed,
  restarted on the same port and data dir, paused (SIGSTOP) and resumed (SIGCONT). Brokers are
  forked from a zygote that imported their modules once (tests/zygote.py: a fresh
  interpreter's imports were most of a restart, 2 s idle and 10-24 s under load); the argv,
  environment and log are those of ``logbus serve``. ``zygote=False`` runs ``python -m api.cli``.
* Optional link proxies (tests/chaos/proxy.py) the test can cut or stall:
  - replication: broker *i* binds its h2c replication listener on a fixed port and advertises
    the port of a proxy in front of it (``LOGBUS_REPLICATION_ADVERTISED_PORT``), so every
    follower fetching from *i* goes through that proxy: cutting it cuts *i* off from its
    followers (followers only ever fetch; a leader never calls them).
  - database (PostgreSQL only): broker *i*'s metadata URL points at a proxy in front of the
    server, so cutting it cuts *i* alone off from the database.
* Leadership is read from the store (:class:`cluster.metadata.MetadataStore`, the truth) or
  from what a broker says (``GET /v1/topics/{t}/partitions``: its view of the rows).
* :class:`ChaosClient` runs idempotent producers (one producer session per writer and
  partition, ``acks=all``) and one consumer per partition in threads. A producer sends a batch
  of values no one else sends and retries the *same* batch with the *same* sequence after a
  timeout, a connection error, a retriable answer or 421, so a batch the broker wrote but could
  not confirm is deduplicated on the retry. Two kinds of writer:
  - *direct* writers route themselves: ``Logbus-Route: direct`` to the leader they believe in
    (the 421's leader hint, else the store), so brokers answer 421 rather than forward;
  - *any-broker* writers (``any_broker_writers_per_partition``) send each attempt, without the
    route header, to a running broker the seeded rng picks, so two times in three the broker
    forwards it to the leader (cluster/forwarding.py) — curl behind a load balancer. A 500, or
    a 5xx that carries no error code, is a bug and goes into ``stats.unexpected``.
  Every send's final outcome (ok with offsets / info when it never got an answer), every poll
  and the final read of every partition go into tests/chaos/checker.py's history, and every
  HTTP attempt (broker, route, start, end, status) into ``attempts`` for scenario assertions.
  Consumers always read from the leader with ``Logbus-Route: direct``.
* :func:`replica_bytes` reads each stopped broker's partition files with core_log's reader,
  to compare replicas byte for byte up to the high watermark.

Everything is polled with generous bounds (:func:`eventually`), never slept on: the brokers
share 2 cores with other work, so how long a step takes varies tenfold.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import itertools
import json
import os
import random
import signal
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final, TypeVar
from urllib.parse import urlsplit, urlunsplit

import httpx

from cluster.metadata import MetadataStore, PartitionMeta
from core_log.clock import SystemClock
from core_log.config import LogConfig
from core_log.errors import LogbusError
from core_log.handles import HandleCache
from core_log.log import PartitionLog
from tests.chaos.checker import History, HistoryLog, Op, Poll, Record, Send, check
from tests.chaos.proxy import ThreadedLinkProxy
from tests.pause import pause
from tests.server import BrokerProcess, free_port

T = TypeVar("T")

# Small leases so a killed broker is fenced within seconds (defaults: 2 s / 9 s / 30 s), and a
# request timeout well under the client's so an acks=all write that cannot commit is answered.
CLUSTER_ENV: Final[dict[str, str]] = {
    "LOGBUS_BROKER_HEARTBEAT_INTERVAL_MS": "200",
    "LOGBUS_BROKER_SESSION_TIMEOUT_MS": "2000",
    "LOGBUS_REPLICA_LAG_TIME_MAX_MS": "3000",
    "LOGBUS_METADATA_REFRESH_INTERVAL_MS": "50",
    "LOGBUS_REPLICA_FETCH_WAIT_MAX_MS": "200",
    "LOGBUS_REQUEST_TIMEOUT_MS": "5000",
    "LOGBUS_REPLICA_SOCKET_TIMEOUT_MS": "5000",
}
SESSION_TIMEOUT_S: Final = 2.0
WAIT_S: Final = 60.0  # a bound for what a healthy cluster reaches in well under 10 s
CLIENT_TIMEOUT_S: Final = 10.0  # > the request timeout (5 s): acks=all is answered first
ROUTE_DIRECT: Final = {"Logbus-Route": "direct"}
RETRY_BACKOFF_S: Final = 0.05
DRAIN_S: Final = 60.0  # how long a producer keeps retrying its last batch after stop()


class ChaosBroker(BrokerProcess):
    """A broker of the chaos cluster: forked from the test run's zygote (tests/zygote.py) unless
    the cluster was made with ``zygote=False``."""


def eventually(probe: Callable[[], T | None], what: str, timeout_s: float = WAIT_S) -> T:
    """Poll ``probe`` until it returns a value (not None): the cluster's state lives in other
    processes, so there is no event to wait on; the bound only fails a hang."""
    deadline = time.monotonic() + timeout_s
    last: BaseException | None = None
    while True:
        try:
            value = probe()
        except (httpx.HTTPError, LogbusError, OSError) as e:
            value, last = None, e
        if value is not None:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s} s waiting for {what} ({last!r})")
        time.sleep(0.05)


def chaos_seed() -> int:
    """``LOGBUS_CHAOS_SEED`` to replay a run's choices, else a fresh one (printed on failure)."""
    raw = os.environ.get("LOGBUS_CHAOS_SEED")
    return int(raw) if raw else random.SystemRandom().randrange(2**32)


def _with_port(url: str, port: int) -> str:
    parts = urlsplit(url)
    host = parts.hostname or "127.0.0.1"
    userinfo = parts.netloc.rsplit("@", 1)[0] + "@" if "@" in parts.netloc else ""
    return urlunsplit(parts._replace(netloc=f"{userinfo}{host}:{port}"))


class ChaosCluster:
    """N brokers sharing ``metadata_url``; see the module docstring."""

    def __init__(
        self,
        tmp_path: Path,
        metadata_url: str,
        *,
        brokers: int = 3,
        seed: int = 0,
        replication_proxies: bool = False,
        db_proxies: bool = False,
        env: dict[str, str] | None = None,
        zygote: bool = True,
    ) -> None:
        self.tmp_path = tmp_path
        self.metadata_url = metadata_url
        self.seed = seed
        self.rng = random.Random(seed)
        self.is_postgres = metadata_url.startswith("postgresql")
        self.repl_proxies: dict[int, ThreadedLinkProxy] = {}
        self.db_proxies: dict[int, ThreadedLinkProxy] = {}
        self.brokers: dict[int, ChaosBroker] = {}
        self._paused: set[int] = set()
        self.clients: list[ChaosClient] = []
        self._store: MetadataStore | None = None
        self._store_lock = threading.Lock()
        base_env = {**CLUSTER_ENV, **(env or {})}
        for i in range(1, brokers + 1):
            url = metadata_url
            broker_env = dict(base_env)
            if db_proxies and self.is_postgres:
                target = urlsplit(metadata_url)
                proxy = ThreadedLinkProxy(target.hostname or "127.0.0.1", target.port or 5432)
                proxy.start()
                self.db_proxies[i] = proxy
                url = _with_port(metadata_url, proxy.port)
            if replication_proxies:
                bound = free_port()
                proxy = ThreadedLinkProxy("127.0.0.1", bound)
                proxy.start()
                self.repl_proxies[i] = proxy
                broker_env["LOGBUS_REPLICATION_PORT"] = str(bound)
                broker_env["LOGBUS_REPLICATION_ADVERTISED_PORT"] = str(proxy.port)
            self.brokers[i] = ChaosBroker(
                tmp_path / f"broker-{i}",
                None,
                "--broker-id",
                str(i),
                "--metadata-url",
                url,
                env=broker_env,
                fork=zygote,
            )

    # -- lifecycle -------------------------------------------------------------------------------

    def start(self) -> ChaosCluster:
        """Start every broker, in parallel (a start is mostly the interpreter's imports)."""
        errors: list[BaseException] = []

        def start_one(b: BrokerProcess) -> None:
            try:
                b.start()
            except BaseException as e:  # re-raised below, in the test's thread
                errors.append(e)

        threads = [threading.Thread(target=start_one, args=(b,)) for b in self.brokers.values()]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        if errors:
            raise errors[0]
        return self

    def close(self) -> None:
        for c in self.clients:
            c.close()
        for i in list(self._paused):
            self.resume(i)
        for b in self.brokers.values():
            b.kill()
        for p in [*self.repl_proxies.values(), *self.db_proxies.values()]:
            p.close()
        if self._store is not None:
            self._store.close()

    def kill(self, i: int) -> None:
        """SIGKILL broker ``i`` (no flush, no clean-shutdown marker)."""
        self._paused.discard(i)
        self.brokers[i].kill()

    def restart(self, i: int) -> None:
        """Start a killed or stopped broker again on its port and data dir."""
        self.brokers[i].start()

    def stop_all(self) -> None:
        """Graceful stop (SIGTERM) of every broker, for reading their files afterwards."""
        for i in list(self._paused):
            self.resume(i)
        for b in self.brokers.values():
            b.stop()

    def pause(self, i: int) -> None:
        """SIGSTOP broker ``i``, outside its SQLite write transactions (:mod:`tests.pause`)."""
        proc = self.brokers[i].proc
        assert proc is not None, f"broker {i} is not running"
        pause(proc.pid, self.metadata_url)
        self._paused.add(i)

    def resume(self, i: int) -> None:
        proc = self.brokers[i].proc
        if proc is not None and i in self._paused:
            os.kill(proc.pid, signal.SIGCONT)
        self._paused.discard(i)

    def running(self, i: int) -> bool:
        return self.brokers[i].proc is not None and i not in self._paused

    def url(self, i: int) -> str:
        return self.brokers[i].url

    def log_paths(self) -> list[Path]:
        return [b.log_path for b in self.brokers.values()]

    def failure_report(self) -> str:
        lines = [f"chaos seed: {self.seed} (replay: LOGBUS_CHAOS_SEED={self.seed})"]
        lines += [f"broker {i} log: {b.log_path}" for i, b in self.brokers.items()]
        return "\n".join(lines)

    # -- metadata --------------------------------------------------------------------------------

    @property
    def store(self) -> MetadataStore:
        with self._store_lock:
            if self._store is None:
                self._store = MetadataStore(self.metadata_url)
            return self._store

    def row(self, topic: str, partition: int) -> PartitionMeta:
        return self.store.topic(topic).assignments[partition]

    def rows(self, topic: str) -> list[PartitionMeta]:
        return list(self.store.topic(topic).assignments)

    def leader(self, topic: str, partition: int) -> int:
        """The leader the store names (-1: none)."""
        return self.row(topic, partition).leader

    def describe(self, i: int, topic: str, timeout: float = 5.0) -> list[dict[str, Any]]:
        """Broker ``i``'s view of the topic's partitions (its rows, its replica's offsets)."""
        r = httpx.get(f"{self.url(i)}/v1/topics/{topic}/partitions", timeout=timeout)
        r.raise_for_status()
        parts: list[dict[str, Any]] = r.json()
        return parts

    def create_topic(
        self, name: str, partitions: int, replication_factor: int = 3, min_isr: int = 2
    ) -> None:
        def create() -> bool | None:
            r = httpx.post(
                f"{self.url(1)}/v1/topics",
                json={
                    "name": name,
                    "partitions": partitions,
                    "replication_factor": replication_factor,
                    "configs": {"min.insync.replicas": str(min_isr)},
                },
                timeout=10,
            )
            if r.status_code in (201, 409):
                return True
            return None

        eventually(create, f"topic {name} created")
        self.wait_healthy(name)

    def wait_healthy(self, topic: str, timeout_s: float = WAIT_S) -> list[PartitionMeta]:
        """Every partition has a leader and a full ISR in the store, and every running broker
        applied those rows (its describe names the same leader and epoch)."""

        def probe() -> list[PartitionMeta] | None:
            rows = self.rows(topic)
            if any(r.leader == -1 or sorted(r.isr) != sorted(r.replicas) for r in rows):
                return None
            for i in self.brokers:
                if not self.running(i):
                    continue
                seen = {
                    (p["partition"], p["leader"], p["leader_epoch"])
                    for p in self.describe(i, topic)
                }
                if seen != {(r.partition, r.leader, r.leader_epoch) for r in rows}:
                    return None
            return rows

        return eventually(probe, f"{topic}: a leader and a full ISR everywhere", timeout_s)

    def wait_converged(self, topic: str, timeout_s: float = WAIT_S) -> dict[int, int]:
        """:meth:`wait_healthy`, then every replica's log end equals its leader's, and the
        leader's high watermark reached it: the partitions' high watermarks."""
        self.wait_healthy(topic, timeout_s)

        def probe() -> dict[int, int] | None:
            rows = self.rows(topic)
            views = {i: self.describe(i, topic) for i in self.brokers}
            hws: dict[int, int] = {}
            for r in rows:
                lead = views[r.leader][r.partition]
                if lead["high_watermark"] != lead["log_end_offset"]:
                    return None
                for i in r.replicas:
                    if views[i][r.partition]["log_end_offset"] != lead["log_end_offset"]:
                        return None
                hws[r.partition] = lead["high_watermark"]
            return hws

        return eventually(probe, f"{topic}: replicas converged", timeout_s)

    # -- link proxies ----------------------------------------------------------------------------

    def replication_link(self, i: int) -> ThreadedLinkProxy:
        """The proxy every follower of broker ``i`` fetches through."""
        return self.repl_proxies[i]

    def db_link(self, i: int) -> ThreadedLinkProxy:
        """The proxy between broker ``i`` and PostgreSQL."""
        return self.db_proxies[i]

    def heal_all(self) -> None:
        for p in [*self.repl_proxies.values(), *self.db_proxies.values()]:
            p.heal()


@contextlib.contextmanager
def running_cluster(cluster: ChaosCluster) -> Iterator[ChaosCluster]:
    try:
        yield cluster.start()
    finally:
        cluster.close()


# -- the chaos client ------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Attempt:
    """One HTTP produce attempt: to which broker, when (monotonic s), and its answer."""

    broker: int
    partition: int
    started: float
    ended: float
    status: int | None  # None: no answer (timeout, connection error)
    code: str | None = None
    direct: bool = True  # False: sent without the route header to any broker


@dataclass
class ClientStats:
    acked: int = 0
    acked_by_partition: dict[int, int] = field(default_factory=dict)
    indeterminate: int = 0
    unexpected: list[str] = field(default_factory=list)  # non-retriable answers: bugs


class _Recorder:
    def __init__(self, log: HistoryLog) -> None:
        self.log = log
        self.ops: list[Op] = []
        self.lock = threading.Lock()

    def record(self, op: Op) -> None:
        with self.lock:
            self.ops.append(op)
        self.log.record(op)


class ChaosClient:
    """Idempotent producers and consumers against a :class:`ChaosCluster` (module docstring)."""

    def __init__(
        self,
        cluster: ChaosCluster,
        topic: str,
        partitions: int,
        *,
        writers_per_partition: int = 1,
        any_broker_writers_per_partition: int = 0,
        batch_records: tuple[int, int] = (1, 5),
        client_timeout_s: float = CLIENT_TIMEOUT_S,
    ) -> None:
        self.cluster = cluster
        self.topic = topic
        self.partitions = partitions
        self.writers_per_partition = writers_per_partition
        self.any_broker_writers_per_partition = any_broker_writers_per_partition
        self.batch_records = batch_records
        self.client_timeout_s = client_timeout_s
        self.history_path = cluster.tmp_path / "history.jsonl"
        self._log = HistoryLog(self.history_path)
        self._rec = _Recorder(self._log)
        self.attempts: list[Attempt] = []
        self._attempts_lock = threading.Lock()
        self.stats = ClientStats()
        self._stats_lock = threading.Lock()
        self._stop = threading.Event()
        self._stop_consumers = threading.Event()
        self._threads: list[threading.Thread] = []
        self._leaders: dict[int, int] = {}
        self._final: dict[int, list[Record]] = {}
        self._rng_lock = threading.Lock()
        self._writer_ids = itertools.count()
        self._closed = False
        cluster.clients.append(self)  # closed with the cluster, whatever the test did

    # -- running ---------------------------------------------------------------------------------

    def start(self, consumers: bool = True) -> None:
        for p in range(self.partitions):
            for _ in range(self.writers_per_partition):
                w = next(self._writer_ids)
                self._spawn(f"producer-{p}-{w}", self._produce, p, w, True)
            for _ in range(self.any_broker_writers_per_partition):
                w = next(self._writer_ids)
                self._spawn(f"producer-{p}-{w}-any", self._produce, p, w, False)
            if consumers:
                self._spawn(f"consumer-{p}", self._consume, p)

    def _spawn(self, name: str, target: Callable[..., None], *args: object) -> None:
        t = threading.Thread(target=target, args=args, name=name, daemon=True)
        t.start()
        self._threads.append(t)

    def stop(self) -> None:
        """Stop producing (each producer finishes its batch, retrying up to ``DRAIN_S``), let
        the consumers read to the end of what was acknowledged, then stop them."""
        self._stop.set()
        producers = [t for t in self._threads if t.name.startswith("producer")]
        for t in producers:
            t.join(DRAIN_S + 2 * self.client_timeout_s)
        self._stop_consumers.set()
        for t in self._threads:
            t.join(WAIT_S)
        assert not any(t.is_alive() for t in self._threads), "a chaos client thread hangs"

    def acked_count(self, partition: int | None = None) -> int:
        with self._stats_lock:
            if partition is None:
                return self.stats.acked
            return self.stats.acked_by_partition.get(partition, 0)

    def wait_acked(
        self, more: int, what: str, partition: int | None = None, timeout_s: float = WAIT_S
    ) -> None:
        """Until ``more`` records beyond those acknowledged now are acknowledged (on
        ``partition``, or on any)."""
        target = self.acked_count(partition) + more
        eventually(lambda: self.acked_count(partition) >= target or None, what, timeout_s)

    def attempts_to(self, broker: int) -> list[Attempt]:
        with self._attempts_lock:
            return [a for a in self.attempts if a.broker == broker]

    # -- leadership ------------------------------------------------------------------------------

    def _leader(self, partition: int, refresh: bool = False) -> int:
        if refresh or partition not in self._leaders:
            try:
                leader = self.cluster.leader(self.topic, partition)
            except LogbusError:  # the store is unreachable: try someone
                leader = -1
            if leader == -1:
                with self._rng_lock:
                    leader = self.cluster.rng.choice(sorted(self.cluster.brokers))
            self._leaders[partition] = leader
        return self._leaders[partition]

    def _any_broker(self) -> int:
        """A running broker, picked by the seeded rng (any broker, as behind a load balancer)."""
        running = [i for i in sorted(self.cluster.brokers) if self.cluster.running(i)]
        with self._rng_lock:
            return self.cluster.rng.choice(running or sorted(self.cluster.brokers))

    def _hint(self, partition: int, body: Any, answered_by: int) -> None:
        """Follow a 421's leader_id, else ask the store again. A broker whose lease lapsed
        (cut off from the store) still names itself from its stale rows: ignored."""
        leader = body.get("leader_id") if isinstance(body, dict) else None
        if isinstance(leader, int) and leader in self.cluster.brokers and leader != answered_by:
            self._leaders[partition] = leader
        else:
            self._leader(partition, refresh=True)

    # -- producers -------------------------------------------------------------------------------

    def _init_producer(
        self, http: httpx.Client, drain_until: list[float]
    ) -> tuple[int, int] | None:
        while not self._stop.is_set():
            for i in sorted(self.cluster.brokers):
                if not self.cluster.running(i):
                    continue
                try:
                    r = http.post(
                        f"{self.cluster.url(i)}/v1/producers", json={}, headers=ROUTE_DIRECT
                    )
                except httpx.HTTPError:
                    continue
                if r.status_code == 201:
                    body = r.json()
                    return int(body["producer_id"]), int(body["producer_epoch"])
            time.sleep(RETRY_BACKOFF_S * 4)
        return None

    def _produce(self, partition: int, writer: int, direct: bool) -> None:
        with httpx.Client(timeout=self.client_timeout_s) as http:
            session = self._init_producer(http, [])
            seq = 0
            n = 0
            while session is not None and not self._stop.is_set():
                with self._rng_lock:
                    count = self.cluster.rng.randint(*self.batch_records)
                values = [f"p{partition}-w{writer}-{n + i}" for i in range(count)]
                n += count
                outcome = self._send_batch(http, partition, session, seq, values, direct=direct)
                if outcome == "fail":  # a non-retriable answer: start a new session
                    session, seq = self._init_producer(http, []), 0
                    continue
                seq += count

    def produce_now(
        self, partition: int, values: list[str], leader: int, timeout_s: float = WAIT_S
    ) -> bool:
        """From the test's thread: one batch in a new producer session, sent to ``leader``
        first and retried like the producers' until acknowledged or ``timeout_s``; recorded in
        the history. Whether it was acknowledged."""
        with httpx.Client(timeout=self.client_timeout_s) as http:
            session = self._init_producer(http, [])
            assert session is not None, "stopped"
            self._leaders[partition] = leader
            deadline = time.monotonic() + timeout_s
            return self._send_batch(http, partition, session, 0, values, deadline) == "ok"

    def _send_batch(
        self,
        http: httpx.Client,
        partition: int,
        session: tuple[int, int],
        seq: int,
        values: list[str],
        deadline: float | None = None,
        *,
        direct: bool = True,
    ) -> str:
        """Send until acknowledged; retries keep the batch and its sequence. Records one Send
        per value with the final outcome. ``direct``: to the leader with ``Logbus-Route:
        direct``; else each attempt to a running broker picked by the seeded rng, which
        forwards it to the leader when it does not lead."""
        pid, epoch = session
        headers = {
            **(ROUTE_DIRECT if direct else {}),
            "Logbus-Producer-Id": str(pid),
            "Logbus-Producer-Epoch": str(epoch),
            "Logbus-Sequence": str(seq),
        }
        body = {"records": [{"value": v} for v in values]}
        drain_deadline: float | None = None
        while True:
            if self._stop.is_set():
                drain_deadline = drain_deadline or time.monotonic() + DRAIN_S
            if (drain_deadline is not None and time.monotonic() > drain_deadline) or (
                deadline is not None and time.monotonic() > deadline
            ):
                self._record_batch(partition, values, "info", None)
                return "info"
            broker = self._leader(partition) if direct else self._any_broker()
            url = (
                f"{self.cluster.url(broker)}/v1/topics/{self.topic}/partitions/{partition}/records"
            )
            started = time.monotonic()
            status: int | None = None
            code: str | None = None
            answer: Any = None
            try:
                r = http.post(url, params={"acks": "all"}, json=body, headers=headers)
                status = r.status_code
                with contextlib.suppress(ValueError):
                    answer = r.json()
                if isinstance(answer, dict) and isinstance(answer.get("code"), str):
                    code = answer["code"]
            except httpx.HTTPError:
                pass
            with self._attempts_lock:
                self.attempts.append(
                    Attempt(broker, partition, started, time.monotonic(), status, code, direct)
                )
            if status == 200:
                offsets = [o["offset"] for o in answer["offsets"]]
                self._record_batch(partition, values, "ok", offsets)
                return "ok"
            if status == 421:
                # A forwarding broker answers 421 only if it lost the leadership between its
                # check and its append: the next attempt goes elsewhere anyway.
                self._hint(partition, answer, broker)
                continue
            if status is not None and (status == 500 or (status >= 500 and code is None)):
                with self._stats_lock:  # an internal error, not an answer: a bug
                    self.stats.unexpected.append(f"{status} from broker {broker}: {answer!r}")
            retriable = (
                status is None
                or status >= 500
                or (isinstance(answer, dict) and answer.get("retriable") is True)
            )
            if retriable:
                if status is None or status >= 500:
                    self._leader(partition, refresh=True)
                time.sleep(RETRY_BACKOFF_S)
                continue
            # Not retriable (OUT_OF_ORDER_SEQUENCE_NUMBER, INVALID_PRODUCER_EPOCH, ...): a retry
            # of an idempotent batch should never see one; whether it was written is unknown.
            with self._stats_lock:
                self.stats.unexpected.append(f"{status} {code} from broker {broker} for {values}")
            self._record_batch(partition, values, "info", None)
            return "fail"

    def _record_batch(
        self, partition: int, values: list[str], outcome: str, offsets: list[int] | None
    ) -> None:
        for i, v in enumerate(values):
            offset = offsets[i] if offsets is not None else None
            self._rec.record(Send(v, v, partition, outcome, offset))  # type: ignore[arg-type]
        with self._stats_lock:
            if outcome == "ok":
                self.stats.acked += len(values)
                by = self.stats.acked_by_partition
                by[partition] = by.get(partition, 0) + len(values)
            else:
                self.stats.indeterminate += len(values)

    # -- consumers -------------------------------------------------------------------------------

    def _consume(self, partition: int) -> None:
        position = 0
        with httpx.Client(timeout=self.client_timeout_s) as http:
            while not self._stop_consumers.is_set():
                records = self._fetch(http, partition, position, wait_ms=200)
                if records is None:
                    time.sleep(RETRY_BACKOFF_S)
                    continue
                if records:
                    self._rec.record(Poll(f"consumer-{partition}", partition, tuple(records)))
                    position = records[-1][0] + 1

    def _fetch(
        self, http: httpx.Client, partition: int, offset: int, wait_ms: int = 0
    ) -> list[Record] | None:
        """Records from the leader at ``offset`` (up to its high watermark), or None."""
        broker = self._leader(partition)
        url = f"{self.cluster.url(broker)}/v1/topics/{self.topic}/partitions/{partition}/records"
        try:
            r = http.get(
                url,
                params={"offset": offset, "max_records": 500, "wait_ms": wait_ms},
                headers=ROUTE_DIRECT,
            )
        except httpx.HTTPError:
            self._leader(partition, refresh=True)
            return None
        if r.status_code == 421:
            with contextlib.suppress(ValueError):
                self._hint(partition, r.json(), broker)
            return None
        if r.status_code != 200:
            self._leader(partition, refresh=True)
            return None
        return [(int(rec["offset"]), str(rec["value"])) for rec in r.json()["records"]]

    def final_read(self, high_watermarks: dict[int, int]) -> None:
        """Read every partition from 0 to its high watermark (the cluster healed first)."""
        with httpx.Client(timeout=self.client_timeout_s) as http:
            for p in range(self.partitions):
                self._leader(p, refresh=True)
                records: list[Record] = []
                position = 0

                while position < high_watermarks[p]:
                    page = functools.partial(self._fetch, http, p, position)
                    got = eventually(page, f"final read of partition {p} at {position}")
                    if not got:
                        break
                    records.extend(got)
                    position = got[-1][0] + 1
                self._final[p] = records
                self._log.final(p, records)

    def check(self) -> str | None:
        """The checker's report if it found anomalies (or the client saw bugs), else None."""
        history = History(tuple(self._rec.ops), dict(self._final))
        result = check(history)
        problems = [] if result.ok else [result.render()]
        if self.stats.unexpected:
            problems.append("non-retriable answers: " + "; ".join(self.stats.unexpected[:10]))
        if not problems:
            return None
        return "\n".join([*problems, f"history: {self.history_path}"])

    def close(self) -> None:
        """Stop, close the history and write every attempt to ``attempts.jsonl`` beside it
        (broker, partition, start/end in monotonic s, status, error code): what a failed run's
        report points at."""
        self._stop.set()
        self._stop_consumers.set()
        if self._closed:
            return
        self._closed = True
        self._log.close()
        with self._attempts_lock, (self.history_path.parent / "attempts.jsonl").open("w") as f:
            for a in self.attempts:
                f.write(json.dumps(dataclasses.asdict(a)) + "\n")


# -- replicas' files ---------------------------------------------------------------------------


def replica_bytes(data_dir: Path, topic: str, partition: int, end: int) -> bytes:
    """The batches of a (stopped) broker's replica from offset 0 up to ``end``, as stored."""
    log = PartitionLog(
        data_dir / f"{topic}-{partition}", LogConfig(), SystemClock(), HandleCache(64)
    )
    try:
        chunks: list[bytes] = []
        offset = log.log_start_offset
        while offset < end:
            result = log.read(offset, 1 << 20, max_offset=end)
            if not result.data:
                break
            chunks.append(result.data)
            offset = result.next_offset
        return b"".join(chunks)
    finally:
        log.close()


def check_replicas_identical(cluster: ChaosCluster, topic: str, hws: dict[int, int]) -> str | None:
    """Stop every broker, then compare each partition's replicas byte for byte up to its high
    watermark; a description of the first difference, or None."""
    rows = cluster.rows(topic)
    cluster.stop_all()
    for r in rows:
        copies = {
            i: replica_bytes(cluster.brokers[i].data_dir, topic, r.partition, hws[r.partition])
            for i in r.replicas
        }
        reference = copies[r.leader]
        if not reference and hws[r.partition] > 0:
            return f"{topic}-{r.partition}: leader {r.leader} holds no bytes below HW"
        for i, data in copies.items():
            if data != reference:
                at = next(
                    (k for k, (a, b) in enumerate(zip(data, reference, strict=False)) if a != b),
                    min(len(data), len(reference)),
                )
                return (
                    f"{topic}-{r.partition}: broker {i}'s log differs from leader {r.leader}'s "
                    f"below HW {hws[r.partition]} at byte {at} "
                    f"({len(data)} vs {len(reference)} bytes)"
                )
    return None


# -- leadership samples ------------------------------------------------------------------------


class LeadershipSampler:
    """Samples, in a thread, which broker each running broker believes leads each partition
    (its describe) and what the store says: at most one broker may ever claim a partition in
    one leader epoch, and the claimant must be the leader the store named for that epoch."""

    INTERVAL_S: Final = 0.1

    def __init__(self, cluster: ChaosCluster, topic: str) -> None:
        self.cluster = cluster
        self.topic = topic
        self.claims: dict[tuple[int, int], set[int]] = {}  # (partition, epoch) -> brokers
        self.store_leaders: dict[tuple[int, int], set[int]] = {}
        self.samples = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="leadership-sampler", daemon=True)

    def __enter__(self) -> LeadershipSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(WAIT_S)

    def _run(self) -> None:
        while not self._stop.wait(self.INTERVAL_S):
            with contextlib.suppress(LogbusError):
                for r in self.cluster.rows(self.topic):
                    if r.leader != -1:
                        key = (r.partition, r.leader_epoch)
                        self.store_leaders.setdefault(key, set()).add(r.leader)
            for i in self.cluster.brokers:
                if not self.cluster.running(i):
                    continue
                try:
                    view = self.cluster.describe(i, self.topic, timeout=2.0)
                except httpx.HTTPError:
                    continue
                for part in view:
                    if part["leader"] == i:
                        key = (part["partition"], part["leader_epoch"])
                        self.claims.setdefault(key, set()).add(i)
            self.samples += 1

    def violations(self) -> list[str]:
        found = []
        for (p, epoch), brokers in sorted(self.claims.items()):
            if len(brokers) > 1:
                found.append(f"partition {p} epoch {epoch}: claimed by brokers {sorted(brokers)}")
            named = self.store_leaders.get((p, epoch), set())
            if named and not brokers <= named:
                found.append(
                    f"partition {p} epoch {epoch}: claimed by {sorted(brokers)}, "
                    f"the store named {sorted(named)}"
                )
        for (p, epoch), named in sorted(self.store_leaders.items()):
            if len(named) > 1:
                found.append(f"partition {p} epoch {epoch}: the store named {sorted(named)}")
        return found
