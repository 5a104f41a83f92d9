"""Fixtures of the launcher tests."""

from __future__ import annotations

import pytest


@pytest.fixture
def script(tmp_path):
    """A training script in its own code folder (the folder a container mounts read-only)."""
    code = tmp_path / "code"
    code.mkdir()
    path = code / "train.py"
    path.write_text("print('train')\n")
    return path
