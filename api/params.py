"""Numbers in paths, queries, headers and bodies: one strict rule.

A number a client sends is ASCII digits only — no sign, no leading zero, no ``_``, no spaces
(``%201``), no other script's digits — and at most 19 of them, so it always fits the signed
64-bit field it ends up in (Kafka's offsets are int64, partitions int32). Python's ``int()``
accepts ``+1``, ``01``, ``1_0`` and `` 1``; pydantic in lax mode accepts ``"3"`` for 3; both let
two spellings name one resource and let a 23-digit partition reach code that packs it into
32 bits. Everything here answers 400 instead.

Used by the lean fast path (:func:`parse_uint`) and by FastAPI (the ``Annotated`` aliases, which
also put the ranges in the OpenAPI document).
"""

from __future__ import annotations

import re
from typing import Annotated, Any

from fastapi import Path
from pydantic import BeforeValidator, StringConstraints, WithJsonSchema

from .problems import bad_request

PARTITION_MAX = 2**31 - 1  # Kafka's partition is an int32
OFFSET_MAX = 2**63 - 1  # offsets and timestamps are int64
UINT_DIGITS_MAX = 19  # len(str(OFFSET_MAX))
UINT_PATTERN = r"^(0|[1-9][0-9]{0,18})$"
_UINT = re.compile(UINT_PATTERN)
DIGITS_RULE = "digits only: no sign, leading zero, underscore or space"


def is_uint(raw: str) -> bool:
    return _UINT.fullmatch(raw) is not None


def parse_uint(raw: str, name: str, low: int, high: int) -> int:
    """``raw`` as an integer in [low, high], or 400 naming ``name``."""
    if not is_uint(raw):
        raise bad_request(f"{name} must be an integer in [{low}, {high}] ({DIGITS_RULE})")
    value = int(raw)
    if not low <= value <= high:
        raise bad_request(f"{name} must be between {low} and {high}")
    return value


def _digits(value: Any) -> Any:
    """A FastAPI parameter arrives as text: let only plain digits through to int parsing."""
    if isinstance(value, str) and not is_uint(value):
        raise ValueError(DIGITS_RULE)
    return value


Digits = BeforeValidator(_digits)

PartitionPath = Annotated[int, Path(ge=0, le=PARTITION_MAX, description="partition number"), Digits]


def _json_number(value: Any) -> Any:
    """A body integer is a JSON number: "3" (text) and true are not 3; 3.0 is (JSON Schema)."""
    if isinstance(value, str | bool):
        raise ValueError("must be a JSON number, not text or a boolean")
    return value


# Body integers: pydantic's lax int, minus text and booleans.
JsonInt = Annotated[int, BeforeValidator(_json_number)]

# Names as the broker checks them (topics, groups). The document carries the pattern; the
# broker's own check answers a bad name with its Kafka code (INVALID_TOPIC_EXCEPTION, ...).
NAME_PATTERN = "^[a-zA-Z0-9._-]{1,249}$"
NAME_SCHEMA: dict[str, Any] = {
    "type": "string",
    "pattern": NAME_PATTERN,
    "minLength": 1,
    "maxLength": 249,
}
NameStr = Annotated[str, WithJsonSchema(NAME_SCHEMA)]
# A name the request itself is checked against (where no Kafka code is at stake).
CheckedName = Annotated[str, StringConstraints(pattern=NAME_PATTERN, min_length=1, max_length=249)]
