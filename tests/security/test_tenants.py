"""Per-tenant data on the GPU page: records filtered by the viewer's DAG read permission, as Airflow's own views
filter DAG runs (issue 19, item 4), with Airflow's real auth-manager machinery (``filter_authorized_dag_ids``)."""

from __future__ import annotations

from pathlib import Path

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


A100 = "GPU-demo0000-a100-0000-0000-000000000000"
V100 = "GPU-demo0001-v100-0000-0000-000000000000"
POOL = str(Path(__file__).resolve().parents[2] / "plugins" / "autodl" / "include" / "pools" / "demo.yaml")


@pytest.fixture
def holders():
    """Team A's run holds the A100, team B's the V100 and a CLI run a device outside the pool; each team has a
    run waiting in the admission queue."""
    from autodl.ledger import Ledger
    from autodl.queue import AdmissionQueue
    from autodl.types import LeaseOwner

    ledger = Ledger()
    ledger.book("team_a/r1/train", [A100], host="demo-node-1", owner=LeaseOwner(dag_id="team_a", run_id="r1"))
    ledger.book("team_b/secret-run/train", [V100], host="demo-node-1",
                owner=LeaseOwner(dag_id="team_b", run_id="secret-run", user="bob"))
    ledger.book("cli-secret-run", ["elsewhere:0"], host="other-node")
    queue = AdmissionQueue()
    for key, dag in (("team_a/r2/train", "team_a"), ("team_b/waiting-secret/train", "team_b")):
        queue.join(key, num_gpus=2, needed_bytes=GiB, candidates=[[A100, V100]], stale_after_s=600, dag_id=dag,
                   run_id=key.split("/")[1], owner_user="bob" if dag == "team_b" else "alice")


GiB = 1 << 30


def test_the_pool_table_hides_holders_of_other_dags_runs(team_a_viewer, holders):
    """Seen (issue 19): the GPU page's pool, queue and lease tables named every run holding a device. A viewer of
    team A sees that the V100 and the outside device are held, not by whom."""
    view = data.pool_view(POOL, readable=team_a_viewer, admin=False)
    by_id = {d.device_id: d.holder for d in view.devices}
    assert by_id[A100] is not None and by_id[A100].run_key == "team_a/r1/train"
    for device in (V100, "elsewhere:0"):
        assert by_id[device] is not None and by_id[device].hidden
    dumped = view.model_dump_json()
    assert "team_b" not in dumped and "secret" not in dumped and "bob" not in dumped


def test_the_lease_table_keeps_other_dags_leases_without_their_run_keys(team_a_viewer, holders):
    rows = data.lease_rows(readable=team_a_viewer, admin=False)
    assert len(rows) == 3  # counts stay
    assert [r.run_key for r in rows if not r.holder.hidden] == ["team_a/r1/train"]
    dumped = "".join(r.model_dump_json() for r in rows)
    assert "team_b" not in dumped and "secret" not in dumped
    assert {d for r in rows for d in r.device_ids} == {A100, V100, "elsewhere:0"}


def test_the_queue_keeps_other_dags_positions_without_who_they_are(team_a_viewer, holders):
    rows = data.queue_view(readable=team_a_viewer, admin=False).rows
    assert [r["position"] for r in rows] == [1, 2]
    mine, theirs = rows
    assert mine["run_key"] == "team_a/r2/train" and not mine.get("hidden")
    assert theirs == {"position": 2, "hidden": True, "num_gpus": 2, "needed_bytes": GiB,
                      "enqueued_at": theirs["enqueued_at"]}


def test_an_admin_sees_every_holder_including_cli_runs(holders):
    everyone = lambda ids: set(ids)  # noqa: E731 - an admin may read every DAG
    rows = data.lease_rows(readable=everyone, admin=True)
    assert sorted(r.run_key for r in rows) == ["cli-secret-run", "team_a/r1/train", "team_b/secret-run/train"]


def test_the_index_page_renders_hidden_holders_without_their_run_keys(team_a_viewer, holders):
    from autodl.ui.app import TEMPLATES

    html = TEMPLATES.get_template("index.html").render(
        app_root="/autodl", store="sqlite://", now=data.utcnow(), admin=False,
        pool=data.pool_view(POOL, readable=team_a_viewer, admin=False),
        queue=data.queue_view(readable=team_a_viewer, admin=False),
        leases=data.lease_rows(readable=team_a_viewer, admin=False), runs=[])
    assert "team_a" in html and "team_b" not in html and "secret" not in html
    assert html.count("a DAG you may not read") == 2 + 2 + 1  # pool rows, lease rows, queue row
