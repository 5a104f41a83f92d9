"""DAGs the real-Airflow tests drive (tests/integration/test_airflow_real.py), on the one-device pool of the
Airflow case (tests/cases/airflow/pool_one_a100.yaml) with a stand-in training.

- ``autodl_queue_check``: the defaults (deferrable waiting and collecting), a 3-second training;
- ``autodl_crash_check``: the same with ``deferrable=False`` (rescheduled wait, collect in a worker), a long
  training by default; the ``spec`` Param picks another.
"""

from __future__ import annotations

from datetime import datetime
from pathlib import Path

from airflow.sdk import DAG, Param

from autodl.operators import AutoDLTrainOperator

HERE = Path(__file__).resolve().parent
POOL = str(HERE.parent.parent / "cases" / "airflow" / "pool_one_a100.yaml")

with DAG("autodl_queue_check", schedule=None, start_date=datetime(2026, 1, 1), catchup=False, max_active_runs=16,
         tags=["autodl-test"]) as autodl_queue_check:
    AutoDLTrainOperator(task_id="train", spec=str(HERE / "stand_in_short.yaml"), gpu_pool=POOL)

for dag_id, deferrable in [("autodl_crash_check", False), ("autodl_crash_check_deferrable", True)]:
    with DAG(dag_id, schedule=None, start_date=datetime(2026, 1, 1), catchup=False, max_active_runs=4,
             tags=["autodl-test"],
             params={"spec": Param(str(HERE / "stand_in_long.yaml"), type="string")}) as dag:
        AutoDLTrainOperator(task_id="train", spec="{{ params.spec }}", gpu_pool=POOL, deferrable=deferrable,
                            sample_interval_s=1.0)
    globals()[dag_id] = dag
