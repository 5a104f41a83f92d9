"""The dry run in the training's own image, through Docker: where the worker has no Paddle or cannot make a sandbox.

Details: docs/reference/estimator.md#autodlprofilecontainer.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import io
import json
import logging
import tarfile
import tempfile
import time
import uuid
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from autodl.launch.mounts import check_host_paths
from autodl.profile.dryrun import (
    CHILD,
    MAX_STAGED_BYTES,
    MAX_STAGED_FILES,
    MIRROR_DEPTH,
    REPORT_FILE_BYTES,
    ChildOutput,
    DryRunConfig,
    child_env,
    child_files,
    stage_script,
)
from autodl.sandbox import SandboxLimits, SandboxResult, SandboxUnavailable, Staged

log = logging.getLogger(__name__)

ENTRY = Path(__file__).with_name("_container_entry.py")
BUNDLE_DIR = "/autodl/dryrun"
"""autodl's files in the container (the entry, the child, its config, the staged code), read-only."""
WORK_DIR = "/autodl/work"
"""The script's working folder in the container (tmpfs, :attr:`SandboxLimits.disk_bytes`)."""
OUT_DIR = "/autodl/out"
"""Where the child writes its report (tmpfs of :data:`OUT_BYTES`)."""
OUT_BYTES = 2 * REPORT_FILE_BYTES + (16 << 20)
"""Size of the output tmpfs: the result and the allocation events, at most :data:`REPORT_FILE_BYTES` each."""

START_GRACE_S = 120.0
"""Seconds the container may take beyond the child's timeout (creating it, Paddle's import is inside the timeout)
before it is killed from outside."""

MAX_LOG_BYTES = 64 << 20
"""Bytes of the container's stdout read back (the framed report of two files of at most 32 MiB each, compressed)."""

CPU_CORES = 2
"""CPUs the dry run may use (``--cpus``; a pod's CPU request and limit): the budgets of :mod:`autodl.profile.dryrun`
are set for two cores, and a dry run on a GPU host leaves the trainings' data loaders the rest."""

STDERR_TAIL_LINES = 200
"""Lines of the container's stderr (the script's own output) kept for the reason of a failed dry run."""

FRAME = "@autodl-dryrun "
FRAME_END = "@autodl-dryrun-end "
VENUE_LABEL = "autodl.dry_run"
"""Label on the dry run's containers and volumes (with ``autodl.managed=true``): what a clean-up may remove."""


@dataclass
class EntryReport:
    """What the entry handed back: the child's exit status, whether its timeout killed it, its output files."""

    returncode: int | None = None
    timed_out: bool = False
    seconds: float = 0.0
    files: dict[str, bytes] = field(default_factory=dict)
    why: dict[str, str] = field(default_factory=dict)
    left_out: list[str] = field(default_factory=list)


def decode_report(stdout: str) -> EntryReport | None:
    """The entry's report from its stdout: the last complete, checksummed frame (see
    :mod:`autodl.profile._container_entry`); None when there is none (the container died before it wrote one).

    Every field is checked for type; the files are bounded by :data:`REPORT_FILE_BYTES` each.
    """
    chunks: list[str] = []
    found: str | None = None
    for line in stdout.splitlines():
        if line.startswith(FRAME_END):
            parts = line[len(FRAME_END):].split()
            text = "".join(chunks)
            if len(parts) == 2 and parts[0] == str(len(chunks)) and \
                    hashlib.sha256(text.encode()).hexdigest() == parts[1]:
                found = text
            chunks = []
        elif line.startswith(FRAME):
            parts = line[len(FRAME):].split(" ", 1)
            if parts[0] != str(len(chunks)):
                chunks = []
                if parts[0] != "0":
                    continue
            chunks.append(parts[1] if len(parts) == 2 else "")
    if found is None:
        return None
    try:
        dec = zlib.decompressobj()
        raw = dec.decompress(base64.b64decode(found, validate=True), 4 * REPORT_FILE_BYTES)
        data = json.loads(raw)
    except (ValueError, zlib.error, binascii.Error):
        return None
    return _entry_report(data) if isinstance(data, dict) else None


def _entry_report(data: dict) -> EntryReport:
    rc = data.get("returncode")
    rep = EntryReport(returncode=rc if type(rc) is int else None, timed_out=data.get("timed_out") is True,
                      seconds=float(data["seconds"]) if type(data.get("seconds")) in (int, float) else 0.0,
                      left_out=[str(x)[:300] for x in (data.get("left_out") or [])[:64]]
                      if isinstance(data.get("left_out"), list) else [])
    files: dict = data["files"] if isinstance(data.get("files"), dict) else {}
    for name in ("result.json", "alloc_events.json"):
        item: dict = files[name] if isinstance(files.get(name), dict) else {}
        text = item.get("data")
        if isinstance(text, str):
            try:
                blob = base64.b64decode(text, validate=True)
            except (ValueError, binascii.Error):
                blob = b""
            if 0 < len(blob) <= REPORT_FILE_BYTES:
                rep.files[name] = blob
                continue
        why = item.get("why")
        rep.why[name] = str(why)[:200] if why else "missing"
    return rep


def child_output(rep: EntryReport | None) -> ChildOutput:
    """The child's files as :func:`autodl.profile.dryrun.read_back` takes them."""
    if rep is None:
        return ChildOutput()
    why = rep.why.get("result.json")
    return ChildOutput(result=rep.files.get("result.json"), events=rep.files.get("alloc_events.json"),
                       refused=None if why in (None, "missing") else f"it is {why} (the dry run's own output file)")


def container_config(script: Path, cfg: DryRunConfig, *, code: str, limits: SandboxLimits,
                     user_dirs: list[str]) -> DryRunConfig:
    """The child's config with the container's paths, and the entry's ``"container"`` section."""
    here = f"{WORK_DIR}/{script.name}"
    box = {
        "code": code, "work": WORK_DIR, "out": OUT_DIR, "child": f"{BUNDLE_DIR}/child/{CHILD.name}",
        "timeout_s": limits.timeout_s, "memory_bytes": limits.memory_bytes,
        "fsize_bytes": min(limits.memory_bytes, limits.disk_bytes), "max_files": MAX_STAGED_FILES,
        "max_bytes": MAX_STAGED_BYTES, "max_depth": MIRROR_DEPTH, "max_report_bytes": REPORT_FILE_BYTES}
    return cfg.model_copy(update={"script": here, "user_dirs": user_dirs, "result": f"{OUT_DIR}/result.json",
                                  "container": box})


def bundle_files(cfg: DryRunConfig) -> dict[str, bytes]:
    """autodl's own files of the container, relative to :data:`BUNDLE_DIR`: the entry, the child's package, its
    FLOPs counter and the config."""
    child = {f"child/{name}": path.read_bytes() for name, path in child_files().items()}
    return {f"child/{ENTRY.name}": ENTRY.read_bytes(), **child, "dryrun.json": cfg.model_dump_json().encode()}


def bundle_tar(files: dict[str, bytes], code: Path | None) -> bytes:
    """A tar of ``files`` and the staged ``code`` folder (as ``code/``): root's, read-only for everyone else."""
    now = time.time()
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        def folder(name: str) -> None:
            info = tarfile.TarInfo(name)
            info.type, info.mode, info.mtime = tarfile.DIRTYPE, 0o755, now
            tar.addfile(info)

        folder("child")
        made = {"child"}
        for name, data in files.items():
            parent = name.rpartition("/")[0]
            if parent and parent not in made:  # the child's package folder
                folder(parent)
                made.add(parent)
            info = tarfile.TarInfo(name)
            info.size, info.mode, info.mtime = len(data), 0o444, now
            tar.addfile(info, io.BytesIO(data))
        if code is not None:
            folder("code")
            for path in sorted(code.rglob("*")):
                if path.is_symlink():
                    continue  # stage_tree copies regular files and folders only
                rel = f"code/{path.relative_to(code).as_posix()}"
                if path.is_dir():
                    folder(rel)
                elif path.is_file():
                    info = tarfile.TarInfo(rel)
                    info.size, info.mode, info.mtime = path.stat().st_size, 0o444, now
                    with path.open("rb") as fh:
                        tar.addfile(info, fh)
    return buf.getvalue()


def sandbox_result(rep: EntryReport | None, *, venue: str, seconds: float, stderr: str, notes: list[str],
                   killed: bool) -> SandboxResult:
    """The run as a :class:`~autodl.sandbox.SandboxResult` (what :func:`autodl.profile.dryrun.summarize` reads)."""
    if rep is None:
        notes = [*notes, "the container ended without handing back the dry run's report."]
    timed_out = killed or (rep.timed_out if rep is not None else False)
    return SandboxResult(returncode=None if timed_out or rep is None else rep.returncode, stdout="", stderr=stderr,
                         timed_out=timed_out, seconds=round(seconds, 3), isolation=venue, notes=notes)


def cpu_only_env() -> dict[str, str]:
    """The vendor table's CPU-only container variables (``NVIDIA_VISIBLE_DEVICES=void``) and no visible CUDA device."""
    from autodl.catalog import load_catalog

    env = {str(k): str(v) for k, v in load_catalog().vendor("nvidia").cpu_only_container_env.items()}
    env["CUDA_VISIBLE_DEVICES"] = ""
    return env


def container_env(batch_env: int | None, launch_env: dict[str, str] | None) -> dict[str, str]:
    """The child's environment in the container: :func:`~autodl.profile.dryrun.child_env` at the container's working
    folder, without the worker's ``PATH`` (the image's own stays), plus :func:`cpu_only_env`."""
    env = child_env(batch_env, Path(WORK_DIR), launch_env)
    env.pop("PATH", None)
    env.update(cpu_only_env(), HOME=WORK_DIR, PYTHONUNBUFFERED="1")
    return env


class DockerVenue:
    """The dry run in a container of the spec's launcher image on a Docker engine (see the module docstring).

    :param launcher: the spec's launcher section (``image``, ``image_pull_policy``, ``python``, ``user``,
        ``mounts``).
    :param engine: :class:`~autodl.launch.docker.DockerLauncher` keyword arguments (``base_url``, ``tls``,
        ``client``), as the Airflow connection ``docker_default`` gives them; empty: ``DOCKER_HOST`` or the
        local socket.
    """

    name = "docker"

    def __init__(self, launcher: Any, engine: dict[str, Any] | None = None):
        self.launcher = launcher
        self.engine = dict(engine or {})

    def _client(self) -> Any:
        from autodl.errors import LaunchError
        from autodl.launch.docker import DockerLauncher

        try:
            docker = DockerLauncher(**self.engine)
            docker.ensure_image(self.image, self.launcher.image_pull_policy)
        except LaunchError as exc:
            raise SandboxUnavailable(f"the dry run cannot run in the launcher's image: {exc}") from None
        return docker.client

    @property
    def image(self) -> str:
        from autodl.launch.docker import DEFAULT_IMAGE

        return self.launcher.image or DEFAULT_IMAGE

    def create_kwargs(self, volume: str, limits: SandboxLimits, env: dict[str, str], labels: dict[str, str]
                      ) -> dict[str, Any]:
        """The keyword arguments of ``containers.create`` for the dry run (see the module docstring)."""
        disk = limits.disk_bytes
        volumes = {volume: {"bind": BUNDLE_DIR, "mode": "ro"}}
        for m in self.launcher.mounts:  # the training's data and libraries, read-only here
            volumes[m.source] = {"bind": m.target, "mode": "ro"}
        tmpfs_opts = "rw,nosuid,nodev,mode=1777,size={}"
        return {
            "image": self.image,
            "command": [self.launcher.python, f"{BUNDLE_DIR}/child/{ENTRY.name}", f"{BUNDLE_DIR}/dryrun.json"],
            "user": self.launcher.user, "environment": env, "labels": labels,  # (a working_dir on the tmpfs
            # would be created by Docker as root 0755 over the tmpfs mode: the entry changes into it instead)
            "network_mode": "none", "read_only": True,
            "tmpfs": {WORK_DIR: tmpfs_opts.format(disk), OUT_DIR: tmpfs_opts.format(OUT_BYTES) + ",noexec",
                      "/tmp": tmpfs_opts.format(disk)},
            "shm_size": disk, "mem_limit": limits.memory_bytes, "memswap_limit": limits.memory_bytes,
            "pids_limit": limits.max_processes, "nano_cpus": CPU_CORES * 10**9, "cap_drop": ["ALL"], "security_opt": ["no-new-privileges"],
            "ipc_mode": "private", "volumes": volumes, "detach": True,
        }

    def run(self, script: Path, cfg: DryRunConfig, *, limits: SandboxLimits, batch_env: int | None,
            launch_env: dict[str, str] | None) -> tuple[ChildOutput, SandboxResult, Staged]:
        """Stage, copy in, run, read the log, remove (see the module docstring).

        :raises SpecError: a mount of ``launcher.mounts`` this host must not give a container.
        :raises SandboxUnavailable: the engine does not answer, the image is missing and may not be pulled, or the
            engine refuses the container (nothing of the user's ran).
        """
        check_host_paths(self.launcher.mounts, [], "the dry run in the launcher's image")  # on the host that mounts
        client = self._client()
        t0 = time.monotonic()
        tar, staged = self._bundle(script, cfg, limits)
        killed, stdout, stderr, notes = self._run_container(client, tar, limits, container_env(batch_env, launch_env))
        rep = decode_report(stdout)
        if rep is not None and rep.left_out:
            staged.left_out.extend(rep.left_out)
        res = sandbox_result(rep, venue="docker", seconds=time.monotonic() - t0, stderr=stderr, notes=notes,
                             killed=killed)
        return child_output(rep), res, staged

    @staticmethod
    def _bundle(script: Path, cfg: DryRunConfig, limits: SandboxLimits) -> tuple[bytes, Staged]:
        """The tar of autodl's files and the staged copy of the script's folder (see :func:`bundle_tar`)."""
        with tempfile.TemporaryDirectory(prefix="autodl-dryrun-") as tmp:
            code = Path(tmp) / "code"
            code.mkdir()
            staged = stage_script(script.parent, code)
            (code / script.name).unlink(missing_ok=True)
            (code / script.name).write_bytes(script.read_bytes())
            inner = container_config(script, cfg, code=f"{BUNDLE_DIR}/code", limits=limits, user_dirs=[WORK_DIR])
            return bundle_tar(bundle_files(inner), code), staged

    def _run_container(self, client: Any, tar: bytes, limits: SandboxLimits, env: dict[str, str]
                       ) -> tuple[bool, str, str, list[str]]:
        """Copy in, start, wait, read the log, remove. :returns: (killed at the deadline, stdout, stderr's tail,
        notes). :raises SandboxUnavailable: the engine failed on the way (never the script's error)."""
        import docker.errors
        import requests

        key = uuid.uuid4().hex[:12]
        labels = {"autodl.managed": "true", VENUE_LABEL: "true", "autodl.dry_run_key": key}
        volume = container = None
        try:
            volume = client.volumes.create(name=f"autodl-dryrun-{key}", labels=labels)
            self._copy_in(client, volume.name, tar, labels)
            container = self._create(client, self.create_kwargs(volume.name, limits, env, labels))
            self._start(container)
            killed = self._wait(container, limits.timeout_s + START_GRACE_S)
            stdout = _read_stream(container.logs(stdout=True, stderr=False, stream=True), MAX_LOG_BYTES)
            stderr = container.logs(stdout=False, stderr=True, tail=STDERR_TAIL_LINES).decode(errors="replace")
            container.reload()
            return killed, stdout, stderr[-limits.max_output_bytes:], _state_notes(container.attrs.get("State") or {},
                                                                                   limits)
        except (docker.errors.DockerException, requests.exceptions.RequestException) as exc:
            raise SandboxUnavailable(f"the Docker engine failed during the dry run ({exc}); nothing of it is "
                                     "used") from None
        finally:
            self._remove(container, volume)

    def _copy_in(self, client: Any, volume: str, tar: bytes, labels: dict[str, str]) -> None:
        """``put_archive`` into the volume through a container that is created, never started."""
        loader = self._create(client, {"image": self.image, "command": ["true"], "labels": labels,
                                       "network_mode": "none", "volumes": {volume: {"bind": BUNDLE_DIR, "mode": "rw"}}})
        try:
            loader.put_archive(BUNDLE_DIR, tar)
        finally:
            loader.remove(force=True)

    def _create(self, client: Any, kwargs: dict[str, Any]) -> Any:
        import docker.errors

        try:
            return client.containers.create(**kwargs)
        except docker.errors.APIError as exc:
            raise SandboxUnavailable(f"the Docker engine refused the dry run's container ({exc.explanation or exc}); "
                                     f"check launcher.image ({self.image}) and launcher.mounts") from None

    def _start(self, container: Any) -> None:
        import docker.errors

        try:
            container.start()
        except docker.errors.APIError as exc:  # e.g. no launcher.python in the image
            raise SandboxUnavailable(f"the dry run's container did not start in {self.image} "
                                     f"({exc.explanation or exc}); check launcher.image and launcher.python "
                                     f"({self.launcher.python})") from None

    @staticmethod
    def _wait(container: Any, deadline_s: float) -> bool:
        """Wait for the container to end; :returns: True when it was killed at ``deadline_s``."""
        import requests

        end = time.monotonic() + deadline_s
        while True:
            try:
                container.wait(timeout=max(1, min(30, int(end - time.monotonic()) + 1)))
                return False
            except (requests.exceptions.ConnectionError, requests.exceptions.ReadTimeout):
                if time.monotonic() >= end:
                    container.kill()
                    container.wait(timeout=30)
                    return True

    @staticmethod
    def _remove(container: Any, volume: Any) -> None:
        import docker.errors

        for thing in (container, volume):
            if thing is None:
                continue
            try:
                thing.remove(force=True)
            except docker.errors.NotFound:
                pass
            except docker.errors.APIError as exc:  # said, never hidden: a container left behind is someone's cost
                log.warning("could not remove the dry run's %s: %s", getattr(thing, "name", thing), exc)


def _read_stream(stream: Any, limit: int) -> str:
    """At most ``limit`` bytes of a log stream, decoded."""
    buf = bytearray()
    for chunk in stream:
        buf += chunk
        if len(buf) > limit:
            break
    close = getattr(stream, "close", None)
    if close is not None:
        close()
    return bytes(buf[:limit]).decode(errors="replace")


def _state_notes(state: dict, limits: SandboxLimits) -> list[str]:
    notes = []
    if state.get("OOMKilled"):
        notes.append(f"the container reached its memory limit ({limits.memory_bytes} bytes for the whole tree): the "
                     "OOM killer killed a process in it.")
    return notes


__all__ = ["DockerVenue", "EntryReport", "bundle_tar", "child_output", "container_config", "container_env",
           "decode_report"]
