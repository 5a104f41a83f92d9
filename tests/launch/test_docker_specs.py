"""The example specs of the Docker and multi-GPU DAGs, rendered the way the pipeline and `autodl plan` do."""

from __future__ import annotations

import json
import shlex

import pytest
import yaml

from autodl import pipeline
from autodl.config import include_dir
from autodl.launch import get_launcher
from autodl.spec import load_spec

SPECS = include_dir() / "specs"
DOCKER_SPEC = SPECS / "simple_cnn_docker.yaml"
MULTI_SPEC = SPECS / "simple_cnn_multi_gpu.yaml"
UUIDS = ["GPU-0a0a0a0a-a100-0000-0000-000000000002", "GPU-0a0a0a0a-a100-0000-0000-000000000003"]


def two_a100(catalog) -> list[dict]:
    return [{"device_id": u, "index": i, "uuid": u, "model": "A100-SXM4-40GB", "vendor": "nvidia",
             "memory_total_bytes": catalog.get("A100-SXM4-40GB").memory_bytes} for u, i in zip(UUIDS, (2, 3))]


def request_from_pipeline(spec_path, devices, *, num_gpus: int, num_workers: int = 0):
    """What step_launch builds for a real (NVML) pool: profile, selection, then build_request."""
    spec = load_spec(spec_path)
    script = str(spec.script_path())
    profile = {"script": script, "params": 1, "peak_memory_bytes": 1 << 30, "flops_per_step": 1.0, "batch_size": 64,
               "breakdown": {}, "num_gpus": num_gpus, "num_workers": num_workers}
    ctx = pipeline.RunContext(run_key="autodl_train_multi_gpu.train.manual__1", dag_id="autodl_train_multi_gpu",
                              run_id="manual__1", task_id="train.launch", try_number=1)
    lease = {"lease_id": "lease-1", "run_key": ctx.run_key, "device_ids": [d["device_id"] for d in devices]}
    selection = {"devices": devices, "lease": lease, "declared_pool": False, "placement": {}, "pool_source": "nvml",
                 "algorithm": "rule_based"}
    return pipeline.build_request(ctx, {"profile": profile, "script": script, "spec_path": str(spec_path)}, selection)


def test_specs_name_their_launcher():
    assert load_spec(DOCKER_SPEC).launcher.type == "docker"
    multi = load_spec(MULTI_SPEC)
    assert multi.task.num_gpus_estimate == 2 and multi.resource_policy.distributed_strategy == "data_parallel"
    assert multi.launcher.shm_size == 8 << 30


def test_multi_gpu_spec_renders_a_distributed_container(catalog):
    spec, request = request_from_pipeline(MULTI_SPEC, two_a100(catalog), num_gpus=2)
    out = get_launcher(spec.launcher.type).render(request)
    assert out["command"] == ["python", "-u", "-m", "paddle.distributed.launch", "--devices", "0,1",
                              "--log_dir", "/tmp/autodl-launch-logs",
                              "/workspace/simple_cnn_dp.py", "--epochs", "1", "--samples", "512"]
    assert out["env"]["CUDA_VISIBLE_DEVICES"] == "0,1"
    assert out["create_kwargs"]["device_requests"][0]["DeviceIDs"] == UUIDS
    assert out["create_kwargs"]["shm_size"] == 8 << 30
    assert out["labels"]["autodl.try_number"] == "1"
    assert f"--gpus '\"device={','.join(UUIDS)}\"'" in out["shell"]
    assert shlex.split(out["shell"])[-len(out["command"]):] == out["command"]


def test_multi_gpu_spec_under_kubernetes(catalog):
    spec, request = request_from_pipeline(MULTI_SPEC, two_a100(catalog), num_gpus=2)
    out = get_launcher("kubernetes").render(request)
    assert out["limits"]["nvidia.com/gpu"] == "2"
    assert out["command"][:6] == ["python", "-u", "-m", "paddle.distributed.launch", "--devices", "0,1"]
    assert "CUDA_VISIBLE_DEVICES" not in out["env"]


def test_docker_spec_renders_one_pinned_gpu(catalog):
    spec, request = request_from_pipeline(DOCKER_SPEC, two_a100(catalog)[:1], num_gpus=1, num_workers=4)
    out = get_launcher(spec.launcher.type).render(request)
    assert out["command"][:3] == ["python", "-u", "/workspace/simple_cnn.py"]
    assert out["env"]["CUDA_VISIBLE_DEVICES"] == "0"
    assert out["create_kwargs"]["device_requests"][0]["DeviceIDs"] == UUIDS[:1]
    assert out["create_kwargs"]["shm_size"] == 2 << 30, "the spec's shm_size wins over the pipeline's default"
    assert out["create_kwargs"]["network_mode"] == "none"


@pytest.mark.parametrize("spec_path", [DOCKER_SPEC, MULTI_SPEC], ids=["docker", "multi_gpu"])
def test_autodl_plan_json(spec_path, tmp_path, capsys, catalog):
    """`autodl plan SPEC --json` on a declared two-A100 pool: it fits; ``launch`` is the Docker container
    as it runs on the chosen GPUs, ``launch_here`` the CPU fallback used because declared devices are not real."""
    from tests.cli_helpers import run_cli

    pool = tmp_path / "pool.yaml"
    pool.write_text(yaml.safe_dump({"host": "node-2", "devices": [
        {"index": 0, "model": "A100-SXM4-40GB", "uuid": UUIDS[0]},
        {"index": 1, "model": "A100-SXM4-40GB", "uuid": UUIDS[1]}]}))
    code, text, err = run_cli(capsys, "plan", str(spec_path), "--pool", str(pool), "--no-probe", "--json")
    assert code == 0, err
    out = json.loads(text)
    assert out["fits"] and out["placements"]
    launch = out["launch"]
    assert launch["launcher"] == "docker" and "error" not in launch
    assert launch["env"]["NVIDIA_VISIBLE_DEVICES"] != "void"
    assert "--gpus '\"device=" in launch["shell"]
    assert out["launch_here"]["env"]["NVIDIA_VISIBLE_DEVICES"] == "void"
    assert launch["shell"].startswith("docker run --detach --name autodl-")
    assert "--network none" in launch["shell"] and "--user 1000:1000" in launch["shell"]
