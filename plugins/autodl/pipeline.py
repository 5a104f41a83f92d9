"""The six steps as plain functions over JSON-ready values; the Airflow operators are thin calls into these.

profile -> wait for the pool -> select (place + lease) -> launch -> collect metrics -> release and record.

Each step is safe to retry: select returns the run's existing lease, launch reattaches to a running
attempt, release is idempotent. Per-run state that must outlive a failed task (metrics of a failed
training, the reason a step failed, the placement decision, the training's report) is kept in autodl's
store (:class:`autodl.store.RunState`), written by the step that learns it and read by the later ones on
any host; ``$AUTODL_HOME/runs/<run key>/`` holds only what stays on the machine that wrote it (the
training's log, samples, the timeline).
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import time
import typing
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from datetime import datetime
from pathlib import Path
from typing import Any

from autodl.catalog import Catalog, load_catalog
from autodl.config import autodl_home
from autodl.errors import (
    AutoDLError,
    ConfigError,
    LeaseError,
    LeaseLost,
    NoFitError,
    NotOwner,
    PoolBusy,
    ProfileError,
    SpecError,
    StoreUnavailable,
    TrainingFailed,
    WaitTimeout,
)
from autodl.fields import MAX_RUN_KEY_CHARS
from autodl.hosts import booked_host, require_here, this_host
from autodl.inventory import read_inventory
from autodl.launch import LaunchRequest, get_launcher
from autodl.launch.base import host_requests
from autodl.launch.local import run_folder
from autodl.ledger import Ledger
from autodl.profile import BATCH_SIZE_ENV  # the spec's per-device batch, passed to the training
from autodl.records import RecordStore
from autodl.redact import read_report, sanitize_report
from autodl.spec import LauncherSection, SchedulerSection, TaskSpec, load_spec, output_dir_path
from autodl.store import RunState
from autodl.types import (
    Device,
    Inventory,
    LaunchHandle,
    Lease,
    LeaseOwner,
    PlacementDecision,
    ProfileResult,
    QueueEntry,
    ResourceProfile,
    RunMetrics,
    RunRecord,
    Selection,
    StopMark,
    StopStatus,
    utcnow,
)
from autodl.untrusted import atomic_write_text, read_json_object

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
    user: str | None = None
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
    """The run key of one AutoDLTrainOperator group in one DAG run: ``dag_id.group_id.run_id``.

    A key longer than the store's column (:data:`autodl.fields.MAX_RUN_KEY_CHARS`; Airflow allows ids
    up to 750 characters together) keeps its head and ends in ``~`` and 16 hex digits of its SHA-256, so
    it stays unique and the same in every step.
    """
    key = f"{dag_id}.{group_id}.{run_id}"
    if len(key) <= MAX_RUN_KEY_CHARS:
        return key
    digest = hashlib.sha256(key.encode("utf-8", "surrogatepass")).hexdigest()[:16]
    return f"{key[:MAX_RUN_KEY_CHARS - 17]}~{digest}"


def state_dir(run_key: str) -> Path:
    """Per-run state folder (shared with the local launcher's run folder): named by a hash of the full run key
    and holding that key, so two runs never share one (see :func:`autodl.launch.local.run_folder`).

    :raises LaunchError: when the folder records another run key.
    """
    return run_folder(autodl_home() / "runs", run_key)


def note_failure(run_key: str, step: str, message: str) -> None:
    """Remember why ``step`` failed (in the run state, whichever host the step ran on) so that the
    release-and-record step can record it."""
    RunState().note_failure(run_key, step, message)


ATTEMPT_FILES = ("failure.json", "metrics.json", "samples.jsonl", "timeline.png", "collect.taken-over")
"""What a run's state folder holds of one training: a new training (a clear and re-run in Airflow) starts
without them (:func:`begin_attempt`)."""


def begin_attempt(run_key: str, log: Callable[[str], None] = print) -> Path | None:
    """A new training of ``run_key`` was just started: move the earlier attempt's failures, metrics and samples to
    ``earlier-<n>/`` in the state folder (the record of that attempt is pointed there), so this attempt's error,
    duration and timeline are its own. Every step before a launch that started a training has succeeded, so the
    failures they noted belong to the earlier attempt.

    :returns: the folder they went to, or None when there was nothing of an earlier attempt.
    """
    folder = state_dir(run_key)
    present = [name for name in ATTEMPT_FILES if (folder / name).exists()]
    facts = RunState().forget_attempt(run_key)   # the earlier training's metrics, report and failures
    if not present:
        if facts:
            log(f"a new training of {run_key}: the earlier attempt's metrics, report and failures were cleared")
        return None
    dest = folder / f"earlier-{1 + len(list(folder.glob('earlier-*')))}"
    dest.mkdir()
    for name in present:
        (folder / name).rename(dest / name)
    if "samples.jsonl" in present:
        RecordStore().set_samples_path(run_key, str(folder / "samples.jsonl"), str(dest / "samples.jsonl"))
    log(f"a new training of {run_key}: the earlier attempt's {', '.join(present)} moved to {dest}")
    return dest


def read_failures(run_key: str) -> dict[str, str]:
    """``{step: why it failed}`` of the run's failed steps, from the run state."""
    return RunState().failures(run_key)


def keep_report(run_key: str, report: dict[str, Any] | None = None, *, log: Callable[[str], None] = print) -> dict[str, Any] | None:
    """Put the training's report (what it said about itself: checkpoint resumed from, epoch) into the run
    state, for the record: ``report`` when a transport brought it (e.g. the training's log stream), else the
    ``AUTODL_REPORT_FILE`` the training wrote on this machine, if it wrote one. Called where the training is
    followed (the booked host), never where the record is written.

    :returns: the report kept, or None when there was none (or it was not a JSON object: said in the log).
    """
    try:  # untrusted: read without following links, bounded, schema-checked, redacted (autodl.redact)
        if report is None:
            found = read_report(state_dir(run_key))
            report = found.data if found is not None else None
        else:
            report = sanitize_report(report).data
    except ValueError as exc:
        log(f"the training's report (AUTODL_REPORT_FILE) could not be used ({exc}); the record goes without it")
        report = None
    if report is not None:
        RunState().put(run_key, RunState.REPORT, report)
    return report


# ------------------------------------------------------------------------------------ pool source
def pool_names() -> dict[str, Path]:
    """The pool files shipped in ``include/pools/`` by name (``demo`` -> ``<include>/pools/demo.yaml``)."""
    from autodl.config import include_dir

    return {p.stem: p for p in sorted((include_dir() / "pools").glob("*.yaml"))}


def resolve_pool_source(value: str | None, *, field: str = "pool", cwd: Path | None = None,
                        strict: bool = True) -> str | None:
    """The pool source a user named, as :func:`autodl.inventory.read_inventory` takes it.

    ``auto``, a source name (``nvml``) and a URL (``prometheus+http://...``) pass unchanged; a pool name
    (``demo``, ``gpu_node_2xa100``: a file of ``include/pools/``) becomes that file; a relative path (the DAG
    Param, where the tasks' working folder means nothing to the user) is looked for under the deployment's
    include folder (:func:`autodl.config.include_dir`) as it is, without a leading ``include/``, and under
    ``pools/`` (``pools/demo.yaml``, ``include/pools/demo.yaml``, ``demo.yaml`` all name the demo pool); an
    absolute path must exist. Empty or None: None (the default source).

    :param field: what the value was given as, for the message (``--pool``, the ``pool`` Param).
    :param cwd: the CLI's folder: a relative path is the user's own file there (a missing one is returned as
        given, for the pool reader to refuse naming where the examples are); only a pool name is looked up.
    :param strict: False: a path found nowhere is returned as given (the pool reader refuses it itself).
    :raises SpecError: (``strict``) when no such pool file exists, naming the field, where it looked and the fix.
    """
    from autodl.config import include_dir
    from autodl.inputs import clip
    from autodl.inventory import SCHEMES, SOURCES

    if value is None or not str(value).strip():
        return None
    text = str(value).strip()
    if text == "auto" or text in SOURCES or "://" in text or text.split("://")[0] in SCHEMES:
        return text
    names = pool_names()
    path = Path(text).expanduser()
    if cwd is not None:  # the CLI: a path is the user's own (relative to where they are), else a pool name
        here = path if path.is_absolute() else cwd / path
        try:
            if here.is_file():
                return str(here)
        except OSError:
            pass
        return str(names[text]) if text in names else text
    if text in names:
        return str(names[text])
    if path.is_absolute():
        candidates = [path]
    else:
        inc = include_dir()
        rel = Path(*path.parts[1:]) if len(path.parts) > 1 and path.parts[0] == "include" else path
        candidates = list(dict.fromkeys([inc / path, inc / rel, inc / "pools" / rel]))
    for candidate in candidates:
        try:
            if candidate.is_file():
                return str(candidate)
        except OSError:  # a name too long, a loop: not a pool file
            continue
    if not strict:
        return text
    looked = ", ".join(clip(str(c), 160) for c in candidates)
    raise SpecError(f"{field} {clip(text, 120)!r}: no such pool file (looked at {looked}). Choose auto, nvml, a pool "
                    f"name ({', '.join(names) or 'none shipped'}), or the path of a pool YAML file, absolute or relative "
                    f"to autodl's include folder {clip(str(include_dir()), 160)} (e.g. pools/demo.yaml).")


# ------------------------------------------------------------------------------------ overrides
OVERRIDES: dict[str, tuple[str, str, tuple[str, ...]]] = {
    "launcher": ("launcher", "type", typing.get_args(LauncherSection.model_fields["type"].annotation)),
    "policy": ("scheduler", "algorithm", typing.get_args(SchedulerSection.model_fields["algorithm"].annotation)),
    "args": ("task", "args", ()),  # a list of strings (templated per run), not one of a set of values
}
"""Run-time overrides of the spec (e.g. from a DAG's Params): name -> (spec section, field, allowed values).
The allowed values are the spec's own (``launcher.type``, ``scheduler.algorithm``)."""

KEEP_SPEC = ("", "spec", "None", None)
"""Override values that mean "as the spec says"."""


def check_overrides(overrides: dict[str, Any] | None) -> dict[str, Any]:
    """The overrides that change something, validated.

    :param overrides: name -> value; ``"spec"``, ``""`` or None mean "as the spec says" and are dropped.
    :raises SpecError: for an unknown name or value, naming the known ones.
    """
    out: dict[str, Any] = {}
    for name, value in (overrides or {}).items():
        if name not in OVERRIDES:
            raise SpecError(f"unknown override {name!r}; known: {', '.join(OVERRIDES)}.")
        if name == "args":
            if value is None:
                continue
            if isinstance(value, str) or not isinstance(value, (list, tuple)) or not all(isinstance(a, str) for a in value):
                raise SpecError(f"args: the script's arguments are a list of strings (each may be templated, e.g. "
                                f"['--data', '{{{{ ti.xcom_pull(task_ids=\"prepare\") }}}}']), got {type(value).__name__}.")
            out[name] = [str(a) for a in value]
            continue
        if value in KEEP_SPEC:
            continue
        allowed = OVERRIDES[name][2]
        if value not in allowed:
            section, key, _ = OVERRIDES[name]
            raise SpecError(f"{name}: {value!r} is not a {section}.{key}; use 'spec' (as the spec says) or one of: "
                            f"{', '.join(allowed)}.")
        out[name] = str(value)
    return out


def apply_overrides(spec: TaskSpec, overrides: dict[str, Any] | None) -> TaskSpec:
    """``spec`` with the (already checked) overrides applied."""
    for name, value in (overrides or {}).items():
        section, key, _ = OVERRIDES[name]
        part = getattr(spec, section)
        spec = spec.model_copy(update={section: part.model_copy(update={key: value})})
    return spec


def run_spec(profile_out: ProfileResult | dict[str, Any]) -> TaskSpec:
    """The spec a run goes by after its profile step: the spec file with the run's overrides applied
    (``{}``: the default spec)."""
    if isinstance(profile_out, ProfileResult):
        spec_path, overrides = profile_out.spec_path, profile_out.overrides
    else:
        spec_path, overrides = profile_out.get("spec_path"), profile_out.get("overrides")
    spec = load_spec(spec_path) if spec_path else TaskSpec()
    return apply_overrides(spec, overrides)


def keep_decision(run_key: str, decision: PlacementDecision) -> None:
    """Keep the placement decision a booking was made on (every candidate, kept or dropped, with its
    reasons) in the run state; the run record takes it as ``decision``."""
    RunState().put(run_key, RunState.DECISION, decision)


# --------------------------------------------------------------------------------------- inputs
def load_inputs(script: str | Path | None, spec_path: str | Path | None) -> tuple[TaskSpec, Path]:
    """The validated spec (defaults when ``spec_path`` is None) and the resolved script path.

    :raises SpecError: invalid spec, or no script given / script missing.
    """
    spec = load_spec(spec_path) if spec_path else TaskSpec()
    return spec, spec.script_path(script if script else None)


def _profile_fn():
    from autodl.profile import profile_script
    from autodl.profile.cache import cached  # the same script, spec, environment and versions: the last profile

    return cached(profile_script)


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
    image, or nowhere (the static bound) with why."""
    words = {"worker": "this worker's bubblewrap sandbox", "docker": "a container of the launcher's image",
             "kubernetes": "a pod of the launcher's image"}
    if profile.dry_run_in:
        return words[profile.dry_run_in]
    why = [r for r in (profile.method_reason or "").split("; ") if r.startswith(("the script was not run",
                                                                                 "dry run not usable"))]
    return "the estimate is the static bound" + (f": {why[0]}" if why else "")


def owner_of(ctx: RunContext, team: str | None = None) -> LeaseOwner:
    """The lease owner for a run: its DAG, its DAG run, the user who triggered it, and its team queue."""
    return LeaseOwner(dag_id=ctx.dag_id, run_id=ctx.run_id, user=ctx.user, team=team)


def recorded_runtime(ctx: RunContext, *, limit: int = 20) -> tuple[float, str | None] | None:
    """(median duration s, device model it ran on) of this run's earlier successful runs (same DAG and task
    group), from the run records; None when there are none."""
    if not ctx.dag_id or not ctx.run_id or not ctx.run_key.endswith(ctx.run_id):
        return None
    family = ctx.run_key[: -len(ctx.run_id)]
    try:
        runs = sorted(
            (float(r.metrics["duration_s"]), r.device_model or "")
            for r in RecordStore().list(dag_id=ctx.dag_id, limit=limit)
            if r.run_key.startswith(family) and r.run_key != ctx.run_key and r.outcome == "succeeded"
            and r.metrics and r.metrics.get("duration_s")
        )
    except AutoDLError:
        return None
    if not runs:
        return None
    duration, model = runs[len(runs) // 2]
    return duration, model or None


def expected_runtime_s(ctx: RunContext, *, limit: int = 20) -> float | None:
    """Median duration (seconds) of this run's earlier successful runs (same DAG and task group), from
    the run records; None when there are none."""
    seen = recorded_runtime(ctx, limit=limit)
    return seen[0] if seen else None


def _fits_ever(profile: ResourceProfile, spec: TaskSpec) -> Callable[[Device], bool]:
    from autodl.policy import DEFAULT_ALLOWED_VENDORS

    policy = spec.resource_policy
    allowed = set(policy.allowed_vendors) if policy.allowed_vendors is not None else set(DEFAULT_ALLOWED_VENDORS)
    need = profile.peak_memory_bytes
    return lambda d: d.vendor in allowed and need <= policy.memory_threshold * d.memory_total_bytes


def step_wait(ctx: RunContext, profile_out: ProfileResult | dict[str, Any], *, pool: str | None = None,
              log: Callable[[str], None] = print, poke_interval_s: float | None = None,
              timeout_s: float | None = None,
              launcher_kwargs_for: Callable[..., dict[str, Any]] | None = None,
              host: str | None = None) -> Selection | None:
    """Step 2, one poll: wait in the admission queue; book the devices when the queue grants them.

    In order: a run that already holds a lease gets it back (a retried or resumed wait); expired leases
    are reaped (:func:`reap_expired`), so their devices are offered again; the run joins (or refreshes)
    its entry in the queue; the queue decides (:func:`autodl.queue.decide`); when it grants this run
    devices they are booked atomically, the run leaves the queue and its selection is returned. A lost
    booking race is not a failure: the run keeps waiting.

    :param poke_interval_s: seconds between polls (default the spec's ``scheduler.poke_interval``); the
        entry stops blocking others after :func:`autodl.queue.stale_after` of it without a poll.
    :param timeout_s: seconds the run may wait from when it first joined (default ``scheduler.timeout``).
    :param launcher_kwargs_for: connection details per launcher type, for stopping what expired leases left.
    :param host: only devices of this host (a launch routed to that host's worker, booking again after its
        booking was re-queued: :func:`requeue_unlaunched`).
    :returns: the selection (as :func:`step_select`) when booked, None while still waiting.
    :raises NoFitError: nothing in the pool could ever hold the run (no point waiting; it leaves the queue).
    :raises WaitTimeout: it waited longer than the timeout (it leaves the queue).
    """
    from autodl.admissions import Admissions
    from autodl.queue import AdmissionQueue, decide, free_devices, held_by_team, packed_grant, queue_rules, running_runs

    profile_out = ProfileResult.coerce(profile_out, what="the profile step's result")
    spec = run_spec(profile_out)
    profile = profile_out.profile
    poke = float(poke_interval_s or spec.scheduler.poke_interval)
    timeout = float(timeout_s or spec.scheduler.timeout)
    catalog = load_catalog()
    ledger = Ledger()
    queue = AdmissionQueue()
    inventory = read_inventory(pool, catalog=catalog)
    if host:
        inventory = inventory.model_copy(update={"devices": [d for d in inventory.devices if d.host == host]})
    held = ledger.get(ctx.run_key)
    if held is not None:
        try:
            held = ledger.heartbeat(ctx.run_key, held.lease_id)
        except LeaseLost as exc:
            log(f"{exc} Waiting for devices again.")
            held = None
        if held is not None:
            queue.leave(ctx.run_key)
            log(f"run {ctx.run_key} already holds lease {held.lease_id} on {held.device_ids}; reusing it")
            return _selection_of(held, inventory, spec.scheduler.algorithm)
    reap_expired(log=log, launcher_kwargs_for=launcher_kwargs_for)

    everywhere = plan(profile, spec, inventory=inventory, catalog=catalog, leased=frozenset())
    if not everywhere.fits:
        queue.leave(ctx.run_key)
        raise no_fit_error(profile, everywhere, inventory, spec.resource_policy.memory_threshold)
    if spec.launcher.type == "kubernetes" and spec.launcher.kueue_queue:
        queue.leave(ctx.run_key)
        return _book_for_kueue(ctx, profile, spec, inventory, ledger, log)
    rules = queue_rules(inventory)
    entry = _join_queue(ctx, queue, profile, spec, inventory, everywhere, catalog, rules, poke=poke, timeout=timeout,
                        pool=pool)
    now = utcnow()
    if entry.deadline_at is not None and now > entry.deadline_at:
        queue.leave(ctx.run_key)
        raise WaitTimeout(f"run {ctx.run_key}: no fitting device became free within {timeout:g} s (scheduler.timeout); "
                          f"it waited since {entry.enqueued_at.isoformat()}.")
    # the entries before the leases: a run that booked and then left the queue in between is then counted
    # twice (waiting and holding: conservative), never not at all (which would let a team over its quota)
    entries = queue.entries()
    leases = ledger.leases()
    leased = frozenset(d for le in leases for d in le.device_ids)
    free = free_devices(inventory, leased)
    decisions: dict[frozenset, PlacementDecision] = {}

    def place_own(free_now: frozenset) -> list[str] | None:
        everything = frozenset(d.device_id for d in inventory.devices)
        decision = plan(profile, spec, inventory=inventory, catalog=catalog, leased=everything - free_now)
        decisions[free_now] = decision
        return decision.chosen.devices if decision.chosen is not None else None

    running = running_runs(leases, now)
    reasons: dict[str, str] = {}
    held_back: set = set()
    grant = decide(entry, entries, free, running, now, place_own, rules, reasons, held_back)
    terms = None
    if spec.resource_policy.sharing == "packed":   # issue 24: beside one packed run when no device is free for it
        grant, terms = packed_grant(grant, entry, profile, spec.resource_policy.memory_threshold, inventory,
                                    ledger.shares, leases, rules, held_back, place_own, log,
                                    model_name=spec.task.model_name or profile.model_name)
    if grant is None:
        _log_waiting(ctx, queue.in_order(now, queues=rules.queues, held=held_by_team(leases)), leases, everywhere, log,
                     reasons.get(ctx.run_key))
        return None
    decision = next((d for d in decisions.values() if d.chosen and tuple(d.chosen.devices) == tuple(grant.devices)), None)
    chosen = decision.chosen if decision else None
    by_id = {d.device_id: d for d in inventory.devices}
    first = by_id[grant.devices[0]]
    try:
        lease = ledger.book(ctx.run_key, list(grant.devices), host=first.host, model=first.model,
                            owner=owner_of(ctx, entry.team), launcher=spec.launcher.type,
                            placement=_placement_of(chosen, (spec.task.model_name or profile.model_name) if terms else None),
                            expected_runtime_s=_runtime_on(entry, first.model), **(terms.booking() if terms else {}))
    except LeaseError as exc:
        log(f"lost a booking race ({exc}); still waiting")
        return None
    queue.leave(ctx.run_key)
    Admissions().record(ctx.run_key, waited_s=(now - entry.enqueued_at).total_seconds(), num_gpus=len(grant.devices),
                        team=entry.team, device_model=first.model, now=now)
    if decision is not None:
        keep_decision(ctx.run_key, decision)
    lines = format_candidates(decision) if decision else []
    for line in lines:
        log(line)
    if inventory.declared:
        log("the pool is DECLARED (no driver answered): the booking is bookkeeping only and the training runs on CPU")
    waited = (now - entry.enqueued_at).total_seconds()
    log(f"booked lease {lease.lease_id}: {lease.model} {lease.device_ids} after waiting {waited:.0f} s "
        f"({grant.reason}); TTL {lease.ttl_s:g} s"
        + (f"; shared, {lease.reserved_bytes} bytes reserved (the launch caps the training's memory there)"
           if lease.sharing == "shared" else ""))
    selection = _selection(lease, [by_id[i] for i in lease.device_ids], inventory,
                           decision.algorithm if decision else spec.scheduler.algorithm,
                           chosen.to_json() if chosen else None, lines)
    RunState().put(ctx.run_key, RunState.SELECTION, selection)
    return selection


def _join_queue(ctx: RunContext, queue: Any, profile: ResourceProfile, spec: TaskSpec, inventory: Inventory,
                everywhere: PlacementDecision, catalog: Catalog, rules: Any, *, poke: float, timeout: float,
                pool: str | None) -> QueueEntry:
    """Join (or refresh) the run's entry in the admission queue: its request, its team
    (:func:`autodl.quota.team_of`) and priority, and, when it first joins, its runtime and speeds per
    device type (:func:`autodl.queue_estimate.estimate_run`).

    :raises ConfigError: ``scheduler.priority`` names a class the team queues do not define.
    """
    from autodl.queue import candidate_groups, stale_after
    from autodl.queue_estimate import estimate_run
    from autodl.quota import team_of

    ranked = [(c.host, c.model) for c in everywhere.candidates if c.kept]
    groups = candidate_groups(inventory, _fits_ever(profile, spec), ranked)
    est = None
    if queue.get(ctx.run_key) is None:   # set once, when the run first joins (see AdmissionQueue.join)
        types = {rules.device_type(g[0]) for g in groups if g} if rules.device_type else set()
        est = estimate_run(profile, types, catalog, recorded=recorded_runtime(ctx),
                           train_steps=spec.scheduler.train_steps)
    return queue.join(
        ctx.run_key, num_gpus=profile.num_gpus, needed_bytes=profile.peak_memory_bytes, candidates=groups,
        stale_after_s=stale_after(poke), vendors=spec.resource_policy.allowed_vendors, dag_id=ctx.dag_id,
        run_id=ctx.run_id, owner_user=ctx.user, pool=pool, timeout_s=timeout,
        team=team_of(spec.scheduler.team, ctx.user), priority=rules.queues.priority(spec.scheduler.priority),
        expected_runtime_s=est.expected_runtime_s if est else None,
        speed_by_type=est.speed_by_type if est else None, runtime_source=est.runtime_source if est else None,
    )


def _placement_of(chosen, packed_model: str | None) -> dict[str, Any] | None:
    """The lease's placement: the chosen candidate; a packed lease also names its run's model (the pair type a run
    that joins it is judged by: :func:`autodl.queue.pair_check`)."""
    from autodl.queue import RUN_MODEL_KEY

    placement = chosen.to_json() if chosen else None
    if packed_model is None:
        return placement
    return {**(placement or {}), RUN_MODEL_KEY: packed_model}


def _runtime_on(entry: QueueEntry, model: str | None) -> float | None:
    """The entry's expected runtime on device ``model`` (its speed there), for the lease's expected end;
    None when unknown (no runtime, or no speed known for that model while speeds are known)."""
    rt = entry.expected_runtime_s
    if rt is None or not entry.speed_by_type:
        return rt
    speed = entry.speed_by_type.get(model or "")
    return rt / speed if speed and speed > 0 else None


def _book_for_kueue(ctx: RunContext, profile: ResourceProfile, spec: TaskSpec, inventory: Inventory, ledger: Ledger,
                    log: Callable[[str], None]) -> Selection | None:
    """The Kueue mode's wait: no entry in autodl's admission queue (Kueue's ClusterQueue orders and admits the
    pod, created behind Kueue's scheduling gate); the best fitting devices no other autodl run holds are booked
    at once, so the launch knows the device model and count to request. None while every fitting device is
    held by another autodl run."""
    leased = frozenset(d for le in ledger.leases() for d in le.device_ids)
    decision = plan(profile, spec, inventory=inventory, catalog=load_catalog(), leased=leased)
    log(f"Kueue mode (LocalQueue {spec.launcher.kueue_queue}): autodl's admission queue steps aside; the pod is "
        "created gated and Kueue admits it")
    if decision.chosen is None:
        log("every fitting device is held by another autodl run; polling again (no place in autodl's queue is kept)")
        return None
    by_id = {d.device_id: d for d in inventory.devices}
    first = by_id[decision.chosen.devices[0]]
    try:
        lease = ledger.book(ctx.run_key, list(decision.chosen.devices), host=first.host, model=first.model,
                            owner=owner_of(ctx), launcher=spec.launcher.type, placement=decision.chosen.to_json())
    except LeaseError as exc:
        log(f"lost a booking race ({exc}); polling again")
        return None
    keep_decision(ctx.run_key, decision)
    lines = format_candidates(decision)
    for line in lines:
        log(line)
    log(f"booked lease {lease.lease_id}: {lease.model} {lease.device_ids} for the pod's device request; TTL "
        f"{lease.ttl_s:g} s")
    selection = _selection(lease, [by_id[i] for i in lease.device_ids], inventory, decision.algorithm,
                           decision.chosen.to_json(), lines)
    RunState().put(ctx.run_key, RunState.SELECTION, selection)
    return selection


def _log_waiting(ctx: RunContext, order: list, leases: list[Lease], everywhere: PlacementDecision,
                 log: Callable[[str], None], why: str | None = None) -> None:
    keys = [e.run_key for e in order]
    place = keys.index(ctx.run_key) + 1 if ctx.run_key in keys else None
    ahead = keys[: place - 1] if place else []
    fitting = {d for c in everywhere.candidates if c.kept for d in c.devices}
    holders = [f"{le.run_key} ({le.owner.user or 'unknown user'}) on {','.join(le.device_ids)}"
               for le in leases if fitting & set(le.device_ids)]
    log(f"waiting: #{place or '?'} of {len(keys)} in the admission queue"
        + (f" behind {', '.join(ahead[:3])}{' ...' if len(ahead) > 3 else ''}" if ahead else "")
        + (f"; fitting devices held by {'; '.join(holders[:3])}" if holders else "")
        + (f"; why: {why}" if why else "")
        + "; autodl queue shows the expected start")


def step_select(ctx: RunContext, profile_out: ProfileResult | dict[str, Any], *, pool: str | None = None,
                log: Callable[[str], None] = print,
                launcher_kwargs_for: Callable[..., dict[str, Any]] | None = None) -> Selection:
    """Step 3: the devices this run booked while waiting, with the ranked candidates; or, when it holds
    no lease (freed while the task was between steps), one more poll of the queue.

    :returns: the :class:`Selection` (lease, placement, the booked devices in full for the launcher).
    :raises NoFitError: nothing in the pool can ever fit.
    :raises PoolBusy: no lease and the queue grants none now (the operator goes back to waiting).
    :raises LeaseLost: the lease expired before this step could renew it.
    """
    spec = run_spec(profile_out)
    ledger = Ledger()
    lease = ledger.get(ctx.run_key)
    if lease is not None:
        lease = ledger.heartbeat(ctx.run_key, lease.lease_id)
        inventory = read_inventory(pool, catalog=load_catalog())
        saved = RunState().get(ctx.run_key, RunState.SELECTION)
        if saved is not None:
            selection = Selection.coerce(saved, what=f"the selection kept for {ctx.run_key}")
            if selection.lease.lease_id == lease.lease_id:
                for line in selection.candidates_log:
                    log(line)
                log(f"using lease {lease.lease_id} booked while waiting: {lease.model} {lease.device_ids}")
                return selection
        log(f"run {ctx.run_key} already holds lease {lease.lease_id} on {lease.device_ids}; reusing it")
        return _selection_of(lease, inventory, spec.scheduler.algorithm)
    selection = step_wait(ctx, profile_out, pool=pool, log=log, launcher_kwargs_for=launcher_kwargs_for)
    if selection is None:
        raise PoolBusy(f"run {ctx.run_key}: every fitting device is busy or granted to runs ahead of it in the "
                       "admission queue; it waits again.")
    return selection


def _selection_of(lease: Lease, inventory: Inventory, algorithm: str) -> Selection:
    by_id = {d.device_id: d for d in inventory.devices}
    return _selection(lease, [by_id[i] for i in lease.device_ids if i in by_id], inventory, algorithm, lease.placement)


def _selection(lease, devices: list[Device], inventory: Inventory, algorithm: str, chosen: dict | None,
               candidates_log: list[str] | None = None) -> Selection:
    return Selection(
        lease=lease, placement=chosen or {"devices": lease.device_ids, "model": lease.model, "host": lease.host},
        devices=list(devices), declared_pool=inventory.declared, pool_source=inventory.source, algorithm=algorithm,
        candidates_log=list(candidates_log or []),
    )


def build_request(ctx: RunContext, profile_out: ProfileResult | dict[str, Any],
                  selection: Selection | dict[str, Any]) -> tuple[TaskSpec, LaunchRequest]:
    """The launch request for the booked devices (CPU when the pool is declared)."""
    profile_out = ProfileResult.coerce(profile_out, what="the profile step's result")
    selection = Selection.coerce(selection, what="the select step's result")
    spec = run_spec(profile_out)
    profile = profile_out.profile
    catalog = load_catalog()
    devices = list(selection.devices)
    vendor = catalog.vendor(devices[0].vendor if devices else "nvidia")
    lease = selection.lease
    lease_id = lease.lease_id
    options = spec.launcher.model_dump(exclude={"type"})
    env = {}
    if spec.task.batch_size_per_gpu:
        # the batch the estimate was made for; scripts that read it train with what was planned
        env[BATCH_SIZE_ENV] = str(spec.task.batch_size_per_gpu)
    output_dir = output_dir_path(spec, profile_out.script, autodl_home(), dag_id=ctx.dag_id, owner=ctx.user)
    output_dir.mkdir(parents=True, exist_ok=True)
    env[OUTPUT_DIR_ENV] = str(output_dir)
    env[REPORT_FILE_ENV] = str(state_dir(ctx.run_key) / "report.json")
    distributed = profile.num_gpus > 1 and len(devices) > 1
    shm_bytes = DEFAULT_SHM_BYTES if profile.num_workers is None or profile.num_workers > 0 else None
    cpu_request, memory_request = host_requests(profile, len(devices) if distributed else 1, shm_bytes)
    request = LaunchRequest(
        run_key=ctx.run_key,
        script=profile_out.script,
        args=list(spec.task.args),
        env=env,
        devices=devices,
        vendor=vendor,
        on_cpu=selection.declared_pool,
        distributed=distributed,
        shm_bytes=shm_bytes,
        cpu_request=cpu_request,
        memory_request_bytes=memory_request,
        labels=ctx.labels(lease_id),
        options=options,
        log_dir=str(state_dir(ctx.run_key)),
        device_memory_cap_bytes=lease.reserved_bytes,   # a shared lease's reservation; None: the whole device
    )
    return spec, request


def require_booked_worker(host: str | None, run_key: str, launcher_type: str) -> None:
    """Routed to a GPU host's Celery queue (``[autodl] host_queues``), a local training starts only on a worker
    that knows it is that host: ``AUTODL_HOST`` set, and equal to the booked host. (Seen: a worker without
    ``AUTODL_HOST`` started a training booked on another host without a word: declared devices run on CPU
    wherever the step runs, so :func:`autodl.hosts.require_here` does not check them.)

    :param host: the booked host the step was routed for (``booked_host``); None: not routed, nothing checked.
    :raises ConfigError: naming the variable, the booked host and this worker's value.
    """
    from autodl.hosts import UNKNOWN_HOSTS

    if not host or host in UNKNOWN_HOSTS or launcher_type != "local":
        return
    mine = os.environ.get("AUTODL_HOST", "").strip()
    if not mine:
        raise ConfigError(f"run {run_key}: not started: it is booked on host {host} and routed to that host's queue, "
                          f"but this worker has no AUTODL_HOST, so it cannot tell it is {host}. Set AUTODL_HOST={host} "
                          "on the worker that serves that queue ([autodl] host_queues), then clear the launch task.")
    if mine != host:
        raise ConfigError(f"run {run_key}: not started: it is booked on host {host}, but this worker is AUTODL_HOST="
                          f"{mine}. The queue of {host} in [autodl] host_queues is served by a worker of another host: "
                          "fix host_queues or the worker's --queues, then clear the launch task.")


def step_launch(ctx: RunContext, profile_out: ProfileResult | dict[str, Any], selection: Selection | dict[str, Any], *,
                launcher_kwargs: dict[str, Any] | None = None, log: Callable[[str], None] = print,
                sample_interval_s: float | None = None) -> dict[str, Any]:
    """Step 4: start the training detached (or reattach to the attempt still running).

    The lease is renewed first (a dead lease launches nothing) and the handle is recorded on it, so a
    reaper can stop the training if every follower of it dies.

    :param sample_interval_s: the collect step's sampling interval, seconds: a new local training is sampled at it
        from here until the collect step takes over (:mod:`autodl.sampling`); None: not sampled before the collect.

    :returns: the :class:`LaunchHandle` as a dict.
    :raises LaunchError: the launcher could not start it.
    :raises LeaseLost: the lease expired or was released before the launch.
    """
    selection, requeued = renew_booking(ctx, profile_out, Selection.coerce(selection, what="the select step's result"),
                                        log)
    spec, request = build_request(ctx, profile_out, selection)
    ledger = Ledger()
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
    handle, sampler = _start(launcher, request, host, sample_interval_s, state_dir(ctx.run_key))
    if not handle.reattached:
        begin_attempt(ctx.run_key, log)
        if requeued is not None:  # what happened to this attempt's first booking, for its record
            RunState().put(ctx.run_key, RunState.REQUEUED, requeued)
    log(("reattached to" if handle.reattached else "started") + f" {ctx.run_key}: pid={handle.pid} "
        f"container={handle.container_name} pod={handle.pod_name} log={handle.log_path}")
    RunState().put(ctx.run_key, RunState.HANDLE, handle)
    (state_dir(ctx.run_key) / "handle-latest.json").write_text(json.dumps(handle.to_json()))  # this machine's timeline
    try:
        ledger.attach(ctx.run_key, handle=handle.to_json(), launched_on=this_host(), launcher=launcher.name)
    except LeaseLost:
        log("the lease was reclaimed while launching: stopping the training just started")
        if sampler is not None:
            sampler.cancel()
        launcher.stop(handle)
        raise
    if sampler is not None:
        pid = sampler.hand(handle.model_dump_json())
        log(f"sampling the training every {sample_interval_s:g} s until the collect step takes over (pid {pid})")
    return handle.to_json()


def _start(launcher: Any, request: LaunchRequest, host: str | None, sample_interval_s: float | None, folder: Path):
    """Start the training (or reattach) and, for a new local one, the launch's sampler (:mod:`autodl.sampling`),
    which starts first so that its imports cost the timeline no samples. :returns: (handle, sampler or None)."""
    sampler = None
    if sample_interval_s and launcher.name == "local":
        from autodl.sampling import LaunchSampler

        sampler = LaunchSampler(folder, sample_interval_s)
    try:
        handle = launcher.launch(request).model_copy(update={"host": host})
    except BaseException:
        if sampler is not None:
            sampler.cancel()
        raise
    if sampler is not None and handle.reattached:  # already followed: its collect samples it
        sampler.cancel()
        sampler = None
    return handle, sampler


def renew_booking(ctx: RunContext, profile_out: ProfileResult | dict[str, Any], selection: Selection,
                  log: Callable[[str], None]) -> tuple[Selection, dict[str, Any] | None]:
    """Before a launch: renew the run's lease; when nothing launched on it within its TTL (no worker ran this launch
    in time) and it was re-queued, by a reaper or now (:func:`reap_expired`), book again (:func:`book_again`).

    :returns: (the selection to launch on, the re-queue fact or None).
    :raises LeaseLost: the lease is gone for another reason (released by hand, a training launched on it).
    :raises PoolBusy: re-queued, and no device of the routed host is granted now.
    """
    state = RunState()
    requeued = state.get(ctx.run_key, RunState.REQUEUED)
    if requeued is None or requeued.get("lease_id") != selection.lease.lease_id:
        try:
            Ledger().heartbeat(ctx.run_key, selection.lease.lease_id)
            return selection, None
        except LeaseLost:
            reap_expired(log=log)  # an expired booking nothing launched is re-queued, not failed
            requeued = state.get(ctx.run_key, RunState.REQUEUED)
            if requeued is None or requeued.get("lease_id") != selection.lease.lease_id:
                raise
    return book_again(ctx, profile_out, selection, requeued, log), requeued


def book_again(ctx: RunContext, profile_out: ProfileResult | dict[str, Any], selection: Selection,
               requeued: dict[str, Any], log: Callable[[str], None]) -> Selection:
    """The launch of a run whose booking was released and re-queued (:func:`requeue_unlaunched`) runs at last: one
    poll of the admission queue for devices of the host it was routed to (the worker running it is that host's).

    :returns: the new selection (kept in the run state for the later steps).
    :raises PoolBusy: the queue grants nothing on that host now (the launch waits for its turn).
    """
    host = selection.host
    log(f"the booking of {ctx.run_key} was released and the run re-queued before this launch ran: "
        f"{requeued.get('message')}; booking again on {host}")
    again = step_wait(ctx, profile_out, pool=source_of(ProfileResult.coerce(profile_out)), log=log, host=host)
    if again is None:
        raise PoolBusy(f"run {ctx.run_key}: back in the admission queue after its booking on {host} was released "
                       f"(no worker launched it in time); it waits for a device of {host} again.")
    return again


def source_of(profile_out: ProfileResult) -> str | None:
    """The pool source the run's profile read, as :func:`autodl.inventory.read_inventory` takes it again
    (``file:<path>`` is the path); None for the default source."""
    src = profile_out.pool_source
    return src[len("file:"):] if src and src.startswith("file:") else src


def requeue_unlaunched(lease: Lease, *, why: str, log: Callable[[str], None] = print) -> bool:
    """A booking nothing launched within the lease's TTL (with ``[autodl] host_queues``: no worker of the booked
    host's queue picked up the launch): free its devices and put the run back in the admission queue, keeping
    why in the run state (:data:`autodl.store.RunState.REQUEUED`; the record's notes say it). The launch, once a
    worker runs it, books again (:func:`book_again`), so the run is kept, not failed.

    :returns: False (nothing done) when the run's profile is not in the store: it cannot wait again.
    """
    from autodl.queue import AdmissionQueue, candidate_groups, stale_after

    state = RunState()
    kept = state.get(lease.run_key, RunState.PROFILE)
    if kept is None:
        return False
    profile_out = ProfileResult.coerce(kept, what=f"the profile kept for {lease.run_key}")
    spec = run_spec(profile_out)
    catalog = load_catalog()
    try:
        inventory = read_inventory(source_of(profile_out), catalog=catalog)
    except AutoDLError as exc:  # the pool cannot be read again here: the booking is reaped as before
        log(f"{lease.run_key} cannot go back to the admission queue: its pool {profile_out.pool_source} ({exc})")
        return False
    everywhere = plan(profile_out.profile, spec, inventory=inventory, catalog=catalog, leased=frozenset())
    if Ledger().release(lease.run_key, lease.lease_id) is None:
        return False  # released meanwhile (its own release step, a manual release): nothing to re-queue
    ranked = [(c.host, c.model) for c in everywhere.candidates if c.kept]
    AdmissionQueue().join(
        lease.run_key, num_gpus=profile_out.profile.num_gpus, needed_bytes=profile_out.profile.peak_memory_bytes,
        candidates=candidate_groups(inventory, _fits_ever(profile_out.profile, spec), ranked),
        stale_after_s=stale_after(float(spec.scheduler.poke_interval)), vendors=spec.resource_policy.allowed_vendors,
        dag_id=lease.owner.dag_id, run_id=lease.owner.run_id, owner_user=lease.owner.user,
        pool=source_of(profile_out), expected_runtime_s=lease.expected_runtime_s,
        timeout_s=float(spec.scheduler.timeout))
    state.put(lease.run_key, RunState.REQUEUED, {"lease_id": lease.lease_id, "host": lease.host, "message": why,
                                                  "at": utcnow().isoformat()})
    log(f"re-queued {lease.run_key}: {why}")
    return True


# ------------------------------------------------------------------------------------------- collect
@dataclass(frozen=True)
class CollectLimits:
    """What may end a collect before the training does.

    :ivar max_run_time_s: the spec's ``scheduler.max_run_time``: seconds from the training's start.
    :ivar deadline_ts: an absolute end (epoch seconds), e.g. the collect task's ``execution_timeout``.
    :ivar deadline_why: what set ``deadline_ts`` (said in the log and the record).
    :ivar max_pending_s: the spec's ``scheduler.max_pending_time``: seconds a pod may stay unschedulable.
    :ivar heartbeat_every_s: seconds between lease heartbeats.
    :ivar lease_ttl_s: the TTL each heartbeat gives the lease (seconds); None keeps the lease's own. A deferred
        collect raises it to :func:`deferred_lease_ttl_s`.
    """

    max_run_time_s: float | None = None
    deadline_ts: float | None = None
    deadline_why: str = "execution_timeout"
    max_pending_s: float | None = None
    heartbeat_every_s: float = 30.0
    lease_ttl_s: float | None = None

    def deferred(self, *, failover_s: float, interval_s: float) -> "CollectLimits":
        """These limits for a collect followed from the triggerer: the lease's TTL raised to
        :func:`deferred_lease_ttl_s` where the configured one is shorter, a heartbeat every fifth of it."""
        from autodl.config import lease_ttl_s

        ttl = deferred_lease_ttl_s(self.lease_ttl_s or lease_ttl_s(), failover_s=failover_s, interval_s=interval_s)
        return replace(self, lease_ttl_s=ttl, heartbeat_every_s=min(self.heartbeat_every_s, 30.0, ttl / 5.0))

    @classmethod
    def for_run(cls, profile_out: ProfileResult | dict[str, Any] | None, *, deadline_ts: float | None = None,
                deadline_why: str = "execution_timeout") -> "CollectLimits":
        """Limits from the run's spec (``scheduler.max_run_time``, ``max_pending_time``) and the lease TTL:
        a heartbeat every TTL/5, at most every 30 s, so four in a row may be missed before the lease dies."""
        from autodl.config import lease_ttl_s

        sched = run_spec(profile_out).scheduler if profile_out else TaskSpec().scheduler
        return cls(max_run_time_s=sched.max_run_time, deadline_ts=deadline_ts, deadline_why=deadline_why,
                   max_pending_s=sched.max_pending_time, heartbeat_every_s=min(30.0, lease_ttl_s() / 5.0))


TRIGGERER_RESUME_MARGIN_S = 20.0
"""Seconds allowed for a restarted triggerer to take up a trigger it was handed and for the trigger's first lease
heartbeat: the triggerer's loop picks up newly assigned triggers every second or so, then the trigger imports
autodl and opens the store in a thread (seen at 2-8 s on a loaded CI machine); the rest is slack."""


def deferred_lease_ttl_s(ttl_s: float, *, failover_s: float, interval_s: float) -> float:
    """The shortest lease TTL a collect followed from the triggerer survives a triggerer restart with.

    A triggerer killed (``kill -9``, an OOM, a node lost) keeps its triggers in Airflow's metadata until its job
    heartbeat is older than ``[triggerer] triggerer_health_check_threshold``; only then does a restarted (or
    another) triggerer take them, after up to ``[triggerer] job_heartbeat_sec`` more (``failover_s``: their sum,
    35 s with Airflow's defaults). The trigger's first heartbeat follows within ``interval_s`` and
    :data:`TRIGGERER_RESUME_MARGIN_S`, and the last beat before the kill may be a heartbeat interval
    (``min(30, TTL/5)`` s) old. So the lease survives when ``TTL - min(30, TTL/5) >= failover_s + interval_s +
    margin``: 70 s with the defaults and a 1 s sample interval; a triggerer down longer than
    ``failover_s`` is survived for ``TTL - min(30, TTL/5) - interval_s - margin`` seconds.

    :param ttl_s: the configured TTL (``AUTODL_LEASE_TTL``), seconds.
    :returns: ``ttl_s`` or the bound above, whichever is longer (seconds).
    """
    need = float(failover_s) + float(interval_s) + TRIGGERER_RESUME_MARGIN_S
    bound = need * 5.0 / 4.0 if need * 5.0 / 4.0 <= 150.0 else need + 30.0
    return max(float(ttl_s), float(math.ceil(bound)))


def keep_lease_for_deferral(ctx: RunContext, lease_id: str | None, limits: CollectLimits, *, failover_s: float,
                            interval_s: float, log: Callable[[str], None] = print) -> CollectLimits:
    """Before the collect defers: the lease's TTL raised to what survives a triggerer restart
    (:func:`deferred_lease_ttl_s`), heartbeated now so that it holds from the start of the deferral.

    A lease lost or a store not answering here is left to the trigger's first check (it stops the training or
    retries, :class:`CollectGuard`), said in the log.

    :param failover_s: seconds until Airflow gives a dead triggerer's triggers to another (see
        :func:`deferred_lease_ttl_s`).
    :returns: the limits the trigger keeps the lease with.
    """
    from autodl.config import lease_ttl_s

    deferred = limits.deferred(failover_s=failover_s, interval_s=interval_s)
    configured = limits.lease_ttl_s or lease_ttl_s()
    if deferred.lease_ttl_s and deferred.lease_ttl_s > configured:
        log(f"lease TTL {deferred.lease_ttl_s:g} s while the triggerer follows the training (AUTODL_LEASE_TTL is "
            f"{configured:g} s): a killed triggerer's triggers resume only after {failover_s:g} s ([triggerer] "
            "triggerer_health_check_threshold + job_heartbeat_sec), and its lease must outlive that")
    try:
        Ledger().heartbeat(ctx.run_key, lease_id, ttl_s=deferred.lease_ttl_s)
    except (LeaseLost, StoreUnavailable) as exc:
        log(f"WARNING: the lease heartbeat before deferring failed ({exc}); the trigger's first check decides")
    return deferred


class CollectStopped(TrainingFailed):
    """The training was stopped before it ended by itself: ``status`` says why (``lease_lost``,
    ``timed_out``, ``unschedulable``, ``stopped``: by hand, ``autodl leases --release``)."""

    def __init__(self, status: StopStatus, message: str):
        super().__init__(message)
        self.status: StopStatus = status


class CollectGuard:
    """Heartbeats the run's lease while a training is followed and says when the collect must stop early
    (lease lost, ``max_run_time`` or the deadline passed, a pod unschedulable for too long).

    Used both by the worker's loop (:func:`step_collect`) and by the collect trigger.
    """

    def __init__(self, ctx: RunContext, handle: LaunchHandle, launcher: Any, limits: CollectLimits,
                 log: Callable[[str], None] = print, lease_id: str | None = None):
        self.ctx, self.handle, self.launcher, self.limits, self.log = ctx, handle, launcher, limits, log
        self.lease_id = lease_id or handle.lease_id
        self._last_beat = 0.0
        self._pending_since: float | None = None
        self._pending_reason: str | None = None
        self._store_down_since: float | None = None

    def _store_unavailable(self, exc: StoreUnavailable, now: float) -> CollectStopped | None:
        """A heartbeat the store did not answer: tried again at the next check (the lease has four more beats
        of its TTL, :meth:`CollectLimits.for_run`); past the lease's TTL since the last beat the lease is surely
        dead and the training is stopped, saying so (issue 23: a 1.8 s PostgreSQL restart failed the run)."""
        from autodl.config import lease_ttl_s

        if self._store_down_since is None:
            self._store_down_since = now
            self.log(f"WARNING: the lease heartbeat of {self.ctx.run_key} got no answer from the store; retrying "
                     f"at every check until it answers ({exc})")
        last = self._last_beat or self._store_down_since
        ttl = self.limits.lease_ttl_s or lease_ttl_s()
        if now - last > ttl:
            return CollectStopped("lease_lost", f"autodl's store has not answered for {now - self._store_down_since:.0f} s, "
                                                f"longer than the lease's TTL ({ttl:g} s): its devices may be "
                                                f"booked by another run, so the training was stopped. Last error: {exc}")
        return None

    def check(self, now: float | None = None) -> CollectStopped | None:
        """One check while the training runs: None to go on, else why to stop (not raised)."""
        now = now or time.time()
        limits = self.limits
        if now - self._last_beat >= limits.heartbeat_every_s:
            try:
                Ledger().heartbeat(self.ctx.run_key, self.lease_id, ttl_s=limits.lease_ttl_s)
                self._last_beat = now
                self._store_down_since = None
            except StoreUnavailable as exc:
                return self._store_unavailable(exc, now)
            except LeaseLost as exc:
                stopped = Ledger().stop_mark(self.lease_id)
                if stopped is not None:
                    return CollectStopped("stopped", f"training {self.ctx.run_key} was {stopped.describe()}; its "
                                                     "lease was freed")
                return CollectStopped("lease_lost", f"{exc} The training was stopped: its devices may be booked by another run.")
        ran = now - self.handle.started_at.timestamp()
        if limits.max_run_time_s is not None and ran > limits.max_run_time_s:
            return CollectStopped("timed_out", f"training {self.ctx.run_key} ran {ran:.0f} s, longer than "
                                               f"scheduler.max_run_time {limits.max_run_time_s:g} s: stopped")
        if limits.deadline_ts is not None and now > limits.deadline_ts:
            return CollectStopped("timed_out", f"training {self.ctx.run_key} passed the collect task's "
                                               f"{limits.deadline_why} after {ran:.0f} s: stopped")
        probe = getattr(self.launcher, "unschedulable_reason", None)
        if probe is not None:
            reason = probe(self.handle)
            if reason is None:
                self._pending_since = self._pending_reason = None
            else:
                if self._pending_since is None:
                    self._pending_since = now
                if reason != self._pending_reason:
                    self.log(f"pod {self.handle.pod_name} cannot be scheduled: {reason}")
                    self._pending_reason = reason
                waited = now - self._pending_since
                if limits.max_pending_s is not None and waited > limits.max_pending_s:
                    return CollectStopped("unschedulable", f"pod {self.handle.namespace}/{self.handle.pod_name} stayed "
                                                           f"unschedulable for {waited:.0f} s (scheduler.max_pending_time "
                                                           f"{limits.max_pending_s:g} s): {reason}; stopped")
        return None


def collect_sinks(ctx: RunContext, handle: LaunchHandle, launcher_type: str, launcher_kwargs: dict[str, Any] | None):
    """(launcher, sampler, samples path, keep(metrics), notes) for following ``handle``: keep writes
    metrics.json; notes say what could not be measured (e.g. no NVML)."""
    from autodl.metrics import make_sampler

    launcher = get_launcher(handle.launcher or launcher_type, **(launcher_kwargs or {}))
    if launcher.name == "local":
        require_here(None if handle.on_cpu else handle.host, "follow the training", ctx.run_key)
    folder = state_dir(ctx.run_key)
    kept_profile = folder / "profile.json"  # this host's OOM explanation and timeline read the estimate here
    if not kept_profile.exists() and (profile := RunState().get(ctx.run_key, RunState.PROFILE)) is not None:
        kept_profile.write_text(json.dumps(profile))
    uuids = [d for d in handle.device_ids if d.startswith(("GPU-", "MIG-"))]

    def keep(m: RunMetrics) -> None:
        keep_metrics(folder, m, print)
        RunState().put(ctx.run_key, RunState.METRICS, m)
        keep_report(ctx.run_key, log=print)  # here, where the training ran, its report file is

    notes: list[str] = []
    from autodl.config import prometheus_url

    sampler = make_sampler(handle, uuids, folder=folder, notes=notes, prometheus_url=prometheus_url())
    return launcher, sampler, folder / "samples.jsonl", keep, notes


def known_end(run_key: str, handle: LaunchHandle) -> float | None:
    """When this attempt's training ended (epoch seconds), as an earlier collect of it saw it: the kept metrics'
    ``duration_s`` from the handle's start, when they have an exit code; None when no collect saw the end. A new
    training clears them (:func:`begin_attempt`), so what is kept is this attempt's."""
    kept = RunState().get(run_key, RunState.METRICS)
    if not kept or kept.get("exit_code") is None or kept.get("duration_s") is None:
        return None
    return handle.started_at.timestamp() + float(kept["duration_s"])


def summarise_end(ctx: RunContext, handle: LaunchHandle, metrics: RunMetrics, log: Callable[[str], None]) -> dict[str, Any]:
    """Finish the metrics (out-of-memory explanation, timeline PNG: :func:`autodl.metrics.finish`), keep them,
    log how the training ended; raise when it failed (the metrics are kept all the same)."""
    from autodl.metrics import finish

    folder = state_dir(ctx.run_key)
    metrics = finish(metrics, handle, folder, log=log)
    keep_metrics(folder, metrics, log)
    RunState().put(ctx.run_key, RunState.METRICS, metrics)
    keep_report(ctx.run_key, log=log)
    peak = ("unknown" if metrics.peak_memory_bytes is None
            else f"{metrics.peak_memory_bytes / GiB:.3f} GiB ({metrics.peak_source})")
    log(f"training ended: exit code {metrics.exit_code}, {metrics.duration_s:.1f} s, own peak memory {peak}, "
        f"{metrics.samples} {metrics.source} samples"
        + (f", {metrics.steps} steps at {metrics.step_time_s:.4g} s/step" if metrics.steps and metrics.step_time_s else ""))
    if metrics.exit_code != 0:
        stopped = Ledger().stop_mark(handle.lease_id)
        if stopped is not None:
            raise CollectStopped("stopped", f"training {ctx.run_key} was {stopped.describe()}; it exited with "
                                            f"{metrics.exit_code} on the stop signal. Its log: {handle.log_path}")
        why = f" ({metrics.oom['explanation']})" if metrics.oom else ""
        last = last_log_line(handle.log_path)
        raise TrainingFailed(f"training {ctx.run_key} failed with exit code {metrics.exit_code}{why}"
                             + (f"; its log ends: {last!r}" if last else "") + f"; its log: {handle.log_path}")
    return metrics.to_json()


def distinct_failures(failures: dict[str, Any]) -> dict[str, Any]:
    """The steps' failure reasons without those that only repeat another's (Airflow's "marked ... failed: <the
    collect's own error>" after the collect said it)."""
    texts = {k: str(v) for k, v in failures.items()}
    return {k: v for k, v in failures.items()
            if not any(o != k and texts[o] and texts[o] in texts[k] and len(texts[o]) < len(texts[k])
                       for o in texts)}


LAST_LINE_CHARS = 300
"""Longest last log line quoted in a failed run's error (characters; the whole log is linked beside it)."""


def last_log_line(log_path: str | None) -> str | None:
    """The last non-empty line of a training's log (the exception a traceback ends with), redacted and clipped to
    :data:`LAST_LINE_CHARS`; None when the log cannot be read here (another host's, or none)."""
    from autodl.oom import read_tails
    from autodl.redact import redact_text

    try:
        tails = read_tails([log_path]) if log_path else []
    except OSError:
        return None
    lines = [ln.strip() for ln in (tails[0] if tails else "").splitlines() if ln.strip()]
    return redact_text(lines[-1])[:LAST_LINE_CHARS] if lines else None


def keep_metrics(folder: Path, metrics: RunMetrics, log: Callable[[str], None]) -> bool:
    """Write ``metrics.json`` atomically (a reader sees the previous file or this one, never a torn one); a
    full or failing disk is said in the log and the collect goes on (issue 23: ENOSPC crashed the collect
    and left a 0-byte file that failed the release). Returns whether it was written."""
    try:
        atomic_write_text(folder / "metrics.json", json.dumps(metrics.to_json(), indent=2))
        return True
    except OSError as exc:
        log(f"WARNING: the run's metrics could not be kept in {folder / 'metrics.json'} ({exc}); the record "
            "goes without what was not written, and the lease is released all the same")
        return False


def stop_early(ctx: RunContext, handle: LaunchHandle, launcher: Any, stopped: CollectStopped,
               log: Callable[[str], None]) -> None:
    """Stop the training for ``stopped``'s reason and remember it for the record (never raises)."""
    log(str(stopped))
    note_failure(ctx.run_key, "collect", str(stopped))
    try:
        if launcher.poll(handle) is None:
            launcher.stop(handle)
    except AutoDLError as exc:
        log(f"could not stop the training {ctx.run_key}: {exc}")


def step_collect(ctx: RunContext, handle_json: dict[str, Any], *, launcher_type: str = "local",
                 launcher_kwargs: dict[str, Any] | None = None, log: Callable[[str], None] = print,
                 interval_s: float = 1.0, limits: CollectLimits | None = None) -> dict[str, Any]:
    """Step 5 (in the worker): follow the training to its end, streaming its log, sampling metrics and
    heartbeating the lease.

    :returns: the :class:`RunMetrics` summary as a dict (also kept in the run's state folder).
    :raises TrainingFailed: when the training exits non-zero (the metrics are kept all the same).
    :raises CollectStopped: when it was stopped early (lease lost, a time limit, an unschedulable pod).
    """
    from autodl.metrics import follow

    handle = LaunchHandle.model_validate(handle_json)
    launcher, sampler, samples_path, keep, notes = collect_sinks(ctx, handle, launcher_type, launcher_kwargs)
    guard = CollectGuard(ctx, handle, launcher, limits or CollectLimits(), log)

    def tick() -> None:
        stopped = guard.check()
        if stopped is not None:
            raise stopped

    try:
        # resumed: the samples of this attempt kept so far, and (collect cleared) the end an earlier collect saw
        metrics = follow(launcher, handle, sampler=sampler, log_sink=lambda line: log(f"[train] {line}"),
                         interval_s=interval_s, samples_path=samples_path, partial_sink=keep, notes=notes,
                         on_tick=tick, resume=True, ended_ts=known_end(ctx.run_key, handle))
    except CollectStopped as stopped:
        stop_early(ctx, handle, launcher, stopped, log)
        raise
    return summarise_end(ctx, handle, metrics, log)


def stop_training(handle_json: dict[str, Any], *, launcher_kwargs: dict[str, Any] | None = None,
                  log: Callable[[str], None] = print, why: str = "stopping it") -> bool:
    """Stop the training behind ``handle_json`` if it still runs. Never raises for a launcher error.

    :returns: True when a running training was stopped.
    """
    return _stop(handle_json, launcher_kwargs=launcher_kwargs, log=log, why=why) == "stopped"


def _stop(handle_json: dict[str, Any], *, launcher_kwargs: dict[str, Any] | None = None,
          log: Callable[[str], None] = print, why: str = "stopping it") -> str:
    """``"stopped"``, ``"not running"`` or ``"unknown: <why>"`` (the launcher could not be asked)."""
    handle = LaunchHandle.model_validate(handle_json)
    try:
        launcher = get_launcher(handle.launcher, **(launcher_kwargs or {}))
        if launcher.name == "local":
            require_here(None if handle.on_cpu else handle.host, "stop the training", handle.run_key)
        if launcher.poll(handle) is None:
            log(f"training {handle.run_key} {why}")
            launcher.stop(handle)
            return "stopped"
        return "not running"
    except AutoDLError as exc:
        log(f"could not stop the training {handle.run_key}: {exc}")
        return f"unknown: {exc}"


# ------------------------------------------------------------------------------- leases left behind
def reaper_id() -> str:
    """Who reaps: ``host:pid``."""
    return f"{this_host()}:{os.getpid()}"


def _left_behind_handle(lease: Lease) -> dict[str, Any] | None:
    """How to find what an expired lease's run launched: the handle on the lease, else the one the launch
    kept in the run state (for this lease), else the run folder's, else (containers, pods) the run key alone,
    which the Docker and Kubernetes launchers select by label."""
    if lease.handle:
        return lease.handle
    kept = RunState().get(lease.run_key, RunState.HANDLE)
    if kept is not None and kept.get("lease_id") == lease.lease_id:
        return kept
    for path in (state_dir(lease.run_key) / "handle-latest.json", state_dir(lease.run_key) / "handle.json"):
        if path.exists():
            try:
                return json.loads(path.read_text())
            except ValueError:
                continue
    if lease.launcher in ("docker", "kubernetes"):
        return LaunchHandle(launcher=lease.launcher, run_key=lease.run_key).to_json()
    return None


def stop_left_behind(lease: Lease, *, launcher_kwargs_for: Callable[..., dict[str, Any]] | None = None,
                     log: Callable[[str], None] = print) -> bool:
    """Stop whatever the run of ``lease`` left running (process tree, container or pod, through the
    launcher's own stop). True when nothing of it runs any more; False when that cannot be known (a local
    training on another host, a launcher that does not answer): its devices must not be freed then."""
    handle = _left_behind_handle(lease)
    if handle is None:
        return True  # booked, never launched
    kind = handle.get("launcher") or lease.launcher or "local"
    if kind == "local" and lease.launched_on and lease.launched_on != this_host():
        log(f"lease {lease.lease_id} of {lease.run_key}: its training runs on {lease.launched_on}, not here "
            f"({this_host()}); it cannot be stopped from here, so its devices stay booked")
        return False
    # the booked host's own engine (docker_<host>) when the handle names it
    kwargs = (launcher_kwargs_for(kind, handle["host"]) if handle.get("host") else launcher_kwargs_for(kind)) \
        if launcher_kwargs_for else {}
    result = _stop(handle, launcher_kwargs=kwargs, log=log, why="was left behind by an expired lease: stopping it")
    return not result.startswith("unknown")


def release_lease(lease: Lease, *, reason: str, step: str = "lease", log: Callable[[str], None] = print,
                  launcher_kwargs_for: Callable[..., dict[str, Any]] | None = None) -> dict[str, Any] | None:
    """Stop what ``lease``'s run left, free the lease and record the run with ``reason``.

    :returns: :func:`step_release_and_record`'s result, or None when the training could not be stopped
        (the lease is kept).
    """
    if not stop_left_behind(lease, launcher_kwargs_for=launcher_kwargs_for, log=log):
        return None
    note_failure(lease.run_key, step, reason)
    ctx = RunContext(run_key=lease.run_key, dag_id=lease.owner.dag_id, run_id=lease.owner.run_id, user=lease.owner.user)
    return step_release_and_record(ctx, script=None, spec_path=None, profile_out=None, selection=None,
                                   handle_json=_left_behind_handle(lease), metrics_json=None, log=log,
                                   lease_id=lease.lease_id,
                                   launcher_kwargs=launcher_kwargs_for(lease.launcher or "local") if launcher_kwargs_for else None)


def reap_expired(*, log: Callable[[str], None] = print, now: datetime | None = None,
                 launcher_kwargs_for: Callable[..., dict[str, Any]] | None = None) -> list[str]:
    """Reclaim every lease whose TTL ran out: claim it (one reaper per lease), stop what it left, free it,
    and record the run as failed with why. Called before devices are offered to waiting runs.

    :returns: the run keys whose leases were freed.
    """
    ledger = Ledger()
    me = reaper_id()
    freed: list[str] = []
    for lease in ledger.expired(now):
        if not ledger.claim_expired(lease.lease_id, me, now=now):
            continue
        last = lease.heartbeat_at.isoformat() if lease.heartbeat_at else "never"
        if lease.handle is None:  # booked, never launched: say what it waited for (a GPU host's worker, on Celery)
            reason = (f"lease {lease.lease_id} expired before its training was launched: booked on host {lease.host} "
                      f"at {lease.created_at.isoformat(timespec='seconds')}, no heartbeat since {last} (TTL "
                      f"{lease.ttl_s:g} s); nothing started it: with [autodl] host_queues, is the Celery worker of "
                      f"{lease.host}'s queue running? Reclaimed by {me}")
            if _left_behind_handle(lease) is None and requeue_unlaunched(
                    lease, why=reason + "; its devices were freed and the run went back to the admission queue: it is "
                               f"booked again when a worker of {lease.host} runs its launch", log=log):
                freed.append(lease.run_key)
                continue
        else:
            reason = (f"lease {lease.lease_id} expired: no heartbeat since {last} (TTL {lease.ttl_s:g} s; its Airflow "
                      f"task, triggerer or worker is gone); reclaimed by {me}, its training stopped")
        log(f"reaping the lease of {lease.run_key} ({lease.owner.describe()}): {reason}")
        if release_lease(lease, reason=reason, log=log, launcher_kwargs_for=launcher_kwargs_for) is not None:
            freed.append(lease.run_key)
    return freed


def exit_status(handle_json: dict[str, Any], *, launcher_kwargs: dict[str, Any] | None = None) -> int | None:
    """The training's exit code as its launcher reports it, or None while it runs or when it cannot be read."""
    handle = LaunchHandle.model_validate(handle_json)
    try:
        return get_launcher(handle.launcher, **(launcher_kwargs or {})).poll(handle)
    except AutoDLError:
        return None


def _running(handle_json: dict[str, Any], *, launcher_kwargs: dict[str, Any] | None = None) -> bool | None:
    """Whether the training behind ``handle_json`` still runs: None when that cannot be told from here (a
    local training on another host, a launcher that does not answer)."""
    handle = LaunchHandle.model_validate(handle_json)
    try:
        launcher = get_launcher(handle.launcher, **(launcher_kwargs or {}))
        if launcher.name == "local":
            require_here(None if handle.on_cpu else handle.host, "stop the training", handle.run_key)
        return launcher.poll(handle) is None
    except AutoDLError:
        return None


def release_by_hand(run_key: str, *, user: str | None = None, force: bool = False,
                    log: Callable[[str], None] = print, how: str = "autodl leases --release") -> dict[str, Any]:
    """Free a run's lease by hand (``autodl leases --release``): stop its training, release, record.

    Only the lease's owner may do this; anyone else (or anyone, when the owner is unknown) needs ``force``.
    A training still running is marked as stopped by hand (:meth:`Ledger.mark_stopped`) *before* it is
    signalled, so the collect step following it and the run's record say "stopped by autodl leases --release
    (by U at T)" with outcome ``stopped``, not an exit code 143/137 that reads like a crash or an OOM kill.

    :param user: who asks (default :func:`autodl.config.current_user`).
    :param how: what released it, for the mark and the record (the GPU page passes its button).
    :returns: ``{"run_key", "lease_id", "device_ids", "owner", "released_by", "forced", "training", "stopped",
        "outcome", "lease_released", ...}``; ``training`` is ``stopped``, ``not running`` (it had ended),
        ``not launched`` or ``unknown: <why>`` (it could not be asked; the lease is freed all the same).
    :raises LeaseError: when ``run_key`` holds no lease (nothing is released).
    :raises NotOwner: when the lease is someone else's and ``force`` is not given (the message says whose).
    """
    from autodl.config import current_user
    from autodl.inputs import clip, short

    user = user or current_user()
    lease = Ledger().get(run_key)
    if lease is None:
        raise LeaseError(f"no lease is held by run {short(run_key)}: nothing released. `autodl leases` lists the "
                         "live leases and their run keys.")
    mine = lease.owner.user is not None and lease.owner.user == user
    whose = f"booked {lease.created_at.isoformat(timespec='seconds')} by {lease.owner.describe()}"
    if not mine and not force:
        raise NotOwner(f"the lease of run {short(run_key)} is not yours ({clip(user, 80)}): it was {whose}. Releasing it "
                       "stops its training; pass --force to do it anyway.")
    devices = ", ".join(lease.device_ids) or "no devices"
    log(f"releasing lease {lease.lease_id} of run {run_key} on {devices} ({whose}) by "
        + (f"its owner {user}" if mine else f"{user} with --force"))
    handle = _left_behind_handle(lease)
    mark = None
    if handle is None:
        training = "not launched"
    else:
        running = _running(handle)
        if running:  # the mark first: whoever sees the training end must know it was stopped by hand
            mark = Ledger().mark_stopped(lease, by=user, how=how, forced=not mine)
        training = _stop(handle, log=log, why=f"is being {mark.describe()}" if mark else "is being stopped")
        if running is False:
            training = "not running"
    if mark is None:  # nothing was stopped: the record still says who freed the lease (a stop says it itself)
        note_failure(run_key, "release", f"lease {lease.lease_id} released by hand ({how}) by "
                                         + (f"its owner {user}" if mine else f"{user} with --force; it was {whose}")
                                         + f"; its training {'was not launched' if handle is None else training}")
    ctx = RunContext(run_key=run_key, dag_id=lease.owner.dag_id, run_id=lease.owner.run_id, user=lease.owner.user)
    result = step_release_and_record(ctx, script=None, spec_path=None, profile_out=None, selection=None,
                                     handle_json=handle, metrics_json=None, log=log, lease_id=lease.lease_id,
                                     force_release=True, stopped=mark)
    return {**result, "lease_id": lease.lease_id, "device_ids": list(lease.device_ids), "owner": lease.owner.to_json(),
            "released_by": user, "forced": not mine, "training": training,
            "stopped": mark.to_json() if mark else None}


def release_failed_run(dag_id: str, run_id: str, *, reason: str, run_key: str | None = None,
                       log: Callable[[str], None] = print,
                       launcher_kwargs_for: Callable[..., dict[str, Any]] | None = None) -> list[str]:
    """Release the leases of a failed Airflow DAG run (all its autodl groups, or only ``run_key``'s) and take
    its waiting runs out of the queue; each run is recorded with ``reason``. Returns the freed run keys."""
    from autodl.queue import AdmissionQueue

    queue = AdmissionQueue()
    if run_key is None:
        queue.leave_all(dag_id=dag_id, run_id=run_id)
    else:
        queue.leave(run_key)
    freed = []
    for lease in Ledger().leases(owner_dag_id=dag_id, owner_run_id=run_id):
        if run_key is not None and lease.run_key != run_key:
            continue
        if release_lease(lease, reason=reason, step="airflow", log=log, launcher_kwargs_for=launcher_kwargs_for):
            freed.append(lease.run_key)
    return freed


def _read_json_object(path: Path, what: str, log: Callable[[str], None]) -> dict[str, Any] | None:
    """A JSON object from ``path``; None when absent, or (said in the log) when it is not a JSON object."""
    try:
        data = read_json_object(path)
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:   # a link, a FIFO, too big, not JSON (issue 23): read as untrusted
        log(f"{what} in {path} could not be read ({exc}); the record goes without it")
        return None
    return data


def step_release_and_record(ctx: RunContext, *, script: str | None, spec_path: str | None,
                            profile_out: ProfileResult | dict[str, Any] | None,
                            selection: Selection | dict[str, Any] | None, handle_json: dict[str, Any] | None, metrics_json: dict[str, Any] | None,
                            launcher_kwargs: dict[str, Any] | None = None,
                            log: Callable[[str], None] = print, lease_id: str | None = None,
                            force_release: bool = False, stopped: StopMark | None = None) -> dict[str, Any]:
    """Step 6: stop a training still running, free the lease (idempotent), leave the queue, write the run record.

    Runs whatever happened upstream; any input may be None: then what the earlier steps kept in the run
    state (:class:`autodl.store.RunState`) is used, whichever host they ran on. A training that ended by itself before it was
    stopped is recorded with its own exit code. Where NVML is present, the lease is freed only once the
    booked devices hold none of the run's processes (``force_release``: free it anyway).

    :param lease_id: free only this lease (a reaper or a manual release), not a newer one of the run.
    :param stopped: the manual stop of this run (``autodl leases --release``); default: the one the store
        holds for the run's lease, if any. A training stopped by hand that did not end by itself with exit 0
        is recorded with outcome ``stopped`` and who stopped it (``stopped``), never as a failure.
    :returns: the run's :class:`autodl.records.RunResult` as JSON (outcome, record key, peaks, duration).
    """
    from autodl.queue import AdmissionQueue

    folder = state_dir(ctx.run_key)
    state = RunState()
    if handle_json is None:
        handle_json = state.get(ctx.run_key, RunState.HANDLE)
    if handle_json and handle_json.get("run_key") not in (None, ctx.run_key):
        log(f"ignoring a launch handle of another run ({str(handle_json.get('run_key'))[:200]!r}) found for "
            f"{ctx.run_key}: its training is not this run's to stop")
        handle_json = None
    if metrics_json is None:
        metrics_json = state.get(ctx.run_key, RunState.METRICS)
    profile_out = profile_out if profile_out is not None else state.get(ctx.run_key, RunState.PROFILE)
    selection = selection if selection is not None else state.get(ctx.run_key, RunState.SELECTION)
    profile_out = profile_out.model_dump(mode="json") if isinstance(profile_out, ProfileResult) else profile_out
    selection = selection.model_dump(mode="json") if isinstance(selection, Selection) else selection
    report = state.get(ctx.run_key, RunState.REPORT)
    decision = state.get(ctx.run_key, RunState.DECISION)
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
    AdmissionQueue().leave(ctx.run_key)
    if stopped is None:
        stopped = Ledger().stop_mark(lease_id or ((selection or {}).get("lease") or {}).get("lease_id")
                                     or (handle.lease_id if handle is not None else None))
    if clear or force_release:
        released = Ledger().release(ctx.run_key, lease_id)
        if released:
            log(f"released lease {released.lease_id} of run {ctx.run_key} on {', '.join(released.device_ids)}")
        else:
            log(f"run {ctx.run_key} held no lease any more (already released"
                + (f": {stopped.describe()})" if stopped else ")") + "; nothing to free")
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
    elif stopped is not None:
        outcome = "stopped"
    else:
        outcome = "failed"
    if outcome != "stopped":
        stopped = None
    profile = profile_out.get("profile") if profile_out else None
    placement = selection.get("placement") if selection else (released.placement if released else None)
    declared = bool(selection.get("declared_pool")) if selection else bool(profile_out and profile_out.get("declared_pool"))
    if stopped is not None:  # what the collect step said of the same stop is not said twice
        failures = {k: v for k, v in failures.items() if stopped.describe() not in v}
        failures = {"stopped": stopped.describe() + (f" (the training exited with {exit_code} on the stop signal)"
                                                     if exit_code is not None else ""), **failures}
    error = "; ".join(f"{k}: {v}" for k, v in distinct_failures(failures).items()) or None
    oom = (metrics_json or {}).get("oom") if outcome == "failed" else None
    if outcome == "failed" and oom:
        error = "; ".join(filter(None, [error, f"out of memory: {oom.get('explanation')}"]))
        from autodl.oom import calibration_tag  # what this OOM calibrates: script content, configuration, memory

        oom = calibration_tag(oom, script=(profile_out or {}).get("script") or script, profile=profile,
                              device_kind="cpu" if declared else ((placement or {}).get("model") or "gpu"))
    requeued = state.get(ctx.run_key, RunState.REQUEUED)
    if outcome == "not_started" and not error and requeued:  # its booking's host never had a worker to launch it
        error = f"launch: never started: {requeued.get('message')}"
    if outcome == "not_started" and not error:  # Airflow itself ended a step (a lost worker, an API timeout)
        step = "profile" if profile_out is None else "select_device" if selection is None else "launch"
        error = (f"{step}: never started, and no step recorded why: the {step} task ended without a result and "
                 "without an autodl error (Airflow failed it: a lost worker, the execution API timing out, a task "
                 "marked failed); its log in Airflow says more, and a retry of it is safe")
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
        device_model=(placement or {}).get("model"), error=error, report=report, decision=decision, stopped=stopped,
        notes=[str(requeued.get("message"))] if requeued else [],
    )
    store = RecordStore()
    previous = store.get(ctx.run_key)
    from autodl.records import same_attempt

    if previous is not None and not same_attempt(record, json.loads(previous.model_dump_json())):
        log(f"a new attempt of {ctx.run_key} (lease {record.lease_id}, was {previous.lease_id}): the record is this "
            f"attempt's; the earlier one is kept in its attempts")
        previous = None  # nothing of another attempt is carried over (its error, its training)
    if previous is not None:  # a second writer (the run's own release after a reaper) keeps what the first knew
        record = record.model_copy(update={
            k: getattr(previous, k) for k in ("dag_id", "run_id", "profile", "placement", "lease_id", "launch", "metrics",
                                              "estimated_peak_bytes", "actual_peak_bytes", "device_model")
            if getattr(record, k) is None and getattr(previous, k) is not None
        })
        if (previous.stopped is not None and record.outcome == "failed" and record.lease_id
                and previous.stopped.lease_id == record.lease_id):  # the stop of this very lease, recorded first
            record = record.model_copy(update={"outcome": "stopped", "stopped": previous.stopped,
                                               "error": previous.error, "oom": None})
            outcome = "stopped"
    from autodl.records import with_sharing

    # whom the run shared its device with: the released lease lists every neighbour that joined, the booking's copy
    # may not
    record = with_sharing(record, released or (selection or {}).get("lease"), previous=previous)
    store.write(record)
    if previous is None:  # a retried release must not teach the policy the same run twice (a new attempt teaches)
        try:
            from autodl.policy import observe

            observe(record, catalog=load_catalog())
        except Exception as exc:  # noqa: BLE001 - learning must never lose the record or keep the lease
            log(f"the learning policy could not learn from this run: {exc}")
    from autodl.config import store_url
    from autodl.store import redact_url

    log(f"run record written: {ctx.run_key} outcome={outcome} store={redact_url(store_url())}")
    from autodl.records import RunResult

    return RunResult.of(record, record_store=redact_url(store_url()), lease_released=bool(released),
                        lease_kept=not (clear or force_release)).model_dump(mode="json")
