"""`autodl ARGS` run in the test's own process, for tests: the exit status, stdout and stderr a user would see,
without starting a fresh interpreter per call (about a second each). What ``main`` changes in the process (the
SIGTERM handler, its argument list, ``sys.argv``) and what a call sets (environment, working folder) are put back
after each call. A few smoke tests still run the console entry point as a real process (marked ``slow``)."""

from __future__ import annotations

import logging
import signal
import sys
import traceback
from collections.abc import Mapping
from pathlib import Path
from typing import NamedTuple, Protocol

import pytest


class Captured(Protocol):
    """pytest's ``capsys`` or ``capfd`` fixture (``capfd`` also sees what child processes write)."""

    def readouterr(self) -> tuple[str, str]: ...


class CliResult(NamedTuple):
    """What one ``autodl`` command gave: named like :class:`subprocess.CompletedProcess`, unpacks as a tuple."""

    returncode: int
    stdout: str
    stderr: str


def _exit_status(exc: SystemExit) -> int:
    """The status the interpreter would exit with for ``exc`` (argparse's usage errors raise SystemExit(2));
    a message instead of a number is printed to stderr and is status 1, as ``sys.exit("...")`` does."""
    if exc.code is None:
        return 0
    if isinstance(exc.code, int):
        return exc.code
    print(exc.code, file=sys.stderr)
    return 1


def run_cli(capture: Captured, *args: str, env: Mapping[str, str | None] | None = None,
            cwd: Path | str | None = None) -> CliResult:
    """Run ``autodl ARGS`` through :func:`autodl.cli.main` in this process.

    :param capture: ``capsys`` (or ``capfd``); what was captured before the call is dropped.
    :param env: variables set for this call only (None: unset).
    :param cwd: the working folder for this call only.
    :returns: the exit status and the text on stdout and stderr. An exception ``main`` lets through is a
        traceback on stderr and status 1, as in a real process. Warnings logged by autodl reach stderr as in a
        process without logging configured (Python's last-resort handler; pytest's own handlers hide it).
    """
    from autodl import cli

    capture.readouterr()
    sigterm, argv, root, last = signal.getsignal(signal.SIGTERM), list(cli._ARGV), logging.getLogger(), logging.lastResort
    if last is not None:
        root.addHandler(last)
    try:
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(sys, "argv", ["autodl", *args])
            for name, value in (env or {}).items():
                mp.delenv(name, raising=False) if value is None else mp.setenv(name, value)
            if cwd is not None:
                mp.chdir(cwd)
            try:
                code = cli.main(list(args))
            except SystemExit as exc:
                code = _exit_status(exc)
            except Exception:  # noqa: BLE001 - what a real process does with it: the test reads it
                traceback.print_exc()
                code = 1
    finally:
        if last is not None:
            root.removeHandler(last)
        signal.signal(signal.SIGTERM, sigterm)
        cli._ARGV[:] = argv
    out, err = capture.readouterr()
    return CliResult(code, out, err)
