"""Binary fetch answers → Arrow record batches in the schema of Spark's Kafka source.

No per-record Python: ``core_log.recordscan.batch_columns`` (C, with a Python twin) walks the
batches once and returns the Arrow buffers (offsets, timestamps, key/value offsets + data +
validity, headers as list<struct>), and the arrays are assembled from those buffers without a
copy. Compressed batches are decompressed here first (one Python call per batch).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import pyarrow as pa  # type: ignore[import-untyped]
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    IntegerType,
    LongType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

if TYPE_CHECKING:
    from core_log.recordscan import BatchColumns

HEADERS_TYPE = ArrayType(
    StructType([StructField("key", StringType()), StructField("value", BinaryType())])
)


def kafka_schema(include_headers: bool) -> StructType:
    """The schema of Spark's Kafka source (all fields nullable, as there)."""
    fields = [
        StructField("key", BinaryType()),
        StructField("value", BinaryType()),
        StructField("topic", StringType()),
        StructField("partition", IntegerType()),
        StructField("offset", LongType()),
        StructField("timestamp", TimestampType()),
        StructField("timestampType", IntegerType()),
    ]
    if include_headers:
        fields.append(StructField("headers", HEADERS_TYPE))
    return StructType(fields)


_HEADER_STRUCT = pa.struct([pa.field("key", pa.string()), pa.field("value", pa.binary())])
_HEADERS_ARROW = pa.list_(pa.field("element", _HEADER_STRUCT))
_TIMESTAMP = pa.timestamp("us", tz="UTC")


def arrow_schema(include_headers: bool) -> pa.Schema:
    fields = [
        pa.field("key", pa.binary()),
        pa.field("value", pa.binary()),
        pa.field("topic", pa.string()),
        pa.field("partition", pa.int32()),
        pa.field("offset", pa.int64()),
        pa.field("timestamp", _TIMESTAMP),
        pa.field("timestampType", pa.int32()),
    ]
    if include_headers:
        fields.append(pa.field("headers", _HEADERS_ARROW))
    return pa.schema(fields)


def decode(data: bytes, start: int, end: int, include_headers: bool) -> BatchColumns:
    """Columns of the records in [start, end) of a binary fetch answer."""
    from core_log.recordscan import batch_columns  # executors only: the driver never decodes

    cols = batch_columns(data, start, end, include_headers)
    if cols is None:
        cols = batch_columns(decompressed(data), start, end, include_headers)
        assert cols is not None
    return cols


def decompressed(data: bytes) -> bytes:
    """The same batches with every compressed one rewritten uncompressed."""
    from core_log.batch import COMPRESSION_MASK, records_section, resign, scan_batches

    out: list[bytes] = []
    for pos, h in scan_batches(data):
        raw = data[pos : pos + h.size_bytes]
        if h.attributes & COMPRESSION_MASK:
            body = records_section(data, h, pos)
            raw = resign(h._replace(attributes=h.attributes & ~COMPRESSION_MASK), body)
        out.append(raw)
    return b"".join(out)


def _bytes_array(
    kind: pa.DataType, n: int, offsets: bytes, data: bytes, validity: bytes | None
) -> pa.Array:
    return pa.Array.from_buffers(
        kind,
        n,
        [
            None if validity is None else pa.py_buffer(validity),
            pa.py_buffer(offsets),
            pa.py_buffer(data),
        ],
    )


def record_batch(
    cols: BatchColumns, topic: str, partition: int, include_headers: bool
) -> pa.RecordBatch:
    """An Arrow batch in :func:`arrow_schema` order from :func:`decode`'s columns."""
    n = cols[0]
    arrays = [
        _bytes_array(pa.binary(), n, cols[5], cols[6], cols[7]),
        _bytes_array(pa.binary(), n, cols[8], cols[9], cols[10]),
        pa.repeat(pa.scalar(topic, pa.string()), n),
        pa.repeat(pa.scalar(partition, pa.int32()), n),
        pa.Array.from_buffers(pa.int64(), n, [None, pa.py_buffer(cols[2])]),
        pa.Array.from_buffers(_TIMESTAMP, n, [None, pa.py_buffer(cols[3])]),
        pa.Array.from_buffers(pa.int32(), n, [None, pa.py_buffer(cols[4])]),
    ]
    if include_headers:
        hoff, hkoff, hkdata, hvoff, hvdata, hvvalid = cols[11:17]
        assert hoff is not None and hkoff is not None and hkdata is not None
        assert hvoff is not None and hvdata is not None
        count = (len(hkoff) // 4) - 1
        keys = _bytes_array(pa.string(), count, hkoff, hkdata, None)
        values = _bytes_array(pa.binary(), count, hvoff, hvdata, hvvalid)
        structs = pa.StructArray.from_arrays([keys, values], fields=list(_HEADER_STRUCT))
        arrays.append(
            pa.Array.from_buffers(_HEADERS_ARROW, n, [None, pa.py_buffer(hoff)], children=[structs])
        )
    return pa.RecordBatch.from_arrays(arrays, schema=arrow_schema(include_headers))
