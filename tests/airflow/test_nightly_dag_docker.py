"""The nightly retraining DAG with ``launcher: docker`` (a real engine, real Paddle CPU training in the container):
the second night resumes from the first night's checkpoint, kept in the model's output volume."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import yaml

from autodl.ledger import Ledger
from autodl.records import RecordStore

REPO = Path(__file__).resolve().parents[2]
DAG_FILE = REPO / "dags" / "autodl_nightly_text_classifier.py"

pytestmark = [pytest.mark.airflow, pytest.mark.slow, pytest.mark.integration]


@pytest.fixture
def docker_client():
    docker = pytest.importorskip("docker")
    from tests.integration.conftest import require_service

    try:
        client = docker.from_env(timeout=30)
        client.ping()
    except docker.errors.DockerException as exc:
        require_service(False, "Docker", f"no Docker engine answers ({exc}); run `source .ci/docker.sh`")
    yield client
    client.close()


def load_dag():
    spec = importlib.util.spec_from_file_location("autodl_nightly_dag_docker", DAG_FILE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.dag


def test_second_night_in_docker_resumes_from_the_first_nights_checkpoint(airflow_db, autodl_home, tmp_path,
                                                                         docker_client):
    from airflow.models.dagrun import DagRun
    from airflow.utils.session import create_session

    from tests.integration import paddle_image

    image = paddle_image.build(docker_client)
    spec = yaml.safe_load((REPO / "include/specs/text_classifier_nightly.yaml").read_text())
    spec["task"]["script"] = str((REPO / "include/scripts/text_classifier.py").resolve())
    spec["task"]["args"] = ["--epochs", "1", "--max-train", "256"]
    data = str((REPO / "include/data").resolve())
    spec["launcher"] = {"type": "docker", "image": image, "image_pull_policy": "Never", "network": "none",
                        "python": paddle_image.python_in_container(),
                        "mounts": [*paddle_image.python_mounts(), {"source": data, "target": "/data"}]}
    path = tmp_path / "nightly.yaml"
    path.write_text(yaml.safe_dump(spec))
    dag = load_dag()
    runs = []
    try:
        for _night in range(2):
            dr = dag.test(run_conf={"spec": str(path)})
            with create_session() as session:
                assert session.get(DagRun, dr.id).state == "success"
            runs.append(dr.run_id)
    finally:
        for container in docker_client.containers.list(all=True, filters={"label": "autodl.managed=true"}):
            if container.labels.get("autodl.dag_id") == dag.dag_id:
                container.remove(force=True)
        home = str(autodl_home)
        for volume in docker_client.volumes.list(filters={"label": "autodl.managed=true"}):
            if (volume.attrs.get("Labels") or {}).get("autodl.output_dir", "").startswith(home):
                volume.remove(force=True)
    assert Ledger().leases() == []
    records = {r.run_id: r for r in RecordStore().list()}
    first, second = records[runs[0]], records[runs[1]]
    assert first.outcome == second.outcome == "succeeded"
    assert first.launch["launcher"] == second.launch["launcher"] == "docker"
    assert first.report["resumed_from"] is None and first.report["epoch"] == 1
    assert second.report["resumed_from"] == "/autodl/output/last.pdparams"
    assert second.report["resumed_epoch"] == 1 and second.report["epoch"] == 2
    # the container's own measurement reached the record: Paddle's peak and the script's step times
    assert second.metrics["peak_source"] == "paddle_reserved" and second.actual_peak_bytes > 0
    assert second.metrics["steps"] and second.metrics["step_time_s"] > 0
