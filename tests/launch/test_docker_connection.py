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
