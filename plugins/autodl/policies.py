"""Airflow cluster policies of autodl (shell). Celery routing: the steps that must run on the booked GPU host go to that host's queue.

Details: docs/reference/scheduler.md#autodlpolicies.
"""

from __future__ import annotations

import logging
from typing import Any

from airflow.policies import hookimpl

log = logging.getLogger(__name__)

ROUTED_OPERATORS = frozenset({"AutoDLLaunchOperator", "AutoDLCollectOperator"})
"""Operator class names whose instances run on the booked host (``TaskInstance.operator``)."""


def routing_enabled() -> bool:
    """True when ``[autodl] host_queues`` names at least one host (read at DAG parse time)."""
    from autodl.config import host_queues

    return bool(host_queues())


def run_keys_for(dag_id: str, task_id: str, run_id: str) -> list[str]:
    """Run keys the step ``task_id`` may belong to: its group's full id (``outer.train``) and, for a
    group nested in another, its own id (``train``), as :func:`autodl.steps.context.make_run_key` builds them."""
    from autodl.steps.context import make_run_key

    if "." not in task_id:
        return []
    group = task_id.rsplit(".", 1)[0]
    keys = [make_run_key(dag_id, group, run_id)]
    if "." in group:
        keys.append(make_run_key(dag_id, group.rsplit(".", 1)[1], run_id))
    return keys


def queue_for_run(dag_id: str, task_id: str, run_id: str) -> str | None:
    """The queue of the host holding the lease of the run ``task_id`` belongs to; None when there is no
    lease yet or its host has no queue in ``[autodl] host_queues``."""
    from autodl.config import queue_for_host
    from autodl.ledger import Ledger

    ledger = Ledger()
    for run_key in run_keys_for(dag_id, task_id, run_id):
        lease = ledger.get(run_key)
        if lease is not None:
            queue = queue_for_host(lease.host)
            if queue is None:
                log.warning("autodl: lease %s of run %s is on host %s, which [autodl] host_queues does not name; "
                            "%s keeps its queue", lease.lease_id, run_key, lease.host, task_id)
            return queue
    return None


@hookimpl
def task_instance_mutation_hook(task_instance: Any, dag_run: Any = None) -> None:
    """Airflow cluster policy: route an expanded ``launch``/``collect_metrics`` instance to its host's queue."""
    try:
        if getattr(task_instance, "map_index", -1) is None or task_instance.map_index < 0:
            return
        operator = getattr(task_instance, "operator", None) or getattr(getattr(task_instance, "task", None), "task_type", None)
        if operator not in ROUTED_OPERATORS or not routing_enabled():
            return
        queue = queue_for_run(task_instance.dag_id, task_instance.task_id, task_instance.run_id)
        if queue and task_instance.queue != queue:
            log.info("autodl: %s of %s runs on queue %s (the booked host's)", task_instance.task_id,
                     task_instance.run_id, queue)
            task_instance.queue = queue
    except Exception as exc:  # noqa: BLE001 - a policy must never break the scheduler's loop
        log.warning("autodl: could not route %s to its GPU host's queue: %s", getattr(task_instance, "task_id", "?"), exc)
