"""Airflow triggers (run in the triggerer): waiting in the admission queue and following a training
without holding a worker slot.

Follows the cncf-kubernetes provider's ``KubernetesPodTrigger`` (``serialize()`` kwargs, one ``TriggerEvent``):
docs/reference/layout.md#the-anchor-each-part-follows.
"""

import asyncio
import time

MIN_DEFERRAL_S = 10.0
"""A trigger fires no sooner than this many seconds after it started. Airflow 3.3 fails a deferred task whose
trigger fires before the scheduler has read the executor's 'success' for the deferring exit: the stale
event then meets the resumed attempt (same try number) and the task is marked failed
(apache/airflow#71580, #72716; the reschedule form is #71172). 10 s covers the worker's exit and a few
scheduler loops on a loaded machine; the deferring steps also have retries for the rare slower case."""


async def hold_until(started_monotonic: float, minimum_s: float = MIN_DEFERRAL_S) -> None:
    """Sleep until ``minimum_s`` seconds have passed since ``started_monotonic`` (``time.monotonic()``)."""
    left = started_monotonic + minimum_s - time.monotonic()
    if left > 0:
        await asyncio.sleep(left)
