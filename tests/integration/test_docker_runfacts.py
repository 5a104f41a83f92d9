"""A Paddle CPU training in a real Docker container records its own facts as a local run does: Paddle's
memory peak (the start-up hook), step times and the training's report, carried in its log stream."""

from __future__ import annotations

import uuid

import pytest
import yaml

from autodl import pipeline
from autodl.launch.docker import DockerLauncher
from autodl.ledger import Ledger
from autodl.records import RecordStore
from autodl.types import Selection
from tests.integration import paddle_image

pytestmark = [pytest.mark.integration, pytest.mark.slow]

TRAIN = '''
import json, os, time
import paddle

paddle.set_device("cpu")
model = paddle.nn.Linear(256, 64)
opt = paddle.optimizer.SGD(learning_rate=0.01, parameters=model.parameters())
out = os.environ["AUTODL_OUTPUT_DIR"]
before = sorted(os.listdir(out))
for step in range(8):
    loss = model(paddle.randn([64, 256])).mean()
    loss.backward()
    opt.step()
    opt.clear_grad()
    with open(os.environ["AUTODL_METRICS_FILE"], "a") as fh:
        fh.write(json.dumps({"step": step, "t": time.time(), "samples": 64}) + "\\n")
    time.sleep(0.05)
open(os.path.join(out, "night-%d" % len(before)), "w").write("checkpoint")
print("@autodl-runfact metrics " + json.dumps({"kind": "memory", "reserved_peak_bytes": -1}), flush=True)
with open(os.environ["AUTODL_REPORT_FILE"], "w") as fh:
    json.dump({"found": before, "output_dir": out}, fh)
print("trained", flush=True)
'''


@pytest.fixture
def image(docker_client):
    return paddle_image.build(docker_client)


def _run_once(tmp_path, image, name):
    code = tmp_path / "code"
    code.mkdir(parents=True)
    script = code / "train.py"
    script.write_text(TRAIN)
    spec = tmp_path / "spec.yaml"
    spec.write_text(yaml.safe_dump({
        "task": {"script": "code/train.py", "num_gpus_estimate": 1, "model_name": name},
        "launcher": {"type": "docker", "image": image, "image_pull_policy": "Never", "network": "none",
                     "python": paddle_image.python_in_container(), "mounts": paddle_image.python_mounts()},
    }))
    profile = {"script": str(script), "params": 1, "peak_memory_bytes": 1 << 20, "flops_per_step": 1.0,
               "batch_size": 64, "breakdown": {}, "num_workers": 0}
    run_key = f"it.docker_runfacts.{uuid.uuid4().hex[:8]}"
    ctx = pipeline.RunContext(run_key=run_key, dag_id="it_dag", run_id=f"manual__{run_key}",
                              task_id="train.launch", try_number=1)
    lease = Ledger().book(run_key, [f"it-device-{uuid.uuid4().hex[:8]}"], model="A100-SXM4-40GB")
    selection = Selection(lease=lease, placement={"devices": lease.device_ids, "model": lease.model}, devices=[],
                          declared_pool=True, pool_source="test", algorithm="rule_based")
    profile_out = {"profile": profile, "script": str(script), "spec_path": str(spec)}
    lines: list[str] = []
    handle = pipeline.step_launch(ctx, profile_out, selection, log=lines.append)
    try:
        metrics = pipeline.step_collect(ctx, handle, launcher_type="docker", log=lines.append, interval_s=0.2)
    finally:
        for container in DockerLauncher().containers_of(run_key):
            container.remove(force=True)
    pipeline.step_release_and_record(ctx, script=str(script), spec_path=str(spec), profile_out=profile_out,
                                     selection=selection, handle_json=handle, metrics_json=metrics, log=lines.append)
    return RecordStore().get(run_key), lines


def test_docker_paddle_run_records_its_own_peak_steps_and_report(tmp_path, image, docker_client):
    name = f"it-facts-{uuid.uuid4().hex[:6]}"
    try:
        first, lines = _run_once(tmp_path / "one", image, name)
        second, _ = _run_once(tmp_path / "two", image, name)
    finally:
        for volume in docker_client.volumes.list(filters={"label": "autodl.managed=true"}):
            if name in volume.name:
                volume.remove(force=True)
    assert first.outcome == "succeeded"
    metrics = first.metrics
    assert metrics["peak_source"] == "paddle_reserved"
    assert metrics["reserved_peak_bytes"] > 0 and metrics["peak_memory_bytes"] == metrics["reserved_peak_bytes"]
    assert metrics["steps"] == 8 and metrics["step_time_s"] > 0.04
    assert any("self-reported" in n for n in metrics["notes"])
    assert any("1 run-fact lines in the training's log were dropped: metrics fact field" in n
               for n in metrics["notes"]), metrics["notes"]
    assert "[train] trained" in lines and not any("@autodl-runfact" in line for line in lines)
    assert first.report == {"found": [], "output_dir": "/autodl/output"}
    # the second run of the model finds the first one's checkpoint in the model's volume
    assert second.report == {"found": ["night-0"], "output_dir": "/autodl/output"}
    assert second.actual_peak_bytes and second.metrics["steps"] == 8
