"""Several GPU hosts, each with its own Docker engine: a pool spans two hosts and each run's container is
started on the engine of the host its devices were booked on.

Two extra real ``dockerd`` (own sockets, data roots, exec roots, pid files; ``--bridge=none
--iptables=false``) stand for the hosts ``gpu-a`` and ``gpu-b``; the machine's default engine is left
alone and must not see the containers. The DAG runs in-process (``dag.test``); the engines are reached
through the Airflow connections ``docker_gpu_a`` / ``docker_gpu_b`` (``AIRFLOW_CONN_*`` variables), as
a deployment would declare them.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

from autodl.records import RecordStore
from tests.airflow.conftest import airflow_db  # noqa: F401 - the fixture, for this module
from tests.airflow.test_multi_host import CASES, build_dag, run_on, serialize
from tests.integration.conftest import IMAGE, _rootfs_tar, require_service
from tests.integration.engines import Engine, start, stop

pytestmark = [pytest.mark.integration, pytest.mark.airflow]

HOSTS = ("gpu-a", "gpu-b")


@pytest.fixture(scope="module")
def engines():
    """Two extra dockerd with the test image imported into each; stopped (by pid) and deleted after."""
    usable = os.geteuid() == 0 and shutil.which("dockerd") and shutil.which("docker") and Path("/bin/busybox").is_file()
    require_service(bool(usable), "dockerd (as root), the docker CLI and /bin/busybox",
                    "run `source .ci/docker.sh` as root (installs Debian's docker.io and busybox-static)")
    root = Path(tempfile.mkdtemp(prefix="adl-", dir="/tmp"))  # short: unix socket paths under it
    started = [Engine(name, root / name[-1]) for name in HOSTS]
    try:
        try:
            start(started)
        except RuntimeError as exc:
            require_service(False, "extra Docker engines", str(exc))
        tar = _rootfs_tar()
        for engine in started:
            subprocess.run(["docker", "-H", engine.base_url, "import", "--change", "ENV PATH=/bin", "-", IMAGE],
                           input=tar, check=True, capture_output=True)
        yield {e.name: e for e in started}
    finally:
        stop(started)
        shutil.rmtree(root, ignore_errors=True)


def _containers(base_url: str, run_key: str) -> list[dict]:
    import docker

    client = docker.DockerClient(base_url=base_url, timeout=30)
    try:
        return [{"name": c.name, "status": c.status, "logs": c.logs().decode()}
                for c in client.containers.list(all=True, filters={"label": f"autodl.run_key={run_key}"})]
    finally:
        client.close()


def test_each_run_starts_its_container_on_its_hosts_engine(airflow_db, engines, monkeypatch):
    for name, engine in engines.items():
        conn = {"conn_type": "autodl_gpu_host", "extra": {"base_url": engine.base_url}}
        monkeypatch.setenv(f"AIRFLOW_CONN_DOCKER_{name.upper().replace('-', '_')}", json.dumps(conn))
    monkeypatch.delenv("AUTODL_HOST_QUEUES", raising=False)
    dag = build_dag("autodl_two_hosts_docker", CASES / "spec_docker.yaml", CASES / "pool_two_hosts.yaml")
    serialize(dag)
    default_engine = os.environ.get("DOCKER_HOST") or "unix:///var/run/docker.sock"
    for host, busy in (("gpu-a", "gpu-b"), ("gpu-b", "gpu-a")):
        dr, tis = run_on(dag, busy)
        assert all(state == "success" for state, _ in tis.values()), tis
        run_key = f"autodl_two_hosts_docker.train.{dr.run_id}"
        record = RecordStore().get(run_key)
        assert record.outcome == "succeeded" and record.placement["host"] == host and record.launch["host"] == host
        here = _containers(engines[host].base_url, run_key)
        assert len(here) == 1 and here[0]["status"] == "exited", here
        assert f"trained run {run_key}" in here[0]["logs"] and "/workspace/train.py" in here[0]["logs"]
        other = next(e for n, e in engines.items() if n != host)
        assert _containers(other.base_url, run_key) == []
        if Path(default_engine.removeprefix("unix://")).exists():
            assert _containers(default_engine, run_key) == []
