"""``PoolTrigger``: polls the inventory and the ledger from the triggerer until a fitting device is free."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

from airflow.triggers.base import BaseTrigger, TriggerEvent


class PoolTrigger(BaseTrigger):
    """Fires ``{"status": "available"}`` when a fitting device set is free, ``{"status": "no_fit",
    "message": ...}`` when nothing in the pool could ever hold the run.

    :param profile_out: the profile step's XCom (profile, spec path).
    :param pool: inventory source (see :func:`autodl.inventory.read_inventory`).
    :param poke_interval: seconds between checks.
    """

    def __init__(self, profile_out: dict[str, Any], pool: str | None = None, poke_interval: float = 30.0):
        super().__init__()
        self.profile_out = profile_out
        self.pool = pool
        self.poke_interval = poke_interval

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return ("autodl.triggers.pool.PoolTrigger",
                {"profile_out": self.profile_out, "pool": self.pool, "poke_interval": self.poke_interval})

    async def run(self) -> AsyncIterator[TriggerEvent]:
        from autodl.errors import NoFitError
        from autodl.pipeline import step_wait

        while True:
            try:
                ready = await asyncio.to_thread(step_wait, self.profile_out, pool=self.pool, log=self.log.info)
            except NoFitError as exc:
                yield TriggerEvent({"status": "no_fit", "message": str(exc)})
                return
            if ready:
                yield TriggerEvent({"status": "available", "message": "fitting device free"})
                return
            await asyncio.sleep(self.poke_interval)
