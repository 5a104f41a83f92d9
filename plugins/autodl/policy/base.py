"""The policy protocol: what a placement policy sees (a run's need, device-set options) and returns (scores with visible terms).

Both :func:`autodl.policy.place` (a real or declared inventory) and the trace-driven simulator
(:mod:`autodl_sim`) build :class:`Option` values and ask the same policy objects to score
them, so the simulator measures the code that places real runs. The registry of policies by name is
:mod:`autodl.policy.registry`.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any, Protocol, Sequence


@dataclass(frozen=True, slots=True)
class Need:
    """What the policy knows about the run being placed.

    :ivar needed_bytes: estimated per-device peak memory, bytes (data parallel: per card).
    :ivar num_gpus: gang size: devices needed at once, all of one model.
    :ivar run_key: an id for logs and the bandit's records.
    """

    needed_bytes: int
    num_gpus: int = 1
    run_key: str = ""


@dataclass(frozen=True, slots=True)
class Option:
    """One device set a policy may choose: ``num_devices`` devices of one model on one host
    (whole hosts of one model for simulated gangs larger than a host).

    :ivar devices: device ids (``place``) or host ids (simulator) that make up the set.
    :ivar memory_total_bytes: memory of one device of the set, bytes.
    :ivar step_time_s: estimated seconds per training step on this model (simulator: seconds
        of the whole run); ``None`` when the catalog cannot estimate it.
    :ivar cost_per_hour_usd: list price of one device per hour, ``None`` when unpublished.
    :ivar load: 0..1, how busy the set (``place``: mean utilization) or its device model
        (simulator: busy fraction of that model's devices) is.
    :ivar order: position in the pool (first-fit order).
    :ivar nvlink: the set shares an NVLink group.
    """

    devices: tuple[Any, ...]
    model: str
    vendor: str
    host: str
    num_devices: int
    memory_total_bytes: int
    step_time_s: float | None
    cost_per_hour_usd: float | None
    load: float
    tags: tuple[str, ...]
    order: int
    nvlink: bool = False


@dataclass(slots=True)
class PolicyContext:
    """Settings and state a policy scores with.

    :ivar preferred_devices: the spec's ``preferred_devices``, best first.
    :ivar tag_priorities: extra score per catalog tag (``{domestic: 1.0}``); empty = off.
    :ivar memory_threshold: fraction of device memory a run may plan to use.
    :ivar rng: seeded random source (random baseline, bandit tie-breaks).
    :ivar weights: rule weights by term name (see :data:`autodl.policy.scoring.DEFAULT_WEIGHTS`).
    :ivar bandit: the rl_based policy's state (:class:`autodl.policy.rl_based.LinUCB`) or ``None``.
    """

    preferred_devices: Sequence[str] = ()
    tag_priorities: dict[str, float] = field(default_factory=dict)
    memory_threshold: float = 0.85
    rng: random.Random = field(default_factory=lambda: random.Random(0))
    weights: dict[str, float] | None = None
    bandit: Any = None


@dataclass(frozen=True, slots=True)
class Scored:
    """A policy's verdict on one option: higher ``score`` is better; ``terms`` add up to it."""

    score: float
    terms: dict[str, float]
    reasons: tuple[str, ...] = ()


class Policy(Protocol):
    """A placement policy. Adding one is one module plus one line in :data:`autodl.policy.registry.POLICIES`.

    :ivar name: registry name.
    :ivar headroom: ``True`` when the policy plans within ``memory_threshold`` of each device;
        ``False`` when it trusts the estimate up to 100% of device memory (the baselines, in ``place``
        and in the simulator only with ``own_headroom``: the benchmark gives every policy the same headroom).
    :ivar queue: the policy's *classic* queue discipline, used only when the simulator is asked for
        each policy's own queue (``autodl simulate --queue own``): ``"fifo"`` (head of line blocks) or
        ``"backfill"`` (any queued run that fits may start, in submit order). By default every policy
        places behind autodl's admission queue (:mod:`autodl.policy.admission`).
    """

    name: str
    headroom: bool
    queue: str

    def score(self, need: Need, options: Sequence[Option], ctx: PolicyContext) -> list[Scored]:
        """Score every option (all fit the run and are free now); same order as ``options``."""
        ...
