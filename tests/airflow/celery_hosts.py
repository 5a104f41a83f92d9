"""The Celery app of the multi-host test: the steps that must run on the booked GPU host (launch, collect),
as tasks a worker started with that host's ``AUTODL_HOST``, ``AUTODL_HOME`` and queue runs.

Each task calls the same :mod:`autodl.pipeline` function the Airflow operator calls, with the values typed
at this edge as the operators type their XComs. The broker and result backend are
``AUTODL_TEST_REDIS_URL`` (Redis).
"""

from __future__ import annotations

import os
from typing import Any

from celery import Celery

app = Celery("autodl_test_hosts", broker=os.environ.get("AUTODL_TEST_REDIS_URL", "redis://127.0.0.1:6379/0"),
             backend=os.environ.get("AUTODL_TEST_REDIS_URL", "redis://127.0.0.1:6379/0"))
app.conf.update(task_serializer="json", result_serializer="json", accept_content=["json"],
                worker_prefetch_multiplier=1, task_acks_late=True, broker_connection_retry_on_startup=True)


def _ctx(run: dict[str, Any]):
    from autodl.pipeline import RunContext

    return RunContext(**run)


@app.task(name="autodl_test.launch")
def launch(run: dict[str, Any], profile_out: dict[str, Any], selection: dict[str, Any]) -> dict[str, Any]:
    """Step 4 on this host: start the training; returns its handle and the host that ran the task."""
    from autodl import pipeline
    from autodl.hosts import this_host
    from autodl.types import ProfileResult, Selection

    handle = pipeline.step_launch(_ctx(run), ProfileResult.coerce(profile_out), Selection.coerce(selection))
    return {"handle": handle, "ran_on": this_host(), "autodl_home": os.environ["AUTODL_HOME"]}


@app.task(name="autodl_test.collect")
def collect(run: dict[str, Any], handle: dict[str, Any]) -> dict[str, Any]:
    """Step 5 on this host: follow the training to its end; returns its metrics and the host that ran the task."""
    from autodl import pipeline
    from autodl.hosts import this_host
    from autodl.store import RunState

    ctx = _ctx(run)
    limits = pipeline.CollectLimits.for_run(RunState().get(ctx.run_key, RunState.PROFILE))
    metrics = pipeline.step_collect(ctx, handle, launcher_type=handle["launcher"], interval_s=0.2, limits=limits)
    return {"metrics": metrics, "ran_on": this_host()}
