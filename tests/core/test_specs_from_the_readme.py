"""autodl as a new user meets it: task specs written from the README alone, commands run outside the
checkout, the demo's Airflow environment after building the wheel.

Seen (helper "newuser", a fresh clone and a fresh ``pip install`` of the wheel):

- ``task: {batch_size: 128}`` was refused as ``unknown key 'task.batch_size'; remove it or check its
  spelling`` without saying the key is ``batch_size_per_gpu``; a key under the wrong section
  (``scheduler.memory_threshold``) got the same words;
- outside the checkout the README's ``autodl plan include/specs/simple_cnn.yaml`` said only "spec file not
  found", and ``--pool include/pools/demo.yaml`` suggested that same missing path: where the shipped
  examples are was said nowhere;
- after ``pip wheel .`` in the checkout, the demo's Airflow reported "Plugin 'autodl' already registered"
  (the build leaves ``plugins/autodl.egg-info``, on Airflow's ``sys.path``).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from autodl.config import include_dir
from autodl.errors import LaunchError, SpecError
from autodl.launch import get_launcher
from autodl.spec import parse_spec
from tests.cli_helpers import CliResult

REPO = Path(__file__).resolve().parents[2]
CASES = REPO / "tests" / "cases" / "newuser"


@pytest.fixture()
def outside(autodl):
    """``autodl ARGS`` in this process, run from ``cwd`` (not the checkout), AUTODL_DEBUG unset (the test's own
    AUTODL_HOME: tests/conftest.py); the exit status is the test's to check."""

    def run(*args: str, cwd: Path) -> CliResult:
        return autodl(*args, cwd=cwd, env={"AUTODL_DEBUG": None}, check=False)

    return run


@pytest.fixture()
def user_folder(tmp_path):
    """The user's project folder, outside the checkout: their script and the specs they wrote."""
    for name in ("mlp.py", "a_wrong_field.yaml", "b_wrong_type.yaml", "c_missing_script.yaml"):
        shutil.copy(CASES / name, tmp_path / name)
    return tmp_path


@pytest.mark.parametrize("command", ["plan", "profile"])
@pytest.mark.parametrize("spec,expected", [
    ("a_wrong_field.yaml", ["unknown key 'task.batch_size' (did you mean 'batch_size_per_gpu'?)",
                            "unknown key 'scheduler.memory_threshold'; it belongs under 'resource_policy:'"]),
    ("b_wrong_type.yaml", ["field 'task.batch_size_per_gpu': Input should be a valid integer (got 'large')",
                           "field 'resource_policy.memory_threshold': Input should be a valid number (got '85%')",
                           "field 'scheduler.timeout'"]),
    ("c_missing_script.yaml", ["field 'task.script' names", "train/mlp.py: does not exist",
                               "fix task.script (relative to the spec file)"]),
])
def test_a_new_users_spec_mistakes_are_named_with_their_fix(outside, user_folder, command, spec, expected):
    """Each of the three specs fails with exit 2 (a spec error), the file named, every mistake named with its
    fix, and no traceback, from ``plan`` and from ``profile`` alike."""
    args = ["plan", spec] if command == "plan" else ["profile", "--spec", spec, "--no-probe"]  # the spec's script
    proc = outside(*args, cwd=user_folder)
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr + proc.stdout
    assert proc.stderr.startswith(f"autodl: error: ") and spec in proc.stderr
    for words in expected:
        assert words in proc.stderr


@pytest.mark.parametrize("data,hint", [
    ({"task": {"num_gpus": 2}}, "unknown key 'task.num_gpus' (did you mean 'num_gpus_estimate'?)"),
    ({"resource_policy": {"preferred_device": ["T4"]}},
     "unknown key 'resource_policy.preferred_device' (did you mean 'preferred_devices'?)"),
    ({"schedular": {"timeout": 5}}, "unknown key 'schedular' (did you mean 'scheduler'?)"),
    ({"task": {"timeout": 5}}, "unknown key 'task.timeout'; it belongs under 'scheduler:', move it there"),
    ({"launcher": {"type": "docker", "mounts": [{"sorce": "/data", "target": "/d"}]}},
     "unknown key 'launcher.mounts.0.sorce' (did you mean 'source'?)"),
    ({"task": {"zzz": 1}}, "unknown key 'task.zzz'; remove it or check its spelling."),
    ({"task": {"x" * 5000: 1}}, "; remove it or check its spelling."),
])
def test_an_unknown_key_says_the_key_it_probably_is(data, hint):
    with pytest.raises(SpecError) as exc:
        parse_spec(data, "user.yaml")
    assert hint in str(exc.value) and "user.yaml" in str(exc.value)


@pytest.mark.parametrize("args,kind", [
    (["plan", "include/specs/simple_cnn.yaml"], "specs"),
    (["profile", "include/scripts/simple_cnn.py", "--no-probe"], "scripts"),
    (["inventory", "--pool", "include/pools/demo.yaml"], "pools"),
])
def test_the_readmes_relative_paths_outside_the_checkout_say_where_the_examples_are(outside, tmp_path, args, kind):
    """The README's commands use paths of the checkout; run elsewhere, the error names the installed examples."""
    proc = outside(*args, cwd=tmp_path)
    assert proc.returncode != 0 and "Traceback" not in proc.stderr
    folder = include_dir() / kind
    assert f"autodl's example {kind} are in {folder}: " in proc.stderr
    example = {"specs": "simple_cnn.yaml", "scripts": "simple_cnn.py", "pools": "demo.yaml"}[kind]
    assert (folder / example).is_file() and example in proc.stderr


def test_airflow_env_removes_the_egg_info_a_build_leaves_in_plugins(tmp_path):
    """``source scripts/airflow_env.sh`` (the demo, the README's ``airflow dags test``) after ``pip wheel .``."""
    (tmp_path / "scripts").mkdir()
    shutil.copy(REPO / "scripts" / "airflow_env.sh", tmp_path / "scripts" / "airflow_env.sh")
    stale = tmp_path / "plugins" / "autodl.egg-info"
    stale.mkdir(parents=True)
    (stale / "entry_points.txt").write_text("[airflow.plugins]\nautodl = autodl.plugin:AutoDLPlugin\n")
    (tmp_path / "plugins" / "autodl").mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AIRFLOW", "AUTODL_"))}
    out = subprocess.run(["bash", "-c", "source scripts/airflow_env.sh && echo $AIRFLOW__CORE__PLUGINS_FOLDER"],
                         cwd=tmp_path, env=env, capture_output=True, text=True, check=True).stdout.strip()
    assert out == str(tmp_path / "plugins")
    assert not stale.exists() and (tmp_path / "plugins" / "autodl").is_dir()


def test_a_union_fields_errors_are_one_line_naming_the_key_of_the_file():
    """Seen: ``num_gpus_estimate: two`` gave two lines, for ``task.num_gpus_estimate.constrained-int`` and
    ``task.num_gpus_estimate.literal['auto']``: names of pydantic's union members, no key of the file."""
    with pytest.raises(SpecError) as exc:
        parse_spec({"task": {"num_gpus_estimate": "two"}}, "user.yaml")
    assert str(exc.value) == ("user.yaml: field 'task.num_gpus_estimate': Input should be a valid integer or 'auto' "
                              "(got 'two').")


@pytest.mark.parametrize("name", ["x" * 300, "a\0b", "missing.yaml"])
def test_the_examples_hint_never_raises_on_a_path_it_cannot_check(tmp_path, name):
    """Seen (the fuzz suite): ``Path.exists`` raised ``OSError: [Errno 36] File name too long`` inside the
    "pool file not found" message. The hint checks with ``os.path.exists`` (False there) and never raises."""
    from autodl.config import shipped_hint

    assert shipped_hint("pools", tmp_path / name).startswith(" (autodl's example pools are in ")
    assert shipped_hint("pools", tmp_path) == ""  # it exists: the error is about something else


@pytest.mark.parametrize("launcher", ["docker", "kubernetes"])
def test_a_launcher_whose_extra_is_not_installed_is_a_launch_error_naming_the_extra(outside, tmp_path, launcher):
    """Seen (a fresh ``pip install autodl`` without extras): ``autodl plan include/specs/simple_cnn_docker.yaml`` said
    ``internal error (plan): ModuleNotFoundError: No module named 'docker'; this is a bug in autodl`` (exit 1): the
    launchers import their client lazily, so the missing extra surfaced deep in the render."""
    spec = tmp_path / "spec.yaml"
    spec.write_text(f"task: {{script: {include_dir() / 'scripts' / 'simple_cnn.py'}, input_shape: [3, 32, 32]}}\n"
                    f"launcher: {{type: {launcher}}}\n")
    with pytest.MonkeyPatch.context() as mp:
        mp.setitem(sys.modules, launcher, None)  # not installed: `import docker` raises ImportError
        proc = outside("plan", str(spec), "--no-probe", "--pool", str(include_dir() / "pools" / "demo.yaml"),
                       cwd=tmp_path)
    # the placement is still shown (exit 0); what it would launch is replaced by the launch error
    assert proc.returncode == 0, proc.stderr
    assert "Traceback" not in proc.stderr + proc.stdout and "internal error" not in proc.stderr
    out = " ".join(proc.stdout.split())  # rich wraps long lines
    assert "A100-SXM4-40GB" in out and "what it would run cannot be shown here:" in out
    assert f"launcher '{launcher}' needs the Python package '{launcher}'" in out
    assert f'pip install "airflow-provider-autodl[{launcher}]"' in out
    with pytest.MonkeyPatch.context() as mp, pytest.raises(LaunchError, match=rf'pip install "airflow-provider-autodl\[{launcher}\]"'):
        mp.setitem(sys.modules, launcher, None)  # the Airflow steps get the launcher the same way
        get_launcher(launcher)


def test_a_mistyped_example_name_is_answered_with_the_closest_shipped_file(tmp_path):
    """A fresh user: `--pool dem` listed the example pools but did not say which one was meant."""
    from autodl.config import include_dir, shipped_hint

    assert shipped_hint("pools", tmp_path / "dem").endswith(f"did you mean {include_dir() / 'pools' / 'demo.yaml'}?)")
    assert shipped_hint("scripts", tmp_path / "simple_cn.py").endswith(
        f"did you mean {include_dir() / 'scripts' / 'simple_cnn.py'}?)")
    assert "did you mean" not in shipped_hint("pools", tmp_path / "zzzzzz")
