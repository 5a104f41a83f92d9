"""A profile where the worker cannot run the script (issue 17, item 5): Paddle is not importable by the worker
(``paddle_available`` says so, as on an Airflow worker without the paddle extra), so the dry run runs in a
container of the launcher's image on the real dockerd -- and measures what the worker's bubblewrap dry run
measures for the same script."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import yaml

import autodl.profile as prof
from autodl import pipeline
from autodl.profile import profile_script
from autodl.spec import load_spec
from tests.integration import paddle_image

pytestmark = [pytest.mark.integration, pytest.mark.slow]

FIX = Path(__file__).resolve().parents[1] / "profile" / "fixtures"


@pytest.fixture
def spec_file(tmp_path, docker_client):
    image = paddle_image.build(docker_client)
    code = tmp_path / "code"
    code.mkdir()
    shutil.copy(FIX / "simple_cnn.py", code / "train.py")
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump({
        "task": {"script": "code/train.py", "batch_size_per_gpu": 32},
        "launcher": {"type": "docker", "image": image, "image_pull_policy": "Never", "network": "none",
                     "python": paddle_image.python_in_container(), "mounts": paddle_image.python_mounts()}}))
    return path


def test_without_paddle_on_the_worker_the_container_measures_what_the_sandbox_does(spec_file, monkeypatch,
                                                                                  sandbox_level):
    spec = load_spec(spec_file)
    script = spec.script_path()
    here = profile_script(script, spec)  # the worker's own sandbox: Paddle and bubblewrap work here
    assert here.dry_run_in == "worker" and here.method == "dry_run"
    monkeypatch.setattr(prof, "paddle_available", lambda: False)
    there = profile_script(script, spec)
    assert there.dry_run_in == "docker" and there.method == "dry_run", there.method_reason
    assert "PaddlePaddle is not installed on this worker" in there.method_reason
    assert not [f for f in there.findings if f.code == "paddle-unavailable"]
    # the same child, the same batch schedule, the same Paddle: the same allocator readings
    assert there.tensor_peak_bytes == here.tensor_peak_bytes
    assert there.peak_memory_bytes == here.peak_memory_bytes and there.params == here.params
    assert there.phases[0].measured == here.phases[0].measured


def test_the_profile_step_says_where_it_ran(spec_file, monkeypatch):
    """Forced with the configuration: the profile step's result and its log say it ran in the launcher's image."""
    monkeypatch.setenv("AUTODL_DRY_RUN_IN", "launcher")
    lines: list[str] = []
    seen: list[str] = []

    def kwargs_for(launcher_type):
        seen.append(launcher_type)
        return {}

    out = pipeline.step_profile(None, str(spec_file), pool=str(Path(__file__).resolve().parents[2] / "include" / "pools" / "demo.yaml"), log=lines.append,
                                launcher_kwargs_for=kwargs_for)
    assert seen == ["docker"]
    assert out.profiled_in == "docker" and out.profile.method == "dry_run"
    assert "profile ran in: docker (a container of the launcher's image)" in lines
    assert any("dry_run_in is launcher: the dry run ran in the launcher's image (docker)" in f.message
               for f in out.profile.findings if f.code == "estimate-path")


@pytest.mark.parametrize("reader", ["PodManager", "client without the provider"])
def test_the_dry_run_pod_measures_what_the_sandbox_does(spec_file, docker_client, monkeypatch, reader):
    """The pod of :func:`autodl.profile.pod.dry_run_pod`, run by a one-node stand-in of the API on the real dockerd
    (``tests/integration/pod_standin.py``: no cluster here), its report read with the cncf provider's PodManager
    (or, where the provider is not installed, the client's log call) from the pod's one log stream: the same figure
    as the worker's sandbox."""
    import sys

    from tests.integration.pod_standin import DockerPodApi

    if reader != "PodManager":
        monkeypatch.setitem(sys.modules, "airflow.providers.cncf.kubernetes.utils.pod_manager", None)

    spec = load_spec(spec_file)
    script = spec.script_path()
    here = profile_script(script, spec)
    from autodl.spec import with_launcher_type

    launcher = with_launcher_type(spec.launcher, "kubernetes").model_copy(update={"code_pvc": "team-code",
                                                                                 "code_dir": "/opt/code"})
    k8s_spec = spec.model_copy(update={"launcher": launcher})
    api = DockerPodApi(docker_client, claims={"team-code": str(script.parent)},
                       image_binds=paddle_image.python_mounts())
    monkeypatch.setattr(prof, "paddle_available", lambda: False)
    there = profile_script(script, k8s_spec, engine={"api": api})
    assert there.dry_run_in == "kubernetes" and there.method == "dry_run", there.method_reason
    assert there.tensor_peak_bytes == here.tensor_peak_bytes and there.phases[0].measured == here.phases[0].measured
    assert api.pods == {}  # deleted
    assert not docker_client.containers.list(all=True, filters={"label": "autodl.test=pod-standin"})
    assert not [v for v in docker_client.volumes.list() if v.name.startswith("standin-")]


def test_a_package_only_the_image_has_is_measured_in_the_image(tmp_path, docker_client):
    """The worker has Paddle but not the team's package (in the image, here a read-only mount on its
    PYTHONPATH): on the worker the script stops on its import; the dry run runs again in the image and measures."""
    image = paddle_image.build(docker_client)
    pkgs = tmp_path / "pkgs" / "teampkg"
    pkgs.mkdir(parents=True)
    (pkgs / "__init__.py").write_text("WIDTH = 1\n")
    code = tmp_path / "code"
    code.mkdir()
    (code / "train.py").write_text("import teampkg  # only in the training's image\n" + (FIX / "simple_cnn.py").read_text())
    spec_path = tmp_path / "spec.yaml"
    spec_path.write_text(yaml.safe_dump({
        "task": {"script": "code/train.py", "batch_size_per_gpu": 32},
        "launcher": {"type": "docker", "image": image, "image_pull_policy": "Never", "env": {"PYTHONPATH": "/opt/pkgs"},
                     "python": paddle_image.python_in_container(),
                     "mounts": [*paddle_image.python_mounts(),
                                {"source": str(tmp_path / "pkgs"), "target": "/opt/pkgs", "read_only": True}]}}))
    spec = load_spec(spec_path)
    p = profile_script(spec.script_path(), spec)
    assert p.method == "dry_run" and p.dry_run_in == "docker", p.method_reason
    (note,) = [f for f in p.findings if f.code == "dry-run-where"]
    assert "No module named 'teampkg'" in note.message and "launcher's image (docker)" in note.message
