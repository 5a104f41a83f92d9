"""The six steps as plain functions over JSON-ready values; the Airflow operators are thin calls into these.

profile -> wait for the pool -> select (place + lease) -> launch -> collect metrics -> release and record.

Each step is safe to retry: select returns the run's existing lease, launch reattaches to a running
attempt, release is idempotent. Per-run state that must outlive a failed task (metrics of a failed
training, the reason a step failed) is kept in ``$AUTODL_HOME/runs/<run key>/``.
"""

from __future__ import annotations

import json
import typing
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from autodl.catalog import Catalog, load_catalog
from autodl.config import autodl_home
from autodl.errors import AutoDLError, LaunchError, LeaseError, NoFitError, ProfileError, SpecError
from autodl.hosts import booked_host, require_here
from autodl.inventory import read_inventory
from autodl.launch import LaunchRequest, get_launcher
from autodl.launch.local import run_folder
from autodl.ledger import Ledger
from autodl.profile import BATCH_SIZE_ENV  # the spec's per-device batch, passed to the training
from autodl.records import RecordStore
from autodl.spec import LauncherSection, SchedulerSection, TaskSpec, load_spec, output_dir_path
from autodl.types import (
    Device,
    Inventory,
    LaunchHandle,
    PlacementDecision,
    ResourceProfile,
    RunMetrics,
    RunRecord,
)

GiB = 1 << 30
MiB = 1 << 20
OUTPUT_DIR_ENV = "AUTODL_OUTPUT_DIR"
"""Where the training keeps checkpoints across runs (the spec's ``task.output_dir``, see
:func:`autodl.spec.output_dir_path`); a nightly job resumes from what the last night left there."""
REPORT_FILE_ENV = "AUTODL_REPORT_FILE"
"""A JSON file the training may write about itself (checkpoint resumed from, epoch, accuracy); the run
record keeps it as ``report``."""
DEFAULT_SHM_BYTES = 8 * GiB
"""/dev/shm given to a run whose DataLoader uses worker processes: 8 GiB, the design card's
``docker run --shm-size=8g`` (Docker's own default of 64 MiB makes Paddle's DataLoader workers fail
with 'bus error' / 'DataLoader worker exited unexpectedly')."""


@dataclass(frozen=True)
class RunContext:
    """Who is running a step: the run key (idempotency key) and the Airflow identity for labels."""

    run_key: str
    dag_id: str | None = None
    run_id: str | None = None
    task_id: str | None = None
    try_number: int | None = None
    extra_labels: dict[str, str] = field(default_factory=dict)

    def labels(self, lease_id: str | None = None) -> dict[str, str]:
        out = {"autodl.run_key": self.run_key}
        for key, value in (("dag_id", self.dag_id), ("run_id", self.run_id), ("task_id", self.task_id),
                           ("try_number", self.try_number), ("lease_id", lease_id)):
            if value is not None:
                out[key] = str(value)
        out.update(self.extra_labels)
        return out


def make_run_key(dag_id: str, group_id: str, run_id: str) -> str:
    """The run key of one AutoDLTrainOperator group in one DAG run: ``dag_id.group_id.run_id``."""
    return f"{dag_id}.{group_id}.{run_id}"


def state_dir(run_key: str) -> Path:
    """Per-run state folder (shared with the local launcher's run folder): named by a hash of the full run key
    and holding that key, so two runs never share one (see :func:`autodl.launch.local.run_folder`).

    :raises LaunchError: when the folder records another run key.
    """
    return run_folder(autodl_home() / "runs", run_key)


def note_failure(run_key: str, step: str, message: str) -> None:
    """Remember why ``step`` failed so that the release-and-record step can record it."""
    path = state_dir(run_key) / "failure.json"
    data = json.loads(path.read_text()) if path.exists() else {}
    data[step] = message
    path.write_text(json.dumps(data, indent=2))


def read_failures(run_key: str) -> dict[str, str]:
    path = state_dir(run_key) / "failure.json"
    return json.loads(path.read_text()) if path.exists() else {}


# ------------------------------------------------------------------------------------ overrides
OVERRIDES: dict[str, tuple[str, str, tuple[str, ...]]] = {
    "launcher": ("launcher", "type", typing.get_args(LauncherSection.model_fields["type"].annotation)),
    "policy": ("scheduler", "algorithm", typing.get_args(SchedulerSection.model_fields["algorithm"].annotation)),
}
"""Run-time overrides of the spec (e.g. from a DAG's Params): name -> (spec section, field, allowed values).
The allowed values are the spec's own (``launcher.type``, ``scheduler.algorithm``)."""

KEEP_SPEC = ("", "spec", "None", None)
"""Override values that mean "as the spec says"."""


def check_overrides(overrides: dict[str, Any] | None) -> dict[str, str]:
    """The overrides that change something, validated.

    :param overrides: name -> value; ``"spec"``, ``""`` or None mean "as the spec says" and are dropped.
    :raises SpecError: for an unknown name or value, naming the known ones.
    """
    out: dict[str, str] = {}
    for name, value in (overrides or {}).items():
        if name not in OVERRIDES:
            raise SpecError(f"unknown override {name!r}; known: {', '.join(OVERRIDES)}.")
        if value in KEEP_SPEC:
            continue
        allowed = OVERRIDES[name][2]
        if value not in allowed:
            section, key, _ = OVERRIDES[name]
            raise SpecError(f"{name}: {value!r} is not a {section}.{key}; use 'spec' (as the spec says) or one of: "
                            f"{', '.join(allowed)}.")
        out[name] = str(value)
    return out


def apply_overrides(spec: TaskSpec, overrides: dict[str, str] | None) -> TaskSpec:
    """``spec`` with the (already checked) overrides applied."""
    for name, value in (overrides or {}).items():
        section, key, _ = OVERRIDES[name]
        part = getattr(spec, section)
        spec = spec.model_copy(update={section: part.model_copy(update={key: value})})
    return spec


def run_spec(profile_out: dict[str, Any]) -> TaskSpec:
    """The spec a run goes by after its profile step: the spec file with the run's overrides applied."""
    spec = load_spec(profile_out["spec_path"]) if profile_out.get("spec_path") else TaskSpec()
    return apply_overrides(spec, profile_out.get("overrides"))


def keep_decision(run_key: str, decision: PlacementDecision) -> None:
    """Keep the placement decision a booking was made on (every candidate, kept or dropped, with its
    reasons) in the run's state folder; the run record takes it as ``decision``."""
    (state_dir(run_key) / "decision.json").write_text(decision.model_dump_json())


# --------------------------------------------------------------------------------------- inputs
def load_inputs(script: str | Path | None, spec_path: str | Path | None) -> tuple[TaskSpec, Path]:
    """The validated spec (defaults when ``spec_path`` is None) and the resolved script path.

    :raises SpecError: invalid spec, or no script given / script missing.
    """
    spec = load_spec(spec_path) if spec_path else TaskSpec()
    return spec, spec.script_path(script if script else None)


def _profile_fn():
    from autodl.profile import profile_script

    return profile_script


def _place_fn():
    from autodl.policy import place

    return place


def check_spec_against_catalog(spec: TaskSpec, catalog: Catalog) -> None:
    """Device models and vendors the spec names must exist; a typo would otherwise be ignored silently.

    :raises SpecError: naming the field, the unknown name and the known ones.
    """
    where = spec.source_path or "<spec>"
    for i, name in enumerate(spec.resource_policy.preferred_devices):
        if catalog.find(name) is None:
            raise SpecError(f"{where}: resource_policy.preferred_devices[{i}]: {name!r} is not in the GPU catalog; "
                            f"use one of: {', '.join(sorted(catalog.models))}.")
    for i, vendor in enumerate(spec.resource_policy.allowed_vendors or []):
        if vendor not in catalog.vendors:
            raise SpecError(f"{where}: resource_policy.allowed_vendors[{i}]: unknown vendor {vendor!r}; "
                            f"use one of: {', '.join(sorted(catalog.vendors))}.")


def profile_run(script: str | Path | None, spec_path: str | Path | None, *, probe: bool | None = None,
                catalog: Catalog | None = None) -> tuple[TaskSpec, ResourceProfile]:
    """Profile the script (static analysis, optional sandboxed probe); never runs it here.

    :raises SpecError: bad spec or script path.
    :raises ProfileError: syntax error in the script, or error findings (e.g. a shape mismatch).
    """
    spec, script_path = load_inputs(script, spec_path)
    catalog = catalog or load_catalog()
    check_spec_against_catalog(spec, catalog)
    profile = _profile_fn()(script_path, spec, catalog=catalog, probe=probe)
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
    if not inventory.devices:
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


# ----------------------------------------------------------------------------------- the steps
def step_profile(script: str | None, spec_path: str | None, *, pool: str | None = None, probe: bool | None = None,
                 log: Callable[[str], None] = print, run_key: str | None = None,
                 overrides: dict[str, Any] | None = None) -> dict[str, Any]:
    """Step 1: profile and pre-check. Refuses at once when nothing in the pool can ever fit.

    Logs the memory breakdown, the findings and the largest batch per device model (:func:`format_profile`).

    :param run_key: when given, the result is also kept in the run's state folder, so that the record
        of a refused run still holds what the profile found.
    :param overrides: run-time overrides of the spec (:data:`OVERRIDES`, e.g. ``{"launcher": "docker"}``);
        the later steps read the spec through :func:`run_spec` with them applied.
    :returns: ``{"profile", "script", "spec_path", "pool_source", "declared_pool", "overrides"}``.
    :raises SpecError, ProfileError, NoFitError: with the message to show.
    """
    checked = check_overrides(overrides)
    catalog = load_catalog()
    spec, profile = profile_run(script, spec_path, probe=probe, catalog=catalog)
    for name, value in checked.items():
        section, key, _ = OVERRIDES[name]
        log(f"override: {section}.{key} = {value} (the spec says {getattr(getattr(spec, section), key)})")
    spec = apply_overrides(spec, checked)
    log(f"profile ({profile.method}): {profile.params:,} params, peak {profile.peak_memory_bytes / GiB:.3f} GiB per device, "
        f"{profile.flops_per_step:.3g} FLOPs/step, batch {profile.batch_size}, {profile.num_gpus} device(s)")
    for line in format_profile(profile, spec.resource_policy.memory_threshold):
        log(line)
    inventory = read_inventory(pool, catalog=catalog)
    out = {
        "profile": profile.to_json(),
        "script": profile.script,
        "spec_path": spec.source_path,
        "pool_source": inventory.source,
        "declared_pool": inventory.declared,
        "overrides": checked,
    }
    if run_key:
        (state_dir(run_key) / "profile.json").write_text(json.dumps(out))
    decision = plan(profile, spec, inventory=inventory, catalog=catalog, leased=frozenset())
    if not decision.fits:
        raise no_fit_error(profile, decision, inventory, spec.resource_policy.memory_threshold)
    return out


def step_wait(profile_out: dict[str, Any], *, pool: str | None = None, log: Callable[[str], None] = print) -> bool:
    """Step 2 (one poke): True when a fitting device set is free now.

    :raises NoFitError: when nothing in the pool could ever fit (no point waiting).
    """
    spec = run_spec(profile_out)
    profile = ResourceProfile.model_validate(profile_out["profile"])
    catalog = load_catalog()
    inventory = read_inventory(pool, catalog=catalog)
    decision = plan(profile, spec, inventory=inventory, catalog=catalog)
    if not decision.fits:
        raise no_fit_error(profile, decision, inventory, spec.resource_policy.memory_threshold)
    if not decision.available:
        log("no fitting device is free yet:")
        for line in format_candidates(decision):
            log(line)
    return decision.available


def step_select(ctx: RunContext, profile_out: dict[str, Any], *, pool: str | None = None,
                log: Callable[[str], None] = print, attempts: int = 5) -> dict[str, Any]:
    """Step 3: place and book a lease atomically; log the ranked candidates.

    Retried internally when another run books the chosen devices first.

    :returns: ``{"lease", "placement", "devices", "declared_pool", "algorithm"}`` (devices are full
        :class:`Device` dicts for the launcher).
    :raises NoFitError: nothing in the pool can ever fit.
    :raises LeaseError: fitting devices exist but none is free (the task retries).
    """
    spec = run_spec(profile_out)
    profile = ResourceProfile.model_validate(profile_out["profile"])
    catalog = load_catalog()
    ledger = Ledger()
    existing = ledger.get(ctx.run_key)
    for _ in range(attempts):
        inventory = read_inventory(pool, catalog=catalog)
        if existing is not None:
            by_id = {d.device_id: d for d in inventory.devices}
            devices = [by_id[i] for i in existing.device_ids if i in by_id]
            log(f"run {ctx.run_key} already holds lease {existing.lease_id} on {existing.device_ids}; reusing it")
            return _selection(existing, devices, inventory, spec.scheduler.algorithm, None)
        decision = plan(profile, spec, inventory=inventory, catalog=catalog, leased=ledger.leased_device_ids())
        for line in format_candidates(decision):
            log(line)
        keep_decision(ctx.run_key, decision)
        if not decision.fits:
            raise no_fit_error(profile, decision, inventory, spec.resource_policy.memory_threshold)
        if decision.chosen is None:
            raise LeaseError(f"run {ctx.run_key}: every fitting device is busy now; the task will retry.")
        chosen = decision.chosen
        try:
            lease = ledger.book(ctx.run_key, chosen.devices, host=chosen.host, model=chosen.model)
        except LeaseError as exc:
            log(f"lost a race for {chosen.devices}: {exc}; placing again")
            continue
        by_id = {d.device_id: d for d in inventory.devices}
        devices = [by_id[i] for i in lease.device_ids]
        if inventory.declared:
            log("the pool is DECLARED (no driver answered): the booking is bookkeeping only and the training runs on CPU")
        log(f"booked lease {lease.lease_id}: {chosen.model} {lease.device_ids}")
        return _selection(lease, devices, inventory, decision.algorithm, chosen.to_json())
    raise LeaseError(f"run {ctx.run_key}: lost the race for free devices {attempts} times; the task will retry.")


def _selection(lease, devices: list[Device], inventory: Inventory, algorithm: str, chosen: dict | None) -> dict[str, Any]:
    return {
        "lease": lease.to_json(),
        "placement": chosen or {"devices": lease.device_ids, "model": lease.model, "host": lease.host},
        "devices": [d.to_json() for d in devices],
        "declared_pool": inventory.declared,
        "pool_source": inventory.source,
        "algorithm": algorithm,
    }


def build_request(ctx: RunContext, profile_out: dict[str, Any], selection: dict[str, Any]) -> tuple[TaskSpec, LaunchRequest]:
    """The launch request for the booked devices (CPU when the pool is declared)."""
    spec = run_spec(profile_out)
    profile = ResourceProfile.model_validate(profile_out["profile"])
    catalog = load_catalog()
    devices = [Device.model_validate(d) for d in selection["devices"]]
    vendor = catalog.vendor(devices[0].vendor if devices else "nvidia")
    lease_id = selection["lease"]["lease_id"]
    options = spec.launcher.model_dump(exclude={"type"})
    env = {}
    if spec.task.batch_size_per_gpu:
        # the batch the estimate was made for; scripts that read it train with what was planned
        env[BATCH_SIZE_ENV] = str(spec.task.batch_size_per_gpu)
    output_dir = output_dir_path(spec, profile_out["script"], autodl_home())
    output_dir.mkdir(parents=True, exist_ok=True)
    env[OUTPUT_DIR_ENV] = str(output_dir)
    env[REPORT_FILE_ENV] = str(state_dir(ctx.run_key) / "report.json")
    request = LaunchRequest(
        run_key=ctx.run_key,
        script=profile_out["script"],
        args=list(spec.task.args),
        env=env,
        devices=devices,
        vendor=vendor,
        on_cpu=bool(selection.get("declared_pool")),
        distributed=profile.num_gpus > 1 and len(devices) > 1,
        shm_bytes=DEFAULT_SHM_BYTES if profile.num_workers > 0 else None,
        labels=ctx.labels(lease_id),
        options=options,
        log_dir=str(state_dir(ctx.run_key)),
    )
    return spec, request


def step_launch(ctx: RunContext, profile_out: dict[str, Any], selection: dict[str, Any], *,
                launcher_kwargs: dict[str, Any] | None = None, log: Callable[[str], None] = print) -> dict[str, Any]:
    """Step 4: start the training detached (or reattach to the attempt still running).

    :returns: the :class:`LaunchHandle` as a dict.
    :raises LaunchError: the launcher could not start it.
    """
    spec, request = build_request(ctx, profile_out, selection)
    launcher = get_launcher(spec.launcher.type, **(launcher_kwargs or {}))
    host = booked_host(d.host for d in request.devices)
    if launcher.name == "local" and not request.on_cpu:  # declared devices: the CPU run goes where this step runs
        require_here(host, "start the training", ctx.run_key)
    rendered = launcher.render(request)
    if rendered.get("shell"):
        log(f"launch ({launcher.name}): {rendered['shell']}")
    if request.on_cpu:
        log("devices are declared, not real: the training runs on CPU (visible devices hidden)"
            + (f"; as ONE process: the {len(request.devices)}-device data-parallel launch (paddle.distributed.launch, "
               "one rank per device) is not exercised here" if len(request.devices) > 1 else ""))
    else:  # whose memory is whose on the booked devices: the processes there before the run are someone else's
        from autodl.metrics import write_baseline

        write_baseline(state_dir(ctx.run_key), [d.uuid for d in request.devices if d.uuid])
    handle = launcher.launch(request).model_copy(update={"host": host})
    log(("reattached to" if handle.reattached else "started") + f" {ctx.run_key}: pid={handle.pid} "
        f"container={handle.container_name} pod={handle.pod_name} log={handle.log_path}")
    (state_dir(ctx.run_key) / "handle-latest.json").write_text(json.dumps(handle.to_json()))
    return handle.to_json()


def step_collect(ctx: RunContext, handle_json: dict[str, Any], *, launcher_type: str = "local",
                 launcher_kwargs: dict[str, Any] | None = None, log: Callable[[str], None] = print,
                 interval_s: float = 1.0) -> dict[str, Any]:
    """Step 5: follow the training to its end, streaming its log and sampling metrics.

    :returns: the :class:`RunMetrics` summary as a dict (also kept in the run's state folder).
    :raises LaunchError: when the training exits non-zero (the metrics are kept all the same).
    """
    from autodl.metrics import finish, follow, make_sampler

    handle = LaunchHandle.model_validate(handle_json)
    launcher = get_launcher(handle.launcher or launcher_type, **(launcher_kwargs or {}))
    if launcher.name == "local":
        require_here(None if handle.on_cpu else handle.host, "follow the training", ctx.run_key)
    folder = state_dir(ctx.run_key)
    uuids = [d for d in handle.device_ids if d.startswith(("GPU-", "MIG-"))]
    def keep(m: RunMetrics) -> None:
        (folder / "metrics.json").write_text(json.dumps(m.to_json(), indent=2))

    notes: list[str] = []
    sampler = make_sampler(handle, uuids, folder=folder, notes=notes)
    metrics = follow(launcher, handle, sampler=sampler, log_sink=lambda line: log(f"[train] {line}"),
                     interval_s=interval_s, samples_path=folder / "samples.jsonl", partial_sink=keep, notes=notes)
    metrics = finish(metrics, handle, folder, log=log)  # OOM explanation, timeline PNG
    keep(metrics)
    peak = ("unknown" if metrics.peak_memory_bytes is None
            else f"{metrics.peak_memory_bytes / GiB:.3f} GiB ({metrics.peak_source})")
    log(f"training ended: exit code {metrics.exit_code}, {metrics.duration_s:.1f} s, own peak memory {peak}, "
        f"{metrics.samples} {metrics.source} samples"
        + (f", {metrics.steps} steps at {metrics.step_time_s:.4g} s/step" if metrics.steps and metrics.step_time_s else ""))
    if metrics.exit_code != 0:
        why = f" ({metrics.oom['explanation']})" if metrics.oom else ""
        raise LaunchError(f"training {ctx.run_key} failed with exit code {metrics.exit_code}{why}; its log: {handle.log_path}")
    return metrics.to_json()


def stop_training(handle_json: dict[str, Any], *, launcher_kwargs: dict[str, Any] | None = None,
                  log: Callable[[str], None] = print, why: str = "stopping it") -> bool:
    """Stop the training behind ``handle_json`` if it still runs. Never raises for a launcher error.

    :returns: True when a running training was stopped.
    """
    handle = LaunchHandle.model_validate(handle_json)
    try:
        launcher = get_launcher(handle.launcher, **(launcher_kwargs or {}))
        if launcher.name == "local":
            require_here(None if handle.on_cpu else handle.host, "stop the training", handle.run_key)
        if launcher.poll(handle) is None:
            log(f"training {handle.run_key} {why}")
            launcher.stop(handle)
            return True
    except AutoDLError as exc:
        log(f"could not stop the training {handle.run_key}: {exc}")
    return False


def exit_status(handle_json: dict[str, Any], *, launcher_kwargs: dict[str, Any] | None = None) -> int | None:
    """The training's exit code as its launcher reports it, or None while it runs or when it cannot be read."""
    handle = LaunchHandle.model_validate(handle_json)
    try:
        return get_launcher(handle.launcher, **(launcher_kwargs or {})).poll(handle)
    except AutoDLError:
        return None


def release_by_hand(run_key: str, *, log: Callable[[str], None] = print) -> dict[str, Any]:
    """Free a lease left behind by a run whose Airflow process died: stop its training, release, record.

    :raises LeaseError: when ``run_key`` holds no lease.
    """
    if Ledger().get(run_key) is None:
        raise LeaseError(f"run key {run_key!r} holds no lease; `autodl leases` lists the live ones.")
    note_failure(run_key, "release", "released by hand (autodl leases --release) after its Airflow run was lost")
    return step_release_and_record(RunContext(run_key=run_key), script=None, spec_path=None, profile_out=None,
                                   selection=None, handle_json=None, metrics_json=None, log=log, force_release=True)


def _read_json_object(path: Path, what: str, log: Callable[[str], None]) -> dict[str, Any] | None:
    """A JSON object from ``path``; None when absent, or (said in the log) when it is not a JSON object."""
    if not path.exists():
        return None
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        log(f"{what} in {path} could not be read ({exc}); the record goes without it")
        return None
    if not isinstance(data, dict):
        log(f"{what} in {path} is not a JSON object; the record goes without it")
        return None
    return data


def step_release_and_record(ctx: RunContext, *, script: str | None, spec_path: str | None,
                            profile_out: dict[str, Any] | None, selection: dict[str, Any] | None,
                            handle_json: dict[str, Any] | None, metrics_json: dict[str, Any] | None,
                            launcher_kwargs: dict[str, Any] | None = None,
                            log: Callable[[str], None] = print, force_release: bool = False) -> dict[str, Any]:
    """Step 6: stop a training still running, free the lease (idempotent), write the run record.

    Runs whatever happened upstream; any input may be None. Where NVML is present, the lease is freed
    only once the booked devices hold none of the run's processes (``force_release``: free it anyway).

    :returns: ``{"run_key", "outcome", "record_url", "lease_released"}``.
    """
    folder = state_dir(ctx.run_key)
    if handle_json is None and (folder / "handle-latest.json").exists():
        handle_json = json.loads((folder / "handle-latest.json").read_text())
    if handle_json and handle_json.get("run_key") not in (None, ctx.run_key):
        log(f"ignoring a launch handle of another run ({str(handle_json.get('run_key'))[:200]!r}) found for "
            f"{ctx.run_key}: its training is not this run's to stop")
        handle_json = None
    if metrics_json is None and (folder / "metrics.json").exists():
        metrics_json = json.loads((folder / "metrics.json").read_text())
    if profile_out is None and (folder / "profile.json").exists():
        profile_out = json.loads((folder / "profile.json").read_text())
    report = _read_json_object(folder / "report.json", "the training's report (AUTODL_REPORT_FILE)", log)
    decision = _read_json_object(folder / "decision.json", "the placement decision", log)
    handle = LaunchHandle.model_validate(handle_json) if handle_json else None
    clear = True
    launcher_exit = None
    if handle is not None:
        stop_training(handle_json, launcher_kwargs=launcher_kwargs, log=log,
                      why="still running after collect ended: stopping it before releasing its devices")
        launcher_exit = exit_status(handle_json, launcher_kwargs=launcher_kwargs)
        if not handle.on_cpu:  # where NVML is present: the devices hold none of the run's processes any more
            from autodl.metrics import wait_devices_clear

            clear = wait_devices_clear([d for d in handle.device_ids if d.startswith(("GPU-", "MIG-"))], folder, log=log)
    if clear or force_release:
        released = Ledger().release(ctx.run_key)
        log(f"lease {'released: ' + released.lease_id if released else 'none held'} for {ctx.run_key}")
    else:
        released = None
        note_failure(ctx.run_key, "release", "lease kept: the run's processes still hold its devices after the stop; "
                                             f"free it with `autodl leases --release {ctx.run_key}` once they are gone")
        log(f"lease of {ctx.run_key} KEPT: its devices are not empty")

    failures = read_failures(ctx.run_key)
    exit_code = metrics_json.get("exit_code") if metrics_json else None
    if exit_code is None and launcher_exit is not None:
        # collect never saw the end (its Airflow process was lost): the launcher's exit status is the outcome
        exit_code = launcher_exit
        metrics_json = {**(metrics_json or {}), "exit_code": launcher_exit}
        log(f"training {ctx.run_key} exit status from the launcher: {launcher_exit}")
    if handle is None:
        outcome = "not_started"
    elif exit_code == 0:
        outcome = "succeeded"
    else:
        outcome = "failed"
    profile = profile_out.get("profile") if profile_out else None
    placement = selection.get("placement") if selection else None
    declared = bool(selection.get("declared_pool")) if selection else bool(profile_out and profile_out.get("declared_pool"))
    error = "; ".join(f"{k}: {v}" for k, v in failures.items()) or None
    oom = (metrics_json or {}).get("oom")
    if outcome == "failed" and oom:
        error = "; ".join(filter(None, [error, f"out of memory: {oom.get('explanation')}"]))
    if outcome == "failed" and not error and exit_code is not None:
        error = f"training failed with exit code {exit_code}"
    record = RunRecord(
        run_key=ctx.run_key, dag_id=ctx.dag_id, run_id=ctx.run_id,
        script=(profile_out or {}).get("script") or str(script or ""),
        spec_path=(profile_out or {}).get("spec_path") or (str(spec_path) if spec_path else None),
        outcome=outcome, declared_pool=declared, profile=profile, placement=placement,
        lease_id=(selection or {}).get("lease", {}).get("lease_id") or (released.lease_id if released else None),
        launch=handle.to_json() if handle else None, metrics=metrics_json,
        estimated_peak_bytes=profile.get("peak_memory_bytes") if profile else None,
        actual_peak_bytes=metrics_json.get("peak_memory_bytes") if metrics_json else None,
        allocated_peak_bytes=(metrics_json or {}).get("allocated_peak_bytes"),
        reserved_peak_bytes=(metrics_json or {}).get("reserved_peak_bytes"), oom=oom,
        device_model=(placement or {}).get("model"), error=error, report=report, decision=decision,
    )
    store = RecordStore()
    first_time = store.get(ctx.run_key) is None
    store.write(record)
    if first_time:  # a retried release must not teach the policy the same run twice
        try:
            from autodl.policy import observe

            observe(record, catalog=load_catalog())
        except Exception as exc:  # noqa: BLE001 - learning must never lose the record or keep the lease
            log(f"the learning policy could not learn from this run: {exc}")
    from autodl.config import store_url
    from autodl.store import redact_url

    log(f"run record written: {ctx.run_key} outcome={outcome} store={redact_url(store_url())}")
    return {"run_key": ctx.run_key, "outcome": outcome, "record_store": redact_url(store_url()),
            "lease_released": bool(released), "declared_pool": declared}
