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
    "pool": {
        "description": "Inventory source when a task names none: auto (NVML, else the declared demo pool), nvml, "
                       "prometheus+http://HOST:PORT (dcgm-exporter through Prometheus), or a pool file. Empty: auto. "
                       "AUTODL_POOL wins.",
        "version_added": "0.1.0",
        "type": "string",
        "example": "prometheus+http://prometheus:9090",
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
}


def get_provider_info() -> dict[str, Any]:
    """The provider description Airflow validates against its ``provider_info.schema.json``."""
    return {
        "package-name": "autodl",
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
        "triggers": [{"integration-name": "autodl", "python-modules": ["autodl.triggers.pool"]}],
        "hooks": [{"integration-name": "autodl", "python-modules": ["autodl.operators.hooks"]}],
        "connection-types": [
            {"connection-type": "autodl_gpu_host", "hook-class-name": "autodl.operators.hooks.GpuHostHook",
             "hook-name": "autodl GPU host (Docker engine)"},
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
