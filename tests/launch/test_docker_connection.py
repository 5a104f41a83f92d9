"""launcher_kwargs('docker'): the Airflow connection docker_default read through DockerHook."""

from __future__ import annotations

import json

import pytest

from autodl.launch import get_launcher
from autodl.operators.connections import launcher_kwargs

pytest.importorskip("airflow.providers.docker")


def test_absent_connection_means_defaults(monkeypatch):
    monkeypatch.delenv("AIRFLOW_CONN_DOCKER_DEFAULT", raising=False)
    assert launcher_kwargs("docker") == {}
    assert launcher_kwargs("local") == {}


def test_engine_from_extra_registry_from_fields(monkeypatch):
    conn = {"conn_type": "docker", "host": "registry.example.org", "port": 5000, "login": "bot",
            "password": "s3cret-token", "extra": {"base_url": "unix:///run/user/1000/docker.sock", "tls": "false",
                                                   "reauth": "no", "timeout": "30"}}
    monkeypatch.setenv("AIRFLOW_CONN_DOCKER_DEFAULT", json.dumps(conn))
    kwargs = launcher_kwargs("docker")
    assert kwargs == {
        "base_url": "unix:///run/user/1000/docker.sock", "tls": False, "timeout": 30,
        "registry": {"registry": "registry.example.org:5000", "username": "bot", "password": "s3cret-token",
                     "email": None, "reauth": False},
    }
    launcher = get_launcher("docker", **kwargs)
    assert launcher.base_url == "unix:///run/user/1000/docker.sock" and launcher.registry["username"] == "bot"


def test_docker_url_synonym_and_no_registry_without_login(monkeypatch):
    conn = {"conn_type": "docker", "host": "registry.example.org", "extra": {"docker_url": "tcp://127.0.0.1:2376"}}
    monkeypatch.setenv("AIRFLOW_CONN_DOCKER_DEFAULT", json.dumps(conn))
    assert launcher_kwargs("docker") == {"base_url": "tcp://127.0.0.1:2376"}


def test_each_gpu_host_has_its_own_engine_connection(monkeypatch):
    """A pool spans hosts: the booked host's connection docker_<host> gives the engine, docker_default the
    registry; a host without a connection uses docker_default's engine."""
    from autodl.operators.connections import host_conn_id

    assert host_conn_id("GPU-Node-2.lab") == "docker_gpu_node_2_lab"
    monkeypatch.setenv("AIRFLOW_CONN_DOCKER_DEFAULT", json.dumps(
        {"conn_type": "docker", "host": "registry.example.org", "login": "bot", "password": "pw",
         "extra": {"base_url": "unix:///var/run/docker.sock", "tls": "true"}}))
    monkeypatch.setenv("AIRFLOW_CONN_DOCKER_GPU_NODE_2_LAB", json.dumps(
        {"conn_type": "autodl_gpu_host", "extra": {"base_url": "tcp://gpu-node-2.lab:2375"}}))
    node2 = launcher_kwargs("docker", "GPU-Node-2.lab")
    assert node2["base_url"] == "tcp://gpu-node-2.lab:2375" and "tls" not in node2
    assert node2["registry"]["username"] == "bot"
    other = launcher_kwargs("docker", "gpu-node-3")
    assert other["base_url"] == "unix:///var/run/docker.sock" and other["tls"] is True


def test_host_connection_without_engine_is_refused(monkeypatch):
    from autodl.errors import LaunchError

    monkeypatch.delenv("AIRFLOW_CONN_DOCKER_DEFAULT", raising=False)
    monkeypatch.setenv("AIRFLOW_CONN_DOCKER_GPU_A", json.dumps({"conn_type": "docker", "extra": {"tls": "true"}}))
    with pytest.raises(LaunchError, match="docker_gpu_a .*has no 'base_url'"):
        launcher_kwargs("docker", "gpu-a")


def _pem_files(tmp_path):
    paths = {}
    for name in ("ca.pem", "cert.pem", "key.pem"):
        (tmp_path / name).write_text("-----BEGIN CERTIFICATE-----\n-----END CERTIFICATE-----\n")
        paths[name] = str(tmp_path / name)
    return paths


def test_tls_client_certificates_become_a_tls_config(monkeypatch, tmp_path):
    """Seen (issue 21): the Docker connection took a `tls` boolean only, no client certificate."""
    from docker.tls import TLSConfig

    pem = _pem_files(tmp_path)
    monkeypatch.setenv("AIRFLOW_CONN_DOCKER_GPU_A", json.dumps(
        {"conn_type": "autodl_gpu_host", "extra": {"base_url": "tcp://gpu-a:2376", "tls": "true",
                                                   "tls_ca_cert": pem["ca.pem"], "tls_client_cert": pem["cert.pem"],
                                                   "tls_client_key": pem["key.pem"]}}))
    kwargs = launcher_kwargs("docker", "gpu-a")
    tls = kwargs["tls"]
    assert isinstance(tls, TLSConfig)
    assert tls.cert == (pem["cert.pem"], pem["key.pem"]) and tls.verify is True and tls.ca_cert == pem["ca.pem"]
    assert get_launcher("docker", **kwargs).tls is tls


def test_tls_false_wins_over_certificate_files(monkeypatch, tmp_path):
    pem = _pem_files(tmp_path)
    monkeypatch.setenv("AIRFLOW_CONN_DOCKER_DEFAULT", json.dumps(
        {"conn_type": "docker", "extra": {"base_url": "tcp://gpu-a:2375", "tls": "false",
                                          "tls_client_cert": pem["cert.pem"], "tls_client_key": pem["key.pem"]}}))
    assert launcher_kwargs("docker")["tls"] is False


def test_client_certificate_without_its_key_names_both_fields(monkeypatch, tmp_path):
    from autodl.errors import LaunchError

    pem = _pem_files(tmp_path)
    monkeypatch.setenv("AIRFLOW_CONN_DOCKER_DEFAULT", json.dumps(
        {"conn_type": "docker", "extra": {"base_url": "tcp://gpu-a:2376", "tls_client_cert": pem["cert.pem"]}}))
    with pytest.raises(LaunchError, match="'tls_client_cert' and 'tls_client_key' go together"):
        launcher_kwargs("docker")


def test_missing_certificate_file_is_named(monkeypatch, tmp_path):
    from autodl.errors import LaunchError

    monkeypatch.setenv("AIRFLOW_CONN_DOCKER_DEFAULT", json.dumps(
        {"conn_type": "docker", "extra": {"base_url": "tcp://gpu-a:2376", "tls_ca_cert": str(tmp_path / "no.pem")}}))
    with pytest.raises(LaunchError, match="no.pem"):
        launcher_kwargs("docker")


@pytest.mark.services  # the real Docker engine
def test_gpu_host_hook_builds_its_docker_client_once_and_it_answers(monkeypatch):
    """The hook caches its client (cached_property, as the providers' hooks do); it talks to the real engine."""
    import os

    from autodl.operators.hooks import GpuHostHook

    base_url = os.environ.get("DOCKER_HOST") or "unix:///var/run/docker.sock"
    monkeypatch.setenv("AIRFLOW_CONN_DOCKER_LOCALHOST", json.dumps(
        {"conn_type": "autodl_gpu_host", "extra": {"base_url": base_url, "timeout": "20"}}))
    hook = GpuHostHook("docker_localhost")
    assert hook.get_conn() is hook.api_client
    assert hook.api_client.ping() is True
