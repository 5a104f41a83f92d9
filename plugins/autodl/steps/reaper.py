"""Leases left behind: reap expired leases, stop what they left running, re-queue bookings nothing launched, free leases by hand or for a failed run."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from datetime import datetime
from typing import Any

from autodl.catalog import load_catalog
from autodl.errors import AutoDLError, LeaseError, NotOwner
from autodl.hosts import this_host
from autodl.inventory import read_inventory
from autodl.ledger import Ledger
from autodl.steps.context import RunContext, note_failure, state_dir
from autodl.steps.inputs import run_spec, source_of
from autodl.steps.profile import fits_ever, plan
from autodl.steps.record import step_release_and_record
from autodl.steps.training import still_running, try_stop
from autodl.store import RunState
from autodl.types import LaunchHandle, Lease, ProfileResult, utcnow


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
        lease.run_key, num_gpus=profile_out.profile.num_gpus, needed_bytes=everywhere.needed_bytes,
        candidates=candidate_groups(inventory, fits_ever(profile_out.profile, spec, inventory), ranked),
        stale_after_s=stale_after(float(spec.scheduler.poke_interval)), vendors=spec.resource_policy.allowed_vendors,
        dag_id=lease.owner.dag_id, run_id=lease.owner.run_id, owner_user=lease.owner.user,
        pool=source_of(profile_out), expected_runtime_s=lease.expected_runtime_s,
        timeout_s=float(spec.scheduler.timeout), team=lease.owner.team, sharing=spec.resource_policy.sharing,
        now=lease.created_at)  # it keeps its place: it was at the front when it was booked, not at the back now
    state.put(lease.run_key, RunState.REQUEUED, {"lease_id": lease.lease_id, "host": lease.host, "message": why,
                                                  "at": utcnow().isoformat()})
    log(f"re-queued {lease.run_key}: {why}")
    return True


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
    result = try_stop(handle, launcher_kwargs=kwargs, log=log, why="was left behind by an expired lease: stopping it")
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
        running = still_running(handle)
        if running:  # the mark first: whoever sees the training end must know it was stopped by hand
            mark = Ledger().mark_stopped(lease, by=user, how=how, forced=not mine)
        training = try_stop(handle, log=log, why=f"is being {mark.describe()}" if mark else "is being stopped")
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
