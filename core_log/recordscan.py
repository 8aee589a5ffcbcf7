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

Two more walks share the C module, each with a Python twin: ``record_keys`` (what compaction
needs) and ``batch_columns`` (the records of a fetch answer as Arrow column buffers, for the
Spark source: no Python object per record).
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


# ---------------------------------------------------------------------------------------------
# column-wise decode (for Arrow readers: spark_sink)
# ---------------------------------------------------------------------------------------------

BatchColumns = tuple[
    int,
    int,
    bytes,
    bytes,
    bytes,
    bytes,
    bytes,
    bytes | None,
    bytes,
    bytes,
    bytes | None,
    bytes | None,
    bytes | None,
    bytes | None,
    bytes | None,
    bytes | None,
    bytes | None,
]


def _bitmap(valid: list[bool]) -> bytes | None:
    if all(valid):
        return None
    out = bytearray((len(valid) + 7) // 8)
    for i, v in enumerate(valid):
        if v:
            out[i >> 3] |= 1 << (i & 7)
    return bytes(out)


def _offsets_data(items: list[bytes | None]) -> tuple[bytes, bytes, bytes | None]:
    import array

    ends = array.array("i", [0])
    pos = 0
    for item in items:
        pos += len(item or b"")
        ends.append(pos)
    return (
        ends.tobytes(),
        b"".join(i or b"" for i in items),
        _bitmap([i is not None for i in items]),
    )


def batch_columns_py(
    data: bytes | memoryview, start_offset: int, end_offset: int, include_headers: bool
) -> BatchColumns | None:
    """The Python twin of ``_recordscan.batch_columns``: Arrow column buffers of the records
    with offsets in [start_offset, end_offset) of the whole batches in ``data`` (control batches
    skipped), or None if a batch is compressed. See ``_recordscan.c`` for the tuple's layout."""
    import array

    from .batch import CONTROL_MASK, RECORDS_OFFSET, decode_records_of, scan_batches

    buf = bytes(data)
    batches = list(scan_batches(buf))
    if any(h.attributes & 0x07 for _, h in batches):
        return None
    offsets = array.array("q")
    stamps = array.array("q")
    types = array.array("i")
    keys: list[bytes | None] = []
    values: list[bytes | None] = []
    header_ends = array.array("i", [0])
    hkeys: list[bytes | None] = []
    hvalues: list[bytes | None] = []
    next_offset = start_offset
    for pos, h in batches:
        if h.magic != 2:
            raise ValueError("unsupported batch magic")
        if h.base_offset >= end_offset:
            break
        if not h.attributes & CONTROL_MASK and h.next_offset > start_offset:
            section = buf[pos + RECORDS_OFFSET : pos + h.size_bytes]
            try:
                records = decode_records_of(h, section)
            except CorruptRecordError as e:
                raise ValueError(str(e)) from None
            for r in records:
                if r.offset < start_offset:
                    continue
                if r.offset >= end_offset:
                    break
                offsets.append(r.offset)
                stamps.append(r.timestamp * 1000)
                types.append(1 if h.log_append_time else 0)
                keys.append(r.key)
                values.append(r.value)
                if include_headers:
                    hkeys.extend(k.encode() for k, _ in r.headers)
                    hvalues.extend(v for _, v in r.headers)
                    header_ends.append(len(hkeys))
        next_offset = max(next_offset, h.next_offset)
    next_offset = min(next_offset, end_offset)
    koff, kdata, kvalid = _offsets_data(keys)
    voff, vdata, vvalid = _offsets_data(values)
    head: tuple[bytes | None, ...] = (None,) * 6
    if include_headers:
        hkoff, hkdata, _ = _offsets_data(hkeys)
        hvoff, hvdata, hvvalid = _offsets_data(hvalues)
        head = (header_ends.tobytes(), hkoff, hkdata, hvoff, hvdata, hvvalid)
    return (  # type: ignore[return-value]  # the 17 fields of the C tuple, checked by tests
        len(offsets),
        next_offset,
        offsets.tobytes(),
        stamps.tobytes(),
        types.tobytes(),
        koff,
        kdata,
        kvalid,
        voff,
        vdata,
        vvalid,
        *head,
    )


_ColumnScanner = Callable[[bytes | memoryview, int, int, bool], BatchColumns | None]

try:
    from ._recordscan import batch_columns as _native_columns

    _columns: _ColumnScanner = _native_columns
except ImportError:  # no compiler at install time, or an extension built before batch_columns
    _columns = batch_columns_py


def batch_columns(
    data: bytes | memoryview, start_offset: int, end_offset: int, include_headers: bool
) -> BatchColumns | None:
    """Arrow column buffers of the records in [start_offset, end_offset) of the whole,
    uncompressed batches in ``data``; None if one is compressed (decompress it first).
    Raises :class:`CorruptRecordError` on a malformed batch."""
    try:
        return _columns(data, start_offset, end_offset, include_headers)
    except ValueError as e:
        raise CorruptRecordError(f"invalid records: {e}") from None
