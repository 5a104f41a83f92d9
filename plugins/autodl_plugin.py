"""autodl's Airflow plugin when the ``autodl`` package is dropped into Airflow's plugins folder instead of
installed with pip.

Airflow imports the top-level files of its plugins folder (``.airflowignore`` keeps it out of the
``autodl`` package itself) and registers the ``AirflowPlugin`` classes it finds in them. An installed
autodl registers through its ``airflow.plugins`` entry point instead, so this file then defines nothing
and the plugin is registered once either way.

Dropping in: copy ``plugins/autodl`` (following the ``include`` link: ``cp -rL``), this file and
``plugins/.airflowignore`` into the plugins folder. Without the package's entry points there is no
provider entry (``[autodl]`` options still work through ``AIRFLOW__AUTODL__*`` and ``AUTODL_*``) and no
Celery routing policy (add ``from autodl.policies import task_instance_mutation_hook`` to
``airflow_local_settings.py`` for that).
"""

from __future__ import annotations

from importlib.metadata import entry_points

if not any(ep.value == "autodl.plugin:AutoDLPlugin" for ep in entry_points(group="airflow.plugins")):
    from autodl.plugin import AutoDLPlugin  # noqa: F401 - Airflow registers the plugin classes it finds here
