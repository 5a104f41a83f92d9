"""Kubernetes the way the ecosystem does it: the spec's labels, annotations, priority class, affinity and
tolerations on the pod; CPU and memory requests (never BestEffort); pod_template_file merged as
KubernetesPodOperator merges it; the Kueue mode (queue label, Kueue's scheduling gate, no second queue).
Every pod is validated against the Kubernetes schema with kubernetes-validate."""

from __future__ import annotations

import kubernetes_validate
import pytest
import yaml
from kubernetes import client as k8s
from kubernetes.client import ApiClient

from autodl import pipeline
from autodl.errors import LaunchError, SpecError
from autodl.launch.base import RANK_HOST_MEMORY_FLOOR_BYTES, LaunchRequest, host_requests
from autodl.launch.kubernetes import CONTAINER_NAME, KUEUE_ADMISSION_GATE, KubernetesLauncher
from autodl.launch.options import KUEUE_QUEUE_LABEL
from autodl.spec import parse_spec
from autodl.types import Device, MemoryBreakdown, ResourceProfile

K8S_VERSION = kubernetes_validate.utils.latest_version()
AFFINITY = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
    {"matchExpressions": [{"key": "topology.kubernetes.io/zone", "operator": "In", "values": ["zone-a"]}]}]}}}
OPTIONS = {"labels": {"team": "nlp", "example.com/cost-centre": "cc-42"},
           "annotations": {"example.com/owner": "Ana Díaz <ana@example.com>"},
           "priority_class": "training-high", "affinity": AFFINITY,
           "tolerations": [{"key": "dedicated", "operator": "Equal", "value": "ml", "effect": "NoSchedule"}]}


def gpus(n=1, host="gpu-node-3"):
    return [Device(device_id=f"GPU-{i}", host=host, index=i, uuid=f"GPU-{i}", model="A100-SXM4-40GB",
                   memory_total_bytes=40 << 30) for i in range(n)]


def request_for(catalog, devs=None, **kw) -> LaunchRequest:
    labels = {"dag_id": "autodl_train", "run_id": "manual__1", "task_id": "train.launch", "try_number": "1",
              "lease_id": "lease-1"}
    return LaunchRequest(run_key="autodl_train/manual__1/train", script="/opt/code/train.py",
                         devices=gpus() if devs is None else devs, vendor=catalog.vendor("nvidia"), labels=labels, **kw)


def render(catalog, **kw) -> dict:
    pod = KubernetesLauncher(catalog=catalog).render(request_for(catalog, **kw))["pod"]
    kubernetes_validate.validate(pod, K8S_VERSION, strict=True)
    return pod


def qos_class(pod: dict) -> str:
    """Kubernetes' QoS rule (https://kubernetes.io/docs/concepts/workloads/pods/pod-qos/): BestEffort when no
    container has a CPU or memory request or limit; Guaranteed when every container's CPU and memory limits
    equal their requests; else Burstable."""
    resources = [c.get("resources") or {} for c in pod["spec"]["containers"]]
    cpu_mem = [{k: v for k, v in (r.get(kind) or {}).items() if k in ("cpu", "memory")}
               for r in resources for kind in ("requests", "limits")]
    if not any(cpu_mem):
        return "BestEffort"
    guaranteed = all((r.get("limits") or {}).get(k) and (r.get("requests") or {}).get(k, r["limits"][k]) == r["limits"][k]
                     for r in resources for k in ("cpu", "memory"))
    return "Guaranteed" if guaranteed else "Burstable"


# ------------------------------------------------------------------------------- pass-through
def test_spec_labels_annotations_priority_affinity_and_tolerations_reach_the_pod(catalog):
    pod = render(catalog, options=OPTIONS)
    meta, spec = pod["metadata"], pod["spec"]
    assert meta["labels"]["team"] == "nlp" and meta["labels"]["example.com/cost-centre"] == "cc-42"
    assert meta["labels"]["autodl/dag-id"] == "autodl_train", "autodl's identity labels stay"
    assert meta["annotations"]["example.com/owner"] == "Ana Díaz <ana@example.com>"
    assert meta["annotations"]["autodl/run-key"] == "autodl_train/manual__1/train"
    assert spec["priorityClassName"] == "training-high"
    assert spec["affinity"] == AFFINITY
    assert {"key": "dedicated", "operator": "Equal", "value": "ml", "effect": "NoSchedule"} in spec["tolerations"]
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in spec["tolerations"]
    assert spec["nodeSelector"]["kubernetes.io/hostname"] == "gpu-node-3"


def test_the_pass_through_fields_are_spec_keys_not_unknown_ones():
    """Issue 17: `launcher.labels` was an unknown key."""
    spec = parse_spec({"launcher": {"type": "kubernetes", **OPTIONS}})
    assert spec.launcher.labels["team"] == "nlp" and spec.launcher.priority_class == "training-high"


@pytest.mark.parametrize(("launcher", "says"), [
    ({"labels": {"autodl/run-key": "x"}}, "launcher.labels.*autodl's own"),
    ({"labels": {"node.kubernetes.io/pool": "x"}}, "launcher.labels.*reserved for Kubernetes"),
    ({"labels": {"team": "two words"}}, "launcher.labels.*not a label value.*annotations"),
    ({"labels": {"bad key!": "x"}}, "launcher.labels.*not a Kubernetes key"),
    ({"annotations": {"/x": "y"}}, "launcher.annotations.*not a Kubernetes key"),
    ({"priority_class": "High_Priority"}, "launcher.priority_class.*object name"),
    ({"affinity": {"nodeSelector": {"a": "b"}}}, "launcher.affinity.*nodeAffinity, podAffinity, podAntiAffinity"),
    ({"memory_limit": "8g", "memory_request": "16g"}, "memory_request is above memory_limit"),
    ({"cpus": 2, "cpu_request": 4}, "cpu_request is above cpus"),
    ({"kueue_queue": "a", "labels": {KUEUE_QUEUE_LABEL: "b"}}, "name different queues"),
    ({"pod_template_file": "pod.yaml"}, "launcher.pod_template_file.*absolute path"),
])
def test_bad_kubernetes_options_name_the_field_and_the_fix(launcher, says):
    with pytest.raises(SpecError, match=says):
        parse_spec({"launcher": {"type": "kubernetes", **launcher}})


# ------------------------------------------------------------------------------------ requests
def test_a_single_gpu_pod_is_not_best_effort(catalog):
    """Issue 17: the single-GPU pod requested no CPU or memory (QoS BestEffort, evicted first)."""
    pod = render(catalog)
    resources = pod["spec"]["containers"][0]["resources"]
    assert resources["requests"]["nvidia.com/gpu"] == resources["limits"]["nvidia.com/gpu"] == "1"
    assert resources["requests"]["cpu"] == "1000m"
    assert resources["requests"]["memory"] == f"{RANK_HOST_MEMORY_FLOOR_BYTES >> 20}Mi"
    assert qos_class(pod) == "Burstable"


def test_cpu_and_memory_requests_come_from_the_estimate(catalog):
    breakdown = MemoryBreakdown(weights_bytes=1 << 30, activations_bytes=4 << 30)
    profile = ResourceProfile(script="/opt/code/train.py", params=1 << 28, peak_memory_bytes=breakdown.total_bytes,
                              breakdown=breakdown, flops_per_step=None, batch_size=8, num_workers=3, num_gpus=2)
    cores, memory = host_requests(profile, ranks=2, shm_bytes=2 << 30)
    assert cores == 8.0  # 2 ranks x (the training process + 3 DataLoader workers)
    assert memory == 2 * (RANK_HOST_MEMORY_FLOOR_BYTES + (1 << 30)) + (2 << 30)
    pod = render(catalog, devs=gpus(2), distributed=True, shm_bytes=2 << 30, cpu_request=cores,
                 memory_request_bytes=memory)
    requests = pod["spec"]["containers"][0]["resources"]["requests"]
    assert requests == {"nvidia.com/gpu": "2", "cpu": "8000m", "memory": "5Gi"}


def test_unknown_worker_count_is_taken_as_one_worker():
    breakdown = MemoryBreakdown(weights_bytes=0)
    profile = ResourceProfile(script="/x.py", params=None, peak_memory_bytes=1, breakdown=breakdown,
                              flops_per_step=None, batch_size=1, num_workers=None)
    assert host_requests(profile, ranks=1, shm_bytes=None)[0] == 2.0


def test_spec_requests_win_and_requests_stay_within_the_limits(catalog):
    pod = render(catalog, cpu_request=12.0, memory_request_bytes=100 << 30,
                 options={"cpu_request": 3, "memory_request": "24g", "cpus": 6, "memory_limit": "32g"})
    resources = pod["spec"]["containers"][0]["resources"]
    assert resources["requests"] == {"nvidia.com/gpu": "1", "cpu": "3000m", "memory": "24Gi"}
    assert resources["limits"] == {"nvidia.com/gpu": "1", "cpu": "6000m", "memory": "32Gi"}
    capped = render(catalog, cpu_request=12.0, memory_request_bytes=100 << 30, options={"cpus": 6, "memory_limit": "32g"})
    assert capped["spec"]["containers"][0]["resources"]["requests"] == {"nvidia.com/gpu": "1", "cpu": "6000m",
                                                                       "memory": "32Gi"}
    assert qos_class(capped) == "Guaranteed"


# ------------------------------------------------------------------------------------------ Kueue
def test_kueue_mode_pod_is_labelled_gated_and_left_to_kueue_to_place(catalog):
    launcher = KubernetesLauncher(catalog=catalog)
    pod = launcher.build_pod(request_for(catalog, options={"kueue_queue": "team-a", "priority_class": "training-high"}))
    assert isinstance(pod, k8s.V1Pod)
    assert pod.metadata.labels[KUEUE_QUEUE_LABEL] == "team-a"
    assert [g.name for g in pod.spec.scheduling_gates] == [KUEUE_ADMISSION_GATE] == ["kueue.x-k8s.io/admission"]
    assert all(isinstance(g, k8s.V1PodSchedulingGate) for g in pod.spec.scheduling_gates)
    assert "kubernetes.io/hostname" not in pod.spec.node_selector, "Kueue's flavor and the scheduler place it"
    assert pod.spec.node_selector["nvidia.com/gpu.product"] == "NVIDIA-A100-SXM4-40GB"
    manifest = ApiClient().sanitize_for_serialization(pod)
    kubernetes_validate.validate(manifest, K8S_VERSION, strict=True)
    assert manifest["spec"]["schedulingGates"] == [{"name": "kueue.x-k8s.io/admission"}]


def test_kueue_label_written_as_in_kueues_docs_is_the_kueue_mode(catalog):
    pod = render(catalog, options={"labels": {KUEUE_QUEUE_LABEL: "team-a"}})
    assert pod["metadata"]["labels"][KUEUE_QUEUE_LABEL] == "team-a"
    assert pod["spec"]["schedulingGates"] == [{"name": KUEUE_ADMISSION_GATE}]


def test_kueue_pod_keeps_its_queue_and_gate_under_kubernetes_pod_operator(catalog, capsys):
    from airflow.providers.cncf.kubernetes.operators.pod import KubernetesPodOperator

    pod = KubernetesLauncher(catalog=catalog).build_pod(request_for(catalog, options={"kueue_queue": "team-a"}))
    KubernetesPodOperator(task_id="train", full_pod_spec=pod).dry_run()
    out = capsys.readouterr().out
    printed = yaml.safe_load(out[out.index("api_version:"):])
    assert printed["metadata"]["labels"][KUEUE_QUEUE_LABEL] == "team-a"
    assert printed["spec"]["scheduling_gates"] == [{"name": KUEUE_ADMISSION_GATE}]


def test_render_shows_requests_priority_and_queue_for_plan(catalog):
    shown = KubernetesLauncher(catalog=catalog).render(request_for(catalog, options={"kueue_queue": "team-a",
                                                                                     "priority_class": "high"}))
    assert shown["kueue_queue"] == "team-a" and shown["priority_class"] == "high"
    assert shown["requests"]["cpu"] == "1000m" and shown["requests"]["nvidia.com/gpu"] == "1"
    plain = KubernetesLauncher(catalog=catalog).render(request_for(catalog))
    assert plain["kueue_queue"] is None and plain["priority_class"] is None


def test_without_kueue_no_gate_and_the_pod_is_pinned(catalog):
    pod = render(catalog)
    assert "schedulingGates" not in pod["spec"] and KUEUE_QUEUE_LABEL not in pod["metadata"]["labels"]


def _kueue_profile_out(tmp_path, queue="team-a"):
    spec = tmp_path / "spec.yaml"
    spec.write_text(yaml.safe_dump({"launcher": {"type": "kubernetes", "kueue_queue": queue}}))
    script = tmp_path / "train.py"
    script.write_text("print('hi')\n")
    b = MemoryBreakdown(weights_bytes=1000, activations_bytes=1 << 30)
    p = ResourceProfile(script=str(script), params=250, peak_memory_bytes=b.total_bytes, breakdown=b,
                        flops_per_step=1e9, batch_size=8)
    return {"profile": p.to_json(), "spec_path": str(spec), "script": str(script)}


def ctx(key):
    return pipeline.RunContext(run_key=key, dag_id="dag", run_id="run1", task_id="t", try_number=1)


def test_kueue_mode_wait_does_not_queue_a_second_time(tmp_path):
    """With Kueue admitting, the wait step books without joining autodl's admission queue, and says so."""
    from autodl.ledger import Ledger
    from autodl.queue import AdmissionQueue

    out = _kueue_profile_out(tmp_path)
    logs: list[str] = []
    for i in range(3):  # the demo pool's three devices
        assert pipeline.step_wait(ctx(f"run{i}"), out, log=logs.append) is not None
    assert any("Kueue mode (LocalQueue team-a): autodl's admission queue steps aside" in line for line in logs)
    logs.clear()
    assert pipeline.step_wait(ctx("run3"), out, log=logs.append) is None
    assert AdmissionQueue().entries() == [], "no entry in autodl's own queue: Kueue orders the runs"
    assert not any("in the admission queue" in line for line in logs)
    Ledger().release("run0")
    assert pipeline.step_wait(ctx("run3"), out, log=logs.append).lease.run_key == "run3"


# ---------------------------------------------------------------------------------- pod template
TEMPLATE = {
    "apiVersion": "v1", "kind": "Pod",
    "metadata": {"labels": {"cluster.example.com/tier": "batch"}, "annotations": {"example.com/template": "v3"}},
    "spec": {
        "containers": [
            {"name": "log-shipper", "image": "fluent/fluent-bit:3.1", "resources": {"requests": {"cpu": "100m"}}},
            {"name": "base", "image": "ignored:latest", "env": [{"name": "NCCL_DEBUG", "value": "WARN"}],
             "volumeMounts": [{"name": "datasets", "mountPath": "/data", "readOnly": True}]},
        ],
        "volumes": [{"name": "datasets", "persistentVolumeClaim": {"claimName": "datasets", "readOnly": True}}],
        "dnsPolicy": "ClusterFirst",
        "restartPolicy": "Always",
    },
}


def test_pod_template_file_is_merged_as_kubernetes_pod_operator_merges_it(catalog, tmp_path):
    path = tmp_path / "pod.yaml"
    path.write_text(yaml.safe_dump(TEMPLATE))
    pod = render(catalog, options={"pod_template_file": str(path), "image": "paddle:3.3.1", "shm_size": "1g"})
    meta, spec = pod["metadata"], pod["spec"]
    assert meta["labels"]["cluster.example.com/tier"] == "batch" and meta["labels"]["app.kubernetes.io/managed-by"] == "autodl"
    assert meta["annotations"]["example.com/template"] == "v3"
    names = [c["name"] for c in spec["containers"]]
    assert names == [CONTAINER_NAME, "log-shipper"], "the template's base is the training container; sidecars stay"
    base = spec["containers"][0]
    assert base["image"] == "paddle:3.3.1" and base["command"][:2] == ["python", "-u"], "what autodl sets wins"
    env = {e["name"]: e.get("value") for e in base["env"]}
    assert env["NCCL_DEBUG"] == "WARN" and "AUTODL_RUN_KEY" in env, "lists are concatenated"
    mounts = {m["mountPath"] for m in base["volumeMounts"]}
    assert {"/data", "/dev/shm"} <= mounts, "the template's mounts are kept beside autodl's"
    assert {"/autodl/run", "/autodl/hook"} <= mounts, "the measurement's volumes survive the merge"
    assert {"datasets", "dshm"} <= {v["name"] for v in spec["volumes"]}
    assert spec["dnsPolicy"] == "ClusterFirst" and spec["restartPolicy"] == "Never"
    assert spec["securityContext"]["runAsNonRoot"] is True


def test_missing_or_wrong_pod_template_is_a_launch_error_naming_the_field(catalog, tmp_path):
    with pytest.raises(LaunchError, match="launcher.pod_template_file .*cannot read it"):
        render(catalog, options={"pod_template_file": str(tmp_path / "absent.yaml")})
    wrong = tmp_path / "job.yaml"
    wrong.write_text(yaml.safe_dump({"apiVersion": "batch/v1", "kind": "Job"}))
    with pytest.raises(LaunchError, match="not a pod manifest"):
        render(catalog, options={"pod_template_file": str(wrong)})
