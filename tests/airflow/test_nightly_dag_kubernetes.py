"""The nightly retraining DAG with ``launcher: kubernetes``, no cluster: each night's pod, as autodl renders it (the
Kubernetes client's objects, validated with ``kubernetes-validate``), mounts the model's PersistentVolumeClaim at the
checkpoint path and tells the training so as the Docker launcher does (``AUTODL_OUTPUT_DIR=/autodl/output``), so the
second night resumes from the first night's checkpoint (issue 17).

A fake API server keeps the pods and claims in memory; its kubelet runs each pod it is given (init container, then
the training container, real Paddle on CPU) under bubblewrap, with the pod's volumes bound where the pod mounts them:
a claim is a folder that outlives the pod, an ``emptyDir`` a fresh one."""

from __future__ import annotations

import importlib.util
import shutil
import subprocess
import sys
import threading
from pathlib import Path

import kubernetes_validate
import pytest
import yaml
from kubernetes import client as k8s
from kubernetes.client import ApiClient
from kubernetes.client.exceptions import ApiException

from autodl.launch.docker import OUTPUT_DIR, output_volume_name
from autodl.launch.kubernetes import output_claim_name
from autodl.ledger import Ledger
from autodl.records import RecordStore
from tests.launch.test_kubernetes import CONTAINER_NAME, K8S_VERSION, FakeCoreV1Api

REPO = Path(__file__).resolve().parents[2]
DAG_FILE = REPO / "dags" / "autodl_nightly_text_classifier.py"
ROOT_DIRS = ("/usr", "/bin", "/lib", "/lib64", "/sbin", "/etc", sys.base_prefix, sys.prefix)
"""What of this machine stands for the training image: the interpreter, its libraries and the virtualenv (Paddle)."""

pytestmark = [pytest.mark.airflow, pytest.mark.slow]


class Kubelet(FakeCoreV1Api):
    """The fake API server, plus claims and a kubelet that runs each created pod under bubblewrap.

    :param claims: claim name -> folder for the claims that exist beforehand (the code and data an admin provides);
        a claim created through the API gets a new folder under ``root``.
    """

    def __init__(self, root: Path, claims: dict[str, Path]):
        super().__init__()
        self.root, self.claims = root, dict(claims)
        self.created_claims: list[k8s.V1PersistentVolumeClaim] = []
        self.rendered: list[dict] = []
        self.threads: list[threading.Thread] = []

    def read_namespaced_persistent_volume_claim(self, name, namespace):
        if name not in self.claims:
            raise ApiException(status=404, reason="NotFound")
        return next((c for c in self.created_claims if c.metadata.name == name), None)

    def create_namespaced_persistent_volume_claim(self, namespace, body):
        self.created_claims.append(body)
        self.claims[body.metadata.name] = self.root / "claims" / body.metadata.name
        self.claims[body.metadata.name].mkdir(parents=True)
        return body

    def create_namespaced_pod(self, namespace, body):
        self.rendered.append(ApiClient().sanitize_for_serialization(body))
        created = super().create_namespaced_pod(namespace, body)
        thread = threading.Thread(target=self._run, args=(body,), daemon=True)
        self.threads.append(thread)
        thread.start()
        return created

    # ------------------------------------------------------------------------------- the kubelet
    def _volumes(self, pod) -> dict[str, Path]:
        folders = {}
        for v in pod.spec.volumes or []:
            if v.persistent_volume_claim is not None:
                folders[v.name] = self.claims[v.persistent_volume_claim.claim_name]
            else:  # emptyDir: one per pod
                folders[v.name] = self.root / "pods" / pod.metadata.name / v.name
                folders[v.name].mkdir(parents=True, exist_ok=True)
        return folders

    def _argv(self, pod, container, volumes: dict[str, Path]) -> list[str]:
        ctx = pod.spec.security_context
        argv = ["bwrap", "--unshare-user", "--uid", str(ctx.run_as_user), "--gid", str(ctx.run_as_group),
                "--unshare-pid", "--unshare-net", "--unshare-ipc", "--die-with-parent", "--proc", "/proc",
                "--dev", "/dev", "--tmpfs", "/tmp", "--clearenv", "--setenv", "PATH", "/usr/bin:/bin", "--setenv",
                "HOME", "/tmp"]
        for folder in dict.fromkeys(ROOT_DIRS):
            if Path(folder).exists():
                argv += ["--ro-bind", folder, folder]
        for m in container.volume_mounts or []:
            argv += ["--ro-bind" if m.read_only else "--bind", str(volumes[m.name]), m.mount_path]
        for e in container.env or []:
            argv += ["--setenv", e.name, e.value or ""]
        return [*argv, "--chdir", container.working_dir or "/", "--", *container.command, *(container.args or [])]

    def _run(self, pod) -> None:
        name = pod.metadata.name
        volumes = self._volumes(pod)
        for init in pod.spec.init_containers or []:
            done = subprocess.run(self._argv(pod, init, volumes), capture_output=True, text=True)
            if done.returncode:
                self.logs[name] = done.stdout + done.stderr
                self.set_phase(name, "Failed", exit_code=done.returncode, namespace=pod.metadata.namespace)
                return
        (main,) = [c for c in pod.spec.containers if c.name == CONTAINER_NAME]
        self.set_phase(name, "Running", namespace=pod.metadata.namespace)
        proc = subprocess.Popen(self._argv(pod, main, volumes), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                text=True)
        self.logs[name] = ""
        for line in proc.stdout:
            self.logs[name] += line
        code = proc.wait()
        self.set_phase(name, "Succeeded" if code == 0 else "Failed", exit_code=code, namespace=pod.metadata.namespace)


def load_dag():
    spec = importlib.util.spec_from_file_location("autodl_nightly_dag_kubernetes", DAG_FILE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.dag


def nightly_spec(tmp_path: Path) -> Path:
    """The DAG's own spec with ``launcher: kubernetes``: the code on a claim at /workspace, the data set on a claim
    the cluster's pod template mounts at /data (where the script looks: ``../data`` from /workspace)."""
    template = tmp_path / "pod-template.yaml"
    template.write_text(yaml.safe_dump({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "template"}, "spec": {
        "containers": [{"name": "base", "volumeMounts": [{"name": "data", "mountPath": "/data", "readOnly": True}]}],
        "volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": "text-data", "readOnly": True}}]}}))
    spec = yaml.safe_load((REPO / "include/specs/text_classifier_nightly.yaml").read_text())
    spec["task"]["script"] = str((REPO / "include/scripts/text_classifier.py").resolve())
    spec["task"]["args"] = ["--epochs", "1", "--max-train", "256"]
    spec["launcher"] = {"type": "kubernetes", "image": "registry.example.com/ml/paddle-cpu:3.3.1",
                        "image_pull_policy": "Never", "namespace": "ml", "code_pvc": "training-code",
                        "python": f"{sys.prefix}/bin/python", "pod_template_file": str(template)}
    path = tmp_path / "nightly.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


def test_second_night_on_kubernetes_resumes_from_the_claim_the_first_night_wrote(airflow_db, autodl_home, tmp_path,
                                                                               monkeypatch):
    from airflow.models.dagrun import DagRun
    from airflow.utils.session import create_session

    from tests.integration.conftest import require_service

    require_service(shutil.which("bwrap") is not None, "bubblewrap", "run `source .ci/bubblewrap.sh`")
    kubelet = Kubelet(tmp_path / "cluster", {"training-code": REPO / "include/scripts", "text-data": REPO / "include/data"})
    monkeypatch.setattr("autodl.operators.connections.launcher_kwargs",
                        lambda launcher_type, host=None: {"api": kubelet} if launcher_type == "kubernetes" else {})
    dag = load_dag()
    spec = nightly_spec(tmp_path)
    runs = []
    for _night in range(2):
        dr = dag.test(run_conf={"spec": str(spec)})
        with create_session() as session:
            assert session.get(DagRun, dr.id).state == "success", [kubelet.logs.get(p["metadata"]["name"])
                                                                   for p in kubelet.rendered]
        runs.append(dr.run_id)
    for thread in kubelet.threads:
        thread.join()

    first_pod, second_pod = kubelet.rendered
    for pod in (first_pod, second_pod):
        kubernetes_validate.validate(pod, K8S_VERSION, strict=True)
    assert first_pod["metadata"]["name"] != second_pod["metadata"]["name"]
    claims = []
    for pod in (first_pod, second_pod):
        (container,) = [c for c in pod["spec"]["containers"] if c["name"] == CONTAINER_NAME]
        env = {e["name"]: e.get("value") for e in container["env"]}
        assert env["AUTODL_OUTPUT_DIR"] == OUTPUT_DIR == "/autodl/output", "the path the Docker launcher gives"
        (mount,) = [m for m in container["volumeMounts"] if m["mountPath"] == OUTPUT_DIR]
        assert not mount.get("readOnly")
        (volume,) = [v for v in pod["spec"]["volumes"] if v["name"] == mount["name"]]
        claims.append(volume["persistentVolumeClaim"]["claimName"])
        assert {"name": "data", "mountPath": "/data", "readOnly": True} in container["volumeMounts"], "the template's"
    assert claims[0] == claims[1], "both nights mount the model's one claim"
    (claim,) = kubelet.created_claims  # made on the first night, found on the second
    host_dir = claim.metadata.annotations["autodl/output-dir"]
    assert claim.metadata.name == claims[0] == output_claim_name(host_dir)
    assert output_claim_name(host_dir).endswith(output_volume_name(host_dir)[-12:]), "the Docker volume's hash"
    kubernetes_validate.validate(ApiClient().sanitize_for_serialization(claim), K8S_VERSION, strict=True)
    assert (kubelet.claims[claims[0]] / "last.pdparams").is_file(), "the checkpoint lives on the claim"

    assert Ledger().leases() == []
    records = {r.run_id: r for r in RecordStore().list()}
    first, second = records[runs[0]], records[runs[1]]
    assert first.outcome == second.outcome == "succeeded"
    assert first.launch["launcher"] == second.launch["launcher"] == "kubernetes"
    assert first.report["resumed_from"] is None and first.report["epoch"] == 1
    assert second.report["resumed_from"] == "/autodl/output/last.pdparams"
    assert second.report["resumed_epoch"] == 1 and second.report["epoch"] == 2
    # the pod's own measurement reached the record through its log: Paddle's peak and the script's steps
    assert second.metrics["peak_source"] == "paddle_reserved" and second.actual_peak_bytes > 0
