"""The throwaway PostgreSQL server (tests/pg.py) keeps committed data across a restart and a
crash, gives each test its own database, and can be paused."""

from __future__ import annotations

import threading
from pathlib import Path

import psycopg
import pytest
import sqlalchemy as sa

from tests.pg import PostgresServer, PostgresUnavailable, find_bin_dir


def test_url_is_psycopg_on_loopback(postgres_url: str, postgres_server: PostgresServer) -> None:
    url = sa.make_url(postgres_url)
    assert url.drivername == "postgresql+psycopg"
    assert url.host == "127.0.0.1"
    assert url.port == postgres_server.port
    engine = sa.create_engine(postgres_url)
    try:
        with engine.connect() as conn:
            assert conn.execute(sa.text("SELECT current_database()")).scalar() == url.database
            assert conn.execute(sa.text("SHOW fsync")).scalar() == "on"
    finally:
        engine.dispose()


@pytest.mark.parametrize("mode", ["fast", "immediate"])
def test_committed_rows_survive_a_restart(
    postgres_db_url: str, postgres_server: PostgresServer, mode: str
) -> None:
    engine = sa.create_engine(postgres_db_url, pool_pre_ping=True)
    try:
        with engine.begin() as conn:
            conn.execute(sa.text("CREATE TABLE t (k int PRIMARY KEY, v text)"))
            conn.execute(sa.text("INSERT INTO t VALUES (1, 'one'), (2, 'two')"))
        pid_before = postgres_server.pid
        postgres_server.restart(mode)
        assert postgres_server.pid != pid_before
        with engine.connect() as conn:
            rows = conn.execute(sa.text("SELECT k, v FROM t ORDER BY k")).all()
        assert [tuple(r) for r in rows] == [(1, "one"), (2, "two")]
    finally:
        engine.dispose()


def test_a_stopped_server_refuses_connections(
    postgres_db_url: str, postgres_server: PostgresServer
) -> None:
    postgres_server.stop()
    assert not postgres_server.is_running()
    engine = sa.create_engine(postgres_db_url)
    try:
        with pytest.raises(sa.exc.OperationalError), engine.connect():
            pass
        postgres_server.start()
        with engine.connect() as conn:
            assert conn.execute(sa.text("SELECT 1")).scalar() == 1
    finally:
        engine.dispose()


def test_each_test_database_is_its_own(postgres_server: PostgresServer) -> None:
    """Two per-test databases (as postgres_db_url makes them) do not share tables."""
    a = postgres_server.create_database("isolation_a")
    b = postgres_server.create_database("isolation_b")
    engines = [sa.create_engine(a), sa.create_engine(b)]
    try:
        with engines[0].begin() as conn:
            conn.execute(sa.text("CREATE TABLE only_in_a (x int)"))
        with engines[1].connect() as conn:
            assert not sa.inspect(conn).has_table("only_in_a")
            conn.execute(sa.text("CREATE TABLE only_in_a (y text)"))  # no clash either
            conn.commit()
    finally:
        for engine in engines:
            engine.dispose()
        postgres_server.drop_database("isolation_a")
        postgres_server.drop_database("isolation_b")


def test_postgres_db_url_is_fresh_per_test(postgres_db_url: str) -> None:
    """A table left behind by another test (test_committed_rows_survive_a_restart) is absent."""
    engine = sa.create_engine(postgres_db_url)
    try:
        with engine.connect() as conn:
            assert sa.inspect(conn).get_table_names() == []
    finally:
        engine.dispose()


def test_pause_holds_queries_until_resume(
    postgres_db_url: str, postgres_server: PostgresServer
) -> None:
    dsn = postgres_server.dsn(sa.make_url(postgres_db_url).database or "")
    with psycopg.connect(dsn, autocommit=True) as conn:
        assert len(postgres_server.process_ids()) > 1  # postmaster + backends
        postgres_server.pause()
        done = threading.Event()
        result: list[object] = []

        def query() -> None:
            cur = conn.execute("SELECT 42")
            result.append(cur.fetchone())
            done.set()

        worker = threading.Thread(target=query, daemon=True)
        try:
            worker.start()
            # The backend is stopped: the query cannot finish. A short wait shows it is held
            # (a false pass here would need the query to be slower than 0.5 s, not faster).
            assert not done.wait(0.5)
        finally:
            postgres_server.resume()
        assert done.wait(30)
        assert result == [(42,)]
        worker.join(30)


def test_bad_database_names_are_refused(postgres_server: PostgresServer) -> None:
    with pytest.raises(ValueError):
        postgres_server.create_database('x"; DROP DATABASE postgres; --')


def test_missing_binaries_say_how_to_install(tmp_path: Path) -> None:
    with pytest.raises(PostgresUnavailable, match="apt-get install postgresql"):
        find_bin_dir(tmp_path)


def test_the_newest_version_is_chosen(tmp_path: Path) -> None:
    for version in ("9.6", "15", "13"):
        bin_dir = tmp_path / version / "bin"
        bin_dir.mkdir(parents=True)
        (bin_dir / "initdb").touch()
        (bin_dir / "pg_ctl").touch()
    assert find_bin_dir(tmp_path) == tmp_path / "15" / "bin"


def test_make_test_installs_postgresql() -> None:
    """`make test` has a prerequisite that installs Debian's postgresql when initdb is absent
    (it is not on PATH, so `command -v` cannot tell)."""
    makefile = (Path(__file__).resolve().parent.parent / "Makefile").read_text()
    test_line = next(line for line in makefile.splitlines() if line.startswith("test:"))
    assert "postgres" in test_line.split(":", 1)[1].split()
    recipe = makefile.split("\npostgres:\n", 1)[1].split("\n\n", 1)[0]
    assert "/usr/lib/postgresql/*/bin/initdb" in recipe
    assert "apt-get install -y -qq postgresql" in recipe
