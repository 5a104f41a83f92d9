"""The GPU page, mounted in Airflow's real api-server app (``create_app``) and driven with FastAPI's TestClient:
refused without a token, the pages and JSON, PNG plots, admin-only release, unknowns shown as unknown."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from autodl.ledger import Ledger
from autodl.records import RecordStore
from autodl.types import RunRecord

pytestmark = pytest.mark.airflow

REPO = Path(__file__).resolve().parents[2]
A100 = "GPU-demo0000-a100-0000-0000-000000000000"
V100 = "GPU-demo0001-v100-0000-0000-000000000000"
RUN_ID = "manual__2026-11-30T21:04:05.123456+00:00"
DAG_ID = "autodl_train.simple_cnn"  # a dot in the DAG id: the run key is still split right
RUN_KEY = f"{DAG_ID}.train_simple_cnn.{RUN_ID}"
DONE_KEY = f"{DAG_ID}.train_simple_cnn.scheduled__2026-11-29T02:30:00+00:00"
WAITING_KEY = f"{DAG_ID}.train_simple_cnn.manual__2026-11-30T22:00:00+00:00"
GiB = 1 << 30


@pytest.fixture(scope="module")
def api(airflow_db):
    """Airflow's api-server app (plugins mounted) with tokens for an admin and a viewer."""
    from airflow.api_fastapi.app import create_app, get_auth_manager
    from airflow.api_fastapi.auth.managers.simple.user import SimpleAuthManagerUser
    from fastapi.testclient import TestClient

    client = TestClient(create_app())
    am = get_auth_manager()
    tokens = {role: am.generate_jwt(SimpleAuthManagerUser(username=role.lower(), role=role))
              for role in ("ADMIN", "VIEWER")}
    return client, tokens


def get(api, path, role="VIEWER", **kw):
    client, tokens = api
    return client.get(path, headers={"Authorization": f"Bearer {tokens[role]}"}, **kw)


@pytest.fixture
def seeded(autodl_home):
    """A live lease on the A100, a run waiting in the admission queue, and one finished run with its decision,
    report and samples."""
    from autodl.queue import AdmissionQueue

    Ledger().book(RUN_KEY, [A100], host="demo-node-1", model="A100-SXM4-40GB")
    AdmissionQueue().join(WAITING_KEY, num_gpus=1, needed_bytes=GiB, candidates=[[A100]], stale_after_s=600,
                          dag_id=DAG_ID, run_id="manual__2026-11-30T22:00:00+00:00", owner_user="admin")
    samples = autodl_home / "runs" / "done" / "samples.jsonl"
    samples.parent.mkdir(parents=True)
    t0 = time.time()
    samples.write_text("".join(json.dumps({"t": t0 + i, "memory_bytes": (1 + i) * 2**28, "utilization_pct": 50.0 + i})
                               + "\n" for i in range(6)) + '{"t": cut short\n')
    decision = {"algorithm": "rule_based", "fits": True, "available": True, "needed_bytes": GiB,
                "candidates": [
                    {"devices": [V100], "model": "V100-PCIE-32GB", "kept": True, "score": 0.91,
                     "terms": {"speed": 0.5}, "reasons": ["fits: 1.00 GiB of 27.2 GiB"]},
                    {"devices": [A100], "model": "A100-SXM4-40GB", "kept": True, "score": 0.72,
                     "terms": {"speed": 0.9}, "reasons": ["fits", "leased? no"]},
                    {"devices": ["demo-node-1:3"], "model": "Ascend-910", "kept": False,
                     "reasons": ["vendor ascend is not in resource_policy.allowed_vendors"]}]}
    RecordStore().write(RunRecord(
        run_key=DONE_KEY, dag_id=DAG_ID, run_id="scheduled__2026-11-29T02:30:00+00:00", script="/x/train.py",
        outcome="succeeded", declared_pool=True, placement=decision["candidates"][0], lease_id="l1",
        metrics={"source": "process", "duration_s": 75.0, "exit_code": 0, "samples": 6, "samples_path": str(samples),
                 "peak_memory_bytes": int(1.5 * GiB)},
        estimated_peak_bytes=GiB, actual_peak_bytes=int(1.5 * GiB), device_model="V100-PCIE-32GB",
        decision=decision, report={"resumed_from": "/ck/last.pdparams", "resumed_epoch": 3, "epoch": 4}))
    return autodl_home


ROUTES = ["/autodl/", "/autodl/api/pool", "/autodl/api/queue", "/autodl/api/leases", "/autodl/api/runs",
          f"/autodl/api/runs/{DONE_KEY}", f"/autodl/runs/{DONE_KEY}", "/autodl/plots/estimate_vs_actual.png",
          f"/autodl/plots/runs/{DONE_KEY}/timeline.png"]


@pytest.mark.parametrize("path", ROUTES)
def test_refused_without_a_token_or_with_a_bad_one(api, seeded, path):
    client, _ = api
    assert client.get(path).status_code == 401
    assert client.get(path, headers={"Authorization": "Bearer not-a-jwt"}).status_code == 403
    assert client.get(path, cookies={"_token": "forged"}).status_code == 403


def test_release_refused_without_a_token(api, seeded):
    client, _ = api
    r = client.post(f"/autodl/api/leases/{RUN_KEY}/release", headers={"X-AutoDL-Action": "release"})
    assert r.status_code == 401
    assert Ledger().get(RUN_KEY) is not None


def test_page_shows_the_pool_with_holders_and_unknowns(api, seeded):
    r = get(api, "/autodl/")  # the UI's cookie works too: see the browser test
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/html")
    html = r.text
    assert html.count("<tr data-device=") == 4
    row = html.split(f'<tr data-device="{A100}">', 1)[1].split("</tr>", 1)[0]
    assert "A100-SXM4-40GB" in row and "2.00 GiB / 40.00 GiB" in row
    assert f'href="/dags/autodl_train.simple_cnn/runs/{RUN_ID.replace(":", "%3A").replace("+", "%2B")}"' in row
    # the declared pool reports no temperature: "unknown", never 0
    assert '<span class="unknown">unknown</span>' in row and "0 °C" not in row
    queue = html.split('id="queue-table"', 1)[1].split("</table>", 1)[0]  # the store-backed admission queue
    assert "manual__2026-11-30T22:00:00+00:00</a>" in queue and "1 × 1.00 GiB" in queue
    # why it waits: the A100 it fits on is leased with no runtime estimate, so no start is guessed (issue 24)
    assert "head of the queue" in queue.split('class="why-waiting">', 1)[1]
    assert "no runtime estimate" in queue.split('class="expected-start">', 1)[1].split("</td>", 1)[0]
    assert "Recent runs" in html and DAG_ID in html and "1.00 GiB" in html and "1.50 GiB" in html
    assert 'id="estimate-plot"' in html


def test_release_button_only_for_admins(api, seeded):
    assert "data-release=" not in get(api, "/autodl/", "VIEWER").text
    assert f'data-release="{RUN_KEY}"' in get(api, "/autodl/", "ADMIN").text


def test_json_endpoints(api, seeded):
    pool = get(api, "/autodl/api/pool").json()
    assert pool["source"].endswith("demo.yaml") and pool["declared"] is True
    by_id = {d["device_id"]: d for d in pool["devices"]}
    assert by_id[A100]["holder"]["dag_id"] == DAG_ID and by_id[A100]["holder"]["run_id"] == RUN_ID
    assert by_id[V100]["holder"] is None
    assert all(d["temperature_c"] is None for d in pool["devices"])
    leases = get(api, "/autodl/api/leases").json()
    assert [le["run_key"] for le in leases] == [RUN_KEY] and leases[0]["device_ids"] == [A100]
    queue = get(api, "/autodl/api/queue").json()
    assert queue["available"] is True and [(q["position"], q["run_key"]) for q in queue["rows"]] == [(1, WAITING_KEY)]
    assert queue["rows"][0]["expected_start"] is None and queue["rows"][0]["reason"].startswith("head of the queue")
    runs = get(api, "/autodl/api/runs").json()
    assert [r["run_key"] for r in runs] == [DONE_KEY]
    # a GPU estimate vs the host RSS of a CPU run (declared pool): not comparable, no ratio (issue 25: ratios 21-275)
    assert runs[0]["estimate_ratio"] is None and runs[0]["comparable"] is False and runs[0]["duration_s"] == 75.0
    detail = get(api, f"/autodl/api/runs/{DONE_KEY}").json()
    assert [c["rank"] for c in detail["ranking"]] == [1, 2, None]
    assert detail["timeline"] is True and detail["record"]["report"]["resumed_epoch"] == 3
    assert get(api, "/autodl/api/runs/no-such-run").status_code == 404


def test_a_viewer_without_the_dag_sees_held_devices_not_who_holds_them(api, seeded, monkeypatch):
    """Seen (issue 19): the pool, queue and lease tables named every run key whatever the viewer's DAG permission.
    Through the mounted app, a viewer who may read no DAG of the seeded runs sees the holds and the queue's length,
    never the run keys."""
    import autodl.ui.app as ui_app

    monkeypatch.setattr(ui_app, "dag_filter", lambda user: (lambda ids: set()))
    bodies = [get(api, path).text for path in ("/autodl/", "/autodl/api/pool", "/autodl/api/queue",
                                               "/autodl/api/leases", "/autodl/api/runs")]
    for body in bodies:
        assert DAG_ID not in body and RUN_ID not in body and "manual__2026-11-30T22" not in body, body[:2000]
    pool = {d["device_id"]: d for d in get(api, "/autodl/api/pool").json()["devices"]}
    assert pool[A100]["holder"]["hidden"] is True
    assert [q["hidden"] for q in get(api, "/autodl/api/queue").json()["rows"]] == [True]
    assert [le["device_ids"] for le in get(api, "/autodl/api/leases").json()] == [[A100]]


def test_run_page_shows_ranked_placement_reasons_and_report(api, seeded):
    html = get(api, f"/autodl/runs/{DONE_KEY}").text
    table = html.split('id="ranking-table"', 1)[1].split("</table>", 1)[0]
    assert table.index("V100-PCIE-32GB") < table.index("A100-SXM4-40GB") < table.index("Ascend-910")
    assert "#1" in table and "chosen" in table and "dropped" in table
    assert "vendor ascend is not in resource_policy.allowed_vendors" in table
    assert 'id="run-report"' in html and "resumed_epoch" in html
    assert 'id="timeline-plot"' in html


def _png_shape(content: bytes):
    import matplotlib.image

    return matplotlib.image.imread(io.BytesIO(content), format="png").shape


def test_plots_are_pngs(api, seeded):
    r = get(api, "/autodl/plots/estimate_vs_actual.png")
    assert r.status_code == 200 and r.headers["content-type"] == "image/png"
    h, w, _ = _png_shape(r.content)
    assert h > 200 and w > 300
    r = get(api, f"/autodl/plots/runs/{DONE_KEY}/timeline.png")
    assert r.status_code == 200 and r.headers["content-type"] == "image/png"
    assert _png_shape(r.content)[0] > 200


def test_timeline_of_a_run_without_samples_is_a_404_that_says_why(api, seeded):
    RecordStore().write(RunRecord(run_key="x.g.manual__1", dag_id="x", run_id="manual__1", script="/x.py",
                                  outcome="not_started", declared_pool=True, error="profile: bad spec"))
    r = get(api, "/autodl/plots/runs/x.g.manual__1/timeline.png")
    assert r.status_code == 404 and "no metric samples" in r.json()["detail"]
    assert "no metric samples" in get(api, "/autodl/runs/x.g.manual__1").text


def test_samples_outside_autodl_home_are_not_read(api, seeded, tmp_path):
    outside = tmp_path / "elsewhere.jsonl"
    outside.write_text('{"t": 1, "memory_bytes": 1}\n')
    RecordStore().write(RunRecord(run_key="y.g.manual__2", dag_id="y", script="/x.py", outcome="succeeded", declared_pool=True,
                                  metrics={"samples_path": str(outside), "source": "process"}))
    r = get(api, "/autodl/plots/runs/y.g.manual__2/timeline.png")
    assert r.status_code == 404 and "outside AUTODL_HOME" in r.json()["detail"]


def test_release_is_for_admins_only_and_needs_the_header(api, seeded):
    client, tokens = api
    url = f"/autodl/api/leases/{RUN_KEY}/release"

    def post(role, header=True):
        headers = {"Authorization": f"Bearer {tokens[role]}"}
        if header:
            headers["X-AutoDL-Action"] = "release"
        return client.post(url, headers=headers)

    assert post("VIEWER").status_code == 403
    assert post("ADMIN", header=False).status_code == 400
    assert Ledger().get(RUN_KEY) is not None
    r = post("ADMIN")
    assert r.status_code == 200 and r.json()["lease_released"] is True
    assert Ledger().get(RUN_KEY) is None
    rec = RecordStore().get(RUN_KEY)
    assert rec is not None and "released by hand" in rec.error
    assert post("ADMIN").status_code == 404  # nothing left to release


def test_unknown_device_figures_stay_unknown():
    from autodl.types import Device
    from autodl.ui.data import device_row

    row = device_row(Device(device_id="d", index=0, model="A100-SXM4-40GB", memory_total_bytes=40 * GiB), None)
    assert row.temperature_c is None and row.health == "healthy"


@pytest.mark.parametrize("key, expected", [
    ("a.b.manual__2026-01-01T00:00:00.5+00:00", ("a", "b", "manual__2026-01-01T00:00:00.5+00:00")),
    ("my.dag.grp.scheduled__2026-01-01T02:30:00+00:00", ("my.dag", "grp", "scheduled__2026-01-01T02:30:00+00:00")),
    ("dag.grp.my_own_run_id", None),
    ("nogroup.manual__1", None),
])
def test_split_run_key(key, expected):
    from autodl.ui.urls import split_run_key

    assert split_run_key(key) == expected


def test_every_step_links_to_its_run_record():
    import importlib.util

    from autodl.operators.links import AutoDLRunRecordLink
    from autodl.operators.steps import AutoDLPoolSensor, _AutoDLStep

    spec = importlib.util.spec_from_file_location("dag_simple", REPO / "dags/autodl_train_simple_cnn.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    for task in module.dag.tasks:
        assert isinstance(task, (_AutoDLStep, AutoDLPoolSensor))
        assert [link.name for link in task.operator_extra_links] == ["autodl run record"]

    class Key:  # the fields of airflow.sdk.types.TaskInstanceKey the link reads
        dag_id, run_id, task_id, map_index, try_number = "d.x", "manual__2026-01-01T00:00:00+00:00", "g.launch", -1, 1

    task = module.dag.get_task("train_simple_cnn.launch")
    link = AutoDLRunRecordLink().get_link(task, ti_key=Key())
    assert link == "/plugin/gpus/autodl/runs/d.x.train_simple_cnn.manual__2026-01-01T00%3A00%3A00%2B00%3A00"


def test_plugin_registers_once_with_its_page():
    """Seen on the Home page of a real Airflow: "1 plugin import error ... Plugin 'autodl' already
    registered" (the entry point was seen twice: installed, and through plugins/autodl.egg-info)."""
    env = {**os.environ, "AIRFLOW__CORE__PLUGINS_FOLDER": str(REPO / "plugins")}
    code = ("import json\nfrom airflow import plugins_manager as pm\nplugins, errors = pm._get_plugins()\n"
            "print(json.dumps({'names': [p.name for p in plugins], 'errors': errors,"
            " 'apps': [a['url_prefix'] for p in plugins for a in p.fastapi_apps],"
            " 'views': [v['url_route'] for p in plugins for v in p.external_views]}))")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result == {"names": ["autodl"], "errors": {}, "apps": ["/autodl"], "views": ["gpus"]}


def test_devices_held_from_another_pool_and_expired_leases_are_shown(api, seeded):
    """Issue 25: the pool table showed only the server's pool and called devices free while a run held a device
    of another pool file; an expired lease looked live; a GPU estimate was compared with a CPU reading."""
    other = "GPU-other000-h100-0000-0000-000000000000"
    Ledger().book("d.g.manual__other", [other], host="gpu-node-9", model="H100-SXM5-80GB", ttl_s=-1)
    pool = get(api, "/autodl/api/pool").json()
    by_id = {d["device_id"]: d for d in pool["devices"]}
    assert by_id[other]["outside_pool"] is True and by_id[other]["holder"]["run_key"] == "d.g.manual__other"
    assert by_id[other]["memory_total_bytes"] is None and by_id[A100]["outside_pool"] is False
    leases = {le["run_key"]: le for le in get(api, "/autodl/api/leases").json()}
    assert leases["d.g.manual__other"]["expired"] is True and leases[RUN_KEY]["expired"] is False
    html = get(api, "/autodl/").text
    row = html.split(f'<tr data-device="{other}">', 1)[1].split("</tr>", 1)[0]
    assert "another pool" in row and "free" not in row
    assert "booked, not launched yet: waiting for a worker on gpu-node-9" in html
    assert 'class="tag expired"' in html and "not comparable" in html.split('id="runs-table"', 1)[1]
    assert "not comparable" in get(api, f"/autodl/runs/{DONE_KEY}").text
