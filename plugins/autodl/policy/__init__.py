"""Placement policies: rank the pool's device sets for a profiled run (rule_based, rl_based, and the simulator's baselines).

``place`` is what the pipeline calls; ``observe`` feeds finished runs to the rl_based contextual
bandit. Policies are a registry chosen by name (:func:`get_policy`, :func:`register_policy`).
"""

from autodl.policy.base import Need, Option, Policy, PolicyContext, Scored, get_policy, policy_names, register_policy
from autodl.policy.placement import DEFAULT_ALLOWED_VENDORS, observe, place

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
