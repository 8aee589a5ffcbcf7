"""Prometheus metrics of one broker: requests, bytes and records in/out, latency, offsets.

Each app gets its own registry (several brokers can run in one test process). Per-partition
offsets are collected at scrape time from the logs, so the hot path never updates them.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Iterator

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.registry import Collector

from cluster.broker import Broker
from cluster.coordinator import Coordinator

from .budgets import Budgets
from .loop_lag import LagRecorder
from .quota_state import METRICS_MAX_ENTITIES, QuotaState
from .security import Security

MAX_GROUPS_EXPORTED = 1_000  # a scrape stays bounded whatever the number of groups
LATENCY_BUCKETS_S = (
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1,
    2.5,
    5,
    10,
    30,
    60,
)


class _PartitionCollector(Collector):
    def __init__(self, broker: Broker) -> None:
        self.broker = broker

    def collect(self) -> Iterator[GaugeMetricFamily]:
        labels = ["topic", "partition"]
        leo = GaugeMetricFamily("logbus_partition_log_end_offset", "Log end offset", labels=labels)
        hw = GaugeMetricFamily("logbus_partition_high_watermark", "High watermark", labels=labels)
        lso = GaugeMetricFamily(
            "logbus_partition_log_start_offset", "Log start offset", labels=labels
        )
        size = GaugeMetricFamily("logbus_partition_size_bytes", "Bytes on disk", labels=labels)
        for p in self.broker.logs.partitions():
            key = [p.topic, str(p.partition)]
            leo.add_metric(key, p.log_end_offset)
            hw.add_metric(key, p.high_watermark)
            lso.add_metric(key, p.log_start_offset)
            size.add_metric(key, p.log.size_bytes)
        yield from (leo, hw, lso, size)
        if self.broker.replicas is not None:
            yield from self._replication()

    def _replication(self) -> Iterator[GaugeMetricFamily]:
        """Partitions this broker leads: ISR size, under-replication, each follower's lag."""
        assert self.broker.replicas is not None
        labels = ["topic", "partition"]
        isr = GaugeMetricFamily("logbus_partition_isr_size", "In-sync replicas", labels=labels)
        under = GaugeMetricFamily(
            "logbus_partition_under_replicated",
            "1 while the ISR is smaller than the replicas (the target ones while reassigning)",
            labels=labels,
        )
        moving = GaugeMetricFamily(
            "logbus_partition_reassigning",
            "1 while a reassignment of the partition is in progress",
            labels=labels,
        )
        lag = GaugeMetricFamily(
            "logbus_replica_lag_records",
            "Records the follower's log end is behind the leader's (-1: not fetched yet)",
            labels=[*labels, "follower"],
        )
        for (topic, partition), leading in self.broker.replicas.leading.items():
            key = [topic, str(partition)]
            state = leading.replica.state
            row = self.broker.replicas.rows.get((topic, partition))
            target = len(row.target_replicas) if row is not None else len(state.replicas)
            isr.add_metric(key, len(state.isr))
            under.add_metric(key, 1 if len(state.isr) < target else 0)
            moving.add_metric(key, 1 if row is not None and row.reassigning else 0)
            end = leading.partition.log_end_offset
            for follower, pos in leading.replica.followers.items():
                behind = end - pos.log_end_offset if pos.log_end_offset >= 0 else -1
                lag.add_metric([*key, str(follower)], behind)
        yield from (isr, under, moving, lag)


class _LogDirCollector(Collector):
    """Whether the data directory is offline after a storage error, and how many storage
    errors (failed writes, fsyncs, reads; full-disk appends included) it has seen."""

    def __init__(self, broker: Broker) -> None:
        self.broker = broker

    def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        d = self.broker.logs.log_dir
        offline = GaugeMetricFamily(
            "logbus_log_dir_offline",
            "1 once the data directory failed (restart to recover)",
            labels=["log_dir"],
        )
        offline.add_metric([str(d.path)], 1 if d.offline else 0)
        errors = CounterMetricFamily(
            "logbus_storage_errors", "Storage errors in the data directory", labels=["log_dir"]
        )
        errors.add_metric([str(d.path)], d.storage_errors)
        yield from (offline, errors)


class _GroupCollector(Collector):
    """Per group: members and total lag; per committed partition: the lag (scrape time)."""

    def __init__(self, coordinator: Coordinator) -> None:
        self.coordinator = coordinator

    def collect(self) -> Iterator[GaugeMetricFamily]:
        members = GaugeMetricFamily("logbus_group_members", "Group members", labels=["group"])
        lag = GaugeMetricFamily(
            "logbus_group_lag", "High watermark minus committed offset", labels=["group"]
        )
        plag = GaugeMetricFamily(
            "logbus_group_partition_lag",
            "Lag of a committed partition",
            labels=["group", "topic", "partition"],
        )
        for group_id in self.coordinator.group_ids()[:MAX_GROUPS_EXPORTED]:
            d = self.coordinator.describe(group_id)
            members.add_metric([group_id], len(d["members"]))
            lag.add_metric([group_id], d["lag"])
            for o in d["offsets"]:
                if o["lag"] is not None:
                    plag.add_metric([group_id, o["topic"], str(o["partition"])], o["lag"])
        yield from (members, lag, plag)


class _LimitsCollector(Collector):
    """Connections and bytes held for clients, against their caps (scrape time)."""

    def __init__(self, budgets: Budgets) -> None:
        self.budgets = budgets

    def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        b = self.budgets
        yield GaugeMetricFamily(
            "logbus_open_connections", "Open client connections", value=b.gate.open
        )
        yield CounterMetricFamily(
            "logbus_connections_refused",
            "Connections refused at accept (at max_connections, none idle)",
            value=b.gate.refused,
        )
        yield CounterMetricFamily(
            "logbus_connections_evicted",
            "Idle connections closed to admit a new one (at max_connections)",
            value=b.gate.evicted,
        )
        for name, budget, what in (
            ("logbus_inflight_body_bytes", b.body, "Request body bytes being read"),
            ("logbus_inflight_response_bytes", b.response, "Produce/fetch answer bytes sent"),
            ("logbus_queued_stream_bytes", b.stream, "WebSocket/SSE bytes read, not yet sent"),
        ):
            yield GaugeMetricFamily(name, what, value=budget.used_bytes)


class _QuotaCollector(Collector):
    """Per quota entity (Kafka's ``user`` / ``client-id`` tags; a ``<default>``-level quota is
    measured per concrete user or client): the measured rate, the quota and the throttle time
    handed out. Only measured entities (a quota applies to them), at most
    ``METRICS_MAX_ENTITIES`` of the most recently active."""

    def __init__(self, quotas: QuotaState) -> None:
        self.quotas = quotas

    def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        labels = ["quota_type", "user", "client_id"]
        rate = GaugeMetricFamily(
            "logbus_quota_rate",
            "Measured rate (bytes/s; request_percentage: % of one loop)",
            labels=labels,
        )
        limit = GaugeMetricFamily("logbus_quota_limit", "The quota in force", labels=labels)
        throttle = CounterMetricFamily(
            "logbus_quota_throttle_time_ms", "Throttle time handed out (ms)", labels=labels
        )
        for e in self.quotas.stats(METRICS_MAX_ENTITIES):
            values = [e.quota_type.value, e.user, e.client_id]
            rate.add_metric(values, e.rate)
            limit.add_metric(values, e.limit)
            throttle.add_metric(values, e.throttle_ms_total)
        yield rate
        yield limit
        yield throttle
        yield GaugeMetricFamily(
            "logbus_quota_sensors", "Clients measured against a quota", value=len(self.quotas)
        )


class _SecurityCollector(Collector):
    """Counters kept by api.security (plain dict increments on the request path)."""

    def __init__(self, security: Security) -> None:
        self.security = security
        self.stats = security.stats

    def collect(self) -> Iterator[CounterMetricFamily | GaugeMetricFamily]:
        watcher = self.security.watcher
        yield GaugeMetricFamily(
            "logbus_security_version",
            "The security state (users, keys, ACLs) version this broker enforces",
            value=self.security.version,
        )
        yield GaugeMetricFamily(
            "logbus_security_applied_poll",
            "logbus_security_polls when the current security version was applied",
            value=self.security.applied_at_poll,
        )
        yield CounterMetricFamily(
            "logbus_security_polls",
            "Reads of the security version (every 250 ms): changes apply within one or two",
            value=watcher.polls if watcher is not None else 0,
        )
        failures = CounterMetricFamily(
            "logbus_authentication_failures",
            "Requests refused 401, by reason (missing, malformed, invalid, expired)",
            labels=["reason"],
        )
        for reason, n in sorted(self.stats.failures.items()):
            failures.add_metric([reason], n)
        yield failures
        denials = CounterMetricFamily(
            "logbus_authorization_denials",
            "Requests or messages refused by the ACLs, by resource type",
            labels=["resource_type"],
        )
        for rtype, n in sorted(self.stats.denials.items()):
            denials.add_metric([rtype], n)
        yield denials


class _Traffic(Collector):
    """Produce and fetch requests, their latency, and bytes and records per topic.

    Counted in plain ints and exported at scrape time, under the same names a
    ``prometheus_client`` Counter and Histogram would use: their ``inc`` and ``observe`` take a
    lock each — a produce's four updates cost ≈ 3.0 µs that way, ≈ 0.75 µs here. The event loop
    is the only writer, so no lock is needed; a scrape reads between two of its steps."""

    def __init__(self) -> None:
        self.requests: dict[tuple[str, str, int], int] = {}
        # route → (bucket counts, one per bound and +Inf, not cumulative; sum of seconds)
        self.latency: dict[str, tuple[list[int], list[float]]] = {}
        self.topics: dict[tuple[str, str], list[int]] = {}  # (route, topic) → [bytes, records]

    def observe(
        self,
        route: str,
        method: str,
        topic: str,
        status: int,
        seconds: float,
        records: int = 0,
        size_bytes: int = 0,
    ) -> None:
        """Count one produce or fetch request (either path: fast or FastAPI)."""
        key = (route, method, status)
        self.requests[key] = self.requests.get(key, 0) + 1
        latency = self.latency.get(route)
        if latency is None:
            latency = self.latency[route] = ([0] * (len(LATENCY_BUCKETS_S) + 1), [0.0])
        latency[0][bisect.bisect_left(LATENCY_BUCKETS_S, seconds)] += 1
        latency[1][0] += seconds
        if status < 300:
            counts = self.topics.get((route, topic))
            if counts is None:
                counts = self.topics[(route, topic)] = [0, 0]
            counts[0] += size_bytes
            counts[1] += records

    def forget_topic(self, topic: str) -> None:
        for route in ("produce", "fetch"):
            self.topics.pop((route, topic), None)

    def collect(self) -> Iterator[CounterMetricFamily | HistogramMetricFamily]:
        requests = CounterMetricFamily(
            "logbus_http_requests", "HTTP requests", labels=["route", "method", "status"]
        )
        for (route, method, status), n in sorted(self.requests.items()):
            requests.add_metric([route, method, str(status)], n)
        yield requests
        latency = HistogramMetricFamily(
            "logbus_http_request_duration_seconds", "Time to answer", labels=["route"]
        )
        for route, (counts, total) in sorted(self.latency.items()):
            buckets = []
            running = 0
            for bound, n in zip((*LATENCY_BUCKETS_S, math.inf), counts, strict=True):
                running += n
                buckets.append(("+Inf" if bound == math.inf else repr(float(bound)), running))
            latency.add_metric([route], buckets, total[0])
        yield latency
        for route, kind, index, what in (
            ("produce", "bytes_in", 0, "Bytes produced"),
            ("fetch", "bytes_out", 0, "Bytes fetched"),
            ("produce", "records_in", 1, "Records produced"),
            ("fetch", "records_out", 1, "Records fetched"),
        ):
            family = CounterMetricFamily(f"logbus_{kind}", what, labels=["topic"])
            for (r, topic), counts in sorted(self.topics.items()):
                if r == route:
                    family.add_metric([topic], counts[index])
            yield family


class Metrics:
    def __init__(
        self,
        broker: Broker,
        coordinator: Coordinator | None = None,
        budgets: Budgets | None = None,
        quotas: QuotaState | None = None,
    ) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.traffic = _Traffic()
        r.register(self.traffic)
        self.loop_lag = LagRecorder(r)
        r.register(_PartitionCollector(broker))
        r.register(_LogDirCollector(broker))
        if coordinator is not None:
            r.register(_GroupCollector(coordinator))
        if budgets is not None:
            r.register(_LimitsCollector(budgets))
        if quotas is not None:
            r.register(_QuotaCollector(quotas))
        self.observe = self.traffic.observe

    def forget_topic(self, topic: str) -> None:
        """Drop a deleted topic's series."""
        self.traffic.forget_topic(topic)

    def watch_security(self, security: Security) -> None:
        """Authentication failures by reason and authorization denials by resource type."""
        self.registry.register(_SecurityCollector(security))

    def render(self) -> bytes:
        return generate_latest(self.registry)
