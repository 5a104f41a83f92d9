"""Secrets stay secret (issue 13): the store URL's password leaked in messages when it held a raw '@', sat in
the query string (?password=) or the URL had no scheme; the local launcher handed the training the worker's
whole environment, store URL included."""

from __future__ import annotations

import json

import pytest

from autodl.redact import MASK, known_secrets, redact_env, redact_obj, redact_text, redact_url

PASSWORD = "p@ss:w/rd#9?x"


@pytest.mark.parametrize("url, shown", [
    (f"postgresql+psycopg2://autodl:{PASSWORD}@db.internal:5432/autodl",
     "postgresql+psycopg2://autodl:***@db.internal:5432/autodl"),
    ("postgresql://u:s3cr@t@host/db", "postgresql://u:***@host/db"),
    # a userinfo without ':' may be a token (https://TOKEN@host): hidden as a whole
    ("postgresql://u@host/db?password=hunter2&sslmode=require", "postgresql://***@host/db?password=***&sslmode=require"),
    ("postgresql://host/db?sslmode=require&pass=hunter2", "postgresql://host/db?sslmode=require&pass=***"),
    ("mysql+pymysql://h/db?user=u&passwd=hunter2", "mysql+pymysql://h/db?user=u&passwd=***"),
    ("user:hunter2@host/db", "user:***@host/db"),
    ("user:hun@ter2@host:5432/db", "user:***@host:5432/db"),
    ("https://ghp_TOKEN1234@github.com/org/repo", "https://***@github.com/org/repo"),
    ("redis://:onlypassword@cache:6379/0", "redis://:***@cache:6379/0"),
    ("sqlite:////var/lib/autodl/autodl.db", "sqlite:////var/lib/autodl/autodl.db"),
    ("https://host/a?email=a@b.com", "https://host/a?email=a@b.com"),
])
def test_urls(url, shown):
    assert redact_url(url) == shown
    assert redact_url(shown) == shown  # idempotent


def test_url_inside_a_message():
    message = f"autodl's store postgresql://autodl:{PASSWORD}@db/autodl (AUTODL_STORE_URL) cannot be used: timeout"
    out = redact_text(message)
    assert "p@ss" not in out and "w/rd" not in out and "postgresql://autodl:***@db/autodl (AUTODL_STORE_URL)" in out


def test_assignments_and_known_secret_values():
    env = {"MY_API_TOKEN": "tok-0123456789", "AUTODL_STORE_URL": "postgresql://u:longpassword1@h/db"}
    text = "PASSWORD=abc TOKEN='a b' AUTODL_RUN_KEY=dag.g.run echo tok-0123456789 longpassword1 done"
    out = redact_text(text, environ=env)
    assert out == f"PASSWORD={MASK} TOKEN='{MASK}' AUTODL_RUN_KEY=dag.g.run echo {MASK} {MASK} done"
    assert set(known_secrets(env)) == {"tok-0123456789", "longpassword1"}


def test_short_known_secrets_are_not_searched_in_free_text():
    """The CI store's password is 'autodl': masking every 'autodl' would garble every message; URLs and
    NAME=value still hide it by position."""
    env = {"AUTODL_STORE_URL": "postgresql+psycopg2://autodl:autodl@127.0.0.1:55432/x"}
    out = redact_text("autodl's store postgresql+psycopg2://autodl:autodl@127.0.0.1:55432/x", environ=env)
    assert out == "autodl's store postgresql+psycopg2://autodl:***@127.0.0.1:55432/x"


def test_environment():
    env = {"PATH": "/bin", "AUTODL_STORE_URL": "postgresql://u:pw@h/d", "AIRFLOW__CORE__FERNET_KEY": "k",
           "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": "postgresql://a:b@c/d", "AIRFLOW_CONN_X": "http://u:p@h",
           "AWS_SECRET_ACCESS_KEY": "x", "DB_PASSWORD": "y", "GITHUB_TOKEN": "z", "AUTODL_RUN_KEY": "r", "EMPTY_TOKEN": ""}
    assert redact_env(env) == {
        "PATH": "/bin", "AUTODL_STORE_URL": "postgresql://u:***@h/d", "AIRFLOW__CORE__FERNET_KEY": MASK,
        "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": "postgresql://a:***@c/d", "AIRFLOW_CONN_X": "http://u:***@h",
        "AWS_SECRET_ACCESS_KEY": MASK, "DB_PASSWORD": MASK, "GITHUB_TOKEN": MASK, "AUTODL_RUN_KEY": "r", "EMPTY_TOKEN": ""}


def test_rendered_objects():
    pod = {"spec": {"containers": [{"env": [{"name": "WANDB_API_KEY", "value": "w"}, {"name": "A", "value": "1"}]}]},
           "env": {"HF_TOKEN": "h"}, "metadata": {"annotations": {"autodl/run-key": "dag.grp.run"}}}
    out = redact_obj(pod)
    assert out["spec"]["containers"][0]["env"] == [{"name": "WANDB_API_KEY", "value": MASK}, {"name": "A", "value": "1"}]
    assert out["env"] == {"HF_TOKEN": MASK} and out["metadata"]["annotations"]["autodl/run-key"] == "dag.grp.run"


def test_store_error_hides_every_kind_of_password(monkeypatch):
    from autodl.errors import StoreError
    from autodl.store import get_engine

    for url in [f"postgresql+psycopg2://autodl:{PASSWORD}@127.0.0.1:1/autodl",
                "postgresql+psycopg2://127.0.0.1:1/autodl?user=autodl&password=hunter2secret",
                "autodl:hunter2secret@127.0.0.1/autodl"]:
        with pytest.raises(StoreError) as info:
            get_engine(url)
        message = str(info.value)
        assert "hunter2" not in message and "p@ss" not in message and "w/rd" not in message, message


def test_cli_error_never_shows_the_store_password(autodl, tmp_path):
    proc = autodl("leases", "--json", cwd=tmp_path, check=False,
                  env={"AUTODL_STORE_URL": f"postgresql+psycopg2://autodl:{PASSWORD}@127.0.0.1:1/autodl"})
    assert proc.returncode == 9, proc.stderr
    assert "p@ss" not in proc.stderr + proc.stdout and "autodl:***@127.0.0.1" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_findings_and_records_are_redacted():
    """A probe's stderr once echoed the worker's environment (read from /proc/<parent>/environ) into a
    probe-failed finding on stdout; findings and records now pass through the redaction."""
    from autodl.types import Finding, RunRecord

    f = Finding(severity="warning", code="probe-failed",
                message="child said AUTODL_STORE_URL=postgresql://u:hunter2pw@db/x AIRFLOW__CORE__FERNET_KEY=abc")
    assert "hunter2pw" not in f.message and "abc" not in f.message
    r = RunRecord(run_key="k", script="s", outcome="failed", declared_pool=True, error="postgresql://u:pw99@h/d down")
    assert "pw99" not in json.dumps(r.to_json())
