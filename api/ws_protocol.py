"""The ``/v1/ws`` message protocol, as values: client messages, credit, frames (sans-I/O).

Client → server (JSON text frames, ``op`` names the message; ``id`` is echoed in replies)::

    {"op": "subscribe", "partitions": [{"topic": "t", "partition": 0, "offset": 5}],
     "topics": ["u"], "from": "earliest", "format": "json" | "binary"}
    {"op": "join", "group": "g", "topics": ["t"], "session_timeout_ms": 10000,
     "instance_id": null, "auto_offset_reset": "latest", "auto_ack": false, "format": "json"}
    {"op": "credit", "records": 1000, "bytes": 1048576}
    {"op": "commit", "offsets": [{"topic": "t", "partition": 0, "offset": 42}], "group": null}
    {"op": "ack"}                      # revoked partitions released (after committing them)
    {"op": "produce", "topic": "t", "partition": null, "acks": "1", "records": [...]}
    {"op": "unsubscribe"} | {"op": "ping"}

Server → client: ``records`` (JSON) or binary frames, ``assigned``, ``revoked``, ``committed``,
``produced``, ``subscribed``, ``joined``, ``stalled``, ``pong`` and ``error`` messages.

**Credit.** The server sends records only against credit the client granted: ``records`` is
the number of records it may still send, ``bytes`` (optional; unlimited until first granted)
the payload bytes of record frames. Each frame is built to fit what is left, so the server never
sends past the credit; a slow client simply stops granting and the server stops reading for
it — nothing is buffered on its behalf. A binary frame carries whole batches, so it waits until
the credit covers a batch; if the credit the client has granted can never cover the next batch,
a ``stalled`` message says how much is needed (once).

**Binary frames**: ``u16 topic length | topic (UTF-8) | i32 partition | Kafka record batches``
(big-endian), the batches exactly as stored; records before the subscribed offset may appear at
the start of the first batch and are to be skipped by offset.
"""

from __future__ import annotations

import struct
from typing import Annotated, Literal

import msgspec

Format = Literal["json", "binary"]
Start = Literal["earliest", "latest"]
# Only read_uncommitted until transactions exist (read_committed is refused, not ignored).
Isolation = Literal["read_uncommitted", "read_committed"]
_U31 = Annotated[int, msgspec.Meta(ge=0, le=2**31 - 1)]
_U63 = Annotated[int, msgspec.Meta(ge=0, le=2**63 - 1)]
_NAME = Annotated[str, msgspec.Meta(min_length=1, max_length=249)]
MAX_SUBSCRIPTIONS = 10_000
CREDIT_MAX = 2**40  # a bound on granted credit, records or bytes

# Close codes (4000-4999 are the application's, RFC 6455 §7.4.2).
CLOSE_AUTH_FAILED = 4401
CLOSE_BAD_SUBSCRIPTION = 4400
CLOSE_UNKNOWN_TOPIC = 4404
CLOSE_FENCED = 4409
CLOSE_COORDINATOR_UNAVAILABLE = 4503  # no coordinator answered for a session timeout
CLOSE_GOING_AWAY = 1001

BINARY_PREFIX = struct.Struct(">H")
BINARY_PARTITION = struct.Struct(">i")


class _Op(msgspec.Struct, tag_field="op", forbid_unknown_fields=True, kw_only=True):
    id: int | str | None = None


class PartitionStart(msgspec.Struct, forbid_unknown_fields=True):
    topic: _NAME
    partition: _U31
    offset: _U63 | None = None
    timestamp: _U63 | None = None
    start: Start | None = msgspec.field(default=None, name="from")


class Subscribe(_Op, tag="subscribe"):
    partitions: Annotated[list[PartitionStart], msgspec.Meta(max_length=MAX_SUBSCRIPTIONS)] = []
    topics: Annotated[list[_NAME], msgspec.Meta(max_length=1000)] = []
    start: Start = msgspec.field(default="latest", name="from")
    timestamp: _U63 | None = None
    format: Format = "json"
    isolation: Isolation = "read_uncommitted"


class Join(_Op, tag="join"):
    group: _NAME
    topics: Annotated[list[_NAME], msgspec.Meta(min_length=1, max_length=1000)]
    session_timeout_ms: _U31 = 10_000
    rebalance_timeout_ms: _U31 = 60_000
    instance_id: _NAME | None = None
    client_id: _NAME | None = None
    auto_offset_reset: Literal["earliest", "latest", "none"] = "latest"
    auto_ack: bool = False
    format: Format = "json"
    isolation: Isolation = "read_uncommitted"


class Credit(_Op, tag="credit"):
    records: Annotated[int, msgspec.Meta(ge=0, le=CREDIT_MAX)] = 0
    bytes: Annotated[int, msgspec.Meta(ge=0, le=CREDIT_MAX)] | None = None


class OffsetSpec(msgspec.Struct, forbid_unknown_fields=True):
    topic: _NAME
    partition: _U31
    offset: _U63
    metadata: Annotated[str, msgspec.Meta(max_length=4096)] = ""


class Commit(_Op, tag="commit"):
    offsets: Annotated[list[OffsetSpec], msgspec.Meta(min_length=1, max_length=10_000)]
    group: _NAME | None = None  # explicit subscriptions: a group with no members


class Ack(_Op, tag="ack"):
    pass


class Produce(_Op, tag="produce"):
    topic: _NAME
    records: msgspec.Raw
    partition: _U31 | None = None
    acks: Literal["0", "1", "all", "-1"] | None = None


class Unsubscribe(_Op, tag="unsubscribe"):
    pass


class Ping(_Op, tag="ping"):
    pass


Message = Subscribe | Join | Credit | Commit | Ack | Produce | Unsubscribe | Ping
_DECODER = msgspec.json.Decoder(Message)


def parse(raw: str | bytes) -> Message:
    """A client message; raises ``ValueError`` with a readable reason."""
    try:
        message: Message = _DECODER.decode(raw)
        return message
    except msgspec.ValidationError as e:
        raise ValueError(f"invalid message: {e}") from None
    except msgspec.DecodeError as e:
        raise ValueError(f"not JSON: {e}") from None
    except RecursionError:
        raise ValueError("not a message: JSON nested too deeply") from None
    except UnicodeDecodeError:
        raise ValueError("not JSON: a message is UTF-8 text") from None


def message_id(raw: str | bytes) -> int | str | None:
    """The ``id`` of a message that failed to parse, if it has a readable one."""
    try:
        doc = msgspec.json.decode(raw)
    except (msgspec.DecodeError, RecursionError, UnicodeDecodeError):
        return None
    value = doc.get("id") if isinstance(doc, dict) else None
    return value if isinstance(value, int | str) else None


class CreditWindow:
    """What the client has granted and the server has not yet used."""

    def __init__(self) -> None:
        self.records = 0
        self.bytes: int | None = None  # None: not limited by bytes

    def grant(self, records: int, nbytes: int | None) -> None:
        self.records = min(CREDIT_MAX, self.records + records)
        if nbytes is not None:
            self.bytes = min(CREDIT_MAX, (self.bytes or 0) + nbytes)

    @property
    def open(self) -> bool:
        return self.records > 0 and (self.bytes is None or self.bytes > 0)

    def fits(self, records: int, nbytes: int) -> bool:
        return records <= self.records and (self.bytes is None or nbytes <= self.bytes)

    def use(self, records: int, nbytes: int) -> None:
        assert self.fits(records, nbytes), "frame built past the credit"
        self.records -= records
        if self.bytes is not None:
            self.bytes -= nbytes


def binary_frame(topic: str, partition: int, batches: bytes) -> bytes:
    name = topic.encode()
    return b"".join(
        (BINARY_PREFIX.pack(len(name)), name, BINARY_PARTITION.pack(partition), batches)
    )


def parse_binary_frame(frame: bytes) -> tuple[str, int, bytes]:
    """The inverse of :func:`binary_frame` (for clients and tests)."""
    (n,) = BINARY_PREFIX.unpack_from(frame)
    topic = frame[2 : 2 + n].decode()
    (partition,) = BINARY_PARTITION.unpack_from(frame, 2 + n)
    return topic, partition, frame[6 + n :]
