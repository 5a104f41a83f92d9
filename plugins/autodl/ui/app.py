"""The GPU page: a FastAPI app the api-server mounts at ``/autodl``, behind Airflow's auth.

Details: docs/reference/gpu-page.md#autodluiapp.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

from airflow.api_fastapi.core_api.security import GetUserDep, get_user
from fastapi import Depends, FastAPI, Header, HTTPException, Request, status
from fastapi.responses import HTMLResponse, JSONResponse, Response
from jinja2 import Environment, FileSystemLoader, select_autoescape

from autodl.errors import AutoDLError
from autodl.inputs import short
from autodl.ui import data, plots
from autodl.ui.urls import APP_PREFIX

TEMPLATES = Environment(loader=FileSystemLoader(str(Path(__file__).with_name("templates"))),
                        autoescape=select_autoescape(["html"]))
RELEASE_HEADER = "X-AutoDL-Action"
"""A POST that changes something must carry this header (value ``release``): a cross-site form cannot
set it, so the UI's cookie alone never releases a lease."""
LEASE_RESOURCE = "autodl_leases"
"""The custom-view resource name an auth manager other than the simple one is asked about (method
``DELETE``) for releasing leases."""


# ------------------------------------------------------------------------------------------ auth
def is_admin(user: Any) -> bool:
    """Whether ``user`` may release leases: the auth manager's admins.

    The simple auth manager: role ``ADMIN``; Flask-AppBuilder's: role ``Admin``; any other auth manager
    is asked whether the user may ``DELETE`` the custom view :data:`LEASE_RESOURCE`.
    """
    role = getattr(user, "role", None)
    if isinstance(role, str):
        return role.upper() == "ADMIN"
    roles = getattr(user, "roles", None)
    if roles is not None:
        return any(getattr(r, "name", r) == "Admin" for r in roles)
    from airflow.api_fastapi.app import get_auth_manager

    return bool(get_auth_manager().is_authorized_custom_view(method="DELETE", resource_name=LEASE_RESOURCE, user=user))


def dag_filter(user: Any) -> data.DagFilter:
    """The viewer's DAG read permission, as Airflow's own views check it: the auth manager's
    ``filter_authorized_dag_ids(dag_ids=..., user=..., method="GET")`` (each id through ``is_authorized_dag``
    unless the auth manager does it in one go)."""
    from airflow.api_fastapi.app import get_auth_manager

    def readable(dag_ids: set[str]) -> set[str]:
        if not dag_ids:
            return set()
        return set(get_auth_manager().filter_authorized_dag_ids(dag_ids=set(dag_ids), user=user, method="GET"))

    return readable


# --------------------------------------------------------------------------------------- helpers
def _app_root(request: Request) -> str:
    """The app's own path prefix as the browser sees it (``/autodl``, or under Airflow's base path)."""
    return (request.scope.get("root_path") or "").rstrip("/")


def _base_path(request: Request) -> str:
    """Airflow's base path (what comes before the app's mount point)."""
    root = _app_root(request)
    return root[: -len(APP_PREFIX)] if root.endswith(APP_PREFIX) else ""


def _render(name: str, request: Request, **context: Any) -> HTMLResponse:
    from autodl.config import store_url
    from autodl.store import redact_url

    html = TEMPLATES.get_template(name).render(app_root=_app_root(request), store=redact_url(store_url()),
                                               now=data.utcnow(), **context)
    return HTMLResponse(html)


def _record_or_404(run_key: str, user: Any) -> Any:
    rec = data.get_record(run_key)
    if rec is None or not data.readable_records([rec], dag_filter(user), admin=is_admin(user)):  # never says it exists
        raise HTTPException(status.HTTP_404_NOT_FOUND, f"no run record {short(run_key)}; /api/runs lists the recorded runs")
    return rec


def _png(content: bytes) -> Response:
    return Response(content, media_type="image/png", headers={"Cache-Control": "no-store"})


# -------------------------------------------------------------------------------------------- app
def create_app(*, pool: str | None = None) -> FastAPI:
    """The GPU page's FastAPI app.

    :param pool: inventory source to show (default ``$AUTODL_POOL``, else ``auto``).
    """
    # Airflow's own dependency (JWT cookie or bearer token, validated by the auth manager) on every route
    app = FastAPI(title="autodl GPUs", docs_url=None, redoc_url=None, openapi_url=None,
                  dependencies=[Depends(get_user)])
    _add_error_handler(app)
    _add_pages(app, pool)
    _add_json_api(app, pool)
    _add_lease_release(app)
    _add_plots(app)
    return app


def _add_error_handler(app: FastAPI) -> None:
    """autodl's errors as a 503 page (or JSON under ``/api/`` and for plots)."""

    @app.exception_handler(AutoDLError)
    def autodl_error(request: Request, exc: AutoDLError) -> Response:
        """The store or the inventory cannot be read: say so (503), never a traceback."""
        if request.url.path.startswith(f"{_app_root(request)}/api/") or request.url.path.endswith(".png"):
            return JSONResponse({"detail": str(exc)}, status_code=status.HTTP_503_SERVICE_UNAVAILABLE)
        html = TEMPLATES.get_template("error.html").render(app_root=_app_root(request), message=str(exc))
        return HTMLResponse(html, status_code=status.HTTP_503_SERVICE_UNAVAILABLE)


def _add_pages(app: FastAPI, pool: str | None) -> None:
    """The HTML pages: the pool, queue, leases and runs (``/``), and one run (``/runs/RUN_KEY``)."""

    @app.get("/", response_class=HTMLResponse, name="index")
    def index(request: Request, user: GetUserDep) -> HTMLResponse:
        b = _base_path(request)
        leases = data.current_leases()
        readable, admin = dag_filter(user), is_admin(user)
        return _render("index.html", request,
                       pool=data.pool_view(pool, leases=leases, base_path=b, readable=readable, admin=admin),
                       queue=data.queue_view(b, pool, readable=readable, admin=admin),
                       leases=data.lease_rows(leases, base_path=b, readable=readable, admin=admin),
                       runs=data.run_rows(50, base_path=b, readable=readable, admin=admin), admin=admin)

    @app.get("/runs/{run_key:path}", response_class=HTMLResponse, name="run_page")
    def run_page(run_key: str, request: Request, user: GetUserDep) -> HTMLResponse:
        detail = data.run_detail(run_key, _base_path(request), dag_filter(user), is_admin(user))
        if detail is None:
            raise HTTPException(status.HTTP_404_NOT_FOUND, f"no run record {short(run_key)}")
        return _render("run.html", request, row=detail.row, record=detail.record, ranking=detail.ranking,
                       timeline=detail.timeline, timeline_note=detail.timeline_note,
                       record_json=json.dumps(detail.record, indent=2))


def _add_json_api(app: FastAPI, pool: str | None) -> None:
    """The JSON API (``/api/pool``, ``/api/queue``, ``/api/leases``, ``/api/runs``, ``/api/runs/RUN_KEY``)."""

    @app.get("/api/pool")
    def api_pool(request: Request, user: GetUserDep) -> JSONResponse:
        view = data.pool_view(pool, base_path=_base_path(request), readable=dag_filter(user), admin=is_admin(user))
        return JSONResponse(view.to_json())

    @app.get("/api/queue")
    def api_queue(request: Request, user: GetUserDep) -> JSONResponse:
        return JSONResponse(data.queue_view(_base_path(request), pool, readable=dag_filter(user),
                                            admin=is_admin(user)).to_json())

    @app.get("/api/leases")
    def api_leases(request: Request, user: GetUserDep) -> JSONResponse:
        rows = data.lease_rows(base_path=_base_path(request), readable=dag_filter(user), admin=is_admin(user))
        return JSONResponse([r.to_json() for r in rows])

    @app.get("/api/runs")
    def api_runs(request: Request, user: GetUserDep, limit: int = 50, dag_id: str | None = None) -> JSONResponse:
        limit = max(1, min(limit, 500))
        rows = data.run_rows(limit, dag_id=dag_id, base_path=_base_path(request), readable=dag_filter(user),
                             admin=is_admin(user))
        return JSONResponse([r.to_json() for r in rows])

    @app.get("/api/runs/{run_key:path}")
    def api_run(run_key: str, request: Request, user: GetUserDep) -> JSONResponse:
        detail = data.run_detail(run_key, _base_path(request), dag_filter(user), is_admin(user))
        if detail is None:
            raise HTTPException(status.HTTP_404_NOT_FOUND, f"no run record {short(run_key)}")
        return JSONResponse(detail.to_json())


def _add_lease_release(app: FastAPI) -> None:
    """An admin's release of a run's lease (``POST /api/leases/RUN_KEY/release``, the page's release button)."""

    @app.post("/api/leases/{run_key:path}/release")
    def api_release(run_key: str, user: GetUserDep,
                    action: Annotated[str | None, Header(alias=RELEASE_HEADER)] = None) -> JSONResponse:
        if action != "release":
            raise HTTPException(status.HTTP_400_BAD_REQUEST, f"send the header {RELEASE_HEADER}: release")
        if not is_admin(user):
            raise HTTPException(status.HTTP_403_FORBIDDEN, "only admins may release another run's lease")
        from autodl.errors import LeaseError
        from autodl.steps.reaper import release_by_hand

        lines: list[str] = []
        try:
            # an admin may release anyone's lease (the owner check of `autodl leases --release` is --force here)
            result = release_by_hand(run_key, user=getattr(user, "get_name", lambda: None)(), force=True,
                                     log=lines.append, how="the GPU page's release button")
        except LeaseError as exc:
            raise HTTPException(status.HTTP_404_NOT_FOUND, str(exc)) from None
        return JSONResponse({**result, "log": lines, "released_by": getattr(user, "get_name", lambda: None)()})


def _add_plots(app: FastAPI) -> None:
    """The PNG plots: estimate vs actual over the recorded runs, and one run's timeline."""

    @app.get("/plots/estimate_vs_actual.png")
    def plot_estimates(user: GetUserDep, limit: int = 200) -> Response:
        rows = data.run_rows(max(1, min(limit, 1000)), readable=dag_filter(user), admin=is_admin(user))
        return _png(plots.estimate_vs_actual_png(data.estimate_points(rows)))

    @app.get("/plots/runs/{run_key:path}/timeline.png")
    def plot_timeline(run_key: str, user: GetUserDep) -> Response:
        rec = _record_or_404(run_key, user)
        path, why = data.samples_file(rec)
        if path is None:
            raise HTTPException(status.HTTP_404_NOT_FOUND, why)
        return _png(plots.run_timeline_png(path, estimated_peak_bytes=rec.estimated_peak_bytes,
                                           source=(rec.metrics or {}).get("source"),
                                           title=f"{rec.run_key} on {rec.device_model or 'unknown device'}"))
