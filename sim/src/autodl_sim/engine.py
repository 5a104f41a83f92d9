"""Event-driven replay of a job trace on a simulated pool: autodl's admission queue and a placement policy, or a preemptive LAS baseline.

Each device is exclusive to one job, unless ``SimOptions.sharing="packed"``: then two 1-device jobs
may share a big NVIDIA device by the product's rule (:mod:`autodl.policy.packing`), each slowed by its
published pair ratio (:mod:`autodl_sim.colocation`). A job needs ``num_gpus`` devices of one model (one
host, or whole hosts of that model when the gang is larger than a host). Within a device model a gang goes to
the fullest host that holds it (packing); the placement policy chooses the device model.

What a policy sees is kept apart from what happens:

- it sees each job's *estimated* memory (true peak x a measured estimator error), its *expected*
  runtime (true x a log-normal error) and the catalog's *assumed* speed of each device model;
- what happens is the *true* peak (a job whose true peak exceeds its device's memory OOMs when the
  peak is reached: after :data:`PEAK_STEP_S` for a training-step peak, after
  :data:`EVAL_PEAK_FRACTION` of its runtime for an evaluation-pass peak) and the *true* speed
  (the measured heterogeneity matrix).

Non-preemptive schedulers decide with :func:`autodl_sim.admission.decide`: the product's admission
decision (:mod:`autodl.policy.admission`) with the simulator's queue rules; ``tiresias_las`` is the preemptive reference (discretized two-dimensional
least-attained-service, Gu et al., "Tiresias: A GPU Cluster Manager for Distributed Deep Learning",
NSDI 2019), paying :data:`CHECKPOINT_S` per preemption.
"""

from __future__ import annotations

import bisect
import heapq
import itertools
import math
import random
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Sequence

from autodl.catalog import Catalog
from autodl.policy import packing
from autodl.policy.admission import AGING_S, WAIT_MARGIN, QueuedRun, RunningRun
from autodl.policy.base import Need, Option, PolicyContext
from autodl.policy.registry import get_policy
from autodl.policy.rl_based import REFERENCE_MODEL, LinUCB, features_from_terms
from autodl.types import Device
from autodl_sim import baselines  # noqa: F401 - registers the baselines
from autodl_sim.admission import CA_WINDOW, GANG_FIRST_MIN_GPUS, decide, sim_queue_key
from autodl_sim.colocation import load_pair_ratios, pair_ratio
from autodl_sim.pool import SimPool
from autodl_sim.workload import ROOFLINE_REFERENCE, SimJob

PEAK_STEP_S = 60.0
"""Seconds from start until a training-step peak is reached (process start, model build, first
steps): where an OOM surfaces for most jobs. Assumption (a training OOM surfaces in the first
iteration); the run is charged this time, or its whole runtime if shorter."""

EVAL_PEAK_FRACTION = 0.1
"""Fraction of a run's runtime before its first evaluation pass, where an evaluation-phase peak is
reached (assumption: evaluation after the first of ten epochs). Applies to error samples whose
``phase`` is ``eval`` (``autodl_sim/data/estimate-errors.csv``)."""

CHECKPOINT_S = 60.0
"""Seconds a preemption costs the preempted job (save a checkpoint, restore it on restart). Assumption:
tens of seconds for a model and optimizer state of a few GiB written to and read from shared storage."""

LAS_THRESHOLD_GPU_S = 3600.0 * 16
"""Tiresias 2D-LAS: attained GPU-seconds above which a job drops from the high- to the low-priority
queue (two queues, as Tiresias recommends). Tuned for this baseline on the tuning slice like autodl's
own constants (``benchmarks/scheduling.py --tune``: 1, 4, 16 GPU-h; 16 best)."""

LAS_PROMOTE_KNOB = 8.0
"""Tiresias' starvation guard: a waiting job whose waiting time exceeds this multiple of its executed
time goes back to the high-priority queue (Tiresias' PromoteKnob; value an assumption)."""

TYPES_REFERENCE = ROOFLINE_REFERENCE

TICK_S = 30.0
"""Seconds between two queue decisions: waiting runs poll the pool every ``scheduler.poke_interval``
seconds (30 by default in the task spec), so the product decides at most that often; the simulator
decides at the first multiple of this after something changed. 0 = at every event."""

RESERVE_TRIES = 8
"""Blocked runs tried as the head of the queue per decision (``decide``'s ``reserve_limit``)."""

PACK_TRIES = 64
"""Waiting 1-device runs, in queue order, tried per decision as a second tenant of a packed device
(``sharing="packed"``). A bound of the simulator's work, like :data:`RESERVE_TRIES`."""


@dataclass
class SimOptions:
    """Knobs of one replay.

    :ivar memory_threshold: every policy plans at most this fraction of device memory (the same
        headroom for all, unless ``own_headroom``).
    :ivar own_headroom: each policy keeps its own ``headroom`` attribute (baselines 1.0), as before
        the benchmark was made fair.
    :ivar order, backfill, aging_s: the admission queue (:func:`autodl_sim.admission.decide`).
    :ivar window: comparative-advantage window; 1 = off.
    :ivar wait_margin: the queue's wait-for-a-faster-device rule with this margin; None = off; ``"policy"``
        (the default) = autodl's own policies (``rule_based``, ``rl_based``) use
        :data:`autodl.policy.admission.WAIT_MARGIN`, the baselines place on what is free now.
    :ivar gang_first_s: after this wait, seconds, the queue serves first the longest-waiting gang of
        :data:`autodl_sim.admission.GANG_FIRST_MIN_GPUS` or more devices (:data:`autodl_sim.admission.GANG_FIRST_S`);
        None = off (the default).
    :ivar own_queue: each policy keeps its classic queue (``fifo``: FCFS with no backfill; ``backfill``:
        FCFS with greedy backfill), overriding order/backfill/window.
    :ivar quotas: per-owner device quotas (the trace's virtual cluster is the owner).
    :ivar depth: waiting runs one decision examines at most (None = all, the product's default).
    :ivar tick_s: see :data:`TICK_S`.
    :ivar prefilter, fast_reservation: the simulator's shortcuts (hand ``decide`` only the runs that
        could fit, search reservations incrementally); off = the plain calls, same decisions, slower.
    :ivar seen_speeds: ``{device model: speed}`` the policy sees (default: truth averaged over classes).
    :ivar seen_by_class: the policy sees each job's own speed on each device model instead (its model
        class's row of the true matrix): what Gavel's throughput matrix assumes, and what autodl's run
        records give once a run of that model has been measured there. Overrides ``seen_speeds``.
    :ivar weights: rule_based weights (default :data:`autodl.policy.scoring.DEFAULT_WEIGHTS`).
    :ivar checkpoint_s, las_threshold_gpu_s, las_promote_knob: the ``tiresias_las`` baseline.
    :ivar steady: (lo, hi) fractions of the slice's submits bounding the steady-state window.
    :ivar sharing: ``exclusive`` (every device is one job's) or ``packed``: after each decision, a waiting
        1-device run may join a device that holds one packed 1-device run, by the product's rule
        (:mod:`autodl.policy.packing`: :func:`~autodl.policy.packing.shareable`,
        :func:`~autodl.policy.packing.fits_beside` on the *estimates*, never a device held back for the
        head of the queue, a pair type barred once measured below
        :data:`~autodl.policy.packing.SLOWDOWN_BAR`). Non-preemptive schedulers only.
    :ivar pack_blind: packing without the estimate: a run joins any device with one packed run (at most
        :data:`~autodl.policy.packing.MAX_TENANTS`), memory unchecked; the true peaks then collide.
    :ivar slowdown_scale: interference multiplier: a shared run progresses at ``1 - scale x (1 - r)`` of its
        solo speed, r the published pair ratio (:mod:`autodl_sim.colocation`); 1 = as published.
    """

    memory_threshold: float = 0.85
    own_headroom: bool = False
    order: str = "sjf"
    backfill: str = "easy"
    aging_s: float = AGING_S
    window: int = CA_WINDOW
    wait_margin: float | None | str = "policy"
    gang_first_s: float | None = None
    own_queue: bool = False
    quotas: dict[str, int] | None = None
    depth: int | None = None
    tick_s: float = TICK_S
    prefilter: bool = True
    fast_reservation: bool = True
    allowed_vendors: tuple[str, ...] | None = None
    preferred_devices: tuple[str, ...] = ()
    tag_priorities: dict[str, float] = field(default_factory=dict)
    seen_speeds: dict[str, float] | None = None
    seen_by_class: bool = False
    weights: dict[str, float] | None = None
    checkpoint_s: float = CHECKPOINT_S
    las_threshold_gpu_s: float = LAS_THRESHOLD_GPU_S
    las_promote_knob: float | None = LAS_PROMOTE_KNOB
    seed: int = 0
    timeline_points: int = 200
    steady: tuple[float, float] = (0.2, 0.8)
    sharing: str = "exclusive"
    pack_blind: bool = False
    slowdown_scale: float = 1.0


AUTODL_POLICIES = ("rule_based", "rl_based")
"""autodl's own placement policies: the wait-for-a-faster-device rule is part of them (a choice of device
type that accepts a wait), not of the queue discipline every policy shares."""

GANG_BUCKETS = (1, 2, 4, 8, 16, 32)
"""Gang-size rows of the per-size table; the last collects 32 and more."""


@dataclass
class SimResult:
    """What one replay measured. Times in seconds; utilizations 0..1.

    JCT = finish - submit of a completed job; queueing delay = JCT - seconds it held devices (all
    attempts). ``gpu_utilization_steady`` = GPU-seconds held / (pool GPUs x window length) over the
    steady-state window: from the submit of the slice's :attr:`SimOptions.steady` [0]-th job to
    that of its [1]-th (ramp-up and drain left out); ``useful_utilization_steady`` counts only
    attempts that were not lost to an OOM (and not preemption overheads). ``gpu_utilization`` is
    the old whole-makespan figure (one long job draining dilutes it).
    """

    policy: str
    queue: str
    headroom: float
    jobs: int
    completed: int
    rejected: int
    failed: int
    avg_jct_s: float
    p99_jct_s: float
    avg_queue_s: float
    p99_queue_s: float
    makespan_s: float
    gpu_utilization: float
    gpu_utilization_steady: float
    useful_utilization_steady: float
    memory_utilization: float
    oom_failures: int
    preemptions: int
    decisions: int
    decision_us_median: float
    wall_s: float
    by_gang: dict[int, dict[str, float]] = field(default_factory=dict)
    jcts: list[float] = field(default_factory=list, repr=False)
    timeline: list[tuple[float, float]] = field(default_factory=list, repr=False)
    placed_on: dict[str, int] = field(default_factory=dict)
    joins: int = 0
    pair_ooms: int = 0
    barred_pairs: list[str] = field(default_factory=list)

    def summary(self) -> dict:
        """JSON-ready metrics without the per-job series."""
        return {k: v for k, v in self.__dict__.items() if k not in ("jcts", "timeline")}


class _Pool:
    """Device ids 0..N-1 by (type, host, slot); per-type host ranges."""

    def __init__(self, pool: SimPool) -> None:
        self.groups = pool.groups
        self.type_of: list[int] = []
        self.host_of: list[int] = []
        self.host_devices: list[list[int]] = []
        self.type_hosts: list[range] = []
        host = 0
        for t, g in enumerate(pool.groups):
            first = host
            for _ in range(g.hosts):
                ids = list(range(len(self.type_of), len(self.type_of) + g.gpus_per_host))
                self.host_devices.append(ids)
                self.type_of.extend([t] * g.gpus_per_host)
                self.host_of.extend([host] * g.gpus_per_host)
                host += 1
            self.type_hosts.append(range(first, host))
        self.n = len(self.type_of)
        self.type_of_host = [self.type_of[ids[0]] for ids in self.host_devices]
        self.model_of_device = [pool.groups[t].model for t in self.type_of]


def _pick_hosts(counts: list[tuple[int, int]], n: int, k: int) -> list[int] | None:
    """Hosts of one type for a gang of ``n`` (``counts``: ascending (free, host), free > 0; ``k`` per host).

    ``n <= k``: the fullest host that holds it; else ``n // k`` whole free hosts plus the fullest
    host holding the remainder. None when it does not fit.
    """
    if n <= k:
        i = bisect.bisect_left(counts, (n, -1))
        return [counts[i][1]] if i < len(counts) else None
    full, rem = divmod(n, k)
    whole = [h for c, h in counts if c == k]
    if len(whole) < full:
        return None
    chosen = whole[:full]
    if rem:
        taken = set(chosen)
        rest = [(c, h) for c, h in counts if h not in taken]
        i = bisect.bisect_left(rest, (rem, -1))
        if i >= len(rest):
            return None
        chosen.append(rest[i][1])
    return chosen


def simulate(
    jobs: Sequence[SimJob],
    pool: SimPool,
    policy_name: str,
    *,
    speeds: dict[str, dict[str, float]],
    catalog: Catalog,
    options: SimOptions | None = None,
) -> SimResult:
    """Replay ``jobs`` on ``pool`` under ``policy_name``.

    :param jobs: the trace slice, sorted by ``submit_s``.
    :param pool: the simulated pool.
    :param policy_name: a registered placement policy (:func:`autodl.policy.policy_names`), placed
        through the admission queue; or ``tiresias_las`` (preemptive, rule_based placement).
    :param speeds: true speeds, ``{model_class: {device model: throughput relative to V100}}``.
    :param catalog: for the bandit's reference device.
    :param options: knobs; defaults of :class:`SimOptions`.
    :returns: the measured :class:`SimResult`.
    :raises AutoDLError: on an unknown policy.
    :raises ValueError: when ``speeds`` lacks a device model of the pool.
    """
    return _Sim(jobs, pool, policy_name, speeds, catalog, options or SimOptions()).run()


class _Sim:
    def __init__(self, jobs, pool, policy_name, speeds, catalog, opt: SimOptions) -> None:
        self.wall0 = time.perf_counter()
        self.jobs = list(jobs)
        self.opt = opt
        self.policy_name = policy_name
        self.preemptive = policy_name == "tiresias_las"
        self.pol = get_policy("rule_based" if self.preemptive else policy_name)
        self.threshold = opt.memory_threshold if (self.pol.headroom or not opt.own_headroom) else 1.0
        if opt.own_queue and not self.preemptive:
            self.order, self.backfill, self.window = "fcfs", ("none" if self.pol.queue == "fifo" else "greedy"), 1
        else:
            self.order, self.backfill, self.window = opt.order, opt.backfill, opt.window
        wm = opt.wait_margin
        if wm == "policy":
            wm = WAIT_MARGIN if policy_name in AUTODL_POLICIES else None
        self.wait_margin = None if (opt.own_queue or self.preemptive) else wm
        self.p = _Pool(pool)
        self.groups = pool.groups
        for g in pool.groups:
            for cls in speeds:
                if g.model not in speeds[cls]:
                    raise ValueError(f"speeds lack device model {g.model} for class {cls}")
        self.true_speed = speeds
        if opt.seen_speeds is not None:
            self.seen = dict(opt.seen_speeds)
        else:
            self.seen = {g.model: sum(speeds[c][g.model] for c in speeds) / len(speeds) for g in pool.groups}
        self.type_counts: dict[str, int] = {}
        for g in pool.groups:
            self.type_counts[g.model] = self.type_counts.get(g.model, 0) + g.gpus
        self.allowed = set(opt.allowed_vendors) if opt.allowed_vendors is not None else None
        self.bandit = LinUCB() if policy_name == "rl_based" else None
        ref = catalog.find(REFERENCE_MODEL)
        self.seen_ref = self.seen.get(REFERENCE_MODEL)
        if self.seen_ref is None and ref is not None:
            base = catalog.get(TYPES_REFERENCE)
            self.seen_ref = min(ref.peak_tflops("fp32") / base.peak_tflops("fp32"),
                                ref.memory_bandwidth_gbps / base.memory_bandwidth_gbps)
        self.seen_ref = self.seen_ref or 1.0
        # what the policy sees per (model class, device model)
        self.seen_cls = {c: (dict(speeds[c]) if opt.seen_by_class else self.seen) for c in speeds}
        self.ctx = PolicyContext(
            preferred_devices=list(opt.preferred_devices), tag_priorities=dict(opt.tag_priorities),
            memory_threshold=self.threshold, rng=random.Random(opt.seed), bandit=self.bandit, weights=opt.weights,
        )
        n = len(self.jobs)
        self.est = [j.est_bytes for j in self.jobs]
        self.feasible: list[tuple[int, ...]] = [()] * n
        self.first_start = [math.nan] * n
        self.finish = [math.nan] * n
        self.held_s = [0.0] * n
        self.key_of: dict[str, int] = {}
        self.qrun: list[QueuedRun | None] = [None] * n
        self.free = set(range(self.p.n))
        self.free_by_type = [g.gpus for g in pool.groups]
        self.running: dict[int, RunningRun] = {}
        self.run_info: dict[int, tuple] = {}      # jid -> (type, devices, start, end, oom, terms)
        self.events: list[tuple[float, int, int, int]] = []
        self.seq = 0
        self.rejected = self.failed = self.ooms = self.preemptions = self.decisions = 0
        self.latencies: list[float] = []
        self.placed_on: dict[str, int] = {}
        self.terms_cache: dict[tuple[int, tuple], dict] = {}
        self._struct_cache: list[tuple[object, list]] = []
        # waiting runs (non-preemptive) by bucket (feasible types, gang size), each in queue_key order
        self.buckets: dict[tuple, tuple[list, list]] = {}
        self.nwaiting = 0
        self.by_enq: list[tuple[float, int]] = []     # waiting runs by enqueue time (gangs first after a while)
        # accounting
        self.busy = 0
        self.used_mem = self.alloc_mem = 0.0
        self.busy_s = self.used_mem_s = self.alloc_mem_s = 0.0
        self.steady_busy_s = self.steady_waste_s = 0.0
        self.wasting = 0              # GPUs held by attempts that will OOM
        self.timeline: list[tuple[float, int]] = []
        subs = sorted(j.submit_s for j in self.jobs)
        if subs:
            lo, hi = opt.steady
            self.win = (subs[min(n - 1, int(lo * n))], subs[min(n - 1, max(0, int(hi * n) - 1))])
        else:
            self.win = (0.0, 0.0)
        # preemptive state
        self.attained = [0.0] * n
        self.remaining = [0.0] * n        # V100-seconds of work left
        self.since = [0.0] * n            # running: last accounting time; waiting: waiting since
        self.last_exec = [0.0] * n
        self.restarts = [0] * n
        self.gen = [0] * n
        self.end_seq = [-1] * n
        self.tick_seq = [-1] * n
        self.wkey_of: dict[int, tuple] = {}
        self.bucket_of: dict[int, tuple] = {}
        self.wasted: set[int] = set()     # attempts counted in self.wasting
        self.init_packing()

    def init_packing(self) -> None:
        """Packing state (``SimOptions.sharing``); the device rule and capacity are the product's functions."""
        opt = self.opt
        if opt.sharing not in packing.SHARING_MODES:
            raise ValueError(f"SimOptions.sharing={opt.sharing!r}: use one of {', '.join(packing.SHARING_MODES)}.")
        self.packing = opt.sharing == "packed" and not self.preemptive
        devs = [Device.model_validate({"device_id": g.model, "index": 0, "model": g.model, "vendor": g.vendor,
                                       "memory_total_bytes": g.memory_bytes}) for g in self.groups]
        self.share_type = [packing.shareable(d) for d in devs]
        self.cap_type = [packing.capacity_bytes(d, self.threshold) for d in devs]
        self.ratios = load_pair_ratios() if self.packing else {}
        self.tenants: dict[int, list[int]] = {}           # packed device -> its jobs, first tenant first
        self.single: dict[tuple[int, str], dict[int, int]] = {}   # (type, tenant's class) -> {device: reserved}
        self.prog: dict[int, list[float]] = {}            # tenant -> [V100-s of work left, rate, since]
        self.pair_obs: dict[int, dict[str, float]] = {}   # tenant -> {pair type: its co-located speed ratio}
        self.observed: dict[str, list[float]] = {}
        self.barred: set[str] = set()
        self.exp_end: dict[int, float | None] = {}
        self.pair_oom: set[int] = set()
        self.no_pack: set[int] = set()
        self.joins = self.pair_ooms = 0

    # ------------------------------------------------------------------ helpers
    def push(self, t: float, kind: int, jid: int) -> int:
        heapq.heappush(self.events, (t, kind, self.seq, jid))
        self.seq += 1
        return self.seq - 1

    def compute_feasible(self, jid: int) -> tuple[int, ...]:
        j = self.jobs[jid]
        return tuple(
            t for t, g in enumerate(self.groups)
            if self.est[jid] <= self.threshold * g.memory_bytes and j.num_gpus <= g.gpus
            and (self.allowed is None or g.vendor in self.allowed)
        )

    def make_qrun(self, jid: int, enqueued_at: float) -> QueuedRun:
        j = self.jobs[jid]
        seen = self.seen_cls[j.model_class]
        speeds = {self.groups[t].model: seen[self.groups[t].model] for t in self.feasible[jid]}
        key = str(jid)
        self.key_of[key] = jid
        return QueuedRun(key, j.num_gpus, self.est[jid], enqueued_at, j.owner, j.est_duration_s, speeds)

    def struct(self, free) -> list:
        """Per type: ascending (free count, host) of hosts with a free device in ``free``; cached per set object."""
        for obj, st in self._struct_cache:
            if obj is free:
                return st
        per_host = Counter(map(self.p.host_of.__getitem__, free))
        by_type: list[list[tuple[int, int]]] = [[] for _ in self.groups]
        type_of_host = self.p.type_of_host
        for h, c in per_host.items():
            by_type[type_of_host[h]].append((c, h))
        for lst in by_type:
            lst.sort()
        if len(self._struct_cache) >= 4:
            self._struct_cache.pop(0)
        self._struct_cache.append((free, by_type))
        return by_type

    def place_on(self, run: QueuedRun, free) -> tuple | None:
        jid = self.key_of[run.run_key]
        n = run.num_gpus
        st = self.struct(free)
        cand = []
        for t in self.feasible[jid]:
            hosts = _pick_hosts(st[t], n, self.groups[t].gpus_per_host)
            if hosts is not None:
                cand.append((t, hosts))
        if not cand:
            return None
        if len(cand) == 1 and self.bandit is None:
            t, hosts = cand[0]
            terms = None
        else:
            j = self.jobs[jid]
            rt = j.est_duration_s if j.est_duration_s else 1.0
            opts = []
            for t, _ in cand:
                g = self.groups[t]
                opts.append(Option(
                    devices=(t,), model=g.model, vendor=g.vendor, host=g.model, num_devices=n,
                    memory_total_bytes=g.memory_bytes, step_time_s=rt / self.seen_cls[j.model_class][g.model],
                    cost_per_hour_usd=g.cost_per_hour_usd, load=1.0 - self.free_by_type[t] / g.gpus,
                    tags=g.tags, order=t,
                ))
            scored = self.pol.score(Need(self.est[jid], n, run.run_key), opts, self.ctx)
            bi = max(range(len(opts)), key=lambda i: (scored[i].score, -opts[i].order))
            t, hosts = cand[bi]
            terms = scored[bi].terms
        devs: list[int] = []
        need = n
        for h in hosts:
            for d in self.p.host_devices[h]:
                if d in free:
                    devs.append(d)
                    need -= 1
                    if not need:
                        break
            if not need:
                break
        out = tuple(devs)
        if terms is not None and self.bandit is not None:
            self.terms_cache[(jid, out)] = terms
        return out

    def earliest(self, run: QueuedRun, free, timeline) -> tuple[tuple, int] | None:
        """The reservation search's fast path (:data:`autodl_sim.admission.Earliest`): per-host free
        counts updated as the timeline's devices free, the policy asked only once the run fits."""
        jid = self.key_of[run.run_key]
        n = run.num_gpus
        feas = set(self.feasible[jid])
        host_of, type_of_host = self.p.host_of, self.p.type_of_host
        counts = Counter(map(host_of.__getitem__, free))
        groups = self.groups

        def fits_type(t: int) -> bool:
            k = groups[t].gpus_per_host
            hosts = self.p.type_hosts[t]
            if n <= k:
                return any(counts.get(h, 0) >= n for h in hosts)
            full, rem = divmod(n, k)
            whole = sum(1 for h in hosts if counts.get(h, 0) == k)
            if whole < full:
                return False
            if rem == 0 or whole > full:
                return True
            return any(rem <= counts.get(h, 0) < k for h in hosts)

        if any(fits_type(t) for t in feas):
            hit = self.place_on(run, free)
            return (hit, 0) if hit is not None else None
        flat = list(free)
        for k, (_end, devs) in enumerate(timeline, 1):
            touched = set()
            for d in devs:
                h = host_of[d]
                counts[h] = counts.get(h, 0) + 1
                touched.add(type_of_host[h])
            flat.extend(devs)
            if any(t in feas and fits_type(t) for t in touched):
                hit = self.place_on(run, frozenset(flat))
                if hit is not None:
                    return hit, k
        return None

    # ------------------------------------------------------------------ accounting
    def advance(self, t_now: float, last_t: float) -> None:
        dt = t_now - last_t
        if dt <= 0:
            return
        self.busy_s += self.busy * dt
        self.used_mem_s += self.used_mem * dt
        self.alloc_mem_s += self.alloc_mem * dt
        lo, hi = self.win
        a, b = max(last_t, lo), min(t_now, hi)
        if b > a:
            self.steady_busy_s += self.busy * (b - a)
            self.steady_waste_s += self.wasting * (b - a)

    def start(self, jid: int, devices: tuple, t_now: float, overhead: float = 0.0) -> None:
        j = self.jobs[jid]
        t = self.p.type_of[devices[0]]
        g = self.groups[t]
        self.free.difference_update(devices)
        self.free_by_type[t] -= len(devices)
        n = len(devices)
        if math.isnan(self.first_start[jid]):
            self.first_start[jid] = t_now
        speed = self.true_speed[j.model_class][g.model]
        work = self.remaining[jid] if self.preemptive else j.duration_s
        runtime = overhead + work / speed
        oom = j.peak_bytes > g.memory_bytes
        if oom:
            to_peak = PEAK_STEP_S if j.peak_phase == "step" else EVAL_PEAK_FRACTION * j.duration_s / speed
            end = t_now + min(runtime, to_peak)
            self.wasting += n
            self.wasted.add(jid)
        else:
            end = t_now + runtime
        terms = self.terms_cache.pop((jid, devices), None) if self.bandit is not None else None
        self.run_info[jid] = (t, devices, t_now, end, oom, terms, overhead)
        self.gen[jid] += 1
        self.end_seq[jid] = self.push(end, 0, jid)
        if self.preemptive and self.attained[jid] < self.opt.las_threshold_gpu_s:
            tick = t_now + (self.opt.las_threshold_gpu_s - self.attained[jid]) / n
            if tick < end:
                self.push(tick, 2, jid)
                self.tick_seq[jid] = self.seq - 1
        exp_end = None
        if j.est_duration_s:
            exp_end = t_now + overhead + j.est_duration_s / self.seen_cls[j.model_class][g.model]
        self.running[jid] = RunningRun(str(jid), devices, exp_end, j.owner)
        self.busy += n
        self.used_mem += min(j.peak_bytes, g.memory_bytes) * n
        self.alloc_mem += g.memory_bytes * n
        self.placed_on[g.model] = self.placed_on.get(g.model, 0) + 1
        self.since[jid] = t_now
        if self.packing and n == 1 and self.share_type[t] and jid not in self.no_pack:
            d = devices[0]
            self.tenants[d] = [jid]
            self.single.setdefault((t, j.model_class), {})[d] = packing.reservation_bytes(self.est[jid], joining=False) or 0
            self.exp_end[jid] = exp_end
            if not oom:
                self.prog[jid] = [j.duration_s, speed, t_now]

    def stop(self, jid: int, t_now: float) -> tuple:
        """Free ``jid``'s devices; returns its run info."""
        info = self.run_info.pop(jid)
        t, devices, t0, _end, oom, _terms, _ov = info
        j = self.jobs[jid]
        g = self.groups[t]
        n = len(devices)
        ten = self.tenants.get(devices[0]) if self.packing else None
        if ten is not None and jid in ten:
            if len(ten) == 2:
                self.leave_shared(jid, devices[0], t0, t_now)
                return info
            del self.tenants[devices[0]]
            self.single[(t, j.model_class)].pop(devices[0], None)
            self.prog.pop(jid, None)
        self.free.update(devices)
        self.free_by_type[t] += n
        self.running.pop(jid, None)
        self.busy -= n
        if jid in self.wasted:
            self.wasted.discard(jid)
            self.wasting -= n
        self.used_mem -= min(j.peak_bytes, g.memory_bytes) * n
        self.alloc_mem -= g.memory_bytes * n
        self.held_s[jid] += t_now - t0
        return info

    def enqueue(self, jid: int, t_enq: float) -> bool:
        self.feasible[jid] = self.compute_feasible(jid)
        if not self.feasible[jid]:
            return False
        q = self.make_qrun(jid, t_enq)
        self.qrun[jid] = q
        if not self.preemptive:
            k = sim_queue_key(q, order=self.order, aging_s=self.opt.aging_s)
            self.wkey_of[jid] = k
            b = (self.feasible[jid], q.num_gpus)
            self.bucket_of[jid] = b
            keys, runs = self.buckets.setdefault(b, ([], []))
            i = bisect.bisect_left(keys, k)
            keys.insert(i, k)
            runs.insert(i, q)
            self.nwaiting += 1
            bisect.insort(self.by_enq, (q.enqueued_at, jid))
        return True

    # ------------------------------------------------------------------ main loop
    def run(self) -> SimResult:
        jobs = self.jobs
        for jid, j in enumerate(jobs):
            self.push(j.submit_s, 1, jid)
        last_t = jobs[0].submit_s if jobs else 0.0
        self.timeline.append((last_t, 0))
        self.las_waiting: list[list[tuple[float, int]]] = [[], []]
        self.tick_pending = False
        while self.events:
            if self.packing:
                self.drop_stale()
                if not self.events:
                    break
            t_now = self.events[0][0]
            self.advance(t_now, last_t)
            last_t = t_now
            changed, decide_now = self.handle_events_at(t_now)
            if self.decision_due(changed, decide_now, t_now):
                if self.preemptive:
                    self.schedule_las(t_now)
                else:
                    self.schedule(t_now)
            if self.timeline[-1][1] != self.busy:
                self.timeline.append((t_now, self.busy))
        return self.result(last_t)

    def handle_events_at(self, t_now: float) -> tuple[bool, bool]:
        """Pop every event at ``t_now`` (submissions, ends, decision ticks, LAS demotion ticks): whether the waiting
        or running runs changed, and whether a decision tick came."""
        changed = decide_now = False
        while self.events and self.events[0][0] == t_now:
            _, kind, seq, jid = heapq.heappop(self.events)
            if kind == 1:
                self.on_submit(jid, t_now)
                changed = True
            elif kind == 0:
                if jid not in self.run_info or self.end_seq[jid] != seq:
                    continue          # preempted before this end
                self.on_end(jid, t_now)
                changed = True
            elif kind == 3:           # a decision tick
                self.tick_pending = False
                decide_now = True
            elif jid in self.run_info and self.tick_seq[jid] == seq:  # LAS demotion tick
                changed = True
        return changed, decide_now

    def on_submit(self, jid: int, t_now: float) -> None:
        """Enqueue a submitted job (into the LAS top queue when preemptive); a rejected one is counted."""
        if self.preemptive:
            self.remaining[jid] = self.jobs[jid].duration_s
            ok = self.enqueue(jid, t_now)
            if ok:
                self.since[jid] = t_now
                bisect.insort(self.las_waiting[0], (self.jobs[jid].submit_s, jid))
        else:
            ok = self.enqueue(jid, t_now)
        if not ok:
            self.rejected += 1

    def decision_due(self, changed: bool, decide_now: bool, t_now: float) -> bool:
        """Whether to decide at ``t_now``: on every change without decision ticks; with them (``tick_s``), on a tick
        only, a change booking the next tick."""
        if changed and self.opt.tick_s > 0:
            if not self.tick_pending:
                self.tick_pending = True
                self.push(math.ceil(t_now / self.opt.tick_s) * self.opt.tick_s, 3, -1)
            return decide_now
        return changed or decide_now

    def queued(self, jid: int) -> QueuedRun:
        """The queued run of job ``jid``, which has been enqueued (it is waiting, or started from the queue)."""
        q = self.qrun[jid]
        if q is None:
            raise RuntimeError(f"job {jid} has no queued run: it was never enqueued")
        return q

    def drop_stale(self) -> None:
        """Pop end events superseded by a reschedule (packing), so they neither advance the clock nor the makespan."""
        ev = self.events
        while ev and ev[0][1] == 0 and (ev[0][3] not in self.run_info or self.end_seq[ev[0][3]] != ev[0][2]):
            heapq.heappop(ev)

    def on_end(self, jid: int, t_now: float) -> None:
        j = self.jobs[jid]
        t, devices, t0, _end, oom, terms, overhead = self.stop(jid, t_now)
        g = self.groups[t]
        if self.preemptive:
            self.attained[jid] += len(devices) * (t_now - self.since[jid])
        if self.bandit is not None and terms is not None:
            # measured step time (true speed) against the reference the policy assumes
            reward = self.bandit.reward(None if oom else self.true_speed[j.model_class][g.model] / self.seen_ref,
                                        None, None, failed=oom)
            self.bandit.update(g.model, features_from_terms(terms, self.ctx.weights), reward)
        obs = self.pair_obs.pop(jid, {}) if self.packing else {}
        if oom:
            self.ooms += 1
            if jid in self.pair_oom:
                # killed beside a neighbour: its own estimate may hold; it never shares again (conservative)
                self.pair_oom.discard(jid)
                self.pair_ooms += 1
                self.no_pack.add(jid)
            else:
                # Paddle's OOM message reports the device's memory: plan for more than that
                self.est[jid] = max(self.est[jid], g.memory_bytes + 1)
            if self.preemptive:
                if self.enqueue(jid, t_now):
                    self.since[jid] = t_now
                    self.las_insert(jid)
                else:
                    self.failed += 1
            elif not self.enqueue(jid, q.enqueued_at if (q := self.qrun[jid]) else t_now):
                self.failed += 1
        else:
            self.finish[jid] = t_now
            for key, r in obs.items():
                self.observed.setdefault(key, []).append(r)
                if packing.pair_barred(self.observed[key]):
                    self.barred.add(key)

    # ------------------------------------------------------------------ admission (non-preemptive)
    def waiting_view(self):
        """The waiting runs ``decide`` needs, lazily in queue order: every run that could fit on the
        free devices (a feasible type with at least its gang size free), plus the first few that
        cannot (candidates for the head's reservation). The others would only be found blocked, so
        the decision is the same as on the whole queue (``tests/simulate`` checks it); this only
        saves the simulator from walking thousands of them per decision."""
        free_by_type = self.free_by_type
        fits, rest = [], []
        for (feas, n), (keys, runs) in self.buckets.items():
            if not runs:
                continue
            if any(free_by_type[t] >= n for t in feas):
                fits.append(zip(keys, runs))
            else:
                rest.append(zip(keys, runs))
        heads = list(itertools.islice(heapq.merge(*rest), RESERVE_TRIES))
        merged = heapq.merge(*fits, heads) if heads else heapq.merge(*fits)
        return (r for _, r in merged)

    def schedule(self, t_now: float) -> None:
        if not self.nwaiting:
            return
        reservation = self.admit(t_now) if self.free else None
        if self.packing and self.nwaiting:
            self.pack(t_now, reservation)

    def admit(self, t_now: float):
        """One ``decide`` over the waiting runs; starts its grants; returns its reservation (or None)."""
        t0 = time.perf_counter()
        view = self.waiting_view() if self.opt.prefilter else (
            r for _, r in heapq.merge(*(zip(k, rs) for k, rs in self.buckets.values())))
        bound = self.opt.gang_first_s if self.order == "sjf" else None
        if bound is not None and self.by_enq and self.by_enq[0][0] <= t_now - bound:
            # the longest-waiting gang past gang_first_s first, as decide() orders it when not presorted
            k = bisect.bisect_right(self.by_enq, (t_now - bound, math.inf))
            old = next(([self.queued(jid)] for _, jid in self.by_enq[:k]
                        if self.jobs[jid].num_gpus >= GANG_FIRST_MIN_GPUS), None)
            if old:
                keys = {q.run_key for q in old}
                view = itertools.chain(old, (r for r in view if r.run_key not in keys))
        adm = decide(
            view, frozenset(self.free), list(self.running.values()), t_now, self.place_on,
            order=self.order, backfill=self.backfill, aging_s=self.opt.aging_s, quotas=self.opt.quotas,
            device_type=self.p.model_of_device.__getitem__ if (self.window > 1 or self.wait_margin is not None) else None,
            wait_margin=self.wait_margin, host_of=self.p.host_of.__getitem__,
            type_counts=self.type_counts, window=self.window, presorted=True, monotone=True,
            earliest=self.earliest if self.opt.fast_reservation else None, depth=self.opt.depth, reserve_limit=RESERVE_TRIES, explain=False,
        )
        self.latencies.append(time.perf_counter() - t0)
        self.decisions += 1
        for gr in adm.grants:
            jid = self.key_of[gr.run_key]
            self.start(jid, gr.devices, t_now)
            self.dequeue(jid)
        return adm.reservation

    def dequeue(self, jid: int) -> None:
        """Take a started run out of the waiting structures."""
        keys, runs = self.buckets[self.bucket_of.pop(jid)]
        i = bisect.bisect_left(keys, self.wkey_of[jid])
        del keys[i]
        del runs[i]
        self.nwaiting -= 1
        k = bisect.bisect_left(self.by_enq, (self.queued(jid).enqueued_at, jid))
        del self.by_enq[k]

    # ------------------------------------------------------------------ packing (sharing="packed")
    def held_back(self, reservation) -> tuple[frozenset, set[int]]:
        """Devices and device types no packed run may join (rule 3, as ``autodl.queue._held_back``): the
        decision's reservation; else, when a gang heads the queue, every device of its feasible types."""
        if reservation is not None:
            return reservation.devices, set()
        heads = [(keys[0], runs[0]) for keys, runs in self.buckets.values() if keys]
        if not heads:
            return frozenset(), set()
        head = min(heads, key=lambda kr: kr[0])[1]
        if head.num_gpus < 2:
            return frozenset(), set()
        return frozenset(), set(self.feasible[self.key_of[head.run_key]])

    def pack(self, t_now: float, reservation) -> None:
        """Second tenants: the first :data:`PACK_TRIES` waiting 1-device runs in queue order, each onto the
        least-booked device with one packed run of its fastest feasible shareable type where
        :func:`autodl.policy.packing.fits_beside` holds for its estimate (any such device when blind)."""
        if not any(self.single.values()):
            return
        ones = [zip(k, r) for (_feas, n), (k, r) in self.buckets.items() if n == 1 and k]
        if not ones:
            return
        cands = [r for _, r in itertools.islice(heapq.merge(*ones), PACK_TRIES)]
        held_devs, held_types = self.held_back(reservation)
        lists = {key: sorted((res, d) for d, res in devs.items() if d not in held_devs)
                 for key, devs in self.single.items() if devs and key[0] not in held_types}
        for run in cands:
            jid = self.key_of[run.run_key]
            if jid in self.no_pack:
                continue
            d = self.pack_target(jid, lists)
            if d is not None:
                self.dequeue(jid)
                self.join(jid, d, t_now)

    def pack_target(self, jid: int, lists: dict) -> int | None:
        """The device ``jid`` joins (taken out of ``lists``), or None."""
        j = self.jobs[jid]
        seen = self.seen_cls[j.model_class]
        types = sorted((t for t in self.feasible[jid] if self.share_type[t]), key=lambda t: -seen[self.groups[t].model])
        for t in types:
            model = self.groups[t].model
            for (tt, cls), lst in lists.items():
                if tt != t or not lst or packing.pair_type(j.model_class, cls, model) in self.barred:
                    continue
                res, d = lst[0]
                share = packing.DeviceShare.model_validate(
                    {"device_id": str(d), "capacity_bytes": self.cap_type[t], "reserved_bytes": res, "leases": 1})
                if self.opt.pack_blind and share.leases < packing.MAX_TENANTS or \
                        packing.fits_beside(share, self.est[jid], self.cap_type[t]):
                    lst.pop(0)
                    return d
        return None

    def join(self, jid: int, d: int, t_now: float) -> None:
        """Start ``jid`` as the second tenant of device ``d``; the TRUE peaks decide an OOM (the later arrival's)."""
        j = self.jobs[jid]
        t = self.p.type_of[d]
        g = self.groups[t]
        first = self.tenants[d][0]
        self.tenants[d].append(jid)
        self.single[(t, self.jobs[first].model_class)].pop(d, None)
        if math.isnan(self.first_start[jid]):
            self.first_start[jid] = t_now
        speed = self.true_speed[j.model_class][g.model]
        runtime = j.duration_s / speed
        oom = j.peak_bytes + self.jobs[first].peak_bytes > g.memory_bytes
        if oom:
            to_peak = PEAK_STEP_S if j.peak_phase == "step" else EVAL_PEAK_FRACTION * j.duration_s / speed
            end = t_now + min(runtime, to_peak)
            self.pair_oom.add(jid)
        else:
            end = t_now + runtime
            self.prog[jid] = [j.duration_s, speed, t_now]
        self.run_info[jid] = (t, (d,), t_now, end, oom, None, 0.0)
        self.gen[jid] += 1
        self.end_seq[jid] = self.push(end, 0, jid)
        exp_end = t_now + j.est_duration_s / self.seen_cls[j.model_class][g.model] if j.est_duration_s else None
        self.exp_end[jid] = exp_end
        ends = (self.exp_end.get(first), exp_end)
        # one entry per device for decide's timeline: the device frees when its last tenant ends
        self.running[first] = RunningRun(str(first), (d,), None if None in ends else max(ends),  # type: ignore[type-var]
                                         self.jobs[first].owner)
        self.used_mem += min(j.peak_bytes, g.memory_bytes)
        self.placed_on[g.model] = self.placed_on.get(g.model, 0) + 1
        self.since[jid] = t_now
        self.joins += 1
        self.retune(d, t_now)

    def leave_shared(self, jid: int, d: int, t0: float, t_now: float) -> None:
        """``jid`` leaves device ``d``, which keeps its other tenant (still busy, still one busy GPU)."""
        ten = self.tenants[d]
        ten.remove(jid)
        other = ten[0]
        self.prog.pop(jid, None)
        self.retune(d, t_now)
        j = self.jobs[jid]
        t = self.p.type_of[d]
        if jid in self.wasted:
            self.wasted.discard(jid)
            self.wasting -= 1
        self.used_mem -= min(j.peak_bytes, self.groups[t].memory_bytes)
        self.held_s[jid] += t_now - t0
        self.running.pop(jid, None)
        self.running[other] = RunningRun(str(other), (d,), self.exp_end.get(other), self.jobs[other].owner)
        self.single.setdefault((t, self.jobs[other].model_class), {})[d] = (
            packing.reservation_bytes(self.est[other], joining=False) or 0)

    def retune(self, d: int, t_now: float) -> None:
        """Bring the tenants of ``d`` up to ``t_now`` at their old rates, then set each one's rate (solo, or
        solo x its pair ratio while two that will not OOM share) and reschedule its end."""
        ten = self.tenants[d]
        live = [k for k in ten if k in self.prog]
        shared = len(ten) == 2 and len(live) == 2
        model = self.p.model_of_device[d]
        for k in live:
            p = self.prog[k]
            p[0] = max(0.0, p[0] - p[1] * (t_now - p[2]))
            p[2] = t_now
            cls = self.jobs[k].model_class
            r = 1.0
            if shared:
                other = self.jobs[ten[1] if ten[0] == k else ten[0]].model_class
                r = pair_ratio(self.ratios, cls, other, self.opt.slowdown_scale)
                self.pair_obs.setdefault(k, {})[packing.pair_type(cls, other, model)] = r
            p[1] = self.true_speed[cls][model] * r
            end = t_now + p[0] / p[1]
            info = self.run_info[k]
            self.run_info[k] = info[:3] + (end,) + info[4:]
            self.end_seq[k] = self.push(end, 0, k)

    # ------------------------------------------------------------------ Tiresias 2D-LAS (preemptive)
    def las_queue(self, jid: int) -> int:
        return 0 if self.attained[jid] < self.opt.las_threshold_gpu_s else 1

    def las_insert(self, jid: int) -> None:
        bisect.insort(self.las_waiting[self.las_queue(jid)], (self.jobs[jid].submit_s, jid))

    def schedule_las(self, t_now: float) -> None:
        opt = self.opt
        t0 = time.perf_counter()
        # attained service of running jobs up to now; demotion ticks for the high-queue ones
        for jid in list(self.run_info):
            n = len(self.run_info[jid][1])
            self.attained[jid] += n * (t_now - self.since[jid])
            self.last_exec[jid] += t_now - self.since[jid]
            self.since[jid] = t_now
        # promotion (starvation guard): low-queue waiting jobs that waited knob x their executed time
        if opt.las_promote_knob is not None and self.las_waiting[1]:
            keep = []
            for sub, jid in self.las_waiting[1]:
                if self.last_exec[jid] > 0 and t_now - self.since[jid] >= opt.las_promote_knob * self.last_exec[jid]:
                    self.attained[jid] = 0.0
                    self.last_exec[jid] = 0.0
                    bisect.insort(self.las_waiting[0], (sub, jid))
                else:
                    keep.append((sub, jid))
            self.las_waiting[1] = keep
        free = set(self.free)
        ffree = frozenset(free)
        tries = 0
        for q in (0, 1):
            started = []
            blocked: list[tuple[int, int]] = []
            for sub, jid in self.las_waiting[q]:
                run = self.queued(jid)
                if not free and (q == 1 or tries >= 16):
                    break
                if any(run.num_gpus >= n0 and run.needed_bytes >= b0 for n0, b0 in blocked):
                    devs = None
                else:
                    devs = self.place_on(run, ffree) if len(free) >= run.num_gpus else None
                    if devs is None and len(free) >= run.num_gpus:
                        blocked.append((run.num_gpus, run.needed_bytes))
                if devs is None and q == 0 and tries < 16:
                    tries += 1
                    devs = self.preempt_for(run, free, t_now)
                    if devs is not None:
                        blocked.clear()       # preemption freed devices: earlier misfits may fit now
                if devs is None:
                    continue
                free.difference_update(devs)
                ffree = frozenset(free)
                overhead = opt.checkpoint_s if self.restarts[jid] else 0.0
                self.start(jid, devs, t_now, overhead)
                self.since[jid] = t_now
                started.append((sub, jid))
            if started:
                gone = set(started)
                self.las_waiting[q] = [e for e in self.las_waiting[q] if e not in gone]
        self.latencies.append(time.perf_counter() - t0)
        self.decisions += 1

    def preempt_for(self, run: QueuedRun, free: set, t_now: float) -> tuple | None:
        """Preempt low-queue jobs (latest submitted first) until ``run`` fits; None when it cannot."""
        victims = sorted((jid for jid in self.run_info if self.las_queue(jid) == 1),
                         key=lambda jid: self.jobs[jid].submit_s, reverse=True)
        if not victims:
            return None
        def hyp(k: int) -> frozenset:
            pool = set(free)
            for v in victims[:k]:
                pool.update(self.run_info[v][1])
            return frozenset(pool)

        if self.place_on(run, hyp(len(victims))) is None:
            return None
        lo, hi = 1, len(victims)             # fewest victims (latest first) that make room
        while lo < hi:
            mid = (lo + hi) // 2
            if self.place_on(run, hyp(mid)) is not None:
                hi = mid
            else:
                lo = mid + 1
        chosen = self.place_on(run, hyp(lo))
        if chosen is None:  # place_on is deterministic: the search ends on a count of victims it placed
            return None
        used = victims[:lo]
        cs = set(chosen)
        for v in used:
            devs = self.run_info[v][1]
            if cs.isdisjoint(devs):
                continue
            t, _, t0, end, oom, _terms, overhead = self.run_info[v]
            j = self.jobs[v]
            speed = self.true_speed[j.model_class][self.groups[t].model]
            if not oom:
                self.remaining[v] = max(0.0, self.remaining[v] - max(0.0, t_now - t0 - overhead) * speed)
            self.attained[v] += len(devs) * (t_now - self.since[v])
            self.stop(v, t_now)
            free.update(devs)
            self.preemptions += 1
            self.restarts[v] += 1
            self.since[v] = t_now
            self.last_exec[v] = 0.0
            self.las_insert(v)
        return chosen

    # ------------------------------------------------------------------ results
    def result(self, last_t: float) -> SimResult:
        jobs = self.jobs
        n = len(jobs)
        done = [i for i in range(n) if not math.isnan(self.finish[i])]
        jct = {i: self.finish[i] - jobs[i].submit_s for i in done}
        qd = {i: max(0.0, jct[i] - self.held_s[i]) for i in done}
        jcts = sorted(jct.values())
        queues = sorted(qd.values())
        by_gang: dict[int, dict[str, float]] = {}
        for b in GANG_BUCKETS:
            hi = GANG_BUCKETS[GANG_BUCKETS.index(b) + 1] if b != GANG_BUCKETS[-1] else math.inf
            ids = [i for i in done if b <= jobs[i].num_gpus < hi]
            if ids:
                by_gang[b] = {
                    "jobs": len(ids),
                    "avg_jct_s": sum(jct[i] for i in ids) / len(ids),
                    "p99_queue_s": _quantile(sorted(qd[i] for i in ids), 0.99),
                    "avg_queue_s": sum(qd[i] for i in ids) / len(ids),
                }
        t_first = jobs[0].submit_s if jobs else 0.0
        makespan = last_t - t_first
        g = self.p.n
        win = self.win[1] - self.win[0]
        lat = sorted(self.latencies)
        queue = "tiresias 2D-LAS, preemptive" if self.preemptive else (
            f"{self.order}+{self.backfill}" + (f"+CA{self.window}" if self.window > 1 else "")
            + (f"+wait{self.wait_margin:g}" if self.wait_margin is not None else "")
            + (f"+gangs{self.opt.gang_first_s / 3600:g}h" if self.opt.gang_first_s is not None and self.order == "sjf"
               else ""))
        return SimResult(
            policy=self.policy_name, queue=queue, headroom=self.threshold, jobs=n, completed=len(done),
            rejected=self.rejected, failed=self.failed,
            avg_jct_s=sum(jcts) / len(jcts) if jcts else 0.0, p99_jct_s=_quantile(jcts, 0.99),
            avg_queue_s=sum(queues) / len(queues) if queues else 0.0, p99_queue_s=_quantile(queues, 0.99),
            makespan_s=makespan,
            gpu_utilization=self.busy_s / (g * makespan) if makespan else 0.0,
            gpu_utilization_steady=self.steady_busy_s / (g * win) if win > 0 else 0.0,
            useful_utilization_steady=(self.steady_busy_s - self.steady_waste_s) / (g * win) if win > 0 else 0.0,
            memory_utilization=self.used_mem_s / self.alloc_mem_s if self.alloc_mem_s else 0.0,
            oom_failures=self.ooms, preemptions=self.preemptions, decisions=self.decisions,
            decision_us_median=1e6 * lat[len(lat) // 2] if lat else 0.0,
            wall_s=time.perf_counter() - self.wall0, by_gang=by_gang, jcts=jcts,
            timeline=_bin_timeline(self.timeline, t_first, t_first + makespan, g, self.opt.timeline_points),
            placed_on=self.placed_on, joins=self.joins, pair_ooms=self.pair_ooms, barred_pairs=sorted(self.barred),
        )


def _quantile(sorted_values: list[float], q: float) -> float:
    """Nearest-rank quantile of an ascending list (0 when empty)."""
    if not sorted_values:
        return 0.0
    k = max(0, min(len(sorted_values) - 1, math.ceil(q * len(sorted_values)) - 1))
    return sorted_values[k]


def _bin_timeline(steps: list[tuple[float, int]], t0: float, t1: float, gpus: int, points: int) -> list[tuple[float, float]]:
    """Time-weighted mean busy fraction in ``points`` equal bins of [t0, t1]; (bin start - t0, fraction)."""
    if t1 <= t0 or points <= 0:
        return []
    width = (t1 - t0) / points
    acc = [0.0] * points
    for (ta, busy), (tb, _) in zip(steps, steps[1:] + [(t1, 0)]):
        ta, tb = max(ta, t0), min(tb, t1)
        if tb <= ta or not busy:
            continue
        b0 = min(points - 1, int((ta - t0) / width))
        b1 = min(points - 1, int((tb - t0) / width))
        for b in range(b0, b1 + 1):
            lo, hi = max(ta, t0 + b * width), min(tb, t0 + (b + 1) * width)
            if hi > lo:
                acc[b] += busy * (hi - lo)
    return [(i * width, acc[i] / (width * gpus)) for i in range(points)]
