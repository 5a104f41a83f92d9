"""Why is my run waiting: each waiting run's position, the reason it waits, and when it is expected to start.

The reason is the admission decision's own (:func:`autodl.queue.admission` with ``explain``): a held
queue, a team at its quota, the devices reserved for the head, no free fitting device. The expected
start replays the same decision forward: at each expected end of a running run (a lease's booking time
plus its expected runtime) its devices come free and the queue admits again, granted runs then holding
their devices for their own expected runtime. A holder whose end is unknown (no runtime, or already past
it) is never assumed to end, so the runs waiting for its devices have no expected start: the report
says why rather than guess.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from datetime import datetime, timezone

from pydantic import BaseModel, ConfigDict

from autodl.policy.admission import RunningRun
from autodl.policy.packing import DeviceShare
from autodl.quota import NO_TEAM
from autodl.types import Device, Inventory, Lease, QueueEntry, utcnow

GiB = 1 << 30
"""Sizes for people are in GiB (2^30 bytes), as in every table of the product."""

MAX_ROUNDS = 200
"""Expected ends replayed at most (each one frees devices and admits again); runs still waiting after that
have no expected start."""


class WaitingRun(BaseModel):
    """One row of "why is my run waiting".

    :ivar position: 1-based place in the order the queue considers live runs; None for a stale entry.
    :ivar reason: why it waits now (or that it starts at its next poll).
    :ivar expected_start: when it is expected to get its devices (UTC); None when unknown.
    :ivar expected_start_note: why there is no expected start, or how it was reached.
    """

    model_config = ConfigDict(frozen=True)

    position: int | None
    entry: QueueEntry
    team: str
    priority: int
    reason: str
    expected_start: datetime | None = None
    expected_start_note: str | None = None

    def to_json(self) -> dict:
        """JSON-ready: the entry's fields with position, team, reason and expected start."""
        return {**self.entry.to_json(), "position": self.position, "team": self.team, "priority": self.priority,
                "reason": self.reason, "stale": self.position is None,
                "expected_start": self.expected_start.isoformat() if self.expected_start else None,
                "expected_start_note": self.expected_start_note}


def holders_by_device(fitting: Sequence[str], leases: Sequence[Lease]) -> list[str]:
    """Who holds each of the ``fitting`` devices (in that order, devices nobody holds left out), one entry a
    device: ``"GPU0: a (ann), c (bob)"``."""
    out = []
    for dev in fitting:
        held = [f"{le.run_key} ({le.owner.user or 'unknown user'})" for le in leases if dev in le.device_ids]
        if held:
            out.append(f"{dev}: {', '.join(held)}")
    return out


def packed_wait_reason(fitting: Sequence[Device], shares: dict[str, DeviceShare], estimate: int | None,
                       threshold: float, leases: Sequence[Lease]) -> str | None:
    """Why a packed 1-device run of ``estimate`` bytes finds no place on any ``fitting`` device: each holds two
    packed runs, is held exclusively, or has no room beside the packed run on it (sizes in GiB, 2^30 bytes); None
    when one of them is free or has room (the queue's own reason then stands: held back for the head, a quota,
    a pair type below the bar), or the estimate is unknown.

    :param shares: the ledger's share rows (:meth:`autodl.ledger.Ledger.shares`).
    :param threshold: the spec's memory threshold (0-1).
    """
    from autodl.policy.packing import MAX_TENANTS, reservation_bytes
    from autodl.queue import share_terms

    if estimate is None or not fitting:
        return None
    full, parts = 0, []
    for device in fitting:
        share = shares.get(device.device_id)
        keys = ", ".join(le.run_key for le in leases if device.device_id in le.device_ids) or "another run"
        if share is None or share.leases == 0:
            return None
        if share.exclusive:
            parts.append(f"{device.device_id} is held exclusively by {keys}")
        elif share.leases >= MAX_TENANTS:
            full += 1
            parts.append(f"{device.device_id} holds two packed runs ({keys})")
        elif share_terms(device, estimate, threshold, share) is None:
            need = reservation_bytes(estimate, joining=True) or estimate
            parts.append(f"no room beside {keys} on {device.device_id}: {share.reserved_bytes / GiB:.2f} + "
                         f"{need / GiB:.2f} GiB over the {share.capacity_bytes / GiB:.2f} GiB its runs may reserve")
        else:
            return None
    if full == len(fitting):
        what = {1: "the fitting device holds", 2: "both fitting devices hold"}.get(full, f"all {full} fitting devices hold")
        return f"{what} two packed runs (at most {MAX_TENANTS} a device)"
    return "; ".join(parts)


def _held(leases: Sequence[Lease]) -> Counter:
    from autodl.queue import held_by_team

    return held_by_team(leases)


def _runtime(entry: QueueEntry, devices: Sequence[str], rules) -> float | None:
    rt = entry.expected_runtime_s
    if rt is None or not entry.speed_by_type or rules.device_type is None or not devices:
        return rt
    speed = entry.speed_by_type.get(rules.device_type(devices[0]))
    return rt / speed if speed and speed > 0 else None


def forecast(live: Sequence[QueueEntry], free: frozenset[str], running: Sequence[RunningRun], now: datetime,
             rules) -> dict[str, float]:
    """Expected start (epoch s) of each live entry the replayed queue admits; entries absent: unknown."""
    from autodl.queue import admission, place_from_candidates

    by_key = {e.run_key: e for e in live}
    waiting = list(live)
    free_now, holders = set(free), list(running)
    at = now.timestamp()
    starts: dict[str, float] = {}
    for _ in range(MAX_ROUNDS):
        grants = admission(waiting, frozenset(free_now), holders, at,
                           lambda run, f: place_from_candidates(by_key[run.run_key], f), rules).grants
        for g in grants:
            e = by_key[g.run_key]
            starts[g.run_key] = at
            rt = _runtime(e, [str(d) for d in g.devices], rules)
            holders.append(RunningRun(g.run_key, tuple(g.devices), at + rt if rt else None, e.owner_user, e.team))
            free_now.difference_update(g.devices)
        waiting = [e for e in waiting if e.run_key not in starts]
        ends = [r.expected_end for r in holders if r.expected_end is not None and r.expected_end > at]
        if not waiting or not ends:
            break
        at = min(ends)
        for r in [r for r in holders if r.expected_end == at]:
            holders.remove(r)
            free_now.update(str(d) for d in r.devices)
    return starts


def why_waiting(entries: Sequence[QueueEntry], inventory: Inventory | None, leases: Sequence[Lease],
                now: datetime | None = None, rules=None) -> list[WaitingRun]:
    """Every waiting run, in queue order (stale entries last), with its reason and expected start.

    :param inventory: the pool (None: it could not be read; the reasons and starts then say so).
    :param rules: :class:`autodl.queue.QueueRules` (default: from configuration and the store).
    """
    from autodl.queue import admission, free_devices, place_from_candidates, product_order, queued_run, running_runs

    now = now or utcnow()
    if rules is None:
        from autodl.queue import queue_rules

        rules = queue_rules(inventory)
    live = [e for e in entries if not e.stale(now)]
    by_key = {e.run_key: e for e in live}
    order = [by_key[r.run_key] for r in product_order([queued_run(e) for e in live], now.timestamp(),
                                                        rules.queues, _held(leases))]
    rows: list[WaitingRun] = []
    if inventory is None:
        for i, e in enumerate(order, 1):
            rows.append(_row(i, e, "the pool's inventory could not be read: no reason or start can be given", None,
                             "inventory unknown"))
    else:
        leased = frozenset(d for le in leases for d in le.device_ids)
        free = free_devices(inventory, leased)
        running = running_runs(leases, now)
        decision = admission(live, free, running, now.timestamp(),
                             lambda run, f: place_from_candidates(by_key[run.run_key], f), rules, explain=True)
        granted = {g.run_key: g for g in decision.grants}
        starts = forecast(live, free, running, now, rules)
        for i, e in enumerate(order, 1):
            if e.run_key in granted:
                why = f"devices are free for it: it books them at its next poll ({granted[e.run_key].reason})"
            else:
                why = _clock(decision.waiting_reasons.get(e.run_key) or "behind the runs ahead of it in the queue")
            start = starts.get(e.run_key)
            when = datetime.fromtimestamp(start, tz=timezone.utc) if start is not None else None
            note = None if when is not None else _no_start(why)
            rows.append(_row(i, e, why, when, note))
    for e in entries:
        if e.stale(now):
            rows.append(_row(None, e, f"its poller has not been seen for over {e.stale_after_s:.0f} s: it blocks nobody "
                                      "and keeps its place if it comes back", None, "not polling"))
    return rows


def _clock(reason: str) -> str:
    """The decision's epoch times (``t=1764673200``) as UTC clock times, for people."""
    import re

    def utc(m: re.Match) -> str:
        return datetime.fromtimestamp(float(m.group(1)), tz=timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")
    return re.sub(r"\bt=(\d{9,})\b", utc, reason)


def _no_start(why: str) -> str:
    if "held for maintenance" in why:
        return "its queue is held: no start until it is resumed"
    return ("unknown: a run it waits for has no runtime estimate (or is past it), or the replay never frees "
            "devices it can use")


def _row(position, entry: QueueEntry, reason: str, start, note) -> WaitingRun:
    return WaitingRun(position=position, entry=entry, team=entry.team or NO_TEAM, priority=entry.priority,
                      reason=reason, expected_start=start, expected_start_note=note)


def queue_report(url: str | None = None, pool: str | None = None, now: datetime | None = None) -> list[WaitingRun]:
    """:func:`why_waiting` over the store's queue, leases and the pool (``pool`` or the configured source).

    :raises ConfigError: the team queues file is malformed.
    """
    from autodl.errors import AutoDLError
    from autodl.ledger import Ledger
    from autodl.queue import AdmissionQueue, queue_rules

    try:
        from autodl.inventory import read_inventory

        inventory = read_inventory(pool)
    except AutoDLError:
        inventory = None
    return why_waiting(AdmissionQueue(url).entries(), inventory, Ledger(url).leases(), now,
                       queue_rules(inventory, url=url))


__all__ = ["MAX_ROUNDS", "WaitingRun", "forecast", "holders_by_device", "packed_wait_reason", "queue_report",
           "why_waiting"]
