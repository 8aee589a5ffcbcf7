"""Visitors of the one record walk for the storage engine: produce validation, compaction keys,
Arrow columns.

A CRC proves the bytes arrived as the producer sent them, not that they are records: a batch
whose records lie about their lengths or offsets, carry a 100 KiB header name or a timestamp
near 2^63 would be stored and then fail every reader, for ever. So produced batches are walked
record by record, with the same walk and the same rules as every reader (``_recordwalk.h`` in
C; its Python twin is :func:`core_log.batch.walk_records`): what produce accepts, every reader
can serve.

The walk is per record, so it runs in C (``_recordscan.c``, without the GIL), and in Python
only where the extension was deliberately not built (``LOGBUS_PURE_PYTHON=1``); measured on a
1 MiB batch of 100-byte records, strict validation with the CRC runs at ≈ 3.7 GB/s with C and
the Python twin at 16 to 55 MB/s.

Two more visitors share the C module, each with a Python twin: ``record_keys`` (what
compaction needs) and ``batch_columns`` (the records of a fetch answer as Arrow column buffers,
for the Spark source: no Python object per record).
"""

from __future__ import annotations

from collections.abc import Callable

from .errors import CorruptRecordError, InvalidRecordError, InvalidTimestampError
from .limits import MAX_HEADER_KEY_BYTES

# (index, reason, offset or -1, structural): the first record the walk rejects
Fault = tuple[int, str, int, bool]
_Scanner = Callable[[bytes | memoryview, int, int, int, int, bool, bool], Fault | None]


def scan_records_py(
    data: bytes | memoryview,
    count: int,
    base_offset: int,
    base_timestamp: int,
    max_timestamp: int,
    log_append_time: bool,
    strict: bool,
) -> Fault | None:
    """The Python twin of ``_recordscan.scan_records`` (same faults, same reasons)."""
    from .batch import TIMESTAMP_TYPE_MASK, BatchHeader, walk_records

    h = BatchHeader(
        base_offset,
        0,
        0,
        2,
        0,
        TIMESTAMP_TYPE_MASK if log_append_time else 0,
        max(count - 1, 0),
        base_timestamp,
        max_timestamp,
        -1,
        -1,
        -1,
        count,
    )
    _, fault = walk_records(h, bytes(data), strict=strict)
    return None if fault is None else tuple(fault)  # type: ignore[return-value]


def scan_keys_py(data: bytes | memoryview, count: int) -> list[tuple[bytes | None, int, bool]]:
    """The Python twin of ``_recordscan.scan_keys``: (key, offset delta, tombstone) per record."""
    from .batch import BatchHeader, walk_records

    h = BatchHeader(0, 0, 0, 2, 0, 0, max(count - 1, 0), 0, 0, -1, -1, -1, count)
    records, fault = walk_records(h, bytes(data), check_timestamps=False)
    if fault is not None:
        raise ValueError(fault.reason)
    return [(r.key, r.offset, r.value is None) for r in records]


_KeyScanner = Callable[[bytes | memoryview, int], list[tuple[bytes | None, int, bool]]]

try:
    from ._recordscan import scan_keys as _native_keys  # type: ignore[import-not-found]
    from ._recordscan import scan_records as _native_scan

    NATIVE = True
    _scan: _Scanner = _native_scan
    _keys: _KeyScanner = _native_keys
except ImportError:  # built with LOGBUS_PURE_PYTHON=1
    NATIVE = False
    _scan = scan_records_py
    _keys = scan_keys_py


def record_keys(data: bytes | memoryview, count: int) -> list[tuple[bytes | None, int, bool]]:
    """(key, offset delta, tombstone) of each record of a records section the log holds —
    what compaction needs, without building a Record per record. Timestamps are not checked
    (compaction needs none, and must not stall on one record a reader cannot render)."""
    try:
        return _keys(data, count)
    except ValueError as e:
        raise CorruptRecordError(f"invalid records: {e}") from None


def check_records(
    data: bytes | memoryview,
    count: int,
    base_offset: int = 0,
    base_timestamp: int = 0,
    max_timestamp: int = 0,
    log_append_time: bool = False,
) -> None:
    """Raise unless ``data`` holds exactly ``count`` records every reader can serve, with offset
    deltas 0..count-1 (a producer's batch): :class:`InvalidTimestampError` for a timestamp
    outside -1 / 0..year 9999, else :class:`CorruptRecordError`."""
    fault = _scan(data, count, base_offset, base_timestamp, max_timestamp, log_append_time, True)
    if fault is None:
        return
    index, reason, _, structural = fault
    if not structural:
        raise InvalidTimestampError(
            f"record {index}: {reason} (a timestamp is -1 or 0..253402300799999 ms)",
            record_index=index,
        )
    if reason == "header key too long":  # well formed, over a documented cap
        raise InvalidRecordError(
            f"record {index}: a header key is longer than {MAX_HEADER_KEY_BYTES} bytes",
            record_index=index,
            max_header_key_bytes=MAX_HEADER_KEY_BYTES,
        )
    raise CorruptRecordError(f"invalid records: record {index}: {reason}", record_index=index)


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

    from .batch import (
        CONTROL_MASK,
        RECORDS_OFFSET,
        TIMESTAMP_OUT_OF_RANGE,
        scan_batches,
        timestamp_ok,
        walk_records,
    )

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
            records, fault = walk_records(h, section, start_offset, check_timestamps=False)
            for r in records:  # as the C walk: a bad timestamp before a structural fault first
                if r.offset < end_offset and not timestamp_ok(r.timestamp):
                    raise ValueError(f"offset {r.offset}: {TIMESTAMP_OUT_OF_RANGE}")
            if fault is not None:
                raise ValueError(f"offset {fault.offset}: {fault.reason}")
            for r in records:
                if r.offset >= end_offset:
                    continue
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
except ImportError:  # built with LOGBUS_PURE_PYTHON=1
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
