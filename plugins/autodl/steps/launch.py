"""Step 4, launch: build the launch request, start the training on its booked devices, renew or book again a booking that lapsed."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from autodl.catalog import load_catalog
from autodl.config import autodl_home
from autodl.errors import ConfigError, LeaseLost, PoolBusy
from autodl.hosts import booked_host, require_here, this_host
from autodl.launch import LaunchRequest, get_launcher
from autodl.launch.base import host_requests
from autodl.ledger import Ledger
from autodl.profile import BATCH_SIZE_ENV  # the spec's per-device batch, passed to the training
from autodl.spec import TaskSpec, output_dir_path
from autodl.steps.context import (
    DEFAULT_SHM_BYTES,
    OUTPUT_DIR_ENV,
    REPORT_FILE_ENV,
    RunContext,
    begin_attempt,
    state_dir,
)
from autodl.steps.inputs import run_spec, source_of
from autodl.steps.reaper import reap_expired
from autodl.steps.wait import step_wait
from autodl.store import RunState
from autodl.types import ProfileResult, Selection


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
