"""Local launcher: the training as a detached process group on this host, pinned by the vendor's visibility variable.

Layout of one run's folder (``$AUTODL_HOME/runs/<run key>/``)::

    handle.json          the current attempt's LaunchHandle
    attempt-N.log        stdout+stderr of attempt N
    attempt-N.exit       its exit code, written by the runner wrapper when it ends
    attempt-N.steps.jsonl  per-step reports the training may write to $AUTODL_METRICS_FILE
    launch.lock          serialises concurrent launches of the same run key

A launch while the current attempt still runs reattaches to it (``reattached=True``) instead of
starting a second copy; a launch after it ended starts attempt N+1.
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


def run_dir_name(run_key: str) -> str:
    """A file-system safe folder name for ``run_key``."""
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", run_key)[:200]


class LocalLauncher:
    """Runs ``python script`` (or ``python -m paddle.distributed.launch``) in a new process group.

    :param base_dir: where run folders go; default ``$AUTODL_HOME/runs``.
    """

    name = "local"

    def __init__(self, base_dir: str | Path | None = None, **_ignored: Any):
        self.base_dir = Path(base_dir) if base_dir else autodl_home() / "runs"

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
        return env

    def render(self, request: LaunchRequest) -> dict[str, Any]:
        argv = training_command(request)
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
            argv = training_command(request)
            added = self.environment(request)
            steps_path = folder / f"attempt-{attempt}.steps.jsonl"
            added["AUTODL_METRICS_FILE"] = str(steps_path)
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
            return any(handle.exit_path and handle.exit_path in part for part in proc.cmdline())
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            return False

    def poll(self, handle: LaunchHandle) -> int | None:
        """Exit code of the attempt, or None while it runs. A process that vanished without
        writing its exit code (the wrapper was SIGKILLed) counts as exit code 137."""
        exit_path = Path(handle.exit_path or "")
        if exit_path.is_file():
            return int(exit_path.read_text().strip() or 255)
        if self._alive(handle):
            return None
        if exit_path.is_file():  # ended between the two checks
            return int(exit_path.read_text().strip() or 255)
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

    def stop(self, handle: LaunchHandle) -> None:
        """SIGTERM the process group, SIGKILL after :data:`STOP_GRACE_S`. Idempotent."""
        if handle.pgid is None or not self._alive(handle):
            return
        code = 128 + signal.SIGTERM
        try:
            os.killpg(handle.pgid, signal.SIGTERM)
        except ProcessLookupError:
            return
        deadline = time.monotonic() + STOP_GRACE_S
        while time.monotonic() < deadline and self._alive(handle):
            time.sleep(0.1)
        if self._alive(handle):
            code = 128 + signal.SIGKILL
            try:
                os.killpg(handle.pgid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            while self._alive(handle):
                time.sleep(0.05)
        exit_path = Path(handle.exit_path or "")
        if handle.exit_path and not exit_path.exists():
            # the wrapper died with the group before it could write the code: record the signal we sent
            exit_path.write_text(str(int(code)))
