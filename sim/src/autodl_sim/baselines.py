"""The simulator's baseline placement policies: FIFO first-fit, random, best-fit memory, Gavel-like max throughput.

None keeps headroom: each trusts the memory estimate up to 100% of device memory, which is how they OOM
when the estimate is low. Importing this module adds them to autodl's policy registry
(:func:`autodl.policy.registry.register_policy`), so ``place`` and the simulator find them by name.
"""

from __future__ import annotations

from typing import Callable, Sequence

from autodl.policy.base import Need, Option, Policy, PolicyContext, Scored
from autodl.policy.registry import register_policy


class FifoFirstFit:
    """Strict FIFO queue; the first fitting device set in pool order."""

    name = "fifo_first_fit"
    headroom = False
    queue = "fifo"

    def score(self, need: Need, options: Sequence[Option], ctx: PolicyContext) -> list[Scored]:
        """Score = -pool order."""
        return [Scored(-float(o.order), {"order": -float(o.order)}) for o in options]


class RandomFit:
    """A uniformly random fitting device set (seeded by ``ctx.rng``)."""

    name = "random"
    headroom = False
    queue = "backfill"

    def score(self, need: Need, options: Sequence[Option], ctx: PolicyContext) -> list[Scored]:
        """Score = a random draw in [0, 1)."""
        out = []
        for _ in options:
            r = ctx.rng.random()
            out.append(Scored(r, {"random": r}))
        return out


class BestFitMemory:
    """The device set whose device memory is the smallest that holds the estimate (ties: pool order)."""

    name = "best_fit_memory"
    headroom = False
    queue = "backfill"

    def score(self, need: Need, options: Sequence[Option], ctx: PolicyContext) -> list[Scored]:
        """Score = -(device memory - need) in GiB, minus a pool-order tie-break."""
        out = []
        for o in options:
            slack = (o.memory_total_bytes - need.needed_bytes) / 2**30
            out.append(Scored(-slack - 1e-6 * o.order, {"slack_gib": -slack}))
        return out


class GavelMaxThroughput:
    """Gavel-like heterogeneity-aware max throughput: the device model on which the run is fastest.

    The greedy per-run form of Gavel's max-sum-throughput policy (Narayanan et al., "Heterogeneity-
    Aware Cluster Scheduling Policies for Deep Learning Workloads", OSDI 2020), without its linear
    program, round-based time sharing or memory headroom.
    """

    name = "gavel_max_throughput"
    headroom = False
    queue = "backfill"

    def score(self, need: Need, options: Sequence[Option], ctx: PolicyContext) -> list[Scored]:
        """Score = 1 / estimated step time (unknown step time scores 0)."""
        out = []
        for o in options:
            t = 1.0 / o.step_time_s if o.step_time_s else 0.0
            out.append(Scored(t - 1e-12 * o.order, {"throughput": t}))
        return out


BASELINES: dict[str, Callable[[], Policy]] = {
    "fifo_first_fit": FifoFirstFit,
    "random": RandomFit,
    "best_fit_memory": BestFitMemory,
    "gavel_max_throughput": GavelMaxThroughput,
}
"""The baselines by registry name."""

for _name, _factory in BASELINES.items():
    register_policy(_name, _factory)
