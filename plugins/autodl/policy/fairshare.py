"""Team queues in the admission decision: nominal quotas per device type, borrowing idle quota, weighted fair sharing, priorities.

Details: docs/reference/scheduler.md#autodlpolicyfairshare.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable, Hashable, Sequence

from autodl.policy.admission import PlaceOn, QueuedRun, RunningRun
from autodl.quota import NO_TEAM, TeamQueues


def _team(name: str | None) -> str:
    return name or NO_TEAM


def fair_order(runs: Sequence[QueuedRun], queues: TeamQueues, held: Counter,
               base: Callable[[QueuedRun], tuple]) -> list[QueuedRun]:
    """``runs`` in the order the team queues consider them (see the module docstring).

    :param held: devices each team holds now (all types).
    :param base: the queue's own sort key (shortest expected run first, with aging).
    """
    if not queues.teams:
        return sorted(runs, key=lambda r: (-r.priority, *base(r)))
    by_team: dict[str, list[QueuedRun]] = {}
    for r in runs:
        by_team.setdefault(_team(r.team), []).append(r)
    keyed = []
    for team, mine in by_team.items():
        quota = queues.quota(team)
        nominal = sum(quota.nominal_quota.values())
        asked = held.get(team, 0)
        for r in sorted(mine, key=lambda r: (-r.priority, *base(r))):
            asked += r.num_gpus
            keyed.append(((max(0, asked - nominal) / quota.weight, -r.priority, *base(r)), r))
    keyed.sort(key=lambda kr: kr[0])
    return [r for _, r in keyed]


class TeamShares:
    """One admission call's accounting of the teams: devices held and asked for, per team and device type.

    :param queues: the configured team queues (no ``teams``: nothing is restricted).
    :param running: the runs holding devices (their ``team`` counts them; a shared lease's device as half of one).
    :param waiting: the runs that wait (their asks make other teams' nominal quota not idle).
    :param device_type: device id -> device type (model name).
    :param usable_types: the device types a waiting run could ever use.
    """

    def __init__(self, queues: TeamQueues, running: Sequence[RunningRun], waiting: Sequence[QueuedRun],
                 device_type: Callable[[Hashable], str], usable_types: Callable[[QueuedRun], frozenset[str]]):
        self.queues = queues
        self.device_type = device_type
        self.held: dict[str, Counter] = {}
        self.asked: dict[str, Counter] = {}
        self.usable = {r.run_key: usable_types(r) for r in waiting}
        self.reasons: dict[str, str] = {}
        for holder in running:
            c = self.held.setdefault(_team(holder.team), Counter())
            for dev in holder.devices:
                c[device_type(dev)] += holder.device_share  # type: ignore[assignment] # a shared lease: half a device
        for run in waiting:
            c = self.asked.setdefault(_team(run.team), Counter())
            for t in self.usable[run.run_key]:
                c[t] += run.num_gpus

    def held_total(self) -> Counter:
        """Devices each team holds now, all types together (for :func:`fair_order`)."""
        return Counter({team: sum(c.values()) for team, c in self.held.items()})

    def owed(self, device_type: str, *, besides: str) -> int:
        """Devices of ``device_type`` the teams other than ``besides`` are owed and ask for now."""
        total = 0
        for team, asks in self.asked.items():
            if team == besides:
                continue
            held = self.held.get(team, Counter())[device_type]
            total += max(0, min(self.queues.quota(team).nominal(device_type) - held, asks[device_type]))
        return total

    def refusal(self, run: QueuedRun, device_type: str, free_of_type: int) -> str | None:
        """Why ``run`` may not take ``num_gpus`` devices of ``device_type`` now, or None when it may.

        :param free_of_type: devices of that type free in the set it is offered.
        """
        if not self.queues.teams:
            return None
        team = _team(run.team)
        quota = self.queues.quota(team)
        held = self.held.get(team, Counter())[device_type]
        nominal = quota.nominal(device_type)
        if held + run.num_gpus <= nominal:
            return None
        borrow = held + run.num_gpus - nominal
        limit = quota.may_borrow(device_type)
        if borrow > limit:
            return (f"team {team!r} holds {held} {device_type}; nominal quota {nominal}, borrowing limit "
                    f"{limit:g}: {run.num_gpus} more would borrow {borrow}")
        owed = self.owed(device_type, besides=team)
        if free_of_type - run.num_gpus < owed:
            return (f"team {team!r} is at its nominal quota of {device_type} ({held} of {nominal} held); it may "
                    f"borrow only idle devices, and the {free_of_type} free are owed to other teams' waiting "
                    f"runs ({owed} within their nominal quota)")
        return None

    def allowed(self, run: QueuedRun, free: frozenset) -> frozenset:
        """The devices of ``free`` whose type ``run`` may take now (all of them without teams)."""
        if not self.queues.teams:
            return free
        by_type: dict[str, list] = {}
        for dev in free:
            by_type.setdefault(self.device_type(dev), []).append(dev)
        out: list = []
        for t, devs in by_type.items():
            why = self.refusal(run, t, len(devs))
            if why is None:
                out.extend(devs)
            elif t in self.usable.get(run.run_key, (t,)):
                self.reasons[run.run_key] = why
        return frozenset(out)

    def place_on(self, place: PlaceOn) -> PlaceOn:
        """``place`` offered only the devices the run's team may take (:meth:`allowed`)."""
        def within(run: QueuedRun, free: frozenset):
            return place(run, self.allowed(run, free))
        return within

    def take(self, run: QueuedRun, devices: tuple) -> None:
        """Count a grant of this call: its devices are held, its ask is met."""
        team = _team(run.team)
        c = self.held.setdefault(team, Counter())
        for dev in devices:
            c[self.device_type(dev)] += 1
        asks = self.asked.get(team)
        if asks is not None:
            for t in self.usable.get(run.run_key, ()):
                asks[t] = max(0, asks[t] - run.num_gpus)
        self.reasons.pop(run.run_key, None)

    def lent(self, run: QueuedRun) -> str | None:
        """When ``run`` waits within its team's nominal quota of a type while other teams hold that quota
        (they borrowed it while its team asked for nothing): who, for "why waiting"; else None."""
        if not self.queues.teams:
            return None
        team = _team(run.team)
        for t in sorted(self.usable.get(run.run_key, ())):
            held = self.held.get(team, Counter())[t]
            if held + run.num_gpus > self.queues.quota(team).nominal(t):
                continue
            borrowers = sorted(other for other, c in self.held.items()
                               if other != team and c[t] > self.queues.quota(other).nominal(t))
            if borrowers:
                return (f"team {team!r}'s nominal quota of {t} is lent to {', '.join(map(repr, borrowers))}: borrowed "
                        "devices come back as those runs end (no preemption)")
        return None

    def share(self, team: str) -> float:
        """The team's weighted share of borrowed devices: held above nominal quota (all types) / weight."""
        quota = self.queues.quota(team)
        held = sum(self.held.get(team, Counter()).values())
        over = max(0, held - sum(quota.nominal_quota.values()))
        return over / quota.weight if math.isfinite(quota.weight) else 0.0


__all__ = ["TeamShares", "fair_order"]
