"""Local launcher: the training as a detached process group on this host, pinned by the vendor's visibility variable.

Layout of one run's folder (``$AUTODL_HOME/runs/<run key>/``)::

    handle.json          the current attempt's LaunchHandle
    attempt-N.log        stdout+stderr of attempt N
    attempt-N.ranks/     per-rank logs of a distributed attempt (paddle.distributed.launch --log_dir)
    attempt-N.exit       its exit code, written by the runner wrapper when it ends
    attempt-N.steps.jsonl  per-step reports the training may write to $AUTODL_METRICS_FILE, and the
                         memory peaks autodl's start-up hook reports there (:mod:`autodl.metrics`)
    launch.lock          serialises concurrent launches of the same run key

A launch while the current attempt still runs reattaches to it (``reattached=True``) instead of
starting a second copy; a launch after it ended starts attempt N+1.

The training's ``PYTHONPATH`` starts with :data:`CHILD_PATH`, whose ``sitecustomize`` reports the
process's own memory peaks without touching the script. Every process of an attempt carries
``AUTODL_ATTEMPT_ID`` (its exit file's path), and the runner wrapper is a child subreaper: ranks
that ``paddle.distributed.launch`` starts in their own sessions stay findable, so :meth:`LocalLauncher.stop`
ends every one of them, not only the launcher's process group.
"""

from __future__ import annotations

import fcntl
import json
import os
import re
import signal
import time
from pathlib import Path
from typing import Any

import psutil

from autodl.config import autodl_home
from autodl.errors import LaunchError
from autodl.launch import runner as _runner_module
from autodl.launch.base import LaunchRequest, pinning_env, shell_line, training_command
from autodl.types import LaunchHandle

STOP_GRACE_S = 10.0
"""Seconds between SIGTERM and SIGKILL when stopping (Kubernetes' default grace period is 30 s;
a training that checkpoints on SIGTERM should finish within this)."""

CHILD_PATH = str(Path(__file__).resolve().parent / "child_path")
"""Folder put first on the training's ``PYTHONPATH``: its ``sitecustomize`` reports Paddle's memory peaks."""

ATTEMPT_ENV = "AUTODL_ATTEMPT_ID"
"""Variable every process of an attempt inherits (the attempt's exit file path): how its processes are
found again, whatever session or parent they ended up in."""


def run_dir_name(run_key: str) -> str:
    """A file-system safe folder name for ``run_key``."""
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", run_key)[:200]


class LocalLauncher:
    """Runs ``python script`` (or ``python -m paddle.distributed.launch``) in a new process group.

    :param base_dir: where run folders go; default ``$AUTODL_HOME/runs``.
    """

    name = "local"

    def __init__(self, base_dir: str | Path | None = None, *, stop_grace_s: float = STOP_GRACE_S, **_ignored: Any):
        self.base_dir = Path(base_dir) if base_dir else autodl_home() / "runs"
        self.stop_grace_s = stop_grace_s

    # -------------------------------------------------------------------------------- helpers
    def run_dir(self, run_key: str) -> Path:
        return self.base_dir / run_dir_name(run_key)

    def environment(self, request: LaunchRequest) -> dict[str, str]:
        """Variables added to the training's environment: pinning, Paddle device, run identity."""
        env = dict(request.env)
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
        return int(re.search(r"attempt-(\d+)", previous.log_path or "attempt-0").group(1)) + 1

    def render(self, request: LaunchRequest) -> dict[str, Any]:
        folder = self.run_dir(request.run_key)
        argv = training_command(request, log_dir=str(folder / f"attempt-{self._next_attempt(folder)}.ranks"))
        env = self.environment(request)
        return {"launcher": self.name, "command": argv, "env": env, "shell": shell_line(argv, env),
                "workdir": request.workdir or str(request.script_path.parent)}

    # ------------------------------------------------------------------------------ protocol
    def launch(self, request: LaunchRequest) -> LaunchHandle:
        """Start the training detached, or reattach to the attempt still running.

        :raises LaunchError: when the script is missing or the process cannot be started.
        """
        if not request.script_path.is_file():
            raise LaunchError(f"training script {request.script} does not exist; check task.script in the spec.")
        folder = self.run_dir(request.run_key)
        folder.mkdir(parents=True, exist_ok=True)
        with open(folder / "launch.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            handle_file = folder / "handle.json"
            attempt = 1
            if handle_file.exists():
                previous = LaunchHandle.model_validate_json(handle_file.read_text())
                if self.poll(previous) is None:
                    return previous.model_copy(update={"reattached": True})
                attempt = int(re.search(r"attempt-(\d+)", previous.log_path or "attempt-0").group(1)) + 1
            log_path = folder / f"attempt-{attempt}.log"
            exit_path = folder / f"attempt-{attempt}.exit"
            argv = training_command(request, log_dir=str(folder / f"attempt-{attempt}.ranks"))
            added = self.environment(request)
            steps_path = folder / f"attempt-{attempt}.steps.jsonl"
            added["AUTODL_METRICS_FILE"] = str(steps_path)
            added[ATTEMPT_ENV] = str(exit_path)
            added["AUTODL_STOP_GRACE_S"] = f"{self.stop_grace_s:g}"
            env = {**os.environ, **added}
            workdir = request.workdir or str(request.script_path.parent)
            wrapper = [request.python, _runner_module.__file__, str(exit_path), "--", *argv]
            try:
                with open(log_path, "ab") as log:
                    proc = psutil.Popen(wrapper, cwd=workdir, env=env, stdout=log, stderr=log,
                                        stdin=open(os.devnull), start_new_session=True)
            except OSError as exc:
                raise LaunchError(f"could not start {argv[0]}: {exc}; check the Python interpreter and workdir {workdir}.") from exc
            self._reaped.pop(proc.pid, None)  # a reused pid is a new process
            self._wait_for_exec(proc, str(exit_path))
            visible = added.get(request.vendor.visible_devices_env) if request.vendor else None
            handle = LaunchHandle(
                launcher=self.name, run_key=request.run_key, lease_id=request.labels.get("lease_id"),
                pid=proc.pid, pgid=proc.pid, log_path=str(log_path), exit_path=str(exit_path), steps_path=str(steps_path),
                command=argv, visible_devices=visible, device_ids=[d.device_id for d in request.devices],
                on_cpu=request.on_cpu or not request.devices,
            )
            tmp = handle_file.with_suffix(".tmp")
            tmp.write_text(json.dumps(handle.to_json()))
            os.replace(tmp, handle_file)
            return handle

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
        """Exit code of the attempt, or None while it runs. A wrapper that vanished without writing its
        exit code (it was SIGKILLed) counts as exit code 137 — once none of the attempt's processes
        (ranks it left behind included) is alive any more; until then the run still runs."""
        exit_path = Path(handle.exit_path or "")
        if exit_path.is_file():
            return int(exit_path.read_text().strip() or 255)
        if self._alive(handle):
            return None
        if exit_path.is_file():  # ended between the two checks
            return int(exit_path.read_text().strip() or 255)
        if self._attempt_processes(handle):  # the wrapper died but ranks it started live on
            return None
        if handle.pid in self._reaped:  # our own child, and its exit file is missing: its status says why
            code = self._reaped[handle.pid]
            return 128 - code if code < 0 else code
        return 137

    def read_logs(self, handle: LaunchHandle, offset: int = 0) -> tuple[str, int]:
        path = Path(handle.log_path or "")
        if not path.is_file():
            return "", offset
        with open(path, "rb") as fh:
            fh.seek(offset)
            data = fh.read()
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

    def stop(self, handle: LaunchHandle) -> None:
        """End every process of the attempt: SIGTERM to each (and to each process group among them:
        ``paddle.distributed.launch`` starts every rank in its own session, so the wrapper's group alone
        misses them), SIGKILL after ``stop_grace_s`` to whatever is left, and wait until none is alive.
        Idempotent; records the signal as the exit code when the wrapper could not."""
        procs = self.processes(handle)
        if not procs:
            return
        code = 128 + signal.SIGTERM
        self._signal(procs, signal.SIGTERM)
        _gone, alive = psutil.wait_procs(procs, timeout=self.stop_grace_s)
        left = {p.pid: p for p in alive}
        for proc in self.processes(handle):  # started during the grace period
            left.setdefault(proc.pid, proc)
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
            exit_path.write_text(str(int(code)))
