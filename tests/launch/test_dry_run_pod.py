"""The dry run as a pod (issue 17, item 5): the same bounds as the container where Kubernetes expresses them,
rendered with the kubernetes client's objects and validated with kubernetes-validate (no cluster here); the
network, which no pod field can cut, cut by a deny-all NetworkPolicy on the dry-run label, which the venue requires."""

from __future__ import annotations

import json
from pathlib import Path

import kubernetes_validate
import pytest
from kubernetes.client import ApiClient
from kubernetes.client.exceptions import ApiException

from autodl.profile.container import BUNDLE_DIR, WORK_DIR, container_env
from autodl.profile.dryrun import CHILD, DryRunConfig
from autodl.profile.pod import DRY_RUN_LABEL, POLICY_NAME, PodVenue, deny_all_policy, dry_run_pod
from autodl.sandbox import SandboxLimits, SandboxUnavailable
from autodl.spec import parse_spec

K8S_VERSION = kubernetes_validate.utils.latest_version()
LIMITS = SandboxLimits(timeout_s=150, memory_bytes=12 << 30, max_processes=256, disk_bytes=1 << 30)


def _pod(tmp_path: Path, **launcher) -> dict:
    script = tmp_path / "train.py"
    script.write_text("print('hi')\n")
    spec = parse_spec({"launcher": {"type": "kubernetes", "image": "registry.example.com/team/train:3",
                                    "user": "1000:1000", **launcher}})
    env = container_env(None, {"HF_HOME": "/data/hf"})
    cfg = DryRunConfig(script=str(script), argv=["--epochs", "1"])
    pod = dry_run_pod(script, cfg, spec.launcher, limits=LIMITS, env=env,
                      namespace="ml", name="autodl-dryrun-0123456789ab")
    manifest = ApiClient().sanitize_for_serialization(pod)
    kubernetes_validate.validate(manifest, K8S_VERSION, strict=True)
    return manifest


def test_the_dry_run_pod_validates_and_carries_every_bound(tmp_path):
    pod = _pod(tmp_path)
    spec = pod["spec"]
    assert spec["automountServiceAccountToken"] is False and spec["enableServiceLinks"] is False
    assert spec["hostNetwork"] is False and spec["restartPolicy"] == "Never"
    assert spec["activeDeadlineSeconds"] == 150 + 120
    assert spec["securityContext"]["runAsNonRoot"] is True and spec["securityContext"]["runAsUser"] == 1000
    assert spec["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    (main,) = spec["containers"]
    for c in (main, *spec["initContainers"]):
        sc = c["securityContext"]
        assert sc["readOnlyRootFilesystem"] is True and sc["allowPrivilegeEscalation"] is False
        assert sc["capabilities"] == {"drop": ["ALL"]} and sc["runAsNonRoot"] is True
        assert c["resources"]["limits"] == c["resources"]["requests"]  # Guaranteed: never evicted first
    assert main["resources"]["limits"]["memory"] == "12Gi"
    assert not any(k.endswith("gpu") for k in main["resources"]["limits"])  # CPU only
    env = {e["name"]: e["value"] for e in main["env"]}
    assert env["CUDA_VISIBLE_DEVICES"] == "" and env["NVIDIA_VISIBLE_DEVICES"] == "void"
    assert env["HF_HOME"] == "/data/hf" and "PATH" not in env  # the image's own PATH
    mounts = {m["mountPath"]: m for m in main["volumeMounts"]}
    assert mounts[BUNDLE_DIR]["readOnly"] is True and WORK_DIR in mounts
    sizes = {v["name"]: v["emptyDir"].get("sizeLimit") for v in spec["volumes"] if "emptyDir" in v}
    assert sizes["work"] == "1Gi" and sizes["tmp"] == "1Gi" and all(sizes.values())
    assert pod["metadata"]["labels"][DRY_RUN_LABEL] == "true"


def test_the_pod_carries_autodls_files_and_the_child_config_for_the_images_code(tmp_path):
    pod = _pod(tmp_path, code_dir="/opt/code", code_pvc="team-code")
    (init,) = pod["spec"]["initContainers"]
    files = json.loads(next(e["value"] for e in init["env"] if e["name"] == "AUTODL_DRYRUN_FILES"))
    package = {f"child/dryrun_child/{p.name}" for p in CHILD.glob("*.py")}
    assert len(package) > 1 and "child/dryrun_child/__main__.py" in package
    assert set(files) == {"child/_container_entry.py", *package, "child/_flops.py", "dryrun.json"}
    cfg = json.loads(files["dryrun.json"])
    assert cfg["container"]["code"] == "/opt/code" and cfg["script"] == f"{WORK_DIR}/train.py"
    assert cfg["argv"] == ["--epochs", "1"]
    claims = [v for v in pod["spec"]["volumes"] if "persistentVolumeClaim" in v]
    assert claims == [{"name": "code", "persistentVolumeClaim": {"claimName": "team-code", "readOnly": True}}]


def test_the_deny_all_policy_selects_the_dry_run_pods_and_allows_nothing():
    policy = ApiClient().sanitize_for_serialization(deny_all_policy("ml"))
    kubernetes_validate.validate(policy, K8S_VERSION, strict=True)
    assert policy["metadata"]["name"] == POLICY_NAME
    assert policy["spec"] == {"podSelector": {"matchLabels": {DRY_RUN_LABEL: "true"}},
                              "policyTypes": ["Ingress", "Egress"]}  # no rule: no traffic either way


class _NoPolicyApi:
    """The kubernetes client's ApiClient standing in front of a cluster whose namespace has no such policy."""

    def __init__(self):
        from kubernetes import client

        self.api_client = client.ApiClient()
        self.created = []

        def refuse(*_a, **_k):
            raise ApiException(status=404, reason="Not Found")

        self.api_client.call_api = refuse

    def create_namespaced_pod(self, namespace, pod):
        self.created.append(pod)


def test_without_the_deny_all_policy_no_pod_is_created(tmp_path, monkeypatch):
    """No network is not a pod field: where the namespace lacks the policy, the venue refuses (the profile falls
    back to the conservative bound and says why) rather than run the script with the namespace's network."""
    api = _NoPolicyApi()
    spec = parse_spec({"launcher": {"type": "kubernetes", "namespace": "ml"}})
    venue = PodVenue(spec.launcher, {"api": api})
    (tmp_path / "train.py").write_text("print(1)\n")
    with pytest.raises(SandboxUnavailable, match=f"NetworkPolicy {POLICY_NAME}.*404"):
        venue.run(tmp_path / "train.py", DryRunConfig(script=str(tmp_path / "train.py")), limits=LIMITS, batch_env=None,
                  launch_env=None)
    assert api.created == []
