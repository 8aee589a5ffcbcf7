"""Shared OpenAPI fragments: documented error responses, shared query parameters."""

from __future__ import annotations

from typing import Any

from fastapi import Query

from ..problems import PROBLEM_JSON
from ..schemas import Problem


def errors(*statuses: int) -> dict[int | str, dict[str, Any]]:
    """Document each status as a problem+json answer."""
    descriptions = {
        400: "Invalid request (INVALID_REQUEST, INVALID_TOPIC_EXCEPTION, INVALID_CONFIG, "
        "INVALID_REPLICA_ASSIGNMENT, CORRUPT_MESSAGE, ...)",
        401: "No, a malformed or a bad credential (SASL_AUTHENTICATION_FAILED), with "
        "WWW-Authenticate; only with authentication on",
        403: "Not allowed (TOPIC_/GROUP_/CLUSTER_/TRANSACTIONAL_ID_AUTHORIZATION_FAILED: the "
        "ACLs deny it, or an internal topic is read through the group API only; "
        "ORIGIN_NOT_ALLOWED)",
        404: "Unknown topic or partition (UNKNOWN_TOPIC_OR_PARTITION)",
        406: "Cannot answer in the Accept type (NOT_ACCEPTABLE)",
        409: "Conflict (TOPIC_ALREADY_EXISTS, CONCURRENT_UPDATE, OUT_OF_ORDER_SEQUENCE_NUMBER, "
        "INVALID_PRODUCER_EPOCH, NO_REASSIGNMENT_IN_PROGRESS, REASSIGNMENT_IN_PROGRESS)",
        413: "Body or batch too large (PAYLOAD_TOO_LARGE, MESSAGE_TOO_LARGE, "
        "RECORD_LIST_TOO_LARGE)",
        415: "Unsupported content type (UNSUPPORTED_MEDIA_TYPE)",
        416: "Offset out of range (OFFSET_OUT_OF_RANGE), with the valid range",
        422: "Idempotency-Key already used with another request (IDEMPOTENCY_KEY_REUSED)",
        500: "A stored record no reader can serve (CORRUPT_MESSAGE, not retriable): the body "
        "names its offset and the next_offset to read on from",
        503: "Storage or broker unavailable (KAFKA_STORAGE_ERROR, NOT_CONTROLLER), retriable",
    }
    return {
        s: {
            "model": Problem,
            "description": descriptions[s],
            "content": {PROBLEM_JSON: {"schema": {"$ref": "#/components/schemas/Problem"}}},
        }
        for s in statuses
    }


# Checked by api.records.isolation_of (one message on the fast path and here).
ISOLATION_QUERY = Query(
    description="read_uncommitted (the default, as in Kafka): everything below the high "
    "watermark; read_committed: committed data only, below the last stable offset (aborted "
    "transactions and markers are passed over; a fetch's Logbus-Last-Stable-Offset says where "
    "it is), also on Server-Sent Events streams and member polls",
    json_schema_extra={"enum": ["read_uncommitted", "read_committed"]},
)
