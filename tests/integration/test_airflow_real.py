"""autodl in a real Airflow 3 (api-server, scheduler with the LocalExecutor, dag-processor, triggerer on
127.0.0.1), driven through the REST API as the UI drives it.

What issue 9 saw (tests/cases/airflow/README.md): two runs of the user's pipeline on its one-device pool with
the default settings, the loser failed (its rescheduled sensor failed by the scheduler, apache/airflow#71172,
or select_device raising "busy now"); kill -9 of Airflow left the lease and the training behind for good.
Right behaviour: overlapping runs all succeed, one after the other; a lease nobody heartbeats any more is
reclaimed once its TTL has run out (its training stopped, the run recorded with why) and the next run trains.

The waits in these tests end when Airflow says the runs ended; their patience comes from the DAGs' own
limits (the specs' timeouts), so a broken Airflow fails a test instead of hanging it.
"""

from __future__ import annotations

import re
import time
from datetime import datetime
from itertools import combinations

import psutil
import pytest

from autodl.ledger import Ledger
from autodl.queue import AdmissionQueue
from autodl.records import RecordStore
from tests.integration.real_airflow import REPO, RealAirflow

pytestmark = [pytest.mark.integration, pytest.mark.airflow, pytest.mark.minutes]

TTL_S = 30
"""The lease TTL these tests run Airflow with (AUTODL_LEASE_TTL): short, so a crash is reclaimed quickly."""
SHORT_SPEC = str(REPO / "tests" / "integration" / "airflow_dags" / "stand_in_short.yaml")
MEDIUM_SPEC = str(REPO / "tests" / "integration" / "airflow_dags" / "stand_in_medium.yaml")


@pytest.fixture(scope="module")
def airflow(tmp_path_factory):
    home = tmp_path_factory.mktemp("real-airflow")
    af = RealAirflow(home, bundles={"cases": REPO / "tests" / "cases" / "airflow",
                                    "checks": REPO / "tests" / "integration" / "airflow_dags"},
                     env={"AUTODL_LEASE_TTL": str(TTL_S)})
    started = time.monotonic()
    try:
        af.start()
        print(f"\nreal Airflow up in {time.monotonic() - started:.0f} s at {af.url} (home {home})")
        yield af
    finally:
        af.stop()


@pytest.fixture
def store(airflow):
    url = airflow.env["AUTODL_STORE_URL"]
    return Ledger(url), AdmissionQueue(url), RecordStore(url)


def run_key(dag_id: str, run_id: str) -> str:
    return f"{dag_id}.train.{run_id}"


def training_intervals(records) -> list[tuple[float, float, str]]:
    """(start, end, run key) of each recorded training: the launch time and the measured duration."""
    out = []
    for r in records:
        start = datetime.fromisoformat(r.launch["started_at"]).timestamp()
        out.append((start, start + float(r.metrics["duration_s"]), r.run_key))
    return sorted(out)


def assert_one_after_the_other(records) -> None:
    spans = training_intervals(records)
    for (s1, e1, k1), (s2, e2, k2) in combinations(spans, 2):
        assert e1 <= s2 or e2 <= s1, f"{k1} and {k2} trained on the one device at the same time"


def report(airflow: RealAirflow, dag_id: str, runs: list[str]) -> str:
    lines = []
    for r in runs:
        tis = airflow.task_instances(dag_id, r)
        lines.append(f"{r}: " + ", ".join(f"{t.split('.')[-1]}={ti['state']}/try{ti['try_number']}"
                                          for t, ti in sorted(tis.items())))
    return "\n".join(lines)


def test_overlapping_runs_of_the_user_pipeline_all_succeed_one_after_the_other(airflow, store):
    """The case's two DAGs (the user's pipeline: prepare >> AutoDLTrainOperator >> evaluate on a one-device pool,
    real Paddle training): ``user_pipeline`` as written (deferrable=False: rescheduled waits, collect in a
    worker) and ``user_pipeline_deferrable``; two runs of each triggered at once, four runs for one device."""
    ledger, queue, records = store
    dags = ["user_pipeline", "user_pipeline_deferrable"]
    for dag_id in dags:
        airflow.wait_for_dag(dag_id)
    started = time.monotonic()
    runs = [(dag_id, airflow.trigger(dag_id)) for dag_id in dags for _ in range(2)]
    states = {}
    for dag_id in dags:  # the spec: scheduler.timeout 600 s for the waits, a short training each
        states.update(airflow.wait_for_runs(dag_id, [r for d, r in runs if d == dag_id], patience_s=1800))
    took = time.monotonic() - started
    detail = "\n".join(report(airflow, d, [r for dd, r in runs if dd == d]) for d in dags)
    print(f"\n4 overlapping runs of the user's pipeline ended in {took:.0f} s:\n{detail}")
    assert set(states.values()) == {"success"}, detail
    for dag_id, run_id in runs:
        tis = airflow.task_instances(dag_id, run_id)
        assert {t: ti["state"] for t, ti in tis.items()} == {t: "success" for t in tis}, detail
    recs = [records.get(run_key(d, r)) for d, r in runs]
    assert all(r is not None and r.outcome == "succeeded" and r.metrics["exit_code"] == 0 for r in recs)
    assert {r.placement["devices"][0] for r in recs} == {"GPU-team0000-a100-0000-0000-000000000000"}
    assert_one_after_the_other(recs)
    assert ledger.leases() == [] and queue.entries() == []
    owners = {r.run_key: r for r in recs}
    assert len(owners) == 4


def test_ten_overlapping_runs_with_the_defaults_all_succeed(airflow, store):
    """Ten runs of a DAG with the default settings (deferrable waiting and collecting) on the one-device pool,
    triggered at once: all succeed, one training at a time, in the order they joined the queue."""
    ledger, queue, records = store
    dag_id = "autodl_queue_check"
    airflow.wait_for_dag(dag_id)
    started = time.monotonic()
    runs = [airflow.trigger(dag_id) for _ in range(10)]
    states = airflow.wait_for_runs(dag_id, runs, patience_s=1800)  # scheduler.timeout 1800 s in the spec
    took = time.monotonic() - started
    detail = report(airflow, dag_id, runs)
    print(f"\n10 overlapping runs ended in {took:.0f} s:\n{detail}")
    assert set(states.values()) == {"success"}, detail
    recs = [records.get(run_key(dag_id, r)) for r in runs]
    assert all(r is not None and r.outcome == "succeeded" for r in recs), [r and r.error for r in recs]
    assert_one_after_the_other(recs)
    assert ledger.leases() == [] and queue.entries() == []
    # the collect step followed each training from the triggerer: the training's lines are in the task log
    log = airflow.task_log(dag_id, runs[-1], "train.collect_metrics")
    assert "[train] stand-in training of" in log and "training ended: exit code 0" in log


def _last_heartbeat(error: str) -> float:
    match = re.search(r"no heartbeat since (\S+) \(TTL", error)
    assert match, error
    return datetime.fromisoformat(match.group(1)).timestamp()


def test_a_worker_killed_mid_training_has_its_lease_reclaimed_and_the_next_run_trains(airflow, store):
    """``kill -9`` of the task's process tree (the LocalExecutor worker supervising collect_metrics, and the
    task process) while it follows a training (``deferrable=False``): nothing heartbeats the lease any more;
    once its TTL has run out the next waiting run reaps it (stops the orphaned training, records why) and trains."""
    ledger, queue, records = store
    dag_id = "autodl_crash_check"
    airflow.wait_for_dag(dag_id)
    first = airflow.trigger(dag_id)  # a long training
    key_a = run_key(dag_id, first)
    lease = airflow.until("the first run launched", lambda: (le := ledger.get(key_a)) and le.handle and le, 600)
    ti = airflow.until("collect_metrics running", lambda: (t := airflow.task_instances(dag_id, first).get("train.collect_metrics"))
                     and t["state"] == "running" and t.get("pid") and t, 600)
    second = airflow.trigger(dag_id, conf={"spec": SHORT_SPEC})
    key_b = run_key(dag_id, second)
    airflow.until("the second run waiting in the queue", lambda: queue.get(key_b), 600)

    task = psutil.Process(ti["pid"])
    worker = task.parent()  # the LocalExecutor worker that supervises the task
    assert worker.pid not in {p.pid for p in airflow.procs.values()}
    tree = [worker, task, *task.children(recursive=True)]
    training = psutil.Process(lease.handle["pid"])
    for proc in tree:
        proc.kill()
    killed_at = time.time()
    assert training.is_running()  # the training runs on, orphaned, its lease held

    states = airflow.wait_for_runs(dag_id, [second], patience_s=1800)
    detail = report(airflow, dag_id, [first, second])
    assert states[second] == "success", detail
    rec_a, rec_b = records.get(key_a), records.get(key_b)
    assert rec_b.outcome == "succeeded", rec_b.error
    assert "expired: no heartbeat since" in rec_a.error and "its training stopped" in rec_a.error
    assert not training.is_running() or training.status() == psutil.STATUS_ZOMBIE
    beat = _last_heartbeat(rec_a.error)
    b_started = datetime.fromisoformat(rec_b.launch["started_at"]).timestamp()
    print(f"\nkilled at +0 s; last heartbeat {beat - killed_at:+.1f} s; lease expired {beat + TTL_S - killed_at:+.1f} s; "
          f"next run trained from {b_started - killed_at:+.1f} s (TTL {TTL_S} s)\n{detail}")
    assert b_started >= beat + TTL_S  # never before the TTL ran out
    assert b_started - (beat + TTL_S) < 120  # reclaimed at the next polls after it ran out
    states = airflow.wait_for_runs(dag_id, [first], patience_s=600)  # Airflow finds the dead worker (60 s)
    assert states[first] == "failed"
    assert ledger.leases() == []


def test_a_killed_triggerer_leaves_a_lease_that_is_reclaimed_after_its_ttl(airflow, store):
    """The default (deferrable) collect follows the training from the triggerer. ``kill -9`` of the triggerer
    for longer than the deferred lease's TTL (raised above this module's 30 s to outlive Airflow's triggerer
    failover, :func:`autodl.pipeline.deferred_lease_ttl_s`): when it is back the dead lease is reclaimed (the
    training stopped, the run failed with why) and the run waiting behind it trains."""
    ledger, queue, records = store
    dag_id = "autodl_crash_check_deferrable"
    airflow.wait_for_dag(dag_id)
    first = airflow.trigger(dag_id)
    key_a = run_key(dag_id, first)
    lease = airflow.until("the first run launched", lambda: (le := ledger.get(key_a)) and le.handle and le, 600)
    airflow.until("collect_metrics deferred", lambda: (airflow.task_instances(dag_id, first).get("train.collect_metrics")
                                                     or {}).get("state") == "deferred", 600)
    second = airflow.trigger(dag_id, conf={"spec": SHORT_SPEC})
    key_b = run_key(dag_id, second)
    airflow.until("the second run waiting in the queue", lambda: queue.get(key_b), 600)
    training = psutil.Process(lease.handle["pid"])

    ttl = airflow.until("the deferred lease's TTL", lambda: (le := ledger.get(key_a)) and le.ttl_s != TTL_S and le.ttl_s, 60)
    assert ttl >= 70  # 30 s + 5 s failover, 1 s samples, 20 s margin: TTL - TTL/5 covers them
    airflow.kill_component("triggerer")
    killed_at = time.time()
    time.sleep(ttl + 5)  # longer than the TTL: the lease is dead now, nobody has reaped it yet
    assert ledger.get(key_a) is not None and ledger.get(key_a).expired() and training.is_running()
    airflow.start_component("triggerer")
    restarted_at = time.time()

    states = airflow.wait_for_runs(dag_id, [first, second], patience_s=1800)
    detail = report(airflow, dag_id, [first, second])
    rec_a, rec_b = records.get(key_a), records.get(key_b)
    b_started = datetime.fromisoformat(rec_b.launch["started_at"]).timestamp()
    print(f"\ntriggerer killed at +0 s, back at {restarted_at - killed_at:+.1f} s; next run trained from "
          f"{b_started - killed_at:+.1f} s\n{detail}\nfirst run: {rec_a.error}")
    assert states == {first: "failed", second: "success"}, detail
    assert rec_b.outcome == "succeeded" and rec_a.outcome == "failed"
    assert "expired" in rec_a.error or "is dead" in rec_a.error or "is gone" in rec_a.error
    assert not training.is_running() or training.status() == psutil.STATUS_ZOMBIE
    assert ledger.leases() == []


def test_a_triggerer_down_8_s_keeps_the_lease_and_the_run_succeeds(airflow, store):
    """Issue 23: a triggerer down 8 s with a 30 s TTL (this module's) failed the run. Airflow hands a killed
    triggerer's triggers to the restarted one only once the old one's heartbeat is older than
    ``[triggerer] triggerer_health_check_threshold`` (30 s): the deferred lease's TTL covers that. The lease
    never expires meanwhile, the collect trigger resumes from its saved offset, the run succeeds and its record
    holds every step, each log line once."""
    ledger, _queue, records = store
    dag_id = "autodl_crash_check_deferrable"
    airflow.wait_for_dag(dag_id)
    run = airflow.trigger(dag_id, conf={"spec": MEDIUM_SPEC})
    key = run_key(dag_id, run)
    airflow.until("the run launched", lambda: (le := ledger.get(key)) and le.handle and le, 600)
    airflow.until("collect_metrics deferred", lambda: (airflow.task_instances(dag_id, run).get("train.collect_metrics")
                                                     or {}).get("state") == "deferred", 600)
    airflow.until("the training's first steps followed", lambda: "step 2" in airflow.task_log(dag_id, run, "train.collect_metrics"), 120)
    airflow.kill_component("triggerer")
    time.sleep(8)
    airflow.start_component("triggerer")
    expired_seen: list[str] = []

    def ended() -> bool:
        lease = ledger.get(key)
        if lease is not None and lease.expired():
            expired_seen.append(f"lease expired at {lease.expires_at} (last heartbeat {lease.heartbeat_at}, TTL {lease.ttl_s} s)")
        return airflow.run_state(dag_id, run) in ("success", "failed")

    airflow.until(f"the run of {dag_id} ending", ended, 1800)  # the spec's scheduler.timeout
    detail = report(airflow, dag_id, [run])
    rec = records.get(key)
    assert expired_seen == [], detail
    assert airflow.run_state(dag_id, run) == "success", f"{detail}\n{rec and rec.error}"
    assert rec.outcome == "succeeded" and rec.metrics["exit_code"] == 0
    log = airflow.task_log(dag_id, run, "train.collect_metrics")
    done = re.search(r"\[train\] stand-in training of \S+ done after (\d+) steps", log)
    assert done, log[-3000:]
    n = int(done.group(1))
    assert rec.metrics["steps"] == n  # every step the training reported, none lost across the restart
    lines = re.findall(r"\[train\] (step \d+)\s*$", log, flags=re.M)
    assert lines == [f"step {i}" for i in range(1, n + 1)], lines  # each line once, in order
    assert ledger.leases() == []
