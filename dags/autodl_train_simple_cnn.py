"""Train a small CNN image classifier with autodl: profile, wait for the pool, select, launch, collect, record.

Trigger it from the UI with Params (script, spec, pool) or run it end to end here:

    airflow dags test autodl_train_simple_cnn

On a machine without a GPU the pool is the declared demo pool (include/pools/demo.yaml): the policy
still ranks and books a device, the logs and the record say the devices are declared, and the
training runs on CPU.
"""

from __future__ import annotations

from datetime import datetime

from airflow.sdk import DAG, Param

from autodl.config import include_dir
from autodl.operators import AutoDLTrainOperator

INCLUDE = include_dir()

with DAG(
    dag_id="autodl_train_simple_cnn",
    description="Small CNN on synthetic CIFAR-shaped data, placed and launched by autodl",
    schedule="@daily",  # nightly retraining
    start_date=datetime(2026, 1, 1),
    catchup=False,
    max_active_runs=1,
    tags=["autodl", "paddle", "example"],
    params={
        "script": Param("", type="string", description="Training script; empty: the spec's task.script"),
        "spec": Param(str(INCLUDE / "specs" / "simple_cnn.yaml"), type="string", description="Task spec YAML"),
        "pool": Param("auto", type="string", description="auto (NVML, else the demo pool), nvml, or a pool file"),
    },
) as dag:
    train = AutoDLTrainOperator(
        task_id="train_simple_cnn",
        script="{{ params.script }}",
        spec="{{ params.spec }}",
        pool="{{ params.pool }}",
        sample_interval_s=0.5,
    )
