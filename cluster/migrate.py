"""Create or migrate the metadata store's schema with Alembic.

Every broker runs :func:`upgrade` at start (``logbus metadata upgrade`` runs it by hand); the
SQLite and PostgreSQL schemas come from the same migration scripts (``cluster/migrations``).
Brokers starting together may race: PostgreSQL serialises them with an advisory lock, SQLite
with its write lock (the migration runs in one transaction on either).

A store created before the schema was managed by Alembic (a single broker's ``metadata.db``
from an earlier release: the tables of revision 0001 and no ``alembic_version``) is stamped at
0001 first, then upgraded like any other.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import sqlalchemy as sa
from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory

MIGRATIONS = Path(__file__).with_name("migrations")
BASELINE = "0001"
_PG_LOCK_KEY = 0x6C6F6762  # "logb": the advisory lock taken while migrating PostgreSQL


def _config(connection: sa.Connection) -> Config:
    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS))
    cfg.attributes["connection"] = connection
    return cfg


def head() -> str:
    """The newest revision the code knows."""
    revision = ScriptDirectory(str(MIGRATIONS)).get_current_head()
    assert revision is not None
    return revision


def current(engine: sa.Engine) -> str | None:
    with engine.connect() as c:
        return MigrationContext.configure(c).get_current_revision()


def upgrade(engine: sa.Engine, revision: str = "head") -> str:
    """Bring the schema to ``revision``; return the revision now in force."""
    if engine.dialect.name == "sqlite":
        engine = _sqlite_transactional(engine)
    with engine.begin() as c:
        if c.dialect.name == "postgresql":
            c.execute(sa.text("SELECT pg_advisory_xact_lock(:k)"), {"k": _PG_LOCK_KEY})
        tables = set(sa.inspect(c).get_table_names())
        cfg = _config(c)
        if "topics" in tables and "alembic_version" not in tables:
            command.stamp(cfg, BASELINE)
        command.upgrade(cfg, revision)
        now = MigrationContext.configure(c).get_current_revision()
    assert now is not None
    return now


def _sqlite_transactional(engine: sa.Engine) -> sa.Engine:
    """An engine on the same SQLite file whose transactions start with ``BEGIN IMMEDIATE``:
    Python's sqlite3 would otherwise run DDL outside any transaction, and two brokers starting
    together could both see an empty file and both create the tables."""
    own = sa.create_engine(engine.url, poolclass=sa.pool.NullPool)
    begin_immediate(own)
    return own


def begin_immediate(engine: sa.Engine) -> None:
    """Make every transaction of a SQLite ``engine`` take the write lock when it begins
    (``BEGIN IMMEDIATE``): a deferred one that reads, then writes, fails at once with
    "database is locked" when another writer holds the lock, whatever the busy timeout;
    an immediate one waits its turn."""

    def manual(dbapi_conn: Any, _record: Any) -> None:
        dbapi_conn.isolation_level = None  # pysqlite would BEGIN (deferred) on its own

    def immediate(conn: sa.Connection) -> None:
        conn.exec_driver_sql("BEGIN IMMEDIATE")

    sa.event.listen(engine, "connect", manual)
    sa.event.listen(engine, "begin", immediate)


def upgrade_url(url: str) -> tuple[str | None, str]:
    """:func:`upgrade` the store at ``url``: (revision before, revision now)."""
    engine = sa.create_engine(url)
    try:
        return current(engine), upgrade(engine)
    finally:
        engine.dispose()
