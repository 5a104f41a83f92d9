"""autodl's own store (leases, the admission queue, run records, the state steps hand each other, learned state): SQLAlchemy, SQLite by default,
PostgreSQL in production.

Airflow 3 tasks may not touch Airflow's metadata database, so autodl keeps its tables here, at
``AUTODL_STORE_URL`` (see :mod:`autodl.config`). Every module that owns a table declares it on
:data:`Base`; the schema itself comes from the Alembic migrations in ``autodl/migrations`` (version table
:data:`VERSION_TABLE`), applied once per store on first use, under a lock so that any number of processes
racing a fresh store agree (PostgreSQL: an advisory lock; SQLite: an exclusive lock on a file beside
the database).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import threading
from collections.abc import Iterator
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from sqlalchemy import JSON, DateTime, String, create_engine, delete, event, make_url, select, text
from sqlalchemy.engine import Connection, Engine
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column, sessionmaker

from autodl import store_faults, store_file
from autodl.config import store_url
from autodl.errors import ConfigError, StoreError
from autodl.redact import redact_text, redact_url  # noqa: F401 - redact_url re-exported for existing callers

VERSION_TABLE = "autodl_alembic_version"
"""Alembic's version table for autodl's schema; not ``alembic_version``, so a store that shares a database
with another Alembic-managed application (Airflow's own metadata uses ``alembic_version``) never mixes
the two histories."""

MIGRATIONS_DIR = Path(__file__).resolve().parent / "migrations"


class Base(DeclarativeBase):
    """Declarative base of every autodl table."""


def _sqlite_pragmas(dbapi_conn, _record) -> None:
    cur = dbapi_conn.cursor()
    cur.execute("PRAGMA busy_timeout=30000")  # first, so that switching to WAL waits instead of failing
    cur.execute("PRAGMA journal_mode=WAL")
    cur.close()


def get_engine(url: str | None = None) -> Engine:
    """Engine for ``url`` (default :func:`autodl.config.store_url`, read at each call), schema migrated.

    SQLite gets WAL and a 30 s busy timeout so concurrent tasks serialise instead of failing.

    :raises StoreError: when the URL is malformed, its driver is missing, or the database cannot be
        reached, written or migrated (the message names AUTODL_STORE_URL, with any password hidden).
    """
    url = url or store_url()
    try:
        return _engine(url)
    except StoreError:
        raise
    except (SQLAlchemyError, ImportError, OSError, ValueError, TypeError) as exc:  # ValueError: a URL SQLAlchemy cannot parse
        shown = redact_url(url)
        reason = redact_text(str(exc).splitlines()[0] if str(exc) else type(exc).__name__)
        raise StoreError(
            f"autodl's store {shown} (AUTODL_STORE_URL) cannot be used: {reason}. Set AUTODL_STORE_URL to "
            "sqlite:///PATH (a writable file) or postgresql+psycopg2://USER:PASSWORD@HOST/DB."
        ) from None


_ENGINES: dict[str, Engine] = {}
_ENGINES_LOCK = threading.Lock()


def _engine(url: str) -> Engine:
    """One engine per URL and process (migrated on creation)."""
    engine = _ENGINES.get(url)
    if engine is not None:
        return engine
    with _ENGINES_LOCK:
        engine = _ENGINES.get(url)
        if engine is None:
            if url.startswith("sqlite"):
                store_file.secure_sqlite_file(make_url(url).database)  # owner-only before SQLite opens it
                engine = create_engine(url, connect_args={"timeout": 30})
                event.listen(engine, "connect", _sqlite_pragmas)
            else:
                engine = create_engine(url, pool_pre_ping=True, connect_args=store_faults.connect_args(url))
            store_faults.watch(engine)
            import_table_modules()
            migrate(engine)
            if engine.dialect.name == "sqlite":
                store_faults.watch_sqlite_file(engine)
            _ENGINES[url] = engine
    return engine


def _forget_parent_connections() -> None:
    """In a forked child (Airflow's LocalExecutor forks its workers, multiprocessing forks), the pooled
    connections are the parent's sockets: using them from two processes corrupts both sessions. The child
    drops them without closing them and opens its own (SQLAlchemy's advice for ``fork``)."""
    for engine in list(_ENGINES.values()):
        engine.dispose(close=False)


os.register_at_fork(after_in_child=_forget_parent_connections)


def session_factory(url: str | None = None) -> sessionmaker:
    """A sessionmaker bound to the store at ``url``."""
    return sessionmaker(get_engine(url), expire_on_commit=False)


# ------------------------------------------------------------------------------------------- migrations
def _alembic_config(connection: Connection | None = None):
    from alembic.config import Config

    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS_DIR))
    cfg.attributes["connection"] = connection
    return cfg


def head_revision() -> str:
    """The newest migration's revision id."""
    from alembic.script import ScriptDirectory

    head = ScriptDirectory.from_config(_alembic_config()).get_current_head()
    if head is None:  # alembic: a script folder without revisions
        raise ConfigError(f"{MIGRATIONS_DIR}/versions holds no migration: autodl's shipped files are incomplete; "
                          "reinstall autodl")
    return head


def current_revision(connection: Connection) -> str | None:
    """The revision the store at ``connection`` is at; None for a store never migrated."""
    from alembic.runtime.migration import MigrationContext

    return MigrationContext.configure(connection, opts={"version_table": VERSION_TABLE}).get_current_revision()


def migrate(engine: Engine) -> str:
    """Bring the store's schema to the newest migration, once, safely under concurrency.

    A store already at the head costs one query. Otherwise the upgrade runs under a lock held for the
    whole upgrade (PostgreSQL: ``pg_advisory_lock`` on a key derived from the schema; SQLite: ``flock``
    on ``<database>.migrate.lock``), and the revision is read again under the lock, so of N processes
    racing a fresh store one creates the tables and the others find them made. Stores created before
    migrations existed (tables present, no version table) are adopted by the first migration.

    :returns: the head revision.
    """
    import logging

    chatty = logging.getLogger("alembic")
    level = chatty.level
    chatty.setLevel(logging.WARNING)  # not Alembic's "Context impl ..." lines in every task's log
    try:
        head = head_revision()
        with engine.connect() as conn:
            if current_revision(conn) == head:
                return head
        with _migration_lock(engine) as conn:
            current = current_revision(conn)
            if current != head:
                from alembic import command

                command.upgrade(_alembic_config(conn), "head")
                conn.commit()
                logging.getLogger(__name__).info("autodl's store %s migrated from %s to %s",
                                                 redact_url(str(engine.url)), current or "empty", head)
        return head
    finally:
        chatty.setLevel(level)


@contextlib.contextmanager
def _migration_lock(engine: Engine) -> Iterator[Connection]:
    """A connection holding the store's migration lock for the duration of the block."""
    dialect = engine.dialect.name
    if dialect == "postgresql":
        with engine.connect() as conn:
            key = conn.execute(text("SELECT hashtext('autodl-migrations:' || current_schema())")).scalar_one()
            conn.execute(text("SELECT pg_advisory_lock(:k)"), {"k": key})
            conn.commit()
            try:
                yield conn
            finally:
                conn.rollback()
                conn.execute(text("SELECT pg_advisory_unlock(:k)"), {"k": key})
                conn.commit()
    elif dialect == "sqlite" and engine.url.database not in (None, "", ":memory:"):
        lock_path = Path(engine.url.database).with_name(Path(engine.url.database).name + ".migrate.lock")
        store_file.create_private(lock_path)
        with open(lock_path, "a") as fh:
            fcntl.flock(fh, fcntl.LOCK_EX)
            try:
                with engine.connect() as conn:
                    yield conn
            finally:
                fcntl.flock(fh, fcntl.LOCK_UN)
    else:  # an in-memory SQLite store is private to this process; other databases: one advisory-free try
        with engine.connect() as conn:
            yield conn


def import_table_modules() -> None:
    """Import the modules that declare tables, which registers them on ``Base.metadata`` (the migrations must match)."""
    import importlib

    for name in ("autodl.ledger", "autodl.queue", "autodl.queue_hold", "autodl.admissions", "autodl.records",
                 "autodl.policy.rl_state", "autodl.profile.cache"):
        try:
            importlib.import_module(name)
        except ModuleNotFoundError as exc:
            if exc.name != name:
                raise


# -------------------------------------------------------------------------------------------- run state
class RunStateRow(Base):
    """One fact about one run, as the step that learned it wrote it (migration ``0004``)."""

    __tablename__ = "autodl_run_state"

    run_key: Mapped[str] = mapped_column(String(512), primary_key=True)
    name: Mapped[str] = mapped_column(String(64), primary_key=True)
    value: Mapped[dict] = mapped_column(JSON)
    written_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    written_on: Mapped[str | None] = mapped_column(String(250), nullable=True)


class RunState:
    """What the steps of one run hand each other, in autodl's store: whichever host, triggerer or worker
    runs a later step reads what an earlier one wrote, never a file on another machine.

    One row per ``(run key, name)``; writing a name again replaces its value. The names the steps use are
    :data:`PROFILE`, :data:`SELECTION`, :data:`DECISION`, :data:`HANDLE`, :data:`METRICS`, :data:`REPORT`,
    :data:`REQUEUED` and ``failure:<step>`` (:meth:`note_failure`). Values are JSON objects (a pydantic model is dumped with
    ``model_dump(mode="json")``).

    :param url: SQLAlchemy URL; default :func:`autodl.config.store_url`.
    """

    PROFILE = "profile"
    SELECTION = "selection"
    DECISION = "decision"
    HANDLE = "handle"
    METRICS = "metrics"
    REPORT = "report"
    REQUEUED = "requeued"
    """A booking no worker launched within the lease's TTL: released and the run put back in the admission
    queue (:func:`autodl.steps.reaper.requeue_unlaunched`); its ``message`` goes into the record's notes."""
    SAID = "said"
    """The lines a waiting run logged once and does not repeat on its next polls
    (:func:`autodl.steps.wait.once_per_run`), with the wait they belong to (a new wait says them again)."""
    FAILURE_PREFIX = "failure:"

    def __init__(self, url: str | None = None):
        self._session = session_factory(url)

    def put(self, run_key: str, name: str, value: Any) -> None:
        """Write ``value`` (a JSON object or a pydantic model) as the run's ``name``, replacing an older one.

        :raises ValueError: when ``value`` is not a JSON object (dict) or a model.
        """
        if hasattr(value, "model_dump"):
            value = value.model_dump(mode="json")
        if not isinstance(value, dict):
            raise ValueError(f"run state {name!r} of {run_key}: a JSON object is kept, not {type(value).__name__}")
        from sqlalchemy.exc import IntegrityError

        from autodl.hosts import this_host

        doc = json.loads(json.dumps(value, default=str))
        for attempt in (1, 2):  # two writers racing to create the same row: the loser updates the winner's
            with self._session() as s:
                row = s.get(RunStateRow, (run_key, name))
                if row is None:
                    row = RunStateRow(run_key=run_key, name=name)
                    s.add(row)
                row.value, row.written_at, row.written_on = doc, datetime.now(timezone.utc), this_host()
                try:
                    s.commit()
                    return
                except IntegrityError:
                    s.rollback()
                    if attempt == 2:
                        raise

    def get(self, run_key: str, name: str) -> dict[str, Any] | None:
        """The run's ``name``, or None when no step wrote it."""
        with self._session() as s:
            row = s.get(RunStateRow, (run_key, name))
            return dict(row.value) if row is not None else None

    def names(self, run_key: str) -> dict[str, str | None]:
        """Every name written for the run, with the host that wrote it (oldest first)."""
        with self._session() as s:
            rows = s.execute(select(RunStateRow.name, RunStateRow.written_on).where(RunStateRow.run_key == run_key)
                             .order_by(RunStateRow.written_at)).all()
            return {name: host for name, host in rows}

    def written(self, name: str) -> dict[str, datetime]:
        """``{run key: when}`` of every run for which some step wrote ``name`` (e.g. :data:`PROFILE`: every
        profiled run, with when it was last profiled), whichever host wrote it; times timezone-aware UTC."""
        with self._session() as s:
            rows = s.execute(select(RunStateRow.run_key, RunStateRow.written_at).where(RunStateRow.name == name)).all()
        return {key: at if at.tzinfo else at.replace(tzinfo=timezone.utc) for key, at in rows}

    def note_failure(self, run_key: str, step: str, message: str) -> None:
        """Remember why ``step`` failed (``failure:<step>``), for the run's record."""
        self.put(run_key, self.FAILURE_PREFIX + step, {"step": step, "message": message})

    def failures(self, run_key: str) -> dict[str, str]:
        """``{step: message}`` of the run's failed steps, in the order they failed."""
        with self._session() as s:
            rows = s.execute(select(RunStateRow.value).where(RunStateRow.run_key == run_key,
                                                             RunStateRow.name.startswith(self.FAILURE_PREFIX))
                             .order_by(RunStateRow.written_at)).scalars()
            return {row["step"]: row["message"] for row in rows}

    def forget_attempt(self, run_key: str) -> int:
        """Delete what one training left of the run (its metrics, report and the steps' failures), when a new
        training of the same run key starts (a clear and re-run); returns how many rows went."""
        with self._session() as s:
            gone = s.execute(delete(RunStateRow).where(
                RunStateRow.run_key == run_key,
                (RunStateRow.name.in_([self.METRICS, self.REPORT, self.REQUEUED])
                 | RunStateRow.name.startswith(self.FAILURE_PREFIX)),
            )).rowcount
            s.commit()
            return gone or 0

    def forget(self, run_key: str) -> int:
        """Delete every fact of the run (a run key used again from scratch); returns how many rows went."""
        with self._session() as s:
            gone = s.execute(delete(RunStateRow).where(RunStateRow.run_key == run_key)).rowcount
            s.commit()
            return gone or 0
