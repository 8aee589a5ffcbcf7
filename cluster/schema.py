"""The metadata store's tables (SQLAlchemy Core) and the database clock.

The schema is created and migrated by Alembic (:mod:`cluster.migrate`, scripts in
``cluster/migrations``); these table objects are what the code queries, and a test checks they
match what the migrations build, on SQLite and on PostgreSQL.

Time in the store is the **database's clock** (:func:`db_now_ms`): leases are written as
"database now + duration" and judged against "database now", so no two machines' wall clocks
are ever compared. SQLite's clock is its host's (one host by definition); PostgreSQL's is the
server's ``clock_timestamp()``.
"""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa
from sqlalchemy.ext.compiler import compiles
from sqlalchemy.sql.expression import FunctionElement

metadata_obj = sa.MetaData()

topics_table = sa.Table(
    "topics",
    metadata_obj,
    sa.Column("name", sa.String(249), primary_key=True),
    sa.Column("topic_id", sa.String(32), nullable=False),
    sa.Column("partitions", sa.Integer, nullable=False),
    sa.Column("replication_factor", sa.Integer, nullable=False),
    sa.Column("configs", sa.JSON, nullable=False),
    sa.Column("created_ms", sa.BigInteger, nullable=False),
    sa.Column("version", sa.Integer, nullable=False),
)

partitions_table = sa.Table(
    "partitions",
    metadata_obj,
    sa.Column("topic", sa.String(249), primary_key=True),
    sa.Column("partition", sa.Integer, primary_key=True),
    sa.Column("replicas", sa.JSON, nullable=False),
    sa.Column("isr", sa.JSON, nullable=False),
    sa.Column("leader", sa.Integer, nullable=False),
    sa.Column("leader_epoch", sa.Integer, nullable=False),
    sa.Column("partition_epoch", sa.Integer, nullable=False),
    # Unclean elections this partition went through (each may have lost acknowledged data).
    sa.Column("unclean_elections", sa.Integer, nullable=False, server_default="0"),
    # A reassignment in progress (KIP-455): replicas = original + target; these say which
    # replicas are being added (target - original) and removed (original - target).
    sa.Column("adding_replicas", sa.JSON, nullable=False, server_default=sa.text("'[]'")),
    sa.Column("removing_replicas", sa.JSON, nullable=False, server_default=sa.text("'[]'")),
)

brokers_table = sa.Table(
    "brokers",
    metadata_obj,
    sa.Column("broker_id", sa.Integer, primary_key=True),
    sa.Column("host", sa.String(255), nullable=False),
    sa.Column("port", sa.Integer, nullable=False),
    sa.Column("rack", sa.String(255), nullable=True),
    sa.Column("lease_expires_ms", sa.BigInteger, nullable=False),  # database clock
    sa.Column("url", sa.String(1024), nullable=False, server_default=""),  # advertised URL
    sa.Column("replication_port", sa.Integer, nullable=False, server_default="0"),
    # Bumped by every registration: a restarted (or fenced and re-registered) broker is a new
    # incarnation, and what the old one decided under its epoch no longer counts.
    sa.Column("broker_epoch", sa.BigInteger, nullable=False, server_default="0"),
)

controller_table = sa.Table(
    "controller",
    metadata_obj,
    sa.Column("id", sa.Integer, primary_key=True),  # one row, id 1
    sa.Column("broker_id", sa.Integer, nullable=False),
    sa.Column("controller_epoch", sa.BigInteger, nullable=False),
    sa.Column("lease_expires_ms", sa.BigInteger, nullable=False),  # database clock
)

counters_table = sa.Table(
    "counters",
    metadata_obj,
    sa.Column("name", sa.String(64), primary_key=True),
    sa.Column("value", sa.BigInteger, nullable=False),
)

producer_names_table = sa.Table(
    "producer_names",
    metadata_obj,
    sa.Column("name", sa.String(249), primary_key=True),
    sa.Column("producer_id", sa.BigInteger, nullable=False),
    sa.Column("producer_epoch", sa.Integer, nullable=False),
)

idempotency_keys_table = sa.Table(
    "idempotency_keys",
    metadata_obj,
    sa.Column("key", sa.String(255), primary_key=True),
    sa.Column("digest", sa.String(64), nullable=False),
    sa.Column("producer_id", sa.BigInteger, nullable=False),
    sa.Column("created_ms", sa.BigInteger, nullable=False, index=True),
)


# -- security (issue 12): users, API keys, ACLs, client quotas, the cluster secret ---------------
# Plain strings only: the api layer turns rows into auth_quotas objects (cluster does not import
# auth_quotas). Sizes: names follow auth_quotas/limits.py (principals 255, resource names 249).

users_table = sa.Table(
    "users",
    metadata_obj,
    sa.Column("name", sa.String(255), primary_key=True),
    sa.Column("created_ms", sa.BigInteger, nullable=False),
)

api_keys_table = sa.Table(
    "api_keys",
    metadata_obj,
    sa.Column("key_id", sa.String(64), primary_key=True),
    sa.Column(
        "user_name",
        sa.String(255),
        sa.ForeignKey("users.name", ondelete="CASCADE"),
        nullable=False,
        index=True,
    ),
    sa.Column("hash", sa.String(512), nullable=False),  # argon2id PHC string (~100 chars)
    sa.Column("description", sa.String(1024), nullable=False, server_default=""),
    sa.Column("created_ms", sa.BigInteger, nullable=False),
)

# The six fields are the key: adding an ACL twice is a no-op, as in Kafka.
acls_table = sa.Table(
    "acls",
    metadata_obj,
    sa.Column("principal", sa.String(255), primary_key=True),
    sa.Column("resource_type", sa.String(32), primary_key=True),
    sa.Column("name", sa.String(249), primary_key=True),
    sa.Column("pattern", sa.String(16), primary_key=True),
    sa.Column("operation", sa.String(32), primary_key=True),
    sa.Column("permission", sa.String(16), primary_key=True),
    sa.Column("created_ms", sa.BigInteger, nullable=False),
)

# An absent entity part is stored as "" (not NULL: SQL unique keys treat NULLs as distinct, so
# (NULL, 'app', t) could be inserted twice); "<default>" is Kafka's default entity. The store
# hands absent parts out as None.
quotas_table = sa.Table(
    "quotas",
    metadata_obj,
    sa.Column("user_name", sa.String(255), primary_key=True),
    sa.Column("client_id", sa.String(255), primary_key=True),
    sa.Column("quota_type", sa.String(64), primary_key=True),
    sa.Column("value", sa.Double, nullable=False),
)

# Random secrets for scoped-token HMACs and the inter-broker credential. The highest generation
# is current; older ones still verify until retired (rotation).
cluster_secrets_table = sa.Table(
    "cluster_secrets",
    metadata_obj,
    sa.Column("generation", sa.BigInteger, primary_key=True, autoincrement=False),
    sa.Column("secret", sa.LargeBinary(64), nullable=False),
    sa.Column("created_ms", sa.BigInteger, nullable=False),  # database clock
)


class db_now_ms(FunctionElement[int]):
    """The database's clock in milliseconds since the epoch, as a SQL expression."""

    type = sa.BigInteger()
    inherit_cache = True


@compiles(db_now_ms, "sqlite")
def _sqlite_now_ms(element: Any, compiler: Any, **kw: Any) -> str:
    return "CAST((julianday('now') - 2440587.5) * 86400000.0 AS INTEGER)"


@compiles(db_now_ms, "postgresql")
def _postgresql_now_ms(element: Any, compiler: Any, **kw: Any) -> str:
    return "CAST(EXTRACT(EPOCH FROM clock_timestamp()) * 1000 AS BIGINT)"
