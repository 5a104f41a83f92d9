"""The six steps under the KubernetesExecutor: a ``pod_override`` given once on the AutoDLTrainOperator group
reaches every step, survives DAG serialization (the scheduler runs the serialized DAG), and each step's worker
pod, built as the executor builds it (cncf.kubernetes' ``PodGenerator.construct_pod`` over the provider's basic
worker template), is a valid Kubernetes pod that carries the override."""

from __future__ import annotations

from datetime import datetime, timezone
from pathlib import Path

import kubernetes_validate
import pytest
from kubernetes import client as k8s
from kubernetes.client import ApiClient

K8S_VERSION = kubernetes_validate.utils.latest_version()
STEPS = ("profile", "wait_for_pool", "select_device", "launch", "collect_metrics", "release_and_record")


def _override() -> k8s.V1Pod:
    return k8s.V1Pod(
        metadata=k8s.V1ObjectMeta(labels={"team": "nlp"}),
        spec=k8s.V1PodSpec(
            service_account_name="autodl-launcher",  # RBAC to create, read and delete the training pods
            priority_class_name="airflow-workers",
            containers=[k8s.V1Container(
                name="base",
                resources=k8s.V1ResourceRequirements(requests={"cpu": "500m", "memory": "1Gi"},
                                                     limits={"memory": "2Gi"}),
                env=[k8s.V1EnvVar(name="AIRFLOW__AUTODL__DEFAULT_LAUNCHER", value="kubernetes")],
            )],
        ),
    )


@pytest.fixture
def dag(tmp_path):
    from airflow.sdk import DAG

    from autodl.operators import AutoDLTrainOperator

    script = tmp_path / "train.py"
    script.write_text("print('hi')\n")
    with DAG("autodl_kubernetes_executor", schedule=None, start_date=datetime(2026, 1, 1, tzinfo=timezone.utc)) as d:
        AutoDLTrainOperator(task_id="train", script=str(script), launcher="kubernetes",
                            default_args={"executor_config": {"pod_override": _override()}})
    return d


def _step_tasks(dag):
    tasks = {t.task_id.split(".", 1)[1]: t for t in dag.tasks if t.task_id.startswith("train.")}
    assert set(STEPS) <= set(tasks), sorted(tasks)
    return tasks


def test_pod_override_reaches_every_step_and_survives_serialization(dag):
    from airflow.serialization.serialized_objects import DagSerialization

    for step, task in _step_tasks(dag).items():
        assert isinstance(task.executor_config["pod_override"], k8s.V1Pod), step
    restored = DagSerialization.from_dict(DagSerialization.to_dict(dag))
    for step, task in _step_tasks(restored).items():
        override = task.executor_config["pod_override"]
        assert isinstance(override, k8s.V1Pod), step
        assert override.spec.service_account_name == "autodl-launcher", step


def test_every_steps_worker_pod_is_valid_and_carries_the_override(dag):
    from airflow.providers.cncf.kubernetes import pod_generator
    from airflow.providers.cncf.kubernetes.pod_generator import PodGenerator

    template = Path(pod_generator.__file__).parent / "kubernetes_executor_templates/basic_template.yaml"
    base = PodGenerator.deserialize_model_file(str(template))
    for step, task in _step_tasks(dag).items():
        pod = PodGenerator.construct_pod(
            dag_id=dag.dag_id, task_id=task.task_id, pod_id=f"autodl-{step.replace('_', '-')}", try_number=1,
            kube_image="autodl-airflow:0.1.0", date=None,
            args=["python", "-m", "airflow.sdk.execution_time.execute_workload", "--json-string", "{}"],
            pod_override_object=PodGenerator.from_obj(task.executor_config), base_worker_pod=base,
            namespace="airflow", scheduler_job_id="1", run_id="manual__1",
        )
        manifest = ApiClient().sanitize_for_serialization(pod)
        kubernetes_validate.validate(manifest, K8S_VERSION, strict=True)
        spec = manifest["spec"]
        assert spec["serviceAccountName"] == "autodl-launcher" and spec["priorityClassName"] == "airflow-workers"
        (container,) = [c for c in spec["containers"] if c["name"] == "base"]
        assert container["resources"]["requests"] == {"cpu": "500m", "memory": "1Gi"}, step
        assert container["image"] == "autodl-airflow:0.1.0"
        env = {e["name"]: e.get("value") for e in container["env"]}
        assert env["AIRFLOW__AUTODL__DEFAULT_LAUNCHER"] == "kubernetes" and env["foo"] == "bar", "lists concatenated"
        assert manifest["metadata"]["labels"]["team"] == "nlp"
        assert manifest["metadata"]["labels"]["task_id"].startswith("train."), "the executor's own labels stay"
        # the worker pod holds no device: with launcher kubernetes the training is a pod of its own
        assert not any("gpu" in k for k in (container["resources"].get("limits") or {}))
