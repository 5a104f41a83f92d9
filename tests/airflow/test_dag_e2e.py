"""End to end: the example DAG run in-process by Airflow (dag.test) with real Paddle training on tiny data."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from autodl.ledger import Ledger
from autodl.records import RecordStore

pytestmark = [pytest.mark.airflow, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]
GROUP = "train_simple_cnn"
STEPS = ["profile", "wait_for_pool", "select_device", "launch", "collect_metrics", "release_and_record"]


def load_example_dag():
    spec = importlib.util.spec_from_file_location("autodl_example_dag", REPO / "dags" / "autodl_train_simple_cnn.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.dag


def run(dag, conf):
    from airflow.utils.session import create_session

    from airflow.models.dagrun import DagRun

    dr = dag.test(run_conf=conf)
    with create_session() as session:
        tis = dr.get_task_instances(session=session)
        states = {ti.task_id.split(".", 1)[-1]: str(ti.state) for ti in tis}
        states["<dag run>"] = str(session.get(DagRun, dr.id).state)
    return dr, states


def test_dag_has_the_six_steps_in_order():
    dag = load_example_dag()
    ids = [f"{GROUP}.{s}" for s in STEPS]
    assert sorted(dag.task_ids) == sorted(ids)
    for before, after in zip(ids, ids[1:]):
        assert before in dag.get_task(after).upstream_task_ids
    release = dag.get_task(ids[-1])
    # the group's last task: it runs whatever happened, and fails (after recording) a run that did not succeed
    assert not release.is_teardown and release.trigger_rule == "all_done"
    assert set(ids[:-1]) <= release.upstream_task_ids
    # every step is retried after a failure of Airflow's own (issue 25: the profile step had retries=0)
    assert all(dag.get_task(i).retries >= 3 for i in ids)
    wait, select, collect = dag.get_task(ids[1]), dag.get_task(ids[2]), dag.get_task(ids[4])
    # waiting and following happen in the triggerer by default; reschedule is the fallback mode
    assert wait.deferrable and select.deferrable and collect.deferrable and wait.mode == "reschedule"
    # one retry per poke the wait can make: a reschedule failed by apache/airflow#71172 is retried
    assert wait.retries == 3600 // 30 + 1 and wait.retry_delay.total_seconds() == 5


def test_non_deferrable_groups_reschedule_and_collect_in_the_worker():
    from datetime import datetime, timedelta

    from airflow.sdk import DAG

    from autodl.operators import AutoDLTrainOperator

    with DAG("autodl_fallback_check", start_date=datetime(2026, 1, 1), schedule=None) as dag:
        AutoDLTrainOperator(task_id="train", spec=str(REPO / "include/specs/simple_cnn.yaml"), deferrable=False,
                            execution_timeout=timedelta(hours=2))
    wait, collect = dag.get_task("train.wait_for_pool"), dag.get_task("train.collect_metrics")
    assert not wait.deferrable and wait.mode == "reschedule" and not collect.deferrable
    assert collect.execution_timeout == timedelta(hours=2)


def test_example_dag_trains_for_real_and_records(airflow_db, autodl_home):
    dag = load_example_dag()
    dr, states = run(dag, {"spec": str(REPO / "include/specs/simple_cnn.yaml"),
                           "script": str(REPO / "include/scripts/simple_cnn.py"), "pool": "auto"})
    assert states == {**{s: "success" for s in STEPS}, "<dag run>": "success"}, states
    assert Ledger().leases() == []
    records = RecordStore().list()
    assert len(records) == 1
    rec = records[0]
    assert rec.outcome == "succeeded" and rec.metrics["exit_code"] == 0
    assert rec.dag_id == "autodl_train_simple_cnn" and rec.run_id == dr.run_id
    # No driver here: the demo pool is declared and the policy's pick for the CNN spec is the A100 at index 0.
    assert rec.declared_pool is True
    assert rec.device_model == "A100-SXM4-40GB"
    assert rec.placement["devices"] == ["GPU-demo0000-a100-0000-0000-000000000000"]
    assert rec.estimated_peak_bytes > 0 and rec.actual_peak_bytes > 0
    log = Path(rec.launch["log_path"]).read_text()
    assert "done: 1 epoch(s)" in log and "on cpu" in log.lower()


def test_failing_training_is_recorded_failed_and_lease_freed(airflow_db, autodl_home, tmp_path):
    script = tmp_path / "broken_train.py"
    script.write_text(
        "import paddle\nimport paddle.nn as nn\n\n"
        "class Net(nn.Layer):\n    def __init__(self):\n        super().__init__()\n        self.fc = nn.Linear(8, 2)\n\n"
        "    def forward(self, x):\n        return self.fc(x)\n\n"
        "BATCH_SIZE = 4\n\nif __name__ == '__main__':\n    print('about to fail', flush=True)\n    raise SystemExit(3)\n"
    )
    dag = load_example_dag()
    _dr, states = run(dag, {"spec": str(REPO / "include/specs/simple_cnn.yaml"), "script": str(script), "pool": "auto"})
    assert states["collect_metrics"] == "failed"
    assert states["release_and_record"] == "failed"  # recorded, lease freed, and the run's failure said
    assert states["<dag run>"] == "failed"
    assert Ledger().leases() == []
    rec = RecordStore().list()[0]
    assert rec.outcome == "failed" and rec.metrics["exit_code"] == 3
    assert "exit code 3" in (rec.error or "")


def test_model_that_fits_nowhere_fails_fast_without_lease(airflow_db, autodl_home, tmp_path):
    spec = tmp_path / "huge.yaml"
    spec.write_text(f"task:\n  script: {REPO / 'include/scripts/simple_cnn.py'}\n  input_shape: [3, 32, 32]\n  batch_size_per_gpu: 100000000\n")
    dag = load_example_dag()
    _dr, states = run(dag, {"spec": str(spec), "script": "", "pool": "auto"})
    assert states["profile"] == "failed"
    assert states["release_and_record"] == "failed" and states["<dag run>"] == "failed"
    assert Ledger().leases() == []
    rec = RecordStore().list()[0]
    assert rec.outcome == "not_started"
    assert "no device in the pool" in rec.error and "largest device" in rec.error
    assert rec.profile is not None and rec.declared_pool  # the refusal keeps what the profile found


def test_wait_times_out_after_the_spec_timeout_when_the_pool_stays_busy(airflow_db, autodl_home, tmp_path):
    """All fitting devices are leased by another run for the whole wait: the sensor gives up after the
    spec's scheduler.timeout (a templated spec, so read at run time), nothing is launched, the other
    run's leases are untouched and this run holds none."""
    ledger = Ledger()
    others = ["GPU-demo0000-a100-0000-0000-000000000000", "GPU-demo0001-v100-0000-0000-000000000000",
              "GPU-demo0002-3090-0000-0000-000000000000"]
    ledger.book("someone-else", others)
    spec = tmp_path / "short_wait.yaml"
    spec.write_text(f"task:\n  script: {REPO / 'include/scripts/simple_cnn.py'}\n  input_shape: [3, 32, 32]\n"
                    "scheduler:\n  timeout: 2\n  poke_interval: 1\n")
    dag = load_example_dag()
    _dr, states = run(dag, {"spec": str(spec), "script": "", "pool": "auto"})
    assert states["profile"] == "success"
    assert states["wait_for_pool"] == "failed"
    assert states["launch"] == "upstream_failed" and states["release_and_record"] == "failed"
    assert states["<dag run>"] == "failed"
    assert [le.run_key for le in ledger.leases()] == ["someone-else"]
    rec = RecordStore().list()[0]
    assert rec.outcome == "not_started" and "no fitting device became free within 2 s" in rec.error


@pytest.mark.parametrize("case", ["missing_script", "syntax_error", "invalid_spec"])
def test_bad_input_fails_in_profile_with_the_message_and_no_lease(airflow_db, autodl_home, tmp_path, case):
    spec = tmp_path / "spec.yaml"
    script = tmp_path / "train.py"
    spec.write_text("task:\n  script: train.py\n")
    if case == "missing_script":
        expected = "does not exist"
    elif case == "syntax_error":
        script.write_text("import paddle\n\nclass Net(paddle.nn.Layer)\n    pass\n")
        expected = "train.py:3: syntax error"
    else:
        script.write_text("print('never run')\n")
        spec.write_text("task:\n  script: train.py\nresource_policy:\n  memory_threshold: 3\n")
        expected = "resource_policy.memory_threshold"
    dag = load_example_dag()
    _dr, states = run(dag, {"spec": str(spec), "script": "", "pool": "auto"})
    assert states["profile"] == "failed" and states["release_and_record"] == "failed"
    assert states["<dag run>"] == "failed"
    assert Ledger().leases() == []
    rec = RecordStore().list()[0]
    assert rec.outcome == "not_started" and expected in rec.error


def test_downstream_of_the_group_waits_for_a_good_training():
    from datetime import datetime

    from airflow.providers.standard.operators.empty import EmptyOperator
    from airflow.sdk import DAG

    from autodl.operators import AutoDLTrainOperator

    with DAG("autodl_chain_check", start_date=datetime(2026, 1, 1), schedule=None) as dag:
        prepare = EmptyOperator(task_id="prepare")
        train = AutoDLTrainOperator(task_id="train", spec=str(REPO / "include/specs/simple_cnn.yaml"))
        evaluate = EmptyOperator(task_id="evaluate")
        prepare >> train >> evaluate
    assert dag.get_task("evaluate").upstream_task_ids == {"train.release_and_record"}  # waits for the record
    assert dag.get_task("train.profile").upstream_task_ids == {"prepare"}
    # a literal spec path is read at parse time for the sensor's timeout
    assert float(dag.get_task("train.wait_for_pool").timeout) == 3600


def test_downstream_gets_the_runs_result_and_templated_args(airflow_db, autodl_home, tmp_path):
    """Issue 25: `train >> downstream` ran beside release_and_record and got None for the outcome; `task.args`
    could not be templated. Now the downstream runs after the record and pulls ``train.result`` (a RunResult);
    the script gets the args rendered for this run."""
    from datetime import datetime

    from airflow.sdk import DAG, task

    from autodl.operators import AutoDLTrainOperator

    script = tmp_path / "echo_args.py"
    script.write_text("import sys\nimport paddle\n\nBATCH_SIZE = 4\n\nif __name__ == '__main__':\n"
                      "    print('ARGS', sys.argv[1:], flush=True)\n")
    seen = tmp_path / "seen.json"
    with DAG("autodl_result_check", start_date=datetime(2026, 1, 1), schedule=None) as dag:
        train = AutoDLTrainOperator(task_id="train", script=str(script), spec=str(REPO / "include/specs/simple_cnn.yaml"),
                                    args=["--run", "{{ run_id }}"], sample_interval_s=0.2)

        @task
        def downstream(result):
            import json

            seen.write_text(json.dumps(result))

        train >> downstream(train.result)
    from tests.airflow.test_multi_host import serialize

    serialize(dag)
    dr, states = run(dag, None)
    assert states["release_and_record"] == "success" and states["<dag run>"] == "success", states
    import json

    result = json.loads(seen.read_text())
    rec = RecordStore().get(result["run_key"])
    assert result["outcome"] == "succeeded" == rec.outcome and result["exit_code"] == 0
    assert result["estimated_peak_bytes"] == rec.estimated_peak_bytes and result["actual_peak_bytes"] == rec.actual_peak_bytes
    log = Path(rec.launch["log_path"]).read_text()
    assert f"ARGS ['--run', '{dr.run_id}']" in log
