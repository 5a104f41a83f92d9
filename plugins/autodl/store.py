"""autodl's own store (leases, run records, learned state): SQLAlchemy, SQLite by default, PostgreSQL in production.

Airflow 3 tasks may not touch Airflow's metadata database, so autodl keeps its tables here, at
``AUTODL_STORE_URL`` (see :mod:`autodl.config`). Every module that owns a table declares it on
:data:`Base` and the tables are created on first use.
"""

from __future__ import annotations

from functools import lru_cache

from sqlalchemy import create_engine, event
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.engine import Engine
from sqlalchemy.orm import DeclarativeBase, sessionmaker

from autodl.config import store_url
from autodl.errors import StoreError
from autodl.redact import redact_text, redact_url  # noqa: F401 - redact_url re-exported for existing callers


class Base(DeclarativeBase):
    """Declarative base of every autodl table."""


def _sqlite_pragmas(dbapi_conn, _record) -> None:
    cur = dbapi_conn.cursor()
    cur.execute("PRAGMA journal_mode=WAL")
    cur.execute("PRAGMA busy_timeout=30000")
    cur.close()


def get_engine(url: str | None = None) -> Engine:
    """Engine for ``url`` (default :func:`autodl.config.store_url`, read at each call), tables created.

    SQLite gets WAL and a 30 s busy timeout so concurrent tasks serialise instead of failing.

    :raises StoreError: when the URL is malformed, its driver is missing, or the database cannot be
        reached or written (the message names AUTODL_STORE_URL, with any password hidden).
    """
    url = url or store_url()
    try:
        return _engine(url)
    except (SQLAlchemyError, ImportError, OSError, ValueError, TypeError) as exc:  # ValueError: a URL SQLAlchemy cannot parse
        shown = redact_url(url)
        reason = redact_text(str(exc).splitlines()[0] if str(exc) else type(exc).__name__)
        raise StoreError(
            f"autodl's store {shown} (AUTODL_STORE_URL) cannot be used: {reason}. Set AUTODL_STORE_URL to "
            "sqlite:///PATH (a writable file) or postgresql+psycopg2://USER:PASSWORD@HOST/DB."
        ) from None


@lru_cache(maxsize=32)
def _engine(url: str) -> Engine:
    if url.startswith("sqlite"):
        engine = create_engine(url, connect_args={"timeout": 30})
        event.listen(engine, "connect", _sqlite_pragmas)
    else:
        engine = create_engine(url, pool_pre_ping=True)
    _import_table_modules()
    Base.metadata.create_all(engine)
    return engine


def session_factory(url: str | None = None) -> sessionmaker:
    """A sessionmaker bound to the store at ``url``."""
    return sessionmaker(get_engine(url), expire_on_commit=False)


def _import_table_modules() -> None:
    # Modules that declare tables; importing registers them on Base.metadata.
    import importlib

    for name in ("autodl.ledger", "autodl.records", "autodl.policy.rl_state"):
        try:
            importlib.import_module(name)
        except ModuleNotFoundError as exc:
            if exc.name != name:
                raise
