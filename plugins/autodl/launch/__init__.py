"""Launchers: start a training pinned to its devices (local process, Docker container, Kubernetes pod).

Chosen by name from the spec's ``launcher.type``; adding one is a module plus a line in ``_REGISTRY``.
"""

from __future__ import annotations

import importlib
from typing import Any

from autodl.errors import LaunchError
from autodl.launch.base import Launcher, LaunchRequest, pinning_env, shell_line, training_command

_REGISTRY: dict[str, str] = {
    "local": "autodl.launch.local:LocalLauncher",
    "docker": "autodl.launch.docker:DockerLauncher",
    "kubernetes": "autodl.launch.kubernetes:KubernetesLauncher",
}


def get_launcher(name: str, **kwargs: Any) -> Launcher:
    """The launcher called ``name``, constructed with ``kwargs``.

    :raises LaunchError: for an unknown name (listing the known ones) or a launcher whose module
        cannot be imported (naming the missing package).
    """
    target = _REGISTRY.get(name)
    if target is None:
        raise LaunchError(f"unknown launcher {name!r}; set launcher.type to one of: {', '.join(_REGISTRY)}.")
    module_name, cls_name = target.split(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise LaunchError(f"launcher {name!r} needs {exc.name}: install it (pip install -r requirements.txt).") from exc
    return getattr(module, cls_name)(**kwargs)


__all__ = ["Launcher", "LaunchRequest", "get_launcher", "pinning_env", "shell_line", "training_command"]
