"""The ``logbus`` data source: streaming reader, batch reader (and, via :mod:`.sink`, writers).

Theory of operation. The driver side (``initialOffset``, ``latestOffset``, ``partitions``)
asks the broker for partition metadata — one ``GET /v1/topics/{t}/partitions`` per subscribed
topic per trigger — and plans one task per partition range ``[start, end)`` (ranges can be cut
further with ``minPartitions``/``maxRecordsPerPartition``). A task's ``read()`` opens its own
HTTP client and fetches ``[start, end)`` exactly, as binary record batches (2 MiB per request),
decoding them to Arrow in C: a re-run of a micro-batch reads the same rows.

Admission control follows Spark's Kafka source with the read limits Python sources have:
``maxOffsetsPerTrigger`` alone is ``ReadMaxRows``; ``minOffsetsPerTrigger`` is ``ReadMinRows``,
and then the reader also applies ``maxTriggerDelay`` and ``maxOffsetsPerTrigger`` itself (a
Python source cannot return Kafka's composite limit). ``ReadAllAvailable`` from the engine
(``Trigger.Once``) ignores both, as Spark requires.

Data loss (``failOnDataLoss``): offsets below a partition's log start when planning or
reading, a partition that went away, or an offset that went backwards (a recreated topic). With
the default ``true`` the query fails with :class:`DataLossError`; with ``false`` the reader logs
a warning and goes on from what is still there. Gaps that compaction leaves inside a range are
not data loss: the reader skips them, as Kafka consumers do.

Isolation (``isolation.level`` or ``kafka.isolation.level``, as Kafka's consumer setting):
``read_uncommitted`` (the default) reads every record up to the high watermark, open and
aborted transactions' included. ``read_committed`` plans every range up to the partition's
last stable offset instead (the first offset of a transaction still open), so a batch never
waits for, nor includes, an open transaction; the fetches ask ``isolation=read_committed`` and
the broker leaves out aborted records and the COMMIT/ABORT markers. A range [start, end) then
yields fewer rows than ``end - start`` and offsets with gaps; the reader goes on from the
fetch's next offset (past what was left out) and stops at ``end``.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import replace
from typing import Any

import pyarrow as pa  # type: ignore[import-untyped]
from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    DataSourceStreamWriter,
    DataSourceWriter,
    InputPartition,
)
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    ReadMinRows,
    SupportsTriggerAvailableNow,
)
from pyspark.sql.types import StructType

from . import limits
from .client import BinaryFetcher, LogbusClient, OutOfRange, PartitionState
from .columns import kafka_schema
from .errors import DATA_LOSS_HINT, BrokerError, DataLossError, OptionError
from .offsets import (
    EARLIEST,
    LATEST,
    OffsetRange,
    PartitionOffsets,
    TopicPartition,
    from_json_dict,
    rate_limit,
    split_ranges,
    to_json_dict,
)
from .options import OffsetSpec, SourceOptions, Subscription, sink_options, source_options

log = logging.getLogger("logbus.spark")


class LogbusDataSource(DataSource):
    """``spark.readStream.format("logbus")``, ``spark.read.format("logbus")`` and the writers."""

    @classmethod
    def name(cls) -> str:
        return "logbus"

    def schema(self) -> StructType:
        headers = str(self.options.get("includeHeaders", "false")).strip().lower() == "true"
        return kafka_schema(headers)

    def reader(self, schema: StructType) -> DataSourceReader:
        return LogbusBatchReader(source_options(self.options, batch=True))

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        return LogbusStreamReader(source_options(self.options, batch=False))

    def writer(self, schema: StructType, overwrite: bool) -> DataSourceWriter:
        from .sink import LogbusBatchWriter

        return LogbusBatchWriter(sink_options(self.options), schema)

    def streamWriter(self, schema: StructType, overwrite: bool) -> DataSourceStreamWriter:
        from .sink import LogbusStreamWriter

        return LogbusStreamWriter(sink_options(self.options), schema)


class RangePartition(InputPartition):
    """One task: records [start, end) of one partition."""

    def __init__(self, r: OffsetRange) -> None:
        super().__init__(r)
        self.range = r


# -- metadata ------------------------------------------------------------------------------


def discover(
    client: LogbusClient, sub: Subscription, committed: bool = False
) -> dict[TopicPartition, PartitionState]:
    """Every subscribed partition that exists now, with its log start and high watermark —
    at ``read_committed`` (``committed``) its last stable offset in place of the latter, so
    "latest" and every planned range end there."""
    if sub.pattern is not None:
        topics = [t for t in client.topics() if sub.matches(t)]
    elif sub.assigned:
        topics = sorted({t for t, _ in sub.assigned})
    else:
        topics = list(sub.topics)
    wanted = set(sub.assigned)
    out: dict[TopicPartition, PartitionState] = {}
    for topic in topics:
        for state in client.partitions(topic) or []:
            tp = (topic, state.partition)
            if not wanted or tp in wanted:
                if committed:  # the readable end: never past an open transaction
                    state = replace(state, high_watermark=state.last_stable_offset)
                out[tp] = state
    if len(out) > limits.MAX_TOPIC_PARTITIONS:
        raise OptionError(f"the subscription matches {len(out)} partitions, over the cap")
    return out


def resolve_offsets(
    client: LogbusClient,
    states: Mapping[TopicPartition, PartitionState],
    spec: OffsetSpec,
    timestamp: int | None,
    by_timestamp: PartitionOffsets | None,
    *,
    what: str,
    no_match: str,
) -> PartitionOffsets:
    """Offsets for every partition in ``states`` from an earliest/latest/JSON spec or from
    timestamps (which take precedence, global first, as in Kafka). ``no_match`` says what a
    timestamp after the last record gives: ``error`` or ``latest``."""
    if timestamp is not None or by_timestamp is not None:
        stamps: PartitionOffsets
        if timestamp is not None:
            stamps = dict.fromkeys(states, timestamp)
        else:
            assert by_timestamp is not None
            stamps = by_timestamp
        _require_all(states, stamps, what)
        out: PartitionOffsets = {}
        for tp, state in states.items():
            found = client.offset_for_timestamp(tp[0], tp[1], stamps[tp])
            if found is None and no_match == "error":
                raise OptionError(
                    f"{what}: no record of {tp[0]}-{tp[1]} has a timestamp at or after "
                    f"{stamps[tp]} (set startingOffsetsByTimestampStrategy to latest to start "
                    "at the end instead)"
                )
            out[tp] = state.high_watermark if found is None else found
        return out
    if spec == "earliest":
        return {tp: s.log_start_offset for tp, s in states.items()}
    if spec == "latest":
        return {tp: s.high_watermark for tp, s in states.items()}
    assert isinstance(spec, dict)
    _require_all(states, spec, what)
    return {
        tp: {EARLIEST: s.log_start_offset, LATEST: s.high_watermark}.get(spec[tp], spec[tp])
        for tp, s in states.items()
    }


def _require_all(
    states: Mapping[TopicPartition, PartitionState], given: Mapping[TopicPartition, Any], what: str
) -> None:
    if set(given) != set(states):
        missing = sorted(set(states) - set(given))
        extra = sorted(set(given) - set(states))
        raise OptionError(
            f"{what} must name every subscribed partition (use -2 for earliest, -1 for "
            f"latest); missing: {missing}, unknown: {extra}"
        )


def starting_offsets(
    client: LogbusClient, o: SourceOptions, states: dict[TopicPartition, PartitionState]
) -> PartitionOffsets:
    """Where a new query starts: ``startingTimestamp``, ``startingOffsetsByTimestamp`` or
    ``startingOffsets``, resolved against the partitions' current state."""
    return resolve_offsets(
        client,
        states,
        o.starting,
        o.starting_timestamp,
        o.starting_by_timestamp,
        what="startingOffsets",
        no_match=o.timestamp_strategy,
    )


def report_data_loss(fail: bool, message: str) -> None:
    if fail:
        raise DataLossError(f"{message} {DATA_LOSS_HINT}")
    log.warning("%s Skipping ahead (failOnDataLoss=false).", message)


def plan_ranges(
    start: Mapping[TopicPartition, int],
    end: Mapping[TopicPartition, int],
    states: Mapping[TopicPartition, PartitionState],
    opts: SourceOptions,
) -> list[OffsetRange]:
    """The tasks of one batch; data loss found here is reported per ``failOnDataLoss``."""
    ranges: list[OffsetRange] = []
    for tp in sorted(end):
        lo, hi = start.get(tp, 0), end[tp]
        name = f"{tp[0]}-{tp[1]}"
        state = states.get(tp)
        if hi < lo:
            report_data_loss(
                opts.fail_on_data_loss,
                f"Partition {name}'s offset went back from {lo} to {hi} (recreated or truncated).",
            )
            continue
        if hi == lo:
            continue
        if state is None:
            report_data_loss(
                opts.fail_on_data_loss, f"Partition {name} no longer exists; [{lo}, {hi}) is gone."
            )
            continue
        if lo < state.log_start_offset:
            skip_to = min(state.log_start_offset, hi)
            report_data_loss(
                opts.fail_on_data_loss,
                f"Offsets [{lo}, {skip_to}) of {name} were deleted before the query read them "
                f"(the log now starts at {state.log_start_offset}).",
            )
            lo = skip_to
        if lo < hi:
            ranges.append(OffsetRange(tp[0], tp[1], lo, hi))
    return split_ranges(ranges, opts.min_partitions, opts.max_records_per_partition)


# -- reading one range (executors) ---------------------------------------------------------


def read_range(opts: SourceOptions, r: OffsetRange) -> Iterator[pa.RecordBatch]:
    """Every record of ``r`` as Arrow batches (one per fetch). Deterministic for a range that
    is still in the log; deleted offsets are data loss (``failOnDataLoss``)."""
    if r.size <= 0:
        return
    from .columns import decode, record_batch

    name = f"{r.topic}-{r.partition}"
    ask = opts.fetch_max_bytes
    with BinaryFetcher(opts.connection) as fetcher:
        offset = r.start
        while offset < r.end:
            got = fetcher.fetch(r.topic, r.partition, offset, ask, opts.read_committed)
            if isinstance(got, OutOfRange):
                if offset >= got.log_start_offset:  # past the log end: truncated
                    report_data_loss(
                        opts.fail_on_data_loss,
                        f"Offsets [{offset}, {r.end}) of {name} are past the log end "
                        f"{got.log_end_offset} (the partition was truncated or recreated).",
                    )
                    return
                skip_to = min(got.log_start_offset, r.end)
                report_data_loss(
                    opts.fail_on_data_loss,
                    f"Offsets [{offset}, {skip_to}) of {name} were deleted before the query read "
                    f"them (the log now starts at {got.log_start_offset}).",
                )
                offset = skip_to
                continue
            cols = decode(got.data, offset, r.end, opts.include_headers)
            if cols[0]:
                yield record_batch(cols, r.topic, r.partition, opts.include_headers)
            past = cols[1]
            if opts.read_committed:  # aborted batches and markers were skipped: offsets gap
                past = max(past, min(got.next_offset, r.end))
            if past > offset:
                offset = past
            elif got.data and ask < limits.FETCH_MAX_BYTES_CEILING:
                ask = min(ask * 2, limits.FETCH_MAX_BYTES_CEILING)  # a batch larger than ask
            elif not got.data and got.high_watermark <= offset:
                report_data_loss(
                    opts.fail_on_data_loss,
                    f"Offsets [{offset}, {r.end}) of {name} are past the high watermark "
                    f"{got.high_watermark} (the partition was truncated or recreated).",
                )
                return
            else:
                raise BrokerError(
                    f"fetching {name} at {offset} made no progress (high watermark "
                    f"{got.high_watermark}, range end {r.end})",
                    status=200,
                )


# -- readers ---------------------------------------------------------------------------------


class _Driver:
    """What the streaming and batch readers share: options and a lazily opened client
    (dropped when the reader is pickled to executors)."""

    def __init__(self, opts: SourceOptions) -> None:
        self.opts = opts
        self._client: LogbusClient | None = None

    def client(self) -> LogbusClient:
        if self._client is None:
            self._client = LogbusClient(self.opts.connection)
        return self._client

    def close(self) -> None:
        if self._client is not None:
            self._client.close()
            self._client = None

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_client"] = None
        return state


class LogbusStreamReader(_Driver, DataSourceStreamReader, SupportsTriggerAvailableNow):
    def __init__(
        self, opts: SourceOptions, clock_ms: Callable[[], float] = lambda: time.time() * 1000
    ) -> None:
        super().__init__(opts)
        self._clock_ms = clock_ms
        self._target: PartitionOffsets | None = None  # Trigger.AvailableNow's end
        self._latest: PartitionOffsets | None = None  # for reportLatestOffset
        self._last_trigger_ms = 0.0

    def __getstate__(self) -> dict[str, Any]:
        state = super().__getstate__()
        state.pop("_clock_ms", None)
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._clock_ms = lambda: time.time() * 1000

    def initialOffset(self) -> dict[str, Any]:
        o = self.opts
        client = self.client()
        return to_json_dict(
            starting_offsets(client, o, discover(client, o.subscription, o.read_committed))
        )

    def prepareForTriggerAvailableNow(self) -> None:
        states = discover(self.client(), self.opts.subscription, self.opts.read_committed)
        self._target = {tp: s.high_watermark for tp, s in states.items()}

    def getDefaultReadLimit(self) -> ReadLimit:
        if self.opts.min_offsets_per_trigger is not None:
            return ReadMinRows(self.opts.min_offsets_per_trigger)
        if self.opts.max_offsets_per_trigger is not None:
            return ReadMaxRows(self.opts.max_offsets_per_trigger)
        return ReadAllAvailable()

    def latestOffset(self, start: dict[str, Any], limit: ReadLimit) -> dict[str, Any]:
        begin = from_json_dict(start, "start offset")
        states = discover(self.client(), self.opts.subscription, self.opts.read_committed)
        latest = {tp: s.high_watermark for tp, s in states.items()}
        self._latest = latest  # what the broker has, even past an availableNow target
        if self._target is not None:
            latest = {
                tp: min(hw, self._target[tp]) for tp, hw in latest.items() if tp in self._target
            }
        admitted = self._admit(begin, latest, limit)
        if admitted is None:
            return start
        end = dict(begin)  # partitions that went away stay at their offset
        end.update(admitted)
        return to_json_dict(end)

    def _admit(
        self, begin: PartitionOffsets, latest: PartitionOffsets, limit: ReadLimit
    ) -> PartitionOffsets | None:
        """End offsets under ``limit``; None to skip this trigger (minOffsetsPerTrigger)."""
        if isinstance(limit, ReadAllAvailable):
            return latest
        if isinstance(limit, ReadMaxRows):
            return rate_limit(begin, latest, limit.max_rows)
        if not isinstance(limit, ReadMinRows):
            raise OptionError(f"read limit {limit!r} is not supported by the logbus source")
        pending = sum(max(0, end - begin.get(tp, 0)) for tp, end in latest.items())
        if pending == 0:
            return latest
        now = self._clock_ms()
        due = now - self._last_trigger_ms >= self.opts.max_trigger_delay_ms
        if pending < limit.min_rows and not due and self._target is None:
            return None
        self._last_trigger_ms = now
        cap = self.opts.max_offsets_per_trigger
        return latest if cap is None else rate_limit(begin, latest, cap)

    def reportLatestOffset(self) -> dict[str, Any] | None:
        return None if self._latest is None else to_json_dict(self._latest)

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> list[InputPartition]:
        begin = from_json_dict(start, "start offset")
        until = from_json_dict(end, "end offset")
        if begin == until:
            return []
        states = discover(self.client(), self.opts.subscription, self.opts.read_committed)
        return [RangePartition(r) for r in plan_ranges(begin, until, states, self.opts)]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, RangePartition)
        return read_range(self.opts, partition.range)

    def commit(self, end: dict[str, Any]) -> None:
        pass

    def stop(self) -> None:
        self.close()


class LogbusBatchReader(_Driver, DataSourceReader):
    """``spark.read.format("logbus")``: [startingOffsets, endingOffsets) once."""

    def partitions(self) -> list[InputPartition]:
        o = self.opts
        client = self.client()
        try:
            states = discover(client, o.subscription, o.read_committed)
            start = starting_offsets(client, o, states)
            end = resolve_offsets(
                client,
                states,
                o.ending,
                o.ending_timestamp,
                o.ending_by_timestamp,
                what="endingOffsets",
                no_match="latest",
            )
        finally:
            self.close()
        return [RangePartition(r) for r in plan_ranges(start, end, states, o)]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, RangePartition)
        return read_range(self.opts, partition.range)
