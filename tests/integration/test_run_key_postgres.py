"""A run key made from the longest ids Airflow allows is queued, booked and recorded in PostgreSQL
(issue 23: a key over 512 characters broke the wait step with a raw ``DataError``)."""

from __future__ import annotations

import pytest

from autodl.ledger import Ledger
from autodl.pipeline import make_run_key
from autodl.queue import AdmissionQueue
from tests.integration.test_store_postgres import pg_url  # noqa: F401 - the fixture

pytestmark = pytest.mark.integration


def test_the_longest_run_key_is_queued_and_booked_in_postgresql(pg_url):  # noqa: F811
    key = make_run_key("d" * 250, "g" * 250, "manual__" + "r" * 242)
    queue = AdmissionQueue(pg_url)
    queue.join(key, num_gpus=1, needed_bytes=1, candidates=[["GPU-0"]], stale_after_s=60)
    assert key in [e.run_key for e in queue.entries()]
    lease = Ledger(pg_url).book(key, ["GPU-0"])
    assert lease.run_key == key
    assert queue.leave(key)
