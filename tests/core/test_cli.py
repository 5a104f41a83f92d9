"""The autodl command as a user runs it: JSON documents, tables, exit codes and messages."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SPEC = REPO / "include" / "specs" / "simple_cnn.yaml"
SCRIPT = REPO / "include" / "scripts" / "simple_cnn.py"


def autodl(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    proc = subprocess.run([sys.executable, "-m", "autodl.cli", *args], capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(REPO / "plugins")}, cwd=REPO)
    if check:
        assert proc.returncode == 0, proc.stderr
    return proc


def test_profile_json_has_the_documented_keys():
    out = json.loads(autodl("profile", str(SCRIPT), "--spec", str(SPEC), "--json", "--no-probe").stdout)
    for key in ("params", "peak_memory_bytes", "breakdown", "flops_per_step", "num_gpus", "findings",
                "max_batch_size_by_device"):
        assert key in out
    # conv1 3*32*9+32, bn1 4*32, conv2 32*64*9+64, bn2 4*64, fc1 4096*256+256, fc2 256*10+10
    assert out["params"] == 896 + 128 + 18496 + 256 + 1048832 + 2570
    assert out["batch_size"] == 64
    assert out["max_batch_size_by_device"]["A100-SXM4-40GB"] > out["max_batch_size_by_device"]["T4"] > 64
    assert out["peak_memory_bytes"] == sum(out["breakdown"].values())


def test_plan_json_ranks_the_demo_pool():
    out = json.loads(autodl("plan", str(SPEC), "--json", "--no-probe", "--pool", str(REPO / "include/pools/demo.yaml")).stdout)
    assert out["fits"] is True and out["declared_pool"] is True
    first = out["placements"][0]
    assert first["model"] == "A100-SXM4-40GB" and first["devices"] == ["GPU-demo0000-a100-0000-0000-000000000000"]
    assert first["score"] >= out["placements"][-1]["score"] and first["reasons"]
    assert any(d["model"] == "Ascend-910" for d in out["dropped"])
    # on the chosen device the run is pinned by UUID; the pool is declared, so here it runs on CPU
    assert out["launch"]["env"]["CUDA_VISIBLE_DEVICES"] == "GPU-demo0000-a100-0000-0000-000000000000"
    assert out["launch_here"]["env"]["CUDA_VISIBLE_DEVICES"] == ""
    assert "simple_cnn.py" in out["launch"]["shell"]


def test_plan_table_without_json():
    proc = autodl("plan", str(SPEC), "--no-probe")
    assert "A100-SXM4-40GB" in proc.stdout and "DECLARED" in proc.stdout and "dropped" in proc.stdout


def test_no_fit_exits_4_with_advice(tmp_path):
    spec = tmp_path / "huge.yaml"
    spec.write_text(f"task:\n  script: {SCRIPT}\n  input_shape: [3, 32, 32]\n  batch_size_per_gpu: 2000000\n")
    proc = autodl("plan", str(spec), "--json", "--no-probe", check=False)
    assert proc.returncode == 4
    out = json.loads(proc.stdout)
    assert out["fits"] is False and out["placements"] == [] and out["suggestions"]


def test_bad_spec_exits_2_naming_field(tmp_path):
    spec = tmp_path / "bad.yaml"
    spec.write_text("resource_policy:\n  memory_threshold: 1.7\n")
    proc = autodl("plan", str(spec), check=False)
    assert proc.returncode == 2
    assert "resource_policy.memory_threshold" in proc.stderr and str(spec) in proc.stderr


def test_missing_script_and_syntax_error(tmp_path):
    proc = autodl("profile", str(tmp_path / "none.py"), check=False)
    assert proc.returncode == 2 and "does not exist" in proc.stderr
    bad = tmp_path / "bad.py"
    bad.write_text("import paddle\ndef f(:\n    pass\n")
    proc = autodl("profile", str(bad), "--no-probe", check=False)
    assert proc.returncode == 3 and "bad.py:2" in proc.stderr and "syntax error" in proc.stderr


def test_inventory_and_runs_and_leases_json():
    inv = json.loads(autodl("inventory", "--json", "--pool", str(REPO / "include/pools/demo.yaml")).stdout)
    assert len(inv["devices"]) == 4 and inv["leased"] == {}
    assert json.loads(autodl("runs", "--json").stdout) == []
    assert json.loads(autodl("leases", "--json").stdout) == []


def test_plan_text_shows_the_pod_for_kubernetes(tmp_path):
    spec = tmp_path / "k8s.yaml"
    spec.write_text(f"task:\n  script: {SCRIPT}\n  input_shape: [3, 32, 32]\nlauncher:\n  type: kubernetes\n  namespace: training\n")
    out = autodl("plan", str(spec), "--no-probe").stdout
    assert "create this pod in namespace training" in out
    assert "nvidia.com/gpu: '1'" in out and "nvidia.com/gpu.product: NVIDIA-A100-SXM4-40GB" in out
