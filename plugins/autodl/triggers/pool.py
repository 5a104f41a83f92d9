"""``PoolTrigger``: waits in autodl's admission queue from the triggerer and books the devices the queue grants."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any

from airflow.triggers.base import BaseTrigger, TriggerEvent

from autodl.triggers import MIN_DEFERRAL_S, hold_until

PERMANENT = ("SpecError", "ProfileError", "CatalogError", "InventoryError", "StateError")
"""Errors a later poll cannot mend (names, to keep the Airflow-free core's classes out of the import path)."""


class PoolTrigger(BaseTrigger):
    """Polls the admission queue every ``poke_interval`` seconds (:func:`autodl.steps.wait.step_wait`: reap
    expired leases, refresh the run's entry, book when the queue grants it devices) and fires once, a
    :class:`autodl.types.PoolEvent` (dumped to JSON only as the event's payload):

    - ``booked`` with the ``selection`` when the run holds its lease (also kept in the run state);
    - ``no_fit`` when nothing in the pool could ever hold the run;
    - ``timeout`` when it waited past ``scheduler.timeout``;
    - ``error`` for a bad spec, script or pool file.

    Other errors (the store or the inventory unreachable for a moment) are logged and the next poll
    tries again: a waiting run does not fail because a poll did.

    :param run: the run's identity (``autodl.steps.context.RunContext`` fields).
    :param profile_out: the profile step's :class:`autodl.types.ProfileResult`, as JSON (the trigger's kwargs).
    :param pool: inventory source (see :func:`autodl.inventory.read_inventory`).
    :param poke_interval: seconds between polls.
    :param timeout_s: seconds the run may wait from when it joined the queue.
    :param min_deferral_s: the event is held until this long after the trigger started (the booking is not):
        see :data:`autodl.triggers.MIN_DEFERRAL_S`.
    """

    def __init__(self, *, run: dict[str, Any], profile_out: dict[str, Any], pool: str | None = None,
                 poke_interval: float = 30.0, timeout_s: float | None = None,
                 min_deferral_s: float = MIN_DEFERRAL_S):
        super().__init__()
        self.min_deferral_s = min_deferral_s
        self.profile_out = profile_out
        self.pool = pool
        self.poke_interval = poke_interval
        self.run_ctx = dict(run)
        self.timeout_s = timeout_s

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return ("autodl.triggers.pool.PoolTrigger",
                {"profile_out": self.profile_out, "pool": self.pool, "poke_interval": self.poke_interval,
                 "run": self.run_ctx, "timeout_s": self.timeout_s, "min_deferral_s": self.min_deferral_s})

    def _poll(self):
        from autodl.operators.connections import launcher_kwargs
        from autodl.steps.context import RunContext
        from autodl.steps.wait import step_wait
        from autodl.types import ProfileResult

        ctx = RunContext(**self.run_ctx)
        profile_out = ProfileResult.coerce(self.profile_out, what="the admission queue trigger's profile_out")
        return step_wait(ctx, profile_out, pool=self.pool, log=self.log.info, poke_interval_s=self.poke_interval,
                         timeout_s=self.timeout_s, launcher_kwargs_for=launcher_kwargs)

    async def run(self) -> AsyncIterator[TriggerEvent]:
        started = time.monotonic()
        event = await self._wait()
        await hold_until(started, self.min_deferral_s)
        yield event

    async def _wait(self) -> TriggerEvent:
        event = await self._event()
        return TriggerEvent(event.model_dump(mode="json"))

    async def _event(self):
        from autodl.errors import AutoDLError, NoFitError, WaitTimeout
        from autodl.types import PoolEvent

        while True:
            try:
                selection = await asyncio.to_thread(self._poll)
            except NoFitError as exc:
                return PoolEvent(status="no_fit", message=str(exc))
            except WaitTimeout as exc:
                return PoolEvent(status="timeout", message=str(exc))
            except AutoDLError as exc:
                if type(exc).__name__ in PERMANENT:
                    return PoolEvent(status="error", message=str(exc))
                self.log.warning("this poll failed, the next one tries again: %s", exc)
                selection = None
            if selection is not None:
                return PoolEvent(status="booked", selection=selection, message=f"booked {selection.lease.device_ids}")
            await asyncio.sleep(self.poke_interval)
