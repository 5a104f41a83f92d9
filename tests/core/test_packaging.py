"""autodl as a provider people can pip install and recognise (issue 21): its index name, one version
source, licence and metadata, ``--version`` / ``python -m autodl``, and the provider info Airflow reads."""

from __future__ import annotations

import importlib
import importlib.metadata
import json
import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

import autodl

REPO = Path(__file__).resolve().parents[2]
PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())


def test_distribution_name_follows_the_airflow_provider_convention():
    """Seen: `autodl` on the public index is an unrelated 2020 package (TensorFlow, Torch, Keras)."""
    assert PYPROJECT["project"]["name"] == autodl.DISTRIBUTION == "airflow-provider-autodl"
    assert importlib.metadata.version(autodl.DISTRIBUTION) == autodl.__version__


def test_no_message_suggests_the_old_name():
    offenders = []
    for folder in ("plugins", "docker", "scripts", "dags", ".ci"):
        for path in (REPO / folder).rglob("*"):
            if path.is_file() and path.suffix in {".py", ".sh", ".txt", ""} and "__pycache__" not in path.parts:
                text = path.read_text(errors="ignore")
                if re.search(r'pip install \\?"?autodl(\[|\b(?!-))', text) or "\"autodl[" in text:
                    offenders.append(str(path.relative_to(REPO)))
    assert not offenders, offenders
    assert 'pip install "airflow-provider-autodl[docker]"' == autodl.pip_install("docker")


def test_version_is_written_once():
    project = PYPROJECT["project"]
    assert "version" not in project and project["dynamic"] == ["version"]
    assert PYPROJECT["tool"]["setuptools"]["dynamic"]["version"] == {"attr": "autodl.__version__"}
    from autodl.provider import get_provider_info

    assert get_provider_info()["versions"] == [autodl.__version__]
    hits = [p for p in (REPO / "plugins/autodl").rglob("*.py") if re.search(r"^\s*__version__\s*=", p.read_text(), re.M)]
    assert hits == [REPO / "plugins/autodl/__init__.py"], hits


@pytest.mark.parametrize("argv", [["autodl"], [sys.executable, "-m", "autodl"]])
def test_version_flag_and_python_dash_m(argv, tmp_path):
    exe = argv if argv[0] != "autodl" else [str(Path(sys.executable).parent / "autodl")]
    out = subprocess.run([*exe, "--version"], capture_output=True, text=True, cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == f"autodl {autodl.__version__} (airflow-provider-autodl)"


def test_python_dash_m_runs_the_same_cli(tmp_path):
    out = subprocess.run([sys.executable, "-m", "autodl", "plan", "--help"], capture_output=True, text=True, cwd=tmp_path)
    assert out.returncode == 0 and "usage: autodl plan" in out.stdout, out.stderr


def test_license_is_the_full_apache_2_text_and_metadata_is_complete():
    text = (REPO / "LICENSE").read_text()
    assert "Apache License" in text and "Version 2.0, January 2004" in text
    assert "TERMS AND CONDITIONS FOR USE, REPRODUCTION, AND DISTRIBUTION" in text and "END OF TERMS AND CONDITIONS" in text
    assert "4. Redistribution." in text and "9. Accepting Warranty or Additional Liability." in text
    meta = importlib.metadata.metadata(autodl.DISTRIBUTION)
    assert meta["License-Expression"] == "Apache-2.0"
    classifiers = meta.get_all("Classifier")
    assert "Framework :: Apache Airflow :: Provider" in classifiers and "Typing :: Typed" in classifiers
    urls = dict(u.split(", ", 1) for u in meta.get_all("Project-URL"))
    assert {"Homepage", "Documentation", "Source", "Issues"} <= set(urls)
    assert meta["Description-Content-Type"] == "text/markdown" and len(meta.get_payload() or meta["Description"]) > 500
    assert (REPO / "plugins/autodl/py.typed").is_file()
    assert "py.typed" in PYPROJECT["tool"]["setuptools"]["package-data"]["autodl"]


def test_every_extra_has_a_floor_and_airflow_is_at_least_3_2():
    for extra, requirements in PYPROJECT["project"]["optional-dependencies"].items():
        for requirement in requirements:
            assert ">=" in requirement, f"extra {extra}: {requirement} has no floor"
    airflow = next(r for r in PYPROJECT["project"]["optional-dependencies"]["airflow"] if r.startswith("apache-airflow>="))
    assert tuple(int(x) for x in airflow.split(">=")[1].split(".")[:2]) >= (3, 2)


def test_provider_info_passes_airflows_schema_and_declares_the_conventions():
    import importlib.resources

    import jsonschema

    from autodl.operators.connections import TLS_FILE_FIELDS
    from autodl.provider import get_provider_info

    info = get_provider_info()
    schema = json.loads((importlib.resources.files("airflow") / "provider_info.schema.json").read_text())
    jsonschema.validate(info, schema)
    assert info["package-name"] == autodl.DISTRIBUTION
    (conn,) = info["connection-types"]
    assert set(conn["conn-fields"]) == {"base_url", "tls", "tls_verify", "timeout", *TLS_FILE_FIELDS}
    assert "hidden-fields" in conn["ui-field-behaviour"]
    assert importlib.import_module("autodl.operators.hooks").GpuHostHook.conn_type == conn["connection-type"]
    from airflow.triggers.base import BaseTrigger

    modules = info["triggers"][0]["python-modules"]
    assert "autodl.triggers.collect" in modules
    for name in modules:
        module = importlib.import_module(name)
        assert any(isinstance(v, type) and issubclass(v, BaseTrigger) and v is not BaseTrigger
                   for v in vars(module).values()), name
    from airflow.sdk import BaseOperatorLink

    for path in info["extra-links"]:
        module, _, cls = path.rpartition(".")
        assert issubclass(getattr(importlib.import_module(module), cls), BaseOperatorLink)


def test_airflow_lists_the_connection_type_in_its_behaviours(tmp_path):
    """Seen: `airflow providers behaviours` listed no autodl entry (the form came from the deprecated
    get_ui_field_behaviour, loaded only with Flask-AppBuilder)."""
    env = {**os.environ, "AIRFLOW_HOME": str(tmp_path)}
    out = subprocess.run([str(Path(sys.executable).parent / "airflow"), "providers", "behaviours"], capture_output=True,
                         text=True, env=env, cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "autodl_gpu_host" in out.stdout
