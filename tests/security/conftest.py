"""Hostile scripts against autodl's isolation (issue 19): they need bubblewrap (CI installs it: .ci/bubblewrap.sh)."""

from __future__ import annotations

import os

import pytest

from autodl.sandbox import isolation, unavailable_reason


@pytest.fixture(scope="session")
def sandbox_level() -> str:
    """The isolation level here; without one these tests skip locally and fail under CI=true."""
    level = isolation()
    if level == "none":
        msg = f"no sandbox on this host: {unavailable_reason()}"
        if os.environ.get("CI") == "true":
            pytest.fail(msg)
        pytest.skip(msg)
    return level
