"""The simulated workload: Philly jobs sorted by submit time, each given a model class, a speed per device model and a memory need.

Sources (cite them in any output): the job table ``philly-jobs.csv`` (Jeon et al., USENIX ATC 2019,
as derived in the Sia SOSP 2023 artifacts, CC BY 4.0) and the heterogeneity matrix
``gpu-relative-throughput.csv`` (single-GPU throughput relative to a V100, from the Sia/Pollux
artifacts). Both ship with autodl in ``include/data/`` (sources and licences in its README).
"""

from __future__ import annotations

import csv
import io
import math
import os
import random
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from autodl.catalog import Catalog
from autodl.config import include_dir
from autodl.errors import AutoDLError
from autodl.inputs import read_text

MAX_CSV_BYTES = 256 << 20
"""Largest trace or throughput CSV read (256 MiB; the shipped Philly trace is a few MiB)."""

DATA_DIR = include_dir() / "data"
"""``include/data``: the Philly trace and the measured throughput ratios, with their sources."""

DEFAULT_TRACE = DATA_DIR / "philly-jobs.csv"
DEFAULT_THROUGHPUT = DATA_DIR / "gpu-relative-throughput.csv"

CLASS_BY_GPU_HOURS = ((1.0, "cifar10_resnet18"), (10.0, "bert_finetune"), (math.inf, "imagenet_resnet50"))
"""Model class of a job by its GPU-hours (upper bound, class), in the manner of Sia (Jayaram
Subramanya et al., SOSP 2023), which gives each trace job a model by its GPU-hours: under 1
GPU-hour a small CIFAR-10 job, 1-10 a BERT fine-tune, above an ImageNet ResNet-50. The bounds are
this simulation's choice (76.8% / 16.8% / 6.4% of Philly jobs)."""

GIB = 2**30

BASE_PEAK_BYTES = {
    "cifar10_resnet18": 3 * GIB,
    "bert_finetune": 7 * GIB,
    "imagenet_resnet50": 9 * GIB,
}
"""Assumed per-device peak memory of each class at its common local batch. Bounded by the data:
all five GPU types, the smallest an 11 GiB RTX 2080 Ti, ran that batch (gpu-relative-throughput.csv),
so each is below 11 GiB; the ordering follows model size (ResNet-18 on 32x32 < BERT-base < ResNet-50
on 224x224). Not measured: an assumption of this simulation."""

BATCH_SCALE = (1.0, 3.0)
"""Each job's batch is its class's common batch times a factor drawn log-uniformly in this range
(users scale the batch to their devices); the peak scales with it. Keeps every job under
0.85 x 40 GiB / 1.15 so that some A100 holds it even at +15% estimate error. Assumption."""

MATRIX_COLUMNS = {
    "T4": ("T4",),
    "V100": ("V100-PCIE-16GB", "V100-PCIE-32GB", "V100-SXM2-32GB"),
    "RTX2080Ti": ("RTX-2080Ti",),
    "QuadroRTX6000": ("Quadro-RTX-6000",),
    "A100-40GB": ("A100-SXM4-40GB",),
}
"""Columns of the heterogeneity matrix and the catalog models each stands for."""

ROOFLINE_REFERENCE = "V100-SXM2-32GB"
"""Catalog model used to scale the speed of device models the matrix lacks: the matrix's V100 is
an AWS p3 V100-SXM2 (15.7 FP32 TFLOPS, 900 GB/s, as this catalog entry)."""


@dataclass(slots=True)
class SimJob:
    """One job of the replay. Times in seconds from the slice's first submit; memory in bytes.

    :ivar duration_s: runtime on a V100 (the trace's duration).
    :ivar peak_bytes: the true per-device peak.
    :ivar est_bytes: the estimate the policy sees (true x (1 + error draw)); set to the true peak
        after an OOM (the failed attempt measured it).
    """

    job_id: int
    submit_s: float
    duration_s: float
    num_gpus: int
    model_class: str
    peak_bytes: int
    est_bytes: int


def load_throughput(path: str | Path | None = None) -> dict[str, dict[str, float]]:
    """Read the heterogeneity matrix.

    :param path: CSV with ``model_class`` and one column per GPU type; default
        ``include/data/gpu-relative-throughput.csv``.
    :returns: ``{model_class: {matrix column: throughput relative to V100}}``.
    :raises AutoDLError: when the file is missing.
    """
    p = Path(path or DEFAULT_THROUGHPUT)
    if not os.path.isfile(p):
        raise AutoDLError(f"{p}: heterogeneity matrix not found; pass --throughput or set AUTODL_INCLUDE to a folder with data/.")
    out: dict[str, dict[str, float]] = {}
    _, text = read_text(p, AutoDLError, "throughput CSV", max_bytes=MAX_CSV_BYTES)
    try:
        for line, row in enumerate(csv.DictReader(io.StringIO(text)), start=2):
            cls = row.pop("model_class")
            row.pop("common_local_batch", None)
            out[cls] = {k: float(v) for k, v in row.items()}
            if not all(math.isfinite(v) and v > 0 for v in out[cls].values()):
                raise ValueError("throughputs must be positive, finite numbers")
    except (KeyError, ValueError, TypeError, csv.Error) as exc:
        raise AutoDLError(f"{p}:{line if 'line' in locals() else 1}: bad row ({exc}); expected model_class and one "
                          "column of relative throughput per GPU type.") from None
    return out


def speed_table(models: list[str], catalog: Catalog, matrix: dict[str, dict[str, float]]) -> tuple[dict[str, dict[str, float]], dict[str, str]]:
    """Relative throughput of each model class on each device model.

    Measured where the matrix has the model; otherwise a roofline bound from the catalog,
    ``min(FP32 TFLOPS ratio, bandwidth ratio)`` against :data:`ROOFLINE_REFERENCE`.

    :returns: ``({model_class: {device model: speed}}, {device model: 'measured'|'estimated'})``.
    """
    col_of = {m: col for col, ms in MATRIX_COLUMNS.items() for m in ms}
    ref = catalog.get(ROOFLINE_REFERENCE)
    table: dict[str, dict[str, float]] = {c: {} for c in matrix}
    how: dict[str, str] = {}
    for name in models:
        col = col_of.get(name)
        if col is not None:
            for c in matrix:
                table[c][name] = matrix[c][col]
            how[name] = "measured"
            continue
        gpu = catalog.get(name)
        est = min(gpu.peak_tflops("fp32") / ref.peak_tflops("fp32"), gpu.memory_bandwidth_gbps / ref.memory_bandwidth_gbps)
        for c in matrix:
            table[c][name] = est
        how[name] = "estimated"
    return table, how


def load_trace(
    path: str | Path | None = None, *, start: int = 0, jobs: int | None = None, seed: int = 0, error: float = 0.15
) -> list[SimJob]:
    """Read the Philly job table, sort by submit time, take a contiguous slice and attach classes and memory.

    Draws (batch scale, estimate error) come from one ``random.Random(seed)`` over the whole
    sorted trace, so a job's draws do not depend on the slice.

    :param path: CSV with ``timestamp,duration,num_gpus,gpu_time``; default ``include/data/philly-jobs.csv``.
    :param start: index of the first job of the slice (after sorting).
    :param jobs: number of jobs (``None`` = to the end).
    :param seed: seed of the draws.
    :param error: estimate error: the estimate is the true peak x (1 + U(-error, +error)).
    :returns: the slice, submit times relative to its first job.
    :raises AutoDLError: when the file is missing or a row is malformed (naming the line).
    """
    p = Path(path or DEFAULT_TRACE)
    if not os.path.isfile(p):
        raise AutoDLError(f"{p}: job trace not found; pass --trace or set AUTODL_INCLUDE to a folder with data/.")
    rows = []
    _, text = read_text(p, AutoDLError, "job trace CSV", max_bytes=MAX_CSV_BYTES)
    reader = enumerate(csv.DictReader(io.StringIO(text)), start=2)
    line = 1
    while True:
        try:
            line, r = next(reader)
        except StopIteration:
            break
        except csv.Error as exc:
            raise AutoDLError(f"{p}:{line + 1}: not a CSV row ({exc}).") from None
        try:
            row = (datetime.fromisoformat(r["timestamp"]).timestamp(), float(r["duration"]),
                   int(r["num_gpus"]), float(r["gpu_time"]))
            if not all(math.isfinite(v) for v in row) or row[1] < 0 or row[2] < 1:
                raise ValueError("duration and gpu_time must be finite, num_gpus >= 1")
            rows.append(row)
        except (KeyError, ValueError, TypeError, OverflowError) as exc:
            raise AutoDLError(f"{p}:{line}: bad row ({exc}); expected timestamp,duration,num_gpus,gpu_time.") from None
    rows.sort(key=lambda r: r[0])
    rng = random.Random(seed)
    lo, hi = math.log(BATCH_SCALE[0]), math.log(BATCH_SCALE[1])
    draws = [(math.exp(rng.uniform(lo, hi)), rng.uniform(-error, error)) for _ in rows]
    end = len(rows) if jobs is None else min(len(rows), start + jobs)
    if start < 0 or start >= len(rows):
        raise AutoDLError(f"--start {start} is outside the trace ({len(rows)} jobs); use 0..{len(rows) - 1}.")
    t0 = rows[start][0]
    out = []
    for i in range(start, end):
        ts, dur, n, gpu_s = rows[i]
        hours = gpu_s / 3600.0
        cls = next(c for bound, c in CLASS_BY_GPU_HOURS if hours < bound)
        scale, err = draws[i]
        peak = int(BASE_PEAK_BYTES[cls] * scale)
        out.append(SimJob(i, ts - t0, max(1.0, dur), max(1, n), cls, peak, int(peak * (1.0 + err))))
    return out
