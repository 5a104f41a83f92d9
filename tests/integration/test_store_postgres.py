"""The lease ledger and run records on a real PostgreSQL server (the production store)."""

from __future__ import annotations

import multiprocessing as mp
import os
import time
import uuid

import pytest
from sqlalchemy import create_engine, text

from autodl.errors import LeaseError
from autodl.ledger import Ledger
from autodl.records import RecordStore
from autodl.store import head_revision
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


def test_racers_on_a_fresh_postgres_store_all_agree(pg_url):
    """Issue 9: on a store's first use concurrent runs failed creating the tables (30 racers on PostgreSQL).
    40 processes race a schema nobody has used: one migrates under the advisory lock, all book or lose cleanly."""
    from tests.core.test_store import RACERS, race_fresh_store

    results = race_fresh_store(pg_url, RACERS)
    errors = [r for kind, r in results if kind == "error"]
    assert errors == [], errors[0]
    assert [kind for kind, _ in results].count("won") == 4
    engine = create_engine(pg_url)
    with engine.connect() as conn:
        # exactly one row, at the migrations' head (one racer migrated, nobody stamped twice)
        assert conn.execute(text("SELECT version_num FROM autodl_alembic_version")).scalars().all() == [head_revision()]
    engine.dispose()


def _gang_racer(url: str, i: int, rounds: int, barrier, results) -> None:
    import random
    import traceback

    rng = random.Random(i)
    ledger = Ledger(url)
    won = lost = 0
    try:
        barrier.wait()
        for r in range(rounds):
            devices = rng.sample(["GPU-0", "GPU-1", "GPU-2", "GPU-3"], 3)  # overlapping gangs, any order
            try:
                ledger.book(f"gang-{i}-{r}", devices)
                won += 1
                ledger.release(f"gang-{i}-{r}")
            except LeaseError:
                lost += 1
        results.put(("ok", won, lost))
    except BaseException:  # noqa: BLE001 - a DeadlockDetected would land here
        results.put(("error", traceback.format_exc(), 0))


def test_gang_bookings_never_deadlock_on_postgres(pg_url):
    """Issue 9: gang bookings deadlocked on PostgreSQL (DeadlockDetected inserting device rows in different
    orders). 16 processes book 3-of-4-device gangs in random orders for 15 rounds each."""
    Ledger(pg_url)
    engine = create_engine(pg_url)
    deadlocks_sql = text("SELECT deadlocks FROM pg_stat_database WHERE datname = current_database()")

    def deadlocks() -> int:
        with engine.connect() as conn:
            conn.execute(text("SELECT pg_stat_clear_snapshot()"))
            return int(conn.execute(deadlocks_sql).scalar_one())

    before = deadlocks()
    ctx = mp.get_context("fork")
    n, rounds = 16, 15
    barrier, results = ctx.Barrier(n), ctx.Queue()
    procs = [ctx.Process(target=_gang_racer, args=(pg_url, i, rounds, barrier, results)) for i in range(n)]
    for p in procs:
        p.start()
    out = [results.get(timeout=600) for _ in procs]
    for p in procs:
        p.join()
    errors = [o[1] for o in out if o[0] == "error"]
    assert errors == [], errors[0]
    assert sum(o[1] for o in out) + sum(o[2] for o in out) == n * rounds
    assert sum(o[1] for o in out) > 0 and Ledger(pg_url).leases() == []
    time.sleep(1.0)  # the racers' statistics reach the shared counters when their backends flush them
    assert deadlocks() - before == 0  # a lost race was never a deadlock the server had to break
    engine.dispose()


def test_attempts_and_calibration_clear_on_postgres(pg_url):
    """The JSON documents are rewritten in place on PostgreSQL too: a re-run's record keeps the earlier attempt,
    and ``autodl calibration --clear`` marks the OOM reports (the records stay)."""
    from autodl.records import clear_calibration, find_calibration

    store = RecordStore(pg_url)
    oom = {"wanted_bytes": 64 << 30, "requested_bytes": 60 << 30, "batch_size": 32, "memory": "device",
           "calibration": {"script_sha256": None, "config_sha256": None, "memory": "device", "cleared_at": None}}
    store.write(RunRecord(run_key="k", script="/x.py", outcome="failed", declared_pool=False, lease_id="L1",
                          error="out of memory", oom=oom))
    store.write(RunRecord(run_key="k", script="/x.py", outcome="failed", declared_pool=False, lease_id="L2",
                          error="out of memory again", oom=oom))
    rec = store.get("k")
    assert rec.error == "out of memory again" and [a["lease_id"] for a in rec.attempts] == ["L1"]
    assert find_calibration("/x.py", 32, url=pg_url).floor_bytes == 64 << 30
    assert clear_calibration("/x.py", url=pg_url) == ["k"]
    assert find_calibration("/x.py", 32, url=pg_url) is None
    assert RecordStore(pg_url).get("k").oom["calibration"]["cleared_at"]


def test_a_shared_runs_record_and_the_interference_read_on_postgres(pg_url):
    """Issue 24: the sharing a record carries survives PostgreSQL's JSON column, and may_pack reads it there."""
    from autodl.interference import may_pack
    from autodl.records import with_sharing
    from autodl.types import Lease

    store = RecordStore(pg_url)

    def run(key, model, step_s, co=None):
        record = RunRecord(run_key=key, script=f"/{model}.py", outcome="succeeded", declared_pool=False,
                           device_model="H100-SXM5-80GB", profile={"model_name": model},
                           metrics={"step_time_s": step_s})
        lease = Lease(lease_id=f"L-{key}", run_key=key, device_ids=["GPU-0"],
                      **({"sharing": "shared", "reserved_bytes": 30 << 30, "co_tenants": [co]} if co else {}))
        store.write(with_sharing(record, lease))

    run("bert-solo", "bert", 0.10)
    run("gpt2-solo", "gpt2", 0.20)
    run("bert-packed", "bert", 0.10 / 0.7, co="gpt2-packed")
    run("gpt2-packed", "gpt2", 0.20 / 0.7, co="bert-packed")
    back = store.get("bert-packed")
    assert back.sharing == "shared" and back.co_tenants == ["gpt2-packed"] and back.device_memory_cap_bytes == 30 << 30
    assert not may_pack("bert", "gpt2", "H100-SXM5-80GB", url=pg_url), "measured 0.7 of solo: barred"
