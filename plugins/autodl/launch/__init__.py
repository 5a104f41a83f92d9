"""Launchers: start a training pinned to its devices (local process, Docker container, Kubernetes pod).

Chosen by name from the spec's ``launcher.type``; adding one is a module, a line in
:data:`autodl.registry.LAUNCHERS`, and its options model (:mod:`autodl.launch.options`, a member of the spec's
``LauncherSection`` union).
"""

from __future__ import annotations

import importlib.util
import sys
from typing import Any

from autodl import pip_install
from autodl.errors import LaunchError
from autodl.launch.base import Launcher, LaunchRequest, pinning_env, shell_line, training_command
from autodl.registry import LAUNCHERS, load


def launcher_names() -> list[str]:
    """The launcher types autodl knows (``launcher.type``, ``[autodl] default_launcher``), in registry order
    (:data:`autodl.registry.LAUNCHERS`)."""
    return list(LAUNCHERS)


_NEEDS: dict[str, tuple[str, ...]] = {"docker": ("docker",), "kubernetes": ("kubernetes",)}
"""Third-party modules each launcher imports when it renders or starts a run (lazily, inside its methods, so
importing the launcher's module alone does not show they are missing): the extras of ``pyproject.toml``."""


def _absent(module: str) -> bool:
    """True when ``module`` cannot be imported here (found without importing it)."""
    if module in sys.modules:
        return sys.modules[module] is None
    try:
        return importlib.util.find_spec(module) is None
    except (ImportError, ValueError):
        return True


def get_launcher(name: str, **kwargs: Any) -> Launcher:
    """The launcher called ``name``, constructed with ``kwargs``.

    :raises LaunchError: for an unknown name (listing the known ones) or a launcher whose module
        cannot be imported (naming the missing package).
    """
    target = LAUNCHERS.get(name)
    if target is None:
        raise LaunchError(f"unknown launcher {name!r}; set launcher.type to one of: {', '.join(LAUNCHERS)}.")
    for needed in _NEEDS.get(name, ()):
        if _absent(needed):
            raise LaunchError(f"launcher {name!r} needs the Python package {needed!r}, which is not installed here: "
                              f"install autodl's {name!r} extra ({pip_install(name)}; in a checkout: "
                              "pip install -r requirements.txt), or set launcher.type to 'local'.")
    try:
        launcher_class = load(target)
    except ImportError as exc:
        raise LaunchError(f"launcher {name!r} needs {exc.name}: install autodl's {name!r} extra "
                          f"({pip_install(name)}; in a checkout: pip install -r requirements.txt).") from exc
    return launcher_class(**kwargs)


__all__ = ["Launcher", "LaunchRequest", "get_launcher", "launcher_names", "pinning_env", "shell_line", "training_command"]
