"""Run records: write, replace on retry, list newest first."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

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


def test_clearing_only_collect_keeps_the_trainings_own_duration_and_samples(autodl_home, tmp_path):
    """Issue 25: clearing only collect_metrics after the training ended rewrote a 91 s training as 203.7 s (the
    second collect's end). The duration is from the training's start to its own end (the exit file the runner
    wrote, else the end an earlier collect kept in the store), and the re-collect keeps the attempt's samples."""
    import time

    from autodl import pipeline
    from autodl.config import default_pool_file
    from autodl.launch.local import LocalLauncher
    from autodl.types import LaunchHandle

    script = tmp_path / "short.py"
    script.write_text("import time\nBATCH_SIZE = 4\n\nif __name__ == '__main__':\n    x = bytearray(64 << 20)\n"
                      "    time.sleep(1.5)\n    print('done', flush=True)\n")
    pool = str(default_pool_file())
    ctx = pipeline.RunContext(run_key="dag.g.manual__2", dag_id="dag", run_id="manual__2")
    quiet = lambda _line: None  # noqa: E731
    out = pipeline.step_profile(str(script), None, pool=pool, probe=False, run_key=ctx.run_key, log=quiet)
    sel = pipeline.step_select(ctx, out, pool=pool, log=quiet)
    handle = pipeline.step_launch(ctx, out, sel, log=quiet)
    first = pipeline.step_collect(ctx, handle, log=quiet, interval_s=0.1)
    assert first["exit_code"] == 0 and first["samples"] >= 5, first
    time.sleep(3.0)  # the collect task is cleared a while after the training ended
    again = pipeline.step_collect(ctx, handle, log=quiet, interval_s=0.1)
    assert again["duration_s"] == pytest.approx(first["duration_s"], abs=0.3), (first, again)
    assert again["duration_s"] < 3.0
    assert again["samples"] == first["samples"] and again["peak_memory_bytes"] == first["peak_memory_bytes"]
    # the end an earlier collect saw, for a launcher that cannot tell it (the exit file's time read here)
    typed = LaunchHandle.model_validate(handle)
    assert LocalLauncher().ended_at(typed) == pytest.approx(typed.started_at.timestamp() + first["duration_s"], abs=0.3)
    assert pipeline.known_end(ctx.run_key, typed) == pytest.approx(typed.started_at.timestamp() + again["duration_s"])
    record = pipeline.step_release_and_record(ctx, script=str(script), spec_path=None, profile_out=out, selection=sel,
                                              handle_json=handle, metrics_json=again, log=quiet)
    assert record["outcome"] == "succeeded" and record["duration_s"] == again["duration_s"]


def test_a_follower_that_finds_the_training_ended_takes_the_end_an_earlier_collect_saw():
    """A launcher that cannot say when the training ended (no ``ended_at``): a follower whose first poll finds it
    ended counts the duration to the end kept by the earlier collect, not to now."""
    from autodl.metrics import Follower
    from autodl.types import LaunchHandle

    started = datetime.now(timezone.utc) - timedelta(seconds=200)

    class Ended:
        name = "stand-in"

        def poll(self, _h):
            return 0

        def read_logs(self, _h, offset=0):
            return "", offset

    handle = LaunchHandle(launcher="local", run_key="k", started_at=started)
    follower = Follower(Ended(), handle, sampler=None, ended_ts=started.timestamp() + 91.0)
    assert follower.step() == 0
    assert follower.summary(0).duration_s == pytest.approx(91.0)
    unknown = Follower(Ended(), handle, sampler=None)
    unknown.step()
    assert unknown.summary(0).duration_s == pytest.approx(200.0, abs=5.0)  # nothing knew better: to now, not less


def test_a_failure_airflow_only_repeats_is_said_once():
    from autodl.pipeline import distinct_failures

    own = "training d.g.r failed with exit code 1; its log: /x/log"
    got = distinct_failures({"collect": own, "airflow": f"Airflow marked g.collect_metrics failed: {own}",
                             "launch": "another reason"})
    assert got == {"collect": own, "launch": "another reason"}
