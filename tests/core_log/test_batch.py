"""Tests for core_log.batch: Kafka's record batch v2, byte for byte.

kafka-python (kafka.record) serves as an independent implementation of the same format: the
two codecs must read each other's batches and, uncompressed, write identical bytes.
"""

from __future__ import annotations

import contextlib
import struct
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import crc32c
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kafka.record import util as kafka_util
from kafka.record.default_records import DefaultRecordBatch, DefaultRecordBatchBuilder
from kafka.record.memory_records import MemoryRecords

from core_log.batch import (
    HEADER_BYTES,
    LOG_OVERHEAD,
    MAGIC,
    PREFIX_BYTES,
    Record,
    any_compressed,
    assemble_batch,
    build_batch,
    decode_records,
    decode_varint,
    encode_records,
    encode_varint,
    iter_records,
    parse_header,
    prefix_for,
    recompress,
    restamp,
    scan_batches,
    split_batches,
    validate_batch,
)
from core_log.compression import Compression, compress
from core_log.config import LogConfig
from core_log.errors import (
    CorruptRecordError,
    ErrorCode,
    InvalidRecordError,
    LogbusError,
    RecordTooLargeError,
)
from core_log.limits import (
    MAX_BATCH_BYTES,
    MAX_DECOMPRESSED_BATCH_RATIO,
    MAX_DECOMPRESSED_BYTES,
    MAX_PRODUCED_DECOMPRESSED_BYTES,
    MAX_RECORDS_PER_BATCH,
    MAX_TIMESTAMP_MS,
)

# Deterministic (seeded from the test itself), no example database written into the repo, and
# no per-example deadline (the first call into a codec library can be slow to warm up).
FAST = settings(
    derandomize=True,
    database=None,
    deadline=None,
    max_examples=120,
    suppress_health_check=[HealthCheck.too_slow],
)

CODECS = list(Compression)
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
NOW_MS = 1_700_000_000_000

# ---------------------------------------------------------------------------------------------
# strategies and helpers
# ---------------------------------------------------------------------------------------------

blobs = st.none() | st.binary(max_size=40)
headers = st.lists(
    st.tuples(st.text(max_size=10), st.none() | st.binary(max_size=20)), max_size=4
).map(tuple)
# Absolute timestamps are >= 0 (a negative one means "unset" to build_batch), but they need not
# be ordered: later records may be older than the first, giving negative timestamp deltas.
timestamps = st.integers(NOW_MS - 10_000, NOW_MS + 10_000) | st.integers(0, MAX_TIMESTAMP_MS)
records_st = st.builds(Record, value=blobs, key=blobs, headers=headers, timestamp=timestamps)
record_lists = st.lists(records_st, min_size=1, max_size=25)
producer_ids = st.integers(-1, INT64_MAX)
producer_epochs = st.integers(-1, 2**15 - 1)
sequences = st.integers(-1, 2**31 - 1)
leader_epochs = st.integers(-1, 2**31 - 1)
base_offsets = st.integers(0, 2**62)


def at_offsets(records: Sequence[Record], base_offset: int) -> list[Record]:
    """``records`` as a reader should return them from a batch based at ``base_offset``."""
    return [replace(r, offset=base_offset + i) for i, r in enumerate(records)]


def flipped(buf: bytes, pos: int, mask: int) -> bytes:
    out = bytearray(buf)
    out[pos] ^= mask
    return bytes(out)


def record_bytes(r: Record, offset_delta: int, base_timestamp: int) -> bytes:
    """One record encoded straight from the format description (independent of the codec)."""
    v = encode_varint

    def nullable(b: bytes | None) -> bytes:
        return b"\x01" if b is None else v(len(b)) + b

    body = b"\x00" + v(r.timestamp - base_timestamp) + v(offset_delta)
    body += nullable(r.key) + nullable(r.value) + v(len(r.headers))
    for k, hv in r.headers:
        body += v(len(k.encode())) + k.encode() + nullable(hv)
    return v(len(body)) + body


def sample_records(n: int = 3, ts: int = NOW_MS) -> list[Record]:
    """n small records with keys, values, a null value and headers (including a null one)."""
    out = []
    for i in range(n):
        out.append(
            Record(
                value=None if i == 1 else b"value-%d" % i,
                key=b"key-%d" % i,
                headers=(("trace", b"t%d" % i), ("empty", None)) if i != 2 else (),
                timestamp=ts + 7 * i - (20 if i == 2 else 0),
            )
        )
    return out


def compressible_records(n: int = 20) -> list[Record]:
    return [Record(b"the same value, again and again " * 4, b"k", (), NOW_MS + i) for i in range(n)]


def kafka_build(
    records: Sequence[Record],
    codec: Compression = Compression.NONE,
    *,
    producer_id: int = -1,
    producer_epoch: int = -1,
    base_sequence: int = -1,
    transactional: bool = False,
) -> bytes:
    """Build a batch with kafka-python's producer-side builder (offset deltas 0..n-1)."""
    builder = DefaultRecordBatchBuilder(
        magic=2,
        compression_type=int(codec),
        is_transactional=int(transactional),
        producer_id=producer_id,
        producer_epoch=producer_epoch,
        base_sequence=base_sequence,
        batch_size=1 << 20,
    )
    for i, r in enumerate(records):
        meta = builder.append(
            i, timestamp=r.timestamp, key=r.key, value=r.value, headers=list(r.headers)
        )
        assert meta is not None
    return bytes(builder.build())


def kafka_read_one(buf: bytes) -> tuple[DefaultRecordBatch, list[Record]]:
    """Read the first batch of ``buf`` with kafka-python, checking its CRC before iterating."""
    batch = MemoryRecords(buf).next_batch()
    assert isinstance(batch, DefaultRecordBatch)
    assert batch.validate_crc()  # must come before iteration (it asserts so)
    return batch, [as_record(r) for r in batch]


def as_record(r: Any) -> Record:
    """A kafka-python record as one of ours."""
    return Record(r.value, r.key, tuple(tuple(h) for h in r.headers), r.timestamp, r.offset)


def rejected(buf: bytes, **kw: bool) -> bool:
    """True if validate_batch raises CorruptRecordError; any other exception propagates."""
    try:
        validate_batch(buf, **kw)
    except CorruptRecordError:
        return True
    return False


def signed(
    body: bytes,
    *,
    attributes: int = 0,
    record_count: int,
    last_offset_delta: int,
    base_offset: int = 0,
    base_timestamp: int = NOW_MS,
) -> bytes:
    """A batch with a valid CRC around an arbitrary (possibly nonsensical) header and body."""
    return assemble_batch(
        body,
        base_offset=base_offset,
        partition_leader_epoch=0,
        attributes=attributes,
        last_offset_delta=last_offset_delta,
        base_timestamp=base_timestamp,
        max_timestamp=base_timestamp,
        producer_id=-1,
        producer_epoch=-1,
        base_sequence=-1,
        record_count=record_count,
    )


def with_header(batch: bytes, fmt: str, offset: int, value: int) -> bytes:
    """``batch`` with one header field overwritten (CRC not recomputed)."""
    out = bytearray(batch)
    struct.pack_into(fmt, out, offset, value)
    return bytes(out)


# ---------------------------------------------------------------------------------------------
# zig-zag varints
# ---------------------------------------------------------------------------------------------

VARINT_VECTORS = [
    (0, "00"),
    (-1, "01"),
    (1, "02"),
    (63, "7e"),
    (-64, "7f"),
    (64, "8001"),
    (300, "d804"),
    (INT64_MAX, "feffffffffffffffff01"),
    (INT64_MIN, "ffffffffffffffffff01"),
]


@pytest.mark.parametrize(("value", "hex_bytes"), VARINT_VECTORS)
def test_varint_known_vectors(value: int, hex_bytes: str) -> None:
    encoded = bytes.fromhex(hex_bytes)
    assert encode_varint(value) == encoded
    assert decode_varint(encoded, 0) == (value, len(encoded))


@FAST
@given(
    value=st.integers(INT64_MIN, INT64_MAX),
    prefix=st.binary(max_size=3),
    suffix=st.binary(max_size=3),
)
def test_varint_round_trip_full_int64_range(value: int, prefix: bytes, suffix: bytes) -> None:
    encoded = encode_varint(value)
    assert 1 <= len(encoded) <= 10
    assert decode_varint(prefix + encoded + suffix, len(prefix)) == (
        value,
        len(prefix) + len(encoded),
    )
    # also readable from a memoryview, as the batch reader passes one
    assert decode_varint(memoryview(encoded), 0) == (value, len(encoded))
    # and the same bytes kafka-python writes
    theirs = bytearray()
    kafka_util.encode_varint(value, theirs.append)
    assert bytes(theirs) == encoded


def test_truncated_varint_raises() -> None:
    for value in (64, 300, -65, 2**40, INT64_MIN, INT64_MAX):
        encoded = encode_varint(value)
        for k in range(len(encoded)):
            with pytest.raises(CorruptRecordError):
                decode_varint(encoded[:k], 0)


def test_varint_longer_than_ten_bytes_raises() -> None:
    with pytest.raises(CorruptRecordError):
        decode_varint(b"\x80" * 10 + b"\x00", 0)


@pytest.mark.parametrize("hex_bytes", ["ffffffffffffffffff7f", "80808080808080808002"])
def test_decoded_varint_fits_in_int64(hex_bytes: str) -> None:
    """A 10th byte above 0x01 carries bits 64+; the value must be rejected, not widened.

    Kafka reads timestampDelta as a Java long; decoding these as Python ints outside the
    signed 64-bit range yields timestamps/offsets no batch header can hold (build_batch and
    struct.pack then fail with non-Logbus errors far from the cause).
    """
    buf = bytes.fromhex(hex_bytes)
    try:
        value, _ = decode_varint(buf, 0)
    except CorruptRecordError:
        return
    assert INT64_MIN <= value <= INT64_MAX, f"decode_varint({hex_bytes}) returned {value}"


# ---------------------------------------------------------------------------------------------
# building and reading one batch
# ---------------------------------------------------------------------------------------------


@FAST
@given(
    records=record_lists,
    codec=st.sampled_from(CODECS),
    base_offset=base_offsets,
    producer_id=producer_ids,
    producer_epoch=producer_epochs,
    base_sequence=sequences,
    leader_epoch=leader_epochs,
    transactional=st.booleans(),
)
def test_round_trip(
    records: list[Record],
    codec: Compression,
    base_offset: int,
    producer_id: int,
    producer_epoch: int,
    base_sequence: int,
    leader_epoch: int,
    transactional: bool,
) -> None:
    batch = build_batch(
        records,
        base_offset=base_offset,
        compression=codec,
        producer_id=producer_id,
        producer_epoch=producer_epoch,
        base_sequence=base_sequence,
        partition_leader_epoch=leader_epoch,
        is_transactional=transactional,
    )
    h = validate_batch(batch, strict=not transactional)  # producers may not send them yet
    assert h == parse_header(batch)
    assert h.size_bytes == len(batch)
    assert h.batch_length == len(batch) - LOG_OVERHEAD
    assert h.magic == MAGIC
    assert h.base_offset == base_offset
    assert h.partition_leader_epoch == leader_epoch
    assert h.compression is codec
    assert h.is_transactional is transactional
    assert not h.is_control
    assert not h.log_append_time
    assert h.producer_id == producer_id
    assert h.producer_epoch == producer_epoch
    assert h.base_sequence == base_sequence
    assert h.record_count == len(records)
    assert h.last_offset_delta == len(records) - 1
    assert h.last_offset == base_offset + len(records) - 1
    assert h.next_offset == base_offset + len(records)
    assert h.base_timestamp == records[0].timestamp
    assert h.max_timestamp == max(r.timestamp for r in records)
    assert decode_records(batch) == at_offsets(records, base_offset)


@FAST
@given(records=record_lists)
def test_encode_records_matches_the_format_description(records: list[Record]) -> None:
    base = records[0].timestamp
    expected = b"".join(record_bytes(r, i, base) for i, r in enumerate(records))
    assert encode_records(records, base) == expected


def test_header_layout() -> None:
    batch = build_batch(
        sample_records(),
        base_offset=1000,
        partition_leader_epoch=7,
        producer_id=42,
        producer_epoch=3,
        base_sequence=17,
        is_transactional=True,
    )
    h = parse_header(batch)
    assert HEADER_BYTES == 61
    assert struct.unpack_from(">q", batch, 0)[0] == 1000
    assert struct.unpack_from(">i", batch, 8)[0] == len(batch) - 12
    assert struct.unpack_from(">i", batch, 12)[0] == 7
    assert batch[16] == 2
    assert struct.unpack_from(">h", batch, 21)[0] == 0x10  # transactional, CreateTime, NONE
    assert struct.unpack_from(">i", batch, 23)[0] == 2
    assert struct.unpack_from(">qq", batch, 27) == (NOW_MS, NOW_MS + 7)
    assert struct.unpack_from(">qhii", batch, 43) == (42, 3, 17, 3)
    assert struct.unpack_from(">I", batch, 17)[0] == crc32c.crc32c(batch[21:]) == h.crc


def test_negative_timestamp_deltas() -> None:
    records = [Record(b"a", timestamp=5000), Record(b"b", timestamp=10), Record(b"c", timestamp=0)]
    batch = build_batch(records)
    h = validate_batch(batch, strict=True)
    assert (h.base_timestamp, h.max_timestamp) == (5000, 5000)
    assert [r.timestamp for r in decode_records(batch)] == [5000, 10, 0]


def test_unset_timestamps_take_the_default() -> None:
    records = [Record(b"a"), Record(b"b", timestamp=NOW_MS + 5), Record(b"c")]
    batch = build_batch(records, default_timestamp=NOW_MS)
    assert [r.timestamp for r in decode_records(batch)] == [NOW_MS, NOW_MS + 5, NOW_MS]
    assert parse_header(batch).max_timestamp == NOW_MS + 5


@pytest.mark.parametrize("codec", CODECS, ids=lambda c: c.name)
def test_log_append_time_gives_every_record_the_max_timestamp(codec: Compression) -> None:
    batch = build_batch(sample_records(), compression=codec, log_append_time=True)
    h = validate_batch(batch, strict=True)
    assert h.log_append_time
    assert [r.timestamp for r in decode_records(batch)] == [h.max_timestamp] * 3


def test_empty_and_oversized_record_lists_are_refused() -> None:
    with pytest.raises(InvalidRecordError):
        build_batch([])
    too_many = [Record(b"")] * (MAX_RECORDS_PER_BATCH + 1)
    with pytest.raises(InvalidRecordError):
        build_batch(too_many)


def test_last_sequence_wraps_like_kafka() -> None:
    for base_sequence, n in [
        (-1, 3),
        (0, 1),
        (10, 5),
        (2**31 - 3, 3),
        (2**31 - 2, 5),
        (2**31 - 1, 2),
    ]:
        records = [Record(b"x", timestamp=NOW_MS)] * n
        batch = build_batch(records, producer_id=1, producer_epoch=0, base_sequence=base_sequence)
        ours = parse_header(batch).last_sequence
        theirs, _ = kafka_read_one(batch)
        assert ours == theirs.last_sequence, (base_sequence, n)
        assert 0 <= ours < 2**31 or ours == -1


def test_reads_batches_inside_larger_buffers() -> None:
    batch = build_batch(sample_records(), base_offset=5, compression=Compression.LZ4)
    buf = b"\xaa" * 13 + batch + b"\xbb" * 7
    for view in (buf, bytearray(buf), memoryview(buf)):
        h = validate_batch(view, 13, strict=True)
        assert h.base_offset == 5
        assert decode_records(view, 13) == at_offsets(sample_records(), 5)


# ---------------------------------------------------------------------------------------------
# cross-check with kafka-python
# ---------------------------------------------------------------------------------------------


@FAST
@given(
    records=record_lists,
    codec=st.sampled_from(CODECS),
    producer_id=producer_ids,
    producer_epoch=producer_epochs,
    base_sequence=sequences,
    transactional=st.booleans(),
)
def test_kafka_python_batches_decode_identically(
    records: list[Record],
    codec: Compression,
    producer_id: int,
    producer_epoch: int,
    base_sequence: int,
    transactional: bool,
) -> None:
    batch = kafka_build(
        records,
        codec,
        producer_id=producer_id,
        producer_epoch=producer_epoch,
        base_sequence=base_sequence,
        transactional=transactional,
    )
    h = validate_batch(batch, strict=not transactional)
    # kafka-python sends uncompressed when compressing does not shrink the records
    assert h.compression in (codec, Compression.NONE)
    assert (h.base_offset, h.partition_leader_epoch) == (0, 0)  # kafka-python writes 0 for both
    assert (h.producer_id, h.producer_epoch, h.base_sequence) == (
        producer_id,
        producer_epoch,
        base_sequence,
    )
    assert h.is_transactional is transactional
    assert h.record_count == len(records)
    assert h.last_offset_delta == len(records) - 1
    assert h.base_timestamp == records[0].timestamp
    assert h.max_timestamp == max(r.timestamp for r in records)
    assert decode_records(batch) == at_offsets(records, 0)


@pytest.mark.parametrize("codec", CODECS, ids=lambda c: c.name)
def test_kafka_python_compressed_batches_decode(codec: Compression) -> None:
    records = compressible_records()
    batch = kafka_build(records, codec, producer_id=9, producer_epoch=1, base_sequence=0)
    h = validate_batch(batch, strict=True)
    assert h.compression is codec  # the data compresses well, so kafka-python really used it
    assert decode_records(batch) == at_offsets(records, 0)


@FAST
@given(
    records=record_lists,
    codec=st.sampled_from(CODECS),
    base_offset=base_offsets,
    producer_id=producer_ids,
    producer_epoch=producer_epochs,
    base_sequence=sequences,
    leader_epoch=leader_epochs,
    transactional=st.booleans(),
)
def test_our_batches_read_by_kafka_python(
    records: list[Record],
    codec: Compression,
    base_offset: int,
    producer_id: int,
    producer_epoch: int,
    base_sequence: int,
    leader_epoch: int,
    transactional: bool,
) -> None:
    batch = build_batch(
        records,
        base_offset=base_offset,
        compression=codec,
        producer_id=producer_id,
        producer_epoch=producer_epoch,
        base_sequence=base_sequence,
        partition_leader_epoch=leader_epoch,
        is_transactional=transactional,
    )
    theirs, their_records = kafka_read_one(batch)
    assert their_records == at_offsets(records, base_offset)
    assert theirs.base_offset == base_offset
    assert theirs.leader_epoch == leader_epoch
    assert theirs.size_in_bytes == len(batch)
    assert theirs.compression_type == codec
    assert theirs.is_transactional is transactional
    assert not theirs.is_control_batch
    assert theirs.timestamp_type == 0
    assert (theirs.producer_id, theirs.producer_epoch, theirs.base_sequence) == (
        producer_id,
        producer_epoch,
        base_sequence,
    )
    assert theirs.records_count == len(records)
    assert theirs.last_offset_delta == len(records) - 1
    assert theirs.first_timestamp == records[0].timestamp
    assert theirs.max_timestamp == max(r.timestamp for r in records)


def test_kafka_python_reads_our_log_append_time_and_control_batches() -> None:
    batch = build_batch(sample_records(), log_append_time=True, base_offset=3)
    theirs, their_records = kafka_read_one(batch)
    assert theirs.timestamp_type == 1
    assert [r.timestamp for r in their_records] == [theirs.max_timestamp] * 3

    commit_marker = Record(value=struct.pack(">hi", 0, 4), key=struct.pack(">hh", 0, 1))
    control = build_batch(
        [commit_marker],
        is_control=True,
        is_transactional=True,
        producer_id=5,
        producer_epoch=2,
        default_timestamp=NOW_MS,
    )
    theirs = MemoryRecords(control).next_batch()
    assert theirs.validate_crc()
    assert theirs.is_control_batch and theirs.is_transactional
    (marker,) = list(theirs)
    assert marker.commit


@FAST
@given(
    records=record_lists,
    producer_id=producer_ids,
    producer_epoch=producer_epochs,
    base_sequence=sequences,
    transactional=st.booleans(),
)
def test_uncompressed_bytes_identical_to_kafka_python(
    records: list[Record],
    producer_id: int,
    producer_epoch: int,
    base_sequence: int,
    transactional: bool,
) -> None:
    fields = {
        "producer_id": producer_id,
        "producer_epoch": producer_epoch,
        "base_sequence": base_sequence,
    }
    theirs = kafka_build(records, transactional=transactional, **fields)
    # kafka-python writes partitionLeaderEpoch 0 (see the next test).
    ours = build_batch(records, partition_leader_epoch=0, is_transactional=transactional, **fields)
    assert ours == theirs


def test_only_the_default_partition_leader_epoch_differs_from_kafka_python() -> None:
    """Our default partitionLeaderEpoch is -1 (Java's RecordBatch.NO_PARTITION_LEADER_EPOCH);
    kafka-python writes 0. The field is outside the CRC and the leader overwrites it on
    append, so the difference is harmless; every other byte is the same."""
    records = sample_records()
    ours = build_batch(records)
    theirs = kafka_build(records)
    assert ours[12:16] == struct.pack(">i", -1)
    assert theirs[12:16] == struct.pack(">i", 0)
    assert ours[:12] + ours[16:] == theirs[:12] + theirs[16:]


def test_kafka_python_reads_a_log_of_our_batches_and_we_read_theirs() -> None:
    batches = [
        build_batch(sample_records(), base_offset=0, compression=Compression.ZSTD),
        build_batch(compressible_records(5), base_offset=3, compression=Compression.SNAPPY),
        build_batch(
            sample_records(2), base_offset=8, producer_id=1, producer_epoch=0, base_sequence=0
        ),
    ]
    reader = MemoryRecords(b"".join(batches))
    seen = []
    while (batch := reader.next_batch()) is not None:
        assert batch.validate_crc()
        seen.extend(as_record(r) for r in batch)
    assert seen == list(iter_records(b"".join(batches)))
    assert [r.offset for r in seen] == list(range(10))

    # theirs, placed in a log by patching base offsets as a leader does
    log = b""
    next_offset = 0
    for records, codec in [
        (sample_records(), Compression.GZIP),
        (compressible_records(4), Compression.LZ4),
    ]:
        batch = kafka_build(records, codec)
        log += prefix_for(next_offset, len(batch) - LOG_OVERHEAD, 9) + batch[PREFIX_BYTES:]
        next_offset += len(records)
    headers = split_batches(log, strict=True)
    assert [(h.base_offset, h.partition_leader_epoch) for h in headers] == [(0, 9), (3, 9)]
    assert [r.offset for r in iter_records(log)] == list(range(7))


# ---------------------------------------------------------------------------------------------
# offset assignment by patching the prefix
# ---------------------------------------------------------------------------------------------


def test_prefix_for_layout() -> None:
    assert PREFIX_BYTES == 16
    assert prefix_for(2**40 + 5, 1234, -1) == struct.pack(">qii", 2**40 + 5, 1234, -1)


@FAST
@given(
    records=record_lists,
    codec=st.sampled_from(CODECS),
    new_base=base_offsets,
    epoch=leader_epochs,
)
def test_patched_prefix_keeps_the_batch_valid(
    records: list[Record], codec: Compression, new_base: int, epoch: int
) -> None:
    batch = build_batch(
        records, compression=codec, producer_id=4, producer_epoch=0, base_sequence=0
    )
    h = validate_batch(batch, strict=True)
    patched = prefix_for(new_base, h.batch_length, epoch) + batch[PREFIX_BYTES:]
    assert patched[PREFIX_BYTES:] == batch[PREFIX_BYTES:]
    h2 = validate_batch(patched, strict=True)
    assert h2 == h._replace(base_offset=new_base, partition_leader_epoch=epoch)
    assert decode_records(patched) == at_offsets(records, new_base)
    theirs, _ = kafka_read_one(patched)
    assert (theirs.base_offset, theirs.leader_epoch) == (new_base, epoch)


# ---------------------------------------------------------------------------------------------
# corruption
# ---------------------------------------------------------------------------------------------

# Bytes the CRC does not cover, by Kafka's design: the leader rewrites them on every append.
BASE_OFFSET_BYTES = range(0, 8)
LEADER_EPOCH_BYTES = range(12, 16)
LENGTH_BYTES = range(8, 12)
MAGIC_BYTE = 16


def test_corruption_errors_are_logbus_errors() -> None:
    assert issubclass(CorruptRecordError, LogbusError)
    assert issubclass(InvalidRecordError, LogbusError)
    assert CorruptRecordError("x").code is ErrorCode.CORRUPT_MESSAGE
    assert InvalidRecordError("x").code is ErrorCode.INVALID_RECORD


@pytest.mark.parametrize("codec", [Compression.NONE, Compression.GZIP], ids=lambda c: c.name)
def test_every_checked_single_byte_flip_is_rejected(codec: Compression) -> None:
    batch = build_batch(sample_records(), compression=codec, producer_id=3, producer_epoch=1)
    assert 100 <= len(batch) <= 200
    checked = [*LENGTH_BYTES, MAGIC_BYTE, *range(17, len(batch))]  # length, magic, CRC + data
    missed = [
        (pos, mask)
        for pos in checked
        for mask in (0xFF, 0x01)
        if not rejected(flipped(batch, pos, mask))
    ]
    assert missed == []


def test_flips_outside_the_crc_pass_by_design() -> None:
    """baseOffset (bytes 0-7) and partitionLeaderEpoch (12-15) are outside the CRC.

    Kafka leaves them out on purpose: the leader rewrites both on every append (prefix_for),
    and a CRC over them would have to be recomputed each time. A flip there therefore yields a
    valid batch that merely claims another base offset or epoch; the records, producer state
    and everything under the CRC are intact. Catching a wrong base offset is the log's job
    (it knows the expected next offset and has the offset index), not the codec's.
    """
    batch = build_batch(sample_records(), base_offset=1000, partition_leader_epoch=5)
    h = validate_batch(batch, strict=True)
    for pos in [*BASE_OFFSET_BYTES, *LEADER_EPOCH_BYTES]:
        for mask in (0xFF, 0x01):
            damaged = flipped(batch, pos, mask)
            h2 = validate_batch(damaged, strict=True)
            base, epoch = (
                struct.unpack_from(">q", damaged, 0)[0],
                struct.unpack_from(">i", damaged, 12)[0],
            )
            assert (base, epoch) != (1000, 5)
            assert h2 == h._replace(base_offset=base, partition_leader_epoch=epoch)
            assert decode_records(damaged) == at_offsets(sample_records(), base)


@pytest.mark.parametrize("codec", CODECS, ids=lambda c: c.name)
def test_every_truncation_is_rejected(codec: Compression) -> None:
    batch = build_batch(sample_records(), compression=codec)
    for k in range(len(batch)):
        cut = batch[:k]
        with pytest.raises(CorruptRecordError):
            validate_batch(cut)
        if k:
            with pytest.raises(CorruptRecordError):
                split_batches(cut)
        with pytest.raises(LogbusError):
            decode_records(cut)
        assert list(scan_batches(cut)) == []
        assert list(iter_records(cut)) == []


def _only_logbus_errors(buf: bytes) -> None:
    for read in (
        validate_batch,
        lambda b: validate_batch(b, strict=True),
        split_batches,
        decode_records,
        lambda b: list(iter_records(b)),
    ):
        with contextlib.suppress(LogbusError):
            read(buf)


@FAST
@given(st.binary(max_size=300))
def test_garbage_raises_only_logbus_errors(garbage: bytes) -> None:
    _only_logbus_errors(garbage)


@FAST
@given(
    garbage=st.binary(min_size=HEADER_BYTES, max_size=300),
    batch_length=st.none() | st.integers(-5, 400),
)
def test_garbage_with_a_plausible_magic_and_length_raises_only_logbus_errors(
    garbage: bytes, batch_length: int | None
) -> None:
    buf = bytearray(garbage)
    buf[MAGIC_BYTE] = MAGIC
    struct.pack_into(
        ">i", buf, 8, len(buf) - LOG_OVERHEAD if batch_length is None else batch_length
    )
    _only_logbus_errors(bytes(buf))


@FAST
@given(
    body=st.binary(max_size=200),
    codec=st.sampled_from(CODECS),
    record_count=st.integers(-2, 12),
    extra_delta=st.integers(-2, 3),
)
def test_signed_garbage_records_raise_only_logbus_errors(
    body: bytes, codec: Compression, record_count: int, extra_delta: int
) -> None:
    """A valid CRC around garbage records (what a buggy producer sends) must not crash us."""
    batch = signed(
        compress(codec, body),
        attributes=int(codec),
        record_count=record_count,
        last_offset_delta=record_count - 1 + extra_delta,
    )
    _only_logbus_errors(batch)


@FAST
@given(records=record_lists, codec=st.sampled_from(CODECS), data=st.data())
def test_damaged_records_raise_only_logbus_errors(
    records: list[Record], codec: Compression, data: st.DataObject
) -> None:
    """Bit flips inside real records, re-signed so only the record decoder can notice."""
    body = bytearray(encode_records(records, records[0].timestamp))
    for _ in range(data.draw(st.integers(1, 3))):
        body[data.draw(st.integers(0, len(body) - 1))] ^= data.draw(st.integers(1, 255))
    batch = signed(
        compress(codec, bytes(body)),
        attributes=int(codec),
        record_count=len(records),
        last_offset_delta=len(records) - 1,
        base_timestamp=records[0].timestamp,
    )
    validate_batch(batch)  # header and CRC are fine: only the record decoder can object
    with contextlib.suppress(LogbusError):
        validate_batch(batch, strict=True)
    try:
        decoded = decode_records(batch)
    except LogbusError:
        return
    assert len(decoded) == len(records)


@pytest.mark.parametrize("codec_bits", [5, 6, 7])
def test_unknown_codec_bits_are_corrupt_everywhere(codec_bits: int) -> None:
    """Attribute bits 0-2 = 5..7 name no codec. validate_batch says so; the readers that skip
    validation (decode_records, iter_records, recompress) must not leak a ValueError from
    ``Compression(5)`` in BatchHeader.compression."""
    body = encode_records(sample_records(), NOW_MS)
    batch = signed(body, attributes=codec_bits, record_count=3, last_offset_delta=2)
    with pytest.raises(CorruptRecordError):
        validate_batch(batch)
    with pytest.raises(CorruptRecordError):
        decode_records(batch)
    with pytest.raises(CorruptRecordError):
        list(iter_records(batch))
    with pytest.raises(CorruptRecordError):
        recompress(batch, Compression.GZIP)


def test_header_sanity_checks() -> None:
    batch = build_batch(sample_records())
    for magic in (0, 1, 3, -1):
        assert rejected(with_header(batch, ">b", MAGIC_BYTE, magic))
    for length in (-1, 0, HEADER_BYTES - LOG_OVERHEAD - 1, MAX_BATCH_BYTES, 2**31 - 1):
        assert rejected(with_header(batch, ">i", 8, length))
    body = encode_records(sample_records(), NOW_MS)
    # signed, so that only the header checks can object
    assert rejected(signed(body, record_count=-1, last_offset_delta=2))
    assert rejected(
        signed(body, record_count=MAX_RECORDS_PER_BATCH + 1, last_offset_delta=2**31 - 1)
    )
    assert rejected(signed(body, record_count=3, last_offset_delta=-1))


def test_record_count_disagreeing_with_the_records_is_caught_when_decoding() -> None:
    # Non-strict validation (data the log already accepted) checks header and CRC only;
    # decoding notices the mismatch.
    body = encode_records(sample_records(), NOW_MS)
    for count in (1, 2, 4):
        batch = signed(body, record_count=count, last_offset_delta=max(count - 1, 0))
        validate_batch(batch)
        with pytest.raises(CorruptRecordError):
            decode_records(batch)


# ---------------------------------------------------------------------------------------------
# strict (producer) validation
# ---------------------------------------------------------------------------------------------


def test_strict_rejects_control_batches() -> None:
    batch = build_batch(
        [Record(struct.pack(">hi", 0, 0), struct.pack(">hh", 0, 0))],
        is_control=True,
        is_transactional=True,
        producer_id=1,
        producer_epoch=0,
    )
    with pytest.raises(InvalidRecordError):
        validate_batch(batch, strict=True)
    assert validate_batch(batch).is_control  # fine in the log (transaction markers)


def test_strict_rejects_transactional_batches() -> None:
    """Transactions do not exist yet: a transactional batch would be visible at once."""
    batch = build_batch(
        sample_records(), is_transactional=True, producer_id=1, producer_epoch=0, base_sequence=0
    )
    with pytest.raises(InvalidRecordError, match="transactions are not supported yet"):
        validate_batch(batch, strict=True)
    assert validate_batch(batch).is_transactional  # a reader of the log still reads one


@pytest.mark.parametrize("codec", [c for c in CODECS if c is not Compression.NONE], ids=str)
def test_strict_caps_the_decompressed_records_of_a_compressed_batch(codec: Compression) -> None:
    records = [Record(b"x" * 100_000, b"k")]
    section = len(encode_records(records, records[0].timestamp))
    batch = build_batch(records, compression=codec)
    assert len(batch) < section // 10
    assert validate_batch(batch, strict=True, max_decompressed_bytes=section).record_count == 1
    with pytest.raises(RecordTooLargeError, match="decompresses to more than") as e:
        split_batches(batch, strict=True, max_decompressed_bytes=section - 1)
    assert e.value.code is ErrorCode.MESSAGE_TOO_LARGE
    assert validate_batch(batch, max_decompressed_bytes=section - 1)  # not strict: not walked


def test_a_topic_caps_decompressed_batches_at_a_multiple_of_max_message_bytes() -> None:
    assert LogConfig().max_decompressed_bytes == MAX_DECOMPRESSED_BATCH_RATIO * 1_048_588
    huge = LogConfig(max_message_bytes=MAX_BATCH_BYTES)
    assert huge.max_decompressed_bytes == MAX_PRODUCED_DECOMPRESSED_BYTES
    assert MAX_PRODUCED_DECOMPRESSED_BYTES <= MAX_DECOMPRESSED_BYTES  # what produce takes reads


def test_any_compressed_looks_at_every_batch_header() -> None:
    plain = build_batch(sample_records())
    packed = build_batch(sample_records(), compression=Compression.LZ4)
    assert not any_compressed(plain + plain)
    assert any_compressed(plain + packed)


def test_strict_rejects_a_raised_last_offset_delta_which_compaction_may_leave() -> None:
    records = sample_records()
    batch = build_batch(records, base_offset=100, last_offset_delta=9)
    with pytest.raises(InvalidRecordError):
        validate_batch(batch, strict=True)
    h = validate_batch(batch)  # a compacted batch keeps its offset range
    assert (h.record_count, h.last_offset_delta, h.next_offset) == (3, 9, 110)
    assert decode_records(batch) == at_offsets(records, 100)
    # what compaction leaves: records 0 and 2 at their original offsets 100 and 109
    kept = [replace(records[0], offset=100), replace(records[2], offset=109)]
    base_ts = records[0].timestamp
    compacted = assemble_batch(
        record_bytes(kept[0], 0, base_ts) + record_bytes(kept[1], 9, base_ts),
        base_offset=100,
        partition_leader_epoch=0,
        attributes=0,
        last_offset_delta=9,
        base_timestamp=base_ts,
        max_timestamp=h.max_timestamp,
        producer_id=-1,
        producer_epoch=-1,
        base_sequence=-1,
        record_count=2,
    )
    assert validate_batch(compacted).next_offset == 110
    with pytest.raises(InvalidRecordError):
        validate_batch(compacted, strict=True)
    assert decode_records(compacted) == kept


def test_strict_validation_checks_the_records_against_the_header() -> None:
    """Records that contradict a well-formed, correctly signed header must not pass strict
    (producer) validation.

    PartitionLog.append validates produced data with split_batches(strict=True) only and stores
    it without decoding a record. Kafka's broker (LogValidator) iterates every record of a
    produced batch and rejects each case below; accepted here, such a batch poisons the
    partition: decode_records, Segment.offset_for_timestamp and consumers fail on it, or see
    offsets that overlap the next batch.
    """
    records = sample_records()
    three = encode_records(records, NOW_MS)

    def deltas(*ds: int) -> bytes:
        return b"".join(record_bytes(r, d, NOW_MS) for r, d in zip(records, ds, strict=True))

    cases = {
        "4 records declared, 3 present": signed(three, record_count=4, last_offset_delta=3),
        "2 records declared, 3 present": signed(three, record_count=2, last_offset_delta=1),
        "offset deltas 0, 0, 0": signed(deltas(0, 0, 0), record_count=3, last_offset_delta=2),
        "offset deltas 0, 1, 7": signed(deltas(0, 1, 7), record_count=3, last_offset_delta=2),
        "records are garbage": signed(b"\xff" * 40, record_count=3, last_offset_delta=2),
        "compressed garbage": signed(
            compress(Compression.GZIP, b"\xff" * 40),
            attributes=int(Compression.GZIP),
            record_count=3,
            last_offset_delta=2,
        ),
    }
    accepted = []
    for name, batch in cases.items():
        try:
            validate_batch(batch, strict=True)
        except LogbusError:
            continue
        accepted.append(name)
    assert not accepted, f"strict validation accepted: {accepted}"


def test_last_offset_delta_below_the_record_count_is_corrupt() -> None:
    batch = build_batch(sample_records(), last_offset_delta=1)
    for strict in (False, True):
        with pytest.raises(CorruptRecordError):
            validate_batch(batch, strict=strict)


def test_empty_batch_left_by_compaction() -> None:
    """Compaction may drop every record yet keep the batch for its producer state."""
    batch = signed(b"", record_count=0, last_offset_delta=4, base_offset=50)
    h = validate_batch(batch)
    assert (h.record_count, h.next_offset) == (0, 55)
    assert decode_records(batch) == []
    with pytest.raises(InvalidRecordError):
        validate_batch(batch, strict=True)


# ---------------------------------------------------------------------------------------------
# several batches: split, scan, iterate, recompress
# ---------------------------------------------------------------------------------------------

LOG_PLAN = [  # (records, codec) appended in order to one log
    (sample_records(3), Compression.NONE),
    (compressible_records(4), Compression.ZSTD),
    (sample_records(2, ts=NOW_MS + 100), Compression.GZIP),
    (compressible_records(3), Compression.SNAPPY),
]


@pytest.fixture
def log() -> tuple[bytes, list[int], list[Record]]:
    """Batches appended back to back as a leader does; returns (buffer, positions, records)."""
    buf = b""
    positions = []
    expected: list[Record] = []
    for records, codec in LOG_PLAN:
        batch = build_batch(records, compression=codec)
        positions.append(len(buf))
        buf += prefix_for(len(expected), len(batch) - LOG_OVERHEAD, 2) + batch[PREFIX_BYTES:]
        expected += at_offsets(records, len(expected))
    return buf, positions, expected


def test_split_batches(log: tuple[bytes, list[int], list[Record]]) -> None:
    buf, positions, _ = log
    headers = split_batches(buf, strict=True)
    assert [h.base_offset for h in headers] == [0, 3, 7, 9]
    assert [h.compression for h in headers] == [codec for _, codec in LOG_PLAN]
    assert [h.size_bytes for h in headers] == [
        b - a for a, b in zip(positions, [*positions[1:], len(buf)], strict=True)
    ]
    assert split_batches(b"") == []


def test_split_batches_rejects_a_partial_or_damaged_tail(
    log: tuple[bytes, list[int], list[Record]],
) -> None:
    buf, positions, _ = log
    for end in range(positions[-1] + 1, len(buf)):
        with pytest.raises(CorruptRecordError):
            split_batches(buf[:end])
    with pytest.raises(CorruptRecordError):
        split_batches(flipped(buf, positions[2] + 40, 0x01))


def test_scan_batches_stops_at_a_partial_tail(log: tuple[bytes, list[int], list[Record]]) -> None:
    buf, positions, _ = log
    assert [pos for pos, _ in scan_batches(buf)] == positions
    assert [h for _, h in scan_batches(buf)] == split_batches(buf)
    for end in range(positions[-1], len(buf)):
        assert [pos for pos, _ in scan_batches(buf[:end])] == positions[:-1]
    # a nonsensical length ends the scan too
    bad = with_header(buf, ">i", positions[1] + 8, 3)
    assert [pos for pos, _ in scan_batches(bad)] == positions[:1]


def test_iter_records(log: tuple[bytes, list[int], list[Record]]) -> None:
    buf, _, expected = log
    assert list(iter_records(buf)) == expected
    assert list(iter_records(buf[: len(buf) - 1])) == expected[:-3]
    assert list(iter_records(memoryview(buf))) == expected


def test_recompress_to_every_codec() -> None:
    records = sample_records() + compressible_records(5)
    for source in CODECS:
        batch = build_batch(
            records,
            base_offset=77,
            compression=source,
            partition_leader_epoch=4,
            producer_id=8,
            producer_epoch=2,
            base_sequence=40,
            is_transactional=True,
            log_append_time=True,
            last_offset_delta=20,
        )
        h = validate_batch(batch)
        for target in CODECS:
            out = recompress(batch, target)
            h2 = validate_batch(out)
            assert h2.compression is target
            assert h2 == h._replace(
                attributes=(h.attributes & ~0x07) | int(target),
                crc=h2.crc,
                batch_length=len(out) - LOG_OVERHEAD,
            ), (source, target)
            assert decode_records(out) == decode_records(batch)
            if target is source:
                assert out == batch


@pytest.mark.parametrize("codec", CODECS, ids=lambda c: c.name)
def test_restamp_marks_the_batch_log_append_time(codec: Compression) -> None:
    batch = build_batch(
        sample_records(),
        base_offset=9,
        compression=codec,
        partition_leader_epoch=3,
        producer_id=2,
        producer_epoch=1,
        base_sequence=5,
        is_transactional=True,
    )
    h = validate_batch(batch)
    append_time = NOW_MS + 999
    out = restamp(batch, append_time)
    h2 = validate_batch(out)
    assert h2 == h._replace(attributes=h.attributes | 0x08, max_timestamp=append_time, crc=h2.crc)
    assert h2.log_append_time and h2.compression is codec
    assert out[HEADER_BYTES:] == batch[HEADER_BYTES:]  # the records are not touched
    assert [r.timestamp for r in decode_records(out)] == [append_time] * 3
    theirs, their_records = kafka_read_one(out)
    assert theirs.timestamp_type == 1
    assert [r.timestamp for r in their_records] == [append_time] * 3


def test_restamp_the_batch_at_a_position(log: tuple[bytes, list[int], list[Record]]) -> None:
    buf, positions, expected = log
    out = restamp(buf, NOW_MS, positions[2])
    assert validate_batch(out, strict=True).base_offset == 7
    assert decode_records(out) == [replace(r, timestamp=NOW_MS) for r in expected[7:9]]


def test_recompress_the_batch_at_a_position(log: tuple[bytes, list[int], list[Record]]) -> None:
    buf, positions, expected = log
    out = recompress(buf, Compression.LZ4, positions[1])
    h = validate_batch(out, strict=True)
    assert h.compression is Compression.LZ4
    assert h.base_offset == 3
    assert decode_records(out) == expected[3:7]
