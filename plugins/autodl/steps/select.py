"""Step 3, select: place the run and hold its lease (the one the wait booked, else a new one)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from autodl.catalog import load_catalog
from autodl.errors import PoolBusy
from autodl.inventory import read_inventory
from autodl.ledger import Ledger
from autodl.steps.context import RunContext
from autodl.steps.inputs import run_spec
from autodl.steps.wait import selection_of, step_wait
from autodl.store import RunState
from autodl.types import ProfileResult, Selection


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
            kept = Selection.coerce(saved, what=f"the selection kept for {ctx.run_key}")
            if kept.lease.lease_id == lease.lease_id:
                for line in kept.candidates_log:
                    log(line)
                log(f"using lease {lease.lease_id} booked while waiting: {lease.model} {lease.device_ids}")
                return kept
        log(f"run {ctx.run_key} already holds lease {lease.lease_id} on {lease.device_ids}; reusing it")
        return selection_of(lease, inventory, spec.scheduler.algorithm)
    selection = step_wait(ctx, profile_out, pool=pool, log=log, launcher_kwargs_for=launcher_kwargs_for)
    if selection is None:
        raise PoolBusy(f"run {ctx.run_key}: every fitting device is busy or granted to runs ahead of it in the "
                       "admission queue; it waits again.")
    return selection
