"""Every example DAG can be triggered from Airflow 3's form with its defaults; enums; conf typos refused;
the profile step's log shows the breakdown, findings and largest batches; launcher/policy overrides."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from autodl.errors import SpecError
from autodl.records import RecordStore

REPO = Path(__file__).resolve().parents[2]
DAG_FILES = sorted((REPO / "dags").glob("autodl_*.py"))


def load(path: Path):
    spec = importlib.util.spec_from_file_location(f"dag_{path.stem}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.dag


def form_requires(schema: dict) -> bool:
    """Airflow 3.3's trigger form (airflow/ui, ``flexibleForm``): a field is required when its schema has
    a ``type`` that does not include ``"null"``; the Trigger button is disabled while a required field's
    value is null, undefined or "" (the form also turns a cleared text field into null)."""
    t = schema.get("type")
    return bool(t) and (not isinstance(t, list) or "null" not in t)


@pytest.fixture(scope="module", params=[p.name for p in DAG_FILES])
def dag(request):
    return load(REPO / "dags" / request.param)


def test_every_example_dag_has_params_and_doc_md(dag):
    assert set(dag.params) == {"script", "spec", "pool", "launcher", "policy"}
    assert dag.doc_md and len(dag.doc_md) > 200


def test_trigger_form_is_enabled_with_the_defaults(dag):
    for name in dag.params:
        param = dag.params.get_param(name)
        value = param.value
        if form_requires(param.schema):
            assert value not in (None, ""), f"{dag.dag_id}: param {name!r} would disable the Trigger button"
        assert param.resolve(value) == value  # the default validates against its own schema


def test_enums_for_the_fixed_sets(dag):
    from autodl.pipeline import OVERRIDES

    p = {name: dag.params.get_param(name) for name in dag.params}
    assert p["launcher"].schema["enum"] == ["spec", *OVERRIDES["launcher"][2]]
    assert set(p["launcher"].schema["enum"]) >= {"local", "docker", "kubernetes"}
    assert p["policy"].schema["enum"] == ["spec", "rule_based", "rl_based"]
    pools = p["pool"].schema["examples"]  # proposals; any pool file path may be typed (checked when the tasks run)
    assert pools[:2] == ["auto", "nvml"] and "demo" in pools and "enum" not in p["pool"].schema
    assert p["pool"].value in pools
    assert set(p["pool"].schema["values_display"]) == set(pools)
    for name in ("launcher", "policy"):
        assert set(p[name].schema["values_display"]) == set(p[name].schema["enum"])
        with pytest.raises(Exception):
            p[name].resolve("no-such-choice")
    assert p["script"].resolve(None) is None  # empty script: the spec's task.script


def test_check_conf_names_the_unknown_key_and_the_known_ones():
    from autodl.operators.params import check_conf

    check_conf({"script": "x.py", "pool": "auto"}, ["script", "spec", "pool"])
    check_conf({}, ["script"])
    with pytest.raises(SpecError) as err:
        check_conf({"scrpit": "x.py", "pool": "auto"}, ["script", "spec", "pool", "launcher", "policy"])
    msg = str(err.value)
    assert "'scrpit' (did you mean 'script'?)" in msg
    assert "launcher, policy, pool, script, spec" in msg


def test_overrides_are_checked_and_applied():
    from autodl.pipeline import apply_overrides, check_overrides
    from autodl.spec import load_spec

    assert check_overrides({"launcher": "spec", "policy": None}) == {}
    checked = check_overrides({"launcher": "docker", "policy": "rl_based"})
    spec = apply_overrides(load_spec(REPO / "include/specs/simple_cnn.yaml"), checked)
    assert spec.launcher.type == "docker" and spec.scheduler.algorithm == "rl_based"
    with pytest.raises(SpecError, match="'slurm' is not a launcher.type.*local, docker, kubernetes"):
        check_overrides({"launcher": "slurm"})


def test_profile_log_has_breakdown_findings_and_largest_batches(autodl_home):
    from autodl.pipeline import step_profile

    lines: list[str] = []
    step_profile(str(REPO / "include/scripts/simple_cnn.py"), str(REPO / "include/specs/simple_cnn.yaml"),
                 pool=str(REPO / "include/pools/demo.yaml"), log=lines.append,
                 overrides={"policy": "rl_based"})  # the dry run measures: the largest batches are known
    text = "\n".join(lines)
    for term in ("weights", "gradients", "optimizer state", "activations", "workspace", "cuda_context", "peak"):
        assert f"  {term}" in text, term
    assert "findings" in text
    assert "largest batch per device under memory threshold 0.85:" in text
    assert "  A100-SXM4-40GB" in text
    assert "override: scheduler.algorithm = rl_based (the spec says rule_based)" in text


@pytest.mark.airflow
def test_unknown_conf_key_fails_the_profile_step_with_its_name(airflow_db, autodl_home):
    """Seen in a real Airflow: a typo in the trigger conf (``scrpit``) was accepted silently."""
    from airflow.models.dagrun import DagRun
    from airflow.utils.session import create_session

    dag = load(REPO / "dags" / "autodl_train_simple_cnn.py")
    dr = dag.test(run_conf={"scrpit": str(REPO / "include/scripts/simple_cnn.py")})
    with create_session() as session:
        states = {ti.task_id.split(".", 1)[1]: str(ti.state) for ti in dr.get_task_instances(session=session)}
        assert session.get(DagRun, dr.id).state == "failed"
    assert states["profile"] == "failed" and states["launch"] == "upstream_failed"
    rec = RecordStore().list()[0]
    assert rec.outcome == "not_started"
    assert "unknown key in the trigger conf: 'scrpit' (did you mean 'script'?)" in rec.error
    assert "launcher, policy, pool, script, spec" in rec.error
