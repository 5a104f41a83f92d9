"""Event-driven replay of a job trace on a simulated pool under one placement policy.

Each device is exclusive to one job; a job needs ``num_gpus`` devices of one model (one host, or
whole hosts of that model when the gang is larger than a host). The policy sees the memory
*estimate*; a job placed where its *true* peak exceeds device memory OOMs after
``oom_detect_s`` (or its runtime if shorter), counts as an OOM failure, learns its true peak and
goes back to the queue keeping its submit order. Within a device model, hosts are packed (the
fullest host that holds the gang): policies choose the device model, the shared packer the host.
"""

from __future__ import annotations

import heapq
import math
import random
import time
from dataclasses import dataclass, field
from typing import Sequence

from autodl.catalog import Catalog
from autodl.policy.base import Need, Option, PolicyContext, get_policy
from autodl.policy.rl_based import REFERENCE_MODEL, LinUCB, features_from_terms
from autodl.simulate.pool import SimPool
from autodl.simulate.workload import SimJob

OOM_DETECT_S = 60.0
"""Seconds a job runs before an OOM kills it: model build plus the first steps, where the peak is
reached (assumption; a training OOM surfaces in the first iteration or the first evaluation)."""


WARMUP_FRACTION = 0.2
"""Share of a slice's first jobs left out of ``avg_jct_after_warmup_s``."""


@dataclass
class SimOptions:
    """Knobs of one replay.

    :ivar memory_threshold: headroom of policies that keep it (rule_based, rl_based).
    :ivar oom_detect_s: see :data:`OOM_DETECT_S`.
    :ivar allowed_vendors: vendors jobs may use; ``None`` = every vendor in the pool (the
        simulation assumes each job has a Paddle build for each).
    :ivar seed: seeds the policy's random draws.
    :ivar timeline_points: bins of the utilization-over-time series.
    """

    memory_threshold: float = 0.85
    oom_detect_s: float = OOM_DETECT_S
    allowed_vendors: tuple[str, ...] | None = None
    preferred_devices: tuple[str, ...] = ()
    tag_priorities: dict[str, float] = field(default_factory=dict)
    seed: int = 0
    timeline_points: int = 200


@dataclass
class SimResult:
    """What one replay measured. Times in seconds; utilizations 0..1.

    ``makespan_s`` = first submit to the last event (a finish, or an OOM after which the job
    fits nowhere); ``gpu_utilization`` = busy GPU-seconds (failed attempts included) / (pool GPUs x makespan);
    ``gpu_utilization_submit_window`` = the same between the first and the last submit (the
    makespan's tail, one long job draining, dilutes the first);
    ``avg_jct_after_warmup_s`` = mean JCT of the jobs after the slice's first
    :data:`WARMUP_FRACTION` (the rl_based bandit learns during those);
    ``memory_utilization`` = per-device true peak x devices, integrated over time, over the memory
    of the devices handed out, integrated over time (how much of what was allocated was used).
    """

    policy: str
    queue: str
    headroom: bool
    jobs: int
    completed: int
    rejected: int
    avg_jct_s: float
    p99_jct_s: float
    avg_queue_s: float
    avg_jct_after_warmup_s: float
    makespan_s: float
    gpu_utilization: float
    gpu_utilization_submit_window: float
    memory_utilization: float
    oom_failures: int
    decisions: int
    decision_us_median: float
    wall_s: float
    jcts: list[float] = field(default_factory=list, repr=False)
    timeline: list[tuple[float, float]] = field(default_factory=list, repr=False)
    placed_on: dict[str, int] = field(default_factory=dict)

    def summary(self) -> dict:
        """JSON-ready metrics without the per-job series."""
        d = {k: v for k, v in self.__dict__.items() if k not in ("jcts", "timeline")}
        return d


class _Type:
    """Run-time state of one host group: free devices per host, hosts bucketed by free count."""

    __slots__ = ("idx", "g", "k", "free", "by_free", "free_total", "total")

    def __init__(self, idx: int, g) -> None:
        self.idx, self.g, self.k = idx, g, g.gpus_per_host
        self.free = [self.k] * g.hosts
        self.by_free = [set() for _ in range(self.k + 1)]
        self.by_free[self.k] = set(range(g.hosts))
        self.free_total = self.total = g.gpus

    def can_take(self, n: int) -> bool:
        if n > self.free_total:
            return False
        bf, k = self.by_free, self.k
        if n <= k:
            for f in range(n, k + 1):
                if bf[f]:
                    return True
            return False
        full, rem = divmod(n, k)
        nfull = len(bf[k])
        if nfull < full:
            return False
        if rem == 0 or nfull > full:
            return True
        return any(bf[f] for f in range(rem, k))

    def _move(self, h: int, new: int) -> None:
        self.by_free[self.free[h]].discard(h)
        self.free[h] = new
        self.by_free[new].add(h)

    def take(self, n: int) -> list[tuple[int, int]]:
        bf, k = self.by_free, self.k
        out = []
        if n > k:
            full, n = divmod(n, k)
            hosts = sorted(bf[k])[:full]
            for h in hosts:
                self._move(h, 0)
                out.append((h, k))
        if n:
            for f in range(n, k + 1):
                if bf[f]:
                    h = min(bf[f])
                    self._move(h, f - n)
                    out.append((h, n))
                    break
        self.free_total -= sum(c for _, c in out)
        return out

    def release(self, alloc: list[tuple[int, int]]) -> None:
        for h, c in alloc:
            self._move(h, self.free[h] + c)
            self.free_total += c


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
    :param policy_name: a registered policy (:func:`autodl.policy.policy_names`).
    :param speeds: ``{model_class: {device model: throughput relative to V100}}``.
    :param catalog: for the reference price of the bandit's reward.
    :param options: knobs; defaults of :class:`SimOptions`.
    :returns: the measured :class:`SimResult`.
    :raises AutoDLError: on an unknown policy.
    """
    opt = options or SimOptions()
    wall0 = time.perf_counter()
    pol = get_policy(policy_name)
    threshold = opt.memory_threshold if pol.headroom else 1.0
    strict_fifo = pol.queue == "fifo"
    types = [_Type(i, g) for i, g in enumerate(pool.groups)]
    allowed = set(opt.allowed_vendors) if opt.allowed_vendors is not None else None
    bandit = LinUCB() if policy_name == "rl_based" else None
    ref = catalog.find(REFERENCE_MODEL)
    ref_cost = ref.cost_per_hour_usd if ref else None
    ctx = PolicyContext(
        preferred_devices=list(opt.preferred_devices), tag_priorities=dict(opt.tag_priorities),
        memory_threshold=opt.memory_threshold, rng=random.Random(opt.seed), bandit=bandit,
    )
    for t in types:
        for cls in speeds:
            if t.g.model not in speeds[cls]:
                raise ValueError(f"speeds lack device model {t.g.model} for class {cls}")

    n_jobs = len(jobs)
    est = [j.est_bytes for j in jobs]
    first_start = [math.nan] * n_jobs
    finish = [math.nan] * n_jobs
    waited = [0.0] * n_jobs
    enq_at = [0.0] * n_jobs
    running: dict[int, tuple[_Type, list[tuple[int, int]], dict | None]] = {}
    rejected = ooms = decisions = 0
    latencies: list[float] = []
    placed_on: dict[str, int] = {}

    def feasible(jid: int) -> tuple[int, ...]:
        j = jobs[jid]
        return tuple(
            t.idx for t in types
            if est[jid] <= threshold * t.g.memory_bytes and j.num_gpus <= t.total
            and (allowed is None or t.g.vendor in allowed)
        )

    buckets: dict[tuple, list] = {}   # (feasible types, n) -> heap of (submit, jid)

    def enqueue(jid: int, now: float) -> bool:
        f = feasible(jid)
        if not f:
            return False
        enq_at[jid] = now
        heapq.heappush(buckets.setdefault((f, jobs[jid].num_gpus), []), (jobs[jid].submit_s, jid))
        return True

    events: list[tuple[float, int, int, int]] = []   # (time, kind 0=end 1=arrive, seq, jid)
    seq = 0
    for j in jobs:
        events.append((j.submit_s, 1, seq, j.job_id))
        seq += 1
    heapq.heapify(events)
    idx_of = {j.job_id: i for i, j in enumerate(jobs)}

    busy = 0
    used_mem = alloc_mem = 0.0
    busy_s = used_mem_s = alloc_mem_s = busy_win_s = 0.0
    last_submit = jobs[-1].submit_s if jobs else 0.0
    last_t = jobs[0].submit_s if jobs else 0.0
    timeline: list[tuple[float, int]] = [(last_t, 0)]
    oom_pending: dict[int, bool] = {}

    def start(jid: int, t_now: float) -> bool:
        nonlocal busy, used_mem, alloc_mem, decisions, seq
        j = jobs[jid]
        n = j.num_gpus
        ft = feasible_cache[jid]
        cand = [types[i] for i in ft if types[i].can_take(n)]
        if not cand:
            return False
        t0 = time.perf_counter()
        if len(cand) == 1 and bandit is None:
            best, chosen_terms = cand[0], None
        else:
            opts = [
                Option(
                    devices=(t.idx,), model=t.g.model, vendor=t.g.vendor, host=t.g.model, num_devices=n,
                    memory_total_bytes=t.g.memory_bytes, step_time_s=j.duration_s / speeds[j.model_class][t.g.model],
                    cost_per_hour_usd=t.g.cost_per_hour_usd, load=1.0 - t.free_total / t.total, tags=t.g.tags, order=t.idx,
                )
                for t in cand
            ]
            scored = pol.score(Need(est[jid], n, str(j.job_id)), opts, ctx)
            bi = max(range(len(opts)), key=lambda i: (scored[i].score, -opts[i].order))
            best, chosen_terms = cand[bi], scored[bi].terms
        latencies.append(time.perf_counter() - t0)
        decisions += 1
        alloc = best.take(n)
        running[jid] = (best, alloc, chosen_terms)
        if math.isnan(first_start[jid]):
            first_start[jid] = t_now
        waited[jid] += t_now - enq_at[jid]
        busy += n
        mem = best.g.memory_bytes
        used_mem += min(j.peak_bytes, mem) * n
        alloc_mem += mem * n
        runtime = j.duration_s / speeds[j.model_class][best.g.model]
        oom = j.peak_bytes > mem
        end = t_now + (min(opt.oom_detect_s, runtime) if oom else runtime)
        oom_pending[jid] = oom
        heapq.heappush(events, (end, 0, seq, j.job_id))
        seq += 1
        placed_on[best.g.model] = placed_on.get(best.g.model, 0) + 1
        return True

    feasible_cache: dict[int, tuple[int, ...]] = {}

    def schedule(t_now: float) -> None:
        heads = [(h[0], key) for key, h in buckets.items() if h]
        heapq.heapify(heads)
        while heads:
            if busy >= total_gpus:
                return
            (_, jid), key = heapq.heappop(heads)
            h = buckets[key]
            if start(jid, t_now):
                heapq.heappop(h)
                if h:
                    heapq.heappush(heads, (h[0], key))
            elif strict_fifo:
                return

    total_gpus = pool.gpus
    while events:
        t_now = events[0][0]
        dt = t_now - last_t
        if dt > 0:
            if last_t < last_submit:
                busy_win_s += busy * (min(t_now, last_submit) - last_t)
            busy_s += busy * dt
            used_mem_s += used_mem * dt
            alloc_mem_s += alloc_mem * dt
            last_t = t_now
        while events and events[0][0] == t_now:
            _, kind, _, job_id = heapq.heappop(events)
            jid = idx_of[job_id]
            j = jobs[jid]
            if kind == 1:
                f = feasible(jid)
                feasible_cache[jid] = f
                if not enqueue(jid, t_now):
                    rejected += 1
                continue
            typ, alloc, terms = running.pop(jid)
            typ.release(alloc)
            busy -= j.num_gpus
            mem = typ.g.memory_bytes
            used_mem -= min(j.peak_bytes, mem) * j.num_gpus
            alloc_mem -= mem * j.num_gpus
            failed = oom_pending.pop(jid)
            if bandit is not None and terms is not None:
                reward = bandit.reward(speeds[j.model_class][typ.g.model], typ.g.cost_per_hour_usd, ref_cost, failed)
                bandit.update(typ.g.model, features_from_terms(terms, ctx.weights), reward)
            if failed:
                ooms += 1
                est[jid] = j.peak_bytes          # the failed attempt measured the true peak
                feasible_cache[jid] = feasible(jid)
                if not enqueue(jid, t_now):
                    rejected += 1
            else:
                finish[jid] = t_now
        schedule(t_now)
        if timeline[-1][1] != busy:
            timeline.append((t_now, busy))

    done = [i for i in range(n_jobs) if not math.isnan(finish[i])]
    jcts = sorted(finish[i] - jobs[i].submit_s for i in done)
    t_first = jobs[0].submit_s if jobs else 0.0
    warm = [finish[i] - jobs[i].submit_s for i in done if i >= int(WARMUP_FRACTION * n_jobs)]
    makespan = last_t - t_first   # until the last job left the pool (finished, or gave up after an OOM)
    lat_sorted = sorted(latencies)
    return SimResult(
        policy=policy_name,
        queue=pol.queue,
        headroom=pol.headroom,
        jobs=n_jobs,
        completed=len(done),
        rejected=rejected,
        avg_jct_s=sum(jcts) / len(jcts) if jcts else 0.0,
        p99_jct_s=_quantile(jcts, 0.99),
        avg_jct_after_warmup_s=sum(warm) / len(warm) if warm else 0.0,
        avg_queue_s=sum(waited[i] for i in done) / len(done) if done else 0.0,
        makespan_s=makespan,
        gpu_utilization=busy_s / (total_gpus * makespan) if makespan else 0.0,
        gpu_utilization_submit_window=(
            busy_win_s / (total_gpus * (last_submit - t_first)) if last_submit > t_first else 0.0
        ),
        memory_utilization=used_mem_s / alloc_mem_s if alloc_mem_s else 0.0,
        oom_failures=ooms,
        decisions=decisions,
        decision_us_median=1e6 * lat_sorted[len(lat_sorted) // 2] if lat_sorted else 0.0,
        wall_s=time.perf_counter() - wall0,
        jcts=jcts,
        timeline=_bin_timeline(timeline, t_first, t_first + makespan, total_gpus, opt.timeline_points),
        placed_on=placed_on,
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
