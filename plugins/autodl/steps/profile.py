"""Step 1, profile: estimate the script's resources, check them against the catalog and plan a placement (no lease yet)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from autodl.catalog import Catalog, load_catalog
from autodl.errors import NoFitError, ProfileError
from autodl.inventory import read_inventory
from autodl.ledger import Ledger
from autodl.spec import TaskSpec, check_spec_against_catalog
from autodl.steps.context import GiB, MiB, begin_attempt, state_dir
from autodl.steps.inputs import OVERRIDES, apply_overrides, check_overrides, load_inputs
from autodl.store import RunState
from autodl.types import Device, Inventory, PlacementDecision, ProfileResult, ResourceProfile


def _profile_fn():
    from autodl.profile import profile_script
    from autodl.profile.cache import cached  # the same script, spec, environment and versions: the last profile

    return cached(profile_script)


def _place_fn():
    from autodl.policy import place

    return place


def profile_run(script: str | Path | None, spec_path: str | Path | None, *, probe: bool | None = None,
                catalog: Catalog | None = None, launcher_type: str | None = None,
                engine: dict[str, Any] | None = None) -> tuple[TaskSpec, ResourceProfile]:
    """Profile the script (static analysis, optional sandboxed probe); never runs it here.

    :param launcher_type: the run's launcher (an override of the spec's ``launcher.type``): a dry run that cannot
        run on this worker runs in its image (:mod:`autodl.profile.where`).
    :param engine: that launcher's connection keyword arguments (the Airflow connection's), for that dry run.
    :raises SpecError: bad spec or script path.
    :raises ProfileError: syntax error in the script, or error findings (e.g. a shape mismatch).
    """
    spec, script_path = load_inputs(script, spec_path)
    catalog = catalog or load_catalog()
    check_spec_against_catalog(spec, catalog)
    profiled = apply_overrides(spec, {"launcher": launcher_type}) if launcher_type else spec
    if engine is not None:
        profile = _profile_fn()(script_path, profiled, catalog=catalog, probe=probe, engine=engine)
    else:
        profile = _profile_fn()(script_path, profiled, catalog=catalog, probe=probe)
    from autodl.records import calibrate_profile  # never below what this script needed when it ran out of memory

    profile = calibrate_profile(profile, threshold=spec.resource_policy.memory_threshold)
    if profile.errors:
        lines = [f"{script_path}:{f.line or '?'}: [{f.code}] {f.message}" for f in profile.errors]
        if spec.task.input_shape and any(f.code == "shape-mismatch" for f in profile.errors):
            lines.append(f"note: the input shape {spec.task.input_shape} comes from task.input_shape in "
                         f"{spec.source_path}; if that is not this script's input, fix or remove it there.")
        raise ProfileError("the script cannot run as written; fix it before booking a device:\n" + "\n".join(lines))
    return spec, profile


def plan(profile: ResourceProfile, spec: TaskSpec, *, inventory: Inventory | None = None, pool: str | None = None,
         catalog: Catalog | None = None, leased: frozenset[str] | None = None, store_url: str | None = None) -> PlacementDecision:
    """Ask the spec's policy where ``profile`` would go now (no booking)."""
    catalog = catalog or load_catalog()
    inventory = inventory or read_inventory(pool, catalog=catalog)
    if leased is None:
        leased = Ledger(store_url).leased_device_ids()
    return _place_fn()(profile, inventory, catalog=catalog, policy=spec.resource_policy,
                       algorithm=spec.scheduler.algorithm, leased=leased, num_gpus=profile.num_gpus,
                       store_url=store_url)


def no_fit_error(profile: ResourceProfile, decision: PlacementDecision, inventory: Inventory,
                 threshold: float = 0.85) -> NoFitError:
    """The message for a run nothing in the pool can ever hold: what it needs, what the pool has, advice.

    Says whether memory is the problem (needed GiB vs the largest device) or the gang size (N devices
    of one model on one host, vs the largest such group whose devices would each hold the run).
    """
    need = profile.peak_memory_bytes
    largest = max(inventory.devices, key=lambda d: d.memory_total_bytes, default=None)
    fitting = [d for d in inventory.devices if need <= threshold * d.memory_total_bytes]
    if largest is None:  # no devices
        msg = f"the pool ({inventory.source}) has no devices."
    elif profile.num_gpus > 1 and fitting:
        groups: dict[tuple[str, str], int] = {}
        for d in fitting:
            groups[(d.host, d.model)] = groups.get((d.host, d.model), 0) + 1
        (host, model), size = max(groups.items(), key=lambda kv: kv[1])
        msg = (f"no host in the pool ({inventory.source}) has {profile.num_gpus} devices of one model for this "
               f"data-parallel run ({need / GiB:.2f} GiB each would fit); the largest group is {size} x {model} on "
               f"{host}. Lower task.num_gpus_estimate to {size} or add devices.")
    else:
        biggest = f"the largest device is {largest.model} with {largest.memory_total_bytes / GiB:.1f} GiB"
        msg = (f"no device in the pool ({inventory.source}) can hold this run: it needs {need / GiB:.2f} GiB per "
               f"device x {profile.num_gpus} under the memory threshold {threshold:g}; {biggest}.")
    if decision.suggestions:
        msg += "\nSuggestions:\n" + "\n".join(f"  - {s}" for s in decision.suggestions)
    return NoFitError(msg, decision.suggestions)


def format_candidates(decision: PlacementDecision) -> list[str]:
    """The ranked candidates, one line each, kept first (with score) then dropped (with reason)."""
    lines = [f"placement ({decision.algorithm}): needs {decision.needed_bytes / GiB:.2f} GiB per device"]
    rank = 0
    for c in decision.candidates:
        where = ",".join(c.devices)
        if c.kept:
            rank += 1
            terms = " ".join(f"{k}={v:.3g}" for k, v in c.terms.items())
            step = f" step~{c.est_step_time_s:.4g}s" if c.est_step_time_s is not None else ""
            lines.append(f"  #{rank} KEPT    {c.model:<18} [{where}] score={c.score:.4g}{step} {terms} :: {'; '.join(c.reasons)}")
        else:
            lines.append(f"     DROPPED {c.model:<18} [{where}] :: {'; '.join(c.reasons)}")
    return lines


def format_profile(profile: ResourceProfile, threshold: float | None = None) -> list[str]:
    """The profile as log lines: the memory breakdown per device (weights, gradients, optimizer state,
    activations, each workspace term), the findings, and the largest batch per device model.

    :param threshold: the spec's memory threshold the largest batches were computed under (shown only).
    """
    b = profile.breakdown
    def size(n: int | None) -> str:
        return "unknown" if n is None else (f"{n / GiB:.3f} GiB" if n >= GiB else f"{n / MiB:.1f} MiB")
    lines = [f"memory per device at batch {profile.batch_size} ({profile.method}, {profile.dtype}"
             + (f", amp {profile.amp}" if profile.amp else "") + (f", optimizer {profile.optimizer}" if profile.optimizer else "")
             + "):"]
    for label, value in (("weights", b.weights_bytes), ("gradients", b.gradients_bytes),
                         ("optimizer state", b.optimizer_state_bytes), ("activations", b.activations_bytes),
                         ("workspace", b.workspace_bytes)):
        lines.append(f"  {label:<18} {size(value):>12}")
        if label == "workspace":
            for term, n in sorted(profile.workspace_terms_bytes.items(), key=lambda kv: -kv[1]):
                lines.append(f"    {term:<20} {size(n):>10}")
    lines.append(f"  {'peak':<18} {size(profile.peak_memory_bytes):>12}"
                 + (f"  (activations {size(profile.activation_bytes_per_sample)} per sample)"
                    if profile.activation_bytes_per_sample else ""))
    for method, n in sorted(profile.estimates_bytes.items()):
        lines.append(f"  tensor peak by {method:<9} {size(n):>12}")
    if profile.findings:
        lines.append(f"findings ({len(profile.findings)}):")
        for f in profile.findings:
            lines.append(f"  {f.severity:<7} [{f.code}]" + (f" line {f.line}" if f.line else "") + f": {f.message}")
    else:
        lines.append("findings: none")
    if profile.max_batch_size_by_device:
        under = f" under memory threshold {threshold:g}" if threshold is not None else ""
        lines.append(f"largest batch per device{under}:")
        for model, n in sorted(profile.max_batch_size_by_device.items(), key=lambda kv: -kv[1]):
            lines.append(f"  {model:<18} {n if n else 'does not fit'}")
    return lines


def step_profile(script: str | None, spec_path: str | None, *, pool: str | None = None, probe: bool | None = None,
                 log: Callable[[str], None] = print, run_key: str | None = None,
                 overrides: dict[str, Any] | None = None,
                 launcher_kwargs_for: Callable[..., dict[str, Any]] | None = None) -> ProfileResult:
    """Step 1: profile and pre-check. Refuses at once when nothing in the pool can ever fit.

    Logs the memory breakdown, the findings and the largest batch per device model (:func:`format_profile`).

    :param run_key: when given, the result is also kept in the run state, so that the record of a
        refused run still holds what the profile found.
    :param overrides: run-time overrides of the spec (:data:`OVERRIDES`, e.g. ``{"launcher": "docker"}``);
        the later steps read the spec through :func:`run_spec` with them applied.
    :param launcher_kwargs_for: ``(launcher type) -> connection keyword arguments`` (the operator's Airflow
        connections), for a dry run in the launcher's image.
    :returns: the :class:`ProfileResult`.
    :raises SpecError, ProfileError, NoFitError: with the message to show.
    """
    if run_key:  # the first step: what the folder holds of a training is an earlier attempt's (a clear and re-run)
        begin_attempt(run_key, log)
    checked = check_overrides(overrides)
    catalog = load_catalog()
    launcher_type = checked.get("launcher") or load_inputs(script, spec_path)[0].launcher.type
    engine = launcher_kwargs_for(launcher_type) if launcher_kwargs_for and launcher_type != "local" else None
    spec, profile = profile_run(script, spec_path, probe=probe, catalog=catalog, launcher_type=checked.get("launcher"),
                                engine=engine)
    for name, value in checked.items():
        section, key, _ = OVERRIDES[name]
        log(f"override: {section}.{key} = {value} (the spec says {getattr(getattr(spec, section), key)})")
    spec = apply_overrides(spec, checked)
    n_params = f"{profile.params:,}" if profile.params is not None else "an unknown number of"
    flops = f"{profile.flops_per_step:.3g}" if profile.flops_per_step is not None else "unknown"
    log(f"profile ({profile.method}): {n_params} params, peak {profile.peak_memory_bytes / GiB:.3f} GiB per device, "
        f"{flops} FLOPs/step, batch {profile.batch_size}, {profile.num_gpus} device(s)")
    for line in format_profile(profile, spec.resource_policy.memory_threshold):
        log(line)
    log(f"profile ran in: {profile.dry_run_in or 'not-run'} ({profile_venue_line(profile)})")
    inventory = read_inventory(pool, catalog=catalog)
    out = ProfileResult(profile=profile, script=profile.script, spec_path=spec.source_path,
                        pool_source=inventory.source, declared_pool=inventory.declared, overrides=checked,
                        profiled_in=profile.dry_run_in or "not-run")
    if run_key:
        RunState().put(run_key, RunState.PROFILE, out)
        (state_dir(run_key) / "profile.json").write_text(out.model_dump_json())  # this machine's timeline reads it
    decision = plan(profile, spec, inventory=inventory, catalog=catalog, leased=frozenset())
    if not decision.fits:
        raise no_fit_error(profile, decision, inventory, spec.resource_policy.memory_threshold)
    return out


def profile_venue_line(profile: ResourceProfile) -> str:
    """Where the script ran for the estimate, in words: this worker's sandbox, a container or pod of the launcher's
    image, or nowhere (the conservative bound) with why."""
    words = {"worker": "this worker's bubblewrap sandbox", "docker": "a container of the launcher's image",
             "kubernetes": "a pod of the launcher's image"}
    if profile.dry_run_in:
        return words[profile.dry_run_in]
    why = [r for r in (profile.method_reason or "").split("; ") if r.startswith(("the script was not run",
                                                                                 "dry run not usable"))]
    return "the estimate is the conservative bound" + (f": {why[0]}" if why else "")


def fits_ever(profile: ResourceProfile, spec: TaskSpec, inventory: Inventory) -> Callable[[Device], bool]:
    """Whether a device could ever hold the run, busy or not: an allowed vendor, the need
    (:func:`autodl.policy.need.needed_bytes`: the peak, or the largest device when the model's size is unknown)
    within the threshold."""
    from autodl.policy import DEFAULT_ALLOWED_VENDORS
    from autodl.policy.need import needed_bytes

    policy = spec.resource_policy
    allowed = set(policy.allowed_vendors) if policy.allowed_vendors is not None else set(DEFAULT_ALLOWED_VENDORS)
    need = needed_bytes(profile, inventory.devices, allowed, policy.memory_threshold)
    return lambda d: d.vendor in allowed and need <= policy.memory_threshold * d.memory_total_bytes
