"""What every launcher takes and does: the launch request, the launcher protocol, the training command.

A launcher starts a training detached and returns a :class:`~autodl.types.LaunchHandle`; another task
(or another try) uses the handle to poll, stream logs and stop. ``launch`` is idempotent per
``request.run_key``: a retried launch finds the first copy and reattaches instead of starting a second.
"""

from __future__ import annotations

import re
import shlex
import sys
from pathlib import Path
from typing import Any, Protocol, TypeVar, runtime_checkable

from pydantic import BaseModel, ConfigDict, Field

from autodl.catalog import VendorInfo
from autodl.types import Device, LaunchHandle

OptionsT = TypeVar("OptionsT", bound=BaseModel)


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
    device_memory_cap_bytes: int | None = Field(
        default=None, description="A packed run's share of its device, bytes (the lease's reserved_bytes): the launcher caps "
                          "Paddle there (autodl.policy.packing.memory_cap_env); None: the whole device.")
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


def launcher_options(request: LaunchRequest, options: type[OptionsT]) -> OptionsT:
    """The spec's launcher section for ``request``, validated as the launcher's ``options`` model (sizes in bytes,
    non-root user).

    ``request.options`` may be a dump of the spec's launcher section or a hand-written mapping (tests, the CLI);
    both go through the same validation. Its ``type``, if any, is the launcher's own. A field of another launcher
    (``namespace`` in a request for Docker: a request made before the section became one model per launcher, or
    another launcher's dump) is left out, as launchers always ignored it; the spec refuses it, naming its launcher.
    A key no launcher has is refused.

    :param options: the launcher's options model (``DockerOptions``, ``KubernetesOptions``).
    :returns: an instance of ``options``.
    :raises LaunchError: naming the bad option and the fix.
    """
    from pydantic import ValidationError

    from autodl.errors import LaunchError
    from autodl.launch.options import ALL_OPTION_FIELDS

    own = options.model_fields
    data = {k: v for k, v in request.options.items() if k != "type" and (k in own or k not in ALL_OPTION_FIELDS)}
    try:
        return options.model_validate(data)
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


# ------------------------------------------------------------------ incremental log following (docker, kubernetes)
_TIMESTAMP = re.compile(rb"(\d{4})-(\d\d)-(\d\d)T(\d\d):(\d\d):(\d\d)(?:\.(\d{1,9}))?Z ")


def timestamp_ns(line: bytes) -> tuple[int | None, bytes]:
    """Split a log line that Docker (``timestamps=True``) or the kubelet (``timestamps=true``) prefixed with
    its RFC 3339 UTC time (``2026-12-01T23:50:01.123456789Z ``): ``(nanoseconds since the epoch, the rest)``,
    or ``(None, line)`` when it has no such prefix."""
    import calendar

    match = _TIMESTAMP.match(line)
    if match is None:
        return None, line
    year, month, day, hour, minute, second = (int(g) for g in match.groups()[:6])
    fraction = (match.group(7) or b"").ljust(9, b"0")
    seconds = calendar.timegm((year, month, day, hour, minute, second, 0, 0, 0))
    return seconds * 1_000_000_000 + int(fraction), line[match.end():]


def rfc3339_ts(text: str | None) -> float | None:
    """Epoch seconds of an RFC 3339 UTC time as Docker writes it (``2026-12-01T23:50:01.123456789Z``); None for
    no time or Docker's zero time (``0001-01-01T00:00:00Z``: not ended)."""
    ns, _rest = timestamp_ns(f"{text or ''} ".encode())
    return ns / 1e9 if ns is not None and ns > 0 else None


PARTIAL_LINE_BYTES = 16 * 1024
"""Docker splits a longer line into partial messages of this many bytes (``bufSize`` in moby's
``daemon/logger/copier.go``; the kubelet's CRI logs split at the same 16 KiB), each with its own timestamp."""


def join_partials(text: bytes) -> bytes:
    """A long line without the timestamps its partial messages carry at every :data:`PARTIAL_LINE_BYTES`."""
    out, rest = [], text
    while len(rest) > PARTIAL_LINE_BYTES:
        match = _TIMESTAMP.match(rest, PARTIAL_LINE_BYTES)
        if match is None:
            break
        out.append(rest[:PARTIAL_LINE_BYTES])
        rest = rest[match.end():]
    out.append(rest)
    return b"".join(out)


class LogStream:
    """Follows one container's log over a single streaming request (``follow``), in a thread, so each byte
    of the log is fetched once — as the providers' PodManager follows a pod (``follow=True``,
    ``timestamps=True``) and DockerOperator a container (``logs(stream=True, follow=True)``).

    Lines carry the engine's timestamps; ``cursor_ns`` is the timestamp of the last line handed out (the
    offset a follower keeps). A stream (re)opened at a cursor asks for the log since that second and skips
    the lines at or before it, so a reattach after a restart or a dropped connection neither repeats nor
    re-reads more than one second of log. Rotation is the engine's business: a follow request continues
    across it (a line rotated away while nobody followed is gone).

    :param open_stream: ``open_stream(since_s)`` -> an iterable of byte chunks with a ``close()``; ``since_s``
        is None for the whole log, else whole seconds since the epoch.
    :param cursor_ns: the offset to resume from (0: the beginning).
    """

    def __init__(self, open_stream: Any, cursor_ns: int = 0):
        import threading

        self.open_stream = open_stream
        self.cursor_ns = int(cursor_ns)
        self.fetched_bytes = 0
        self.done = threading.Event()
        self.error: BaseException | None = None
        self._lock = threading.Lock()
        self._out: list[str] = []
        self._stream: Any = None
        self._closed = False
        self._thread = threading.Thread(target=self._run, name="autodl-log-stream", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        start = self.cursor_ns
        since = start // 1_000_000_000 if start else None
        pending = b""
        try:
            self._stream = self.open_stream(since)
            for chunk in self._stream:
                if self._closed:
                    break
                self.fetched_bytes += len(chunk)
                *lines, pending = (pending + chunk).split(b"\n")
                for line in lines:
                    self._take(line + b"\n", start)
            if pending and not self._closed:
                self._take(pending, start)
        except BaseException as exc:  # noqa: BLE001 - said to the reader, which reopens or reports
            if not self._closed:
                self.error = exc
        finally:
            self.done.set()

    def _take(self, line: bytes, start: int) -> None:
        """Hand ``line`` out unless a stream before this one did (at or before ``start``). Within one stream
        nothing is skipped: stdout and stderr lines may reach the engine's log slightly out of time order."""
        ts, text = timestamp_ns(line)
        if ts is not None and len(text) > PARTIAL_LINE_BYTES:
            text = join_partials(text)
        if ts is not None and ts <= start:
            return  # fetched again after a reopen: already handed out
        with self._lock:
            self._out.append(text.decode("utf-8", "replace"))
            if ts is not None:
                self.cursor_ns = max(self.cursor_ns, ts)

    def read(self) -> tuple[str, int]:
        """The text that arrived since the last read, and the cursor (ns) to resume from."""
        with self._lock:
            text, self._out = "".join(self._out), []
            return text, self.cursor_ns

    def wait(self, timeout_s: float) -> bool:
        """Wait up to ``timeout_s`` for the stream to end (the container ended); True when it did."""
        return self.done.wait(timeout_s)

    def close(self) -> None:
        """Stop following (idempotent)."""
        self._closed = True
        closer = getattr(self._stream, "close", None)
        if closer is not None:
            try:
                closer()
            except Exception:  # noqa: BLE001 - closing a finished stream
                pass

