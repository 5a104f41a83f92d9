"""AutoDLTrainOperator follows Airflow's conventions (issue 21): ``deferrable`` from ``[operators]
default_deferrable``, ``pool`` is Airflow's pool and ``gpu_pool`` autodl's inventory source, the DAG's
``default_args`` are not overridden, and the pipeline's warnings and errors are logged at their level."""

from __future__ import annotations

import logging
from datetime import datetime, timedelta
from pathlib import Path

import pytest
from airflow.sdk import DAG

from autodl.operators import AutoDLTrainOperator
from autodl.operators.steps import _leveled, log_level

REPO = Path(__file__).resolve().parents[2]
SPEC = str(REPO / "include/specs/simple_cnn.yaml")
DEMO_POOL = str(REPO / "include/pools/demo.yaml")


def _group(dag_id: str, default_args: dict | None = None, **kwargs) -> DAG:
    with DAG(dag_id, start_date=datetime(2026, 1, 1), schedule=None, default_args=default_args or {}) as dag:
        AutoDLTrainOperator(task_id="train", spec=SPEC, **kwargs)
    return dag


@pytest.mark.parametrize("setting, expected", [("True", True), ("False", False)])
def test_deferrable_defaults_from_operators_default_deferrable(monkeypatch, setting, expected):
    monkeypatch.setenv("AIRFLOW__OPERATORS__DEFAULT_DEFERRABLE", setting)
    dag = _group(f"autodl_defer_{setting}")
    for step in ("wait_for_pool", "select_device", "collect_metrics"):
        assert dag.get_task(f"train.{step}").deferrable is expected, step


def test_explicit_deferrable_wins_over_the_setting(monkeypatch):
    monkeypatch.setenv("AIRFLOW__OPERATORS__DEFAULT_DEFERRABLE", "False")
    assert _group("autodl_defer_explicit", deferrable=True).get_task("train.collect_metrics").deferrable is True


def test_gpu_pool_is_the_inventory_source_and_pool_is_airflows():
    dag = _group("autodl_pools", gpu_pool=DEMO_POOL, pool="gpu_trainings")
    for task in dag.tasks:
        assert task.pool == "gpu_trainings", task.task_id
    assert dag.get_task("train.profile").pool_source == DEMO_POOL
    assert dag.get_task("train.wait_for_pool").pool_source == DEMO_POOL


def test_without_pool_the_tasks_take_airflows_default_pool():
    dag = _group("autodl_default_pool", gpu_pool="auto")
    assert {t.pool for t in dag.tasks} == {"default_pool"}


@pytest.mark.parametrize("old_style", [DEMO_POOL, "auto", "nvml", "prometheus+http://127.0.0.1:9090",
                                       "include/pools/demo.yaml", "{{ params.pool }}"])
def test_old_style_pool_naming_an_inventory_is_refused_naming_gpu_pool(old_style):
    with pytest.raises(ValueError, match=r"inventory source is now 'gpu_pool': write gpu_pool="):
        _group("autodl_old_pool", pool=old_style)


def test_default_args_retries_and_delay_are_not_overridden():
    dag = _group("autodl_default_args", default_args={"retries": 5, "retry_delay": timedelta(minutes=2)})
    for step in ("profile", "launch", "release_and_record"):
        task = dag.get_task(f"train.{step}")
        assert task.retries == 5 and task.retry_delay == timedelta(minutes=2), step
    # the deferred steps keep their floors, and go above them with the DAG's retries
    assert dag.get_task("train.select_device").retries == 5
    assert dag.get_task("train.collect_metrics").retry_delay == timedelta(minutes=2)
    assert dag.get_task("train.wait_for_pool").retries >= 5


def test_without_default_args_airflows_defaults_apply_and_floors_stay():
    from autodl.operators.group import DEFERRED_STEP_RETRIES

    dag = _group("autodl_no_default_args")
    from airflow.configuration import conf

    from autodl.operators.group import TRANSIENT_RETRIES

    airflow_default = conf.getint("core", "default_task_retries", fallback=0)
    # every step is idempotent: Airflow's own failures are retried at least TRANSIENT_RETRIES times (issue 25)
    assert dag.get_task("train.launch").retries == max(airflow_default, TRANSIENT_RETRIES)
    assert dag.get_task("train.collect_metrics").retries == DEFERRED_STEP_RETRIES


def test_explicit_retries_win():
    dag = _group("autodl_explicit_retries", default_args={"retries": 5}, retries=2)
    assert dag.get_task("train.launch").retries == 2


def test_pipeline_lines_are_logged_at_their_level():
    assert log_level("  warning [cold-start]: the first steps are slower") == logging.WARNING
    assert log_level("  error   [shape-mismatch] line 12: shapes differ") == logging.ERROR
    assert log_level("could not stop the training r1: gone") == logging.WARNING
    assert log_level("booked lease L1: A100 ['0'] after waiting 0 s") == logging.INFO
    assert log_level("[train] could not find a checkpoint, starting fresh") == logging.INFO


SCRIPT_WITH_ITS_OWN_BATCH = """
import paddle
import paddle.nn as nn

class Net(nn.Layer):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(784, 10)

    def forward(self, x):
        return self.fc(x)

model = Net()
opt = paddle.optimizer.Adam(parameters=model.parameters())
for step in range(10):
    loss = model(paddle.randn([32, 784])).mean()
    loss.backward()
    opt.step()
"""


def test_a_real_profile_logs_its_warning_findings_as_warnings(caplog, tmp_path):
    """A script that uses batch 32 under a spec saying 64 gets the warning finding spec-batch-not-used: it
    reaches the task log at WARNING, the profile summary at INFO (seen, issue 21: everything was INFO)."""
    from autodl import pipeline

    script = tmp_path / "own_batch.py"
    script.write_text(SCRIPT_WITH_ITS_OWN_BATCH)
    logger = logging.getLogger("autodl.test.levels")
    with caplog.at_level(logging.INFO, logger="autodl.test.levels"):
        pipeline.step_profile(str(script), SPEC, pool=DEMO_POOL, probe=False, log=_leveled(logger))
    levels = {r.getMessage(): r.levelno for r in caplog.records}
    assert any(m.startswith("profile (") and lv == logging.INFO for m, lv in levels.items()), levels
    findings = {m: lv for m, lv in levels.items() if m.lstrip().startswith(("warning ", "error "))}
    assert any("[spec-batch-not-used]" in m for m in findings), list(levels)
    for message, level in findings.items():
        assert level == (logging.ERROR if message.lstrip().startswith("error") else logging.WARNING), message


def test_a_failed_runs_message_says_what_became_of_its_lease():
    """A fresh user: every failed run said "lease KEPT", also when the collect had freed it or none was booked."""
    from autodl.operators.steps import lease_words

    assert lease_words({"lease_released": True, "lease_kept": False}) == "lease freed"
    assert lease_words({"lease_released": False, "lease_kept": False}) == "no lease held any more"
    assert lease_words({"lease_released": False, "lease_kept": True}).startswith("lease KEPT")
