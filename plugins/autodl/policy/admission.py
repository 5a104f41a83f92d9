"""The admission queue's decision, as a pure function: which waiting runs get devices now, and which devices.

Both the product (waiting runs registered in autodl's store, see the pool-wait step) and the
trace-driven simulator call :func:`admit` with the runs that wait, the devices that are free and the
runs that hold devices, so the simulator measures the queue code that orders real runs.

This module decides *which* run goes next and hands each candidate the free devices; *where* a run
goes among those devices is the placement policy's job (the ``place_on`` callback).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Hashable, Sequence


@dataclass(frozen=True, slots=True)
class QueuedRun:
    """A run waiting for devices.

    :ivar run_key: the run's idempotency key.
    :ivar num_gpus: gang size (devices needed at once).
    :ivar needed_bytes: estimated per-device peak memory, bytes.
    :ivar enqueued_at: when it started waiting, seconds (epoch in the product, trace time in the simulator).
    :ivar owner: who submitted it (quota key), or None.
    :ivar expected_runtime_s: expected seconds of training once placed (from run records, or FLOPs /
        device throughput), or None when unknown.
    """

    run_key: str
    num_gpus: int
    needed_bytes: int
    enqueued_at: float
    owner: str | None = None
    expected_runtime_s: float | None = None


@dataclass(frozen=True, slots=True)
class RunningRun:
    """A run that holds devices now.

    :ivar devices: the devices it holds.
    :ivar expected_end: when it is expected to free them, seconds (same clock as ``enqueued_at``), or None.
    """

    run_key: str
    devices: tuple[Hashable, ...]
    expected_end: float | None = None
    owner: str | None = None


@dataclass(frozen=True, slots=True)
class Grant:
    """The queue's decision for one run: start it now on ``devices``."""

    run_key: str
    devices: tuple[Hashable, ...]
    reason: str


PlaceOn = Callable[[QueuedRun, frozenset], "Sequence[Hashable] | None"]
"""``place_on(run, free_devices)``: the devices the placement policy would give ``run`` among
``free_devices`` (a gang: ``num_gpus`` of them), or None when it fits on none of them now."""


def queue_order(waiting: Sequence[QueuedRun], now: float) -> list[QueuedRun]:
    """The order in which waiting runs are considered: first come, first served (ties by run key)."""
    del now
    return sorted(waiting, key=lambda r: (r.enqueued_at, r.run_key))


def admit(waiting: Sequence[QueuedRun], free: frozenset, running: Sequence[RunningRun], now: float,
          place_on: PlaceOn) -> list[Grant]:
    """Decide which waiting runs start now and on which of the ``free`` devices.

    Runs are taken in :func:`queue_order`; each that the placement policy can put on what is still
    free gets those devices (later runs may start when an earlier one does not fit: backfill).

    :param waiting: the runs that wait.
    :param free: ids of the devices free now.
    :param running: the runs holding devices (for reservations; unused by first-come, first-served).
    :param now: the current time, same clock as ``QueuedRun.enqueued_at``.
    :param place_on: the placement policy, see :data:`PlaceOn`.
    :returns: the grants, in the order they were decided; devices of different grants never overlap.
    """
    del running
    grants: list[Grant] = []
    left = set(free)
    for run in queue_order(waiting, now):
        if len(left) < run.num_gpus:
            continue
        devices = place_on(run, frozenset(left))
        if not devices:
            continue
        left.difference_update(devices)
        grants.append(Grant(run.run_key, tuple(devices), "first come, first served"))
    return grants


__all__ = ["Grant", "PlaceOn", "QueuedRun", "RunningRun", "admit", "queue_order"]
