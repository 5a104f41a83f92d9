"""Step 6, release and record: gather what the run's steps kept (facts), decide its outcome (pure), free its lease and write its run record."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from autodl.catalog import load_catalog
from autodl.ledger import Ledger
from autodl.records import RecordStore
from autodl.steps.collect import distinct_failures
from autodl.steps.context import RunContext, note_failure, read_failures, state_dir
from autodl.steps.training import exit_status, stop_training
from autodl.store import RunState
from autodl.types import LaunchHandle, Lease, ProfileResult, RunOutcome, RunRecord, Selection, StopMark
from autodl.untrusted import read_json_object


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


"""A run record's outcome (:attr:`autodl.types.RunRecord.outcome`)."""


class ReleaseFacts(BaseModel):
    """What the release step knows of a run once its training is stopped and its lease freed or kept: what the
    earlier steps kept in the run state (:class:`autodl.store.RunState`), what the launcher and the ledger said.
    The one input of :func:`decide_outcome`."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    profile_out: dict[str, Any] | None = Field(default=None, description="The profile step's result, JSON.")
    selection: dict[str, Any] | None = Field(default=None, description="The select step's result, JSON.")
    handle: LaunchHandle | None = Field(default=None, description="The launch handle: None, never launched.")
    metrics: dict[str, Any] | None = Field(
        default=None, description="The collect step's metrics, JSON, with the launcher's exit code where collect "
                                  "never saw the end.")
    report: dict[str, Any] | None = Field(default=None, description="The training's own report.")
    decision: dict[str, Any] | None = Field(default=None, description="The placement decision kept by the steps.")
    requeued: dict[str, Any] | None = Field(
        default=None, description="The re-queue of a booking nothing launched (:data:`autodl.store.RunState.REQUEUED`).")
    failures: dict[str, str] = Field(default_factory=dict, description="Each step's failure reason, by step.")
    exit_code: int | None = Field(default=None, description="The training's exit code; None: not known.")
    stopped: StopMark | None = Field(default=None, description="The manual stop of the run's lease, if any.")
    released: Lease | None = Field(default=None, description="The lease this release freed; None: none freed.")
    lease_kept: bool = Field(default=False, description="The lease was kept: the run's processes still hold its devices.")


class Outcome(BaseModel):
    """How a run ended, decided from its :class:`ReleaseFacts` alone (:func:`decide_outcome`)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    outcome: RunOutcome = Field(description="The run record's outcome.")
    error: str | None = Field(default=None, description="Why it did not succeed, each step's reason once.")
    stopped: StopMark | None = Field(default=None, description="Who stopped it: only on outcome ``stopped``.")
    oom: dict[str, Any] | None = Field(
        default=None, description="The collect's out-of-memory finding: only on outcome ``failed``.")


def decide_outcome(facts: ReleaseFacts) -> Outcome:
    """The run's outcome and error from what the release knows (pure).

    Never launched: ``not_started``; exit code 0: ``succeeded`` (even when stopped by hand, it ended first); a manual
    stop: ``stopped``, who stopped it first among the reasons; else ``failed``. A run without any recorded reason
    gets one that says what is known (its re-queue, the step Airflow ended, its exit code).
    """
    exit_code, stopped, failures = facts.exit_code, facts.stopped, facts.failures
    outcome: RunOutcome
    if facts.handle is None:
        outcome = "not_started"
    elif exit_code == 0:
        outcome = "succeeded"
    elif stopped is not None:
        outcome = "stopped"
    else:
        outcome = "failed"
    if outcome != "stopped":
        stopped = None
    if stopped is not None:  # what the collect step said of the same stop is not said twice
        failures = {k: v for k, v in failures.items() if stopped.describe() not in v}
        failures = {"stopped": stopped.describe() + (f" (the training exited with {exit_code} on the stop signal)"
                                                     if exit_code is not None else ""), **failures}
    error = "; ".join(f"{k}: {v}" for k, v in distinct_failures(failures).items()) or None
    oom = (facts.metrics or {}).get("oom") if outcome == "failed" else None
    if outcome == "failed" and oom:
        error = "; ".join(filter(None, [error, f"out of memory: {oom.get('explanation')}"]))
    if outcome == "not_started" and not error:
        error = _never_started(facts)
    if outcome == "failed" and not error and exit_code is not None:
        error = f"training failed with exit code {exit_code}"
    return Outcome(outcome=outcome, error=error, stopped=stopped, oom=oom)


def _never_started(facts: ReleaseFacts) -> str:
    """Why a run that never started and whose steps recorded no reason did not start."""
    requeued = facts.requeued
    if requeued:  # its booking's host never had a worker to launch it
        return f"launch: never started: {requeued.get('message')}"
    # Airflow itself ended a step (a lost worker, an API timeout)
    step = "profile" if facts.profile_out is None else "select_device" if facts.selection is None else "launch"
    return (f"{step}: never started, and no step recorded why: the {step} task ended without a result and "
            "without an autodl error (Airflow failed it: a lost worker, the execution API timing out, a task "
            "marked failed); its log in Airflow says more, and a retry of it is safe")


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
    facts = gather_facts(ctx, profile_out=profile_out, selection=selection, handle_json=handle_json,
                         metrics_json=metrics_json, launcher_kwargs=launcher_kwargs, log=log, lease_id=lease_id,
                         force_release=force_release, stopped=stopped)
    outcome = decide_outcome(facts)
    record = write_record(run_record(ctx, facts, outcome, script=script, spec_path=spec_path), log=log)
    from autodl.config import store_url
    from autodl.records import RunResult
    from autodl.store import redact_url

    return RunResult.of(record, record_store=redact_url(store_url()), lease_released=bool(facts.released),
                        lease_kept=facts.lease_kept).model_dump(mode="json")


def _kept(ctx: RunContext, *, profile_out: ProfileResult | dict[str, Any] | None,
          selection: Selection | dict[str, Any] | None, handle_json: dict[str, Any] | None,
          metrics_json: dict[str, Any] | None, log: Callable[[str], None]) -> dict[str, Any]:
    """The inputs not given, as the earlier steps kept them in the run state (JSON); a handle of another run dropped."""
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
    return {"profile_out": profile_out, "selection": selection, "handle_json": handle_json, "metrics": metrics_json,
            "report": state.get(ctx.run_key, RunState.REPORT), "decision": state.get(ctx.run_key, RunState.DECISION),
            "requeued": state.get(ctx.run_key, RunState.REQUEUED)}


def gather_facts(ctx: RunContext, *, profile_out: ProfileResult | dict[str, Any] | None,
                 selection: Selection | dict[str, Any] | None, handle_json: dict[str, Any] | None,
                 metrics_json: dict[str, Any] | None, launcher_kwargs: dict[str, Any] | None = None,
                 log: Callable[[str], None] = print, lease_id: str | None = None, force_release: bool = False,
                 stopped: StopMark | None = None) -> ReleaseFacts:
    """Stop a training still running, leave the queue, free the lease (unless its devices still hold the run's
    processes), and gather what is then known of the run (see :func:`step_release_and_record` for the inputs)."""
    from autodl.queue import AdmissionQueue

    folder = state_dir(ctx.run_key)  # made first, as ever; raises for a folder of another run key
    kept = _kept(ctx, profile_out=profile_out, selection=selection, handle_json=handle_json,
                 metrics_json=metrics_json, log=log)
    handle_json, metrics_json = kept.pop("handle_json"), kept["metrics"]
    handle = LaunchHandle.model_validate(handle_json) if handle_json else None
    clear = True
    launcher_exit = None
    if handle is not None:
        stop_training(handle_json, launcher_kwargs=launcher_kwargs, log=log,
                      why="still running after collect ended: stopping it before releasing its devices")
        launcher_exit = exit_status(handle_json, launcher_kwargs=launcher_kwargs)
        if not handle.on_cpu:  # where NVML is present: the devices hold none of the run's processes any more
            from autodl.metrics import wait_devices_clear

            clear = wait_devices_clear([d for d in handle.device_ids if d.startswith(("GPU-", "MIG-"))], folder,
                                       log=log)
    AdmissionQueue().leave(ctx.run_key)
    if stopped is None:
        stopped = Ledger().stop_mark(lease_id or ((kept["selection"] or {}).get("lease") or {}).get("lease_id")
                                     or (handle.lease_id if handle is not None else None))
    released = _release(ctx, lease_id, free=clear or force_release, stopped=stopped, log=log)
    failures = read_failures(ctx.run_key)
    exit_code = metrics_json.get("exit_code") if metrics_json else None
    if exit_code is None and launcher_exit is not None:
        # collect never saw the end (its Airflow process was lost): the launcher's exit status is the outcome
        exit_code = launcher_exit
        kept["metrics"] = {**(metrics_json or {}), "exit_code": launcher_exit}
        log(f"training {ctx.run_key} exit status from the launcher: {launcher_exit}")
    return ReleaseFacts(**kept, handle=handle, failures=failures, exit_code=exit_code, stopped=stopped,
                        released=released, lease_kept=not (clear or force_release))


def _release(ctx: RunContext, lease_id: str | None, *, free: bool, stopped: StopMark | None,
             log: Callable[[str], None]) -> Lease | None:
    """Free the run's lease (``lease_id``: only that one) when ``free``; else keep it and say why."""
    if free:
        released = Ledger().release(ctx.run_key, lease_id)
        if released:
            log(f"released lease {released.lease_id} of run {ctx.run_key} on {', '.join(released.device_ids)}")
        else:
            log(f"run {ctx.run_key} held no lease any more (already released"
                + (f": {stopped.describe()})" if stopped else ")") + "; nothing to free")
        return released
    note_failure(ctx.run_key, "release", "lease kept: the run's processes still hold its devices after the stop; "
                                         f"free it with `autodl leases --release {ctx.run_key}` once they are gone")
    log(f"lease of {ctx.run_key} KEPT: its devices are not empty")
    return None


def run_record(ctx: RunContext, facts: ReleaseFacts, outcome: Outcome, *, script: str | None,
               spec_path: str | None) -> RunRecord:
    """The run record of this attempt from its facts and outcome (an OOM tagged with what it calibrates)."""
    profile_out, selection, released, metrics_json = facts.profile_out, facts.selection, facts.released, facts.metrics
    profile = profile_out.get("profile") if profile_out else None
    placement = selection.get("placement") if selection else (released.placement if released else None)
    declared = bool(selection.get("declared_pool")) if selection else bool(profile_out and profile_out.get("declared_pool"))
    oom = outcome.oom
    if outcome.outcome == "failed" and oom:
        from autodl.oom import calibration_tag  # what this OOM calibrates: script content, configuration, memory

        oom = calibration_tag(oom, script=(profile_out or {}).get("script") or script, profile=profile,
                              device_kind="cpu" if declared else ((placement or {}).get("model") or "gpu"))
    requeued, handle = facts.requeued, facts.handle
    record = RunRecord(
        run_key=ctx.run_key, dag_id=ctx.dag_id, run_id=ctx.run_id,
        script=(profile_out or {}).get("script") or str(script or ""),
        spec_path=(profile_out or {}).get("spec_path") or (str(spec_path) if spec_path else None),
        outcome=outcome.outcome, declared_pool=declared, profile=profile, placement=placement,
        lease_id=(selection or {}).get("lease", {}).get("lease_id") or (released.lease_id if released else None),
        launch=handle.to_json() if handle else None, metrics=metrics_json,
        estimated_peak_bytes=profile.get("peak_memory_bytes") if profile else None,
        actual_peak_bytes=metrics_json.get("peak_memory_bytes") if metrics_json else None,
        allocated_peak_bytes=(metrics_json or {}).get("allocated_peak_bytes"),
        reserved_peak_bytes=(metrics_json or {}).get("reserved_peak_bytes"), oom=oom,
        device_model=(placement or {}).get("model"), error=outcome.error, report=facts.report,
        decision=facts.decision, stopped=outcome.stopped,
        notes=[str(requeued.get("message"))] if requeued else [],
    )
    from autodl.records import with_sharing

    # whom the run shared its device with: the released lease lists every neighbour that joined, the booking's copy
    # may not
    return with_sharing(record, released or (selection or {}).get("lease"))


def write_record(record: RunRecord, *, log: Callable[[str], None] = print) -> RunRecord:
    """Write ``record``, keeping what an earlier writer of the same attempt knew; the policy learns from a first
    record of an attempt. :returns: the record written."""
    store = RecordStore()
    previous = store.get(record.run_key)
    from autodl.records import same_attempt

    if previous is not None and not same_attempt(record, json.loads(previous.model_dump_json())):
        log(f"a new attempt of {record.run_key} (lease {record.lease_id}, was {previous.lease_id}): the record is this "
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
        if record.sharing == "exclusive":  # this writer had no lease to read it from: the first writer's sharing
            from autodl.records import with_sharing

            record = with_sharing(record, None, previous=previous)
    store.write(record)
    if previous is None:  # a retried release must not teach the policy the same run twice (a new attempt teaches)
        try:
            from autodl.policy import observe

            observe(record, catalog=load_catalog())
        except Exception as exc:  # noqa: BLE001 - learning must never lose the record or keep the lease
            log(f"the learning policy could not learn from this run: {exc}")
    from autodl.config import store_url
    from autodl.store import redact_url

    log(f"run record written: {record.run_key} outcome={record.outcome} store={redact_url(store_url())}")
    return record
