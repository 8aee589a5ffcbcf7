"""``make bench-cluster``: the cost of replication, follower lag, leader failover time.

    .venv/bin/python -m benchmarks.cluster [--quick] [--json PATH] [--plot PATH]

Every broker is a ``logbus serve`` child process (:class:`api.process.BrokerProcess`) on
loopback; a cluster is 3 of them sharing one SQLite metadata store (``--metadata-url
sqlite:///…``), so on this machine 3 brokers, the load generator and the sampler share 2
cores. One run measures (issue 11, "Performance"):

1. **Produce throughput, RF=3 acks=all as a ratio to RF=1 on one broker.** The load and its
   shapes are those of ``logbus bench`` (:mod:`benchmarks.http`): ``wrk`` (C, one thread)
   posting the same prebuilt body again and again; binary: one uncompressed ~1 MiB batch of
   100-byte records per request (``binary_batch``: ``core_log``'s batch builder), 4
   connections; JSON: 1,000 records of 100-byte values per request (``json_body``), 8
   connections. Every request says ``acks=all`` and goes to ``/v1/topics/{t}/partitions/0/
   records`` of a 1-partition topic. The baseline is a standalone broker (no metadata URL,
   default settings: today's single broker), RF=1. The replicated case is a 3-broker cluster
   (default lease/replication settings), topic RF=3 with ``min.insync.replicas=2``; its
   leader is found as a client would (``GET /v1/topics/{t}/partitions`` ``leader`` and ``GET
   /v1/cluster`` broker ``url``) and written to directly with ``Logbus-Route: direct`` (a
   non-leader would answer 421). The standalone broker and the cluster run side by side and
   the cases alternate within each round (baseline, RF=3, …), so load from other work on the
   machine hits both; the ratio is the median over ``--rounds`` of each round's RF=3 / RF=1.
   Extra lines, same round: the same RF=3 writes sent to a broker that does not lead (it
   forwards them to the leader over the brokers' h2c link), and RF=1 on a cluster broker
   (what cluster mode costs without replication). Each measurement writes into a fresh topic
   that is deleted afterwards, so disk use stays bounded.
2. **Replication lag under steady load.** A producer (a minimal asyncio HTTP/1.1 client,
   :class:`benchmarks.consumers.RawHttp`) sends 1,000-record binary batches on a fixed
   schedule (``--lag-rate`` records/s; by default half the RF=3 binary rate just measured)
   with ``acks=1`` to the leader of a fresh RF=3 topic, so the producer is not paced by the
   followers. Every ``--sample-ms`` (50) each follower is asked ``GET /v1/topics/{t}/
   partitions``: its answer carries the leader's log end offset (asked of the leader over
   h2c first) and then its own replica's (``local_replica``), so one answer holds an ordered
   pair. *Lag in records* of a sample = max(0, leader LEO - follower LEO): a lower bound by
   what the leader appends during that h2c round trip (≈ 1 ms). *Lag in ms* of a sample taken
   at t = the time until that follower's LEO reached the leader's LEO of the sample, found in
   the follower's later samples and interpolated linearly between the two samples around the
   crossing (0 when the follower already had it); its resolution is the sampling interval.
   p50/p99 over both followers' samples; samples whose target was not reached before the
   load stopped are counted and left out.
3. **Failover time over ``--kills`` (20) SIGKILLs of the leader**, on a cluster with the test
   timings (``FAILOVER_ENV``: heartbeat 200 ms, session timeout 2,000 ms, metadata refresh
   50 ms, replica fetch wait 200 ms, replica lag max 3,000 ms). Before each kill the topic
   (RF=3, min ISR 2) has all 3 replicas in its ISR and the leader has accepted an acks=all
   write. The time runs from just before ``SIGKILL`` to the answer of the first acks=all
   write the new leader accepts; meanwhile the client does what a routing client does: polls
   a surviving broker's partition listing every 10 ms and, once it names a new leader, posts
   an acks=all write to it directly (``Logbus-Route: direct``, retrying on 421/503/
   ``NOT_ENOUGH_REPLICAS``). The killed broker is then restarted. p50/p99/max against
   ``broker.session.timeout.ms`` + 1 s. ``--default-kills N`` repeats it on a cluster with
   the default timings (session 9 s).
4. **HTTP/2 replication fetch on one connection vs HTTP/1.1 reading the same bytes**, twice:
   *a real leader*: on the cluster of parts 1-2, a fresh RF=3 topic gets ``H2_READ_MIB`` (64)
   ~1 MiB binary batches (acks=all); then, in rounds of ``--h2-seconds`` (2) that alternate,
   the whole partition is read from offset 0 to its end on one connection, one request in
   flight, 1 MiB per request (``replica.fetch.max.bytes``): (a) ``POST /replica/fetch`` over
   the leader's h2c listener, exactly as a follower's fetcher sends it (the bench presents
   itself as one of the followers, with ``max_wait_ms`` 0; the topic is idle and fully
   replicated, so the positions it reports move nothing: the high watermark never goes back
   and the real follower keeps its place in the ISR by its own fetches), decoded as the
   fetcher decodes it; (b) ``GET /v1/topics/{t}/partitions/0/records?offset=&max_bytes=``
   over HTTP/1.1 (a consumer's binary read), received in place by a minimal client
   (:class:`benchmarks.h2_fetch.Http1Client`). Both read the same log through the same
   broker, so the ratio is what carrying replication over h2c costs end to end (request
   handling, framing, the client's receive), with the leader's CPU seconds per 10^9 bytes
   beside it. *Transport only*: the ``h2_fetch`` benchmark of this package (a synthetic
   server answering preallocated bodies of 1 and 16 MiB on both protocols; run as a child
   with ``--json``), which isolates HTTP/2's framing and flow control from the broker.

Output: a table on stdout, ``--json`` (default ``docs/bench-cluster.json``), ``--plot``
(default ``docs/bench-cluster.png``; needs matplotlib, the ``bench`` extra). ``--quick`` is a
smoke run (≈ 40 s); a machine without ``wrk`` falls back to an asyncio load generator
(``--driver python``), whose figures are not comparable with ``wrk``'s.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import importlib.util
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, TypeVar

import httpx
import orjson

from api.process import BrokerProcess
from benchmarks.consumers import Figure, RawHttp, describe_source
from benchmarks.h2_fetch import Http1Client
from benchmarks.http import WrkResult, binary_batch, json_body, run_wrk
from benchmarks.storage import batch_records, build_fitting_batch
from cluster import replica_wire as wire
from cluster.h2transport import H2Client
from cluster.metadata import MetadataStore
from cluster.replication import FetchPosition
from core_log.batch import scan_batches
from core_log.epoch_cache import UNDEFINED_EPOCH

T = TypeVar("T")
MIB = 1024 * 1024
BATCH_CT = "application/vnd.logbus.batch"
DIRECT = {"Logbus-Route": "direct"}
# The test timings of tests/cluster (defaults: heartbeat 2 s, session 9 s, refresh 200 ms).
FAILOVER_ENV = {
    "LOGBUS_BROKER_HEARTBEAT_INTERVAL_MS": "200",
    "LOGBUS_BROKER_SESSION_TIMEOUT_MS": "2000",
    "LOGBUS_REPLICA_LAG_TIME_MAX_MS": "3000",
    "LOGBUS_METADATA_REFRESH_INTERVAL_MS": "50",
    "LOGBUS_REPLICA_FETCH_WAIT_MAX_MS": "200",
}
DEFAULT_SESSION_TIMEOUT_MS = 9_000
WAIT_S = 60.0  # bound on a state a healthy cluster reaches in seconds (a hang, not a figure)
FAILOVER_GIVE_UP_S = 60.0
STARTUP_GRACE_S = 120.0  # past BrokerProcess's own 30 s
REQUEST_TIMEOUT_S = 30.0  # any one request of the asyncio clients
H2_FETCH = f"{__package__ or 'benchmarks'}.h2_fetch"  # may be absent: see part_h2
PLOT_TITLE = "bench-cluster: 3 brokers on loopback, 2 cores"


def eventually(probe: Callable[[], T | None], what: str, timeout_s: float = WAIT_S) -> T:
    """Poll ``probe`` until it returns a value: the state lives in other processes."""
    deadline = time.monotonic() + timeout_s
    while True:
        with contextlib.suppress(httpx.TransportError):
            value = probe()
            if value is not None:
                return value
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out waiting for {what}")
        time.sleep(0.02)


def percentile(values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..100) of a non-empty sequence."""
    s = sorted(values)
    return s[min(len(s) - 1, max(0, int(-(-len(s) * q // 100)) - 1))]


# -- brokers -----------------------------------------------------------------------------------


def start_patiently(broker: BrokerProcess) -> None:
    """``broker.start()``, allowing for a loaded machine: at a load average of 25 a broker took
    over the 30 s that ``BrokerProcess`` waits for; a process still alive gets more time."""
    try:
        broker.start()
    except TimeoutError:
        if broker.proc is None or broker.proc.poll() is not None:
            raise
        eventually(
            lambda: httpx.get(f"{broker.url}/readyz", timeout=1).status_code == 200 or None,
            f"{broker.url} ready",
            timeout_s=STARTUP_GRACE_S,
        )


class Cluster:
    """``n`` broker processes sharing a SQLite metadata store under ``root``."""

    def __init__(self, root: Path, n: int = 3, env: dict[str, str] | None = None) -> None:
        root.mkdir(parents=True, exist_ok=True)
        self.metadata_url = f"sqlite:///{root / 'shared.db'}"
        self.brokers = {
            i: BrokerProcess(
                root / f"broker-{i}",
                None,
                "--broker-id",
                str(i),
                "--metadata-url",
                self.metadata_url,
                env=env or {},
            )
            for i in range(1, n + 1)
        }
        self.urls: dict[int, str] = {}

    def start(self) -> Cluster:
        # One after the other, as tests/cluster does: the first creates the shared schema.
        for b in self.brokers.values():
            start_patiently(b)
        self.urls = eventually(self._registered, "every broker registered")
        return self

    def _registered(self) -> dict[int, str] | None:
        doc = httpx.get(f"{self.any_url()}/v1/cluster", timeout=5).json()
        alive = {b["broker_id"]: b["url"] for b in doc["brokers"] if b["alive"]}
        return alive if len(alive) == len(self.brokers) and doc["controller"] != -1 else None

    def any_url(self, exclude: Sequence[int] = ()) -> str:
        return next(
            b.url for i, b in self.brokers.items() if b.proc is not None and i not in exclude
        )

    def partition(self, topic: str, via: str | None = None) -> dict[str, Any]:
        r = httpx.get(f"{via or self.any_url()}/v1/topics/{topic}/partitions", timeout=5)
        r.raise_for_status()
        part: dict[str, Any] = r.json()[0]
        return part

    def create_topic(self, name: str, rf: int, min_isr: int = 1) -> dict[str, Any]:
        """Create a 1-partition topic; wait until its ISR is full and every broker knows its
        leader (a direct write must not meet a broker with stale metadata)."""
        r = httpx.post(
            f"{self.any_url()}/v1/topics",
            json={
                "name": name,
                "partitions": 1,
                "replication_factor": rf,
                "configs": {"min.insync.replicas": str(min_isr)},
            },
            timeout=30,
        )
        r.raise_for_status()
        return self.wait_healthy(name, rf)

    def wait_healthy(self, topic: str, rf: int) -> dict[str, Any]:
        def probe() -> dict[str, Any] | None:
            try:
                views = [self.partition(topic, b.url) for b in self.brokers.values() if b.proc]
            except httpx.HTTPStatusError:  # 404: a broker has not seen the new topic yet
                return None
            first = views[0]
            ok = first["leader"] != -1 and len(first["isr"]) == rf
            same = all(v["leader"] == first["leader"] for v in views)
            return first if ok and same else None

        return eventually(probe, f"{topic}: a leader and a full ISR on every broker")

    def leader_url(self, topic: str) -> tuple[int, str]:
        leader = int(self.partition(topic)["leader"])
        return leader, self.urls[leader]

    def delete_topic(self, name: str) -> None:
        with contextlib.suppress(httpx.HTTPError):
            httpx.delete(f"{self.any_url()}/v1/topics/{name}", timeout=30)

    def stop(self) -> None:
        for b in self.brokers.values():
            b.kill()


@contextlib.contextmanager
def running(*things: Cluster | BrokerProcess) -> Iterator[None]:
    try:
        yield
    finally:
        for t in things:
            t.stop() if isinstance(t, Cluster) else t.kill()


# -- 1. throughput -----------------------------------------------------------------------------


@dataclass
class Load:
    """One produce shape: the same body posted again and again."""

    kind: str  # "binary" | "json"
    body: bytes
    records: int  # per request
    connections: int
    content_type: str


def loads() -> dict[str, Load]:
    batch, n = binary_batch()
    return {
        "binary": Load("binary", batch, n, 4, BATCH_CT),
        "json": Load("json", json_body(1000), 1000, 8, "application/json"),
    }


async def _python_load(
    url: str, path: str, load: Load, seconds: float, headers: dict[str, str]
) -> WrkResult:
    """The fallback load generator: ``load.connections`` keep-alive connections posting."""
    port = int(url.rsplit(":", 1)[1])
    latencies: list[float] = []
    errors = 0
    deadline = time.perf_counter() + seconds

    async def one() -> None:
        nonlocal errors
        client = RawHttp(port, {"Content-Type": load.content_type, **headers})
        try:
            while time.perf_counter() < deadline:
                t = time.perf_counter()
                status = await asyncio.wait_for(client.post(path, load.body), REQUEST_TIMEOUT_S)
                latencies.append((time.perf_counter() - t) * 1000)
                errors += status != 200
        finally:
            client.close()

    start = time.perf_counter()
    await asyncio.gather(*(one() for _ in range(load.connections)))
    elapsed = time.perf_counter() - start
    if errors:
        raise RuntimeError(f"{errors} failed produce requests to {url}{path}")
    return WrkResult(
        len(latencies) / elapsed, percentile(latencies, 50), percentile(latencies, 99), 0
    )


def produce(
    url: str,
    topic: str,
    load: Load,
    seconds: float,
    workdir: Path,
    driver: str,
    direct: bool,
) -> tuple[float, WrkResult]:
    """acks=all produce for ``seconds``; (records/s, raw result)."""
    path = f"/v1/topics/{topic}/partitions/0/records?acks=all"
    headers = DIRECT if direct else {}
    if driver == "wrk":
        r = run_wrk(
            url + path,
            workdir,
            seconds=seconds,
            connections=load.connections,
            method="POST",
            body=load.body,
            content_type=load.content_type,
            direct=direct,
        )
    else:
        r = asyncio.run(_python_load(url, path, load, seconds, headers))
    return r.requests_per_s * load.records, r


def create_standalone_topic(url: str, name: str) -> None:
    httpx.post(f"{url}/v1/topics", json={"name": name, "partitions": 1}).raise_for_status()


def part_throughput(
    single: BrokerProcess,
    cluster: Cluster,
    args: argparse.Namespace,
    workdir: Path,
    extra: dict[str, Any],
) -> list[Figure]:
    rounds: dict[str, list[dict[str, float]]] = {"binary": [], "json": []}
    p99: dict[str, list[float]] = {}
    for rnd in range(args.rounds):
        for kind, load in loads().items():
            row: dict[str, float] = {}
            cases: list[tuple[str, Callable[[str], tuple[str, bool]], int]] = []

            def standalone(t: str) -> tuple[str, bool]:
                create_standalone_topic(single.url, t)
                return single.url, False

            def rf3_direct(t: str) -> tuple[str, bool]:
                cluster.create_topic(t, 3, 2)
                return cluster.leader_url(t)[1], True

            def rf3_forwarded(t: str) -> tuple[str, bool]:
                cluster.create_topic(t, 3, 2)
                leader = cluster.leader_url(t)[0]
                return cluster.urls[min(i for i in cluster.urls if i != leader)], False

            def rf1_cluster(t: str) -> tuple[str, bool]:
                cluster.create_topic(t, 1, 1)
                return cluster.leader_url(t)[1], True

            cases = [
                ("rf1_standalone", standalone, 1),
                ("rf3_direct", rf3_direct, 3),
                ("rf3_forwarded", rf3_forwarded, 3),
                ("rf1_cluster", rf1_cluster, 1),
            ]
            for case, setup, _rf in cases:
                topic = f"bench-{kind}-{case.replace('_', '-')}-{rnd}"
                url, direct = setup(topic)
                rate, res = produce(url, topic, load, args.seconds, workdir, args.driver, direct)
                row[case] = rate
                p99.setdefault(f"{kind}/{case}", []).append(res.latency_p99_ms)
                print(
                    f"  round {rnd + 1} {kind:6} {case:15} {rate:>12,.0f} records/s "
                    f"({res.requests_per_s * len(load.body) / 1e6:,.1f} MB/s, "
                    f"p99 {res.latency_p99_ms:.0f} ms)",
                    flush=True,
                )
                if case == "rf1_standalone":
                    with contextlib.suppress(httpx.HTTPError):
                        httpx.delete(f"{single.url}/v1/topics/{topic}", timeout=30)
                else:
                    cluster.delete_topic(topic)
            rounds[kind].append(row)
    extra["throughput_rounds"] = rounds
    extra["throughput_p99_ms"] = {k: statistics.median(v) for k, v in p99.items()}

    figures: list[Figure] = []
    for kind, rows in rounds.items():
        load = loads()[kind]
        per_req = f"{'~1 MiB batches' if kind == 'binary' else '1,000 records/request'}"

        def med(case: str, rows: list[dict[str, float]] = rows) -> float:
            return statistics.median(r[case] for r in rows)

        def ratio(case: str, rows: list[dict[str, float]] = rows) -> float:
            return statistics.median(r[case] / r["rf1_standalone"] for r in rows)

        base, rf3 = med("rf1_standalone"), med("rf3_direct")
        figures += [
            Figure(
                f"{kind} produce RF=3 acks=all / RF=1 one broker",
                ratio("rf3_direct"),
                "ratio",
                0.33,
                note=f"RF=3 {rf3:,.0f} vs RF=1 {base:,.0f} records/s "
                f"({per_req}, {load.connections} connections)",
            ),
            Figure(
                f"{kind} produce RF=3 acks=all / RF=1 on a cluster broker",
                statistics.median(r["rf3_direct"] / r["rf1_cluster"] for r in rows),
                "ratio",
                note="the same brokers and settings; a standalone broker fsyncs for acks=all, "
                "a cluster does not (acks=all means the ISR has it)",
            ),
            Figure(
                f"{kind} produce RF=3 through a non-leader (forwarded) / RF=1",
                ratio("rf3_forwarded"),
                "ratio",
                note=f"{med('rf3_forwarded'):,.0f} records/s",
            ),
            Figure(
                f"{kind} produce RF=1 on a cluster broker / RF=1 standalone",
                ratio("rf1_cluster"),
                "ratio",
                note=f"{med('rf1_cluster'):,.0f} records/s",
            ),
        ]
    return figures


# -- 2. replication lag ------------------------------------------------------------------------


@dataclass
class Sample:
    t: float  # monotonic seconds, midpoint of the request
    leader_leo: int
    follower_leo: int


def lag_ms(samples: list[Sample]) -> tuple[list[float], int]:
    """Per sample, ms until this follower's LEO reached the sample's leader LEO (interpolated
    between the two samples around the crossing); (lags, samples never caught up in the run)."""
    out: list[float] = []
    unresolved = 0
    j = 0
    for i, s in enumerate(samples):
        if s.follower_leo >= s.leader_leo:
            out.append(0.0)
            continue
        j = max(j, i + 1)
        while j < len(samples) and samples[j].follower_leo < s.leader_leo:
            j += 1
        if j == len(samples):
            unresolved += 1
            continue
        a, b = samples[j - 1], samples[j]
        frac = (s.leader_leo - a.follower_leo) / max(1, b.follower_leo - a.follower_leo)
        t_cross = a.t + max(0.0, min(1.0, frac)) * (b.t - a.t)
        out.append(max(0.0, t_cross - s.t) * 1000)
    return out, unresolved


async def _steady_lag(
    leader_url: str,
    follower_urls: list[str],
    topic: str,
    rate: float,
    seconds: float,
    sample_s: float,
) -> tuple[dict[str, list[Sample]], int]:
    batch = build_fitting_batch(1000)
    per_request = batch_records(batch)
    interval = per_request / rate
    path = f"/v1/topics/{topic}/partitions/0/records?acks=1"
    stop = asyncio.Event()
    samples: dict[str, list[Sample]] = {u: [] for u in follower_urls}
    sent = 0

    async def producer() -> None:
        nonlocal sent
        client = RawHttp(int(leader_url.rsplit(":", 1)[1]), {"Content-Type": BATCH_CT, **DIRECT})
        t0 = time.perf_counter()
        n = 0
        try:
            while time.perf_counter() - t0 < seconds:
                delay = t0 + n * interval - time.perf_counter()
                if delay > 0:
                    await asyncio.sleep(delay)
                status = await asyncio.wait_for(client.post(path, batch), REQUEST_TIMEOUT_S)
                if status != 200:
                    raise RuntimeError(f"steady producer got {status}")
                n += 1
                sent += per_request
        finally:
            client.close()
            stop.set()

    async def sample(client: RawHttp, url: str) -> None:
        t = time.perf_counter()
        status, body = await asyncio.wait_for(
            client.request("GET", f"/v1/topics/{topic}/partitions"), REQUEST_TIMEOUT_S
        )
        mid = (t + time.perf_counter()) / 2
        if status != 200:
            return
        p = orjson.loads(body)[0]
        local = p.get("local_replica") or {}
        if p["log_end_offset"] >= 0 and "log_end_offset" in local:  # -1: leader not reached
            samples[url].append(Sample(mid, p["log_end_offset"], local["log_end_offset"]))

    async def sampler(url: str) -> None:
        client = RawHttp(int(url.rsplit(":", 1)[1]))
        try:
            while not stop.is_set():
                t = time.perf_counter()
                await sample(client, url)
                await asyncio.sleep(max(0.0, t + sample_s - time.perf_counter()))
            for _ in range(int(2.0 / sample_s)):  # 2 s of tail: late samples resolve
                t = time.perf_counter()
                await sample(client, url)
                await asyncio.sleep(max(0.0, t + sample_s - time.perf_counter()))
        finally:
            client.close()

    await asyncio.gather(producer(), *(sampler(u) for u in follower_urls))
    return samples, sent


def part_lag(
    cluster: Cluster, args: argparse.Namespace, rate: float, extra: dict[str, Any]
) -> list[Figure]:
    topic = "bench-lag"
    part = cluster.create_topic(topic, 3, 2)
    leader = int(part["leader"])
    followers = [cluster.urls[i] for i in part["replicas"] if i != leader]
    samples, sent = asyncio.run(
        _steady_lag(
            cluster.urls[leader], followers, topic, rate, args.lag_seconds, args.sample_ms / 1000
        )
    )
    records: list[float] = []
    ms: list[float] = []
    unresolved = 0
    for per in samples.values():
        records += [max(0, s.leader_leo - s.follower_leo) for s in per]
        lags, u = lag_ms(per)
        ms += lags
        unresolved += u
    cluster.delete_topic(topic)
    achieved = sent / args.lag_seconds
    extra["lag"] = {
        "rate_target_records_s": rate,
        "rate_achieved_records_s": achieved,
        "samples": len(records),
        "unresolved_samples": unresolved,
        "records": {"p50": percentile(records, 50), "p99": percentile(records, 99)},
        "ms": {"p50": percentile(ms, 50), "p99": percentile(ms, 99), "max": max(ms)},
    }
    note = (
        f"{achieved:,.0f} records/s acks=1 for {args.lag_seconds:g} s, "
        f"{len(records)} samples of 2 followers every {args.sample_ms:g} ms"
    )
    return [
        Figure("replication lag p50", percentile(records, 50), "records", note=note),
        Figure("replication lag p99", percentile(records, 99), "records"),
        Figure("replication lag p50 (time to catch up)", percentile(ms, 50), "ms"),
        Figure(
            "replication lag p99 (time to catch up)",
            percentile(ms, 99),
            "ms",
            note=f"max {max(ms):.0f} ms; {unresolved} samples unresolved at the end",
        ),
    ]


# -- 3. failover -------------------------------------------------------------------------------


def _write(client: httpx.Client, url: str, topic: str, timeout_s: float) -> int:
    r = client.post(
        f"{url}/v1/topics/{topic}/partitions/0/records",
        params={"acks": "all"},
        json={"records": [{"value": "failover-probe"}]},
        headers=DIRECT,
        timeout=timeout_s,
    )
    return r.status_code


def failover_once(cluster: Cluster, topic: str, client: httpx.Client) -> tuple[float, int]:
    """Kill the leader; ms until a new leader accepted an acks=all write, and its epoch."""
    part = cluster.wait_healthy(topic, len(cluster.brokers))
    old, old_epoch = int(part["leader"]), int(part["leader_epoch"])
    eventually(
        lambda: _write(client, cluster.urls[old], topic, 10) == 200 or None, "a pre-kill write"
    )
    survivors = [i for i in cluster.brokers if i != old]
    t0 = time.monotonic()
    cluster.brokers[old].kill()
    n = 0
    while time.monotonic() - t0 < FAILOVER_GIVE_UP_S:
        via = cluster.urls[survivors[n % len(survivors)]]
        n += 1
        try:
            p = client.get(f"{via}/v1/topics/{topic}/partitions", timeout=1).json()[0]
            new = int(p["leader"])
            if new not in (-1, old) and _write(client, cluster.urls[new], topic, 5) == 200:
                elapsed = (time.monotonic() - t0) * 1000
                start_patiently(cluster.brokers[old])
                return elapsed, int(p["leader_epoch"]) - old_epoch
        except (httpx.TransportError, ValueError, KeyError):
            pass
        time.sleep(0.01)
    start_patiently(cluster.brokers[old])
    raise TimeoutError(f"no new leader accepted a write within {FAILOVER_GIVE_UP_S:.0f} s")


def part_failover(
    root: Path,
    kills: int,
    env: dict[str, str],
    session_ms: float,
    label: str,
    extra: dict[str, Any],
) -> list[Figure]:
    cluster = Cluster(root, 3, env)
    times: list[float] = []
    with running(cluster), httpx.Client() as client:
        cluster.start()
        cluster.create_topic("bench-failover", 3, 2)
        for k in range(kills):
            ms, _epochs = failover_once(cluster, "bench-failover", client)
            times.append(ms)
            print(f"  kill {k + 1}/{kills} ({label}): {ms:,.0f} ms", flush=True)
    extra[f"failover_ms_{label}"] = times
    bound = session_ms + 1000
    return [
        Figure(f"failover p50, {label}", percentile(times, 50), "ms", note=f"{kills} SIGKILLs"),
        Figure(
            f"failover p99, {label}",
            percentile(times, 99),
            "ms",
            bound,
            lower_is_better=True,
            note=f"target: session timeout {session_ms:,.0f} ms + 1 s",
        ),
        Figure(f"failover max, {label}", max(times), "ms"),
    ]


# -- 4. HTTP/2 fetch ---------------------------------------------------------------------------

H2_READ_MIB = 64  # what the broker-level reads go over: 64 batches of ~1 MiB
REPLICA_FETCH_MAX_BYTES = 1_048_576  # replica.fetch.max.bytes (a follower's per-partition ask)


class _RecordsReader(Http1Client):
    """One keep-alive HTTP/1.1 connection reading a partition's binary records (a consumer's
    ``GET …/records?offset=&max_bytes=``), bodies received in place as in ``h2_fetch``."""

    host = ""  # the Host header: the broker checks it names itself

    async def read(self, path: str) -> bytes:
        assert self.transport is not None
        self.done = asyncio.get_running_loop().create_future()
        self.transport.write(
            f"GET {path} HTTP/1.1\r\nhost: {self.host}\r\naccept: {BATCH_CT}\r\n"
            "logbus-route: direct\r\n\r\n".encode()
        )
        return await self.done


def _next_offset(data: bytes | memoryview, offset: int) -> int:
    last = None
    for _, header in scan_batches(data):
        last = header
    if last is None:
        raise RuntimeError(f"no batch in the answer at offset {offset}: {bytes(data[:300])!r}")
    return int(last.next_offset)


def _cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def _broker_reads(
    cluster: Cluster, topic: str, leader: int, follower: int, end: int, args: argparse.Namespace
) -> dict[str, Any]:
    """Alternating rounds of reading ``topic`` from offset 0 to ``end`` on one connection,
    one request in flight: h2c replica fetches as ``follower`` vs HTTP/1.1 consumer reads."""
    store = MetadataStore(cluster.metadata_url)
    try:
        brokers = {b.broker_id: b for b in store.brokers()}
    finally:
        store.close()
    lead, me = brokers[leader], brokers[follower]
    part = cluster.partition(topic)
    port = int(cluster.urls[leader].rsplit(":", 1)[1])
    h2 = H2Client(lead.host, lead.replication_port)
    loop = asyncio.get_running_loop()
    h1s: list[_RecordsReader] = []

    async def h1_conn() -> _RecordsReader:
        # Reopened when the broker closed it: its keep-alive timeout (5 s) can pass while the
        # h2c rounds run on a loaded machine.
        if not h1s or h1s[0].transport is None or h1s[0].transport.is_closing():
            _, new = await loop.create_connection(_RecordsReader, "127.0.0.1", port)
            new.host = f"127.0.0.1:{port}"
            h1s[:] = [new]
        return h1s[0]

    async def h2_read(offset: int) -> tuple[int, int]:
        req = wire.ReplicaFetchRequest(
            follower,
            me.broker_epoch,
            0,
            10 * REPLICA_FETCH_MAX_BYTES,
            REPLICA_FETCH_MAX_BYTES,
            {
                (topic, 0): FetchPosition(
                    offset, UNDEFINED_EPOCH, int(part["leader_epoch"]), -1, end
                )
            },
        )
        body = wire.encode_request(req)
        response = await h2.request("POST", wire.PATH, body=body, timeout_s=REQUEST_TIMEOUT_S)
        if response.status != 200 or not isinstance(response.body, bytes):
            raise RuntimeError(f"replica fetch answered {response.status}")
        ((_, answer, data),) = wire.decode_answer(response.body)
        if answer.error is not None:
            raise RuntimeError(f"replica fetch at {offset}: {answer.error}")
        return len(data), _next_offset(data, offset)

    async def h1_read(offset: int) -> tuple[int, int]:
        path = f"/v1/topics/{topic}/partitions/0/records?offset={offset}"
        data = await (await h1_conn()).read(f"{path}&max_bytes={REPLICA_FETCH_MAX_BYTES}")
        return len(data), _next_offset(data, offset)

    readers = {"http1": h1_read, "h2c_replica_fetch": h2_read}
    pid = cluster.brokers[leader].proc.pid  # type: ignore[union-attr]
    rounds: dict[str, list[dict[str, float]]] = {name: [] for name in readers}
    try:
        for read in readers.values():  # warm up: connections, page cache
            offset = 0
            while offset < end:
                offset = (await read(offset))[1]
        for _ in range(args.rounds):
            for name, read in readers.items():
                total = 0
                cpu0, t0 = _cpu_s(pid), time.perf_counter()
                while True:
                    offset = 0
                    while offset < end:
                        n, offset = await read(offset)
                        total += n
                    if time.perf_counter() - t0 >= args.h2_seconds:
                        break
                elapsed = time.perf_counter() - t0
                rounds[name].append(
                    {
                        "mb_per_s": total / elapsed / 1e6,
                        "leader_cpu_s_per_gb": (_cpu_s(pid) - cpu0) / (total / 1e9),
                    }
                )
    finally:
        await h2.close()
        if h1s and h1s[0].transport is not None:
            h1s[0].transport.close()
    return {
        name: {
            "mb_per_s": statistics.median(r["mb_per_s"] for r in v),
            "leader_cpu_s_per_gb": statistics.median(r["leader_cpu_s_per_gb"] for r in v),
            "rounds": v,
        }
        for name, v in rounds.items()
    }


def part_h2_broker(
    cluster: Cluster, args: argparse.Namespace, extra: dict[str, Any]
) -> list[Figure]:
    """The replication fetch of a real leader on one h2c connection vs a plain HTTP/1.1 read
    of the same bytes from the same broker (module docstring, part 4)."""
    topic = "bench-h2-read"
    cluster.create_topic(topic, 3, 2)
    leader, url = cluster.leader_url(topic)
    follower = min(i for i in cluster.urls if i != leader)
    batch, _ = binary_batch()
    with httpx.Client(timeout=REQUEST_TIMEOUT_S) as client:
        for _ in range(H2_READ_MIB):
            r = client.post(
                f"{url}/v1/topics/{topic}/partitions/0/records",
                params={"acks": "all"},
                content=batch,
                headers={"Content-Type": BATCH_CT, **DIRECT},
            )
            r.raise_for_status()
    end = int(cluster.partition(topic, url)["high_watermark"])
    try:
        import uvloop  # what the brokers run on; the client's loop is part of the cost

        result = uvloop.run(_broker_reads(cluster, topic, leader, follower, end, args))
    except ImportError:
        result = asyncio.run(_broker_reads(cluster, topic, leader, follower, end, args))
    cluster.delete_topic(topic)
    extra["h2_broker_read"] = result
    h1, h2 = result["http1"], result["h2c_replica_fetch"]
    ratio = statistics.median(
        a["mb_per_s"] / b["mb_per_s"] for a, b in zip(h2["rounds"], h1["rounds"], strict=True)
    )
    print(
        f"  leader broker, {H2_READ_MIB} MiB in 1 MiB requests: h2c replica fetch "
        f"{h2['mb_per_s']:,.0f} MB/s, HTTP/1.1 consumer read {h1['mb_per_s']:,.0f} MB/s; "
        f"leader CPU {h2['leader_cpu_s_per_gb']:.2f} vs {h1['leader_cpu_s_per_gb']:.2f} s/GB",
        flush=True,
    )
    return [
        Figure(
            "h2c replication fetch / HTTP/1.1 read, same leader, one connection",
            ratio,
            "ratio",
            note=f"h2c {h2['mb_per_s']:,.0f} MB/s, HTTP/1.1 {h1['mb_per_s']:,.0f} MB/s; "
            f"1 MiB per request; leader CPU {h2['leader_cpu_s_per_gb']:.2f} vs "
            f"{h1['leader_cpu_s_per_gb']:.2f} s/GB",
        )
    ]


def part_h2(args: argparse.Namespace, workdir: Path, extra: dict[str, Any]) -> list[Figure]:
    """The transport-only ``h2_fetch`` benchmark (h2c vs HTTP/1.1 reads of the same bytes
    from a synthetic server), run as a child; its ratios and CPU cost per GB."""
    if importlib.util.find_spec(H2_FETCH) is None:
        print(f"  {H2_FETCH} is not here: HTTP/2 fetch ratio not measured", flush=True)
        extra["h2_fetch"] = f"missing: no {H2_FETCH} in this tree"
        return []
    out = workdir / "h2.json"
    cmd = [sys.executable, "-m", H2_FETCH, "--no-httpx", "--json", str(out)]
    cmd += ["--rounds", "1", "--seconds", "0.5"] if args.quick else ["--rounds", "3"]
    subprocess.run(cmd, check=True, timeout=600)
    report = json.loads(out.read_text())
    extra["h2_fetch"] = report
    figures = []
    for size, entry in report["results"].items():
        mb_s, cpu = entry["mb_per_s"], entry["cpu_s_per_gb"]
        figures.append(
            Figure(
                f"h2c / HTTP/1.1, transport only, {size} bodies, one connection",
                entry["ratio_h2c_to_http1_raw"],
                "ratio",
                note=f"h2c {mb_s['h2c']:,.0f} MB/s, HTTP/1.1 {mb_s['http1_raw']:,.0f} MB/s; "
                f"client CPU {cpu['h2c']['client']:.2f} vs {cpu['http1_raw']['client']:.2f} s/GB",
            )
        )
        if "ratio_h2c_replica_wire_to_http1_raw" in entry:  # the replication fetch's own path
            figures.append(
                Figure(
                    f"h2c replica_wire / HTTP/1.1, transport only, {size}",
                    entry["ratio_h2c_replica_wire_to_http1_raw"],
                    "ratio",
                    note=f"{mb_s.get('h2c_replica_wire', 0):,.0f} MB/s",
                )
            )
    return figures


# -- the run -----------------------------------------------------------------------------------


def print_table(figures: list[Figure]) -> None:
    print(f"\n{'measure':<62} {'value':>10} {'unit':<8} {'target':>9} {'met':>4}  note")
    for f in figures:
        met = {True: "yes", False: "NO", None: ""}[f.met]
        target = ""
        if f.target is not None:
            target = (
                "≤ " if f.lower_is_better else "≥ "
            ) + f"{f.target:,.{0 if f.target >= 10 else 2}f}"
        value = f"{f.value:,.2f}" if f.unit == "ratio" else f"{f.value:,.0f}"
        print(f"{f.name:<62} {value:>10} {f.unit:<8} {target:>9} {met:>4}  {f.note}")


def plot(out: dict[str, Any], path: Path) -> None:
    """Three panels: throughput per case relative to RF=1, the lag distribution, every failover."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    extra = out["extra"]
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.6))
    ax = axes[0]
    cases = ["rf1_standalone", "rf1_cluster", "rf3_direct", "rf3_forwarded"]
    labels = [
        "RF=1\nstandalone",
        "RF=1\ncluster",
        "RF=3 acks=all\nleader",
        "RF=3 acks=all\nforwarded",
    ]
    rounds = extra.get("throughput_rounds", {})
    width = 0.38
    for k, kind in enumerate(rounds):
        rows = rounds[kind]
        ratios = [statistics.median(r[c] / r["rf1_standalone"] for r in rows) for c in cases]
        xs = [i + (k - 0.5) * width for i in range(len(cases))]
        ax.bar(xs, ratios, width, label=kind)
        for x, r in zip(xs, ratios, strict=True):
            ax.text(x, r, f"{r:.2f}", ha="center", va="bottom", fontsize=7)
    ax.axhline(0.33, color="black", linestyle="--", linewidth=1, label="target 0.33")
    ax.set_xticks(range(len(cases)), labels, fontsize=8)
    ax.set_ylabel("produce records/s ÷ RF=1 standalone")
    ax.set_title("produce throughput (median of rounds)", fontsize=10)
    ax.legend(fontsize=8)

    ax = axes[1]
    lag = extra.get("lag")
    if lag:
        bars = ax.bar(["p50", "p99", "max"], [lag["ms"][k] for k in ("p50", "p99", "max")])
        ax.bar_label(bars, fmt="%.0f ms", fontsize=8)
        ax.set_ylabel("ms until the follower has the leader's LEO")
        ax.set_title(
            f"replication lag at {lag['rate_achieved_records_s']:,.0f} records/s\n"
            f"(records: p50 {lag['records']['p50']:,.0f}, p99 {lag['records']['p99']:,.0f})",
            fontsize=10,
        )

    ax = axes[2]
    for key, value in extra.items():
        if key.startswith("failover_ms_"):
            label = key.removeprefix("failover_ms_")
            ax.plot(range(1, len(value) + 1), value, "o", label=label)
    ax.axhline(
        out["settings"]["failover_session_timeout_ms"] + 1000,
        color="black",
        linestyle="--",
        linewidth=1,
        label="session timeout + 1 s (test timings)",
    )
    ax.set_ylim(bottom=0)
    ax.set_xlabel("kill #")
    ax.set_ylabel("ms from SIGKILL to an acks=all write accepted")
    ax.set_title("leader failover", fontsize=10)
    ax.legend(fontsize=8)
    fig.suptitle(
        f"{PLOT_TITLE} ({out['date']}, load average {out['machine']['load_average_during']:.1f})",
        fontsize=10,
    )
    fig.tight_layout()
    fig.savefig(path, dpi=110)


class LoadWatch:
    """The 1-minute load average every 5 s during the run: the other work on this machine."""

    def __init__(self) -> None:
        self.values: list[float] = [os.getloadavg()[0]]
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while not self._stop.wait(5.0):
            self.values.append(os.getloadavg()[0])

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()
        self.values.append(os.getloadavg()[0])


Runner = Callable[[argparse.Namespace, Path], tuple[list[Figure], dict[str, Any]]]


def measured_run(
    name: str, args: argparse.Namespace, argv: list[str] | None, runner: Runner
) -> tuple[list[Figure], dict[str, Any], float, list[float]]:
    """Run ``runner`` in a scratch directory under ``args.data_dir`` (removed after), watching
    the machine's load. Returns its figures and extra, when it started and the loads seen,
    and the report's common head (date, source, command, machine) in ``extra["_head"]``."""
    base = Path(args.data_dir)
    base.mkdir(parents=True, exist_ok=True)
    workdir = Path(tempfile.mkdtemp(prefix=f"bench-{name}-", dir=base))
    started = time.time()
    watch = LoadWatch()
    try:
        figures, extra = runner(args, workdir)
    finally:
        watch.stop()
        shutil.rmtree(workdir, ignore_errors=True)
    seen = watch.values
    extra["_head"] = {
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(started)),
        "source": describe_source(),
        "command": f"python -m benchmarks.{name} "
        + " ".join(sys.argv[1:] if argv is None else argv),
        "machine": {
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "load_average_start": seen[0],
            "load_average_end": seen[-1],
            "load_average_during": statistics.mean(seen),
            "load_average_max": max(seen),
        },
    }
    return figures, extra, started, seen


def run_summary(started: float, seen: list[float], driver: str, source: str) -> str:
    return (
        f"\n{time.time() - started:.0f} s in all; 1-min load average {seen[0]:.1f} at the "
        f"start, {statistics.mean(seen):.1f} mean, {max(seen):.1f} max, {seen[-1]:.1f} at the "
        f"end; driver {driver}; source {source}"
    )


def run(args: argparse.Namespace, workdir: Path) -> tuple[list[Figure], dict[str, Any]]:
    figures: list[Figure] = []
    extra: dict[str, Any] = {"part_seconds": {}}
    rf3_binary = 0.0
    t0 = time.monotonic()

    def done(part: str) -> None:
        nonlocal t0
        extra["part_seconds"][part] = round(time.monotonic() - t0, 1)
        print(f"  ({part}: {time.monotonic() - t0:.0f} s)", flush=True)
        t0 = time.monotonic()

    if {"throughput", "lag", "h2"} & set(args.only):
        single = BrokerProcess(workdir / "single" / "data")
        (workdir / "single").mkdir(parents=True, exist_ok=True)
        cluster = Cluster(workdir / "cluster", 3)
        with running(single, cluster):
            if "throughput" in args.only:
                start_patiently(single)
            cluster.start()
            done("start brokers")
            if "throughput" in args.only:
                print("throughput (acks=all):", flush=True)
                figures += part_throughput(single, cluster, args, workdir, extra)
                rf3_binary = statistics.median(
                    r["rf3_direct"] for r in extra["throughput_rounds"]["binary"]
                )
                done("throughput")
            if "lag" in args.only:
                rate = args.lag_rate or (rf3_binary / 2 if rf3_binary else 50_000)
                print(f"replication lag at {rate:,.0f} records/s:", flush=True)
                figures += part_lag(cluster, args, rate, extra)
                done("lag")
            if "h2" in args.only:
                print("HTTP/2 replication fetch vs HTTP/1.1 read, one leader broker:", flush=True)
                figures += part_h2_broker(cluster, args, extra)
                done("h2 broker")
    if "failover" in args.only:
        print("failover (test timings):", flush=True)
        session = float(FAILOVER_ENV["LOGBUS_BROKER_SESSION_TIMEOUT_MS"])
        figures += part_failover(
            workdir / "failover", args.kills, FAILOVER_ENV, session, "test timings", extra
        )
        if args.default_kills:
            print("failover (default timings):", flush=True)
            figures += part_failover(
                workdir / "failover-default",
                args.default_kills,
                {},
                DEFAULT_SESSION_TIMEOUT_MS,
                "default timings",
                extra,
            )
        done("failover")
    if "h2" in args.only:
        print("HTTP/2 fetch vs HTTP/1.1, transport only (benchmarks.h2_fetch):", flush=True)
        figures += part_h2(args, workdir, extra)
        done("h2")
    return figures, extra


PARTS = ("throughput", "lag", "failover", "h2")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a smoke run (≈ 40 s)")
    parser.add_argument("--json", default="docs/bench-cluster.json", help="'' for none")
    parser.add_argument("--plot", default="docs/bench-cluster.png", help="'' for none")
    parser.add_argument("--replot", metavar="JSON", help="only draw --plot from a --json")
    parser.add_argument("--data-dir", default="bench-data")
    parser.add_argument("--seconds", type=float, help="per throughput measurement (4; quick 1)")
    parser.add_argument("--rounds", type=int, help="throughput rounds (3; quick 1)")
    parser.add_argument("--lag-rate", type=float, help="records/s (half the RF=3 binary rate)")
    parser.add_argument("--lag-seconds", type=float, help="steady load for the lag (10; quick 2)")
    parser.add_argument("--sample-ms", type=float, default=50)
    parser.add_argument("--kills", type=int, help="leader SIGKILLs, test timings (20; quick 2)")
    parser.add_argument("--default-kills", type=int, default=0, help="also with default timings")
    parser.add_argument(
        "--h2-seconds", type=float, help="per broker-level read round (2; quick 0.5)"
    )
    parser.add_argument("--driver", choices=["wrk", "python"], help="load generator (wrk if found)")
    parser.add_argument(
        "--only", default=",".join(PARTS), help=f"comma-separated parts of {', '.join(PARTS)}"
    )
    args = parser.parse_args(argv)
    if args.replot:
        if not args.plot:
            parser.error("--replot needs --plot")
        plot(json.loads(Path(args.replot).read_text()), Path(args.plot))
        return 0
    q = args.quick
    args.seconds = args.seconds or (1.0 if q else 4.0)
    args.rounds = args.rounds or (1 if q else 3)
    args.lag_seconds = args.lag_seconds or (2.0 if q else 10.0)
    args.kills = args.kills if args.kills is not None else (2 if q else 20)
    args.h2_seconds = args.h2_seconds or (0.5 if q else 2.0)
    args.driver = args.driver or ("wrk" if shutil.which("wrk") else "python")
    args.only = [p.strip() for p in args.only.split(",") if p.strip()]
    if unknown := set(args.only) - set(PARTS):
        parser.error(f"unknown parts: {', '.join(sorted(unknown))}")

    figures, extra, started, seen = measured_run("cluster", args, argv, run)
    print_table(figures)
    out: dict[str, Any] = {
        **extra.pop("_head"),
        "settings": {
            **{k: getattr(args, k) for k in ("quick", "seconds", "rounds", "lag_seconds")},
            **{k: getattr(args, k) for k in ("sample_ms", "kills", "default_kills", "driver")},
            "failover_env": FAILOVER_ENV,
            "failover_session_timeout_ms": float(FAILOVER_ENV["LOGBUS_BROKER_SESSION_TIMEOUT_MS"]),
        },
        "figures": [asdict(f) | {"met": f.met} for f in figures],
        "extra": extra,
    }
    print(run_summary(started, seen, args.driver, out["source"]))
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=2) + "\n")
    if args.plot:
        try:
            plot(out, Path(args.plot))
        except ImportError:
            print("no plot: matplotlib is missing (pip install -e '.[bench]')")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
