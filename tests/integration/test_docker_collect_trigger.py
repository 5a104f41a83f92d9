"""The collect trigger follows a real container across a triggerer restart: each log line and each run fact once."""

from __future__ import annotations

import asyncio
import json
import uuid

import pytest
import yaml

from autodl import pipeline
from autodl.launch.docker import DockerLauncher
from autodl.ledger import Ledger
from autodl.types import Selection
from tests.airflow.test_trigger import LogSink, collect_trigger, first_event

pytestmark = pytest.mark.integration

FACT = "@autodl-runfact"
COMMAND = (  # step times a second apart from the container's clock (dated within the run: autodl.metrics.checked_steps)
    "b=$(date +%s); for i in 0 1 2 3 4 5; do echo line $i; "
    f"echo '{FACT} metrics {{\"step\": '$i', \"t\": '$((b + i))'.5, \"samples\": 4}}' >&2; sleep 0.25; done; "
    f"echo '{FACT} report {{\"epoch\": 1}}' >&2; echo end"
)


def test_trigger_restart_repeats_no_line_and_no_fact(tmp_path, busybox_image, docker_client):
    code = tmp_path / "code"
    code.mkdir()
    (code / "train.py").write_text("unused\n")
    spec = tmp_path / "spec.yaml"
    spec.write_text(yaml.safe_dump({
        "task": {"script": "code/train.py", "num_gpus_estimate": 1},
        "launcher": {"type": "docker", "image": busybox_image, "image_pull_policy": "Never", "network": "none",
                     "command": ["sh", "-c", COMMAND]},
    }))
    profile = {"script": str(code / "train.py"), "params": 1, "peak_memory_bytes": 1 << 20, "flops_per_step": 1.0,
               "batch_size": 1, "breakdown": {}, "num_workers": 0}
    run_key = f"it.docker_trigger.{uuid.uuid4().hex[:8]}"
    ctx = pipeline.RunContext(run_key=run_key, dag_id="it_dag", run_id="manual__it", task_id="g.collect", try_number=1)
    lease = Ledger().book(run_key, [f"it-device-{uuid.uuid4().hex[:8]}"], model="A100-SXM4-40GB")
    selection = Selection(lease=lease, placement={"devices": lease.device_ids, "model": lease.model}, devices=[],
                          declared_pool=True, pool_source="test", algorithm="rule_based")
    out = {"profile": profile, "script": str(code / "train.py"), "spec_path": str(spec)}
    handle = pipeline.step_launch(ctx, out, selection, log=lambda _l: None)
    sink = LogSink()

    async def interrupted():
        trigger = collect_trigger(ctx, handle)
        trigger.log_line = lambda line: sink.info("[train] %s", line)
        task = asyncio.ensure_future(first_event(trigger))
        while not any("line 2" in line for line in sink.lines):
            await asyncio.sleep(0.05)
        task.cancel()  # the triggerer went away mid-run
        try:
            await task
        except asyncio.CancelledError:
            pass

    try:
        asyncio.run(interrupted())
        resumed = collect_trigger(ctx, handle)
        resumed.log_line = lambda line: sink.info("[train] %s", line)
        event = asyncio.run(first_event(resumed))
    finally:
        for container in DockerLauncher(client=docker_client).containers_of(run_key):
            container.remove(force=True)
    assert event.payload["status"] == "ended" and event.payload["exit_code"] == 0
    assert [line for line in sink.lines if line.startswith("[train]")] == \
        [f"[train] line {i}" for i in range(6)] + ["[train] end"]
    metrics = event.payload["metrics"]
    assert metrics["steps"] == 6 and metrics["step_time_s"] == 1.0, "six step facts, none kept twice"
    report = json.loads((pipeline.state_dir(run_key) / "report.json").read_text())
    assert report == {"epoch": 1}
