"""The lease ledger and run records on a real PostgreSQL server (the production store)."""

from __future__ import annotations

import multiprocessing as mp
import os
import uuid

import pytest
from sqlalchemy import create_engine, text

from autodl.errors import LeaseError
from autodl.ledger import Ledger
from autodl.records import RecordStore
from autodl.types import RunRecord
from tests.integration.conftest import require_service

pytestmark = pytest.mark.integration


@pytest.fixture
def pg_url():
    url = os.environ.get("AUTODL_TEST_PG_URL")
    require_service(bool(url), "PostgreSQL", "set AUTODL_TEST_PG_URL (.ci/postgres.sh starts one on 127.0.0.1)")
    schema = f"t_{uuid.uuid4().hex[:8]}"
    engine = create_engine(url)
    with engine.begin() as conn:
        conn.execute(text(f"CREATE SCHEMA {schema}"))
    yield f"{url}?options=-csearch_path%3D{schema}"
    with engine.begin() as conn:
        conn.execute(text(f"DROP SCHEMA {schema} CASCADE"))
    engine.dispose()


def _race(url: str, run_key: str, queue) -> None:
    try:
        Ledger(url).book(run_key, ["GPU-0", "GPU-1"])
        queue.put(run_key)
    except LeaseError:
        queue.put(None)


def test_ledger_on_postgres(pg_url):
    ledger = Ledger(pg_url)
    lease = ledger.book("run-a", ["GPU-0"])
    with pytest.raises(LeaseError):
        ledger.book("run-b", ["GPU-1", "GPU-0"])
    assert ledger.leased_device_ids() == {"GPU-0"}
    assert ledger.release("run-a").lease_id == lease.lease_id
    assert ledger.release("run-a") is None


def test_racing_processes_on_postgres(pg_url):
    Ledger(pg_url)
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    procs = [ctx.Process(target=_race, args=(pg_url, f"run-{i}", queue)) for i in range(6)]
    for p in procs:
        p.start()
    for p in procs:
        p.join()
    winners = [r for r in (queue.get() for _ in procs) if r]
    assert len(winners) == 1
    assert Ledger(pg_url).holders() == {"GPU-0": winners[0], "GPU-1": winners[0]}


def test_records_on_postgres(pg_url):
    store = RecordStore(pg_url)
    store.write(RunRecord(run_key="k", script="/s.py", outcome="succeeded", declared_pool=False,
                          estimated_peak_bytes=5 * 2**30, actual_peak_bytes=4 * 2**30))
    got = store.get("k")
    assert got.outcome == "succeeded" and got.actual_peak_bytes == 4 * 2**30
