"""Running untrusted user code (the profile's probe and dry run) in a separate, limited, network-less process.

A user's training script never runs in the calling process (the CLI, an Airflow worker). Whatever
autodl executes of it goes through :func:`run_sandboxed`, which starts a fresh process with

* a wall-clock timeout, after which the whole process tree is killed;
* a memory limit (:attr:`SandboxLimits.memory_bytes`);
* no network (a new network namespace), an empty working directory and ``HOME``;
* the tree killed when the call returns, whatever happened (success, timeout, Ctrl-C, SIGTERM).

:func:`isolation` says which mechanism this host allows; the result carries it, and
``SandboxResult.notes`` says what was not available, so the caller can put it in a finding.
"""

from __future__ import annotations

import os
import resource
import shutil
import signal
import subprocess
import time
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Sequence


@dataclass(frozen=True)
class SandboxLimits:
    """Bounds of one sandboxed run.

    :ivar timeout_s: wall-clock seconds before the whole tree is killed.
    :ivar memory_bytes: memory the run may use, bytes.
    :ivar max_processes: processes (and threads) the run may have at once.
    """

    timeout_s: float
    memory_bytes: int
    max_processes: int = 256


@dataclass
class SandboxResult:
    """What a sandboxed run did.

    :ivar returncode: exit status (negative: killed by that signal); None when it was killed on timeout.
    :ivar timed_out: True when :attr:`SandboxLimits.timeout_s` expired and the tree was killed.
    :ivar seconds: wall-clock duration.
    :ivar isolation: the mechanism used (see :func:`isolation`).
    :ivar notes: isolation that was asked for but not available here, one sentence each.
    """

    returncode: int | None
    stdout: str
    stderr: str
    timed_out: bool
    seconds: float
    isolation: str
    notes: list[str] = field(default_factory=list)


@lru_cache(maxsize=1)
def _network_prefix() -> tuple[str, ...] | None:
    exe = shutil.which("unshare")
    if not exe:
        return None
    for flags in (("-n",), ("-rn",)):
        try:
            if subprocess.run([exe, *flags, "true"], capture_output=True, timeout=10).returncode == 0:
                return (exe, *flags)
        except (OSError, subprocess.SubprocessError):
            continue
    return None


def isolation() -> str:
    """The isolation this host allows: ``"unshare-net"`` (a network namespace) or ``"none"``."""
    return "unshare-net" if _network_prefix() else "none"


def _limits(memory_bytes: int, max_processes: int):
    def apply() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (memory_bytes, memory_bytes))
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    return apply


def _kill_tree(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def run_sandboxed(argv: Sequence[str], *, workdir: Path, limits: SandboxLimits, env: dict[str, str],
                  read_only_paths: Sequence[Path] = ()) -> SandboxResult:
    """Run ``argv`` isolated, wait for it within ``limits.timeout_s``, kill its whole tree, return its output.

    :param argv: the command; ``argv[0]`` is usually ``sys.executable``.
    :param workdir: the run's working directory and ``HOME``; the only place it is meant to write.
    :param limits: timeout, memory and process bounds.
    :param env: the complete environment of the child (nothing of the caller's is inherited).
    :param read_only_paths: paths the child must be able to read (the script, the interpreter's
        prefix); used by mechanisms that hide the rest of the file system.
    :returns: the result; a timeout is ``timed_out=True``, never an exception.
    :raises KeyboardInterrupt, SystemExit: re-raised after the tree was killed.
    """
    del read_only_paths  # the network-namespace mechanism leaves the file system as it is
    prefix = _network_prefix()
    notes = [] if prefix else ["no network namespace available (unshare -n failed): the child had network access."]
    t0 = time.monotonic()
    proc = subprocess.Popen([*(prefix or ()), *argv], cwd=workdir, env=dict(env, HOME=str(workdir)),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, errors="replace",
                            preexec_fn=_limits(limits.memory_bytes, limits.max_processes), start_new_session=True)
    timed_out = False
    try:
        out, err = proc.communicate(timeout=limits.timeout_s)
    except subprocess.TimeoutExpired:
        timed_out = True
        _kill_tree(proc)
        out, err = proc.communicate()
    except BaseException:  # Ctrl-C, SIGTERM: never leave the sandbox running
        _kill_tree(proc)
        proc.communicate()
        raise
    finally:
        _kill_tree(proc)
    return SandboxResult(returncode=None if timed_out else proc.returncode, stdout=out or "", stderr=err or "",
                         timed_out=timed_out, seconds=round(time.monotonic() - t0, 3),
                         isolation="unshare-net" if prefix else "none", notes=notes)


__all__ = ["SandboxLimits", "SandboxResult", "isolation", "run_sandboxed"]
