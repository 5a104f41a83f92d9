"""``GpuHostHook``: autodl's connection type ``autodl_gpu_host``, one connection per GPU host's Docker engine.

A pool spans hosts; the Docker launcher starts a booked device's container on that device's own host,
through the connection ``docker_<host>`` (:func:`autodl.operators.connections.host_conn_id`). Such a
connection may be of the Docker provider's type or of this one, whose form (``conn-fields`` in
:mod:`autodl.provider`) asks only for what autodl reads: the engine's ``base_url``, ``tls`` and the TLS
client certificate files. Registry credentials stay in ``docker_default``.
"""

from __future__ import annotations

from functools import cached_property
from typing import Any

from airflow.sdk import BaseHook

from autodl.errors import LaunchError
from autodl.operators.connections import docker_engine_kwargs


class GpuHostHook(BaseHook):
    """The Docker engine of one GPU host (connection type ``autodl_gpu_host``).

    The connection's extra (the form's fields): ``base_url`` (``unix:///var/run/docker.sock``,
    ``tcp://gpu-node-2:2376``), ``tls`` (boolean), ``tls_ca_cert``, ``tls_client_cert``, ``tls_client_key``
    (PEM file paths on the worker: docker-py's ``TLSConfig``), ``tls_verify`` (check the engine's certificate
    against ``tls_ca_cert``; default true when a CA is given), ``timeout`` (seconds).

    :param conn_id: ``docker_<host>`` (see :func:`autodl.operators.connections.host_conn_id`).
    """

    conn_name_attr = "conn_id"
    default_conn_name = "docker_default"
    conn_type = "autodl_gpu_host"
    hook_name = "autodl GPU host (Docker engine)"

    def __init__(self, conn_id: str = default_conn_name, **kwargs: Any):
        super().__init__(**kwargs)
        self.conn_id = conn_id

    @cached_property
    def connection(self) -> Any:
        """The Airflow connection ``conn_id`` (read once)."""
        return self.get_connection(self.conn_id)

    def engine_kwargs(self) -> dict[str, Any]:
        """``DockerLauncher`` keyword arguments (``base_url``, ``tls`` as bool or ``TLSConfig``, ``timeout``).

        :raises LaunchError: for a TLS file field that names no file (naming the field).
        """
        return docker_engine_kwargs(self.connection, self.conn_id)

    @cached_property
    def api_client(self) -> Any:
        """A ``docker.DockerClient`` for this engine, built once per hook (as the providers' hooks do).

        :raises LaunchError: when the connection has no ``base_url``.
        """
        from docker.client import DockerClient

        kwargs = self.engine_kwargs()
        if "base_url" not in kwargs:
            raise LaunchError(f"Airflow connection {self.conn_id}: no 'base_url' in its extra; set it, e.g. "
                              '{"base_url": "tcp://gpu-node-2:2376", "tls": true}.')
        return DockerClient(base_url=kwargs["base_url"], tls=kwargs.get("tls", False),
                            timeout=kwargs.get("timeout", 60))

    def get_conn(self) -> Any:
        """The cached :attr:`api_client` (Airflow's hook interface)."""
        return self.api_client
