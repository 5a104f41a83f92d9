"""Train the small CNN on two GPUs of one host with Paddle's distributed launcher, in a Docker container.

The spec (include/specs/simple_cnn_multi_gpu.yaml) asks for two GPUs and data parallelism. autodl
books two devices of one model on one host (NVLink-connected preferred) and launches

    python -m paddle.distributed.launch --devices 0,1 simple_cnn.py ...

in a container whose device request lists the two booked GPUs by UUID; inside, they are devices
0 and 1, so ``--devices`` names positions, never host indices. /dev/shm is 8 GiB for NCCL.

The pool must hold two free GPUs of one model (a real NVML pool, or a pool file given as the
``pool`` param); the demo pool has no such pair, and the select step then says so.

    airflow dags test autodl_train_multi_gpu
"""

from __future__ import annotations

from datetime import datetime

from airflow.sdk import DAG

from autodl.config import include_dir
from autodl.operators import AutoDLTrainOperator
from autodl.operators.params import train_params

INCLUDE = include_dir()

with DAG(
    dag_id="autodl_train_multi_gpu",
    description="Small CNN on two GPUs (paddle.distributed.launch) placed and launched by autodl",
    schedule=None,
    start_date=datetime(2026, 1, 1),
    catchup=False,
    doc_md=__doc__,
    max_active_runs=1,
    tags=["autodl", "paddle", "distributed", "example"],
    params=train_params(spec=INCLUDE / "specs" / "simple_cnn_multi_gpu.yaml", pool=str(INCLUDE / "pools" / "gpu_node_2xa100.yaml")),
) as dag:
    train = AutoDLTrainOperator(
        task_id="train_two_gpus",
        script="{{ params.script }}",
        spec="{{ params.spec }}",
        gpu_pool="{{ params.pool }}",
        launcher="{{ params.launcher }}",
        policy="{{ params.policy }}",
    )
