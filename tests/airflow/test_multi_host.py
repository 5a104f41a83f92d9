"""Several GPU hosts on Airflow's own executors: a pool spans two hosts, and the steps that must run on the
booked host (launch, collect) are put on that host's Celery queue by autodl's cluster policy.

The DAG runs in-process (``dag.test``), through the same code the scheduler runs to create task
instances: mapped ``launch``/``collect_metrics`` instances are created after the booking
(``TaskMap.expand_mapped_task``) and the ``airflow.policy`` entry point of the installed package
(:mod:`autodl.policies`) sets their queue. The CeleryExecutor sends an instance to ``ti.queue``.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from autodl.ledger import Ledger
from autodl.records import RecordStore

pytestmark = pytest.mark.airflow

CASES = Path(__file__).resolve().parents[1] / "cases" / "multi_host"
DEVICE = {"gpu-a": "GPU-aaaa0000-0000-0000-0000-000000000000", "gpu-b": "GPU-bbbb0000-0000-0000-0000-000000000000"}
QUEUES = {"gpu-a": "q_gpu_a", "gpu-b": "q_gpu_b"}


def build_dag(dag_id: str, spec: Path, pool: Path):
    import pendulum
    from airflow.sdk import DAG

    from autodl.operators import AutoDLTrainOperator

    with DAG(dag_id, schedule=None, start_date=pendulum.datetime(2026, 1, 1, tz="UTC"), catchup=False) as dag:
        AutoDLTrainOperator(task_id="train", spec=str(spec), gpu_pool=str(pool), probe=False, sample_interval_s=0.2)
    return dag


def serialize(dag) -> None:
    """Write ``dag`` to the metadata database as the DAG processor would (``dag.test`` runs only
    serialized DAGs; this one is built in the test, not read from the dags folder)."""
    from airflow.dag_processing.bundles.manager import DagBundlesManager
    from airflow.dag_processing.dagbag import DagBag, sync_bag_to_db

    DagBundlesManager().sync_bundles_to_db()
    bag = DagBag(dag_folder="/dev/null")
    bag.bag_dag(dag)
    sync_bag_to_db(bag, "dags-folder", None)


def run_on(dag, busy_host: str | None):
    """One DAG run while ``busy_host``'s device is booked by another run, so the placement goes to the other host."""
    from airflow.utils.session import create_session

    ledger = Ledger()
    if busy_host:
        ledger.book("other-run", [DEVICE[busy_host]], host=busy_host, model="A100-SXM4-40GB")
    try:
        dr = dag.test()
    finally:
        if busy_host:
            ledger.release("other-run")
    with create_session() as session:
        tis = {(ti.task_id.split(".", 1)[1], ti.map_index): ti for ti in dr.get_task_instances(session=session)}
        return dr, {key: (str(ti.state), ti.queue) for key, ti in tis.items()}


def test_group_maps_launch_and_collect_only_when_hosts_have_queues(monkeypatch):
    spec, pool = CASES / "spec_local.yaml", CASES / "pool_two_hosts.yaml"
    plain = build_dag("autodl_one_host", spec, pool)
    assert not any(getattr(t, "is_mapped", False) for t in plain.tasks)
    monkeypatch.setenv("AUTODL_HOST_QUEUES", "gpu-a=q_gpu_a,gpu-b=q_gpu_b")
    routed = build_dag("autodl_two_hosts", spec, pool)
    mapped = sorted(t.task_id for t in routed.tasks if getattr(t, "is_mapped", False))
    assert mapped == ["train.collect_metrics", "train.launch"]
    # routed to the GPU host's worker, collect follows the training there, never from a triggerer elsewhere
    assert routed.get_task("train.collect_metrics").partial_kwargs["deferrable"] is False
    assert plain.get_task("train.collect_metrics").deferrable is True


def test_runs_placed_on_each_host_go_to_that_hosts_queue(airflow_db, monkeypatch):
    monkeypatch.setenv("AUTODL_HOST_QUEUES", ",".join(f"{h}={q}" for h, q in QUEUES.items()))
    dag = build_dag("autodl_two_hosts_routing", CASES / "spec_local.yaml", CASES / "pool_two_hosts.yaml")
    serialize(dag)
    for host, busy in (("gpu-a", "gpu-b"), ("gpu-b", "gpu-a")):
        dr, tis = run_on(dag, busy)
        assert all(state == "success" for state, _ in tis.values()), tis
        assert tis[("launch", 0)][1] == QUEUES[host] and tis[("collect_metrics", 0)][1] == QUEUES[host], tis
        # the steps that may run anywhere keep the default queue
        for step in ("profile", "wait_for_pool", "select_device", "release_and_record"):
            assert tis[(step, -1)][1] not in QUEUES.values(), (step, tis)
        record = RecordStore().get(f"autodl_two_hosts_routing.train.{dr.run_id}")
        assert record.outcome == "succeeded" and record.placement["host"] == host
        assert record.launch["host"] == host
    assert Ledger().leases() == []


def test_local_launch_refuses_a_host_it_is_not_on(monkeypatch):
    """Without routing a worker on gpu-a would start a training pinned to gpu-b's device ids: refused."""
    from autodl.errors import LaunchError
    from autodl.hosts import require_here

    monkeypatch.setenv("AUTODL_HOST", "gpu-a")
    require_here("gpu-a", "start the training", "k")
    require_here(None, "start the training", "k")
    with pytest.raises(LaunchError, match="booked devices are on host gpu-b, but this step runs on gpu-a"):
        require_here("gpu-b", "start the training", "k")

