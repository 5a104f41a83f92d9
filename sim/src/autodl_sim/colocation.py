"""Interference of two co-located runs: each one's paired/solo speed ratio, from the published pair measurements.

The table is ``include/data/colocation-pairs.csv`` (Gavel, Narayanan et al., OSDI 2020, measured on a P100,
MIT licence; see ``include/data/README.md``). The trace's model classes map onto its models:
``imagenet_resnet50`` and ``cifar10_resnet18`` -> ``ResNet-50`` (the table's only convolutional network),
``bert_finetune`` -> ``Transformer``. A job's ratio is its own paired steps/s over its own solo steps/s.
"""

from __future__ import annotations

import csv
from pathlib import Path

from autodl.config import include_dir

PAIRS_CSV = include_dir() / "data" / "colocation-pairs.csv"

MODEL_OF_CLASS = {
    "imagenet_resnet50": "ResNet-50",
    "cifar10_resnet18": "ResNet-50",
    "bert_finetune": "Transformer",
}
"""The trace's model class -> the table's model (see the module docstring)."""

MIN_RATIO = 0.05
"""Floor of a scaled ratio (``slowdown_scale`` can drive ``1 - s(1 - r)`` to or below 0): a run that shares
still progresses, at 5% of its solo speed at worst. An assumption of the sensitivity rows only."""


def load_pair_ratios(path: str | Path = PAIRS_CSV) -> dict[tuple[str, str], float]:
    """``{(own model, neighbour's model): paired/solo speed ratio}`` from the pair table.

    :raises ValueError: naming the file and row when a speed is missing or not positive.
    """
    out: dict[tuple[str, str], float] = {}
    with open(path, newline="") as fh:
        for i, row in enumerate(csv.DictReader(fh), 2):
            try:
                ra = float(row["paired_a_steps_per_s"]) / float(row["solo_a_steps_per_s"])
                rb = float(row["paired_b_steps_per_s"]) / float(row["solo_b_steps_per_s"])
            except (KeyError, TypeError, ValueError, ZeroDivisionError) as exc:
                raise ValueError(f"{path}: row {i}: {exc!r}; each row needs positive solo_/paired_ steps_per_s.") from None
            a, b = row["model_a"], row["model_b"]
            if a == b:
                out[(a, b)] = (ra + rb) / 2
            else:
                out[(a, b)], out[(b, a)] = ra, rb
    return out


def pair_ratio(ratios: dict[tuple[str, str], float], own_class: str, other_class: str, scale: float = 1.0) -> float:
    """The speed ratio (0-1] of a ``own_class`` job beside an ``other_class`` one: ``1 - scale x (1 - r)``,
    floored at :data:`MIN_RATIO`.

    :raises KeyError: when a class has no model in :data:`MODEL_OF_CLASS` or the pair no row in the table.
    """
    r = ratios[(MODEL_OF_CLASS[own_class], MODEL_OF_CLASS[other_class])]
    return max(MIN_RATIO, min(1.0, 1.0 - scale * (1.0 - r)))
