"""Errors as RFC 9457 ``application/problem+json`` with Kafka-style codes.

Every error answer has the same shape::

    {"type": "about:blank", "title": "OFFSET_OUT_OF_RANGE", "status": 416,
     "code": "OFFSET_OUT_OF_RANGE", "retriable": false, "detail": "offset 9 is outside ...",
     "log_start_offset": 0, "log_end_offset": 5}

``code`` is stable (Kafka's error names); extra fields come from the error's ``detail``.
"""

from __future__ import annotations

from typing import Any

import orjson

from core_log.errors import ErrorCode, LogbusError

PROBLEM_JSON = "application/problem+json"


def problem_body(error: LogbusError) -> dict[str, Any]:
    code = error.code
    body: dict[str, Any] = {
        "type": "about:blank",
        "title": code.name,
        "status": error.http_status,
        "code": code.name,
        "retriable": error.retriable,
        "detail": error.message,
    }
    for k, v in error.detail.items():
        body.setdefault(k, v)
    return body


def problem_bytes(error: LogbusError) -> bytes:
    body = problem_body(error)
    try:
        return orjson.dumps(body)
    except TypeError:  # a detail JSON cannot carry (an integer past 64 bits a client sent)
        return orjson.dumps({k: _jsonable(v) for k, v in body.items()})


def _jsonable(value: Any) -> Any:
    if isinstance(value, int) and not -(2**63) <= value < 2**64:
        return str(value)
    if isinstance(value, list | tuple):
        return [_jsonable(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    return value


def bad_request(message: str, **detail: Any) -> LogbusError:
    return LogbusError(message, code=ErrorCode.INVALID_REQUEST, **detail)


def unsupported_media_type(got: str, allowed: list[str]) -> LogbusError:
    return LogbusError(
        f"unsupported content type {got!r}; use one of {', '.join(allowed)}",
        code=ErrorCode.UNSUPPORTED_MEDIA_TYPE,
        supported=allowed,
    )


def payload_too_large(limit: int) -> LogbusError:
    return LogbusError(
        f"request body exceeds the limit of {limit} bytes",
        code=ErrorCode.PAYLOAD_TOO_LARGE,
        max_request_bytes=limit,
    )
