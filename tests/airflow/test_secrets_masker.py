"""autodl's own secrets reach Airflow's secrets masker inside Airflow (issue 21: the store URL's password
was not registered, so a task log quoting the URL showed it); the CLI keeps its own redaction."""

from __future__ import annotations

import pytest

from autodl.operators.secrets import autodl_secrets, register_secrets


def _airflow_redact(text: str) -> str:
    from airflow.sdk._shared.secrets_masker import redact

    return str(redact(text))


@pytest.fixture
def fresh_masker():
    from airflow.sdk._shared.secrets_masker import reset_secrets_masker

    reset_secrets_masker()
    yield
    reset_secrets_masker()


def test_store_and_pool_passwords_are_masked_in_airflow(monkeypatch, fresh_masker):
    monkeypatch.setenv("AUTODL_STORE_URL", "postgresql+psycopg2://autodl:St0re-Pa55word@db/autodl")
    monkeypatch.setenv("AUTODL_POOL", "prometheus+http://reader:Pr0m-Pa55word@prom:9090")
    line = "store postgresql+psycopg2://autodl:St0re-Pa55word@db/autodl, pool reader:Pr0m-Pa55word@prom"
    assert "St0re-Pa55word" in _airflow_redact(line)  # Airflow alone does not know them
    registered = register_secrets(["prometheus+http://ops:Task-Pool-Secret@prom2:9090"])
    assert {"St0re-Pa55word", "Pr0m-Pa55word", "Task-Pool-Secret"} <= set(registered)
    masked = _airflow_redact(line + " task pool ops:Task-Pool-Secret@prom2")
    assert "St0re-Pa55word" not in masked and "Pr0m-Pa55word" not in masked and "Task-Pool-Secret" not in masked
    assert "***" in masked


def test_sqlite_store_and_plain_pools_register_nothing(monkeypatch):
    monkeypatch.delenv("AUTODL_POOL", raising=False)
    assert autodl_secrets(["auto", "include/pools/demo.yaml", None]) == []


def test_short_passwords_are_left_to_the_cli_redaction(monkeypatch):
    """Masking a two-letter password everywhere would garble every log line: as autodl.redact does, only
    secrets of at least MIN_KNOWN_SECRET characters are registered; URLs still show it redacted."""
    from autodl.redact import redact_url

    monkeypatch.setenv("AUTODL_STORE_URL", "postgresql://a:pw@db/a")
    assert autodl_secrets() == []
    assert "pw" not in redact_url("postgresql://a:pw@db/a").split("@")[0]
