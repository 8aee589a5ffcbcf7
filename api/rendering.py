"""JSON answers bounded by ``max_bytes`` of *rendered* records, as Kafka bounds a fetch.

Theory of operation
-------------------
A read is bounded by stored bytes, which compression makes a poor bound on an answer: an
8 KB zstd batch may hold 16 MiB of records (the produce cap, ``LogConfig.max_decompressed_bytes``)
and a 1 MiB read sixty such batches — a 1.3 GB JSON answer for ``max_bytes=1 MiB`` (base64
adds a third). :func:`encode_json_within` renders batch by batch with
:func:`core_log.recordjson.encode_json` (the C walk) and stops once the answer would pass
``max_bytes``, always keeping the first record so a consumer progresses (Kafka returns the
first batch whatever ``fetch.max.bytes`` says). Memory is then one answer plus one batch.

Only the batch that crosses the budget is cut at a record boundary: it is rendered again with
``\\n`` between records — a byte no rendered record contains, since NDJSON and SSE carry one
record per line — split, and the records that fit are kept. That happens once per answer, so
the common case costs one C call per batch, as before; the cut batch costs two more (its lines,
then the records kept).
"""

from __future__ import annotations

from dataclasses import dataclass

from core_log.batch import scan_batches
from core_log.recordjson import encode_json

_LINE = b"\n"


@dataclass(frozen=True, slots=True)
class Rendered:
    """Records rendered as JSON objects joined by the caller's separator."""

    body: bytes
    count: int
    last_offset: int  # of the last record in ``body``; -1 when empty
    full: bool  # stopped by the byte budget: records after ``last_offset`` were left out

    def next_offset(self, start: int) -> int:
        """Where a consumer continues after a ``full`` answer."""
        return self.last_offset + 1 if self.count else start


def encode_json_within(
    data: bytes | memoryview,
    start_offset: int,
    max_records: int,
    max_bytes: int,
    *,
    extra: bytes = b"",
    sep: bytes = b",",
    at_least_one: bool = True,
) -> Rendered:
    """The records of the whole batches in ``data`` at or after ``start_offset``, at most
    ``max_records`` and ``max_bytes`` of rendered body — but the first record even when it is
    larger, unless ``at_least_one`` is False (a caller that already answers with records).
    Raises :class:`~core_log.errors.CorruptRecordError` as ``encode_json`` does."""
    view = memoryview(data)
    parts: list[bytes] = []
    size = count = 0
    last = -1
    for pos, h in scan_batches(view):
        if count >= max_records:
            break
        if h.last_offset < start_offset:
            continue
        gap = len(sep) if parts else 0
        if size + gap >= max_bytes and (count or not at_least_one):
            return Rendered(sep.join(parts), count, last, True)
        batch = view[pos : pos + h.size_bytes]
        body, n, at = encode_json(batch, start_offset, max_records - count, extra=extra, sep=sep)
        if not n:
            continue
        if size + gap + len(body) > max_bytes and (n > 1 or count or not at_least_one):
            room = max_bytes - size - gap
            lines = body if sep == _LINE else None
            take = _count_within(
                batch, start_offset, n, room, at_least_one and not count, extra, sep, lines
            )
            if take:
                body, n, at = encode_json(batch, start_offset, take, extra=extra, sep=sep)
                parts.append(body)
                count += n
                last = at
            return Rendered(sep.join(parts), count, last, True)
        parts.append(body)
        size += gap + len(body)
        count += n
        last = at
    return Rendered(sep.join(parts), count, last, False)


def _count_within(
    batch: memoryview,
    start_offset: int,
    limit: int,
    room: int,
    need_one: bool,
    extra: bytes,
    sep: bytes,
    lines: bytes | None,
) -> int:
    """How many of the first records of ``batch`` (at most ``limit``) fit in ``room`` bytes
    joined by ``sep`` (at least one with ``need_one``). ``lines``: their rendering one per
    line, if the caller has it."""
    if lines is None:
        lines, n, _ = encode_json(batch, start_offset, limit, extra=extra, sep=_LINE)
        assert n == limit
    used = take = 0
    for obj in lines.split(_LINE):
        add = len(obj) + (len(sep) if take else 0)
        if used + add > room and (take or not need_one):
            break
        used += add
        take += 1
    return take
