"""Tests for core_log.compression: Kafka's batch codecs, their wire formats and their limits.

kafka-python's codec module (kafka.codec) is used as an independent implementation: whatever
we compress it must decompress, and the other way round.
"""

from __future__ import annotations

import contextlib
import itertools
import random
import struct
import threading
import tracemalloc
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import cramjam
import pytest
import snappy
import zstandard
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kafka import codec as kafka_codec
from kafka.record.default_records import DefaultRecordBase

from core_log.compression import Compression, compress, decompress
from core_log.errors import (
    CorruptRecordError,
    ErrorCode,
    LogbusError,
    UnsupportedCompressionError,
)

# Deterministic (seeded from the test itself), no example database written into the repo, and
# no per-example deadline (the first call into a codec library can be slow to warm up).
FAST = settings(
    derandomize=True,
    database=None,
    deadline=None,
    max_examples=150,
    suppress_health_check=[HealthCheck.too_slow],
)

CODECS = list(Compression)
REAL_CODECS = [c for c in Compression if c is not Compression.NONE]

XERIAL_HEADER = b"\x82SNAPPY\x00" + struct.pack(">ii", 1, 1)
XERIAL_CHUNK = 32 * 1024

# kafka-python's own encoders/decoders for each codec.
KAFKA_ENCODE: dict[Compression, Callable[[bytes], bytes]] = {
    Compression.GZIP: kafka_codec.gzip_encode,
    Compression.SNAPPY: kafka_codec.snappy_encode,
    Compression.LZ4: kafka_codec.lz4_encode,
    Compression.ZSTD: kafka_codec.zstd_encode,
}
KAFKA_DECODE: dict[Compression, Callable[[bytes], bytes]] = {
    Compression.GZIP: kafka_codec.gzip_decode,
    Compression.SNAPPY: kafka_codec.snappy_decode,
    Compression.LZ4: kafka_codec.lz4_decode,
    Compression.ZSTD: kafka_codec.zstd_decode,
}


def text_payload(n_bytes: int, seed: int = 1) -> bytes:
    """Deterministic, moderately compressible bytes (JSON-ish words with random numbers)."""
    rnd = random.Random(seed)
    words = [b"order", b"user", b"amount", b"status", b"paid", b"eur", b"click", b"view"]
    out = bytearray()
    while len(out) < n_bytes:
        out += b'{"%s": %d, "%s": "%s"} ' % (
            rnd.choice(words),
            rnd.randrange(10**6),
            rnd.choice(words),
            rnd.choice(words),
        )
    return bytes(out[:n_bytes])


def random_payload(n_bytes: int, seed: int = 2) -> bytes:
    """Deterministic incompressible bytes."""
    return random.Random(seed).randbytes(n_bytes)


PAYLOADS = {
    "empty": b"",
    "one-byte": b"x",
    "small-text": text_payload(300),
    # > 64 KiB: several lz4 blocks; > 32 KiB: several xerial snappy chunks.
    "large-text": text_payload(150_000),
    "incompressible": random_payload(70_000),
    "zeros": bytes(100_000),
}


def xerial_chunk_ends(stream: bytes) -> list[int]:
    """Stream lengths at which a xerial snappy stream ends exactly after a whole chunk."""
    ends = [len(XERIAL_HEADER)]
    pos = len(XERIAL_HEADER)
    while pos < len(stream):
        (n,) = struct.unpack_from(">I", stream, pos)
        pos += 4 + n
        ends.append(pos)
    assert pos == len(stream)
    return ends


# ---------------------------------------------------------------------------------------------
# round trips and wire formats
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("codec", CODECS, ids=lambda c: c.name)
def test_round_trip_fixed_payloads(codec: Compression) -> None:
    for name, data in PAYLOADS.items():
        assert decompress(codec, compress(codec, data)) == data, name


@FAST
@given(codec=st.sampled_from(CODECS), data=st.binary(max_size=3000))
def test_round_trip_arbitrary_bytes(codec: Compression, data: bytes) -> None:
    assert decompress(codec, compress(codec, data)) == data


def test_codec_ids_match_kafka_attribute_bits() -> None:
    K = DefaultRecordBase
    assert Compression.NONE == K.CODEC_NONE == 0
    assert Compression.GZIP == K.CODEC_GZIP == 1
    assert Compression.SNAPPY == K.CODEC_SNAPPY == 2
    assert Compression.LZ4 == K.CODEC_LZ4 == 3
    assert Compression.ZSTD == K.CODEC_ZSTD == 4


def test_none_is_the_identity() -> None:
    data = text_payload(1000)
    assert compress(Compression.NONE, data) is data
    assert decompress(Compression.NONE, data) == data


def test_gzip_writes_an_rfc1952_stream() -> None:
    out = compress(Compression.GZIP, text_payload(1000))
    assert out[:3] == b"\x1f\x8b\x08"  # gzip magic + deflate


def test_gzip_also_accepts_a_zlib_stream() -> None:
    import zlib

    data = text_payload(5000)
    assert decompress(Compression.GZIP, zlib.compress(data)) == data


def test_snappy_writes_xerial_framing_in_32k_chunks() -> None:
    data = PAYLOADS["large-text"]
    out = compress(Compression.SNAPPY, data)
    assert out.startswith(XERIAL_HEADER)  # magic, version 1, compatible version 1
    ends = xerial_chunk_ends(out)
    chunks = [out[a + 4 : b] for a, b in itertools.pairwise(ends)]
    assert len(chunks) == -(-len(data) // XERIAL_CHUNK)
    sizes = [cramjam.snappy.decompress_raw_len(c) for c in chunks]
    assert all(s == XERIAL_CHUNK for s in sizes[:-1])
    assert sum(sizes) == len(data)


def test_snappy_decodes_both_xerial_and_raw_blocks() -> None:
    data = PAYLOADS["large-text"]
    raw = snappy.compress(data)  # python-snappy: a bare snappy block, no framing
    assert not raw.startswith(b"\x82SNAPPY")
    assert decompress(Compression.SNAPPY, raw) == data
    xerial = kafka_codec.snappy_encode(data, xerial_compatible=True)
    assert xerial.startswith(XERIAL_HEADER)
    assert decompress(Compression.SNAPPY, xerial) == data


def test_lz4_writes_a_frame_with_independent_64k_blocks() -> None:
    out = compress(Compression.LZ4, PAYLOADS["large-text"])
    assert out[:4] == b"\x04\x22\x4d\x18"  # LZ4 frame magic
    flg, bd = out[4], out[5]
    assert flg >> 6 == 0b01  # frame version 1
    assert flg & 0x20, "Kafka's Java LZ4 reader does not support dependent (linked) blocks"
    assert not flg & 0x04, "no content checksum"
    assert (bd >> 4) & 0x07 == 4  # block max size 64 KiB


def test_zstd_writes_a_zstd_frame() -> None:
    out = compress(Compression.ZSTD, text_payload(1000))
    assert out[:4] == b"\x28\xb5\x2f\xfd"


def test_zstd_frame_without_declared_content_size_decodes() -> None:
    # Streaming zstd encoders (e.g. zstd-jni's ZstdOutputStream in Kafka's Java producer) do not
    # write the content size into the frame header.
    data = text_payload(50_000)
    frame = zstandard.ZstdCompressor(write_content_size=False).compress(data)
    assert zstandard.frame_content_size(frame) == -1
    assert decompress(Compression.ZSTD, frame) == data


@pytest.mark.parametrize("codec", REAL_CODECS, ids=lambda c: c.name)
def test_interop_with_kafka_python_codecs(codec: Compression) -> None:
    for name, data in PAYLOADS.items():
        if not (codec is Compression.SNAPPY and name == "empty"):
            # kafka-python only recognises xerial framing in streams longer than the 16-byte
            # header, so it cannot read an empty xerial stream (not even its own).
            assert KAFKA_DECODE[codec](compress(codec, data)) == data, f"kafka reads ours: {name}"
        assert decompress(codec, KAFKA_ENCODE[codec](data)) == data, f"we read kafka's: {name}"


def test_compression_is_thread_safe() -> None:
    # zstd compressor objects are kept per thread; hammer all codecs from several threads.
    def work(seed: int) -> bool:
        for i in range(30):
            data = text_payload(2000 + 37 * i, seed=seed * 100 + i)
            for codec in CODECS:
                if decompress(codec, compress(codec, data)) != data:
                    return False
        return True

    barrier = threading.Barrier(8)

    def run(seed: int) -> bool:
        barrier.wait()
        return work(seed)

    with ThreadPoolExecutor(max_workers=8) as pool:
        assert all(pool.map(run, range(8)))


# ---------------------------------------------------------------------------------------------
# names
# ---------------------------------------------------------------------------------------------


def test_from_name() -> None:
    assert Compression.from_name("lz4") is Compression.LZ4
    assert Compression.from_name("LZ4") is Compression.LZ4
    assert Compression.from_name("none") is Compression.NONE
    assert Compression.from_name("gzip") is Compression.GZIP
    assert Compression.from_name("Snappy") is Compression.SNAPPY
    assert Compression.from_name("zstd") is Compression.ZSTD


@pytest.mark.parametrize("name", ["brotli", "", "lz4 ", "producer", "5"])
def test_from_name_rejects_unknown_names(name: str) -> None:
    with pytest.raises(UnsupportedCompressionError) as e:
        Compression.from_name(name)
    assert isinstance(e.value, LogbusError)
    assert e.value.code is ErrorCode.UNSUPPORTED_COMPRESSION_TYPE


# ---------------------------------------------------------------------------------------------
# limits: compression bombs
# ---------------------------------------------------------------------------------------------

BOMB_BYTES = 16 * 1024 * 1024
BOMB_LIMIT = 64 * 1024
# Far below the 16 MiB a bomb expands to, with room for a decoder's fixed working buffers.
BOMB_PEAK = 2 * 1024 * 1024


@pytest.fixture(scope="module")
def bombs() -> dict[Compression, bytes]:
    """16 MiB of zeros compressed with every codec (a few KiB each, except NONE)."""
    big = bytes(BOMB_BYTES)
    return {codec: compress(codec, big) for codec in CODECS}


@pytest.mark.parametrize("codec", CODECS, ids=lambda c: c.name)
def test_decompression_bomb_is_rejected_with_bounded_memory(
    codec: Compression, bombs: dict[Compression, bytes]
) -> None:
    bomb = bombs[codec]
    tracemalloc.start()
    try:
        with pytest.raises(CorruptRecordError):
            decompress(codec, bomb, max_bytes=BOMB_LIMIT)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    # Only allocations Python can see are traced (not cramjam's Rust heap), so this is a lower
    # bound on what a codec allocates; it still shows zlib/zstd/lz4 never build the 16 MiB.
    assert peak < BOMB_PEAK, f"peak {peak} bytes"


@pytest.mark.parametrize("codec", CODECS, ids=lambda c: c.name)
def test_small_stream_does_not_reserve_max_bytes(codec: Compression) -> None:
    """Memory for a small stream must scale with its output, not with ``max_bytes``.

    Reserving ``max_bytes`` (256 MiB by default) for every call is harmless only while the
    kernel overcommits: under RLIMIT_AS or vm.overcommit_memory=2 the allocation fails with
    MemoryError, which decompress() reports as CorruptRecordError for a valid batch.
    """
    data = text_payload(1100)
    streams = {"ours": compress(codec, data)}
    if codec is Compression.ZSTD:  # what streaming encoders (Kafka's Java producer) write
        streams["no content size"] = zstandard.ZstdCompressor(write_content_size=False).compress(
            data
        )
    for name, stream in streams.items():
        tracemalloc.start()
        try:
            assert decompress(codec, stream) == data
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
        # a fixed working buffer of a few MiB is fine; 256 MiB per call is not
        assert peak < 8 * 1024 * 1024, f"{name}: decompressing {len(data)} bytes allocated {peak}"


def test_zstd_bomb_without_declared_size_is_rejected_with_bounded_memory() -> None:
    frame = zstandard.ZstdCompressor(write_content_size=False).compress(bytes(BOMB_BYTES))
    tracemalloc.start()
    try:
        with pytest.raises(CorruptRecordError):
            decompress(Compression.ZSTD, frame, max_bytes=BOMB_LIMIT)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < BOMB_PEAK, f"peak {peak} bytes"


def test_raw_snappy_bomb_is_rejected() -> None:
    raw = bytes(cramjam.snappy.compress_raw(bytes(BOMB_BYTES)))
    with pytest.raises(CorruptRecordError):
        decompress(Compression.SNAPPY, raw, max_bytes=BOMB_LIMIT)


@pytest.mark.parametrize("codec", CODECS, ids=lambda c: c.name)
def test_limit_is_inclusive(codec: Compression) -> None:
    data = text_payload(100_000)
    comp = compress(codec, data)
    assert decompress(codec, comp, max_bytes=len(data)) == data
    with pytest.raises(CorruptRecordError):
        decompress(codec, comp, max_bytes=len(data) - 1)


# ---------------------------------------------------------------------------------------------
# damaged input
# ---------------------------------------------------------------------------------------------


def accepted_truncations(codec: Compression, comp: bytes, data: bytes) -> list[int]:
    """Lengths k < len(comp) at which comp[:k] decompresses instead of raising.

    Every other exception type fails the test at once. A xerial snappy stream cut exactly
    after a whole chunk is indistinguishable from a shorter stream (the framing carries no
    total length), so those cuts are allowed, provided they yield a prefix of the data.
    """
    inherent = set(xerial_chunk_ends(comp)) if codec is Compression.SNAPPY else set()
    accepted = []
    for k in range(len(comp)):
        try:
            out = decompress(codec, comp[:k])
        except CorruptRecordError:
            continue
        if k in inherent:
            assert data.startswith(out)
            continue
        accepted.append(k)
    return accepted


@pytest.mark.parametrize("codec", REAL_CODECS, ids=lambda c: c.name)
def test_truncated_stream_is_rejected(codec: Compression) -> None:
    small, large = text_payload(300), text_payload(40_000)
    streams = {
        "ours, small": (compress(codec, small), small),
        "ours, large": (compress(codec, large), large),
        "kafka-python, large": (KAFKA_ENCODE[codec](large), large),
    }
    for name, (comp, data) in streams.items():
        accepted = accepted_truncations(codec, comp, data)
        assert not accepted, f"{name} ({len(comp)} bytes): comp[:k] decoded for k in {accepted}"


@pytest.mark.parametrize("codec", [Compression.GZIP, Compression.ZSTD], ids=lambda c: c.name)
def test_data_after_the_first_gzip_member_or_zstd_frame_is_not_dropped(
    codec: Compression,
) -> None:
    """A gzip stream may hold several members and a zstd stream several frames.

    Kafka's Java consumer (GZIPInputStream, zstd-jni's ZstdInputStream) and kafka-python
    (kafka.codec.gzip_decode / zstd_decode) decode all of them, and reject trailing junk.
    Returning only the first member/frame silently drops data.
    """
    first, second = text_payload(5000, seed=3), text_payload(5000, seed=4)
    both = compress(codec, first) + compress(codec, second)
    assert KAFKA_DECODE[codec](both) == first + second  # the reference behaviour
    assert decompress(codec, both) == first + second
    with pytest.raises(CorruptRecordError):
        decompress(codec, compress(codec, first) + b"junk after the stream")


MAGICS = {
    Compression.GZIP: b"\x1f\x8b\x08\x00",
    Compression.SNAPPY: b"\x82SNAPPY\x00",
    Compression.LZ4: b"\x04\x22\x4d\x18",
    Compression.ZSTD: b"\x28\xb5\x2f\xfd",
}


@FAST
@given(
    codec=st.sampled_from(REAL_CODECS),
    with_magic=st.booleans(),
    garbage=st.binary(max_size=400),
)
def test_garbage_raises_only_corrupt_record_error(
    codec: Compression, with_magic: bool, garbage: bytes
) -> None:
    data = (MAGICS[codec] + garbage) if with_magic else garbage
    try:
        out = decompress(codec, data, max_bytes=1 << 20)
    except CorruptRecordError:
        return
    assert len(out) <= 1 << 20


@FAST
@given(
    codec=st.sampled_from(REAL_CODECS),
    data=st.binary(min_size=1, max_size=2000),
    pos=st.integers(min_value=0),
    mask=st.integers(1, 255),
)
def test_bit_flipped_stream_raises_only_corrupt_record_error(
    codec: Compression, data: bytes, pos: int, mask: int
) -> None:
    comp = bytearray(compress(codec, data))
    comp[pos % len(comp)] ^= mask
    with contextlib.suppress(CorruptRecordError):
        decompress(codec, bytes(comp))
