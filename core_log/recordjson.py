"""Records of a fetch as JSON text, straight from the log's batches: no Python object per record.

Theory of operation
-------------------
A JSON fetch used to decode every record into a :class:`~core_log.batch.Record`, turn it into a
dict (``api.records_codec.record_to_json``: an ``orjson.loads`` per value to decide whether it
is embedded or sent as base64) and encode the lot: ≈ 4.4 µs of broker CPU per record, 60 % of
it in those two steps. :func:`encode_json` walks each batch's records section in C
(``_recordjson.c``) and writes each record's JSON object directly, the GIL released; Python
only steps over batch headers and decompresses compressed batches with the log's codec.
Measured on 100-byte JSON values: ≈ 0.07-0.2 µs a record in C, ≈ 6 µs in the Python twin;
JSON fetch went from ≈ 0.27 M to ≈ 1.5-1.9 M records/s (wrk, 4 connections, 2 cores) and
WebSocket JSON push from ≈ 0.22 M to ≈ 0.42-0.47 M records/s (client-bound; broker CPU
4.55 → 0.75-0.85 µs a record).

Each object is what ``api.records_codec.record_to_json`` (the CLI's path, for Record
objects) gives through ``orjson.dumps``, with ``extra`` (raw JSON members, e.g.
``b',"topic":"t","partition":0'``) appended inside it; fetch, NDJSON, SSE, WebSocket and member
polls all render through :func:`encode_json`::

    {"offset":7,"timestamp":1700000000000,"key":"k"|null,"value":<raw JSON>|null,
     "headers":[{"name":"h","value":"v"}]}

A key or header value that is not UTF-8 becomes ``key_b64``/``value_b64``; a value that is not
one JSON text by the one rule (:func:`is_json`) becomes ``value_b64``.

The one rule, :func:`is_json`: strict RFC 8259 (no NaN/Infinity, no lone surrogate escape,
valid UTF-8, no BOM, nothing after the value), nesting at most ``MAX_DEPTH`` (512) deep, and no
number a double cannot hold (``1e999``, ``-1e999``, a 310-digit integer: JSON.parse makes them
Infinity and orjson refuses them, so a client could not read the answer). The C validator
decides overflow by comparing digits with 2^1024 - 2^970 (the smallest magnitude that rounds
to infinity); the twin asks Python's correctly rounded ``float``.

Records are walked by the one record walk (``_recordwalk.h``; twin
:func:`core_log.batch.walk_records`), so a record produce accepted always renders. A stored
record it rejects (old data, corruption) ends an answer before it; asked for first, it raises
:class:`~core_log.errors.UnreadableRecordError` with its offset and where to read on.

The pure-Python twin (:func:`encode_section_py`, used when the extension was deliberately not
built, and by the tests as the reference) gives the same bytes and the same faults.
"""

from __future__ import annotations

import base64
import json
import math
from collections.abc import Callable
from typing import Any

import orjson

from .batch import (
    HEADER,
    HEADER_BYTES,
    LOG_OVERHEAD,
    RECORDS_OFFSET,
    BatchHeader,
    Record,
    walk_records,
)
from .compression import Compression, decompress
from .errors import CorruptRecordError, UnreadableRecordError
from .limits import MAX_HEADER_KEY_BYTES, MAX_HEADERS_PER_RECORD, MAX_TIMESTAMP_MS

_LINE_BREAKS = bytes.maketrans(b"\r\n", b"  ")


def one_line(value: bytes) -> bytes:
    """A valid JSON text with its line breaks made spaces: outside strings they are only
    whitespace (inside, they must be escaped), so the value is unchanged and one record stays
    one NDJSON line or SSE data line."""
    return value.translate(_LINE_BREAKS)


MAX_DEPTH = 512  # nesting of a value embedded as JSON; deeper values are sent as value_b64

_COMPRESSION_MASK = 0x07
_TIMESTAMP_TYPE_MASK = 0x08
_MIN_BATCH_LENGTH = HEADER_BYTES - LOG_OVERHEAD

# (reason, offset or -1, structural): why a section's walk stopped at a record
SectionFault = tuple[str, int, bool]
# (section, record_count, base_offset, base_timestamp, log_append_time, max_timestamp,
#  start_offset, max_records, extra, sep) -> (body, count, last_offset, fault)
SectionEncoder = Callable[
    [bytes | memoryview, int, int, int, bool, int, int, int, bytes, bytes],
    tuple[bytes, int, int, SectionFault | None],
]


# -- the Python twin -------------------------------------------------------------------------


class _Pairs(list[Any]):
    """A JSON object as its (key, value) pairs: duplicate keys are all kept and checked."""


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def _finite(text: str) -> None:
    """A number a double can hold (Python's float rounds exactly as the C comparison does)."""
    if math.isinf(float(text)):
        raise ValueError(f"{text[:20]} overflows a double")


def is_json_py(raw: bytes | memoryview) -> bool:
    """Is ``raw`` one strict JSON text? The twin of ``_recordjson.is_json`` (same answers)."""
    try:
        text = bytes(raw).decode()
        doc = json.loads(
            text,
            object_pairs_hook=_Pairs,
            parse_constant=_reject_constant,
            parse_int=_finite,
            parse_float=_finite,
        )
    except (ValueError, RecursionError):  # JSONDecodeError and UnicodeDecodeError included
        return False
    return _nesting_ok(doc)


def _nesting_ok(doc: Any) -> bool:
    """No container deeper than MAX_DEPTH, no string with a lone surrogate."""
    stack = [(doc, 1)]
    while stack:
        node, depth = stack.pop()
        if isinstance(node, str):
            try:
                node.encode()
            except UnicodeEncodeError:
                return False
        elif isinstance(node, _Pairs):
            if depth > MAX_DEPTH:
                return False
            for k, v in node:
                stack.append((k, depth + 1))
                stack.append((v, depth + 1))
        elif isinstance(node, list):
            if depth > MAX_DEPTH:
                return False
            stack.extend((v, depth + 1) for v in node)
    return True


def _text_or_b64(name: bytes, raw: bytes | None) -> bytes:
    if raw is None:
        return b',"%s":null' % name
    try:
        return b',"%s":%s' % (name, orjson.dumps(raw.decode()))
    except UnicodeDecodeError:
        return b',"%s_b64":"%s"' % (name, base64.b64encode(raw))


def encode_section_py(
    section: bytes | memoryview,
    record_count: int,
    base_offset: int,
    base_timestamp: int,
    log_append_time: bool,
    max_timestamp: int,
    start_offset: int,
    max_records: int,
    extra: bytes,
    sep: bytes,
) -> tuple[bytes, int, int, SectionFault | None]:
    """The twin of ``_recordjson.encode_section``: one batch's records section → JSON, and the
    fault that stopped the walk (the records before it are rendered)."""
    h = BatchHeader(
        base_offset,
        0,
        0,
        2,
        0,
        _TIMESTAMP_TYPE_MASK if log_append_time else 0,
        0,
        base_timestamp,
        max_timestamp,
        -1,
        -1,
        -1,
        record_count,
    )
    if max_records <= 0:
        return b"", 0, -1, None
    records, fault = walk_records(h, bytes(section), start_offset, limit=max_records)
    parts = [render_record(r, extra) for r in records]
    last = records[-1].offset if records else -1
    why = None if fault is None else (fault.reason, fault.offset, fault.structural)
    return sep.join(parts), len(parts), last, why


def render_record(r: Record, extra: bytes = b"") -> bytes:
    """One record's JSON object, as the C walk writes it (``extra``: raw members to append)."""
    out = [b'{"offset":%d,"timestamp":%d' % (r.offset, r.timestamp)]
    out.append(_text_or_b64(b"key", r.key))
    if r.value is None:
        out.append(b',"value":null')
    elif is_json_py(r.value):
        out.append(b',"value":' + one_line(r.value))
    else:
        out.append(b',"value_b64":"%s"' % base64.b64encode(r.value))
    hs = [
        b'{"name":%s%s}' % (orjson.dumps(name), _text_or_b64(b"value", hv))
        for name, hv in r.headers
    ]
    out.append(b',"headers":[%s]%s}' % (b",".join(hs), extra))
    return b"".join(out)


# -- the C walk, when built ------------------------------------------------------------------

try:
    from . import _recordjson  # type: ignore[attr-defined]
except ImportError:  # pragma: no cover - the extension is optional
    _recordjson = None

NATIVE = _recordjson is not None  # the C walk was built

if _recordjson is not None:
    assert _recordjson.MAX_DEPTH == MAX_DEPTH
    assert _recordjson.MAX_HEADERS_PER_RECORD == MAX_HEADERS_PER_RECORD
    assert _recordjson.MAX_HEADER_KEY_BYTES == MAX_HEADER_KEY_BYTES
    assert _recordjson.MAX_TIMESTAMP_MS == MAX_TIMESTAMP_MS
    encode_section: SectionEncoder = _recordjson.encode_section
    is_json: Callable[[bytes | memoryview], bool] = _recordjson.is_json
else:  # pragma: no cover
    encode_section = encode_section_py
    is_json = is_json_py

_unpack_header = HEADER.unpack_from


def encode_json(
    data: bytes | memoryview,
    start_offset: int,
    max_records: int,
    *,
    extra: bytes = b"",
    sep: bytes = b",",
    encoder: SectionEncoder | None = None,
) -> tuple[bytes, int, int]:
    """:func:`encode_json_upto` without where it stopped: (body, count, last offset)."""
    body, count, last, _ = encode_json_upto(
        data, start_offset, max_records, extra=extra, sep=sep, encoder=encoder
    )
    return body, count, last


def encode_json_upto(
    data: bytes | memoryview,
    start_offset: int,
    max_records: int,
    *,
    extra: bytes = b"",
    sep: bytes = b",",
    encoder: SectionEncoder | None = None,
) -> tuple[bytes, int, int, int | None]:
    """The records of the whole batches in ``data`` (as read from the log) at or after
    ``start_offset``, at most ``max_records``, as JSON objects joined by ``sep``.

    Returns (body, records in it, offset of the last one or -1, the offset of an unreadable
    record the answer stopped before or None): a reader goes on from there, never past it,
    whatever else the read held. A trailing partial batch is
    ignored, as :func:`~core_log.batch.scan_batches` does; batches ending before
    ``start_offset`` are skipped unread. ``encoder`` picks the C walk or the Python twin
    (default: C when built). A record no reader can serve (:mod:`core_log.batch`'s walk
    rejects it) ends the answer before it; if it is the first, raises
    :class:`UnreadableRecordError` naming its offset and where to read on.
    """
    walk = encode_section if encoder is None else encoder
    view = memoryview(data)
    end = len(view)
    pos = 0
    parts: list[bytes] = []
    count = 0
    last = -1
    while end - pos >= HEADER_BYTES and count < max_records:
        f = _unpack_header(view, pos)
        base_offset, batch_length, attributes, last_delta = f[0], f[1], f[5], f[6]
        size = batch_length + LOG_OVERHEAD
        if batch_length < _MIN_BATCH_LENGTH or pos + size > end:
            break
        batch_next = base_offset + last_delta + 1
        if batch_next > start_offset:
            section: bytes | memoryview = view[pos + RECORDS_OFFSET : pos + size]
            codec = attributes & _COMPRESSION_MASK
            fault: SectionFault | None = None
            n = 0
            try:
                if codec > Compression.ZSTD:
                    raise CorruptRecordError(f"unknown compression codec {codec}")
                if codec:
                    section = decompress(Compression(codec), bytes(section))
            except CorruptRecordError as e:
                fault = (e.message, -1, True)
            else:
                body, n, at, fault = walk(
                    section,
                    f[12],  # recordCount
                    base_offset,
                    f[7],  # baseTimestamp
                    bool(attributes & _TIMESTAMP_TYPE_MASK),
                    f[8],  # maxTimestamp
                    start_offset,
                    max_records - count,
                    extra,
                    sep,
                )
                if n:
                    parts.append(body)
                    count += n
                    last = at
            if fault is not None:
                if count:  # serve what came before; the next read from there reports it
                    return sep.join(parts), count, last, last + 1
                raise unreadable(fault, start_offset, base_offset, batch_next)
        pos += size
    return sep.join(parts), count, last, None


def read_on_from(end: int, stop: int | None) -> int:
    """Where a reader whose read ended at ``end`` goes on, given :func:`encode_json_upto`'s
    ``stop``: never past an unreadable record it has not named yet."""
    return end if stop is None else min(end, stop)


def unreadable(
    fault: SectionFault, start_offset: int, base_offset: int, batch_next: int
) -> UnreadableRecordError:
    """The error for a stored record no reader can serve: which offset, and where a consumer
    that skips it reads on (past the record, or past its batch when the batch's bytes are
    unreadable from there on)."""
    reason, at, structural = fault
    first = max(start_offset, base_offset)
    offset = min(max(at, first), batch_next - 1)
    next_offset = batch_next if structural else offset + 1
    return UnreadableRecordError(
        f"the record at offset {offset} cannot be read ({reason}); skip it by reading on "
        f"from offset {next_offset}",
        offset=offset,
        next_offset=next_offset,
    )
