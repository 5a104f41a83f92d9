"""PoolTrigger (deferrable wait): fires when a leased device frees up; reports a run that can never fit."""

from __future__ import annotations

import asyncio

from autodl.ledger import Ledger
from autodl.types import MemoryBreakdown, ResourceProfile

DEMO_IDS = ["GPU-demo0000-a100-0000-0000-000000000000", "GPU-demo0001-v100-0000-0000-000000000000",
            "GPU-demo0002-3090-0000-0000-000000000000"]


def profile_out(peak_gib: float) -> dict:
    act = int(peak_gib * 2**30) - 3000
    b = MemoryBreakdown(weights_bytes=1000, gradients_bytes=1000, optimizer_state_bytes=1000, activations_bytes=act)
    p = ResourceProfile(script="/x.py", params=250, peak_memory_bytes=b.total_bytes, breakdown=b,
                        flops_per_step=1e9, batch_size=8, activation_bytes_per_sample=act // 8)
    return {"profile": p.to_json(), "spec_path": None, "script": "/x.py"}


def test_trigger_waits_for_a_release_then_fires(autodl_home):
    from autodl.triggers.pool import PoolTrigger

    ledger = Ledger()
    ledger.book("other-run", DEMO_IDS)
    trigger = PoolTrigger(profile_out=profile_out(1.0), pool=None, poke_interval=0.05)
    classpath, kwargs = trigger.serialize()
    assert classpath == "autodl.triggers.pool.PoolTrigger" and kwargs["poke_interval"] == 0.05

    async def scenario():
        events = trigger.run().__aiter__()
        first = asyncio.ensure_future(events.__anext__())
        await asyncio.sleep(0.3)
        fired_while_leased = first.done()
        ledger.release("other-run")
        event = await first
        return fired_while_leased, event

    fired_while_leased, event = asyncio.run(scenario())
    assert fired_while_leased is False
    assert event.payload["status"] == "available"


def test_trigger_reports_no_fit(autodl_home):
    from autodl.triggers.pool import PoolTrigger

    trigger = PoolTrigger(profile_out=profile_out(500.0), poke_interval=0.05)

    async def first_event():
        async for event in trigger.run():
            return event

    event = asyncio.run(first_event())
    assert event.payload["status"] == "no_fit" and "no device in the pool" in event.payload["message"]
