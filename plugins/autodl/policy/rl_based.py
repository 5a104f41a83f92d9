"""The ``rl_based`` policy: a contextual bandit (disjoint LinUCB, one arm per device model) trained on recorded outcomes.

Details: docs/reference/scheduler.md#autodlpolicyrl_based.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from typing import Sequence

from autodl.policy.base import Need, Option, PolicyContext, Scored
from autodl.policy.scoring import DEFAULT_WEIGHTS, rule_terms

FEATURES = ("bias", "speed", "fit", "load", "cost")
"""Context features of one option: 1, fastest/this step time, needed/device memory, load 0..1,
relative cost per step 0..1 (0 when unknown)."""

FAILURE_REWARD = -3.0
"""Reward of an OOM or failed run: ln(1/20), i.e. as bad as running 20x slower than the reference."""

REFERENCE_MODEL = "V100-PCIE-32GB"
"""Reference device for throughput and price: V100 = 1.0 in ``gpu-relative-throughput.csv``
(Sia/Pollux artifacts); its price comes from the catalog."""


def features_from_terms(terms: dict[str, float], weights: dict[str, float] | None = None) -> list[float]:
    """Raw feature vector from rule terms (undo each term's weight).

    :param terms: the ``terms`` of a rule-scored option (or a recorded placement's chosen candidate).
    :param weights: the rule weights used; default :data:`DEFAULT_WEIGHTS`.
    :returns: values in :data:`FEATURES` order.
    """
    w = weights or DEFAULT_WEIGHTS

    def raw(key: str, sign: float) -> float:
        wk = w.get(key, 0.0)
        return sign * terms.get(key, 0.0) / wk if wk else 0.0

    speed = raw("speed", 1.0)
    fit = 1.0 - raw("best_fit", -1.0)
    return [1.0, speed, fit, raw("balance", -1.0), raw("cost", -1.0)]


@dataclass
class Arm:
    """One device model's LinUCB state: ``a_inv`` (d x d), ``b`` (d), ``count`` observations."""

    a_inv: list[list[float]]
    b: list[float]
    count: int = 0

    @classmethod
    def fresh(cls, dim: int, ridge: float) -> "Arm":
        return cls([[(1.0 / ridge if i == j else 0.0) for j in range(dim)] for i in range(dim)], [0.0] * dim)

    def theta(self) -> list[float]:
        return [sum(r[j] * self.b[j] for j in range(len(self.b))) for r in self.a_inv]


@dataclass
class LinUCB:
    """Disjoint LinUCB over device models.

    :ivar alpha: width of the confidence bonus (exploration); 0 = greedy.
    :ivar ridge: L2 prior (A starts as ridge x I).
    :ivar warmup: observations before the bandit decides (cold start uses rule_based).
    :ivar top_k: exploration is bounded to the rule's best ``top_k`` options.
    :ivar cost_weight: lambda in the reward (0 = throughput only, 1 = throughput per cost). Default 0:
        the queue's objective is job completion time, and the price preference is already a visible,
        user-weighted term of the rule (``cost``) that the bandit's context includes; a price term in
        the reward made the bandit prefer a T4 over a faster P100 (issue 11) -- i.e. it learned the
        price list, which needs no learning.
    """

    alpha: float = 0.3
    ridge: float = 1.0
    warmup: int = 20
    top_k: int = 3
    cost_weight: float = 0.0
    arms: dict[str, Arm] = field(default_factory=dict)

    @property
    def observations(self) -> int:
        return sum(a.count for a in self.arms.values())

    def arm(self, name: str) -> Arm:
        a = self.arms.get(name)
        if a is None:
            a = self.arms[name] = Arm.fresh(len(FEATURES), self.ridge)
        return a

    def ucb(self, name: str, x: Sequence[float]) -> tuple[float, float]:
        """:returns: (predicted reward, confidence bonus) of arm ``name`` for context ``x``."""
        a = self.arms.get(name) or Arm.fresh(len(FEATURES), self.ridge)
        th = a.theta()
        pred = sum(t * xi for t, xi in zip(th, x))
        ax = [sum(r[j] * x[j] for j in range(len(x))) for r in a.a_inv]
        var = max(0.0, sum(xi * v for xi, v in zip(x, ax)))
        return pred, self.alpha * math.sqrt(var)

    def update(self, name: str, x: Sequence[float], reward: float) -> None:
        """Sherman-Morrison update of arm ``name`` with context ``x`` and ``reward``."""
        a = self.arm(name)
        d = len(x)
        ax = [sum(a.a_inv[i][j] * x[j] for j in range(d)) for i in range(d)]
        denom = 1.0 + sum(x[i] * ax[i] for i in range(d))
        for i in range(d):
            for j in range(d):
                a.a_inv[i][j] -= ax[i] * ax[j] / denom
        for i in range(d):
            a.b[i] += reward * x[i]
        a.count += 1

    def reward(self, relative_throughput: float | None, cost_per_hour_usd: float | None,
               reference_cost_usd: float | None, failed: bool) -> float:
        """ln(throughput) - cost_weight x ln(cost / reference cost); :data:`FAILURE_REWARD` when failed.

        Unknown price (or reference price) contributes 0.

        :raises ValueError: when a run that did not fail has no positive throughput (nothing measured is
            not a failure: do not reward it at all).
        """
        if failed:
            return FAILURE_REWARD
        if not relative_throughput or relative_throughput <= 0:
            raise ValueError("a succeeded run's reward needs its measured relative throughput (> 0)")
        r = math.log(relative_throughput)
        if cost_per_hour_usd and reference_cost_usd:
            r -= self.cost_weight * math.log(cost_per_hour_usd / reference_cost_usd)
        return r

    # ---------------------------------------------------------------- persistence
    def to_rows(self) -> dict[str, dict]:
        """Arms as JSON-ready dicts (for the store)."""
        return {k: {"a_inv": a.a_inv, "b": a.b, "count": a.count} for k, a in self.arms.items()}

    def load_rows(self, rows: dict[str, dict]) -> None:
        """Replace arms from :meth:`to_rows` output."""
        self.arms = {k: Arm([list(r) for r in v["a_inv"]], list(v["b"]), int(v["count"])) for k, v in rows.items()}


class RLBased:
    """Contextual bandit over device models; rule_based until warmed up."""

    name = "rl_based"
    headroom = True
    queue = "backfill"

    def score(self, need: Need, options: Sequence[Option], ctx: PolicyContext) -> list[Scored]:
        """Rule-score every option; when the bandit is warm, re-rank the rule's ``top_k`` by UCB.

        Options outside the top k keep their rule terms plus ``outside_top_k = -1000`` so they
        rank after every explored option. Terms always include the rule terms (``observe``
        rebuilds the context from them).
        """
        rule = rule_terms(need, options, ctx)
        bandit: LinUCB | None = ctx.bandit
        if bandit is None or bandit.observations < bandit.warmup:
            return [Scored(s.score, s.terms, ("cold start: rule_based ranking",)) for s in rule]
        order = sorted(range(len(options)), key=lambda i: (-rule[i].score, options[i].order))
        top = set(order[: bandit.top_k])
        out = []
        for i, (o, s) in enumerate(zip(options, rule)):
            terms = dict(s.terms)
            if i in top:
                pred, bonus = bandit.ucb(o.model, features_from_terms(s.terms, ctx.weights))
                terms["predicted_reward"] = pred
                terms["exploration"] = bonus
                # rule score breaks ties only
                out.append(Scored(pred + bonus + 1e-6 * s.score, terms, ("LinUCB over the rule's top options",)))
            else:
                terms["outside_top_k"] = -1000.0
                out.append(Scored(s.score - 1000.0, terms, (f"outside the rule's top {bandit.top_k}",)))
        return out



# ------------------------------------------------------------------------------ store
def load_bandit(store_url: str | None = None, policy: str = "rl_based") -> LinUCB:
    """The bandit as kept in the store at ``store_url`` (fresh when empty)."""
    from sqlalchemy import select

    from autodl.policy.rl_state import BanditArmRow
    from autodl.store import session_factory

    bandit = LinUCB()
    with session_factory(store_url)() as s:
        rows = s.execute(select(BanditArmRow).where(BanditArmRow.policy == policy)).scalars().all()
        bandit.load_rows(
            {r.arm: {"a_inv": json.loads(r.a_inv_json), "b": json.loads(r.b_json), "count": r.count} for r in rows}
        )
    return bandit


def save_arm(bandit: LinUCB, arm: str, store_url: str | None = None, policy: str = "rl_based") -> None:
    """Write one arm of ``bandit`` to the store (insert or update)."""
    from sqlalchemy import select

    from autodl.policy.rl_state import BanditArmRow
    from autodl.store import session_factory

    a = bandit.arm(arm)
    with session_factory(store_url)() as s, s.begin():
        row = s.execute(
            select(BanditArmRow).where(BanditArmRow.policy == policy, BanditArmRow.arm == arm)
        ).scalar_one_or_none()
        if row is None:
            row = BanditArmRow(policy=policy, arm=arm, dim=len(a.b), a_inv_json="", b_json="", count=0)
            s.add(row)
        row.a_inv_json = json.dumps(a.a_inv)
        row.b_json = json.dumps(a.b)
        row.count = a.count
        row.dim = len(a.b)
