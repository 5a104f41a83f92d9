"""Process wrapper used by the local launcher: runs the training, then writes its exit code to a file.

Details: docs/launchers.md#autodllaunchrunner.
"""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys
import time

PR_SET_CHILD_SUBREAPER = 36
"""``prctl`` option number (linux/prctl.h)."""

PR_SET_PDEATHSIG = 1
"""``prctl`` option number (linux/prctl.h): the signal a process gets when its parent dies."""


def die_with_parent() -> None:
    """In the training's command, between fork and exec: SIGKILL it when this wrapper dies (prctl(2)), so a
    training that kills its wrapper (possible without bubblewrap's PID namespace) goes with it instead of
    running on unaccounted for. Kept across ``execve``; a process it forks does not inherit it, and a hostile
    training may clear it: only bubblewrap's namespaces are a bound it cannot lift (``docs/security.md``)."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    except (OSError, AttributeError):
        pass


def become_subreaper() -> bool:
    """Make this process the reaper of its orphaned descendants; False where the kernel refuses (not Linux)."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def _live_descendants() -> list:
    import psutil

    try:
        return [p for p in psutil.Process().children(recursive=True) if p.status() != psutil.STATUS_ZOMBIE]
    except psutil.Error:
        return []


def _reap_exited() -> bool:
    """Reap every child that has exited; :returns: False when this process has no child left at all."""
    while True:
        try:
            pid, _status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return False
        if pid == 0:
            return True


def end_leftovers(grace_s: float, poll_s: float = 0.05) -> int:
    """End every process the training left, and return only when none is left.

    Each live descendant gets SIGTERM, SIGKILL once ``grace_s`` seconds have passed since the first SIGTERM;
    every child is reaped until ``waitpid`` says there is none (``ECHILD``). As a child subreaper, every orphan
    of the training — a double-forked daemon in a session of its own, the processes of a bubblewrap PID
    namespace being torn down — is this process's child until it is gone, so an empty ``waitpid`` means no
    process of the attempt is left.

    :returns: how many processes were signalled.
    """
    import psutil

    signalled: set[int] = set()
    first: float | None = None
    while _reap_exited():
        left = _live_descendants()
        fresh = [p for p in left if p.pid not in signalled]
        if fresh and first is None:
            first = time.monotonic()
        late = first is not None and time.monotonic() - first >= grace_s
        for proc in left if late else fresh:
            try:
                proc.kill() if late else proc.terminate()
            except psutil.Error:
                pass
            signalled.add(proc.pid)
        time.sleep(poll_s)
    return len(signalled)


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) < 3 or args[1] != "--":
        print("usage: python -m autodl.launch.runner EXIT_FILE -- COMMAND [ARGS...]", file=sys.stderr)
        return 2
    exit_file, command = args[0], args[2:]
    child: subprocess.Popen | None = None
    received: list[int] = []
    forwarded: list[int] = []

    def send(signum: int) -> None:
        forwarded.append(signum)
        try:
            child.send_signal(signum)  # type: ignore[union-attr]
        except ProcessLookupError:
            pass

    def forward(signum, _frame):
        received.append(signum)
        if child is not None:
            send(signum)

    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, forward)
    become_subreaper()
    if received:  # stopped before the training started
        code = 128 + received[0]
    else:
        os.umask(0o077)  # what the training writes (logs, checkpoints, its report) is its owner's only
        child = subprocess.Popen(command, preexec_fn=die_with_parent)
        if len(received) > len(forwarded):  # a stop that came while the child was being started reached no one
            send(received[-1])
        code = child.wait()
    if code < 0:
        code = 128 - code
    try:
        grace = float(os.environ.get("AUTODL_STOP_GRACE_S", "10"))
    except ValueError:
        grace = 10.0
    left = end_leftovers(grace)
    if left:
        print(f"autodl: the training's command ended; {left} process(es) it left behind were stopped", file=sys.stderr,
              flush=True)
    tmp = exit_file + ".tmp"
    try:
        with open(tmp, "w") as fh:
            fh.write(str(code))
        os.replace(tmp, exit_file)
    except OSError as exc:  # a full disk: the launcher then reads this process's own exit status, or 137
        print(f"autodl: could not write the exit code {code} to {exit_file} ({exc.strerror})", file=sys.stderr,
              flush=True)
    return code


if __name__ == "__main__":
    sys.exit(main())
