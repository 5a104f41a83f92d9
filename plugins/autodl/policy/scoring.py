"""The rule-based score: each term computed on its own and kept visible (speed, cost, balance, best fit, preferred order, tags)."""

from __future__ import annotations

from typing import Sequence

from autodl.policy.base import Need, Option, PolicyContext, Scored

DEFAULT_WEIGHTS: dict[str, float] = {
    "speed": 1.0,
    "cost": 0.2,
    "balance": 0.1,
    "best_fit": 8.0,
    "preferred": 1.0,
    "nvlink": 0.2,
}
"""Weight of each rule term. ``best_fit`` was tuned with ``benchmarks/scheduling.py --tune`` on Philly
slices 0, 2 and 7 only (never on the reported slices; grid 0.3, 1, 2, 8; loads x1 and x2): at 8 a run
takes the smallest device that holds it and speed breaks ties between devices of similar memory --
keeping big devices and whole hosts for the runs that need them lowered the mean JCT there by 10%
against the previous 0.3 (5.82 h vs 6.49 h), most of it under load and for gangs. On the reported
slices, which are less loaded, 0.3 did better at x1 (9%) and x2 (5%): see the benchmark's table.
``preferred`` (the spec's ``preferred_devices``) weighs as much as speed, as before; between devices of
very different memory best fit now outweighs it (8 x the difference in needed / device memory), as it
does tag priorities of 1-2. Cost, balance and NVLink break near-ties."""


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
