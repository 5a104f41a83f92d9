"""KubernetesLauncher without a cluster: every pod validated against the Kubernetes schema and run
through KubernetesPodOperator's dry run; launch/poll/logs/stop against a recording fake CoreV1Api."""

from __future__ import annotations

import re
from pathlib import Path
import time
from datetime import datetime, timedelta, timezone

import kubernetes_validate
import pytest
import yaml
from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException

from autodl.errors import LaunchError
from autodl.launch import get_launcher
from autodl.launch.base import LaunchRequest
from autodl.launch.kubernetes import (
    CONTAINER_NAME,
    RUN_KEY_HASH_LABEL,
    KubernetesLauncher,
    pod_resource_total,
    product_label_value,
    safe_label_value,
)
from autodl.types import Device

K8S_VERSION = kubernetes_validate.utils.latest_version()
LABEL_VALUE = re.compile(r"(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?")
DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
VISIBILITY = {"CUDA_VISIBLE_DEVICES", "NVIDIA_VISIBLE_DEVICES", "ASCEND_RT_VISIBLE_DEVICES", "ASCEND_VISIBLE_DEVICES",
              "XPU_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES"}
MODELS = {"nvidia": "A100-SXM4-40GB", "ascend": "Ascend-910B", "kunlun": "Kunlun-R200", "amd": "MI250X",
          "hygon": "DCU-Z100"}
RUN_ID = "scheduled__2026-01-01T00:00:00+00:00"


def devices(vendor="nvidia", n=2, model=None) -> list[Device]:
    return [Device(device_id=f"{vendor}-{i}", index=i + 2, uuid=f"GPU-{i}", model=model or MODELS[vendor], vendor=vendor,
                   memory_total_bytes=40 << 30) for i in range(n)]


def request_for(catalog, *, vendor="nvidia", devs=None, try_number="1", **kw) -> LaunchRequest:
    labels = {"dag_id": "autodl_train_multi_gpu", "run_id": RUN_ID, "task_id": "train.launch",
              "try_number": try_number, "lease_id": "lease-7"}
    return LaunchRequest(run_key=kw.pop("run_key", f"autodl_train_multi_gpu/{RUN_ID}/train"),
                         script="/opt/code/train.py", devices=devs if devs is not None else devices(vendor),
                         vendor=catalog.vendor(vendor), labels=labels, **kw)


def manifest(catalog, **kw) -> dict:
    return KubernetesLauncher(catalog=catalog).render(request_for(catalog, **kw))["pod"]


CASES = {
    "nvidia-1": dict(devs=devices(n=1)),
    "nvidia-2-distributed": dict(distributed=True, shm_bytes=8 << 30, memory_limit_bytes=64 << 30),
    "cpu": dict(devs=[]),
    "declared-pool": dict(on_cpu=True),
    "ascend": dict(vendor="ascend"),
    "kunlun": dict(vendor="kunlun"),
    "amd": dict(vendor="amd"),
    "hygon": dict(vendor="hygon"),
    "spec-options": dict(options={"namespace": "ml", "node_selector": {"pool": "train"}, "service_account": "trainer",
                                  "tolerations": [{"key": "dedicated", "operator": "Equal", "value": "ml",
                                                   "effect": "NoExecute", "toleration_seconds": 60}],
                                  "image_pull_secrets": ["regcred"], "code_pvc": "code", "cpus": 8,
                                  "memory_limit": "48g", "shm_size": "16g"}),
}


@pytest.mark.parametrize("case", CASES, ids=list(CASES))
def test_every_pod_is_valid_kubernetes(catalog, case):
    pod = manifest(catalog, **CASES[case])
    kubernetes_validate.validate(pod, K8S_VERSION, strict=True)
    meta = pod["metadata"]
    assert DNS_LABEL.fullmatch(meta["name"]) and len(meta["name"]) <= 63
    for key, value in meta["labels"].items():
        assert LABEL_VALUE.fullmatch(value) and len(value) <= 63, (key, value)
    env = {e["name"] for e in pod["spec"]["containers"][0].get("env", [])}
    assert not (env & VISIBILITY - {"NVIDIA_VISIBLE_DEVICES"}), "the device plugin pins, not environment variables"


def test_schema_validation_catches_a_broken_pod(catalog):
    """Guard: the validator used above does reject a wrong pod."""
    pod = manifest(catalog)
    pod["spec"]["nodeSelector"] = {"nvidia.com/gpu.product": 3}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(pod, K8S_VERSION, strict=True)


def test_gpu_limits_requests_selector_toleration(catalog):
    pod = manifest(catalog, distributed=True)
    (container,) = pod["spec"]["containers"]
    assert container["name"] == CONTAINER_NAME
    assert container["resources"]["limits"]["nvidia.com/gpu"] == "2"
    assert container["resources"]["requests"]["nvidia.com/gpu"] == "2"  # extended resources: request == limit
    assert pod_resource_total(pod, "nvidia.com/gpu") == 2
    assert pod["spec"]["nodeSelector"] == {"nvidia.com/gpu.product": "NVIDIA-A100-SXM4-40GB"}
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in pod["spec"]["tolerations"]
    # no CUDA_VISIBLE_DEVICES in the pod (the device plugin pins): positions; rank logs under /tmp
    assert container["command"] == ["python", "-u", "-m", "paddle.distributed.launch", "--devices", "0,1",
                                    "--log_dir", "/tmp/autodl-launch-logs", "/workspace/train.py"]
    env = {e["name"]: e["value"] for e in container["env"]}
    assert not VISIBILITY & env.keys()


def test_resource_total_sums_containers():
    pod = {"spec": {"containers": [{"resources": {"limits": {"nvidia.com/gpu": "2"}}},
                                   {"resources": {"limits": {"nvidia.com/gpu": "1"}}}, {}],
                    "initContainers": [{"resources": {"limits": {"nvidia.com/gpu": "1"}}}]}}
    assert pod_resource_total(pod, "nvidia.com/gpu") == 3
    pod["spec"]["initContainers"][0]["resources"]["limits"]["nvidia.com/gpu"] = "4"
    assert pod_resource_total(pod, "nvidia.com/gpu") == 4


@pytest.mark.parametrize(("model", "label"), [
    ("A100-SXM4-40GB", "NVIDIA-A100-SXM4-40GB"),
    ("H100-SXM5-80GB", "NVIDIA-H100-80GB-HBM3"),
    ("V100-PCIE-16GB", "Tesla-V100-PCIE-16GB"),
])
def test_gfd_product_label(catalog, model, label):
    """GPU Feature Discovery labels nodes nvidia.com/gpu.product=<NVML name, spaces as dashes>."""
    assert product_label_value(model, catalog) == label
    pod = manifest(catalog, devs=devices(model=model))
    assert pod["spec"]["nodeSelector"]["nvidia.com/gpu.product"] == label


@pytest.mark.parametrize(("vendor", "resource", "taint"), [
    ("ascend", "huawei.com/Ascend910", "huawei.com/Ascend910"),
    ("kunlun", "kunlunxin.com/xpu", "kunlunxin.com/xpu"),
    ("amd", "amd.com/gpu", "amd.com/gpu"),
    ("hygon", "hygon.com/dcu", "hygon.com/dcu"),
])
def test_vendor_resource_names_from_the_catalog(catalog, vendor, resource, taint):
    pod = manifest(catalog, vendor=vendor)
    assert pod["spec"]["containers"][0]["resources"]["limits"] == {resource: "2"}
    assert pod_resource_total(pod, resource) == 2
    assert any(t["key"] == taint for t in pod["spec"]["tolerations"])
    env = {e["name"]: e["value"] for e in pod["spec"]["containers"][0]["env"]}
    assert env["AUTODL_PADDLE_DEVICE"] == catalog.vendor(vendor).paddle_device


def test_cpu_pod_requests_no_device_and_hides_gpus(catalog):
    pod = manifest(catalog, devs=[])
    container = pod["spec"]["containers"][0]
    assert "resources" not in container or not container["resources"].get("limits")
    assert "nodeSelector" not in pod["spec"] and "tolerations" not in pod["spec"]
    env = {e["name"]: e["value"] for e in container["env"]}
    assert env["NVIDIA_VISIBLE_DEVICES"] == "void"


def test_shm_is_a_sized_memory_emptydir(catalog):
    pod = manifest(catalog, shm_bytes=8 << 30, memory_limit_bytes=64 << 30)
    (vol,) = [v for v in pod["spec"]["volumes"] if v["name"] == "dshm"]
    assert vol["emptyDir"] == {"medium": "Memory", "sizeLimit": "8Gi"}
    mounts = pod["spec"]["containers"][0]["volumeMounts"]
    assert {"name": "dshm", "mountPath": "/dev/shm"} in mounts
    assert pod["spec"]["containers"][0]["resources"]["limits"]["memory"] == "64Gi"


def test_non_root_security_context(catalog):
    pod = manifest(catalog)
    assert pod["spec"]["securityContext"]["runAsNonRoot"] is True
    assert pod["spec"]["securityContext"]["runAsUser"] == 1000
    assert pod["spec"]["containers"][0]["securityContext"]["allowPrivilegeEscalation"] is False
    assert pod["spec"]["automountServiceAccountToken"] is False


def test_non_numeric_user_is_refused(catalog):
    with pytest.raises(LaunchError, match="numeric uid"):
        manifest(catalog, options={"user": "trainer"})


def test_spec_options_reach_the_pod(catalog):
    pod = manifest(catalog, **CASES["spec-options"])
    spec = pod["spec"]
    assert pod["metadata"]["namespace"] == "ml"
    assert spec["nodeSelector"] == {"nvidia.com/gpu.product": "NVIDIA-A100-SXM4-40GB", "pool": "train"}
    assert {"key": "dedicated", "operator": "Equal", "value": "ml", "effect": "NoExecute",
            "tolerationSeconds": 60} in spec["tolerations"]
    assert spec["serviceAccountName"] == "trainer" and spec["automountServiceAccountToken"] is True
    assert spec["imagePullSecrets"] == [{"name": "regcred"}]
    limits = spec["containers"][0]["resources"]["limits"]
    assert limits == {"nvidia.com/gpu": "2", "memory": "48Gi", "cpu": "8000m"}
    assert {"name": "code", "mountPath": "/workspace", "readOnly": True} in spec["containers"][0]["volumeMounts"]
    (code,) = [v for v in spec["volumes"] if v["name"] == "code"]
    assert code["persistentVolumeClaim"] == {"claimName": "code", "readOnly": True}


def test_spec_env_cannot_pin_in_kubernetes(catalog):
    pod = manifest(catalog, options={"env": {"CUDA_VISIBLE_DEVICES": "3", "OMP_NUM_THREADS": "4"}})
    env = {e["name"]: e["value"] for e in pod["spec"]["containers"][0]["env"]}
    assert "CUDA_VISIBLE_DEVICES" not in env and env["OMP_NUM_THREADS"] == "4"


def test_labels_sanitised_annotations_verbatim(catalog):
    pod = manifest(catalog)
    labels, notes = pod["metadata"]["labels"], pod["metadata"]["annotations"]
    assert notes["autodl/run-id"] == RUN_ID
    assert notes["autodl/run-key"] == f"autodl_train_multi_gpu/{RUN_ID}/train"
    assert labels["autodl/run-id"] != RUN_ID and LABEL_VALUE.fullmatch(labels["autodl/run-id"])
    assert labels["autodl/dag-id"] == "autodl_train_multi_gpu"
    assert labels["autodl/try-number"] == "1" and labels["autodl/lease-id"] == "lease-7"
    assert labels["app.kubernetes.io/managed-by"] == "autodl"


@pytest.mark.parametrize("value", ["x" * 100, "a:b", "-lead", "trail.", "ok_value-1", "+++", RUN_ID])
def test_safe_label_value(value):
    safe = safe_label_value(value)
    assert LABEL_VALUE.fullmatch(safe) and len(safe) <= 63
    if LABEL_VALUE.fullmatch(value) and len(value) <= 63:
        assert safe == value
    assert safe_label_value(value + "!") != safe


def test_pod_name_unique_per_try(catalog):
    names = {KubernetesLauncher(catalog=catalog).render(request_for(catalog, try_number=t))["pod_name"]
             for t in ("1", "2")}
    assert len(names) == 2


# --------------------------------------------------------------- KubernetesPodOperator dry run
def test_pod_runs_unchanged_under_kubernetes_pod_operator(catalog, capsys):
    from airflow.providers.cncf.kubernetes.operators.pod import KubernetesPodOperator

    pod = KubernetesLauncher(catalog=catalog).build_pod(request_for(catalog, distributed=True, shm_bytes=8 << 30))
    KubernetesPodOperator(task_id="train", full_pod_spec=pod).dry_run()
    out = capsys.readouterr().out
    printed = yaml.safe_load(out[out.index("api_version:"):])  # Airflow may log a line before the YAML
    spec = printed["spec"]
    (container,) = spec["containers"]
    assert container["name"] == "base", "our container must be KubernetesPodOperator's base container"
    assert container["resources"]["limits"]["nvidia.com/gpu"] == "2"
    assert container["command"][:4] == ["python", "-u", "-m", "paddle.distributed.launch"]
    assert spec["node_selector"] == {"nvidia.com/gpu.product": "NVIDIA-A100-SXM4-40GB"}
    assert {"name": "dshm", "empty_dir": {"medium": "Memory", "size_limit": "8Gi"}} in spec["volumes"]
    assert spec["security_context"]["run_as_non_root"] is True
    assert printed["metadata"]["labels"][RUN_KEY_HASH_LABEL] == pod.metadata.labels[RUN_KEY_HASH_LABEL]


# ------------------------------------------------------------------------ fake CoreV1Api
class FakeCoreV1Api:
    """Records calls and keeps pods in memory, answering as the API server would (models, ApiException)."""

    def __init__(self):
        self.calls: list[tuple] = []
        self.pods: dict[tuple[str, str], k8s.V1Pod] = {}
        self.logs: dict[str, str] = {}
        self.refuse_create: ApiException | None = None
        self._clock = datetime(2026, 1, 1, tzinfo=timezone.utc)

    def list_namespaced_pod(self, namespace, label_selector=""):
        self.calls.append(("list", namespace, label_selector))
        key, _, value = label_selector.partition("=")
        items = [p for (ns, _), p in self.pods.items() if ns == namespace and (p.metadata.labels or {}).get(key) == value]
        return k8s.V1PodList(items=items)

    def create_namespaced_pod(self, namespace, body):
        self.calls.append(("create", namespace, body.metadata.name))
        if self.refuse_create is not None:
            raise self.refuse_create
        if (namespace, body.metadata.name) in self.pods:
            raise ApiException(status=409, reason="AlreadyExists")
        self._clock += timedelta(seconds=1)
        body.metadata.creation_timestamp = self._clock
        body.status = k8s.V1PodStatus(phase="Pending")
        self.pods[(namespace, body.metadata.name)] = body
        return body

    def read_namespaced_pod(self, name, namespace):
        self.calls.append(("read", namespace, name))
        try:
            return self.pods[(namespace, name)]
        except KeyError:
            raise ApiException(status=404, reason="NotFound") from None

    def read_namespaced_pod_log(self, name, namespace, container=None, **kwargs):
        self.calls.append(("log", namespace, name, container, kwargs))
        if (namespace, name) not in self.pods:
            raise ApiException(status=404, reason="NotFound")
        if name not in self.logs:
            raise ApiException(status=400, reason="BadRequest")  # container creating
        if kwargs.get("_preload_content", True):
            return self.logs[name]
        # follow=True, timestamps=True: the kubelet's RFC 3339 time before each line (here: line i at i ns),
        # and the stream ends with what is there (as when the connection drops)
        lines = self.logs[name].splitlines(keepends=True)
        return FakeLogResponse("".join(f"2026-12-01T00:00:00.{i + 1:09d}Z {line}" for i, line in enumerate(lines)))

    def delete_namespaced_pod(self, name, namespace, grace_period_seconds=None):
        self.calls.append(("delete", namespace, name, grace_period_seconds))
        if self.pods.pop((namespace, name), None) is None:
            raise ApiException(status=404, reason="NotFound")

    # test helpers
    def set_phase(self, name, phase, *, exit_code=None, waiting=None, namespace="default"):
        pod = self.pods[(namespace, name)]
        state = None
        if exit_code is not None:
            state = k8s.V1ContainerState(terminated=k8s.V1ContainerStateTerminated(exit_code=exit_code))
        elif waiting:
            state = k8s.V1ContainerState(waiting=k8s.V1ContainerStateWaiting(reason=waiting, message="no such image"))
        status = k8s.V1ContainerStatus(name=CONTAINER_NAME, image="x", image_id="", ready=False, restart_count=0,
                                       state=state)
        pod.status = k8s.V1PodStatus(phase=phase, container_statuses=[status])

    def count(self, verb):
        return sum(1 for c in self.calls if c[0] == verb)


@pytest.fixture
def api():
    return FakeCoreV1Api()


@pytest.fixture
def launcher(api, catalog):
    return KubernetesLauncher(api=api, catalog=catalog)


def test_launch_creates_one_pod(launcher, api, catalog):
    handle = launcher.launch(request_for(catalog))
    assert handle.launcher == "kubernetes" and not handle.reattached
    assert handle.namespace == "default" and handle.pod_name
    assert api.count("create") == 1
    (pod,) = api.pods.values()
    assert pod.spec.containers[0].resources.limits["nvidia.com/gpu"] == "2"
    assert api.calls[0][0] == "list" and api.calls[0][2].startswith(RUN_KEY_HASH_LABEL + "=")


def test_retry_reattaches_to_the_live_pod(launcher, api, catalog):
    first = launcher.launch(request_for(catalog, try_number="1"))
    api.set_phase(first.pod_name, "Running")
    again = launcher.launch(request_for(catalog, try_number="2"))
    assert again.reattached and again.pod_name == first.pod_name
    assert api.count("create") == 1 and len(api.pods) == 1


def test_retry_replaces_an_ended_pod(launcher, api, catalog):
    first = launcher.launch(request_for(catalog, try_number="1"))
    api.set_phase(first.pod_name, "Failed", exit_code=1)
    second = launcher.launch(request_for(catalog, try_number="2"))
    assert not second.reattached and second.pod_name != first.pod_name
    assert ("delete", "default", first.pod_name, 30) in api.calls
    assert list(api.pods) == [("default", second.pod_name)]


def test_other_runs_are_left_alone(launcher, api, catalog):
    a = launcher.launch(request_for(catalog, run_key="run-a"))
    api.set_phase(a.pod_name, "Running")
    b = launcher.launch(request_for(catalog, run_key="run-b"))
    assert not b.reattached and len(api.pods) == 2
    launcher.stop(b)
    assert list(api.pods) == [("default", a.pod_name)]


def test_poll_follows_the_phase(launcher, api, catalog):
    handle = launcher.launch(request_for(catalog))
    assert launcher.poll(handle) is None
    api.set_phase(handle.pod_name, "Running")
    assert launcher.poll(handle) is None
    api.set_phase(handle.pod_name, "Failed", exit_code=3)
    assert launcher.poll(handle) == 3
    api.set_phase(handle.pod_name, "Succeeded", exit_code=0)
    assert launcher.poll(handle) == 0


def test_poll_reports_an_image_that_cannot_be_pulled(launcher, api, catalog):
    handle = launcher.launch(request_for(catalog))
    api.set_phase(handle.pod_name, "Pending", waiting="ImagePullBackOff")
    with pytest.raises(LaunchError, match="launcher.image"):
        launcher.poll(handle)


class FakeLogResponse:
    """A streamed log response (``_preload_content=False``): ``stream()`` yields its bytes in small pieces."""

    def __init__(self, text):
        self.data = text.encode()
        self.closed = False

    def stream(self, amt=None, decode_content=True):
        for i in range(0, len(self.data), 7):
            yield self.data[i:i + 7]

    def close(self):
        self.closed = True


LOG_T0_NS = int(datetime(2026, 12, 1, tzinfo=timezone.utc).timestamp()) * 10**9
"""The fake kubelet's time of line 0 (its line i is at ``LOG_T0_NS + i + 1``)."""


def read_until(launcher, handle, offset, want):
    """Read until ``want`` arrived (the stream delivers from its own thread)."""
    got = ""
    for _ in range(2000):
        text, offset = launcher.read_logs(handle, offset)
        got += text
        if got == want:
            return got, offset
        time.sleep(0.005)
    return got, offset


def test_read_logs_follows_once_and_resumes_after_the_last_line(launcher, api, catalog):
    handle = launcher.launch(request_for(catalog))
    assert launcher.read_logs(handle) == ("", 0)  # container still creating
    api.logs[handle.pod_name] = "step 1\n"
    text, offset = read_until(launcher, handle, 0, "step 1\n")
    assert text == "step 1\n" and offset == LOG_T0_NS + 1  # the first line's timestamp, ns
    api.logs[handle.pod_name] = "step 1\nstep 2 ✓\n"
    text, offset = read_until(launcher, handle, offset, "step 2 ✓\n")
    assert text == "step 2 ✓\n" and offset == LOG_T0_NS + 2, "the reopened stream skips the line already read"
    _, _, name, container, kwargs = [c for c in api.calls if c[0] == "log"][-1]
    assert name == handle.pod_name and kwargs["follow"] is True and kwargs["timestamps"] is True
    assert container == CONTAINER_NAME and kwargs["since_seconds"] >= 1
    # a fresh launcher (a triggerer restarted) resumes at the offset it kept
    fresh = KubernetesLauncher(api=api, catalog=catalog)
    api.logs[handle.pod_name] += "step 3\n"
    assert read_until(fresh, handle, offset, "step 3\n") == ("step 3\n", LOG_T0_NS + 3)


def test_the_lines_after_a_dropped_stream_are_read_when_the_pod_ended_in_between(launcher, api, catalog):
    """Seen in CI under load (the nightly DAG on Kubernetes): the log stream ended (the connection dropped) while
    the pod ran, the pod then ended before the next poll, and the reader returned nothing for good: the training's
    last lines, its run facts and its report among them, were lost. A stream that ended early is reopened at its
    cursor; only one opened after the pod ended has said all."""
    handle = launcher.launch(request_for(catalog))
    api.logs[handle.pod_name] = "step 1\n"
    text, offset = read_until(launcher, handle, 0, "step 1\n")
    api.logs[handle.pod_name] = "step 1\nstep 2\n@autodl-runfact report {}\n"
    api.set_phase(handle.pod_name, "Succeeded", exit_code=0)
    text, offset = read_until(launcher, handle, offset, "@autodl-runfact report {}\n")
    assert text == "step 2\n@autodl-runfact report {}\n" and offset == LOG_T0_NS + 3
    assert launcher.read_logs(handle, offset) == ("", offset), "after the final stream, nothing more"


def test_stop_deletes_by_label_and_is_idempotent(launcher, api, catalog):
    handle = launcher.launch(request_for(catalog))
    launcher.stop(handle)
    assert api.pods == {}
    launcher.stop(handle)  # nothing left: no error
    with pytest.raises(LaunchError, match="no longer exists"):
        launcher.poll(handle)


def test_refused_pod_is_a_launch_error(launcher, api, catalog):
    api.refuse_create = ApiException(status=403, reason="Forbidden")
    with pytest.raises(LaunchError, match="403 Forbidden.*RBAC"):
        launcher.launch(request_for(catalog))


def test_registry_picks_kubernetes():
    assert isinstance(get_launcher("kubernetes", namespace="ml"), KubernetesLauncher)


def test_pod_carries_the_hook_run_files_and_the_models_output_claim(catalog):
    from kubernetes.client import ApiClient

    from autodl.launch.child_path import sitecustomize
    from autodl.launch.kubernetes import output_claim

    req = request_for(catalog, env={"AUTODL_OUTPUT_DIR": "/srv/autodl/outputs/text_classifier",
                                    "AUTODL_REPORT_FILE": "/srv/autodl/runs/x/report.json"})
    pod = ApiClient().sanitize_for_serialization(KubernetesLauncher(catalog=catalog, api=object()).build_pod(req))
    kubernetes_validate.validate(pod, K8S_VERSION, strict=True)
    (init,) = pod["spec"]["initContainers"]
    (container,) = pod["spec"]["containers"]
    assert init["image"] == container["image"] and init["command"][0] == "python"
    hook = {e["name"]: e["value"] for e in init["env"]}["AUTODL_HOOK_SOURCE"]
    assert hook == Path(sitecustomize.__file__).read_text()
    assert init["resources"]["limits"] == init["resources"]["requests"], "never lowers the pod's QoS class"
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["AUTODL_RUNFACTS"] == "log" and env["PYTHONPATH"].split(":")[0] == "/autodl/hook"
    assert env["AUTODL_METRICS_FILE"] == "/autodl/run/metrics.jsonl"
    assert env["AUTODL_REPORT_FILE"] == "/autodl/run/report.json", "a container path, not the host's"
    assert env["AUTODL_OUTPUT_DIR"] == "/autodl/output"
    mounts = {m["mountPath"]: m for m in container["volumeMounts"]}
    assert mounts["/autodl/hook"]["readOnly"] is True
    volumes = {v["name"]: v for v in pod["spec"]["volumes"]}
    claim_name = volumes["autodl-output"]["persistentVolumeClaim"]["claimName"]
    claim = ApiClient().sanitize_for_serialization(output_claim(req, "default"))
    kubernetes_validate.validate(claim, K8S_VERSION, strict=True)
    assert claim["metadata"]["name"] == claim_name and len(claim_name) <= 63 and DNS_LABEL.fullmatch(claim_name)
    other = output_claim(request_for(catalog, env={"AUTODL_OUTPUT_DIR": "/home/b/outputs/text_classifier"}), "default")
    assert other.metadata.name != claim_name, "one claim per model and home"


def test_launch_creates_the_output_claim_once(catalog, api):
    created = []

    def read_claim(name, namespace):
        if name not in created:
            raise ApiException(status=404, reason="NotFound")

    api.read_namespaced_persistent_volume_claim = read_claim
    api.create_namespaced_persistent_volume_claim = lambda namespace, body: created.append(body.metadata.name)
    launcher = KubernetesLauncher(api=api, catalog=catalog)
    req = request_for(catalog, env={"AUTODL_OUTPUT_DIR": "/srv/autodl/outputs/text_classifier"})
    launcher.launch(req)
    launcher.stop(launcher.launch(req))
    launcher.launch(req.model_copy(update={"labels": {**req.labels, "try_number": "2"}}))
    assert len(created) == 1


def test_a_command_override_gets_no_hook_init_container(catalog):
    from kubernetes.client import ApiClient

    req = request_for(catalog, options={"command": ["sh", "-c", "echo hi"], "env": {"PYTHONPATH": "/opt/x"}})
    pod = ApiClient().sanitize_for_serialization(KubernetesLauncher(catalog=catalog, api=object()).build_pod(req))
    kubernetes_validate.validate(pod, K8S_VERSION, strict=True)
    assert "initContainers" not in pod["spec"], "an image without Python must still start"
    env = {e["name"]: e.get("value") for e in pod["spec"]["containers"][0]["env"]}
    assert env["PYTHONPATH"] == "/opt/x" and env["AUTODL_METRICS_FILE"] == "/autodl/run/metrics.jsonl"
    assert "autodl-hook" not in {v["name"] for v in pod["spec"]["volumes"]}
