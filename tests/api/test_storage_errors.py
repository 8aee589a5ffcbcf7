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
from core_log.manager import CLEAN_SHUTDOWN_FILE
from tests.api.helpers import PROBLEM
from tests.api.inprocess import app_client
from tests.core_log.faults import EIO, ENOSPC, faulty_files


@contextmanager
def metadata_disk_full(state: AppState) -> Iterator[None]:
    """Every write to the metadata store fails as SQLite does on a full disk."""

    def full(*args: Any) -> None:
        statement: str = args[2]
        if statement.lstrip().upper().startswith(("INSERT", "UPDATE", "DELETE")):
            raise sqlite3.OperationalError("database or disk is full")

    store = state.broker.store
    engines = {store.engine, store.writer}  # on SQLite, writes have their own engine
    for engine in engines:
        sa.event.listen(engine, "before_cursor_execute", full)
    try:
        yield
    finally:
        for engine in engines:
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


def test_full_disk_produce_is_503_and_the_partition_works_once_space_is_freed(
    tmp_path: Path,
) -> None:
    async def main() -> None:
        async with app_client(tmp_path / "data") as (c, _state):
            assert (await c.post("/v1/topics", json={"name": "t"})).status_code == 201
            url = "/v1/topics/t/partitions/0/records"
            assert (await c.post(url, json={"records": [{"value": 0}]})).status_code == 200
            with faulty_files() as files:
                files.write_errors = [ENOSPC]
                r = await c.post(url, json={"records": [{"value": "lost"}]})
                assert_storage_error(r)
            assert (await c.get("/readyz")).status_code == 200
            r = await c.post(url, json={"records": [{"value": 1}]})
            assert r.json()["offsets"] == [{"partition": 0, "offset": 1}]
            r = await c.get(url, params={"offset": 0})
            assert [x["value"] for x in r.json()["records"]] == [0, 1]
            assert metric(await c.get("/metrics"), "logbus_storage_errors_total") == 1

    asyncio.run(main())


def test_failed_fsync_takes_the_data_dir_offline_and_the_broker_stays_up(tmp_path: Path) -> None:
    async def main() -> None:
        data = tmp_path / "data"
        async with app_client(data) as (c, _state):
            r = await c.post("/v1/topics", json={"name": "t", "partitions": 2})
            assert r.status_code == 201
            p0, p1 = "/v1/topics/t/partitions/0/records", "/v1/topics/t/partitions/1/records"
            assert (await c.post(p0, json={"records": [{"value": "acked"}]})).status_code == 200
            assert metric(await c.get("/metrics"), "logbus_log_dir_offline") == 0
            with faulty_files() as files:
                files.datasync_errors = [EIO]
                files.datasync_match = "t-0"
                assert_storage_error(await c.post(p0, json={"records": [{"value": "x"}]}))
            # Every partition of the directory answers 503 until a restart, whatever the acks.
            assert_storage_error(await c.post(p1, json={"records": [{"value": "y"}]}))
            assert_storage_error(await c.post(p1 + "?acks=1", json={"records": [{"value": 1}]}))
            assert_storage_error(await c.get(p0, params={"offset": 0}))
            assert_storage_error(await c.get(p1, params={"offset": 0, "wait_ms": 5000}))
            # The process answers everything else.
            assert (await c.get("/healthz")).status_code == 200
            r = await c.get("/readyz")
            assert r.status_code == 503 and r.json()["status"] == "log_dir_offline"
            assert (await c.get("/v1/topics/t")).status_code == 200
            metrics = await c.get("/metrics")
            assert metric(metrics, "logbus_log_dir_offline") == 1
            assert metric(metrics, "logbus_storage_errors_total") >= 1
        assert not (data / CLEAN_SHUTDOWN_FILE).exists()
        async with app_client(data) as (c, _state):  # restart: recovered, online
            assert (await c.get("/readyz")).status_code == 200
            r = await c.get(p0, params={"offset": 0})
            assert r.json()["records"][0]["value"] == "acked"
            assert (await c.post(p1, json={"records": [{"value": "z"}]})).status_code == 200

    asyncio.run(main())


def metric(r: httpx.Response, name: str) -> float:
    """The value of the one sample of ``name`` in a Prometheus text answer."""
    assert r.status_code == 200
    values = [
        float(line.rsplit(" ", 1)[1])
        for line in r.text.splitlines()
        if line.startswith(name + "{") or line.startswith(name + " ")
    ]
    assert len(values) == 1, (name, values)
    return values[0]
