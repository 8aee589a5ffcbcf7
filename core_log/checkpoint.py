"""Small metadata files written atomically: temp file → fsync → rename → fsync directory.

A reader sees either the old file or the new one, never a torn mix, even across a power cut.
"""

from __future__ import annotations

import os
from pathlib import Path

import orjson

from . import fileio
from .errors import KafkaStorageError


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        fileio.ops.fsync(fd)
    finally:
        os.close(fd)


def write_atomic(path: Path, data: bytes) -> None:
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        view = memoryview(data)
        while view:
            n = fileio.ops.write(fd, view)
            view = view[n:]
        fileio.ops.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)
    fsync_dir(path.parent)


def write_json(path: Path, value: object) -> None:
    write_atomic(path, orjson.dumps(value, option=orjson.OPT_SORT_KEYS))


def read_json(path: Path) -> object | None:
    """The JSON in ``path``, or None when it is missing. A corrupt file is a storage error."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return None
    try:
        value: object = orjson.loads(data)
        return value
    except orjson.JSONDecodeError as e:
        raise KafkaStorageError(f"corrupt checkpoint {path}: {e}") from e
