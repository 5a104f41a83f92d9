"""Airflow shell: ``AutoDLTrainOperator`` (a TaskGroup of the six steps) and the step operators."""

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
