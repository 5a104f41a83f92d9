"""Alembic migrations of autodl's store (applied by :func:`autodl.store.migrate`; version table
``autodl_alembic_version``). A change to a table is a new file in ``versions/``:
``alembic -c plugins/autodl/migrations/alembic.ini revision -m "what changed"``."""
