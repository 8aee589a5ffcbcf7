"""Security (issue 12): users, API keys, ACLs, client quotas, cluster secrets, and the
``security_version`` counter brokers poll to reload them.

The counter row is created here (value 0) so every security change can lock it first
(``SELECT … FOR UPDATE`` on PostgreSQL): changes then serialise, and the store's caps are
counted exactly even with several brokers writing at once.

Revision ID: 0004
Revises: 0003
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None

SECURITY_VERSION = "security_version"  # cluster.security_store.SECURITY_VERSION


def upgrade() -> None:
    op.create_table(
        "users",
        sa.Column("name", sa.String(255), primary_key=True),
        sa.Column("created_ms", sa.BigInteger, nullable=False),
    )
    op.create_table(
        "api_keys",
        sa.Column("key_id", sa.String(64), primary_key=True),
        sa.Column(
            "user_name",
            sa.String(255),
            sa.ForeignKey("users.name", ondelete="CASCADE", name="fk_api_keys_user_name_users"),
            nullable=False,
        ),
        sa.Column("hash", sa.String(512), nullable=False),
        sa.Column("description", sa.String(1024), nullable=False, server_default=""),
        sa.Column("created_ms", sa.BigInteger, nullable=False),
    )
    op.create_index("ix_api_keys_user_name", "api_keys", ["user_name"])
    op.create_table(
        "acls",
        sa.Column("principal", sa.String(255), primary_key=True),
        sa.Column("resource_type", sa.String(32), primary_key=True),
        sa.Column("name", sa.String(249), primary_key=True),
        sa.Column("pattern", sa.String(16), primary_key=True),
        sa.Column("operation", sa.String(32), primary_key=True),
        sa.Column("permission", sa.String(16), primary_key=True),
        sa.Column("created_ms", sa.BigInteger, nullable=False),
    )
    op.create_table(
        "quotas",
        sa.Column("user_name", sa.String(255), primary_key=True),
        sa.Column("client_id", sa.String(255), primary_key=True),
        sa.Column("quota_type", sa.String(64), primary_key=True),
        sa.Column("value", sa.Double, nullable=False),
    )
    op.create_table(
        "cluster_secrets",
        sa.Column("generation", sa.BigInteger, primary_key=True, autoincrement=False),
        sa.Column("secret", sa.LargeBinary(64), nullable=False),
        sa.Column("created_ms", sa.BigInteger, nullable=False),
    )
    counters = sa.table("counters", sa.column("name", sa.String), sa.column("value", sa.BigInteger))
    op.execute(counters.delete().where(counters.c.name == SECURITY_VERSION))
    op.bulk_insert(counters, [{"name": SECURITY_VERSION, "value": 0}])


def downgrade() -> None:
    counters = sa.table("counters", sa.column("name", sa.String))
    op.execute(counters.delete().where(counters.c.name == SECURITY_VERSION))
    op.drop_table("cluster_secrets")
    op.drop_table("quotas")
    op.drop_table("acls")
    op.drop_index("ix_api_keys_user_name", "api_keys")
    op.drop_table("api_keys")
    op.drop_table("users")
