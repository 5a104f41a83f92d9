"""The lease of a collect followed from the triggerer outlives a triggerer restart (issue 23, item 5): its TTL is
raised to the documented lower bound (:func:`autodl.pipeline.deferred_lease_ttl_s`) before the collect defers, and
the trigger's heartbeats keep it there. The real triggerer restart is
``tests/integration/test_airflow_real.py::test_a_triggerer_down_8_s_keeps_the_lease_and_the_run_succeeds``."""

from __future__ import annotations

from datetime import timedelta

import pytest

from autodl import pipeline
from autodl.ledger import Ledger
from autodl.types import LaunchHandle, utcnow

AIRFLOW_FAILOVER_S = 35.0
"""Airflow 3's defaults: [triggerer] triggerer_health_check_threshold 30 s + job_heartbeat_sec 5 s."""


def test_the_repositorys_30_s_ttl_is_raised_to_outlive_airflows_triggerer_failover():
    assert pipeline.deferred_lease_ttl_s(30, failover_s=AIRFLOW_FAILOVER_S, interval_s=1.0) == 70
    assert pipeline.deferred_lease_ttl_s(300, failover_s=AIRFLOW_FAILOVER_S, interval_s=1.0) == 300  # long enough


@pytest.mark.parametrize("failover_s", [5.0, 35.0, 95.0, 300.0])
@pytest.mark.parametrize("interval_s", [0.5, 1.0, 30.0])
def test_the_bound_covers_a_heartbeat_interval_the_failover_and_the_resume(failover_s, interval_s):
    """The longest gap between two heartbeats across a kill and restart: the last beat up to a heartbeat interval
    before the kill, Airflow's failover, the trigger's first poll, its start-up margin."""
    ttl = pipeline.deferred_lease_ttl_s(10, failover_s=failover_s, interval_s=interval_s)
    beat_every = min(30.0, ttl / 5.0)
    assert beat_every + failover_s + interval_s + pipeline.TRIGGERER_RESUME_MARGIN_S <= ttl


def test_deferring_raises_the_leases_ttl_in_the_store_and_says_so(monkeypatch):
    monkeypatch.setenv("AUTODL_LEASE_TTL", "30")
    ledger = Ledger()
    lease = ledger.book("dag.train.run1", ["GPU-a"])
    assert lease.ttl_s == 30
    ctx = pipeline.RunContext(run_key="dag.train.run1")
    said: list[str] = []
    limits = pipeline.keep_lease_for_deferral(ctx, lease.lease_id, pipeline.CollectLimits.for_run(None),
                                              failover_s=AIRFLOW_FAILOVER_S, interval_s=1.0, log=said.append)
    kept = ledger.get("dag.train.run1")
    assert limits.lease_ttl_s == kept.ttl_s == 70
    assert kept.expires_at - kept.heartbeat_at == timedelta(seconds=70)
    assert limits.heartbeat_every_s <= 14
    assert any("lease TTL 70 s while the triggerer follows the training" in line and "AUTODL_LEASE_TTL is 30 s" in line
               for line in said)
    # the trigger's guard (rebuilt from the serialised limits) keeps the lease at the raised TTL
    handle = LaunchHandle(launcher="local", run_key=ctx.run_key, lease_id=lease.lease_id, started_at=utcnow())
    guard = pipeline.CollectGuard(ctx, handle, None, pipeline.CollectLimits(**limits.__dict__), log=said.append)
    assert guard.check() is None
    again = ledger.get("dag.train.run1")
    assert again.ttl_s == 70 and again.heartbeat_at > kept.heartbeat_at


def test_a_long_configured_ttl_is_kept_and_nothing_is_said(monkeypatch):
    monkeypatch.setenv("AUTODL_LEASE_TTL", "600")
    lease = Ledger().book("dag.train.run2", ["GPU-b"])
    said: list[str] = []
    limits = pipeline.keep_lease_for_deferral(pipeline.RunContext(run_key="dag.train.run2"), lease.lease_id,
                                              pipeline.CollectLimits.for_run(None), failover_s=AIRFLOW_FAILOVER_S,
                                              interval_s=1.0, log=said.append)
    assert limits.lease_ttl_s == 600 and Ledger().get("dag.train.run2").ttl_s == 600 and said == []


def test_a_lease_lost_before_deferring_is_left_to_the_triggers_first_check(monkeypatch):
    said: list[str] = []
    limits = pipeline.keep_lease_for_deferral(pipeline.RunContext(run_key="dag.train.gone"), "no-such-lease",
                                              pipeline.CollectLimits.for_run(None), failover_s=AIRFLOW_FAILOVER_S,
                                              interval_s=1.0, log=said.append)
    assert limits.lease_ttl_s == 300  # the default TTL, long enough
    assert any("the trigger's first check decides" in line for line in said)
