"""The task spec: a YAML file (``task:`` / ``resource_policy:`` / ``scheduler:`` / ``launcher:``) validated with pydantic.

Example (``include/specs/simple_cnn.yaml``)::

    task:
      type: image_classification
      framework: paddlepaddle
      model_name: simple_cnn
      script: ../scripts/simple_cnn.py      # relative to this file
      batch_size_per_gpu: 64
      num_gpus_estimate: auto               # or an integer
    resource_policy:
      memory_threshold: 0.85                # fraction of device memory a run may plan to use
      allow_mixed_precision: true
      distributed_strategy: none            # none | data_parallel | fleet
      preferred_devices: [A100-SXM4-40GB, V100-PCIE-32GB]
    scheduler:
      algorithm: rule_based                 # rule_based | rl_based
      timeout: 3600                         # seconds to wait for a free device

Values given here override what the profiler reads from the script.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from autodl.errors import SpecError

DEFAULT_MEMORY_THRESHOLD = 0.85
"""Plan at most 85% of a device's memory: leaves room for allocator fragmentation and the
estimate's error (the design card's default; issue 2)."""


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class TaskSection(_Section):
    type: str = "training"
    framework: Literal["paddlepaddle", "paddle"] = "paddlepaddle"
    model_name: str | None = None
    script: str | None = Field(None, description="Training script, relative to the spec file.")
    args: list[str] = Field(default_factory=list, description="Arguments passed to the script.")
    sequence_length: int | None = Field(None, gt=0)
    batch_size_per_gpu: int | None = Field(None, gt=0)
    input_shape: list[int] | None = Field(None, description="Per-sample input shape, e.g. [3, 32, 32].")
    num_gpus_estimate: int | Literal["auto"] = "auto"

    @field_validator("num_gpus_estimate")
    @classmethod
    def _positive_gpus(cls, value: int | str) -> int | str:
        if isinstance(value, int) and value < 1:
            raise ValueError("must be 'auto' or an integer >= 1")
        return value


class ResourcePolicySection(_Section):
    memory_threshold: float = Field(DEFAULT_MEMORY_THRESHOLD, gt=0, le=1)
    allow_mixed_precision: bool = True
    distributed_strategy: Literal["none", "data_parallel", "fleet"] = "none"
    preferred_devices: list[str] = Field(default_factory=list)
    tag_priorities: dict[str, float] = Field(
        default_factory=dict, description="Extra score per catalog tag, e.g. {domestic: 1.0}."
    )
    allowed_vendors: list[str] | None = None


class SchedulerSection(_Section):
    algorithm: Literal["rule_based", "rl_based"] = "rule_based"
    timeout: int = Field(3600, gt=0, description="Seconds to wait for a fitting device.")
    poke_interval: int = Field(30, gt=0, description="Seconds between pool checks while waiting.")


class LauncherSection(_Section):
    """How the training is started. ``launcher: docker`` is shorthand for ``{type: docker}``."""

    model_config = ConfigDict(extra="allow", frozen=True)

    type: Literal["local", "docker", "kubernetes"] = "local"


class TaskSpec(_Section):
    task: TaskSection = Field(default_factory=TaskSection)
    resource_policy: ResourcePolicySection = Field(default_factory=ResourcePolicySection)
    scheduler: SchedulerSection = Field(default_factory=SchedulerSection)
    launcher: LauncherSection = Field(default_factory=LauncherSection)
    source_path: str | None = Field(None, description="Where the spec was read from (set by load_spec).")

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
        else:
            raise SpecError(
                f"{where}: field 'task.script' is missing and no script was given; "
                "set task.script (relative to the spec file) or pass --script."
            )
        path = path.resolve()
        if not path.is_file():
            field = "--script" if override is not None else "task.script"
            raise SpecError(f"{where}: {field} names {path}, which does not exist; fix the path.")
        return path


def _format_errors(exc: ValidationError, where: str) -> str:
    lines = []
    for err in exc.errors():
        loc = ".".join(str(p) for p in err["loc"]) or "<root>"
        if err["type"] == "extra_forbidden":
            lines.append(f"{where}: unknown key '{loc}'; remove it or check its spelling.")
        else:
            got = err.get("input")
            lines.append(f"{where}: field '{loc}': {err['msg']} (got {got!r}).")
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
        data["source_path"] = str(Path(source).resolve())
    try:
        return TaskSpec.model_validate(data)
    except ValidationError as exc:
        raise SpecError(_format_errors(exc, where)) from None


def load_spec(path: str | Path) -> TaskSpec:
    """Read and validate a task spec YAML file.

    :param path: the spec file.
    :returns: the validated :class:`TaskSpec` with ``source_path`` set.
    :raises SpecError: when the file is missing, is not YAML, or fails validation.
    """
    p = Path(path)
    if not p.is_file():
        raise SpecError(f"{p}: spec file not found; pass the path of a task spec YAML.")
    try:
        data = yaml.safe_load(p.read_text())
    except yaml.YAMLError as exc:
        raise SpecError(f"{p}: not valid YAML: {exc}") from None
    return parse_spec(data, p)
