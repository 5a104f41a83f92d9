"""Registers autodl with Airflow (entry point ``airflow.plugins``): operators are imported from
``autodl.operators``; this plugin lists autodl in the UI and adds the listeners that release the leases
of failed runs (:mod:`autodl.listeners`)."""

from __future__ import annotations

import importlib

from airflow.plugins_manager import AirflowPlugin


class AutoDLPlugin(AirflowPlugin):
    """autodl's Airflow plugin."""

    name = "autodl"
    listeners = [importlib.import_module("autodl.listeners")]
