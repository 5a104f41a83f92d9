"""Interference: how fast a run goes beside another on one device, measured from the run records, else a published prior.

A pair type (:func:`autodl.policy.packing.pair_type`: the two runs' model names on one device model) stops being
packed when its runs' co-located/solo speed ratio falls below :data:`autodl.policy.packing.SLOWDOWN_BAR` (issue 24,
rule 5 of ``docs/reference/fractional-leases.md``). The ratios come from this pool's own records: a shared run's
``metrics.step_time_s`` against the median step time of the solo (exclusive) runs of the same model on the same
device model. A pair type never measured here falls to the published measurement of the same two models
(``include/data/colocation-pairs.csv``, sources in ``include/data/README.md``); one neither measured nor published is
packed until its records measure it.
"""

from __future__ import annotations

import csv
import re
import statistics
from collections import defaultdict
from collections.abc import Iterable
from functools import lru_cache
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from autodl.policy.packing import SLOWDOWN_BAR, pair_barred, pair_type
from autodl.types import RunRecord

PAIRS_FILE = "data/colocation-pairs.csv"
"""The published pair measurements, under autodl's include folder (:func:`autodl.config.include_dir`)."""

RECENT_RECORDS = 2000
"""How many of the newest run records :func:`may_pack` reads from the store (one query; older runs measured an
older software stack)."""


class PairSpeed(BaseModel):
    """What is known of one pair type's speed, and whether it may be packed."""

    model_config = ConfigDict(frozen=True)

    pair_type: str
    ratios: list[float] = Field(description="Co-located/solo step-speed ratios (0-1], one per run (or published job).")
    source: Literal["measured", "published", "published-median"] = Field(description=(
        "measured: this pool's records; published: the published pair of these two models; published-median: no "
        "figure for these models, the median of the published pairs' means."))
    barred: bool = Field(description=f"The mean ratio is below {SLOWDOWN_BAR} (autodl.policy.packing.pair_barred).")
    detail: str = Field(description="The figures and where they come from, for a log line or a finding.")


def model_key(name: str | None) -> str:
    """A model name as pair types are keyed: lower case, letters and digits only (``ResNet-50`` -> ``resnet50``);
    ``?`` for an unknown model."""
    key = re.sub(r"[^a-z0-9]", "", (name or "").lower())
    return key or "?"


def _step_time(record: RunRecord) -> float | None:
    value = (record.metrics or {}).get("step_time_s")
    return float(value) if isinstance(value, (int, float)) and value > 0 else None


def _model(record: RunRecord) -> str:
    return model_key((record.profile or {}).get("model_name"))


def solo_step_times(records: Iterable[RunRecord]) -> dict[tuple[str, str], float]:
    """Median ``step_time_s`` (seconds) of the succeeded exclusive runs on a device, by (model key, device model)."""
    times: dict[tuple[str, str], list[float]] = defaultdict(list)
    for r in records:
        step = _step_time(r)
        if r.sharing == "exclusive" and r.outcome == "succeeded" and not r.declared_pool and r.device_model and step:
            times[(_model(r), r.device_model)].append(step)
    return {key: statistics.median(values) for key, values in times.items()}


def measured_ratios(records: Iterable[RunRecord]) -> dict[str, list[float]]:
    """Co-located/solo speed ratios by pair type, from run records (pure).

    A shared run counts when it succeeded, reports a step time, shared its device with exactly one run whose
    record is among ``records`` (that run's model names the pair), and solo runs of its model on its device model
    are recorded. Its ratio is solo median step time / its step time, capped at 1.0 (a run beside another measured
    faster than alone is noise, never a reason to pack a slower pair). A run whose device saw two neighbours in
    turn is left out: its step time cannot be laid to one of them.

    :returns: pair type -> ratios, one per counted run (both runs of a pair count, each against its own solo).
    """
    records = list(records)
    by_key = {r.run_key: r for r in records}
    solo = solo_step_times(records)
    ratios: dict[str, list[float]] = defaultdict(list)
    for r in records:
        step = _step_time(r)
        if r.sharing != "shared" or r.outcome != "succeeded" or len(r.co_tenants) != 1 or not step or not r.device_model:
            continue
        neighbour = by_key.get(r.co_tenants[0])
        alone = solo.get((_model(r), r.device_model))
        if neighbour is None or alone is None:
            continue
        ratios[pair_type(_model(r), _model(neighbour), r.device_model)].append(min(1.0, alone / step))
    return dict(ratios)


@lru_cache(maxsize=4)
def published_pairs(path: str | None = None) -> dict[tuple[str, str], tuple[float, ...]]:
    """The published pairs (``include/data/colocation-pairs.csv``): sorted model keys -> both jobs' speed ratios.

    :param path: another CSV of the same columns; default the shipped one.
    """
    from autodl.config import include_dir

    file = Path(path) if path else include_dir() / PAIRS_FILE
    pairs: dict[tuple[str, str], tuple[float, ...]] = {}
    with open(file, newline="") as f:
        for row in csv.DictReader(f):
            a, b = model_key(row["model_a"]), model_key(row["model_b"])
            both = (float(row["paired_a_steps_per_s"]) / float(row["solo_a_steps_per_s"]),
                    float(row["paired_b_steps_per_s"]) / float(row["solo_b_steps_per_s"]))
            key = (min(a, b), max(a, b))
            pairs[key] = pairs.get(key, ()) + both
    return pairs


def published_prior(model_a: str | None,
                    model_b: str | None) -> tuple[list[float], Literal["published", "published-median"], str]:
    """The prior for a pair type never measured here: ``(ratios, source, detail)``.

    The published pair of the same two models when there is one (on whatever GPU it was measured: the device
    model differs, the prior says so); else the median of the published pairs' mean ratios, as one ratio: what to
    expect of a pair nothing is known of (0.62 with the shipped figures). Such a pair is still packed, since rule 5
    bars only what was measured (:func:`pair_speed`), and its records then measure it.
    """
    pairs = published_pairs()
    a, b = sorted((model_key(model_a), model_key(model_b)))
    if (a, b) in pairs:
        ratios = list(pairs[(a, b)])
        return ratios, "published", (f"published pair {a}+{b} (Gavel, P100; include/data/colocation-pairs.csv): "
                                     f"speed ratios {', '.join(f'{x:.2f}' for x in ratios)}")
    means = sorted(statistics.fmean(v) for v in pairs.values())
    median = statistics.median(means)
    return [median], "published-median", (f"{a}+{b} was never measured: the median of the {len(means)} published "
                                          f"pairs' mean speed ratios, {median:.2f} (include/data/colocation-pairs.csv)")


def pair_speed(model_a: str | None, model_b: str | None, device_model: str,
               records: Iterable[RunRecord]) -> PairSpeed:
    """What is known of the pair type of ``model_a`` beside ``model_b`` on ``device_model`` (pure given ``records``):
    this pool's measured ratios when there are any, else :func:`published_prior`."""
    key = pair_type(model_key(model_a), model_key(model_b), device_model)
    measured = measured_ratios(records).get(key)
    if measured:
        detail = (f"{key}: measured in {len(measured)} shared run(s), mean speed ratio "
                  f"{statistics.fmean(measured):.2f} of solo")
        return PairSpeed(pair_type=key, ratios=measured, source="measured", barred=pair_barred(measured), detail=detail)
    ratios, source, detail = published_prior(model_a, model_b)
    if source == "published-median":
        # rule 5 bars what was *measured* below the bar: a pair nobody measured is packed (the run asked for packed),
        # measured by its records, and barred from then on if it is slow; the median says what to expect meanwhile
        return PairSpeed(pair_type=key, ratios=ratios, source=source, barred=False,
                         detail=f"{key}: {detail}; packed until this pool measures it (barred below {SLOWDOWN_BAR})")
    return PairSpeed(pair_type=key, ratios=ratios, source=source,
                     barred=pair_barred(ratios), detail=f"{key}: {detail}")


def barred_pairs(records: Iterable[RunRecord]) -> set[str]:
    """The pair types this pool measured below the bar (pure): what the queue must not pack again."""
    return {key for key, ratios in measured_ratios(records).items() if pair_barred(ratios)}


def recent_records(url: str | None = None, limit: int = RECENT_RECORDS) -> list[RunRecord]:
    """The newest ``limit`` run records in autodl's store (``url``: default the configured store)."""
    from autodl.records import RecordStore

    return RecordStore(url).list(limit=limit)


def may_pack(model: str | None, neighbour_model: str | None, device_model: str, *,
             records: Iterable[RunRecord] | None = None, url: str | None = None) -> bool:
    """Whether a run of ``model`` may share a ``device_model`` device with a run of ``neighbour_model``.

    :param records: the run records to judge by; default :func:`recent_records` of the store at ``url``.
    :returns: False when the pair type's measured (else published) speed ratio is below the bar.
    """
    found = records if records is not None else recent_records(url)
    return not pair_speed(model, neighbour_model, device_model, found).barred
