from __future__ import annotations

import itertools
import os
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.pg import PostgresServer, PostgresUnavailable
from tests.server import BrokerProcess


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[BrokerProcess]:
    """A fresh broker process on its own data directory and port."""
    b = BrokerProcess(tmp_path / "data").start()
    try:
        yield b
    finally:
        b.stop()


@pytest.fixture
def client(broker: BrokerProcess) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=broker.url, timeout=30.0) as c:
        yield c


# -- PostgreSQL (tests/pg.py) -----------------------------------------------------------------


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[PostgresServer]:
    """One throwaway PostgreSQL server for the whole run; skips when it is not installed."""
    try:
        server = PostgresServer()
    except PostgresUnavailable as e:
        pytest.skip(str(e))
    with server:
        yield server


@pytest.fixture(scope="session")
def postgres_url(postgres_server: PostgresServer) -> str:
    """An SQLAlchemy URL (postgresql+psycopg://) to a fresh database shared by the run."""
    return postgres_server.create_database("logbus")


_postgres_databases = itertools.count(1)


@pytest.fixture
def postgres_db_url(postgres_server: PostgresServer) -> Iterator[str]:
    """An SQLAlchemy URL to a database of this test's own, dropped afterwards.

    The server is made to run again first and afterwards, so a test that stopped or paused it
    does not break the next one."""
    postgres_server.ensure_running()
    name = f"test_{os.getpid()}_{next(_postgres_databases)}"
    url = postgres_server.create_database(name)
    try:
        yield url
    finally:
        postgres_server.ensure_running()
        postgres_server.drop_database(name)
