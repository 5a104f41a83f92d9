"""autodl as people install it: the wheel built from this repository, installed into a fresh virtual
environment, used from a folder outside the checkout.

Seen before (issue 12): ``pip install ".[airflow]"`` gave a package whose every command exited 8,
because the GPU catalog, vendor table and demo pool were found by walking up from the module file and
were not in the wheel.

No network: the wheel is built from a copy of the tracked files with this environment's setuptools
(``--no-build-isolation``); the fresh environment sees this environment's already-installed packages
through a ``.pth`` overlay (every distribution but autodl itself), and pip installs the wheel with
``--no-index --find-links``, resolving its dependencies against those installed packages. So a dependency missing from
``pyproject.toml`` is not seen here (the overlay has it): ``tests/core/test_dependencies.py`` checks that.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
SKIP_IN_OVERLAY = ("autodl", "airflow_provider_autodl", "__editable__", "_distutils_hack", "pip", "setuptools", "pkg_resources", "wheel")


def _tracked_copy(dest: Path) -> None:
    """The repository's tracked files (what a clone has), symlinks kept (plugins/autodl/include)."""
    files = subprocess.run(["git", "ls-files", "-z"], cwd=REPO, capture_output=True, check=True).stdout.split(b"\0")
    for name in filter(None, (f.decode() for f in files)):
        src, dst = REPO / name, dest / name
        if not src.exists() and not src.is_symlink():
            continue  # deleted in the work tree, not yet committed
        dst.parent.mkdir(parents=True, exist_ok=True)
        if src.is_symlink():
            dst.symlink_to(os.readlink(src))
        else:
            shutil.copy2(src, dst)


def _overlay(dest: Path) -> Path:
    """A folder of links to this environment's installed packages, autodl and the installers left out."""
    dest.mkdir()
    source = Path(sysconfig.get_paths()["purelib"])
    for entry in source.iterdir():
        name = entry.name
        if name.endswith(".pth") or name == "__pycache__" or name.lower().startswith(SKIP_IN_OVERLAY):
            continue
        (dest / name).symlink_to(entry)
    return dest


def _fresh_venv(root: Path) -> tuple[Path, Path]:
    """A new virtual environment that sees this one's installed packages (autodl left out): (python, purelib)."""
    venv = root / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    py = venv / "bin" / "python"
    purelib = subprocess.run([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                             capture_output=True, text=True, check=True).stdout.strip()
    Path(purelib, "_autodl_test_overlay.pth").write_text(str(_overlay(root / "overlay")) + "\n")
    return py, Path(purelib)


def _outside_env(work: Path, venv: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("AUTODL_", "AIRFLOW", "PYTHON", "VIRTUAL_ENV"))}
    env.update(AIRFLOW_HOME=str(work / "airflow_home"), AUTODL_HOME=str(work / "autodl_home"),
               AIRFLOW__CORE__LOAD_EXAMPLES="False", AIRFLOW__CORE__PLUGINS_FOLDER=str(work / "plugins"),
               AIRFLOW__CORE__DAGS_FOLDER=str(work / "dags"), PATH=f"{venv / 'bin'}:{env.get('PATH', '')}")
    return env


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    root = tmp_path_factory.mktemp("wheel")
    src = root / "src"
    _tracked_copy(src)
    wheels = root / "wheels"
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w", str(wheels),
                    str(src)], check=True, capture_output=True, text=True)
    wheel = next(wheels.glob("airflow_provider_autodl-*.whl"))
    py, purelib = _fresh_venv(root)
    venv = py.parent.parent
    subprocess.run([str(py), "-m", "pip", "install", "-q", "--no-index", "--find-links", str(wheels),
                    f"airflow-provider-autodl[airflow,docker,kubernetes] @ {wheel.as_uri()}"], check=True, capture_output=True, text=True)
    work = root / "elsewhere"
    (work / "plugins").mkdir(parents=True)
    return {"wheel": wheel, "venv": venv, "py": py, "work": work, "env": _outside_env(work, venv), "purelib": purelib}


def _run(installed, *argv: str) -> subprocess.CompletedProcess:
    return subprocess.run(list(argv), cwd=installed["work"], env=installed["env"], capture_output=True, text=True)


def test_wheel_carries_the_shipped_files(installed):
    names = zipfile.ZipFile(installed["wheel"]).namelist()
    for needed in ("autodl/include/catalog/gpus.yaml", "autodl/include/catalog/vendors.yaml",
                   "autodl/include/pools/demo.yaml", "autodl/include/specs/simple_cnn.yaml",
                   "autodl/include/scripts/simple_cnn.py", "autodl/include/data/gpu-relative-throughput.csv",
                   "autodl/include/data/README.md"):
        assert needed in names, needed
    # the simulator and its 3.4 MB trace are their own distribution (sim/, autodl-sim), not the product's
    assert not [n for n in names if n.startswith("autodl/simulate/") or n.endswith("philly-jobs.csv")], names
    assert not [n for n in names if "__pycache__" in n or n.endswith(".pyc")]
    assert "autodl/py.typed" in names and "autodl/__main__.py" in names
    assert any(n.endswith(".dist-info/licenses/LICENSE") for n in names), "the Apache-2.0 text goes with the wheel"
    meta = next(n for n in names if n.endswith(".dist-info/entry_points.txt"))
    entry_points = zipfile.ZipFile(installed["wheel"]).read(meta).decode()
    for line in ("provider_info = autodl.provider:get_provider_info", "autodl = autodl.plugin:AutoDLPlugin",
                 "autodl = autodl.policies"):
        assert line in entry_points


def test_installed_package_finds_its_files_outside_the_checkout(installed):
    out = _run(installed, str(installed["py"]), "-c",
               "import autodl, json; from autodl.config import include_dir; "
               "print(json.dumps({'module': autodl.__file__, 'include': str(include_dir())}))")
    assert out.returncode == 0, out.stderr
    where = json.loads(out.stdout)
    assert Path(where["module"]).is_relative_to(installed["purelib"]), where
    assert Path(where["include"]) == installed["purelib"] / "autodl" / "include"


def test_autodl_plan_runs_from_the_installed_package(installed):
    include = installed["purelib"] / "autodl" / "include"
    out = _run(installed, str(installed["venv"] / "bin" / "autodl"), "plan", str(include / "specs" / "simple_cnn.yaml"),
               "--json")
    assert out.returncode == 0, out.stderr
    plan = json.loads(out.stdout)
    assert plan["fits"] is True and plan["placements"], plan
    inventory = _run(installed, str(installed["venv"] / "bin" / "autodl"), "inventory", "--json")
    assert inventory.returncode == 0, inventory.stderr
    assert str(include / "pools" / "demo.yaml") in inventory.stdout or "nvml" in inventory.stdout


PARSE = """
import json
from airflow.dag_processing.dagbag import DagBag
from airflow import plugins_manager
from airflow.providers_manager import ProvidersManager
bag = DagBag(dag_folder="dags")
plugins, errors = plugins_manager._get_plugins()
provider = ProvidersManager().providers.get("airflow-provider-autodl")
print(json.dumps({"dags": sorted(bag.dag_ids), "import_errors": {str(k): str(v) for k, v in bag.import_errors.items()},
                  "plugins": [p.name for p in plugins], "plugin_errors": {str(k): str(v) for k, v in errors.items()},
                  "provider": provider.version if provider else None}))
"""


def test_example_dags_parse_against_the_installed_provider(installed):
    shutil.copytree(REPO / "dags", installed["work"] / "dags", ignore=shutil.ignore_patterns("__pycache__"))
    out = _run(installed, str(installed["py"]), "-c", PARSE)
    assert out.returncode == 0, out.stderr[-3000:]
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["import_errors"] == {} and result["plugin_errors"] == {}, result
    assert {"autodl_train_simple_cnn", "autodl_train_docker", "autodl_train_multi_gpu"} <= set(result["dags"])
    assert result["plugins"].count("autodl") == 1, result
    assert result["provider"] == "0.1.0"


def test_package_dropped_into_the_plugins_folder_registers_once(tmp_path):
    """Not installed: the package, the top-level plugin file and .airflowignore copied into Airflow's plugins
    folder (the include link followed) give one plugin, and the example DAGs parse against it."""
    py, purelib = _fresh_venv(tmp_path)
    work = tmp_path / "airflow_deployment"
    plugins = work / "plugins"
    plugins.mkdir(parents=True)
    shutil.copytree(REPO / "plugins" / "autodl", plugins / "autodl", symlinks=False,
                    ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("autodl_plugin.py", ".airflowignore"):
        shutil.copy2(REPO / "plugins" / name, plugins / name)
    shutil.copytree(REPO / "dags", work / "dags", ignore=shutil.ignore_patterns("__pycache__"))
    env = _outside_env(work, py.parent.parent)
    out = subprocess.run([str(py), "-c", PARSE], cwd=work, env=env, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr[-3000:]
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["plugins"] == ["autodl"] and result["plugin_errors"] == {}, result
    assert result["import_errors"] == {} and "autodl_train_simple_cnn" in result["dags"], result
    assert result["provider"] is None  # no entry points without pip install
    where = subprocess.run([str(py), "-c", "import sys; sys.path.insert(0, 'plugins'); import autodl.config as c; "
                            "print(c.include_dir())"], cwd=work, env=env, capture_output=True, text=True, check=True)
    assert Path(where.stdout.strip()) == plugins / "autodl" / "include"
