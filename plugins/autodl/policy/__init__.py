"""Placement policies: rank the pool's device sets for a profiled run (rule_based, rl_based; the simulator adds its baselines).

``place`` is what the pipeline calls; ``observe`` feeds finished runs to the rl_based contextual
bandit. Policies are a registry chosen by name (:mod:`autodl.policy.registry`).

Follows Airflow's provider registries (a name to an import path, imported when used):
docs/reference/layout.md#the-anchor-each-part-follows.
"""

from autodl.policy.base import Need, Option, Policy, PolicyContext, Scored
from autodl.policy.placement import DEFAULT_ALLOWED_VENDORS, observe, place
from autodl.policy.registry import get_policy, policy_names, register_policy

__all__ = [
    "DEFAULT_ALLOWED_VENDORS",
    "Need",
    "Option",
    "Policy",
    "PolicyContext",
    "Scored",
    "get_policy",
    "observe",
    "place",
    "policy_names",
    "register_policy",
]
