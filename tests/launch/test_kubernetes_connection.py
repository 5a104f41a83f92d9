"""launcher_kwargs('kubernetes'): the Airflow connection kubernetes_default read through KubernetesHook."""

from __future__ import annotations

import json

import pytest

from autodl.errors import LaunchError
from autodl.launch import get_launcher
from autodl.operators.connections import launcher_kwargs

pytest.importorskip("airflow.providers.cncf.kubernetes")

KUBECONFIG = {
    "apiVersion": "v1", "kind": "Config", "current-context": "ci",
    "clusters": [{"name": "ci", "cluster": {"server": "https://127.0.0.1:6443"}}],
    "users": [{"name": "ci", "user": {"token": "abc"}}],
    "contexts": [{"name": "ci", "context": {"cluster": "ci", "user": "ci"}}],
}


def test_absent_connection_means_kubeconfig_defaults(monkeypatch):
    monkeypatch.delenv("AIRFLOW_CONN_KUBERNETES_DEFAULT", raising=False)
    assert launcher_kwargs("kubernetes") == {}


def test_extras_become_launcher_kwargs(monkeypatch):
    conn = {"conn_type": "kubernetes", "extra": {"namespace": "ml", "in_cluster": False,
                                                  "kube_config_path": "/etc/kube/config", "cluster_context": "gpu"}}
    monkeypatch.setenv("AIRFLOW_CONN_KUBERNETES_DEFAULT", json.dumps(conn))
    kwargs = launcher_kwargs("kubernetes")
    # KubernetesHook._get_field reads a false extra as absent: in_cluster False is the default anyway.
    assert kwargs == {"namespace": "ml", "config_file": "/etc/kube/config", "cluster_context": "gpu"}
    launcher = get_launcher("kubernetes", **kwargs)
    assert launcher.namespace == "ml" and launcher.cluster_context == "gpu"


def test_in_cluster(monkeypatch):
    monkeypatch.setenv("AIRFLOW_CONN_KUBERNETES_DEFAULT", json.dumps({"conn_type": "kubernetes",
                                                                      "extra": {"in_cluster": "true"}}))
    assert launcher_kwargs("kubernetes") == {"in_cluster": True}


def test_inline_kubeconfig_builds_a_client_for_it(monkeypatch):
    conn = {"conn_type": "kubernetes", "extra": {"kube_config": json.dumps(KUBECONFIG)}}
    monkeypatch.setenv("AIRFLOW_CONN_KUBERNETES_DEFAULT", json.dumps(conn))
    kwargs = launcher_kwargs("kubernetes")
    assert kwargs["config_dict"]["current-context"] == "ci"
    api = get_launcher("kubernetes", **kwargs).api  # configures, contacts nothing
    assert api.api_client.configuration.host == "https://127.0.0.1:6443"


def test_unreadable_inline_kubeconfig_names_the_field(monkeypatch):
    conn = {"conn_type": "kubernetes", "extra": {"kube_config": "just a string"}}
    monkeypatch.setenv("AIRFLOW_CONN_KUBERNETES_DEFAULT", json.dumps(conn))
    with pytest.raises(LaunchError, match="kube_config"):
        launcher_kwargs("kubernetes")
