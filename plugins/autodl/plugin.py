"""Registers autodl with Airflow (entry point ``airflow.plugins``): operators are imported from
``autodl.operators``; this plugin adds the listeners-free metadata so the UI lists autodl."""

from __future__ import annotations

from airflow.plugins_manager import AirflowPlugin


class AutoDLPlugin(AirflowPlugin):
    """autodl's Airflow plugin."""

    name = "autodl"
