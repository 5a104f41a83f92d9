"""The trigger form of a DAG that trains with autodl: its Params, and the check of a trigger's conf against them.

Airflow 3's trigger form disables its Trigger button while a field whose JSON-schema ``type`` does not
allow ``null`` is empty, so every Param here has a usable default or allows ``null``. Where the values are
a fixed set (the launcher, the placement policy) the Param is an ``enum``, shown as a drop-down; the
launcher's and the policy's values come from the spec's own fields. The pool is free text with proposals
(``examples``: a text field with a list): ``auto``, ``nvml``, the shipped pool names, or any pool file path,
resolved by :func:`autodl.steps.inputs.resolve_pool_source` when the tasks run.
"""

from __future__ import annotations

import difflib
import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from airflow.sdk import Param

from autodl.errors import SpecError
from autodl.inputs import short
from autodl.steps.inputs import KEEP_SPEC, OVERRIDES, pool_names

MAX_KEYS_NAMED = 10
"""A trigger conf's unknown keys named in the error, at most (each cut to a line): the rest are counted."""

SPEC_DEFAULT = "spec"
"""The launcher/policy choice meaning "as the spec says"."""


def pool_choices(extra: Iterable[str] = ()) -> dict[str, str]:
    """Pool sources proposed in the form, value -> label: ``auto``, ``nvml`` and the name of each pool file
    shipped in ``include/pools/`` (``demo``), plus ``extra`` values (e.g. ``$AUTODL_POOL``)."""
    choices = {"auto": "auto: this host's NVIDIA driver, else the demo pool",
               "nvml": "nvml: this host's NVIDIA driver (fails without one)"}
    for name, path in pool_names().items():
        choices[name] = f"{name}: pool file include/pools/{path.name}"
    for value in extra:
        if value and value not in choices:
            choices[value] = f"pool {value}"
    return choices


def _override_param(name: str, description: str) -> Param:
    section, key, allowed = OVERRIDES[name]
    labels = {SPEC_DEFAULT: f"as the spec says ({section}.{key})", **{v: v for v in allowed}}
    return Param(SPEC_DEFAULT, type="string", enum=list(labels), values_display=labels, title=name,
                 description=description)


def train_params(*, spec: str | Path, pool: str | None = None, script: str | None = None) -> dict[str, Param]:
    """The Params of a DAG with one :class:`~autodl.operators.AutoDLTrainOperator`.

    :param spec: default task spec YAML.
    :param pool: default pool source; default ``$AUTODL_POOL`` where the DAG is parsed, else ``auto``.
    :param script: default training script; default None (the spec's ``task.script``).
    :returns: ``script``, ``spec``, ``pool``, ``launcher``, ``policy``.
    """
    pool = pool or os.environ.get("AUTODL_POOL") or "auto"
    pools = pool_choices(extra=[pool])
    return {
        "script": Param(script, type=["null", "string"], title="script",
                        description="Training script (a path where the tasks run); empty: the spec's task.script."),
        "spec": Param(str(spec), type="string", minLength=1, title="spec", description="Task spec YAML."),
        "pool": Param(pool, type="string", minLength=1, examples=list(pools), values_display=pools, title="pool",
                      description="Where the devices come from: auto, nvml, a pool name (demo), or a pool YAML "
                                  "file, absolute or relative to autodl's include folder (pools/demo.yaml). "
                                  "A file that does not exist fails the profile step, saying where it looked."),
        "launcher": _override_param("launcher", "How the training is started; overrides the spec's launcher.type."),
        "policy": _override_param("policy", "Placement policy; overrides the spec's scheduler.algorithm."),
    }


def check_conf(conf: Mapping[str, Any] | None, known: Iterable[str]) -> None:
    """Refuse a trigger conf key the DAG does not declare as a Param (a typo would otherwise pass silently).

    :param conf: the DAG run's conf.
    :param known: the DAG's Param names.
    :raises SpecError: naming each unknown key, the closest known one, and the known keys.
    """
    known = sorted(known)
    unknown = sorted(set(conf or {}) - set(known))
    if not unknown:
        return
    parts = []
    for key in unknown[:MAX_KEYS_NAMED]:
        close = difflib.get_close_matches(key, known, n=1) if len(key) <= 200 else []
        parts.append(short(key) + (f" (did you mean {close[0]!r}?)" if close else ""))
    if len(unknown) > MAX_KEYS_NAMED:
        parts.append(f"and {len(unknown) - MAX_KEYS_NAMED:,} more")
    raise SpecError(f"unknown key{'s' if len(unknown) > 1 else ''} in the trigger conf: {', '.join(parts)}; "
                    f"this DAG's params are: {', '.join(known) or 'none'}. Fix the conf and trigger again.")


def override_value(value: Any) -> str | None:
    """A rendered launcher/policy Param as an override: None for "as the spec says"."""
    return None if value in (*KEEP_SPEC, SPEC_DEFAULT) else str(value)
