"""Docker launcher: the training in a container on a Docker engine, pinned with a device request.

Details: docs/launchers.md#autodllaunchdocker.
"""

from __future__ import annotations

import codecs
import hashlib
import logging
import re
import shlex
from collections.abc import Iterator
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

from autodl.catalog import VendorInfo, load_catalog
from autodl.errors import LaunchError
from autodl.launch.base import (
    LaunchRequest,
    LogStream,
    container_script,
    launcher_options,
    pinning_env,
    rfc3339_ts,
    run_labels,
    training_command,
    visible_devices_value,
)
from autodl.launch.mounts import check_host_paths
from autodl.launch.options import DockerOptions
from autodl.launch.packed import memory_cap
from autodl.redact import redact_env, redact_text
from autodl.types import LaunchHandle

log = logging.getLogger(__name__)

DEFAULT_IMAGE = "paddlepaddle/paddle:3.3.1-gpu-cuda12.6-cudnn9.5"
"""PaddlePaddle's official GPU image (CUDA 12.6, cuDNN 9.5); tags listed at
https://hub.docker.com/r/paddlepaddle/paddle/tags and in the install guide
https://www.paddlepaddle.org.cn/documentation/docs/en/install/docker/linux-docker_en.html."""

LABEL_PREFIX = "autodl."
"""Prefix of the labels autodl puts on containers (Docker's guideline: a namespace per tool,
https://docs.docker.com/engine/manage-resources/labels/)."""

MANAGED_LABEL = f"{LABEL_PREFIX}managed"

STOP_TIMEOUT_S = 10
"""Seconds between SIGTERM and SIGKILL when stopping a container (``docker stop``'s default is 10 s)."""

NVIDIA_TOOLKIT_URL = "https://docs.nvidia.com/datacenter/cloud-native/container-toolkit/latest/install-guide.html"
GPU_ENUMERATION_URL = "https://docs.nvidia.com/datacenter/cloud-native/container-toolkit/latest/docker-specialized.html"

_RUNNING = {"running", "restarting", "paused"}

HOOK_DIR = "/autodl/hook"
"""Where autodl's start-up hook (``autodl/launch/child_path``) is copied in the container; read-only for the user."""

RUN_DIR = "/autodl/run"
"""The run's own files in the container (``$AUTODL_METRICS_FILE``, ``$AUTODL_REPORT_FILE``), owned by its user."""

OUTPUT_DIR = "/autodl/output"
"""Where the model's output volume is mounted (``$AUTODL_OUTPUT_DIR`` in the container)."""

OUTPUT_DIR_ENV = "AUTODL_OUTPUT_DIR"
REPORT_FILE_ENV = "AUTODL_REPORT_FILE"
"""The pipeline's contract variables (:mod:`autodl.steps`): host paths there, container paths here."""

LOG_DRAIN_S = 10.0
"""Seconds the last read of an ended container waits for its log stream to deliver the last lines."""


def output_volume_name(host_output_dir: str) -> str:
    """The named volume holding one model's checkpoints: ``autodl-output-<folder name>-<hash>``.

    ``host_output_dir`` is the folder the pipeline gives the model (``task.output_dir``, else
    ``$AUTODL_HOME/outputs/<model>``); its name keeps the volume readable, the first 12 hex digits of the
    SHA-256 of the whole path keep two homes' models of one name apart. Docker volume names match
    ``[a-zA-Z0-9][a-zA-Z0-9_.-]+``.
    """
    base = re.sub(r"[^a-zA-Z0-9_.-]+", "-", host_output_dir.rstrip("/").rsplit("/", 1)[-1]).strip("-_.")[:60] or "model"
    return f"autodl-output-{base}-{hashlib.sha256(host_output_dir.encode('utf-8', 'surrogatepass')).hexdigest()[:12]}"


def container_user_ids(user: str) -> tuple[int, int]:
    """``(uid, gid)`` of ``launcher.user`` (``1000:1000``, or ``1000``: Docker's group is then 0)."""
    uid, _, gid = user.partition(":")
    return int(uid), int(gid or 0)


def run_files_archive(uid: int, gid: int) -> bytes:
    """A tar, extracted at ``/`` of a created container: the start-up hook under :data:`HOOK_DIR` (root's,
    readable), :data:`RUN_DIR` and the output volume's root :data:`OUTPUT_DIR` owned by ``uid:gid`` (so the
    non-root training can write its report and checkpoints)."""
    import io
    import tarfile
    import time
    from pathlib import Path

    from autodl.launch.local import CHILD_PATH

    now = time.time()
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        def folder(name: str, mode: int, owner: tuple[int, int] = (0, 0)) -> None:
            info = tarfile.TarInfo(name)
            info.type, info.mode, info.mtime = tarfile.DIRTYPE, mode, now
            info.uid, info.gid = owner
            tar.addfile(info)

        folder("autodl", 0o755)
        folder(HOOK_DIR.lstrip("/"), 0o755)
        folder(RUN_DIR.lstrip("/"), 0o700, (uid, gid))
        folder(OUTPUT_DIR.lstrip("/"), 0o750, (uid, gid))
        for source in sorted(Path(CHILD_PATH).glob("*.py")):
            data = source.read_bytes()
            info = tarfile.TarInfo(f"{HOOK_DIR.lstrip('/')}/{source.name}")
            info.size, info.mode, info.mtime = len(data), 0o644, now
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def measurement_env(request: LaunchRequest, vendor: VendorInfo, base: dict[str, str]) -> dict[str, str]:
    """The variables that make the run's measurement travel in its log (see the module docstring):
    the hook first on ``PYTHONPATH``, ``AUTODL_RUNFACTS=log``, the run's files under :data:`RUN_DIR`, and
    ``AUTODL_OUTPUT_DIR`` at the output volume when the pipeline gave one."""
    prior = base.get("PYTHONPATH")
    env = {
        "PYTHONPATH": HOOK_DIR + (":" + prior if prior else ""),
        "AUTODL_RUNFACTS": "log",
        "AUTODL_METRICS_FILE": f"{RUN_DIR}/metrics.jsonl",
        REPORT_FILE_ENV: f"{RUN_DIR}/report.json",
        "AUTODL_VISIBLE_ENV": vendor.visible_devices_env,
    }
    if request.env.get(OUTPUT_DIR_ENV):
        env[OUTPUT_DIR_ENV] = OUTPUT_DIR
    return env


def container_labels(request: LaunchRequest) -> dict[str, str]:
    """Docker labels for ``request``'s container: ``autodl.<key>`` for the run identity, plus
    ``autodl.managed=true``. Docker label values are free strings, so nothing is sanitised."""
    labels = {f"{LABEL_PREFIX}{key}": value for key, value in run_labels(request).items()}
    labels[MANAGED_LABEL] = "true"
    return labels


def container_name(request: LaunchRequest) -> str:
    """A name unique per try: ``autodl-<run key slug>-<hash of run key>-t<try>``.

    Docker names match ``[a-zA-Z0-9][a-zA-Z0-9_.-]+``; the slug keeps it readable, the hash keeps
    run keys that slug alike apart. Without a try number (``autodl plan``, the CLI) the suffix is
    ``t0``; two concurrent launches of one try then collide on the name and the engine refuses the second.
    """
    slug = re.sub(r"[^a-zA-Z0-9_.-]+", "-", request.run_key).strip("-_.")[:40] or "run"
    digest = hashlib.sha1(request.run_key.encode()).hexdigest()[:8]
    try_number = request.labels.get("try_number")
    suffix = f"t{try_number}" if try_number not in (None, "") else "t0"
    return f"autodl-{slug}-{digest}-{suffix}"


def docker_size(n_bytes: int) -> str:
    """``n_bytes`` as ``docker run`` writes sizes (``8g``, ``512m``, or plain bytes); binary units."""
    for unit, factor in (("g", 1 << 30), ("m", 1 << 20), ("k", 1 << 10)):
        if n_bytes % factor == 0:
            return f"{n_bytes // factor}{unit}"
    return str(n_bytes)


def gpus_flag(device_ids: list[str]) -> str:
    """The value of ``docker run --gpus`` for ``device_ids``, before shell quoting: ``"device=2,3"``.

    The CLI reads ``--gpus`` as CSV, so a comma-separated id list needs inner double quotes, which
    in turn need shell quoting: ``--gpus '"device=2,3"'``. ``--gpus 2`` would be a *count* of two
    (any two GPUs) and ``--gpus 0`` a count of none. Source: NVIDIA Container Toolkit, "GPU
    Enumeration", :data:`GPU_ENUMERATION_URL`.
    """
    return f'"device={",".join(device_ids)}"'


def complete_utf8_length(chunk: bytes) -> int:
    """Length of the longest prefix of ``chunk`` that does not end inside a multi-byte UTF-8 character."""
    for back in range(1, min(4, len(chunk)) + 1):
        byte = chunk[-back]
        if byte & 0xC0 == 0x80:  # continuation byte: look further back for the lead byte
            continue
        if byte < 0x80:
            return len(chunk)
        need = 2 if byte >> 5 == 0b110 else 3 if byte >> 4 == 0b1110 else 4 if byte >> 3 == 0b11110 else 1
        return len(chunk) if back >= need else len(chunk) - back
    return len(chunk)


@dataclass(frozen=True)
class DockerPlan:
    """Everything :meth:`DockerLauncher.launch` will send, computed without contacting the engine."""

    image: str
    name: str
    argv: list[str]
    env: dict[str, str]
    labels: dict[str, str]
    create_kwargs: dict[str, Any]
    cli: list[str]
    device_ids: list[str] = field(default_factory=list)
    visible_devices: str | None = None
    pull_policy: str = "IfNotPresent"
    output_volume: str | None = None
    output_dir: str | None = None
    user: str = "1000:1000"
    notes: list[str] = field(default_factory=list, repr=False)
    """What the launch logs about the plan (a packed run's memory cap: :func:`~autodl.launch.packed.memory_cap`)."""

    @property
    def shell(self) -> str:
        """The equivalent ``docker run`` line, quoted for a POSIX shell, secret-named ``--env`` values as ``***``
        (it is shown in logs and messages)."""
        return redact_text(shlex.join(self.cli))


@dataclass(frozen=True)
class DeviceSettings:
    """How a container gets the booked devices (from the vendor table, ``include/catalog/vendors.yaml``)."""

    env: dict[str, str]
    requests: list[Any] = field(default_factory=list)
    device_ids: list[str] = field(default_factory=list)
    device_nodes: list[str] = field(default_factory=list)
    mounts: list[str] = field(default_factory=list)


def _device_settings(request: LaunchRequest, vendor: VendorInfo, runtime: str | None = None) -> DeviceSettings:
    """Environment, device requests, device nodes and read-only mounts for ``request``'s container.

    From the vendor table (``include/catalog/vendors.yaml``, sources per vendor there):

    * the vendor has ``docker_capabilities`` (NVIDIA): a ``DeviceRequest`` with the device ids; the
      runtime exposes only those, renumbered, so the visibility variable lists ``0..n-1``.
      ``NVIDIA_VISIBLE_DEVICES`` is set to the same ids: Docker sets it too for a device request, and an
      engine whose default runtime is ``nvidia`` would otherwise honour the image's ``=all``.
    * the vendor has a ``docker_runtime`` (Ascend Docker Runtime) and ``launcher.runtime`` selects it:
      the runtime's variable (``ASCEND_VISIBLE_DEVICES``) gets the host indices, the process one
      ``0..n-1``. Without that runtime (plain runc) nothing reads ``ASCEND_VISIBLE_DEVICES``: the
      booked ``/dev/davinciN`` and the shared ``/dev/davinci_manager``, ``/dev/devmm_svm``,
      ``/dev/hisi_hdc`` are passed as device nodes and the driver is mounted read-only.
    * otherwise (AMD, Hygon, Kunlun) the vendor's device nodes are passed through (per device, e.g.
      ``/dev/xpuN``, and shared ones such as ``/dev/kfd``, ``/dev/dri``); nothing renumbers the
      devices, so the visibility variable lists the host ids as on the host.

    A CPU run gets the vendor's ``cpu_only_container_env`` (``NVIDIA_VISIBLE_DEVICES=void``) and no device.
    """
    import docker.types

    if request.on_cpu or not request.devices:
        env = dict(vendor.cpu_only_container_env)
        env.update(pinning_env(request.model_copy(update={"vendor": vendor}), inside_container=True))
        return DeviceSettings(env)
    pinned = request.model_copy(update={"vendor": vendor})
    host_ids = visible_devices_value(request.devices).split(",")
    indices = [str(d.index) for d in request.devices]
    if vendor.docker_capabilities:
        env = {vendor.container_visible_env: ",".join(host_ids)}
        env.update(pinning_env(pinned, inside_container=True))
        requests = [docker.types.DeviceRequest(device_ids=host_ids, capabilities=vendor.docker_capabilities)]
        return DeviceSettings(env, requests, host_ids)
    nodes = [n.format(index=d.index) for d in request.devices for n in vendor.docker_device_nodes]
    nodes += vendor.docker_shared_device_nodes
    if vendor.docker_runtime and runtime == vendor.docker_runtime:
        env = {vendor.container_visible_env: ",".join(indices)}
        env.update(pinning_env(pinned, inside_container=True))
        return DeviceSettings(env, [], indices)
    if vendor.container_visible_env != vendor.visible_devices_env:
        return DeviceSettings(pinning_env(pinned, inside_container=True), [], indices, nodes, list(vendor.docker_mounts))
    return DeviceSettings(pinning_env(pinned, inside_container=False), [], host_ids, nodes, list(vendor.docker_mounts))


LAUNCH_LOG_DIR = "/tmp/autodl-launch-logs"
"""Where ``paddle.distributed.launch`` writes its per-rank logs in a container (its default ``./log``
would be inside the read-only code folder)."""


def _container_env(request: LaunchRequest, opts: DockerOptions, vendor: VendorInfo, device_env: dict[str, str], *,
                   on_cpu: bool) -> tuple[dict[str, str], list[str]]:
    """The container's environment (the request's, the options', a packed run's memory cap, the devices' and the
    measurement hook's, autodl's run variables) and the memory cap's notes."""
    env = {"HOME": "/tmp", "PYTHONUNBUFFERED": "1"}
    env.update(request.env)
    env.update(opts.env)
    cap_env, cap_notes = memory_cap(request, {**request.env, **opts.env})  # a packed run's share, the lower wins
    env.update(cap_env)
    env.update(device_env)
    env.update(measurement_env(request, vendor, env))
    if not on_cpu and request.devices:  # the hook attributes Paddle's place gpu:N to the Nth booked device
        env["AUTODL_DEVICE_IDS"] = visible_devices_value(request.devices)
    env["AUTODL_RUN_KEY"] = request.run_key
    env["AUTODL_PADDLE_DEVICE"] = "cpu" if on_cpu else vendor.paddle_device
    if request.labels.get("lease_id"):
        env["AUTODL_LEASE_ID"] = str(request.labels["lease_id"])
    return env, cap_notes


def _container_volumes(request: LaunchRequest, opts: DockerOptions, host_root: str,
                       driver_mounts: list[str]) -> tuple[dict[str, dict[str, str]], str | None]:
    """The container's volumes (code read-only, vendor driver mounts, the spec's mounts, the output volume)."""
    volumes = {host_root: {"bind": opts.code_dir, "mode": "ro"}}
    for path in driver_mounts:  # the vendor's driver libraries and tools, read-only
        volumes[path] = {"bind": path, "mode": "ro"}
    for mount in opts.mounts:
        volumes[mount.source] = {"bind": mount.target, "mode": "ro" if mount.read_only else "rw"}
    output_volume = output_volume_name(request.env[OUTPUT_DIR_ENV]) if request.env.get(OUTPUT_DIR_ENV) else None
    if output_volume:
        volumes[output_volume] = {"bind": OUTPUT_DIR, "mode": "rw"}
    return volumes, output_volume


def _run_options(opts: DockerOptions, devs: DeviceSettings, *, shm: Any, memory: Any,
                 on_cpu: bool) -> tuple[dict[str, Any], list[str]]:
    """The network, IPC, memory, CPU, runtime and device options: create kwargs and ``docker run`` flags."""
    kwargs: dict[str, Any] = {}
    cli: list[str] = []
    if opts.network:
        kwargs["network_mode"] = opts.network
        cli += ["--network", opts.network]
    if opts.ipc_mode:
        kwargs["ipc_mode"] = opts.ipc_mode
        cli += ["--ipc", opts.ipc_mode]
    if shm:
        kwargs["shm_size"] = int(shm)
        cli += ["--shm-size", docker_size(int(shm))]
    if memory:
        kwargs["mem_limit"] = int(memory)
        cli += ["--memory", docker_size(int(memory))]
    if opts.cpus:
        kwargs["nano_cpus"] = int(opts.cpus * 1e9)
        cli += ["--cpus", f"{opts.cpus:g}"]
    if opts.runtime:
        kwargs["runtime"] = opts.runtime
        cli += ["--runtime", opts.runtime]
    if devs.requests:
        kwargs["device_requests"] = devs.requests
        cli += ["--gpus", gpus_flag(devs.device_ids)]
    nodes = list(dict.fromkeys([*devs.device_nodes, *(opts.devices if not on_cpu else [])]))
    if nodes:
        kwargs["devices"] = [d if d.count(":") else f"{d}:{d}:rwm" for d in nodes]
        cli += [arg for d in nodes for arg in ("--device", d)]
    return kwargs, cli


class DockerLauncher:
    """Runs the training in a container on a Docker engine (docker-py).

    :param base_url: the engine, e.g. ``unix:///var/run/docker.sock`` or ``tcp://127.0.0.1:2376``;
        default: ``DOCKER_HOST`` or the local socket (``docker.from_env``).
    :param tls: ``True`` or a ``docker.tls.TLSConfig`` for a TLS engine.
    :param registry: credentials for pulling (``registry``, ``username``, ``password``, optional
        ``email``, ``reauth``), as the Airflow connection ``docker_default`` holds them.
    :param client: a ready ``docker.DockerClient`` (tests, callers sharing one).
    :param timeout: seconds per API call.
    :param stop_timeout_s: grace period between SIGTERM and SIGKILL on stop, seconds.
    """

    name = "docker"
    options = DockerOptions

    def __init__(
        self,
        base_url: str | None = None,
        tls: Any = None,
        *,
        registry: dict[str, Any] | None = None,
        client: Any = None,
        timeout: int = 60,
        stop_timeout_s: int = STOP_TIMEOUT_S,
        **_ignored: Any,
    ):
        self.base_url = base_url
        self.tls = tls
        self.registry = registry
        self.timeout = timeout
        self.stop_timeout_s = stop_timeout_s
        if client is not None:
            self.__dict__["client"] = client

    @cached_property
    def client(self) -> Any:
        """The ``docker.DockerClient``, connected on first use.

        :raises LaunchError: when no engine answers at ``base_url``.
        """
        import docker

        where = self.base_url or "DOCKER_HOST or unix:///var/run/docker.sock"
        try:
            if self.base_url:
                client = docker.DockerClient(
                    base_url=self.base_url, tls=self.tls or False, timeout=self.timeout)
            else:
                client = docker.from_env(timeout=self.timeout)
            client.ping()
        except docker.errors.DockerException as exc:
            raise LaunchError(
                f"cannot reach the Docker engine at {where}: {exc}; start dockerd (or set the base_url in the "
                "Airflow connection docker_default's extra) and check this user may use its socket."
            ) from exc
        return client

    # ------------------------------------------------------------------------------- planning
    def plan(self, request: LaunchRequest) -> DockerPlan:
        """What would be created for ``request``; pure, never contacts the engine.

        :raises LaunchError: for invalid launcher options or a script outside the code folder.
        """
        opts = launcher_options(request, DockerOptions)
        vendor = request.vendor
        if vendor is None:
            catalog = load_catalog()
            vendor = catalog.vendor(request.devices[0].vendor if request.devices else "nvidia")
        host_root, script_inside = container_script(request, opts.code_dir)
        devs = _device_settings(request, vendor, opts.runtime)
        device_env, device_ids = devs.env, devs.device_ids
        argv = list(opts.command) if opts.command else training_command(
            request, python=opts.python, script=script_inside, visible=device_env.get(vendor.visible_devices_env, ""),
            log_dir=LAUNCH_LOG_DIR)
        on_cpu = request.on_cpu or not request.devices
        env, cap_notes = _container_env(request, opts, vendor, device_env, on_cpu=on_cpu)

        image = opts.image or DEFAULT_IMAGE
        name = container_name(request)
        labels = container_labels(request)
        volumes, output_volume = _container_volumes(request, opts, host_root, devs.mounts)
        shm = opts.shm_size or (request.shm_bytes if opts.ipc_mode != "host" else None)
        memory = opts.memory_limit or request.memory_limit_bytes

        kwargs: dict[str, Any] = {
            "image": image,
            "command": argv,
            "name": name,
            "labels": labels,
            "environment": env,
            "working_dir": opts.code_dir,
            "user": opts.user,
            "volumes": volumes,
            "security_opt": ["no-new-privileges"],
            "detach": True,
        }
        cli = ["docker", "run", "--detach", "--name", name]
        cli += [arg for key, value in labels.items() for arg in ("--label", f"{key}={value}")]
        cli += [arg for key, value in env.items() for arg in ("--env", f"{key}={value}")]
        cli += ["--user", opts.user, "--workdir", opts.code_dir, "--security-opt", "no-new-privileges"]
        run_kwargs, run_cli = _run_options(opts, devs, shm=shm, memory=memory, on_cpu=on_cpu)
        kwargs.update(run_kwargs)
        cli += run_cli
        for source, bind in volumes.items():
            cli += ["--volume", f"{source}:{bind['bind']}:{bind['mode']}"]
        cli += [image, *argv]
        visible = device_env.get(vendor.visible_devices_env)
        return DockerPlan(
            image=image, name=name, argv=argv, env=env, labels=labels, create_kwargs=kwargs, cli=cli,
            device_ids=device_ids, visible_devices=visible, pull_policy=opts.image_pull_policy,
            output_volume=output_volume, output_dir=request.env.get(OUTPUT_DIR_ENV), user=opts.user, notes=cap_notes,
        )

    def render(self, request: LaunchRequest) -> dict[str, Any]:
        """The container for ``autodl plan --json`` and logs: argv, env, the ``docker run`` line
        (``shell``) and the keyword arguments of ``containers.create`` (JSON-ready)."""
        plan = self.plan(request)
        return {
            "launcher": self.name,
            "image": plan.image,
            "container_name": plan.name,
            "command": plan.argv,
            "env": redact_env(plan.env),
            "labels": plan.labels,
            "device_ids": plan.device_ids,
            "visible_devices": plan.visible_devices,
            "shell": plan.shell,
            "output_volume": plan.output_volume,
            "create_kwargs": {k: (list(map(dict, v)) if k == "device_requests" else redact_env(v) if k == "environment" else v)
                              for k, v in plan.create_kwargs.items()},
        }

    # ------------------------------------------------------------------------------- engine
    def containers_of(self, run_key: str) -> list[Any]:
        """Every container (any state) labelled with ``run_key``, newest first.

        The engine's label filter selects; each container's own ``autodl.run_key`` label is then compared with
        the whole run key, so a launch never reattaches to (and a stop never removes) another run's container."""
        found = self.client.containers.list(all=True, filters={"label": f"{LABEL_PREFIX}run_key={run_key}"})
        mine = [c for c in found if (getattr(c, "labels", None) or {}).get(f"{LABEL_PREFIX}run_key") == run_key]
        return sorted(mine, key=lambda c: c.attrs.get("Created", ""), reverse=True)

    def _ensure_image(self, plan: DockerPlan) -> None:
        self.ensure_image(plan.image, plan.pull_policy)

    def ensure_image(self, image: str, pull_policy: str) -> None:
        """Pull ``image`` as ``pull_policy`` (``launcher.image_pull_policy``) says: when absent (``IfNotPresent``),
        always (``Always``), or never (``Never``: an absent image is an error).

        :raises LaunchError: the image is absent and may not be pulled, or the pull failed (naming the fix).
        """
        import docker

        present = True
        try:
            self.client.images.get(image)
        except docker.errors.ImageNotFound:
            present = False
        if present and pull_policy != "Always":
            return
        if pull_policy == "Never":
            raise LaunchError(
                f"image {image} is not on the Docker host and launcher.image_pull_policy is Never; "
                f"run `docker pull {image}` there or set image_pull_policy: IfNotPresent."
            )
        auth = None
        if self.registry and self.registry.get("username"):
            auth = {"username": self.registry["username"], "password": self.registry.get("password")}
        log.info("pulling %s", image)
        try:
            self.client.images.pull(image, auth_config=auth)
        except docker.errors.APIError as exc:
            raise LaunchError(
                f"cannot pull image {image}: {exc.explanation or exc}; check launcher.image, the registry "
                "credentials in the Airflow connection docker_default, and that the Docker host reaches the registry."
            ) from exc

    def create(self, request: LaunchRequest) -> Any:
        """Create (not start) the container for ``request``, removing ended containers of its run key.

        The run's mounts and device nodes are checked against this host first (its sockets, symlinks, engine
        socket and autodl's state: :func:`autodl.launch.mounts.check_host_paths`): the container is created on
        the engine of the host that mounts them, whichever machine validated the spec.

        :returns: the ``docker.models.containers.Container``.
        :raises SpecError: a mount or device node this host must not give a container, naming the field.
        :raises LaunchError: when the image is missing and may not be pulled, or the engine refuses.
        """
        import docker

        opts = launcher_options(request, DockerOptions)
        check_host_paths(opts.mounts, opts.devices, f"run {request.run_key}")
        plan = self.plan(request)
        for old in self.containers_of(request.run_key):
            if old.status not in _RUNNING:
                log.info("removing ended container %s (%s) of run %s", old.name, old.status, request.run_key)
                old.remove(force=True)
        self._ensure_image(plan)
        self._ensure_output_volume(plan)
        for note in plan.notes:
            log.info("%s", note)
        log.info("docker equivalent: %s", plan.shell)
        try:
            container = self.client.containers.create(**plan.create_kwargs)
        except docker.errors.APIError as exc:
            raise LaunchError(
                f"Docker refused to create container {plan.name} for run {request.run_key}: "
                f"{exc.explanation or exc}; reproduce with: {plan.shell}"
            ) from exc
        try:
            container.put_archive("/", run_files_archive(*container_user_ids(plan.user)))
        except docker.errors.APIError as exc:
            container.remove(force=True)
            raise LaunchError(
                f"cannot copy autodl's start-up hook into container {plan.name} ({exc.explanation or exc}): the run "
                "would measure nothing of its own; check the image has a writable root file system."
            ) from exc
        return container

    def _ensure_output_volume(self, plan: DockerPlan) -> None:
        """Create the model's output volume, labelled with the host folder it stands for, unless it exists."""
        import docker

        if not plan.output_volume:
            return
        try:
            self.client.volumes.get(plan.output_volume)
            return
        except docker.errors.NotFound:
            pass
        labels = {MANAGED_LABEL: "true", f"{LABEL_PREFIX}output_dir": plan.output_dir or ""}
        log.info("creating output volume %s for %s", plan.output_volume, plan.output_dir)
        self.client.volumes.create(name=plan.output_volume, labels=labels)

    def launch(self, request: LaunchRequest) -> LaunchHandle:
        """Start the training detached, or reattach to its running container.

        :raises LaunchError: when the container cannot be created or started; a GPU request on an
            engine without the NVIDIA Container Toolkit says what to install.
        """
        import docker

        plan = self.plan(request)
        for existing in self.containers_of(request.run_key):
            if existing.status in _RUNNING:
                log.info("reattaching to running container %s of run %s", existing.name, request.run_key)
                return self._handle(request, plan, existing, reattached=True)
        container = self.create(request)
        try:
            container.start()
        except docker.errors.APIError as exc:
            container.remove(force=True)
            reason = str(exc.explanation or exc)
            if plan.create_kwargs.get("device_requests") and "device driver" in reason:
                raise LaunchError(
                    f"the Docker engine cannot give container {plan.name} the GPUs {','.join(plan.device_ids)} "
                    f"({reason}): install the NVIDIA Container Toolkit on the Docker host ({NVIDIA_TOOLKIT_URL}), "
                    "run `nvidia-ctk runtime configure --runtime=docker` and restart dockerd; or run on CPU."
                ) from exc
            raise LaunchError(
                f"container {plan.name} for run {request.run_key} did not start: {reason}; reproduce with: {plan.shell}"
            ) from exc
        container.reload()
        return self._handle(request, plan, container, reattached=False)

    def _handle(self, request: LaunchRequest, plan: DockerPlan, container: Any, *, reattached: bool) -> LaunchHandle:
        return LaunchHandle(
            launcher=self.name,
            run_key=request.run_key,
            lease_id=request.labels.get("lease_id"),
            container_id=container.id,
            container_name=container.name,
            command=plan.argv,
            visible_devices=plan.visible_devices,
            device_ids=[d.device_id for d in request.devices],
            on_cpu=request.on_cpu or not request.devices,
            reattached=reattached,
        )

    def _container(self, handle: LaunchHandle) -> Any:
        import docker

        try:
            return self.client.containers.get(handle.container_id or handle.container_name)
        except docker.errors.NotFound:
            raise LaunchError(
                f"container {handle.container_name or handle.container_id} of run {handle.run_key} no longer exists "
                "(stopped and removed, or removed by hand); its exit code and logs are gone: relaunch the run."
            ) from None

    def poll(self, handle: LaunchHandle) -> int | None:
        """The container's exit code once it ended (137 after an out-of-memory kill), else ``None``.

        :raises LaunchError: when the container is gone or was never started.
        """
        state = self._container(handle).attrs.get("State", {})
        status = state.get("Status")
        if status in ("exited", "dead"):
            if state.get("OOMKilled"):
                log.warning("container %s was killed for exceeding its memory limit", handle.container_name)
            return int(state.get("ExitCode", 255))
        if status == "created":
            raise LaunchError(
                f"container {handle.container_name} of run {handle.run_key} was created but never started; relaunch."
            )
        return None

    def ended_at(self, handle: LaunchHandle) -> float | None:
        """When the container ended (epoch seconds): Docker's ``State.FinishedAt`` (RFC 3339, nanoseconds), None
        while it runs or when the engine cannot tell."""
        state = self._container(handle).attrs.get("State", {})
        if state.get("Status") not in ("exited", "dead"):
            return None
        return rfc3339_ts(state.get("FinishedAt"))

    def read_logs(self, handle: LaunchHandle, offset: int = 0) -> tuple[str, int]:
        """stdout and stderr since ``offset`` (the timestamp of the last line read, ns; 0: the beginning),
        and the offset to pass next time.

        One streaming request per container follows the log (:class:`~autodl.launch.base.LogStream`:
        ``logs(stream=True, follow=True, timestamps=True, since=...)``), so nothing is fetched twice; a
        stream that broke while the container runs is reopened at ``offset``. Once the container ended,
        the read waits up to :data:`LOG_DRAIN_S` for the stream's last lines.
        """
        key = handle.container_id or handle.container_name or handle.run_key
        stream = self._streams.get(key)
        if stream is not None and stream.done.is_set():
            text, cursor = stream.read()
            if text or self._container(handle).status not in _RUNNING:
                return text, cursor
            log.info("log stream of container %s ended early (%s): reopening it", handle.container_name, stream.error)
            offset, stream = cursor, None
        if stream is None:
            container = self._container(handle)

            def open_stream(since_s: int | None) -> Any:
                kwargs = {"since": since_s} if since_s else {}
                return container.logs(stdout=True, stderr=True, stream=True, follow=True, timestamps=True, **kwargs)

            stream = self._streams[key] = LogStream(open_stream, offset)
        if not stream.done.is_set() and self._container(handle).status not in _RUNNING:
            stream.wait(LOG_DRAIN_S)
        return stream.read()

    @property
    def _streams(self) -> dict[str, LogStream]:
        return self.__dict__.setdefault("_log_streams", {})

    def close_logs(self, handle: LaunchHandle) -> None:
        """Stop following ``handle``'s log (the follower is done with it); idempotent."""
        stream = self._streams.pop(handle.container_id or handle.container_name or handle.run_key, None)
        if stream is not None:
            stream.close()

    def stream_logs(self, handle: LaunchHandle) -> Iterator[str]:
        """Follow the container's output as it is written, until the container ends."""
        decoder = codecs.getincrementaldecoder("utf-8")("replace")
        for chunk in self._container(handle).logs(stdout=True, stderr=True, stream=True, follow=True):
            text = decoder.decode(chunk)
            if text:
                yield text
        tail = decoder.decode(b"", final=True)
        if tail:
            yield tail

    def stop(self, handle: LaunchHandle) -> None:
        """Stop (SIGTERM, then SIGKILL after ``stop_timeout_s``) and remove every container of the
        handle's run key; idempotent."""
        import docker

        found = {c.id: c for c in self.containers_of(handle.run_key)}
        if handle.container_id and handle.container_id not in found:
            try:
                container = self.client.containers.get(handle.container_id)
                found[container.id] = container
            except docker.errors.NotFound:
                pass
        for container in found.values():
            try:
                if container.status in _RUNNING:
                    container.stop(timeout=self.stop_timeout_s)
                container.remove(force=True)
                log.info("removed container %s of run %s", container.name, handle.run_key)
            except docker.errors.NotFound:
                pass
