"""Hostile scripts run through the real sandbox: the host must have bubblewrap (CI installs it: .ci/bubblewrap.sh)."""

from __future__ import annotations

import os
import uuid
from pathlib import Path

import pytest

from autodl.sandbox import isolation, unavailable_reason


@pytest.fixture(scope="session")
def sandbox_level() -> str:
    """The isolation level here; without one the hostile tests skip locally and fail under CI=true."""
    level = isolation()
    if level == "none":
        msg = f"no sandbox on this host: {unavailable_reason()}"
        if os.environ.get("CI") == "true":
            pytest.fail(msg)
        pytest.skip(msg)
    return level


@pytest.fixture
def workdir(tmp_path) -> Path:
    d = tmp_path / "work"
    d.mkdir()
    return d


@pytest.fixture
def marker() -> str:
    """A token unique to this test, put on hostile processes' command lines so the test can look for them."""
    return f"autodl-hostile-{uuid.uuid4().hex}"


