"""Train the small CNN in a Docker container pinned to the booked GPU: profile, wait, select, launch, collect, record.

The spec (include/specs/simple_cnn_docker.yaml) says ``launcher: docker``: the launch step creates a
container from the PaddlePaddle GPU image with a device request for exactly the booked GPU (inside,
it is device 0), the code folder mounted read-only at /workspace, a sized /dev/shm, a memory limit,
a non-root user and no network. The task log shows the equivalent ``docker run`` line.

The engine comes from the Airflow connection ``docker_default`` (extra ``base_url``; host/login/password
are the registry to pull from), else the local socket. GPUs need the NVIDIA Container Toolkit:
https://docs.nvidia.com/datacenter/cloud-native/container-toolkit/latest/install-guide.html

    airflow dags test autodl_train_docker
"""

from __future__ import annotations

from datetime import datetime

from airflow.sdk import DAG

from autodl.config import include_dir
from autodl.operators import AutoDLTrainOperator
from autodl.operators.params import train_params

INCLUDE = include_dir()

with DAG(
    dag_id="autodl_train_docker",
    description="Small CNN trained in a Docker container on the GPU autodl booked",
    schedule=None,
    start_date=datetime(2026, 1, 1),
    catchup=False,
    doc_md=__doc__,
    max_active_runs=1,
    tags=["autodl", "paddle", "docker", "example"],
    params=train_params(spec=INCLUDE / "specs" / "simple_cnn_docker.yaml"),
) as dag:
    train = AutoDLTrainOperator(
        task_id="train_in_docker",
        script="{{ params.script }}",
        spec="{{ params.spec }}",
        gpu_pool="{{ params.pool }}",
        launcher="{{ params.launcher }}",
        policy="{{ params.policy }}",
    )
