"""Lease ledger: atomic booking, one live lease per device, idempotent book/release, across processes."""

from __future__ import annotations

import multiprocessing as mp

import pytest

from autodl.errors import LeaseError
from autodl.ledger import Ledger


def test_book_and_release(autodl_home):
    ledger = Ledger()
    lease = ledger.book("run-a", ["GPU-0", "GPU-1"], host="h", model="A100-SXM4-40GB")
    assert lease.device_ids == ["GPU-0", "GPU-1"]
    assert ledger.leased_device_ids() == {"GPU-0", "GPU-1"}
    assert ledger.holders() == {"GPU-0": "run-a", "GPU-1": "run-a"}
    freed = ledger.release("run-a")
    assert freed.lease_id == lease.lease_id
    assert ledger.leased_device_ids() == frozenset()
    assert ledger.release("run-a") is None  # idempotent


def test_book_is_idempotent_per_run(autodl_home):
    ledger = Ledger()
    first = ledger.book("run-a", ["GPU-0"])
    again = ledger.book("run-a", ["GPU-1"])
    assert again.lease_id == first.lease_id and again.device_ids == ["GPU-0"]
    assert ledger.leased_device_ids() == {"GPU-0"}


def test_conflicting_booking_books_nothing(autodl_home):
    ledger = Ledger()
    ledger.book("run-a", ["GPU-1"])
    with pytest.raises(LeaseError, match="GPU-1.*run-a"):
        ledger.book("run-b", ["GPU-0", "GPU-1"])
    assert ledger.get("run-b") is None
    assert ledger.leased_device_ids() == {"GPU-1"}  # GPU-0 was not left booked


def test_empty_booking_rejected(autodl_home):
    with pytest.raises(LeaseError, match="at least one device"):
        Ledger().book("run-a", [])


def _race(url: str, run_key: str, queue) -> None:
    import os

    os.environ["AUTODL_STORE_URL"] = url
    try:
        Ledger(url).book(run_key, ["GPU-0"])
        queue.put(run_key)
    except LeaseError:
        queue.put(None)


def test_racing_processes_one_winner(autodl_home):
    url = f"sqlite:///{autodl_home / 'race.db'}"
    Ledger(url)  # create tables
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    procs = [ctx.Process(target=_race, args=(url, f"run-{i}", queue)) for i in range(6)]
    for p in procs:
        p.start()
    for p in procs:
        p.join()
    results = [queue.get() for _ in procs]
    winners = [r for r in results if r]
    assert len(winners) == 1
    assert Ledger(url).holders() == {"GPU-0": winners[0]}


# ------------------------------------------------------------------------------ owners, TTL, reaping
def test_a_lease_records_its_owner_and_ttl(autodl_home, monkeypatch):
    from autodl.types import LeaseOwner

    monkeypatch.setenv("AUTODL_LEASE_TTL", "42")
    lease = Ledger().book("run-a", ["GPU-0"], owner=LeaseOwner(dag_id="d", run_id="r", user="alice"), launcher="docker",
                          placement={"model": "A100-SXM4-40GB", "score": 1.0})
    got = Ledger().get("run-a")
    assert got.owner == LeaseOwner(dag_id="d", run_id="r", user="alice") and got.owner.describe() == "user alice, DAG d, run r"
    assert lease.ttl_s == 42 and (got.expires_at - got.heartbeat_at).total_seconds() == 42
    assert got.launcher == "docker" and got.placement["model"] == "A100-SXM4-40GB"
    assert [le.run_key for le in Ledger().leases(owner_dag_id="d", owner_run_id="r")] == ["run-a"]
    assert Ledger().leases(owner_dag_id="d", owner_run_id="other") == []


@pytest.mark.parametrize("raw", ["0", "-5", "soon", "nan", "inf"])
def test_a_bad_lease_ttl_is_a_clear_error(autodl_home, monkeypatch, raw):
    from autodl.errors import StoreError

    monkeypatch.setenv("AUTODL_LEASE_TTL", raw)
    with pytest.raises(StoreError, match="AUTODL_LEASE_TTL=.*positive number of seconds"):
        Ledger().book("run-a", ["GPU-0"])


def test_heartbeat_moves_the_expiry_and_a_dead_lease_stays_dead(autodl_home):
    from datetime import timedelta

    from autodl.errors import LeaseLost
    from autodl.types import utcnow

    ledger = Ledger()
    lease = ledger.book("run-a", ["GPU-0"], ttl_s=10)
    later = utcnow() + timedelta(seconds=8)
    beat = ledger.heartbeat("run-a", lease.lease_id, now=later)
    assert beat.expires_at == later + timedelta(seconds=10)
    assert ledger.expired(later + timedelta(seconds=5)) == []
    too_late = later + timedelta(seconds=11)
    assert [le.run_key for le in ledger.expired(too_late)] == ["run-a"]
    with pytest.raises(LeaseLost, match="is dead: it expired at"):
        ledger.heartbeat("run-a", now=too_late)  # expired is expired, even before a reaper came
    with pytest.raises(LeaseLost, match="is gone"):
        ledger.heartbeat("run-a", "another-lease-id")


def test_one_reaper_claims_an_expired_lease(autodl_home):
    from datetime import timedelta

    from autodl.errors import LeaseLost
    from autodl.ledger import REAP_CLAIM_S
    from autodl.types import utcnow

    ledger = Ledger()
    lease = ledger.book("run-a", ["GPU-0"], ttl_s=1)
    assert ledger.claim_expired(lease.lease_id, "r1") is False  # not expired yet
    t = utcnow() + timedelta(seconds=2)
    assert ledger.claim_expired(lease.lease_id, "r1", now=t) is True
    assert ledger.claim_expired(lease.lease_id, "r2", now=t) is False
    with pytest.raises(LeaseLost, match=r"a reaper \(r1\) is reclaiming it"):
        ledger.heartbeat("run-a", now=t)
    # the first reaper died while stopping the training: its claim lapses
    assert ledger.claim_expired(lease.lease_id, "r2", now=t + timedelta(seconds=REAP_CLAIM_S + 1)) is True
    assert ledger.release("run-a", "not-this-lease") is None and ledger.release("run-a", lease.lease_id) is not None


def test_gang_rows_are_inserted_in_one_sorted_order(autodl_home):
    """Gang bookings deadlocked on PostgreSQL (issue 9: DeadlockDetected inserting device rows in different
    orders): rows go in sorted device order, the placement's order is kept as the position."""
    from sqlalchemy import event

    from autodl.store import get_engine

    inserted: list[list[str]] = []

    def spy(_conn, _cursor, statement, parameters, _context, executemany):
        if statement.startswith("INSERT INTO autodl_lease_devices"):
            rows = parameters if executemany else [parameters]
            inserted.append([r[0] if isinstance(r, (list, tuple)) else r["device_id"] for r in rows])

    engine = get_engine()
    event.listen(engine, "before_cursor_execute", spy)
    try:
        lease = Ledger().book("gang", ["GPU-3", "GPU-1", "GPU-2"])
    finally:
        event.remove(engine, "before_cursor_execute", spy)
    assert inserted == [["GPU-1", "GPU-2", "GPU-3"]]
    assert lease.device_ids == ["GPU-3", "GPU-1", "GPU-2"]  # the placement's order
