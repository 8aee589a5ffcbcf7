"""Records as JSON, both ways. No pydantic here: this is the hot path (see PERFORMANCE-NOTES).

A JSON record (produce) ::

    {"key": "user-1" | null, "key_b64": "...", "value": <any JSON> | null, "value_b64": "...",
     "headers": [{"name": "h", "value": "text"} | {"name": "h", "value_b64": "..."}],
     "partition": 0, "timestamp": 1700000000000}

* ``key`` is text and is stored as its UTF-8 bytes (so murmur2 places it where a Kafka producer
  with a string serializer would); ``key_b64`` carries raw bytes.
* ``value`` is any JSON and is stored as its JSON text; ``value_b64`` carries raw bytes; a null
  or missing value is a tombstone.
* On fetch, a value that parses as JSON is returned as ``value``; other bytes as ``value_b64``.
  Keys and header values that are UTF-8 come back as text, others as ``*_b64``.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Callable
from typing import Annotated, Any

import msgspec
import orjson

from core_log.batch import Record
from core_log.errors import ErrorCode, LogbusError
from core_log.recordjson import is_json, one_line

from .problems import bad_request

# -- input ---------------------------------------------------------------------------------------
# msgspec decodes and validates a whole body in C (~0.15 us a record) into these structs, and
# keeps each value as its raw JSON text (msgspec.Raw): the stored bytes are what the producer
# sent, with no re-encoding — and integers of any size stay exact.

_UNSET = msgspec.UNSET
_NULL = b"null"


class HeaderIn(msgspec.Struct, forbid_unknown_fields=True):
    name: str
    value: str | msgspec.UnsetType | None = _UNSET
    value_b64: str | msgspec.UnsetType = _UNSET


class RecordIn(msgspec.Struct, forbid_unknown_fields=True):
    key: str | msgspec.UnsetType | None = _UNSET
    key_b64: str | msgspec.UnsetType = _UNSET
    value: msgspec.Raw | msgspec.UnsetType = _UNSET
    value_b64: str | msgspec.UnsetType = _UNSET
    headers: list[HeaderIn] | None = None
    partition: Annotated[int, msgspec.Meta(ge=0, le=2**31 - 1)] | None = None
    timestamp: Annotated[int, msgspec.Meta(ge=0, le=2**63 - 1)] | None = None


class ProduceBody(msgspec.Struct, forbid_unknown_fields=True):
    records: list[RecordIn]


_BODY = msgspec.json.Decoder(ProduceBody)
_LINES = msgspec.json.Decoder(RecordIn)


def _b64(raw: str, where: str) -> bytes:
    try:
        return base64.b64decode(raw, validate=True)
    except (binascii.Error, ValueError):
        raise bad_request(f"{where} is not valid base64") from None


def to_record(r: RecordIn, now_ms: int, where: str, index: int) -> tuple[int | None, Record]:
    """(explicit partition or None, record). ``where % index`` names it in errors."""
    ts = now_ms if r.timestamp is None else r.timestamp
    if r.key_b64 is _UNSET and r.value_b64 is _UNSET and r.headers is None:  # common shape
        k = r.key
        v = r.value
        value = None if v is _UNSET else bytes(v)
        return r.partition, Record(
            None if value == _NULL else value,
            None if k is _UNSET or k is None else k.encode(),
            (),
            ts,
        )
    return r.partition, _to_record_full(r, ts, where % index)


def to_records(
    items: list[RecordIn], now_ms: int, where: str, numbers: list[int] | None = None
) -> list[tuple[int | None, Record]]:
    """``[to_record(r, now_ms, where, number) ...]``: in C (``_recordscan.plain_records``,
    ≈ 0.3 µs a record against ≈ 1.3) when every record has the common shape (no ``*_b64``, no
    headers), else in Python. ``numbers`` name records in errors (default: their index)."""
    if _native_plain is not None:
        out: list[tuple[int | None, Record]] | None = _native_plain(items, now_ms, Record, _UNSET)
        if out is not None:
            return out
    if numbers is None:
        return [to_record(r, now_ms, where, i) for i, r in enumerate(items)]
    return [to_record(r, now_ms, where, n) for r, n in zip(items, numbers, strict=True)]


try:
    from core_log._recordscan import plain_records as _c_plain  # type: ignore[import-not-found]

    _native_plain: Callable[..., list[tuple[int | None, Record]] | None] | None = _c_plain
except ImportError:  # built with LOGBUS_PURE_PYTHON=1
    _native_plain = None


def _to_record_full(r: RecordIn, ts: int, where: str) -> Record:
    key: bytes | None = None
    if not isinstance(r.key_b64, msgspec.UnsetType):
        if not isinstance(r.key, msgspec.UnsetType):
            raise bad_request(f"{where}: give key or key_b64, not both")
        key = _b64(r.key_b64, f"{where}.key_b64")
    elif isinstance(r.key, str):
        key = r.key.encode()
    value: bytes | None = None
    if not isinstance(r.value_b64, msgspec.UnsetType):
        if not isinstance(r.value, msgspec.UnsetType):
            raise bad_request(f"{where}: give value or value_b64, not both")
        value = _b64(r.value_b64, f"{where}.value_b64")
    elif not isinstance(r.value, msgspec.UnsetType) and bytes(r.value) != _NULL:
        value = bytes(r.value)
    headers: list[tuple[str, bytes | None]] = []
    for i, h in enumerate(r.headers or ()):
        if not isinstance(h.value_b64, msgspec.UnsetType):
            headers.append((h.name, _b64(h.value_b64, f"{where}.headers[{i}].value_b64")))
        else:
            hv = None if isinstance(h.value, msgspec.UnsetType) else h.value
            headers.append((h.name, None if hv is None else hv.encode()))
    return Record(value, key, tuple(headers), ts)


def _invalid(e: msgspec.MsgspecError, what: str) -> LogbusError:
    # ValidationError is a subclass of DecodeError: test it first.
    kind = "invalid" if isinstance(e, msgspec.ValidationError) else "malformed JSON in"
    return bad_request(f"{kind} {what}: {e}")


def check_utf8(text: bytes, what: str) -> None:
    """400 unless ``text`` is UTF-8. msgspec keeps values as raw JSON text (``msgspec.Raw``)
    without checking their strings, so ``"\xff"`` would be stored and served as a value that
    is not JSON; ``isascii`` makes the common case a scan at memory speed."""
    if text.isascii():
        return
    try:
        text.decode()
    except UnicodeDecodeError as e:
        raise bad_request(f"{what} is not UTF-8 (byte {e.start})") from None


def decode_failed(e: Exception, what: str) -> LogbusError:
    if isinstance(e, RecursionError):
        return bad_request(f"{what}: JSON nested too deeply")
    if isinstance(e, UnicodeDecodeError):
        return bad_request(f"{what}: not UTF-8")
    assert isinstance(e, msgspec.MsgspecError)
    return _invalid(e, what)


DECODE_ERRORS = (msgspec.MsgspecError, RecursionError, UnicodeDecodeError)


def parse_json_body(body: bytes, max_records: int, now_ms: int) -> list[tuple[int | None, Record]]:
    """A ``{"records": [...]}`` body → (explicit partition or None, record) in request order."""
    check_utf8(body, "the body")
    try:
        records = _BODY.decode(body).records
    except DECODE_ERRORS as e:
        raise decode_failed(e, 'body (it must be {"records": [...]})') from None
    if not records:
        raise bad_request("no records in the request")
    if len(records) > max_records:
        raise too_many_records(max_records)
    return to_records(records, now_ms, "records[%d]")


def parse_ndjson_lines(
    lines: list[bytes], first_line_no: int, now_ms: int
) -> list[tuple[int | None, Record]]:
    """Complete NDJSON lines (blank ones skipped) → records; errors name the line number."""
    numbered = [(first_line_no + i, line) for i, line in enumerate(lines) if line.strip()]
    if not numbered:
        return []
    joined = b"\n".join(line for _, line in numbered)
    try:
        check_utf8(joined, "the body")
        decoded = _LINES.decode_lines(joined)
    except (*DECODE_ERRORS, LogbusError):
        for line_no, line in numbered:  # the error path only: find the first bad line
            try:
                check_utf8(line, f"line {line_no}")
                _LINES.decode(line)
            except DECODE_ERRORS as e:
                raise decode_failed(e, f"record on line {line_no}") from None
        raise  # every line decodes alone: a bug, not bad input
    return to_records(decoded, now_ms, "line %d", [line_no for line_no, _ in numbered])


def too_many_records(limit: int) -> LogbusError:
    return LogbusError(
        f"more than {limit} records in one request",
        code=ErrorCode.RECORD_LIST_TOO_LARGE,
        max_records_per_request=limit,
    )


# -- output ------------------------------------------------------------------------------------


def _text_or_b64(name: str, raw: bytes | None, out: dict[str, Any]) -> None:
    if raw is None:
        out[name] = None
        return
    try:
        out[name] = raw.decode()
    except UnicodeDecodeError:
        out[name + "_b64"] = base64.b64encode(raw).decode()


def record_to_json(r: Record) -> dict[str, Any]:
    """One record as a dict for orjson: byte for byte what the one renderer,
    :func:`core_log.recordjson.encode_json`, writes, with its rule for "is this value JSON"
    (:func:`core_log.recordjson.is_json`: strict RFC 8259, nesting <= 512, no number a double
    cannot hold). For callers holding Record objects (the CLI)."""
    out: dict[str, Any] = {"offset": r.offset, "timestamp": r.timestamp}
    _text_or_b64("key", r.key, out)
    if r.value is None:
        out["value"] = None
    elif is_json(r.value):
        # already JSON text: embedded, not re-encoded (line breaks, whitespace there, made spaces)
        out["value"] = orjson.Fragment(one_line(r.value))
    else:
        out["value_b64"] = base64.b64encode(r.value).decode()
    hs = []
    for name, hv in r.headers:
        h: dict[str, Any] = {"name": name}
        _text_or_b64("value", hv, h)
        hs.append(h)
    out["headers"] = hs
    return out
