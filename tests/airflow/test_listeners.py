"""The Airflow listeners release the leases of failed runs (what skips the release teardown: a DAG run marked
failed, a collect task marked failed while its training runs in the triggerer), but never of a try that
will be retried; and the plugin registers them."""

from __future__ import annotations

from types import SimpleNamespace

from autodl import pipeline
from autodl.ledger import Ledger
from autodl.queue import AdmissionQueue, stale_after
from autodl.records import RecordStore
from autodl.types import LaunchHandle, MemoryBreakdown, ResourceProfile


def launched(tmp_path, key: str, group: str = "train"):
    script = tmp_path / f"{key}.py"
    script.write_text("import time\ntime.sleep(600)\n")
    b = MemoryBreakdown(weights_bytes=1000, gradients_bytes=1000, optimizer_state_bytes=1000, activations_bytes=2**28)
    p = ResourceProfile(script=str(script), params=250, peak_memory_bytes=b.total_bytes, breakdown=b,
                        flops_per_step=1e9, batch_size=8, activation_bytes_per_sample=2**25)
    out = {"profile": p.to_json(), "spec_path": None, "script": str(script)}
    ctx = pipeline.RunContext(run_key=pipeline.make_run_key("dag", group, key), dag_id="dag", run_id=key, user="alice")
    sel = pipeline.step_select(ctx, out, log=lambda _l: None)
    return ctx, pipeline.step_launch(ctx, out, sel, log=lambda _l: None)


def running(handle: dict) -> bool:
    from autodl.launch.local import LocalLauncher

    return LocalLauncher().poll(LaunchHandle.model_validate(handle)) is None


def test_a_collect_marked_failed_releases_its_lease_and_stops_the_training(tmp_path):
    from autodl import listeners

    ctx, handle = launched(tmp_path, "r1")
    ti = SimpleNamespace(task_id="train.collect_metrics", dag_id="dag", run_id="r1", state="up_for_retry")
    listeners.on_task_instance_failed(previous_state="running", task_instance=ti, error="boom")
    assert Ledger().get(ctx.run_key) is not None and running(handle)  # a retry follows: nothing released
    ti.state = "failed"
    listeners.on_task_instance_failed(previous_state=None, task_instance=ti,
                                      error="TaskInstance's state was manually set to `failed`.")
    assert Ledger().get(ctx.run_key) is None and not running(handle)
    rec = RecordStore().get(ctx.run_key)
    assert rec.outcome == "failed" and "Airflow marked train.collect_metrics failed" in rec.error


def test_other_tasks_failing_release_nothing(tmp_path):
    from autodl import listeners

    ctx, handle = launched(tmp_path, "r1")
    for task_id in ("evaluate", "train.profile", "train.release_and_record", "other.thing"):
        listeners.on_task_instance_failed(previous_state=None, error="x", task_instance=SimpleNamespace(
            task_id=task_id, dag_id="dag", run_id="r1", state="failed"))
    assert Ledger().get(ctx.run_key) is not None and running(handle)
    Ledger().release(ctx.run_key)
    pipeline.stop_training(handle)


def test_a_failed_dag_run_releases_every_lease_it_holds_and_leaves_the_queue(tmp_path):
    from autodl import listeners

    a, ha = launched(tmp_path, "r1", "first")
    b, hb = launched(tmp_path, "r1", "second")
    other, ho = launched(tmp_path, "r2", "first")
    AdmissionQueue().join("dag.third.r1", num_gpus=1, needed_bytes=1, candidates=[], stale_after_s=stale_after(5),
                          dag_id="dag", run_id="r1")
    listeners.on_dag_run_failed(dag_run=SimpleNamespace(dag_id="dag", run_id="r1"), msg="marked failed in the UI")
    assert [le.run_key for le in Ledger().leases()] == [other.run_key]
    assert not running(ha) and not running(hb) and running(ho)
    assert AdmissionQueue().entries() == []
    assert "the DAG run r1 failed: marked failed in the UI" in RecordStore().get(a.run_key).error
    Ledger().release(other.run_key)
    pipeline.stop_training(ho)


def test_a_listener_never_raises(monkeypatch):
    from autodl import listeners

    monkeypatch.setenv("AUTODL_STORE_URL", "sqlite:////nonexistent-dir/x.db")
    listeners.on_dag_run_failed(dag_run=SimpleNamespace(dag_id="dag", run_id="r1"), msg="x")
    listeners.on_task_instance_failed(previous_state=None, error="x", task_instance=SimpleNamespace(
        task_id="t.launch", dag_id="dag", run_id="r1", state="failed"))


def test_the_plugin_registers_the_listeners():
    from autodl import listeners
    from autodl.plugin import AutoDLPlugin

    assert listeners in AutoDLPlugin.listeners
