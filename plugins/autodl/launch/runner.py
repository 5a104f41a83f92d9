"""Process wrapper used by the local launcher: runs the training, then writes its exit code to a file.

The local launcher starts ``python -m autodl.launch.runner EXIT_FILE -- argv...`` as the leader of a
new process group, detached from the Airflow task that started it, so a later task (or try) can
learn the exit code after the launching process is gone. Signals sent to the group reach the
training; a training killed by signal N is recorded as exit code 128 + N (the shell convention).

The wrapper makes itself a *child subreaper* (Linux ``prctl(PR_SET_CHILD_SUBREAPER)``, see
prctl(2)): processes the training leaves behind — ranks ``paddle.distributed.launch`` started in
their own sessions, a DataLoader worker whose parent died — are re-parented to it instead of to
init. When the training's command has ended, whatever of it is still alive gets SIGTERM, SIGKILL
after ``$AUTODL_STOP_GRACE_S`` seconds, and only then is the exit code written: an attempt is over
when all of its processes are.
"""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys

PR_SET_CHILD_SUBREAPER = 36
"""``prctl`` option number (linux/prctl.h)."""


def become_subreaper() -> bool:
    """Make this process the reaper of its orphaned descendants; False where the kernel refuses (not Linux)."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def end_leftovers(grace_s: float) -> int:
    """SIGTERM every remaining descendant, SIGKILL after ``grace_s``; :returns: how many there were."""
    try:
        import psutil
    except ImportError:  # pragma: no cover - psutil is a dependency
        return 0
    me = psutil.Process()
    left = [p for p in me.children(recursive=True) if p.status() != psutil.STATUS_ZOMBIE]
    if not left:
        for p in me.children():  # reap zombies
            try:
                p.wait(0)
            except Exception:  # noqa: BLE001
                pass
        return 0
    for p in left:
        try:
            p.terminate()
        except psutil.NoSuchProcess:
            pass
    _gone, alive = psutil.wait_procs(left, timeout=grace_s)
    while alive:
        for p in alive:
            try:
                p.kill()
            except psutil.NoSuchProcess:
                pass
        _gone, alive = psutil.wait_procs(alive, timeout=5)
        alive += [p for p in me.children(recursive=True) if p.pid not in {a.pid for a in alive}]
    return len(left)


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) < 3 or args[1] != "--":
        print("usage: python -m autodl.launch.runner EXIT_FILE -- COMMAND [ARGS...]", file=sys.stderr)
        return 2
    exit_file, command = args[0], args[2:]
    child: subprocess.Popen | None = None
    received: list[int] = []

    def forward(signum, _frame):
        received.append(signum)
        if child is not None:
            try:
                child.send_signal(signum)
            except ProcessLookupError:
                pass

    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, forward)
    become_subreaper()
    if received:  # stopped before the training started
        code = 128 + received[0]
    else:
        os.umask(0o077)  # what the training writes (logs, checkpoints, its report) is its owner's only
        child = subprocess.Popen(command)
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
    with open(tmp, "w") as fh:
        fh.write(str(code))
    os.replace(tmp, exit_file)
    return code


if __name__ == "__main__":
    sys.exit(main())
