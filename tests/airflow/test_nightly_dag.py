"""The nightly retraining DAG: a cron at night that never starts a run when unpaused, and a second night
that resumes from the first night's checkpoint (real Paddle training on CPU, in-process Airflow)."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from unittest import mock

import pendulum
import pytest

from autodl.ledger import Ledger
from autodl.records import RecordStore

REPO = Path(__file__).resolve().parents[2]
DAG_FILE = REPO / "dags" / "autodl_nightly_text_classifier.py"
GROUP = "retrain_text_classifier"


def load_dag():
    spec = importlib.util.spec_from_file_location("autodl_nightly_dag", DAG_FILE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.dag


@pytest.mark.parametrize("now, expected", [
    ("2026-12-01T14:00:00+00:00", "2026-12-02T02:30:00+00:00"),  # unpaused in the afternoon: tonight
    ("2026-12-01T03:00:00+00:00", "2026-12-02T02:30:00+00:00"),  # half an hour after tonight's slot: not at once
    ("2026-12-01T02:00:00+00:00", "2026-12-01T02:30:00+00:00"),
])
def test_nightly_schedule_never_starts_a_run_when_unpaused(now, expected):
    """Airflow 3.3 computes the first run from the timetable: the next 02:30 UTC, never a missed night."""
    import airflow.timetables.trigger as trigger
    from airflow.serialization.serialized_objects import LazyDeserializedDAG

    dag = load_dag()
    assert dag.catchup is False and dag.start_date is None and dag.max_active_runs == 1
    assert dag.doc_md and "Unpausing does not start a run at once" in dag.doc_md
    at = pendulum.parse(now)
    with mock.patch.object(trigger, "utcnow", lambda: at):
        info = LazyDeserializedDAG.from_dag(dag).next_dagrun_info(last_automated_run_info=None)
    assert info.run_after == pendulum.parse(expected)


def test_a_plain_cron_with_a_past_start_date_would_start_at_once():
    """What the README warns about: cron string + past start_date + catchup=False -> the latest missed
    slot is due at once (run_after in the past) when the DAG is unpaused."""
    from datetime import datetime

    import airflow.timetables.trigger as trigger
    from airflow.sdk import DAG
    from airflow.serialization.serialized_objects import LazyDeserializedDAG

    with DAG("plain_cron", schedule="30 2 * * *", start_date=datetime(2026, 1, 1), catchup=False) as dag:
        pass
    at = pendulum.parse("2026-12-01T14:00:00+00:00")
    with mock.patch.object(trigger, "utcnow", lambda: at):
        info = LazyDeserializedDAG.from_dag(dag).next_dagrun_info(last_automated_run_info=None)
    assert info.run_after == pendulum.parse("2026-12-01T02:30:00+00:00") < at


@pytest.mark.airflow
@pytest.mark.slow
def test_second_night_resumes_from_the_first_nights_checkpoint(airflow_db, autodl_home, tmp_path):
    from airflow.models.dagrun import DagRun
    from airflow.utils.session import create_session

    out = tmp_path / "checkpoints"
    spec = tmp_path / "nightly.yaml"
    text = (REPO / "include/specs/text_classifier_nightly.yaml").read_text()
    text = text.replace("script: ../scripts/text_classifier.py", f"script: {REPO / 'include/scripts/text_classifier.py'}")
    text = text.replace('args: ["--epochs", "1"]', 'args: ["--epochs", "1", "--max-train", "256"]')
    text = text.replace("  # output_dir: /data/checkpoints/text_classifier", f"  output_dir: {out}")
    spec.write_text(text)
    dag = load_dag()
    runs = []
    for _night in range(2):
        dr = dag.test(run_conf={"spec": str(spec)})
        with create_session() as session:
            assert session.get(DagRun, dr.id).state == "success"
        runs.append(dr.run_id)
    assert Ledger().leases() == []
    records = {r.run_id: r for r in RecordStore().list()}
    first, second = records[runs[0]], records[runs[1]]
    assert first.outcome == second.outcome == "succeeded"
    assert first.report["resumed_from"] is None and first.report["epoch"] == 1
    assert second.report["resumed_from"] == str(out / "last.pdparams")
    assert second.report["resumed_epoch"] == 1 and second.report["epoch"] == 2
    history = [json.loads(line) for line in (out / "history.jsonl").read_text().splitlines()]
    assert [h["epoch"] for h in history] == [1, 2]
    assert "resuming from" in Path(second.launch["log_path"]).read_text()
    # the record also keeps the placement decision the booking was made on, every candidate with reasons
    assert second.decision and any(c["kept"] for c in second.decision["candidates"])
    assert all(c["reasons"] for c in second.decision["candidates"] if not c["kept"])
