"""Where autodl's GPU page lives in the Airflow UI, and the Airflow UI's own addresses it links to.

The page is a FastAPI app mounted in the api-server at :data:`APP_PREFIX` and shown inside Airflow's UI
as an external view at ``/plugin/<URL_ROUTE>`` (Airflow 3.3 keeps the iframe's path in the address bar
after that prefix, so ``/plugin/gpus/autodl/runs/<key>`` opens one run's record inside the UI).
"""

from __future__ import annotations

from urllib.parse import quote

APP_PREFIX = "/autodl"
"""Mount point of the FastAPI app in the api-server (not one of Airflow's reserved prefixes)."""
URL_ROUTE = "gpus"
"""The external view's route in Airflow's UI: ``/plugin/gpus``."""


def _join(base_path: str, path: str) -> str:
    return base_path.rstrip("/") + path


def page_path(base_path: str = "") -> str:
    """The GPU page inside Airflow's UI (navigation entry)."""
    return _join(base_path, f"/plugin/{URL_ROUTE}")


def run_record_path(run_key: str, base_path: str = "", *, in_ui: bool = True) -> str:
    """A run's record: inside Airflow's UI (``in_ui``, for links from the task page) or the app's own page."""
    app_path = f"{APP_PREFIX}/runs/{quote(run_key, safe='')}"
    return _join(base_path, f"/plugin/{URL_ROUTE}{app_path}" if in_ui else app_path)


def dag_run_path(dag_id: str, run_id: str, base_path: str = "") -> str:
    """Airflow 3's UI page of one DAG run."""
    return _join(base_path, f"/dags/{quote(dag_id, safe='')}/runs/{quote(run_id, safe='')}")


def dag_path(dag_id: str, base_path: str = "") -> str:
    """Airflow 3's UI page of one DAG."""
    return _join(base_path, f"/dags/{quote(dag_id, safe='')}")


RUN_ID_PREFIXES = ("manual__", "scheduled__", "backfill__", "asset_triggered__", "dataset_triggered__")
"""Prefixes of the run ids Airflow generates (``DagRunType``); a run key ``dag_id.group_id.run_id``
is split at the last ``.<prefix>`` when the lease does not carry its DAG and run."""


def split_run_key(run_key: str) -> tuple[str, str, str] | None:
    """(dag_id, group_id, run_id) of a run key made by :func:`autodl.steps.context.make_run_key`, or None when
    the run id is not one Airflow generates (then the key cannot be split safely: DAG ids may hold dots)."""
    best = -1
    for prefix in RUN_ID_PREFIXES:
        best = max(best, run_key.rfind("." + prefix))
    if best <= 0:
        return None
    head, run_id = run_key[:best], run_key[best + 1:]
    if "." not in head:
        return None
    dag_id, group_id = head.rsplit(".", 1)  # task group ids hold no dots
    return dag_id, group_id, run_id
