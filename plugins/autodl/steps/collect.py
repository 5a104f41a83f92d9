"""Step 5, collect: follow the training to its end within its limits (:class:`CollectLimits`, :class:`CollectGuard`) and keep its metrics."""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from autodl.errors import AutoDLError, LeaseLost, StoreUnavailable, TrainingFailed
from autodl.hosts import require_here
from autodl.launch import get_launcher
from autodl.ledger import Ledger
from autodl.spec import TaskSpec
from autodl.steps.context import GiB, RunContext, keep_report, note_failure, state_dir
from autodl.steps.inputs import run_spec
from autodl.store import RunState
from autodl.types import LaunchHandle, ProfileResult, RunMetrics, StopStatus
from autodl.untrusted import atomic_write_text


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
