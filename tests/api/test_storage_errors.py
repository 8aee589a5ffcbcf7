"""Storage failures answer 503 KAFKA_STORAGE_ERROR (retriable) and change nothing (issue 10).

The broker runs in this process (tests.api.inprocess) so faults can be injected into its
storage: the metadata store reports SQLite's "database or disk is full" for every write.
"""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import sqlalchemy as sa

from api.state import AppState
from tests.api.helpers import PROBLEM
from tests.api.inprocess import app_client


@contextmanager
def metadata_disk_full(state: AppState) -> Iterator[None]:
    """Every write to the metadata store fails as SQLite does on a full disk."""

    def full(*args: Any) -> None:
        statement: str = args[2]
        if statement.lstrip().upper().startswith(("INSERT", "UPDATE", "DELETE")):
            raise sqlite3.OperationalError("database or disk is full")

    engine = state.broker.store.engine
    sa.event.listen(engine, "before_cursor_execute", full)
    try:
        yield
    finally:
        sa.event.remove(engine, "before_cursor_execute", full)


def assert_storage_error(r: httpx.Response) -> None:
    assert r.status_code == 503, (r.status_code, r.text)
    assert r.headers["content-type"].startswith(PROBLEM), r.headers
    body = r.json()
    assert body["code"] == "KAFKA_STORAGE_ERROR" and body["retriable"] is True, body


def test_topic_creation_on_a_full_metadata_disk_is_503_and_changes_nothing(
    tmp_path: Path,
) -> None:
    async def main() -> None:
        async with app_client(tmp_path / "data") as (c, state):
            with metadata_disk_full(state):
                r = await c.post("/v1/topics", json={"name": "t", "partitions": 2})
                assert_storage_error(r)
                assert "disk is full" in r.json()["detail"]
            assert (await c.get("/v1/topics/t")).status_code == 404
            assert not (tmp_path / "data" / "t-0").exists()
            r = await c.post("/v1/topics", json={"name": "t", "partitions": 2})
            assert r.status_code == 201, r.text

    asyncio.run(main())


def test_idempotency_key_produce_on_a_full_metadata_disk_is_503_and_keeps_the_key(
    tmp_path: Path,
) -> None:
    async def main() -> None:
        async with app_client(tmp_path / "data") as (c, state):
            assert (await c.post("/v1/topics", json={"name": "t"})).status_code == 201
            body = {"records": [{"value": "once"}]}
            headers = {"idempotency-key": "order-1"}
            with metadata_disk_full(state):
                r = await c.post("/v1/topics/t/records", json=body, headers=headers)
                assert_storage_error(r)
            assert state.broker.logs.get("t", 0).log_end_offset == 0
            # The key was not burned: the retry is appended once, then answered as a duplicate.
            r = await c.post("/v1/topics/t/records", json=body, headers=headers)
            assert r.status_code == 200, r.text
            assert r.json()["offsets"] == [{"partition": 0, "offset": 0}]
            r = await c.post("/v1/topics/t/records", json=body, headers=headers)
            assert r.status_code == 200 and r.headers.get("logbus-duplicate") == "true"
            assert state.broker.logs.get("t", 0).log_end_offset == 1

    asyncio.run(main())
