"""Hostile scripts run through the real sandbox: the host must have bubblewrap (CI installs it: .ci/bubblewrap.sh)."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest


@pytest.fixture
def workdir(tmp_path) -> Path:
    d = tmp_path / "work"
    d.mkdir()
    return d


@pytest.fixture
def marker() -> str:
    """A token unique to this test, put on hostile processes' command lines so the test can look for them."""
    return f"autodl-hostile-{uuid.uuid4().hex}"


