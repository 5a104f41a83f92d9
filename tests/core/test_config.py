"""Settings: AUTODL_* variables first, then Airflow's [autodl] section, then autodl's defaults; shipped files
found through importlib.resources."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from importlib import resources
from pathlib import Path

import pytest

from autodl import config
from autodl.errors import ConfigError
from autodl.spec import DEFAULT_MEMORY_THRESHOLD, TaskSpec, parse_spec

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def _no_settings(monkeypatch):
    for name in [*config.SETTINGS.values(), "AUTODL_INCLUDE"]:
        monkeypatch.delenv(name, raising=False)
    for key in [k for k in os.environ if k.startswith("AIRFLOW__AUTODL__")]:
        monkeypatch.delenv(key)


def test_include_dir_is_the_package_resource_resolved_to_the_repository_folder():
    """In the checkout plugins/autodl/include links to include/: the same files the wheel carries."""
    packaged = resources.files("autodl") / "include"
    assert packaged.is_dir() and (packaged / "catalog" / "gpus.yaml").is_file()
    assert config.include_dir() == (REPO / "include").resolve()
    assert (config.include_dir() / "pools" / "demo.yaml").is_file()


def test_autodl_include_overrides(monkeypatch, tmp_path):
    monkeypatch.setenv("AUTODL_INCLUDE", str(tmp_path))
    assert config.include_dir() == tmp_path
    assert config.default_pool_file() == tmp_path / "pools" / "demo.yaml"


def test_defaults_without_settings():
    assert config.pool_source() == "auto"
    assert config.default_memory_threshold() is None and config.default_launcher() is None
    assert config.host_queues() == {} and config.prometheus_url() is None
    spec = TaskSpec()
    assert spec.resource_policy.memory_threshold == DEFAULT_MEMORY_THRESHOLD and spec.launcher.type == "local"


def test_variables_give_the_spec_defaults_but_the_spec_wins(monkeypatch):
    monkeypatch.setenv("AUTODL_MEMORY_THRESHOLD", "0.7")
    monkeypatch.setenv("AUTODL_LAUNCHER", "docker")
    assert TaskSpec().resource_policy.memory_threshold == 0.7
    assert parse_spec({"launcher": {"image": "x"}}).launcher.type == "docker"
    spec = parse_spec({"resource_policy": {"memory_threshold": 0.5}, "launcher": "kubernetes"})
    assert spec.resource_policy.memory_threshold == 0.5 and spec.launcher.type == "kubernetes"


def test_sharing_is_exclusive_unless_configured_and_the_spec_wins(monkeypatch):
    from autodl.policy import packing

    assert config.SHARING_MODES == packing.SHARING_MODES
    assert config.default_sharing() == "exclusive" and TaskSpec().resource_policy.sharing == "exclusive"
    monkeypatch.setenv("AUTODL_SHARING", "packed")
    assert TaskSpec().resource_policy.sharing == "packed"
    assert parse_spec({"resource_policy": {"sharing": "exclusive"}}).resource_policy.sharing == "exclusive"


def test_a_bad_sharing_in_the_spec_names_the_field_and_the_modes():
    from autodl.errors import SpecError

    with pytest.raises(SpecError, match="field 'resource_policy.sharing': Input should be 'exclusive' or 'packed'"):
        parse_spec({"resource_policy": {"sharing": "shared"}})


@pytest.mark.parametrize("name,value,fragment", [
    ("AUTODL_MEMORY_THRESHOLD", "1.5", "not a fraction"),
    ("AUTODL_MEMORY_THRESHOLD", "lots", "not a fraction"),
    ("AUTODL_LAUNCHER", "dockr", "unknown launcher 'dockr'"),
    ("AUTODL_HOST_QUEUES", "gpu-a", "is not host=queue"),
    ("AUTODL_HOST_QUEUES", "{\"gpu-a\": 3}", "map host names to queue names"),
    ("AUTODL_PROMETHEUS_URL", "prometheus:9090", "is not an http\\(s\\) URL of a Prometheus server"),
    ("AUTODL_SHARING", "shared", "'shared' is not a sharing mode; use one of: exclusive, packed"),
])
def test_bad_settings_name_their_source(monkeypatch, name, value, fragment):
    monkeypatch.setenv(name, value)
    with pytest.raises(ConfigError, match=fragment) as err:
        (config.default_memory_threshold(), config.default_launcher(), config.host_queues(), config.prometheus_url(),
         config.default_sharing())
    assert f"environment variable {name}" in str(err.value)


def test_host_queues_forms(monkeypatch):
    monkeypatch.setenv("AUTODL_HOST_QUEUES", " gpu-a = q_a , gpu-b=q_b ")
    assert config.host_queues() == {"gpu-a": "q_a", "gpu-b": "q_b"}
    assert config.queue_for_host("gpu-b") == "q_b" and config.queue_for_host("demo-node-1") is None
    monkeypatch.setenv("AUTODL_HOST_QUEUES", json.dumps({"gpu-a": "q_a"}))
    assert config.host_queues() == {"gpu-a": "q_a"}


def _probe(env: dict[str, str], code: str) -> dict:
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


PROBE = ("import json, sys\nfrom autodl import config\n"
         "print(json.dumps({'pool': config.pool_source(), 'store': config.store_url(), "
         "'threshold': config.default_memory_threshold(), 'airflow_imported': 'airflow' in sys.modules}))")


def _clean_env(tmp_path: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AUTODL_", "AIRFLOW"))}
    env["AIRFLOW_HOME"] = str(tmp_path / "airflow_home")
    env["AUTODL_HOME"] = str(tmp_path / "autodl_home")
    env["PYTHONPATH"] = str(REPO / "plugins")
    return env


def test_command_line_without_airflow_configuration_never_imports_airflow(tmp_path):
    """The CLI never imports Airflow: it would cost seconds and create $AIRFLOW_HOME/logs."""
    result = _probe(_clean_env(tmp_path), PROBE)
    assert result == {"pool": "auto", "store": f"sqlite:///{tmp_path / 'autodl_home' / 'autodl.db'}",
                      "threshold": None, "airflow_imported": False}
    assert not (tmp_path / "airflow_home").exists()


def test_airflow_cfg_section_is_read_and_variables_win(tmp_path):
    """[autodl] in airflow.cfg and AIRFLOW__AUTODL__* read by the command line without importing Airflow
    (seen: once Airflow was imported its logging wrote autodl's log lines to stdout, into `plan --json`);
    AUTODL_* first."""
    env = _clean_env(tmp_path)
    home = tmp_path / "airflow_home"
    home.mkdir()
    (home / "airflow.cfg").write_text("[core]\nexecutor = LocalExecutor\n[autodl]\npool = /pools/from-cfg.yaml\n"
                                      "memory_threshold = 0.6\nstore_url = sqlite:////tmp/from-cfg.db\n")
    assert _probe(env, PROBE) == {"pool": "/pools/from-cfg.yaml", "store": "sqlite:////tmp/from-cfg.db",
                                  "threshold": 0.6, "airflow_imported": False}
    env["AIRFLOW__AUTODL__POOL"] = "nvml"
    env["AUTODL_MEMORY_THRESHOLD"] = "0.8"
    assert _probe(env, PROBE)["pool"] == "nvml" and _probe(env, PROBE)["threshold"] == 0.8
    env["AUTODL_POOL"] = "auto"
    assert _probe(env, PROBE)["pool"] == "auto"


def test_inside_airflow_the_section_comes_through_airflows_conf(tmp_path):
    """Where Airflow is loaded (its processes), its own conf answers: airflow.cfg and AIRFLOW__AUTODL__*."""
    env = _clean_env(tmp_path)
    home = tmp_path / "airflow_home"
    home.mkdir()
    (home / "airflow.cfg").write_text("[autodl]\npool = /pools/from-cfg.yaml\n")
    code = "import airflow.configuration\n" + PROBE
    assert _probe(env, code)["pool"] == "/pools/from-cfg.yaml" and _probe(env, code)["airflow_imported"] is True
    env["AIRFLOW__AUTODL__POOL"] = "nvml"
    assert _probe(env, code)["pool"] == "nvml"


@pytest.mark.slow  # a process: what the bug was (Airflow's logging on stdout) is a fresh interpreter's import
def test_plan_json_stays_json_with_an_airflow_cfg(tmp_path):
    env = _clean_env(tmp_path)
    home = tmp_path / "airflow_home"
    home.mkdir()
    (home / "airflow.cfg").write_text("[autodl]\nmemory_threshold = 0.8\n")
    out = subprocess.run([sys.executable, "-m", "autodl.cli", "plan", str(REPO / "include/specs/simple_cnn.yaml"),
                          "--json", "--no-probe"], env=env, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["fits"] is True


def test_prometheus_url_from_the_variable(monkeypatch):
    monkeypatch.setenv("AUTODL_PROMETHEUS_URL", "http://prometheus:9090/")
    assert config.prometheus_url() == "http://prometheus:9090"
