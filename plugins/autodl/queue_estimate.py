"""What a waiting run expects of itself, for the admission queue: its runtime, where that came from, and its speed per device type.

Details: docs/reference/scheduler.md#autodlqueue_estimate.
"""

from __future__ import annotations

from collections.abc import Iterable

from pydantic import BaseModel, ConfigDict

from autodl.catalog import Catalog
from autodl.types import ResourceProfile


class RunEstimate(BaseModel):
    """The queue's expectation of one run.

    :ivar expected_runtime_s: seconds of training on ``reference_type`` (on any device when that is None);
        None when unknown.
    :ivar runtime_source: ``records``, ``flops`` or None (unknown).
    :ivar speed_by_type: throughput per device type relative to ``reference_type``; None when unknown.
    """

    model_config = ConfigDict(frozen=True)

    expected_runtime_s: float | None = None
    runtime_source: str | None = None
    speed_by_type: dict[str, float] | None = None
    reference_type: str | None = None


def step_times(profile: ResourceProfile, types: Iterable[str], catalog: Catalog) -> dict[str, float]:
    """Estimated seconds per step on each device type the catalog knows (types it does not know, or a
    profile without FLOPs, are left out)."""
    from autodl.errors import CatalogError
    from autodl.profile.runtime import estimate_step_time_s

    out: dict[str, float] = {}
    for t in sorted(set(types)):
        gpu = catalog.find(t)
        if gpu is None:
            continue
        try:
            step = estimate_step_time_s(profile, gpu)
        except CatalogError:
            continue
        if step is not None and step > 0:
            out[t] = step
    return out


def estimate_run(profile: ResourceProfile, types: Iterable[str], catalog: Catalog, *,
                 recorded: tuple[float, str | None] | None = None, train_steps: int | None = None) -> RunEstimate:
    """The queue's expectation of a run that can use device ``types``.

    :param recorded: (median duration s, device model it ran on) of earlier runs of the same DAG task group.
    :param train_steps: optimizer steps the training runs in all (``scheduler.train_steps``).
    """
    steps = step_times(profile, types, catalog)
    if recorded is not None:
        duration, model = recorded
        ref = next((t for t in steps if model and catalog.find(model) is catalog.find(t)), None)
        if ref is None:
            return RunEstimate(expected_runtime_s=duration, runtime_source="records")
        return RunEstimate(expected_runtime_s=duration, runtime_source="records", reference_type=ref,
                           speed_by_type={t: steps[ref] / s for t, s in steps.items()})
    if not steps:
        return RunEstimate()
    ref = min(steps, key=lambda t: (steps[t], t))
    speeds = {t: steps[ref] / s for t, s in steps.items()}
    if not train_steps:
        return RunEstimate(speed_by_type=speeds, reference_type=ref)
    return RunEstimate(expected_runtime_s=float(train_steps) * steps[ref], runtime_source="flops",
                       reference_type=ref, speed_by_type=speeds)


__all__ = ["RunEstimate", "estimate_run", "step_times"]
