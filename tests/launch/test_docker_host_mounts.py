"""The Docker launcher checks a run's mounts against the host that mounts them, at launch (issue 20 item 6).

What a mount's path names (``/``, ``/proc``, ``/var/run/docker.sock``) is the spec's check, anywhere; what depends
on the host (its live Unix sockets, its symlinks, ``DOCKER_HOST``, autodl's and Airflow's state there) is checked
by :meth:`DockerLauncher.create`, before the engine is asked for anything. The machine that validates a spec (the
scheduler, a worker without Docker, a laptop running ``autodl plan``) is often not the GPU host that mounts.
"""

from __future__ import annotations

import socket

import pytest

from autodl.errors import SpecError
from autodl.launch.base import LaunchRequest
from autodl.launch.docker import DockerLauncher
from autodl.spec import parse_spec


class UntouchedEngine:
    """A Docker client that fails the test if the launcher asks it for anything: a refused mount stops first."""

    def __getattr__(self, name):
        raise AssertionError(f"the engine was asked for {name} before the mounts were checked")


def launch_with_mount(script, source: str) -> None:
    """Validate a docker spec mounting ``source`` (as the scheduler does), then create its container (as the GPU
    host's worker does)."""
    spec = parse_spec({"task": {"script": str(script)},
                       "launcher": {"type": "docker", "mounts": [{"source": source, "target": "/data"}]}})
    request = LaunchRequest(run_key="dag_a/manual__1/train", script=str(script), devices=[], on_cpu=True,
                            options=spec.launcher.model_dump(exclude={"type"}))
    DockerLauncher(client=UntouchedEngine()).create(request)


def test_a_folder_holding_a_socket_of_this_host_validates_but_the_launcher_refuses_it_at_launch(script, tmp_path):
    """Seen: ``/tmp`` (holding PostgreSQL's ``.s.PGSQL.55432``, trust authentication) mounted read-only was
    accepted; a read-only mount does not stop ``connect()``, so the training could edit autodl's leases. The socket
    lives on the host that mounts: the spec validates on any machine, the launcher refuses it where it mounts."""
    folder = tmp_path / "with-socket"
    (folder / "sub").mkdir(parents=True)
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(str(folder / "sub" / ".s.PGSQL.5432"))
    server.listen(1)
    try:
        spec = parse_spec({"launcher": {"type": "docker", "mounts": [{"source": str(folder), "target": "/d"}]}})
        assert spec.launcher.mounts[0].source == str(folder)  # no host check at validation
        with pytest.raises(SpecError) as err:
            launch_with_mount(script, str(folder))
    finally:
        server.close()
    text = str(err.value)
    assert "field 'launcher.mounts.0.source'" in text and "Unix socket" in text and ".s.PGSQL.5432" in text, text
    assert "mount a folder without sockets" in text and "run dag_a/manual__1/train" in text, text


@pytest.mark.parametrize("which", ["home", "inside-home", "holds-home", "store-db", "airflow-home"])
def test_autodl_and_airflow_state_of_the_mounting_host_is_never_mounted(script, monkeypatch, tmp_path, which):
    """Seen: mounts of AUTODL_HOME (every run's folder), the store's SQLite file (leases) and AIRFLOW_HOME
    (airflow.cfg) were accepted. They are the launching host's: its environment names them."""
    home = tmp_path / "state" / "autodl-home"
    (home / "runs" / "other-run").mkdir(parents=True)
    airflow = tmp_path / "airflow"
    airflow.mkdir()
    monkeypatch.setenv("AUTODL_HOME", str(home))
    monkeypatch.setenv("AIRFLOW_HOME", str(airflow))
    monkeypatch.setenv("AUTODL_STORE_URL", f"sqlite:///{tmp_path / 'db' / 'autodl.db'}")
    source = {"home": home, "inside-home": home / "runs" / "other-run", "holds-home": tmp_path / "state",
              "store-db": tmp_path / "db" / "autodl.db", "airflow-home": airflow}[which]
    with pytest.raises(SpecError, match=r"field 'launcher.mounts.0.source': .* own state"):
        launch_with_mount(script, str(source))


def test_a_mount_through_a_symlink_to_the_socket_folder_is_refused_at_launch(script, tmp_path):
    link = tmp_path / "innocent"
    link.symlink_to("/run")
    parse_spec({"launcher": {"type": "docker", "mounts": [{"source": str(link), "target": "/d"}]}})
    with pytest.raises(SpecError, match=r"field 'launcher.mounts.0.source': .* is or contains the container engine's "
                                        r"socket"):
        launch_with_mount(script, str(link))


def test_the_folder_of_this_hosts_docker_host_socket_is_refused_at_launch(script, tmp_path, monkeypatch):
    """A rootless or relocated engine (``DOCKER_HOST=unix:///srv/engine/docker.sock``) is found by the launching
    host's own ``DOCKER_HOST``, not the validating machine's."""
    engine = tmp_path / "engine"
    engine.mkdir()
    monkeypatch.setenv("DOCKER_HOST", f"unix://{engine / 'docker.sock'}")
    parse_spec({"launcher": {"type": "docker", "mounts": [{"source": str(engine), "target": "/d"}]}})
    with pytest.raises(SpecError, match=r"container engine's socket .*mount a data folder that does not hold it"):
        launch_with_mount(script, str(engine))


def test_a_plain_data_folder_passes_the_launch_check(script, tmp_path):
    """The check refuses what the host would give away, not every mount: a data folder reaches the engine."""
    data = tmp_path / "datasets"
    data.mkdir()
    with pytest.raises(AssertionError, match="the engine was asked for"):
        launch_with_mount(script, str(data))
