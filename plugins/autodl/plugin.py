"""Registers autodl with Airflow (entry point ``airflow.plugins``): the GPU page (a FastAPI app mounted in the
api-server at ``/autodl``, shown in the UI as the external view "GPUs" in the navigation bar).

Operators are imported from ``autodl.operators``; their "autodl run record" extra link leads to the run on
that page. The plugin registers once: through the package's entry point (``pip install``), never also
from the plugins folder (``plugins/.airflowignore`` keeps Airflow from importing the package's files one by
one, and ``scripts/setup.sh`` leaves no ``autodl.egg-info`` there, which would make Airflow see the entry
point twice and report "Plugin 'autodl' already registered"). Its listeners (:mod:`autodl.listeners`)
release the leases of failed runs.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

from airflow.plugins_manager import AirflowPlugin

from autodl.ui.urls import APP_PREFIX, URL_ROUTE

if TYPE_CHECKING:
    from fastapi import FastAPI


class GpuPageApp:
    """The GPU page as an ASGI app built on its first request: every Airflow process loads plugins, only the
    api-server serves this, so the others never import FastAPI routes, templates or matplotlib for it."""

    def __init__(self) -> None:
        self._app: FastAPI | None = None

    async def __call__(self, scope, receive, send) -> None:
        if self._app is None:
            from autodl.ui.app import create_app

            self._app = create_app()
        await self._app(scope, receive, send)


GPU_ICON = ("data:image/svg+xml;utf8,<svg xmlns='http://www.w3.org/2000/svg' viewBox='0 0 24 24' fill='none' "
            "stroke='%23718096' stroke-width='2'><rect x='2' y='6' width='20' height='12' rx='2'/><circle cx='9' cy='12' "
            "r='3'/><circle cx='16' cy='12' r='3'/><path d='M5 18v2M19 18v2'/></svg>")
"""The navigation icon: a graphics card (drawn for autodl)."""


class AutoDLPlugin(AirflowPlugin):
    """autodl's Airflow plugin."""

    name = "autodl"
    listeners = [importlib.import_module("autodl.listeners")]
    fastapi_apps = [{"app": GpuPageApp(), "url_prefix": APP_PREFIX, "name": "autodl GPUs"}]
    external_views = [{
        "name": "GPUs",
        "href": f"{APP_PREFIX}/",
        "url_route": URL_ROUTE,
        "destination": "nav",
        "icon": GPU_ICON,
    }]
