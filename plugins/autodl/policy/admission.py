"""The admission queue's decision, as a pure function: which waiting runs get devices now, and which devices.

Details: docs/reference/scheduler.md#autodlpolicyadmission.
"""

from __future__ import annotations

import bisect
import math
from collections import Counter
from dataclasses import dataclass, field
from typing import AbstractSet, Callable, Hashable, Mapping, Sequence

AGING_S = 192 * 3600.0
"""Aging of the ``sjf`` order, seconds: every ``AGING_S`` seconds of waiting divide a run's effective
size by e (a run waiting 8 days ranks with a run e times shorter that just arrived), so every run
eventually overtakes every newer one. Picked by ``benchmarks/scheduling.py --tune`` on Philly slices
0, 2 and 7 only (never on the reported slices), with the rule ``tune`` prints, together with the
rule weights and the wait rule (``benchmarks/results/scheduling-tune.txt``): 192 h, best fit 2 and
the wait rule on give a mean JCT of 6.54 h there against 7.08 h for the previous 96 h, best fit 0.25
and no wait. Weaker aging is better for the mean (shortest-first); stronger aging (48 h, earlier
grids) never came within 2% of the best mean."""

CA_WINDOW = 1
"""How many of the next runs in order (that can start now) compete for the freed devices by
comparative advantage. 1 = the order alone decides (the default: on the tuning slice a window of 4
raised the mean JCT in 15 of the 16 other settings of the grid, by up to 4%, since it lets longer runs
overtake shorter ones; see ``--tune``). Pass ``window`` (and ``device_type``) to use it."""

WAIT_MARGIN = 0.25
"""Margin of the wait-for-a-faster-device rule (part 5): a run waits only when it would end at least
this fraction sooner on the faster device, wait included. Chosen with ``benchmarks/scheduling.py`` on
Philly slices 0, 2 and 7 only, at x1, x2, x4 and the pool halved, from 0, 0.1 and 0.25: mean JCT
ratio (rule alone / with the rule) 1.004, 1.029, 1.077, 1.027 for 0.25 against 0.969, 1.043, 1.094,
1.026 for 0 (0 loses at x1). ``--tune`` then picked the rule on (with this margin) for autodl's
placement. ``decide`` keeps it off unless asked (it needs each run's speed per device type, which the
product's queue entries do not carry yet); the simulator turns it on for autodl's own policies."""

GANG_FIRST_S = 96 * 3600.0
"""After how long a gang of :data:`GANG_FIRST_MIN_GPUS`+ devices goes first (part 6), seconds, as the
benchmark shows it. Measured with
``benchmarks/scheduling.py`` on Philly slices 0, 2 and 7 only (72, 96 and 144 h; and every gang past
every such gang first instead of the longest-waiting one, which cost twice as much): at 96 h the p99
queueing delay of 8-GPU gangs at x1 falls from 162 h to 124 h (FIFO's: 120 h) and of 16-GPU gangs from
181 h to 120 h (FIFO's: 105 h), while the mean JCT rises 3% at x1, 4% at x2, 3% at x4 and 9% with the
pool halved, nearly all on slice 0, the most loaded. The default queue already keeps those delays
within 2x FIFO's on those slices, and the tuning rule (the lowest mean JCT, then the lowest gang delay
within 2% of it) does not pick it, so it is off by default: an operator who owes big gangs a shorter
tail turns it on."""

GANG_FIRST_MIN_GPUS = 8
"""Gang size from which :data:`GANG_FIRST_S` applies: a whole 8-device host, the smallest gang that needs
a host to drain completely (the simulated pool's hosts, and DGX/HGX nodes, have 8 devices)."""

UNKNOWN_RUNTIME_S = 1144.0
"""Expected runtime, seconds, used to *order* a run whose runtime is unknown (no record, no estimate):
the median job duration of the Philly trace (1,144 s; ``include/data/README.md``, facts checked), i.e.
such a run ranks as a typical job. It is never used to let such a run backfill into a reservation
(an unknown runtime may be long): there it counts as unknown."""

ORDERS = ("sjf", "fcfs")
"""Queue orders: shortest expected GPU-time first with aging, or first come, first served."""

BACKFILLS = ("easy", "greedy", "none")
"""Backfill disciplines: EASY (reservation for the head), greedy (no reservation), none (head blocks)."""


@dataclass(frozen=True, slots=True)
class QueuedRun:
    """A run waiting for devices.

    :ivar run_key: the run's idempotency key.
    :ivar num_gpus: gang size (devices needed at once).
    :ivar needed_bytes: estimated per-device peak memory, bytes.
    :ivar enqueued_at: when it started waiting, seconds (epoch in the product, trace time in the simulator).
    :ivar owner: who submitted it (quota key), or None.
    :ivar expected_runtime_s: expected seconds of training once placed on a device of speed 1.0 in
        ``speed_by_type``'s units (on any device when ``speed_by_type`` is empty), from run records or
        FLOPs / device throughput; None when unknown.
    :ivar speed_by_type: expected throughput of this run on each device type (model name), relative
        to the reference of ``expected_runtime_s`` (V100 = 1.0 in autodl's data); None when unknown.
        Only the types the run can use should be listed (the comparative-advantage window counts 0 speed
        on the others when it averages the run's speed over the pool).
    :ivar team: the team queue it counts against (:mod:`autodl.policy.fairshare`), or None.
    :ivar priority: its priority within its team (higher first; :mod:`autodl.policy.fairshare` orders by it).
    """

    run_key: str
    num_gpus: int
    needed_bytes: int
    enqueued_at: float
    owner: str | None = None
    expected_runtime_s: float | None = None
    speed_by_type: Mapping[str, float] | None = None
    team: str | None = None
    priority: int = 0


@dataclass(frozen=True, slots=True)
class RunningRun:
    """A run that holds devices now.

    :ivar devices: the devices it holds.
    :ivar expected_end: when it is expected to free them, seconds (same clock as ``enqueued_at``), or
        None when unknown (then it is assumed to hold them indefinitely when reserving).
    :ivar owner: who submitted it (counts against its quota), or None.
    :ivar team: the team queue whose quota it uses, or None.
    :ivar device_share: the part of each device it counts as holding against its team's quota: 1, or 0.5 for
        a shared lease (two packed runs on one device use one device of quota).
    """

    run_key: str
    devices: tuple[Hashable, ...]
    expected_end: float | None = None
    owner: str | None = None
    team: str | None = None
    device_share: float = 1.0


@dataclass(frozen=True, slots=True)
class Grant:
    """The queue's decision for one run: start it now on ``devices``.

    :ivar reason: why it goes now (order, backfill, comparative advantage), for logs.
    :ivar backfilled: it starts ahead of a blocked run that holds a reservation.
    """

    run_key: str
    devices: tuple[Hashable, ...]
    reason: str
    backfilled: bool = False


@dataclass(frozen=True, slots=True)
class Reservation:
    """The devices held back for the blocked head of the queue.

    :ivar run_key: the head run.
    :ivar devices: the devices it is expected to get.
    :ivar start_by: when they are all expected to be free, seconds; None when a holder's end is unknown.
    """

    run_key: str
    devices: frozenset
    start_by: float | None


@dataclass(frozen=True, slots=True)
class Admission:
    """The whole decision: grants, the reservation, and why each examined run still waits."""

    grants: tuple[Grant, ...]
    reservation: Reservation | None = None
    waiting_reasons: dict[str, str] = field(default_factory=dict)


Earliest = Callable[[QueuedRun, frozenset, "Sequence[tuple[float, tuple]]"], "tuple[Sequence[Hashable], int] | None"]
"""Optional fast path of the reservation search: ``earliest(run, free, timeline)`` with ``timeline`` the
(expected end, devices) of the running runs in ascending end order returns ``(place_on(run, free |
devices of the first k entries), k)`` for the smallest k where that is not None, or None when no k
is; the same answer as the generic search by ``place_on``, only cheaper (the simulator has one)."""

PlaceOn = Callable[[QueuedRun, frozenset], "Sequence[Hashable] | None"]
"""``place_on(run, free_devices)``: the devices the placement policy would give ``run`` among
``free_devices`` (a gang: ``num_gpus`` of them), or None when it fits on none of them. It must not
modify ``free_devices`` and must be *monotone*: a run that fits on a set of devices fits on any
superset (the reservation search relies on it)."""


def queue_key(run: QueuedRun, *, order: str = "sjf", aging_s: float = AGING_S,
              unknown_runtime_s: float = UNKNOWN_RUNTIME_S) -> tuple:
    """The sort key of ``run`` in the queue (smaller goes first); it does not change while runs wait.

    ``sjf``: ln(expected GPU-seconds) + enqueued_at / aging_s, i.e. expected GPU-time x e^(-waited /
    aging_s) compared at any common time. ``fcfs``: enqueued_at. Ties: enqueued_at, then run_key.

    :raises ValueError: for an unknown ``order``.
    """
    if order == "fcfs":
        return (run.enqueued_at, run.enqueued_at, run.run_key)
    if order != "sjf":
        raise ValueError(f"queue order {order!r} is unknown; use one of {ORDERS}")
    rt = run.expected_runtime_s
    if rt is None or not rt > 0 or math.isinf(rt):
        rt = unknown_runtime_s
    size = max(1.0, rt * max(1, run.num_gpus))
    age = run.enqueued_at / aging_s if aging_s and math.isfinite(aging_s) else 0.0
    return (math.log(size) + age, run.enqueued_at, run.run_key)


def queue_order(waiting: Sequence[QueuedRun], now: float, *, order: str = "sjf", aging_s: float = AGING_S,
                unknown_runtime_s: float = UNKNOWN_RUNTIME_S) -> list[QueuedRun]:
    """The order in which waiting runs are considered (see :func:`queue_key`); ``now`` does not change it."""
    del now
    return sorted(waiting, key=lambda r: queue_key(r, order=order, aging_s=aging_s, unknown_runtime_s=unknown_runtime_s))


def gang_first(runs: list[QueuedRun], now: float, after_s: float | None,
               min_gpus: int = GANG_FIRST_MIN_GPUS) -> list[QueuedRun]:
    """``runs`` (in queue order) with the longest-waiting gang of ``min_gpus``+ devices that has waited
    ``after_s`` seconds moved to the front (part 6 of the module docstring); unchanged when ``after_s``
    is None or no gang has waited that long."""
    if after_s is None:
        return runs
    old = [r for r in runs if r.num_gpus >= min_gpus and now - r.enqueued_at >= after_s]
    if not old:
        return runs
    first = min(old, key=lambda r: (r.enqueued_at, r.run_key))
    return [first] + [r for r in runs if r is not first]


def _first(entry: tuple) -> float:
    return entry[0]


def _known(x: float | None) -> bool:
    return x is not None and x > 0 and math.isfinite(x)


class _Discard(dict):
    """A dict that keeps nothing (reasons when not asked for)."""

    def __setitem__(self, key, value) -> None:
        pass


class _Decider:
    """One call's state (see :func:`decide`)."""

    def __init__(self, free, running, now, place_on, *, backfill, reserve_limit, quotas, device_type,
                 type_counts, monotone, earliest=None, wait_margin=None, host_of=None):
        self.left = set(free)
        self._fleft: frozenset | None = None
        self._foff: frozenset | None = None
        self._fhole: frozenset | None = None
        self.running = running
        self.now = now
        self.place_on = place_on
        self.earliest = earliest
        self.backfill = backfill
        self.quotas = quotas or {}
        self.device_type = device_type
        self.type_counts = type_counts
        self.monotone = monotone
        self.held: Counter = Counter()
        for r in running:
            if r.owner is not None:
                self.held[r.owner] += len(r.devices)
        self.granted_ends: list[tuple[float, tuple]] = []   # grants of this call, as future holders
        self.head: QueuedRun | None = None
        self.reservation: Reservation | None = None
        self.reserved: frozenset = frozenset()
        self.shadow = math.inf
        self.reserve_tries = reserve_limit
        self.wait_margin = wait_margin
        self._later: dict | None = None     # device type -> ascending expected free times (wait rule)
        self.claimed: Counter = Counter()    # (type, host) -> how many of its earliest free times waiting runs count on
        self.host_of = host_of
        self.host_size: Counter = Counter()   # (type, host) -> devices seen there (wait rule)
        # (num_gpus, needed_bytes) that did not fit, per free-set variant: "all" free devices, "off" the
        # reservation, in its "hole"
        self.blocked: dict[str, list[tuple[int, int]]] = {"all": [], "off": [], "hole": []}

    # ---------------------------------------------------------------- free sets
    def fleft(self) -> frozenset:
        if self._fleft is None:
            self._fleft = frozenset(self.left)
        return self._fleft

    def fhole(self) -> frozenset:
        """The free devices inside the reservation."""
        if self._fhole is None:
            self._fhole = frozenset(self.left & self.reserved)
        return self._fhole

    def foff(self) -> frozenset:
        """The free devices outside the reservation."""
        if self._foff is None:
            self._foff = frozenset(self.left - self.reserved)
        return self._foff

    def take(self, devices) -> None:
        self.left.difference_update(devices)
        self._fleft = self._foff = self._fhole = None
        self._later = None

    def _dominated(self, run: QueuedRun, variant: str) -> bool:
        if not self.monotone:
            return False
        n, b = run.num_gpus, run.needed_bytes
        for n0, b0 in self.blocked[variant]:
            if n >= n0 and b >= b0:
                return True
        return False

    def try_place(self, run: QueuedRun, free: frozenset, variant: str):
        if len(free) < run.num_gpus or self._dominated(run, variant):
            return None
        devices = self.place_on(run, free)
        if not devices:
            if self.monotone:
                self.blocked[variant].append((run.num_gpus, run.needed_bytes))
            return None
        return tuple(devices)

    # ---------------------------------------------------------------- speeds
    def runtime_on(self, run: QueuedRun, devices) -> float | None:
        """Expected seconds of ``run`` on ``devices`` (None when unknown)."""
        rt = run.expected_runtime_s
        if not _known(rt):
            return None
        if self.device_type is None or not run.speed_by_type:
            return rt
        s = run.speed_by_type.get(self.device_type(devices[0]))
        return rt / s if _known(s) else None

    def could_end_by(self, run: QueuedRun, when: float) -> bool:
        """Whether ``run`` could end by ``when`` on its fastest device type (False when its runtime is unknown)."""
        rt = run.expected_runtime_s
        if not _known(rt):
            return False
        sp = run.speed_by_type
        if sp and self.device_type is not None:
            fastest = max(sp.values())
            if not fastest > 0:
                return False
            rt = rt / fastest
        return self.now + rt <= when

    def gain(self, run: QueuedRun, devices) -> float:
        """Seconds ``run`` is expected to save on ``devices`` against its pool-average speed (0 when unknown).

        Pool-average speed: the run's speed averaged over every device of the pool (``type_counts``),
        0 on a device type it cannot use (absent from its ``speed_by_type``) -- Gavel's normalisation
        of a job's throughput by its throughput across the cluster. A run that can use few devices has
        a low average, so it gains most from a device it can use (it has no alternative); a run that
        can use everything gains most from the fastest devices only.
        """
        rt, sp = run.expected_runtime_s, run.speed_by_type
        if self.device_type is None or not sp or not _known(rt):
            return 0.0
        s = sp.get(self.device_type(devices[0]))
        if not _known(s):
            return 0.0
        num = den = 0.0
        if self.type_counts:
            for t, c in self.type_counts.items():
                den += c
                st = sp.get(t)
                if st is not None and _known(st):
                    num += c * st
        else:                       # no pool make-up: the average over the run's own types
            for st in sp.values():
                if _known(st):
                    num += st
                    den += 1.0
        if num <= 0 or den <= 0:
            return 0.0
        return rt * (den / num - 1.0 / s)


    # ---------------------------------------------------------------- wait for a faster device
    def _later_frees(self) -> dict:
        """Per (device type, host), the ascending times its devices are expected free: now for the free
        ones outside the reservation, the expected end of their holder for the others. Holders past
        their expected end, or with none, are left out (they may hold on indefinitely), and so are the
        reserved devices; every device seen counts in :attr:`host_size`. Rebuilt after each grant or
        reservation."""
        if self._later is None:
            dt = self.device_type
            ho = self.host_of or (lambda dev: None)
            out: dict[str, dict[Hashable, list[float]]] = {}
            size: Counter = Counter()
            reserved = self.reserved
            for dev in self.left:
                t, h = dt(dev), ho(dev)
                size[t, h] += 1
                if dev not in reserved:
                    out.setdefault(t, {}).setdefault(h, []).append(self.now)
            ends = [(r.expected_end, r.devices) for r in self.running]
            ends.extend(self.granted_ends)
            for e, devs in ends:
                known = e is not None and self.now < e < math.inf
                for dev in devs:
                    t, h = dt(dev), ho(dev)
                    size[t, h] += 1
                    if known and dev not in reserved:
                        out.setdefault(t, {}).setdefault(h, []).append(e)
            for hosts in out.values():
                for v in hosts.values():
                    v.sort()
            self._later = out
            self.host_size = size
        return self._later

    def _start_on(self, t: str, hosts: dict, n: int) -> tuple[float, list[tuple[Hashable, int]]] | None:
        """When ``n`` devices of type ``t`` are expected free for a gang, and which (host, count) it takes.

        Without ``host_of`` all devices of a type count together. With it, a gang of up to a host's
        devices needs them on one host; a bigger one whole hosts (every device of the host expected
        free), as many as it needs."""
        claimed = self.claimed
        size = self.host_size
        per_host = math.inf if self.host_of is None else max(size[t, h] for h in hosts)
        if n <= per_host:
            best = None
            for h, times in hosts.items():
                c = claimed[t, h]
                if len(times) >= c + n and (best is None or times[c + n - 1] < best[0]):
                    best = (times[c + n - 1], [(h, n)])
            return best
        whole = sorted((times[-1], h) for h, times in hosts.items()
                       if len(times) == size[t, h] and not claimed[t, h])
        got, chosen = 0, []
        for end, h in whole:
            chosen.append((end, h))
            got += size[t, h]
            if got >= n:
                return end, [(hh, size[t, hh]) for _, hh in chosen]
        return None

    def wait_instead(self, run: QueuedRun, devices) -> tuple[str, float, float] | None:
        """Whether ``run`` should leave ``devices`` to others and wait for a faster device type.

        It waits when, on some faster type, the wait until its gang is expected free there plus the
        run's expected runtime there is below ``(1 - wait_margin)`` x its expected runtime on
        ``devices`` now: the earliest finish time rule of list scheduling on heterogeneous
        machines (HEFT: Topcuoglu, Hariri and Wu, IEEE TPDS 13(3), 2002). The devices it waits for
        are then counted as taken, so the next run in order does not count on them too. Off
        (None) without ``wait_margin``, ``device_type`` or the run's ``speed_by_type``, and for a
        run whose runtime is unknown.

        :returns: (device type, expected start, expected end) to wait for, or None (take ``devices``).
        """
        if self.wait_margin is None or self.device_type is None or not run.speed_by_type:
            return None
        rt = run.expected_runtime_s
        sp = run.speed_by_type
        here = sp.get(self.device_type(devices[0]))
        if not _known(rt) or not _known(here) or not here > 0:
            return None
        best = (1.0 - self.wait_margin) * rt / here
        pick = None
        later = self._later_frees()
        for t, s in sp.items():
            if not _known(s) or not s > here or t not in later:
                continue
            hit = self._start_on(t, later[t], run.num_gpus)
            if hit is None or hit[0] <= self.now:
                continue            # free now: the placement's choice stands
            finish = (hit[0] - self.now) + rt / s
            if finish < best:
                best, pick = finish, (t, hit)
        if pick is None:
            return None
        t, (t_start, taken) = pick
        for h, k in taken:
            self.claimed[t, h] += k
        return t, t_start, self.now + best

    # ---------------------------------------------------------------- reservation
    def make_reservation(self, head: QueuedRun) -> bool:
        """Reserve for ``head`` the devices it would get at the earliest expected time; False when none."""
        inf = math.inf
        timeline = [(r.expected_end if r.expected_end is not None and r.expected_end < inf else inf, r.devices)
                     for r in self.running]
        timeline.extend(self.granted_ends)
        timeline.sort(key=_first)
        m = bisect.bisect_left(timeline, inf, key=_first)
        finite = timeline[:m]
        base = frozenset(self.left)
        upto: list[int] = []
        flat: list = []

        def hyp(k: int) -> frozenset:
            if not upto:
                upto.append(0)
                for _, devs in timeline:   # upto[k]: devices freed by the first k ending runs
                    flat.extend(devs)
                    upto.append(len(flat))
            return base.union(flat[:upto[k]])

        def fits(k: int):
            if not k:
                return self.place_on(head, base) if len(base) >= head.num_gpus else None
            h = hyp(k)
            return self.place_on(head, h) if len(h) >= head.num_gpus else None

        devices = None
        k_found = None
        m = len(finite)
        if self.earliest is not None:
            hit = self.earliest(head, base, finite) if m else None
            if hit is not None:
                devices, k_found = tuple(hit[0]), hit[1]
        elif m and fits(m):
            # galloping, then binary search: the fewest ending runs whose devices make room for the head
            lo, step, hi = 1, 1, m
            while lo < m and not fits(lo):
                lo, step = min(m, lo + step), step * 2
            if lo > 1:
                prev = max(1, lo - step // 2)
                hi, lo = lo, prev
                while lo < hi:
                    mid = (lo + hi) // 2
                    if fits(mid):
                        hi = mid
                    else:
                        lo = mid + 1
            devices = fits(lo)
            k_found = lo
        if not devices:
            devices = fits(len(timeline))
            if not devices:
                return False            # fits nowhere even when everything is free: it blocks nobody
            k_found = None
        reserved = frozenset(devices)
        if k_found is None:
            shadow = math.inf
        else:
            shadow = self.now
            for end, devs in finite[:k_found]:
                if not reserved.isdisjoint(devs):
                    shadow = max(shadow, end)
        self.head = head
        self.reserved = reserved
        self.shadow = shadow
        self.reservation = Reservation(head.run_key, reserved, shadow if math.isfinite(shadow) else None)
        self._foff = self._fhole = None
        self._later = None
        return True


def decide(
    waiting: Sequence[QueuedRun],
    free: AbstractSet,
    running: Sequence[RunningRun],
    now: float,
    place_on: PlaceOn,
    *,
    order: str = "sjf",
    backfill: str = "easy",
    aging_s: float = AGING_S,
    quotas: Mapping[str, int] | None = None,
    device_type: Callable[[Hashable], str] | None = None,
    type_counts: Mapping[str, int] | None = None,
    window: int = CA_WINDOW,
    unknown_runtime_s: float = UNKNOWN_RUNTIME_S,
    presorted: bool = False,
    monotone: bool = False,
    reserve_limit: int = 8,
    depth: int | None = None,
    earliest: Earliest | None = None,
    explain: bool = True,
    wait_margin: float | None = None,
    host_of: Callable[[Hashable], Hashable] | None = None,
    gang_first_s: float | None = None,
    gang_first_min_gpus: int = GANG_FIRST_MIN_GPUS,
    on_grant: Callable[[QueuedRun, tuple], None] | None = None,
) -> Admission:
    """The admission decision with its reservation and the reasons runs wait; see :func:`admit`.

    :param explain: fill ``waiting_reasons`` (off: grants and reservation only, a little faster).
    :param earliest: the placement's fast path for the reservation search (:data:`Earliest`).
    :param depth: at most this many waiting runs are examined (like Slurm's ``default_queue_depth``);
        None (default) = all: a limit leaves devices idle that a deeper run could use.
    :param wait_margin: turn on the wait-for-a-faster-device rule with this margin (e.g.
        :data:`WAIT_MARGIN`; needs ``device_type`` and the runs' ``speed_by_type``); None = off.
    :param host_of: device id -> host, so the wait rule counts a gang's devices on one host (up to a
        host's devices) or on whole hosts; None = devices of a type are counted together.
    :param gang_first_s: big gangs first after this wait, seconds (e.g. :data:`GANG_FIRST_S`): the longest-waiting run of
        at least ``gang_first_min_gpus`` devices that has waited this long goes first, so it becomes the head
        and gets the reservation (one at a time, as EASY holds one reservation). None = off. With
        ``presorted`` the caller puts that run first (the simulator does).
    :param on_grant: called with each run and its devices as it is granted, before the next run is
        considered (team quotas count the call's own grants with it: :mod:`autodl.policy.fairshare`).
    :param reserve_limit: how many blocked runs may be tried as the head before giving up on a
        reservation this call (a run that fits nowhere even when every device is free blocks nobody,
        and the next blocked run is tried).
    :returns: an :class:`Admission`; ``waiting_reasons`` covers the runs examined and not granted.
    :raises ValueError: for an unknown ``order`` or ``backfill``.
    """
    if backfill not in BACKFILLS:
        raise ValueError(f"backfill {backfill!r} is unknown; use one of {BACKFILLS}")
    if order not in ORDERS:
        raise ValueError(f"queue order {order!r} is unknown; use one of {ORDERS}")
    if presorted:
        it = iter(waiting)
        runs: list[QueuedRun] = []
    else:
        it = None
        runs = queue_order(waiting, now, order=order, aging_s=aging_s, unknown_runtime_s=unknown_runtime_s)
        runs = gang_first(runs, now, gang_first_s, gang_first_min_gpus)
    d = _Decider(free, running, now, place_on, backfill=backfill, reserve_limit=reserve_limit, quotas=quotas,
                 device_type=device_type, type_counts=type_counts, monotone=monotone, earliest=earliest,
                 wait_margin=wait_margin, host_of=host_of)
    use_window = max(1, int(window)) if device_type is not None else 1
    grants: list[Grant] = []
    reasons: dict[str, str] = {} if explain else _Discard()
    done: set[int] = set()          # positions granted, blocked for this call, or over quota
    head_pos: int | None = None
    start = 0
    stop_at = math.inf              # backfill "none": nothing after the head is looked at
    if depth is not None:
        stop_at = max(1, int(depth))

    def quota_left(run: QueuedRun) -> int | None:
        if run.owner is None:
            return None
        q = d.quotas.get(run.owner, d.quotas.get("*"))
        return None if q is None else q - d.held[run.owner]

    def before_reserved(pos: int, run: QueuedRun, free, stage: str) -> tuple[tuple | None, float | None, bool]:
        """Backfill ``run`` on ``free()`` when it is expected to end before the start reserved for the head.

        :returns: (devices, expected runtime s, queued): devices None when it was not tried or does not fit
            there; queued (in this round's window) when it is expected to end in time.
        """
        rt0 = run.expected_runtime_s
        if rt0 is None or not math.isfinite(d.shadow) or not (
                now + rt0 <= d.shadow or (run.speed_by_type and d.could_end_by(run, d.shadow))):
            return None, None, False
        devs = d.try_place(run, free(), stage)
        if devs is None:
            return None, None, False
        rt = d.runtime_on(run, devs)
        if rt is not None and now + rt <= d.shadow:
            window.append((pos, run, devs, True,
                           f"backfill: expected to end ({rt:.0f} s) before the start reserved for {d.head.run_key}",
                           "before"))
            return devs, rt, True
        return devs, rt, False

    while d.left:
        window: list[tuple[int, QueuedRun, tuple, bool, str]] = []
        i = start
        while i < stop_at and len(window) < use_window:
            if i >= len(runs):
                nxt = next(it, None) if it is not None else None
                if nxt is None:
                    break
                runs.append(nxt)
            run = runs[i]
            pos = i
            i += 1
            if pos in done:
                if pos == start:
                    start += 1
                continue
            q = quota_left(run)
            if q is not None and run.num_gpus > q:
                if explain:
                    reasons[run.run_key] = (f"owner {run.owner!r} holds {d.held[run.owner]} device(s); quota "
                                            f"{q + d.held[run.owner]} leaves room for {max(0, q)}, the run needs "
                                            f"{run.num_gpus}")
                done.add(pos)
                continue
            after_head = head_pos is not None and pos > head_pos
            if not after_head:
                devs = d.try_place(run, d.fleft(), "all")
                if devs is not None:
                    window.append((pos, run, devs, False, "", "all"))
                    continue
                done.add(pos)
                if backfill == "none":
                    reasons[run.run_key] = "first in the queue; waits for devices (no backfill: it blocks the runs behind it)"
                    stop_at = pos + 1
                    break
                if backfill == "easy" and head_pos is None and d.reserve_tries > 0:
                    d.reserve_tries -= 1
                    if d.make_reservation(run):
                        head_pos = pos
                        if explain:
                            when = (f"expected free at t={d.shadow:.0f}" if math.isfinite(d.shadow)
                                    else "when their holders end (an end is unknown)")
                            reasons[run.run_key] = (f"head of the queue: {len(d.reserved)} device(s) reserved for "
                                                    f"it, {when}")
                        continue
                reasons[run.run_key] = "does not fit on the free devices now"
                continue
            # behind the head: into the reservation's hole when it ends before the reserved start
            # (leaving the other devices to runs that cannot), else off the reservation
            if before_reserved(pos, run, d.fhole, "hole")[2]:
                continue
            devs = d.try_place(run, d.foff(), "off")
            if devs is not None:
                window.append((pos, run, devs, True, f"backfill off the devices reserved for {d.head.run_key}", "off"))
                continue
            devs, rt, queued = before_reserved(pos, run, d.fleft, "all")
            if queued:
                continue
            if devs is not None:
                done.add(pos)
                if explain:
                    reasons[run.run_key] = (f"would delay the start reserved for {d.head.run_key} "
                                            f"(expected runtime {'unknown' if rt is None else f'{rt:.0f} s'})")
                continue
            done.add(pos)
            if explain:
                reasons[run.run_key] = (f"does not fit off the devices reserved for {d.head.run_key}, and is not "
                                        "expected to end before their reserved start")
        if not window:
            break
        if len(window) == 1:
            pick = window[0]
            why = None
        else:
            gains = [d.gain(run, devs) for _, run, devs, _, _, _ in window]
            best = max(range(len(window)), key=lambda k: (gains[k], -k))
            pick = window[best]
            why = (f"comparative advantage: expected to save {gains[best]:.0f} s on these devices, the most of the "
                   f"next {len(window)} runs that can start") if best != 0 else None
        pos, run, devs, backfilled, bf_why, _variant = pick
        later = d.wait_instead(run, devs)
        if later is not None:
            done.add(pos)
            if explain:
                reasons[run.run_key] = (f"waits for {later[0]}: expected free at t={later[1]:.0f} and the run to "
                                        f"end by t={later[2]:.0f}, sooner than on the devices free now")
            continue
        d.take(devs)
        done.add(pos)
        reasons.pop(run.run_key, None)
        if run.owner is not None:
            d.held[run.owner] += len(devs)
        rt = d.runtime_on(run, devs)
        d.granted_ends.append((now + rt if rt is not None else math.inf, devs))
        if why is None:
            why = bf_why or ("first come, first served" if order == "fcfs" else "shortest expected run first (with aging)")
        grants.append(Grant(run.run_key, devs, why, backfilled))
        if on_grant is not None:
            on_grant(run, devs)
    return Admission(tuple(grants), d.reservation, reasons)


def admit(waiting: Sequence[QueuedRun], free: frozenset, running: Sequence[RunningRun], now: float,
          place_on: PlaceOn, **options) -> list[Grant]:
    """Decide which waiting runs start now and on which of the ``free`` devices.

    The default is autodl's queue policy: shortest expected run first with aging, EASY backfill with
    a reservation for the blocked head, quotas when given, and comparative advantage for *where* when
    ``device_type`` is given (see the module docstring for each part and its sources).

    :param waiting: the runs that wait.
    :param free: ids of the devices free now.
    :param running: the runs holding devices (their ``expected_end`` places the reservation; their
        ``owner`` counts against quotas).
    :param now: the current time, same clock as ``QueuedRun.enqueued_at``.
    :param place_on: the placement policy, see :data:`PlaceOn`.
    :param options: keyword arguments of :func:`decide`: ``order`` (``"sjf"`` | ``"fcfs"``),
        ``backfill`` (``"easy"`` | ``"greedy"`` | ``"none"``), ``aging_s`` (:data:`AGING_S`),
        ``quotas`` ({owner: max devices held}, ``"*"`` = any owner), ``device_type`` (device id ->
        model name; enables comparative advantage), ``type_counts`` ({model: devices in the pool},
        weights the pool-average speed), ``window`` (:data:`CA_WINDOW`), ``unknown_runtime_s``
        (:data:`UNKNOWN_RUNTIME_S`), ``presorted`` (``waiting`` is already in :func:`queue_key`
        order: skips the sort; it may then be any iterable, read only as far as needed), ``monotone`` (every run's fit depends only on its gang size and
        memory need, so a run no smaller than one that did not fit is skipped).
    :returns: the grants, in the order they were decided; devices of different grants never overlap
        and are all in ``free``.
    :raises ValueError: for an unknown ``order`` or ``backfill``.
    """
    options.setdefault("explain", False)
    return list(decide(waiting, free, running, now, place_on, **options).grants)


__all__ = [
    "AGING_S", "Admission", "BACKFILLS", "GANG_FIRST_MIN_GPUS", "GANG_FIRST_S", "CA_WINDOW", "Earliest", "Grant", "ORDERS", "PlaceOn",
    "QueuedRun", "Reservation",
    "RunningRun", "UNKNOWN_RUNTIME_S", "WAIT_MARGIN", "admit", "decide", "gang_first", "queue_key", "queue_order",
]
