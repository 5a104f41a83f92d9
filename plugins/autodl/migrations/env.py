"""Alembic environment of autodl's store: online migrations on the connection autodl hands over (under its
migration lock), or on ``AUTODL_STORE_URL`` when a developer runs ``alembic`` by hand."""

from __future__ import annotations

from alembic import context

from autodl.store import VERSION_TABLE, Base, import_table_modules

import_table_modules()


def _run(connection) -> None:
    context.configure(connection=connection, target_metadata=Base.metadata, version_table=VERSION_TABLE,
                      render_as_batch=True, compare_type=True)
    with context.begin_transaction():
        context.run_migrations()


connection = context.config.attributes.get("connection")
if connection is not None:
    _run(connection)
else:
    from sqlalchemy import create_engine

    from autodl.config import store_url

    with create_engine(store_url()).connect() as conn:
        _run(conn)
        conn.commit()
