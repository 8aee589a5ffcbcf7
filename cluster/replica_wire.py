"""The replica fetch on the wire: one request per follower and leader broker, over HTTP/2.

``POST /replica/fetch`` with a JSON body::

    {"broker_id": 2, "broker_epoch": 7, "max_wait_ms": 500, "max_bytes": 10485760,
     "partition_max_bytes": 1048576,
     "partitions": [[topic, partition, fetch_offset, last_fetched_epoch,
                     current_leader_epoch, durable_offset, high_watermark], ...]}

The answer (``application/vnd.logbus.replica-fetch``) is a 4-byte big-endian length, a JSON
header, then the raw record batches of every partition one after another, byte for byte as the
leader stores them::

    {"partitions": [[topic, partition, error, high_watermark, log_start_offset,
                     log_end_offset, diverging_epoch, diverging_end_offset, records_bytes], ...]}

The request is small (tens of bytes per partition) and the batches are never re-encoded.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Any

import orjson

from .replication import FetchError, FetchPosition, PartitionFetchAnswer

PATH = "/replica/fetch"
CONTENT_TYPE = "application/vnd.logbus.replica-fetch"
_LENGTH = struct.Struct(">I")
MAX_HEADER_BYTES = 16 * 1024 * 1024  # 10,000 partitions of ~100 bytes, with room

TopicPartition = tuple[str, int]


class ReplicaWireError(ValueError):
    """A malformed replica fetch request or answer."""


@dataclass(frozen=True, slots=True)
class ReplicaFetchRequest:
    broker_id: int
    broker_epoch: int
    max_wait_ms: int
    max_bytes: int
    partition_max_bytes: int
    positions: dict[TopicPartition, FetchPosition]


def encode_request(r: ReplicaFetchRequest) -> bytes:
    return orjson.dumps(
        {
            "broker_id": r.broker_id,
            "broker_epoch": r.broker_epoch,
            "max_wait_ms": r.max_wait_ms,
            "max_bytes": r.max_bytes,
            "partition_max_bytes": r.partition_max_bytes,
            "partitions": [
                [
                    t,
                    p,
                    x.fetch_offset,
                    x.last_fetched_epoch,
                    x.current_leader_epoch,
                    x.durable_offset,
                    x.high_watermark,
                ]
                for (t, p), x in r.positions.items()
            ],
        }
    )


def decode_request(body: bytes) -> ReplicaFetchRequest:
    try:
        d = orjson.loads(body)
        positions = {
            (str(t), int(p)): FetchPosition(int(fo), int(le), int(cle), int(do), int(hw))
            for t, p, fo, le, cle, do, hw in d["partitions"]
        }
        return ReplicaFetchRequest(
            int(d["broker_id"]),
            int(d["broker_epoch"]),
            int(d["max_wait_ms"]),
            int(d["max_bytes"]),
            int(d["partition_max_bytes"]),
            positions,
        )
    except (orjson.JSONDecodeError, KeyError, TypeError, ValueError) as e:
        raise ReplicaWireError(f"malformed replica fetch request: {e}") from e


def frame(header: dict[str, Any], payload: bytes | memoryview = b"") -> bytes:
    """A 4-byte big-endian length, a JSON header, then ``payload`` as it is."""
    raw = orjson.dumps(header)
    return b"".join((_LENGTH.pack(len(raw)), raw, payload))


def unframe(body: bytes) -> tuple[dict[str, Any], memoryview]:
    """The JSON header of :func:`frame` and a view of the bytes after it."""
    view = memoryview(body)
    try:
        (n,) = _LENGTH.unpack_from(view, 0)
        if n > MAX_HEADER_BYTES or 4 + n > len(view):
            raise ReplicaWireError(f"header of {n} bytes in a body of {len(view)}")
        header = orjson.loads(view[4 : 4 + n])
    except (struct.error, orjson.JSONDecodeError) as e:
        raise ReplicaWireError(f"malformed framed body: {e}") from e
    if not isinstance(header, dict):
        raise ReplicaWireError("the header of a framed body must be a JSON object")
    return header, view[4 + n :]


def encode_answer(
    answers: list[tuple[TopicPartition, PartitionFetchAnswer]],
) -> bytes:
    """The header part of an answer; the caller sends the batches after it, in order."""
    return frame(
        {
            "partitions": [
                [
                    t,
                    p,
                    a.error.value if a.error is not None else None,
                    a.high_watermark,
                    a.log_start_offset,
                    a.log_end_offset,
                    a.diverging_epoch,
                    a.diverging_end_offset,
                    a.records_bytes,
                ]
                for (t, p), a in answers
            ]
        }
    )


def decode_answer(
    body: bytes,
) -> list[tuple[TopicPartition, PartitionFetchAnswer, memoryview]]:
    """(partition, answer, its raw batches) for every partition of an answer."""
    header, rest = unframe(body)
    try:
        out = []
        pos = 0
        for t, p, err, hw, lso, leo, de, deo, size in header["partitions"]:
            if size < 0 or pos + size > len(rest):
                raise ReplicaWireError("replica fetch answer shorter than its header says")
            answer = PartitionFetchAnswer(
                FetchError(err) if err is not None else None, hw, lso, leo, de, deo, size
            )
            out.append(((str(t), int(p)), answer, rest[pos : pos + size]))
            pos += size
        return out
    except (KeyError, TypeError, ValueError) as e:
        if isinstance(e, ReplicaWireError):
            raise
        raise ReplicaWireError(f"malformed replica fetch answer: {e}") from e
