"""Each run's own memory: the training's own peak counters (start-up hook), NVML per-process memory by device UUID,
never device-wide 'used' as the run's peak (cases A05 spiky, A08-17 shared)."""

from __future__ import annotations

import json
import sys

import pytest

from autodl.catalog import load_catalog
from autodl.launch import LaunchRequest
from autodl.launch.local import LocalLauncher
from autodl.metrics import NvmlSampler, follow, make_sampler, read_memory_reports, summarise, write_baseline
from autodl.types import Device
from tests.hardware.conftest import GiB

SPIKY_TRAINING = """
import paddle
paddle.set_device("cpu")
model = paddle.nn.Linear(64, 64)
opt = paddle.optimizer.Adam(parameters=model.parameters())
for step in range(3):
    loss = model(paddle.randn([8, 64])).mean()
    loss.backward()
    spike = paddle.zeros([16, 1024, 1024])  # 64 MiB held for a moment, as an activation spike between two samples
    del spike
    opt.step()
    opt.clear_grad()
print("trained", flush=True)
"""


def gpu_device(uuid: str, model="A100-SXM4-40GB") -> Device:
    return Device(device_id=uuid, index=0, uuid=uuid, model=model, memory_total_bytes=40 * GiB)


def test_a05_the_recorded_peak_is_the_trainings_own_counter(tmp_path, fake_nvml):
    """A05: a device whose memory peaks for 0.3 s in every 3 s step; a 1 Hz sample of device 'used' misses or
    mis-attributes it. The recorded peak is the training's own peak counter, reported by autodl's start-up hook
    (the script is not edited), which holds the 64 MiB spike of every step."""
    nv = fake_nvml("A05-nvml_spiky.json")
    uuid = "GPU-2080ti-ocr-0000"
    script = tmp_path / "train.py"
    script.write_text(SPIKY_TRAINING)
    launcher = LocalLauncher()
    request = LaunchRequest(run_key="a05", script=str(script), devices=[gpu_device(uuid, "RTX-2080Ti")],
                            vendor=load_catalog().vendor("nvidia"), python=sys.executable)
    assert write_baseline(tmp_path, [uuid], nvml=nv)
    handle = launcher.launch(request)
    notes: list[str] = []
    sampler = make_sampler(handle, [uuid], folder=tmp_path, nvml=nv, notes=notes)
    assert isinstance(sampler, NvmlSampler)
    metrics = follow(launcher, handle, sampler=sampler, log_sink=lambda _l: None, interval_s=1.0, notes=notes)
    assert metrics.exit_code == 0
    reports = [json.loads(line) for line in open(handle.steps_path) if '"kind": "memory"' in line]
    assert reports and reports[-1]["final"] and reports[-1]["device"] == "cpu"   # CPU build: host allocator peaks
    assert metrics.peak_source == "paddle_reserved"
    assert metrics.peak_memory_bytes == max(r["reserved_peak_bytes"] for r in reports) >= 64 * 2**20
    assert metrics.allocated_peak_bytes >= 64 * 2**20
    # device-wide NVML 'used' (3.35 GiB most of the time, 10.5 GiB in the spike) is context, never the run's peak
    assert metrics.device_used_peak_bytes is not None and metrics.device_used_peak_bytes != metrics.peak_memory_bytes


def test_the_hook_leaves_a_script_without_paddle_alone_and_keeps_the_site_hook(tmp_path):
    """The hook is inert for a process that never trains, and a sitecustomize it shadows still runs."""
    other = tmp_path / "site"
    other.mkdir()
    (other / "sitecustomize.py").write_text("import os\nos.environ['OTHER_SITE_HOOK_RAN'] = '1'\n")
    script = tmp_path / "t.py"
    script.write_text("import os\nprint(os.environ.get('OTHER_SITE_HOOK_RAN'))\n")
    launcher = LocalLauncher()
    request = LaunchRequest(run_key="plain", script=str(script), on_cpu=True, vendor=load_catalog().vendor("nvidia"),
                            env={"PYTHONPATH": str(other)})
    handle = launcher.launch(request)
    lines: list[str] = []
    metrics = follow(launcher, handle, sampler=None, log_sink=lines.append, interval_s=0.05)
    assert metrics.exit_code == 0 and lines[0] == "1"
    assert read_memory_reports(handle.steps_path)["reserved_peak_bytes"] is None


def test_a08_17_shared_device_own_memory_by_uuid_not_device_used(tmp_path, fake_nvml):
    """A08-17: another job holds 10 GiB on the same A100; the run pre-allocated 26.5 GiB (naive_best_fit) for a
    ~3 GiB tensor peak. The record holds the run's own figures side by side — Paddle's allocated ~3 GiB and
    reserved 26.5 GiB, NVML's 26.5 GiB for the run's process — and keeps the 36.5 GiB device 'used' and the other
    job's 10 GiB apart. The run's process is told from the other job's by device UUID and launch time (the
    baseline), never by matching process ids (pid 412399 is nobody in this process tree)."""
    nv = fake_nvml("A08-17-nvml_shared.json")
    uuid = "GPU-88888888-a100-0000-0000-000000000000"
    (tmp_path / "nvml_baseline.json").write_text(json.dumps({uuid: {"412345": 10 * GiB}}))  # before launch: the other job
    sampler = NvmlSampler([uuid], nvml=nv, baseline=json.loads((tmp_path / "nvml_baseline.json").read_text()))
    sample = sampler.sample()
    assert sample["process_bytes"] == 28454158336 and sample["others_bytes"] == 10 * GiB
    assert sample["device_used_bytes"] == 39191576576 and sample["utilization_pct"] == 35
    steps = tmp_path / "steps.jsonl"
    steps.write_text(json.dumps({"kind": "memory", "t": 1.0, "device": uuid, "place": "gpu:0", "step": 5,
                                 "allocated_peak_bytes": 3 * GiB, "reserved_peak_bytes": 28454158336,
                                 "allocator_strategy": "naive_best_fit", "final": True}) + "\n")
    m = summarise([sample], source="nvml", duration_s=10, exit_code=0, steps_path=steps)
    assert m.peak_memory_bytes == 28454158336 and m.peak_source == "paddle_reserved"
    assert m.allocated_peak_bytes == 3 * GiB and m.reserved_peak_bytes == 28454158336
    assert m.process_peak_bytes == 28454158336 and m.others_memory_bytes == 10 * GiB
    assert m.device_used_peak_bytes == 39191576576 and m.peak_by_device[uuid]["process_peak_bytes"] == 28454158336
    without_report = summarise([sample], source="nvml", duration_s=10, exit_code=0)
    assert without_report.peak_memory_bytes == 28454158336 and without_report.peak_source == "nvml_process"


def test_a08_17_busy_versus_too_big(tmp_path):
    """The same shared A100: an OOM where the other job's 10 GiB made the difference is BUSY; the same request on a
    device nobody else uses is TOO BIG, with the batch that would fit."""
    from autodl.oom import explain
    from autodl.types import MemoryBreakdown, ResourceProfile

    profile = ResourceProfile(script="t.py", params=10, peak_memory_bytes=20 * GiB, batch_size=32, flops_per_step=1.0,
                              breakdown=MemoryBreakdown(weights_bytes=4 * GiB, activations_bytes=16 * GiB))
    text = ("ResourceExhaustedError: \n\nOut of memory error on GPU 0. Cannot allocate 4.000000GB memory on GPU 0, "
            "38.500000GB memory has been allocated and available memory is only 1.500000GB.\n")
    reports = {"peak_by_device": {"GPU-8888": {"allocated_peak_bytes": 3 * GiB, "reserved_peak_bytes": 27 * GiB},
                                  "GPU-9999": {"allocated_peak_bytes": GiB, "reserved_peak_bytes": 2 * GiB}},
               "places": {"GPU-8888": "gpu:0", "GPU-9999": "gpu:1"}, "allocator_strategy": "naive_best_fit"}
    busy = explain([text], profile=profile, memory_reports=reports, others_bytes=10 * GiB, env={})
    assert busy.verdict == "busy" and busy.others_bytes == 10 * GiB and busy.allocator_strategy == "naive_best_fit"
    assert busy.allocator_strategy_source == "training" and busy.wanted_bytes == 31 * GiB
    assert "BUSY" in busy.explanation and "naive_best_fit pre-allocates" in busy.explanation
    alone = explain([text.replace("38.500000GB", "28.500000GB").replace("1.500000GB.", "11.500000GB.")
                     .replace("4.000000GB memory on", "14.000000GB memory on")],
                    profile=profile, memory_reports=reports, others_bytes=0, env={})
    assert alone.verdict == "too_big" and alone.requested_bytes == 14 * GiB
    # wanted 27 + 14 = 41 GiB at batch 32 on a 40 GiB card with 4 GiB batch-independent: 32 * 36 / 37 -> 31
    assert alone.fitting_batch_size == 31 and "TOO BIG" in alone.explanation


def test_a_sampler_failure_never_fails_the_run(tmp_path):
    """A sampler that raises mid-run is dropped with a note; the training's exit code 0 stands."""

    class Broken:
        source = "nvml"

        def sample(self):
            raise RuntimeError("NVML went away")

        def close(self):
            raise RuntimeError("and cannot shut down")

    script = tmp_path / "t.py"
    script.write_text("import time\ntime.sleep(0.3)\n")
    launcher = LocalLauncher()
    handle = launcher.launch(LaunchRequest(run_key="broken", script=str(script), on_cpu=True,
                                           vendor=load_catalog().vendor("nvidia")))
    lines: list[str] = []
    metrics = follow(launcher, handle, sampler=Broken(), log_sink=lines.append, interval_s=0.05)
    assert metrics.exit_code == 0
    assert any("sampler (nvml) failed" in n and "NVML went away" in n for n in metrics.notes)
    assert any("NVML went away" in line for line in lines)


def test_nvml_sampler_guards_every_device_and_field(fake_nvml):
    """A15-memory through the sampler: memory NotSupported on one device makes its used unknown (and the sum
    unknown), the other device still sampled; a lost GPU's fields are unknown, not 0."""
    nv = fake_nvml("A15-nvml_memory.json")
    s = NvmlSampler(["GPU-eeeeeeee-a100-0000-0000-000000000000", "GPU-ffffffff-a100-0000-0000-000000000000"], nvml=nv,
                    baseline=None).sample()
    assert s["device_used_bytes"] is None and s["devices"]["GPU-ffffffff-a100-0000-0000-000000000000"]["used_bytes"] == 0
    assert s["utilization_pct"] == 15 and s["process_bytes"] is None


def test_gpu_lost_during_sampling(fake_nvml):
    nv = fake_nvml("B09-gpu-lost-nvml_lost.json")
    s = NvmlSampler(["GPU-b09b09b1-a100-0000-0000-000000000000"], nvml=nv).sample()
    assert s["device_used_bytes"] is None and s["utilization_pct"] is None and s["power_w"] is None


def test_make_sampler_says_why_nvml_was_not_used(tmp_path, fake_nvml):
    from autodl.types import LaunchHandle

    fake_nvml("B01-nvml-mismatch-nvml_mismatch.json")
    notes: list[str] = []
    handle = LaunchHandle(launcher="local", run_key="x", pid=1, device_ids=["GPU-x"])
    sampler = make_sampler(handle, ["GPU-x"], folder=tmp_path, notes=notes)
    assert sampler is not None and sampler.source == "process"
    assert any("NVML sampling unavailable" in n and "version mismatch" in n for n in notes)


@pytest.mark.parametrize("optimizer", ["SGD", "Momentum", "AdamW"])
def test_hook_reports_after_every_kind_of_optimizer_step(tmp_path, optimizer):
    """The hook wraps step/minimize of every Optimizer class, including ones that override step."""
    script = tmp_path / "t.py"
    script.write_text(f"import paddle\nm = paddle.nn.Linear(4, 4)\n"
                      f"o = paddle.optimizer.{optimizer}(parameters=m.parameters(), learning_rate=0.1)\n"
                      "for i in range(2):\n    m(paddle.ones([2, 4])).mean().backward()\n    o.step()\n    o.clear_grad()\n")
    launcher = LocalLauncher()
    handle = launcher.launch(LaunchRequest(run_key=f"opt-{optimizer}", script=str(script), on_cpu=True,
                                           vendor=load_catalog().vendor("nvidia")))
    assert follow(launcher, handle, sampler=None, log_sink=lambda _l: None, interval_s=0.1).exit_code == 0
    rows = [json.loads(line) for line in open(handle.steps_path)]
    assert rows and rows[-1]["step"] == 2 and rows[-1]["allocator_strategy"] == "auto_growth"
