"""Kafka's compression codecs (attribute bits 0-2 of a v2 batch).

Wire formats, as Kafka's Java client writes them so batches interoperate:
  gzip    RFC 1952 gzip stream
  snappy  xerial framing (``\\x82SNAPPY\\x00`` header, then 4-byte length + raw block chunks);
          raw snappy blocks are accepted on input as well
  lz4     LZ4 frame format, independent 64 KiB blocks
  zstd    zstd frame

Decompression is always bounded by ``max_bytes`` so a compression bomb cannot exhaust memory.
Compressor objects are kept per thread: zstd compressors must never be shared across threads.
"""

from __future__ import annotations

import enum
import struct
import threading
import zlib

import cramjam
import lz4.frame
import zstandard

from .errors import CorruptRecordError, DecompressedTooLargeError, UnsupportedCompressionError
from .limits import MAX_DECOMPRESSED_BYTES


class Compression(enum.IntEnum):
    NONE = 0
    GZIP = 1
    SNAPPY = 2
    LZ4 = 3
    ZSTD = 4

    @classmethod
    def from_name(cls, name: str) -> Compression:
        try:
            return cls[name.upper()]
        except KeyError:
            raise UnsupportedCompressionError(f"unknown compression type {name!r}") from None


_XERIAL_MAGIC = b"\x82SNAPPY\x00"
_XERIAL_HEADER = _XERIAL_MAGIC + struct.pack(">ii", 1, 1)
_XERIAL_CHUNK_BYTES = 32 * 1024
_U32 = struct.Struct(">I")

_local = threading.local()


def _zstd_compressor() -> zstandard.ZstdCompressor:
    c: zstandard.ZstdCompressor | None = getattr(_local, "zstd_c", None)
    if c is None:
        c = _local.zstd_c = zstandard.ZstdCompressor(level=3)
    return c


def _zstd_decompressor() -> zstandard.ZstdDecompressor:
    d: zstandard.ZstdDecompressor | None = getattr(_local, "zstd_d", None)
    if d is None:
        d = _local.zstd_d = zstandard.ZstdDecompressor()
    return d


def compress(codec: Compression, data: bytes) -> bytes:
    """Compress ``data`` in the wire format Kafka uses for ``codec``."""
    if codec is Compression.NONE:
        return data
    if codec is Compression.GZIP:
        c = zlib.compressobj(6, zlib.DEFLATED, 31)
        return c.compress(data) + c.flush()
    if codec is Compression.SNAPPY:
        parts = [_XERIAL_HEADER]
        for i in range(0, len(data), _XERIAL_CHUNK_BYTES):
            block = bytes(cramjam.snappy.compress_raw(data[i : i + _XERIAL_CHUNK_BYTES]))
            parts.append(_U32.pack(len(block)))
            parts.append(block)
        return b"".join(parts)
    if codec is Compression.LZ4:
        return bytes(
            lz4.frame.compress(
                data,
                block_size=lz4.frame.BLOCKSIZE_MAX64KB,
                block_linked=False,
                content_checksum=False,
            )
        )
    if codec is Compression.ZSTD:
        return bytes(_zstd_compressor().compress(data))
    raise UnsupportedCompressionError(f"unsupported codec {codec}")


def decompress(codec: Compression, data: bytes, max_bytes: int = MAX_DECOMPRESSED_BYTES) -> bytes:
    """Decompress ``data``; raise :class:`CorruptRecordError` if it is invalid, its subclass
    :class:`DecompressedTooLargeError` if it expands past ``max_bytes``."""
    try:
        out = _decompress(codec, data, max_bytes)
    except CorruptRecordError:
        raise
    except Exception as e:  # every codec library has its own exception types
        raise CorruptRecordError(f"cannot decompress {codec.name} data: {e}") from e
    if len(out) > max_bytes:
        raise DecompressedTooLargeError(f"decompressed batch exceeds {max_bytes} bytes")
    return out


# Output produced per step of a streaming decompressor: bounds what one step can allocate.
_STEP_BYTES = 1024 * 1024


def _decompress(codec: Compression, data: bytes, max_bytes: int) -> bytes:
    if codec is Compression.NONE:
        return data
    if not data:
        raise CorruptRecordError(f"empty {codec.name} data")
    if codec is Compression.GZIP:
        return _gzip_decode(data, max_bytes)
    if codec is Compression.SNAPPY:
        if data.startswith(_XERIAL_MAGIC[:4]):
            return _xerial_decode(data, max_bytes)
        if cramjam.snappy.decompress_raw_len(data) > max_bytes:
            raise DecompressedTooLargeError(f"decompressed batch exceeds {max_bytes} bytes")
        return bytes(cramjam.snappy.decompress_raw(data))
    if codec is Compression.LZ4:
        return _lz4_decode(data, max_bytes)
    if codec is Compression.ZSTD:
        return _zstd_decode(data, max_bytes)
    raise UnsupportedCompressionError(f"unsupported codec {int(codec)}")


def _check_total(total: int, max_bytes: int) -> None:
    if total > max_bytes:
        raise DecompressedTooLargeError(f"decompressed batch exceeds {max_bytes} bytes")


def _gzip_decode(data: bytes, max_bytes: int) -> bytes:
    """Every gzip member in ``data`` (Kafka's readers accept concatenated members)."""
    parts: list[bytes] = []
    total = 0
    rest = data
    while rest:
        d = zlib.decompressobj(47)  # gzip or zlib header
        chunk = d.decompress(rest, max_bytes - total + 1)
        total += len(chunk)
        _check_total(total, max_bytes)
        parts.append(chunk)
        if not d.eof:
            raise CorruptRecordError("truncated gzip stream")
        rest = d.unused_data
    return b"".join(parts)


def _lz4_decode(data: bytes, max_bytes: int) -> bytes:
    step = min(_STEP_BYTES, max_bytes + 1)
    d = lz4.frame.LZ4FrameDecompressor()
    parts = [d.decompress(data, max_length=step)]
    total = len(parts[0])
    while not d.eof:
        _check_total(total, max_bytes)
        if d.needs_input:
            raise CorruptRecordError("truncated lz4 frame")
        chunk = d.decompress(b"", max_length=step)
        total += len(chunk)
        parts.append(chunk)
    _check_total(total, max_bytes)
    return b"".join(parts)


def _zstd_decode(data: bytes, max_bytes: int) -> bytes:
    """Every zstd frame in ``data``, reading at most ``max_bytes + 1`` bytes of output.

    python-zstandard offers either bounded output (``stream_reader``, silent on a truncated
    frame) or truncation checks (``decompressobj``, unbounded output), so frames are first
    proved complete by walking their block headers, then read through the bounded reader.
    """
    _zstd_check_frames(data)
    parts: list[bytes] = []
    total = 0
    with _zstd_decompressor().stream_reader(data, read_across_frames=True) as reader:
        while chunk := reader.read(min(_STEP_BYTES, max_bytes + 1 - total)):
            total += len(chunk)
            _check_total(total, max_bytes)
            parts.append(chunk)
            if total == max_bytes + 1:
                break
    return b"".join(parts)


_ZSTD_MAGIC = 0xFD2FB528
_ZSTD_SKIPPABLE_MASK = 0xFFFFFFF0
_ZSTD_SKIPPABLE_MAGIC = 0x184D2A50


def _zstd_check_frames(data: bytes) -> None:
    """Raise unless ``data`` is a sequence of complete zstd (or skippable) frames."""
    pos = 0
    n = len(data)
    while pos < n:
        if n - pos < 8:
            raise CorruptRecordError("truncated zstd frame header")
        (magic,) = struct.unpack_from("<I", data, pos)
        if magic & _ZSTD_SKIPPABLE_MASK == _ZSTD_SKIPPABLE_MAGIC:
            (size,) = struct.unpack_from("<I", data, pos + 4)
            pos += 8 + size
            continue
        if magic != _ZSTD_MAGIC:
            raise CorruptRecordError("not a zstd frame")
        params = zstandard.get_frame_parameters(data[pos:])
        pos += zstandard.frame_header_size(data[pos:])
        while True:
            if n - pos < 3:
                raise CorruptRecordError("truncated zstd block header")
            header = int.from_bytes(data[pos : pos + 3], "little")
            block_type = (header >> 1) & 3
            size = header >> 3
            if block_type == 3:
                raise CorruptRecordError("reserved zstd block type")
            pos += 3 + (1 if block_type == 1 else size)
            if header & 1:
                break
        if params.has_checksum:
            pos += 4
    if pos != n:
        raise CorruptRecordError("truncated zstd frame")


def _xerial_decode(data: bytes, max_bytes: int) -> bytes:
    if len(data) < len(_XERIAL_HEADER) or not data.startswith(_XERIAL_MAGIC):
        raise CorruptRecordError("truncated snappy (xerial) header")
    pos = len(_XERIAL_HEADER)
    parts: list[bytes] = []
    total = 0
    while pos < len(data):
        if pos + 4 > len(data):
            raise CorruptRecordError("truncated snappy chunk length")
        (n,) = _U32.unpack_from(data, pos)
        pos += 4
        if pos + n > len(data):
            raise CorruptRecordError("truncated snappy chunk")
        chunk = data[pos : pos + n]
        total += cramjam.snappy.decompress_raw_len(chunk)
        if total > max_bytes:
            raise DecompressedTooLargeError(f"decompressed batch exceeds {max_bytes} bytes")
        parts.append(bytes(cramjam.snappy.decompress_raw(chunk)))
        pos += n
    return b"".join(parts)
