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
existing record codecs) or :func:`committed_records` (records).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Literal

from .batch import BatchHeader, Record, decode_records, scan_batches
from .txn_index import AbortedTxn

# Kafka's isolation.level values; read_uncommitted is the default, as in Kafka.
IsolationLevel = Literal["read_uncommitted", "read_committed"]
ISOLATION_LEVELS: tuple[IsolationLevel, ...] = ("read_uncommitted", "read_committed")


class _Aborted:
    """Aborted ranges by producer id: ``contains(pid, offset)``."""

    def __init__(self, aborted: Iterable[AbortedTxn]) -> None:
        self._ranges: dict[int, list[tuple[int, int]]] = {}
        for a in aborted:
            self._ranges.setdefault(a.producer_id, []).append((a.first_offset, a.last_offset))

    def __bool__(self) -> bool:
        return bool(self._ranges)

    def contains(self, producer_id: int, offset: int) -> bool:
        ranges = self._ranges.get(producer_id)
        return ranges is not None and any(lo <= offset <= hi for lo, hi in ranges)


def committed_batches(
    data: bytes | memoryview, aborted: Iterable[AbortedTxn]
) -> Iterator[tuple[int, BatchHeader]]:
    """(position, header) of each whole batch of ``data`` that holds committed data."""
    index = _Aborted(aborted)
    for pos, h in scan_batches(data):
        if h.is_control:
            continue
        if h.is_transactional and index and index.contains(h.producer_id, h.base_offset):
            continue
        yield pos, h


def committed_bytes(data: bytes, aborted: Iterable[AbortedTxn]) -> bytes:
    """``data`` without its control batches and aborted batches (``data`` itself, no copy,
    when nothing is dropped)."""
    kept = list(committed_batches(data, aborted))
    if sum(h.size_bytes for _, h in kept) == len(data):
        return data
    view = memoryview(data)
    return b"".join(view[pos : pos + h.size_bytes] for pos, h in kept)


def committed_records(data: bytes | memoryview, aborted: Iterable[AbortedTxn]) -> Iterator[Record]:
    """Every committed data record of ``data``, in offset order."""
    for pos, _ in committed_batches(data, aborted):
        yield from decode_records(data, pos)
