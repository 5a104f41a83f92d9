"""What a training container may be given of its host (``launcher.mounts``, ``launcher.devices``): checked by name
when the spec is validated, anywhere, and against the host itself (its sockets, symlinks, ``DOCKER_HOST``, autodl's
state) by the launcher, at launch, on the host that mounts.
"""

from __future__ import annotations

import os
import posixpath
import re
import stat
from collections.abc import Sequence

from pydantic import Field, field_validator

from autodl.errors import SpecError
from autodl.inputs import clip, short
from autodl.section import Section


def normpath(path: str) -> str:
    """``path`` lexically normalised: ``/var/run/docker.sock/.``, ``//var//run/``, ``/var/lib/../run`` become what
    they name (nothing on the file system is read)."""
    return "/" + posixpath.normpath(path).lstrip("/") if path.startswith("/") else posixpath.normpath(path)


ENGINE_SOCKETS = (
    "/var/run/docker.sock", "/run/docker.sock",
    "/run/containerd/containerd.sock", "/var/run/containerd/containerd.sock",
    "/run/podman/podman.sock", "/var/run/crio/crio.sock", "/run/crio/crio.sock",
)
"""Container engines' API sockets at their packaged locations (Docker, containerd, Podman, CRI-O): whoever can
write to one is root on the host."""

SYSTEM_TREES = ("/proc", "/sys", "/dev", "/boot", "/etc", "/root", "/run", "/var/run", "/var/lib/docker",
                "/var/lib/containerd", "/var/lib/containers", "/var/lib/kubelet", "/var/lib/postgresql")
"""Host folders never mounted into a training container, nor any folder inside or holding one: the kernel's
interfaces (``/proc``: every process's command line; ``/sys``; ``/dev``: device nodes), the host's configuration
and credentials (``/etc``, ``/root``, ``/boot``), runtime state with sockets (``/run``), and the state of the
container engines, the kubelet (pod tokens) and PostgreSQL (data files)."""

AUTODL_CONTAINER_TREE = "/autodl"
"""The folder of a training container that is autodl's: its start-up hook, run folder and output volume
(:data:`autodl.launch.docker.HOOK_DIR`, ``RUN_DIR``, ``OUTPUT_DIR``); no mount goes there."""

MAX_UNIX_SOCKETS_READ = 4 << 20
"""Bytes of ``/proc/net/unix`` read to find live Unix sockets (one line per socket, ~100 bytes: 40,000 sockets)."""


class MountSpec(Section):
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
        if normpath(value).endswith("docker.sock"):
            raise ValueError("the Docker socket is never mounted into a training container (it is root on the host)")
        return value

    @field_validator("source")
    @classmethod
    def _not_engine_socket(cls, value: str) -> str:
        check_mount_name(value)
        return value


def _overlaps(name: str, protected: str) -> bool:
    """True when ``name`` is ``protected``, lies inside it, or holds it."""
    name, protected = name.rstrip("/") or "/", protected.rstrip("/") or "/"
    return (name == protected or name == "/" or protected.startswith(name + "/")
            or name.startswith(protected + "/"))


def _refuse_protected(source: str, names: set[str], sockets: Sequence[str]) -> None:
    """Refuse ``source`` (spelt as each of ``names``) that is, lies in or holds one of ``sockets`` or
    :data:`SYSTEM_TREES`. :raises ValueError: naming what it holds and the fix."""
    for name in names:
        for sock in sockets:
            if name == "/" or name == sock or sock.startswith(name.rstrip("/") + "/") or name.startswith(sock + "/"):
                raise ValueError(f"{clip(source, 60)} is or contains the container engine's socket {sock} (root on the "
                                 "host); mount a data folder that does not hold it, e.g. /data/datasets")
    for name in names:
        for tree in SYSTEM_TREES:
            if _overlaps(name, tree):
                raise ValueError(f"{clip(source, 60)} is, lies in or holds the host's {tree}, which is never mounted into "
                                 "a training container; mount a data folder, e.g. /data/datasets")


def check_mount_name(source: str) -> None:
    """Refuse a host folder by what its path names, lexically normalised (``/var/run/docker.sock/.``,
    ``//var/run``), reading nothing of this host: ``/``, a container engine's socket at its packaged place
    (:data:`ENGINE_SOCKETS`) or a folder holding one, and the host's system trees (:data:`SYSTEM_TREES`: ``/proc``,
    ``/sys``, ``/dev``, ``/etc``, ``/root``, ``/run``, ...), as the path itself, anything inside it or any folder
    holding it. The spec's check: it holds wherever the spec is validated (the scheduler, ``autodl plan`` on a
    laptop); what depends on the host that mounts is :func:`check_mount_here`'s, at launch.

    :raises ValueError: naming what the path contains (pydantic turns it into a SpecError).
    """
    _refuse_protected(source, {normpath(source)}, ENGINE_SOCKETS)


def _engine_sockets() -> list[str]:
    """This host's engine sockets: ``DOCKER_HOST``'s, :data:`ENGINE_SOCKETS`, ``$XDG_RUNTIME_DIR/docker.sock``
    (rootless Docker), each also with its symlinks resolved."""
    sockets = list(ENGINE_SOCKETS)
    host = os.environ.get("DOCKER_HOST", "")
    if host.startswith("unix://"):
        sockets.insert(0, host[len("unix://"):])
    if os.environ.get("XDG_RUNTIME_DIR"):
        sockets.append(os.path.join(os.environ["XDG_RUNTIME_DIR"], "docker.sock"))
    resolved: list[str] = []
    for sock in sockets:
        for name in (normpath(sock), os.path.realpath(sock)):
            if name not in resolved:
                resolved.append(name)
    return resolved


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
        for name in (normpath(os.path.abspath(p)), os.path.realpath(p)):
            if name not in out:
                out.append(name)
    return out


def check_mount_here(source: str) -> None:
    """Refuse a host folder whose mount would hand the container this host, another run or a socket: what
    :func:`check_mount_name` refuses, with symlinks resolved on this host (``/data/link`` -> ``/run``), and

    * a Unix socket itself, and this host's engine socket (``DOCKER_HOST``, rootless ``$XDG_RUNTIME_DIR``);
    * any folder holding a Unix socket bound on this host (``/proc/net/unix``): ``/tmp`` with PostgreSQL's
      ``.s.PGSQL.5432``, whose trust authentication would let the training edit autodl's leases (a read-only
      mount does not stop ``connect()``);
    * autodl's and Airflow's own state here (``AUTODL_HOME``, the store's SQLite file, ``AIRFLOW_HOME``).

    Run by the launcher on the host that mounts, at launch: the machine that validated the spec (the scheduler,
    a worker without Docker, a laptop running ``autodl plan``) has other sockets, links and state.

    :raises ValueError: naming what the path contains and the fix.
    """
    names = {normpath(source)}
    try:
        if os.path.lexists(source):
            names.add(os.path.realpath(source))
            if stat.S_ISSOCK(os.stat(source).st_mode):
                raise ValueError("is a Unix socket; a socket is never mounted into a training container")
    except OSError:
        pass
    _refuse_protected(source, names, _engine_sockets())
    for name in names:
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


def check_device_node(item: str, *, here: bool = False) -> None:
    """Refuse a ``launcher.devices`` entry that is not an accelerator's node (:data:`ACCELERATOR_NODES`).

    An entry is ``HOST[:CONTAINER[:PERMISSIONS]]`` as ``docker run --device`` takes it: ``HOST`` lexically
    normalised (and, with ``here``, with its symlinks resolved on this host) must be an accelerator node;
    ``CONTAINER`` an absolute path; ``PERMISSIONS`` letters of ``rwm``.

    :param here: also resolve ``HOST``'s symlinks on this host: the launcher's check, on the host that mounts.
    :raises ValueError: naming the entry and what is allowed.
    """
    parts = item.split(":") if isinstance(item, str) and len(item) <= 200 else []
    if not parts or len(parts) > 3 or any(ord(c) < 32 for c in item):
        raise ValueError(f"{short(item, 60)} is not a device node (HOST[:CONTAINER[:rwm]])")
    host = parts[0]
    names = {normpath(host)} if host.startswith("/") else set()
    if here and host.startswith("/") and os.path.lexists(host):
        names.add(os.path.realpath(host))
    if not names or not all(ACCELERATOR_NODES.fullmatch(n) for n in names):
        raise ValueError(f"{short(host, 60)} is not an accelerator's device node; only those are passed through "
                         "(/dev/kfd, /dev/dri, /dev/davinciN, /dev/davinci_manager, /dev/devmm_svm, /dev/hisi_hdc, "
                         "/dev/xpuN, /dev/xpuctrl, /dev/nvidia*): any other node (a disk, /dev/mem) is the host")
    if len(parts) >= 2 and (not parts[1].startswith("/") or not parts[1].strip("/")):
        raise ValueError(f"{short(item, 60)}: the path inside the container must be absolute")
    if len(parts) == 3 and (not parts[2] or set(parts[2]) - set("rwm")):
        raise ValueError(f"{short(item, 60)}: permissions are letters of 'rwm'")


def check_host_paths(mounts: Sequence[MountSpec], devices: Sequence[str], what: str) -> None:
    """The launcher's check of a run's mounts and device nodes against this host (:func:`check_mount_here`,
    :func:`check_device_node` with ``here``), before any container is created.

    :param what: what mounts them, for the message (``run dag.task.run1``, ``the dry run``).
    :raises SpecError: naming ``what``, the field (``launcher.mounts.0.source``), what is wrong and the fix.
    """
    for i, mount in enumerate(mounts):
        try:
            check_mount_here(mount.source)
        except ValueError as exc:
            raise SpecError(f"{what}: field 'launcher.mounts.{i}.source': {exc} (on this host, "
                            f"{clip(os.uname().nodename, 60)}, which mounts it).") from None
    for i, item in enumerate(devices):
        try:
            check_device_node(item, here=True)
        except ValueError as exc:
            raise SpecError(f"{what}: field 'launcher.devices.{i}': {exc} (on this host, "
                            f"{clip(os.uname().nodename, 60)}).") from None


__all__ = ["ACCELERATOR_NODES", "ENGINE_SOCKETS", "SYSTEM_TREES", "MountSpec", "check_device_node", "check_host_paths",
           "check_mount_here", "check_mount_name", "normpath"]


def check_mount_layout(mounts: Sequence[MountSpec], code_dir: str) -> None:
    """Refuse mounts a container cannot have as written: one host folder twice (the engine keeps one of them), two
    mounts at one target, a mount at the code folder (``code_dir``, where autodl mounts the script) or in autodl's
    own folder (:data:`AUTODL_CONTAINER_TREE`).

    :raises ValueError: naming ``launcher.mounts.N`` and the fix.
    """
    sources: dict[str, int] = {}
    targets: dict[str, int] = {normpath(code_dir): -1}
    for i, m in enumerate(mounts):
        src, dst = normpath(m.source), normpath(m.target)
        if src in sources:
            raise ValueError(f"launcher.mounts.{i}.source: {short(m.source, 80)} is already mounted "
                             f"(launcher.mounts.{sources[src]}); a host folder is mounted once: drop one, or mount "
                             "two of its sub-folders")
        if dst in targets:
            at = "launcher.code_dir, where the script is mounted" if targets[dst] < 0 else f"launcher.mounts.{targets[dst]}"
            raise ValueError(f"launcher.mounts.{i}.target: {short(m.target, 80)} is already a mount target ({at}); "
                             "choose another target")
        if dst == AUTODL_CONTAINER_TREE or dst.startswith(AUTODL_CONTAINER_TREE + "/"):
            raise ValueError(f"launcher.mounts.{i}.target: {short(m.target, 80)} is in {AUTODL_CONTAINER_TREE}, "
                             "autodl's own folder of the container (its hook, run folder and outputs); choose another "
                             "target")
        sources[src], targets[dst] = i, i
