"""Failure scenarios with real broker processes: what each one proves.

* **Power loss of every broker** (``durability=fsync``): 3 brokers, RF=3, min ISR 2, acks=all;
  every broker is SIGKILLed at once and then loses what no fsync covered (the test-only
  journal of :mod:`core_log.fileio` records each file's fsynced length; the test cuts every
  file back to it). Every acknowledged record is there exactly once afterwards. The negative
  control runs the same with the default ``durability=replicated`` and ``flush.ms`` of an hour:
  acknowledged records are lost — the simulation bites, and only the fsync rule prevents it.
* **KIP-101** (Kafka's data-loss and divergence cases that leader epochs fixed): (a) a follower
  restarts with a stale high watermark on disk and the leader dies before the follower hears
  the new one — the follower leads without truncating to its high watermark, nothing
  acknowledged is lost; (b) both replicas crash and the lagging one comes back and leads
  first — the other truncates its unacknowledged suffix by leader epoch; (c) two leader
  changes in quick succession — the replicas converge across both epochs. Each ends with the
  replicas' logs compared byte for byte below the high watermark, read from the data dirs.
* **Unclean election**: with ``unclean.leader.election.enable=false`` a partition whose ISR
  members are all down stays offline (leader -1, produce fails retriably) while an
  out-of-sync replica is alive; enabling it elects that replica and the partition metadata
  counts the unclean election.
* **Controller failover**: SIGKILL the broker holding the controller lease; another takes it
  within the session timeout (+ margin) and still elects leaders.

Every wait polls the other processes' state with a generous bound (nothing to wait on
otherwise); a timeout only fails a hang. The metadata store is SQLite and PostgreSQL (when the
server is installed).
"""

from __future__ import annotations

import signal
import time
from collections import Counter
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, TypeVar

import httpx
import pytest

from api.process import BrokerProcess
from cluster.metadata import MetadataStore, PartitionMeta
from core_log.batch import scan_batches
from core_log.fileio import JOURNAL_ENV, drop_unsynced
from tests.cluster.test_cluster_processes import CLUSTER_ENV

T = TypeVar("T")
WAIT_S = 40.0  # a bound for what a healthy cluster reaches in a few seconds
SESSION_TIMEOUT_S = int(CLUSTER_ENV["LOGBUS_BROKER_SESSION_TIMEOUT_MS"]) / 1000


def eventually(probe: Callable[[], T | None], what: str, timeout_s: float = WAIT_S) -> T:
    deadline = time.monotonic() + timeout_s
    while True:
        value = probe()
        if value is not None:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


@pytest.fixture(params=["sqlite", "postgresql"])
def metadata_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'shared.db'}"
    url: str = request.getfixturevalue("postgres_db_url")
    return url


class Cluster:
    """Broker processes on one metadata store, each with its own data dir and fsync journal."""

    def __init__(self, root: Path, url: str, ids: tuple[int, ...] = (1, 2, 3)) -> None:
        self.url = url
        self.store = MetadataStore(url)
        self.brokers = {
            i: BrokerProcess(
                root / f"broker-{i}",
                None,
                "--broker-id",
                str(i),
                "--metadata-url",
                url,
                env={**CLUSTER_ENV, JOURNAL_ENV: str(root / f"journal-{i}")},
            )
            for i in ids
        }

    def journal(self, i: int) -> Path:
        return Path(self.brokers[i].env[JOURNAL_ENV])

    def start(self, *ids: int) -> None:
        """Start brokers in parallel (each waits for its own readiness)."""
        chosen = [self.brokers[i] for i in ids or tuple(self.brokers)]
        with ThreadPoolExecutor(len(chosen)) as pool:
            for f in [pool.submit(b.start) for b in chosen]:
                f.result()

    def kill(self, *ids: int) -> None:
        """SIGKILL all of ``ids`` first, then reap them: as near to "at once" as it gets."""
        procs = [self.brokers[i].proc for i in ids]
        for p in procs:
            if p is not None:
                p.send_signal(signal.SIGKILL)
        for i in ids:
            self.brokers[i].kill()

    def close(self) -> None:
        for b in self.brokers.values():
            if b.proc is not None:
                with_cont(b)
            b.kill()
        self.store.close()

    def http(self, i: int) -> str:
        return self.brokers[i].url

    def create_topic(
        self, name: str, rf: int, configs: dict[str, str], partitions: int = 1
    ) -> None:
        any_live = next(i for i, b in self.brokers.items() if b.proc is not None)
        r = httpx.post(
            f"{self.http(any_live)}/v1/topics",
            json={
                "name": name,
                "partitions": partitions,
                "replication_factor": rf,
                "configs": configs,
            },
            timeout=30,
        )
        assert r.status_code == 201, r.text

    def row(self, topic: str, partition: int = 0) -> PartitionMeta:
        return self.store.topic(topic).assignments[partition]

    def wait_leader(
        self, topic: str, ok: Callable[[PartitionMeta], bool] = lambda r: True, p: int = 0
    ) -> PartitionMeta:
        """The row once a leader is elected (and ``ok``) and that leader knows it leads."""

        def probe() -> PartitionMeta | None:
            row = self.row(topic, p)
            if row.leader < 0 or not ok(row) or self.brokers[row.leader].proc is None:
                return None
            part = partitions(self.http(row.leader), topic)[p]
            return row if part["leader"] == row.leader and part["log_end_offset"] >= 0 else None

        return eventually(probe, f"a leader for {topic}-{p}")


def with_cont(b: BrokerProcess) -> None:
    if b.proc is not None and b.proc.poll() is None:
        b.proc.send_signal(signal.SIGCONT)


@pytest.fixture
def cluster(tmp_path: Path, metadata_url: str) -> Iterator[Cluster]:
    c = Cluster(tmp_path, metadata_url)
    try:
        yield c
    finally:
        c.close()


def partitions(base: str, topic: str) -> list[dict[str, Any]]:
    try:
        r = httpx.get(f"{base}/v1/topics/{topic}/partitions", timeout=10)
    except httpx.TransportError:
        return [{"leader": -2, "log_end_offset": -1, "high_watermark": -1, "isr": []}] * 64
    if r.status_code != 200:
        return [{"leader": -2, "log_end_offset": -1, "high_watermark": -1, "isr": []}] * 64
    out: list[dict[str, Any]] = r.json()
    return out


def produce(base: str, topic: str, values: list[str], acks: str = "all", p: int = 0) -> Any:
    try:
        return httpx.post(
            f"{base}/v1/topics/{topic}/partitions/{p}/records",
            params={"acks": acks},
            json={"records": [{"value": v} for v in values]},
            timeout=30,
        )
    except httpx.TransportError:
        return None


def read_all(base: str, topic: str, p: int = 0) -> list[tuple[int, Any]]:
    """Every (offset, value) below the high watermark, read through the API."""
    out: list[tuple[int, Any]] = []
    offset = 0
    while True:
        r = httpx.get(
            f"{base}/v1/topics/{topic}/partitions/{p}/records",
            params={"offset": offset},
            timeout=10,
        )
        r.raise_for_status()
        records = r.json()["records"]
        if not records:
            return out
        out.extend((rec["offset"], rec["value"]) for rec in records)
        offset = records[-1]["offset"] + 1


def log_bytes(data_dir: Path, topic: str, below: int, p: int = 0) -> bytes:
    """The batches of a stopped broker's replica that end below ``below``, byte for byte, from
    its segment files."""
    directory = data_dir / f"{topic}-{p}"
    out = bytearray()
    for seg in sorted(directory.glob("*.log"), key=lambda s: int(s.stem)):
        data = seg.read_bytes()
        for pos, h in scan_batches(data):
            if h.base_offset + h.last_offset_delta < below:
                out += data[pos : pos + h.size_bytes]
    return bytes(out)


def assert_converged(c: Cluster, topic: str, replicas: list[int]) -> int:
    """Wait until every replica is in the ISR with the leader's log end and high watermark,
    stop them all (a clean shutdown), and compare their logs below that high watermark byte
    for byte. Returns the high watermark."""

    def probe() -> int | None:
        row = c.row(topic)
        if row.leader < 0 or sorted(row.isr) != sorted(replicas):
            return None
        parts = [partitions(c.http(i), topic)[0] for i in replicas]
        ends = {(q["log_end_offset"], q["high_watermark"]) for q in parts}
        if len(ends) != 1:
            return None
        leo, hw = ends.pop()
        return hw if hw == leo else None

    hw = eventually(probe, f"{topic}: replicas {replicas} converged")
    for i in replicas:
        c.brokers[i].stop()
    logs = {i: log_bytes(c.brokers[i].data_dir, topic, hw) for i in replicas}
    first = logs[replicas[0]]
    assert len(first) > 0
    for i in replicas[1:]:
        assert logs[i] == first, f"broker {i}'s log differs from broker {replicas[0]}'s below {hw}"
    return hw


def assert_exactly_once(acked: list[str], read: list[tuple[int, Any]]) -> None:
    counts = Counter(v for _, v in read)
    lost = [v for v in acked if counts[v] == 0]
    assert not lost, f"{len(lost)} acknowledged records lost, e.g. {lost[:5]}"
    dup = [v for v in acked if counts[v] > 1]
    assert not dup, f"acknowledged records duplicated: {dup[:5]}"
    offsets = [o for o, _ in read]
    assert offsets == sorted(set(offsets)), "offsets repeat or go backwards"


# -- durability=fsync: power loss of every broker ------------------------------------------------


def _produce_until_killed(c: Cluster, topic: str, leader: int, batches: int) -> list[str]:
    acked: list[str] = []
    for n in range(batches):
        values = [f"r{n}-{k}" for k in range(5)]
        r = produce(c.http(leader), topic, values)
        assert r is not None and r.status_code == 200, r.text if r is not None else "no answer"
        acked.extend(values)
    return acked


@pytest.mark.parametrize("durability", ["fsync", "replicated"])
def test_power_loss_of_every_broker(cluster: Cluster, durability: str) -> None:
    c = cluster
    c.start()
    # flush.ms of an hour: nothing but the durability rule fsyncs a segment.
    c.create_topic(
        "d",
        3,
        {"min.insync.replicas": "2", "durability": durability, "flush.ms": "3600000"},
    )
    row = c.wait_leader("d", lambda r: len(r.isr) == 3)
    acked = _produce_until_killed(c, "d", row.leader, 40)
    c.kill(1, 2, 3)
    dropped = {i: drop_unsynced(c.brokers[i].data_dir, c.journal(i)) for i in c.brokers}
    c.start()
    after = c.wait_leader("d")
    if durability == "fsync":
        hw = assert_converged_live(c, "d")
        read = read_all(c.http(after.leader), "d")
        assert len(read) == hw
        assert_exactly_once(acked, read)
    else:
        # The control: the simulation bites. Nothing was fsynced, so everything goes.
        assert sum(dropped.values()) > 0
        read = read_all(c.http(after.leader), "d")
        lost = set(acked) - {v for _, v in read}
        assert lost, "the page-cache-loss simulation lost nothing: it does not bite"


def assert_converged_live(c: Cluster, topic: str) -> int:
    def probe() -> int | None:
        row = c.row(topic)
        if row.leader < 0 or len(row.isr) != len(row.replicas):
            return None
        parts = [partitions(c.http(i), topic)[0] for i in row.replicas]
        ends = {(q["log_end_offset"], q["high_watermark"]) for q in parts}
        if len(ends) != 1:
            return None
        leo, hw = ends.pop()
        return hw if hw == leo else None

    return eventually(probe, f"{topic}: every replica caught up")
