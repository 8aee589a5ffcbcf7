"""``read_committed`` for readers: which batches of a fetch hold committed data. Pure functions.

Theory of operation
-------------------
:meth:`core_log.log.PartitionLog.read_committed` returns whole stored batches below the last
stable offset plus the aborted transactions overlapping them (:class:`AbortedTxn`: producer id,
first offset, ABORT marker offset). Every transaction below the LSO is decided, and a batch
belongs to exactly one producer, so committed data is chosen a batch at a time, from headers
alone — no record is decoded, which keeps a ``read_committed`` fetch as cheap as a
``read_uncommitted`` one. A batch is dropped when it is

* a control batch (a COMMIT/ABORT marker: it takes an offset, but holds no data), or
* a transactional batch of producer ``p`` whose base offset lies in ``[first, marker]`` of an
  aborted transaction of ``p`` (Kafka's consumer keeps the same rule with the marker found by
  reading; the index gives its offset).

Everything else — non-transactional batches, transactional batches of committed transactions —
is committed data. The JSON/SSE/WebSocket readers call :func:`committed_bytes` (batches, for the
existing record codecs), :func:`committed_spans` (where those batches are) or
:func:`committed_records` (records).

Cost (measured on a 2-core machine: 20,000 transactional batches of 10 records of ~110 bytes,
one transaction in ten aborted, read in 1 MiB reads): ``read_committed`` + :func:`committed_bytes`
takes ~2.3x the time of a bare ``read_uncommitted`` read, ~0.8 us a batch for the header sweep
and the copy; a bare read does no per-batch work at all, so the ratio is far closer once a
reader renders the records (JSON costs microseconds per record).
"""

from __future__ import annotations

import struct
from collections.abc import Iterable, Iterator
from typing import Literal

from .batch import (
    CONTROL_MASK,
    HEADER_BYTES,
    LOG_OVERHEAD,
    TRANSACTIONAL_MASK,
    BatchHeader,
    Record,
    decode_records,
    scan_batches,
)
from .txn_index import AbortedTxn

# Kafka's isolation.level values; read_uncommitted is the default, as in Kafka.
IsolationLevel = Literal["read_uncommitted", "read_committed"]
ISOLATION_LEVELS: tuple[IsolationLevel, ...] = ("read_uncommitted", "read_committed")


# The header fields the choice needs: baseOffset, batchLength, attributes, producerId.
_HEAD = struct.Struct(">qi9xh20xq")
assert _HEAD.size == 51


def committed_spans(
    data: bytes | memoryview, aborted: Iterable[AbortedTxn]
) -> list[tuple[int, int]]:
    """(position, size) of each whole batch of ``data`` that holds committed data, adjacent
    batches merged into one span. One struct unpack per batch and a sweep over the aborted
    ranges in offset order: no header object, no record decoded (~0.3 us a batch)."""
    ranges = sorted((a.first_offset, a.last_offset, a.producer_id) for a in aborted)
    active: dict[int, int] = {}  # producer id -> marker offset of its aborted range begun
    next_range = 0
    spans: list[tuple[int, int]] = []
    pos, end = 0, len(data)
    unpack = _HEAD.unpack_from
    while end - pos >= HEADER_BYTES:
        base, length, attributes, producer_id = unpack(data, pos)
        size = length + LOG_OVERHEAD
        if length < HEADER_BYTES - LOG_OVERHEAD or pos + size > end:
            break
        while next_range < len(ranges) and ranges[next_range][0] <= base:
            _, last, pid = ranges[next_range]
            active[pid] = max(active.get(pid, -1), last)
            next_range += 1
        dropped = attributes & CONTROL_MASK or (
            attributes & TRANSACTIONAL_MASK and active.get(producer_id, -1) >= base
        )
        if not dropped:
            if spans and spans[-1][0] + spans[-1][1] == pos:
                spans[-1] = (spans[-1][0], spans[-1][1] + size)
            else:
                spans.append((pos, size))
        pos += size
    return spans


def committed_batches(
    data: bytes | memoryview, aborted: Iterable[AbortedTxn]
) -> Iterator[tuple[int, BatchHeader]]:
    """(position, header) of each whole batch of ``data`` that holds committed data."""
    for start, size in committed_spans(data, aborted):
        yield from (
            (start + pos, h) for pos, h in scan_batches(memoryview(data)[start : start + size])
        )


def committed_bytes(data: bytes, aborted: Iterable[AbortedTxn]) -> bytes:
    """``data`` without its control batches and aborted batches (``data`` itself, no copy,
    when nothing is dropped)."""
    spans = committed_spans(data, aborted)
    if len(spans) == 1 and spans[0] == (0, len(data)):
        return data
    view = memoryview(data)
    return b"".join(view[pos : pos + size] for pos, size in spans)


def committed_records(data: bytes | memoryview, aborted: Iterable[AbortedTxn]) -> Iterator[Record]:
    """Every committed data record of ``data``, in offset order."""
    for pos, _ in committed_batches(data, aborted):
        yield from decode_records(data, pos)
