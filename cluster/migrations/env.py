"""Alembic environment: migrations run on the connection :mod:`cluster.migrate` hands over."""

from __future__ import annotations

from alembic import context

from cluster.schema import metadata_obj

connection = context.config.attributes["connection"]
context.configure(connection=connection, target_metadata=metadata_obj, render_as_batch=True)
with context.begin_transaction():
    context.run_migrations()
