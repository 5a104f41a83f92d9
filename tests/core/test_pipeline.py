"""The six steps as plain functions (no Airflow): retries, races, failures, records."""

from __future__ import annotations

import sys
import time

import pytest

from autodl import pipeline
from autodl.errors import LaunchError, LeaseError, NoFitError, NotOwner, PoolBusy
from autodl.ledger import Ledger
from autodl.records import RecordStore
from autodl.types import MemoryBreakdown, ResourceProfile

A100 = "GPU-demo0000-a100-0000-0000-000000000000"
V100 = "GPU-demo0001-v100-0000-0000-000000000000"
RTX = "GPU-demo0002-3090-0000-0000-000000000000"


def profile_out(tmp_path, peak_gib=1.0, body="print('hi')\n", num_gpus=1):
    script = tmp_path / "train.py"
    script.write_text(body)
    act = int(peak_gib * 2**30) - 3000
    b = MemoryBreakdown(weights_bytes=1000, gradients_bytes=1000, optimizer_state_bytes=1000, activations_bytes=act)
    p = ResourceProfile(script=str(script), params=250, peak_memory_bytes=b.total_bytes, breakdown=b,
                        flops_per_step=1e9, batch_size=8, activation_bytes_per_sample=act // 8, num_gpus=num_gpus)
    return {"profile": p.to_json(), "spec_path": None, "script": str(script)}


def ctx(key="dag.group.run1"):
    return pipeline.RunContext(run_key=key, dag_id="dag", run_id="run1", task_id="t", try_number=1)


def test_select_books_and_a_retry_reuses_the_lease(tmp_path):
    out = profile_out(tmp_path)
    logs: list[str] = []
    first = pipeline.step_select(ctx(), out, log=logs.append)
    again = pipeline.step_select(ctx(), out, log=logs.append)
    assert first.lease.lease_id == again.lease.lease_id
    assert first.declared_pool is True
    assert any("KEPT" in l for l in logs) and any("DROPPED" in l and "Ascend" in l for l in logs)
    assert any("DECLARED" in l for l in logs)
    assert len(Ledger().leases()) == 1


def test_second_run_gets_another_device_and_third_waits(tmp_path):
    from autodl.queue import AdmissionQueue

    out = profile_out(tmp_path)
    chosen = {pipeline.step_select(ctx(f"run{i}"), out, log=lambda _l: None).lease.device_ids[0] for i in range(3)}
    assert chosen == {A100, V100, RTX}
    sorted_holders = [Ledger().get(f"run{i}").device_ids[0] for i in range(3)]   # every fitting device, per device
    logs: list[str] = []
    assert pipeline.step_wait(ctx("run4"), out, log=logs.append) is None  # waits, in the queue
    assert [e.run_key for e in AdmissionQueue().entries()] == ["run4"]
    assert any("#1 of 1 in the admission queue" in line and "fitting devices held by " in line
               and all(f"{dev}: run{i} (" in line for i, dev in enumerate(sorted_holders)) for line in logs), logs
    with pytest.raises(PoolBusy, match="busy"):  # select without a lease goes back to waiting
        pipeline.step_select(ctx("run4"), out, log=lambda _l: None)
    freed = Ledger().release("run1").device_ids
    booked = pipeline.step_wait(ctx("run4"), out, log=lambda _l: None)
    assert booked.lease.device_ids == freed and AdmissionQueue().entries() == []
    assert pipeline.step_select(ctx("run4"), out, log=lambda _l: None).lease == booked.lease


def test_nothing_fits_is_refused_with_advice(tmp_path):
    out = profile_out(tmp_path, peak_gib=200)
    with pytest.raises(NoFitError) as exc:
        pipeline.step_select(ctx(), out, log=lambda _l: None)
    assert "200.00 GiB" in str(exc.value) and "largest device is A100-SXM4-40GB with 40.0 GiB" in str(exc.value)
    with pytest.raises(NoFitError):
        pipeline.step_wait(ctx(), out)
    assert Ledger().leases() == []


def test_launch_collect_release_success(tmp_path):
    out = profile_out(tmp_path, body="print('training', flush=True)\n")
    sel = pipeline.step_select(ctx(), out, log=lambda _l: None)
    handle = pipeline.step_launch(ctx(), out, sel, log=lambda _l: None)
    assert handle["on_cpu"] is True and handle["visible_devices"] == ""
    lines: list[str] = []
    metrics = pipeline.step_collect(ctx(), handle, log=lines.append, interval_s=0.05)
    assert metrics["exit_code"] == 0 and "[train] training" in lines
    result = pipeline.step_release_and_record(ctx(), script=None, spec_path=None, profile_out=out, selection=sel,
                                              handle_json=handle, metrics_json=metrics, log=lambda _l: None)
    assert result["outcome"] == "succeeded" and result["lease_released"]
    rec = RecordStore().get(ctx().run_key)
    assert rec.device_model == "A100-SXM4-40GB" and rec.declared_pool and rec.estimated_peak_bytes == 2**30
    # a declared pool trains on CPU: nothing was measured on the A100, so the learning policy learns nothing
    from autodl.policy.rl_based import load_bandit

    assert "A100-SXM4-40GB" not in load_bandit().arms
    # release is idempotent
    again = pipeline.step_release_and_record(ctx(), script=None, spec_path=None, profile_out=out, selection=sel,
                                             handle_json=handle, metrics_json=metrics, log=lambda _l: None)
    assert again["lease_released"] is False and RecordStore().get(ctx().run_key).outcome == "succeeded"
    assert "A100-SXM4-40GB" not in load_bandit().arms


def test_failed_training_keeps_metrics_for_the_record(tmp_path):
    out = profile_out(tmp_path, body="import sys\nprint('boom', flush=True)\nsys.exit(5)\n")
    sel = pipeline.step_select(ctx(), out, log=lambda _l: None)
    handle = pipeline.step_launch(ctx(), out, sel, log=lambda _l: None)
    with pytest.raises(LaunchError, match="exit code 5"):
        pipeline.step_collect(ctx(), handle, log=lambda _l: None, interval_s=0.05)
    # The collect task failed, so Airflow has no XCom from it: release reads the kept metrics.
    result = pipeline.step_release_and_record(ctx(), script=None, spec_path=None, profile_out=out, selection=sel,
                                              handle_json=handle, metrics_json=None, log=lambda _l: None)
    assert result["outcome"] == "failed"
    rec = RecordStore().get(ctx().run_key)
    assert rec.metrics["exit_code"] == 5 and "exit code 5" in rec.error
    assert Ledger().leases() == []


def test_release_stops_a_training_still_running(tmp_path):
    out = profile_out(tmp_path, body="import time\ntime.sleep(120)\n")
    sel = pipeline.step_select(ctx(), out, log=lambda _l: None)
    handle = pipeline.step_launch(ctx(), out, sel, log=lambda _l: None)
    logs: list[str] = []
    result = pipeline.step_release_and_record(ctx(), script=None, spec_path=None, profile_out=out, selection=sel,
                                              handle_json=None, metrics_json=None, log=logs.append)
    assert any("still running" in l for l in logs)
    assert result["outcome"] == "failed" and Ledger().leases() == []
    from autodl.launch.local import LocalLauncher
    from autodl.types import LaunchHandle

    assert LocalLauncher().poll(LaunchHandle.model_validate(handle)) == 143


def test_release_with_nothing_upstream_records_not_started(tmp_path):
    pipeline.note_failure(ctx().run_key, "profile", "script.py:3: syntax error")
    result = pipeline.step_release_and_record(ctx(), script="/s.py", spec_path=None, profile_out=None, selection=None,
                                              handle_json=None, metrics_json=None, log=lambda _l: None)
    assert result["outcome"] == "not_started" and not result["lease_released"]
    assert "syntax error" in RecordStore().get(ctx().run_key).error


def test_retried_launch_reattaches(tmp_path):
    out = profile_out(tmp_path, body="import time\ntime.sleep(60)\n")
    sel = pipeline.step_select(ctx(), out, log=lambda _l: None)
    first = pipeline.step_launch(ctx(), out, sel, log=lambda _l: None)
    second = pipeline.step_launch(ctx(), out, sel, log=lambda _l: None)
    assert second["reattached"] and second["pid"] == first["pid"]
    pipeline.step_release_and_record(ctx(), script=None, spec_path=None, profile_out=out, selection=sel,
                                     handle_json=second, metrics_json=None, log=lambda _l: None)


def test_spec_batch_size_reaches_the_training(tmp_path):
    """The estimate is made for the spec's batch; the training is told it (it trained with its own
    default before, so the plan and the run disagreed)."""
    script = tmp_path / "train.py"
    script.write_text("import os\nprint('batch', os.environ.get('AUTODL_BATCH_SIZE_PER_GPU'), flush=True)\n")
    spec = tmp_path / "spec.yaml"
    spec.write_text("task:\n  script: train.py\n  batch_size_per_gpu: 32\n")
    out = profile_out(tmp_path, body=script.read_text())
    out["spec_path"] = str(spec)
    sel = pipeline.step_select(ctx(), out, log=lambda _l: None)
    handle = pipeline.step_launch(ctx(), out, sel, log=lambda _l: None)
    lines: list[str] = []
    pipeline.step_collect(ctx(), handle, log=lines.append, interval_s=0.05)
    assert "[train] batch 32" in lines


def test_refused_run_keeps_its_profile_for_the_record(tmp_path):
    from autodl.config import include_dir

    spec = tmp_path / "huge.yaml"
    spec.write_text(f"task:\n  script: {include_dir() / 'scripts/simple_cnn.py'}\n  input_shape: [3, 32, 32]\n"
                    "  batch_size_per_gpu: 5000000\n")
    with pytest.raises(NoFitError):
        pipeline.step_profile(None, str(spec), probe=False, log=lambda _l: None, run_key=ctx().run_key)
    pipeline.step_release_and_record(ctx(), script=None, spec_path=str(spec), profile_out=None, selection=None,
                                     handle_json=None, metrics_json=None, log=lambda _l: None)
    rec = RecordStore().get(ctx().run_key)
    assert rec.outcome == "not_started" and rec.declared_pool
    assert rec.profile["batch_size"] == 5000000 and rec.estimated_peak_bytes > 100 * 2**30


def test_too_many_devices_is_a_gang_message_not_a_memory_one(tmp_path):
    out = profile_out(tmp_path, peak_gib=1.0, num_gpus=8)
    with pytest.raises(NoFitError) as exc:
        pipeline.step_select(ctx(), out, log=lambda _l: None)
    msg = str(exc.value)
    assert "has 8 devices of one model" in msg and "largest group is 1 x" in msg
    assert "num_gpus_estimate" in msg and "can hold this run" not in msg


def test_unknown_preferred_device_is_a_spec_error(tmp_path):
    from autodl.errors import SpecError

    (tmp_path / "train.py").write_text("print(1)\n")
    spec = tmp_path / "spec.yaml"
    spec.write_text("task: {script: train.py}\nresource_policy:\n  preferred_devices: [A100-SXM4-40GB, Z9000]\n")
    with pytest.raises(SpecError, match=r"preferred_devices\[1\]: 'Z9000' is not in the GPU catalog"):
        pipeline.profile_run(None, spec, probe=False)


def test_release_by_hand_stops_the_training_and_records_it(tmp_path):
    """The Airflow process died mid-training (kill -9): `autodl leases --release` must not free a device
    that is still computing, and the run must not vanish from the records. Only the lease's owner may
    release it without --force (issue 13: another tenant freed a lease whose training kept running)."""
    out = profile_out(tmp_path, body="import time\ntime.sleep(120)\n")
    mine = pipeline.RunContext(run_key=ctx().run_key, dag_id="dag", run_id="run1", user="alice")
    sel = pipeline.step_select(mine, out, log=lambda _l: None)
    handle = pipeline.step_launch(mine, out, sel, log=lambda _l: None)
    with pytest.raises(NotOwner, match=r"not yours \(bob\).*user alice, DAG dag, run run1.*--force"):
        pipeline.release_by_hand(ctx().run_key, user="bob", log=lambda _l: None)
    assert Ledger().get(ctx().run_key) is not None  # refused: nothing stopped, nothing freed
    from autodl.launch.local import LocalLauncher
    from autodl.types import LaunchHandle

    assert LocalLauncher().poll(LaunchHandle.model_validate(handle)) is None
    result = pipeline.release_by_hand(ctx().run_key, user="bob", force=True, log=lambda _l: None)
    assert LocalLauncher().poll(LaunchHandle.model_validate(handle)) == 143
    assert Ledger().leases() == [] and result["outcome"] == "stopped" and result["training"] == "stopped"
    rec = RecordStore().get(ctx().run_key)
    assert rec.outcome == "stopped" and "stopped by autodl leases --release (by bob at " in rec.error
    assert rec.stopped.by == "bob" and rec.stopped.forced and rec.stopped.lease_id == sel.lease.lease_id
    assert rec.launch["pid"] == handle["pid"]
    with pytest.raises(LeaseError, match="no lease is held by run .*: nothing released"):
        pipeline.release_by_hand(ctx().run_key)


def test_release_by_hand_of_a_training_that_ended_by_itself_records_success(tmp_path):
    """Issue 13: after a training exited 0 on its own (nobody followed it: Airflow was gone), a manual
    release recorded it as failed. The launcher's exit status is the outcome."""
    out = profile_out(tmp_path, body="print('done')\n")
    mine = pipeline.RunContext(run_key=ctx().run_key, dag_id="dag", run_id="run1", user="alice")
    sel = pipeline.step_select(mine, out, log=lambda _l: None)
    handle = pipeline.step_launch(mine, out, sel, log=lambda _l: None)
    from autodl.launch.local import LocalLauncher
    from autodl.types import LaunchHandle

    h = LaunchHandle.model_validate(handle)
    while LocalLauncher().poll(h) is None:
        time.sleep(0.05)
    result = pipeline.release_by_hand(ctx().run_key, user="alice", log=lambda _l: None)
    assert result["outcome"] == "succeeded" and Ledger().leases() == []


def test_collect_on_kill_stops_the_training(tmp_path):
    from autodl.operators.steps import AutoDLCollectOperator

    out = profile_out(tmp_path, body="import time\ntime.sleep(120)\n")
    sel = pipeline.step_select(ctx(), out, log=lambda _l: None)
    handle = pipeline.step_launch(ctx(), out, sel, log=lambda _l: None)
    op = AutoDLCollectOperator(task_id="collect_metrics", group_id="group")
    op._following = (handle, ctx())
    op.on_kill()
    from autodl.launch.local import LocalLauncher
    from autodl.types import LaunchHandle

    assert LocalLauncher().poll(LaunchHandle.model_validate(handle)) == 143
    assert "stopped by Airflow" in pipeline.read_failures(ctx().run_key)["collect"]
