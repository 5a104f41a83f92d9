"""The simulated workload: Philly jobs sorted by submit time, each given a model class, a speed per device model and a memory need.

Sources (cite them in any output): the job table ``philly-jobs.csv`` (Jeon et al., USENIX ATC 2019,
as derived in the Sia SOSP 2023 artifacts, CC BY 4.0) and the heterogeneity matrix
``gpu-relative-throughput.csv`` (single-GPU throughput relative to a V100, from the Sia/Pollux
artifacts). The trace ships with the simulator (``autodl_sim/data/``), the matrix with autodl (``include/data/``); sources and licences in each folder's README.
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

DATA_DIR = Path(__file__).resolve().parent / "data"
"""The simulator's own data (``autodl_sim/data``): the Philly trace, the estimator's measured errors and the
simulated pool, with their sources in its README."""

DEFAULT_TRACE = DATA_DIR / "philly-jobs.csv"
DEFAULT_THROUGHPUT = include_dir() / "data" / "gpu-relative-throughput.csv"
"""The measured throughput ratios ship with autodl (the step-time model reads them too)."""

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


DEFAULT_ERRORS = DATA_DIR / "estimate-errors.csv"
"""The memory estimator's measured errors (estimate / measured peak per script), with their source."""

RUNTIME_SIGMA = 1.0
"""Spread of the expected runtime the queue sees: expected = true duration x exp(N(0, RUNTIME_SIGMA)),
i.e. off by a factor e (2.7x) at one standard deviation. An assumption standing for "from recorded
durations of earlier runs, or FLOPs / device throughput x steps": no trace ships both a prediction and
the outcome. ``benchmarks/scheduling.py`` reports the queue's sensitivity to it (0 = exact, 2 = 7.4x)."""


@dataclass(frozen=True, slots=True)
class ErrorSample:
    """One measured memory estimate: ``ratio`` = estimate / measured peak; ``phase`` = where the
    measured peak was reached (``step``: the first training steps; ``eval``: an evaluation pass)."""

    name: str
    ratio: float
    phase: str
    source: str


@dataclass(slots=True)
class SimJob:
    """One job of the replay. Times in seconds from the slice's first submit; memory in bytes.

    What happens: ``duration_s``, ``peak_bytes``, ``peak_phase``. What the policy sees: ``est_bytes``
    and ``est_duration_s`` (and, in the engine, the assumed speeds).

    :ivar duration_s: true runtime on a V100 (the trace's duration).
    :ivar peak_bytes: the true per-device peak.
    :ivar est_bytes: the estimate the policy sees (true x a measured error ratio); after an OOM, at
        least the memory of the device it failed on (Paddle's OOM message reports it).
    :ivar est_duration_s: the expected runtime on a V100 the queue sees, or None when unknown.
    :ivar peak_phase: ``step`` (peak in the first steps) or ``eval`` (at the first evaluation).
    :ivar owner: the trace's virtual cluster (the quota key), or None.
    """

    job_id: int
    submit_s: float
    duration_s: float
    num_gpus: int
    model_class: str
    peak_bytes: int
    est_bytes: int
    est_duration_s: float | None = None
    peak_phase: str = "step"
    owner: str | None = None


def assumed_speeds(models: list[str], catalog: Catalog) -> dict[str, float]:
    """What the catalog says of each device model's speed, the same for every job: the roofline bound
    ``min(FP32 TFLOPS ratio, bandwidth ratio)`` against :data:`ROOFLINE_REFERENCE` (V100 = 1.0).

    This is what a policy sees in the simulator; what happens is :func:`speed_table` (measured per
    model class where the matrix has the device).
    """
    ref = catalog.get(ROOFLINE_REFERENCE)
    out = {}
    for name in models:
        gpu = catalog.get(name)
        out[name] = min(gpu.peak_tflops("fp32") / ref.peak_tflops("fp32"), gpu.memory_bandwidth_gbps / ref.memory_bandwidth_gbps)
    return out


def perturb_speeds(speeds: dict[str, float], sigma: float, seed: int) -> dict[str, float]:
    """``speeds`` each multiplied by exp(N(0, sigma)), drawn per device model in sorted name order from
    ``random.Random(seed)``: a catalog whose figures are wrong (0 = unchanged)."""
    if not sigma:
        return dict(speeds)
    rng = random.Random(f"catalog-error-{seed}")
    return {m: speeds[m] * math.exp(rng.gauss(0.0, sigma)) for m in sorted(speeds)}


def load_errors(path: str | Path | None = None) -> list[ErrorSample]:
    """Read the memory estimator's measured errors.

    :param path: CSV with ``name,measured_bytes,estimated_bytes,phase,source``; default
        ``autodl_sim/data/estimate-errors.csv``.
    :returns: one sample per row with a measured and an estimated peak (rows with an empty estimate:
        refused by the estimator, are kept as ratio ``inf``: the run is refused as fitting nowhere).
    :raises AutoDLError: when the file is missing, empty or a row is malformed (naming the line).
    """
    p = Path(path or DEFAULT_ERRORS)
    if not os.path.isfile(p):
        raise AutoDLError(f"{p}: estimate error table not found; pass --errors or set AUTODL_INCLUDE to a folder with data/.")
    _, text = read_text(p, AutoDLError, "estimate error CSV", max_bytes=MAX_CSV_BYTES)
    out = []
    rows = (line for line in io.StringIO(text) if not line.lstrip().startswith("#"))
    try:
        for line, r in enumerate(csv.DictReader(rows), start=2):
            try:
                measured = float(r["measured_bytes"])
                est = (r["estimated_bytes"] or "").strip()
                ratio = float(est) / measured if est else math.inf
                phase = (r.get("phase") or "step").strip()
                if not measured > 0 or not ratio > 0 or math.isnan(ratio) or phase not in ("step", "eval"):
                    raise ValueError("measured and estimated bytes must be > 0, phase step or eval")
            except (KeyError, ValueError, TypeError, AttributeError, OverflowError, ZeroDivisionError) as exc:
                raise AutoDLError(f"{p}: row {line}: {exc}; expected name,measured_bytes,estimated_bytes,phase,source.") from None
            out.append(ErrorSample(r["name"], ratio, phase, (r.get("source") or "").strip()))
    except csv.Error as exc:
        raise AutoDLError(f"{p}: not a CSV table ({exc}).") from None
    if not out:
        raise AutoDLError(f"{p}: no rows; the simulator draws estimate errors from them.")
    return out


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
    path: str | Path | None = None, *, start: int = 0, jobs: int | None = None, seed: int = 0,
    error: float | None = None, errors: str | Path | list[ErrorSample] | None = None,
    runtime_sigma: float = RUNTIME_SIGMA, load: float = 1.0,
) -> list[SimJob]:
    """Read the Philly job table, sort by submit time, take a contiguous slice and attach classes, memory and estimates.

    Draws (batch scale, memory estimate error, runtime estimate error) come from one
    ``random.Random(seed)`` over the whole sorted trace, so a job's draws do not depend on the slice.

    :param path: CSV with ``timestamp,duration,num_gpus,gpu_time``; default ``autodl_sim/data/philly-jobs.csv``.
    :param start: index of the first job of the slice (after sorting).
    :param jobs: number of jobs (``None`` = to the end).
    :param seed: seed of the draws.
    :param error: when given, a uniform memory estimate error: estimate = true x (1 + U(-error, +error));
        default None: the measured error distribution (``errors``).
    :param errors: the measured error table (path or samples); default ``autodl_sim/data/estimate-errors.csv``.
        Each job's estimate is its true peak x the ratio of one sample drawn uniformly (a bootstrap).
    :param runtime_sigma: see :data:`RUNTIME_SIGMA`; ``math.inf`` = runtimes unknown to the queue.
    :param load: arrival-rate multiplier: submit times are divided by it (2 = twice as many jobs per hour).
    :returns: the slice, submit times relative to its first job.
    :raises AutoDLError: when a file is missing or a row is malformed (naming the line), or for a bad slice.
    """
    p = Path(path or DEFAULT_TRACE)
    if not os.path.isfile(p):
        raise AutoDLError(f"{p}: job trace not found; pass --trace or set AUTODL_INCLUDE to a folder with data/.")
    if not load > 0:
        raise AutoDLError(f"load {load}: must be > 0 (1 = the trace's own arrival rate).")
    rows = _trace_rows(p)
    samples: list[ErrorSample] = []  # drawn from when no uniform error is given
    if error is None:
        samples = errors if isinstance(errors, list) else load_errors(errors)
    rng = random.Random(seed)
    lo, hi = math.log(BATCH_SCALE[0]), math.log(BATCH_SCALE[1])
    end = len(rows) if jobs is None else min(len(rows), start + jobs)
    if start < 0 or start >= len(rows):
        raise AutoDLError(f"--start {start} is outside the trace ({len(rows)} jobs); use 0..{len(rows) - 1}.")
    t0 = rows[start][0]
    out = []
    for i, (ts, dur, n, gpu_s, owner) in enumerate(rows):
        scale = math.exp(rng.uniform(lo, hi))
        if error is not None:
            ratio, phase = 1.0 + rng.uniform(-error, error), "step"
        else:
            smp = samples[rng.randrange(len(samples))]
            ratio, phase = smp.ratio, smp.phase
        noise = rng.gauss(0.0, 1.0)
        if i < start or i >= end:
            continue
        hours = gpu_s / 3600.0
        cls = next(c for bound, c in CLASS_BY_GPU_HOURS if hours < bound)
        peak = int(BASE_PEAK_BYTES[cls] * scale)
        duration = max(1.0, dur)
        est_dur = None if math.isinf(runtime_sigma) else duration * math.exp(runtime_sigma * noise)
        est = peak * ratio
        out.append(SimJob(i, (ts - t0) / load, duration, max(1, n), cls, peak,
                          int(est) if math.isfinite(est) and est < 2**62 else 2**62, est_dur, phase, owner))
    return out


_ROWS_CACHE: dict[tuple[str, float], list[tuple[float, float, int, float, str | None]]] = {}


def _trace_rows(p: Path) -> list[tuple[float, float, int, float, str | None]]:
    """The trace's rows sorted by submit time (cached per file and modification time)."""
    key = (str(p.resolve()), p.stat().st_mtime)
    hit = _ROWS_CACHE.get(key)
    if hit is not None:
        return hit
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
            rows.append((*row, r.get("cluster") or None))
        except (KeyError, ValueError, TypeError, OverflowError) as exc:
            raise AutoDLError(f"{p}:{line}: bad row ({exc}); expected timestamp,duration,num_gpus,gpu_time.") from None
    rows.sort(key=lambda r: r[0])
    _ROWS_CACHE.clear()
    _ROWS_CACHE[key] = rows
    return rows
