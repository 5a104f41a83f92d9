"""The GPU check of issue 22 (scripts/gpu_check.sh -> benchmarks/gpu_check.py) run here against the fake NVML, so it
cannot rot before a session with a device runs it: its JSON says what ran, what could not (and why), what failed."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.hardware.conftest import FAKE_NVML, MiB

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "gpu_check.sh"
UUID = "GPU-0a1b2c3d-h200-0000-0000-000000000000"
H200 = {"name": "NVIDIA H200", "uuid": UUID, "bus": "00000000:18:00.0", "total": 143771 * MiB, "used_v1": 575 * MiB,
        "used_v2": 4 * MiB, "reserved": 571 * MiB, "util": 0, "temp": 31, "power_mw": 75000, "procs": []}
"""An idle H200 as NVML reports it (143771 MiB total, as nvidia-smi shows an H200 SXM)."""

FAKE_SMI = r'''#!{python}
"""nvidia-smi --query-gpu=... --format=csv,noheader,nounits from the fake NVML's scenario (memory.total + $SMI_TOTAL_OFFSET_MIB)."""
import json, os, sys
assert sys.argv[1].startswith("--query-gpu=") and sys.argv[2] == "--format=csv,noheader,nounits", sys.argv
fields = sys.argv[1].split("=", 1)[1].split(",")
for i, d in enumerate(json.load(open(os.environ["FAKE_NVML_CONFIG"]))["devices"]):
    row = {{"index": i, "uuid": d["uuid"], "name": d["name"],
           "memory.total": d["total"] // 2**20 + int(os.environ.get("SMI_TOTAL_OFFSET_MIB", "0")),
           "memory.used": d["used_v2"] // 2**20, "mig.mode.current": "[N/A]", "utilization.gpu": d["util"],
           "temperature.gpu": d["temp"], "power.draw": "%.2f" % (d["power_mw"] / 1000), "driver_version": "570.86.15"}}
    print(", ".join(str(row[f]) for f in fields))
'''

STAND_IN_TORCH = '''"""A stand-in for torch's CUDA surface the GPU check's child uses (no GPU here): exercises the check's GPU branch."""
import os
__version__ = "0.0+stand-in"
class version: cuda = "12.8"
uint8 = "uint8"
_TOTAL = 143771 * 2**20
class OutOfMemoryError(RuntimeError):
    pass
class _Props:
    name = "NVIDIA H200"
    total_memory = _TOTAL
    uuid = os.environ.get("CUDA_VISIBLE_DEVICES", "GPU-none").split(",")[0].removeprefix("GPU-")
class _T:
    def square(self): return self
    def mean(self): return self
    def backward(self): pass
    def __float__(self): return 0.5
class cuda:
    @staticmethod
    def is_available(): return True
    @staticmethod
    def device_count(): return 1
    @staticmethod
    def get_device_properties(i): return _Props()
    @staticmethod
    def init(): pass
    @staticmethod
    def synchronize(): pass
    @staticmethod
    def memory_reserved(): return 2 * 2**20
    @staticmethod
    def max_memory_reserved(): return 1536 * 2**20
    @staticmethod
    def max_memory_allocated(): return 1200 * 2**20
def empty(n, dtype=None, device=None):
    if n > _TOTAL:
        raise OutOfMemoryError(f"CUDA out of memory. Tried to allocate {n / 2**30:.2f} GiB. GPU 0 has a total capacity of "
                               f"{_TOTAL / 2**30:.2f} GiB of which {(_TOTAL - 2**29) / 2**30:.2f} GiB is free.")
    return _T()
def ones(*a, **k): return _T()
def randn(*a, **k): return _T()
class nn:
    class Linear:
        def __init__(self, *a): pass
    class Sequential:
        def __init__(self, *layers): pass
        def cuda(self): return self
        def parameters(self): return []
        def __call__(self, x): return _T()
class optim:
    class Adam:
        def __init__(self, params): pass
        def step(self): pass
        def zero_grad(self, set_to_none=True): pass
'''


def run_check(tmp_path: Path, devices: list[dict], *, smi_offset_mib: int | None = None,
              torch_stand_in: bool = False) -> tuple[int, dict, str]:
    """Runs the one command with the fake NVML (a fake nvidia-smi when ``smi_offset_mib`` is given, the stand-in
    torch when asked); (rc, JSON, text)."""
    scenario = tmp_path / "nvml.json"
    scenario.write_text(json.dumps({"devices": devices}))
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    if smi_offset_mib is not None:
        smi = bin_dir / "nvidia-smi"
        smi.write_text(FAKE_SMI.format(python=sys.executable))
        smi.chmod(0o755)
    path = [str(FAKE_NVML.parent)]
    isolation = {}
    if torch_stand_in:
        (tmp_path / "torch").mkdir()
        (tmp_path / "torch" / "__init__.py").write_text(STAND_IN_TORCH)
        path.append(str(tmp_path))
        # the stand-in lives under /tmp, which an isolated training sees as its own empty /tmp
        # (autodl.launch.isolation); a real torch is in site-packages, which the training sees
        isolation = {"AUTODL_LOCAL_ISOLATION": "none"}
    out = tmp_path / "out"
    env = {**os.environ, "PYTHON": sys.executable, "OUT": str(out), "FAKE_NVML_CONFIG": str(scenario),
           "FAKE_NVML_LOG": str(tmp_path / "nvml.log"), "PYTHONPATH": os.pathsep.join(path),
           "PATH": f"{bin_dir}:{Path(sys.executable).parent}:/usr/bin:/bin",
           "SMI_TOTAL_OFFSET_MIB": str(smi_offset_mib or 0), **isolation}
    done = subprocess.run(["bash", str(SCRIPT)], env=env, capture_output=True, text=True, cwd=tmp_path)
    assert (out / "gpu_check.json").is_file(), done.stdout + done.stderr
    return done.returncode, json.loads((out / "gpu_check.json").read_text()), (out / "gpu_check.txt").read_text()


def by_number(result: dict) -> dict[str, dict]:
    """Steps by their item number and run ('2 plan + book (train)' -> '2 train'); checks by name inside each."""
    out = {}
    for s in result["steps"]:
        number, _, rest = s["name"].partition(" ")
        key = f"{number} {rest.rsplit('(', 1)[1].rstrip(')')}" if number in ("2", "7") else number
        out[key] = {**s, "by_check": {c["name"]: c for c in s["checks"]}}
    return out


def test_without_torch_or_nvidia_smi_every_step_that_can_runs_and_the_others_say_why(tmp_path):
    """Here (no torch, no nvidia-smi): inventory, booking, the UUID-pinned launch, NVML collection, the timeline and
    the release run against the fake H200; the comparison with nvidia-smi, the torch-side checks, the CUDA context and
    the OOM say 'not run' with the reason, and the check passes."""
    rc, result, text = run_check(tmp_path, [H200])
    steps = by_number(result)
    assert rc == 0 and result["ok"] is True
    inv = steps["1"]
    assert inv["status"] == "ok" and inv["figures"]["devices"][0]["model"] == "H200-SXM-141GB"
    assert inv["by_check"]["nvidia-smi comparison"] == {"name": "nvidia-smi comparison", "ok": None,
                                                         "detail": "not run: nvidia-smi is not on PATH"}
    assert inv["by_check"][f"{UUID}: memory info v2"]["ok"] is True
    assert steps["2 train"]["status"] == "ok" and steps["2 train"]["figures"]["booked"] == [UUID]
    launch = steps["3"]
    assert launch["status"] == "ok" and launch["by_check"]["CUDA_VISIBLE_DEVICES in the child"]["ok"] is True
    assert launch["figures"]["child"]["cuda_visible_devices"] == UUID
    assert launch["by_check"]["visible devices (torch)"]["ok"] is None
    assert launch["by_check"]["visible devices (torch)"]["detail"].startswith("not run: ")
    collect = steps["4"]
    assert collect["status"] == "ok" and collect["figures"]["source"] == "nvml" and collect["figures"]["samples"] >= 1
    assert collect["figures"]["device_used_peak_bytes"] == 4 * MiB and collect["figures"]["process_peak_bytes"] == 0
    assert Path(collect["figures"]["timeline_png"]).stat().st_size > 0
    assert steps["5"]["status"] == "not run" and steps["5"]["figures"]["assumed_cuda_context_bytes"] == 512 * MiB
    assert steps["6"]["status"] == "not run" and steps["6"]["why"]
    release = steps["7 train"]
    assert release["status"] == "ok" and release["figures"]["outcome"] == "succeeded"
    assert release["by_check"]["no process of the run on the device"]["ok"] is True
    assert steps["8"]["status"] == "ok"
    assert "NOT RUN  5 CUDA context" in text and "OK       7 release (train)" in text
    cap = steps["9"]  # .venv's Paddle is a CPU build: the cap cannot be measured here, and the check says so
    assert cap["status"] == "not run" and "memory cap not verified under auto_growth" in cap["why"]
    assert "not built with CUDA" in cap["why"] or "not installed" in cap["why"]


@pytest.mark.parametrize("offset_mib, agrees", [(0, True), (1024, False)])
def test_every_inventory_figure_is_compared_with_nvidia_smi_and_a_disagreement_fails(tmp_path, offset_mib, agrees):
    """A (fake) nvidia-smi that reads the same driver figures agrees on model, MIG mode, memory, utilization,
    temperature and power; one whose memory total is 1 GiB off fails the inventory step and the check (exit 1),
    and every later step still runs."""
    rc, result, text = run_check(tmp_path, [H200], smi_offset_mib=offset_mib)
    steps = by_number(result)
    checks = steps["1"]["by_check"]
    compared = {name.split(": ", 1)[1]: c["ok"] for name, c in checks.items() if name.startswith(f"{UUID}: ")}
    assert set(compared) >= {"model", "mig_mode", "memory_total_bytes", "memory_used_bytes", "utilization_pct",
                             "temperature_c", "power_w"}
    assert compared["memory_total_bytes"] is agrees
    assert all(ok is True for name, ok in compared.items() if name != "memory_total_bytes")
    assert (rc, result["ok"], steps["1"]["status"]) == ((0, True, "ok") if agrees else (1, False, "failed"))
    assert steps["7 train"]["status"] == "ok" and steps["8"]["status"] == "ok"
    if not agrees:
        assert "FAILED   1 inventory" in text
        assert f"nvidia-smi {(143771 + 1024) * MiB:g}" in checks[f"{UUID}: memory_total_bytes"]["detail"]


def test_a_host_whose_only_gpu_is_lost_fails_at_the_inventory_with_the_reason(tmp_path):
    """No healthy GPU with a UUID: the check says so in step 1 and books, launches and changes nothing."""
    rc, result, _text = run_check(tmp_path, [{**H200, "lost": True}])
    assert rc == 1 and [s["name"] for s in result["steps"]] == ["1 inventory (NVML vs nvidia-smi)"]
    step = result["steps"][0]
    assert step["status"] == "failed" and step["why"].startswith("a healthy GPU with a UUID: 1 device(s), 0 usable")
    assert step["figures"]["devices"][0]["healthy"] is False


def load_check():
    spec = importlib.util.spec_from_file_location("gpu_check", REPO / "benchmarks" / "gpu_check.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("gpu_check", module)  # dataclasses look their module up while the file runs
    spec.loader.exec_module(sys.modules["gpu_check"])
    return sys.modules["gpu_check"]


def test_a_figure_nvidia_smi_does_not_report_is_unknown_not_a_disagreement(catalog):
    """nvidia-smi prints '[N/A]' for power on some boards and '[Not Supported]' elsewhere: the comparison is
    unknown (None), neither passed nor failed; a figure NVML could not read is unknown the same way."""
    check = load_check()
    device = {"device_id": UUID, "uuid": UUID, "model": "H200-SXM-141GB", "memory_total_bytes": 143771 * MiB,
              "memory_used_bytes": 4 * MiB, "utilization_pct": None, "temperature_c": 31.0, "power_w": 75.0}
    row = {"name": "NVIDIA H200", "memory.total": "143771", "memory.used": "4", "mig.mode.current": "Disabled",
           "utilization.gpu": "0", "temperature.gpu": "31", "power.draw": "[N/A]"}
    result = {c.name: c.ok for c in check.compare_smi(device, row, catalog, [device])}
    assert result == {"model": True, "mig_mode": True, "memory_total_bytes": True, "memory_used_bytes": True,
                      "utilization_pct": None, "temperature_c": True, "power_w": None}
    mig_on = {c.name: c.ok for c in check.compare_smi(device, {**row, "mig.mode.current": "Enabled"}, catalog, [device])}
    assert mig_on["mig_mode"] is False   # nvidia-smi says MIG, autodl lists the whole GPU


def test_the_check_sets_nothing_on_the_card():
    """Item 8: no NVML setter, no reset, no MIG, clock or power change anywhere in the check or its command."""
    text = (REPO / "benchmarks" / "gpu_check.py").read_text() + (REPO / "scripts" / "gpu_check.sh").read_text()
    for forbidden in ("nvmlDeviceSet", "nvmlDeviceReset", "nvmlDeviceClear", "nvmlGpuInstanceCreate", "--gpu-reset",
                      "-r ", "-mig", "mig -cgi", "-lgc", "--lock-gpu-clocks", "-pl ", "--power-limit", "-ac ",
                      "--applications-clocks", "-pm ", "--persistence-mode", "-c ", "--compute-mode"):
        assert forbidden not in text, forbidden


def test_the_gpu_branch_driven_by_a_stand_in_torch_reaches_every_gpu_check(tmp_path):
    """Plumbing only, so that the one device run is not lost to a slip in code no CPU run reaches: with a stand-in
    for torch's CUDA calls (no GPU, no memory behind it) the child reports what it sees, step 3 compares the visible
    device's UUID, 4 compares the NVML peak with torch's counters, 5 reports the first allocation, and 6 books,
    launches, fails and releases a second run asking for 1.25x the card. The fake NVML lists no process for the
    child, so 4's comparisons fail here; 6's out-of-memory is explained from PyTorch's own message."""
    rc, result, _text = run_check(tmp_path, [H200], torch_stand_in=True)
    steps = by_number(result)
    assert rc == 1 and result["torch"]["cuda_available"] is True
    launch = steps["3"]["by_check"]
    assert launch["exactly one device visible"]["ok"] is True and launch["the visible device is the booked one"]["ok"] is True
    collect = steps["4"]
    assert collect["figures"]["torch_max_memory_reserved_bytes"] == 1536 * MiB
    assert collect["by_check"]["peak vs max_memory_reserved + context"]["ok"] is False   # NVML (fake) saw no process
    assert steps["5"]["status"] == "ok" and steps["5"]["figures"]["first_allocation_reserved_bytes"] == 2 * MiB
    assert steps["2 oom"]["status"] == "ok" and steps["7 oom"]["figures"]["outcome"] == "failed"
    assert steps["7 oom"]["status"] == "ok" and steps["7 train"]["status"] == "ok"
    oom = steps["6"]
    assert oom["figures"]["requested_bytes"] == int(H200["total"] * 1.25) and oom["by_check"]["the child failed"]["ok"]
    assert oom["by_check"]["explained as an OOM"]["ok"] is True


STAND_IN_PADDLE = '''"""A stand-in for the Paddle surface step 9's child uses (no GPU here): its allocator honours the cap when
$STAND_IN_HONOURS_CAP is 1, else allocates past it (what auto_growth would do if it ignored the flag)."""
import os
__version__ = "0.0+stand-in"
class _Cuda:
    reserved = 0
    @staticmethod
    def device_count(): return 1
    @classmethod
    def max_memory_reserved(cls): return cls.reserved
class device:
    cuda = _Cuda
def is_compiled_with_cuda(): return True
def get_flags(names): return {n: os.environ.get(n) for n in names}
def set_device(name): assert name == "gpu"
class _T:
    def __init__(self, n): self.shape = [n]
def zeros(shape, dtype):
    n = shape[0]
    if os.environ.get("STAND_IN_HONOURS_CAP") == "1" and _Cuda.reserved + n > int(os.environ["FLAGS_gpu_memory_limit_mb"]) * 2**20:
        raise MemoryError(f"Out of memory error on GPU 0. Cannot allocate {n} bytes: the limit is reached")
    _Cuda.reserved += n
    return _T(n)
'''


@pytest.mark.parametrize("honours, status", [("1", "ok"), ("0", "failed")])
def test_step_9_passes_only_when_an_allocation_past_the_cap_raises(tmp_path, monkeypatch, honours, status):
    """The GPU branch of step 9, driven by a stand-in Paddle: an allocator that honours FLAGS_gpu_memory_limit_mb
    passes; one that allocates twice the cap fails the step, saying the cap was ignored."""
    (tmp_path / "paddle").mkdir()
    (tmp_path / "paddle" / "__init__.py").write_text(STAND_IN_PADDLE)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(tmp_path), str(REPO / "plugins")]))
    monkeypatch.setenv("STAND_IN_HONOURS_CAP", honours)
    check = load_check()
    step = check.check_paddle_cap(sys.executable, {"uuid": UUID, "memory_total_bytes": 143771 * MiB})
    assert step.status == status, step
    child = step.figures["child"]
    assert child["flags"]["FLAGS_gpu_memory_limit_mb"] == "1024"
    assert child["flags"]["FLAGS_allocator_strategy"] == "auto_growth"
    assert child["within_cap_ok"] is True
    if status == "failed":
        assert "auto_growth ignores the cap" in step.why
    else:
        assert "Cannot allocate" in child["past_cap_error"]
