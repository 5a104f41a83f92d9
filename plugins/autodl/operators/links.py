"""Operator extra link from each autodl step to its run's record on the GPU page."""

from __future__ import annotations

from typing import TYPE_CHECKING

from airflow.sdk import BaseOperatorLink

from autodl.steps.context import make_run_key
from autodl.ui.urls import run_record_path

if TYPE_CHECKING:
    from airflow.sdk import BaseOperator
    from airflow.sdk.types import TaskInstanceKey


def _base_path() -> str:
    """The path part of ``[api] base_url`` (Airflow served under a sub-path), else ''."""
    from urllib.parse import urlparse

    try:
        from airflow.configuration import conf

        return urlparse(conf.get("api", "base_url", fallback="") or "").path.rstrip("/")
    except Exception:  # noqa: BLE001 - a link must never fail a task
        return ""


class AutoDLRunRecordLink(BaseOperatorLink):
    """"autodl run record": the run's page (pool, placement with reasons, estimate vs actual, timeline)."""

    name = "autodl run record"

    def get_link(self, operator: BaseOperator, *, ti_key: TaskInstanceKey) -> str:
        group_id = getattr(operator, "group_id", None)
        if not group_id:
            return ""
        return run_record_path(make_run_key(ti_key.dag_id, group_id, ti_key.run_id), _base_path())
