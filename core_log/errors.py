"""The error tree of Logbus, with Kafka's error names.

Every operating error a caller can see is a :class:`LogbusError` carrying an :class:`ErrorCode`:
a stable Kafka-style name, Kafka's numeric code, whether a retry can succeed, and the HTTP
status the API answers with. Programmer errors stay ``AssertionError``/``TypeError``.

    LogbusError
    ├── CorruptRecordError          CORRUPT_MESSAGE          400
    │   └── DecompressedTooLargeError   (a compressed batch expands past the cap it is read with)
    ├── InvalidRecordError          INVALID_RECORD           400
    ├── UnreadableRecordError       CORRUPT_MESSAGE          500  (not retriable; a stored record)
    ├── InvalidTimestampError       INVALID_TIMESTAMP        400
    ├── RecordTooLargeError         RECORD_TOO_LARGE         413
    ├── OffsetOutOfRangeError       OFFSET_OUT_OF_RANGE      416  (carries the valid range)
    ├── UnknownTopicOrPartitionError UNKNOWN_TOPIC_OR_PARTITION 404
    ├── InvalidTopicError           INVALID_TOPIC_EXCEPTION  400
    ├── TopicAlreadyExistsError     TOPIC_ALREADY_EXISTS     409
    ├── InvalidConfigError          INVALID_CONFIG           400
    ├── KafkaStorageError           KAFKA_STORAGE_ERROR      503  (retriable)
    │   └── StorageFullError        KAFKA_STORAGE_ERROR      503  (undone; nothing changed)
    └── ... (any ErrorCode through LogbusError(code, message))
"""

from __future__ import annotations

import enum
from typing import Any


class ErrorCode(enum.Enum):
    """(Kafka numeric code, retriable, HTTP status)."""

    UNKNOWN_SERVER_ERROR = (-1, False, 500)
    OFFSET_OUT_OF_RANGE = (1, False, 416)
    CORRUPT_MESSAGE = (2, True, 400)
    UNKNOWN_TOPIC_OR_PARTITION = (3, True, 404)
    INVALID_FETCH_SIZE = (4, False, 400)
    LEADER_NOT_AVAILABLE = (5, True, 503)
    NOT_LEADER_OR_FOLLOWER = (6, True, 421)
    REQUEST_TIMED_OUT = (7, True, 504)
    MESSAGE_TOO_LARGE = (10, False, 413)
    OFFSET_METADATA_TOO_LARGE = (12, False, 400)
    NETWORK_EXCEPTION = (13, True, 503)
    COORDINATOR_LOAD_IN_PROGRESS = (14, True, 503)
    COORDINATOR_NOT_AVAILABLE = (15, True, 503)
    NOT_COORDINATOR = (16, True, 421)
    INVALID_TOPIC_EXCEPTION = (17, False, 400)
    RECORD_LIST_TOO_LARGE = (18, False, 413)
    NOT_ENOUGH_REPLICAS = (19, True, 503)
    NOT_ENOUGH_REPLICAS_AFTER_APPEND = (20, True, 503)
    INVALID_REQUIRED_ACKS = (21, False, 400)
    ILLEGAL_GENERATION = (22, False, 409)
    UNKNOWN_MEMBER_ID = (25, False, 404)
    INVALID_GROUP_ID = (24, False, 400)
    INVALID_SESSION_TIMEOUT = (26, False, 400)
    REBALANCE_IN_PROGRESS = (27, False, 409)
    TOPIC_AUTHORIZATION_FAILED = (29, False, 403)
    GROUP_AUTHORIZATION_FAILED = (30, False, 403)
    CLUSTER_AUTHORIZATION_FAILED = (31, False, 403)
    INVALID_TIMESTAMP = (32, False, 400)
    INVALID_PARTITIONS = (37, False, 400)
    INVALID_REPLICATION_FACTOR = (38, False, 400)
    INVALID_REPLICA_ASSIGNMENT = (39, False, 400)
    NOT_CONTROLLER = (41, True, 503)
    INVALID_REQUEST = (42, False, 400)
    UNSUPPORTED_FOR_MESSAGE_FORMAT = (43, False, 415)
    POLICY_VIOLATION = (44, False, 400)
    OUT_OF_ORDER_SEQUENCE_NUMBER = (45, False, 409)
    DUPLICATE_SEQUENCE_NUMBER = (46, False, 409)
    INVALID_PRODUCER_EPOCH = (47, False, 409)
    INVALID_TXN_STATE = (48, False, 409)
    TRANSACTION_COORDINATOR_FENCED = (52, False, 409)
    # Transaction coordinator answers (cluster/txn_state.py). CONCURRENT_TRANSACTIONS is
    # retriable: the transaction is between two states (a record or its markers in flight).
    INVALID_PRODUCER_ID_MAPPING = (49, False, 409)
    INVALID_TRANSACTION_TIMEOUT = (50, False, 400)
    CONCURRENT_TRANSACTIONS = (51, True, 409)
    PRODUCER_FENCED = (90, False, 409)
    TRANSACTIONAL_ID_NOT_FOUND = (105, False, 404)
    TOPIC_ALREADY_EXISTS = (36, False, 409)
    INVALID_CONFIG = (40, False, 400)
    TRANSACTIONAL_ID_AUTHORIZATION_FAILED = (53, False, 403)
    KAFKA_STORAGE_ERROR = (56, True, 503)
    SASL_AUTHENTICATION_FAILED = (58, False, 401)  # a missing, malformed or bad credential
    REASSIGNMENT_IN_PROGRESS = (60, True, 409)
    NO_REASSIGNMENT_IN_PROGRESS = (85, False, 409)
    FENCED_LEADER_EPOCH = (74, True, 409)
    UNKNOWN_LEADER_EPOCH = (75, True, 409)
    UNSUPPORTED_COMPRESSION_TYPE = (76, False, 415)
    INVALID_RECORD = (87, False, 400)
    THROTTLING_QUOTA_EXCEEDED = (89, True, 429)
    RESOURCE_NOT_FOUND = (91, False, 404)  # e.g. an unknown user (Kafka's SCRAM admin APIs)
    DUPLICATE_RESOURCE = (92, False, 409)  # e.g. a user or key id that already exists
    NON_EMPTY_GROUP = (68, False, 409)
    GROUP_ID_NOT_FOUND = (69, False, 404)
    GROUP_MAX_SIZE_REACHED = (81, False, 503)
    FENCED_MEMBER_EPOCH = (110, False, 409)
    UNSUPPORTED_MEDIA_TYPE = (-1001, False, 415)
    PAYLOAD_TOO_LARGE = (-1002, False, 413)
    NOT_FOUND = (-1003, False, 404)
    METHOD_NOT_ALLOWED = (-1004, False, 405)
    CONCURRENT_UPDATE = (-1005, True, 409)
    REQUEST_TIMEOUT = (-1006, True, 408)
    NOT_ACCEPTABLE = (-1007, False, 406)
    IDEMPOTENCY_KEY_REUSED = (-1008, False, 422)
    BROKER_BUSY = (-1020, True, 503)  # a global budget (connections, bytes in flight) is full
    ORIGIN_NOT_ALLOWED = (-1021, False, 403)  # a browser page of another origin

    def __init__(self, kafka_code: int, retriable: bool, http_status: int) -> None:
        self.kafka_code = kafka_code
        self.retriable = retriable
        self.http_status = http_status


class LogbusError(Exception):
    """An operating error with a Kafka-style code. ``detail`` holds extra structured fields."""

    code: ErrorCode = ErrorCode.UNKNOWN_SERVER_ERROR
    retriable_override: bool | None = None  # a class whose answer differs from its code's
    http_status_override: int | None = None

    def __init__(self, message: str, *, code: ErrorCode | None = None, **detail: Any) -> None:
        super().__init__(message)
        if code is not None:
            self.code = code
        self.message = message
        self.detail: dict[str, Any] = detail

    @property
    def retriable(self) -> bool:
        r = self.retriable_override
        return self.code.retriable if r is None else r

    @property
    def http_status(self) -> int:
        s = self.http_status_override
        return self.code.http_status if s is None else s

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.code.name}: {self.message})"


class CorruptRecordError(LogbusError):
    """A batch failed validation: bad CRC, bad length, torn or truncated bytes."""

    code = ErrorCode.CORRUPT_MESSAGE


class DecompressedTooLargeError(CorruptRecordError):
    """A compressed batch expands past the cap it is read with: corrupt data to a reader of
    the log; produce validation answers it as :class:`RecordTooLargeError` instead."""


class InvalidRecordError(LogbusError):
    """A batch is well formed but not acceptable (bad offsets, magic, timestamps, null key)."""

    code = ErrorCode.INVALID_RECORD


class InvalidTimestampError(LogbusError):
    """A record's timestamp is one no reader can render (not -1, nor 0..year 9999 in ms)."""

    code = ErrorCode.INVALID_TIMESTAMP


class UnreadableRecordError(CorruptRecordError):
    """A record already in the log that no reader can serve (written before produce checked
    what it checks now, or corrupted on disk). It is the broker's data, not the request's
    fault, and retrying reads the same bytes: CORRUPT_MESSAGE, HTTP 500, *not* retriable.
    ``offset`` names the record; a consumer skips it by reading on from ``next_offset``."""

    code = ErrorCode.CORRUPT_MESSAGE
    retriable_override = False
    http_status_override = 500

    def __init__(self, message: str, *, offset: int, next_offset: int, **detail: Any) -> None:
        super().__init__(message, offset=offset, next_offset=next_offset, **detail)
        self.offset = offset
        self.next_offset = next_offset


class RecordTooLargeError(LogbusError):
    code = ErrorCode.MESSAGE_TOO_LARGE


class OffsetOutOfRangeError(LogbusError):
    """The requested offset is outside ``[log_start_offset, log_end_offset]``."""

    code = ErrorCode.OFFSET_OUT_OF_RANGE

    def __init__(self, offset: int, log_start_offset: int, log_end_offset: int) -> None:
        super().__init__(
            f"offset {offset} is outside the valid range [{log_start_offset}, {log_end_offset}]",
            offset=offset,
            log_start_offset=log_start_offset,
            log_end_offset=log_end_offset,
        )
        self.offset = offset
        self.log_start_offset = log_start_offset
        self.log_end_offset = log_end_offset


class UnknownTopicOrPartitionError(LogbusError):
    code = ErrorCode.UNKNOWN_TOPIC_OR_PARTITION


class InvalidTopicError(LogbusError):
    code = ErrorCode.INVALID_TOPIC_EXCEPTION


class TopicAlreadyExistsError(LogbusError):
    code = ErrorCode.TOPIC_ALREADY_EXISTS


class InvalidConfigError(LogbusError):
    code = ErrorCode.INVALID_CONFIG


class UnsupportedCompressionError(LogbusError):
    code = ErrorCode.UNSUPPORTED_COMPRESSION_TYPE


class KafkaStorageError(LogbusError):
    """The disk failed under us (I/O error); the log directory is offline until restart."""

    code = ErrorCode.KAFKA_STORAGE_ERROR


class StorageFullError(KafkaStorageError):
    """An append found the disk full (ENOSPC/EDQUOT) and was undone: nothing changed, the log
    directory stays online, and the same append succeeds once space is freed."""
