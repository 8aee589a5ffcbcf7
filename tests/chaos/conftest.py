"""Fixtures of the chaos tests: the metadata backend (SQLite and PostgreSQL), the seed, and a
report (seed, broker logs, history) printed when a test fails."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.chaos.harness import chaos_seed

_failed_key = pytest.StashKey[bool]()


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> object:
    report = yield
    if call.when == "call" and getattr(report, "failed", False):
        item.stash[_failed_key] = True
    return report


@pytest.fixture(params=["sqlite", "postgresql"])
def metadata_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """The shared metadata store: a SQLite file, or a database of the test's own on the run's
    PostgreSQL server (skipped, with the install hint, when Debian's binaries are missing)."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'shared.db'}"
    url: str = request.getfixturevalue("postgres_db_url")
    return url


@pytest.fixture
def seed() -> int:
    return chaos_seed()


@pytest.fixture
def failure_report(request: pytest.FixtureRequest) -> Iterator[list[str]]:
    """Tests append lines (seed, log paths); they are printed if the test fails."""
    lines: list[str] = []
    yield lines
    if request.node.stash.get(_failed_key, False):
        print("\n".join(["", "== chaos run failed ==", *lines]))
