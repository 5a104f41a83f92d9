"""launcher_kwargs('kubernetes'): the Airflow connection kubernetes_default read through the provider's
KubernetesHook, whose cached CoreV1Api the launcher uses (so every connection option means what it means
in the provider: in_cluster, kube_config_path, kube_config, cluster_context, disable_verify_ssl,
disable_tcp_keepalive)."""

from __future__ import annotations

import json

import pytest
import yaml

from autodl.errors import LaunchError
from autodl.launch import get_launcher
from autodl.operators.connections import launcher_kwargs

pytest.importorskip("airflow.providers.cncf.kubernetes")

KUBECONFIG = {
    "apiVersion": "v1", "kind": "Config", "current-context": "ci",
    "clusters": [{"name": "ci", "cluster": {"server": "https://127.0.0.1:6443"}},
                 {"name": "gpu", "cluster": {"server": "https://127.0.0.2:6443"}}],
    "users": [{"name": "ci", "user": {"token": "abc"}}],
    "contexts": [{"name": "ci", "context": {"cluster": "ci", "user": "ci"}},
                 {"name": "gpu", "context": {"cluster": "gpu", "user": "ci"}}],
}


@pytest.fixture(autouse=True)
def _default_client_configuration():
    """disable_verify_ssl changes the kubernetes client's default Configuration (as the provider does): restore it."""
    from kubernetes.client import Configuration

    yield
    Configuration.set_default(Configuration())


def _connection(monkeypatch, **extra):
    monkeypatch.setenv("AIRFLOW_CONN_KUBERNETES_DEFAULT", json.dumps({"conn_type": "kubernetes", "extra": extra}))


def test_absent_connection_means_kubeconfig_defaults(monkeypatch):
    monkeypatch.delenv("AIRFLOW_CONN_KUBERNETES_DEFAULT", raising=False)
    assert launcher_kwargs("kubernetes") == {}


def test_kubeconfig_path_and_context_reach_the_launcher_through_the_hooks_client(monkeypatch, tmp_path):
    path = tmp_path / "config"
    path.write_text(yaml.safe_dump(KUBECONFIG))
    _connection(monkeypatch, namespace="ml", kube_config_path=str(path), cluster_context="gpu")
    kwargs = launcher_kwargs("kubernetes")
    assert set(kwargs) == {"namespace", "api"} and kwargs["namespace"] == "ml"
    launcher = get_launcher("kubernetes", **kwargs)
    assert launcher.namespace == "ml"
    assert launcher.api is kwargs["api"]  # the hook's client, not a second one
    assert launcher.api.api_client.configuration.host == "https://127.0.0.2:6443"  # the context's cluster


def test_inline_kubeconfig_builds_a_client_for_it(monkeypatch):
    _connection(monkeypatch, kube_config=json.dumps(KUBECONFIG))
    api = launcher_kwargs("kubernetes")["api"]  # configures, contacts nothing
    assert api.api_client.configuration.host == "https://127.0.0.1:6443"
    assert api.api_client.configuration.verify_ssl is True


def test_disable_verify_ssl_is_honoured(monkeypatch):
    _connection(monkeypatch, kube_config=json.dumps(KUBECONFIG), disable_verify_ssl=True)
    api = launcher_kwargs("kubernetes")["api"]
    assert api.api_client.configuration.verify_ssl is False


def test_tcp_keepalive_on_by_default_and_off_when_disabled(monkeypatch):
    import socket

    def keepalive(api) -> bool:
        options = api.api_client.rest_client.pool_manager.connection_pool_kw.get("socket_options") or []
        return any(opt[:2] == (socket.SOL_SOCKET, socket.SO_KEEPALIVE) for opt in options)

    _connection(monkeypatch, kube_config=json.dumps(KUBECONFIG))
    assert keepalive(launcher_kwargs("kubernetes")["api"])
    _connection(monkeypatch, kube_config=json.dumps(KUBECONFIG), disable_tcp_keepalive=True)
    assert not keepalive(launcher_kwargs("kubernetes")["api"])


def test_in_cluster_outside_a_cluster_names_the_connection(monkeypatch):
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    _connection(monkeypatch, in_cluster="true")
    with pytest.raises(LaunchError, match="kubernetes_default: cannot configure the Kubernetes client"):
        launcher_kwargs("kubernetes")


def test_unreadable_inline_kubeconfig_names_the_field(monkeypatch):
    _connection(monkeypatch, kube_config="just a string")
    with pytest.raises(LaunchError, match="kube_config"):
        launcher_kwargs("kubernetes")
