"""A packed run's device-memory cap: the same Paddle flags from every launcher, the lower of it and the user's."""

from __future__ import annotations

import json
import time

import kubernetes_validate
import pytest

from autodl.catalog import load_catalog
from autodl.launch import LaunchRequest
from autodl.launch.packed import memory_cap
from autodl.launch.docker import DockerLauncher
from autodl.launch.kubernetes import KubernetesLauncher, shared_resource
from autodl.launch.local import LocalLauncher
from autodl.errors import LaunchError
from autodl.policy.packing import CAP_NOT_VERIFIED, memory_cap_env
from autodl.types import Device

GIB = 1 << 30
TOTAL = 80 * GIB
CAP = 30 * GIB
FLAGS = ("FLAGS_fraction_of_gpu_memory_to_use", "FLAGS_gpu_memory_limit_mb")
ENV_DUMP = """
import json, os
print(json.dumps({k: os.environ.get(k) for k in %r}), flush=True)
""" % (FLAGS,)
K8S_VERSION = kubernetes_validate.utils.latest_version()


def h100(i=0, **labels):
    return Device(device_id=f"GPU-{i}", index=i, uuid=f"GPU-{i}", model="H100-SXM5-80GB", vendor="nvidia",
                  memory_total_bytes=TOTAL, labels=labels)


def packed(tmp_path, *, cap=CAP, user_env=None, devices=None, **kw) -> LaunchRequest:
    script = tmp_path / "train.py"
    script.write_text(ENV_DUMP)
    options = {"env": user_env} if user_env else {}
    return LaunchRequest(run_key=kw.pop("run_key", "packed/r1"), script=str(script),
                         devices=devices if devices is not None else [h100()], vendor=load_catalog().vendor("nvidia"),
                         device_memory_cap_bytes=cap, options=options, labels={"lease_id": "L1"}, **kw)


def test_the_cap_is_paddles_two_flags_of_the_share_and_the_log_says_it_is_not_verified(tmp_path):
    env, lines = memory_cap(packed(tmp_path), {})
    assert env == memory_cap_env(CAP, TOTAL)
    assert env == {"FLAGS_fraction_of_gpu_memory_to_use": "0.3750", "FLAGS_gpu_memory_limit_mb": str(30 * 1024)}
    assert lines[-1].endswith(CAP_NOT_VERIFIED) and "30720 MiB of 81920 MiB" in lines[-1]


def test_an_exclusive_run_or_a_cpu_run_gets_no_cap(tmp_path):
    assert memory_cap(packed(tmp_path, cap=None), {}) == ({}, [])
    assert memory_cap(packed(tmp_path, on_cpu=True), {}) == ({}, [])


def test_a_users_higher_flag_never_raises_the_cap_and_a_lower_one_is_kept(tmp_path):
    env, lines = memory_cap(packed(tmp_path), {"FLAGS_gpu_memory_limit_mb": "70000",
                                               "FLAGS_fraction_of_gpu_memory_to_use": "0.2"})
    assert env["FLAGS_gpu_memory_limit_mb"] == "30720", "the user's 70000 MiB would raise the cap"
    assert env["FLAGS_fraction_of_gpu_memory_to_use"] == "0.2", "the user's lower fraction wins"
    said = "\n".join(lines)
    assert "FLAGS_gpu_memory_limit_mb=70000 from launcher.env would not keep the run" in said
    assert "FLAGS_fraction_of_gpu_memory_to_use=0.2 from launcher.env is below" in said


@pytest.mark.parametrize("bad", ["lots", "0", "-5"])
def test_a_users_flag_that_is_no_positive_number_is_replaced_by_the_cap(tmp_path, bad):
    env, _ = memory_cap(packed(tmp_path), {"FLAGS_gpu_memory_limit_mb": bad})
    assert env["FLAGS_gpu_memory_limit_mb"] == "30720"


def test_paddle_knows_both_flags():
    """Paddle 3.3.1 (the CPU build in .venv) has both flags the cap sets, so neither is silently ignored."""
    paddle = pytest.importorskip("paddle")
    flags = paddle.get_flags(list(FLAGS))
    assert set(flags) == set(FLAGS)


def wait(launcher, handle):
    for _ in range(1200):
        code = launcher.poll(handle)
        if code is not None:
            return code
        time.sleep(0.05)
    raise AssertionError("training did not end")


def test_a_local_packed_training_runs_with_the_cap_and_its_log_says_unverified(tmp_path):
    launcher = LocalLauncher(base_dir=tmp_path / "runs")
    handle = launcher.launch(packed(tmp_path, user_env={"FLAGS_gpu_memory_limit_mb": "99999"}))
    assert wait(launcher, handle) == 0
    text, _ = launcher.read_logs(handle)
    seen = json.loads([line for line in text.splitlines() if line.startswith("{")][-1])
    assert seen == {"FLAGS_fraction_of_gpu_memory_to_use": "0.3750", "FLAGS_gpu_memory_limit_mb": "30720"}
    assert f"autodl: run packed/r1: device memory capped at 30720 MiB" in text and CAP_NOT_VERIFIED in text
    assert "FLAGS_gpu_memory_limit_mb=99999 from launcher.env would not keep" in text


def test_a_local_exclusive_training_gets_no_cap_flags(tmp_path):
    launcher = LocalLauncher(base_dir=tmp_path / "runs")
    handle = launcher.launch(packed(tmp_path, cap=None))
    assert wait(launcher, handle) == 0
    text, _ = launcher.read_logs(handle)
    assert json.loads(text.splitlines()[-1]) == {k: None for k in FLAGS} and CAP_NOT_VERIFIED not in text


def test_a_docker_packed_container_gets_the_same_flags_as_a_local_run(tmp_path):
    request = packed(tmp_path, user_env={"FLAGS_gpu_memory_limit_mb": "99999"})
    plan = DockerLauncher(client=object()).plan(request)
    assert {k: plan.env[k] for k in FLAGS} == {k: v for k, v in LocalLauncher(base_dir=tmp_path).environment(request).items()
                                               if k in FLAGS} == memory_cap_env(CAP, TOTAL)
    assert plan.create_kwargs["environment"]["FLAGS_gpu_memory_limit_mb"] == "30720"
    assert plan.notes[-1].endswith(CAP_NOT_VERIFIED)


def pod(request) -> dict:
    return KubernetesLauncher(catalog=load_catalog()).render(request)["pod"]


def test_a_packed_pod_is_valid_asks_for_the_shared_resource_and_carries_the_cap(tmp_path, monkeypatch):
    monkeypatch.delenv("AUTODL_K8S_SHARED_RESOURCE", raising=False)
    manifest = pod(packed(tmp_path, workdir=str(tmp_path)))
    kubernetes_validate.validate(manifest, K8S_VERSION, strict=True)
    (container,) = [c for c in manifest["spec"]["containers"] if c["name"] == "base"]
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert {k: env[k] for k in FLAGS} == memory_cap_env(CAP, TOTAL)
    assert container["resources"]["limits"]["nvidia.com/gpu"] == "1"


def test_a_renamed_shared_resource_is_asked_for_and_still_valid(tmp_path, monkeypatch):
    monkeypatch.setenv("AUTODL_K8S_SHARED_RESOURCE", "nvidia.com/gpu.shared")
    manifest = pod(packed(tmp_path, workdir=str(tmp_path)))
    kubernetes_validate.validate(manifest, K8S_VERSION, strict=True)
    limits = manifest["spec"]["containers"][0]["resources"]["limits"]
    assert limits.get("nvidia.com/gpu.shared") == "1" and "nvidia.com/gpu" not in limits
    exclusive = pod(packed(tmp_path, cap=None, workdir=str(tmp_path)))
    assert exclusive["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] == "1", \
        "an exclusive run keeps the whole-device resource"


def test_a_packed_mig_instance_keeps_its_own_resource(tmp_path, monkeypatch):
    monkeypatch.setenv("AUTODL_K8S_SHARED_RESOURCE", "nvidia.com/gpu.shared")
    manifest = pod(packed(tmp_path, devices=[h100(mig_profile="3g.40gb")], workdir=str(tmp_path)))
    assert "nvidia.com/gpu.shared" not in manifest["spec"]["containers"][0]["resources"]["limits"]


def test_a_shared_resource_that_is_no_resource_name_is_refused_naming_the_variable(monkeypatch):
    monkeypatch.setenv("AUTODL_K8S_SHARED_RESOURCE", "gpu shared")
    with pytest.raises(LaunchError, match="AUTODL_K8S_SHARED_RESOURCE='gpu shared' is not an extended resource"):
        shared_resource(load_catalog().vendor("nvidia"))
