"""Step-time model against the measured GPU throughput ratios of include/data/gpu-relative-throughput.csv."""

from __future__ import annotations

import csv
import math
from pathlib import Path

import pytest

from autodl.profile import profile_script
from autodl.profile.runtime import estimate_step_time_s
from autodl.spec import parse_spec

ROOT = Path(__file__).resolve().parents[2]
CSV = ROOT / "include" / "data" / "gpu-relative-throughput.csv"
COLUMNS = {"T4": "T4", "RTX2080Ti": "RTX-2080Ti", "QuadroRTX6000": "Quadro-RTX-6000", "A100-40GB": "A100-SXM4-40GB"}
STAND_INS = {"cifar10_resnet18": ("resnet18", 128), "imagenet_resnet50": ("resnet50", 64),
             "bert_finetune": ("transformer_cls", 16)}


@pytest.fixture(scope="module")
def measured():
    with open(CSV) as fh:
        return {row["model_class"]: {COLUMNS[k]: float(row[k]) for k in COLUMNS} for row in csv.DictReader(fh)}


@pytest.mark.parametrize("model_class", sorted(STAND_INS))
def test_predicted_speed_ratios_match_measurements(catalog, measured, model_class):
    """Every predicted throughput ratio vs V100 is within 35% of the Sia/Pollux measurement, and the
    GPUs come out in the measured order (a FLOPS-only roofline put the T4 at 0.58 x V100, measured 0.34-0.41). The
    profile is the dry run's (its FLOPs and breakdown): without one the FLOPs are unknown and so is the step time."""
    name, batch = STAND_INS[model_class]
    p = profile_script(ROOT / "benchmarks" / "models" / f"{name}.py", parse_spec({"task": {"batch_size_per_gpu": batch}}),
                       catalog=catalog)
    v100 = estimate_step_time_s(p, catalog.get("V100-PCIE-16GB"))
    predicted = {gpu: v100 / estimate_step_time_s(p, catalog.get(gpu)) for gpu in measured[model_class]}
    for gpu, ratio in measured[model_class].items():
        assert abs(math.log(predicted[gpu] / ratio)) < math.log(1.35), (gpu, predicted[gpu], ratio)
    assert predicted["T4"] < predicted["RTX-2080Ti"] < 1.0 < predicted["A100-SXM4-40GB"]


def test_a100_ranks_above_rtx3090_for_the_example_cnn(catalog):
    p = profile_script(ROOT / "include" / "scripts" / "simple_cnn.py", catalog=catalog)
    assert estimate_step_time_s(p, catalog.get("A100-SXM4-40GB")) < estimate_step_time_s(p, catalog.get("RTX-3090"))
