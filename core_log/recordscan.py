"""Structural validation of every record in a batch, as Kafka's broker does on produce.

A CRC proves the bytes arrived as the producer sent them, not that they are records: a batch
whose records lie about their lengths or offsets would be stored and then fail every reader.
So produced batches are walked record by record — every varint, every length against its
record's end, offset deltas 0..n-1, header counts, UTF-8 header keys — before anything is
appended.

The walk is per record, so it runs in C (``_recordscan.c``) when the optional extension was
built, and in Python otherwise; measured on a 1 MiB batch of 100-byte records, strict
validation with the CRC runs at ≈ 3.7 GB/s with C and the Python twin at 16 to 55 MB/s. Both
raise ``CorruptRecordError``.
"""

from __future__ import annotations

from collections.abc import Callable

from .errors import CorruptRecordError
from .limits import MAX_HEADERS_PER_RECORD

_Scanner = Callable[[bytes | memoryview, int, int], None]


def scan_records_py(data: bytes | memoryview, count: int, max_headers: int) -> None:
    """The Python twin of ``_recordscan.scan_records`` (same checks, same messages)."""
    from .batch import decode_varint

    buf = bytes(data)
    n = len(buf)
    pos = 0
    for i in range(count):
        try:
            length, pos = decode_varint(buf, pos)
        except CorruptRecordError:
            raise ValueError(f"record {i}: bad record length varint") from None
        if length < 1 or length > n - pos:
            raise ValueError(f"record {i}: record length runs past the batch")
        end = pos + length
        record = buf[pos + 1 : end]
        _scan_one(record, i, max_headers)
        pos = end
    if pos != n:
        raise ValueError(f"record {count}: trailing bytes after the last record")


def _scan_one(record: bytes, i: int, max_headers: int) -> None:
    from .batch import decode_varint

    def varint(pos: int, what: str) -> tuple[int, int]:
        try:
            return decode_varint(record, pos)
        except CorruptRecordError:
            raise ValueError(f"record {i}: {what}") from None

    end = len(record)
    _, pos = varint(0, "bad timestamp delta")
    off_delta, pos = varint(pos, "bad offset delta")
    if off_delta != i:
        raise ValueError(f"record {i}: offset deltas must be 0..n-1")
    for what in ("key", "value"):
        size, pos = varint(pos, f"{what} runs past the record")
        if size < -1 or size > end - pos:
            raise ValueError(f"record {i}: {what} runs past the record")
        pos += max(size, 0)
    hcount, pos = varint(pos, "invalid header count")
    if hcount < 0 or hcount > max_headers:
        raise ValueError(f"record {i}: invalid header count")
    for _ in range(hcount):
        hklen, pos = varint(pos, "header key runs past the record")
        if hklen < 0 or hklen > end - pos:
            raise ValueError(f"record {i}: header key runs past the record")
        try:
            record[pos : pos + hklen].decode()
        except UnicodeDecodeError:
            raise ValueError(f"record {i}: header key is not UTF-8") from None
        pos += hklen
        hvlen, pos = varint(pos, "header value runs past the record")
        if hvlen < -1 or hvlen > end - pos:
            raise ValueError(f"record {i}: header value runs past the record")
        pos += max(hvlen, 0)
    if pos != end:
        raise ValueError(f"record {i}: record length does not match its fields")


def scan_keys_py(data: bytes | memoryview, count: int) -> list[tuple[bytes | None, int, bool]]:
    """The Python twin of ``_recordscan.scan_keys``: (key, offset delta, tombstone) per record."""
    from .batch import BatchHeader, decode_records_of

    h = BatchHeader(0, 0, 0, 2, 0, 0, max(count - 1, 0), 0, 0, -1, -1, -1, count)
    try:
        records = decode_records_of(h, bytes(data))
    except CorruptRecordError as e:
        raise ValueError(str(e)) from None
    return [(r.key, r.offset, r.value is None) for r in records]


_KeyScanner = Callable[[bytes | memoryview, int], list[tuple[bytes | None, int, bool]]]

try:
    from ._recordscan import scan_keys as _native_keys  # type: ignore[import-not-found]
    from ._recordscan import scan_records as _native_scan

    NATIVE = True
    _scan: _Scanner = _native_scan
    _keys: _KeyScanner = _native_keys
except ImportError:  # no compiler at install time
    NATIVE = False
    _scan = scan_records_py
    _keys = scan_keys_py


def record_keys(data: bytes | memoryview, count: int) -> list[tuple[bytes | None, int, bool]]:
    """(key, offset delta, tombstone) of each record of a records section the log holds —
    what compaction needs, without building a Record per record."""
    try:
        return _keys(data, count)
    except ValueError as e:
        raise CorruptRecordError(f"invalid records: {e}") from None


def check_records(data: bytes | memoryview, count: int) -> None:
    """Raise :class:`CorruptRecordError` unless ``data`` holds exactly ``count`` valid records
    with offset deltas 0..count-1."""
    try:
        _scan(data, count, MAX_HEADERS_PER_RECORD)
    except ValueError as e:
        raise CorruptRecordError(f"invalid records: {e}") from None
