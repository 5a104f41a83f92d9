"""The admission queue's decision, as a pure function: which waiting runs get devices now, and which devices.

Shortest expected GPU-time first with aging, EASY backfill with a reservation for the blocked head, and the
wait for a faster device; team quotas come in through ``place_on`` and ``on_grant`` (:mod:`autodl.policy.fairshare`).
The simulator's other queue rules (first come first served, greedy or no backfill, owner quotas, comparative
advantage) extend :class:`Decider` in ``autodl_sim.admission``. Details: docs/reference/scheduler.md#autodlpolicyadmission.
"""

from __future__ import annotations

import bisect
import math
from collections import Counter
from dataclasses import dataclass, field
from typing import AbstractSet, Callable, Hashable, Iterable, Iterator, Mapping, Sequence

AGING_S = 192 * 3600.0
"""Aging of the ``sjf`` order, seconds: every ``AGING_S`` seconds of waiting divide a run's effective
size by e (a run waiting 8 days ranks with a run e times shorter that just arrived), so every run
eventually overtakes every newer one. Picked by ``benchmarks/scheduling.py --tune`` on Philly slices
0, 2 and 7 only (never on the reported slices), with the rule ``tune`` prints, together with the
rule weights and the wait rule (``benchmarks/results/scheduling-tune.txt``): 192 h, best fit 2 and
the wait rule on give a mean JCT of 6.54 h there against 7.08 h for the previous 96 h, best fit 0.25
and no wait. Weaker aging is better for the mean (shortest-first); stronger aging (48 h, earlier
grids) never came within 2% of the best mean."""

WAIT_MARGIN = 0.25
"""Margin of the wait-for-a-faster-device rule: a run waits only when it would end at least this fraction
sooner on the faster device, wait included. Chosen with ``benchmarks/scheduling.py`` on Philly slices 0, 2
and 7 only, at x1, x2, x4 and the pool halved, from 0, 0.1 and 0.25: mean JCT ratio (rule alone / with
the rule) 1.004, 1.029, 1.077, 1.027 for 0.25 against 0.969, 1.043, 1.094, 1.026 for 0 (0 loses at x1).
``--tune`` then picked the rule on (with this margin). ``decide`` keeps it off unless asked (it needs each
run's speed per device type); the product's queue (:func:`autodl.queue.admission`) turns it on when the
inventory names the device types, the simulator for autodl's own policies."""

RESERVE_LIMIT = 8
"""How many blocked runs one decision tries as the head before it gives up on a reservation (a run that fits
nowhere even when every device is free blocks nobody, and the next blocked run is tried). Assumption: a
few are enough; the simulator's queue passes its own."""

UNKNOWN_RUNTIME_S = 1144.0
"""Expected runtime, seconds, used to *order* a run whose runtime is unknown (no record, no estimate):
the median job duration of the Philly trace (1,144 s; ``include/data/README.md``, facts checked), i.e.
such a run ranks as a typical job. It is never used to let such a run backfill into a reservation
(an unknown runtime may be long): there it counts as unknown."""


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
        Only the types the run can use should be listed (the simulator's comparative-advantage window counts 0
        speed on the others when it averages the run's speed over the pool).
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

    :ivar reason: why it goes now (order, backfill), for logs.
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


PlaceOn = Callable[[QueuedRun, frozenset], "Sequence[Hashable] | None"]
"""``place_on(run, free_devices)``: the devices the placement policy would give ``run`` among
``free_devices`` (a gang: ``num_gpus`` of them), or None when it fits on none of them. It must not
modify ``free_devices`` and must be *monotone*: a run that fits on a set of devices fits on any
superset (the reservation search relies on it)."""


def queue_key(run: QueuedRun, *, aging_s: float = AGING_S, unknown_runtime_s: float = UNKNOWN_RUNTIME_S) -> tuple:
    """The sort key of ``run`` in the queue (smaller goes first); it does not change while runs wait.

    ln(expected GPU-seconds) + enqueued_at / aging_s, i.e. expected GPU-time x e^(-waited / aging_s)
    compared at any common time. Ties: enqueued_at, then run_key.
    """
    rt = run.expected_runtime_s
    if rt is None or not rt > 0 or math.isinf(rt):
        rt = unknown_runtime_s
    size = max(1.0, rt * max(1, run.num_gpus))
    age = run.enqueued_at / aging_s if aging_s and math.isfinite(aging_s) else 0.0
    return (math.log(size) + age, run.enqueued_at, run.run_key)


def queue_order(waiting: Sequence[QueuedRun], now: float, *, aging_s: float = AGING_S,
                unknown_runtime_s: float = UNKNOWN_RUNTIME_S) -> list[QueuedRun]:
    """The order in which waiting runs are considered (see :func:`queue_key`); ``now`` does not change it."""
    del now
    return sorted(waiting, key=lambda r: queue_key(r, aging_s=aging_s, unknown_runtime_s=unknown_runtime_s))


def gang_first(runs: list[QueuedRun], now: float, after_s: float | None, min_gpus: int) -> list[QueuedRun]:
    """``runs`` (in queue order) with the longest-waiting gang of ``min_gpus``+ devices that has waited
    ``after_s`` seconds moved to the front, so it becomes the head and gets the reservation (one at a time,
    as EASY holds one reservation); unchanged when ``after_s`` is None or no gang has waited that long."""
    if after_s is None:
        return runs
    old = [r for r in runs if r.num_gpus >= min_gpus and now - r.enqueued_at >= after_s]
    if not old:
        return runs
    first = min(old, key=lambda r: (r.enqueued_at, r.run_key))
    return [first] + [r for r in runs if r is not first]


def _first(entry: tuple) -> float:
    return entry[0]


def known(x: float | None) -> bool:
    """Whether ``x`` is a usable runtime or speed: a finite number > 0."""
    return x is not None and x > 0 and math.isfinite(x)


class _Discard(dict):
    """A dict that keeps nothing (reasons when not asked for)."""

    def __setitem__(self, key, value) -> None:
        pass


Startable = tuple[int, QueuedRun, tuple, bool, str]
"""A run that can start now, as one decision round sees it: (queue position, run, devices, backfilled,
why it may backfill)."""


class Decider:
    """One :func:`decide` call: its state (free devices, the reservation, the grants so far) and its loop.

    Each round takes the first run in order that can start now (on the free devices; behind the head only
    off the reservation, or inside it when expected to end before the reserved start), unless it would end
    sooner by waiting for a faster device; the first run that cannot is the head and gets the reservation
    (EASY). The hooks :meth:`refusal`, :meth:`on_blocked`, :meth:`pick`, :meth:`granted`, :meth:`try_place`
    and :meth:`search_reservation` are where the simulator's other queue rules plug in (``autodl_sim.admission``).

    :param free: ids of the devices free now.
    :param running: the runs holding devices.
    :param now: the current time, seconds.
    :param place_on: the placement policy (:data:`PlaceOn`).
    :param device_type: device id -> type (model name), for the runs' speeds per type; None: speeds unused.
    :param host_of: device id -> host, for the wait rule (see :func:`decide`).
    :param wait_margin: the wait-for-a-faster-device rule's margin; None = off.
    :param on_grant: called with each run and its devices as it is granted.
    :param explain: keep why each examined run still waits.
    """

    window_size = 1
    """How many runs that can start now one round looks at before it picks (:meth:`pick`): the first."""

    def __init__(self, free: AbstractSet, running: Sequence[RunningRun], now: float, place_on: PlaceOn, *,
                 device_type: Callable[[Hashable], str] | None = None, host_of: Callable[[Hashable], Hashable] | None = None,
                 wait_margin: float | None = None, on_grant: Callable[[QueuedRun, tuple], None] | None = None,
                 explain: bool = True):
        self.left = set(free)
        self._fleft: frozenset | None = None
        self._foff: frozenset | None = None
        self._fhole: frozenset | None = None
        self.running = running
        self.now = now
        self.place_on = place_on
        self.device_type = device_type
        self.host_of = host_of
        self.wait_margin = wait_margin
        self.on_grant = on_grant
        self.explain = explain
        self.order_reason = "shortest expected run first (with aging)"
        self.granted_ends: list[tuple[float, tuple]] = []   # grants of this call, as future holders
        self.head: QueuedRun | None = None
        self.head_pos: int | None = None
        self.reservation: Reservation | None = None
        self.reserved: frozenset = frozenset()
        self.shadow = math.inf
        self.reserve_tries = RESERVE_LIMIT
        self._later: dict | None = None     # device type -> ascending expected free times (wait rule)
        self.claimed: Counter = Counter()    # (type, host) -> how many of its earliest free times waiting runs count on
        self.host_size: Counter = Counter()   # (type, host) -> devices seen there (wait rule)
        self.reasons: dict[str, str] = {} if explain else _Discard()
        self.grants: list[Grant] = []
        self.done: set[int] = set()          # positions granted, blocked for this call, or refused
        self.stop_at: float = math.inf       # positions from here on are not looked at
        self.window: list[Startable] = []

    # ---------------------------------------------------------------- free sets
    def fleft(self) -> frozenset:
        """The free devices."""
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
        """Mark ``devices`` as no longer free."""
        self.left.difference_update(devices)
        self._fleft = self._foff = self._fhole = None
        self._later = None

    def try_place(self, run: QueuedRun, free: frozenset, variant: str) -> tuple | None:
        """The devices ``place_on`` gives ``run`` among ``free``, or None. ``variant`` names the free set
        (``"all"``, ``"off"`` the reservation, in its ``"hole"``)."""
        del variant
        if len(free) < run.num_gpus:
            return None
        devices = self.place_on(run, free)
        return tuple(devices) if devices else None

    # ---------------------------------------------------------------- speeds
    def runtime_on(self, run: QueuedRun, devices) -> float | None:
        """Expected seconds of ``run`` on ``devices`` (None when unknown)."""
        rt = run.expected_runtime_s
        if rt is None or not known(rt):
            return None
        if self.device_type is None or not run.speed_by_type:
            return rt
        s = run.speed_by_type.get(self.device_type(devices[0]))
        return rt / s if s is not None and known(s) else None

    def could_end_by(self, run: QueuedRun, when: float) -> bool:
        """Whether ``run`` could end by ``when`` on its fastest device type (False when its runtime is unknown)."""
        rt = run.expected_runtime_s
        if rt is None or not known(rt):
            return False
        sp = run.speed_by_type
        if sp and self.device_type is not None:
            fastest = max(sp.values())
            if not fastest > 0:
                return False
            rt = rt / fastest
        return self.now + rt <= when

    # ---------------------------------------------------------------- wait for a faster device
    def _later_frees(self) -> dict:
        """Per (device type, host), the ascending times its devices are expected free: now for the free
        ones outside the reservation, the expected end of their holder for the others. Holders past
        their expected end, or with none, are left out (they may hold on indefinitely), and so are the
        reserved devices; every device seen counts in :attr:`host_size`. Rebuilt after each grant or
        reservation."""
        if self._later is None:
            dt = self.device_type or (lambda dev: "device")   # wait_instead asks only with device types
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
                ends_later = e is not None and self.now < e < math.inf
                for dev in devs:
                    t, h = dt(dev), ho(dev)
                    size[t, h] += 1
                    if ends_later and e is not None and dev not in reserved:
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
        if rt is None or here is None or not known(rt) or not known(here) or not here > 0:
            return None
        best = (1.0 - self.wait_margin) * rt / here
        pick = None
        later = self._later_frees()
        for t, s in sp.items():
            if s is None or not known(s) or not s > here or t not in later:
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
        finite = timeline[:bisect.bisect_left(timeline, inf, key=_first)]
        base = frozenset(self.left)
        upto: list[int] = []
        flat: list = []

        def fits(k: int) -> Sequence[Hashable] | None:
            """Where ``place_on`` puts the head once the first ``k`` runs of the timeline have ended."""
            if k and not upto:
                upto.append(0)
                for _, devs in timeline:   # upto[k]: devices freed by the first k ending runs
                    flat.extend(devs)
                    upto.append(len(flat))
            h = base.union(flat[:upto[k]]) if k else base
            return self.place_on(head, h) if len(h) >= head.num_gpus else None

        hit = self.search_reservation(head, base, finite, fits) if finite else None
        devices, k_found = hit if hit is not None else (None, None)
        if not devices:
            devices = fits(len(timeline))
            if not devices:
                return False            # fits nowhere even when everything is free: it blocks nobody
            k_found = None
        reserved = frozenset(devices)
        shadow = math.inf
        if k_found is not None:
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

    def search_reservation(self, head: QueuedRun, base: frozenset, finite: list[tuple[float, tuple]],
                           fits: Callable[[int], Sequence[Hashable] | None]) -> tuple[Sequence[Hashable], int] | None:
        """The fewest runs of ``finite`` (holders with a known end, earliest first) whose ending makes room for
        ``head``, and where it goes then: galloping, then binary search over ``fits(k)`` (monotone in k).

        :returns: (devices, k), or None when even all of ``finite`` ending is not enough.
        """
        del base
        m = len(finite)
        if not fits(m):
            return None
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
        return (devices, lo) if devices else None

    # ---------------------------------------------------------------- hooks
    def refusal(self, run: QueuedRun) -> str | None:
        """Why ``run`` is passed over this call before it is placed (it blocks nobody), or None."""
        del run
        return None

    def on_blocked(self, pos: int, run: QueuedRun) -> bool:
        """``run``, at or ahead of the head, does not fit on the free devices: the first such run that a
        reservation can be made for becomes the head (EASY). :returns: whether to stop looking further."""
        if self.head_pos is None and self.reserve_tries > 0:
            self.reserve_tries -= 1
            if self.make_reservation(run):
                self.head_pos = pos
                if self.explain:
                    when = (f"expected free at t={self.shadow:.0f}" if math.isfinite(self.shadow)
                            else "when their holders end (an end is unknown)")
                    self.reasons[run.run_key] = (f"head of the queue: {len(self.reserved)} device(s) reserved for "
                                                 f"it, {when}")
                return False
        self.reasons[run.run_key] = "does not fit on the free devices now"
        return False

    def pick(self) -> tuple[Startable, str | None]:
        """The candidate of this round that starts, and why when not for its place in the order: the first."""
        return self.window[0], None

    def granted(self, run: QueuedRun, devices: tuple) -> None:
        """``run`` was granted ``devices`` (after they were taken)."""
        if self.on_grant is not None:
            self.on_grant(run, devices)

    # ---------------------------------------------------------------- the loop
    def before_reserved(self, pos: int, run: QueuedRun, free: Callable[[], frozenset],
                        stage: str) -> tuple[tuple | None, float | None, bool]:
        """Backfill ``run`` on ``free()`` when it is expected to end before the start reserved for the head.

        :returns: (devices, expected runtime s, queued): devices None when it was not tried or does not fit
            there; queued (in this round's window) when it is expected to end in time.
        """
        rt0, now, head = run.expected_runtime_s, self.now, self.head
        if rt0 is None or head is None or not math.isfinite(self.shadow) or not (
                now + rt0 <= self.shadow or (run.speed_by_type and self.could_end_by(run, self.shadow))):
            return None, None, False
        devs = self.try_place(run, free(), stage)
        if devs is None:
            return None, None, False
        rt = self.runtime_on(run, devs)
        if rt is not None and now + rt <= self.shadow:
            self.window.append((pos, run, devs, True,
                                f"backfill: expected to end ({rt:.0f} s) before the start reserved for {head.run_key}"))
            return devs, rt, True
        return devs, rt, False

    def behind_head(self, pos: int, run: QueuedRun) -> None:
        """Consider ``run``, behind the head: into the reservation's hole when it ends before the reserved
        start (leaving the other devices to runs that cannot), else off the reservation."""
        head = self.head.run_key if self.head is not None else "?"
        if self.before_reserved(pos, run, self.fhole, "hole")[2]:
            return
        devs = self.try_place(run, self.foff(), "off")
        if devs is not None:
            self.window.append((pos, run, devs, True, f"backfill off the devices reserved for {head}"))
            return
        devs, rt, queued = self.before_reserved(pos, run, self.fleft, "all")
        if queued:
            return
        self.done.add(pos)
        if not self.explain:
            return
        if devs is not None:
            self.reasons[run.run_key] = (f"would delay the start reserved for {head} "
                                         f"(expected runtime {'unknown' if rt is None else f'{rt:.0f} s'})")
        else:
            self.reasons[run.run_key] = (f"does not fit off the devices reserved for {head}, and is not "
                                         "expected to end before their reserved start")

    def scan(self, runs: list[QueuedRun], more: Iterator[QueuedRun], start: int) -> int:
        """Fill this round's window with up to :attr:`window_size` runs that can start now, in order from
        ``start`` (reading ``more`` into ``runs`` as far as needed). :returns: the next round's start."""
        i = start
        while i < self.stop_at and len(self.window) < self.window_size:
            if i >= len(runs):
                nxt = next(more, None)
                if nxt is None:
                    break
                runs.append(nxt)
            run = runs[i]
            pos = i
            i += 1
            if pos in self.done:
                if pos == start:
                    start += 1
                continue
            why = self.refusal(run)
            if why is not None:
                self.reasons[run.run_key] = why
                self.done.add(pos)
                continue
            if self.head_pos is not None and pos > self.head_pos:
                self.behind_head(pos, run)
                continue
            devs = self.try_place(run, self.fleft(), "all")
            if devs is not None:
                self.window.append((pos, run, devs, False, ""))
                continue
            self.done.add(pos)
            if self.on_blocked(pos, run):
                break
        return start

    def start(self, pick: Startable, why: str | None) -> None:
        """Grant the picked run its devices, unless it waits for a faster device instead."""
        pos, run, devs, backfilled, bf_why = pick
        self.done.add(pos)
        later = self.wait_instead(run, devs)
        if later is not None:
            if self.explain:
                self.reasons[run.run_key] = (f"waits for {later[0]}: expected free at t={later[1]:.0f} and the run "
                                             f"to end by t={later[2]:.0f}, sooner than on the devices free now")
            return
        self.take(devs)
        self.reasons.pop(run.run_key, None)
        rt = self.runtime_on(run, devs)
        self.granted_ends.append((self.now + rt if rt is not None else math.inf, devs))
        self.grants.append(Grant(run.run_key, devs, why or bf_why or self.order_reason, backfilled))
        self.granted(run, devs)

    def run(self, waiting: Iterable[QueuedRun]) -> Admission:
        """Decide over ``waiting`` (in queue order, read only as far as needed) until no device is left or
        no run can start."""
        runs: list[QueuedRun] = []
        more = iter(waiting)
        start = 0
        while self.left:
            self.window = []
            start = self.scan(runs, more, start)
            if not self.window:
                break
            self.start(*self.pick())
        return Admission(tuple(self.grants), self.reservation, self.reasons)


def decide(
    waiting: Iterable[QueuedRun],
    free: AbstractSet,
    running: Sequence[RunningRun],
    now: float,
    place_on: PlaceOn,
    *,
    aging_s: float = AGING_S,
    presorted: bool = False,
    device_type: Callable[[Hashable], str] | None = None,
    host_of: Callable[[Hashable], Hashable] | None = None,
    wait_margin: float | None = None,
    on_grant: Callable[[QueuedRun, tuple], None] | None = None,
    explain: bool = True,
) -> Admission:
    """The admission decision with its reservation and the reasons runs wait; see :func:`admit`.

    :param aging_s: the order's aging (:data:`AGING_S`), when not ``presorted``.
    :param presorted: ``waiting`` is already in the queue's order (the product's: team fair sharing over
        :func:`queue_key`, then :func:`gang_first`); it may then be any iterable, read only as far as needed.
    :param device_type: device id -> model name: the runs' ``speed_by_type`` then count (their runtime on the
        devices they get, and the wait rule).
    :param host_of: device id -> host, so the wait rule counts a gang's devices on one host (up to a
        host's devices) or on whole hosts; None = devices of a type are counted together.
    :param wait_margin: turn on the wait-for-a-faster-device rule with this margin (e.g.
        :data:`WAIT_MARGIN`; needs ``device_type`` and the runs' ``speed_by_type``); None = off.
    :param on_grant: called with each run and its devices as it is granted, before the next run is
        considered (team quotas count the call's own grants with it: :mod:`autodl.policy.fairshare`).
    :param explain: fill ``waiting_reasons`` (off: grants and reservation only, a little faster).
    :returns: an :class:`Admission`; ``waiting_reasons`` covers the runs examined and not granted.
    """
    runs = waiting if presorted else queue_order(list(waiting), now, aging_s=aging_s)
    d = Decider(free, running, now, place_on, device_type=device_type, host_of=host_of, wait_margin=wait_margin,
                on_grant=on_grant, explain=explain)
    return d.run(runs)


def admit(waiting: Sequence[QueuedRun], free: frozenset, running: Sequence[RunningRun], now: float,
          place_on: PlaceOn, **options) -> list[Grant]:
    """Decide which waiting runs start now and on which of the ``free`` devices.

    autodl's queue policy: shortest expected run first with aging, EASY backfill with a reservation for the
    blocked head, and the wait for a faster device when asked (see the module docstring).

    :param waiting: the runs that wait.
    :param free: ids of the devices free now.
    :param running: the runs holding devices (their ``expected_end`` places the reservation).
    :param now: the current time, same clock as ``QueuedRun.enqueued_at``.
    :param place_on: the placement policy, see :data:`PlaceOn`.
    :param options: keyword arguments of :func:`decide`.
    :returns: the grants, in the order they were decided; devices of different grants never overlap
        and are all in ``free``.
    """
    options.setdefault("explain", False)
    return list(decide(waiting, free, running, now, place_on, **options).grants)


__all__ = [
    "AGING_S", "Admission", "Startable", "Decider", "Grant", "PlaceOn", "QueuedRun", "RESERVE_LIMIT", "Reservation",
    "RunningRun", "UNKNOWN_RUNTIME_S", "WAIT_MARGIN", "admit", "decide", "gang_first", "known", "queue_key",
    "queue_order",
]
