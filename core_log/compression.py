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

from .errors import CorruptRecordError, UnsupportedCompressionError
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
    """Decompress ``data``; raise :class:`CorruptRecordError` if it is invalid or too large."""
    try:
        out = _decompress(codec, data, max_bytes)
    except CorruptRecordError:
        raise
    except Exception as e:  # every codec library has its own exception types
        raise CorruptRecordError(f"cannot decompress {codec.name} data: {e}") from e
    if len(out) > max_bytes:
        raise CorruptRecordError(f"decompressed batch exceeds {max_bytes} bytes")
    return out


def _decompress(codec: Compression, data: bytes, max_bytes: int) -> bytes:
    if codec is Compression.NONE:
        return data
    if codec is Compression.GZIP:
        d = zlib.decompressobj(47)  # accept gzip or zlib headers
        out = d.decompress(data, max_bytes + 1)
        if not d.eof:
            raise CorruptRecordError("truncated or oversized gzip stream")
        return out
    if codec is Compression.SNAPPY:
        if data.startswith(_XERIAL_MAGIC):
            return _xerial_decode(data, max_bytes)
        if cramjam.snappy.decompress_raw_len(data) > max_bytes:
            raise CorruptRecordError(f"decompressed batch exceeds {max_bytes} bytes")
        return bytes(cramjam.snappy.decompress_raw(data))
    if codec is Compression.LZ4:
        d4 = lz4.frame.LZ4FrameDecompressor()
        out = d4.decompress(data, max_length=max_bytes + 1)
        if not d4.eof:
            raise CorruptRecordError("truncated or oversized lz4 frame")
        return bytes(out)
    if codec is Compression.ZSTD:
        # Check the declared size before the library allocates for it; an undeclared size is
        # bounded by max_output_size.
        declared = zstandard.frame_content_size(data)
        if declared > max_bytes:
            raise CorruptRecordError(f"decompressed batch exceeds {max_bytes} bytes")
        return bytes(_zstd_decompressor().decompress(data, max_output_size=max_bytes))
    raise UnsupportedCompressionError(f"unsupported codec {int(codec)}")


def _xerial_decode(data: bytes, max_bytes: int) -> bytes:
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
            raise CorruptRecordError(f"decompressed batch exceeds {max_bytes} bytes")
        parts.append(bytes(cramjam.snappy.decompress_raw(chunk)))
        pos += n
    return b"".join(parts)
