"""What a store failure means: a fault worth retrying, a store that cannot be used, or a race a caller handles.

SQLAlchemy's ``handle_error`` hook turns the database's own errors into autodl's (:class:`StoreUnavailable`
to retry, :class:`StoreError` to stop with a message naming the store and the fix), so no command ends in a
raw ``OperationalError`` (issue 23). Lost races (PostgreSQL's serialization failure and deadlock) and
integrity errors pass through unchanged: the ledger turns them into "keep waiting".
"""

from __future__ import annotations

import os
import random
import time
from collections.abc import Callable
from typing import TypeVar

from sqlalchemy import event
from sqlalchemy.engine import Engine

from autodl.errors import StoreError, StoreUnavailable
from autodl.redact import redact_text, redact_url

T = TypeVar("T")

CONNECT_TIMEOUT_S = 10
"""Seconds libpq waits to open a PostgreSQL connection (``connect_timeout``), handshake included, so a
server that accepts and never answers fails the command instead of hanging it. libpq's own default is
no limit; 10 s is what the cncf provider's and Airflow's docs use in their examples of the option."""

STATEMENT_TIMEOUT_MS = 60_000
"""PostgreSQL ``statement_timeout`` for autodl's sessions, ms: no statement of autodl's (a booking under
row locks included) takes more than a second on a healthy store; a minute means the store is stuck."""

RETRY_FIRST_S = 0.25
"""First back-off between retries of a transient fault, doubled each time (with jitter) up to the budget."""

_LOST_RACE = {"40P01", "40001"}
"""SQLSTATEs of a lost race (deadlock_detected, serialization_failure): the caller's business, not a fault."""

_TRANSIENT_SQLSTATE_CLASSES = ("08", "57P")
"""SQLSTATE classes of connection exceptions (08xxx) and operator intervention (57Pxx: admin shutdown,
crash shutdown, cannot connect now): the server went away or is restarting (PostgreSQL appendix A)."""

_SQLITE_FATAL = {
    "database or disk is full": "the disk holding it is full; free space there",
    "disk i/o error": "its disk failed a read or write; check the disk",
    "attempt to write a readonly database": "it is read-only for this user; fix its permissions",
    "unable to open database file": "its folder is missing or not writable; fix AUTODL_STORE_URL or the folder",
}


def classify(exc: BaseException, is_disconnect: bool = False) -> str | None:
    """``"transient"``, ``"fatal"`` (with the fix in :func:`why`) or None (the caller's own business)."""
    code = getattr(exc, "pgcode", None)
    if code in _LOST_RACE:
        return None
    if is_disconnect or (code and code.startswith(_TRANSIENT_SQLSTATE_CLASSES)):
        return "transient"
    name = type(exc).__name__
    if name == "OperationalError" and code is None and type(exc).__module__.startswith("psycopg"):
        return "transient"   # refused, reset or closed before any SQLSTATE: the server is not there now
    if code in ("53100", "57014"):   # disk_full, query_canceled (statement_timeout)
        return "fatal"
    text = str(exc).lower()
    if any(key in text for key in _SQLITE_FATAL):
        return "fatal"
    return None


def why(exc: BaseException) -> str:
    """What is wrong with the store and what to do, from the database's own error."""
    text = str(exc).lower()
    for key, fix in _SQLITE_FATAL.items():
        if key in text:
            return fix
    code = getattr(exc, "pgcode", None)
    if code == "53100":
        return "the PostgreSQL server's disk is full; free space there"
    if code == "57014":
        return f"a statement ran past {STATEMENT_TIMEOUT_MS / 1000:g} s (statement_timeout); check the server's load and locks"
    return "the server did not answer; check that it runs and is reachable"


def _on_error(context) -> None:
    exc = context.original_exception
    kind = classify(exc, bool(getattr(context, "is_disconnect", False)))
    if kind is None:
        return
    url = redact_url(str(context.engine.url)) if context.engine is not None else "?"
    first = redact_text(str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__)
    cls = StoreUnavailable if kind == "transient" else StoreError
    raise cls(f"autodl's store {url} (AUTODL_STORE_URL): {first}; {why(exc)}. Nothing was lost that was "
              "recorded before; a lease still held can be freed with `autodl leases --release RUN_KEY` once "
              "the store answers.")


def _postgres_session(dbapi_conn, _record) -> None:
    cur = dbapi_conn.cursor()
    cur.execute(f"SET statement_timeout = {int(STATEMENT_TIMEOUT_MS)}")
    cur.close()
    dbapi_conn.commit()


def connect_args(url: str) -> dict:
    """Extra DBAPI connect arguments for ``url``: libpq's ``connect_timeout`` for PostgreSQL (unless the URL sets it)."""
    if url.startswith("postgresql") and "connect_timeout" not in url:
        return {"connect_timeout": CONNECT_TIMEOUT_S}
    return {}


def watch(engine: Engine) -> None:
    """Turn ``engine``'s database errors into autodl's and, on PostgreSQL, bound every statement."""
    event.listen(engine, "handle_error", _on_error)
    if engine.dialect.name == "postgresql":
        event.listen(engine, "connect", _postgres_session)


def watch_sqlite_file(engine: Engine) -> None:
    """Fail every later session loudly when the SQLite file is deleted or replaced under this process.

    SQLite keeps writing to an unlinked file: a run would report success into a store nobody reads and
    another process, with a new file, would book the same devices (issue 23).
    """
    path = engine.url.database
    if not path or path == ":memory:":
        return
    try:
        first = os.stat(path)
    except OSError:
        return
    identity = (first.st_dev, first.st_ino)

    def _check(_dbapi_conn, _record, _proxy) -> None:
        try:
            now = os.stat(path)
            same = (now.st_dev, now.st_ino) == identity
        except OSError:
            same = False
        if not same:
            raise StoreError(
                f"autodl's store {path} (AUTODL_STORE_URL) was deleted or replaced while this process used it: "
                "what it wrote since is lost and its leases are unknown to the new file. Stop the runs that use "
                "it, restore the file (or point AUTODL_STORE_URL at the real store) and re-run.")

    event.listen(engine, "checkout", _check)


def retrying(what: str, fn: Callable[[], T], budget_s: float, *, sleep: Callable[[float], None] = time.sleep) -> T:
    """``fn()``, retried with exponential back-off (and jitter) while the store is unavailable, for at
    most ``budget_s`` seconds; then the last :class:`StoreUnavailable`, saying for how long it was tried.

    :param what: what is being done, for the message (``"heartbeat of run R"``).
    """
    deadline = time.monotonic() + max(0.0, budget_s)
    delay = RETRY_FIRST_S
    tries = 0
    while True:
        tries += 1
        try:
            return fn()
        except StoreUnavailable as exc:
            left = deadline - time.monotonic()
            if left <= 0:
                raise StoreUnavailable(f"{what}: tried {tries} time(s) over {budget_s:g} s: {exc}") from None
            sleep(min(left, delay * (0.5 + random.random())))
            delay *= 2


__all__ = ["CONNECT_TIMEOUT_S", "STATEMENT_TIMEOUT_MS", "classify", "connect_args", "retrying", "watch",
           "watch_sqlite_file", "why"]
