"""Running untrusted user code (the profile's probe and dry run) in a bubblewrap sandbox, or not at all.

Details: docs/security.md#autodlsandbox.
"""

from __future__ import annotations

import json
import os
import resource
import select
import shutil
import signal
import stat
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Mapping, Sequence

from autodl.errors import AutoDLError

SANDBOX_UID = 65534
"""uid and gid of the sandboxed process inside its user namespace: Debian's ``nobody``/``nogroup``."""

_PASSWD = "root:x:0:0:root:/root:/usr/sbin/nologin\nnobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n"
_GROUP = "root:x:0:\nnogroup:x:65534:\n"
_HOSTS = "127.0.0.1 localhost sandbox\n::1 localhost ip6-localhost ip6-loopback\n"
_ETC_FILES = ("/etc/ld.so.cache", "/etc/ld.so.conf", "/etc/ld.so.conf.d", "/etc/localtime", "/etc/alternatives")
_SYS_DIRS = ("/sys/devices/system/cpu", "/sys/devices/system/node")


class SandboxUnavailable(AutoDLError):
    """No sandbox can be made on this host (``bwrap`` missing or not allowed to create namespaces).

    autodl then does not run the user's code at all; the message says why and how to enable it.
    """

    exit_code = 3


@dataclass(frozen=True)
class SandboxLimits:
    """Bounds of one sandboxed run.

    :ivar timeout_s: wall-clock seconds before the whole tree is killed.
    :ivar memory_bytes: memory the run may use, bytes: the whole tree's with a cgroup, and each
        process's address space (``RLIMIT_AS``) in every case.
    :ivar max_processes: processes and threads the whole tree may have at once (a cgroup's
        ``pids.max``, else ``RLIMIT_NPROC`` in the sandbox's own user namespace).
    :ivar max_output_bytes: bytes of stdout and of stderr kept (the last ones); the rest is read and
        dropped, so a child printing without end cannot fill the caller's memory.
    :ivar disk_bytes: disk the run may fill in ``workdir`` (allocated blocks of every file, bytes; 1 GiB: the
        probe writes nothing there, a dry run a small result; measured, a hostile probe wrote 2.5 GiB there
        in 15 s before this bound), and the size of each file it writes anywhere (``RLIMIT_FSIZE``).
    :ivar max_files: entries (files, folders, links) ``workdir`` may hold.
    """

    timeout_s: float
    memory_bytes: int
    max_processes: int = 256
    max_output_bytes: int = 16 << 20
    disk_bytes: int = 1 << 30
    max_files: int = 10_000


@dataclass
class SandboxResult:
    """What a sandboxed run did.

    :ivar returncode: exit status (negative: killed by that signal); None when it was killed on timeout.
    :ivar timed_out: True when :attr:`SandboxLimits.timeout_s` expired and the tree was killed.
    :ivar seconds: wall-clock duration.
    :ivar isolation: the level used (see :func:`isolation`).
    :ivar notes: isolation that was not available, or bounds the run hit, one sentence each.
    :ivar peak_memory_bytes: the whole tree's peak memory (cgroup), bytes; None without a cgroup.
    :ivar oom_kills: processes the OOM killer killed inside the sandbox; None without a cgroup.
    :ivar forks_refused: forks refused at :attr:`SandboxLimits.max_processes`; None without a cgroup.
    :ivar disk_exceeded: True when the tree was killed because ``workdir`` went past
        :attr:`SandboxLimits.disk_bytes`, :attr:`SandboxLimits.max_files` or :data:`MAX_WORKDIR_DEPTH`.
    """

    returncode: int | None
    stdout: str
    stderr: str
    timed_out: bool
    seconds: float
    isolation: str
    notes: list[str] = field(default_factory=list)
    peak_memory_bytes: int | None = None
    oom_kills: int | None = None
    forks_refused: int | None = None
    disk_exceeded: bool = False


# ----------------------------------------------------------------------------------------------------
# bubblewrap


def bwrap_path() -> str | None:
    """The bubblewrap executable on PATH or in /usr/bin, /usr/local/bin.

    :returns: its path, or None when bubblewrap is not installed.
    """
    return shutil.which("bwrap") or next((p for p in ("/usr/bin/bwrap", "/usr/local/bin/bwrap") if os.access(p, os.X_OK)), None)


def _python_dirs() -> list[Path]:
    """The interpreter's prefix and the virtual environment (where site-packages, Paddle included, live)."""
    dirs = {Path(sys.base_prefix).resolve(), Path(sys.prefix).resolve(), Path(sys.executable).resolve().parent.parent}
    return sorted(d for d in dirs if d not in (Path("/"), Path("/usr")) and not str(d).startswith("/usr/"))


def _root_args() -> list[str]:
    """The read-only file system of the sandbox (see the module docstring)."""
    args = ["--ro-bind", "/usr", "/usr"]
    for top in ("/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32"):
        p = Path(top)
        if p.is_symlink():
            args += ["--symlink", os.readlink(p), top]
        elif p.is_dir():
            args += ["--ro-bind", top, top]
    for path in (*_ETC_FILES, *_SYS_DIRS):
        args += ["--ro-bind-try", path, path]
    for d in _python_dirs():
        args += ["--ro-bind", str(d), str(d)]
    args += ["--proc", "/proc", "--dev", "/dev"]
    return args


def _python_over_tmpfs_args() -> list[str]:
    """The interpreter's folders again, for those under ``/tmp`` or ``/dev/shm``: the private tmpfs mounted
    there would otherwise hide them (a checkout and its ``.venv`` in a temporary folder, as CI makes)."""
    args: list[str] = []
    for d in _python_dirs():
        if any(d == Path(t) or Path(t) in d.parents for t in ("/tmp", "/dev/shm")):
            args += ["--ro-bind", str(d), str(d)]
    return args


def _namespace_args() -> list[str]:
    return ["--unshare-user", "--disable-userns", "--uid", str(SANDBOX_UID), "--gid", str(SANDBOX_UID),
            "--unshare-pid", "--unshare-net", "--unshare-ipc", "--unshare-uts", "--hostname", "sandbox",
            "--unshare-cgroup-try", "--die-with-parent", "--new-session", "--cap-drop", "ALL"]


@lru_cache(maxsize=1)
def _bwrap_check() -> tuple[str | None, str]:
    """(bwrap's path, "") when a sandbox starts here, else (None, why not). Run once per process."""
    exe = bwrap_path()
    if exe is None:
        return None, "bubblewrap (bwrap) is not installed: install the Debian/Ubuntu package 'bubblewrap'"
    try:
        r = subprocess.run([exe, *_namespace_args(), *_root_args(), "--size", str(1 << 20), "--tmpfs", "/tmp",
                            "--remount-ro", "/", "--", "/bin/true"], capture_output=True,
                           text=True, errors="replace", timeout=30, env={"PATH": "/usr/bin:/bin"})
    except (OSError, subprocess.SubprocessError) as exc:
        return None, f"bwrap ({exe}) could not be started: {exc}"
    if r.returncode != 0:
        why = (r.stderr or "").strip().splitlines()
        return None, (f"bwrap ({exe}) cannot make the sandbox here ({why[-1] if why else f'exit {r.returncode}'}); "
                      "it needs bubblewrap 0.8 or later and user namespaces (sysctl user.max_user_namespaces > 0, "
                      "kernel.unprivileged_userns_clone=1, or a container runtime that permits them)"
                      + (CONTAINER_SANDBOX_HINT if in_container() else ""))
    return exe, ""


CONTAINER_SANDBOX_HINT = (
    ". This process runs in a container: Docker's default seccomp profile refuses the user namespace and its masked "
    "/proc paths refuse a fresh /proc (bubblewrap#284, #505). Run this worker with security_opt "
    "seccomp=unconfined and systempaths=unconfined (docker run --security-opt; in the compose stack "
    "docker/compose.sandbox.yaml, see docs/compose.md), or profile where bubblewrap works")
"""The fix named when the sandbox fails inside a container. Both options were needed, and enough, for
``bwrap --unshare-user --unshare-pid --proc /proc`` as uid 50000 under Docker 20.10 (each alone fails:
"No permissions to create new namespace" / "Can't mount proc on /newroot/proc")."""


def in_container() -> bool:
    """True when this process runs in a container: Docker's ``/.dockerenv``, Podman's ``/run/.containerenv``,
    or a Kubernetes service host in the environment."""
    return (Path("/.dockerenv").exists() or Path("/run/.containerenv").exists()
            or "KUBERNETES_SERVICE_HOST" in os.environ)


# ----------------------------------------------------------------------------------------------------
# cgroups


def _mountinfo() -> list[tuple[str, str, set[str]]]:
    """(mount point, fs type, super options) of each cgroup mount."""
    out: list[tuple[str, str, set[str]]] = []
    try:
        lines = Path("/proc/self/mountinfo").read_text().splitlines()
    except OSError:
        return out
    for line in lines:
        pre, _, post = line.partition(" - ")
        parts, rest = pre.split(), post.split()
        if len(parts) >= 5 and len(rest) >= 3 and rest[0] in ("cgroup", "cgroup2"):
            out.append((parts[4].replace("\\040", " "), rest[0], set(rest[2].split(","))))
    return out


def _own_cgroups() -> dict[str, str]:
    """This process's cgroup path per v1 controller (``"memory"``, ``"pids"``) and ``""`` for v2."""
    own: dict[str, str] = {}
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        return own
    for line in lines:
        _hid, controllers, path = line.split(":", 2)
        for c in (controllers.split(",") if controllers else [""]):
            own[c] = path
    return own


class _Cgroup:
    """A cgroup made for one sandboxed run (v1 ``memory`` + ``pids``, or one v2 group with both)."""

    def __init__(self, memory_bytes: int, max_processes: int):
        self.dirs: list[Path] = []
        self.memory: Path | None = None
        self.pids: Path | None = None
        self.v2 = False
        name = f"autodl-sandbox-{uuid.uuid4().hex[:12]}"
        own = _own_cgroups()
        mounts = _mountinfo()
        try:
            v1 = {c: mp for mp, fs, opts in mounts if fs == "cgroup" for c in ("memory", "pids") if c in opts}
            if "memory" in v1 and "pids" in v1 and "memory" in own and "pids" in own:
                self.memory = self._make(Path(v1["memory"]), own["memory"], name)
                self.pids = self._make(Path(v1["pids"]), own["pids"], name)
                (self.memory / "memory.limit_in_bytes").write_text(str(memory_bytes))
                memsw = self.memory / "memory.memsw.limit_in_bytes"
                if memsw.exists():
                    memsw.write_text(str(memory_bytes))
                (self.pids / "pids.max").write_text(str(max_processes))
                return
            v2 = next((mp for mp, fs, _ in mounts if fs == "cgroup2"), None)
            if v2 is not None and "" in own:
                d = self._make(Path(v2), own[""], name)
                if not {"memory", "pids"} <= set((d / "cgroup.controllers").read_text().split()):
                    raise OSError("the memory and pids controllers are not delegated to this process's cgroup")
                (d / "memory.max").write_text(str(memory_bytes))
                if (d / "memory.swap.max").exists():
                    (d / "memory.swap.max").write_text("0")
                (d / "pids.max").write_text(str(max_processes))
                self.memory = self.pids = d
                self.v2 = True
                return
            raise OSError("no memory and pids cgroup controllers are mounted")
        except BaseException:
            self.remove()
            raise

    def _make(self, mount: Path, own: str, name: str) -> Path:
        d = mount / own.lstrip("/") / name
        d.mkdir()
        self.dirs.append(d)
        return d

    def add(self, pid: int) -> None:
        for d in self.dirs:
            (d / "cgroup.procs").write_text(str(pid))

    def _read(self, d: Path | None, name: str) -> str | None:
        try:
            return (d / name).read_text() if d is not None else None
        except OSError:
            return None

    def _field(self, d: Path | None, name: str, key: str) -> int | None:
        text = self._read(d, name)
        if text is None:
            return None
        for line in text.splitlines():
            k, _, v = line.partition(" ")
            if k == key and v.strip().isdigit():
                return int(v)
        return 0

    def peak_memory(self) -> int | None:
        text = self._read(self.memory, "memory.peak" if self.v2 else "memory.max_usage_in_bytes")
        return int(text) if text and text.strip().isdigit() else None

    def oom_kills(self) -> int | None:
        return self._field(self.memory, "memory.events" if self.v2 else "memory.oom_control", "oom_kill")

    def forks_refused(self) -> int | None:
        return self._field(self.pids, "pids.events", "max")

    def pids_left(self) -> list[int]:
        text = self._read(self.pids, "cgroup.procs") or ""
        return [int(p) for p in text.split()]

    def kill_all(self) -> None:
        """SIGKILL every process still in the group, until none is left (bounded rounds).

        Each pid is held by a pidfd and checked to still be in this group before it is signalled.
        """
        if self.v2 and self.pids is not None and (self.pids / "cgroup.kill").exists():
            try:
                (self.pids / "cgroup.kill").write_text("1")
            except OSError:
                pass
        name = self.dirs[0].name if self.dirs else None
        for _ in range(200):
            left = self.pids_left()
            if not left or name is None:
                return
            for pid in left:
                p = _Pid(pid)
                try:
                    if name in Path(f"/proc/{pid}/cgroup").read_text():
                        p.kill()
                except OSError:
                    pass
                finally:
                    p.close()
            time.sleep(0.01)

    def remove(self) -> None:
        for d in reversed(self.dirs):
            for _ in range(100):
                try:
                    d.rmdir()
                    break
                except FileNotFoundError:
                    break
                except OSError:
                    time.sleep(0.01)  # the last killed processes are still being reaped
        self.dirs = []


@lru_cache(maxsize=1)
def _cgroup_check() -> str:
    """"" when a cgroup can be made here, else why not."""
    try:
        _Cgroup(1 << 30, 64).remove()
        return ""
    except OSError as exc:
        return str(exc)


def isolation() -> str:
    """The isolation this host allows.

    :returns: ``"bwrap+cgroup"`` (bubblewrap's namespaces and a cgroup bounding the tree's memory and
        processes), ``"bwrap+rlimit"`` (the namespaces, with rlimits instead of a cgroup: see the
        module docstring) or ``"none"`` (no sandbox: :func:`run_sandboxed` refuses to run anything).
    """
    exe, _why = _bwrap_check()
    if exe is None:
        return "none"
    return "bwrap+cgroup" if not _cgroup_check() else "bwrap+rlimit"


def unavailable_reason() -> str | None:
    """Why :func:`isolation` is ``"none"``, or None when a sandbox can be made."""
    exe, why = _bwrap_check()
    return None if exe else why


# ----------------------------------------------------------------------------------------------------
# running


class _Pid:
    """A process to kill later, held by a pidfd where the kernel has them (Linux 5.3), so a recycled
    pid number is never signalled."""

    def __init__(self, pid: int):
        self.pid = pid
        try:
            self.fd: int | None = os.pidfd_open(pid)
        except (AttributeError, OSError):
            self.fd = None

    def kill(self) -> None:
        try:
            if self.fd is not None:
                signal.pidfd_send_signal(self.fd, signal.SIGKILL)
            else:
                os.kill(self.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError, OSError):
            pass

    def close(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None


def _read_info(fd: int, deadline: float) -> dict:
    """bubblewrap's ``--info-fd`` JSON (``child-pid``: the sandbox's pid 1 as the host sees it)."""
    buf = b""
    poller = select.poll()  # not select(): a worker may hold more than FD_SETSIZE descriptors
    poller.register(fd, select.POLLIN | select.POLLHUP)
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            break
        if not poller.poll(left * 1000):
            break
        chunk = os.read(fd, 4096)
        if not chunk:
            break
        buf += chunk
    try:
        return json.loads(buf.decode() or "{}")
    except ValueError:
        return {}


def _data_fd(text: str) -> int:
    r, w = os.pipe()
    os.write(w, text.encode())
    os.close(w)
    return r


class _Output:
    """The last ``cap`` bytes of a stream (a child printing without end cannot fill the caller's memory)."""

    def __init__(self, cap: int):
        self.cap, self.buf, self.dropped = cap, bytearray(), 0

    def add(self, chunk: bytes) -> None:
        self.buf += chunk
        if len(self.buf) > self.cap:
            cut = len(self.buf) - self.cap
            del self.buf[:cut]
            self.dropped += cut

    def text(self) -> str:
        return self.buf.decode(errors="replace")


DISK_CHECK_S = 0.5
"""Seconds between two measurements of the working folder while the sandboxed command runs."""

MAX_WORKDIR_DEPTH = 32
"""Deepest folder nesting allowed in the working folder (deeper trees could hide bytes from the measurement)."""


def workdir_usage(workdir: Path, *, max_bytes: int, max_files: int) -> str | None:
    """Why ``workdir`` is over its bounds, or None when it is within them.

    Counts every entry (file, folder, link, FIFO) without following symlinks, and the disk each file holds
    (allocated 512-byte blocks, so a sparse file counts what it really takes); stops at the first bound passed.
    A folder it cannot list, or nested deeper than :data:`MAX_WORKDIR_DEPTH`, is over the bounds (nothing the
    run needs looks like that).
    """
    used = files = 0
    stack = [(workdir, 0)]
    while stack:
        folder, depth = stack.pop()
        if depth > MAX_WORKDIR_DEPTH:
            return f"folders nested more than {MAX_WORKDIR_DEPTH} deep"
        try:
            with os.scandir(folder) as it:
                for entry in it:
                    files += 1
                    if files > max_files:
                        return f"more than {max_files} files"
                    st = entry.stat(follow_symlinks=False)
                    used += st.st_blocks * 512
                    if used > max_bytes:
                        return f"more than {max_bytes} bytes"
                    if entry.is_dir(follow_symlinks=False):
                        stack.append((Path(entry.path), depth + 1))
        except FileNotFoundError:
            continue  # removed while we looked
        except OSError as exc:
            return f"a folder that cannot be measured ({exc.strerror or exc})"
    return None


def read_output(workdir: str | Path, relative: str, *, max_bytes: int) -> bytes | None:
    """The bytes of a file a sandboxed run left in ``workdir``, read without trusting it.

    Every part of ``relative`` is opened relative to the folder before it with ``O_NOFOLLOW`` (a symlink the
    child planted, to ``/etc/shadow`` or the caller's ``/proc/self/environ``, is never followed), the file must be
    a regular file (a named pipe would block the caller for good; it is opened non-blocking and refused) of at
    most ``max_bytes`` bytes (checked on the open file, then read at most that).

    :param relative: a relative path inside ``workdir`` (no ``..``).
    :returns: the bytes, or None when the file is missing or is not such a file.
    """
    parts = [p for p in str(relative).split("/") if p not in ("", ".")]
    if not parts or ".." in parts or str(relative).startswith("/"):
        return None
    flags = os.O_RDONLY | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_NOFOLLOW", 0)
    fd = None
    try:
        fd = os.open(str(workdir), os.O_RDONLY | os.O_DIRECTORY | getattr(os, "O_CLOEXEC", 0))
        for part in parts[:-1]:
            nfd = os.open(part, flags | os.O_DIRECTORY, dir_fd=fd)
            os.close(fd)
            fd = nfd
        ffd = os.open(parts[-1], flags | os.O_NONBLOCK, dir_fd=fd)
        with os.fdopen(ffd, "rb") as fh:
            st = os.fstat(fh.fileno())
            if not stat.S_ISREG(st.st_mode) or st.st_size > max_bytes:
                return None
            data = fh.read(max_bytes + 1)
        return data if len(data) <= max_bytes else None
    except (OSError, ValueError):
        return None
    finally:
        if fd is not None:
            os.close(fd)


def _collect(proc: subprocess.Popen, deadline: float, cap: int, watch: tuple[Path, int, int] | None = None
             ) -> tuple[_Output, _Output, bool, str | None]:
    """Read the child's stdout and stderr until both close or ``deadline``.

    :param watch: ``(workdir, max bytes, max files)`` measured every :data:`DISK_CHECK_S` seconds.
    :returns: stdout, stderr, True when the deadline passed, and why the working folder is over its bounds (the
        reading stops at once then) or None.
    """
    if proc.stdout is None or proc.stderr is None:
        raise ValueError("_collect reads a child started with stdout=PIPE and stderr=PIPE")
    outs = {proc.stdout.fileno(): _Output(cap), proc.stderr.fileno(): _Output(cap)}
    order = list(outs.values())
    open_fds = set(outs)
    poller = select.poll()
    for fd in open_fds:
        poller.register(fd, select.POLLIN | select.POLLHUP)
    next_check = time.monotonic()
    while open_fds:
        now = time.monotonic()
        left = deadline - now
        if left <= 0:
            return order[0], order[1], True, None
        if watch is not None and now >= next_check:
            over = workdir_usage(watch[0], max_bytes=watch[1], max_files=watch[2])
            if over:
                return order[0], order[1], False, over
            next_check = time.monotonic() + DISK_CHECK_S
        for fd, _event in poller.poll(min(left, DISK_CHECK_S if watch is not None else 1.0) * 1000):
            chunk = os.read(fd, 1 << 16)
            if chunk:
                outs[fd].add(chunk)
            else:
                open_fds.discard(fd)
                poller.unregister(fd)
    return order[0], order[1], False, None


def _drain(proc: subprocess.Popen, outs: tuple[_Output, _Output]) -> None:
    """After the tree was killed: what is left in the pipes (bounded by the pipes' size)."""
    for stream, o in zip((proc.stdout, proc.stderr), outs):
        if stream is None:  # not a pipe: nothing to read
            continue
        fd = stream.fileno()
        os.set_blocking(fd, False)
        while True:
            try:
                chunk = os.read(fd, 1 << 16)
            except BlockingIOError:
                break
            if not chunk:
                break
            o.add(chunk)


def _bind_args(workdir: Path, read_only_paths: Sequence[Path]) -> list[str]:
    """``read_only_paths`` read-only (also at the path a symlink resolves to) and ``workdir`` read-write.

    Paths inside ``workdir`` are bound after it, so they stay read-only; the others before it, so a
    read-only folder holding ``workdir`` does not cover it.
    """
    before: list[str] = []
    after: list[str] = []
    for p in read_only_paths:
        p = Path(p).absolute()
        real = p.resolve()
        if not real.exists():
            continue
        for dest in dict.fromkeys((real, p)):
            (after if dest == workdir or workdir in dest.parents else before).extend(["--ro-bind", str(real), str(dest)])
    return [*before, "--bind", str(workdir), str(workdir), *after]


def _tree_cgroup(limits: SandboxLimits, notes: list[str]) -> _Cgroup | None:
    """A cgroup bounding the whole tree's memory and processes, or None with a note saying what bounds it then."""
    try:
        return _Cgroup(limits.memory_bytes, limits.max_processes)
    except OSError as exc:
        if os.geteuid() == 0:
            procs = ("the number of processes was bounded only by the timeout (RLIMIT_NPROC does not apply to "
                     "uid 0, which the sandbox maps to)")
        else:
            procs = f"processes were bounded by RLIMIT_NPROC={limits.max_processes}"
        notes.append(f"no cgroup could be created ({exc}): {procs}, and memory only per process "
                     f"(RLIMIT_AS={limits.memory_bytes} bytes), not for the whole tree.")
        return None


def _bwrap_argv(exe: str, argv: Sequence[str], *, workdir: Path, read_only_paths: Sequence[Path], data: list[int],
                tmpfs_bytes: int, block_r: int, info_w: int) -> list[str]:
    """bubblewrap's command line: new namespaces, a read-only root, the data files (``/etc/passwd``, ``/etc/group``,
    ``/etc/hosts``) from ``data``'s descriptors, ``/tmp`` and ``/dev/shm`` of ``tmpfs_bytes``, the bind mounts,
    and pid 1 waiting on ``block_r`` after writing its pid to ``info_w``."""
    return [exe, *_namespace_args(), *_root_args(),
            "--ro-bind-data", str(data[0]), "/etc/passwd", "--ro-bind-data", str(data[1]), "/etc/group",
            "--ro-bind-data", str(data[2]), "/etc/hosts",
            "--size", str(tmpfs_bytes), "--tmpfs", "/tmp",
            "--size", str(tmpfs_bytes), "--tmpfs", "/dev/shm", *_python_over_tmpfs_args(),
            *_bind_args(workdir, read_only_paths), "--remount-ro", "/", "--chdir", str(workdir),
            "--block-fd", str(block_r), "--info-fd", str(info_w), "--", *argv]


def _bound_pid1(child: int, cgroup: _Cgroup | None, limits: SandboxLimits, fsize: int) -> None:
    """Bounds on the sandbox's pid 1 while it waits on ``--block-fd``, before it forks the command: the tree
    inherits them (the cgroup, or RLIMIT_NPROC without one; RLIMIT_AS, no core files, RLIMIT_FSIZE)."""
    if cgroup is not None:
        cgroup.add(child)
    for res, value in ((resource.RLIMIT_AS, limits.memory_bytes), (resource.RLIMIT_CORE, 0),
                       (resource.RLIMIT_FSIZE, fsize)):
        resource.prlimit(child, res, (value, value))
    if cgroup is None:
        resource.prlimit(child, resource.RLIMIT_NPROC, (limits.max_processes, limits.max_processes))


def _kill_tree(pid1: _Pid | None, proc: subprocess.Popen | None) -> None:
    """Kill the sandbox's pid 1 (its whole PID namespace dies with it) and bwrap."""
    if pid1 is not None:
        pid1.kill()
    if proc is not None:
        proc.kill()


def _reap(proc: subprocess.Popen, outs: tuple[_Output, _Output]) -> None:
    """Kill bwrap if it still runs, wait for it, read what is left in its pipes into ``outs`` and close them."""
    if proc.poll() is None:
        proc.kill()
    proc.wait()
    _drain(proc, outs)
    for stream in (proc.stdout, proc.stderr):
        if stream is not None:
            stream.close()


def _bound_notes(limits: SandboxLimits, outs: tuple[_Output, _Output], *, oom: int | None, refused: int | None,
                 disk_over: str | None) -> list[str]:
    """What the bounds did to the run: output dropped, OOM kills, forks refused, a working folder over its bounds."""
    notes = []
    for name, o in zip(("stdout", "stderr"), outs):
        if o.dropped:
            notes.append(f"{name} was longer than {limits.max_output_bytes} bytes: its first {o.dropped} bytes were dropped.")
    if oom:
        notes.append(f"the sandbox reached its memory limit ({limits.memory_bytes} bytes for the whole tree): "
                     f"the OOM killer killed {oom} process(es).")
    if refused:
        notes.append(f"the sandbox reached its process limit ({limits.max_processes}): {refused} fork(s) refused.")
    if disk_over:
        notes.append(f"the run put {disk_over} into its working folder (at most {limits.disk_bytes} bytes in "
                     f"{limits.max_files} files): its whole tree was killed.")
    return notes


def run_sandboxed(argv: Sequence[str], *, workdir: Path, limits: SandboxLimits, env: dict[str, str],
                  read_only_paths: Sequence[Path] = ()) -> SandboxResult:
    """Run ``argv`` in a bubblewrap sandbox, wait for it within ``limits.timeout_s``, kill its whole tree.

    :param argv: the command; ``argv[0]`` is usually ``sys.executable`` (its prefix and virtual
        environment are mounted read-only). Any other program must lie under ``/usr`` or in
        ``read_only_paths``.
    :param workdir: the run's working directory and ``HOME``, mounted read-write at the same path:
        the only host path the child can write.
    :param limits: timeout, memory, process and output bounds.
    :param env: the complete environment of the child (nothing of the caller's is inherited).
    :param read_only_paths: files or folders the child must read (the script, a helper), mounted
        read-only at the same path (also at the path a symlink resolves to); missing ones are left out.
    :returns: the result; a timeout is ``timed_out=True``, never an exception. ``stdout``/``stderr``
        hold at most the last :attr:`SandboxLimits.max_output_bytes` of each (a note says what was dropped).
    :raises SandboxUnavailable: when no sandbox can be made on this host (nothing was run).
    :raises KeyboardInterrupt, SystemExit: re-raised after the tree was killed.
    """
    exe, why = _bwrap_check()
    if exe is None:
        raise SandboxUnavailable(f"no sandbox can be made on this host ({why}), and user code never runs unisolated.")
    workdir = Path(workdir).resolve()
    notes: list[str] = []
    cgroup = _tree_cgroup(limits, notes)
    level = "bwrap+cgroup" if cgroup is not None else "bwrap+rlimit"
    # tmpfs pages are host memory: the cgroup counts them; without one no rlimit does, so they are kept small
    tmpfs_bytes = limits.memory_bytes if cgroup is not None else min(limits.memory_bytes, limits.disk_bytes)
    fsize = min(limits.memory_bytes, limits.disk_bytes)
    return _run_bwrap(exe, argv, workdir=workdir, read_only_paths=read_only_paths, env=env, limits=limits,
                      cgroup=cgroup, level=level, tmpfs_bytes=tmpfs_bytes, fsize=fsize, notes=notes)


def _close_fds(fds: list[int], *which: int) -> None:
    """Close those of ``which`` still in ``fds`` (the descriptors a sandboxed run opened) and drop them from it."""
    for fd in which:
        if fd in fds:
            fds.remove(fd)
            os.close(fd)


def _end_tree(pid1: _Pid | None, proc: subprocess.Popen | None, outs: tuple[_Output, _Output],
              cgroup: _Cgroup | None) -> tuple[int | None, int | None, int | None]:
    """Kill pid 1, reap bwrap, kill the cgroup's rest and remove it: (peak memory bytes, OOM kills, forks refused)."""
    if pid1 is not None:  # the command is done: whatever it left in its PID namespace dies with pid 1
        pid1.kill()
        pid1.close()
    if proc is not None:
        _reap(proc, outs)
    peak = oom = refused = None
    if cgroup is not None:
        cgroup.kill_all()
        peak, oom, refused = cgroup.peak_memory(), cgroup.oom_kills(), cgroup.forks_refused()
        cgroup.remove()
    return peak, oom, refused


def _run_bwrap(exe: str, argv: Sequence[str], *, workdir: Path, read_only_paths: Sequence[Path], env: dict[str, str],
               limits: SandboxLimits, cgroup: _Cgroup | None, level: str, tmpfs_bytes: int, fsize: int,
               notes: list[str]) -> SandboxResult:
    """Run bwrap on ``argv`` with pid 1 bounded before the command starts; kill its tree on a bound or an exception."""
    fds: list[int] = []  # every descriptor this call opened, closed in the end
    data = [_data_fd(text) for text in (_PASSWD, _GROUP, _HOSTS)]
    fds += data
    block_r, block_w = os.pipe()
    info_r, info_w = os.pipe()
    fds += [block_r, block_w, info_r, info_w]
    args = _bwrap_argv(exe, argv, workdir=workdir, read_only_paths=read_only_paths, data=data,
                       tmpfs_bytes=tmpfs_bytes, block_r=block_r, info_w=info_w)
    t0 = time.monotonic()
    deadline = t0 + limits.timeout_s
    proc: subprocess.Popen | None = None
    pid1: _Pid | None = None
    timed_out = False
    disk_over: str | None = None
    outs = (_Output(limits.max_output_bytes), _Output(limits.max_output_bytes))

    try:
        proc = subprocess.Popen(args, cwd=workdir, env=dict(env, HOME=str(workdir), PYTHONNOUSERSITE="1"),
                                stdin=subprocess.DEVNULL,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True,
                                pass_fds=(*data, block_r, info_w))
        _close_fds(fds, *data, block_r, info_w)
        child = _read_info(info_r, t0 + max(10.0, limits.timeout_s)).get("child-pid")
        if isinstance(child, int) and child > 0:
            pid1 = _Pid(child)
            _bound_pid1(child, cgroup, limits, fsize)
            os.write(block_w, b"x")
        else:
            proc.kill()  # never let it go on without its bounds (closing --block-fd would release it)
        _close_fds(fds, block_w)
        out, err, timed_out, disk_over = _collect(proc, deadline, limits.max_output_bytes,
                                                  (workdir, limits.disk_bytes, limits.max_files))
        outs = (out, err)
        if timed_out or disk_over:
            _kill_tree(pid1, proc)
    except BaseException:  # Ctrl-C, SIGTERM, an error placing the tree: never leave the sandbox running
        _kill_tree(pid1, proc)
        raise
    finally:
        _close_fds(fds, *list(fds))
        peak, oom, refused = _end_tree(pid1, proc, outs, cgroup)
    if not pid1:
        notes.append("bwrap did not start the sandbox (see stderr).")
    returncode = None if timed_out else proc.returncode
    if returncode is not None and 128 < returncode <= 128 + 64:
        returncode = 128 - returncode  # bwrap reports a command killed by signal N as 128+N, like a shell
    notes += _bound_notes(limits, outs, oom=oom, refused=refused, disk_over=disk_over)
    return SandboxResult(returncode=returncode, stdout=outs[0].text(), stderr=outs[1].text(), timed_out=timed_out,
                         seconds=round(time.monotonic() - t0, 3), isolation=level, notes=notes,
                         peak_memory_bytes=peak, oom_kills=oom, forks_refused=refused,
                         disk_exceeded=disk_over is not None)


# ----------------------------------------------------------------------------------------------------
# what of the user's folder a sandbox is shown

PROTECTED_NAMES = ("airflow.cfg", "webserver_config.py", "unittests.cfg", "airflow-webserver.pid", ".env")
"""File names never shown to user code: Airflow's configuration (it holds the JWT secret and the metadata database's
URL), the web server's config and pid file, and dotenv files (secrets by convention)."""

PROTECTED_SUFFIXES = (".db", ".db-journal", ".db-wal", ".db-shm", ".sqlite", ".sqlite3", ".cfg.bak", ".pem", ".key")
"""File endings never shown to user code: SQLite stores (autodl's ``autodl.db``, Airflow's ``airflow.db``), their
journals, and private keys."""

HOME_MARKERS = ("airflow.cfg", "autodl.db")
"""A folder holding one of these is an Airflow or autodl home: it is never shown, whatever its name."""


def airflow_home(environ: Mapping[str, str] | None = None) -> Path:
    """``$AIRFLOW_HOME``, default ``~/airflow`` (Airflow's own default), resolved."""
    env = os.environ if environ is None else environ
    return Path(env.get("AIRFLOW_HOME") or Path(env.get("HOME") or "~").expanduser() / "airflow").resolve()


def protected_paths(src: Path | None = None, environ: Mapping[str, str] | None = None) -> list[Path]:
    """autodl's and Airflow's own state, by location, resolved: autodl's home (``$AUTODL_HOME``, default
    ``$AIRFLOW_HOME/autodl``), the store's SQLite file (``AUTODL_STORE_URL`` / ``[autodl] store_url``) and
    :func:`airflow_home` -- except, when ``src`` (the script's folder) lies inside Airflow's home (a script kept in
    ``$AIRFLOW_HOME/dags/``), that home: the walk starts at ``src`` and never sees the rest of it, and Airflow's
    files there are still refused by name (:func:`why_protected`)."""
    env = os.environ if environ is None else environ
    af = airflow_home(env)
    out = [Path(env["AUTODL_HOME"]) if env.get("AUTODL_HOME") else af / "autodl"]
    try:
        from autodl.config import autodl_home, store_url

        out.append(autodl_home())
        url = store_url()
        if url.startswith("sqlite:///"):
            out.append(Path(url[len("sqlite:///"):]))
    except AutoDLError:
        pass
    if src is None or af not in Path(src).resolve().parents:
        out.append(af)
    return list(dict.fromkeys(p.resolve() for p in out))


def why_protected(path: Path, protected: Sequence[Path]) -> str | None:
    """Why ``path`` (absolute, resolved) must not be shown to user code, or None.

    :returns: a short reason: autodl's or Airflow's state (the path is, holds or lies in one of ``protected``, or
        looks like a home by :data:`HOME_MARKERS`), a protected name (:data:`PROTECTED_NAMES`,
        :data:`PROTECTED_SUFFIXES`), or a hidden entry (``.git``, ``.ssh``, ``__pycache__``: not user code or data).
    """
    if any(path == g or g in path.parents for g in protected):
        return "autodl's or Airflow's state"
    name = path.name
    if name.startswith(".") or name == "__pycache__":
        return "a hidden entry"
    if name in PROTECTED_NAMES or name.lower().endswith(PROTECTED_SUFFIXES):
        return "a protected file (Airflow's configuration, a store, a key)"
    if path.is_dir() and not path.is_symlink() and any(os.path.lexists(path / m) for m in HOME_MARKERS):
        return "an Airflow or autodl home"
    return None


@dataclass
class Staged:
    """What :func:`stage_tree` copied and what it left out.

    :ivar files: the copies, absolute paths under the destination (to be mounted read-only).
    :ivar bytes: bytes copied.
    :ivar left_out: one ``"relative path (why)"`` per entry not copied.
    """

    files: list[Path] = field(default_factory=list)
    bytes: int = 0
    left_out: list[str] = field(default_factory=list)


def stage_tree(src: Path, dest: Path, *, protected: Sequence[Path], max_files: int, max_bytes: int,
               max_depth: int) -> Staged:
    """Copy the user's code and data files of ``src`` into ``dest`` (an existing, empty folder), nothing else.

    Only regular files and folders are copied (never a socket, FIFO or device: a host Unix socket reachable through
    a bind mount can be connected to even read-only); a symbolic link only when it resolves inside ``src`` to a
    regular file, and then as a copy; nothing :func:`why_protected` refuses; at most ``max_files`` files of
    ``max_bytes`` bytes together, ``max_depth`` folders deep. Files are read with ``O_NOFOLLOW | O_NONBLOCK`` and
    checked again on the open descriptor (a file swapped for a FIFO or link meanwhile is left out).

    :returns: what was copied and, for each entry left out, why.
    """
    src = src.resolve()
    out = Staged()
    stack = [(src, dest, 0)]
    while stack:
        folder, target, depth = stack.pop()
        try:
            entries = sorted(folder.iterdir())
        except OSError as exc:
            out.left_out.append(f"{folder.relative_to(src)}/ (cannot be listed: {exc.strerror or exc})")
            continue
        for e in entries:
            rel = e.relative_to(src)
            why = _stage_one(e, target / e.name, src, protected, out, max_files, max_bytes, depth, max_depth, stack)
            if why:
                out.left_out.append(f"{rel} ({why})")
    return out


def _stage_one(e: Path, d: Path, src: Path, protected: Sequence[Path], out: Staged, max_files: int, max_bytes: int,
               depth: int, max_depth: int, stack: list) -> str | None:
    """Copy one entry (see :func:`stage_tree`); :returns: why it was left out, or None."""
    try:
        st = e.lstat()
        real = e.resolve()
    except (OSError, RuntimeError) as exc:
        return f"cannot be read: {exc}"
    if stat.S_ISLNK(st.st_mode):
        if src not in real.parents or not real.is_file():
            return "a link out of the folder, or not to a regular file"
        st = real.stat()
    why = why_protected(e.absolute(), protected) or why_protected(real, protected)
    if why:
        return why
    if stat.S_ISDIR(st.st_mode):
        if depth >= max_depth:
            return f"folders nested more than {max_depth} deep"
        d.mkdir()
        stack.append((e, d, depth + 1))
        return None
    if not stat.S_ISREG(st.st_mode):
        return "not a regular file (a socket, FIFO or device)"
    if len(out.files) >= max_files:
        return f"more than {max_files} files"
    if out.bytes + st.st_size > max_bytes:
        return f"more than {max_bytes} bytes together"
    try:
        fd = os.open(real, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except OSError as exc:
        return f"cannot be read: {exc.strerror or exc}"
    with os.fdopen(fd, "rb") as fh:
        if not stat.S_ISREG(os.fstat(fh.fileno()).st_mode):
            return "not a regular file (a socket, FIFO or device)"
        with open(d, "wb") as copy:
            shutil.copyfileobj(fh, copy, 1 << 20)
            n = copy.tell()
    out.bytes += n
    out.files.append(d)
    return None


__all__ = ["SANDBOX_UID", "Staged", "airflow_home", "protected_paths", "stage_tree", "why_protected", "SandboxLimits",
           "SandboxResult", "SandboxUnavailable", "isolation", "read_output",
           "run_sandboxed", "unavailable_reason", "workdir_usage"]
