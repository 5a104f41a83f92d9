"""Step-time estimate of a profiled run on a catalog device model: compute time plus memory-traffic time.

Details: docs/reference/estimator.md#autodlprofileruntime.
"""

from __future__ import annotations

from autodl.catalog import GPUModel
from autodl.errors import CatalogError
from autodl.types import ResourceProfile

COMPUTE_EFFICIENCY = 0.7
"""Fraction of dense peak TFLOPS the compute-bound kernels reach (fitted; see the module docstring)."""

ACTIVATION_TRAFFIC = 150.0
"""Bytes moved through device memory per step per byte of activations kept for backward (fitted; see
the module docstring). It lumps every re-read and re-write of a step: forward writes, backward reads of
inputs and outputs, gradient writes, cuDNN workspaces, normalisation passes."""

DEFAULT_EFFICIENCY = COMPUTE_EFFICIENCY  # kept for callers that pass ``efficiency=`` explicitly


def estimate_step_time_s(profile: ResourceProfile, gpu: GPUModel, *, efficiency: float | None = None) -> float | None:
    """Seconds per training step on one ``gpu`` (see the module docstring for the form and its fit);
    None when the profile's FLOPs are unknown (``flops_per_step`` null: the model was not found).

    :param profile: the run's profile (FLOPs per step, memory breakdown, AMP).
    :param gpu: the device model (TFLOPS at the run's precision, memory bandwidth in GB/s).
    :param efficiency: fraction of peak TFLOPS reached; default :data:`COMPUTE_EFFICIENCY`. Records
        may calibrate it per device model.
    :raises CatalogError: when the device model has no TFLOPS figure at all.
    """
    if profile.flops_per_step is None:
        return None
    eff = efficiency or COMPUTE_EFFICIENCY
    precision = "fp16" if profile.amp else "fp32"
    compute = profile.flops_per_step / (gpu.peak_tflops(precision) * 1e12 * eff)
    b = profile.breakdown
    moved = 3 * (b.weights_bytes + b.gradients_bytes) + 2 * b.optimizer_state_bytes + ACTIVATION_TRAFFIC * b.activations_bytes
    memory = moved / (gpu.memory_bandwidth_gbps * 1e9)
    return compute + memory


FLOPS_COUNT_SLACK = 2.0
"""How far above the truth the profile's FLOPs per step are allowed to lie before :func:`fastest_step_s` would
call a real step impossible: a safety factor, not a fit (a static count that takes a fused or skipped op for a
full one over-counts; twice the count is well beyond what the estimator cases under ``tests/cases/estimator``
show)."""


def fastest_step_s(profile: ResourceProfile, gpu: GPUModel) -> float | None:
    """The fewest seconds one training step of ``profile`` can take on one ``gpu``: its FLOPs at the device's
    dense fp16 peak (the fastest precision it publishes), divided by :data:`FLOPS_COUNT_SLACK`. A step time
    below it is not a measurement (issue 23: forged step lines claimed 0.001 s per step).

    :returns: seconds, or None when the FLOPs or the device's TFLOPS are unknown.
    """
    if not profile.flops_per_step:
        return None
    try:
        peak = max(gpu.peak_tflops("fp16"), gpu.peak_tflops("fp32"))
    except CatalogError:
        return None
    return profile.flops_per_step / (peak * 1e12) / FLOPS_COUNT_SLACK
