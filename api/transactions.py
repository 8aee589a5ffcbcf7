"""The single-request transaction: records for several partitions and a group's offsets,
committed atomically by one ``POST /v1/transactions`` (the form curl users and the Spark sink
use). Independent of the web framework.

The whole body is decoded and validated first (records through the same
:func:`api.records_codec.to_record` as every produce, topics and partitions looked up, limits
checked), so bad input changes nothing. Then, as a transactional producer would: a new session
for the transactional id (fencing any older one and aborting what it left open), every
partition added to the transaction in one coordinator call, each partition's batches appended
with ``acks=all`` (sequences from 0: every session and every transaction has its own epoch),
the group's offsets added, and the commit. Anything failing after the session began aborts the
transaction (best effort: a transaction left open is aborted by its timeout anyway) and answers
the error, so the request is all or nothing. A client that lost the answer may send it again:
it is then written again (a second transaction) — a reader that must not see it twice dedupes,
or the client checks the group's committed offset first, as a consume-transform-produce loop
does.
"""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass
from typing import Annotated, Any

import msgspec

from cluster.broker import Acks, Broker
from cluster.coordinator import validate_group_id
from cluster.txn_coordinator import DEFAULT_TRANSACTION_TIMEOUT_MS, TxnCoordinator
from cluster.txn_state import validate_transactional_id
from core_log.batch import Record, scan_batches, with_producer
from core_log.errors import LogbusError

from .problems import bad_request
from .records import build_batches
from .records_codec import (
    DECODE_ERRORS,
    RecordIn,
    check_utf8,
    decode_failed,
    to_record,
    too_many_records,
)
from .settings import Settings

_INT32 = Annotated[int, msgspec.Meta(ge=0, le=2**31 - 1)]
_INT63 = Annotated[int, msgspec.Meta(ge=0, le=2**63 - 1)]


class TxnRecordIn(RecordIn, forbid_unknown_fields=True):
    topic: str = ""


class TxnOffsetIn(msgspec.Struct, forbid_unknown_fields=True):
    topic: str
    partition: _INT32
    offset: _INT63
    metadata: str = ""


class TxnOffsetsIn(msgspec.Struct, forbid_unknown_fields=True):
    group_id: str
    offsets: list[TxnOffsetIn]
    member_id: str | None = None
    generation: _INT32 | None = None


class TxnRequestIn(msgspec.Struct, forbid_unknown_fields=True):
    transactional_id: str
    records: list[TxnRecordIn] = msgspec.field(default_factory=list)
    offsets: TxnOffsetsIn | None = None
    transaction_timeout_ms: Annotated[int, msgspec.Meta(ge=1, le=2**31 - 1)] = (
        DEFAULT_TRANSACTION_TIMEOUT_MS
    )


_DECODER = msgspec.json.Decoder(TxnRequestIn)


@dataclass(frozen=True)
class TxnRequest:
    """A decoded, validated single-request transaction."""

    transactional_id: str
    timeout_ms: int
    partitions: dict[tuple[str, int], list[Record]]  # in first-seen order
    placement: list[tuple[str, int, int]]  # each record's (topic, partition, index there)
    offsets: TxnOffsetsIn | None

    def topics(self) -> list[str]:
        return sorted({t for t, _ in self.partitions})


def parse(broker: Broker, settings: Settings, body: bytes) -> TxnRequest:
    """Decode and check the whole request (400/404/413 before anything is written)."""
    check_utf8(body, "the body")
    try:
        doc = _DECODER.decode(body)
    except DECODE_ERRORS as e:
        raise decode_failed(e, "body") from None
    txn_id = validate_transactional_id(doc.transactional_id)
    if not doc.records and doc.offsets is None:
        raise bad_request("a transaction carries records, offsets or both")
    if len(doc.records) > settings.max_records_per_request:
        raise too_many_records(settings.max_records_per_request)
    now = broker.clock.now_ms()
    partitions: dict[tuple[str, int], list[Record]] = {}
    placement: list[tuple[str, int, int]] = []
    sticky: dict[str, int] = {}
    for i, r in enumerate(doc.records):
        if not r.topic:
            raise bad_request(f"records[{i}].topic is missing")
        meta = broker.topic(r.topic)  # 404 for an unknown topic
        explicit, record = to_record(r, now, "records[%d]", i)
        if explicit is not None:
            broker.check_partition(r.topic, explicit)
            p = explicit
        elif record.key is None:
            if r.topic not in sticky:
                sticky[r.topic] = broker.sticky.next_partition(meta.partitions) % meta.partitions
            p = sticky[r.topic]
        else:
            p = broker.partition_for(r.topic, record.key, 0)
        group = partitions.setdefault((r.topic, p), [])
        placement.append((r.topic, p, len(group)))
        group.append(record)
    if doc.offsets is not None:
        validate_group_id(doc.offsets.group_id)
        if not doc.offsets.offsets:
            raise bad_request("offsets.offsets is empty")
        for o in doc.offsets.offsets:
            broker.check_partition(o.topic, o.partition)
    return TxnRequest(txn_id, doc.transaction_timeout_ms, partitions, placement, doc.offsets)


async def run(broker: Broker, transactions: TxnCoordinator, req: TxnRequest) -> dict[str, Any]:
    """Write ``req`` in one transaction and commit it; the answer's offsets are in request
    order."""
    txn_id = req.transactional_id
    pid, epoch = await transactions.init_producer(txn_id, req.timeout_ms)
    try:
        if req.partitions:
            await transactions.add_partitions(txn_id, pid, epoch, list(req.partitions))
        payloads = {
            tp: _stamped(records, broker.log_config(tp[0]).max_message_bytes, pid, epoch)
            for tp, records in req.partitions.items()
        }
        results = await asyncio.gather(
            *(
                broker.append(t, p, data, Acks.ALL, transactional=True)
                for (t, p), data in payloads.items()
            )
        )
        if req.offsets is not None:
            o = req.offsets
            await transactions.send_offsets(
                txn_id,
                pid,
                epoch,
                o.group_id,
                {(x.topic, x.partition): (x.offset, x.metadata) for x in o.offsets},
                member_id=o.member_id,
                generation=o.generation,
            )
        answer = await transactions.end(txn_id, pid, epoch, True)
    except BaseException:
        await _abort_quietly(transactions, txn_id, pid, epoch)
        raise
    base = {tp: r.base_offset for tp, r in zip(payloads, results, strict=True)}
    return {
        "transactional_id": txn_id,
        "producer_id": answer["producer_id"],
        "producer_epoch": answer["producer_epoch"],
        "completed": answer["completed"],
        "offsets": [
            {"topic": t, "partition": p, "offset": base[(t, p)] + j} for t, p, j in req.placement
        ],
    }


def _stamped(records: list[Record], max_message_bytes: int, pid: int, epoch: int) -> bytes:
    """The records as transactional batches of the session, sequences from 0."""
    data = build_batches(records, max_message_bytes)
    out: list[bytes] = []
    seq = 0
    for pos, h in scan_batches(data):
        out.append(
            with_producer(data[pos : pos + h.size_bytes], pid, epoch, seq, transactional=True)
        )
        seq += h.record_count
    return b"".join(out)


async def _abort_quietly(transactions: TxnCoordinator, txn_id: str, pid: int, epoch: int) -> None:
    # Fenced, or the coordinator is gone: the transaction's timeout aborts it then.
    with contextlib.suppress(LogbusError, OSError):
        await asyncio.shield(transactions.end(txn_id, pid, epoch, False))
