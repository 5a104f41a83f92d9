"""Where autodl finds its files and store: environment variables with embedded defaults.

| variable           | default                                           |
|--------------------|---------------------------------------------------|
| AUTODL_INCLUDE     | ``include/`` of this repository                   |
| AUTODL_HOME        | ``$AIRFLOW_HOME/autodl`` or ``~/.autodl``         |
| AUTODL_STORE_URL   | ``sqlite:///$AUTODL_HOME/autodl.db``              |
| AUTODL_POOL        | NVML when a driver answers, else ``include/pools/demo.yaml`` |
| AUTODL_CATALOG     | ``include/catalog/gpus.yaml``                     |
| AUTODL_LEASE_TTL   | ``300`` seconds (see :func:`lease_ttl_s`)         |
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[2]


def include_dir() -> Path:
    """The ``include/`` folder (training scripts, specs, catalog, pools)."""
    return Path(os.environ.get("AUTODL_INCLUDE") or REPO_ROOT / "include")


def autodl_home() -> Path:
    """State folder for run logs and metric samples; created on first use.

    :raises StoreError: when it cannot be created (naming AUTODL_HOME and the reason).
    """
    env = os.environ.get("AUTODL_HOME")
    if env:
        home = Path(env)
    elif os.environ.get("AIRFLOW_HOME"):
        home = Path(os.environ["AIRFLOW_HOME"]) / "autodl"
    else:
        home = Path.home() / ".autodl"
    try:
        home.mkdir(parents=True, exist_ok=True)
    except (OSError, ValueError) as exc:
        from autodl.errors import StoreError

        raise StoreError(f"autodl's state folder {str(home)[:300]} (AUTODL_HOME) cannot be created: "
                         f"{getattr(exc, 'strerror', None) or exc}; set AUTODL_HOME to a writable folder.") from None
    return home


def store_url() -> str:
    """SQLAlchemy URL of autodl's own store (never Airflow's metadata database)."""
    return os.environ.get("AUTODL_STORE_URL") or f"sqlite:///{autodl_home() / 'autodl.db'}"


DEFAULT_LEASE_TTL_S = 300.0
"""A lease not heartbeated for this many seconds is dead. 300 s is the time Airflow itself gives a running
task without heartbeat before declaring it a zombie (``[scheduler] task_instance_heartbeat_timeout``,
default 300): long enough to ride out a scheduler or triggerer restart, short enough that a GPU left by
a crashed run is free again within minutes."""


def lease_ttl_s() -> float:
    """Seconds a lease lives without a heartbeat: ``AUTODL_LEASE_TTL``, default :data:`DEFAULT_LEASE_TTL_S`.

    :raises StoreError: when the variable is not a positive, finite number of seconds.
    """
    import math

    from autodl.errors import StoreError

    raw = os.environ.get("AUTODL_LEASE_TTL")
    if raw in (None, ""):
        return DEFAULT_LEASE_TTL_S
    try:
        value = float(raw)
    except ValueError:
        value = float("nan")
    if not math.isfinite(value) or value <= 0:
        raise StoreError(f"AUTODL_LEASE_TTL={raw!r} is not a positive number of seconds; unset it for the "
                         f"default {DEFAULT_LEASE_TTL_S:g} s or set e.g. AUTODL_LEASE_TTL=600.")
    return value


def current_user() -> str:
    """Who runs this process, for lease ownership outside Airflow: ``AUTODL_USER``, else the login name."""
    import getpass

    return os.environ.get("AUTODL_USER") or getpass.getuser()


def default_pool_file() -> Path:
    """The declared pool used when no NVML driver answers."""
    return include_dir() / "pools" / "demo.yaml"


def read_yaml(path: str | Path, error: type[Exception], missing: str) -> Any:
    """Parse a YAML file (spec, pool, catalog) with autodl's one bounded loader (:func:`autodl.inputs.read_yaml`).

    :param missing: what to say (after the path) when the file does not exist.
    :raises error: ``"<path>: <missing>"``, or ``"<path>:<line>: <field>: <problem>"`` for a file autodl
        refuses (binary, too large, a symlink loop, duplicate keys, tags, aliases expanding without bound,
        nesting too deep, numbers out of range).
    """
    from autodl.inputs import read_yaml as _read

    return _read(path, error, missing)
