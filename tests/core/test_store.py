"""autodl's store schema comes from Alembic migrations: applied once, safely when many processes race a
fresh store (issue 9: "table autodl_leases already exists" for 71 of 320 racers on SQLite), adopting a
store made before migrations, and matching the tables the code declares."""

from __future__ import annotations

import multiprocessing as mp
import sqlite3
import traceback

import pytest
from sqlalchemy import create_engine, inspect

from autodl.errors import LeaseError
from autodl.ledger import Ledger
from autodl.store import VERSION_TABLE, Base, get_engine, head_revision

RACERS = 40


def _racer(url: str, i: int, barrier, put) -> None:
    try:
        barrier.wait()
        Ledger(url).book(f"run-{i}", [f"GPU-{i % 4}"])
        put(("won", i))
    except LeaseError:
        put(("lost", i))
    except BaseException:  # noqa: BLE001 - anything else is what the test looks for
        put(("error", traceback.format_exc()))


def race_processes(racer, url: str, n: int) -> list:
    """``n`` processes (forked after the imports, each with its own connection: the store forgets the parent's),
    started together at a barrier, each running ``racer(url, i, barrier, put)``; what they ``put``, one item each."""
    ctx = mp.get_context("fork")
    barrier, results = ctx.Barrier(n), ctx.Queue()
    procs = [ctx.Process(target=racer, args=(url, i, barrier, results.put)) for i in range(n)]
    for p in procs:
        p.start()
    out = [results.get(timeout=600) for _ in procs]
    for p in procs:
        p.join()
    return out


def race_fresh_store(url: str, n: int = RACERS) -> list[tuple[str, object]]:
    """``n`` processes each book one of four devices on a store nobody has used yet."""
    return race_processes(_racer, url, n)


def test_racers_on_a_fresh_sqlite_store_all_agree(tmp_path):
    url = f"sqlite:///{tmp_path / 'fresh.db'}"
    results = race_fresh_store(url)
    errors = [r for kind, r in results if kind == "error"]
    assert errors == [], errors[0]
    assert sorted(kind for kind, _ in results).count("won") == 4
    assert len(Ledger(url).leases()) == 4
    with sqlite3.connect(tmp_path / "fresh.db") as db:
        assert db.execute(f"SELECT version_num FROM {VERSION_TABLE}").fetchall() == [(head_revision(),)]


def test_a_store_made_before_migrations_is_adopted(tmp_path):
    """The old code created the tables with create_all and no version table; its leases and records stay."""
    path = tmp_path / "old.db"
    with sqlite3.connect(path) as db:
        db.executescript("""
            CREATE TABLE autodl_leases (lease_id VARCHAR(64) NOT NULL PRIMARY KEY, run_key VARCHAR(512) NOT NULL,
                host VARCHAR(255) NOT NULL, model VARCHAR(128), created_at DATETIME NOT NULL);
            CREATE UNIQUE INDEX ix_autodl_leases_run_key ON autodl_leases (run_key);
            CREATE TABLE autodl_lease_devices (device_id VARCHAR(255) NOT NULL PRIMARY KEY,
                lease_id VARCHAR(64) NOT NULL REFERENCES autodl_leases (lease_id) ON DELETE CASCADE, position INTEGER NOT NULL);
            CREATE TABLE autodl_runs (run_key VARCHAR(512) NOT NULL PRIMARY KEY, dag_id VARCHAR(250), run_id VARCHAR(250),
                outcome VARCHAR(32) NOT NULL, device_model VARCHAR(128), estimated_peak_bytes BIGINT,
                actual_peak_bytes BIGINT, recorded_at DATETIME NOT NULL, document JSON NOT NULL, error TEXT);
            INSERT INTO autodl_leases VALUES ('old1', 'old-run', 'box', 'A100-SXM4-40GB', '2026-01-01 00:00:00.000000');
            INSERT INTO autodl_lease_devices VALUES ('GPU-0', 'old1', 0);
        """)
    url = f"sqlite:///{path}"
    ledger = Ledger(url)
    lease = ledger.get("old-run")
    assert lease.device_ids == ["GPU-0"] and lease.expires_at is None and lease.owner.user is None
    assert ledger.expired() == []  # nobody heartbeats an old lease: it is never reaped automatically
    tables = set(inspect(get_engine(url)).get_table_names())
    assert {"autodl_queue", "autodl_bandit_arms", VERSION_TABLE} <= tables


def test_the_declared_tables_match_the_migrations(tmp_path):
    """A table or column added to the code without a migration would be missing from every store: compare
    the migrated schema with what the code declares (Alembic's autogenerate comparison)."""
    from alembic.autogenerate import compare_metadata
    from alembic.runtime.migration import MigrationContext

    url = f"sqlite:///{tmp_path / 'check.db'}"
    get_engine(url)
    with create_engine(url).connect() as conn:
        diff = compare_metadata(MigrationContext.configure(conn, opts={"compare_type": True}), Base.metadata)
    diff = [d for d in diff if not (isinstance(d, tuple) and d[0] == "remove_table" and d[1].name == VERSION_TABLE)]
    assert diff == [], f"write a migration in plugins/autodl/migrations/versions/ for: {diff}"


@pytest.mark.parametrize("url", ["sqlite:///relative/../x.db"])
def test_migration_errors_name_the_store(url, tmp_path, monkeypatch):
    from autodl.errors import StoreError

    monkeypatch.chdir(tmp_path)
    with pytest.raises(StoreError, match="AUTODL_STORE_URL"):
        get_engine(url)
