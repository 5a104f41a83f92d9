"""The Docker and multi-GPU example DAGs import cleanly (DagBag) and build the six autodl steps."""

from __future__ import annotations

from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
DAGS = {
    "autodl_train_docker": ("autodl_train_docker.py", "train_in_docker", "simple_cnn_docker.yaml"),
    "autodl_train_multi_gpu": ("autodl_train_multi_gpu.py", "train_two_gpus", "simple_cnn_multi_gpu.yaml"),
}
STEPS = ["profile", "wait_for_pool", "select_device", "launch", "collect_metrics", "release_and_record"]


@pytest.fixture(scope="module")
def dagbag():
    pytest.importorskip("airflow")
    from airflow.dag_processing.dagbag import DagBag

    return DagBag(dag_folder=str(REPO / "dags"), safe_mode=False)


@pytest.mark.parametrize("dag_id", list(DAGS))
def test_dag_imports_and_builds_the_steps(dagbag, dag_id):
    filename, group, spec_name = DAGS[dag_id]
    errors = {k: v for k, v in dagbag.import_errors.items() if k.endswith(filename)}
    assert errors == {}
    dag = dagbag.dags.get(dag_id)  # get_dag() would consult the metadata DB
    assert dag is not None
    assert sorted(dag.task_ids) == sorted(f"{group}.{step}" for step in STEPS)
    assert dag.params["spec"].endswith(f"include/specs/{spec_name}")
    assert Path(dag.params["spec"]).is_file()
    assert dag.params["script"] is None  # empty (null): the spec's task.script is trained
    launch = dag.get_task(f"{group}.launch")
    assert [t.task_id for t in launch.upstream_list] == [f"{group}.select_device"]
