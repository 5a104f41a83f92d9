"""Per-tenant data on the GPU page: records filtered by the viewer's DAG read permission, as Airflow's own views
filter DAG runs (issue 19, item 4), with Airflow's real auth-manager machinery (``filter_authorized_dag_ids``)."""

from __future__ import annotations

import pytest

from autodl.records import RecordStore
from autodl.types import RunRecord
from autodl.ui import data


@pytest.fixture
def team_a_viewer():
    """A viewer who may read DAG ``team_a`` only: the simple auth manager with per-DAG permission, the viewer and
    the ``readable`` filter Airflow's base auth manager builds from ``is_authorized_dag``."""
    from airflow.api_fastapi.auth.managers.simple.simple_auth_manager import SimpleAuthManager
    from airflow.api_fastapi.auth.managers.simple.user import SimpleAuthManagerUser

    class PerDagAuthManager(SimpleAuthManager):
        def is_authorized_dag(self, *, method, user, access_entity=None, details=None):
            return method == "GET" and details is not None and details.id == "team_a"

    am = PerDagAuthManager()
    user = SimpleAuthManagerUser(username="alice", role="VIEWER")
    return lambda ids: am.filter_authorized_dag_ids(dag_ids=ids, user=user, method="GET")


@pytest.fixture
def records():
    store = RecordStore()
    for key, dag in (("team_a/r1/train", "team_a"), ("team_b/r1/train", "team_b"), ("cli-run", None)):
        store.write(RunRecord(run_key=key, dag_id=dag, script="/x.py", outcome="succeeded", declared_pool=True,
                              report={"owner": dag or "cli"}))
    return store


def test_a_viewer_sees_only_the_runs_of_dags_they_may_read(team_a_viewer, records):
    rows = data.run_rows(50, readable=team_a_viewer, admin=False)
    assert [r.run_key for r in rows] == ["team_a/r1/train"]


def test_another_dags_run_page_is_not_found_for_that_viewer(team_a_viewer, records):
    assert data.run_detail("team_b/r1/train", readable=team_a_viewer, admin=False) is None
    assert data.run_detail("cli-run", readable=team_a_viewer, admin=False) is None
    assert data.run_detail("team_a/r1/train", readable=team_a_viewer, admin=False) is not None


def test_admins_see_runs_without_a_dag(team_a_viewer, records):
    keys = {r.run_key for r in data.run_rows(50, readable=team_a_viewer, admin=True)}
    assert keys == {"team_a/r1/train", "cli-run"}


def test_the_run_page_escapes_what_a_training_wrote():
    """A training's report is shown on the run page: markup in it is text, never HTML."""
    import json

    from autodl.ui.app import TEMPLATES

    RecordStore().write(RunRecord(run_key="k", dag_id="d", script="/x.py", outcome="succeeded", declared_pool=True,
                                  report={"<img src=x onerror=alert(1)>": "<script>alert(2)</script>"}))
    d = data.run_detail("k")
    html = TEMPLATES.get_template("run.html").render(
        app_root="/autodl", store="sqlite://", now=data.utcnow(), row=d.row, record=d.record, ranking=d.ranking,
        timeline=d.timeline, timeline_note=d.timeline_note, record_json=json.dumps(d.record, indent=2))
    assert 'id="run-report"' in html
    assert "<script>alert(2)</script>" not in html and "<img src=x" not in html
    assert "&lt;script&gt;alert(2)&lt;/script&gt;" in html
