"""Step 2, wait for the pool: join the admission queue and wait until it books devices for the run."""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from typing import Any

from autodl.catalog import Catalog, load_catalog
from autodl.errors import AutoDLError, LeaseError, LeaseLost, WaitTimeout
from autodl.inventory import read_inventory
from autodl.launch.options import KubernetesOptions
from autodl.ledger import Ledger
from autodl.records import RecordStore
from autodl.spec import TaskSpec
from autodl.steps.context import RunContext
from autodl.steps.inputs import keep_decision, run_spec
from autodl.steps.profile import fits_ever, format_candidates, no_fit_error, plan
from autodl.steps.reaper import reap_expired
from autodl.store import RunState
from autodl.types import (
    Device,
    Inventory,
    Lease,
    LeaseOwner,
    PlacementDecision,
    ProfileResult,
    QueueEntry,
    ResourceProfile,
    Selection,
    utcnow,
)
from autodl.waiting import holders_by_device


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
    from autodl.queue import AdmissionQueue, queue_rules

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
    reused = _reuse_held_lease(ctx, ledger, queue, inventory, spec, log)
    if reused is not None:
        return reused
    reap_expired(log=log, launcher_kwargs_for=launcher_kwargs_for)

    everywhere = plan(profile, spec, inventory=inventory, catalog=catalog, leased=frozenset())
    if not everywhere.fits:
        queue.leave(ctx.run_key)
        raise no_fit_error(profile, everywhere, inventory, spec.resource_policy.memory_threshold)
    if isinstance(spec.launcher, KubernetesOptions) and spec.launcher.kueue_queue:
        queue.leave(ctx.run_key)
        return _book_for_kueue(ctx, profile, spec, inventory, ledger, log)
    rules = queue_rules(inventory)
    entry = _join_queue(ctx, queue, profile, spec, inventory, everywhere, catalog, rules, poke=poke, timeout=timeout,
                        pool=pool)
    now = utcnow()
    _check_wait_deadline(ctx, queue, entry, now, timeout)
    admitted = _admission_grant(ctx, queue, entry, ledger, inventory, profile, spec, catalog, rules, now, log)
    if admitted is None:
        return None
    grant, terms, decision = admitted
    return _book_admitted(ctx, queue, ledger, inventory, profile, spec, entry, grant, terms, decision, now, log)


def _reuse_held_lease(ctx: RunContext, ledger: Ledger, queue: Any, inventory: Inventory, spec: TaskSpec,
                      log: Callable[[str], None]) -> Selection | None:
    """The selection of a lease the run already holds (a retried or resumed wait), renewed; None when it holds none."""
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
            return selection_of(held, inventory, spec.scheduler.algorithm)
    return None


def _check_wait_deadline(ctx: RunContext, queue: Any, entry: QueueEntry, now: datetime, timeout: float) -> None:
    """Leave the admission queue and raise :class:`WaitTimeout` when the run has waited past its deadline."""
    if entry.deadline_at is not None and now > entry.deadline_at:
        queue.leave(ctx.run_key)
        raise WaitTimeout(f"run {ctx.run_key}: no fitting device became free within {timeout:g} s (scheduler.timeout); "
                          f"it waited since {entry.enqueued_at.isoformat()}.")


def _admission_grant(ctx: RunContext, queue: Any, entry: QueueEntry, ledger: Ledger, inventory: Inventory,
                     profile: ResourceProfile, spec: TaskSpec, catalog: Catalog, rules: Any, now: datetime,
                     log: Callable[[str], None]) -> tuple[Any, Any, PlacementDecision | None] | None:
    """The admission queue's (grant, packing terms, placement decision) for the run; None, the wait logged, if none."""
    from autodl.queue import decide, free_devices, held_by_team, packed_grant, running_runs

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
                                    ledger.shares, leases, rules, held_back, place_own,
                                    once_per_run(ctx.run_key, log, entry.enqueued_at),
                                    model_name=spec.task.model_name or profile.model_name)
    if grant is None:
        why = _packed_why(reasons.get(ctx.run_key), entry, inventory, ledger, leases, profile, spec)
        _log_waiting(ctx, queue.in_order(now, queues=rules.queues, held=held_by_team(leases)), leases, entry, log, why)
        return None
    decision = next((d for d in decisions.values() if d.chosen and tuple(d.chosen.devices) == tuple(grant.devices)), None)
    return grant, terms, decision


def _book_admitted(ctx: RunContext, queue: Any, ledger: Ledger, inventory: Inventory, profile: ResourceProfile,
                   spec: TaskSpec, entry: QueueEntry, grant: Any, terms: Any, decision: PlacementDecision | None,
                   now: datetime, log: Callable[[str], None]) -> Selection | None:
    """Book the granted devices, leave the admission queue and record the admission; None on a lost booking race."""
    from autodl.admissions import Admissions

    chosen = decision.chosen if decision else None
    by_id = {d.device_id: d for d in inventory.devices}
    device_ids = [str(d) for d in grant.devices]  # device ids (autodl.policy.admission keys devices by any hashable)
    first = by_id[device_ids[0]]
    try:
        lease = ledger.book(ctx.run_key, device_ids, host=first.host, model=first.model,
                            owner=owner_of(ctx, entry.team), launcher=spec.launcher.type,
                            placement=_placement_of(chosen, (spec.task.model_name or profile.model_name) if terms else None),
                            expected_runtime_s=_stretched(_runtime_on(entry, first.model), terms, log),
                            **(terms.booking() if terms else {}))
    except LeaseError as exc:
        log(f"lost a booking race ({exc}); still waiting")
        return None
    queue.leave(ctx.run_key)
    Admissions().record(ctx.run_key, waited_s=(now - entry.enqueued_at).total_seconds(), num_gpus=len(grant.devices),
                        team=entry.team, device_model=first.model, now=now)
    return _booked_selection(ctx, lease, by_id, inventory, spec, entry, grant, decision, now, log)


def _booked_selection(ctx: RunContext, lease: Lease, by_id: dict[str, Device], inventory: Inventory, spec: TaskSpec,
                      entry: QueueEntry, grant: Any, decision: PlacementDecision | None, now: datetime,
                      log: Callable[[str], None]) -> Selection:
    """Keep the placement decision, log the candidates and the lease booked, and store the run's selection."""
    chosen = decision.chosen if decision else None
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
    groups = candidate_groups(inventory, fits_ever(profile, spec, inventory), ranked)
    est = None
    if queue.get(ctx.run_key) is None:   # set once, when the run first joins (see AdmissionQueue.join)
        types = {rules.device_type(g[0]) for g in groups if g} if rules.device_type else set()
        est = estimate_run(profile, types, catalog, recorded=recorded_runtime(ctx),
                           train_steps=spec.scheduler.train_steps)
    return queue.join(
        ctx.run_key, num_gpus=profile.num_gpus, needed_bytes=everywhere.needed_bytes, candidates=groups,
        stale_after_s=stale_after(poke), vendors=spec.resource_policy.allowed_vendors, dag_id=ctx.dag_id,
        run_id=ctx.run_id, owner_user=ctx.user, pool=pool, timeout_s=timeout,
        team=team_of(spec.scheduler.team, ctx.user), priority=rules.queues.priority(spec.scheduler.priority),
        expected_runtime_s=est.expected_runtime_s if est else None,
        speed_by_type=est.speed_by_type if est else None, runtime_source=est.runtime_source if est else None,
        sharing=spec.resource_policy.sharing,
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


def _stretched(runtime_s: float | None, terms: Any, log: Callable[[str], None]) -> float | None:
    """A run that joins a packed device runs slower: its expected runtime (seconds) over its expected speed there
    (``terms.speed_ratio``, a fraction of solo), so the queue's reservations for others are not set too early."""
    ratio = getattr(terms, "speed_ratio", None)
    if runtime_s is None or not ratio or ratio <= 0:
        return runtime_s
    log(f"sharing: expected runtime {runtime_s:.0f} s solo, {runtime_s / ratio:.0f} s beside its neighbour "
        f"({ratio:.2f} of solo speed: {terms.speed_source})")
    return runtime_s / ratio


def _book_for_kueue(ctx: RunContext, profile: ResourceProfile, spec: TaskSpec, inventory: Inventory, ledger: Ledger,
                    log: Callable[[str], None]) -> Selection | None:
    """The Kueue mode's wait: no entry in autodl's admission queue (Kueue's ClusterQueue orders and admits the
    pod, created behind Kueue's scheduling gate); the best fitting devices no other autodl run holds are booked
    at once, so the launch knows the device model and count to request. None while every fitting device is
    held by another autodl run."""
    leased = frozenset(d for le in ledger.leases() for d in le.device_ids)
    decision = plan(profile, spec, inventory=inventory, catalog=load_catalog(), leased=leased)
    queue_name = spec.launcher.kueue_queue if isinstance(spec.launcher, KubernetesOptions) else None
    log(f"Kueue mode (LocalQueue {queue_name}): autodl's admission queue steps aside; the pod is "
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


def _fitting(entry: QueueEntry) -> list[str]:
    """Every device the run could use (its queue entry's candidate groups, leases ignored), in the policy's order.
    (The plan's kept candidates name only the best device set of each host and model, so they left out a second
    fitting device of the same model.)"""
    return list(dict.fromkeys(d for group in entry.candidates for d in group))


GENERIC_WAIT = "no device is free now"
"""The queue's reason when nothing is free (:func:`autodl.queue.admission`); a packed run says more instead."""


def _packed_why(why: str | None, entry: QueueEntry, inventory: Inventory, ledger: Ledger,
                leases: list[Lease], profile: ResourceProfile, spec: TaskSpec) -> str | None:
    """The run's reason to wait: the queue's ``why``; for a packed 1-device run, its generic "no device is free
    now" as what fills each fitting device (:func:`autodl.waiting.packed_wait_reason`), when that is known."""
    from autodl.queue import known_estimate
    from autodl.waiting import packed_wait_reason

    if spec.resource_policy.sharing != "packed" or profile.num_gpus != 1:
        return why
    if why is not None and not why.startswith(GENERIC_WAIT):
        return why
    by_id = {d.device_id: d for d in inventory.devices}
    packed = packed_wait_reason([by_id[d] for d in _fitting(entry) if d in by_id], ledger.shares(),
                                known_estimate(profile), spec.resource_policy.memory_threshold, leases)
    if packed is None:
        return why
    return packed + (why[len(GENERIC_WAIT):] if why else "")


MAX_SAID = 64
"""Refusals remembered per run (the newest kept): more distinct (device, reason) pairs than a pool shows one run."""


def once_per_run(run_key: str, log: Callable[[str], None], since: datetime | None = None) -> Callable[[str], None]:
    """``log`` that says each line once per run's wait, across polls (a poll is a task try of its own): the packing
    refusals (``sharing: not packed on GPU0: ...``, one a run, device and reason) would else repeat on every
    poll. The lines said are kept in the run state (:data:`autodl.store.RunState.SAID`, the newest
    :data:`MAX_SAID`) with ``since`` (when the run joined the queue): a later wait of the run key says them again."""
    mark = since.isoformat() if since else None

    def say(line: str) -> None:
        state = RunState()
        kept = state.get(run_key, RunState.SAID) or {}
        said = list(kept.get("lines", [])) if kept.get("since") == mark else []
        if line in said:
            return
        log(line)
        state.put(run_key, RunState.SAID, {"since": mark, "lines": (said + [line])[-MAX_SAID:]})
    return say


def _log_waiting(ctx: RunContext, order: list, leases: list[Lease], entry: QueueEntry,
                 log: Callable[[str], None], why: str | None = None) -> None:
    keys = [e.run_key for e in order]
    place = keys.index(ctx.run_key) + 1 if ctx.run_key in keys else None
    ahead = keys[: place - 1] if place else []
    holders = holders_by_device(_fitting(entry), leases)
    log(f"waiting: #{place or '?'} of {len(keys)} in the admission queue"
        + (f" behind {', '.join(ahead[:3])}{' ...' if len(ahead) > 3 else ''}" if ahead else "")
        + (f"; fitting devices held by {'; '.join(holders)}" if holders else "")
        + (f"; why: {why}" if why else "")
        + "; autodl queue shows the expected start")


def selection_of(lease: Lease, inventory: Inventory, algorithm: str) -> Selection:
    """The :class:`autodl.types.Selection` of a lease already held: its devices as the pool lists them."""
    by_id = {d.device_id: d for d in inventory.devices}
    return _selection(lease, [by_id[i] for i in lease.device_ids if i in by_id], inventory, algorithm, lease.placement)


def _selection(lease, devices: list[Device], inventory: Inventory, algorithm: str, chosen: dict | None,
               candidates_log: list[str] | None = None) -> Selection:
    return Selection(
        lease=lease, placement=chosen or {"devices": lease.device_ids, "model": lease.model, "host": lease.host},
        devices=list(devices), declared_pool=inventory.declared, pool_source=inventory.source, algorithm=algorithm,
        candidates_log=list(candidates_log or []),
    )
