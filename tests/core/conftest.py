"""Fixtures shared by the tests of autodl's core: the ``autodl`` command run in the test's own process."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import pytest

from tests.cli_helpers import CliResult, run_cli

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def autodl(capsys):
    """``autodl ARGS`` in this process, from the checkout unless ``cwd`` is given, with ``env`` set for the call
    only (None: unset); exit 0 asserted unless ``check=False``."""

    def run(*args: str, check: bool = True, env: Mapping[str, str | None] | None = None,
            cwd: Path = REPO) -> CliResult:
        proc = run_cli(capsys, *args, env=env, cwd=cwd)
        if check:
            assert proc.returncode == 0, proc.stderr
        return proc

    return run
