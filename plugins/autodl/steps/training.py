"""A launched training behind its handle: stop it, read its exit status, tell whether it still runs."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from autodl.errors import AutoDLError
from autodl.hosts import require_here
from autodl.launch import get_launcher
from autodl.types import LaunchHandle


def stop_training(handle_json: dict[str, Any], *, launcher_kwargs: dict[str, Any] | None = None,
                  log: Callable[[str], None] = print, why: str = "stopping it") -> bool:
    """Stop the training behind ``handle_json`` if it still runs. Never raises for a launcher error.

    :returns: True when a running training was stopped.
    """
    return try_stop(handle_json, launcher_kwargs=launcher_kwargs, log=log, why=why) == "stopped"


def try_stop(handle_json: dict[str, Any], *, launcher_kwargs: dict[str, Any] | None = None,
             log: Callable[[str], None] = print, why: str = "stopping it") -> str:
    """``"stopped"``, ``"not running"`` or ``"unknown: <why>"`` (the launcher could not be asked)."""
    handle = LaunchHandle.model_validate(handle_json)
    try:
        launcher = get_launcher(handle.launcher, **(launcher_kwargs or {}))
        if launcher.name == "local":
            require_here(None if handle.on_cpu else handle.host, "stop the training", handle.run_key)
        if launcher.poll(handle) is None:
            log(f"training {handle.run_key} {why}")
            launcher.stop(handle)
            return "stopped"
        return "not running"
    except AutoDLError as exc:
        log(f"could not stop the training {handle.run_key}: {exc}")
        return f"unknown: {exc}"


def exit_status(handle_json: dict[str, Any], *, launcher_kwargs: dict[str, Any] | None = None) -> int | None:
    """The training's exit code as its launcher reports it, or None while it runs or when it cannot be read."""
    handle = LaunchHandle.model_validate(handle_json)
    try:
        return get_launcher(handle.launcher, **(launcher_kwargs or {})).poll(handle)
    except AutoDLError:
        return None


def still_running(handle_json: dict[str, Any], *, launcher_kwargs: dict[str, Any] | None = None) -> bool | None:
    """Whether the training behind ``handle_json`` still runs: None when that cannot be told from here (a
    local training on another host, a launcher that does not answer)."""
    handle = LaunchHandle.model_validate(handle_json)
    try:
        launcher = get_launcher(handle.launcher, **(launcher_kwargs or {}))
        if launcher.name == "local":
            require_here(None if handle.on_cpu else handle.host, "stop the training", handle.run_key)
        return launcher.poll(handle) is None
    except AutoDLError:
        return None
