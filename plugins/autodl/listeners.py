"""Airflow listeners: when a DAG run or one of autodl's steps fails for good, its lease is released.

The release step (a teardown) frees the lease whenever the DAG runs to its end. These listeners cover
what skips it: a DAG run marked failed (its unfinished tasks are skipped, the teardown with them), a
collect task marked failed by hand while its training runs in the triggerer, a task the scheduler
fails after its worker died. Each stops the run's training, frees the lease, takes the run out of the
admission queue and records why. A try that will be retried releases nothing.
"""

from __future__ import annotations

import logging
from typing import Any

from airflow.listeners import hookimpl

log = logging.getLogger(__name__)

HOLDING_STEPS = ("wait_for_pool", "select_device", "launch", "collect_metrics")
"""Steps that run while (or just before) the run holds a lease."""


def _state(value: Any) -> str:
    return str(getattr(value, "value", value) or "").lower()


def _step_of(task_id: str) -> tuple[str, str] | None:
    """(group id, step) of an autodl step's task id ``<group>.<step>``, else None."""
    group, _, step = task_id.rpartition(".")
    return (group, step) if group and step in HOLDING_STEPS else None


def _launcher_kwargs_for(kind: str, host: str | None = None) -> dict[str, Any]:
    from autodl.operators.connections import launcher_kwargs

    try:
        return launcher_kwargs(kind, host)
    except Exception:  # noqa: BLE001 - a connection that cannot be read: stop with the launcher's defaults
        return {}


@hookimpl
def on_task_instance_failed(previous_state: Any, task_instance: Any, error: Any) -> None:
    """A step of an autodl group failed for good (not a try that will be retried): release its run's lease."""
    try:
        if _state(getattr(task_instance, "state", None)) == "up_for_retry":
            return
        found = _step_of(str(getattr(task_instance, "task_id", "")))
        if found is None:
            return
        group, step = found
        from autodl.steps.context import make_run_key
        from autodl.steps.reaper import release_failed_run

        dag_id, run_id = task_instance.dag_id, task_instance.run_id
        run_key = make_run_key(dag_id, group, run_id)
        reason = f"Airflow marked {task_instance.task_id} failed: {str(error or 'no reason given')[:500]}"
        freed = release_failed_run(dag_id, run_id, run_key=run_key, reason=reason, log=log.info,
                                   launcher_kwargs_for=_launcher_kwargs_for)
        if freed:
            log.info("autodl released the lease of %s: %s", run_key, reason)
    except Exception:  # noqa: BLE001 - a listener must never break Airflow; the lease TTL is the last resort
        log.exception("autodl could not release the lease of a failed task")


@hookimpl
def on_dag_run_failed(dag_run: Any, msg: str) -> None:
    """A DAG run failed: release every lease it still holds and take its waiting runs out of the queue."""
    try:
        from autodl.steps.reaper import release_failed_run

        reason = f"the DAG run {dag_run.run_id} failed: {str(msg or 'no reason given')[:500]}"
        freed = release_failed_run(dag_run.dag_id, dag_run.run_id, reason=reason, log=log.info,
                                   launcher_kwargs_for=_launcher_kwargs_for)
        if freed:
            log.info("autodl released the leases of %s: %s", ", ".join(freed), reason)
    except Exception:  # noqa: BLE001 - a listener must never break Airflow; the lease TTL is the last resort
        log.exception("autodl could not release the leases of a failed DAG run")
