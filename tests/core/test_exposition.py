"""autodl's exporter counts waiting runs from the store: with several hosts (each its own AUTODL_HOME, one
store) the runs profiled on one host and waiting are seen by an exporter on any other (issue 17: they were
counted from this machine's run folders)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from autodl import pipeline
from autodl.exposition import registry
from tests.integration.test_store_postgres import pg_url  # noqa: F401 - the schema-per-test fixture

REPO = Path(__file__).resolve().parents[2]


def on_host(host: str, home: Path, store: str, code: str) -> None:
    """Run ``code`` as the named host would: its own process, AUTODL_HOST and AUTODL_HOME, the shared store."""
    home.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "AUTODL_HOST": host, "AUTODL_HOME": str(home), "AUTODL_STORE_URL": store}
    env.pop("AUTODL_POOL", None)
    out = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=env, cwd=REPO, capture_output=True,
                         text=True)
    assert out.returncode == 0, out.stdout + out.stderr


PROFILE = """
    from autodl import pipeline
    for key in {keys!r}:
        pipeline.step_profile({script!r}, None, probe=False, run_key=key, log=lambda _l: None)
"""

BOOK = """
    from autodl import pipeline
    from autodl.store import RunState
    ctx = pipeline.RunContext(run_key={key!r}, dag_id="dag", run_id="r", user="bob")
    pipeline.step_select(ctx, RunState().get({key!r}, RunState.PROFILE), log=lambda _l: None)
"""


def waiting_runs(store: str) -> float:
    return registry(store).get_sample_value("autodl_waiting_runs")


def test_waiting_runs_of_two_hosts_are_counted_from_the_shared_store(pg_url, tmp_path, monkeypatch):
    script = tmp_path / "train.py"
    script.write_text("print('training')\n")
    on_host("gpu-a", tmp_path / "home-a", pg_url, PROFILE.format(keys=["dag.g.a1"], script=str(script)))
    on_host("gpu-b", tmp_path / "home-b", pg_url, PROFILE.format(keys=["dag.g.b1", "dag.g.b2"], script=str(script)))
    on_host("gpu-b", tmp_path / "home-b", pg_url, BOOK.format(key="dag.g.b1"))
    # the exporter runs on a third machine: no run folder of these runs is here
    exporter_home = tmp_path / "home-exporter"
    exporter_home.mkdir()
    monkeypatch.setenv("AUTODL_HOME", str(exporter_home))
    monkeypatch.setenv("AUTODL_STORE_URL", pg_url)
    assert not (exporter_home / "runs").exists()
    assert waiting_runs(pg_url) == 2, "a1 (host a) and b2 (host b) wait; b1 holds its lease"
    assert registry(pg_url).get_sample_value("autodl_leases_held") == 1

    ctx = pipeline.RunContext(run_key="dag.g.a1", dag_id="dag", run_id="r", user="alice")
    pipeline.step_release_and_record(ctx, script=str(script), spec_path=None, profile_out=None, selection=None,
                                     handle_json=None, metrics_json=None, log=lambda _l: None)
    assert waiting_runs(pg_url) == 1, "a recorded run no longer waits"
    on_host("gpu-a", tmp_path / "home-a", pg_url, PROFILE.format(keys=["dag.g.a1"], script=str(script)))
    assert waiting_runs(pg_url) == 2, "cleared and run again: profiled after its record, it waits again"


def test_a_run_in_the_admission_queue_is_waiting_without_a_profile_row(tmp_path, monkeypatch):
    from autodl.queue import AdmissionQueue
    from autodl.types import utcnow

    store = f"sqlite:///{tmp_path / 'shared.db'}"
    monkeypatch.setenv("AUTODL_HOME", str(tmp_path))
    AdmissionQueue(store).join("dag.g.q1", num_gpus=1, needed_bytes=1 << 30, candidates=[["GPU-0"]],
                               stale_after_s=60, now=utcnow())
    assert waiting_runs(store) == 1
    AdmissionQueue(store).leave("dag.g.q1")
    assert waiting_runs(store) == 0
