"""The rule-based score: each term computed on its own and kept visible (speed, cost, balance, best fit, preferred order, tags)."""

from __future__ import annotations

from typing import Sequence

from autodl.policy.base import Need, Option, PolicyContext, Scored

DEFAULT_WEIGHTS: dict[str, float] = {
    "speed": 1.0,
    "cost": 0.05,
    "balance": 0.025,
    "best_fit": 2.0,
    "preferred": 1.0,
    "nvlink": 0.05,
}
"""Weight of each rule term. ``best_fit`` 2 against speed 1: picked by ``benchmarks/scheduling.py --tune``
on Philly slices 0, 2 and 7 only (never on the reported slices), with the estimator's measured errors
of 2026-12-01, together with the queue's aging (192 h) and the wait-for-a-faster-device rule (on), by
the rule ``tune`` prints (the lowest mean JCT at x1 and x2 with the 8- and 16-GPU gangs' p99 queueing
within 2x FIFO's on every slice; no setting met that there, so: within 2% of the best mean, the lowest
gang ratio). Mean JCT there 6.54 h (gang ratio 4.41) against 7.08 h (5.55) for the previous best_fit
0.25 with 96 h aging and no wait, and 6.70 h (5.43) for best_fit 0.25 with 192 h and the wait rule
(``benchmarks/results/scheduling-tune.txt``). A run still takes a fast device first; best fit keeps
the big-memory devices for runs that need them, which the gangs' tail pays for least. Cost, balance
and NVLink (0.05, 0.025, 0.05) break near-ties. ``preferred`` (the spec's ``preferred_devices``) weighs
as much as speed; tag priorities of 1-2 weigh about as much as best fit. Placement moves the mean JCT
by a few percent at most once the pool is saturated: see the README's scheduling results."""


def rule_terms(need: Need, options: Sequence[Option], ctx: PolicyContext) -> list[Scored]:
    """Score options with the rule terms; terms sum to the score.

    - ``speed`` = w x fastest estimated step time among the options / this option's (1 = fastest);
      0 when the catalog cannot estimate the step time.
    - ``cost`` = -w x (price per GPU-hour x devices x step time) / the dearest such among options;
      0 when the catalog has no list price for the model.
    - ``balance`` = -w x load (0..1).
    - ``best_fit`` = -w x (1 - needed / device memory): keeps big devices free for big runs.
    - ``preferred`` = w x (1 - rank / len(preferred_devices)) for a listed model, else 0.
    - ``nvlink`` = w for a gang of 2+ devices that share an NVLink group (gradient all-reduce
      runs over NVLink instead of PCIe), else 0.
    - ``tag:<tag>`` = ``tag_priorities[tag]`` for each catalog tag of the model.

    :param need: the run's per-device memory need and gang size.
    :param options: device sets that fit and are free.
    :param ctx: preferred order, tag priorities, weights.
    :returns: one :class:`Scored` per option, in order.
    """
    w = ctx.weights or DEFAULT_WEIGHTS
    steps = [o.step_time_s for o in options if o.step_time_s]
    best_step = min(steps) if steps else None
    costs = [
        o.cost_per_hour_usd * o.num_devices * o.step_time_s
        for o in options
        if o.cost_per_hour_usd is not None and o.step_time_s
    ]
    max_cost = max(costs) if costs else None
    pref = {name: i for i, name in enumerate(ctx.preferred_devices)}
    npref = len(ctx.preferred_devices)
    w_speed, w_cost, w_bal, w_fit, w_pref = (
        w.get("speed", 0.0), w.get("cost", 0.0), w.get("balance", 0.0), w.get("best_fit", 0.0), w.get("preferred", 0.0)
    )
    out = []
    for o in options:
        terms: dict[str, float] = {}
        terms["speed"] = w_speed * (best_step / o.step_time_s) if (best_step and o.step_time_s) else 0.0
        if max_cost and o.cost_per_hour_usd is not None and o.step_time_s:
            terms["cost"] = -w_cost * (o.cost_per_hour_usd * o.num_devices * o.step_time_s) / max_cost
        else:
            terms["cost"] = 0.0
        terms["balance"] = -w_bal * o.load
        terms["best_fit"] = -w_fit * max(0.0, 1.0 - need.needed_bytes / o.memory_total_bytes)
        rank = pref.get(o.model)
        terms["preferred"] = w_pref * (1.0 - rank / npref) if rank is not None else 0.0
        if o.nvlink and o.num_devices > 1:
            terms["nvlink"] = w.get("nvlink", 0.0)
        for tag in o.tags:
            p = ctx.tag_priorities.get(tag)
            if p:
                terms[f"tag:{tag}"] = float(p)
        out.append(Scored(sum(terms.values()), terms))
    return out
