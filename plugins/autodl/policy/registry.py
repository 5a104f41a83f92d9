"""The placement policies by name: declared here as ``module:attribute`` paths, loaded on first use.

The product's policies are :data:`POLICIES`; another distribution adds its own with :func:`register_policy`
(the simulator's baselines: ``autodl_sim.baselines``). Names are declared as paths, not imported, so the spec
can validate ``scheduler.algorithm`` against them without importing the policies (nor their store).
"""

from __future__ import annotations

import importlib
from typing import Callable, Union

from autodl.policy.base import Policy

PolicyFactory = Union[str, Callable[[], Policy]]
"""A policy's factory: a zero-argument callable, or a ``"module:attribute"`` path to one (imported on first use)."""

POLICIES: dict[str, str] = {
    "rule_based": "autodl.policy.rule_based:RuleBased",
    "rl_based": "autodl.policy.rl_based:RLBased",
}
"""autodl's own placement policies: the choices of the spec's ``scheduler.algorithm``. Adding one is one
module plus one line here."""

_EXTRA: dict[str, PolicyFactory] = {}


def register_policy(name: str, factory: PolicyFactory) -> None:
    """Add a policy under ``name`` for this process (replacing an added one of that name); autodl's own
    :data:`POLICIES` cannot be replaced.

    :param name: the registry name (``scheduler.algorithm``, ``--policies``).
    :param factory: a zero-argument callable that returns a fresh policy, or a ``"module:attribute"`` path to one.
    :raises ValueError: when ``name`` is one of :data:`POLICIES`.
    """
    if name in POLICIES:
        raise ValueError(f"placement policy {name!r} is autodl's own and cannot be replaced")
    _EXTRA[name] = factory


def policy_names() -> list[str]:
    """Every policy name known in this process (:data:`POLICIES` and the registered ones), sorted."""
    return sorted({*POLICIES, *_EXTRA})


def get_policy(name: str) -> Policy:
    """A fresh policy object by registry name.

    :raises SpecError: naming the unknown policy (cut to a line) and the known ones.
    """
    factory = POLICIES.get(name) or _EXTRA.get(name)
    if factory is None:
        from autodl.errors import SpecError
        from autodl.inputs import short

        raise SpecError(f"placement algorithm {short(name)} is unknown (scheduler.algorithm or --policies); "
                        f"use one of: {', '.join(policy_names())}.")
    if isinstance(factory, str):
        module, _, attr = factory.partition(":")
        factory = getattr(importlib.import_module(module), attr)
    return factory()
