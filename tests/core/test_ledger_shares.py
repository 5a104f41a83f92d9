"""Fractional leases in the ledger (docs/reference/fractional-leases.md): shared bookings on one device, the
guarded increment as the atomic test, release and co-tenants, migration 0007, and racers on SQLite and the
real PostgreSQL that must never over-commit a device."""

from __future__ import annotations

import random
import threading
import traceback

import pytest
from sqlalchemy import create_engine, text

from autodl.errors import LeaseError
from autodl.ledger import Ledger
from autodl.store import _alembic_config
from tests.integration.test_store_postgres import pg_url  # noqa: F401 - the schema-per-test fixture

GB = 10**9
CAP = 68 * GB  # 0.85 x an 80 GB device


def test_two_shared_leases_hold_one_device_and_name_each_other(store_url):
    ledger = Ledger(store_url)
    a = ledger.book("run-a", ["GPU-0"], sharing="shared", reserved_bytes=20 * GB, capacity_bytes=CAP)
    b = ledger.book("run-b", ["GPU-0"], sharing="shared", reserved_bytes=30 * GB, capacity_bytes=CAP)
    assert (a.sharing, a.reserved_bytes, b.reserved_bytes) == ("shared", 20 * GB, 30 * GB)
    assert ledger.get("run-a").co_tenants == ["run-b"] and ledger.get("run-b").co_tenants == ["run-a"]
    share = ledger.shares()["GPU-0"]
    assert (share.leases, share.reserved_bytes, share.exclusive, share.capacity_bytes) == (2, 50 * GB, False, CAP)
    assert ledger.leased_device_ids() == {"GPU-0"} and ledger.holders() == {"GPU-0": "run-a, run-b"}
    ledger.release("run-a")
    assert ledger.shares()["GPU-0"].reserved_bytes == 30 * GB and ledger.shares()["GPU-0"].leases == 1
    assert ledger.get("run-b").co_tenants == ["run-a"]  # whom it shared with while it lived stays
    ledger.release("run-b")
    assert ledger.shares() == {} and ledger.leased_device_ids() == frozenset()


def test_a_third_lease_or_too_many_bytes_finds_no_room(store_url):
    ledger = Ledger(store_url)
    ledger.book("run-a", ["GPU-0"], sharing="shared", reserved_bytes=40 * GB, capacity_bytes=CAP)
    with pytest.raises(LeaseError, match="GPU-0 already leased by run-a .no room"):
        ledger.book("run-b", ["GPU-0"], sharing="shared", reserved_bytes=29 * GB, capacity_bytes=CAP)
    assert ledger.get("run-b") is None and ledger.shares()["GPU-0"].reserved_bytes == 40 * GB
    ledger.book("run-b", ["GPU-0"], sharing="shared", reserved_bytes=28 * GB, capacity_bytes=CAP)
    with pytest.raises(LeaseError, match="no room"):
        ledger.book("run-c", ["GPU-0"], sharing="shared", reserved_bytes=1, capacity_bytes=CAP)
    assert ledger.shares()["GPU-0"].leases == 2


def test_exclusive_and_shared_never_meet_on_a_device(store_url):
    ledger = Ledger(store_url)
    ledger.book("whole", ["GPU-0"])
    with pytest.raises(LeaseError, match="GPU-0 already leased by whole"):
        ledger.book("packed", ["GPU-0"], sharing="shared", reserved_bytes=GB, capacity_bytes=CAP)
    ledger.book("packed", ["GPU-1"], sharing="shared", reserved_bytes=GB, capacity_bytes=CAP)
    with pytest.raises(LeaseError, match="GPU-1 already leased by packed"):
        ledger.book("gang", ["GPU-2", "GPU-1"])
    assert ledger.get("gang") is None and "GPU-2" not in ledger.shares()  # the gang left nothing booked
    shares = ledger.shares()
    assert shares["GPU-0"].exclusive and shares["GPU-0"].leases == 1 and not shares["GPU-1"].exclusive


def test_a_shared_booking_is_idempotent_per_run_and_of_one_known_device(store_url):
    ledger = Ledger(store_url)
    first = ledger.book("run-a", ["GPU-0"], sharing="shared", reserved_bytes=GB, capacity_bytes=CAP)
    again = ledger.book("run-a", ["GPU-0"], sharing="shared", reserved_bytes=GB, capacity_bytes=CAP)
    assert again.lease_id == first.lease_id and ledger.shares()["GPU-0"].leases == 1
    with pytest.raises(LeaseError, match="a shared lease is of one device"):
        ledger.book("gang", ["GPU-1", "GPU-2"], sharing="shared", reserved_bytes=GB, capacity_bytes=CAP)
    with pytest.raises(LeaseError, match="estimate is unknown books exclusively"):
        ledger.book("unknown", ["GPU-1"], sharing="shared", reserved_bytes=None, capacity_bytes=CAP)
    with pytest.raises(LeaseError, match="sharing 'packed' is not one of exclusive, shared"):
        ledger.book("typo", ["GPU-1"], sharing="packed")


def test_an_exclusive_booking_keeps_todays_lease(store_url):
    ledger = Ledger(store_url)
    lease = ledger.book("run-a", ["GPU-1", "GPU-0"])
    assert (lease.sharing, lease.reserved_bytes, lease.co_tenants, lease.device_ids) == ("exclusive", None, [],
                                                                                         ["GPU-1", "GPU-0"])
    assert {d: (s.exclusive, s.leases) for d, s in ledger.shares().items()} == {"GPU-0": (True, 1), "GPU-1": (True, 1)}
    ledger.release("run-a")
    assert ledger.shares() == {}


def test_reaping_an_expired_shared_lease_frees_only_its_share(store_url):
    """The reaper's path (claim, then release): the expired tenant's bytes come off, its neighbour keeps its own."""
    from datetime import timedelta

    from autodl.types import utcnow

    ledger = Ledger(store_url)
    dead = ledger.book("dead", ["GPU-0"], sharing="shared", reserved_bytes=20 * GB, capacity_bytes=CAP, ttl_s=1)
    ledger.book("alive", ["GPU-0"], sharing="shared", reserved_bytes=30 * GB, capacity_bytes=CAP, ttl_s=10**6)
    later = utcnow() + timedelta(seconds=60)
    assert [le.run_key for le in ledger.expired(later)] == ["dead"]
    assert ledger.claim_expired(dead.lease_id, "reaper-1", now=later)
    assert ledger.release("dead", dead.lease_id) is not None and ledger.release("dead", dead.lease_id) is None
    share = ledger.shares()["GPU-0"]
    assert (share.leases, share.reserved_bytes) == (1, 30 * GB)


def test_migration_0007_makes_every_existing_lease_exclusive(store_url):
    """A store at 0006 with a lease on GPU-0: after 0007 the lease is exclusive and GPU-0 is held whole."""
    from alembic import command

    engine = create_engine(store_url)
    with engine.connect() as conn:
        command.upgrade(_alembic_config(conn), "0006")
        conn.commit()
        conn.execute(text("INSERT INTO autodl_leases (lease_id, run_key, host, created_at) "
                          "VALUES ('old1', 'old-run', 'box', '2026-01-01 00:00:00')"))
        conn.execute(text("INSERT INTO autodl_lease_devices VALUES ('GPU-0', 'old1', 0)"))
        conn.commit()
    engine.dispose()
    ledger = Ledger(store_url)   # migrates to the head
    lease = ledger.get("old-run")
    assert (lease.sharing, lease.device_ids, lease.co_tenants) == ("exclusive", ["GPU-0"], [])
    assert ledger.shares()["GPU-0"].exclusive
    with pytest.raises(LeaseError, match="GPU-0 already leased by old-run"):
        ledger.book("new", ["GPU-0"], sharing="shared", reserved_bytes=GB, capacity_bytes=CAP)
    ledger.release("old-run")
    assert ledger.shares() == {}


# ------------------------------------------------------------------------------------------------ racers
DEVICES = ["GPU-0", "GPU-1", "GPU-2", "GPU-3"]
RACERS = 64
ROUNDS = 4


def _racer(url: str, i: int, barrier, put) -> None:
    """``ROUNDS`` bookings of one of four devices; about half are released at once (so releases race too)."""
    rng = random.Random(i)
    ledger = Ledger(url)
    won = lost = 0
    try:
        barrier.wait()
        for r in range(ROUNDS):
            key, device = f"racer-{i}-{r}", rng.choice(DEVICES)
            try:
                if i % 16 == 0:   # a few exclusive bookings among the shared ones
                    ledger.book(key, [device])
                else:
                    ledger.book(key, [device], sharing="shared", reserved_bytes=rng.randint(1, 50) * GB,
                                capacity_bytes=CAP)
                won += 1
                if rng.random() < 0.5:
                    assert ledger.release(key) is not None
            except LeaseError:
                lost += 1
        put(("ok", won, lost))
    except BaseException:  # noqa: BLE001 - anything else is what the test looks for
        put(("error", traceback.format_exc(), 0))


def _ledger_is_consistent(url: str) -> None:
    """Per device: reserved within the capacity, at most two leases, never exclusive and shared at once, and the
    share row equal to the sum of its lease rows."""
    engine = create_engine(url)
    with engine.connect() as conn:
        rows = conn.execute(text(
            "SELECT d.device_id, d.reserved_bytes, l.sharing FROM autodl_lease_devices d "
            "JOIN autodl_leases l ON l.lease_id = d.lease_id")).all()
        shares = {r[0]: r[1:] for r in conn.execute(text(
            "SELECT device_id, capacity_bytes, reserved_bytes, leases, exclusive FROM autodl_device_shares"))}
    engine.dispose()
    assert set(shares) == {d for d, _, _ in rows}
    for device, (capacity, reserved, leases, exclusive) in shares.items():
        mine = [(b, kind) for d, b, kind in rows if d == device]
        kinds = {kind for _, kind in mine}
        assert len(kinds) == 1, f"{device} is held exclusively and shared at once: {mine}"
        assert leases == len(mine) and 1 <= leases <= 2
        assert bool(exclusive) == (kinds == {"exclusive"})
        if not exclusive:
            assert reserved == sum(b for b, _ in mine) <= capacity == CAP, f"{device} over-committed: {mine}"


def _race_threads(url: str) -> list:
    """``RACERS`` threads of one process (SQLite: one database file, its write lock serialises them)."""
    barrier, out = threading.Barrier(RACERS), []
    threads = [threading.Thread(target=_racer, args=(url, i, barrier, out.append)) for i in range(RACERS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return out


def _race_processes(url: str) -> list:
    """``RACERS`` processes racing, as ``tests/core/test_store.py``'s racers."""
    from tests.core.test_store import race_processes

    return race_processes(_racer, url, RACERS)


def _check_race(url: str, out: list) -> None:
    errors = [o[1] for o in out if o[0] == "error"]
    assert errors == [], errors[0]
    assert len(out) == RACERS and sum(o[1] + o[2] for o in out) == RACERS * ROUNDS
    _ledger_is_consistent(url)
    ledger = Ledger(url)
    leases = ledger.leases()
    assert sum(o[1] for o in out) > len(leases) > 0
    for device in DEVICES:   # two leases left on one device name each other
        pair = [le for le in leases if le.device_ids == [device]]
        if len(pair) == 2:
            assert pair[1].run_key in pair[0].co_tenants and pair[0].run_key in pair[1].co_tenants
    for le in leases:
        assert ledger.release(le.run_key) is not None
    assert ledger.shares() == {} and ledger.leased_device_ids() == frozenset()


def test_64_threads_racing_for_shared_devices_never_over_commit_on_sqlite(tmp_path):
    url = f"sqlite:///{tmp_path / 'race.db'}"
    Ledger(url)   # the schema, before the racers
    _check_race(url, _race_threads(url))


@pytest.mark.integration
def test_64_connections_racing_for_shared_devices_never_over_commit_on_postgres(pg_url):  # noqa: F811
    Ledger(pg_url)
    _check_race(pg_url, _race_processes(pg_url))
