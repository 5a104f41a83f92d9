"""The profile step's dry run in the launcher's image goes to the engine of the Airflow connection docker_default,
as the launch does (issue 17, item 5)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import autodl.profile as prof
from autodl import pipeline

pytest.importorskip("airflow.providers.docker")
REPO = Path(__file__).resolve().parents[2]


def test_the_profile_steps_dry_run_uses_the_docker_default_connection(monkeypatch, autodl_home):
    """The connection names an engine that does not answer: the profile says so, naming that engine (not the
    local socket), and the estimate is the conservative bound."""
    from autodl.operators.connections import launcher_kwargs

    conn = {"conn_type": "docker", "extra": {"base_url": "tcp://127.0.0.1:9", "timeout": "2"}}
    monkeypatch.setenv("AIRFLOW_CONN_DOCKER_DEFAULT", json.dumps(conn))
    monkeypatch.setattr(prof, "paddle_available", lambda: False)  # a worker without the paddle extra
    lines: list[str] = []
    out = pipeline.step_profile(str(REPO / "include/scripts/simple_cnn.py"), str(REPO / "include/specs/simple_cnn_docker.yaml"),
                                pool=str(REPO / "include/pools/demo.yaml"), log=lines.append,
                                launcher_kwargs_for=launcher_kwargs)
    assert out.profiled_in == "not-run" and out.profile.method == "cold_start"
    (w,) = [f for f in out.profile.findings if f.code == "probe-unavailable"]
    assert "tcp://127.0.0.1:9" in w.message and "launcher's image" in w.message
    assert any(line.startswith("profile ran in: not-run (the estimate is the conservative bound: the script was not run: "
                               "the dry run cannot run in the launcher's image") for line in lines), lines
