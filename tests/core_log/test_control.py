"""Transaction markers (core_log.control): Kafka's control batch format, built and parsed.

kafka-python reads the batches back as an independent implementation of the format: its
control-batch flag, transactional flag, producer fields and CRC must agree with ours.
"""

from __future__ import annotations

import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from kafka.record.default_records import DefaultRecordBatch

from core_log.batch import (
    NO_SEQUENCE,
    Record,
    build_batch,
    decode_records,
    validate_batch,
)
from core_log.control import (
    ControlType,
    build_control_batch,
    parse_control_batch,
    require_marker,
)
from core_log.errors import CorruptRecordError, InvalidRecordError

SETTINGS = settings(derandomize=True, database=None, deadline=None, max_examples=200)


@SETTINGS
@given(
    producer_id=st.integers(0, 2**63 - 1),
    epoch=st.integers(0, 2**15 - 1),
    commit=st.booleans(),
    coordinator_epoch=st.integers(0, 2**31 - 1),
    timestamp=st.integers(0, 2**42),
    base_offset=st.integers(0, 2**40),
)
def test_marker_round_trips(
    producer_id: int,
    epoch: int,
    commit: bool,
    coordinator_epoch: int,
    timestamp: int,
    base_offset: int,
) -> None:
    batch = build_control_batch(
        producer_id, epoch, commit, coordinator_epoch, timestamp, base_offset=base_offset
    )
    h = validate_batch(batch)  # the log's (non-strict) check accepts it
    assert h.is_control and h.is_transactional
    assert (h.producer_id, h.producer_epoch, h.base_sequence) == (producer_id, epoch, NO_SEQUENCE)
    assert h.record_count == 1 and h.last_offset_delta == 0 and h.base_offset == base_offset
    marker = parse_control_batch(batch)
    assert marker is not None
    assert marker.producer_id == producer_id and marker.producer_epoch == epoch
    assert marker.commit is commit
    assert marker.control_type is (ControlType.COMMIT if commit else ControlType.ABORT)
    assert marker.coordinator_epoch == coordinator_epoch
    assert (marker.offset, marker.timestamp) == (base_offset, timestamp)


def test_marker_bytes_are_kafkas_control_record() -> None:
    batch = build_control_batch(7, 3, False, 11, 1_000)
    (record,) = decode_records(batch)
    assert record.key == struct.pack(">hh", 0, 0)  # version 0, ABORT
    assert record.value == struct.pack(">hi", 0, 11)  # version 0, coordinator epoch
    commit = decode_records(build_control_batch(7, 3, True, 11, 1_000))[0]
    assert commit.key == struct.pack(">hh", 0, 1)


def test_kafka_python_reads_our_markers() -> None:
    batch = build_control_batch(42, 5, True, 9, 1_700_000_000_000, base_offset=100)
    theirs = DefaultRecordBatch(batch)
    assert theirs.validate_crc()
    assert theirs.is_control_batch and theirs.is_transactional
    assert (theirs.producer_id, theirs.producer_epoch, theirs.base_offset) == (42, 5, 100)
    (record,) = list(theirs)
    assert record.key == struct.pack(">hh", 0, 1)
    assert record.value == struct.pack(">hi", 0, 9)


def test_producers_may_not_send_markers() -> None:
    batch = build_control_batch(1, 0, True, 0, 0)
    for allow in (False, True):
        with pytest.raises(InvalidRecordError, match="control"):
            validate_batch(batch, strict=True, allow_transactional=allow)


@pytest.mark.parametrize(
    ("producer_id", "epoch", "coordinator_epoch"),
    [(-1, 0, 0), (1, -1, 0), (1, 2**15, 0), (1, 0, -1), (1, 0, 2**31)],
)
def test_builder_refuses_bad_fields(producer_id: int, epoch: int, coordinator_epoch: int) -> None:
    with pytest.raises(InvalidRecordError):
        build_control_batch(producer_id, epoch, True, coordinator_epoch, 0)


def test_parser_ignores_what_is_not_a_marker() -> None:
    data = build_batch([Record(b"v", b"k")], producer_id=1, producer_epoch=0, base_sequence=0)
    assert parse_control_batch(data) is None  # not a control batch
    unknown_type = build_batch(
        [Record(struct.pack(">hi", 0, 0), struct.pack(">hh", 0, 7))],
        producer_id=1,
        producer_epoch=0,
        is_control=True,
        is_transactional=True,
    )
    assert parse_control_batch(unknown_type) is None
    short_key = build_batch(
        [Record(None, b"\x00")], producer_id=1, producer_epoch=0, is_control=True
    )
    assert parse_control_batch(short_key) is None
    with pytest.raises(CorruptRecordError):
        require_marker(short_key)
    # A newer key/value version with extra fields still parses (Kafka's forward compatibility).
    newer = build_batch(
        [Record(struct.pack(">hiq", 1, 4, 0), struct.pack(">hhq", 1, 1, 0))],
        producer_id=1,
        producer_epoch=2,
        is_control=True,
        is_transactional=True,
    )
    marker = require_marker(newer)
    assert marker.commit and marker.coordinator_epoch == 4


def test_strict_accepts_transactional_batches_only_when_allowed() -> None:
    batch = build_batch(
        [Record(b"v")], is_transactional=True, producer_id=1, producer_epoch=0, base_sequence=0
    )
    with pytest.raises(InvalidRecordError, match="transactions are not supported yet"):
        validate_batch(batch, strict=True)
    assert validate_batch(batch, strict=True, allow_transactional=True).is_transactional
    anonymous = build_batch([Record(b"v")], is_transactional=True)
    with pytest.raises(InvalidRecordError, match="producer id"):
        validate_batch(anonymous, strict=True, allow_transactional=True)
