"""Fit and check the step-time model against measured GPU throughput ratios (not a test; prints tables).

Data: include/data/gpu-relative-throughput.csv — single-GPU training throughput relative to a V100,
from the Sia/Pollux artifacts (see include/data/README.md). Models: autodl's static profiles of
benchmarks/models/{resnet18,resnet50,transformer_cls}.py standing in for the CSV's ResNet-18/CIFAR-10,
ResNet-50/ImageNet and BERT fine-tuning classes.

    .venv/bin/python benchmarks/step_time_calibration.py
"""

from __future__ import annotations

import csv
import math
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "plugins"))

from autodl.catalog import load_catalog  # noqa: E402
from autodl.profile import profile_script  # noqa: E402
from autodl.profile import runtime  # noqa: E402
from autodl.spec import parse_spec  # noqa: E402

CSV = ROOT / "include" / "data" / "gpu-relative-throughput.csv"
COLUMNS = {"T4": "T4", "RTX2080Ti": "RTX-2080Ti", "QuadroRTX6000": "Quadro-RTX-6000", "A100-40GB": "A100-SXM4-40GB"}
STAND_INS = {"cifar10_resnet18": ("resnet18", 128), "imagenet_resnet50": ("resnet50", 64), "bert_finetune": ("transformer_cls", 16)}


def measured() -> dict[str, dict[str, float]]:
    with open(CSV) as fh:
        return {row["model_class"]: {COLUMNS[k]: float(row[k]) for k in COLUMNS} for row in csv.DictReader(fh)}


def step(p, g, e, k, additive=True):
    b = p.breakdown
    comp = (p.flops_per_step or 0.0) / (g.peak_tflops("fp32") * 1e12 * e)   # its profiles all have FLOPs
    mem = (3 * (b.weights_bytes + b.gradients_bytes) + 2 * b.optimizer_state_bytes + k * b.activations_bytes) / (g.memory_bandwidth_gbps * 1e9)
    return comp + mem if additive else max(comp, mem)


def main() -> None:
    catalog = load_catalog()
    truth = measured()
    profiles = {cls: profile_script(ROOT / "benchmarks" / "models" / f"{name}.py",
                                    parse_spec({"task": {"batch_size_per_gpu": batch}}), probe=False, catalog=catalog)
                for cls, (name, batch) in STAND_INS.items()}
    v100 = catalog.get("V100-PCIE-16GB")

    def errors(e, k, additive=True):
        out = []
        for cls, row in truth.items():
            p = profiles[cls]
            for gpu, ratio in row.items():
                pred = step(p, v100, e, k, additive) / step(p, catalog.get(gpu), e, k, additive)
                out.append((cls, gpu, ratio, pred, math.log(pred / ratio)))
        return out

    grid = [(e, k) for e in (0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0) for k in (1, 2, 5, 10, 20, 50, 100, 150, 200, 400)]
    scored = sorted(grid, key=lambda ek: sum(abs(x[4]) for x in errors(*ek)))
    print(f"best fits (mean |log err|): " + ", ".join(
        f"e={e} k={k}: {sum(abs(x[4]) for x in errors(e, k)) / 12:.3f}" for e, k in scored[:4]))
    rows = {
        "uncalibrated roofline max(compute@0.35, 2 x act)": errors(0.35, 2, additive=False),
        f"autodl (e={runtime.COMPUTE_EFFICIENCY}, k={runtime.ACTIVATION_TRAFFIC:g})": errors(runtime.COMPUTE_EFFICIENCY, runtime.ACTIVATION_TRAFFIC),
    }
    print(f"\n{'class':20s} {'GPU':16s} {'measured':>9s} " + " ".join(f"{n[:28]:>30s}" for n in rows))
    base = next(iter(rows.values()))
    for i, (cls, gpu, ratio, _p, _e) in enumerate(base):
        print(f"{cls:20s} {gpu:16s} {ratio:9.3f} " + " ".join(f"{r[i][3]:30.3f}" for r in rows.values()))
    for name, errs in rows.items():
        mean = sum(abs(x[4]) for x in errs) / len(errs)
        worst = max(abs(x[4]) for x in errs)
        print(f"{name}: mean |log err| {mean:.3f} (~{math.expm1(mean):.0%}), worst {worst:.3f} (~{math.expm1(worst):.0%})")


if __name__ == "__main__":
    main()
