"""The peak-memory formula: model states + activations + workspace, per device, with the source of each term.

Details: docs/reference/estimator.md#autodlprofilememory.
"""

from __future__ import annotations

from autodl.profile.facts import OPTIMIZER_STATE_SLOTS
from autodl.types import MemoryBreakdown

MIB = 1 << 20

DTYPE_BYTES = {
    "float32": 4, "float16": 2, "bfloat16": 2, "float64": 8,
    "int64": 8, "int32": 4, "int8": 1, "uint8": 1, "bool": 1,
}
"""Element sizes in bytes (IEEE 754 / C integer widths)."""

CUDA_CONTEXT_BYTES = 512 * MIB
"""CUDA context + Paddle's kernel images per process. Assumption: NVML shows 300-600 MiB for an idle
framework process on V100/A100 (lazy module loading, CUDA >= 11.7, cuts it; NVIDIA CUDA C++ Programming
Guide, "Lazy Loading"); 512 MiB is the planning figure until records calibrate it."""

CUDNN_WORKSPACE_BYTES = 512 * MIB
"""Upper bound of the cuDNN convolution workspace Paddle will request: ``FLAGS_conv_workspace_size_limit``
defaults to 512 (MB) (``paddle/phi/core/flags.cc``). Only for models with convolutions."""

CUBLAS_WORKSPACE_BYTES = 32 * MIB
"""cuBLAS workspace per handle: 32 MiB on Hopper, 4 MiB before (cuBLAS documentation,
``cublasSetWorkspace``); the larger figure is used for every device model."""

ALLOCATOR_SLACK = 0.05
"""Fraction of the batch-independent tensor bytes (model states, fixed transients) lost to rounding and
fragmentation in Paddle's ``auto_growth`` GPU allocator (``FLAGS_allocator_strategy``; 256-byte
alignment, chunk splitting). Assumption to be calibrated from run records (estimated vs NVML peak).
Slack on activations is left to the planning threshold (``resource_policy.memory_threshold``, 0.85),
so that the batch rescale of :meth:`ResourceProfile.max_batch_size` stays linear."""

AMP_ACTIVATION_FACTOR = {None: 1.0, "O1": 0.6, "O2": 0.5}
"""Activation bytes under AMP relative to fp32. O2 stores activations in fp16 (factor 0.5); O1 casts only
the white-list ops (matmul, conv) to fp16 and keeps black-list ops (softmax, norms, losses) in fp32 plus
cast copies (``paddle/amp/amp_lists.py``), assumed 0.6. Not validated on CPU (AMP needs a GPU)."""

RECOMPUTE_FACTOR = 0.35
"""Activations kept under full-layer recompute relative to none: only segment boundaries survive
(Chen et al. 2016, "Training Deep Nets with Sublinear Memory Cost", O(sqrt(n)) segments); assumption."""

TRAINING_FLOPS_FACTOR = 3.0
"""Training FLOPs = 3 x forward FLOPs: backward costs twice the forward for matmul/conv (gradients w.r.t.
inputs and weights), Kaplan et al. 2020, "Scaling Laws for Neural Language Models", sec. 2.1 (C = 6N
per token vs 2N forward)."""


def model_states(params: int, trainable: int, optimizer: str | None, amp: str | None) -> tuple[int, int, int]:
    """(weights, gradients, optimizer state) bytes.

    :param params: all registered parameter elements (trainable + buffers such as BN statistics).
    :param trainable: trainable elements.
    :param optimizer: ``paddle.optimizer`` class name; None is treated as Adam (the common default,
        and the costliest of the usual choices).
    :param amp: None, 'O1' or 'O2'.
    """
    slots = OPTIMIZER_STATE_SLOTS.get(optimizer or "Adam", 2)
    frozen = params - trainable
    if amp == "O2":
        weights = 2 * trainable + 4 * frozen
        grads = 2 * trainable
        opt = 4 * trainable * slots + 4 * trainable  # moments + fp32 master weights
    else:
        weights = 4 * params
        grads = 4 * trainable
        opt = 4 * trainable * slots
    return weights, grads, opt


def gpu_terms(fixed_tensor_bytes: int, has_conv: bool) -> dict[str, int]:
    """GPU-only workspace terms in bytes (see the module constants for their sources).

    :param fixed_tensor_bytes: batch-independent tensor bytes (model states + fixed transients).
    """
    terms = {
        "cuda_context": CUDA_CONTEXT_BYTES,
        "cublas_workspace": CUBLAS_WORKSPACE_BYTES,
        "allocator_slack": int(ALLOCATOR_SLACK * fixed_tensor_bytes),
    }
    if has_conv:
        terms["cudnn_workspace"] = CUDNN_WORKSPACE_BYTES
    return terms


GPU_ONLY_TERMS = ("cuda_context", "cublas_workspace", "allocator_slack", "cudnn_workspace")


def breakdown(
    params: int,
    trainable: int,
    optimizer: str | None,
    amp: str | None,
    activations: int,
    fixed_transient: int,
    has_conv: bool,
) -> tuple[MemoryBreakdown, dict[str, int], int]:
    """Assemble the per-device breakdown.

    :param activations: batch-proportional activation bytes at the run's batch size (fp32).
    :param fixed_transient: batch-independent transient bytes of backward (parameter-gradient buffers
        before accumulation, kernel scratch), measured or simulated.
    :returns: (breakdown, workspace terms, tensor peak bytes), all in bytes.
    """
    w, g, o = model_states(params, trainable, optimizer, amp)
    act = int(activations * AMP_ACTIVATION_FACTOR.get(amp, 1.0))
    tensor_peak = w + g + o + act + max(0, fixed_transient)
    terms = {"backward_transient": max(0, int(fixed_transient))}
    terms.update(gpu_terms(w + g + o + max(0, fixed_transient), has_conv))
    b = MemoryBreakdown(weights_bytes=w, gradients_bytes=g, optimizer_state_bytes=o, activations_bytes=act,
                        workspace_bytes=sum(terms.values()))
    return b, terms, tensor_peak
