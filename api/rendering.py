"""JSON answers bounded by ``max_bytes`` of *rendered* records, as Kafka bounds a fetch.

Theory of operation
-------------------
A read is bounded by stored bytes, which compression makes a poor bound on an answer: an 8 KB
zstd batch may hold 16 MiB of records (the produce cap, ``LogConfig.max_decompressed_bytes``);
a 1 MiB member poll of a 26 KB log of 480 records of 1 MiB answered 671 MB. Here
:func:`encode_json_within` renders piece by piece with :func:`core_log.recordjson.encode_json`
(the C walk) and stops once the answer would pass ``max_bytes``, always keeping the first
record so a consumer progresses (Kafka likewise returns a first batch larger than
``fetch.max.bytes``). Memory is then the answer plus one piece.

Rendering goes by pieces: each compressed batch alone, uncompressed batches in runs of up to
``RUN_BYTES`` stored (their rendering is at most a few times that: base64 adds a third, escapes
up to 6x), so a log of one-record batches costs one C call per run, not one per batch (a call
per batch measured 2.2x slower on 1-record batches). Only the piece that crosses the budget is
cut at a record boundary: it is rendered again with ``\\n`` between records — a byte no rendered
record contains, since NDJSON and SSE carry one record per line — split, and the records that
fit are rendered once more. That happens once per answer.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator
from dataclasses import dataclass

from core_log.batch import (
    ATTRIBUTES_OFFSET,
    COMPRESSION_MASK,
    CONTROL_MASK,
    HEADER_BYTES,
    LOG_OVERHEAD,
)
from core_log.errors import UnreadableRecordError
from core_log.recordjson import encode_json, encode_json_upto

_LINE = b"\n"
RUN_BYTES = 64 * 1024  # stored bytes of uncompressed batches rendered by one C call
_LENGTH = struct.Struct(">i")  # batchLength, at 8
_ATTRIBUTES = struct.Struct(">h")
_MIN_BATCH_LENGTH = HEADER_BYTES - LOG_OVERHEAD


@dataclass(frozen=True, slots=True)
class Rendered:
    """Records rendered as JSON objects joined by the caller's separator: the pieces as the
    renderer gave them (one per run of batches), joined once by whoever sends them."""

    parts: list[bytes]
    sep: bytes
    count: int
    last_offset: int  # of the last record in ``body``; -1 when empty
    full: bool  # stopped by the byte budget: records after ``last_offset`` were left out
    # Stopped before a record no reader can serve (``encode_json_upto``'s ``stop``): a reader
    # goes on from here, never past it; the next read names it.
    stop: int | None = None

    @property
    def body(self) -> bytes:
        """The records joined by ``sep`` (no copy when one piece holds them all)."""
        return self.sep.join(self.parts)

    def joined(self, head: bytes, tail: bytes) -> bytes:
        """``head + body + tail`` with one copy of the records, not two (a 1,000-record
        JSON page of 100-byte values is 174 KB, rendered in two pieces)."""
        pieces = [head]
        for i, part in enumerate(self.parts):
            if i:
                pieces.append(self.sep)
            pieces.append(part)
        pieces.append(tail)
        return b"".join(pieces)

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
    A record no reader can serve ends the answer before it (``stop``); when it comes first,
    :class:`~core_log.errors.UnreadableRecordError` names it, as ``encode_json_upto`` does."""
    view = memoryview(data)
    parts: list[bytes] = []
    size = count = 0
    last = -1
    for batch in _pieces(view):
        if count >= max_records:
            break
        gap = len(sep) if parts else 0
        if size + gap >= max_bytes and (count or not at_least_one):
            return Rendered(parts, sep, count, last, True)
        try:
            body, n, at, stop = encode_json_upto(
                batch, start_offset, max_records - count, extra=extra, sep=sep
            )
        except UnreadableRecordError:
            if not count:
                raise
            return Rendered(parts, sep, count, last, False, last + 1)
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
            return Rendered(parts, sep, count, last, True)
        parts.append(body)
        size += gap + len(body)
        count += n
        last = at
        if stop is not None:
            return Rendered(parts, sep, count, last, False, stop)
    return Rendered(parts, sep, count, last, False)


def _pieces(view: memoryview) -> Iterator[memoryview]:
    """The whole batches of ``view``: each compressed one alone, uncompressed ones in runs of
    at most ``RUN_BYTES`` (or one larger batch). A trailing partial batch is left out, and so
    are control batches (COMMIT/ABORT markers: Kafka's consumers skip them at either
    isolation level; their offsets are passed over like a compaction gap)."""
    pos = run = 0
    end = len(view)
    while end - pos >= HEADER_BYTES:
        (length,) = _LENGTH.unpack_from(view, pos + 8)
        size = length + LOG_OVERHEAD
        if length < _MIN_BATCH_LENGTH or pos + size > end:
            break
        (attributes,) = _ATTRIBUTES.unpack_from(view, pos + ATTRIBUTES_OFFSET)
        if attributes & CONTROL_MASK:  # a transaction marker: no reader is served its record
            if run < pos:
                yield view[run:pos]
            pos += size
            run = pos
            continue
        if attributes & COMPRESSION_MASK:
            if run < pos:
                yield view[run:pos]
            yield view[pos : pos + size]
            run = pos + size
        elif pos > run and pos + size - run > RUN_BYTES:
            yield view[run:pos]
            run = pos
        pos += size
    if run < pos:
        yield view[run:pos]


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
