"""Run records: write, replace on retry, list newest first."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

from autodl.records import RecordStore
from autodl.types import RunRecord


def rec(key, outcome="succeeded", minutes=0, **kw):
    return RunRecord(run_key=key, script="/x.py", outcome=outcome, declared_pool=True,
                     recorded_at=datetime(2026, 1, 1, tzinfo=timezone.utc) + timedelta(minutes=minutes), **kw)


def test_write_get_replace_list(autodl_home):
    store = RecordStore()
    store.write(rec("a", minutes=1, estimated_peak_bytes=10, actual_peak_bytes=9, dag_id="d"))
    store.write(rec("b", outcome="failed", minutes=2, error="exit 3", dag_id="d"))
    store.write(rec("a", outcome="failed", minutes=3, dag_id="d"))  # retried release replaces
    assert store.get("a").outcome == "failed"
    assert [r.run_key for r in store.list()] == ["a", "b"]
    assert store.get("b").error == "exit 3"
    assert store.get("zzz") is None
    assert [r.run_key for r in store.list(dag_id="other")] == []
