"""Launcher connection details from Airflow connections: ``docker_default`` and ``kubernetes_default``.

Details: docs/reference/provider.md#autodloperatorsconnections.
"""

from __future__ import annotations

import json
from typing import Any

from autodl.errors import LaunchError

DOCKER_CONN_ID = "docker_default"
KUBERNETES_CONN_ID = "kubernetes_default"

_TRUE = {"1", "true", "yes", "y", "on", "t"}


def _as_bool(value: Any) -> bool:
    return value if isinstance(value, bool) else str(value).strip().lower() in _TRUE


def host_conn_id(host: str) -> str:
    """The Airflow connection id of ``host``'s Docker engine: ``docker_<host>`` with the host name
    lower-cased and every character other than a letter, digit or ``_`` replaced by ``_``
    (``gpu-node-2.lab`` -> ``docker_gpu_node_2_lab``), so it can also be given as
    ``AIRFLOW_CONN_DOCKER_GPU_NODE_2_LAB``."""
    import re

    return "docker_" + re.sub(r"[^a-z0-9_]", "_", host.lower())


def _get_connection(conn_id: str) -> Any:
    """The connection ``conn_id``, or None when it does not exist."""
    from airflow.exceptions import AirflowNotFoundException
    from airflow.sdk import BaseHook

    try:
        return BaseHook.get_connection(conn_id)
    except AirflowNotFoundException:
        return None


TLS_FILE_FIELDS = ("tls_ca_cert", "tls_client_cert", "tls_client_key")
"""Extra fields naming PEM files for a TLS Docker engine (docker-py ``TLSConfig``; ``docker --tlscacert``,
``--tlscert``, ``--tlskey``)."""


def _tls_config(extra: dict[str, Any], conn_id: str) -> Any:
    """``docker.tls.TLSConfig`` from the extra's certificate files, or None when it names none.

    :raises LaunchError: for a certificate without its key (or the reverse), naming the fields.
    """
    files = {name: extra.get(name) or None for name in TLS_FILE_FIELDS}
    if not any(files.values()):
        return None
    cert, key, ca = files["tls_client_cert"], files["tls_client_key"], files["tls_ca_cert"]
    if bool(cert) != bool(key):
        raise LaunchError(f"Airflow connection {conn_id}: 'tls_client_cert' and 'tls_client_key' go together "
                          "(the client certificate and its private key); set both or neither.")
    verify = _as_bool(extra.get("tls_verify", True)) if ca else False
    from docker.tls import TLSConfig

    try:
        return TLSConfig(client_cert=(cert, key) if cert else None, ca_cert=ca, verify=verify)
    except Exception as exc:  # docker.errors.TLSParameterError: a path that is not a file
        raise LaunchError(f"Airflow connection {conn_id}: TLS files {', '.join(f for f in files.values() if f)}: "
                          f"{exc}; put the PEM files on the worker and name their paths.") from None


def docker_engine_kwargs(conn: Any, conn_id: str = DOCKER_CONN_ID) -> dict[str, Any]:
    """``base_url``/``tls``/``timeout`` from a Docker engine connection's extra; ``tls`` is a ``TLSConfig``
    when the extra names certificate files (:data:`TLS_FILE_FIELDS`), else a boolean."""
    extra = conn.extra_dejson or {}
    kwargs: dict[str, Any] = {}
    base_url = extra.get("base_url") or extra.get("docker_url")
    if base_url:
        kwargs["base_url"] = base_url
    if "tls" in extra:
        kwargs["tls"] = _as_bool(extra["tls"])
    tls = _tls_config(extra, conn_id) if kwargs.get("tls", True) else None
    if tls is not None:
        kwargs["tls"] = tls
    if "timeout" in extra:
        kwargs["timeout"] = int(extra["timeout"])
    return kwargs


def _docker_kwargs(conn_id: str, host: str | None = None) -> dict[str, Any]:
    kwargs: dict[str, Any] = {}
    conn = _get_connection(conn_id)
    if conn is not None:
        kwargs = _default_docker_kwargs(conn)
    host_conn = _get_connection(host_conn_id(host)) if host else None
    if host and host_conn is not None:  # the GPU host's own engine (autodl.operators.hooks.GpuHostHook's connection)
        engine = docker_engine_kwargs(host_conn, host_conn_id(host))
        if "base_url" not in engine:
            raise LaunchError(
                f"Airflow connection {host_conn_id(host)} (the Docker engine of GPU host {host}) has no "
                "'base_url' in its extra; set it, e.g. {\"base_url\": \"tcp://" + host + ":2376\", \"tls\": true}."
            )
        kwargs.pop("tls", None)
        kwargs.update(engine)
    return kwargs


def _default_docker_kwargs(conn: Any) -> dict[str, Any]:
    extra = conn.extra_dejson or {}
    kwargs = docker_engine_kwargs(conn, DOCKER_CONN_ID)
    if conn.host and conn.login:
        registry = f"{conn.host}:{conn.port}" if conn.port else conn.host
        kwargs["registry"] = {
            "registry": registry,
            "username": conn.login,
            "password": conn.password,
            "email": extra.get("email") or None,
            "reauth": _as_bool(extra.get("reauth", True)),
        }
    return kwargs


def _check_inline_kubeconfig(hook: Any, conn_id: str) -> None:
    """Refuse an inline ``kube_config`` that is not a kubeconfig mapping, naming the field."""
    inline = hook._get_field("kube_config")
    if not inline or isinstance(inline, dict):
        return
    import yaml

    try:
        inline = json.loads(inline)
    except ValueError:
        try:
            inline = yaml.safe_load(inline)
        except yaml.YAMLError:
            inline = None
    if not isinstance(inline, dict):
        raise LaunchError(
            f"Airflow connection {conn_id}: extra 'kube_config' is not a kubeconfig mapping; paste the "
            "kubeconfig as JSON or YAML, or use kube_config_path."
        )


def _kubernetes_kwargs(conn_id: str) -> dict[str, Any]:
    """``namespace`` and a ``CoreV1Api`` built by the provider's ``KubernetesHook`` (its cached
    ``core_v1_client``), so every option of the connection applies as in the provider's own operators:
    ``in_cluster``, ``kube_config_path``, ``kube_config``, ``cluster_context``, ``disable_verify_ssl``,
    ``disable_tcp_keepalive``.

    :raises LaunchError: for an unreadable inline kubeconfig or a client that cannot be configured.
    """
    from airflow.providers.cncf.kubernetes.hooks.kubernetes import KubernetesHook

    if _get_connection(conn_id) is None:  # (KubernetesHook.get_connection makes up an empty kubernetes_default)
        return {}
    hook = KubernetesHook(conn_id=conn_id)
    _check_inline_kubeconfig(hook, conn_id)
    kwargs: dict[str, Any] = {}
    namespace = hook.get_namespace()
    if namespace:
        kwargs["namespace"] = namespace
    try:
        kwargs["api"] = hook.core_v1_client
    except Exception as exc:  # noqa: BLE001 - kubeconfig/in-cluster errors of the kubernetes client, reworded
        raise LaunchError(
            f"Airflow connection {conn_id}: cannot configure the Kubernetes client ({type(exc).__name__}: {exc}); "
            "fix its extra in_cluster, kube_config_path, kube_config or cluster_context."
        ) from None
    return kwargs


def launcher_kwargs(launcher_type: str, host: str | None = None) -> dict[str, Any]:
    """Keyword arguments for the launcher called ``launcher_type``, from its Airflow connection.

    :param launcher_type: ``local``, ``docker`` or ``kubernetes``.
    :param host: the GPU host of the booked devices; for Docker its own engine connection
        (:func:`host_conn_id`) replaces ``docker_default``'s engine when it exists.
    :returns: ``DockerLauncher`` / ``KubernetesLauncher`` keyword arguments; ``{}`` for ``local``, for
        an absent connection, or when the provider is not installed.
    :raises LaunchError: for a connection whose extra cannot be understood (naming the field).
    """
    try:
        if launcher_type == "docker":
            return _docker_kwargs(DOCKER_CONN_ID, host)
        if launcher_type == "kubernetes":
            return _kubernetes_kwargs(KUBERNETES_CONN_ID)
    except ImportError:
        return {}
    return {}
