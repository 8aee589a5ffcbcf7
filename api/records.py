"""Produce and fetch, independent of the web framework.

Both the lean ASGI route (:mod:`api.fastpath`) and the FastAPI routes that document them
(:mod:`api.routes.records`) call these functions, so there is one implementation.

Produce: the body is parsed and validated whole — JSON, NDJSON (parsed line by line as it
streams in, so the raw body is never held with its parsed form) or binary batches — and turned
into one or more batches per partition *before* anything is appended, so bad input changes
nothing. Then each partition gets one append call (its batches back to back) and the reply
lists offsets in request order.

Fetch: read whole batches from the offset; if fewer than ``min_bytes`` are there, wait on the
partition's high-watermark event (never a sleep loop) until ``wait_ms`` passes, then answer as
JSON, NDJSON or raw batches. Every answer carries the next offset and the high watermark.
"""

from __future__ import annotations

import asyncio
import hashlib
import re
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final

import orjson
from starlette.types import Message, Receive

from cluster.broker import Acks, Broker, check_readable
from cluster.partitioner import partition_for_key
from cluster.txn_coordinator import TxnCoordinator
from cluster.txn_state import validate_transactional_id
from core_log.batch import (
    HEADER_BYTES,
    BatchHeader,
    Record,
    any_compressed,
    build_batch,
    build_plain,
    built_headers,
    scan_batches,
    split_batches,
    with_producer,
)
from core_log.errors import ErrorCode, LogbusError, RecordTooLargeError
from core_log.isolation import committed_bytes
from core_log.limits import OFF_LOOP_IO_BYTES
from core_log.log import AppendResult, CommittedReadResult, ReadResult
from core_log.manager import answered_by
from core_log.recordjson import read_on_from

from .guard import media_type
from .params import is_uint, parse_uint
from .problems import bad_request, payload_too_large, unsupported_media_type
from .records_codec import (
    parse_json_body,
    parse_ndjson_lines,
    too_many_records,
)
from .rendering import encode_json_within
from .settings import Settings

JSON = "application/json"
NDJSON = "application/x-ndjson"
BATCH = "application/vnd.logbus.batch"
OCTETS = "application/octet-stream"  # the body is one record's value; key in Logbus-Key
PRODUCE_TYPES = [JSON, NDJSON, BATCH, OCTETS]
FETCH_TYPES = [JSON, NDJSON, BATCH]

# Target size of a batch built from JSON records: large enough to amortise the 61-byte header
# and per-batch work, small enough that a fetch bounded by max_records decodes little beyond
# what it returns (a fetch decodes whole batches). Kafka's producer default is 16 KiB.
TARGET_BATCH_BYTES = 64 * 1024
RECORD_OVERHEAD_BYTES = 24  # varints and attributes of one record, upper estimate
# The first read of a JSON fetch: what the log reads inline (larger reads go to the thread
# pool); the log stops earlier at the batch holding the last record the fetch wants.
FIRST_JSON_READ_BYTES = OFF_LOOP_IO_BYTES - 1


@dataclass
class Reply:
    status: int
    body: bytes | AsyncIterator[bytes]
    content_type: str = JSON
    headers: dict[str, str] = field(default_factory=dict)
    records: int = 0  # records produced or fetched, for metrics
    size_bytes: int = 0  # payload bytes produced or fetched, for metrics


Body = AsyncIterator[bytes]


class ClientDisconnected(Exception):
    pass


class BodyChunks:
    """The request body's chunks as they arrive (an ASGI ``receive``); raises
    :class:`ClientDisconnected` if the client goes away first. A class, not an async
    generator: the stdlib event loop registers every async generator for finalization (≈ 1 %
    of an in-process profile of a small produce); under uvloop both cost ≈ 1.2 µs a body."""

    __slots__ = ("_done", "_receive")

    def __init__(self, receive: Receive) -> None:
        self._receive = receive
        self._done = False

    def __aiter__(self) -> AsyncIterator[bytes]:
        return self

    async def __anext__(self) -> bytes:
        if self._done:
            raise StopAsyncIteration
        return self._body_of(await self._receive())

    def _body_of(self, message: Message) -> bytes:
        if message["type"] == "http.disconnect":
            raise ClientDisconnected
        if not message.get("more_body", False):
            self._done = True
        body: bytes = message.get("body", b"")
        return body

    async def read(self, limit: int) -> bytes:
        """:func:`read_body` without the iterator protocol, whose end is a raised
        StopAsyncIteration: 0.5 µs for a one-message body, not 1.9 (uvloop, timeit)."""
        parts: list[bytes] = []
        size = 0
        while not self._done:
            body = self._body_of(await self._receive())
            size += len(body)
            if size > limit:
                raise payload_too_large(limit)
            parts.append(body)
        return parts[0] if len(parts) == 1 else b"".join(parts)


class WholeBody:
    """A request body that had all arrived with its head (the lean lane,
    :meth:`api.fastpath.FastPath._enter`): one chunk, read without waiting."""

    __slots__ = ("_done", "data")

    def __init__(self, data: bytes) -> None:
        self.data = data
        self._done = False

    def __aiter__(self) -> AsyncIterator[bytes]:
        return self

    async def __anext__(self) -> bytes:
        if self._done:
            raise StopAsyncIteration
        self._done = True
        return self.data


async def read_body(chunks: Body, limit: int) -> bytes:
    if type(chunks) is WholeBody:
        if len(chunks.data) > limit:
            raise payload_too_large(limit)
        return chunks.data
    if type(chunks) is BodyChunks:
        return await chunks.read(limit)
    parts: list[bytes] = []
    size = 0
    async for chunk in chunks:
        size += len(chunk)
        if size > limit:
            raise payload_too_large(limit)
        parts.append(chunk)
    return b"".join(parts)


# -- produce -----------------------------------------------------------------------------------


async def produce(
    broker: Broker,
    settings: Settings,
    topic: str,
    partition: int | None,
    query: Mapping[str, str],
    headers: Mapping[str, str],
    body: Body,
    transactions: TxnCoordinator | None = None,
) -> Reply:
    """Produce the request body. ``headers`` needs Content-Type and may carry a producer
    session (Logbus-Producer-Id, Logbus-Producer-Epoch, Logbus-Sequence) for idempotence, and
    with it Logbus-Transactional-Id to write in that producer's transaction (the caller has
    checked WRITE on the transactional id)."""
    acks = Acks.parse(query.get("acks"))
    kind = media_type(headers.get("content-type"))
    if kind not in PRODUCE_TYPES:  # no type is refused too: a browser's no-cors POST has none
        raise unsupported_media_type(kind or "(none)", PRODUCE_TYPES)
    producer = producer_session(headers)
    txn = _transaction_of(headers, producer, kind, acks, partition, transactions)
    meta = broker.topic(topic)  # 404 before reading the body
    if partition is not None:
        broker.check_partition(topic, partition)
    if (key := headers.get("idempotency-key")) is not None:
        if producer is not None:
            raise bad_request("send either an Idempotency-Key or a producer session, not both")
        return await _produce_with_key(
            broker, settings, topic, partition, acks, kind, key, headers, body
        )
    if kind == BATCH:
        if producer is not None:
            raise bad_request("binary batches carry their producer id, epoch and sequence")
        return await _produce_binary(broker, settings, topic, partition, acks, body)
    now = broker.clock.now_ms()
    if kind == JSON:
        if type(body) is WholeBody and len(body.data) <= settings.max_request_bytes:
            raw = body.data  # read_body's answer, without its coroutine
        else:
            raw = await read_body(body, settings.max_request_bytes)
        parsed = parse_json_body(raw, settings.max_records_per_request, now)
    elif kind == NDJSON:
        parsed = await _parse_ndjson(body, settings, now)
    else:
        raw = await read_body(body, settings.max_request_bytes)
        parsed = [(None, octets_record(raw, headers, now))]
    if producer is not None:
        return await _produce_idempotent(broker, topic, partition, acks, parsed, producer, txn)
    return await _produce_parsed(broker, topic, partition, acks, parsed, meta.partitions)


_IDEMPOTENCY_KEY = re.compile(r"[\x21-\x7e]{1,255}")
LOGBUS_KEY = "logbus-key"


def octets_record(value: bytes, headers: Mapping[str, str], now_ms: int) -> Record:
    """An ``application/octet-stream`` body: one record whose value is the body as sent (empty
    is an empty value, not a tombstone) and whose key is the ``Logbus-Key`` header's bytes."""
    key = headers.get(LOGBUS_KEY)
    return Record(value, None if key is None else key.encode("latin-1"), (), now_ms)


async def _produce_with_key(
    broker: Broker,
    settings: Settings,
    topic: str,
    partition: int | None,
    acks: Acks,
    kind: str,
    key: str,
    headers: Mapping[str, str],
    body: Body,
) -> Reply:
    """Produce once per Idempotency-Key, for clients that never manage sequences.

    The key claims a producer id in the metadata store (committed with a digest of the request
    before anything is appended); the records go out as that producer's batches, sequence 0,
    one per partition, keyless records placed by a hash of the key. A retry finds the same id
    and partitions, so every partition answers it as a duplicate with the original offsets; if
    the first attempt died before appending, the retry appends — exactly once either way.
    """
    if not _IDEMPOTENCY_KEY.fullmatch(key):
        raise bad_request("Idempotency-Key must be 1..255 visible ASCII characters")
    raw = await read_body(body, settings.max_request_bytes)
    record_key = headers.get(LOGBUS_KEY, "") if kind == OCTETS else ""
    digest = hashlib.sha256(
        b"\0".join(
            [topic.encode(), str(partition).encode(), kind.encode(), record_key.encode(), raw]
        )
    ).hexdigest()
    if kind == BATCH:
        if partition is None:
            raise bad_request("binary batches need a partition path")
        batches = await _validated(raw, broker.log_config(topic).max_decompressed_bytes)
        if len(batches) != 1 or batches[0].producer_id >= 0:
            raise bad_request("with an Idempotency-Key, send one batch without a producer id")
        payloads = {partition: raw}
        placement = [(partition, 0)]
        count = batches[0].record_count
    else:
        # Everything a client can get wrong is checked before the key is claimed.
        now = broker.clock.now_ms()
        if kind == JSON:
            parsed = parse_json_body(raw, settings.max_records_per_request, now)
        elif kind == NDJSON:
            parsed = _counted(parse_ndjson_lines(raw.split(b"\n"), 1, now), settings)
        else:
            parsed = [(None, octets_record(raw, headers, now))]
        sticky = partition_for_key(key.encode(), broker.topic(topic).partitions)
        groups, placement = _route(broker, topic, partition, parsed, sticky)
        max_message_bytes = broker.log_config(topic).max_message_bytes
        payloads = {
            p: _one_batch(
                rs, max_message_bytes, producer_id=-1, producer_epoch=-1, base_sequence=-1
            )
            for p, rs in groups.items()
        }
        count = len(parsed)
    pid, new = await broker.idempotency_session(key, digest)
    stamped = {p: with_producer(data, pid, 0, 0) for p, data in payloads.items()}
    outcomes = await asyncio.gather(
        *(broker.append(topic, p, data, acks) for p, data in stamped.items()),
        return_exceptions=True,
    )
    results = [r for r in outcomes if isinstance(r, AppendResult)]
    failed = [e for e in outcomes if isinstance(e, BaseException)]
    if failed:
        if new and not results and not any(_retriable(e) for e in failed):
            await broker.release_idempotency_key(key, digest)  # rejected: nothing changed
        raise failed[0]
    base = {p: r.base_offset for p, r in zip(stamped, results, strict=True)}
    offsets = [{"partition": p, "offset": base[p] + j} for p, j in placement]
    reply = _produce_reply(acks, offsets, count, sum(map(len, stamped.values())))
    return _mark_duplicate(reply, results)


async def _validated(raw: bytes, max_decompressed_bytes: int) -> list[BatchHeader]:
    """Producer batches validated whole; off the loop when one is compressed (its
    decompressed size, up to the topic's cap, sets the cost — not its size on the wire)."""
    if any_compressed(raw):
        return await asyncio.to_thread(
            split_batches, raw, strict=True, max_decompressed_bytes=max_decompressed_bytes
        )
    return split_batches(raw, strict=True, max_decompressed_bytes=max_decompressed_bytes)


def _retriable(e: BaseException) -> bool:
    """Whether the append may have failed after writing (so the key must stay claimed)."""
    return not isinstance(e, LogbusError) or e.retriable


def _mark_duplicate(reply: Reply, results: list[AppendResult]) -> Reply:
    if results and all(r.duplicate for r in results):
        reply.headers["Logbus-Duplicate"] = "true"
    return reply


def _one_batch(
    records: list[Record],
    max_message_bytes: int,
    *,
    producer_id: int,
    producer_epoch: int,
    base_sequence: int,
    is_transactional: bool = False,
) -> bytes:
    """All ``records`` in one batch (an idempotent request is one batch per partition)."""
    data = build_batch(
        records,
        producer_id=producer_id,
        producer_epoch=producer_epoch,
        base_sequence=base_sequence,
        is_transactional=is_transactional,
    )
    if len(data) > max_message_bytes:
        raise RecordTooLargeError(
            f"an idempotent request is one batch per partition: {len(data)} bytes is over the "
            f"topic's max.message.bytes {max_message_bytes}",
            max_message_bytes=max_message_bytes,
        )
    return data


@dataclass(frozen=True)
class ProducerSession:
    producer_id: int
    producer_epoch: int
    base_sequence: int


_PRODUCER_HEADERS = (
    ("logbus-producer-id", 0, 2**63 - 1),
    ("logbus-producer-epoch", 0, 2**15 - 1),
    ("logbus-sequence", 0, 2**31 - 1),
)
_PRODUCER_HEADER_NAMES = tuple(name for name, _, _ in _PRODUCER_HEADERS)


TRANSACTIONAL_ID_HEADER = "logbus-transactional-id"


def _transaction_of(
    headers: Mapping[str, str],
    producer: ProducerSession | None,
    kind: str,
    acks: Acks,
    partition: int | None,
    transactions: TxnCoordinator | None,
) -> tuple[str, TxnCoordinator] | None:
    """The transaction a produce writes in (Logbus-Transactional-Id), checked before the body
    is read; None for an ordinary produce."""
    txn_id = headers.get(TRANSACTIONAL_ID_HEADER)
    if txn_id is None:
        return None
    validate_transactional_id(txn_id)
    if producer is None:
        raise bad_request(
            "a transactional produce carries the session of POST /v1/transactions/{id}: "
            "Logbus-Producer-Id, Logbus-Producer-Epoch and Logbus-Sequence"
        )
    if kind == BATCH or headers.get("idempotency-key") is not None:
        raise bad_request("a transactional produce sends JSON, NDJSON or one octet-stream value")
    if partition is None:
        raise bad_request(
            "a transactional produce needs a partition path: sequences are counted per partition"
        )
    if acks is not Acks.ALL:
        raise bad_request("a transactional produce is acks=all (anything less could lose a commit)")
    if transactions is None:
        raise LogbusError("transactions are not served here", code=ErrorCode.INVALID_REQUEST)
    return txn_id, transactions


def producer_session(headers: Mapping[str, str]) -> ProducerSession | None:
    """The idempotent-producer headers: all three, or none."""
    pid, epoch, seq = _PRODUCER_HEADER_NAMES
    if pid not in headers and epoch not in headers and seq not in headers:
        return None  # every produce asks: three lookups, no generator, no list
    raw = [headers.get(name) for name, _, _ in _PRODUCER_HEADERS]
    values = []
    for (name, low, high), v in zip(_PRODUCER_HEADERS, raw, strict=True):
        if v is None or not is_uint(v) or not low <= int(v) <= high:
            raise bad_request(
                f"{name} must be an integer in [{low}, {high}]; an idempotent request carries "
                "Logbus-Producer-Id, Logbus-Producer-Epoch and Logbus-Sequence together"
            )
        values.append(int(v))
    return ProducerSession(*values)


async def _produce_idempotent(
    broker: Broker,
    topic: str,
    partition: int | None,
    acks: Acks,
    parsed: list[tuple[int | None, Record]],
    producer: ProducerSession,
    txn: tuple[str, TxnCoordinator] | None = None,
) -> Reply:
    """One batch with the producer's id, epoch and base sequence (sequences are per partition,
    as in Kafka). A retry of one of the last 5 answers with the original offsets. In a
    transaction (``txn``) the coordinator adds the partition first — it refuses a fenced or
    unknown producer, so no write joins a transaction it does not know — and the batch is
    transactional."""
    if partition is None:
        raise bad_request(
            "idempotent produce needs a partition path: sequences are counted per partition"
        )
    for i, (explicit, _) in enumerate(parsed):
        if explicit not in (None, partition):
            raise bad_request(f"records[{i}].partition differs from the path's partition")
    records = [r for _, r in parsed]
    data = _one_batch(
        records,
        broker.log_config(topic).max_message_bytes,
        producer_id=producer.producer_id,
        producer_epoch=producer.producer_epoch,
        base_sequence=producer.base_sequence,
        is_transactional=txn is not None,
    )
    if txn is not None:
        txn_id, transactions = txn
        await transactions.add_partitions(
            txn_id, producer.producer_id, producer.producer_epoch, [(topic, partition)]
        )
    result = await broker.append(topic, partition, data, acks, transactional=txn is not None)
    offsets = [
        {"partition": partition, "offset": result.base_offset + i} for i in range(len(records))
    ]
    return _mark_duplicate(_produce_reply(acks, offsets, len(records), len(data)), [result])


async def _produce_binary(
    broker: Broker, settings: Settings, topic: str, partition: int | None, acks: Acks, body: Body
) -> Reply:
    if partition is None:
        raise bad_request(
            "binary batches are appended as they are: send them to "
            "/v1/topics/{topic}/partitions/{partition}/records"
        )
    data = await read_body(body, settings.max_request_bytes)
    if not data:
        raise bad_request("empty body")
    return await _append_binary(broker, topic, partition, data, acks)


async def _append_binary(
    broker: Broker, topic: str, partition: int, data: bytes, acks: Acks
) -> Reply:
    result = await broker.append(topic, partition, data, acks)
    offsets = [{"partition": partition, "offset": result.base_offset}]
    return _mark_duplicate(_produce_reply(acks, offsets, result.records, len(data)), [result])


def _counted(
    parsed: list[tuple[int | None, Record]], settings: Settings
) -> list[tuple[int | None, Record]]:
    """``parsed`` once it holds between 1 and ``max_records_per_request`` records."""
    if len(parsed) > settings.max_records_per_request:
        raise too_many_records(settings.max_records_per_request)
    if not parsed:
        raise bad_request("no records in the request")
    return parsed


def _produce_parsed(
    broker: Broker,
    topic: str,
    partition: int | None,
    acks: Acks,
    parsed: list[tuple[int | None, Record]],
    partition_count: int,
) -> Awaitable[Reply]:
    """Route records to partitions, build every batch, then append (one call per partition);
    the answer, to await. Records to one partition (most requests): the append answers with
    the reply itself (:meth:`Broker.append_built`: no coroutine of its own or of this
    function's in the request's chain on a single broker)."""
    sticky = broker.sticky.next_partition(partition_count)
    groups, placement = _route(broker, topic, partition, parsed, sticky)
    max_message_bytes = broker.log_config(topic).max_message_bytes
    if len(groups) == 1:  # most requests: no task (gather of one: ≈ 12 µs), no dicts
        [(p, rs)] = groups.items()
        data, checked = built_batches(rs, max_message_bytes)
        answer = _offsets_reply(acks, p, placement, len(data))
        if checked is None:
            return answered_by(broker.append(topic, p, data, acks), answer)
        return broker.append_built(topic, p, data, acks, checked, answer)
    return _produce_groups(broker, topic, acks, groups, placement, max_message_bytes)


def _offsets_reply(
    acks: Acks, p: int, placement: list[tuple[int, int]], size: int
) -> Callable[[int], Reply]:
    """The answer to records appended to partition ``p`` from its first offset."""
    if len(placement) == 1 and acks is not Acks.NONE:  # one record: no dicts, no encoder
        return lambda first: Reply(200, ONE_OFFSET % (p, first), JSON, {}, 1, size)  # by position
    return lambda first: _produce_reply(
        acks, [{"partition": p, "offset": first + j} for _, j in placement], len(placement), size
    )


async def _produce_groups(
    broker: Broker,
    topic: str,
    acks: Acks,
    groups: dict[int, list[Record]],
    placement: list[tuple[int, int]],
    max_message_bytes: int,
) -> Reply:
    """Records to several partitions: their appends concurrently."""
    payloads = {p: build_batches(rs, max_message_bytes) for p, rs in groups.items()}
    results = await asyncio.gather(
        *(broker.append(topic, p, data, acks) for p, data in payloads.items())
    )
    base = {p: r.base_offset for p, r in zip(payloads, results, strict=True)}
    offsets = [{"partition": p, "offset": base[p] + j} for p, j in placement]
    return _produce_reply(acks, offsets, len(placement), sum(map(len, payloads.values())))


def built_batches(
    records: list[Record], max_message_bytes: int
) -> tuple[bytes, list[BatchHeader] | None]:
    """:func:`build_batches`, and the headers of the batches when nothing in them can fail
    the log's checks (:func:`core_log.batch.built_headers`: the log need not walk them again);
    one record (most web producers) in one C call (:func:`core_log.batch.build_plain`)."""
    plain = build_plain(records) if len(records) == 1 else None
    if plain is not None and len(plain[0]) <= max_message_bytes:
        return plain[0], [plain[1]]
    data = build_batches(records, max_message_bytes)
    return data, built_headers(data, records)


def _route(
    broker: Broker,
    topic: str,
    partition: int | None,
    parsed: list[tuple[int | None, Record]],
    sticky: int,
) -> tuple[dict[int, list[Record]], list[tuple[int, int]]]:
    """Records grouped by partition (path, explicit, key hash, or ``sticky`` for keyless),
    and each record's (partition, index in its group) in request order."""
    one = partition
    if len(parsed) == 1:  # one record (most web producers): no generators
        [(explicit, record)] = parsed
        if one is not None:
            if explicit not in (None, one):
                raise bad_request("records[0].partition differs from the path's partition")
        elif explicit is not None:
            broker.check_partition(topic, explicit)
            one = explicit
        else:
            one = broker.partition_for(topic, record.key, sticky)
        return {one: [record]}, [(one, 0)]
    if one is None and all(e is None and r.key is None for e, r in parsed):
        one = sticky % broker.topic(topic).partitions  # keyless: the request is sticky
    if one is not None:  # the whole request goes to one partition: no per-record work
        for i, (explicit, _) in enumerate(parsed):
            if explicit not in (None, one):
                raise bad_request(f"records[{i}].partition differs from the path's partition")
        return {one: [r for _, r in parsed]}, [(one, i) for i in range(len(parsed))]
    groups: dict[int, list[Record]] = {}
    placement: list[tuple[int, int]] = []
    for i, (explicit, record) in enumerate(parsed):
        if partition is not None:
            if explicit not in (None, partition):
                raise bad_request(f"records[{i}].partition differs from the path's partition")
            p = partition
        elif explicit is not None:
            broker.check_partition(topic, explicit)
            p = explicit
        else:
            p = broker.partition_for(topic, record.key, sticky)
        group = groups.setdefault(p, [])
        placement.append((p, len(group)))
        group.append(record)
    return groups, placement


# The answer to a one-record produce, as :func:`_produce_reply` encodes it (orjson: no spaces;
# tests/api/test_produce_reply.py checks they agree).
ONE_OFFSET: Final = b'{"offsets":[{"partition":%d,"offset":%d}]}'


def _produce_reply(acks: Acks, offsets: list[dict[str, int]], count: int, size: int) -> Reply:
    if acks is Acks.NONE:
        return Reply(
            202, b"{}", headers={"Logbus-Record-Count": str(count)}, records=count, size_bytes=size
        )
    return Reply(200, orjson.dumps({"offsets": offsets}), records=count, size_bytes=size)


def build_batches(records: list[Record], max_message_bytes: int) -> bytes:
    """Records → batches of about TARGET_BATCH_BYTES, back to back; checked against the limit.

    The split is by record count from the request's average record size (one pass in C via
    ``map``), not a per-record loop; a batch that still comes out too large is built again in
    halves, so uneven records cannot push a batch past ``max.message.bytes``.
    """
    if len(records) == 1:  # most requests of web producers: one batch, nothing to split
        return b"".join(_batches_within(records, max_message_bytes))
    target = min(TARGET_BATCH_BYTES, max_message_bytes - HEADER_BYTES)
    payload = sum(map(len, filter(None, (r.value for r in records))))
    payload += sum(map(len, filter(None, (r.key for r in records))))
    avg = RECORD_OVERHEAD_BYTES + payload // len(records)
    step = max(1, target // avg)
    out: list[bytes] = []
    for start in range(0, len(records), step):
        out.extend(_batches_within(records[start : start + step], max_message_bytes))
    return b"".join(out)


def _batches_within(records: list[Record], max_message_bytes: int) -> list[bytes]:
    batch = build_batch(records)
    if len(batch) <= max_message_bytes:
        return [batch]
    if len(records) == 1:
        raise RecordTooLargeError(
            f"a record needs a batch of {len(batch)} bytes, over the topic's "
            f"max.message.bytes {max_message_bytes}",
            max_message_bytes=max_message_bytes,
        )
    half = len(records) // 2
    return _batches_within(records[:half], max_message_bytes) + _batches_within(
        records[half:], max_message_bytes
    )


async def _parse_ndjson(
    body: Body, settings: Settings, now: int
) -> list[tuple[int | None, Record]]:
    """Parse NDJSON as it streams in: each chunk's complete lines are decoded at once, so the
    raw body is never held whole next to its parsed form. A line spread over many chunks is
    joined once, when it ends (joining at every chunk made one 60 MiB line cost 7 s)."""
    out: list[tuple[int | None, Record]] = []
    pending: list[bytes] = []  # the start of a line not yet ended, in chunks
    size = 0
    line_no = 1
    async for chunk in body:
        size += len(chunk)
        if size > settings.max_request_bytes:
            raise payload_too_large(settings.max_request_bytes)
        end = chunk.rfind(b"\n")
        if end < 0:  # no line ends here: keep the chunk, do not copy what came before
            pending.append(chunk)
            continue
        pending.append(chunk[:end])
        lines = b"".join(pending).split(b"\n")
        pending = [chunk[end + 1 :]]
        out.extend(parse_ndjson_lines(lines, line_no, now))
        line_no += len(lines)
        if len(out) > settings.max_records_per_request:
            raise too_many_records(settings.max_records_per_request)
    out.extend(parse_ndjson_lines([b"".join(pending)], line_no, now))
    return _counted(out, settings)


# -- fetch -------------------------------------------------------------------------------------


def int_param(query: Mapping[str, str], name: str, default: int | None, low: int, high: int) -> int:
    raw = query.get(name)
    if raw is None:
        if default is None:
            raise bad_request(f"query parameter {name!r} is required")
        return default
    return parse_uint(raw, name, low, high)


def media_range(part: str) -> tuple[str, float]:
    """One Accept element → (media type, q). A ``q`` that is not a number in [0, 1] is 400."""
    kind, *params = part.split(";")
    q = 1.0
    for param in params:
        name, _, value = param.partition("=")
        if name.strip().lower() == "q":
            if not _QVALUE.fullmatch(value.strip()):
                raise bad_request(f"Accept: q must be a number in [0, 1], got {value.strip()!r}")
            q = float(value)
    return kind.strip().lower(), q


_QVALUE = re.compile(r"0(\.[0-9]{0,3})?|1(\.0{0,3})?")  # RFC 9110 §12.4.2


def negotiate(accept: str | None, offered: list[str] = FETCH_TYPES) -> str:
    """The type of ``offered`` the Accept header prefers (highest q, then first listed); a
    wildcard means the first offered type not refused (``q=0``); JSON for no header."""
    if not accept:
        return offered[0]
    ranges = [media_range(part) for part in accept.split(",") if part.strip()]
    refused = {kind for kind, q in ranges if q == 0}
    for kind, q in sorted(ranges, key=lambda r: -r[1]):  # stable: ties keep their order
        if q == 0:
            break
        if kind in offered:
            return kind
        if kind in ("*/*", "application/*"):
            prefix = "" if kind == "*/*" else kind[:-1]
            usable = [o for o in offered if o not in refused and o.startswith(prefix)]
            if usable:
                return usable[0]
    raise LogbusError(
        f"cannot answer in {accept!r}; acceptable: {', '.join(offered)}",
        code=ErrorCode.NOT_ACCEPTABLE,
    )


async def fetch(
    broker: Broker,
    settings: Settings,
    topic: str,
    partition: int,
    query: Mapping[str, str],
    accept: str | None,
) -> Reply:
    check_readable(topic)
    kind = negotiate(accept)
    offset = int_param(query, "offset", None, 0, 2**63 - 1)
    max_bytes = int_param(
        query, "max_bytes", settings.default_fetch_bytes, 1, settings.max_fetch_bytes
    )
    max_records = int_param(
        query, "max_records", settings.default_fetch_records, 1, settings.max_fetch_records
    )
    min_bytes = int_param(query, "min_bytes", 1, 0, settings.max_fetch_bytes)
    wait_ms = int_param(query, "wait_ms", 0, 0, settings.max_wait_ms)
    committed = isolation_of(query) == READ_COMMITTED
    loop = asyncio.get_running_loop()
    deadline = loop.time() + wait_ms / 1000
    # JSON answers stop at max_records: the log reads no batch past the one holding the last
    # record wanted, and at first no more than it reads inline (off the thread pool); more
    # only if that was not enough.
    step = max_bytes if kind == BATCH else min(max_bytes, FIRST_JSON_READ_BYTES)
    wanted = None if kind == BATCH else max_records
    while True:
        p = broker.reader(topic, partition)  # again after a wait: it may have been deleted
        read = p.read_committed if committed else p.read
        result = await read(offset, step, max_records=wanted)
        while (
            step < max_bytes
            and result.next_offset - offset < max_records
            and result.next_offset < visible_end(result)
        ):
            step = min(max_bytes, next_json_step(step, result, offset, max_records))
            result = await read(offset, step, max_records=wanted)
        end = read_end(offset, result)  # past every batch read, aborted ones included
        data = result.data
        if isinstance(result, CommittedReadResult):
            data = committed_bytes(result.data, result.aborted_transactions)
            if not data and end > offset:  # only aborted data and markers: read on past them
                offset = end
                continue
        remaining = deadline - loop.time()
        if len(data) >= min_bytes or remaining <= 0 or p.released:
            break
        # Until the high watermark moves (the last stable offset only moves with it).
        await p.wait_for(max(offset, result.high_watermark), remaining)
    hw = result.high_watermark
    if kind == BATCH:
        next_offset = end
        count = sum(h.record_count for _, h in scan_batches(data))
        headers = _position_headers(next_offset, hw, result)
        return Reply(200, data, BATCH, headers, count, len(result.data))
    sep = b"\n" if kind == NDJSON else b","
    rendered = encode_json_within(data, offset, max_records, max_bytes, sep=sep)
    count, last = rendered.count, rendered.last_offset
    if rendered.full:  # max_bytes of rendered records: go on after the last one sent
        next_offset = rendered.next_offset(offset)
    else:  # never past an unreadable record not yet named (the next read names it)
        next_offset = next_offset_after(
            offset, count, last, max_records, read_on_from(end, rendered.stop)
        )
    headers = _position_headers(next_offset, hw, result)
    if kind == NDJSON:
        body = rendered.joined(b"", b"\n") if count else b""
        return Reply(200, body, NDJSON, headers, count, len(result.data))
    position: dict[str, int] = {
        "next_offset": next_offset,
        "high_watermark": hw,
        "log_start_offset": result.log_start_offset,
        "lag": max(0, visible_end(result) - next_offset),
    }
    if isinstance(result, CommittedReadResult):
        position["last_stable_offset"] = result.last_stable_offset
    doc = rendered.joined(b'{"records":[', b"]," + orjson.dumps(position)[1:])
    return Reply(200, doc, JSON, headers, count, len(result.data))


READ_UNCOMMITTED: Final = "read_uncommitted"
READ_COMMITTED: Final = "read_committed"


def next_json_step(step: int, result: ReadResult, offset: int, max_records: int) -> int:
    """The next read size of a JSON fetch whose read of ``step`` bytes held too few records:
    what ``max_records`` take at the bytes per offset the read showed, with a quarter more,
    and at least twice ``step``. Asking more than the records take costs nothing: the log
    stops the read at the batch holding the last record wanted."""
    covered = result.next_offset - offset
    if covered <= 0 or not result.data:
        return step * 4
    return max(step * 2, len(result.data) * max_records * 5 // (4 * covered))


def isolation_of(query: Mapping[str, str]) -> str:
    """A partition fetch's ``isolation`` (Kafka's ``isolation.level``): ``read_uncommitted``
    (the default, as in Kafka) or ``read_committed`` (committed data only, never at or past
    the last stable offset)."""
    isolation = query.get("isolation", READ_UNCOMMITTED)
    if isolation not in (READ_UNCOMMITTED, READ_COMMITTED):
        raise bad_request("isolation must be read_uncommitted (the default) or read_committed")
    return isolation


def visible_end(result: ReadResult) -> int:
    """Where a reader's view of the partition ends: the high watermark, or at
    ``read_committed`` the last stable offset."""
    if isinstance(result, CommittedReadResult):
        return result.last_stable_offset
    return result.high_watermark


def read_end(start: int, result: Any) -> int:
    """The offset just past the batches a read returned (``start`` if it returned none)."""
    return int(result.next_offset) if result.data else start


def next_offset_after(start: int, count: int, last: int, limit: int, end: int) -> int:
    """Where a consumer goes on after taking ``count`` records, the last at offset ``last``,
    of a read from ``start`` whose batches end at ``end``: past what it took, or past the whole
    read when it took everything there (fewer than ``limit``) or nothing — a read of batches
    with no record at or after ``start`` is a gap compaction left, skipped, not re-read."""
    if count == 0:
        return max(start, end)
    if count < limit:
        return max(last + 1, end)
    return last + 1


def _position_headers(next_offset: int, hw: int, result: Any) -> dict[str, str]:
    headers = {
        "Logbus-Next-Offset": str(next_offset),
        "Logbus-High-Watermark": str(hw),
        "Logbus-Log-Start-Offset": str(result.log_start_offset),
        "Logbus-Lag": str(max(0, visible_end(result) - next_offset)),
    }
    if isinstance(result, CommittedReadResult):
        headers["Logbus-Last-Stable-Offset"] = str(result.last_stable_offset)
    return headers
