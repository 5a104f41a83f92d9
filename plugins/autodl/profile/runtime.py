"""Step-time estimate of a profiled run on a catalog device model: a roofline over FLOPs and bytes moved."""

from __future__ import annotations

from autodl.catalog import GPUModel
from autodl.types import ResourceProfile

DEFAULT_EFFICIENCY = 0.35
"""Fraction of peak TFLOPS a training step reaches; 0.3-0.5 is typical for CNN/Transformer training
in fp32/AMP (MLPerf Training v3.0 results on A100 reach ~0.4-0.5 of dense peak for BERT). Records
calibrate it per device model."""


def estimate_step_time_s(profile: ResourceProfile, gpu: GPUModel, *, efficiency: float | None = None) -> float:
    """Seconds per training step on one ``gpu``: max(compute time, memory time).

    compute = flops_per_step / (peak TFLOPS at the run's precision x 1e12 x efficiency);
    memory  = (weights + gradients + optimizer state + 2 x activations) bytes / bandwidth.

    :param profile: the run's profile (FLOPs per step, breakdown, AMP).
    :param gpu: the device model (TFLOPS, GB/s).
    :param efficiency: fraction of peak reached; default :data:`DEFAULT_EFFICIENCY`.
    """
    eff = efficiency or DEFAULT_EFFICIENCY
    precision = "fp16" if profile.amp else "fp32"
    compute = profile.flops_per_step / (gpu.peak_tflops(precision) * 1e12 * eff)
    b = profile.breakdown
    moved = b.weights_bytes + b.gradients_bytes + b.optimizer_state_bytes + 2 * b.activations_bytes
    memory = moved / (gpu.memory_bandwidth_gbps * 1e9)
    return max(compute, memory)
