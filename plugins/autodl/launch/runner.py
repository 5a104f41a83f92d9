"""Process wrapper used by the local launcher: runs the training, then writes its exit code to a file.

The local launcher starts ``python -m autodl.launch.runner EXIT_FILE -- argv...`` as the leader of a
new process group, detached from the Airflow task that started it, so a later task (or try) can
learn the exit code after the launching process is gone. Signals sent to the group reach the
training; a training killed by signal N is recorded as exit code 128 + N (the shell convention).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys


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
    if received:  # stopped before the training started
        code = 128 + received[0]
    else:
        child = subprocess.Popen(command)
        code = child.wait()
    if code < 0:
        code = 128 - code
    tmp = exit_file + ".tmp"
    with open(tmp, "w") as fh:
        fh.write(str(code))
    os.replace(tmp, exit_file)
    return code


if __name__ == "__main__":
    sys.exit(main())
