"""The ``rule_based`` policy: plan within the memory threshold, then rank by the visible rule terms."""

from __future__ import annotations

from typing import Sequence

from autodl.policy.base import Need, Option, PolicyContext, Scored
from autodl.policy.scoring import rule_terms


class RuleBased:
    """Headroom (``memory_threshold``) plus the weighted terms of :func:`autodl.policy.scoring.rule_terms`."""

    name = "rule_based"
    headroom = True
    queue = "backfill"

    def score(self, need: Need, options: Sequence[Option], ctx: PolicyContext) -> list[Scored]:
        """:returns: one :class:`Scored` per option (see :func:`rule_terms`)."""
        return rule_terms(need, options, ctx)

