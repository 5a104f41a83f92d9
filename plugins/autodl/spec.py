"""The task spec: a YAML file (``task:`` / ``resource_policy:`` / ``scheduler:`` / ``launcher:``) validated with pydantic.

Details: docs/reference/task-spec.md#autodlspec.
"""

from __future__ import annotations

import difflib
import json
import math
import os
import re
import shlex
import types
import typing
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal, TypeAlias

from pydantic import BaseModel, Discriminator, Field, Tag, TypeAdapter, ValidationError, field_validator

from autodl.config import read_yaml, shipped_hint
from autodl.errors import SpecError
from autodl.fields import (
    MAX_INPUT_ELEMENTS,
    MAX_INPUT_RANK,
    BatchSize,
    DeviceCount,
    Fraction,
    InputDim,
    ScoreWeight,
    SequenceLength,
    WaitSeconds,
)
from autodl.inputs import clip, resolve_file, short
from autodl.launch.options import DockerOptions, KubernetesOptions, LauncherOptions, LocalOptions
from autodl.section import Section
from autodl.types import DryRunIn, Sharing

if TYPE_CHECKING:
    from autodl.catalog import Catalog

DEFAULT_MEMORY_THRESHOLD = 0.85
"""Plan at most 85% of a device's memory: leaves room for allocator fragmentation and the
estimate's error (the design card's default; issue 2)."""


DEFAULT_MAX_PENDING_S = 900
"""Seconds a Kubernetes pod may stay unschedulable before the run gives up: 15 minutes, the cluster
autoscaler's ``--max-node-provision-time`` default (after that it stops waiting for a new node too)."""


def _configured_threshold() -> float:
    """The default memory threshold: ``[autodl] memory_threshold`` / ``AUTODL_MEMORY_THRESHOLD`` when set
    (:func:`autodl.config.default_memory_threshold`), else :data:`DEFAULT_MEMORY_THRESHOLD`."""
    from autodl.config import default_memory_threshold

    configured = default_memory_threshold()
    return DEFAULT_MEMORY_THRESHOLD if configured is None else configured


def _configured_sharing() -> Sharing:
    """The default sharing mode: ``[autodl] sharing`` / ``AUTODL_SHARING`` (:func:`autodl.config.default_sharing`),
    ``exclusive`` when unset."""
    from autodl.config import default_sharing

    return "packed" if default_sharing() == "packed" else "exclusive"


def _configured_launcher() -> str:
    """The default launcher: ``[autodl] default_launcher`` / ``AUTODL_LAUNCHER`` when set, else ``local``."""
    from autodl.config import default_launcher

    return default_launcher() or "local"


class TaskSection(Section):
    type: str = "training"
    framework: Literal["paddlepaddle", "paddle"] = "paddlepaddle"
    model_name: str | None = Field(None, max_length=200, description="Names the default output folder, records, logs.")
    script: str | None = Field(None, description="Training script, relative to the spec file.")
    args: list[str] = Field(default_factory=list, description="Arguments passed to the script.")
    sequence_length: SequenceLength | None = None
    batch_size_per_gpu: BatchSize | None = None
    input_shape: list[InputDim] | None = Field(None, min_length=1, max_length=MAX_INPUT_RANK,
                                               description="Per-sample input shape, e.g. [3, 32, 32].")
    num_gpus_estimate: DeviceCount | Literal["auto"] = "auto"
    probe: bool | None = Field(None, description="Measure the model in the sandboxed CPU probe; "
                                                 "default: when Paddle is importable. The CLI's --probe/--no-probe wins.")
    dry_run_in: DryRunIn | None = Field(
        None, description="Where the dry run runs the script: auto (this worker's sandbox, else the launcher's "
                          "image), worker or launcher; default: [autodl] dry_run_in, else auto.")
    output_dir: str | None = Field(
        None, description="Folder the training keeps its checkpoints in across runs (AUTODL_OUTPUT_DIR), relative "
                          "to the spec file; default: $AUTODL_HOME/outputs/<dag_id>/<owner>/<model_name or script "
                          "name> (outside Airflow: outputs/<name>).")

    @field_validator("num_gpus_estimate", mode="before")
    @classmethod
    def _positive_gpus(cls, value: Any) -> Any:
        if isinstance(value, int) and not isinstance(value, bool) and value < 1:
            raise ValueError("must be 'auto' or an integer >= 1")
        return value

    @field_validator("input_shape")
    @classmethod
    def _sample_size(cls, value: list[int] | None) -> list[int] | None:
        if value and math.prod(value) > MAX_INPUT_ELEMENTS:
            raise ValueError(f"one sample of this shape has {math.prod(value):.3g} elements, more than any device holds; "
                             "give the shape of one sample (without the batch), e.g. [3, 224, 224]")
        return value


class ResourcePolicySection(Section):
    memory_threshold: Fraction = Field(default_factory=lambda: _configured_threshold())
    allow_mixed_precision: bool = True
    distributed_strategy: Literal["none", "data_parallel", "fleet"] = "none"
    preferred_devices: list[str] = Field(default_factory=list)
    tag_priorities: dict[str, ScoreWeight] = Field(
        default_factory=dict, description="Extra score per catalog tag, e.g. {domestic: 1.0}."
    )
    allowed_vendors: list[str] | None = None
    sharing: Sharing = Field(
        default_factory=lambda: _configured_sharing(),
        description="exclusive: the run's devices are its own; packed: a 1-device run whose estimate is known may share "
                    "a >= 24 GB NVIDIA device with one other packed run when both estimates fit "
                    "(autodl.policy.packing). Default [autodl] sharing, itself exclusive.")

    @field_validator("sharing", mode="before")
    @classmethod
    def _sharing_as_configured(cls, value: Any) -> Any:
        # as [autodl] sharing reads it (case and spaces do not matter there); null is the configured default
        if value is None:
            return _configured_sharing()
        return value.strip().lower() if isinstance(value, str) else value

    @field_validator("tag_priorities")
    @classmethod
    def _catalog_tags(cls, value: dict[str, float]) -> dict[str, float]:
        # a tag no catalog entry carries scores nothing: a typo ('domestc') would be a silent no-op (issue 23)
        if not value:
            return value
        from autodl.catalog import load_catalog

        known = sorted({tag for model in load_catalog().models.values() for tag in model.tags})
        unknown = [tag for tag in value if tag not in known]
        if unknown:
            hint = difflib.get_close_matches(unknown[0], known, n=1)
            did = f" (did you mean {hint[0]!r}?)" if hint else ""
            raise ValueError(f"unknown catalog tag {short(unknown[0])}{did}; the catalog's tags are: {', '.join(known)}")
        return value


class SchedulerSection(Section):
    algorithm: str = Field(default="rule_based", description="The placement policy, by registry name "
                                                             "(:data:`autodl.policy.registry.POLICIES`).")
    timeout: WaitSeconds = Field(3600, description="Seconds to wait for a fitting device.")
    poke_interval: WaitSeconds = Field(30, description="Seconds between pool checks while waiting.")
    max_run_time: WaitSeconds | None = Field(None, description="Seconds the training may run; past it autodl "
                                                               "stops it and records why. None: no limit.")
    max_pending_time: WaitSeconds = Field(DEFAULT_MAX_PENDING_S, description="Seconds a Kubernetes pod may stay "
                                          "unschedulable (Pending, FailedScheduling) before the run is stopped.")
    team: str | None = Field(default=None, min_length=1, max_length=250,
                             description="The team queue whose quota the run counts against ([autodl] team_queues); "
                                         "default: the run's owner.")
    priority: int | str | None = Field(default=None, description="Priority within the team: an integer (higher first) or a "
                                                         "priority class of the team queues file. Default 0.")
    train_steps: int | None = Field(default=None, ge=1, le=10**12,
                                    description="Optimizer steps the training runs in all: the queue's runtime estimate "
                                                "of a run never seen before is this x the estimated step time.")

    @field_validator("algorithm")
    @classmethod
    def _known_algorithm(cls, value: str) -> str:
        from autodl.policy.registry import policy_names

        if value not in policy_names():
            raise ValueError(f"placement algorithm {short(value)} is unknown; use one of: {', '.join(policy_names())}")
        return value

    @field_validator("priority")
    @classmethod
    def _priority(cls, value: Any) -> Any:
        if isinstance(value, bool) or (isinstance(value, int) and not -10**6 <= value <= 10**6):
            raise ValueError("an integer from -1000000 to 1000000 or a priority class name, e.g. high")
        if isinstance(value, str) and not (0 < len(value) <= 100):
            raise ValueError("a priority class name of 1 to 100 characters, or an integer")
        return value


LAUNCHER_OPTIONS: dict[str, type[LauncherOptions]] = {
    "local": LocalOptions, "docker": DockerOptions, "kubernetes": KubernetesOptions,
}
"""Each launcher's options by ``launcher.type``: the ``options`` of its class in :data:`autodl.registry.LAUNCHERS`
(a test checks the two agree)."""


def _launcher_tag(value: Any) -> str:
    """The union member a ``launcher:`` section is validated as: its ``type``; without one, the configured default
    launcher (``[autodl] default_launcher``). A type no launcher has goes to ``local``'s, whose ``type`` check
    then names the field and the choices."""
    kind = value.get("type", _configured_launcher()) if isinstance(value, dict) else getattr(value, "type", None)
    return kind if isinstance(kind, str) and kind in LAUNCHER_OPTIONS else "local"


LauncherChoice: TypeAlias = LocalOptions | DockerOptions | KubernetesOptions
"""A validated ``launcher:`` section: the options of one of :data:`LAUNCHER_OPTIONS`' launchers."""

LauncherSection: TypeAlias = Annotated[
    Annotated[LocalOptions, Tag("local")] | Annotated[DockerOptions, Tag("docker")]
    | Annotated[KubernetesOptions, Tag("kubernetes")],
    Discriminator(_launcher_tag),
]
"""How the training is started: the options of the launcher ``type`` names (:data:`LAUNCHER_OPTIONS`).
``launcher: docker`` is shorthand for ``{type: docker}``; without a type, the configured default launcher's.
A key of another launcher (``namespace`` under ``type: docker``) is refused, naming the launcher that has it;
unknown keys are refused, naming the key, so a typo never passes silently."""
_LAUNCHER_ADAPTER: TypeAdapter[LauncherChoice] = TypeAdapter(LauncherSection)


def launcher_section(value: Any) -> LauncherChoice:
    """``value`` (a ``launcher:`` section: a mapping, a launcher name, or a validated section) validated as
    :data:`LauncherSection`.

    :raises pydantic.ValidationError: naming each bad field.
    """
    return _LAUNCHER_ADAPTER.validate_python({"type": value} if isinstance(value, str) else value)


def with_launcher_type(section: LauncherChoice, kind: str) -> LauncherChoice:
    """``section`` as the options of launcher ``kind`` (a run's override of ``launcher.type``): the fields the spec
    set that ``kind``'s launcher has are kept; the others (``namespace`` when a kubernetes spec runs on docker)
    mean nothing to it and are dropped, as a launcher always ignored them.

    :raises pydantic.ValidationError: when a kept field is invalid for ``kind`` (it never is for the shipped ones).
    """
    if section.type == kind:
        return section
    fields = LAUNCHER_OPTIONS[kind].model_fields
    kept = section.model_dump(include={name for name in section.model_fields_set if name in fields and name != "type"})
    return launcher_section({**kept, "type": kind})


def other_launcher_of(key: str, kind: str) -> str | None:
    """The launcher whose options have ``key``, when ``kind``'s do not (``namespace`` -> ``kubernetes``)."""
    if key in LAUNCHER_OPTIONS.get(kind, LocalOptions).model_fields:
        return None
    return next((name for name, model in LAUNCHER_OPTIONS.items() if key in model.model_fields), None)


class TaskSpec(Section):
    task: TaskSection = Field(default_factory=TaskSection)
    resource_policy: ResourcePolicySection = Field(default_factory=ResourcePolicySection)
    scheduler: SchedulerSection = Field(default_factory=SchedulerSection)
    launcher: LauncherSection = Field(default_factory=lambda: launcher_section({}))
    source_path: str | None = Field(None, description="Where the spec was read from (set by load_spec).")

    @field_validator("task", "resource_policy", "scheduler", "launcher", mode="before")
    @classmethod
    def _empty_section(cls, value: Any) -> Any:
        # `resource_policy:` with every key under it commented out is YAML's null: the section's defaults, as `{}`
        return {} if value is None else value

    @field_validator("launcher", mode="before")
    @classmethod
    def _launcher_shorthand(cls, value: Any) -> Any:
        if isinstance(value, str):
            return {"type": value}
        return value

    def script_path(self, override: str | Path | None = None) -> Path:
        """Resolve the training script: ``override`` wins, else ``task.script`` relative to the spec.

        :raises SpecError: when neither names a script, or the file does not exist.
        """
        where = self.source_path or "<spec>"
        if override is not None:
            path = Path(override)
        elif self.task.script:
            base = Path(self.source_path).parent if self.source_path else Path.cwd()
            path = base / self.task.script
        elif self.source_path is None:
            raise SpecError("no training script was given: `autodl profile SCRIPT [--spec SPEC]`, or a spec whose "
                            "task.script names it (`autodl plan SPEC`).")
        else:
            raise SpecError(
                f"{where}: field 'task.script' is missing and no script was given; "
                "set task.script (relative to the spec file), or give the script itself: `autodl profile SCRIPT "
                "--spec SPEC`, `autodl plan SPEC --script SCRIPT`."
            )
        # resolved without following symlink loops; a folder, a FIFO or a too-long name is refused
        if override is not None:
            try:
                return resolve_file(os.path.abspath(path), SpecError, "script",
                                    fix="pass the path of a Python training script",
                                    missing="does not exist; pass the path of a Python training script"
                                    + shipped_hint("scripts", os.path.abspath(path)) + ".")
            except SpecError as exc:
                raise SpecError(f"training script {exc}") from None
        try:
            return resolve_file(os.path.abspath(path), SpecError, "script", fix="fix task.script (relative to the spec file)",
                                missing="does not exist; fix task.script (relative to the spec file).")
        except SpecError as exc:
            raise SpecError(f"{where}: field 'task.script' names {exc}") from None


MAX_ERRORS_SHOWN = 10
"""Validation errors listed in one message; the rest are counted (a list of 100,000 bad values says so in a line)."""


def output_dir_path(spec: TaskSpec, script: str | Path, home: Path, *, dag_id: str | None = None,
                    owner: str | None = None) -> Path:
    """The folder a run keeps its checkpoints in, the same for every run of one model of one DAG and owner.

    :param spec: the task spec; ``task.output_dir`` wins (relative to the spec file).
    :param script: the training script (names the default folder when the spec has no model name).
    :param home: autodl's state folder (``AUTODL_HOME``); the default is ``home/outputs/<name>``, and
        ``home/outputs/<dag_id>/<owner>/<name>`` for a run of a DAG, so two owners' (or two DAGs') models of one
        script name never resume from or overwrite each other's checkpoints (issue 23).
    :param dag_id: the DAG the run belongs to (None: a run outside Airflow).
    :param owner: who runs it (the Airflow user or the DAG's owner; None: ``unknown``).
    :returns: an absolute path (not created here).
    """
    if spec.task.output_dir:
        base = Path(spec.source_path).parent if spec.source_path else Path.cwd()
        return (base / spec.task.output_dir).resolve()
    name = output_dir_name(spec.task.model_name or Path(script).stem)
    if dag_id is None:
        return (home / "outputs" / name).resolve()
    return (home / "outputs" / output_dir_name(dag_id) / output_dir_name(owner or "unknown") / name).resolve()


def output_dir_name(name: str) -> str:
    """The folder name under ``$AUTODL_HOME/outputs`` of a model called ``name``.

    A name of at most 100 file-name-safe characters (letters, digits, ``_.-``, not starting with a dot) is the
    folder name itself, as it always was (``simple_cnn``). Any other (``a/b``, ``résumé``, ``..``, 300 characters)
    becomes ``<readable prefix>-<first 16 hex digits of its SHA-256>``, so two names that differ only in characters
    the prefix replaces never share a folder (one model would resume from another's checkpoint), and the name
    always fits a file name (255 bytes).
    """
    import hashlib

    if re.fullmatch(r"[A-Za-z0-9_-][A-Za-z0-9_.-]{0,99}", name):
        return name
    prefix = re.sub(r"[^A-Za-z0-9_.-]+", "_", name)[:60].strip("._") or "model"
    return f"{prefix}-{hashlib.sha256(name.encode('utf-8', 'surrogatepass')).hexdigest()[:16]}"


def _model_in(annotation: Any) -> type[BaseModel] | None:
    """The pydantic model an annotation holds (``LauncherSection``, ``list[MountSpec]``, ``X | None``), else None."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in typing.get_args(annotation):
        found = _model_in(arg)
        if found is not None:
            return found
    return None


KEY_SYNONYMS = {"volumes": "mounts", "volume": "mounts", "binds": "mounts", "environment": "env",
                "batch": "batch_size_per_gpu", "gpus": "num_gpus_estimate"}
"""Keys users bring from Docker Compose, docker-py and other tools, and autodl's key for the same thing."""


def _models_in(annotation: Any) -> list[type[BaseModel]]:
    """Every pydantic model an annotation holds (the launcher union's three, ``list[MountSpec]``'s one)."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    return [m for arg in typing.get_args(annotation) for m in _models_in(arg)]


def _walk_to_section(loc: tuple) -> tuple[type[BaseModel] | None, tuple]:
    """The model holding the key at ``loc`` and ``loc`` as the file spells it: the launcher union's tag
    (``launcher.docker.namespace``) picks that launcher's options and leaves the path."""
    model: type[BaseModel] | None = TaskSpec
    shown: list = []
    parts = list(loc[:-1])
    while parts:
        part = parts.pop(0)
        shown.append(part)
        if isinstance(part, int):  # an item of a list of mappings (launcher.mounts[0])
            continue
        field = model.model_fields.get(part) if model is not None else None
        if field is None:
            return None, loc
        model = _model_in(field.annotation)
        if len(_models_in(field.annotation)) > 1 and parts and parts[0] in LAUNCHER_OPTIONS:
            model = LAUNCHER_OPTIONS[parts.pop(0)]
        if model is None:
            return None, loc
    return model, (*shown, loc[-1])


def _key_hint(loc: tuple) -> str:
    """The fix for an unknown key at ``loc``: the launcher whose options have it (``namespace`` under
    ``type: docker`` -> ``kubernetes``), the closest key its section has (``task.batch_size`` ->
    ``batch_size_per_gpu``), or the section a key of another section belongs to (``scheduler.memory_threshold``
    -> ``resource_policy``), else "remove it or check its spelling"."""
    fallback = "; remove it or check its spelling"
    model, loc = _walk_to_section(loc)
    if model is None:
        return fallback
    key = str(loc[-1])
    if isinstance(model, type) and issubclass(model, LauncherOptions):
        kind = str(model.model_fields["type"].default)
        other = other_launcher_of(key, kind)
        if other is not None:
            return (f"; it is a field of the {other} launcher, not of {kind}: set launcher.type: {other}, or remove "
                    "it")
    known = [name for name in model.model_fields if name != "source_path"]
    close = difflib.get_close_matches(key, known, n=1) if len(key) <= 100 else []
    if not close and KEY_SYNONYMS.get(key) in known:
        close = [KEY_SYNONYMS[key]]
    if close:
        return f" (did you mean '{close[0]}'?){fallback}"
    if model is not TaskSpec and len(loc) == 2:
        for section, field in TaskSpec.model_fields.items():
            others = [m for m in _models_in(field.annotation) if m is not model and section != loc[0]]
            if any(key in other.model_fields for other in others):
                return f"; it belongs under '{section}:', move it there"
    return fallback


def _shown_loc(loc: tuple) -> tuple:
    """``loc`` without the names pydantic gives the members of a union (``task.num_gpus_estimate.constrained-int``
    and ``task.num_gpus_estimate.literal['auto']`` are both ``task.num_gpus_estimate``): they are no key of the file."""
    model: type[BaseModel] | None = TaskSpec
    shown: list = []
    union_member_next = False
    for part in loc:
        if union_member_next and isinstance(part, str):
            union_member_next = False
            if part in LAUNCHER_OPTIONS and model is LocalOptions:  # the launcher union's tag: that launcher's fields
                model = LAUNCHER_OPTIONS[part]
            continue
        union_member_next = False
        shown.append(part)
        if isinstance(part, int) or model is None:
            continue
        field = model.model_fields.get(part)
        if field is None:
            model = None
            continue
        members = [a for a in typing.get_args(field.annotation) if a is not type(None)]
        union_member_next = typing.get_origin(field.annotation) in (typing.Union, types.UnionType) and len(members) > 1
        model = _model_in(field.annotation)
    return tuple(shown)


def _yaml_hint(msg: str, got: Any) -> str:
    """How to write the value in YAML, where its type is what is wrong: a number where a string is wanted
    (``launcher.env``'s values) is quoted, a quoted number where a number is wanted is written bare."""
    if "instance of MountSpec" in msg and isinstance(got, str) and got.count(":") in (1, 2):
        source, target = got.split(":")[:2]
        ro = "false" if got.endswith(":rw") else "true"
        return f"; a mount is a mapping: {{source: {source}, target: {target}, read_only: {ro}}}"
    if msg.startswith("Input should be a valid string") and isinstance(got, (int, float)) and not isinstance(got, bool):
        return f"; quote it in the YAML: '{got}'"
    if msg.startswith(("Input should be a valid integer", "Input should be a valid number")) and isinstance(got, str) \
            and got.strip().lstrip("-").replace(".", "", 1).isdigit():
        return f"; write it without quotes: {got.strip()}"
    return _percent_hint(msg, got) or _list_hint(msg, got)


def _percent_hint(msg: str, got: Any) -> str:
    """A fraction written as a percentage (``85%``, ``85``): the fraction it means."""
    text = got.strip().removesuffix("%") if isinstance(got, str) and got.strip().endswith("%") else got
    if isinstance(text, str):
        try:
            text = float(text)
        except ValueError:
            return ""
    wanted = msg.startswith(("Input should be less than or equal to 1", "Input should be a valid number"))
    if wanted and isinstance(text, (int, float)) and not isinstance(text, bool) and 1 < text <= 100:
        return f"; it is a fraction: {text / 100:g} for {text:g}%"
    return ""


def _list_hint(msg: str, got: Any) -> str:
    """A list written as one string (``args: --bs 128``): the YAML list of its words."""
    if not (msg.startswith("Input should be a valid list") and isinstance(got, str) and got.strip()):
        return ""
    try:
        words = shlex.split(got)
    except ValueError:
        return ""
    return "; write it as a YAML list, one item each: [" + ", ".join(json.dumps(w) for w in words[:8]) \
        + (", ..." if len(words) > 8 else "") + "]"


def _mapping_wanted(loc: str, msg: str) -> str:
    """Pydantic's "Input should be a valid dictionary or instance of LocalOptions" in the file's terms: a mapping
    of the section's keys (for ``launcher``, or a launcher's name); other messages as they are."""
    if not msg.startswith("Input should be a valid dictionary"):
        return msg
    if loc == "launcher":
        return (f"should be a launcher's name ({', '.join(LAUNCHER_OPTIONS)}) or a mapping of that launcher's "
                "options (type: docker, image: ...)")
    return "should be a mapping: its keys as indented 'key: value' lines"


def _format_errors(exc: ValidationError, where: str) -> str:
    lines = []
    errors = exc.errors(include_url=False)
    merged: list[tuple[str, str, Any]] = []  # (loc, message, input): a union's members' errors become one line
    for err in errors:
        loc = clip(".".join(str(p) for p in _shown_loc(err["loc"])) or "<root>", 100)
        msg = err["msg"].removeprefix("Value error, ")
        if err["type"] == "extra_forbidden":
            merged.append((loc, "", err["loc"]))
        elif merged and merged[-1][0] == loc and merged[-1][1] and merged[-1][2] is err.get("input"):
            merged[-1] = (loc, f"{merged[-1][1]} or {msg.removeprefix('Input should be ')}", err.get("input"))
        else:
            merged.append((loc, msg, err.get("input")))
    for loc, msg, got in merged[:MAX_ERRORS_SHOWN]:
        if not msg:
            lines.append(f"{where}: unknown key '{loc}'{_key_hint(got)}.")
        else:
            lines.append(f"{where}: field '{loc}': {clip(_mapping_wanted(loc, msg), 300)} (got {short(got, 60)})"
                         f"{_yaml_hint(msg, got)}.")
    if len(merged) > MAX_ERRORS_SHOWN:
        lines.append(f"{where}: ... and {len(merged) - MAX_ERRORS_SHOWN} more errors.")
    return "\n".join(lines)


def parse_spec(data: Any, source: str | Path | None = None) -> TaskSpec:
    """Validate a spec already loaded as a mapping.

    :param data: the YAML document as Python objects (``None`` means an empty spec).
    :param source: the file it came from, for messages and relative script paths.
    :raises SpecError: naming the file and each bad field.
    """
    where = str(source) if source else "<spec>"
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise SpecError(f"{where}: a spec is a mapping with task:/resource_policy:/scheduler:, got {type(data).__name__}.")
    data = dict(data)
    data.pop("source_path", None)
    if source is not None:
        data["source_path"] = os.path.realpath(source)  # never raises on a symlink loop (Path.resolve does)
    try:
        return TaskSpec.model_validate(data)
    except ValidationError as exc:
        raise SpecError(_format_errors(exc, where)) from None


def load_spec(path: str | Path) -> TaskSpec:
    """Read and validate a task spec YAML file.

    :param path: the spec file.
    :returns: the validated :class:`TaskSpec` with ``source_path`` set.
    :raises SpecError: when the file is missing, is not YAML, or fails validation; a Python file (the training
        script given where the spec goes) is named as such, not as YAML that does not parse.
    """
    if str(path).endswith(".py") and _readable_file(path):
        raise SpecError(f"{path} is a Python file, not a task spec: give the task spec YAML, whose task.script names "
                        "the training script (`autodl plan SPEC`, or `autodl plan SPEC --script SCRIPT`); "
                        "`autodl profile SCRIPT` profiles a script without a spec.")
    data = read_yaml(path, SpecError, "spec file not found; pass the path of a task spec YAML"
                     + ("" if Path(path).is_absolute() else f" (a relative path is read from {os.getcwd()}, the "
                        "current folder of this process: in a DAG, the worker's; give an absolute path, e.g. "
                        "relative to the DAG file's folder)")
                     + shipped_hint("specs", path) + ".")
    return parse_spec(data, Path(path))


def _closest(name: str, known: list[str]) -> str:
    """" (did you mean ...?)" naming the known names that begin with ``name`` or are spelt like it, else ""."""
    key = name.lower().replace(" ", "-")
    near = [k for k in known if k.lower().startswith(key)] or difflib.get_close_matches(name, known, n=3, cutoff=0.6)
    return f" (did you mean {' or '.join(near[:3])}?)" if near else ""


def _readable_file(path: str | Path) -> bool:
    """Whether ``path`` is a file here (a missing one or a symlink loop is for the reader to name)."""
    try:
        return Path(path).is_file()
    except OSError:
        return False


def check_spec_against_catalog(spec: TaskSpec, catalog: Catalog) -> None:
    """Device models and vendors the spec names must exist; a typo would otherwise be ignored silently.

    :raises SpecError: naming the field, the unknown name and the known ones.
    """
    where = spec.source_path or "<spec>"
    for i, name in enumerate(spec.resource_policy.preferred_devices):
        if catalog.find(name) is None:
            raise SpecError(f"{where}: resource_policy.preferred_devices[{i}]: {name!r} is not in the GPU catalog"
                            f"{_closest(name, sorted(catalog.models))}; use one of: {', '.join(sorted(catalog.models))}.")
    for i, vendor in enumerate(spec.resource_policy.allowed_vendors or []):
        if vendor not in catalog.vendors:
            raise SpecError(f"{where}: resource_policy.allowed_vendors[{i}]: unknown vendor {vendor!r}; "
                            f"use one of: {', '.join(sorted(catalog.vendors))}.")
