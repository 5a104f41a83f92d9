"""Shared fixtures: an isolated autodl home and store per test, the real catalog."""

from __future__ import annotations

import logging
import os
import tempfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

# Airflow reads its configuration once, at first import: give the whole session an embedded Airflow
# home (SQLite metadata) with this repository's dags/ and plugins/, before any test imports airflow.
# Each pytest-xdist worker (.ci/run's `-n`) gets its own: the workers inherit the controller's environment, and
# two workers migrating or writing one SQLite metadata file at once would lock each other out.
if os.environ.get("PYTEST_XDIST_WORKER"):
    os.environ["AIRFLOW_HOME"] = tempfile.mkdtemp(prefix=f"autodl-airflow-home-{os.environ['PYTEST_XDIST_WORKER']}-")
os.environ.setdefault("AIRFLOW_HOME", tempfile.mkdtemp(prefix="autodl-airflow-home-"))
os.environ["AIRFLOW__CORE__DAGS_FOLDER"] = str(REPO / "dags")
os.environ["AIRFLOW__CORE__PLUGINS_FOLDER"] = str(REPO / "plugins")
os.environ["AIRFLOW__CORE__LOAD_EXAMPLES"] = "False"
# autodl's steps take `deferrable` from [operators] default_deferrable (Airflow's default: false), as the
# providers' operators do; the suite runs the deferrable paths, as the compose deployment (which has a
# triggerer) does. Tests of the default set it themselves.
os.environ.setdefault("AIRFLOW__OPERATORS__DEFAULT_DEFERRABLE", "True")

from autodl import sandbox as _sandbox
from autodl.catalog import load_catalog


def pytest_configure(config):
    """A private base temp folder per pytest session: pytest's default (/tmp/pytest-of-USER) keeps the
    last three sessions and deletes older ones, so two sessions at once would delete each other's run
    folders (and the trainings in them)."""
    if not config.option.basetemp and not hasattr(config, "workerinput"):
        config.option.basetemp = tempfile.mkdtemp(prefix="autodl-pytest-")


SERVICE_FIXTURES = frozenset({"docker_client", "busybox_image", "pg_url"})
"""Fixtures that need a daemon .ci/run starts (a Docker engine, PostgreSQL): a test requesting one is a
``services`` test."""

SERVICE_PARAMS = frozenset({"postgresql"})
"""Fixture parameters that reach a daemon through ``request.getfixturevalue`` (the store kinds' PostgreSQL)."""


def needs_services(item: pytest.Item) -> bool:
    """Whether ``item`` needs a daemon that .ci/run starts after the fast job: marked ``integration`` or
    ``services``, or requesting a :data:`SERVICE_FIXTURES` fixture (directly or through another), or parametrized
    with a :data:`SERVICE_PARAMS` value."""
    if item.get_closest_marker("integration") or item.get_closest_marker("services"):
        return True
    if SERVICE_FIXTURES & set(getattr(item, "fixturenames", ())):
        return True
    callspec = getattr(item, "callspec", None)
    return callspec is not None and bool(SERVICE_PARAMS & {str(v) for v in callspec.params.values()})


def pytest_collection_modifyitems(config, items):
    """Mark every test that needs a daemon ``services``, so .ci/run's fast job (``-m "not (services or slow)"``)
    runs before any daemon starts and the second job (``-m "services or slow"``) runs the rest: every test in
    exactly one job. In parallel (``-n``, ``--dist loadfile --no-loadscope-reorder``), modules marked ``minutes``
    come first, so one worker starts each while the others run the rest."""
    for item in items:
        if needs_services(item) and not item.get_closest_marker("services"):
            item.add_marker(pytest.mark.services)
    if hasattr(config, "workerinput"):  # a pytest-xdist worker: every worker sorts alike, so collections still match
        items.sort(key=lambda item: item.get_closest_marker("minutes") is None)


@pytest.fixture(autouse=True)
def autodl_home(tmp_path, monkeypatch):
    """Every test gets its own AUTODL_HOME and SQLite store."""
    home = tmp_path / "autodl_home"
    home.mkdir()
    monkeypatch.setenv("AUTODL_HOME", str(home))
    monkeypatch.setenv("AUTODL_STORE_URL", f"sqlite:///{home / 'autodl.db'}")
    monkeypatch.delenv("AUTODL_POOL", raising=False)
    return home


@pytest.fixture(autouse=True)
def root_logger_as_found():
    """Every test leaves the root logger's handlers as it found them.

    Seen: Airflow configures logging the first time a test imports it (KubernetesPodOperator.dry_run), adding a
    StreamHandler on that test's captured stderr; once pytest closed it, every later log record printed a
    ``--- Logging error ---`` traceback into the next in-process ``autodl`` call's stderr (test_nvml_cases failed
    when run after tests/launch/test_kubernetes.py).
    """
    from _pytest.logging import LogCaptureHandler  # pytest's own per-phase handlers: pytest removes them

    root = logging.getLogger()
    handlers = list(root.handlers)
    yield
    for handler in [h for h in root.handlers if h not in handlers and not isinstance(h, LogCaptureHandler)]:
        root.removeHandler(handler)


@pytest.fixture
def catalog():
    return load_catalog()


@pytest.fixture(scope="session")
def sandbox_level() -> str:
    """The isolation level here; without one the hostile tests skip locally and fail under CI=true."""
    level = _sandbox.isolation()
    if level == "none":
        msg = f"no sandbox on this host: {_sandbox.unavailable_reason()}"
        if os.environ.get("CI") == "true":
            pytest.fail(msg)
        pytest.skip(msg)
    return level


@pytest.fixture(params=["sqlite", "postgresql"])
def store_url(request, tmp_path):
    """A fresh store URL of each kind: a SQLite file, then the real PostgreSQL (the module imports ``pg_url`` from
    ``tests/integration/test_store_postgres.py``, the schema-per-test fixture)."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'store.db'}"
        return
    yield request.getfixturevalue("pg_url")
