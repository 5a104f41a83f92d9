"""The variation points chosen by name: launchers and inventory sources, each declared once here as
name -> ``"module:attr"`` and imported only when used.

The spec, the configuration and the run-time overrides validate names against these mappings (no repeated
``Literal``), and this module imports nothing of autodl, so any module may read them without an import cycle.
Adding a launcher or a source is its module plus one line here.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from typing import Any

LAUNCHERS: dict[str, str] = {
    "local": "autodl.launch.local:LocalLauncher",
    "docker": "autodl.launch.docker:DockerLauncher",
    "kubernetes": "autodl.launch.kubernetes:KubernetesLauncher",
}
"""Launchers by ``launcher.type`` (``[autodl] default_launcher``): the class, built by
:func:`autodl.launch.get_launcher`."""

INVENTORY_SOURCES: dict[str, str] = {
    "nvml": "autodl.inventory.nvml:read_nvml",
}
"""Inventory sources by name (``--pool nvml``, ``[autodl] pool``): a function ``(catalog) -> Inventory``, called
by :func:`autodl.inventory.read_inventory`."""

INVENTORY_SCHEMES: dict[str, str] = {
    "prometheus+http": "autodl.inventory.prometheus:read_prometheus",
    "prometheus+https": "autodl.inventory.prometheus:read_prometheus",
}
"""Inventory sources by URL scheme (``scheme://...``): a function ``(url, catalog) -> Inventory`` given the whole
URL."""


def load(target: str) -> Any:
    """The object a registry entry names.

    :param target: ``"package.module:attr"``, a value of one of this module's mappings.
    :returns: ``attr`` of the imported module.
    :raises ImportError: when the module (or a package it needs) cannot be imported.
    """
    module_name, _, attr = target.partition(":")
    return getattr(importlib.import_module(module_name), attr)


def check_choice(value: str, choices: Mapping[str, str], what: str) -> str:
    """``value`` when it is a key of ``choices``.

    :param what: what the names are, for the message (``launcher``); the caller names the field.
    :raises ValueError: naming the value and the choices (in registry order).
    """
    if value not in choices:
        raise ValueError(f"unknown {what} {value!r}; use one of: {', '.join(choices)}")
    return value


__all__ = ["INVENTORY_SCHEMES", "INVENTORY_SOURCES", "LAUNCHERS", "check_choice", "load"]
