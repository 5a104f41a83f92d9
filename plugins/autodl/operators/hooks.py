"""``GpuHostHook``: autodl's connection type ``autodl_gpu_host``, one connection per GPU host.

A pool spans hosts; the Docker launcher starts a booked device's container on that device's own host,
through the connection ``docker_<host>`` (:func:`autodl.operators.connections.host_conn_id`). Such a
connection may be of the Docker provider's type or of this one, whose form asks only for what autodl
reads: the engine's ``base_url`` (``unix:///var/run/docker.sock``, ``tcp://gpu-node-2:2376``) and
``tls``. Registry credentials stay in ``docker_default``.
"""

from __future__ import annotations

from typing import Any

from airflow.sdk import BaseHook


class GpuHostHook(BaseHook):
    """The Docker engine of one GPU host (connection type ``autodl_gpu_host``).

    :param conn_id: ``docker_<host>`` (see :func:`autodl.operators.connections.host_conn_id`).
    """

    conn_name_attr = "conn_id"
    default_conn_name = "docker_default"
    conn_type = "autodl_gpu_host"
    hook_name = "autodl GPU host (Docker engine)"

    def __init__(self, conn_id: str = default_conn_name, **kwargs: Any):
        super().__init__(**kwargs)
        self.conn_id = conn_id

    def engine_kwargs(self) -> dict[str, Any]:
        """``DockerLauncher`` keyword arguments (``base_url``, ``tls``, ``timeout``) from the connection's extra."""
        from autodl.operators.connections import _engine_kwargs

        return _engine_kwargs(self.get_connection(self.conn_id))

    @classmethod
    def get_ui_field_behaviour(cls) -> dict[str, Any]:
        """The connection form: only the extra fields autodl reads (Airflow's form hides the rest)."""
        return {
            "hidden_fields": ["host", "schema", "login", "password", "port"],
            "relabeling": {},
            "placeholders": {"extra": '{"base_url": "tcp://gpu-node-2:2376", "tls": true}'},
        }
