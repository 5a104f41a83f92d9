"""Train a small CNN image classifier with autodl: profile, wait for the pool, select, launch, collect, record.

Trigger it from the UI (the form's defaults work as they are: the spec's script on the `auto` pool, the
spec's launcher and policy) or run it end to end here:

    airflow dags test autodl_train_simple_cnn

Params: `script` (empty: the spec's `task.script`), `spec`, `pool` (`auto`, `nvml` or a pool file in
include/pools/), `launcher` and `policy` (`spec`: as the spec says). A conf key that is not one of these
fails the profile step with a message naming it. Each step has an "autodl run record" link to the run on
the GPU page (GPUs in the navigation bar).

On a machine without a GPU the pool is the declared demo pool (include/pools/demo.yaml): the policy
still ranks and books a device, the logs and the record say the devices are declared, and the
training runs on CPU.
"""

from __future__ import annotations

from datetime import datetime

from airflow.sdk import DAG

from autodl.config import include_dir
from autodl.operators import AutoDLTrainOperator
from autodl.operators.params import train_params

INCLUDE = include_dir()

with DAG(
    dag_id="autodl_train_simple_cnn",
    description="Small CNN on synthetic CIFAR-shaped data, placed and launched by autodl",
    schedule=None,  # triggered; dags/autodl_nightly_text_classifier.py is the nightly example
    start_date=datetime(2026, 1, 1),
    catchup=False,
    doc_md=__doc__,
    max_active_runs=1,
    tags=["autodl", "paddle", "example"],
    params=train_params(spec=INCLUDE / "specs" / "simple_cnn.yaml"),
) as dag:
    train = AutoDLTrainOperator(
        task_id="train_simple_cnn",
        script="{{ params.script }}",
        spec="{{ params.spec }}",
        gpu_pool="{{ params.pool }}",
        launcher="{{ params.launcher }}",
        policy="{{ params.policy }}",
        sample_interval_s=0.5,
    )
