"""Partition reassignment (KIP-455): the replicas being added and removed.

While a reassignment runs, a partition's ``replicas`` is the union of the original and the
target set; ``adding_replicas`` (target - original) and ``removing_replicas`` (original - target)
say which is which. Both are empty lists when no reassignment is in progress.

Revision ID: 0003
Revises: 0002
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("partitions") as p:
        p.add_column(
            sa.Column("adding_replicas", sa.JSON, nullable=False, server_default=sa.text("'[]'"))
        )
        p.add_column(
            sa.Column("removing_replicas", sa.JSON, nullable=False, server_default=sa.text("'[]'"))
        )


def downgrade() -> None:
    with op.batch_alter_table("partitions") as p:
        p.drop_column("removing_replicas")
        p.drop_column("adding_replicas")
