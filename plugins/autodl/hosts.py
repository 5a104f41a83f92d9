"""Which GPU host a step runs on, and which host the booked devices are on.

A pool spans hosts (NVML on each, a pool file naming several, or dcgm-exporter through Prometheus);
a lease books devices of one host. The local launcher starts and follows the training as a process
of the machine it runs on, so its launch, collect and stop must run on the booked host: with Airflow's
CeleryExecutor, on that host's queue (``[autodl] host_queues``, :mod:`autodl.policies`).
These checks turn a step that landed elsewhere into a clear error instead of a training pinned to
another machine's device ids or a process id that means something else here.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Iterable

from autodl.errors import LaunchError

UNKNOWN_HOSTS = frozenset({"", "localhost", "unknown"})
"""Host names that say nothing: a device read without a host, and the Prometheus source's missing ``Hostname``."""


def this_host() -> str:
    """The name of the host this process runs on, as the inventory names hosts: ``AUTODL_HOST`` when set
    (a container's host name is not its machine's: the compose file sets it on each GPU worker), else
    :func:`socket.gethostname` (what the NVML source records)."""
    return os.environ.get("AUTODL_HOST", "").strip() or socket.gethostname()


def booked_host(hosts: Iterable[str | None]) -> str | None:
    """The one host of the booked devices (given their ``host`` fields), or None when it is unknown.

    :raises LaunchError: when the devices are on several hosts (a lease books devices of one host).
    """
    named = {h for h in hosts if h and h not in UNKNOWN_HOSTS}
    if len(named) > 1:
        raise LaunchError(f"the booked devices are on several hosts ({', '.join(sorted(named))}); one training runs "
                          "on one host: book devices of one host.")
    return named.pop() if named else None


def require_here(host: str | None, what: str, run_key: str) -> None:
    """Refuse to ``what`` (launch, follow, stop) a local training of host ``host`` from another machine.

    Nothing is checked when ``host`` is unknown or declared devices run on CPU wherever the step runs
    (the caller passes None then).

    :raises LaunchError: naming both hosts and the fix (route the step to the host's Celery queue).
    """
    here = this_host()
    if host is None or host in UNKNOWN_HOSTS or host == here:
        return
    raise LaunchError(
        f"run {run_key}: cannot {what} here: the booked devices are on host {host}, but this step runs on {here}. "
        f"The local launcher runs the training as a process of the GPU host, so this step must run there: with "
        f"the CeleryExecutor run a worker on {host} with its own queue (airflow celery worker --queues <queue>) and "
        f"set [autodl] host_queues (AUTODL_HOST_QUEUES), e.g. {host}=<queue>; set AUTODL_HOST on that worker if "
        "its host name differs from the inventory's. Or use launcher: docker with a connection per host "
        "(docker_<host>), or launcher: kubernetes."
    )
