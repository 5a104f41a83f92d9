"""Fixtures shared by the tests of autodl's core: the ``autodl`` command run in the test's own process."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.cli_helpers import CliResult, run_cli

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def autodl(capsys):
    """``autodl ARGS`` in this process, from the checkout (exit 0 asserted unless ``check=False``)."""

    def run(*args: str, check: bool = True) -> CliResult:
        proc = run_cli(capsys, *args, cwd=REPO)
        if check:
            assert proc.returncode == 0, proc.stderr
        return proc

    return run
