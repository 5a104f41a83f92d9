"""The profile step: read a PaddlePaddle training script and estimate what one run needs per device.

``profile_script`` first reads the script (never importing or running it in this process): static analysis builds
the model symbolically, traces ``forward()`` and replays a training step's memory; it also finds what must be
known without running (hard-coded devices, distributed markers, data-loader workers). It then runs the script
itself for a few optimizer steps (the dry run, :mod:`autodl.profile.dryrun`) and reads Paddle's allocator peak per
phase: in this worker's sandbox when Paddle is importable and bubblewrap works here, else in a container or pod of
the launcher's image (:mod:`autodl.profile.where`). Where the script cannot run there (it downloads, its data is
elsewhere, it times out), the model alone is probed (:mod:`autodl.profile.probe`) on the inputs the dry run saw,
else the static estimate stands. The profile says which path it took and why (``method``, ``method_reason``, an
``estimate-path`` finding). The result is a :class:`~autodl.types.ResourceProfile`.
"""

from __future__ import annotations

import ast
import importlib.util
import math
import sys
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
from autodl.sandbox import isolation
from autodl.types import Finding, PhasePeak, ResourceProfile

__all__ = ["profile_script", "advice", "estimate_step_time_s", "paddle_available"]

BATCH_SIZE_ENV = "AUTODL_BATCH_SIZE_PER_GPU"
"""Where the launchers pass the spec's per-device batch (set by :func:`autodl.steps.launch.build_request`)."""

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


MAX_SIBLING_MODULES = 8
"""Modules beside the script whose definitions the static reading takes in (``from mymodels import Net``)."""


def _with_siblings(tree: ast.Module, path: Path) -> ast.Module:
    """``tree`` with each ``from X import a, b`` of a module ``X.py`` beside the script replaced by X's top-level
    imports, definitions and constants (one level, at most :data:`MAX_SIBLING_MODULES`): the model is often defined
    there (esttest F9). Their line numbers stay X's own. A module that cannot be read is left as an import."""
    from autodl.inputs import read_script

    body: list[ast.stmt] = []
    taken = 0
    for stmt in tree.body:
        mod = stmt.module if isinstance(stmt, ast.ImportFrom) and not stmt.level else None
        sib = path.parent / f"{mod}.py" if mod and "." not in mod and mod.isidentifier() else None
        if sib is None or taken >= MAX_SIBLING_MODULES or sib.resolve() == path.resolve() or not sib.is_file() \
                or any(a.name == "*" for a in stmt.names):
            body.append(stmt)
            continue
        try:
            _, _, sub = read_script(sib, ProfileError)
        except (ProfileError, OSError, RecursionError, ValueError):
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
    catalog = catalog or load_catalog()

    try:
        facts: ScriptFacts = scan(_with_siblings(tree, path), source) if tree is not None else None
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

    spec_batch = task.batch_size_per_gpu if task and task.batch_size_per_gpu else None
    batch = spec_batch or facts.batch_size
    if (task and task.batch_size_per_gpu and facts.batch_size and facts.batch_size != task.batch_size_per_gpu
            and BATCH_SIZE_ENV not in source
            and not batch_passed(task.batch_size_per_gpu, task.args, spec.launcher.env if spec else {})):
        findings.append(Finding(
            severity="warning", code="spec-batch-not-used",
            message=f"the spec's task.batch_size_per_gpu={task.batch_size_per_gpu} is what this estimate is for, but "
                    f"the script uses batch {facts.batch_size} and never reads {BATCH_SIZE_ENV}; make the script read "
                    f"it (as include/scripts/simple_cnn.py does) or set the spec to {facts.batch_size}."))
    # what only static analysis assumed: said only when the estimate rests on it (not after a dry run)
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

    distributed = facts.distributed
    if policy and policy.distributed_strategy != "none":
        distributed = policy.distributed_strategy

    # ------------------------------------------------------------------------ static estimate (the pre-screen)
    st = StaticEstimate()
    static_shape: Finding | None = None
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
        if isinstance(exc, L.Refused):
            # arguments Paddle refuses whatever the input (a negative or non-integer size): certain from the script;
            # an error unless the dry run shows the script building its model after all
            static_shape = Finding(severity="error", code="shape-mismatch", line=line or facts.model_line,
                                   message=(f"line {line}: " if line else "") + msg + ".")
        else:
            # a shape met with an input autodl inferred: its reading, not Paddle running the script (issue 8, kind 2)
            static_shape = Finding(severity="warning", code="shape-mismatch", line=line or facts.model_line,
                                   message=(f"line {line}: " if line else "") + msg + " (found by reading the "
                                   "script, not by running it; the dry run did not confirm it).")
        from autodl.profile.analysis import count_params
        try:
            t, nt = count_params(facts.model)
            st.params, st.trainable = t + nt, t
        except Exception:
            pass
    assumptions.extend(st.findings)
    if facts.input_shape and not input_shape:
        input_shape = facts.input_shape
    if st.unknown_calls and st.traced:
        names = ", ".join(sorted(st.unknown_calls)[:6])
        assumptions.append(Finding(severity="info", code="unknown-calls",
                                   message=f"calls the estimator does not model ({names}) were taken as shape-preserving."))

    method = "static"
    params, trainable = st.params, st.trainable
    act_per_sample = st.act_bytes_per_sample
    fixed = st.fixed_transient_bytes
    flops_fwd = st.forward_flops_per_sample
    cold: Finding | None = None
    if not st.traced:
        method = "cold_start"
        hidden = st.hidden or 768
        t = seq_len or (math.prod(input_shape) if input_shape else 512)
        act_per_sample = int(t * hidden * 4 * COLD_START_FACTOR)
        if params is None:
            params = trainable = 0
        # FLOPs from the parameter count; unknown (null) with it, never 0
        flops_fwd = 2.0 * params * (seq_len or 1) if params else None
        cold = Finding(
            severity="warning", code="cold-start",
            message=f"static analysis could not pin the model down ({st.why_not}); activations use the cold-start "
                    f"formula batch x seq_len({t}) x hidden({hidden}) x 4 B x {COLD_START_FACTOR}"
                    + ("" if params else " and parameters are unknown")
                    + ". Set task.input_shape/sequence_length in the spec or let the dry run run.")
    reasons = [("static analysis traced the model" if st.traced else f"static analysis: {st.why_not}")]

    estimates: dict[str, int] = {}
    w, g, o = E.model_states(params or 0, trainable or 0, facts.optimizer, None)
    if method != "cold_start" or params:
        estimates[method] = int(w + g + o + act_per_sample * batch + fixed)

    # --------------------------------------------------------------------------- dry run, then probe
    if probe is None and task is not None:
        probe = task.probe  # the spec's task.probe, unless the caller (CLI flag, operator) decided
    choice, do_probe, do_dry = _where(path, spec, probe, dry_run, findings, reasons)
    probe_seconds = None
    probe_batches = None
    ran_in = None
    dry_seconds = None
    phases: list[PhasePeak] = []
    dr = None
    step_flops: float | None = None
    measured_peak = None
    user_error = False
    if do_dry:
        from autodl.profile.dryrun import run_dry_run

        def dry(where):
            return run_dry_run(path, argv=list(task.args) if task else [], batch=spec_batch,
                               script_batch=facts.batch_size, batch_from_spec=bool(spec_batch),
                               hints={"act_bytes_per_sample": st.act_bytes_per_sample if st.traced else None,
                                      "forward_flops_per_sample": st.forward_flops_per_sample if st.traced else None,
                                      "params": st.params, "fallback_batch": batch},
                               eval_expected=_has_eval(source), env=dict(spec.launcher.env) if spec else None,
                               venue=_venue(where, spec, engine))

        dr = dry(choice)
        from autodl.profile.where import image_retry

        again = image_retry(choice, spec.launcher.type if spec else "local", dr.raw.get("error") or {}, dr.outcome)
        if again is not None:  # the worker lacks a package the training's image has: measure it there
            first = dr.reason
            choice, dr = again, dry(again)
            dr.findings.insert(0, Finding(severity="info", code="dry-run-where", message=(
                f"on this worker the script could not run ({first}); {again.reason}.")))
        if dr.outcome != "no-isolation" and choice is not None:
            ran_in = choice.venue
            if choice.venue != "worker":
                reasons.append(choice.reason)
        dry_seconds = dr.seconds
        findings.extend(_true_batch_reason(f, source) for f in dr.findings)
        if dr.ok:
            from autodl.profile.dryrun import script_native

            if spec_batch and script_native(dr.raw) == spec_batch:
                # the script, run with its task.args, uses the spec's batch itself (e.g. --batch-size in the args)
                findings[:] = [f for f in findings if f.code != "spec-batch-not-used"]
            method = "dry_run"
            reasons.append(f"dry run: {dr.reason}")
            batch = dr.batch or batch
            params, trainable = dr.params or params, dr.trainable if dr.trainable is not None else trainable
            act_per_sample = dr.act_bytes_per_sample
            measured_peak = dr.tensor_peak_bytes
            phases = list(dr.phases)
            estimates["dry_run"] = int(dr.tensor_peak_bytes)
            if dr.forward_flops_per_sample:
                flops_fwd = dr.forward_flops_per_sample
            step_flops = dr.step_flops_per_sample  # the whole step: every forward call, recompute (issue 18)
            if dr.inputs:
                input_shape = list(dr.inputs[0]["shape"][1:])
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
            _phase_findings(findings, phases, batch)
        elif dr.outcome == "user-error":
            user_error = True
            reasons.append(f"dry run: the script raised an error: {dr.reason}")
            findings.append(Finding(
                severity="error", code="script-error", line=dr.error_line,
                message=(f"line {dr.error_line}: " if dr.error_line else "") + "run as the launcher would run it "
                        f"(its own arguments, data and batch; on CPU), the script raised {dr.reason}. The run would "
                        "fail the same way; fix the script."))
            findings.extend(Finding(severity="info", code="dry-run-note", message=f"dry run: {n}.")
                            for n in dr.raw.get("notes") or [] if "stood in" in n)
        elif dr.outcome == "no-isolation":
            # the sandbox could not be made when it was needed: nothing ran, and the probe (sandboxed too) won't
            findings.append(Finding(severity="warning", code="probe-unavailable", message=(
                f"{path}: the script was not run (no dry run, no probe): {dr.reason} The estimate is static.")))
            reasons.append("the script was not run: " + ("no sandbox isolation on this host" if ran_in is None and (
                choice is None or choice.venue == "worker") else dr.reason))
            do_probe = False
        else:
            if dr.params and not params:  # the model the script built before it stopped: its states bound the need
                params, trainable = dr.params, dr.trainable if dr.trainable is not None else dr.params
            reasons.append(f"dry run not usable: {dr.reason}")
            findings.append(Finding(severity="warning", code="dry-run-failed", message=(
                f"the dry run (the script itself, run in the sandbox on CPU) could not measure a training step: "
                f"{dr.reason}. " + ("Falling back to the model-only probe." if do_probe else "The estimate is static."))))
    if do_probe and method != "dry_run" and not user_error:
        from autodl.profile.probe import run_probe

        pr = run_probe(path, facts, batch=batch, input_shape=input_shape, seq_len=seq_len,
                       act_bytes_per_sample_hint=st.act_bytes_per_sample if st.traced else None,
                       flops_per_sample_hint=st.forward_flops_per_sample if st.traced else None,
                       inputs=_probe_inputs(dr))
        probe_seconds = pr.seconds
        findings.extend(pr.findings)
        if pr.ok:
            method = "probe"
            reasons.append("the model-only probe measured the model alone"
                           + (" on the inputs the script's Dataset yields" if pr.inputs_from else ""))
            params, trainable = pr.params, pr.trainable
            act_per_sample, fixed = pr.act_bytes_per_sample, pr.fixed_transient_bytes
            probe_batches = pr.batch_sizes
            estimates["probe"] = int(pr.tensor_peak_bytes)
            measured_peak = int(pr.tensor_peak_bytes)  # a CPU reading too: the tensor peak, as the dry run's
            if pr.forward_flops_per_sample and (not st.traced or not flops_fwd):
                flops_fwd = pr.forward_flops_per_sample
        else:
            reasons.append("the probe could not run the model")
    if method in ("static", "cold_start", "probe"):
        findings.extend(assumptions if method != "probe" else
                        [f for f in assumptions if f.code in ("assumed-batch-size", "assumed-input")])
        if cold is not None and method == "cold_start":
            findings.append(cold)
        trained = dr is not None and bool(dr.raw.get("steps"))  # a step ran: forward and backward went through
        if static_shape is not None and method != "probe" and not user_error and not trained:
            findings.append(static_shape)  # what ran shows it builds; a script that trained has no shape error
        elif static_shape is not None and trained:
            findings.append(Finding(severity="info", code="static-shape-unconfirmed", message=(
                "static analysis met a shape it could not follow (" + static_shape.message.rstrip(".")
                + "), but the dry run trained the script: its forward and backward ran, so that reading was "
                "not the script's; the estimate above does not rest on it.")))
    if facts.optimizer is None and not (dr is not None and dr.ok and dr.optimizer):
        findings.append(Finding(severity="info", code="assumed-optimizer",
                                message="no paddle.optimizer construction found; optimizer state sized as Adam (2 fp32 "
                                        "moments per parameter)."))
    optimizer = facts.optimizer or (dr.optimizer if dr is not None and dr.ok else None)

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
    findings.append(Finding(severity="info", code="estimate-path",
                            message=f"estimate by {method.replace('_', ' ')}: " + "; ".join(reasons) + "."))

    if method != "dry_run" and facts.loader_depth and input_shape:
        # the script's single-process DataLoader keeps prefetched batches in Paddle's allocator through the step;
        # the probe and the static replay feed the model directly, so they are added here (the dry run measures them)
        from autodl.profile.trace import DTYPE_BYTES

        sample = math.prod(int(d) for d in input_shape) * DTYPE_BYTES.get(facts.input_dtype, 4)
        held = int(facts.loader_depth * batch * sample)
        if held:
            fixed = int(fixed or 0) + held
            if measured_peak is not None:
                measured_peak += held
            findings.append(Finding(severity="info", code="data-loader-buffer", message=(
                f"the script's DataLoader runs in the training process: it keeps up to {facts.loader_depth} batches "
                f"ready (prefetch_factor + the buffer reader's; measured on Paddle 3.3.1: 5 at the defaults), "
                f"{held / 2**20:,.1f} MiB of inputs at batch {batch}, added to the estimate (labels not counted).")))
    amp = facts.amp
    if method == "dry_run" and measured_peak is not None and task and task.sequence_length:
        measured_peak, length_factor = _to_sequence_length(measured_peak, task.sequence_length, phases, params,
                                                           trainable, optimizer, findings,
                                                           quadratic=_has_attention(source))
        act_per_sample = int((act_per_sample or 0) * length_factor) if act_per_sample else act_per_sample
    reading = (dr.raw.get("max_reading") or 0) if dr is not None and not user_error else 0
    figure = measured_peak if measured_peak is not None else _static_tensor_peak(
        params, trainable, facts, act_per_sample, batch, fixed, st.has_conv)
    if reading and reading > (measured_peak if measured_peak is not None else 0) and (
            measured_peak is not None or reading > figure):
        # a few percent above the figure is the allocator's own rounding and caching: a note; more is a warning
        over = reading > figure * (1 + MEASURED_FLOOR_NOTE_FRACTION)
        findings.append(Finding(severity="warning" if over else "info", code="measured-floor", message=(
            f"the dry run's allocator reached {reading / 2**20:,.1f} MiB while the script ran"
            + (f" (at batch {dr.raw['max_reading_batch']})" if dr.raw.get("max_reading_batch") else "")
            + f", more than the {method.replace('_', ' ')} figure ({figure / 2**20:,.1f} MiB); a run needs at least "
            "what was measured, so "
            "tensor_peak_bytes is raised to that reading (a lower bound, not an extrapolation).")))
        measured_peak = int(reading)
    if measured_peak is not None:
        # the dry run's peak at the run's batch is the tensor peak; split it into the breakdown's terms
        w, g, o = E.model_states(params or 0, trainable or 0, optimizer, None)
        act_total = min(int(act_per_sample or 0) * batch, max(0, measured_peak - (w + g + o)))
        fixed = max(0, measured_peak - (w + g + o) - act_total)
    else:
        act_total = int(act_per_sample or 0) * batch
    if facts.recompute and measured_peak is None:  # a dry run or the probe ran the recompute itself
        act_total = int(act_total * E.RECOMPUTE_FACTOR)
        act_per_sample = int((act_per_sample or 0) * E.RECOMPUTE_FACTOR)
    bd, terms, tensor_peak = E.breakdown(params or 0, trainable or 0, optimizer, amp, act_total, fixed, st.has_conv)
    if measured_peak is not None:
        # tensor_peak_bytes is what a CPU allocator measures: the dry run's own reading. Under AMP (a GPU feature:
        # on CPU the script ran in fp32) the device breakdown above scales the activations instead.
        tensor_peak = measured_peak
        if amp:
            findings.append(Finding(severity="info", code="amp-on-cpu", message=(
                f"the script uses AMP ({amp}); the {'dry run' if method == 'dry_run' else 'probe'} ran on CPU in fp32, so tensor_peak_bytes is the fp32 "
                f"peak, and the device estimate scales activations by {E.AMP_ACTIVATION_FACTOR[amp]} (an assumption "
                "until run records calibrate it).")))
    per_sample_scaled = int((act_per_sample or 0) * E.AMP_ACTIVATION_FACTOR.get(amp, 1.0))
    if bd.total_bytes > INT64_MAX or (params or 0) > INT64_MAX:
        findings.append(Finding(severity="error", code="beyond-int64",
                                message=f"this run needs {bd.total_bytes:.3g} bytes per device for {params or 0:.3g} "
                                        "parameters: more than Paddle's int64 sizes (and any device) can address; "
                                        "lower the batch or the model size."))
    prof = ResourceProfile(
        script=str(path.resolve()),
        model_name=(task.model_name if task and task.model_name else None) or facts.model_name
        or ((dr.raw.get("model") or [None])[0] if dr is not None else None),
        # a model autodl could not find has an unknown parameter count: null, never 0 (the cold-start warning says so)
        params=int(params) if params or method != "cold_start" else None,
        trainable_params=int(trainable or 0) if params or method != "cold_start" else None,
        peak_memory_bytes=bd.total_bytes,
        breakdown=bd,
        activation_bytes_per_sample=per_sample_scaled,
        flops_per_step=float(step_flops * batch) if step_flops else (
            float(E.TRAINING_FLOPS_FACTOR * flops_fwd * batch) if flops_fwd is not None else None),
        batch_size=int(batch),
        sequence_length=seq_len,
        input_shape=list(input_shape) if input_shape else None,
        num_gpus=int(num_gpus),
        optimizer=optimizer,
        amp=amp,
        dtype="float16" if amp == "O2" else "float32",
        recompute=facts.recompute,
        distributed=distributed,
        num_workers=facts.num_workers,
        method=method,
        method_reason="; ".join(reasons),
        phases=phases,
        dry_run_seconds=dry_seconds,
        dry_run_in=ran_in,
        probe_seconds=probe_seconds,
        findings=_for_the_launcher(findings, spec.launcher.type if spec else "local"),
        tensor_peak_bytes=int(tensor_peak),
        workspace_terms_bytes=terms,
        estimates_bytes=estimates,
        probe_batch_sizes=probe_batches,
    )
    prof = prof.model_copy(update={"max_batch_size_by_device": _max_batches(prof, catalog, threshold)})
    if dr is not None and dr.failed_alloc is not None:
        prof = with_failed_allocation(prof, dr.failed_alloc, threshold)
    return prof


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
    return raised_to(prof, prof.peak_memory_bytes + need, note, threshold, fixed=failed.scaling == "fixed")


def _where(path: Path, spec: TaskSpec | None, probe: bool | None, dry_run: bool | None, findings: list[Finding],
           reasons: list[str]):
    """Whether the dry run and the probe run, and where (:func:`autodl.profile.where.choose`); when nowhere, the
    warning saying the estimate is the static bound and why. :returns: ``(choice or None, do_probe, do_dry)``."""
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
            "run (no dry run, no probe): the estimate is static, read from the script's text, and less certain "
            f"(see its other findings); {choice.reason}. Install paddlepaddle where autodl profiles (the paddle "
            "extra), or give the spec a docker or kubernetes launcher with the training's image to measure it.")))
        reasons.append("the script was not run: PaddlePaddle is not installed here")
    elif no_sandbox and setting != "launcher":
        findings.append(Finding(severity="warning", code="probe-unavailable", message=(
            f"{path}: the script was not run (no dry run, no probe): no sandbox can be made on this host "
            f"({no_sandbox}), and user code never runs unisolated. The estimate is static; {choice.reason}.")))
        reasons.append("the script was not run: no sandbox isolation on this host")
    else:
        findings.append(Finding(severity="warning", code="dry-run-nowhere", message=(
            f"{path}: the script was not run: {choice.reason}. The estimate is the static bound.")))
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


def _venue(choice, spec: TaskSpec | None, engine: dict | None):
    """The dry run's venue for ``choice`` (None: the worker's sandbox)."""
    if choice is None or choice.venue in (None, "worker") or spec is None:
        return None
    from autodl.profile.where import venue_for

    return venue_for(choice.venue, spec.launcher, engine)


def _static_tensor_peak(params, trainable, facts, act_per_sample, batch, fixed, has_conv) -> int:
    """The tensor peak the static or cold-start figures give (bytes), to compare with a dry-run reading."""
    act = int(act_per_sample or 0) * batch
    if facts.recompute:
        act = int(act * E.RECOMPUTE_FACTOR)
    return int(E.breakdown(params or 0, trainable or 0, facts.optimizer, facts.amp, act, fixed, has_conv)[2])


def _to_sequence_length(peak: int, seq_len: int, phases: list[PhasePeak], params, trainable, optimizer,
                        findings: list[Finding], *, quadratic: bool = False) -> tuple[int, float]:
    """(training peak in bytes, factor) at the spec's ``sequence_length`` when the dry run's token inputs were all
    shorter (variable-length batches: the longest, which sets the peak, may come late in the epoch): the part above
    the model states scaled by ``(sequence_length / longest length seen)``, squared where the script uses attention
    (:func:`_has_attention`: its score matrices grow with the length squared), an upper bound said in a warning;
    the factor also scales the activations per sample, so the largest batch per device is sized at that length.
    Unchanged (factor 1) when a token input (int, rank 2) reached ``seq_len``."""
    lengths = [s[0] for p in phases for s, d in zip(p.input_shapes, p.input_dtypes)
               if len(s) == 1 and d.startswith("int") and s[0] > 1]
    if not lengths or max(lengths) >= seq_len:
        return peak, 1.0
    seen = max(lengths)
    factor = (seq_len / seen) ** (2 if quadratic else 1)
    w, g, o = E.model_states(params or 0, trainable or 0, optimizer, None)
    above = max(0, peak - (w + g + o))
    scaled = int(w + g + o + above * factor)
    how = (f"({seq_len}/{seen})^2 = {factor:,.1f}: the script uses attention, whose score matrices grow with the "
           "length squared" if quadratic else f"{seq_len}/{seen}: activations linear in the length (no attention "
           "found in the script; one would grow with the length squared)")
    findings.append(Finding(severity="warning", code="sequence-length-bound", message=(
        f"the dry run's token inputs were at most {seen} long, the spec's task.sequence_length is {seq_len}: the "
        f"longest batch sets the peak, so of the measured {peak / 2**20:,.1f} MiB the part above the model states "
        f"({above / 2**20:,.1f} MiB) is scaled by {how}: {scaled / 2**20:,.1f} MiB, an upper bound (the activations "
        "per sample and the largest batch per device are sized at that length too).")))
    return max(peak, scaled), factor


ATTENTION_MARKERS = ("attention", "transformer", "scaled_dot_product", "flash_attn")
"""Source text (lower-cased) that marks attention, whose activations grow with the sequence length squared:
``paddle.nn.MultiHeadAttention``, ``paddle.nn.Transformer*``, ``F.scaled_dot_product_attention``, flash attention,
and a user's own ``Attention`` class."""


def _has_attention(source: str) -> bool:
    """Whether the script's text uses attention (:data:`ATTENTION_MARKERS`)."""
    low = source.lower()
    return any(m in low for m in ATTENTION_MARKERS)


FIXED_BATCH_TEXT = ("the dry run could not change it: the script fixes its batch or builds its batches itself, "
                    "e.g. with a BatchSampler")


def _true_batch_reason(f: Finding, source: str) -> Finding:
    """A script that reads :data:`BATCH_SIZE_ENV` does not fix its batch: the dry run kept its steps small itself
    (its time and memory budgets, or tensors it reduced), so the finding says that instead."""
    if f.code != "dry-run-extrapolated" or FIXED_BATCH_TEXT not in f.message or BATCH_SIZE_ENV not in source:
        return f
    return f.model_copy(update={"message": f.message.replace(
        FIXED_BATCH_TEXT, f"the script reads {BATCH_SIZE_ENV}, but the dry run kept its steps small to stay within "
                          "its time and memory budgets")})


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


_EVAL_MARKERS = ("no_grad", ".eval()", "evaluate(", "eval_data", "eval_loader", "val_loader", "valid_loader",
                 "test_loader", "validate(", "inference_mode")


def _has_eval(source: str) -> bool:
    """Whether the script looks like it has an evaluation pass (then the dry run waits for it)."""
    return any(m in source for m in _EVAL_MARKERS)


def _probe_inputs(dr) -> list[list[dict]] | None:
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


def _phase_findings(findings: list[Finding], phases: list[PhasePeak], batch: int) -> None:
    """Say which phase needs what when there is more than one (issue 8, kind 8)."""
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
    sev = "warning" if train is not None and top is not train and top.peak_bytes > 1.1 * train.peak_bytes else "info"
    msg = "tensor peak per phase: " + "; ".join(parts) + "."
    if sev == "warning":
        msg += (f" The {top.name} pass needs {top.peak_bytes / max(1, train.peak_bytes):.1f}x the training step; the "
                "profile's peak is that pass's, so the device must hold it.")
    findings.append(Finding(severity=sev, code="phase-peaks", message=msg))
