"""``CollectTrigger``: follows a launched training from the triggerer, so no worker slot is held while it trains."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any

from airflow.triggers.base import BaseTrigger, TriggerEvent

from autodl.triggers import MIN_DEFERRAL_S, hold_until


class CollectTrigger(BaseTrigger):
    """Every ``interval_s`` seconds: polls the process, container or pod, streams the training's new log
    lines into the task log, samples metrics (:class:`autodl.metrics.Follower`), heartbeats the lease and
    checks the limits (:class:`autodl.steps.collect.CollectGuard`). Fires once, a :class:`autodl.types.CollectEvent`
    (dumped to JSON only as the event's payload):

    - ``ended`` with the ``exit_code`` when the training ended by itself;
    - ``lease_lost``, ``timed_out``, ``unschedulable`` or ``stopped`` with a ``message`` when it was stopped
      early, and why.

    Both carry the ``metrics`` measured up to then (:class:`autodl.types.RunMetrics`).

    Resumable: the log offset (bytes for a local run, the last line's timestamp in ns for a container or pod,
    :class:`autodl.launch.base.LogStream`) is kept in the run's state folder and the samples file is re-read, so a
    triggerer restart neither repeats log lines nor loses samples.

    :param run: the run's identity (``autodl.steps.context.RunContext`` fields).
    :param handle: the launch step's :class:`~autodl.types.LaunchHandle` as a dict.
    :param limits: :class:`autodl.steps.collect.CollectLimits` fields.
    :param interval_s: seconds between polls.
    :param min_deferral_s: the event is held until this long after the trigger started: see
        :data:`autodl.triggers.MIN_DEFERRAL_S`.
    """

    def __init__(self, run: dict[str, Any], handle: dict[str, Any], limits: dict[str, Any] | None = None,
                 interval_s: float = 5.0, min_deferral_s: float = MIN_DEFERRAL_S):
        super().__init__()
        self.min_deferral_s = min_deferral_s
        self.run_ctx = dict(run)
        self.handle = handle
        self.limits = dict(limits or {})
        self.interval_s = interval_s

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return ("autodl.triggers.collect.CollectTrigger",
                {"run": self.run_ctx, "handle": self.handle, "limits": self.limits, "interval_s": self.interval_s,
                 "min_deferral_s": self.min_deferral_s})

    def log_line(self, line: str) -> None:
        """One line of the training's log, into the task's log (the triggerer routes ``self.log`` there)."""
        self.log.info("[train] %s", line)

    def _setup(self):
        from autodl.metrics import Follower
        from autodl.operators.connections import launcher_kwargs
        from autodl.steps.collect import CollectGuard, CollectLimits, collect_sinks, known_end
        from autodl.steps.context import RunContext, state_dir
        from autodl.types import LaunchHandle

        ctx = RunContext(**self.run_ctx)
        handle = LaunchHandle.model_validate(self.handle)
        launcher, sampler, samples_path, keep, notes = collect_sinks(ctx, handle, handle.launcher,
                                                                     launcher_kwargs(handle.launcher, handle.host))
        offset_file = state_dir(ctx.run_key) / "collect.offset"
        offset = int(offset_file.read_text() or 0) if offset_file.exists() else 0
        follower = Follower(launcher, handle, sampler=sampler, log_sink=self.log_line,
                            samples_path=samples_path, notes=notes, offset=offset, resume=True,
                            ended_ts=known_end(ctx.run_key, handle))
        guard = CollectGuard(ctx, handle, launcher, CollectLimits(**self.limits), log=self.log.info)
        return ctx, handle, launcher, follower, guard, keep, offset_file

    async def run(self) -> AsyncIterator[TriggerEvent]:
        started = time.monotonic()
        event = await self._follow()
        await hold_until(started, self.min_deferral_s)
        yield event

    async def _follow(self) -> TriggerEvent:
        event = await self._event()
        return TriggerEvent(event.model_dump(mode="json"))

    async def _event(self):
        from autodl.steps.collect import stop_early
        from autodl.types import CollectEvent

        ctx, handle, launcher, follower, guard, keep, offset_file = await asyncio.to_thread(self._setup)
        try:
            while True:
                tick = time.monotonic()
                code = await asyncio.to_thread(follower.step)
                offset_file.write_text(str(follower.offset))
                if code is not None:
                    metrics = follower.summary(code)
                    keep(metrics)
                    return CollectEvent(status="ended", exit_code=code, metrics=metrics)
                stopped = await asyncio.to_thread(guard.check)
                if stopped is not None:
                    await asyncio.to_thread(stop_early, ctx, handle, launcher, stopped, self.log.warning)
                    metrics = follower.summary(None)
                    keep(metrics)
                    return CollectEvent(status=stopped.status, message=str(stopped), metrics=metrics)
                # the interval is from tick to tick: the poll and the lease check above are part of it
                await asyncio.sleep(max(0.0, self.interval_s - (time.monotonic() - tick)))
        finally:
            await asyncio.to_thread(follower.close)
