"""NDJSON is parsed as it streams in, in time linear in the body (sans-I/O: no broker)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator

from api.records import _parse_ndjson
from api.settings import Settings

LINE_BYTES = 8 * 1024 * 1024
CHUNK_BYTES = 1024


async def _chunks(body: bytes, size: int) -> AsyncIterator[bytes]:
    for i in range(0, len(body), size):
        yield body[i : i + size]


def test_one_long_line_in_small_chunks_is_joined_once() -> None:
    """8 MiB in 1 KiB chunks: joining the pending line at every chunk copied ~32 GB (minutes;
    a 60 MiB line took 7.1 s over HTTP); joined once it takes milliseconds. The bound is
    generous for a shared machine and still far below the quadratic cost."""
    body = b'{"value":"' + b"x" * LINE_BYTES + b'"}\n{"value":2}\n'
    started = time.monotonic()
    parsed = asyncio.run(_parse_ndjson(_chunks(body, CHUNK_BYTES), Settings(), 0))
    elapsed = time.monotonic() - started
    assert [len(r.value or b"") for _, r in parsed] == [LINE_BYTES + 2, 1]
    assert elapsed < 10, elapsed


def test_lines_split_anywhere_parse_the_same() -> None:
    body = b"".join(b'{"key":"k%d","value":%d}\n' % (i, i) for i in range(300))
    whole = asyncio.run(_parse_ndjson(_chunks(body, len(body)), Settings(), 0))
    for size in (1, 2, 7, 64, 1000):
        parts = asyncio.run(_parse_ndjson(_chunks(body, size), Settings(), 0))
        assert [(r.key, r.value) for _, r in parts] == [(r.key, r.value) for _, r in whole]
