"""The task spec: a YAML file (``task:`` / ``resource_policy:`` / ``scheduler:`` / ``launcher:``) validated with pydantic.

Details: docs/reference/task-spec.md#autodlspec.
"""

from __future__ import annotations

import difflib
import math
import os
import posixpath
import re
import stat
import types
import typing
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, ValidationInfo, field_validator, model_validator

from autodl.config import read_yaml, shipped_hint
from autodl.errors import SpecError
from autodl.fields import (
    MAX_HOST_BYTES,
    MAX_INPUT_ELEMENTS,
    MAX_INPUT_RANK,
    UINT32_ID_MAX,
    BatchSize,
    Cpus,
    DeviceCount,
    Fraction,
    InputDim,
    Int,
    ScoreWeight,
    SequenceLength,
    WaitSeconds,
)
from autodl.inputs import clip, resolve_file, short
from autodl.registry import LAUNCHERS, check_choice

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


def _configured_sharing() -> Literal["exclusive", "packed"]:
    """The default sharing mode: ``[autodl] sharing`` / ``AUTODL_SHARING`` (:func:`autodl.config.default_sharing`),
    ``exclusive`` when unset."""
    from autodl.config import default_sharing

    return "packed" if default_sharing() == "packed" else "exclusive"


def _configured_launcher() -> str:
    """The default launcher: ``[autodl] default_launcher`` / ``AUTODL_LAUNCHER`` when set, else ``local``."""
    from autodl.config import default_launcher

    return default_launcher() or "local"


def _kind_of(annotation: Any) -> str:
    """What a field takes, in words (``a number``, ``a string``, ``one of 'exclusive', 'packed'``), from its
    annotation."""
    import typing

    seen: set[type] = set()
    choices: list[str] = []

    def walk(a: Any) -> None:
        if isinstance(a, type):
            seen.add(a)
        if typing.get_origin(a) is typing.Literal:
            choices.extend(repr(v) for v in typing.get_args(a))
            return
        for arg in typing.get_args(a):
            walk(arg)

    walk(annotation)
    if choices and not seen - {type(None)}:
        return "one of " + ", ".join(choices)
    number, text = bool(seen & {int, float}), str in seen
    return "a number" if number and not text else "a string" if text and not number else "a number or a string"


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    @field_validator("*", mode="before")
    @classmethod
    def _no_bool_for_numbers(cls, value: Any, info: ValidationInfo) -> Any:
        # YAML's `true` must not pass as 1 (a batch of one) or 1.0 (a threshold of 100%)
        if isinstance(value, bool):
            annotation = cls.model_fields[str(info.field_name)].annotation
            if "bool" not in str(annotation):
                raise ValueError(f"expected {_kind_of(annotation)}, not true/false")
        return value

    @field_validator("*", mode="before")
    @classmethod
    def _no_nul(cls, value: Any, info: ValidationInfo) -> Any:
        # a NUL byte cannot cross exec(2), a Docker API call or a pod manifest: refuse it here, naming the
        # field, instead of failing the launch with a traceback (reliability test, issue 23). A nested section
        # checks its own fields, so the error names the innermost one.
        if _holds_section(cls.model_fields[info.field_name].annotation):
            return value
        if _has_nul(value):
            raise ValueError("contains a NUL character (\\x00), which no launcher can pass on; remove it")
        return value


def _holds_section(annotation: Any) -> bool:
    """Whether a field's type is (or contains) a pydantic model, which validates its own strings."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return True
    return any(_holds_section(arg) for arg in typing.get_args(annotation))


def _has_nul(value: Any, depth: int = 0) -> bool:
    """Whether a string anywhere in ``value`` (strings, lists, dicts, nested up to 16 levels) holds a NUL."""
    if isinstance(value, str):
        return "\x00" in value
    if depth > 16:
        return False
    if isinstance(value, dict):
        return any(_has_nul(k, depth + 1) or _has_nul(v, depth + 1) for k, v in value.items())
    if isinstance(value, (list, tuple)):
        return any(_has_nul(v, depth + 1) for v in value)
    return False


class TaskSection(_Section):
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
    dry_run_in: Literal["auto", "worker", "launcher"] | None = Field(
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


class ResourcePolicySection(_Section):
    memory_threshold: Fraction = Field(default_factory=lambda: _configured_threshold())
    allow_mixed_precision: bool = True
    distributed_strategy: Literal["none", "data_parallel", "fleet"] = "none"
    preferred_devices: list[str] = Field(default_factory=list)
    tag_priorities: dict[str, ScoreWeight] = Field(
        default_factory=dict, description="Extra score per catalog tag, e.g. {domestic: 1.0}."
    )
    allowed_vendors: list[str] | None = None
    sharing: Literal["exclusive", "packed"] = Field(
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


class SchedulerSection(_Section):
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


_SIZE_RE = re.compile(r"^\s*([0-9]+(?:\.[0-9]+)?)\s*([kmgt]?)(i?b?)\s*$", re.IGNORECASE)
_SIZE_FACTOR = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}


def parse_size(value: int | str | None) -> int | None:
    """Bytes for a size written as ``docker run --shm-size`` accepts it.

    ``8g``, ``8G``, ``8GB``, ``8Gi`` and ``8GiB`` all mean 8 GiB (8 * 2**30 bytes): Docker's
    ``units.RAMInBytes`` reads every unit as binary, and so does Kubernetes' ``Gi``. A bare integer
    is bytes.

    :param value: the size, an integer (bytes) or a string with an optional unit (b, k, m, g, t).
    :returns: bytes, or ``None`` for ``None``.
    :raises ValueError: for a negative, infinite or absurd (over 1 PiB) size or an unknown unit (pydantic turns
        it into a SpecError).
    """
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise ValueError("a size is a number of bytes or a string like '8g'")
    if isinstance(value, (int, float)):
        number = value
    else:
        match = _SIZE_RE.match(value) if len(value) <= 40 else None
        if not match:
            raise ValueError(f"{short(value, 40)} is not a size; write bytes or a number with k, m, g or t (binary), "
                             "e.g. '8g'")
        number = float(match.group(1)) * _SIZE_FACTOR[match.group(2).lower()]
    if not math.isfinite(number) or number <= 0:
        raise ValueError("a size must be a positive, finite number of bytes")
    if number > MAX_HOST_BYTES:
        raise ValueError(f"a size of {number:.3g} bytes is more than {MAX_HOST_BYTES >> 50} PiB; check the unit")
    return int(number)


class TolerationSpec(_Section):
    """A Kubernetes toleration (https://kubernetes.io/docs/concepts/scheduling-eviction/taint-and-toleration/)."""

    key: str | None = None
    operator: Literal["Exists", "Equal"] = "Exists"
    value: str | None = None
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"] | None = None
    toleration_seconds: Int(ge=0, le=10**9) | None = None


class MountSpec(_Section):
    """An extra host folder mounted into the container (data sets, checkpoints)."""

    source: str = Field(description="Absolute path on the Docker host.")
    target: str = Field(description="Absolute path inside the container.")
    read_only: bool = True

    @field_validator("source", "target")
    @classmethod
    def _absolute(cls, value: str) -> str:
        if not value.startswith("/") or "\x00" in value:
            raise ValueError("must be an absolute path")
        if len(value) > 4095 or any(c in value for c in ":,") or any(ord(c) < 32 or ord(c) == 127 for c in value):
            # Docker's bind syntax is SOURCE:TARGET:MODE (',' separates --mount options): a ':' in a path
            # would make the rest of it a target or a mode ('/data:/host:rw')
            raise ValueError("must be a path of at most 4095 characters without ':', ',' or control characters")
        if _normpath(value).endswith("docker.sock"):
            raise ValueError("the Docker socket is never mounted into a training container (it is root on the host)")
        return value

    @field_validator("source")
    @classmethod
    def _not_engine_socket(cls, value: str) -> str:
        check_mount_source(value)
        return value


ENGINE_SOCKETS = (
    "/var/run/docker.sock", "/run/docker.sock",
    "/run/containerd/containerd.sock", "/var/run/containerd/containerd.sock",
    "/run/podman/podman.sock", "/var/run/crio/crio.sock", "/run/crio/crio.sock",
)
"""Container engines' API sockets at their packaged locations (Docker, containerd, Podman, CRI-O): whoever can
write to one is root on the host."""


def _normpath(path: str) -> str:
    # lexical: '/var/run/docker.sock/.', '//var//run/', '/var/lib/../run' all become what they name
    return "/" + posixpath.normpath(path).lstrip("/") if path.startswith("/") else posixpath.normpath(path)


def _engine_sockets() -> list[str]:
    sockets = list(ENGINE_SOCKETS)
    host = os.environ.get("DOCKER_HOST", "")
    if host.startswith("unix://"):
        sockets.insert(0, host[len("unix://"):])
    if os.environ.get("XDG_RUNTIME_DIR"):
        sockets.append(os.path.join(os.environ["XDG_RUNTIME_DIR"], "docker.sock"))
    resolved: list[str] = []
    for sock in sockets:
        for name in (_normpath(sock), os.path.realpath(sock)):
            if name not in resolved:
                resolved.append(name)
    return resolved


SYSTEM_TREES = ("/proc", "/sys", "/dev", "/boot", "/etc", "/root", "/run", "/var/run", "/var/lib/docker",
                "/var/lib/containerd", "/var/lib/containers", "/var/lib/kubelet", "/var/lib/postgresql")
"""Host folders never mounted into a training container, nor any folder inside or holding one: the kernel's
interfaces (``/proc``: every process's command line; ``/sys``; ``/dev``: device nodes), the host's configuration
and credentials (``/etc``, ``/root``, ``/boot``), runtime state with sockets (``/run``), and the state of the
container engines, the kubelet (pod tokens) and PostgreSQL (data files)."""

MAX_UNIX_SOCKETS_READ = 4 << 20
"""Bytes of ``/proc/net/unix`` read to find live Unix sockets (one line per socket, ~100 bytes: 40,000 sockets)."""


def _unix_socket_paths() -> list[str]:
    """Paths of the Unix sockets bound on this host (``/proc/net/unix``, this network namespace's; abstract ones
    are left out: they are not files). Empty where it cannot be read."""
    try:
        with open("/proc/net/unix", "rb") as f:
            data = f.read(MAX_UNIX_SOCKETS_READ)
    except OSError:
        return []
    paths = []
    for line in data.decode("utf-8", "replace").splitlines()[1:]:
        parts = line.split(None, 7)
        if len(parts) == 8 and parts[7].startswith("/"):
            paths.append(posixpath.normpath(parts[7]))
    return paths


def _autodl_state_paths() -> list[str]:
    """autodl's and Airflow's own state on this host: ``AUTODL_HOME`` (every run's folder, logs, reports), the
    store's SQLite file (leases and records) and ``AIRFLOW_HOME`` (``airflow.cfg``: the Fernet key, connections).
    Computed as :mod:`autodl.config` does, without creating anything."""
    paths = []
    if os.environ.get("AUTODL_HOME"):
        paths.append(os.environ["AUTODL_HOME"])
    elif os.environ.get("AIRFLOW_HOME"):
        paths.append(os.path.join(os.environ["AIRFLOW_HOME"], "autodl"))
    else:
        paths.append(os.path.join(os.path.expanduser("~"), ".autodl"))
    if os.environ.get("AIRFLOW_HOME"):
        paths.append(os.environ["AIRFLOW_HOME"])
    url = os.environ.get("AUTODL_STORE_URL", "")
    if url.startswith("sqlite:///") and len(url) > len("sqlite:///"):
        db = url[len("sqlite:///"):].split("?", 1)[0]
        paths.append(db if db.startswith("/") else os.path.abspath(db))
    out = []
    for p in paths:
        for name in (_normpath(os.path.abspath(p)), os.path.realpath(p)):
            if name not in out:
                out.append(name)
    return out


def _overlaps(name: str, protected: str) -> bool:
    """True when ``name`` is ``protected``, lies inside it, or holds it."""
    name, protected = name.rstrip("/") or "/", protected.rstrip("/") or "/"
    return (name == protected or name == "/" or protected.startswith(name + "/")
            or name.startswith(protected + "/"))


def check_mount_source(source: str) -> None:
    """Refuse a host folder whose mount would hand the container the host, another run or a socket.

    The path is checked by what it names, not how it is spelt: lexically normalised (``/var/run/docker.sock/.``,
    ``//var/run``) and, where it exists on this host, with symlinks resolved (``/var/run`` -> ``/run``). Refused,
    as the path itself, anything inside it or any folder holding it:

    * a container engine's socket (``/var/run``, ``/run``, ``/var``, ``/`` hold Docker's), anything named
      ``docker.sock``, and any Unix socket;
    * any folder holding a Unix socket bound on this host (``/proc/net/unix``): ``/tmp`` with PostgreSQL's
      ``.s.PGSQL.5432``, whose trust authentication would let the training edit autodl's leases (a read-only
      mount does not stop ``connect()``);
    * the host's system trees (:data:`SYSTEM_TREES`: ``/proc``, ``/sys``, ``/dev``, ``/etc``, ``/root``, ...);
    * autodl's and Airflow's own state (``AUTODL_HOME``, the store's SQLite file, ``AIRFLOW_HOME``).

    :raises ValueError: naming what the path contains (pydantic turns it into a SpecError).
    """
    names = {_normpath(source)}
    try:
        if os.path.lexists(source):
            names.add(os.path.realpath(source))
            if stat.S_ISSOCK(os.stat(source).st_mode):
                raise ValueError("is a Unix socket; a socket is never mounted into a training container")
    except OSError:
        pass
    for name in names:
        for sock in _engine_sockets():
            if name == "/" or name == sock or sock.startswith(name.rstrip("/") + "/") or name.startswith(sock + "/"):
                raise ValueError(f"{clip(source, 60)} is or contains the container engine's socket {sock} (root on the "
                                 "host); mount a data folder that does not hold it, e.g. /data/datasets")
    for name in names:
        for tree in SYSTEM_TREES:
            if _overlaps(name, tree):
                raise ValueError(f"{clip(source, 60)} is, lies in or holds the host's {tree}, which is never mounted into "
                                 "a training container; mount a data folder, e.g. /data/datasets")
        for state in _autodl_state_paths():
            if _overlaps(name, state):
                raise ValueError(f"{clip(source, 60)} is, lies in or holds autodl's or Airflow's own state "
                                 f"({clip(state, 60)}: other runs' folders, the store, airflow.cfg); mount a data "
                                 "folder of this run only, e.g. /data/datasets")
    sockets = _unix_socket_paths()
    for name in names:
        inside = next((sock for sock in sockets if sock.startswith(name.rstrip("/") + "/")), None)
        if inside is not None:
            raise ValueError(f"{clip(source, 60)} holds the Unix socket .{clip(inside[len(name.rstrip('/')):], 60)} of a "
                             "service on this host "
                             "(a read-only mount does not stop connecting to it); mount a folder without sockets, "
                             "e.g. /data/datasets")


ACCELERATOR_NODES = re.compile(
    r"/dev/(?:kfd|dri(?:/(?:card|renderD)[0-9]{1,4})?|davinci[0-9]{1,4}|davinci_manager|devmm_svm|hisi_hdc"
    r"|xpu[0-9]{1,4}|xpuctrl|nvidia[0-9]{1,4}|nvidiactl|nvidia-uvm|nvidia-uvm-tools|nvidia-modeset)"
)
"""Host device nodes a training container may be given (``launcher.devices``): the accelerators' own. Sources: the
vendor table's ``docker_device_nodes``/``docker_shared_device_nodes`` (``include/catalog/vendors.yaml``: AMD/Hygon
``/dev/kfd`` and ``/dev/dri`` per ROCm's Docker guide, Ascend ``/dev/davinciN``, ``/dev/davinci_manager``,
``/dev/devmm_svm``, ``/dev/hisi_hdc``, Kunlun ``/dev/xpuN``, ``/dev/xpuctrl``), the DRM nodes under ``/dev/dri``
(``cardN``, ``renderDN``), and the NVIDIA driver's nodes (``/dev/nvidiaN``, ``nvidiactl``, ``nvidia-uvm*``,
``nvidia-modeset``: https://docs.nvidia.com/datacenter/cloud-native/container-toolkit/latest/arch-overview.html).
Anything else (``/dev/sda``, ``/dev/mem``, ``/dev/kmsg``) hands the container the host."""


def check_device_node(item: str) -> None:
    """Refuse a ``launcher.devices`` entry that is not an accelerator's node (:data:`ACCELERATOR_NODES`).

    An entry is ``HOST[:CONTAINER[:PERMISSIONS]]`` as ``docker run --device`` takes it: ``HOST`` lexically
    normalised and, where it exists, with symlinks resolved, must be an accelerator node; ``CONTAINER`` an
    absolute path; ``PERMISSIONS`` letters of ``rwm``.

    :raises ValueError: naming the entry and what is allowed.
    """
    parts = item.split(":") if isinstance(item, str) and len(item) <= 200 else []
    if not parts or len(parts) > 3 or any(ord(c) < 32 for c in item):
        raise ValueError(f"{short(item, 60)} is not a device node (HOST[:CONTAINER[:rwm]])")
    host = parts[0]
    names = {_normpath(host)} if host.startswith("/") else set()
    if host.startswith("/") and os.path.lexists(host):
        names.add(os.path.realpath(host))
    if not names or not all(ACCELERATOR_NODES.fullmatch(n) for n in names):
        raise ValueError(f"{short(host, 60)} is not an accelerator's device node; only those are passed through "
                         "(/dev/kfd, /dev/dri, /dev/davinciN, /dev/davinci_manager, /dev/devmm_svm, /dev/hisi_hdc, "
                         "/dev/xpuN, /dev/xpuctrl, /dev/nvidia*): any other node (a disk, /dev/mem) is the host")
    if len(parts) >= 2 and (not parts[1].startswith("/") or not parts[1].strip("/")):
        raise ValueError(f"{short(item, 60)}: the path inside the container must be absolute")
    if len(parts) == 3 and (not parts[2] or set(parts[2]) - set("rwm")):
        raise ValueError(f"{short(item, 60)}: permissions are letters of 'rwm'")


_DNS_SUBDOMAIN = re.compile(r"(?=.{1,253}$)[a-z0-9](?:[-a-z0-9.]*[a-z0-9])?")

_USER_RE = re.compile(r"([0-9]+)(?::([0-9]+))?")


def parse_container_user(value: str) -> tuple[int, int | None]:
    """``uid[:gid]`` as numbers, refusing root however it is spelt.

    Only numbers are taken: a user or group *name* is resolved inside the image, where autodl cannot see that it
    is not root (``root``, or any name mapped to uid 0). ``0``, ``00``, ``0:1000`` are uid 0; ``-0`` and
    ``+1000`` are not numbers; a uid above 4294967294 is not a uid (:data:`~autodl.fields.UINT32_ID_MAX`). The root
    group is refused too (``1000:0``, ``65534:0``): the training would share group root's access.

    :returns: ``(uid, gid or None)``.
    :raises ValueError: naming what is wrong and an example that works.
    """
    match = _USER_RE.fullmatch(value) if isinstance(value, str) and len(value) <= 40 else None
    if not match:
        raise ValueError(f"{short(value, 40)} is not a non-root numeric uid[:gid]; write numbers such as '1000:1000' "
                         "(a name resolves inside the image, where autodl cannot check that it is not root)")
    uid = int(match.group(1))
    gid = int(match.group(2)) if match.group(2) is not None else None
    if uid == 0:
        raise ValueError(f"{short(value, 40)} is uid 0, root; the training never runs as root: use a non-root uid "
                         "such as '1000:1000'")
    if gid == 0:
        raise ValueError(f"{short(value, 40)} has gid 0, the root group (files of group root in the image and on "
                         "mounted host folders become readable and writable to the training; a pod's fsGroup 0 gives "
                         "its volumes to group root); use a non-root gid such as '1000:1000'")
    if uid > UINT32_ID_MAX or (gid is not None and gid > UINT32_ID_MAX):
        raise ValueError(f"{short(value, 40)} is out of range (uid and gid are at most {UINT32_ID_MAX}); use a non-root "
                         "uid such as '1000:1000'")
    return uid, gid


KUEUE_QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
"""The label that hands a pod or Job to Kueue's LocalQueue of that name
(https://kueue.sigs.k8s.io/docs/tasks/run/plain_pods/)."""

_LABEL_NAME = re.compile(r"[A-Za-z0-9](?:[-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?")
_LABEL_VALUE = re.compile(r"(?:[A-Za-z0-9](?:[-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?)?")
_RESERVED_PREFIXES = ("kubernetes.io", "k8s.io")
AFFINITY_KEYS = ("nodeAffinity", "podAffinity", "podAntiAffinity")
"""The fields of a Kubernetes ``Affinity`` (https://kubernetes.io/docs/reference/kubernetes-api/workload-resources/pod-v1/#scheduling)."""


def check_metadata_key(key: str) -> str:
    """Refuse a label or annotation key that is not ``[prefix/]name`` (a DNS subdomain and a 63-character name,
    https://kubernetes.io/docs/concepts/overview/working-with-objects/labels/#syntax-and-character-set), that uses
    autodl's own ``autodl/`` prefix (its launches find their pods by it) or a prefix Kubernetes reserves for itself."""
    prefix, slash, name = key.rpartition("/")
    if not _LABEL_NAME.fullmatch(name) or (slash and not _DNS_SUBDOMAIN.fullmatch(prefix)):
        raise ValueError(f"{short(key, 60)} is not a Kubernetes key ([prefix/]name: name of at most 63 letters, "
                         "digits, '-', '_', '.', prefix a DNS subdomain)")
    if prefix == "autodl":
        raise ValueError(f"{short(key, 60)}: the autodl/ prefix is autodl's own (its launches find their pods by it); "
                         "use a prefix of your own, e.g. example.com/team")
    if any(prefix == p or prefix.endswith("." + p) for p in _RESERVED_PREFIXES):
        raise ValueError(f"{short(key, 60)}: the kubernetes.io/ and k8s.io/ prefixes are reserved for Kubernetes' core "
                         "components; use a prefix of your own")
    return key


class LauncherSection(_Section):
    """How the training is started. ``launcher: docker`` is shorthand for ``{type: docker}``.

    Sizes (``shm_size``, ``memory_limit``) are validated and stored as bytes; they may be written
    ``8g`` (see :func:`parse_size`). Fields a launcher does not use are ignored by it (``namespace``
    means nothing to Docker). Unknown keys are rejected, naming the key, so a typo never passes silently.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    type: str = Field(default_factory=lambda: _configured_launcher(),
                      description="The launcher, a name of autodl.registry.LAUNCHERS: local, docker or kubernetes.")
    image: str | None = Field(None, description="Container image; default: the PaddlePaddle GPU image.")
    image_pull_policy: Literal["IfNotPresent", "Always", "Never"] = "IfNotPresent"
    python: str = Field("python", description="Interpreter inside the container (the host's is meaningless there).")
    command: list[str] | None = Field(
        None, description="Replaces the whole training command (argv) inside the container; for tests and odd images."
    )
    shm_size: int | None = Field(None, description="/dev/shm size, bytes (e.g. '8g'); overrides the profile's.")
    ipc_mode: Literal["private", "shareable", "host"] | None = Field(
        None, description="Docker IPC namespace; 'host' shares the host's /dev/shm instead of sizing one."
    )
    memory_limit: int | None = Field(None, description="Container memory limit, bytes (e.g. '32g').")
    cpus: Cpus | None = Field(None, description="CPU limit in cores.")
    user: str = Field("1000:1000", description="uid[:gid] the training runs as; never root.")
    network: str | None = Field(None, description="Docker network ('none' to cut it off); default: Docker's.")
    runtime: str | None = Field(None, description="Docker runtime, e.g. 'nvidia' or 'ascend'; default: the daemon's.")
    devices: list[str] = Field(
        default_factory=list, description="Host device nodes passed through (AMD/Hygon/Kunlun), e.g. /dev/kfd."
    )
    mounts: list[MountSpec] = Field(default_factory=list)
    env: dict[str, str] = Field(default_factory=dict, description="Extra environment for the training.")
    code_dir: str = Field("/workspace", description="Where the code is mounted (read-only) inside the container.")
    namespace: str | None = Field(None, description="Kubernetes namespace; default: the connection's, else 'default'.")
    node_selector: dict[str, str] = Field(default_factory=dict, description="Added to the GPU product selector.")
    tolerations: list[TolerationSpec] = Field(default_factory=list, description="Added to the GPU taint's.")
    service_account: str | None = None
    image_pull_secrets: list[str] = Field(default_factory=list)
    code_pvc: str | None = Field(
        None, description="PersistentVolumeClaim holding the code, mounted read-only at code_dir; default: code in the image."
    )
    labels: dict[str, str] = Field(default_factory=dict, description="Extra pod labels (Kubernetes).")
    annotations: dict[str, str] = Field(default_factory=dict, description="Extra pod annotations (Kubernetes).")
    priority_class: str | None = Field(None, description="The pod's PriorityClass name (priorityClassName).")
    affinity: dict[str, Any] | None = Field(
        None, description="The pod's affinity, as in a manifest (nodeAffinity, podAffinity, podAntiAffinity).")
    cpu_request: Cpus | None = Field(None, description="CPU request in cores; default: from the estimate.")
    memory_request: int | None = Field(None, description="Memory request, bytes (e.g. '16g'); default: from the estimate.")
    pod_template_file: str | None = Field(
        None, description="Pod YAML merged under autodl's pod, as KubernetesPodOperator's pod_template_file.")
    kueue_queue: str | None = Field(
        None, description="Kueue LocalQueue: the pod is created gated and Kueue admits it; autodl does not queue it.")

    @field_validator("type")
    @classmethod
    def _known_launcher(cls, value: str) -> str:
        return check_choice(value, LAUNCHERS, "launcher")

    @field_validator("shm_size", "memory_limit", "memory_request", mode="before")
    @classmethod
    def _size(cls, value: Any) -> int | None:
        return parse_size(value)

    @field_validator("code_dir")
    @classmethod
    def _absolute_dir(cls, value: str) -> str:
        # normalised first, so '/.', '//' and '/a/..' are the root they name (issue 23)
        normal = posixpath.normpath(value) if value.startswith("/") else value
        if not normal.startswith("/") or normal.strip("/") == "":
            raise ValueError("must be an absolute folder other than '/', e.g. /workspace")
        return normal.rstrip("/")

    @field_validator("user")
    @classmethod
    def _non_root(cls, value: str) -> str:
        uid, gid = parse_container_user(value)
        return f"{uid}:{gid}" if gid is not None else str(uid)

    @field_validator("network")
    @classmethod
    def _own_network(cls, value: str | None) -> str | None:
        if value is None:
            return value
        name = value.strip().lower()
        if name == "host" or name.startswith(("container:", "ns:")) or not value or len(value) > 200 \
                or any(c.isspace() or ord(c) < 32 for c in value):
            raise ValueError(f"{short(value, 40)} is not allowed: 'host' puts the training on the host's network "
                             "(127.0.0.1: PostgreSQL, Airflow, the Docker API if exposed) and 'container:NAME' into "
                             "another container's; use 'none', 'bridge' or a user-defined network's name")
        return value

    @field_validator("namespace")
    @classmethod
    def _namespace(cls, value: str | None) -> str | None:
        # a Kubernetes namespace is a DNS-1123 label; the system ones are where admission policies are often exempt
        if value is not None and not re.fullmatch(r"[a-z0-9](?:[-a-z0-9]{0,61}[a-z0-9])?", value):
            raise ValueError(f"{short(value, 40)} is not a Kubernetes namespace name (lower-case letters, digits and "
                             "'-', at most 63)")
        if value in ("kube-system", "kube-public", "kube-node-lease"):
            raise ValueError(f"{value} is Kubernetes' own namespace (where admission policies are often exempt); "
                             "run the training in a namespace of its own")
        return value

    @field_validator("service_account")
    @classmethod
    def _service_account(cls, value: str | None) -> str | None:
        if value is not None and not _DNS_SUBDOMAIN.fullmatch(value):
            raise ValueError(f"{short(value, 40)} is not a Kubernetes object name (lower-case letters, digits, '-' "
                             "and '.', at most 253)")
        return value

    @field_validator("image_pull_secrets")
    @classmethod
    def _secret_names(cls, value: list[str]) -> list[str]:
        for name in value:
            if not _DNS_SUBDOMAIN.fullmatch(name):
                raise ValueError(f"{short(name, 40)} is not a Kubernetes Secret name (lower-case letters, digits, '-' "
                                 "and '.', at most 253)")
        return value

    @field_validator("image")
    @classmethod
    def _image_reference(cls, value: str | None) -> str | None:
        # a reference has no spaces or control characters (docker's grammar: distribution/reference)
        if value is not None and (not value or len(value) > 512 or any(c.isspace() or not c.isprintable() for c in value)
                                  or value.startswith("-")):
            raise ValueError(f"{short(value, 60)} is not an image reference (e.g. paddlepaddle/paddle:3.3.1-gpu-"
                             "cuda12.6-cudnn9.5); no spaces, no leading '-'")
        return value

    @field_validator("devices")
    @classmethod
    def _accelerator_nodes(cls, value: list[str]) -> list[str]:
        for item in value:
            check_device_node(item)
        return value

    @field_validator("env")
    @classmethod
    def _env_names(cls, value: dict[str, str]) -> dict[str, str]:
        for key, val in value.items():
            if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]{0,127}", key):
                raise ValueError(f"{short(key, 40)} is not an environment variable name (letters, digits, _)")
            if "\x00" in val:
                raise ValueError(f"the value of {key} holds a NUL byte")
        return value

    @field_validator("command")
    @classmethod
    def _nonempty(cls, value: list[str] | None) -> list[str] | None:
        if value is not None and not value:
            raise ValueError("an empty command runs nothing; remove the key or give argv")
        return value

    @field_validator("labels", "annotations")
    @classmethod
    def _metadata(cls, value: dict[str, str], info: ValidationInfo) -> dict[str, str]:
        for key, val in value.items():
            check_metadata_key(key)
            if info.field_name == "labels" and not (len(val) <= 63 and _LABEL_VALUE.fullmatch(val)):
                raise ValueError(f"the value of {short(key, 60)}, {short(val, 40)}, is not a label value (at most 63 "
                                 "letters, digits, '-', '_', '.', starting and ending alphanumeric); put free text in "
                                 "launcher.annotations")
        if info.field_name == "annotations" and sum(len(k) + len(v) for k, v in value.items()) > 256 * 1024:
            raise ValueError("annotations hold more than 256 KiB in all (Kubernetes' limit); keep large data elsewhere")
        return value

    @field_validator("priority_class", "kueue_queue")
    @classmethod
    def _object_name(cls, value: str | None) -> str | None:
        if value is not None and not _DNS_SUBDOMAIN.fullmatch(value):
            raise ValueError(f"{short(value, 40)} is not a Kubernetes object name (lower-case letters, digits, '-' "
                             "and '.', at most 253)")
        return value

    @field_validator("affinity")
    @classmethod
    def _affinity(cls, value: dict[str, Any] | None) -> dict[str, Any] | None:
        if value is not None:
            wrong = sorted(set(value) - set(AFFINITY_KEYS))
            if wrong or not all(isinstance(v, dict) for v in value.values()):
                raise ValueError(f"{short(', '.join(wrong) or 'a value', 60)}: an affinity holds only mappings under "
                                 f"{', '.join(AFFINITY_KEYS)} (the manifest's camelCase form)")
        return value

    @field_validator("pod_template_file")
    @classmethod
    def _template_path(cls, value: str | None) -> str | None:
        if value is not None and (not value.startswith("/") or "\x00" in value):
            raise ValueError(f"{short(value, 60)} must be an absolute path of a pod YAML file on the launching host")
        return value

    @model_validator(mode="before")
    @classmethod
    def _queue_from_label(cls, data: Any) -> Any:
        # a user following Kueue's docs writes the label; either spelling is the Kueue mode
        if isinstance(data, dict) and isinstance(data.get("labels"), dict) and KUEUE_QUEUE_LABEL in data["labels"]:
            labels = dict(data["labels"])
            named = labels.pop(KUEUE_QUEUE_LABEL)
            if data.get("kueue_queue") not in (None, named):
                raise ValueError(f"launcher.kueue_queue ({data['kueue_queue']}) and the label {KUEUE_QUEUE_LABEL} "
                                 f"({named}) name different queues; keep one")
            data = {**data, "labels": labels, "kueue_queue": named}
        return data

    @model_validator(mode="after")
    def _requests_within_limits(self) -> "LauncherSection":
        if self.memory_request and self.memory_limit and self.memory_request > self.memory_limit:
            raise ValueError("memory_request is above memory_limit (Kubernetes refuses such a pod); lower the request "
                             "or raise the limit")
        if self.cpu_request and self.cpus and self.cpu_request > self.cpus:
            raise ValueError("cpu_request is above cpus, the CPU limit (Kubernetes refuses such a pod); lower the "
                             "request or raise the limit")
        return self

    @model_validator(mode="after")
    def _shm_or_ipc(self) -> "LauncherSection":
        if self.ipc_mode == "host" and self.shm_size is not None:
            raise ValueError("shm_size and ipc_mode: host exclude each other (host IPC uses the host's /dev/shm); keep one")
        return self


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


def _key_hint(loc: tuple) -> str:
    """The fix for an unknown key at ``loc``: the closest key its section has (``task.batch_size`` ->
    ``batch_size_per_gpu``), or the section a key of another section belongs to (``scheduler.memory_threshold``
    -> ``resource_policy``), else "remove it or check its spelling"."""
    fallback = "; remove it or check its spelling"
    model: type[BaseModel] | None = TaskSpec
    for part in loc[:-1]:
        if isinstance(part, int):  # an item of a list of mappings (launcher.mounts[0])
            continue
        field = model.model_fields.get(part) if model is not None else None
        model = _model_in(field.annotation) if field is not None else None
        if model is None:
            return fallback
    key = str(loc[-1])
    known = [name for name in model.model_fields if name != "source_path"]
    close = difflib.get_close_matches(key, known, n=1) if len(key) <= 100 else []
    if not close and KEY_SYNONYMS.get(key) in known:
        close = [KEY_SYNONYMS[key]]
    if close:
        return f" (did you mean '{close[0]}'?){fallback}"
    if model is not TaskSpec and len(loc) == 2:
        for section, field in TaskSpec.model_fields.items():
            other = _model_in(field.annotation)
            if other is not None and other is not model and key in other.model_fields:
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
    return ""


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
            lines.append(f"{where}: field '{loc}': {clip(msg, 300)} (got {short(got, 60)}){_yaml_hint(msg, got)}.")
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
    :raises SpecError: when the file is missing, is not YAML, or fails validation.
    """
    data = read_yaml(path, SpecError, "spec file not found; pass the path of a task spec YAML"
                     + ("" if Path(path).is_absolute() else f" (a relative path is read from {os.getcwd()}, the "
                        "current folder of this process: in a DAG, the worker's; give an absolute path, e.g. "
                        "relative to the DAG file's folder)")
                     + shipped_hint("specs", path) + ".")
    return parse_spec(data, Path(path))
