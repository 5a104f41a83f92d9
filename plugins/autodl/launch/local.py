"""Local launcher: the training as a detached process group on this host, pinned by the vendor's visibility variable.

Details: docs/launchers.md#autodllaunchlocal.
"""

from __future__ import annotations

import errno
import fcntl
import hashlib
import json
import logging
import os
import re
import signal
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import psutil

from autodl.config import autodl_home
from autodl.errors import LaunchError
from autodl.launch import runner as _runner_module
from autodl.launch.base import LaunchRequest, pinning_env, shell_line, training_command
from autodl.launch.isolation import Isolation, python_dirs, training_isolation
from autodl.launch.options import LocalOptions
from autodl.launch.packed import memory_cap
from autodl.redact import is_secret_name, redact_env, redact_text
from autodl.types import LaunchHandle
from autodl.untrusted import LOG_CHUNK_BYTES, atomic_write_text, read_bytes

logger = logging.getLogger(__name__)

STOP_GRACE_S = 10.0
"""Seconds between SIGTERM and SIGKILL when stopping (Kubernetes' default grace period is 30 s;
a training that checkpoints on SIGTERM should finish within this)."""

STOP_POLL_S = 0.2
"""Seconds between looks for processes of a stopping attempt that have not had SIGTERM yet."""

CHILD_PATH = str(Path(__file__).resolve().parent / "child_path")
"""Folder put first on the training's ``PYTHONPATH``: its ``sitecustomize`` reports Paddle's memory peaks."""

OUTPUT_DIR_ENV = "AUTODL_OUTPUT_DIR"
"""The run's output folder (checkpoints), set by the pipeline (:data:`autodl.steps.context.OUTPUT_DIR_ENV`): kept
writable in the training's namespaces though it lies in autodl's home."""

ATTEMPT_ENV = "AUTODL_ATTEMPT_ID"
"""Variable every process of an attempt inherits (the attempt's exit file path): how its processes are
found again, whatever session or parent they ended up in."""


DISK_FULL = (errno.ENOSPC, errno.EDQUOT)
"""``errno`` values of a full disk or an exhausted quota: a launch that meets one says so (autodl's error), not a
traceback."""

RUN_KEY_FILE = "run_key"
"""File in a run folder holding the full run key the folder belongs to."""

STATUS_DIR = "status"
"""Folder in a run folder holding the attempts' exit files: bound read-only into the training's namespaces."""


def run_dir_name(run_key: str) -> str:
    """The folder name of ``run_key``'s run: ``<readable prefix>-<first 20 hex digits of its SHA-256>``.

    The prefix (at most 60 file-name-safe characters) is for people; the hash keeps two run keys apart that
    differ only in characters the prefix replaces or after its 60th character (2**80 values: a collision
    needs ~10**12 run keys). Never longer than 81 bytes, so any run key fits a file name.
    """
    prefix = re.sub(r"[^A-Za-z0-9_.-]+", "_", run_key)[:60].strip("._") or "run"
    return f"{prefix}-{hashlib.sha256(run_key.encode('utf-8', 'surrogatepass')).hexdigest()[:20]}"


def run_folder(base: str | Path, run_key: str, *, create: bool = True) -> Path:
    """The folder of ``run_key`` under ``base``, holding the run key it belongs to (written on creation).

    :raises LaunchError: when the folder holds another run key (a hash collision or a folder edited by hand):
        reattaching there would follow, and stop, another run's training.
    """
    folder = Path(base) / run_dir_name(run_key)
    marker = folder / RUN_KEY_FILE
    if create:
        folder.mkdir(parents=True, exist_ok=True, mode=0o700)
        try:  # the run's own: logs, reports and outputs are its owner's (the worker's uid) only
            os.chmod(folder, 0o700)
        except OSError:
            pass
        if not marker.exists():
            tmp = folder / f".{RUN_KEY_FILE}.{os.getpid()}.tmp"
            tmp.write_text(run_key, encoding="utf-8", errors="surrogatepass")
            os.replace(tmp, marker)
    check_run_folder(folder, run_key)
    return folder


def check_run_folder(folder: Path, run_key: str) -> None:
    """:raises LaunchError: when ``folder`` records a run key other than ``run_key``."""
    marker = Path(folder) / RUN_KEY_FILE
    try:
        recorded = marker.read_text(encoding="utf-8", errors="surrogatepass")
    except FileNotFoundError:
        return
    except OSError as exc:
        raise LaunchError(f"run folder {folder}: cannot read its {RUN_KEY_FILE} ({exc.strerror}); fix its permissions.") from None
    if recorded != run_key:
        raise LaunchError(f"run folder {folder} belongs to run {redact_text(recorded)[:200]!r}, not {redact_text(run_key)[:200]!r}; "
                          "refusing to reattach to (or stop) another run's training. Move that folder away.")


TRAINING_ENV_NAMES = frozenset({
    "PATH", "HOME", "USER", "LOGNAME", "SHELL", "TERM", "TZ", "TMPDIR", "LANG", "LANGUAGE",
    "PYTHONPATH", "PYTHONHOME", "PYTHONUNBUFFERED", "PYTHONIOENCODING", "PYTHONHASHSEED", "VIRTUAL_ENV",
    "CONDA_PREFIX", "CONDA_DEFAULT_ENV", "LD_LIBRARY_PATH",
    "OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS", "NUMEXPR_NUM_THREADS",
    "AUTODL_PEAK_HOOK",
})
"""Variables of the worker's environment a training may inherit: what Python, Paddle and the CUDA libraries
need to start (search paths, locale, threads), and ``AUTODL_PEAK_HOOK`` (``0`` turns the child-side memory
peak hook off, :mod:`autodl.launch.child_path`)."""

TRAINING_ENV_PREFIXES = ("LC_", "CUDA_", "CUDNN_", "NCCL_", "NVIDIA_", "FLAGS_", "PADDLE_", "GLOG_", "KMP_", "MKL_",
                         "XPU_", "BKCL_", "ASCEND_", "HCCL_", "HIP_", "ROCR_", "HSA_", "MIOPEN_", "RCCL_")
"""Prefixes of inherited variables: CUDA/cuDNN/NCCL, NVIDIA's container variables, Paddle's ``FLAGS_*`` and
``PADDLE_*`` (https://www.paddlepaddle.org.cn/documentation/docs/en/guides/flags/flags_en.html), glog, Intel
OpenMP/MKL, and the other vendors' runtimes (Kunlun XPU/BKCL, Ascend/HCCL, ROCm/HIP/RCCL)."""


def training_environment(inherited: Mapping[str, str], added: Mapping[str, str]) -> dict[str, str]:
    """The whole environment of a local training: the allow-listed part of ``inherited`` plus ``added``.

    ``inherited`` (the worker's environment) contributes only :data:`TRAINING_ENV_NAMES` and
    :data:`TRAINING_ENV_PREFIXES`, never a secret-named variable (``*PASSWORD*``, ``*TOKEN*``, ``*KEY*``, ...)
    nor anything of autodl's (``AUTODL_*``: the store URL) or Airflow's (``AIRFLOW*``). ``added`` (pinning,
    autodl's contract variables, the spec's ``launcher.env``) is passed as given: it is what the run asked for.
    """
    env = {
        name: value for name, value in inherited.items()
        if not is_secret_name(name) and (name in TRAINING_ENV_NAMES or (
            name.startswith(TRAINING_ENV_PREFIXES) and not name.startswith(("AUTODL_", "AIRFLOW"))))
    }
    env.update(added)
    return env


def previous_attempt(handle_file: Path, log_path: str | None) -> int:
    """The attempt number of the handle in ``handle_file``, from its log (``attempt-N.log``); 0 without a log.

    :raises LaunchError: when the log's name holds no attempt number (the handle was not written by this launcher).
    """
    match = re.search(r"attempt-(\d+)", log_path or "attempt-0")
    if match is None:
        raise LaunchError(f"{handle_file}: its log_path {redact_text(log_path or '')[:200]!r} names no attempt "
                          "(attempt-N.log), so the next attempt's number is unknown; the handle was not written by "
                          "autodl's local launcher: move the run folder away.")
    return int(match.group(1))


def _ignores(pid: int, sig: int) -> bool:
    """Whether process ``pid`` ignores ``sig`` now (the ``SigIgn`` mask of ``/proc/PID/status``, proc(5)); False
    when that cannot be read (the process is gone, or not Linux)."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("SigIgn:"):
                return bool(int(line.split()[1], 16) >> (sig - 1) & 1)
    except (OSError, ValueError, IndexError):
        pass
    return False


class LocalLauncher:
    """Runs ``python script`` (or ``python -m paddle.distributed.launch``) in a new process group.

    :param base_dir: where run folders go; default ``$AUTODL_HOME/runs``.
    """

    name = "local"
    options = LocalOptions

    def __init__(self, base_dir: str | Path | None = None, *, stop_grace_s: float = STOP_GRACE_S, **_ignored: Any):
        self.base_dir = Path(base_dir) if base_dir else autodl_home() / "runs"
        self.stop_grace_s = stop_grace_s

    # -------------------------------------------------------------------------------- helpers
    def run_dir(self, run_key: str) -> Path:
        """The run's folder (created, holding its run key); see :func:`run_folder`."""
        return run_folder(self.base_dir, run_key)

    @staticmethod
    def _user_env(request: LaunchRequest) -> dict[str, str]:
        """What the run itself asked for: the spec's ``launcher.env`` and ``request.env``."""
        user_env = request.options.get("env") if isinstance(request.options, dict) else None
        return {**{str(k): str(v) for k, v in (user_env or {}).items()}, **request.env}

    def environment(self, request: LaunchRequest) -> dict[str, str]:
        """Variables added to the training's environment: the spec's ``launcher.env``, pinning, Paddle device,
        run identity. The rest of its environment is the allow-listed part of this process's (see
        :func:`training_environment`)."""
        env = self._user_env(request)
        env.update(memory_cap(request, env)[0])  # a packed run's share of its device; the lower of it and the user's
        env.update(pinning_env(request))
        if request.on_cpu or not request.devices:
            env["AUTODL_PADDLE_DEVICE"] = "cpu"
        elif request.vendor is not None:
            env["AUTODL_PADDLE_DEVICE"] = request.vendor.paddle_device
        env["AUTODL_RUN_KEY"] = request.run_key
        if request.labels.get("lease_id"):
            env["AUTODL_LEASE_ID"] = request.labels["lease_id"]
        if request.vendor is not None:  # which variable maps Paddle's place to a device id, for the peak hook
            env["AUTODL_VISIBLE_ENV"] = request.vendor.visible_devices_env
        prior = env.get("PYTHONPATH", os.environ.get("PYTHONPATH", ""))
        env["PYTHONPATH"] = CHILD_PATH + (os.pathsep + prior if prior else "")
        return env

    def _next_attempt(self, folder: Path) -> int:
        handle_file = folder / "handle.json"
        if not handle_file.exists():
            return 1
        previous = LaunchHandle.model_validate_json(handle_file.read_text())
        return previous_attempt(handle_file, previous.log_path) + 1

    def render(self, request: LaunchRequest) -> dict[str, Any]:
        """What would run, for ``autodl plan --json`` and logs: argv, the variables autodl sets (secret-named
        values shown as ``***``) and a shell line."""
        folder = self.run_dir(request.run_key)
        argv = training_command(request, log_dir=str(folder / f"attempt-{self._next_attempt(folder)}.ranks"))
        env = redact_env(self.environment(request))
        return {"launcher": self.name, "command": argv, "env": env, "shell": shell_line(argv, env),
                "workdir": request.workdir or str(request.script_path.parent)}

    # ------------------------------------------------------------------------------ protocol
    def launch(self, request: LaunchRequest) -> LaunchHandle:
        """Start the training detached, or reattach to the attempt still running.

        :raises LaunchError: when the script is missing or the process cannot be started.
        """
        if not request.script_path.is_file():
            raise LaunchError(f"training script {request.script} does not exist; check task.script in the spec.")
        try:
            return self._launch(request)
        except OSError as exc:
            if exc.errno not in DISK_FULL:
                raise
            raise LaunchError(f"no space left on the disk holding {self.base_dir} ({exc.strerror}): the run's folder "
                              "(its log, handle and exit code) could not be written there (autodl's home, $AUTODL_HOME); "
                              "free space there and retry. Nothing was started, and what earlier attempts wrote is "
                              "as it was.") from None

    def _launch(self, request: LaunchRequest) -> LaunchHandle:
        folder = self.run_dir(request.run_key)
        folder.mkdir(parents=True, exist_ok=True)
        with open(folder / "launch.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            handle_file = folder / "handle.json"
            running, attempt = self._running_or_next_attempt(request, folder, handle_file)
            if running is not None:
                return running.model_copy(update={"reattached": True})
            log_path = folder / f"attempt-{attempt}.log"
            status = folder / STATUS_DIR
            status.mkdir(mode=0o700, exist_ok=True)
            exit_path = status / f"attempt-{attempt}.exit"
            argv = training_command(request, log_dir=str(folder / f"attempt-{attempt}.ranks"))
            added = self.environment(request)
            steps_path = folder / f"attempt-{attempt}.steps.jsonl"
            added["AUTODL_METRICS_FILE"] = str(steps_path)
            added[ATTEMPT_ENV] = str(exit_path)
            added["AUTODL_STOP_GRACE_S"] = f"{self.stop_grace_s:g}"
            env = training_environment(os.environ, added)
            workdir = request.workdir or str(request.script_path.parent)
            iso = self._isolation(request, folder, workdir, env, status)
            wrapper = [request.python, _runner_module.__file__, str(exit_path), "--", *iso.prefix, *argv]
            proc = self._start_runner(request, wrapper, workdir, env, log_path, iso.note, argv)
            self._reaped.pop(proc.pid, None)  # a reused pid is a new process
            self._wait_for_exec(proc, str(exit_path))
            visible = added.get(request.vendor.visible_devices_env) if request.vendor else None
            handle = LaunchHandle(
                launcher=self.name, run_key=request.run_key, lease_id=request.labels.get("lease_id"),
                pid=proc.pid, pgid=proc.pid, log_path=str(log_path), exit_path=str(exit_path), steps_path=str(steps_path),
                command=argv, visible_devices=visible, device_ids=[d.device_id for d in request.devices],
                on_cpu=request.on_cpu or not request.devices,
            )
            try:
                atomic_write_text(handle_file, json.dumps(handle.to_json()))
            except OSError:  # a training no later task could find again must not run
                self.stop(handle)
                raise
            return handle

    def _running_or_next_attempt(self, request: LaunchRequest, folder: Path,
                                 handle_file: Path) -> tuple[LaunchHandle | None, int]:
        """(the run's attempt still running, else None; the number of the attempt to start), from ``handle.json``."""
        attempt = 1
        if handle_file.exists():
            previous = LaunchHandle.model_validate_json(handle_file.read_text())
            if previous.run_key != request.run_key:
                raise LaunchError(f"run folder {folder} holds a handle of run {redact_text(previous.run_key)[:200]!r}, "
                                  f"not {redact_text(request.run_key)[:200]!r}; refusing to reattach to another run's "
                                  "training. Move that folder away.")
            if self.poll(previous) is None:
                return previous, attempt
            attempt = previous_attempt(handle_file, previous.log_path) + 1
        return None, attempt

    def _isolation(self, request: LaunchRequest, folder: Path, workdir: str, env: dict[str, str],
                   status: Path) -> Isolation:
        """The training's isolation (what it may see and write), its output folder first made its owner's only."""
        if env.get(OUTPUT_DIR_ENV) and Path(env[OUTPUT_DIR_ENV]).is_dir():
            try:  # the run's checkpoints are its owner's only, like its folder
                os.chmod(env[OUTPUT_DIR_ENV], 0o700)
            except OSError:
                pass
        return training_isolation(
            run_folder=folder, workdir=Path(workdir), python=request.python,
            keep=[request.script_path.parent, Path(CHILD_PATH), *python_dirs(), Path(request.python).resolve().parent.parent],
            writable=[Path(env[OUTPUT_DIR_ENV])] if env.get(OUTPUT_DIR_ENV) else [],
            devices=request.devices, vendor=request.vendor, on_cpu=request.on_cpu,
            read_only=[Path(p) for p in env.get("PYTHONPATH", "").split(os.pathsep) if p], training_env=env,
            read_only_after=[status])

    def _start_runner(self, request: LaunchRequest, wrapper: list[str], workdir: str, env: dict[str, str],
                      log_path: Path, isolation_note: str | None, argv: list[str]) -> psutil.Popen:
        """Start the runner detached in a new session, its output appended to the attempt's log after autodl's notes."""
        try:
            with open(log_path, "ab") as log:
                for note in [isolation_note, *memory_cap(request, self._user_env(request))[1]]:
                    if note:
                        log.write(f"autodl: {note}\n".encode())
                        logger.info("%s", note)
                log.flush()
                return psutil.Popen(wrapper, cwd=workdir, env=env, stdout=log, stderr=log,
                                    stdin=open(os.devnull), start_new_session=True)
        except OSError as exc:
            if exc.errno in DISK_FULL:
                raise
            raise LaunchError(f"could not start {argv[0]}: {exc}; check the Python interpreter and workdir {workdir}.") from exc

    def _wait_for_exec(self, proc: psutil.Popen, exit_path: str, limit_s: float = 10.0) -> None:
        """Return once the new process runs the runner (its command line names ``exit_path``) or has ended.

        Between fork and exec the child still shows the parent's command line, and :meth:`_alive` (which
        recognises the runner by it) would take a training polled in that instant for one that vanished
        (exit code 137). ``limit_s`` bounds the wait on a machine too loaded to exec in time.
        """
        deadline = time.monotonic() + limit_s
        while time.monotonic() < deadline:
            try:
                code = proc.poll()
                if code is not None:  # reaped here: keep its status for poll()
                    self._reaped[proc.pid] = code
                    return
                if any(exit_path in part for part in proc.cmdline()):
                    return
            except (psutil.NoSuchProcess, psutil.ZombieProcess, psutil.AccessDenied):
                return
            time.sleep(0.005)

    _reaped: dict[int, int] = {}
    """Exit codes of runner processes this process reaped itself (pid -> code): when the launching process
    is also the one that polls (tests, ``airflow dags test``), the runner's own exit status is known even
    if its exit file could not be written."""

    def _alive(self, handle: LaunchHandle) -> bool:
        if handle.pid is None:
            return False
        if handle.pid in self._reaped:
            return False
        try:
            pid, status = os.waitpid(handle.pid, os.WNOHANG)  # reap if it is our own child
            if pid == handle.pid:
                self._reaped[pid] = os.waitstatus_to_exitcode(status)
                return False
        except ChildProcessError:
            pass
        try:
            proc = psutil.Process(handle.pid)
            if proc.status() == psutil.STATUS_ZOMBIE:
                return False
            cmdline = proc.cmdline()
            if not cmdline:  # just forked and still exec'ing: /proc/PID/cmdline is briefly empty
                return True
            return any(handle.exit_path and handle.exit_path in part for part in cmdline)
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            return False

    def poll(self, handle: LaunchHandle) -> int | None:
        """Exit code of the attempt, or None while any of its processes runs.

        While the runner wrapper lives, or any process carrying the attempt's :data:`ATTEMPT_ENV` (ranks it left
        behind), the attempt runs, whatever any file says. Then the code is the wrapper's own exit status where
        this process reaped it (``waitpid``), else the exit file the wrapper wrote once every process of the
        attempt had ended; a wrapper that vanished without writing it (SIGKILLed) counts as 137, and an
        unreadable exit file as 255 (a failure, never a success).
        """
        if self._alive(handle) or self._attempt_processes(handle):
            return None
        if handle.pid in self._reaped:  # our own child: its status from waitpid
            code = self._reaped[handle.pid]
            return 128 - code if code < 0 else code
        return self._exit_file_code(handle)

    @staticmethod
    def _exit_file_code(handle: LaunchHandle) -> int:
        try:
            text = read_bytes(handle.exit_path or "", 32).decode("ascii", errors="replace").strip()
        except FileNotFoundError:
            return 128 + signal.SIGKILL
        except OSError:
            return 255
        return int(text) if text.isdigit() and int(text) < 256 else 255

    def ended_at(self, handle: LaunchHandle) -> float | None:
        """When the attempt ended (epoch seconds): its exit file's modification time, written by the runner once
        every process of the attempt was gone; None while it runs or when the file is not there."""
        try:
            return Path(handle.exit_path).stat().st_mtime if handle.exit_path else None
        except OSError:
            return None

    def read_logs(self, handle: LaunchHandle, offset: int = 0) -> tuple[str, int]:
        try:   # the training's own log: no links or FIFOs, a bounded chunk per poll (issue 23)
            data = read_bytes(handle.log_path or "", LOG_CHUNK_BYTES, offset)
        except OSError:
            return "", offset
        return data.decode("utf-8", errors="replace"), offset + len(data)

    def _attempt_processes(self, handle: LaunchHandle) -> list[psutil.Process]:
        """Live processes carrying the attempt's :data:`ATTEMPT_ENV` (found whatever their session or parent)."""
        if not handle.exit_path:
            return []
        found = []
        me = os.getpid()
        uid = os.getuid()
        for proc in psutil.process_iter(["uids"]):
            try:
                if proc.pid == me or (uid != 0 and proc.info["uids"] and proc.info["uids"].real != uid):
                    continue
                if proc.environ().get(ATTEMPT_ENV) == handle.exit_path and proc.status() != psutil.STATUS_ZOMBIE:
                    found.append(proc)
            except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess, OSError):
                continue
        return found

    def processes(self, handle: LaunchHandle) -> list[psutil.Process]:
        """Every live process of the attempt: the wrapper, its descendants (a subreaper keeps orphaned
        ranks among them) and any process carrying the attempt's :data:`ATTEMPT_ENV`."""
        procs: dict[int, psutil.Process] = {}
        if handle.pid is not None and self._alive(handle):
            try:
                root = psutil.Process(handle.pid)
                procs[root.pid] = root
                for child in root.children(recursive=True):
                    procs[child.pid] = child
            except (psutil.NoSuchProcess, psutil.AccessDenied):
                pass
        for proc in self._attempt_processes(handle):
            procs.setdefault(proc.pid, proc)
        return list(procs.values())

    @staticmethod
    def _signal(procs: list[psutil.Process], sig: int) -> None:
        groups = set()
        for proc in procs:
            try:
                groups.add(os.getpgid(proc.pid))
                proc.send_signal(sig)
            except (psutil.NoSuchProcess, psutil.AccessDenied, ProcessLookupError):
                continue
        for pgid in groups:  # ranks in their own sessions are group leaders: reach their helpers too
            if pgid in (os.getpgid(0),):
                continue
            try:
                os.killpg(pgid, sig)
            except (ProcessLookupError, PermissionError):
                continue

    def _terminate(self, handle: LaunchHandle, procs: list[psutil.Process]) -> dict[int, psutil.Process]:
        """SIGTERM to ``procs`` and their process groups, then, until they are gone or ``stop_grace_s`` has passed,
        to each process of the attempt that did not get it yet and does not ignore it: the training inside
        bubblewrap starts after the sandbox (whose shim ignores SIGTERM, :data:`autodl.launch.isolation.IGNORE_STOP`)
        and ignores it until its own shim restores it, so a stop right after the launch reached no one (seen under
        load: the training ran the whole grace period and was SIGKILLed, exit 137).

        :returns: the attempt's processes still alive when the grace period ended (pid -> process).
        """
        delivered = {p.pid for p in procs if not _ignores(p.pid, signal.SIGTERM)}
        self._signal(procs, signal.SIGTERM)
        deadline = time.monotonic() + self.stop_grace_s
        while True:
            alive = self.processes(handle)
            if not alive or time.monotonic() >= deadline:
                return {p.pid: p for p in alive}
            for proc in alive:
                if proc.pid not in delivered and not _ignores(proc.pid, signal.SIGTERM):
                    try:
                        proc.send_signal(signal.SIGTERM)
                        delivered.add(proc.pid)
                    except psutil.Error:
                        continue
            psutil.wait_procs(alive, timeout=STOP_POLL_S)

    def stop(self, handle: LaunchHandle) -> None:
        """End every process of the attempt: SIGTERM to each (and to each process group among them:
        ``paddle.distributed.launch`` starts every rank in its own session, so the wrapper's group alone
        misses them), SIGKILL after ``stop_grace_s`` to whatever is left, and wait until none is alive.
        Idempotent; records the signal as the exit code when the wrapper could not."""
        procs = self.processes(handle)
        if not procs:
            return
        code = 128 + signal.SIGTERM
        left = self._terminate(handle, procs)
        while left:
            code = 128 + signal.SIGKILL
            self._signal(list(left.values()), signal.SIGKILL)
            psutil.wait_procs(list(left.values()), timeout=5)
            left = {p.pid: p for p in self.processes(handle)}
        if handle.pid is not None:
            self._alive(handle)  # reap the wrapper if it is our own child
        exit_path = Path(handle.exit_path or "")
        if handle.exit_path and not exit_path.exists():
            # the wrapper died with the group before it could write the code: record the signal we sent
            try:
                exit_path.write_text(str(int(code)))
            except OSError:  # a full disk: poll() then says 137 (ended, by a signal), never "running"
                pass
