"""The wheel, installed by its index name with its extras and the OLDEST Airflow and providers its floors
allow, from the public package index, into a fresh virtual environment outside the checkout.

Seen (issue 21): the ``airflow`` extra allowed ``apache-airflow>=3.0``, but ``autodl.operators`` imports
``AirflowFailException``, ``AirflowSensorTimeout`` and ``TaskDeferred`` from ``airflow.sdk.exceptions``,
which the Task SDK has only from 1.2 (Airflow 3.2): on 3.0/3.1 the import failed. This test installs
exactly the floors written in ``pyproject.toml`` (``==`` each), so a floor too low fails here.

Needs the network (the package index): marked ``registry``; it runs in CI (``.ci/run``).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from tests.integration.test_wheel_install import _tracked_copy

pytestmark = [pytest.mark.integration, pytest.mark.registry, pytest.mark.minutes]

REPO = Path(__file__).resolve().parents[2]
FLOORED = ("apache-airflow", "apache-airflow-task-sdk", "apache-airflow-providers-docker",
           "apache-airflow-providers-cncf-kubernetes")
EXTRAS = "airflow,docker,kubernetes"


def floors(pyproject: Path = REPO / "pyproject.toml") -> dict[str, str]:
    """``{distribution: lowest allowed version}`` for :data:`FLOORED`, from the extras' ``>=`` bounds."""
    extras = tomllib.loads(pyproject.read_text())["project"]["optional-dependencies"]
    found: dict[str, str] = {}
    for requirement in (r for group in extras.values() for r in group):
        m = re.fullmatch(r"([A-Za-z0-9_.-]+)>=([0-9.]+)", requirement.replace(" ", ""))
        if m and m.group(1) in FLOORED:
            found[m.group(1)] = m.group(2)
    return found


def test_every_floored_distribution_has_a_floor():
    assert set(floors()) == set(FLOORED), floors()
    assert tuple(int(x) for x in floors()["apache-airflow"].split(".")[:2]) >= (3, 2)


@pytest.fixture(scope="module")
def oldest(tmp_path_factory):
    root = tmp_path_factory.mktemp("oldest")
    src = root / "src"
    _tracked_copy(src)
    wheels = root / "wheels"
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w", str(wheels),
                    str(src)], check=True, capture_output=True, text=True)
    wheel = next(wheels.glob("airflow_provider_autodl-*.whl"))
    venv = root / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    py = venv / "bin" / "python"
    pins = [f"{name}=={version}" for name, version in floors().items()]
    install = subprocess.run([str(py), "-m", "pip", "install", "-q", "--disable-pip-version-check",
                              f"airflow-provider-autodl[{EXTRAS}] @ {wheel.as_uri()}", *pins],
                             capture_output=True, text=True)
    assert install.returncode == 0, install.stderr[-4000:]
    work = root / "elsewhere"
    work.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AUTODL_", "AIRFLOW", "PYTHON", "VIRTUAL_ENV"))}
    env.update(AIRFLOW_HOME=str(work / "airflow_home"), AUTODL_HOME=str(work / "autodl_home"),
               AIRFLOW__CORE__LOAD_EXAMPLES="False", PATH=f"{venv / 'bin'}:{env.get('PATH', '')}")
    return {"py": py, "venv": venv, "work": work, "env": env}


def _run(oldest, *argv: str) -> subprocess.CompletedProcess:
    return subprocess.run(list(argv), cwd=oldest["work"], env=oldest["env"], capture_output=True, text=True)


def test_oldest_allowed_airflow_is_what_got_installed(oldest):
    out = _run(oldest, str(oldest["py"]), "-m", "pip", "list", "--format", "freeze")
    installed = dict(line.split("==", 1) for line in out.stdout.splitlines() if "==" in line)
    for name, version in floors().items():
        assert installed.get(name) == version, (name, installed.get(name))
    assert installed.get("airflow-provider-autodl"), "installed under its index name"


def test_operators_and_plugin_import_on_the_oldest_airflow(oldest):
    out = _run(oldest, str(oldest["py"]), "-c",
               "import autodl.operators, autodl.plugin, autodl.operators.hooks, autodl.triggers.collect, "
               "autodl.triggers.pool; from autodl.operators import AutoDLTrainOperator; print('ok')")
    assert out.returncode == 0 and out.stdout.strip().endswith("ok"), out.stderr[-3000:]


def test_airflow_lists_the_connection_type_and_the_provider(oldest):
    behaviours = _run(oldest, str(oldest["venv"] / "bin" / "airflow"), "providers", "behaviours")
    assert behaviours.returncode == 0, behaviours.stderr[-3000:]
    assert "autodl_gpu_host" in behaviours.stdout, behaviours.stdout[-3000:]
    providers = _run(oldest, str(oldest["venv"] / "bin" / "airflow"), "providers", "list")
    assert providers.returncode == 0 and "airflow-provider-autodl" in providers.stdout, providers.stdout[-3000:]
