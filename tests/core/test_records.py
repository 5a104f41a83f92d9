"""Run records: write, replace on retry, list newest first."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from pathlib import Path

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


def test_another_attempt_keeps_the_earlier_one_and_a_retried_release_replaces(autodl_home):
    store = RecordStore()
    store.write(rec("k", outcome="failed", error="exit 3", lease_id="L1", metrics={"duration_s": 91.0}))
    store.write(rec("k", outcome="failed", error="exit 3 (retried release)", lease_id="L1"))  # same attempt
    assert store.get("k").attempts == [] and store.get("k").error == "exit 3 (retried release)"
    store.write(rec("k", outcome="succeeded", lease_id="L2", metrics={"duration_s": 12.0}))  # cleared and re-run
    latest = store.get("k")
    assert latest.outcome == "succeeded" and latest.error is None and latest.metrics["duration_s"] == 12.0
    assert [(a["lease_id"], a["outcome"], a["error"]) for a in latest.attempts] == [("L1", "failed", "exit 3 (retried release)")]
    store.write(rec("k", outcome="succeeded", lease_id="L2", metrics={"duration_s": 12.0}))  # its release retried
    assert len(store.get("k").attempts) == 1


def test_clear_and_rerun_records_each_attempt_with_its_own_error_and_timeline(autodl_home, tmp_path):
    """Issue 25: clearing from select_device re-trained and succeeded, but the record kept the first attempt's
    error (a red Error box under "succeeded") and the timeline joined both attempts. A real training (local
    launcher, CPU) fails with exit 3 the first time and succeeds the second."""
    from autodl import pipeline
    from autodl.config import default_pool_file
    from autodl.errors import LaunchError

    marker = tmp_path / "second"
    script = tmp_path / "flaky.py"
    script.write_text("import os, sys, time\nBATCH_SIZE = 4\n\nif __name__ == '__main__':\n"
                      f"    first = not os.path.exists({str(marker)!r})\n    open({str(marker)!r}, 'w').close()\n"
                      "    time.sleep(1.0)\n    print('first' if first else 'second', flush=True)\n"
                      "    sys.exit(3 if first else 0)\n")
    pool = str(default_pool_file())
    ctx = pipeline.RunContext(run_key="dag.g.manual__1", dag_id="dag", run_id="manual__1")
    quiet = lambda _line: None  # noqa: E731
    out = pipeline.step_profile(str(script), None, pool=pool, probe=False, run_key=ctx.run_key, log=quiet)

    def attempt():
        sel = pipeline.step_select(ctx, out, pool=pool, log=quiet)
        handle = pipeline.step_launch(ctx, out, sel, log=quiet)
        try:
            metrics = pipeline.step_collect(ctx, handle, log=quiet, interval_s=0.1)
        except LaunchError as exc:
            pipeline.note_failure(ctx.run_key, "collect", str(exc))
            metrics = None
        return pipeline.step_release_and_record(ctx, script=str(script), spec_path=None, profile_out=out,
                                                selection=sel, handle_json=handle, metrics_json=metrics, log=quiet)

    assert attempt()["outcome"] == "failed"
    first = RecordStore().get(ctx.run_key)
    assert "exit code 3" in first.error
    assert attempt()["outcome"] == "succeeded"  # cleared from select_device: booked and trained again
    rec_ = RecordStore().get(ctx.run_key)
    assert rec_.outcome == "succeeded" and rec_.error is None and rec_.metrics["exit_code"] == 0
    [earlier] = rec_.attempts
    assert earlier["outcome"] == "failed" and "exit code 3" in earlier["error"] and earlier["lease_id"] == first.lease_id
    assert earlier["lease_id"] != rec_.lease_id
    now_samples, then_samples = rec_.metrics["samples_path"], earlier["metrics"]["samples_path"]
    assert now_samples != then_samples and Path(then_samples).exists() and Path(now_samples).exists()
    assert "earlier-1" in then_samples
