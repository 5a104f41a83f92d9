"""What every launcher takes and does: the launch request, the launcher protocol, the training command.

A launcher starts a training detached and returns a :class:`~autodl.types.LaunchHandle`; another task
(or another try) uses the handle to poll, stream logs and stop. ``launch`` is idempotent per
``request.run_key``: a retried launch finds the first copy and reattaches instead of starting a second.
"""

from __future__ import annotations

import shlex
import sys
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from pydantic import BaseModel, ConfigDict, Field

from autodl.catalog import VendorInfo
from autodl.types import Device, LaunchHandle


class LaunchRequest(BaseModel):
    """Everything a launcher needs to start one training run.

    ``devices`` are the booked devices in the order the policy chose; an empty list (or
    ``on_cpu=True``) means run on CPU, as when the pool is declared rather than real.
    """

    model_config = ConfigDict(frozen=True, extra="forbid", arbitrary_types_allowed=True)

    run_key: str = Field(description="Unique per DAG run and task group; the idempotency key.")
    script: str = Field(description="Absolute path of the training script on the launching host.")
    args: list[str] = Field(default_factory=list)
    workdir: str | None = Field(None, description="Folder mounted/used as the code root; default: the script's folder.")
    devices: list[Device] = Field(default_factory=list)
    vendor: VendorInfo | None = None
    on_cpu: bool = False
    distributed: bool = Field(False, description="Launch with python -m paddle.distributed.launch.")
    shm_bytes: int | None = Field(None, description="Shared memory the run needs (/dev/shm), bytes.")
    memory_limit_bytes: int | None = None
    memory_request_bytes: int | None = Field(
        None, description="Host memory the run is estimated to need, bytes (:func:`host_requests`); a pod's request.")
    cpu_request: float | None = Field(
        None, description="CPU cores the run is estimated to keep busy (:func:`host_requests`); a pod's request.")
    env: dict[str, str] = Field(default_factory=dict)
    labels: dict[str, str] = Field(default_factory=dict, description="dag_id, run_id, task_id, try_number, lease_id.")
    options: dict[str, Any] = Field(default_factory=dict, description="The spec's launcher section.")
    log_dir: str | None = None
    python: str = Field(default_factory=lambda: sys.executable)

    @property
    def script_path(self) -> Path:
        return Path(self.script)


RANK_HOST_MEMORY_FLOOR_BYTES = 512 << 20
"""Host memory of one training process before its model, bytes: 297 MiB peak RSS measured for a Paddle 3.3.1 CPU
process training a 64x64 Linear with Adam (``resource.getrusage``, this project's CI machine), rounded up. A GPU
process also maps the CUDA libraries; that part is not measured here, so set ``launcher.memory_request`` for it."""


def host_requests(profile: Any, ranks: int, shm_bytes: int | None) -> tuple[float, int]:
    """CPU cores and host memory (bytes) a run keeps busy, for a pod's ``requests`` (QoS Burstable, never BestEffort).

    Per rank (one process per device, or one on CPU): one core for the training process plus one per DataLoader
    worker (each worker is a process, Paddle's ``DataLoader(num_workers=...)``; an unknown count is taken as one);
    and :data:`RANK_HOST_MEMORY_FLOOR_BYTES` plus the weights (a checkpoint and the initial parameters pass through
    host memory before they move to the device). ``/dev/shm`` as a memory ``emptyDir`` counts against the pod's
    memory (https://kubernetes.io/docs/concepts/storage/volumes/#emptydir), so it is added once.

    :param profile: the :class:`~autodl.types.ResourceProfile` of the run.
    :param ranks: training processes (booked devices under data parallelism, else 1).
    :returns: ``(cores, bytes)``.
    """
    workers = profile.num_workers if profile.num_workers is not None else 1
    ranks = max(1, ranks)
    cores = float(ranks * (1 + workers))
    memory = ranks * (RANK_HOST_MEMORY_FLOOR_BYTES + int(profile.breakdown.weights_bytes or 0)) + int(shm_bytes or 0)
    return cores, memory


def visible_devices_value(devices: list[Device]) -> str:
    """The value for ``CUDA_VISIBLE_DEVICES`` (or the vendor's variable): UUIDs when every device has
    one, else PCI-ordered indices. Comma-separated, no spaces."""
    if devices and all(d.uuid for d in devices):
        return ",".join(d.uuid for d in devices if d.uuid)
    return ",".join(str(d.index) for d in devices)


def pinning_env(request: LaunchRequest, *, inside_container: bool = False) -> dict[str, str]:
    """Environment variables that pin the training to the booked devices.

    On the host the vendor's visibility variable lists the booked devices (UUIDs preferred); inside
    a container that already only sees the booked devices they are renumbered ``0..n-1``, so the
    variable lists positions, never host indices. A CPU run hides every device (empty value).
    """
    vendor = request.vendor
    if vendor is None:
        return {}
    env = dict(vendor.extra_env)
    if request.on_cpu or not request.devices:
        env[vendor.visible_devices_env] = ""
    elif inside_container:
        env[vendor.visible_devices_env] = ",".join(str(i) for i in range(len(request.devices)))
    else:
        env[vendor.visible_devices_env] = visible_devices_value(request.devices)
    return env


def launch_devices_arg(request: LaunchRequest, visible: str | None = None) -> str:
    """The value of ``paddle.distributed.launch --devices`` for ``request``'s booked devices.

    Paddle's launch reads the visibility variable of NVIDIA (``CUDA_VISIBLE_DEVICES``) and Kunlun
    (``XPU_VISIBLE_DEVICES``) itself and resolves each ``--devices`` entry as a *member* of it
    (``paddle/distributed/launch/context/device.py``: ``labels.index(d)``), so beside
    ``CUDA_VISIBLE_DEVICES=<UUID>,<UUID>`` it must be those UUIDs — ``--devices 0,1`` fails with
    ``ValueError: '0' is not in list`` (reproduced with Paddle 3.3.1). For vendors whose variable it
    does not read (Ascend, AMD/Hygon: the runtime renumbers the visible devices), and wherever the
    variable is unset (a Kubernetes pod), the entries are positions ``0..n-1``. The vendor table's
    ``launch_devices`` says which (``include/catalog/vendors.yaml``).

    :param visible: the visibility variable's value where the command runs (a container's
        renumbered ``0,1``); default: the host value :func:`pinning_env` gives.
    """
    n = len(request.devices)
    positions = ",".join(str(i) for i in range(n))
    vendor = request.vendor
    if vendor is None or vendor.launch_devices != "members":
        return positions
    if visible is None:
        visible = pinning_env(request).get(vendor.visible_devices_env, "")
    members = [v for v in (visible or "").split(",") if v]
    return ",".join(members) if len(members) == n else positions


def training_command(request: LaunchRequest, *, python: str | None = None, script: str | None = None,
                     visible: str | None = None, log_dir: str | None = None) -> list[str]:
    """argv that runs the training.

    Single device: ``python -u script args``. Distributed (N devices): ``python -m
    paddle.distributed.launch --devices <...> [--log_dir DIR] script args``, with ``--devices`` as
    :func:`launch_devices_arg` gives it for the vendor (never host indices beside a visibility list).

    :param visible: the visibility variable's value where the command runs (see :func:`launch_devices_arg`);
        ``""`` when none is set there (a pod: the device plugin pins).
    :param log_dir: where ``paddle.distributed.launch`` writes its per-rank logs (``workerlog.N``);
        default its own ``./log``, which a read-only code folder cannot hold.
    """
    py = python or request.python
    target = script or request.script
    n = len(request.devices)
    if request.distributed and n > 1 and not request.on_cpu:
        argv = [py, "-u", "-m", "paddle.distributed.launch", "--devices", launch_devices_arg(request, visible)]
        if log_dir:
            argv += ["--log_dir", log_dir]
        return [*argv, target, *request.args]
    return [py, "-u", target, *request.args]


def shell_line(argv: list[str], env: dict[str, str] | None = None) -> str:
    """A copy-pasteable shell line for ``argv`` with ``env`` assignments in front, correctly quoted."""
    prefix = " ".join(f"{k}={shlex.quote(v)}" for k, v in (env or {}).items())
    cmd = shlex.join(argv)
    return f"{prefix} {cmd}" if prefix else cmd


@runtime_checkable
class Launcher(Protocol):
    """A way of running a training: local process, Docker container, Kubernetes pod."""

    name: str

    def launch(self, request: LaunchRequest) -> LaunchHandle:
        """Start detached (or reattach to the run already started for ``request.run_key``).

        :raises LaunchError: when it cannot start, with the reason and the fix.
        """

    def poll(self, handle: LaunchHandle) -> int | None:
        """Exit code when finished, ``None`` while running."""

    def read_logs(self, handle: LaunchHandle, offset: int = 0) -> tuple[str, int]:
        """New log text since ``offset`` and the offset to pass next time."""

    def stop(self, handle: LaunchHandle) -> None:
        """Stop and clean up; idempotent."""

    def render(self, request: LaunchRequest) -> dict[str, Any]:
        """What would be run, for ``autodl plan --json`` and logs (command line, container, pod)."""


# ------------------------------------------------------------------ helpers shared by the container launchers
RUN_LABEL_KEYS = ("dag_id", "run_id", "task_id", "try_number", "lease_id")
"""The keys of ``LaunchRequest.labels`` every container and pod carries, plus ``run_key``."""


def launcher_options(request: LaunchRequest, launcher: str) -> Any:
    """The spec's launcher section for ``request``, validated (sizes in bytes, non-root user).

    ``request.options`` may be a dump of :class:`~autodl.spec.LauncherSection` or a hand-written
    mapping (tests, the CLI); both go through the same validation.

    :param launcher: the launcher's name, used as ``type`` when the options omit it.
    :returns: a :class:`~autodl.spec.LauncherSection`.
    :raises LaunchError: naming the bad option and the fix.
    """
    from pydantic import ValidationError

    from autodl.errors import LaunchError
    from autodl.spec import LauncherSection

    data = {"type": launcher, **request.options}
    data["type"] = launcher
    try:
        return LauncherSection.model_validate(data)
    except ValidationError as exc:
        errors = exc.errors(include_url=False)
        problems = "; ".join(f"launcher.{'.'.join(str(p) for p in e['loc'])[:100] or '<root>'}: "
                             f"{e['msg'].removeprefix('Value error, ')[:300]}" for e in errors[:10])
        if len(errors) > 10:
            problems += f"; and {len(errors) - 10} more"
        raise LaunchError(f"run {request.run_key}: invalid launcher options: {problems}; fix the spec's launcher section.") from None


def run_labels(request: LaunchRequest) -> dict[str, str]:
    """The identity of a run as plain strings: ``run_key`` plus the known :data:`RUN_LABEL_KEYS`.

    Launchers turn these into container labels or (sanitised) pod labels.
    """
    labels = {"run_key": request.run_key}
    for key in RUN_LABEL_KEYS:
        value = request.labels.get(key)
        if value not in (None, ""):
            labels[key] = str(value)
    return labels


def container_script(request: LaunchRequest, code_dir: str) -> tuple[str, str]:
    """Where the script is inside a container that mounts the code root at ``code_dir``.

    :returns: ``(host code root, script path inside the container)``.
    :raises LaunchError: when the script is not under ``request.workdir``.
    """
    from autodl.errors import LaunchError

    script = Path(request.script)
    root = Path(request.workdir) if request.workdir else script.parent
    try:
        relative = script.relative_to(root)
    except ValueError:
        raise LaunchError(
            f"run {request.run_key}: script {script} is not inside the code folder {root} that is mounted at "
            f"{code_dir}; set the workdir to a folder containing the script."
        ) from None
    return str(root), f"{code_dir.rstrip('/')}/{relative.as_posix()}"
