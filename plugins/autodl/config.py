"""Where autodl finds its files and settings: environment variables, then Airflow's ``[autodl]`` section, then defaults.

Details: docs/reference/configuration.md#autodlconfig.
"""

from __future__ import annotations

import os
import sys
from importlib import resources
from pathlib import Path
from typing import Any

from autodl.errors import ConfigError
from autodl.registry import LAUNCHERS

SETTINGS: dict[str, str] = {
    "store_url": "AUTODL_STORE_URL",
    "pool": "AUTODL_POOL",
    "memory_threshold": "AUTODL_MEMORY_THRESHOLD",
    "default_launcher": "AUTODL_LAUNCHER",
    "host_queues": "AUTODL_HOST_QUEUES",
    "gang_wait_bound_s": "AUTODL_GANG_WAIT_BOUND_S",
    "dry_run_in": "AUTODL_DRY_RUN_IN",
    "team_queues": "AUTODL_TEAM_QUEUES",
    "prometheus_url": "AUTODL_PROMETHEUS_URL",
    "sharing": "AUTODL_SHARING",
}
"""``[autodl]`` option -> the environment variable that overrides it."""


def include_dir() -> Path:
    """The folder of the files autodl ships: GPU catalog and vendor table (``catalog/``), pool files
    (``pools/``), example specs and training scripts, and the data the simulator reads (``data/``).

    ``AUTODL_INCLUDE`` when set; else ``importlib.resources.files("autodl") / "include"``: in an
    installed wheel the files are copied there (``[tool.setuptools.package-data]`` in pyproject.toml);
    in the repository (checkout, editable install, or the package dropped into an Airflow
    ``plugins/`` folder) ``plugins/autodl/include`` is a symbolic link to the top-level ``include/``.
    The path is resolved, so in the repository it reads ``<repo>/include``.

    :raises ConfigError: when neither exists (a copy of the package without its files).
    """
    env = os.environ.get("AUTODL_INCLUDE")
    if env:
        return Path(env)
    packaged = resources.files("autodl") / "include"
    if packaged.is_dir():
        return Path(str(packaged)).resolve()
    raise ConfigError(
        f"autodl's files (GPU catalog, pools, specs) are not at {packaged}: this copy of the package lacks its "
        "include/ folder. Reinstall autodl (pip install airflow-provider-autodl), copy the repository's include/ folder there "
        "(in a checkout plugins/autodl/include is a link to ../../include), or set AUTODL_INCLUDE to such a folder."
    )


def airflow_cfg_path() -> Path:
    """The ``airflow.cfg`` Airflow reads: ``$AIRFLOW_CONFIG``, else ``$AIRFLOW_HOME/airflow.cfg`` (``~/airflow``)."""
    if os.environ.get("AIRFLOW_CONFIG"):
        return Path(os.environ["AIRFLOW_CONFIG"])
    return Path(os.environ.get("AIRFLOW_HOME") or Path.home() / "airflow") / "airflow.cfg"


def _option_without_airflow(name: str) -> str | None:
    """``[autodl] <name>`` as Airflow would read it from the same two places, without importing Airflow:
    ``AIRFLOW__AUTODL__<NAME>``, else the ``[autodl]`` section of :func:`airflow_cfg_path`. (Importing
    Airflow in the command line would cost seconds and set up Airflow's logging, which writes to stdout
    and so breaks ``--json``.) Secrets backends and ``_cmd`` options are Airflow's own: inside Airflow only."""
    env = os.environ.get(f"AIRFLOW__AUTODL__{name.upper()}")
    if env is not None:
        return env
    path = airflow_cfg_path()
    if not path.is_file():
        return None
    import configparser

    parser = configparser.ConfigParser(interpolation=None, strict=False)
    try:
        parser.read(path, encoding="utf-8")
    except (configparser.Error, OSError, UnicodeDecodeError):
        return None  # Airflow itself reports a configuration it cannot read
    return parser.get("autodl", name, fallback=None)


def airflow_option(name: str) -> str | None:
    """``[autodl] <name>`` from Airflow's configuration, or None when unset or empty.

    Inside an Airflow process (``airflow`` already imported) through Airflow's own ``conf``; elsewhere (the
    ``autodl`` command) from ``AIRFLOW__AUTODL__*`` and ``airflow.cfg`` directly (:func:`_option_without_airflow`).
    Never raises: a configuration Airflow itself cannot read is Airflow's error to report, and autodl
    falls back to its defaults.
    """
    if "airflow" in sys.modules:
        try:
            from airflow.configuration import conf

            value = conf.get("autodl", name, fallback=None)
        except Exception:  # noqa: BLE001 - see the docstring
            value = None
    else:
        value = _option_without_airflow(name)
    if value is None:
        return None
    value = str(value).strip()
    return value or None


def setting(name: str) -> str | None:
    """The value of the ``[autodl]`` option ``name``: its environment variable (:data:`SETTINGS`), else
    Airflow's ``[autodl]`` section (see the module docstring), else None (the caller's default)."""
    env = os.environ.get(SETTINGS[name], "").strip()
    if env:
        return env
    return airflow_option(name)


def _source(name: str) -> str:
    """Where the value of ``name`` came from, for messages."""
    if os.environ.get(SETTINGS[name], "").strip():
        return f"environment variable {SETTINGS[name]}"
    return f"[autodl] {name} in Airflow's configuration (airflow.cfg or AIRFLOW__AUTODL__{name.upper()})"


def autodl_home() -> Path:
    """State folder for run logs and metric samples; created on first use, mode 0700.

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
        home.mkdir(parents=True, exist_ok=True, mode=0o700)  # its owner's only: runs and the store of every tenant
    except (OSError, ValueError) as exc:
        from autodl.errors import StoreError

        raise StoreError(f"autodl's state folder {str(home)[:300]} (AUTODL_HOME) cannot be created: "
                         f"{getattr(exc, 'strerror', None) or exc}; set AUTODL_HOME to a writable folder.") from None
    return home


def store_url() -> str:
    """SQLAlchemy URL of autodl's own store (never Airflow's metadata database)."""
    return setting("store_url") or f"sqlite:///{autodl_home() / 'autodl.db'}"


def pool_source() -> str:
    """The inventory source used when none is given: ``auto``, ``nvml``, a URL source or a pool file."""
    return setting("pool") or "auto"


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


def shipped_hint(kind: str, missing: str | os.PathLike | None = None) -> str:
    """Where autodl's own example files of one kind are, for a "not found" message: ``kind`` is ``specs``,
    ``pools`` or ``scripts`` (folders of :func:`include_dir`). An installed autodl has no ``include/`` in the
    user's folder, so ``include/specs/simple_cnn.yaml`` from the README is found only in the checkout.

    :param missing: the path that was not found; when it exists after all (the error is about something
        else) the hint is empty. Checked with ``os.path.exists``, which is False for a name too long or holding
        a NUL byte (``Path.exists`` raises there).
    :returns: ``" (autodl's example specs are in /.../autodl/include/specs: a.yaml, b.yaml)"``; empty when
        the folder cannot be listed (never raises: it only adds to another error).
    """
    if missing is not None and os.path.exists(missing):
        return ""
    try:
        folder = include_dir() / kind
        names = sorted(p.name for p in folder.iterdir() if p.is_file() and not p.name.startswith(("_", ".")))
    except (OSError, ConfigError):
        return ""
    if not names:
        return ""
    import difflib

    given = Path(str(missing)).name if missing is not None else ""
    by_name = {**{Path(n).stem: n for n in names}, **{n: n for n in names}}
    close = difflib.get_close_matches(given, list(by_name), n=1, cutoff=0.6) if given else []
    guess = f"; did you mean {folder / by_name[close[0]]}?" if close else ""
    return f" (autodl's example {kind} are in {folder}: {', '.join(names[:10])}{guess})"


def default_pool_file() -> Path:
    """The declared pool used when no NVML driver answers."""
    return include_dir() / "pools" / "demo.yaml"


def default_memory_threshold() -> float | None:
    """The memory threshold for specs that do not set ``resource_policy.memory_threshold``; None: the
    spec's own default.

    :raises ConfigError: not a number in (0, 1], naming where the value came from.
    """
    raw = setting("memory_threshold")
    if raw is None:
        return None
    try:
        value = float(raw)
    except ValueError:
        value = float("nan")
    if not 0 < value <= 1:
        raise ConfigError(f"{_source('memory_threshold')}: {raw!r} is not a fraction of device memory in (0, 1]; "
                          "set it to e.g. 0.85, or unset it to use the spec's default.")
    return value


GANG_WAIT_BOUND_S = 1800.0
"""Default bound, seconds, after which a waiting gang (2+ devices) goes first in the product's admission
queue (``[autodl] gang_wait_bound_s`` / ``AUTODL_GANG_WAIT_BOUND_S``): half of a spec's default
``scheduler.timeout`` (3600 s), so a gang that a stream of smaller runs keeps overtaking becomes the
queue's head, and gets its reservation, well before its own wait times out (issue 23)."""


def gang_wait_bound_s() -> float | None:
    """Seconds after which a waiting gang goes first (:data:`GANG_WAIT_BOUND_S` unless configured);
    None when configured as ``off``.

    :raises ConfigError: not ``off`` nor a number of seconds > 0, naming where the value came from.
    """
    raw = setting("gang_wait_bound_s")
    if raw is None:
        return GANG_WAIT_BOUND_S
    if raw.strip().lower() == "off":
        return None
    try:
        value = float(raw)
    except ValueError:
        value = float("nan")
    if not 0 < value < float("inf"):
        raise ConfigError(f"{_source('gang_wait_bound_s')}: {raw!r} is not a number of seconds > 0; set it to "
                          f"e.g. {GANG_WAIT_BOUND_S:g}, or 'off' to let the shortest runs always go first.")
    return value


def prometheus_url() -> str | None:
    """The Prometheus server that scrapes dcgm-exporter (``[autodl] prometheus_url``, ``http(s)://HOST:PORT[/prefix]``):
    where the collect step samples the GPUs of a pod, and of a container whose host NVML cannot be read from
    here (:mod:`autodl.dcgm`). None: not configured.

    :raises ConfigError: not an http(s) URL, naming where the value came from.
    """
    raw = setting("prometheus_url")
    if raw is None:
        return None
    from urllib.parse import urlsplit

    parts = urlsplit(raw)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        from autodl.redact import redact_url

        raise ConfigError(f"{_source('prometheus_url')}: {redact_url(raw)!r} is not an http(s) URL of a Prometheus "
                          "server; set it to e.g. http://prometheus:9090")
    return raw.rstrip("/")


def default_launcher() -> str | None:
    """The launcher for specs without a ``launcher:`` section; None: ``local``.

    Known names: :data:`autodl.registry.LAUNCHERS`.

    :raises ConfigError: not a known launcher name, naming where the value came from.
    """
    raw = setting("default_launcher")
    if raw is None:
        return None
    if raw not in LAUNCHERS:
        raise ConfigError(f"{_source('default_launcher')}: unknown launcher {raw!r}; use one of: {', '.join(LAUNCHERS)}.")
    return raw


SHARING_MODES: tuple[str, ...] = ("exclusive", "packed")
"""The values of ``resource_policy.sharing``, as :data:`autodl.policy.packing.SHARING_MODES` (a test keeps the two
equal; the configuration imports nothing of the policy, which would be an import cycle)."""


def default_sharing() -> str:
    """Whether runs may share a device, for specs that do not set ``resource_policy.sharing``
    (``[autodl] sharing`` / ``AUTODL_SHARING``): ``exclusive`` (the default: every lease holds its devices
    alone) or ``packed`` (:mod:`autodl.policy.packing`, ``docs/reference/fractional-leases.md``).

    :raises ConfigError: not one of those, naming where the value came from.
    """
    raw = setting("sharing")
    if raw is None:
        return "exclusive"
    value = raw.strip().lower()
    if value not in SHARING_MODES:
        raise ConfigError(f"{_source('sharing')}: {raw!r} is not a sharing mode; use one of: {', '.join(SHARING_MODES)} "
                          "(or unset it: exclusive).")
    return value


def host_queues() -> dict[str, str]:
    """Which Celery queue runs the steps that must run on a GPU host (``[autodl] host_queues``).

    Written ``host=queue,host=queue`` (or a JSON object), the hosts as the inventory names them. Only
    listed hosts are routed: a declared pool's made-up host names never send a step to a queue no
    worker reads. Empty: no routing (one machine, or launchers that reach the host remotely: a Docker
    engine per host, Kubernetes). Read by the DAG processor (it builds the group) and the scheduler
    (:mod:`autodl.policies`): give both the same value.

    :returns: ``{host: queue}``.
    :raises ConfigError: for an entry that is not ``host=queue``.
    """
    raw = setting("host_queues")
    if not raw:
        return {}
    if raw.startswith("{"):
        import json

        try:
            data = json.loads(raw)
        except ValueError as exc:
            raise ConfigError(f"{_source('host_queues')}: not a JSON object ({exc}); write host=queue,host=queue.") from None
        if not isinstance(data, dict) or not all(isinstance(k, str) and isinstance(v, str) and k and v
                                                 for k, v in data.items()):
            raise ConfigError(f"{_source('host_queues')}: a JSON value must map host names to queue names.")
        return dict(data)
    out: dict[str, str] = {}
    for entry in filter(None, (e.strip() for e in raw.split(","))):
        host, sep, queue = entry.partition("=")
        if not sep or not host.strip() or not queue.strip():
            raise ConfigError(f"{_source('host_queues')}: entry {entry!r} is not host=queue; write e.g. "
                              "gpu-node-1=gpu-node-1,gpu-node-2=gpu-node-2.")
        out[host.strip()] = queue.strip()
    return out


def queue_for_host(host: str | None) -> str | None:
    """The Celery queue of ``host`` under :func:`host_queues`; None when routing is off or the host is not listed."""
    if not host:
        return None
    return host_queues().get(host)


def read_yaml(path: str | Path, error: type[Exception], missing: str) -> Any:
    """Parse a YAML file (spec, pool, catalog) with autodl's one bounded loader (:func:`autodl.inputs.read_yaml`).

    :param missing: what to say (after the path) when the file does not exist.
    :raises error: ``"<path>: <missing>"``, or ``"<path>:<line>: <field>: <problem>"`` for a file autodl
        refuses (binary, too large, a symlink loop, duplicate keys, tags, aliases expanding without bound,
        nesting too deep, numbers out of range).
    """
    from autodl.inputs import read_yaml as _read

    return _read(path, error, missing)
