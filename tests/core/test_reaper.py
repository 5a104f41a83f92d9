"""Leases that survive crashes: a lease nobody heartbeats is reaped before devices are offered (its training
stopped, the run recorded with why); a followed training is stopped when its lease is lost, when it runs past
scheduler.max_run_time, or when its pod stays unschedulable."""

from __future__ import annotations

import threading
import time
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest

from autodl import pipeline, registry
from autodl.ledger import Ledger
from autodl.records import RecordStore
from autodl.types import LaunchHandle, MemoryBreakdown, ResourceProfile


def profile_out(tmp_path, body: str) -> dict:
    script = tmp_path / "train.py"
    script.write_text(body)
    b = MemoryBreakdown(weights_bytes=1000, gradients_bytes=1000, optimizer_state_bytes=1000, activations_bytes=2**29)
    p = ResourceProfile(script=str(script), params=250, peak_memory_bytes=b.total_bytes, breakdown=b,
                        flops_per_step=1e9, batch_size=8, activation_bytes_per_sample=2**26)
    return {"profile": p.to_json(), "spec_path": None, "script": str(script)}


@pytest.fixture
def one_device_pool(tmp_path):
    pool = tmp_path / "one.yaml"
    pool.write_text("host: box\ndevices:\n  - {index: 0, model: A100-SXM4-40GB, uuid: GPU-only}\n")
    return str(pool)


def ctx(key: str, user: str = "alice") -> pipeline.RunContext:
    return pipeline.RunContext(run_key=key, dag_id="dag", run_id=key, user=user)


def local_poll(handle: dict) -> int | None:
    from autodl.launch.local import LocalLauncher

    return LocalLauncher().poll(LaunchHandle.model_validate(handle))


def test_an_expired_lease_is_reaped_before_the_device_is_offered(tmp_path, one_device_pool, monkeypatch):
    """kill -9 of the Airflow process left a lease and its training behind (issue 9): once the TTL has run
    out the next waiting run stops that training, frees the lease, records why, and books the device."""
    monkeypatch.setenv("AUTODL_LEASE_TTL", "300")
    out_a = profile_out(tmp_path, "import time\nprint('training', flush=True)\ntime.sleep(600)\n")
    sel = pipeline.step_wait(ctx("a"), out_a, pool=one_device_pool, log=lambda _l: None)
    handle = pipeline.step_launch(ctx("a"), out_a, sel, log=lambda _l: None)
    assert Ledger().get("a").handle["pid"] == handle["pid"]
    assert pipeline.step_wait(ctx("b", "bob"), out_a, pool=one_device_pool, log=lambda _l: None) is None  # a lives
    # nobody heartbeats a's lease any more: its last heartbeat was 10 minutes ago, with a TTL of 1 s (a TTL of 1 s
    # from the start expired under CI's load before the launch had recorded its handle: LeaseLost in step_launch)
    Ledger().heartbeat("a", now=datetime.now(timezone.utc) - timedelta(minutes=10), ttl_s=1)
    logs: list[str] = []
    booked = pipeline.step_wait(ctx("b", "bob"), out_a, pool=one_device_pool, log=logs.append)
    assert booked is not None and booked.lease.device_ids == ["GPU-only"]
    assert local_poll(handle) == 143  # a's training was stopped (SIGTERM) before b got the device
    rec = RecordStore().get("a")
    assert rec.outcome == "failed" and "lease" in rec.error and "expired: no heartbeat since" in rec.error
    assert rec.dag_id == "dag" and rec.launch["pid"] == handle["pid"]
    assert any("reaping the lease of a (user alice, DAG dag, run a)" in line for line in logs)
    assert Ledger().get("b").owner.user == "bob"


def test_a_training_on_another_host_is_not_freed_from_here(tmp_path, one_device_pool, monkeypatch):
    """A local training can only be stopped on its own host; freeing its device from elsewhere would put a
    second run on a device still computing. It stays booked (and says so)."""
    monkeypatch.setenv("AUTODL_LEASE_TTL", "1")
    lease = Ledger().book("far", ["GPU-only"], launcher="local")
    Ledger().attach("far", handle=LaunchHandle(launcher="local", run_key="far", pid=1, pgid=1).to_json(),
                    launched_on="some-other-host")
    time.sleep(1.2)
    logs: list[str] = []
    out = profile_out(tmp_path, "print('x')\n")
    assert pipeline.step_wait(ctx("b"), out, pool=one_device_pool, log=logs.append) is None
    assert Ledger().get("far").lease_id == lease.lease_id
    assert any("runs on some-other-host, not here" in line for line in logs)


class LabelledLauncher:
    """A container launcher stand-in: finds a run's containers by its run key, as Docker and Kubernetes do."""

    name = "labelled"
    stopped: list[str] = []
    pending: str | None = None

    def __init__(self, **_kwargs: Any):
        pass

    def poll(self, handle: LaunchHandle) -> int | None:
        return 137 if handle.run_key in LabelledLauncher.stopped else None

    def stop(self, handle: LaunchHandle) -> None:
        LabelledLauncher.stopped.append(handle.run_key)

    def read_logs(self, handle, offset=0):
        return "", offset

    def unschedulable_reason(self, handle) -> str | None:
        return LabelledLauncher.pending


@pytest.fixture
def labelled(monkeypatch):
    monkeypatch.setitem(registry.LAUNCHERS, "docker", f"{__name__}:LabelledLauncher")
    LabelledLauncher.stopped = []
    LabelledLauncher.pending = None
    return LabelledLauncher


def test_a_container_left_by_an_expired_lease_is_stopped_by_its_run_key(tmp_path, one_device_pool, monkeypatch, labelled):
    """The launch step died between starting the container and recording its handle: the reaper still finds
    the container by the run's label."""
    monkeypatch.setenv("AUTODL_LEASE_TTL", "1")
    Ledger().book("boxed", ["GPU-only"], launcher="docker")
    time.sleep(1.2)
    assert pipeline.reap_expired(log=lambda _l: None) == ["boxed"]
    assert labelled.stopped == ["boxed"] and Ledger().leases() == []


def test_collect_in_the_worker_stops_when_the_lease_is_lost(tmp_path, one_device_pool):
    out = profile_out(tmp_path, "import time\ntime.sleep(600)\n")
    sel = pipeline.step_wait(ctx("a"), out, pool=one_device_pool, log=lambda _l: None)
    handle = pipeline.step_launch(ctx("a"), out, sel, log=lambda _l: None)
    threading.Timer(0.5, lambda: Ledger().release("a")).start()
    limits = pipeline.CollectLimits(heartbeat_every_s=0.1)
    with pytest.raises(pipeline.CollectStopped, match="is gone") as exc:
        pipeline.step_collect(ctx("a"), handle, log=lambda _l: None, interval_s=0.05, limits=limits)
    assert exc.value.status == "lease_lost" and local_poll(handle) == 143
    assert "is gone" in pipeline.read_failures("a")["collect"]


def test_a_hung_training_is_stopped_at_max_run_time_and_the_record_says_why(tmp_path, one_device_pool):
    """Issue 9: collect had no time limit; one hung training blocked every later nightly run."""
    spec = tmp_path / "spec.yaml"
    spec.write_text("task: {script: train.py}\nscheduler: {max_run_time: 1}\n")
    out = {**profile_out(tmp_path, "import time\nprint('hung', flush=True)\ntime.sleep(600)\n"), "spec_path": str(spec)}
    sel = pipeline.step_wait(ctx("a"), out, pool=one_device_pool, log=lambda _l: None)
    handle = pipeline.step_launch(ctx("a"), out, sel, log=lambda _l: None)
    limits = pipeline.CollectLimits.for_run(out)
    assert limits.max_run_time_s == 1
    with pytest.raises(pipeline.CollectStopped, match="longer than scheduler.max_run_time 1 s: stopped"):
        pipeline.step_collect(ctx("a"), handle, log=lambda _l: None, interval_s=0.05, limits=limits)
    assert local_poll(handle) == 143
    result = pipeline.step_release_and_record(ctx("a"), script=None, spec_path=None, profile_out=out, selection=sel,
                                              handle_json=handle, metrics_json=None, log=lambda _l: None)
    rec = RecordStore().get("a")
    assert result["outcome"] == "failed" and "scheduler.max_run_time" in rec.error and Ledger().leases() == []


def test_max_run_time_must_be_a_positive_number_of_seconds(tmp_path):
    from autodl.errors import SpecError
    from autodl.spec import load_spec

    for bad in ("0", "-3", "true", "soon"):
        spec = tmp_path / "spec.yaml"
        spec.write_text(f"scheduler: {{max_run_time: {bad}}}\n")
        with pytest.raises(SpecError, match="max_run_time"):
            load_spec(spec)


def test_an_unschedulable_pod_is_given_up_after_max_pending_time(tmp_path, labelled):
    """Issue 9: a Kubernetes pod stuck Pending (insufficient GPUs) kept collect waiting forever, lease held."""
    labelled.pending = "0/3 nodes are available: 3 Insufficient nvidia.com/gpu."
    lease = Ledger().book("k", ["GPU-only"], launcher="docker")
    handle = LaunchHandle(launcher="docker", run_key="k", lease_id=lease.lease_id, pod_name="p", namespace="ns").to_json()
    logs: list[str] = []
    limits = pipeline.CollectLimits(max_pending_s=0.3, heartbeat_every_s=0.1)
    with pytest.raises(pipeline.CollectStopped, match="unschedulable for .* s .*3 Insufficient nvidia.com/gpu") as exc:
        pipeline.step_collect(ctx("k"), handle, launcher_type="docker", log=logs.append, interval_s=0.05, limits=limits)
    assert exc.value.status == "unschedulable" and labelled.stopped == ["k"]
    assert sum("cannot be scheduled: 0/3 nodes are available" in line for line in logs) == 1  # said once, not per poll
    assert "Insufficient nvidia.com/gpu" in pipeline.read_failures("k")["collect"]


def test_the_collect_tasks_execution_timeout_stops_the_training_and_says_so(tmp_path, one_device_pool):
    """The operator's execution_timeout bounds the training even while it is followed from the triggerer
    (Airflow does not apply execution_timeout to a deferred task): the limit becomes a deadline."""
    from datetime import datetime, timedelta, timezone
    from types import SimpleNamespace

    from autodl.operators.steps import AutoDLCollectOperator

    op = AutoDLCollectOperator(task_id="collect_metrics", group_id="g", execution_timeout=timedelta(seconds=90))
    started = datetime(2026, 1, 1, tzinfo=timezone.utc)
    context = {"ti": SimpleNamespace(start_date=started, xcom_pull=lambda task_ids=None: None, dag_id="d",
                                     task_id="g.collect_metrics"), "run_id": "r"}
    limits = op._limits(context)
    assert limits.deadline_ts == started.timestamp() + 90 and "execution_timeout (0:01:30)" in limits.deadline_why

    out = profile_out(tmp_path, "import time\ntime.sleep(600)\n")
    sel = pipeline.step_wait(ctx("a"), out, pool=one_device_pool, log=lambda _l: None)
    handle = pipeline.step_launch(ctx("a"), out, sel, log=lambda _l: None)
    limits = pipeline.CollectLimits(deadline_ts=time.time() + 0.5, deadline_why="execution_timeout (0:00:00.5)")
    with pytest.raises(pipeline.CollectStopped, match="passed the collect task's execution_timeout") as exc:
        pipeline.step_collect(ctx("a"), handle, log=lambda _l: None, interval_s=0.05, limits=limits)
    assert exc.value.status == "timed_out" and local_poll(handle) == 143
    assert "execution_timeout" in pipeline.read_failures("a")["collect"]


def _profiled(tmp_path, key: str, pool: str) -> Any:
    script = tmp_path / "quick.py"
    script.write_text("import time\nBATCH_SIZE = 4\n\nif __name__ == '__main__':\n    time.sleep(0.5)\n")
    return pipeline.step_profile(str(script), None, pool=pool, probe=False, run_key=key, log=lambda _l: None)


def test_a_booking_nothing_launched_goes_back_to_the_queue_and_its_launch_books_again(tmp_path, one_device_pool,
                                                                                      monkeypatch):
    """Issue 25: a booking whose launch no worker ran (its host's worker down) expired and the run failed later
    with "lease is gone". Past its TTL the reaper (here: another run's poll) frees the device and re-queues the
    run, ahead of the poller, instead of failing it; its launch, when it runs, waits while the device is held and
    then books again and trains; the record notes it."""
    from autodl.errors import PoolBusy
    from autodl.queue import AdmissionQueue

    monkeypatch.setenv("AUTODL_LEASE_TTL", "1")
    out_a = _profiled(tmp_path, "a", one_device_pool)
    sel = pipeline.step_wait(ctx("a"), out_a, pool=one_device_pool, log=lambda _l: None)
    time.sleep(1.2)  # no worker picked the launch up within the TTL
    monkeypatch.setenv("AUTODL_LEASE_TTL", "300")
    logs: list[str] = []
    out_b = _profiled(tmp_path, "b", one_device_pool)
    assert pipeline.step_wait(ctx("b", "bob"), out_b, pool=one_device_pool, log=logs.append) is None
    assert any(line.startswith("re-queued a: ") for line in logs), logs
    assert any("waiting: #2 of 2 in the admission queue behind a" in line for line in logs), logs
    assert AdmissionQueue().get("a") is not None and RecordStore().get("a") is None and Ledger().get("a") is None
    # it keeps the place it had when it was booked (the back of the queue was noticed and left since stop 27)
    assert AdmissionQueue().get("a").enqueued_at == sel.lease.created_at < AdmissionQueue().get("b").enqueued_at
    Ledger().book("by-hand", ["GPU-only"], host="box")  # the device taken meanwhile
    with pytest.raises(PoolBusy, match="back in the admission queue after its booking on box was released"):
        pipeline.step_launch(ctx("a"), out_a, sel, log=lambda _l: None)
    Ledger().release("by-hand")
    handle = pipeline.step_launch(ctx("a"), out_a, sel, log=lambda _l: None)
    assert handle["lease_id"] != sel.lease.lease_id and Ledger().get("a").lease_id == handle["lease_id"]
    metrics = pipeline.step_collect(ctx("a"), handle, log=lambda _l: None, interval_s=0.1)
    out = pipeline.step_release_and_record(ctx("a"), script=None, spec_path=None, profile_out=None, selection=None,
                                           handle_json=handle, metrics_json=metrics, log=lambda _l: None)
    rec = RecordStore().get("a")
    assert out["outcome"] == "succeeded" and rec.error is None and rec.lease_id == handle["lease_id"]
    assert len(rec.notes) == 1 and "went back to the admission queue" in rec.notes[0]


def test_a_launch_that_finds_its_unlaunched_booking_expired_books_again_instead_of_failing(tmp_path, one_device_pool,
                                                                                           monkeypatch):
    """No reaper ran while the worker was down (no other run waited): the launch itself finds the booking expired
    with nothing launched on it, re-queues it and books again, instead of failing with "lease is dead"."""
    monkeypatch.setenv("AUTODL_LEASE_TTL", "1")
    out_a = _profiled(tmp_path, "a", one_device_pool)
    sel = pipeline.step_wait(ctx("a"), out_a, pool=one_device_pool, log=lambda _l: None)
    time.sleep(1.2)
    monkeypatch.setenv("AUTODL_LEASE_TTL", "300")
    logs: list[str] = []
    handle = pipeline.step_launch(ctx("a"), out_a, sel, log=logs.append)
    assert handle["lease_id"] != sel.lease.lease_id
    assert any("booking again on box" in line for line in logs), logs
    assert pipeline.step_collect(ctx("a"), handle, log=lambda _l: None, interval_s=0.1)["exit_code"] == 0


def test_a_requeued_run_whose_launch_never_runs_is_recorded_not_started_with_why(tmp_path, one_device_pool,
                                                                                 monkeypatch):
    """The host's worker never came back: Airflow fails the queued launch task and the release step records the run
    ``not_started``, saying what it waited for, and takes it out of the admission queue."""
    from autodl.queue import AdmissionQueue

    monkeypatch.setenv("AUTODL_LEASE_TTL", "1")
    out_a = _profiled(tmp_path, "a", one_device_pool)
    assert pipeline.step_wait(ctx("a"), out_a, pool=one_device_pool, log=lambda _l: None) is not None
    time.sleep(1.2)
    assert pipeline.reap_expired(log=lambda _l: None) == ["a"]
    assert AdmissionQueue().get("a") is not None
    out = pipeline.step_release_and_record(ctx("a"), script=None, spec_path=None, profile_out=None, selection=None,
                                           handle_json=None, metrics_json=None, log=lambda _l: None)
    assert out["outcome"] == "not_started"
    assert out["error"].startswith("launch: never started: lease ")
    assert "expired before its training was launched" in out["error"]
    assert AdmissionQueue().get("a") is None and Ledger().leases() == []
