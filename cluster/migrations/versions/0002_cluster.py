"""The replicated cluster: broker epochs, URLs and replication ports, the controller lease,
unclean election counts.

Revision ID: 0002
Revises: 0001
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("brokers") as b:
        b.add_column(sa.Column("url", sa.String(1024), nullable=False, server_default=""))
        b.add_column(sa.Column("replication_port", sa.Integer, nullable=False, server_default="0"))
        b.add_column(sa.Column("broker_epoch", sa.BigInteger, nullable=False, server_default="0"))
    with op.batch_alter_table("partitions") as p:
        p.add_column(sa.Column("unclean_elections", sa.Integer, nullable=False, server_default="0"))
    op.create_table(
        "controller",
        sa.Column("id", sa.Integer, primary_key=True),
        sa.Column("broker_id", sa.Integer, nullable=False),
        sa.Column("controller_epoch", sa.BigInteger, nullable=False),
        sa.Column("lease_expires_ms", sa.BigInteger, nullable=False),
    )


def downgrade() -> None:
    op.drop_table("controller")
    with op.batch_alter_table("partitions") as p:
        p.drop_column("unclean_elections")
    with op.batch_alter_table("brokers") as b:
        b.drop_column("broker_epoch")
        b.drop_column("replication_port")
        b.drop_column("url")
