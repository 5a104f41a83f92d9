"""The profile step: read a PaddlePaddle training script and estimate what one run needs per device.

``profile_script`` parses the script (never imports or runs it in this process), builds the model
symbolically, traces ``forward()`` and replays a training step's memory (static estimate); when Paddle
is importable it also runs the model alone in a sandboxed subprocess at small batch sizes (probe) and
extrapolates. The result is a :class:`~autodl.types.ResourceProfile`.
"""

from __future__ import annotations

import ast
import importlib.util
import math
from pathlib import Path

from autodl.catalog import Catalog, load_catalog
from autodl.errors import ProfileError
from autodl.profile import memory as E
from autodl.profile import layers as L
from autodl.profile.advice import advice
from autodl.profile.analysis import ScriptFacts, scan
from autodl.profile.runtime import estimate_step_time_s
from autodl.profile.static import StaticEstimate, estimate, layer_line
from autodl.spec import DEFAULT_MEMORY_THRESHOLD, TaskSpec
from autodl.types import Finding, ResourceProfile

__all__ = ["profile_script", "advice", "estimate_step_time_s", "paddle_available"]

BATCH_SIZE_ENV = "AUTODL_BATCH_SIZE_PER_GPU"
"""Where the launchers pass the spec's per-device batch (see :data:`autodl.pipeline.BATCH_SIZE_ENV`)."""

DEFAULT_BATCH_SIZE = 32
"""Batch size assumed when neither the spec nor the script gives one (a warning finding says so)."""

DEFAULT_DISTRIBUTED_GPUS = 2
"""Devices assumed for a data-parallel/fleet script when the spec says ``num_gpus_estimate: auto`` and the
script does not fix ``nprocs``: the smallest data-parallel group. Per-card memory does not depend on it."""

INT64_MAX = (1 << 63) - 1
"""Paddle's tensor sizes and autodl's store columns are signed 64-bit: a need past this is an error, not a number."""

COLD_START_FACTOR = 1.5
"""Cold-start activations = batch x seq_len x hidden x 4 bytes x 1.5 (issue 2's fallback formula: one fp32
hidden state per token, 1.5x for the tensors kept around it)."""


def paddle_available() -> bool:
    """True when ``paddle`` is importable (checked without importing it)."""
    return importlib.util.find_spec("paddle") is not None


def _read(script: Path) -> tuple[str, ast.Module | None]:
    # bounded, UTF-8, no symlink loops, and compiled as Python would (``return`` at module level is an error)
    from autodl.inputs import read_script

    _, source, tree = read_script(script, ProfileError)
    return source, tree


def _bound_script_values(facts: ScriptFacts) -> None:
    """Drop sizes read from the script that no run can have (a batch of 10**400), with a warning saying so: the
    same bounds as the spec's (:mod:`autodl.fields`), so nothing downstream overflows or is planned from them."""
    from autodl.fields import (MAX_BATCH_PER_DEVICE, MAX_DEVICES_PER_RUN, MAX_INPUT_DIM, MAX_INPUT_ELEMENTS,
                               MAX_INPUT_RANK, MAX_SEQUENCE_LENGTH)

    def fits(value, limit) -> bool:
        return type(value) is int and 0 < value <= limit

    dropped = []
    for name, limit, what in (("batch_size", MAX_BATCH_PER_DEVICE, "batch size"),
                              ("sequence_length", MAX_SEQUENCE_LENGTH, "sequence length"),
                              ("distributed_nprocs", MAX_DEVICES_PER_RUN, "process count")):
        value = getattr(facts, name)
        if value is not None and not fits(value, limit):
            dropped.append(f"{what} {str(value)[:40]}")
            setattr(facts, name, None)
    shape = facts.input_shape
    if shape is not None and not (len(shape) <= MAX_INPUT_RANK and all(fits(d, MAX_INPUT_DIM) for d in shape)
                                  and math.prod(shape) <= MAX_INPUT_ELEMENTS):
        dropped.append(f"input shape {str(shape)[:60]}")
        facts.input_shape = None
    if dropped:
        facts.findings.append(Finding(severity="warning", code="implausible-size",
                                      message=f"ignored what the script says about the {', '.join(dropped)}: no run can "
                                              "have it; set the real value in the spec (task.*)."))


def _max_batches(profile: ResourceProfile, catalog: Catalog, threshold: float) -> dict[str, int]:
    return {name: profile.max_batch_size(m.memory_bytes, threshold) for name, m in catalog.models.items()}


def profile_script(
    script: str | Path,
    spec: TaskSpec | None = None,
    *,
    catalog: Catalog | None = None,
    probe: bool | None = None,
    threshold: float | None = None,
) -> ResourceProfile:
    """Estimate the per-device training peak memory, FLOPs and risks of a PaddlePaddle script.

    :param script: the training script (``.py``).
    :param spec: the task spec; its ``task.batch_size_per_gpu``, ``sequence_length``, ``input_shape``,
        ``num_gpus_estimate`` and ``resource_policy.distributed_strategy`` override what the script says.
    :param catalog: GPU catalog for ``max_batch_size_by_device``; default :func:`load_catalog`.
    :param probe: run the sandboxed probe; None means on when Paddle is importable.
    :param threshold: fraction of device memory a run may plan to use; default the spec's
        ``resource_policy.memory_threshold``, else 0.85.
    :returns: the profile; ``peak_memory_bytes`` in bytes per device, ``flops_per_step`` training FLOPs of
        one step on one device. Shape errors are ``error`` findings, not exceptions.
    :raises ProfileError: when the script is missing, unreadable or not valid Python (file and line named).
    """
    path = Path(script)
    source, tree = _read(path)
    task = spec.task if spec else None
    policy = spec.resource_policy if spec else None
    threshold = threshold if threshold is not None else (policy.memory_threshold if policy else DEFAULT_MEMORY_THRESHOLD)
    catalog = catalog or load_catalog()

    try:
        facts: ScriptFacts = scan(tree, source) if tree is not None else None
    except RecursionError:
        facts = None
    if facts is None:  # valid Python nested deeper than the analysis follows: the tool's limit, not an error
        from autodl.profile.interp import Interp

        facts = ScriptFacts(interp=Interp(ast.Module(body=[], type_ignores=[])))
        facts.build_error = "the script nests expressions deeper than the static analysis follows"
        facts.findings.append(Finding(severity="warning", code="analysis-too-deep",
                                      message="the script nests expressions deeper than the static analysis follows; "
                                              "nothing was read from it (model, batch size). Set task.input_shape and "
                                              "batch_size_per_gpu in the spec or let the probe run."))
    _bound_script_values(facts)
    findings: list[Finding] = list(facts.findings)

    batch = (task.batch_size_per_gpu if task and task.batch_size_per_gpu else None) or facts.batch_size
    if (task and task.batch_size_per_gpu and facts.batch_size and facts.batch_size != task.batch_size_per_gpu
            and BATCH_SIZE_ENV not in source):
        findings.append(Finding(
            severity="warning", code="spec-batch-not-used",
            message=f"the spec's task.batch_size_per_gpu={task.batch_size_per_gpu} is what this estimate is for, but "
                    f"the script uses batch {facts.batch_size} and never reads {BATCH_SIZE_ENV}; make the script read "
                    f"it (as include/scripts/simple_cnn.py does) or set the spec to {facts.batch_size}."))
    if not batch:
        batch = DEFAULT_BATCH_SIZE
        findings.append(Finding(severity="warning", code="assumed-batch-size",
                                message=f"no batch size found in the script (DataLoader(batch_size=...), BATCH_SIZE, "
                                        f"--batch-size) or the spec; assumed {DEFAULT_BATCH_SIZE}. Set "
                                        "task.batch_size_per_gpu in the spec."))
    seq_len = (task.sequence_length if task and task.sequence_length else None) or facts.sequence_length
    input_shape = (list(task.input_shape) if task and task.input_shape else None) or facts.input_shape
    if input_shape and facts.input_dtype == "int64" and task and task.sequence_length:
        input_shape = [task.sequence_length]

    distributed = facts.distributed
    if policy and policy.distributed_strategy != "none":
        distributed = policy.distributed_strategy
    if task and isinstance(task.num_gpus_estimate, int):
        num_gpus = task.num_gpus_estimate
    elif distributed:
        num_gpus = facts.distributed_nprocs or DEFAULT_DISTRIBUTED_GPUS
        if not facts.distributed_nprocs:
            findings.append(Finding(severity="info", code="assumed-num-gpus",
                                    message=f"distributed markers ({distributed}) and num_gpus_estimate: auto: planning "
                                            f"{DEFAULT_DISTRIBUTED_GPUS} devices with batch {batch} each; set "
                                            "task.num_gpus_estimate to change it."))
    else:
        num_gpus = 1

    # ------------------------------------------------------------------------ static estimate
    st = StaticEstimate()
    try:
        st = estimate(facts, batch, input_shape, seq_len)
    except OverflowError as exc:  # a size past what floats hold: the analysis' limit, said, and the work goes on
        st.why_not = f"a size in the model is too large to follow ({exc})"
    except L.ShapeMismatch as exc:
        st.why_not = "a shape error stops the forward trace"
        msg = str(exc)
        line = None
        for token in msg.split("'"):
            line = line or layer_line(facts.model, token)
        findings.append(Finding(severity="error", code="shape-mismatch", line=line or facts.model_line,
                                message=(f"line {line}: " if line else "") + msg + "."))
        from autodl.profile.analysis import count_params
        try:
            t, nt = count_params(facts.model)
            st.params, st.trainable = t + nt, t
        except Exception:
            pass
    findings.extend(st.findings)
    if facts.input_shape and not input_shape:
        input_shape = facts.input_shape
    if st.unknown_calls and st.traced:
        names = ", ".join(sorted(st.unknown_calls)[:6])
        findings.append(Finding(severity="info", code="unknown-calls",
                                message=f"calls the estimator does not model ({names}) were taken as shape-preserving."))

    method = "static"
    params, trainable = st.params, st.trainable
    act_per_sample = st.act_bytes_per_sample
    fixed = st.fixed_transient_bytes
    flops_fwd = st.forward_flops_per_sample
    if not st.traced:
        method = "cold_start"
        hidden = st.hidden or 768
        t = seq_len or (math.prod(input_shape) if input_shape else 512)
        act_per_sample = int(t * hidden * 4 * COLD_START_FACTOR)
        if params is None:
            params = trainable = 0
        flops_fwd = 2.0 * (params or 0) * (seq_len or 1)
        findings.append(Finding(
            severity="warning", code="cold-start",
            message=f"static analysis could not pin the model down ({st.why_not}); activations use the cold-start "
                    f"formula batch x seq_len({t}) x hidden({hidden}) x 4 B x {COLD_START_FACTOR}"
                    + ("" if params else " and parameters are unknown")
                    + ". Set task.input_shape/sequence_length in the spec or let the probe run."))

    # --------------------------------------------------------------------------------- probe
    estimates: dict[str, int] = {}
    w, g, o = E.model_states(params or 0, trainable or 0, facts.optimizer, None)
    if method != "cold_start" or params:
        estimates[method] = int(w + g + o + act_per_sample * batch + fixed)
    if probe is None and task is not None:
        probe = task.probe  # the spec's task.probe, unless the caller (CLI flag, operator) decided
    do_probe = paddle_available() if probe is None else probe
    probe_seconds = None
    probe_batches = None
    if do_probe and not any(f.severity == "error" for f in findings):
        from autodl.profile.probe import run_probe

        pr = run_probe(path, facts, batch=batch, input_shape=input_shape, seq_len=seq_len,
                       act_bytes_per_sample_hint=st.act_bytes_per_sample if st.traced else None,
                       flops_per_sample_hint=st.forward_flops_per_sample if st.traced else None)
        probe_seconds = pr.seconds
        findings.extend(pr.findings)
        if pr.ok:
            method = "probe"
            params, trainable = pr.params, pr.trainable
            act_per_sample, fixed = pr.act_bytes_per_sample, pr.fixed_transient_bytes
            probe_batches = pr.batch_sizes
            estimates["probe"] = int(pr.tensor_peak_bytes)
            if not st.traced and pr.forward_flops_per_sample:
                flops_fwd = pr.forward_flops_per_sample
    if facts.optimizer is None:
        findings.append(Finding(severity="info", code="assumed-optimizer",
                                message="no paddle.optimizer construction found; optimizer state sized as Adam (2 fp32 "
                                        "moments per parameter)."))
    amp = facts.amp
    act_total = int(act_per_sample or 0) * batch
    if facts.recompute:
        act_total = int(act_total * E.RECOMPUTE_FACTOR)
        act_per_sample = int((act_per_sample or 0) * E.RECOMPUTE_FACTOR)
    bd, terms, tensor_peak = E.breakdown(params or 0, trainable or 0, facts.optimizer, amp, act_total, fixed, st.has_conv)
    per_sample_scaled = int((act_per_sample or 0) * E.AMP_ACTIVATION_FACTOR.get(amp, 1.0))
    if bd.total_bytes > INT64_MAX or (params or 0) > INT64_MAX:
        findings.append(Finding(severity="error", code="beyond-int64",
                                message=f"this run needs {bd.total_bytes:.3g} bytes per device for {params or 0:.3g} "
                                        "parameters: more than Paddle's int64 sizes (and any device) can address; "
                                        "lower the batch or the model size."))
    prof = ResourceProfile(
        script=str(path.resolve()),
        model_name=(task.model_name if task and task.model_name else None) or facts.model_name,
        params=int(params or 0),
        trainable_params=int(trainable or 0),
        peak_memory_bytes=bd.total_bytes,
        breakdown=bd,
        activation_bytes_per_sample=per_sample_scaled,
        flops_per_step=float(E.TRAINING_FLOPS_FACTOR * (flops_fwd or 0.0) * batch),
        batch_size=int(batch),
        sequence_length=seq_len,
        input_shape=list(input_shape) if input_shape else None,
        num_gpus=int(num_gpus),
        optimizer=facts.optimizer,
        amp=amp,
        dtype="float16" if amp == "O2" else "float32",
        recompute=facts.recompute,
        distributed=distributed,
        num_workers=facts.num_workers,
        method=method,
        probe_seconds=probe_seconds,
        findings=findings,
        tensor_peak_bytes=int(tensor_peak),
        workspace_terms_bytes=terms,
        estimates_bytes=estimates,
        probe_batch_sizes=probe_batches,
    )
    return prof.model_copy(update={"max_batch_size_by_device": _max_batches(prof, catalog, threshold)})
