"""Real services for integration tests: under CI (CI=true) a missing service is a failure, not a skip."""

from __future__ import annotations

import os

import pytest


def require_service(available: bool, what: str, how: str) -> None:
    """Fail under CI, skip with the reason elsewhere, when a real service is missing."""
    if available:
        return
    message = f"{what} is not available: {how}"
    if os.environ.get("CI"):
        pytest.fail(message)
    pytest.skip(message)
