"""The simulator's queue rules on top of autodl's admission decision: first come first served, greedy or no backfill, owner quotas, comparative advantage, big gangs first.

:func:`decide` is :func:`autodl.policy.admission.decide` with these rules as options; every run of the
benchmark goes through the product's :class:`~autodl.policy.admission.Decider` (its order, EASY reservation
and wait rule), extended here by :class:`SimDecider`. None of these rules moved the benchmark's mean enough
to ship (``benchmarks/results/scheduling-tune.txt``).
"""

from __future__ import annotations

from collections import Counter
from typing import AbstractSet, Callable, Hashable, Iterable, Mapping, Sequence

from autodl.policy.admission import (
    AGING_S,
    RESERVE_LIMIT,
    UNKNOWN_RUNTIME_S,
    Admission,
    Decider,
    PlaceOn,
    QueuedRun,
    RunningRun,
    Startable,
    gang_first,
    known,
    queue_key,
)

CA_WINDOW = 1
"""How many of the next runs in order (that can start now) compete for the freed devices by
comparative advantage. 1 = the order alone decides (the default: on the tuning slice a window of 4
raised the mean JCT in 15 of the 16 other settings of the grid, by up to 4%, since it lets longer runs
overtake shorter ones; see ``--tune``). Pass ``window`` (and ``device_type``) to use it."""

GANG_FIRST_S = 96 * 3600.0
"""After how long a gang of :data:`GANG_FIRST_MIN_GPUS`+ devices goes first, seconds, as the benchmark
shows it. Measured with ``benchmarks/scheduling.py`` on Philly slices 0, 2 and 7 only (72, 96 and 144 h;
and every gang past every such gang first instead of the longest-waiting one, which cost twice as much):
at 96 h the p99 queueing delay of 8-GPU gangs at x1 falls from 162 h to 124 h (FIFO's: 120 h) and of
16-GPU gangs from 181 h to 120 h (FIFO's: 105 h), while the mean JCT rises 3% at x1, 4% at x2, 3% at x4
and 9% with the pool halved, nearly all on slice 0, the most loaded. The tuning rule (the lowest mean
JCT, then the lowest gang delay within 2% of it) does not pick it, so it is off by default. (The product
bounds every gang's wait instead: :data:`autodl.config.GANG_WAIT_BOUND_S`.)"""

GANG_FIRST_MIN_GPUS = 8
"""Gang size from which :data:`GANG_FIRST_S` applies: a whole 8-device host, the smallest gang that needs
a host to drain completely (the simulated pool's hosts, and DGX/HGX nodes, have 8 devices)."""

ORDERS = ("sjf", "fcfs")
"""Queue orders: shortest expected GPU-time first with aging, or first come, first served."""

BACKFILLS = ("easy", "greedy", "none")
"""Backfill disciplines: EASY (reservation for the head), greedy (no reservation), none (head blocks)."""

Earliest = Callable[[QueuedRun, frozenset, "Sequence[tuple[float, tuple]]"], "tuple[Sequence[Hashable], int] | None"]
"""Optional fast path of the reservation search: ``earliest(run, free, timeline)`` with ``timeline`` the
(expected end, devices) of the running runs in ascending end order returns ``(place_on(run, free |
devices of the first k entries), k)`` for the smallest k where that is not None, or None when no k
is; the same answer as the generic search by ``place_on``, only cheaper (the simulator has one)."""


def sim_queue_key(run: QueuedRun, *, order: str = "sjf", aging_s: float = AGING_S,
                  unknown_runtime_s: float = UNKNOWN_RUNTIME_S) -> tuple:
    """The sort key of ``run`` (smaller first): ``sjf`` is :func:`autodl.policy.admission.queue_key`;
    ``fcfs`` is enqueued_at (ties: run_key).

    :raises ValueError: for an unknown ``order``.
    """
    if order == "fcfs":
        return (run.enqueued_at, run.enqueued_at, run.run_key)
    if order != "sjf":
        raise ValueError(f"queue order {order!r} is unknown; use one of {ORDERS}")
    return queue_key(run, aging_s=aging_s, unknown_runtime_s=unknown_runtime_s)


class SimDecider(Decider):
    """The product's :class:`~autodl.policy.admission.Decider` with the simulator's rules (see :func:`decide`)."""

    def __init__(self, free: AbstractSet, running: Sequence[RunningRun], now: float, place_on: PlaceOn, *,
                 order: str, backfill: str, quotas: Mapping[str, int] | None, type_counts: Mapping[str, int] | None,
                 window: int, monotone: bool, earliest: Earliest | None, depth: int | None, reserve_limit: int,
                 **product):
        super().__init__(free, running, now, place_on, **product)
        self.backfill = backfill
        self.quotas = quotas or {}
        self.type_counts = type_counts
        self.window_size = max(1, int(window)) if self.device_type is not None else 1
        self.monotone = monotone
        self.earliest = earliest
        self.reserve_tries = reserve_limit
        if depth is not None:
            self.stop_at = max(1, int(depth))
        if order == "fcfs":
            self.order_reason = "first come, first served"
        self.held: Counter = Counter()
        for r in running:
            if r.owner is not None:
                self.held[r.owner] += len(r.devices)
        # (num_gpus, needed_bytes) that did not fit, per free-set variant: "all" free devices, "off" the
        # reservation, in its "hole"
        self.blocked: dict[str, list[tuple[int, int]]] = {"all": [], "off": [], "hole": []}

    def try_place(self, run: QueuedRun, free: frozenset, variant: str) -> tuple | None:
        """With ``monotone``: a run no smaller (devices, memory) than one that did not fit on this free set
        is not tried."""
        if len(free) < run.num_gpus or self._dominated(run, variant):
            return None
        devices = super().try_place(run, free, variant)
        if devices is None and self.monotone:
            self.blocked[variant].append((run.num_gpus, run.needed_bytes))
        return devices

    def _dominated(self, run: QueuedRun, variant: str) -> bool:
        if not self.monotone:
            return False
        n, b = run.num_gpus, run.needed_bytes
        return any(n >= n0 and b >= b0 for n0, b0 in self.blocked[variant])

    def search_reservation(self, head, base, finite, fits):
        """The ``earliest`` fast path when given, else the generic search."""
        if self.earliest is None:
            return super().search_reservation(head, base, finite, fits)
        hit = self.earliest(head, base, finite)
        return (tuple(hit[0]), hit[1]) if hit is not None else None

    def refusal(self, run: QueuedRun) -> str | None:
        """Over its owner's quota (devices held, ``"*"``: any owner's)."""
        if run.owner is None:
            return None
        q = self.quotas.get(run.owner, self.quotas.get("*"))
        if q is None or run.num_gpus <= q - self.held[run.owner]:
            return None
        held = self.held[run.owner]
        return (f"owner {run.owner!r} holds {held} device(s); quota {q} leaves room for {max(0, q - held)}, "
                f"the run needs {run.num_gpus}")

    def on_blocked(self, pos: int, run: QueuedRun) -> bool:
        """``none``: the head blocks everything behind it; ``greedy``: no reservation; ``easy``: the product's."""
        if self.backfill == "none":
            self.reasons[run.run_key] = "first in the queue; waits for devices (no backfill: it blocks the runs behind it)"
            self.stop_at = pos + 1
            return True
        if self.backfill == "greedy":
            self.reasons[run.run_key] = "does not fit on the free devices now"
            return False
        return super().on_blocked(pos, run)

    def granted(self, run: QueuedRun, devices: tuple) -> None:
        if run.owner is not None:
            self.held[run.owner] += len(devices)
        super().granted(run, devices)

    def pick(self) -> tuple[Startable, str | None]:
        """Comparative advantage: of the window, the run that saves the most seconds on its devices."""
        if len(self.window) == 1:
            return self.window[0], None
        gains = [self.gain(run, devs) for _, run, devs, _, _ in self.window]
        best = max(range(len(self.window)), key=lambda k: (gains[k], -k))
        why = (f"comparative advantage: expected to save {gains[best]:.0f} s on these devices, the most of the "
               f"next {len(self.window)} runs that can start") if best != 0 else None
        return self.window[best], why

    def gain(self, run: QueuedRun, devices) -> float:
        """Seconds ``run`` is expected to save on ``devices`` against its pool-average speed (0 when unknown).

        Pool-average speed: the run's speed averaged over every device of the pool (``type_counts``),
        0 on a device type it cannot use (absent from its ``speed_by_type``) -- Gavel's normalisation
        of a job's throughput by its throughput across the cluster. A run that can use few devices has
        a low average, so it gains most from a device it can use (it has no alternative); a run that
        can use everything gains most from the fastest devices only.
        """
        rt, sp = run.expected_runtime_s, run.speed_by_type
        if self.device_type is None or not sp or rt is None or not known(rt):
            return 0.0
        s = sp.get(self.device_type(devices[0]))
        if s is None or not known(s):
            return 0.0
        num = den = 0.0
        if self.type_counts:
            for t, c in self.type_counts.items():
                den += c
                st = sp.get(t)
                if st is not None and known(st):
                    num += c * st
        else:                       # no pool make-up: the average over the run's own types
            for st in sp.values():
                if known(st):
                    num += st
                    den += 1.0
        if num <= 0 or den <= 0:
            return 0.0
        return rt * (den / num - 1.0 / s)


def decide(
    waiting: Iterable[QueuedRun],
    free: AbstractSet,
    running: Sequence[RunningRun],
    now: float,
    place_on: PlaceOn,
    *,
    order: str = "sjf",
    backfill: str = "easy",
    aging_s: float = AGING_S,
    quotas: Mapping[str, int] | None = None,
    type_counts: Mapping[str, int] | None = None,
    window: int = CA_WINDOW,
    unknown_runtime_s: float = UNKNOWN_RUNTIME_S,
    presorted: bool = False,
    monotone: bool = False,
    reserve_limit: int = RESERVE_LIMIT,
    depth: int | None = None,
    earliest: Earliest | None = None,
    gang_first_s: float | None = None,
    gang_first_min_gpus: int = GANG_FIRST_MIN_GPUS,
    **product,
) -> Admission:
    """:func:`autodl.policy.admission.decide` with the simulator's queue rules.

    :param order: ``"sjf"`` (the product's) or ``"fcfs"``; ``aging_s``, ``unknown_runtime_s``: of ``sjf``.
    :param backfill: ``"easy"`` (the product's), ``"greedy"`` (no reservation) or ``"none"`` (the head blocks).
    :param quotas: {owner: most devices held}, ``"*"`` = any owner; a run over it is passed over.
    :param type_counts: {model: devices in the pool}, which weighs a run's pool-average speed.
    :param window: how many runs that can start compete by comparative advantage (:data:`CA_WINDOW`;
        needs ``device_type``).
    :param presorted: ``waiting`` is already in :func:`sim_queue_key` order (then ``gang_first_s`` is the
        caller's to apply; the engine does).
    :param monotone: every run's fit depends only on its gang size and memory need, so a run no smaller
        than one that did not fit is skipped.
    :param reserve_limit: how many blocked runs may be tried as the head (:data:`RESERVE_LIMIT`).
    :param depth: at most this many waiting runs are examined (like Slurm's ``default_queue_depth``);
        None = all.
    :param earliest: the placement's fast path for the reservation search (:data:`Earliest`).
    :param gang_first_s: the longest-waiting gang of ``gang_first_min_gpus``+ devices that has waited this
        long goes first (:data:`GANG_FIRST_S`); None = off.
    :param product: :func:`autodl.policy.admission.decide`'s own options (``device_type``, ``host_of``,
        ``wait_margin``, ``on_grant``, ``explain``).
    :raises ValueError: for an unknown ``order`` or ``backfill``.
    """
    if backfill not in BACKFILLS:
        raise ValueError(f"backfill {backfill!r} is unknown; use one of {BACKFILLS}")
    if order not in ORDERS:
        raise ValueError(f"queue order {order!r} is unknown; use one of {ORDERS}")
    runs = waiting
    if not presorted:
        ordered = sorted(waiting, key=lambda r: sim_queue_key(r, order=order, aging_s=aging_s,
                                                               unknown_runtime_s=unknown_runtime_s))
        runs = gang_first(ordered, now, gang_first_s, gang_first_min_gpus)
    d = SimDecider(free, running, now, place_on, order=order, backfill=backfill, quotas=quotas,
                   type_counts=type_counts, window=window, monotone=monotone, earliest=earliest, depth=depth,
                   reserve_limit=reserve_limit, **product)
    return d.run(runs)


def admit(waiting: Sequence[QueuedRun], free: frozenset, running: Sequence[RunningRun], now: float,
          place_on: PlaceOn, **options) -> list:
    """The grants of :func:`decide` (``explain`` off unless asked)."""
    options.setdefault("explain", False)
    return list(decide(waiting, free, running, now, place_on, **options).grants)
