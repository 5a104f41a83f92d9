"""Airflow shell: ``AutoDLTrainOperator`` (a TaskGroup of the six steps) and the step operators.

Follows astronomer-cosmos's ``DbtTaskGroup`` (a TaskGroup that builds its tasks) and apache-airflow-providers-docker
(``template_fields``, the hook's client behind ``cached_property``): docs/reference/layout.md#the-anchor-each-part-follows.
"""

from __future__ import annotations

from autodl.operators.group import AutoDLTrainOperator
from autodl.operators.steps import (
    AutoDLCollectOperator,
    AutoDLLaunchOperator,
    AutoDLPoolSensor,
    AutoDLProfileOperator,
    AutoDLReleaseOperator,
    AutoDLSelectOperator,
)

__all__ = [
    "AutoDLTrainOperator",
    "AutoDLProfileOperator",
    "AutoDLPoolSensor",
    "AutoDLSelectOperator",
    "AutoDLLaunchOperator",
    "AutoDLCollectOperator",
    "AutoDLReleaseOperator",
]
