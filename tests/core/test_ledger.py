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
