"""Where the dry run runs: the worker's bubblewrap sandbox, or the training's own image through the launcher.

Details: docs/reference/estimator.md#autodlprofilewhere.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, cast

from autodl.errors import ConfigError
from autodl.types import DryRunIn, Venue

SETTING_ENV = "AUTODL_DRY_RUN_IN"
CHOICES = ("auto", "worker", "launcher")


@dataclass(frozen=True)
class Choice:
    """Where the dry run runs (``venue``; None: nowhere) and why, one sentence."""

    venue: Venue | None
    reason: str
    setting: str


def configured(spec_value: str | None) -> tuple[str, str]:
    """``(setting, where it came from)``: the spec's ``task.dry_run_in``, else the configuration, else ``auto``.

    :raises ConfigError: a configured value that is none of :data:`CHOICES`, naming where it came from.
    """
    if spec_value:
        return spec_value, "the spec's task.dry_run_in"
    from autodl.config import setting

    value = setting("dry_run_in")
    if value is None:
        return "auto", "the default"
    where = (f"environment variable {SETTING_ENV}" if os.environ.get(SETTING_ENV, "").strip()
             else "[autodl] dry_run_in in Airflow's configuration")
    if value not in CHOICES:
        raise ConfigError(f"{where}: {value!r} is not one of {', '.join(CHOICES)}; set it to auto (the worker's "
                          "sandbox where it works, else the launcher's image), worker or launcher.")
    return value, where


def choose(setting: str, launcher_type: str, *, paddle_here: bool, no_sandbox_why: str | None) -> Choice:
    """Where the dry run runs.

    :param setting: ``auto``, ``worker`` or ``launcher`` (see the module docstring).
    :param launcher_type: the spec's ``launcher.type`` (after a run's override).
    :param paddle_here: Paddle is importable by this worker's interpreter.
    :param no_sandbox_why: why bubblewrap cannot make a sandbox here; None when it can.
    """
    container = cast("Venue | None", launcher_type if launcher_type in ("docker", "kubernetes") else None)
    worker_why = None
    if not paddle_here:
        worker_why = "PaddlePaddle is not installed on this worker"
    elif no_sandbox_why:
        worker_why = f"no sandbox can be made on this worker ({no_sandbox_why})"
    if setting == "worker" or (setting == "auto" and worker_why is None):
        if worker_why is None:
            return Choice("worker", "the dry run ran in this worker's bubblewrap sandbox", setting)
        return Choice(None, f"dry_run_in is worker, and {worker_why}", setting)
    if container is None:
        why = worker_why if setting == "auto" else "dry_run_in is launcher"
        return Choice(None, f"{why}, and the launcher is {launcher_type!r}, which has no image to run it in "
                            "(set launcher.type docker or kubernetes with the training's image)", setting)
    lead = f"{worker_why}, so " if setting == "auto" else "dry_run_in is launcher: "
    return Choice(container, f"{lead}the dry run ran in the launcher's image ({container})", setting)


IMPORT_ERRORS = ("ModuleNotFoundError", "ImportError")
"""What the script raised on the worker that the training's image may not raise: a package only the image has."""


def image_retry(choice: Choice | None, launcher_type: str, error: dict[str, Any], outcome: str) -> Choice | None:
    """Where to run the dry run again after it could not run on the worker, or None: in ``auto``, with a
    ``docker`` or ``kubernetes`` launcher, when the script stopped on an import (the worker lacks a package the
    training's image has, e.g. paddlenlp)."""
    if choice is None or choice.setting != "auto" or choice.venue != "worker" or outcome != "cannot-run":
        return None
    if error.get("type") not in IMPORT_ERRORS or launcher_type not in ("docker", "kubernetes"):
        return None
    venue = cast("Venue", launcher_type)
    return Choice(venue, f"it ran again in the launcher's image ({venue}), which the training runs in", "auto")


def venue_for(venue: str, launcher: Any, engine: dict[str, Any] | None) -> Any:
    """The :class:`~autodl.profile.dryrun.DryRunVenue` of the launcher's image: a container (``docker``) or a pod
    (``kubernetes``), on the engine or cluster of ``engine`` (the launcher's connection keyword arguments)."""
    from autodl.profile.container import DockerVenue
    from autodl.profile.pod import PodVenue

    venues = {"docker": DockerVenue, "kubernetes": PodVenue}
    return venues[venue](launcher, engine)


__all__ = ["CHOICES", "Choice", "DryRunIn", "Venue", "choose", "configured", "image_retry", "venue_for"]
