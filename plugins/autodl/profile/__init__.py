"""The profile step: read a PaddlePaddle training script and estimate what one run needs per device.

Details: docs/reference/estimator.md#autodlprofile.
"""

from __future__ import annotations

import ast
import importlib.util
import math
import sys
from pathlib import Path
from typing import NamedTuple

from autodl.catalog import Catalog, load_catalog
from autodl.errors import ProfileError
from autodl.profile import memory as E
from autodl.profile import paths as P
from autodl.profile.advice import advice
from autodl.profile.dryrun import SIZE_ADVICE
from autodl.profile.facts import ScriptFacts, scan
from autodl.profile.paths import BATCH_SIZE_ENV, COLD_START_FACTOR, DEFAULT_BATCH_SIZE
from autodl.profile.runtime import estimate_step_time_s
from autodl.sandbox import isolation
from autodl.spec import DEFAULT_MEMORY_THRESHOLD, TaskSection, TaskSpec
from autodl.types import Finding, PhasePeak, ResourceProfile

__all__ = ["profile_script", "advice", "estimate_step_time_s", "paddle_available", "BATCH_SIZE_ENV",
           "COLD_START_FACTOR", "DEFAULT_BATCH_SIZE"]

DEFAULT_DISTRIBUTED_GPUS = 2
"""Devices assumed for a data-parallel/fleet script when the spec says ``num_gpus_estimate: auto`` and the
script does not fix ``nprocs``: the smallest data-parallel group. Per-card memory does not depend on it."""

INT64_MAX = (1 << 63) - 1
"""Paddle's tensor sizes and autodl's store columns are signed 64-bit: a need past this is an error, not a number."""

def paddle_available() -> bool:
    """True when ``paddle`` is importable (checked without importing it)."""
    return importlib.util.find_spec("paddle") is not None


def _read(script: Path) -> tuple[str, ast.Module | None]:
    # bounded, UTF-8, no symlink loops, and compiled as Python would (``return`` at module level is an error)
    from autodl.inputs import read_script

    _, source, tree = read_script(script, ProfileError)
    return source, tree


MAX_SIBLING_MODULES = 8
"""Modules beside the script whose definitions the static reading takes in (``from mymodels import Net``)."""


def _sibling_module(stmt: ast.ImportFrom, path: Path) -> Path | None:
    """The file ``X.py`` beside ``path`` that ``from X import a, b`` names (not ``*``, not relative, not the script
    itself), or None."""
    mod = stmt.module if not stmt.level else None
    sib = path.parent / f"{mod}.py" if mod and "." not in mod and mod.isidentifier() else None
    if sib is None or sib.resolve() == path.resolve() or not sib.is_file() or any(a.name == "*" for a in stmt.names):
        return None
    return sib


def _with_siblings(tree: ast.Module, path: Path) -> ast.Module:
    """``tree`` with each ``from X import a, b`` of a module ``X.py`` beside the script replaced by X's top-level
    imports, definitions and constants (one level, at most :data:`MAX_SIBLING_MODULES`): the model is often defined
    there (esttest F9). Their line numbers stay X's own. A module that cannot be read is left as an import."""
    from autodl.inputs import read_script

    body: list[ast.stmt] = []
    taken = 0
    for stmt in tree.body:
        sib = _sibling_module(stmt, path) if isinstance(stmt, ast.ImportFrom) else None
        if not isinstance(stmt, ast.ImportFrom) or sib is None or taken >= MAX_SIBLING_MODULES:
            body.append(stmt)
            continue
        try:
            _, _, sub = read_script(sib, ProfileError)
        except (ProfileError, OSError, RecursionError, ValueError):
            sub = None
        if sub is None:  # unreadable, or nested deeper than Python builds a syntax tree for: left as an import
            body.append(stmt)
            continue
        taken += 1
        body.extend(s for s in sub.body if isinstance(s, (ast.Import, ast.ImportFrom, ast.ClassDef, ast.FunctionDef,
                                                           ast.AsyncFunctionDef, ast.Assign, ast.AnnAssign)))
        for a in stmt.names:
            if a.asname and a.asname != a.name:
                alias = ast.Assign(targets=[ast.Name(a.asname, ast.Store())], value=ast.Name(a.name, ast.Load()))
                body.append(ast.copy_location(alias, stmt))
    if not taken:
        return tree
    return ast.fix_missing_locations(ast.Module(body=body, type_ignores=tree.type_ignores))


def _bound_script_values(facts: ScriptFacts) -> None:
    """Drop sizes read from the script that no run can have (a batch of 10**400), with a warning saying so: the
    same bounds as the spec's (:mod:`autodl.fields`), so nothing downstream overflows or is planned from them."""
    from autodl.fields import (
        MAX_BATCH_PER_DEVICE,
        MAX_DEVICES_PER_RUN,
        MAX_INPUT_DIM,
        MAX_INPUT_ELEMENTS,
        MAX_INPUT_RANK,
        MAX_SEQUENCE_LENGTH,
    )

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
    out = {name: profile.max_batch_size(m.memory_bytes, threshold) for name, m in catalog.models.items()}
    return {name: b for name, b in out.items() if b is not None}   # none when the model states are unknown


def profile_script(
    script: str | Path,
    spec: TaskSpec | None = None,
    *,
    catalog: Catalog | None = None,
    probe: bool | None = None,
    threshold: float | None = None,
    dry_run: bool | None = None,
    engine: dict | None = None,
) -> ResourceProfile:
    """Estimate the per-device training peak memory, FLOPs and risks of a PaddlePaddle script.

    :param script: the training script (``.py``).
    :param spec: the task spec; its ``task.batch_size_per_gpu``, ``sequence_length``, ``input_shape``,
        ``num_gpus_estimate`` and ``resource_policy.distributed_strategy`` override what the script says.
    :param catalog: GPU catalog for ``max_batch_size_by_device``; default :func:`load_catalog`.
    :param probe: run the script in the sandbox (the dry run, then the model-only probe if the dry run cannot
        measure); None means on when Paddle is importable (the spec's ``task.probe`` decides first).
    :param dry_run: False skips the dry run (only the model-only probe runs); None follows ``probe``.
    :param engine: the launcher's connection (``DockerLauncher``/``KubernetesLauncher`` keyword arguments) for a
        dry run in the launcher's image (:mod:`autodl.profile.where`); None: ``DOCKER_HOST``/the kubeconfig.
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
    facts = _read_facts(path, source, tree)
    findings: list[Finding] = list(facts.findings)
    _spec_batch_check(facts.batch_size, spec, source, facts, findings)
    inputs = P.run_inputs(facts, spec)
    bound = P.bound_path(inputs)
    reasons: list[str] = []
    if probe is None and task is not None:
        probe = task.probe  # the spec's task.probe, unless the caller (CLI flag, operator) decided
    where, do_probe, do_dry = _where(path, spec, probe, dry_run, findings, reasons)
    dry = P.dry_run_path(path, spec, facts, source, inputs, bound, engine, where, do_probe, findings, reasons) \
        if do_dry else None
    dr = dry.dr if dry is not None else None
    user_error = dry is not None and dry.user_error
    measured = dry.estimate if dry is not None else None
    probed, probe_seconds = None, None
    if (dry.probe_still if dry is not None else do_probe) and measured is None and not user_error:
        probed, probe_seconds = P.probe_path(path, facts, inputs, dr, findings, reasons)
    chosen = P.choose(bound.estimate, measured, probed)
    if chosen is bound.estimate:
        reasons.insert(0, bound.reason)
    findings.extend(P.kept_findings(chosen, bound, tried=dr is not None or probe_seconds is not None,
                                    off=probe is False))
    ran = {"estimates_bytes": {e.method: e.figure_bytes for e in (bound.estimate, measured, probed)
                               if e is not None and e.figure_bytes is not None},
           "dry_run_seconds": dr.seconds if dr is not None else None,
           "dry_run_in": dry.ran_in if dry is not None else None, "probe_seconds": probe_seconds}
    prof = _assemble(path, spec, facts, source, chosen, dr, user_error, findings, reasons, ran)
    prof = prof.model_copy(update={"max_batch_size_by_device": _max_batches(prof, catalog or load_catalog(), threshold)})
    if dr is not None and dr.failed_alloc is not None:
        prof = with_failed_allocation(prof, dr.failed_alloc, threshold)
    return prof


def _read_facts(path: Path, source: str, tree: ast.Module | None) -> ScriptFacts:
    """What static analysis reads from the script (its siblings' definitions taken in), sizes no run can have
    dropped; an empty reading with a warning when the script nests deeper than the analysis follows."""
    try:
        facts: ScriptFacts | None = scan(_with_siblings(tree, path), source) if tree is not None else None
    except RecursionError:
        facts = None
    if facts is None:  # valid Python nested deeper than the analysis follows: the tool's limit, not an error
        from autodl.profile.interp import Interp

        facts = ScriptFacts(interp=Interp(ast.Module(body=[], type_ignores=[])))
        facts.findings.append(Finding(severity="warning", code="analysis-too-deep",
                                      message="the script nests expressions deeper than the static analysis follows; "
                                              "nothing was read from it (model, batch size). Set task.input_shape and "
                                              "batch_size_per_gpu in the spec or let the probe run."))
    _bound_script_values(facts)
    return facts


def _spec_batch_check(script_batch: int | None, spec: TaskSpec | None, source: str, facts: ScriptFacts,
                      findings: list[Finding], seen: str = "the script uses batch") -> None:
    """Warn when the spec's batch is not ``script_batch``, the batch the script will train with (``seen``: how that
    was told), and nothing the launch passes sets it (``AUTODL_BATCH_SIZE_PER_GPU``, ``task.args``,
    ``launcher.env``)."""
    task = spec.task if spec else None
    if not (task and task.batch_size_per_gpu and script_batch and script_batch != task.batch_size_per_gpu):
        return
    if BATCH_SIZE_ENV in source or batch_passed(task.batch_size_per_gpu, task.args, spec.launcher.env if spec else {}):
        return
    findings.append(Finding(
        severity="warning", code="spec-batch-not-used",
        message=f"the spec's task.batch_size_per_gpu={task.batch_size_per_gpu} is what this estimate is for, but "
                f"{seen} {script_batch}: nothing the launch passes sets it (task.args, launcher.env), and the script "
                f"does not read {BATCH_SIZE_ENV}, which autodl sets to the spec's batch. "
                + _batch_ways(task.batch_size_per_gpu, script_batch, facts, source)))


def _batch_ways(batch: int, script_batch: int, facts: ScriptFacts, source: str) -> str:
    """How the spec's ``batch`` can reach the script, of the ways it has (a fresh user was told to pass
    ``--batch-size`` to a script that takes no option): its argparse option named for a batch (``task.args``), an
    environment variable it reads (``launcher.env``), reading :data:`BATCH_SIZE_ENV`, or the spec set to its batch."""
    ways = [f"pass it as the script's option (task.args: [{flag}, {batch}])"
            for dest, flag in facts.interp.argparse_flags.items() if _training_batch_option(dest)][:1]
    if "environ" in source or "getenv" in source:
        ways.append("set the variable the script reads in launcher.env")
    ways += [f"make the script read {BATCH_SIZE_ENV}", f"set the spec to {script_batch}"]
    fixed = "" if len(ways) > 2 else "The script sets its batch in its own code (no option or variable of it does): "
    text = ", ".join(ways[:-1]) + f" or {ways[-1]}"
    return fixed + (text[0].upper() + text[1:] if not fixed else text) + "."


def _trained_batch_check(dr, facts: ScriptFacts, spec: TaskSpec | None, source: str, findings: list[Finding]) -> None:
    """Say ``spec-batch-not-used`` from the batch the dry run saw the script train at, where it saw one
    (:func:`autodl.profile.dryrun.trained_batch`), over the static reading's: a data tensor's rows the script slices
    micro-batches from are not its batch, and a batch the static reading could not follow is still checked."""
    from autodl.profile.dryrun import trained_batch

    trained = trained_batch(dr.raw, facts.batch_size)
    if trained is None:
        return
    findings[:] = [f for f in findings if f.code != "spec-batch-not-used"]
    _spec_batch_check(trained, spec, source, facts, findings, seen="the dry run saw the script train at batch")


def _num_gpus(spec: TaskSpec | None, facts: ScriptFacts, distributed, batch: int, findings: list[Finding]) -> int:
    """Devices the run plans: the spec's count, else the script's process count for a distributed script (or the
    smallest data-parallel group, said), else 1."""
    task = spec.task if spec else None
    if task and isinstance(task.num_gpus_estimate, int):
        return task.num_gpus_estimate
    if not distributed:
        return 1
    if not facts.distributed_nprocs:
        findings.append(Finding(severity="info", code="assumed-num-gpus",
                                message=f"distributed markers ({distributed}) and num_gpus_estimate: auto: planning "
                                        f"{DEFAULT_DISTRIBUTED_GPUS} devices with batch {batch} each; set "
                                        "task.num_gpus_estimate to change it."))
    return facts.distributed_nprocs or DEFAULT_DISTRIBUTED_GPUS


def _loader_buffer(est: P.Estimate, facts: ScriptFacts, findings: list[Finding]) -> None:
    """Add the batches the script's single-process DataLoader keeps in Paddle's allocator through the step to a
    probe or bound estimate (they feed the model directly; the dry run measures them)."""
    if est.method == "dry_run" or not facts.loader_depth or not est.input_shape:
        return
    batch = est.batch or 1
    sample = math.prod(int(d) for d in est.input_shape) * E.DTYPE_BYTES.get(facts.input_dtype, 4)
    held = int(facts.loader_depth * batch * sample)
    if not held:
        return
    est.fixed = int(est.fixed or 0) + held
    if est.measured_peak is not None:
        est.measured_peak += held
    findings.append(Finding(severity="info", code="data-loader-buffer", message=(
        f"the script's DataLoader runs in the training process: it keeps up to {facts.loader_depth} batches "
        f"ready (prefetch_factor + the buffer reader's; measured on Paddle 3.3.1: 5 at the defaults), "
        f"{held / 2**20:,.1f} MiB of inputs at batch {batch}, added to the estimate (labels not counted).")))


def _measured_floor(est: P.Estimate, dr, user_error: bool, facts: ScriptFacts, has_conv: bool,
                    findings: list[Finding]) -> None:
    """Never below a reading the dry run's allocator took while the script ran (issue 18): raise the figure to it."""
    reading = (dr.raw.get("max_reading") or 0) if dr is not None and not user_error else 0
    if not reading:
        return
    figure = est.measured_peak if est.measured_peak is not None else _static_tensor_peak(
        est.params, est.trainable, facts, est.act_per_sample, est.batch or 1, est.fixed, has_conv)
    if not (reading > (est.measured_peak or 0) and (est.measured_peak is not None or reading > figure)):
        return
    from autodl.profile.dryrun import bytes_text  # bytes in KiB under a MiB ("1.1 MiB, more than 1.1 MiB")

    # a few percent above the figure is the allocator's own rounding and caching: a note; more is a warning
    over = reading > figure * (1 + MEASURED_FLOOR_NOTE_FRACTION)
    findings.append(Finding(severity="warning" if over else "info", code="measured-floor", message=(
        f"the dry run's allocator reached {reading / 2**20:,.1f} MiB while the script ran"
        + (f" (at batch {dr.raw['max_reading_batch']})" if dr.raw.get("max_reading_batch") else "")
        + f", {bytes_text(reading - figure)} more than the {est.method.replace('_', ' ')} figure "
        f"({figure / 2**20:,.1f} MiB); a run needs at least "
        "what was measured, so "
        "tensor_peak_bytes is raised to that reading (a lower bound, not an extrapolation).")))
    est.measured_peak = int(reading)


def _breakdown(est: P.Estimate, facts: ScriptFacts, optimizer, has_conv: bool, findings: list[Finding]):
    """The device breakdown of ``est``: (breakdown, workspace terms, tensor peak bytes, activations per sample)."""
    batch = est.batch or 1
    act_per_sample = est.act_per_sample
    fixed = est.fixed
    if est.measured_peak is not None:
        # the measured peak at the run's batch is the tensor peak; split it into the breakdown's terms
        w, g, o = E.model_states(est.params or 0, est.trainable or 0, optimizer, None)
        act_total = min(int(act_per_sample or 0) * batch, max(0, est.measured_peak - (w + g + o)))
        fixed = max(0, est.measured_peak - (w + g + o) - act_total)
    else:
        act_total = int(act_per_sample or 0) * batch
    if facts.recompute and est.measured_peak is None:  # a dry run or the probe ran the recompute itself
        act_total = int(act_total * E.RECOMPUTE_FACTOR)
        act_per_sample = int((act_per_sample or 0) * E.RECOMPUTE_FACTOR)
    bd, terms, tensor_peak = E.breakdown(est.params or 0, est.trainable or 0, optimizer, facts.amp, act_total,
                                         fixed or 0, has_conv)
    if est.measured_peak is not None:
        # tensor_peak_bytes is what a CPU allocator measures: the dry run's own reading. Under AMP (a GPU feature:
        # on CPU the script ran in fp32) the device breakdown above scales the activations instead.
        tensor_peak = est.measured_peak
        if facts.amp:
            findings.append(Finding(severity="info", code="amp-on-cpu", message=(
                f"the script uses AMP ({facts.amp}); the {'dry run' if est.method == 'dry_run' else 'probe'} ran on "
                f"CPU in fp32, so tensor_peak_bytes is the fp32 peak, and the device estimate scales activations by "
                f"{E.AMP_ACTIVATION_FACTOR[facts.amp]} (an assumption until run records calibrate it).")))
    return bd, terms, tensor_peak, act_per_sample


def _assemble(path: Path, spec: TaskSpec | None, facts: ScriptFacts, source: str, est: P.Estimate, dr, user_error: bool, findings: list[Finding], reasons: list[str],
              ran: dict) -> ResourceProfile:
    """The profile from the chosen estimate: the conservative corrections (data-loader buffers, the spec's sequence
    length, a larger reading), the device breakdown, and the findings that say so."""
    task = spec.task if spec else None
    policy = spec.resource_policy if spec else None
    distributed = policy.distributed_strategy if policy and policy.distributed_strategy != "none" else facts.distributed
    dry_ok = dr is not None and dr.ok
    if facts.optimizer is None and not (dry_ok and dr.optimizer):
        findings.append(Finding(severity="info", code="assumed-optimizer",
                                message="no paddle.optimizer construction found; optimizer state sized as Adam (2 fp32 "
                                        "moments per parameter)."))
    optimizer = facts.optimizer or (dr.optimizer if dry_ok else None)
    batch = est.batch or 1
    num_gpus = _num_gpus(spec, facts, distributed, batch, findings)
    findings.append(Finding(severity="info", code="estimate-path",
                            message=f"estimate by {est.method.replace('_', ' ')}: " + "; ".join(reasons) + "."))
    _loader_buffer(est, facts, findings)
    if dry_ok:
        _trained_batch_check(dr, facts, spec, source, findings)
    if est.method == "dry_run" and est.measured_peak is not None and task and (size := _spec_size(task, est.phases)):
        est.measured_peak, length_factor = _to_spec_size(est.measured_peak, size, est.params, est.trainable,
                                                         optimizer, findings, quadratic=_has_attention(source),
                                                         pair_share=est.pair_flops_share)
        if est.act_per_sample:
            est.act_per_sample = int(est.act_per_sample * length_factor)
        flops_factor = _flops_factor(size, est.pair_flops_share)
        est.step_flops = est.step_flops and est.step_flops * flops_factor
        est.flops_fwd = est.flops_fwd and est.flops_fwd * flops_factor
        # the figure is for the spec's size, not the one seen
        if size.field == "task.sequence_length":
            est.input_shape = [size.wanted] if est.input_shape and len(est.input_shape) == 1 else est.input_shape
        elif task.input_shape:
            est.input_shape = list(task.input_shape)
        if length_factor > 1:  # the bound's part above the model states is per-sample at most: never less per sample
            w, g, o = E.model_states(est.params or 0, est.trainable or 0, optimizer, None)
            per_sample = max(0, est.measured_peak - (w + g + o)) // max(1, batch)
            est.act_per_sample = max(int(est.act_per_sample or 0), int(per_sample))
    if task:
        _advice_at_spec_size(findings, task)
    _measured_floor(est, dr, user_error, facts, facts.has_conv, findings)
    bd, terms, tensor_peak, act_per_sample = _breakdown(est, facts, optimizer, facts.has_conv, findings)
    if bd.total_bytes > INT64_MAX or (est.params or 0) > INT64_MAX:
        findings.append(Finding(severity="error", code="beyond-int64",
                                message=f"this run needs {bd.total_bytes:.3g} bytes per device for {est.params or 0:.3g} "
                                        "parameters: more than Paddle's int64 sizes (and any device) can address; "
                                        "lower the batch or the model size."))
    known = bool(est.params) or est.method != "cold_start"  # an unknown parameter count is null, never 0
    return ResourceProfile(
        script=str(path.resolve()),
        model_name=(task.model_name if task and task.model_name else None) or facts.model_name
        or ((dr.raw.get("model") or [None])[0] if dr is not None else None),
        params=int(est.params or 0) if known else None,
        trainable_params=int(est.trainable or 0) if known else None,
        peak_memory_bytes=bd.total_bytes, breakdown=bd,
        activation_bytes_per_sample=int((act_per_sample or 0) * E.AMP_ACTIVATION_FACTOR.get(facts.amp, 1.0)),
        flops_per_step=float(est.step_flops * batch) if est.step_flops else (
            float(E.TRAINING_FLOPS_FACTOR * est.flops_fwd * batch) if est.flops_fwd is not None else None),
        batch_size=int(batch), sequence_length=_seq_len(task, facts),
        input_shape=list(est.input_shape) if est.input_shape else None,
        num_gpus=int(num_gpus), optimizer=optimizer, amp=facts.amp, dtype="float16" if facts.amp == "O2" else "float32",
        recompute=facts.recompute, distributed=distributed, num_workers=facts.num_workers,
        method=est.method, method_reason="; ".join(reasons), phases=est.phases,
        findings=_for_the_launcher(findings, spec.launcher.type if spec else "local"),
        tensor_peak_bytes=int(tensor_peak), workspace_terms_bytes=terms, probe_batch_sizes=est.probe_batches,
        **ran,
    )


def _seq_len(task, facts: ScriptFacts) -> int | None:
    """The sequence length the estimate is for: the spec's, else the script's."""
    return (task.sequence_length if task and task.sequence_length else None) or facts.sequence_length


def with_failed_allocation(prof: ResourceProfile, failed, threshold: float | None) -> ResourceProfile:
    """``prof`` never below what the script asked for in one allocation that failed in the dry run, larger than the
    dry run's whole memory limit (:class:`autodl.profile.dryrun.FailedAllocation`): the estimate plus that request,
    rescaled to the run's batch when it scales with the batch (or might: one batch size seen, an upper bound), as
    batch-independent workspace when it does not (then no smaller batch is advised: it would not help).

    :param failed: the :class:`~autodl.profile.dryrun.FailedAllocation`.
    :param threshold: the spec's memory threshold, for the largest batch per device.
    """
    from autodl.records import raised_to

    gib = 1 << 30
    request, seen = failed.request_bytes, ", ".join(
        f"{r / gib:.2f} GiB at batch {b if b is not None else '?'}" for b, r in failed.batches)
    rescale = failed.scaling != "fixed" and failed.batch and prof.batch_size != failed.batch
    need = int(request * prof.batch_size / failed.batch) if rescale else request
    how = {"fixed": "the same request at two batch sizes: it does not depend on the batch, so a smaller batch does "
                    "not help; the script must allocate less",
           "scales": f"it grew with the batch: rescaled to batch {prof.batch_size}",
           "unknown": (f"one batch size seen: assumed to scale with the batch, rescaled to batch {prof.batch_size} "
                       "(an upper bound)" if rescale else "one batch size seen")}[failed.scaling]
    note = Finding(severity="warning", code="dry-run-allocation", message=(
        f"the script asked for {request / gib:.2f} GiB in one allocation in the dry run ({seen}), more than the dry "
        f"run's whole memory limit ({failed.limit_bytes / gib:.0f} GiB): that is the script's own need, not the dry "
        f"run's limit ({how}). The estimate is raised from {prof.peak_memory_bytes / gib:.2f} to "
        f"{(prof.peak_memory_bytes + need) / gib:.2f} GiB per device."))
    return raised_to(prof, prof.peak_memory_bytes + need, note, threshold, fixed=failed.scaling == "fixed",
                     measured=min(request, need))  # one batch seen: it may or may not scale; the smaller is certain


def _where(path: Path, spec: TaskSpec | None, probe: bool | None, dry_run: bool | None, findings: list[Finding],
           reasons: list[str]):
    """Whether the dry run and the probe run, and where (:func:`autodl.profile.where.choose`); when nowhere, the
    warning saying the estimate is the conservative bound and why. :returns: ``(choice or None, do_probe, do_dry)``."""
    from autodl.profile.where import choose, configured
    from autodl.sandbox import unavailable_reason

    if probe is False:
        return None, False, False
    setting, _ = configured(spec.task.dry_run_in if spec else None)
    no_sandbox = (unavailable_reason() or "bubblewrap cannot make a sandbox here") if isolation() == "none" else None
    launcher = spec.launcher.type if spec else "local"
    choice = choose(setting, launcher, paddle_here=paddle_available(), no_sandbox_why=no_sandbox)
    if choice.venue == "worker":
        return choice, True, dry_run is not False
    if choice.venue is not None:  # the probe needs Paddle here: only the dry run runs in the image
        return choice, False, dry_run is not False
    if not paddle_available() and setting != "launcher":
        findings.append(Finding(severity="warning", code="paddle-unavailable", message=(
            f"{path}: PaddlePaddle is not importable by this interpreter ({sys.executable}), so the script was not "
            "run (no dry run, no probe): the estimate is the conservative bound, the model's size unknown and "
            f"placed as the largest allowed device (see its other findings); {choice.reason}. Install paddlepaddle where autodl profiles (the paddle "
            "extra), or give the spec a docker or kubernetes launcher with the training's image to measure it.")))
        reasons.append("the script was not run: PaddlePaddle is not installed here")
    elif no_sandbox and setting != "launcher":
        findings.append(Finding(severity="warning", code="probe-unavailable", message=(
            f"{path}: the script was not run (no dry run, no probe): no sandbox can be made on this host "
            f"({no_sandbox}), and user code never runs unisolated. The estimate is the conservative bound; {choice.reason}.")))
        reasons.append("the script was not run: no sandbox isolation on this host")
    else:
        findings.append(Finding(severity="warning", code="dry-run-nowhere", message=(
            f"{path}: the script was not run: {choice.reason}. The estimate is the conservative bound.")))
        reasons.append(f"the script was not run: {choice.reason}")
    return choice, False, False


MEASURED_FLOOR_NOTE_FRACTION = 0.05
"""A dry-run reading at most this fraction above the figure raises it with an ``info`` finding, more with a warning
(the README's demo read 0.8 MiB above a 95 MiB figure: a warning there was noise)."""


def _for_the_launcher(findings: list[Finding], launcher: str) -> list[Finding]:
    """A local training shares the host's ``/dev/shm``, so DataLoader workers there are a note, not a warning (the
    64 MiB container default the ``dataloader-workers`` warning is about applies to Docker and Kubernetes)."""
    if launcher != "local":
        return findings
    return [f.model_copy(update={"severity": "info", "message": f.message + " (launcher: local: the run shares this "
                                 "host's /dev/shm, so this matters only in a container)"})
            if f.code == "dataloader-workers" and f.severity == "warning" else f for f in findings]


def _static_tensor_peak(params, trainable, facts, act_per_sample, batch, fixed, has_conv) -> int:
    """The tensor peak the conservative bound's figures give (bytes), to compare with a dry-run reading."""
    act = int(act_per_sample or 0) * batch
    if facts.recompute:
        act = int(act * E.RECOMPUTE_FACTOR)
    return int(E.breakdown(params or 0, trainable or 0, facts.optimizer, facts.amp, act, fixed or 0, has_conv)[2])


class _SpecSize(NamedTuple):
    """The spec's input size against the largest the dry run's training steps had: ``field`` names it, ``seen`` and
    ``wanted`` count tokens (``task.sequence_length``) or elements per sample (``task.input_shape``)."""

    field: str  # the spec's field as said ("task.sequence_length", "task.input_shape [3, 64, 64]")
    seen: int
    wanted: int


def _spec_size(task: TaskSection, phases: list[PhasePeak]) -> _SpecSize | None:
    """The spec's size where it is larger than the dry run's inputs: ``task.sequence_length`` against the longest
    token input (integer, one dimension per sample), else ``task.input_shape``'s elements against the largest
    floating-point input's; None when the spec sets neither or the inputs reached it."""
    pairs = [(s, d) for p in phases for s, d in zip(p.input_shapes, p.input_dtypes)]
    if task.sequence_length:
        lengths = [s[0] for s, d in pairs if len(s) == 1 and d.startswith("int") and s[0] > 1]
        if lengths and max(lengths) < task.sequence_length:
            return _SpecSize("task.sequence_length", max(lengths), task.sequence_length)
    if task.input_shape:
        wanted = math.prod(task.input_shape)
        sizes = [math.prod(s) for s, d in pairs if d.startswith(("float", "bfloat"))]
        if sizes and max(sizes) < wanted:
            return _SpecSize(f"task.input_shape {list(task.input_shape)}", max(sizes), wanted)
    return None


def _flops_factor(size: _SpecSize, pair_share: float) -> float:
    """How the FLOPs per sample grow from the dry run's input size to the spec's: linearly for layers (convolutions,
    linear and recurrent layers do the same work per token or pixel), squared for the share counted in products of
    two activations (attention's scores and their weighting of the values: tokens x tokens)."""
    r = size.wanted / size.seen
    return (1 - pair_share) * r + pair_share * r * r


def _to_spec_size(peak: int, size: _SpecSize, params, trainable, optimizer, findings: list[Finding], *,
                  quadratic: bool = False, pair_share: float = 0.0) -> tuple[int, float]:
    """(training peak in bytes, factor) at the spec's input size when the dry run's inputs were all smaller (the
    longest or largest batch, which sets the peak, may come late in the epoch): the part above the model states
    scaled by ``wanted / seen``, squared where the script uses attention (:func:`_has_attention`: its score matrices
    grow with the tokens squared), an upper bound said in a warning; the factor also scales the activations per
    sample, so the largest batch per device is sized at that size."""
    tokens = size.field == "task.sequence_length"
    unit = "long" if tokens else "elements per sample"
    factor = (size.wanted / size.seen) ** (2 if quadratic else 1)
    w, g, o = E.model_states(params or 0, trainable or 0, optimizer, None)
    above = max(0, peak - (w + g + o))
    scaled = int(w + g + o + above * factor)
    ratio = f"{size.wanted:,}/{size.seen:,}"
    how = (f"({ratio})^2 = {factor:,.1f}: the script uses attention, whose score matrices grow with the "
           "tokens squared" if quadratic else f"{ratio}: activations linear in the input (no attention "
           "found in the script; one would grow with the tokens squared)")
    code = "sequence-length-bound" if tokens else "input-shape-bound"
    findings.append(Finding(severity="warning", code=code, message=(
        f"the dry run's inputs were at most {size.seen:,} {unit}, the spec's {size.field} "
        f"{'is' if tokens else 'holds'} {size.wanted:,}: the "
        f"largest batch sets the peak, so of the measured {peak / 2**20:,.1f} MiB the part above the model states "
        f"({above / 2**20:,.1f} MiB) is scaled by {how}: {scaled / 2**20:,.1f} MiB, an upper bound (the activations "
        "per sample and the largest batch per device are sized at that size too); " + _flops_said(size, pair_share))))
    return max(peak, scaled), factor


def _flops_said(size: _SpecSize, pair_share: float) -> str:
    """The bound's sentence on the FLOPs (:func:`_flops_factor`)."""
    ratio = f"{size.wanted:,}/{size.seen:,}"
    if not pair_share:
        return (f"the FLOPs per sample are scaled by {ratio} (linear in the input, as convolutions, linear and "
                "recurrent layers are; no product of two activations, as attention's, was counted).")
    return (f"the FLOPs per sample are scaled by {_flops_factor(size, pair_share):,.2f}: {ratio} for the layers and "
            f"its square for the {pair_share:.0%} counted in products of two activations (attention's scores and "
            "their weighting of the values grow with the tokens squared).")


def _advice_at_spec_size(findings: list[Finding], task: TaskSection) -> None:
    """Where the spec sets ``task.sequence_length`` or ``task.input_shape``, the findings that advise setting them
    (:data:`~autodl.profile.dryrun.SIZE_ADVICE`) say instead that the figure is sized to it (:func:`_to_spec_size`)."""
    given = ([f"task.sequence_length ({task.sequence_length})"] if task.sequence_length else []) + \
        ([f"task.input_shape ({list(task.input_shape)})"] if task.input_shape else [])
    if not given:
        return
    said = (f"the figure is sized to the spec's {' and '.join(given)} at least, taken as the largest the data holds: "
            "raise it if the data holds larger, or keep headroom")
    findings[:] = [f.model_copy(update={"message": f.message.replace(SIZE_ADVICE, said)}) if SIZE_ADVICE in f.message
                   else f for f in findings]


ATTENTION_MARKERS = ("attention", "transformer", "scaled_dot_product", "flash_attn")
"""Source text (lower-cased) that marks attention, whose activations grow with the sequence length squared:
``paddle.nn.MultiHeadAttention``, ``paddle.nn.Transformer*``, ``F.scaled_dot_product_attention``, flash attention,
and a user's own ``Attention`` class."""


def _has_attention(source: str) -> bool:
    """Whether the script's text uses attention (:data:`ATTENTION_MARKERS`)."""
    low = source.lower()
    return any(m in low for m in ATTENTION_MARKERS)


def _training_batch_option(dest: str) -> bool:
    """Whether an argparse destination names the training batch (``batch_size``, ``bs``; not ``eval_batch_size``)."""
    d = dest.lower()
    return ("batch" in d or d in ("bs", "bsz")) and not d.startswith(("eval", "val", "test", "infer"))


BATCH_FLAGS = ("batch", "bs", "bsz")
"""Argument and variable names that carry a batch (``--batch-size``, ``--bs``, ``BATCH``, ``TRAIN_BSZ``)."""


def batch_passed(batch: int, args: list[str], env: dict[str, str]) -> bool:
    """Whether what the launch passes sets ``batch``: a ``task.args`` option named for a batch (``--batch-size 64``,
    ``--bs=64``) or a ``launcher.env`` variable named for one holding it. Then ``spec-batch-not-used`` is untrue."""
    want = str(batch)
    for i, a in enumerate(args):
        name, _, val = a.partition("=")
        if any(f in name.lower() for f in BATCH_FLAGS) and name.startswith("-"):
            if (val or (args[i + 1] if i + 1 < len(args) else "")) == want:
                return True
    return any(any(f in k.lower() for f in BATCH_FLAGS) and v.strip() == want for k, v in (env or {}).items())
