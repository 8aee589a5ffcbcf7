"""The options of the ``logbus`` data source, parsed once into frozen values.

Names and meanings follow Spark's Kafka source and sink (``subscribe``, ``startingOffsets``,
``maxOffsetsPerTrigger``, ``failOnDataLoss``, ...); Logbus-specific ones are ``url`` (one or
several broker URLs, comma-separated, like Kafka's ``bootstrap.servers``),
``token``/``tokenFile`` (sent as ``Authorization: Bearer``), ``fetchMaxBytes`` and
``requestTimeoutMs``; the sink's ``transactional`` and Kafka's ``transaction.timeout.ms``
(also as ``kafka.transaction.timeout.ms``);
the source's ``isolation.level`` (also as Spark's ``kafka.isolation.level``). Option names
are case-insensitive, as in Spark.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

from logbus_client.routing import parse_bootstrap

from . import limits
from .errors import OptionError
from .offsets import (
    EARLIEST,
    LATEST,
    PartitionOffsets,
    TopicPartition,
    from_json_dict,
    parse_json_offsets,
)

OffsetSpec = Literal["earliest", "latest"] | PartitionOffsets
# Kafka's consumer setting, bare or with Spark's kafka. prefix for consumer configs.
ISOLATION_OPTIONS = ("isolation.level", "kafka.isolation.level")


@dataclass(frozen=True)
class Connection:
    """How to reach the brokers; shared by the source and the sink. ``url``: one or several
    broker URLs, comma-separated (any of them bootstraps; see logbus_client.routing)."""

    url: str
    token: str | None = None
    token_file: str | None = None
    request_timeout_s: float = limits.REQUEST_TIMEOUT_S

    @property
    def urls(self) -> list[str]:
        return parse_bootstrap(self.url)

    def auth_token(self) -> str | None:
        if self.token_file is not None:
            with open(self.token_file, encoding="utf-8") as f:
                return f.read().strip()
        return self.token


@dataclass(frozen=True)
class Subscription:
    """Exactly one of Kafka's ``subscribe``, ``subscribePattern``, ``assign``."""

    topics: tuple[str, ...] = ()
    pattern: str | None = None
    assigned: tuple[TopicPartition, ...] = ()

    def matches(self, topic: str) -> bool:
        if self.pattern is not None:
            return re.fullmatch(self.pattern, topic) is not None
        if self.assigned:
            return any(t == topic for t, _ in self.assigned)
        return topic in self.topics


@dataclass(frozen=True)
class SourceOptions:
    connection: Connection
    subscription: Subscription
    starting: OffsetSpec = "latest"
    starting_timestamp: int | None = None
    starting_by_timestamp: PartitionOffsets | None = None
    timestamp_strategy: Literal["error", "latest"] = "error"
    ending: OffsetSpec = "latest"
    ending_timestamp: int | None = None
    ending_by_timestamp: PartitionOffsets | None = None
    max_offsets_per_trigger: int | None = None
    min_offsets_per_trigger: int | None = None
    max_trigger_delay_ms: int = 15 * 60 * 1000
    fail_on_data_loss: bool = True
    include_headers: bool = False
    fetch_max_bytes: int = limits.FETCH_MAX_BYTES
    min_partitions: int | None = None
    max_records_per_partition: int | None = None
    read_committed: bool = False  # isolation.level / kafka.isolation.level


@dataclass(frozen=True)
class SinkOptions:
    connection: Connection
    topic: str | None = None
    max_request_bytes: int = limits.PRODUCE_MAX_BYTES
    max_request_records: int = limits.PRODUCE_MAX_RECORDS
    acks: str = "all"
    transactional: bool = True
    transaction_timeout_ms: int = limits.TRANSACTION_TIMEOUT_MS
    fail_once_marker: str | None = None  # tests only: see spark_sink.sink
    fail_commit_once_marker: str | None = None  # tests only: see spark_sink.sink


def _lower(options: Mapping[str, str]) -> dict[str, str]:
    return {k.lower(): v for k, v in options.items() if v is not None}


def _int(opts: Mapping[str, str], name: str, low: int = 0) -> int | None:
    raw = opts.get(name.lower())
    if raw is None:
        return None
    try:
        value = int(raw)
    except ValueError:
        raise OptionError(f"option {name} must be an integer, got {raw!r}") from None
    if value < low:
        raise OptionError(f"option {name} must be at least {low}, got {value}")
    return value


def _bool(opts: Mapping[str, str], name: str, default: bool) -> bool:
    raw = opts.get(name.lower())
    if raw is None:
        return default
    if raw.strip().lower() in ("true", "false"):
        return raw.strip().lower() == "true"
    raise OptionError(f"option {name} must be true or false, got {raw!r}")


_DURATION = re.compile(r"^\s*(\d+)\s*(ms|s|m|min|h|d)?\s*$")
_UNIT_MS = {"ms": 1, None: 1, "s": 1000, "m": 60_000, "min": 60_000, "h": 3_600_000}


def parse_duration_ms(raw: str, name: str) -> int:
    """Spark's time strings: ``500ms``, ``30s``, ``15m``, ``1h``, ``1d`` (bare numbers: ms)."""
    m = _DURATION.match(raw.lower())
    if not m:
        raise OptionError(f"option {name} must be a duration like 30s or 15m, got {raw!r}")
    return int(m[1]) * _UNIT_MS.get(m[2], 86_400_000)


def connection_of(opts: Mapping[str, str]) -> Connection:
    url = opts.get("url")
    if not url:
        raise OptionError('option url is required, e.g. .option("url", "http://127.0.0.1:8080")')
    try:
        urls = parse_bootstrap(url)
    except ValueError as e:
        raise OptionError(
            f"option url must be one or several http:// or https:// URLs, comma-separated: {e}"
        ) from None
    timeout_ms = _int(opts, "requestTimeoutMs", 1)
    return Connection(
        url=",".join(urls),
        token=opts.get("token"),
        token_file=opts.get("tokenfile"),
        request_timeout_s=timeout_ms / 1000 if timeout_ms else limits.REQUEST_TIMEOUT_S,
    )


def _subscription(opts: Mapping[str, str]) -> Subscription:
    given = [k for k in ("subscribe", "subscribepattern", "assign") if opts.get(k)]
    if len(given) != 1:
        raise OptionError(
            "exactly one of the options subscribe, subscribePattern, assign is required"
            f" (got {len(given)})"
        )
    if given[0] == "subscribe":
        topics = tuple(t.strip() for t in opts["subscribe"].split(",") if t.strip())
        if not topics:
            raise OptionError("option subscribe must list at least one topic")
        return Subscription(topics=topics)
    if given[0] == "subscribepattern":
        try:
            re.compile(opts["subscribepattern"])
        except re.error as e:
            raise OptionError(f"option subscribePattern is not a valid regex: {e}") from None
        return Subscription(pattern=opts["subscribepattern"])
    try:
        doc = json.loads(opts["assign"])
    except json.JSONDecodeError as e:
        raise OptionError(f'option assign must be JSON like {{"t":[0,1]}}: {e}') from None
    if not isinstance(doc, dict) or not all(
        isinstance(ps, list) and all(isinstance(p, int) for p in ps) for ps in doc.values()
    ):
        raise OptionError('option assign must be JSON like {"topicA":[0,1],"topicB":[2,4]}')
    assigned = tuple(sorted((t, p) for t, ps in doc.items() for p in ps))
    if not assigned:
        raise OptionError("option assign must name at least one partition")
    return Subscription(assigned=assigned)


def _offset_spec(
    opts: Mapping[str, str], name: str, default: Literal["earliest", "latest"]
) -> OffsetSpec:
    raw = opts.get(name.lower())
    if raw is None:
        return default
    if raw.strip().lower() in ("earliest", "latest"):
        return "earliest" if raw.strip().lower() == "earliest" else "latest"
    offsets = parse_json_offsets(raw, f"option {name}")
    for tp, off in offsets.items():
        if off < EARLIEST:
            raise OptionError(f"option {name}: offset {off} of {tp[0]}-{tp[1]} is not valid")
    return offsets


def _timestamps(opts: Mapping[str, str], name: str) -> PartitionOffsets | None:
    raw = opts.get(name.lower())
    if raw is None:
        return None
    try:
        return from_json_dict(json.loads(raw), f"option {name}")
    except json.JSONDecodeError as e:
        raise OptionError(f"option {name} is not valid JSON: {e}") from None


def source_options(options: Mapping[str, str], *, batch: bool) -> SourceOptions:
    """Parse and check the options of ``readStream`` (``batch=False``) or ``read``."""
    opts = _lower(options)
    starting = _offset_spec(opts, "startingOffsets", "earliest" if batch else "latest")
    ending = _offset_spec(opts, "endingOffsets", "latest")
    if batch:
        if starting == "latest" or (isinstance(starting, dict) and LATEST in starting.values()):
            raise OptionError("startingOffsets latest (or -1) is not allowed in a batch query")
        if ending == "earliest" or (isinstance(ending, dict) and EARLIEST in ending.values()):
            raise OptionError("endingOffsets earliest (or -2) is not allowed in a batch query")
    else:
        for name in ("endingOffsets", "endingTimestamp", "endingOffsetsByTimestamp"):
            if name.lower() in opts:
                raise OptionError(f"option {name} is for batch queries only")
    strategy = opts.get("startingoffsetsbytimestampstrategy", "error").lower()
    if strategy not in ("error", "latest"):
        raise OptionError("option startingOffsetsByTimestampStrategy must be error or latest")
    max_offsets = _int(opts, "maxOffsetsPerTrigger", 1)
    min_offsets = _int(opts, "minOffsetsPerTrigger", 1)
    if max_offsets is not None and min_offsets is not None and min_offsets > max_offsets:
        raise OptionError("minOffsetsPerTrigger must not be above maxOffsetsPerTrigger")
    delay = opts.get("maxtriggerdelay")
    isolation = {opts[k].strip().lower() for k in ISOLATION_OPTIONS if k in opts}
    if len(isolation) > 1 or not isolation <= {"read_uncommitted", "read_committed"}:
        raise OptionError(
            "option isolation.level (or kafka.isolation.level) must be read_uncommitted (the "
            f"default) or read_committed, got {sorted(isolation)}"
        )
    fetch_bytes = _int(opts, "fetchMaxBytes", 1024) or limits.FETCH_MAX_BYTES
    return SourceOptions(
        connection=connection_of(opts),
        subscription=_subscription(opts),
        starting=starting,
        starting_timestamp=_int(opts, "startingTimestamp"),
        starting_by_timestamp=_timestamps(opts, "startingOffsetsByTimestamp"),
        timestamp_strategy="latest" if strategy == "latest" else "error",
        ending=ending,
        ending_timestamp=_int(opts, "endingTimestamp"),
        ending_by_timestamp=_timestamps(opts, "endingOffsetsByTimestamp"),
        max_offsets_per_trigger=max_offsets,
        min_offsets_per_trigger=min_offsets,
        max_trigger_delay_ms=(
            parse_duration_ms(delay, "maxTriggerDelay") if delay is not None else 15 * 60 * 1000
        ),
        fail_on_data_loss=_bool(opts, "failOnDataLoss", True),
        include_headers=_bool(opts, "includeHeaders", False),
        fetch_max_bytes=min(fetch_bytes, limits.FETCH_MAX_BYTES_CEILING),
        min_partitions=_int(opts, "minPartitions", 1),
        max_records_per_partition=_int(opts, "maxRecordsPerPartition", 1),
        read_committed=isolation == {"read_committed"},
    )


def sink_options(options: Mapping[str, str]) -> SinkOptions:
    opts = _lower(options)
    acks = opts.get("acks", "all")
    if acks not in ("all", "1"):
        raise OptionError("option acks must be all or 1 (acks=0 answers without offsets)")
    transactional = _bool(opts, "transactional", True)
    if transactional and acks != "all":
        raise OptionError(
            "option acks=1 needs transactional=false: transactional writes are acks=all"
        )
    timeouts = {
        _int(opts, name, 1) for name in ("transaction.timeout.ms", "kafka.transaction.timeout.ms")
    }
    timeouts.discard(None)
    if len(timeouts) > 1:
        raise OptionError("options transaction.timeout.ms and kafka.transaction.timeout.ms differ")
    timeout_ms = timeouts.pop() if timeouts else None
    if timeout_ms is not None and timeout_ms > 2**31 - 1:
        raise OptionError(f"option transaction.timeout.ms must be at most {2**31 - 1}")
    return SinkOptions(
        connection=connection_of(opts),
        topic=opts.get("topic") or None,
        max_request_bytes=_int(opts, "maxRequestBytes", 1) or limits.PRODUCE_MAX_BYTES,
        max_request_records=_int(opts, "maxRequestRecords", 1) or limits.PRODUCE_MAX_RECORDS,
        acks=acks,
        transactional=transactional,
        transaction_timeout_ms=timeout_ms or limits.TRANSACTION_TIMEOUT_MS,
        fail_once_marker=opts.get("testing.failoncemarker"),
        fail_commit_once_marker=opts.get("testing.failcommitoncemarker"),
    )
