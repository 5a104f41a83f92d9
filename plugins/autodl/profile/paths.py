"""The profile's estimate paths: the dry run, the model-only probe, the conservative bound, each giving an
:class:`Estimate`, and :func:`choose`, the precedence between them (dry run > probe > conservative bound)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from autodl.profile.dryrun import FIXED_BATCH_TEXT, SIZE_ADVICE
from autodl.profile.facts import ScriptFacts
from autodl.spec import TaskSpec
from autodl.types import Finding, PhasePeak, Severity

if TYPE_CHECKING:
    from autodl.profile.dryrun import DryRun

BATCH_SIZE_ENV = "AUTODL_BATCH_SIZE_PER_GPU"
"""Where the launchers pass the spec's per-device batch (set by :func:`autodl.steps.launch.build_request`)."""

DEFAULT_BATCH_SIZE = 32
"""Batch size assumed when neither the spec nor the script gives one (a warning finding says so)."""

COLD_START_FACTOR = 1.5
"""Cold-start activations = batch x seq_len x hidden x 4 bytes x 1.5 (issue 2's fallback formula: one fp32
hidden state per token, 1.5x for the tensors kept around it)."""

PROBE_KEEPS = ("assumed-batch-size", "assumed-input")
"""The bound path's assumptions that still hold when the probe measured the model (it ran at that batch)."""


@dataclass
class Estimate:
    """What one path measured or assumed: sizes in bytes, FLOPs per sample, ``method`` its name.

    :ivar figure_bytes: the path's own tensor-peak figure (``ResourceProfile.estimates_bytes[method]``); None
        when it has none (a cold start with no parameter count).
    :ivar measured_peak: a peak an allocator read (dry run, probe), bytes; None for the conservative bound.
    """

    method: str
    params: int | None = None
    trainable: int | None = None
    act_per_sample: int | None = None
    fixed: int | None = None
    flops_fwd: float | None = None
    step_flops: float | None = None
    pair_flops_share: float = 0.0  # of the FLOPs, products of two activations (grow with the tokens squared)
    measured_peak: int | None = None
    figure_bytes: int | None = None
    batch: int | None = None
    input_shape: list[int] | None = None
    phases: list[PhasePeak] = field(default_factory=list)
    probe_batches: list[int] | None = None


@dataclass
class RunInputs:
    """What the estimate is for: the spec's values over the script's (``batch`` per device, ``seq_len`` tokens)."""

    spec_batch: int | None
    batch: int
    seq_len: int | None
    input_shape: list[int] | None
    assumptions: list[Finding] = field(default_factory=list)


def run_inputs(facts: ScriptFacts, spec: TaskSpec | None) -> RunInputs:
    """The batch, sequence length and input shape the estimate is for, and the assumption made where none is known."""
    task = spec.task if spec else None
    spec_batch = task.batch_size_per_gpu if task and task.batch_size_per_gpu else None
    batch = spec_batch or facts.batch_size
    assumptions: list[Finding] = []
    if not batch:
        batch = DEFAULT_BATCH_SIZE
        assumptions.append(Finding(severity="warning", code="assumed-batch-size",
                                   message=f"no batch size found in the script (DataLoader(batch_size=...), BATCH_SIZE, "
                                           f"--batch-size) or the spec; assumed {DEFAULT_BATCH_SIZE}. Set "
                                           "task.batch_size_per_gpu in the spec."))
    seq_len = (task.sequence_length if task and task.sequence_length else None) or facts.sequence_length
    input_shape = (list(task.input_shape) if task and task.input_shape else None) or facts.input_shape
    if input_shape and facts.input_dtype == "int64" and task and task.sequence_length:
        input_shape = [task.sequence_length]
    return RunInputs(spec_batch=spec_batch, batch=batch, seq_len=seq_len, input_shape=input_shape,
                     assumptions=assumptions)


COLD_START_HIDDEN = 768
"""Hidden size the cold-start formula assumes: BERT-base's and GPT-2 small's (Devlin et al. 2019; Radford et al.
2019), the common size of the models the formula was written for (issue 2)."""


def _cold_start(inputs: RunInputs, est: Estimate) -> Finding:
    """``est`` as the conservative bound (nothing ran or measured the script): parameters unknown (None, never 0), the
    cold-start formula for the activations, and the warning saying what was assumed and how it is placed."""
    t = inputs.seq_len or (math.prod(inputs.input_shape) if inputs.input_shape else 512)
    size = "seq_len" if inputs.seq_len else "input size" if inputs.input_shape else "assumed input size"
    est.method = "cold_start"
    est.act_per_sample = int(t * COLD_START_HIDDEN * 4 * COLD_START_FACTOR)
    # FLOPs from the parameter count; unknown (null) with it, never 0
    est.flops_fwd = 2.0 * est.params * (inputs.seq_len or 1) if est.params else None
    return Finding(
        severity="warning", code="cold-start",
        message="the model's size could not be measured (no dry run or probe measured the script); activations use "
                f"the cold-start formula batch x {size}({t}) x hidden({COLD_START_HIDDEN}) x 4 B x {COLD_START_FACTOR}"
                + ("" if est.params else " and parameters are unknown, so this figure is no bound: placement sizes "
                   "the run as the largest allowed device (autodl.policy.need)")
                + COLD_START_UNTRIED + COLD_START_INPUTS)


COLD_START_UNTRIED = (". To size it, let the dry run measure the script (PaddlePaddle where autodl profiles: the paddle "
                      "extra, without --no-probe; or a docker or kubernetes launcher with the training's image); ")
"""The cold-start warning's advice when nothing ran the script."""

COLD_START_TRIED = (". To size it, mend what stopped the dry run (its finding above says what it met), and profile "
                    "again; ")
"""The advice when the dry run or the probe ran and measured nothing: Paddle is there, the run met something."""

COLD_START_OFF = (". To size it, let the dry run measure the script: this profile turned it off (task.probe: false in "
                  "the spec, or --no-probe, or probe=False); ")
"""The advice when the caller turned the dry run and the probe off (a fresh user with ``task.probe: false`` was told
to install Paddle, which was installed, and to drop a ``--no-probe`` never passed)."""

COLD_START_INPUTS = ("task.input_shape or task.sequence_length set the formula's input size; task.model_name does not "
                     "change the figure, it only names outputs and records.")


@dataclass
class BoundPath:
    """The conservative bound (the estimate when nothing measured): its estimate and the findings that hold only if it
    is chosen."""

    estimate: Estimate
    reason: str
    assumptions: list[Finding]
    cold: Finding


def bound_path(inputs: RunInputs) -> BoundPath:
    """The conservative bound: the model's size unknown (``params`` None: placed as the largest allowed device by
    :mod:`autodl.policy.need`), activations by the cold-start formula; what a dry run or the probe measures wins."""
    est = Estimate(method="cold_start", batch=inputs.batch, input_shape=inputs.input_shape)
    cold = _cold_start(inputs, est)
    return BoundPath(estimate=est, reason="nothing measured the model: the conservative bound",
                     assumptions=list(inputs.assumptions), cold=cold)


def choose(bound: Estimate, dry_run: Estimate | None, probe: Estimate | None) -> Estimate:
    """The precedence: what the dry run measured of the script itself, else the model-only probe, else the
    conservative bound."""
    return dry_run or probe or bound


def kept_findings(chosen: Estimate, bound: BoundPath, tried: bool = False, off: bool = False) -> list[Finding]:
    """The bound path's findings that still hold once ``chosen`` is the estimate: all of them when it is the estimate
    itself, the assumed batch only when the probe measured (it ran at that batch), none after a dry run. ``tried``:
    the dry run or the probe ran and measured nothing, so the cold-start advice is to mend what it met; ``off``: the
    caller turned them off, so the advice is to turn them on."""
    if chosen.method == "dry_run":
        return []
    if chosen.method == "probe":
        return [f for f in bound.assumptions if f.code in PROBE_KEEPS]
    cold = bound.cold
    if tried or off:
        said = COLD_START_TRIED if tried else COLD_START_OFF
        cold = cold.model_copy(update={"message": cold.message.replace(COLD_START_UNTRIED, said)})
    return list(bound.assumptions) + [cold]


def true_batch_reason(f: Finding, source: str) -> Finding:
    """A script that reads :data:`BATCH_SIZE_ENV` does not fix its batch: the dry run kept its steps small itself
    (its time and memory budgets, or tensors it reduced), so the finding says that instead."""
    if f.code != "dry-run-extrapolated" or FIXED_BATCH_TEXT not in f.message or BATCH_SIZE_ENV not in source:
        return f
    return f.model_copy(update={"message": f.message.replace(
        FIXED_BATCH_TEXT, f"the script reads {BATCH_SIZE_ENV}, but the dry run kept its steps small to stay within "
                          "its time and memory budgets")})


_EVAL_MARKERS = ("no_grad", ".eval()", "evaluate(", "eval_data", "eval_loader", "val_loader", "valid_loader",
                 "test_loader", "validate(", "inference_mode")


def has_eval(source: str) -> bool:
    """Whether the script looks like it has an evaluation pass (then the dry run waits for it)."""
    return any(m in source for m in _EVAL_MARKERS)


def probe_inputs(dr) -> list[list[dict]] | None:
    """Candidate input lists for the model-only probe from what the dry run saw before it stopped: the model's own
    inputs (shapes, dtypes, value ranges), else the Dataset's first sample (all fields but the label, then the
    first field alone). Per-sample shapes (batch dimension dropped)."""
    if dr is None:
        return None
    cands: list[list[dict]] = []
    if dr.inputs:
        cands.append([dict(d, shape=d["shape"][1:]) for d in dr.inputs if d.get("shape")])
    for ld in dr.loaders:
        fs = ld.get("first_sample") or []
        if len(fs) >= 2:
            cands.append(fs[:-1])
        if fs:
            cands.append(fs[:1])
    return cands or None


def varying_input_finding(phases: list[PhasePeak]) -> Finding | None:
    """A warning when the training steps the dry run measured had inputs of different shapes (padded or bucketed
    lengths, multi-scale images, graphs of different sizes): the figure is the largest step seen, and a batch later
    in the epoch may be larger (issue 18's fresh scripts: -16% for per-batch padding and multi-scale training)."""
    train = [p for p in phases if p.name == "train"]
    shapes = {tuple(tuple(s) for s in p.input_shapes) for p in train}
    if len(shapes) < 2:
        return None
    top = max(train, key=lambda p: p.peak_bytes)
    return Finding(severity="warning", code="input-size-varies", message=(
        f"the training inputs changed shape between the dry run's steps ({len(shapes)} shapes among the measured "
        f"steps); the largest step seen held {top.peak_bytes / (1 << 20):,.1f} MiB, and batches "
        "later in an epoch may be larger than any seen (the longest sequence, the largest image size or graph): "
        + SIZE_ADVICE + "."))


def phase_findings(findings: list[Finding], phases: list[PhasePeak], batch: int) -> None:
    """Say which phase needs what when there is more than one (issue 8, kind 8), and when the training inputs'
    shape varied between steps (:func:`varying_input_finding`)."""
    if (varies := varying_input_finding(phases)) is not None:
        findings.append(varies)
    if len(phases) < 2:
        return
    mib = 1 << 20
    top = max(phases, key=lambda p: p.peak_bytes)
    train = next((p for p in phases if p.name == "train"), None)
    parts = []
    for p in phases:
        shapes = ", ".join("x".join(str(d) for d in s) or "scalar" for s in p.input_shapes[:2])
        parts.append(f"{p.name} at batch {p.batch_size}" + (f" [{shapes}]" if shapes else "")
                     + f": {p.peak_bytes / mib:,.1f} MiB" + (" (extrapolated)" if p.extrapolated else ""))
    sev: Severity = "info"
    if train is not None and top is not train and top.peak_bytes > 1.1 * train.peak_bytes:
        sev = "warning"
    msg = "tensor peak per phase: " + "; ".join(parts) + "."
    if sev == "warning" and train is not None:
        msg += (f" The {top.name} pass needs {top.peak_bytes / max(1, train.peak_bytes):.1f}x the training step; the "
                "profile's peak is that pass's, so the device must hold it.")
    findings.append(Finding(severity=sev, code="phase-peaks", message=msg))


def venue(choice, spec: TaskSpec | None, engine: dict | None):
    """The dry run's venue for ``choice`` (None: the worker's sandbox)."""
    if choice is None or choice.venue in (None, "worker") or spec is None:
        return None
    from autodl.profile.where import venue_for

    return venue_for(choice.venue, spec.launcher, engine)



@dataclass
class DryRunPath:
    """The dry run's outcome for the profile: its estimate when it measured a step (else None), where it ran."""

    dr: DryRun
    estimate: Estimate | None
    ran_in: str | None
    user_error: bool
    probe_still: bool


def _dry(path: Path, spec: TaskSpec | None, facts: ScriptFacts, source: str, inputs: RunInputs,
         engine: dict | None, where):
    """One dry run of the script as the launcher would run it (:func:`autodl.profile.dryrun.run_dry_run`)."""
    from autodl.profile.dryrun import run_dry_run

    task = spec.task if spec else None
    return run_dry_run(path, argv=list(task.args) if task else [], batch=inputs.spec_batch,
                       script_batch=facts.batch_size, batch_from_spec=bool(inputs.spec_batch),
                       hints={"fallback_batch": inputs.batch},
                       eval_expected=has_eval(source), env=dict(spec.launcher.env) if spec else None,
                       venue=venue(where, spec, engine))


FLOPS_NOT_COUNTED = Finding(severity="info", code="flops-not-counted", message=(
    "the dry run counted no FLOPs in the training step: the model computes with none of what autodl counts (Conv, "
    "Linear and RNN layers, paddle.matmul/bmm/@; not einsum, functional convolutions or custom operators), so "
    "flops_per_step is unknown (null), not 0: no step time is estimated and placement does not score the run's cost."))


def _measured(dr, bound: Estimate, inputs: RunInputs, facts: ScriptFacts, findings: list[Finding]) -> Estimate:
    """The dry run's estimate (it measured a training step), and the findings what it saw makes true or untrue."""
    est = Estimate(method="dry_run", params=dr.params or bound.params,
                   trainable=dr.trainable if dr.trainable is not None else bound.trainable,
                   act_per_sample=dr.act_bytes_per_sample, fixed=bound.fixed,
                   flops_fwd=dr.forward_flops_per_sample or bound.flops_fwd,
                   step_flops=dr.step_flops_per_sample,  # the whole step: every forward call, recompute (issue 18)
                   pair_flops_share=dr.pair_flops_share,
                   measured_peak=dr.tensor_peak_bytes, figure_bytes=int(dr.tensor_peak_bytes),
                   batch=dr.batch or inputs.batch, phases=list(dr.phases),
                   input_shape=list(dr.inputs[0]["shape"][1:]) if dr.inputs else inputs.input_shape)
    _called(dr, facts)
    if not est.flops_fwd and not est.step_flops:
        findings.append(FLOPS_NOT_COUNTED)
    if dr.num_workers is not None or dr.loaders:
        facts.num_workers = dr.num_workers
        findings[:] = [f for f in findings if f.code != "dataloader-workers-unknown"]
        if dr.num_workers and not any(f.code == "dataloader-workers" for f in findings):
            findings.append(Finding(severity="warning", code="dataloader-workers", message=(
                f"the script's DataLoader runs with num_workers={dr.num_workers} (seen in the dry run): worker "
                "processes exchange batches through shared memory; autodl's Docker/Kubernetes launchers give "
                "the run a larger /dev/shm.")))
    elif dr.num_workers is None and any(isinstance(n, str) for n in dr.raw.get("num_workers") or []):
        facts.num_workers = None
    phase_findings(findings, est.phases, est.batch or inputs.batch)
    return est


def _called(dr, facts: ScriptFacts) -> None:
    """What the dry run saw the script call, over what the call-site reading found: the AMP level it ran under and its
    distributed calls (when it made any: a branch the dry run did not take keeps the reading's), and whether the model
    it trained has convolutions (then the device needs cuDNN's workspace)."""
    if dr.amp:
        facts.amp = dr.amp
    if dr.distributed and facts.distributed != "fleet":
        facts.distributed = dr.distributed
    if dr.has_conv is not None:
        facts.has_conv = dr.has_conv


def _script_error(dr, findings: list[Finding]) -> None:
    """The script raised on its own inputs: an error finding (the run would fail the same way)."""
    findings.append(Finding(
        severity="error", code="script-error", line=dr.error_line,
        message=(f"line {dr.error_line}: " if dr.error_line else "") + "run as the launcher would run it "
                f"(its own arguments, data and batch; on CPU), the script raised {dr.reason}. The run would "
                "fail the same way; fix the script."))
    findings.extend(Finding(severity="info", code="dry-run-note", message=f"dry run: {n}.")
                    for n in dr.raw.get("notes") or [] if "stood in" in n)


def dry_run_path(path: Path, spec: TaskSpec | None, facts: ScriptFacts, source: str, inputs: RunInputs,
                 bound: BoundPath, engine: dict | None, where, do_probe: bool, findings: list[Finding],
                 reasons: list[str]) -> DryRunPath:
    """Run the script itself (in the worker's sandbox, else once more in the launcher's image when the worker lacks a
    package it imports) and read what it measured; ``findings`` and ``reasons`` get what it found, in order."""
    from autodl.profile.where import image_retry

    dr = _dry(path, spec, facts, source, inputs, engine, where)
    again = image_retry(where, spec.launcher.type if spec else "local", dr.raw.get("error") or {}, dr.outcome)
    if again is not None:  # the worker lacks a package the training's image has: measure it there
        first = dr.reason
        where, dr = again, _dry(path, spec, facts, source, inputs, engine, again)
        dr.findings.insert(0, Finding(severity="info", code="dry-run-where", message=(
            f"on this worker the script could not run ({first}); {again.reason}.")))
    ran_in = None
    if dr.outcome != "no-isolation" and where is not None:
        ran_in = where.venue
        if where.venue != "worker":
            reasons.append(where.reason)
    findings.extend(true_batch_reason(f, source) for f in dr.findings)
    out = DryRunPath(dr=dr, estimate=None, ran_in=ran_in, user_error=False, probe_still=do_probe)
    if dr.ok:
        reasons.append(dr.reason)  # "estimate by dry run: the script ran ..."
        out.estimate = _measured(dr, bound.estimate, inputs, facts, findings)
    elif dr.outcome == "user-error":
        out.user_error = True
        reasons.append(f"dry run: the script raised an error: {dr.reason}")
        _script_error(dr, findings)
    elif dr.outcome == "no-isolation":
        # the sandbox could not be made when it was needed: nothing ran, and the probe (sandboxed too) won't
        findings.append(Finding(severity="warning", code="probe-unavailable", message=(
            f"{path}: the script was not run (no dry run, no probe): {dr.reason} The estimate is the conservative bound.")))
        reasons.append("the script was not run: " + ("no sandbox isolation on this host" if ran_in is None and (
            where is None or where.venue == "worker") else dr.reason))
        out.probe_still = False
    else:
        est = bound.estimate
        if dr.params and not est.params:  # the model the script built before it stopped: its states bound the need
            est.params, est.trainable = dr.params, dr.trainable if dr.trainable is not None else dr.params
        reasons.append(f"dry run not usable: {brief(dr.reason)} (the dry-run-failed finding says why)")
        findings.append(Finding(severity="warning", code="dry-run-failed", message=(
            f"the dry run (the script itself, run in the sandbox on CPU) could not measure a training step: "
            f"{dr.reason}. " + ("Falling back to the model-only probe." if do_probe else "The estimate is the conservative bound."))))
    return out


def brief(reason: str) -> str:
    """A reason's first clause (up to its first parenthesis or semicolon), for the path line: a fresh user read the
    dry run's whole reason three times, in the path line, ``estimate-path`` and ``dry-run-failed``."""
    cut = min((i for i in (reason.find(" ("), reason.find("; ")) if i > 0), default=len(reason))
    return reason[:cut]


def probe_path(path: Path, facts: ScriptFacts, inputs: RunInputs, dr, findings: list[Finding],
               reasons: list[str]) -> tuple[Estimate | None, float | None]:
    """The model-only probe (:func:`autodl.profile.probe.run_probe`) on the inputs the dry run saw: its estimate when
    it measured the model (else None), and its seconds."""
    from autodl.profile.probe import run_probe

    pr = run_probe(path, facts, batch=inputs.batch, input_shape=inputs.input_shape, seq_len=inputs.seq_len,
                   inputs=probe_inputs(dr))
    findings.extend(pr.findings)
    if not pr.ok:
        reasons.append("the probe could not run the model")
        return None, pr.seconds
    reasons.append("the model-only probe measured the model alone"
                   + (" on the inputs the script's Dataset yields" if pr.inputs_from else ""))
    est = Estimate(method="probe", params=pr.params, trainable=pr.trainable, act_per_sample=pr.act_bytes_per_sample,
                   fixed=pr.fixed_transient_bytes, flops_fwd=pr.forward_flops_per_sample, batch=inputs.batch, input_shape=inputs.input_shape,
                   measured_peak=int(pr.tensor_peak_bytes),  # a CPU reading too: the tensor peak, as the dry run's
                   figure_bytes=int(pr.tensor_peak_bytes), probe_batches=pr.batch_sizes)
    return est, pr.seconds
