"""Nightly retraining: a Transformer text classifier, resumed from last night's checkpoint, placed and recorded by autodl.

Every night at 02:30 UTC autodl profiles `include/scripts/text_classifier.py` (a `paddle.nn.TransformerEncoder`
over `include/data/text/topics.tsv`, synthetic sentences on four topics, CC0), waits for a device that
fits, books it, trains **one more epoch** on top of the checkpoint the previous night left in the output
folder (`task.output_dir` of the spec, default `$AUTODL_HOME/outputs/text_classifier`), and writes the run
record: estimate vs actual peak, placement, and the training's own report (checkpoint and epoch it
resumed from, validation accuracy). The GPU page (GPUs in the navigation bar) shows each night's run.

**Unpausing does not start a run at once.** The schedule is a `CronTriggerTimetable` with
`run_immediately=timedelta(0)` and no `start_date`, with `catchup=False`: the first run is the next 02:30
UTC after the DAG is unpaused. (With a plain cron string and a `start_date` in the past, Airflow 3.3
starts the most recent missed night at once when the DAG is unpaused, even with `catchup=False`.)
Trigger it by hand to train now.

Start from this file for your own nightly job: change the spec (script, `args`, `output_dir`) and the
cron line; a script resumes when it reads `$AUTODL_OUTPUT_DIR` and says what it did in
`$AUTODL_REPORT_FILE` (see the script).
"""

from __future__ import annotations

from datetime import timedelta

from airflow.sdk import DAG
from airflow.timetables.trigger import CronTriggerTimetable

from autodl.config import include_dir
from autodl.operators import AutoDLTrainOperator
from autodl.operators.params import train_params

INCLUDE = include_dir()
NIGHTLY = CronTriggerTimetable("30 2 * * *", timezone="UTC", run_immediately=timedelta(0))
"""02:30 UTC every night; never the missed night at once when unpaused."""

with DAG(
    dag_id="autodl_nightly_text_classifier",
    description="Nightly Transformer text classifier retraining, resumed from last night's checkpoint",
    schedule=NIGHTLY,
    catchup=False,
    max_active_runs=1,
    doc_md=__doc__,
    tags=["autodl", "paddle", "nightly", "example"],
    params=train_params(spec=INCLUDE / "specs" / "text_classifier_nightly.yaml"),
) as dag:
    train = AutoDLTrainOperator(
        task_id="retrain_text_classifier",
        script="{{ params.script }}",
        spec="{{ params.spec }}",
        gpu_pool="{{ params.pool }}",
        launcher="{{ params.launcher }}",
        policy="{{ params.policy }}",
        sample_interval_s=0.5,
    )
