"""autodl as an Airflow provider: what ``airflow providers list`` shows and the ``[autodl]`` config section.

Registered through the ``apache_airflow_provider`` entry point of the installed package. Imports
nothing (Airflow calls it while discovering providers). The ``config`` part declares the options
:mod:`autodl.config` reads through Airflow's ``conf`` (environment variables ``AUTODL_*`` first); an
empty value means autodl's own default.
"""

from __future__ import annotations

from typing import Any

from autodl import __version__

_OPTIONS: dict[str, dict[str, Any]] = {
    "store_url": {
        "description": "SQLAlchemy URL of autodl's own store (leases, run records, the learning policy's state), "
                       "never Airflow's metadata database. Empty: sqlite:///$AUTODL_HOME/autodl.db. "
                       "The variable AUTODL_STORE_URL wins over this option.",
        "version_added": "0.1.0",
        "type": "string",
        "example": "postgresql+psycopg2://autodl:autodl@postgres/autodl",
        "default": "",
        "sensitive": True,
    },
    "memory_threshold": {
        "description": "Fraction of a device's memory a run may plan to use, for specs that do not set "
                       "resource_policy.memory_threshold. Empty: 0.85. AUTODL_MEMORY_THRESHOLD wins.",
        "version_added": "0.1.0",
        "type": "float",
        "example": "0.85",
        "default": "",
    },
    "default_launcher": {
        "description": "Launcher for specs without a launcher section: local, docker or kubernetes. Empty: local. "
                       "AUTODL_LAUNCHER wins.",
        "version_added": "0.1.0",
        "type": "string",
        "example": "docker",
        "default": "",
    },
    "sharing": {
        "description": "Whether runs may share a device, for specs that do not set resource_policy.sharing: exclusive "
                       "(each lease holds its devices alone) or packed (a 1-device run with a known estimate may "
                       "share a >= 24 GB NVIDIA device with one other packed run when both fit: "
                       "docs/reference/fractional-leases.md). Empty: exclusive. AUTODL_SHARING wins.",
        "version_added": "0.1.0",
        "type": "string",
        "example": "packed",
        "default": "",
    },
    "pool": {
        "description": "Inventory source when a task's gpu_pool is empty: auto (NVML, else the declared demo pool), nvml, "
                       "prometheus+http://HOST:PORT (dcgm-exporter through Prometheus), or a pool file. Empty: auto. "
                       "AUTODL_POOL wins.",
        "version_added": "0.1.0",
        "type": "string",
        "example": "prometheus+http://prometheus:9090",
        "default": "",
    },
    "dry_run_in": {
        "description": "Where the profile's dry run runs the script: auto (this worker's bubblewrap sandbox where "
                       "Paddle and bubblewrap work, else a container or pod of the launcher's image), worker (the "
                       "sandbox only) or launcher (the image only). A spec's task.dry_run_in wins. Empty: auto. "
                       "AUTODL_DRY_RUN_IN wins.",
        "version_added": "0.1.0",
        "type": "string",
        "example": "launcher",
        "default": "",
    },
    "prometheus_url": {
        "description": "Prometheus server scraping dcgm-exporter (http://HOST:PORT). The collect step samples a pod's "
                       "GPUs there (dcgm-exporter's pod and namespace labels), and a container's by device UUID when "
                       "NVML cannot be read where the collect runs. Empty: those GPU samples are unknown, and the "
                       "run's metrics say so. AUTODL_PROMETHEUS_URL wins.",
        "version_added": "0.1.0",
        "type": "string",
        "example": "http://prometheus:9090",
        "default": "",
    },
    "host_queues": {
        "description": "Several GPU hosts on the CeleryExecutor: host=queue pairs, comma-separated. The launch and "
                       "collect steps of a run booked on a listed host go to its queue (one worker per host runs "
                       "airflow celery worker --queues QUEUE). Empty: no routing. AUTODL_HOST_QUEUES wins.",
        "version_added": "0.1.0",
        "type": "string",
        "example": "gpu-node-1=gpu-node-1,gpu-node-2=gpu-node-2",
        "default": "",
    },
    "team_queues": {
        "description": "YAML file of team queues: each team's nominal quota of devices per GPU type, borrowing limit "
                       "and fair-sharing weight, and priority classes (Kueue's vocabulary; docs/team-queues.md). "
                       "Empty: no teams, one queue. AUTODL_TEAM_QUEUES wins.",
        "version_added": "0.1.0",
        "type": "string",
        "example": "/opt/airflow/autodl/team-queues.yaml",
        "default": "",
    },
}


_GPU_HOST_FIELDS: dict[str, dict[str, Any]] = {
    "base_url": {"label": "Engine URL", "schema": {"type": ["string", "null"]},
                 "description": "The Docker engine of this GPU host: unix:///var/run/docker.sock or tcp://HOST:2376."},
    "tls": {"label": "TLS", "schema": {"type": ["boolean", "null"]},
            "description": "Talk to the engine over TLS (true when the certificate fields below are set)."},
    "tls_ca_cert": {"label": "CA certificate file", "schema": {"type": ["string", "null"]},
                    "description": "PEM file on the worker that signed the engine's certificate (docker --tlscacert)."},
    "tls_client_cert": {"label": "Client certificate file", "schema": {"type": ["string", "null"]},
                        "description": "PEM file on the worker (docker --tlscert); goes with the key file."},
    "tls_client_key": {"label": "Client key file", "schema": {"type": ["string", "null"]},
                       "description": "PEM file on the worker (docker --tlskey); goes with the certificate file."},
    "tls_verify": {"label": "Verify the engine's certificate", "schema": {"type": ["boolean", "null"]},
                   "description": "Check the engine's certificate against the CA file (default true with a CA)."},
    "timeout": {"label": "Timeout (s)", "schema": {"type": ["integer", "null"]},
                "description": "Seconds to wait for each call to the engine (docker-py's default: 60)."},
}
"""The ``autodl_gpu_host`` form's fields (stored in the connection's extra), as
apache-airflow-providers-docker declares ``conn-fields`` in its provider info (Airflow 3.2+ builds the form
from them; ``get_ui_field_behaviour`` is deprecated there)."""


def get_provider_info() -> dict[str, Any]:
    """The provider description Airflow validates against its ``provider_info.schema.json``."""
    from autodl import DISTRIBUTION

    return {
        "package-name": DISTRIBUTION,
        "name": "autodl",
        "description": "Profile a PaddlePaddle training script, place it on the right GPU of a pool that spans "
                       "hosts, launch it pinned (local process, Docker, Kubernetes), measure and record it.",
        "versions": [__version__],
        "integrations": [
            {"integration-name": "autodl", "tags": ["software"]},
        ],
        "operators": [{"integration-name": "autodl", "python-modules": ["autodl.operators.group",
                                                                        "autodl.operators.steps"]}],
        "sensors": [{"integration-name": "autodl", "python-modules": ["autodl.operators.steps"]}],
        "triggers": [{"integration-name": "autodl", "python-modules": ["autodl.triggers.pool",
                                                                       "autodl.triggers.collect"]}],
        "hooks": [{"integration-name": "autodl", "python-modules": ["autodl.operators.hooks"]}],
        "extra-links": ["autodl.operators.links.AutoDLRunRecordLink"],
        "connection-types": [
            {"connection-type": "autodl_gpu_host", "hook-class-name": "autodl.operators.hooks.GpuHostHook",
             "hook-name": "autodl GPU host (Docker engine)",
             "conn-fields": _GPU_HOST_FIELDS,
             "ui-field-behaviour": {
                 "hidden-fields": ["host", "schema", "login", "password", "port", "extra"],
                 "relabeling": {},
                 "placeholders": {"base_url": "tcp://gpu-node-2:2376", "tls_ca_cert": "/etc/docker/certs/ca.pem",
                                  "tls_client_cert": "/etc/docker/certs/cert.pem",
                                  "tls_client_key": "/etc/docker/certs/key.pem"},
             }},
        ],
        "plugins": [{"name": "autodl", "plugin-class": "autodl.plugin.AutoDLPlugin"}],
        "config": {
            "autodl": {
                "description": "autodl: where its store is, how much of a device a run may plan to use, the default "
                               "launcher and inventory, and the Celery queue of each GPU host. Environment variables "
                               "AUTODL_* override each option.",
                "options": _OPTIONS,
            }
        },
    }
