"""The run state in autodl's store (``autodl_run_state``, migration 0004) on SQLite and PostgreSQL, and the
typed step values that travel through it and the XComs."""

from __future__ import annotations

import pytest
from sqlalchemy import create_engine, inspect

from autodl.errors import StateError
from autodl.store import RunState, get_engine, head_revision
from autodl.types import Lease, MemoryBreakdown, PoolEvent, ProfileResult, ResourceProfile, Selection
from tests.integration.test_store_postgres import pg_url  # noqa: F401 - the schema-per-test fixture


def profile_result() -> ProfileResult:
    b = MemoryBreakdown(weights_bytes=1000, activations_bytes=4000)
    p = ResourceProfile(script="/s/train.py", params=250, peak_memory_bytes=b.total_bytes, breakdown=b,
                        flops_per_step=1e9, batch_size=8)
    return ProfileResult(profile=p, script="/s/train.py", spec_path="/s/spec.yaml", pool_source="file:/p.yaml",
                         declared_pool=True, overrides={"launcher": "docker"})


def test_migration_0004_makes_the_run_state_table(store_url):
    get_engine(store_url)
    assert head_revision() >= "0004"
    columns = {c["name"] for c in inspect(create_engine(store_url)).get_columns("autodl_run_state")}
    assert columns == {"run_key", "name", "value", "written_at", "written_on"}


def test_a_fact_written_by_one_host_is_read_back_with_the_host_that_wrote_it(store_url, monkeypatch):
    state = RunState(store_url)
    monkeypatch.setenv("AUTODL_HOST", "gpu-a")
    state.put("dag.g.r1", RunState.REPORT, {"epoch": 3, "resumed_from": "/ck/last.pdparams"})
    monkeypatch.setenv("AUTODL_HOST", "control")
    state.put("dag.g.r1", RunState.PROFILE, profile_result())
    assert state.get("dag.g.r1", RunState.REPORT) == {"epoch": 3, "resumed_from": "/ck/last.pdparams"}
    assert ProfileResult.coerce(state.get("dag.g.r1", RunState.PROFILE)) == profile_result()
    assert state.names("dag.g.r1") == {"report": "gpu-a", "profile": "control"}
    assert state.get("dag.g.r2", RunState.REPORT) is None and state.names("dag.g.r2") == {}
    state.put("dag.g.r1", RunState.REPORT, {"epoch": 4})  # written again: replaced, one row
    assert state.get("dag.g.r1", RunState.REPORT) == {"epoch": 4}
    assert state.forget("dag.g.r1") == 2 and state.names("dag.g.r1") == {}


def test_failures_of_several_steps_are_kept_per_step_in_order(store_url):
    state = RunState(store_url)
    state.note_failure("k", "wait", "no fitting device became free")
    state.note_failure("k", "collect", "lease lost")
    state.note_failure("k", "collect", "lease lost, training stopped")
    assert state.failures("k") == {"wait": "no fitting device became free", "collect": "lease lost, training stopped"}
    assert state.failures("other") == {}


def test_a_value_that_is_not_a_json_object_is_refused():
    with pytest.raises(ValueError, match="run state 'report' of k: a JSON object is kept, not list"):
        RunState().put("k", RunState.REPORT, [1, 2])


def test_a_renamed_field_fails_where_the_value_is_read_naming_the_field():
    doc = profile_result().model_dump(mode="json")
    doc["spec"] = doc.pop("script")
    with pytest.raises(StateError, match=r"the profile step's XCom is not a valid ProfileResult \(script: Field "
                                         r"required; spec: Extra inputs are not permitted\)"):
        ProfileResult.coerce(doc, what="the profile step's XCom")


def test_a_pool_event_carries_a_typed_selection_through_json():
    lease = Lease(lease_id="l1", run_key="k", device_ids=["GPU-a"], host="gpu-a")
    from autodl.types import Device

    dev = Device(device_id="GPU-a", host="gpu-a", index=0, model="A100-SXM4-40GB", memory_total_bytes=40 << 30)
    sel = Selection(lease=lease, placement={"devices": ["GPU-a"], "host": "gpu-a"}, devices=[dev], declared_pool=True,
                    pool_source="file:/p.yaml", algorithm="rule_based")
    event = PoolEvent.coerce(PoolEvent(status="booked", selection=sel, message="booked").model_dump(mode="json"))
    assert event.selection == sel and event.selection.host == "gpu-a"
    with pytest.raises(StateError, match="status: Input should be 'booked', 'no_fit', 'timeout' or 'error'"):
        PoolEvent.coerce({"status": "granted"})


def test_a_trigger_event_with_a_renamed_field_fails_the_wait_at_once_and_the_record_says_why():
    """The event comes back from the triggerer as JSON: a wrong field fails the task without retrying
    (a retry would read the same event), naming the field; the run state keeps why for the record."""
    from types import SimpleNamespace

    from airflow.sdk.exceptions import AirflowFailException

    from autodl.operators.steps import AutoDLPoolSensor

    op = AutoDLPoolSensor(task_id="g.wait_for_pool", group_id="g")
    context = {"ti": SimpleNamespace(dag_id="d", task_id="g.wait_for_pool", try_number=1), "run_id": "r1"}
    with pytest.raises(AirflowFailException, match=r"selection\.lease: Field required"):
        op.execute_complete(context, {"status": "booked", "selection": {"leases": {}}, "message": "booked"})
    assert "not a valid PoolEvent" in RunState().failures("d.g.r1")["wait"]
