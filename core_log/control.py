"""Transaction markers: Kafka's control batches (COMMIT / ABORT), built and parsed. Pure codec.

A control batch is an ordinary v2 batch (:mod:`core_log.batch`) with the ``CONTROL`` and
``TRANSACTIONAL`` attribute bits set, the producer id and epoch of the transaction it ends, no
sequence (``baseSequence = -1``: markers are not idempotent writes), no compression, and one
record whose key and value are small big-endian structs::

    key    (CONTROL_KEY, 4 bytes)    version int16 = 0, type int16 (0 = ABORT, 1 = COMMIT)
    value  (CONTROL_VALUE, 6 bytes)  version int16 = 0, coordinatorEpoch int32

The marker takes one offset in the partition like any record; readers skip it. Only the
broker writes markers (:meth:`core_log.log.PartitionLog.append_marker`): produce validation
refuses every control batch (``validate_batch(strict=True)``), so a producer cannot end a
transaction or forge a marker by itself.

Parsing is lenient about what follows the two version fields (Kafka's rule: a newer version may
append fields), strict about the rest: a control batch that is not a transaction marker (an
unknown type, a missing or short key) parses to ``None`` so that replay of a log never fails on
one (Kafka uses other control types in its metadata logs).
"""

from __future__ import annotations

import enum
import struct
from dataclasses import dataclass

from .batch import (
    NO_SEQUENCE,
    BatchHeader,
    Record,
    build_batch,
    parse_header,
    records_section,
    walk_records,
)
from .errors import CorruptRecordError, InvalidRecordError

CONTROL_KEY = struct.Struct(">hh")  # version, type
CONTROL_VALUE = struct.Struct(">hi")  # version, coordinatorEpoch
CONTROL_KEY_VERSION = 0
CONTROL_VALUE_VERSION = 0
_INT16_MAX = 2**15 - 1
_INT32_MAX = 2**31 - 1


class ControlType(enum.IntEnum):
    """The ``type`` field of a control record's key (Kafka's ControlRecordType)."""

    ABORT = 0
    COMMIT = 1


@dataclass(frozen=True, slots=True)
class ControlMarker:
    """One parsed transaction marker: who it is for, how the transaction ended, and where."""

    producer_id: int
    producer_epoch: int
    control_type: ControlType
    coordinator_epoch: int
    offset: int  # the marker's offset (the batch's base offset)
    timestamp: int

    @property
    def commit(self) -> bool:
        return self.control_type is ControlType.COMMIT


def build_control_batch(
    producer_id: int,
    epoch: int,
    commit: bool,
    coordinator_epoch: int,
    timestamp: int,
    *,
    base_offset: int = 0,
    partition_leader_epoch: int = -1,
) -> bytes:
    """A COMMIT (``commit=True``) or ABORT marker for ``producer_id`` at ``epoch``, written
    by a coordinator of epoch ``coordinator_epoch``, stamped ``timestamp`` (ms).

    Raises :class:`InvalidRecordError` for a negative producer id, epoch or coordinator epoch,
    or one out of its field's range (int16 epoch, int32 coordinator epoch).
    """
    if producer_id < 0 or not 0 <= epoch <= _INT16_MAX:
        raise InvalidRecordError(
            f"a transaction marker needs a producer id >= 0 and an epoch in 0..{_INT16_MAX} "
            f"(got {producer_id}, {epoch})"
        )
    if not 0 <= coordinator_epoch <= _INT32_MAX:
        raise InvalidRecordError(f"invalid coordinator epoch {coordinator_epoch}")
    kind = ControlType.COMMIT if commit else ControlType.ABORT
    record = Record(
        CONTROL_VALUE.pack(CONTROL_VALUE_VERSION, coordinator_epoch),
        CONTROL_KEY.pack(CONTROL_KEY_VERSION, int(kind)),
        timestamp=timestamp,
    )
    return build_batch(
        [record],
        base_offset=base_offset,
        producer_id=producer_id,
        producer_epoch=epoch,
        base_sequence=NO_SEQUENCE,
        partition_leader_epoch=partition_leader_epoch,
        is_transactional=True,
        is_control=True,
        default_timestamp=timestamp,
    )


def parse_control_batch(buf: bytes | memoryview, pos: int = 0) -> ControlMarker | None:
    """The transaction marker in the (validated) control batch at ``pos``, or None when the
    batch is not a control batch or holds no COMMIT/ABORT record (see the module docstring).
    Raises :class:`CorruptRecordError` only when its records section cannot be read at all."""
    h = parse_header(buf, pos)
    if not h.is_control or h.record_count < 1:
        return None
    records, _ = walk_records(h, records_section(buf, h, pos), check_timestamps=False)
    if not records:
        return None
    return marker_of(h, records[0])


def marker_of(h: BatchHeader, record: Record) -> ControlMarker | None:
    """The marker the control record ``record`` of batch ``h`` describes, or None."""
    key, value = record.key, record.value
    if key is None or len(key) < CONTROL_KEY.size:
        return None
    key_version, kind = CONTROL_KEY.unpack_from(key)
    if key_version < 0 or kind not in (ControlType.ABORT, ControlType.COMMIT):
        return None
    coordinator_epoch = -1
    if value is not None and len(value) >= CONTROL_VALUE.size:
        _, coordinator_epoch = CONTROL_VALUE.unpack_from(value)
    return ControlMarker(
        h.producer_id,
        h.producer_epoch,
        ControlType(kind),
        coordinator_epoch,
        h.base_offset,
        record.timestamp,
    )


def require_marker(buf: bytes | memoryview, pos: int = 0) -> ControlMarker:
    """:func:`parse_control_batch`, but a batch that is not a transaction marker raises
    :class:`CorruptRecordError` (for callers that expect one)."""
    marker = parse_control_batch(buf, pos)
    if marker is None:
        raise CorruptRecordError("not a transaction marker (COMMIT/ABORT control batch)")
    return marker
