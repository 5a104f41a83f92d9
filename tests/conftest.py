"""Shared fixtures: an isolated autodl home and store per test, the real catalog."""

from __future__ import annotations

import pytest

from autodl.catalog import load_catalog


@pytest.fixture(autouse=True)
def autodl_home(tmp_path, monkeypatch):
    """Every test gets its own AUTODL_HOME and SQLite store."""
    home = tmp_path / "autodl_home"
    home.mkdir()
    monkeypatch.setenv("AUTODL_HOME", str(home))
    monkeypatch.setenv("AUTODL_STORE_URL", f"sqlite:///{home / 'autodl.db'}")
    monkeypatch.delenv("AUTODL_POOL", raising=False)
    return home


@pytest.fixture
def catalog():
    return load_catalog()
