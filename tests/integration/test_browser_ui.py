"""A real Airflow 3 (api-server, scheduler, dag-processor, triggerer on 127.0.0.1:28100) and headless Chromium:
log in, open the GPU page (pool table and plot render), open a DAG's trigger form (Trigger enabled with the
defaults), trigger, the run succeeds, and its record is on the GPU page (placement, timeline), reached from
the task's "autodl run record" link.

Seen before this page existed (Airflow 3.3.2, ``airflow standalone``): the Trigger button of every example
DAG was disabled with the default Params, and the Home page showed "1 plugin import error".

Screenshots go to ``$AUTODL_SCREENSHOTS`` (default: the test's temporary folder).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import urllib.error
import urllib.request
from pathlib import Path
from urllib.parse import quote, unquote

import pytest

from tests.integration.browser import AirflowServer, Chromium, find_chromium, http_json, wait_until
from tests.integration.conftest import require_service

pytestmark = [pytest.mark.integration, pytest.mark.minutes]

REPO = Path(__file__).resolve().parents[2]
PORTS = (28100, 28101, 28102, 28103)  # api-server; log/health ports set but not served
DEVTOOLS_PORT = 28110
DAG_ID = "autodl_train_simple_cnn"
GROUP = "train_simple_cnn"
IFRAME_DOC = "document.querySelector('iframe') && document.querySelector('iframe').contentDocument"


@pytest.fixture(scope="module")
def chromium_binary():
    binary = find_chromium()
    require_service(binary is not None, "Chromium", "apt-get install chromium (.ci/run installs it)")
    return binary


@pytest.fixture(scope="module")
def shots():
    folder = Path(os.environ.get("AUTODL_SCREENSHOTS") or tempfile.mkdtemp(prefix="autodl-screens-"))
    folder.mkdir(parents=True, exist_ok=True)
    return folder


@pytest.fixture(scope="module")
def airflow(tmp_path_factory):
    root = tmp_path_factory.mktemp("real-airflow")
    server = AirflowServer(home=root / "airflow", repo=REPO, ports=PORTS, autodl_home=root / "autodl")
    try:
        server.start()
        wait_until(lambda: DAG_ID in {d["dag_id"] for d in server.api("/dags")["dags"]},
                   "the example DAGs being parsed", within_s=180, every_s=3)
        yield server
    except BaseException:
        print(server.logs())
        raise
    finally:
        server.stop()


@pytest.fixture(scope="module")
def browser(chromium_binary, tmp_path_factory):
    folder = tmp_path_factory.mktemp("chromium")
    chrome = Chromium(chromium_binary, port=DEVTOOLS_PORT, user_data_dir=folder / "profile", log_path=folder / "log")
    yield chrome
    chrome.close()


def js(value) -> str:
    return json.dumps(value)


def login(browser: Chromium, airflow: AirflowServer, shots: Path) -> None:
    browser.navigate(f"{airflow.url}/")
    browser.wait_for("!!document.querySelector('input[name=username]')", "the login form")
    for name, value in (("username", "admin"), ("password", airflow.password)):
        browser.eval(f"document.querySelector('input[name={name}]').focus()")
        browser.send("Input.insertText", text=value)
    browser.wait_for("!document.querySelector('button[type=submit]').disabled", "Sign in enabled")
    browser.eval("document.querySelector('button[type=submit]').click()")
    browser.wait_for("location.pathname === '/' && document.body.innerText.includes('Health')", "the Home page")
    browser.wait_for("document.body.innerText.includes('Dag Processor')", "the Home page's health badges")
    browser.screenshot(shots / "01-home.png")
    assert "plugin import error" not in browser.eval("document.body.innerText").lower()


def test_gpu_page_trigger_form_and_a_run_that_succeeds(airflow, browser, shots):
    # the page is behind Airflow's auth in the real api-server too
    for path in ("/autodl/", "/autodl/api/pool", "/autodl/plots/estimate_vs_actual.png"):
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(f"{airflow.url}{path}", timeout=30)
        assert refused.value.code == 401
    assert http_json(f"{airflow.url}/autodl/api/pool", token=airflow.token())["declared"] is True

    login(browser, airflow, shots)

    # --- the GPU page, inside Airflow's UI: the pool table and the plot render
    assert browser.eval("Array.from(document.querySelectorAll('a')).some(a => a.getAttribute('href') === '/plugin/gpus')")
    browser.navigate(f"{airflow.url}/plugin/gpus")
    rows = browser.wait_for(f"{IFRAME_DOC} && {IFRAME_DOC}.querySelectorAll('#pool-table tbody tr[data-device]').length",
                            "the pool table in the GPU page")
    assert rows == 4  # the declared demo pool
    width = browser.wait_for(f"{IFRAME_DOC}.querySelector('#estimate-plot') && "
                             f"{IFRAME_DOC}.querySelector('#estimate-plot').complete && "
                             f"{IFRAME_DOC}.querySelector('#estimate-plot').naturalWidth", "the estimate plot")
    assert width > 300
    pool_text = browser.eval(f"{IFRAME_DOC}.querySelector('#pool-table').innerText")
    assert "A100-SXM4-40GB" in pool_text and "unknown" in pool_text  # no temperature: unknown, not 0
    browser.screenshot(shots / "02-gpu-page.png")

    # --- the trigger form: Trigger is enabled with the defaults
    browser.navigate(f"{airflow.url}/dags/{DAG_ID}")
    browser.wait_for("!!document.querySelector('button[aria-label=\"Trigger Dag\"]')", "the DAG page's Trigger button")
    browser.eval("document.querySelector('button[aria-label=\"Trigger Dag\"]').click()")
    submit = ("Array.from(document.querySelectorAll('[role=dialog] button'))"
              ".find(b => b.textContent.trim() === 'Trigger')")
    browser.wait_for(f"!!document.querySelector('[name=element_policy]') && !!{submit}", "the trigger form with its Params")
    fields = browser.eval("Array.from(document.querySelectorAll('[role=dialog] input[name^=element_]')).map(e => e.name)")
    assert set(fields) >= {"element_script", "element_spec", "element_pool", "element_launcher", "element_policy"}
    browser.eval(f"{submit}.scrollIntoView({{block: 'center'}})")
    browser.screenshot(shots / "03-trigger-form.png")
    assert browser.eval(f"{submit}.disabled") is False
    browser.eval(f"{submit}.click()")

    # --- the UI goes to the new run; it succeeds
    run_path = browser.wait_for(f"location.pathname.startsWith('/dags/{DAG_ID}/runs/') && location.pathname",
                                "the new DAG run's page")
    run_id = unquote(run_path.rsplit("/", 1)[1])

    def state():
        s = airflow.api(f"/dags/{DAG_ID}/dagRuns/{quote(run_id, safe='')}")["state"]
        if s == "failed":
            raise AssertionError(f"the run failed:\n{airflow.logs()}")
        return s == "success"

    wait_until(state, "the triggered run succeeding", within_s=420, every_s=3)
    browser.navigate(f"{airflow.url}/dags/{DAG_ID}/runs/{quote(run_id, safe='')}")
    browser.wait_for("document.body.innerText.includes('Success')", "the run page showing Success")
    browser.screenshot(shots / "04-run-succeeded.png")
    conf = airflow.api(f"/dags/{DAG_ID}/dagRuns/{quote(run_id, safe='')}")["conf"]
    assert conf == {"script": None, "spec": str(REPO / "include/specs/simple_cnn.yaml"), "pool": "auto",
                    "launcher": "spec", "policy": "spec"}

    # --- the task's extra link leads to the run's record on the GPU page
    browser.navigate(f"{airflow.url}/dags/{DAG_ID}/runs/{quote(run_id, safe='')}/tasks/{GROUP}.launch/details")
    link = ("Array.from(document.querySelectorAll('a'))"
            ".find(a => a.textContent.trim() === 'autodl run record')")
    browser.wait_for(f"!!{link}", "the 'autodl run record' extra link")
    browser.eval(f"{link}.click()")
    ranked = browser.wait_for(f"{IFRAME_DOC} && {IFRAME_DOC}.querySelectorAll('#ranking-table tbody tr').length",
                              "the run record's ranked placement")
    assert ranked >= 3
    assert browser.eval("location.pathname").startswith("/plugin/gpus/autodl/runs/")
    timeline = browser.wait_for(f"{IFRAME_DOC}.querySelector('#timeline-plot') && "
                                f"{IFRAME_DOC}.querySelector('#timeline-plot').complete && "
                                f"{IFRAME_DOC}.querySelector('#timeline-plot').naturalWidth", "the run's timeline plot")
    assert timeline > 300
    summary = browser.eval(f"{IFRAME_DOC}.querySelector('#run-summary').innerText")
    assert "succeeded" in summary
    browser.screenshot(shots / "05-run-record.png")

    # --- a link from the GPU page to the DAG run moves Airflow's own page (the frame may not navigate it)
    browser.eval(f"{IFRAME_DOC}.querySelector('a[data-airflow]').click()")
    browser.wait_for(f"location.pathname === '/dags/{DAG_ID}/runs/' + encodeURIComponent({js(run_id)})",
                     "Airflow's DAG run page after the link in the GPU page")

    # --- back on the GPU page the run is listed with its estimate and measured peak
    browser.navigate(f"{airflow.url}/plugin/gpus")
    browser.wait_for(f"{IFRAME_DOC} && {IFRAME_DOC}.querySelector('#runs-table') && "
                     f"{IFRAME_DOC}.querySelector('#runs-table').innerText.includes('succeeded')",
                     "the run in the GPU page's recent runs")
    browser.screenshot(shots / "06-gpu-page-after-run.png")


def book_lease(airflow: AirflowServer, run_key: str) -> str:
    """A lease on the first device of the server's pool, booked in the server's autodl store (as a run's
    select_device step would); returns the device id."""
    pool = http_json(f"{airflow.url}/autodl/api/pool", token=airflow.token())
    device = pool["devices"][0]
    code = ("import sys\nfrom autodl.ledger import Ledger\n"
            "Ledger().book(sys.argv[1], [sys.argv[2]], host=sys.argv[3], model=sys.argv[4])")
    subprocess.run([sys.executable, "-c", code, run_key, device["device_id"], device["host"], device["model"]],
                   env=airflow.env, check=True, capture_output=True, text=True)
    return device["device_id"]


def test_release_from_the_gpu_page_reached_through_airflows_nav(airflow, browser, shots):
    """Seen in Airflow 3.3.2: the page is an iframe whose sandbox lacks ``allow-modals``, so the Release
    button's ``confirm()`` was ignored ("Ignored call to 'confirm()'" in the console) and nothing was
    released. The confirmation is in the page now: cancel keeps the lease, confirm frees it."""
    run_key = f"{DAG_ID}.{GROUP}.manual__2026-12-01T00:00:00+00:00"
    book_lease(airflow, run_key)
    browser.navigate(f"{airflow.url}/")
    browser.wait_for("!!document.querySelector('input[name=username]') || document.body.innerText.includes('Health')",
                     "the login form or the Home page")
    if browser.eval("!!document.querySelector('input[name=username]')"):  # this test run alone
        login(browser, airflow, shots)
    nav = "document.querySelector('a[href=\"/plugin/gpus\"]')"
    browser.wait_for(f"!!{nav}", "the GPUs entry in Airflow's nav")
    browser.eval(f"{nav}.click()")
    button = (f"{IFRAME_DOC} && Array.from({IFRAME_DOC}.querySelectorAll('button[data-release]'))"
              f".find(b => b.getAttribute('data-release') === {js(run_key)})")
    browser.wait_for(f"!!({button})", "the lease's release button in the GPU page")
    assert browser.eval("location.pathname").startswith("/plugin/gpus")  # Airflow's page, the GPU page in its frame
    frame_sandbox = browser.eval("document.querySelector('iframe').getAttribute('sandbox') || ''")
    assert "allow-modals" not in frame_sandbox  # what made confirm() a no-op

    row = f"({button}).closest('tr')"
    browser.eval(f"({button}).click()")
    browser.wait_for(f"!{row}.querySelector('.confirm-release').hidden", "the in-page confirmation")
    browser.screenshot(shots / "07-release-confirm.png")
    browser.eval(f"{row}.querySelector('button[data-cancel]').click()")  # cancel: nothing released
    assert browser.eval(f"({button}).hidden") is False
    assert [le["run_key"] for le in http_json(f"{airflow.url}/autodl/api/leases", token=airflow.token())] == [run_key]

    browser.eval(f"({button}).click()")
    browser.eval(f"{row}.querySelector('button[data-confirm-release]').click()")
    box = f"({IFRAME_DOC}) && ({IFRAME_DOC}).querySelector('#action-status')"
    status = browser.wait_for(f"({box}) && !({box}).hidden && !({box}).innerText.startsWith('releasing') && "
                              f"!({button}) && ({box}).innerText", "the release's answer on the page read again")
    browser.screenshot(shots / "08-released.png")
    assert status.startswith(f"released: {run_key}")
    assert http_json(f"{airflow.url}/autodl/api/leases", token=airflow.token()) == []
    pool = browser.eval(f"({IFRAME_DOC}).querySelector('#pool-table').innerText")
    assert "manual__2026-12-01T00:00:00" not in pool  # the page was read again: the device is free
    record = http_json(f"{airflow.url}/autodl/api/runs/{quote(run_key, safe='')}", token=airflow.token())["record"]
    assert "released by hand" in record["error"]
