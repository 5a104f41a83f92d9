"""A run's inputs: the pool source (named pools, ``file:`` paths), the spec's run-time overrides, the spec a step runs with."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from autodl.errors import SpecError
from autodl.policy.registry import POLICIES
from autodl.registry import INVENTORY_SOURCES, LAUNCHERS
from autodl.spec import TaskSpec, load_spec, with_launcher_type
from autodl.store import RunState
from autodl.types import PlacementDecision, ProfileResult


# ------------------------------------------------------------------------------------ pool source
def pool_names() -> dict[str, Path]:
    """The pool files shipped in ``include/pools/`` by name (``demo`` -> ``<include>/pools/demo.yaml``)."""
    from autodl.config import include_dir

    return {p.stem: p for p in sorted((include_dir() / "pools").glob("*.yaml"))}


def resolve_pool_source(value: str | None, *, field: str = "pool", cwd: Path | None = None,
                        strict: bool = True) -> str | None:
    """The pool source a user named, as :func:`autodl.inventory.read_inventory` takes it.

    ``auto``, a source name (``nvml``) and a URL (``prometheus+http://...``) pass unchanged; a pool name
    (``demo``, ``gpu_node_2xa100``: a file of ``include/pools/``) becomes that file; a relative path (the DAG
    Param, where the tasks' working folder means nothing to the user) is looked for under the deployment's
    include folder (:func:`autodl.config.include_dir`) as it is, without a leading ``include/``, and under
    ``pools/`` (``pools/demo.yaml``, ``include/pools/demo.yaml``, ``demo.yaml`` all name the demo pool); an
    absolute path must exist. Empty or None: None (the default source).

    :param field: what the value was given as, for the message (``--pool``, the ``pool`` Param).
    :param cwd: the CLI's folder: a relative path is the user's own file there (a missing one is returned as
        given, for the pool reader to refuse naming where the examples are); only a pool name is looked up.
    :param strict: False: a path found nowhere is returned as given (the pool reader refuses it itself).
    :raises SpecError: (``strict``) when no such pool file exists, naming the field, where it looked and the fix.
    """
    from autodl.config import include_dir
    from autodl.inputs import clip

    if value is None or not str(value).strip():
        return None
    text = str(value).strip()
    if text == "auto" or text in INVENTORY_SOURCES or "://" in text:
        return text
    names = pool_names()
    path = Path(text).expanduser()
    if cwd is not None:  # the CLI: a path is the user's own (relative to where they are), else a pool name
        here = path if path.is_absolute() else cwd / path
        try:
            if here.is_file():
                return str(here)
        except OSError:
            pass
        return str(names[text]) if text in names else text
    if text in names:
        return str(names[text])
    if path.is_absolute():
        candidates = [path]
    else:
        inc = include_dir()
        rel = Path(*path.parts[1:]) if len(path.parts) > 1 and path.parts[0] == "include" else path
        candidates = list(dict.fromkeys([inc / path, inc / rel, inc / "pools" / rel]))
    for candidate in candidates:
        try:
            if candidate.is_file():
                return str(candidate)
        except OSError:  # a name too long, a loop: not a pool file
            continue
    if not strict:
        return text
    looked = ", ".join(clip(str(c), 160) for c in candidates)
    raise SpecError(f"{field} {clip(text, 120)!r}: no such pool file (looked at {looked}). Choose auto, nvml, a pool "
                    f"name ({', '.join(names) or 'none shipped'}), or the path of a pool YAML file, absolute or relative "
                    f"to autodl's include folder {clip(str(include_dir()), 160)} (e.g. pools/demo.yaml).")


# ------------------------------------------------------------------------------------ overrides
OVERRIDES: dict[str, tuple[str, str, tuple[str, ...]]] = {
    "launcher": ("launcher", "type", tuple(LAUNCHERS)),
    "policy": ("scheduler", "algorithm", tuple(POLICIES)),
    "args": ("task", "args", ()),  # a list of strings (templated per run), not one of a set of values
}
"""Run-time overrides of the spec (e.g. from a DAG's Params): name -> (spec section, field, allowed values).
The allowed values are the spec's own (``launcher.type``: :data:`autodl.registry.LAUNCHERS`; ``scheduler.algorithm``:
autodl's own policies, :data:`autodl.policy.registry.POLICIES`)."""


KEEP_SPEC = ("", "spec", "None", None)
"""Override values that mean "as the spec says"."""


def check_overrides(overrides: dict[str, Any] | None) -> dict[str, Any]:
    """The overrides that change something, validated.

    :param overrides: name -> value; ``"spec"``, ``""`` or None mean "as the spec says" and are dropped.
    :raises SpecError: for an unknown name or value, naming the known ones.
    """
    out: dict[str, Any] = {}
    for name, value in (overrides or {}).items():
        if name not in OVERRIDES:
            raise SpecError(f"unknown override {name!r}; known: {', '.join(OVERRIDES)}.")
        if name == "args":
            if value is None:
                continue
            if isinstance(value, str) or not isinstance(value, (list, tuple)) or not all(isinstance(a, str) for a in value):
                raise SpecError(f"args: the script's arguments are a list of strings (each may be templated, e.g. "
                                f"['--data', '{{{{ ti.xcom_pull(task_ids=\"prepare\") }}}}']), got {type(value).__name__}.")
            out[name] = [str(a) for a in value]
            continue
        if value in KEEP_SPEC:
            continue
        allowed = OVERRIDES[name][2]
        if value not in allowed:
            section, key, _ = OVERRIDES[name]
            raise SpecError(f"{name}: {value!r} is not a {section}.{key}; use 'spec' (as the spec says) or one of: "
                            f"{', '.join(allowed)}.")
        out[name] = str(value)
    return out


def apply_overrides(spec: TaskSpec, overrides: dict[str, Any] | None) -> TaskSpec:
    """``spec`` with the (already checked) overrides applied; a ``launcher`` override makes the section that
    launcher's options (:func:`autodl.spec.with_launcher_type`: the fields it lacks are dropped)."""
    for name, value in (overrides or {}).items():
        section, key, _ = OVERRIDES[name]
        part = getattr(spec, section)
        changed = with_launcher_type(part, value) if name == "launcher" else part.model_copy(update={key: value})
        spec = spec.model_copy(update={section: changed})
    return spec


def run_spec(profile_out: ProfileResult | dict[str, Any]) -> TaskSpec:
    """The spec a run goes by after its profile step: the spec file with the run's overrides applied
    (``{}``: the default spec)."""
    overrides: dict[str, Any] | None
    if isinstance(profile_out, ProfileResult):
        spec_path, overrides = profile_out.spec_path, profile_out.overrides
    else:
        spec_path, overrides = profile_out.get("spec_path"), profile_out.get("overrides")
    spec = load_spec(spec_path) if spec_path else TaskSpec()
    return apply_overrides(spec, overrides)


def keep_decision(run_key: str, decision: PlacementDecision) -> None:
    """Keep the placement decision a booking was made on (every candidate, kept or dropped, with its
    reasons) in the run state; the run record takes it as ``decision``."""
    RunState().put(run_key, RunState.DECISION, decision)


# --------------------------------------------------------------------------------------- inputs
def load_inputs(script: str | Path | None, spec_path: str | Path | None) -> tuple[TaskSpec, Path]:
    """The validated spec (defaults when ``spec_path`` is None) and the resolved script path.

    :raises SpecError: invalid spec, or no script given / script missing.
    """
    spec = load_spec(spec_path) if spec_path else TaskSpec()
    return spec, spec.script_path(script if script else None)


def source_of(profile_out: ProfileResult) -> str | None:
    """The pool source the run's profile read, as :func:`autodl.inventory.read_inventory` takes it again
    (``file:<path>`` is the path); None for the default source."""
    src = profile_out.pool_source
    return src[len("file:"):] if src and src.startswith("file:") else src
