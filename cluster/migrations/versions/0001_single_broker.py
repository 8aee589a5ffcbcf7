"""The single broker's schema: topics, partitions, brokers, counters, producers, keys.

Revision ID: 0001
Revises:
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "topics",
        sa.Column("name", sa.String(249), primary_key=True),
        sa.Column("topic_id", sa.String(32), nullable=False),
        sa.Column("partitions", sa.Integer, nullable=False),
        sa.Column("replication_factor", sa.Integer, nullable=False),
        sa.Column("configs", sa.JSON, nullable=False),
        sa.Column("created_ms", sa.BigInteger, nullable=False),
        sa.Column("version", sa.Integer, nullable=False),
    )
    op.create_table(
        "partitions",
        sa.Column("topic", sa.String(249), primary_key=True),
        sa.Column("partition", sa.Integer, primary_key=True),
        sa.Column("replicas", sa.JSON, nullable=False),
        sa.Column("isr", sa.JSON, nullable=False),
        sa.Column("leader", sa.Integer, nullable=False),
        sa.Column("leader_epoch", sa.Integer, nullable=False),
        sa.Column("partition_epoch", sa.Integer, nullable=False),
    )
    op.create_table(
        "brokers",
        sa.Column("broker_id", sa.Integer, primary_key=True),
        sa.Column("host", sa.String(255), nullable=False),
        sa.Column("port", sa.Integer, nullable=False),
        sa.Column("rack", sa.String(255), nullable=True),
        sa.Column("lease_expires_ms", sa.BigInteger, nullable=False),
    )
    op.create_table(
        "counters",
        sa.Column("name", sa.String(64), primary_key=True),
        sa.Column("value", sa.BigInteger, nullable=False),
    )
    op.create_table(
        "producer_names",
        sa.Column("name", sa.String(249), primary_key=True),
        sa.Column("producer_id", sa.BigInteger, nullable=False),
        sa.Column("producer_epoch", sa.Integer, nullable=False),
    )
    op.create_table(
        "idempotency_keys",
        sa.Column("key", sa.String(255), primary_key=True),
        sa.Column("digest", sa.String(64), nullable=False),
        sa.Column("producer_id", sa.BigInteger, nullable=False),
        sa.Column("created_ms", sa.BigInteger, nullable=False),
    )
    op.create_index(
        "ix_idempotency_keys_created_ms", "idempotency_keys", ["created_ms"], unique=False
    )


def downgrade() -> None:
    for table in ("idempotency_keys", "producer_names", "counters", "brokers", "partitions"):
        op.drop_table(table)
    op.drop_table("topics")
