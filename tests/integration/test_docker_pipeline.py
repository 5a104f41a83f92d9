"""The pipeline's launch and collect steps with ``launcher: docker`` on a real engine: the spec's
launcher section reaches the container, the log is streamed, the exit code collected, a failure raised."""

from __future__ import annotations

import uuid

import pytest
import yaml

from autodl import pipeline
from autodl.errors import LaunchError
from autodl.launch.docker import DockerLauncher
from autodl.ledger import Ledger

pytestmark = pytest.mark.integration


def _setup(tmp_path, image, command):
    code = tmp_path / "code"
    code.mkdir()
    script = code / "train.py"
    script.write_text("print('unused: busybox has no python')\n")
    spec = tmp_path / "spec.yaml"
    spec.write_text(yaml.safe_dump({
        "task": {"script": "code/train.py", "num_gpus_estimate": 1},
        "launcher": {"type": "docker", "image": image, "image_pull_policy": "Never", "network": "none",
                     "command": ["sh", "-c", command], "shm_size": "128m", "env": {"GREETING": "hello"}},
    }))
    profile = {"script": str(script), "params": 1, "peak_memory_bytes": 1 << 20, "flops_per_step": 1.0,
               "batch_size": 1, "breakdown": {}, "num_workers": 2}
    run_key = f"it.docker_pipeline.{uuid.uuid4().hex[:8]}"
    ctx = pipeline.RunContext(run_key=run_key, dag_id="it_dag", run_id="manual__it", task_id="train.launch",
                              try_number=1)
    # a real lease: the launch heartbeats it first and refuses to start a training without one (LeaseLost)
    lease = Ledger().book(run_key, [f"it-device-{uuid.uuid4().hex[:8]}"], model="A100-SXM4-40GB")
    selection = {"devices": [], "lease": lease.to_json(), "declared_pool": True, "placement": {},
                 "pool_source": "test", "algorithm": "rule_based"}
    return ctx, {"profile": profile, "script": str(script), "spec_path": str(spec)}, selection


@pytest.fixture
def cleanup(docker_client):
    keys: list[str] = []
    yield keys
    launcher = DockerLauncher(client=docker_client)
    for key in keys:
        for container in launcher.containers_of(key):
            container.remove(force=True)


def test_launch_and_collect_through_the_pipeline(tmp_path, busybox_image, docker_client, cleanup):
    ctx, profile_out, selection = _setup(
        tmp_path, busybox_image, 'echo "$GREETING from $(id -u)"; df -k /dev/shm | tail -n 1; echo step 1; echo step 2')
    cleanup.append(ctx.run_key)
    lines: list[str] = []
    handle = pipeline.step_launch(ctx, profile_out, selection, log=lines.append)
    assert handle["launcher"] == "docker" and handle["container_name"].endswith("-t1")
    assert any(line.startswith("launch (docker): docker run --detach") for line in lines)
    metrics = pipeline.step_collect(ctx, handle, launcher_type="docker", log=lines.append, interval_s=0.1)
    assert metrics["exit_code"] == 0
    train = [line for line in lines if line.startswith("[train] ")]
    assert train[0] == "[train] hello from 1000"
    assert "131072" in train[1], "/dev/shm from the spec's shm_size (128 MiB), over the pipeline's default"
    assert train[-2:] == ["[train] step 1", "[train] step 2"]


def test_failed_training_fails_collect(tmp_path, busybox_image, docker_client, cleanup):
    ctx, profile_out, selection = _setup(tmp_path, busybox_image, "echo boom >&2; exit 7")
    cleanup.append(ctx.run_key)
    handle = pipeline.step_launch(ctx, profile_out, selection, log=lambda _: None)
    with pytest.raises(LaunchError, match="exit code 7"):
        pipeline.step_collect(ctx, handle, launcher_type="docker", log=lambda _: None, interval_s=0.1)
