"""The triggers, run as the triggerer runs them (an asyncio loop): PoolTrigger waits in the admission queue
and books; CollectTrigger follows a training, streams its log, heartbeats its lease, stops it at its limits."""

from __future__ import annotations

import asyncio
import json

import pytest

from autodl import pipeline
from autodl.ledger import Ledger
from autodl.queue import AdmissionQueue
from autodl.records import RecordStore
from autodl.types import MemoryBreakdown, ResourceProfile

DEMO_IDS = ["GPU-demo0000-a100-0000-0000-000000000000", "GPU-demo0001-v100-0000-0000-000000000000",
            "GPU-demo0002-3090-0000-0000-000000000000"]


def profile_out(peak_gib: float, script: str = "/x.py") -> dict:
    act = int(peak_gib * 2**30) - 3000
    b = MemoryBreakdown(weights_bytes=1000, gradients_bytes=1000, optimizer_state_bytes=1000, activations_bytes=act)
    p = ResourceProfile(script=script, params=250, peak_memory_bytes=b.total_bytes, breakdown=b,
                        flops_per_step=1e9, batch_size=8, activation_bytes_per_sample=act // 8)
    return {"profile": p.to_json(), "spec_path": None, "script": script}


def run_fields(key: str, user: str = "alice") -> dict:
    return {"run_key": key, "dag_id": "dag", "run_id": key, "task_id": "g.wait_for_pool", "try_number": 1, "user": user}


async def first_event(trigger):
    async for event in trigger.run():
        return event


def test_trigger_waits_for_a_release_then_books(autodl_home):
    from autodl.triggers.pool import PoolTrigger

    ledger = Ledger()
    ledger.book("other-run", DEMO_IDS)
    trigger = PoolTrigger(run=run_fields("mine"), profile_out=profile_out(1.0), pool=None, poke_interval=0.05, min_deferral_s=0)
    classpath, kwargs = trigger.serialize()
    assert classpath == "autodl.triggers.pool.PoolTrigger" and kwargs["poke_interval"] == 0.05
    assert PoolTrigger(**kwargs).serialize() == (classpath, kwargs)

    async def scenario():
        pending = asyncio.ensure_future(first_event(trigger))
        await asyncio.sleep(0.5)
        fired_while_leased = pending.done()
        queued = [e.run_key for e in AdmissionQueue().entries()]
        ledger.release("other-run")
        return fired_while_leased, queued, await pending

    fired_while_leased, queued, event = asyncio.run(scenario())
    assert fired_while_leased is False and queued == ["mine"]
    assert event.payload["status"] == "booked"
    lease = ledger.get("mine")
    assert event.payload["selection"]["lease"]["lease_id"] == lease.lease_id
    assert lease.owner.user == "alice" and lease.owner.dag_id == "dag" and lease.expires_at is not None
    assert AdmissionQueue().entries() == []  # booked: out of the queue


def test_two_triggers_book_one_after_the_other_in_queue_order(autodl_home, tmp_path):
    """Two runs wait for the same single device: the one that joined first books first; the second books
    only after the first releases (never both, never the second first)."""
    from autodl.triggers.pool import PoolTrigger

    pool = tmp_path / "one.yaml"
    pool.write_text("host: box\ndevices:\n  - {index: 0, model: A100-SXM4-40GB, uuid: GPU-one}\n")
    Ledger().book("holder", ["GPU-one"])
    first = PoolTrigger(run=run_fields("first"), profile_out=profile_out(1.0), pool=str(pool), poke_interval=0.05, min_deferral_s=0)
    second = PoolTrigger(run=run_fields("second"), profile_out=profile_out(1.0), pool=str(pool), poke_interval=0.05, min_deferral_s=0)

    async def scenario():
        a = asyncio.ensure_future(first_event(first))
        await asyncio.sleep(0.3)
        b = asyncio.ensure_future(first_event(second))
        await asyncio.sleep(0.3)
        order = [e.run_key for e in AdmissionQueue().in_order()]
        Ledger().release("holder")
        done, _ = await asyncio.wait({a, b}, return_when=asyncio.FIRST_COMPLETED)
        await asyncio.sleep(0.3)
        second_waits = not b.done()
        Ledger().release("first")
        return order, done == {a}, second_waits, await a, await b

    order, first_done_first, second_waits, ev_a, ev_b = asyncio.run(scenario())
    assert order == ["first", "second"]
    assert first_done_first and second_waits
    assert ev_a.payload["status"] == ev_b.payload["status"] == "booked"
    assert Ledger().get("second").device_ids == ["GPU-one"]


def test_trigger_reports_no_fit(autodl_home):
    from autodl.triggers.pool import PoolTrigger

    trigger = PoolTrigger(run=run_fields("big"), profile_out=profile_out(500.0), poke_interval=0.05, min_deferral_s=0)
    event = asyncio.run(first_event(trigger))
    assert event.payload["status"] == "no_fit" and "no device in the pool" in event.payload["message"]
    assert AdmissionQueue().entries() == []


def test_trigger_times_out_from_when_the_run_joined(autodl_home):
    from autodl.triggers.pool import PoolTrigger

    Ledger().book("other-run", DEMO_IDS)
    trigger = PoolTrigger(run=run_fields("late"), profile_out=profile_out(1.0), poke_interval=0.05, timeout_s=0.3, min_deferral_s=0)
    event = asyncio.run(first_event(trigger))
    assert event.payload["status"] == "timeout" and "within 0.3 s (scheduler.timeout)" in event.payload["message"]
    assert AdmissionQueue().entries() == [] and Ledger().get("late") is None


# --------------------------------------------------------------------------------------------- collect
def launched(tmp_path, body: str, key: str = "dag.g.r1"):
    script = tmp_path / "train.py"
    script.write_text(body)
    out = profile_out(0.5, str(script))
    ctx = pipeline.RunContext(run_key=key, dag_id="dag", run_id="r1", user="alice")
    sel = pipeline.step_select(ctx, out, log=lambda _l: None)
    handle = pipeline.step_launch(ctx, out, sel, log=lambda _l: None)
    return ctx, handle


def collect_trigger(ctx, handle, **limits):
    from autodl.triggers.collect import CollectTrigger

    fields = {"run_key": ctx.run_key, "dag_id": ctx.dag_id, "run_id": ctx.run_id, "user": ctx.user}
    limits.setdefault("heartbeat_every_s", 0.1)
    trigger = CollectTrigger(run=fields, handle=handle, limits=limits, interval_s=0.05, min_deferral_s=0)
    classpath, kwargs = trigger.serialize()
    json.dumps(kwargs)  # stored by Airflow as JSON
    return CollectTrigger(**kwargs)


class LogSink:
    def __init__(self):
        self.lines: list[str] = []

    def info(self, msg, *args):
        self.lines.append(msg % args if args else msg)

    warning = error = info


def test_collect_trigger_streams_the_log_and_heartbeats_until_the_end(autodl_home, tmp_path):
    body = "import time\nfor i in range(6):\n    print('step', i, flush=True)\n    time.sleep(0.1)\n"
    ctx, handle = launched(tmp_path, body)
    before = Ledger().get(ctx.run_key).heartbeat_at
    trigger = collect_trigger(ctx, handle)
    sink = LogSink()
    trigger.log_line = lambda line: sink.info("[train] %s", line)  # the task's log
    event = asyncio.run(first_event(trigger))
    assert event.payload["status"] == "ended" and event.payload["exit_code"] == 0
    assert [line for line in sink.lines if line.startswith("[train] step")] == [f"[train] step {i}" for i in range(6)]
    assert event.payload["metrics"]["samples"] >= 1 and event.payload["metrics"]["source"] == "process"
    assert Ledger().get(ctx.run_key).heartbeat_at > before
    kept = json.loads((pipeline.state_dir(ctx.run_key) / "metrics.json").read_text())
    assert kept["exit_code"] == 0


def test_collect_trigger_resumes_without_repeating_log_lines(autodl_home, tmp_path):
    """A triggerer restart re-creates the trigger from its kwargs: it goes on from the saved log offset."""
    body = "import time\nprint('first', flush=True)\ntime.sleep(0.6)\nprint('second', flush=True)\n"
    ctx, handle = launched(tmp_path, body)
    sink = LogSink()

    async def interrupted():
        t = collect_trigger(ctx, handle)
        t.log_line = lambda line: sink.info("[train] %s", line)
        task = asyncio.ensure_future(first_event(t))
        await asyncio.sleep(0.4)
        task.cancel()  # the triggerer went away
        try:
            await task
        except asyncio.CancelledError:
            pass

    asyncio.run(interrupted())
    resumed = collect_trigger(ctx, handle)
    resumed.log_line = lambda line: sink.info("[train] %s", line)
    event = asyncio.run(first_event(resumed))
    assert event.payload["status"] == "ended"
    train = [line for line in sink.lines if line.startswith("[train]")]
    assert train == ["[train] first", "[train] second"]


def test_collect_trigger_stops_a_hung_training_at_max_run_time(autodl_home, tmp_path):
    ctx, handle = launched(tmp_path, "import time\nprint('hanging', flush=True)\ntime.sleep(600)\n")
    trigger = collect_trigger(ctx, handle, max_run_time_s=0.5)
    event = asyncio.run(first_event(trigger))
    assert event.payload["status"] == "timed_out"
    assert "longer than scheduler.max_run_time 0.5 s: stopped" in event.payload["message"]
    from autodl.launch.local import LocalLauncher
    from autodl.types import LaunchHandle

    assert LocalLauncher().poll(LaunchHandle.model_validate(handle)) == 143  # stopped cleanly (SIGTERM)
    result = pipeline.step_release_and_record(ctx, script=None, spec_path=None, profile_out=None, selection=None,
                                              handle_json=handle, metrics_json=None, log=lambda _l: None)
    rec = RecordStore().get(ctx.run_key)
    assert result["outcome"] == "failed" and "scheduler.max_run_time" in rec.error


def test_collect_trigger_stops_the_training_when_its_lease_is_lost(autodl_home, tmp_path):
    """Someone freed the lease (a reaper after a triggerer outage longer than the TTL): the training must not
    go on computing on devices that may be booked by another run."""
    ctx, handle = launched(tmp_path, "import time\ntime.sleep(600)\n")
    Ledger().release(ctx.run_key)
    event = asyncio.run(first_event(collect_trigger(ctx, handle)))
    assert event.payload["status"] == "lease_lost" and "is gone" in event.payload["message"]
    from autodl.launch.local import LocalLauncher
    from autodl.types import LaunchHandle

    # stopped: SIGTERM (143), or SIGKILL (137) when the grace ran out first (CI, under load: seen twice)
    assert LocalLauncher().poll(LaunchHandle.model_validate(handle)) in (128 + 15, 128 + 9)
    assert "is gone" in pipeline.read_failures(ctx.run_key)["collect"]


def test_a_quick_grant_books_at_once_but_fires_after_the_minimum_deferral(autodl_home):
    """Airflow 3.3 fails a deferred task whose trigger fires before the scheduler has read the deferring
    exit's executor event (apache/airflow#71580, #72716): the booking happens at the first poll, the event
    is held for the minimum deferral."""
    from autodl.triggers.pool import PoolTrigger

    trigger = PoolTrigger(run=run_fields("quick"), profile_out=profile_out(1.0), poke_interval=0.05, min_deferral_s=5.0)

    async def scenario():
        pending = asyncio.ensure_future(first_event(trigger))
        while Ledger().get("quick") is None:  # booked at the first poll
            await asyncio.sleep(0.05)
        return pending.done(), await pending

    fired_when_booked, event = asyncio.run(scenario())
    assert not fired_when_booked and event.payload["status"] == "booked"


def test_the_triggerer_samples_at_the_configured_interval(autodl_home, tmp_path):
    """Issue 25: short runs followed from the triggerer got 0-5 samples at a 0.5 s interval: the deferred collect
    step clamped the interval to 1 s and added each poll's own time to it. The trigger now gets the configured
    interval and keeps it from tick to tick."""
    from airflow.sdk.exceptions import TaskDeferred

    from autodl.operators.steps import AutoDLCollectOperator

    ctx, handle = launched(tmp_path, "import time\ntime.sleep(3)\n")
    out = profile_out(0.5)

    class TI:
        start_date = None
        dag_id, task_id, try_number = "dag", "g.collect_metrics", 1

        def xcom_pull(self, task_ids):
            return {"g.launch": handle, "g.profile": out}[task_ids]

    op = AutoDLCollectOperator(task_id="g.collect_metrics", group_id="g", sample_interval_s=0.2)
    with pytest.raises(TaskDeferred) as deferred:
        op.run_step(ctx, {"ti": TI(), "run_id": "interval-test"})
    trigger = deferred.value.trigger
    assert trigger.interval_s == 0.2
    classpath, kwargs = trigger.serialize()
    event = asyncio.run(first_event(type(trigger)(**{**kwargs, "min_deferral_s": 0})))
    assert event.payload["status"] == "ended" and event.payload["exit_code"] == 0
    # 3 s at 0.2 s is 15 ticks; a 1 s floor gave at most 4
    assert event.payload["metrics"]["samples"] >= 8, event.payload["metrics"]
    with pytest.raises(ValueError, match="sample_interval_s"):
        AutoDLCollectOperator(task_id="c", group_id="g", sample_interval_s=0)


def _alive(pid: int) -> bool:
    """The training process ``pid`` still runs (a zombie counts as ended)."""
    import psutil

    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def test_a_short_run_followed_from_the_triggerer_is_sampled_from_its_launch(autodl_home, tmp_path):
    """Issue 25: the seconds from the launch until the triggerer picked the trigger up (the collect task scheduled,
    deferring) were not sampled, so short runs had near-empty timelines. The launch step samples the training at
    the collect's interval until the trigger takes over; the trigger's summary covers both."""
    import time

    from autodl.operators import AutoDLTrainOperator

    script = tmp_path / "train.py"
    script.write_text("import time\nx = bytearray(64 << 20)\ntime.sleep(6)\n")
    out = profile_out(0.5, str(script))
    ctx = pipeline.RunContext(run_key="dag.g.r1", dag_id="dag", run_id="r1", user="alice")
    sel = pipeline.step_select(ctx, out, log=lambda _l: None)
    handle = pipeline.step_launch(ctx, out, sel, log=lambda _l: None, sample_interval_s=0.2)
    # the pickup gap (the collect task is scheduled, defers, the triggerer picks it up) lasts until the launch's
    # sampler has written three rows or the training has ended, whichever comes first: on a loaded machine the
    # sampler's start takes seconds, and a fixed gap made this test fail for the machine, not for the code
    samples = pipeline.state_dir(ctx.run_key) / "samples.jsonl"
    while _alive(handle["pid"]) and (not samples.exists() or len(samples.read_text().splitlines()) < 3):
        time.sleep(0.1)
    picked_up = time.time()
    trigger = collect_trigger(ctx, handle)
    trigger.interval_s = 0.2
    event = asyncio.run(first_event(trigger))
    metrics = event.payload["metrics"]
    assert event.payload["status"] == "ended" and event.payload["exit_code"] == 0
    rows = [json.loads(line) for line in (pipeline.state_dir(ctx.run_key) / "samples.jsonl").read_text().splitlines()]
    before = [r for r in rows if r["t"] < picked_up]
    assert len(before) >= 3, rows  # taken by the launch's sampler; nobody sampled there before
    assert metrics["samples"] == len(rows) and metrics["samples"] >= 8, metrics
    assert max(r["rss_bytes"] for r in before) > 64 << 20
    assert (pipeline.state_dir(ctx.run_key) / "collect.taken-over").exists()
    # the operator gives the launch step the collect's interval
    import pendulum
    from airflow.sdk import DAG

    with DAG("interval_dag", schedule=None, start_date=pendulum.datetime(2026, 1, 1, tz="UTC")):
        train = AutoDLTrainOperator(task_id="train", sample_interval_s=0.2, probe=False)
    assert train.launch.sample_interval_s == 0.2


# ------------------------------------------------------------------------------- the collect event, typed
def through_airflow(event):
    """The path a trigger's event takes to ``execute_complete``: the triggerer's message to its supervisor
    (the TriggerEvent model as JSON), the scheduler's ``next_kwargs`` (Airflow's serde, stored as JSON) and the
    task runner's deserialisation."""
    from airflow.sdk.serde import deserialize, serialize
    from airflow.triggers.base import TriggerEvent

    sent = TriggerEvent.model_validate_json(event.model_dump_json())
    stored = json.loads(json.dumps(serialize({"event": sent.payload})))
    return deserialize(stored)["event"]


def test_the_collect_event_round_trips_through_airflows_trigger_event_serialization(autodl_home, tmp_path):
    from autodl.types import CollectEvent, RunMetrics

    ctx, handle = launched(tmp_path, "print('step 0', flush=True)\n")
    event = asyncio.run(first_event(collect_trigger(ctx, handle)))
    received = CollectEvent.coerce(through_airflow(event), what="the collect trigger's event")
    assert received.status == "ended" and received.exit_code == 0
    assert isinstance(received.metrics, RunMetrics) and received.metrics.exit_code == 0
    assert received.metrics == RunMetrics.model_validate(event.payload["metrics"])


def test_a_stopped_collect_event_keeps_its_reason_and_metrics_through_airflow(autodl_home, tmp_path):
    from autodl.types import CollectEvent

    ctx, handle = launched(tmp_path, "import time\ntime.sleep(600)\n")
    Ledger().release(ctx.run_key)
    received = CollectEvent.coerce(through_airflow(asyncio.run(first_event(collect_trigger(ctx, handle)))))
    assert received.status == "lease_lost" and received.exit_code is None and "is gone" in received.message
    assert received.metrics.exit_code is None


def collect_op_context():
    from types import SimpleNamespace

    ti = SimpleNamespace(dag_id="d", task_id="g.collect_metrics", try_number=1,
                         xcom_pull=lambda task_ids: {"launcher": "local", "run_key": "d.g.r1"})
    return {"ti": ti, "run_id": "r1"}


@pytest.mark.parametrize("event, field", [
    ({"status": "ended", "exit_code": 0, "metric": {}}, "metrics: Field required"),
    ({"state": "ended", "exit_code": 0, "metrics": {"source": "nvml", "duration_s": 1.0, "exit_code": 0}},
     "status: Field required"),
    ({"status": "finished", "metrics": {"source": "nvml", "duration_s": 1.0, "exit_code": 0}}, "status: Input should be"),
    ({"status": "ended", "exit_code": 0, "metrics": {"source": "nvml", "exit_code": 0}}, r"metrics\.duration_s: Field required"),
    (None, r"\(value\): Input should be a valid dictionary"),
], ids=["metrics-renamed", "status-renamed", "unknown-status", "metrics-field-missing", "no-event"])
def test_a_collect_event_with_a_renamed_or_missing_key_fails_the_collect_at_once_naming_it(autodl_home, event, field):
    """The event comes back from the triggerer as JSON: a wrong key fails the task without retrying (a retry
    reads the same event), naming the key, and the run state keeps why for the record."""
    from airflow.sdk.exceptions import AirflowFailException

    from autodl.operators.steps import AutoDLCollectOperator
    from autodl.store import RunState

    op = AutoDLCollectOperator(task_id="g.collect_metrics", group_id="g")
    with pytest.raises(AirflowFailException, match=field) as failed:
        op.execute_complete(collect_op_context(), event)
    assert "the collect trigger's event is not a valid CollectEvent" in str(failed.value)
    assert "not a valid CollectEvent" in RunState().failures("d.g.r1")["collect"]
