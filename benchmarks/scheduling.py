"""Scheduling benchmark: autodl's queue and placement against baselines on the Philly trace, with 95% confidence intervals.

Run from the repository root::

    .venv/bin/python benchmarks/scheduling.py              # everything (see the wall time it prints)
    .venv/bin/python benchmarks/scheduling.py --quick      # smoke run: one short slice, two replicas
    .venv/bin/python benchmarks/scheduling.py --tune       # the grid the queue constants were chosen on

What is compared (all with the same headroom, 0.85 of device memory, and the same information: the
memory estimate with the estimator's measured errors, expected runtimes with a log-normal error,
the catalog's assumed speeds; the simulator runs the true peaks and speeds):

- *same queue*: every placement policy under autodl's admission queue (shortest expected run first
  with aging, EASY backfill with a reservation for the head): isolates where runs go. ``autodl`` is
  rule_based placement with its wait-for-a-faster-device rule (the default); the others place by
  their rule on what is free now ("gavel + wait rule" shows Gavel-like with autodl's wait rule).
- *classic*: strict FIFO with first fit; Gavel-like under first come, first served with greedy
  backfill (the previous benchmark's discipline) and with EASY backfill; Tiresias 2D-LAS, preemptive
  with a checkpoint cost, as the reference for what preemption would buy.

Replicas: slice k = sorted Philly jobs [k x 10,000, (k+1) x 10,000); replica i runs evaluation slice
EVAL_SLICES[i] with seed i (memory errors, runtime errors, policy randomness). The queue constants and
the best-fit weight were tuned on TUNE_SLICES only (``--tune``), never on the evaluation slices.
Ratios are per replica (baseline JCT / autodl JCT, paired), mean and 95% t-interval.
"""

from __future__ import annotations

import argparse
import math
import multiprocessing as mp
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "plugins"))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "sim" / "src"))  # the simulator distribution (autodl-sim)

from autodl.policy.admission import AGING_S, WAIT_MARGIN  # noqa: E402
from autodl.policy.packing import MAX_TENANTS, MIN_SHARED_MEMORY_BYTES, SLOWDOWN_BAR  # noqa: E402
from autodl_sim import run_all  # noqa: E402
from autodl_sim.admission import CA_WINDOW, GANG_FIRST_S  # noqa: E402
from autodl_sim.engine import GANG_BUCKETS, LAS_THRESHOLD_GPU_S, SimOptions  # noqa: E402
from autodl_sim.report import SEED_UTILIZATION_CLAIM, SOURCES  # noqa: E402

SLICE_JOBS = 10_000
TUNE_SLICES = (0, 2, 7)
"""Slices the constants are tuned on (never reported): slice 0 alone at first; widened to 0, 2 and 7
after the first evaluation showed slice 0 far more loaded than the evaluation slices (the best-fit
weight chosen on it, 8, lost to the old 0.3 on them) -- so that second choice saw one evaluation."""
EVAL_SLICES = (1, 3, 4, 5, 6)
SETTINGS = (("x1", 1.0, 1.0), ("x2", 2.0, 1.0), ("x4", 4.0, 1.0), ("pool/2", 1.0, 0.5), ("pool/4", 1.0, 0.25))
"""(name, load multiplier, pool scale)."""

T975 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262, 10: 2.228}
"""Two-sided 95% quantiles of Student's t by degrees of freedom (standard table)."""

BEST_FIT_FIRST = {"speed": 1.0, "cost": 0.2, "balance": 0.1, "best_fit": 8.0, "preferred": 1.0, "nvlink": 0.2}
"""rule_based's previous default weights (best fit first), chosen on the tuning slices when the memory
estimates were off by -97%..+6338%; shown as an ablation since the estimator's rebuild."""

SAME_QUEUE = {
    "autodl": ("rule_based", {}),
    "gavel_max_throughput": ("gavel_max_throughput", {"window": 1}),
    "best_fit_memory": ("best_fit_memory", {"window": 1}),
    "first_fit": ("fifo_first_fit", {"window": 1}),
    "random": ("random", {"window": 1}),
}
ABLATIONS = {
    "autodl + comp. advantage": ("rule_based", {"window": 4}),
    "rule_based, best_fit 8": ("rule_based", {"window": 1, "weights": BEST_FIT_FIRST}),
    "rl_based": ("rl_based", {}),
    "autodl, no wait rule": ("rule_based", {"wait_margin": None}),
    "gavel + wait rule": ("gavel_max_throughput", {"window": 1, "wait_margin": WAIT_MARGIN}),
    "autodl + gangs first 96h": ("rule_based", {"gang_first_s": GANG_FIRST_S}),
}
"""autodl's own variants: shown, not targets."""
CLASSIC = {
    "fifo_first_fit (strict)": ("fifo_first_fit", {"own_queue": True}),
    "gavel fcfs+greedy": ("gavel_max_throughput", {"order": "fcfs", "backfill": "greedy", "window": 1}),
    "gavel fcfs+easy": ("gavel_max_throughput", {"order": "fcfs", "backfill": "easy", "window": 1}),
    "tiresias_las": ("tiresias_las", {}),
}
SCHEDULERS = {**SAME_QUEUE, **ABLATIONS, **CLASSIC}


# ------------------------------------------------------------------------------------------ runs
def _run(task: tuple) -> tuple:
    """One replay in a worker: (key, summary dict)."""
    key, policy, overrides, start, jobs, seed, load, scale, extra = task
    opt = SimOptions(seed=seed, **overrides)
    r = run_all(start=start, jobs=jobs, seed=seed, load=load, pool_scale=scale, policies=[policy], options=opt,
                **extra)[0]
    return key, r.summary()


def run_tasks(tasks: list[tuple], workers: int) -> dict:
    """Run tasks (in ``workers`` processes when > 1); {key: summary}."""
    if workers <= 1:
        return dict(map(_run, tasks))
    with mp.get_context("fork").Pool(workers) as pool:
        return dict(pool.imap_unordered(_run, tasks, chunksize=1))


def ci(values: list[float]) -> tuple[float, float]:
    """(mean, half-width of the 95% t-interval); half-width nan for one value."""
    m = statistics.fmean(values)
    if len(values) < 2:
        return m, math.nan
    return m, T975.get(len(values) - 1, 1.96) * statistics.stdev(values) / math.sqrt(len(values))


def _fmt_ci(values: list[float], scale: float = 1.0, digits: int = 2) -> str:
    m, h = ci([v / scale for v in values])
    return f"{m:.{digits}f} ± {h:.{digits}f}" if not math.isnan(h) else f"{m:.{digits}f}"


def _ratio(base: list[float], ours: list[float]) -> tuple[float, float, float]:
    """Paired ratios base/ours: (mean, lo, hi) of the 95% interval."""
    rs = [b / o for b, o in zip(base, ours) if o > 0]
    m, h = ci(rs)
    return m, m - h, m + h


# ------------------------------------------------------------------------------------------ tables
def main_tables(res: dict, reps: list[tuple[int, int]], settings, schedulers, out) -> dict:
    """Print per-setting tables; returns the target verdicts."""
    verdicts: dict = {"jct": [], "gang": [], "gang_ablation": [], "oom": []}
    for sname, _load, _scale in settings:
        rows = {s: [res[(sname, s, i)] for i in range(len(reps))] for s in schedulers}
        ours = [r["avg_jct_s"] for r in rows["autodl"]]
        out(f"\n## {sname}: mean over {len(reps)} replicas ± 95% CI; ratio = scheduler's JCT / autodl's (paired)")
        head = (f"{'scheduler':26s}{'queue':24s}{'avg JCT h':>17s}{'ratio [95% CI]':>22s}{'p99 queue h':>16s}"
                f"{'OOM':>7s}{'rejected':>9s}{'util':>7s}{'useful':>8s}")
        out(head)
        out("-" * len(head))
        for s in schedulers:
            rs = rows[s]
            jct = [r["avg_jct_s"] for r in rs]
            m, lo, hi = _ratio(jct, ours)
            rtxt = "1 (reference)" if s == "autodl" else f"{m:.2f} [{lo:.2f}, {hi:.2f}]"
            out(f"{s:26s}{rs[0]['queue']:24s}{_fmt_ci(jct, 3600):>17s}{rtxt:>22s}"
                f"{_fmt_ci([r['p99_queue_s'] for r in rs], 3600, 1):>16s}"
                f"{statistics.fmean(r['oom_failures'] for r in rs):7.1f}{statistics.fmean(r['rejected'] for r in rs):9.1f}"
                f"{statistics.fmean(r['gpu_utilization_steady'] for r in rs):7.1%}"
                f"{statistics.fmean(r['useful_utilization_steady'] for r in rs):8.1%}")
            if s in SAME_QUEUE and s != "autodl" or s in CLASSIC and s != "tiresias_las":
                verdicts["jct"].append((sname, s, m, lo, hi))
        verdicts["oom"].append((sname, statistics.fmean(r["oom_failures"] for r in rows["autodl"])))
        if "fifo_first_fit (strict)" in rows:
            for who in [w for w in ("autodl", *ABLATIONS) if w in rows]:
                for g in (8, 16):
                    a = [r["by_gang"].get(g, {}).get("p99_queue_s") for r in rows[who]]
                    f = [r["by_gang"].get(g, {}).get("p99_queue_s") for r in rows["fifo_first_fit (strict)"]]
                    pairs = [(x, y) for x, y in zip(a, f) if x is not None and y]
                    if pairs:
                        verdicts["gang" if who == "autodl" else "gang_ablation"].append(
                            (sname, g, statistics.fmean(x for x, _ in pairs) / 3600,
                             statistics.fmean(y for _, y in pairs) / 3600, who))
    return verdicts


def gang_table(res: dict, reps, sname: str, schedulers, out) -> None:
    """Per gang size: average JCT and p99 queueing delay (hours), mean over replicas."""
    out(f"\n## {sname}, per gang size: avg JCT h / p99 queueing delay h (mean over replicas; jobs per replica)")
    head = f"{'scheduler':26s}" + "".join(f"{f'{g} GPU' + ('s+' if g == GANG_BUCKETS[-1] else ''):>16s}" for g in GANG_BUCKETS)
    out(head)
    out("-" * len(head))
    n = {g: [] for g in GANG_BUCKETS}
    for s in schedulers:
        cells = []
        for g in GANG_BUCKETS:
            vals = [res[(sname, s, i)]["by_gang"].get(g) for i in range(len(reps))]
            vals = [v for v in vals if v]
            if not vals:
                cells.append(f"{'-':>16s}")
                continue
            if s == "autodl":
                n[g] = [v["jobs"] for v in vals]
            cells.append(f"{statistics.fmean(v['avg_jct_s'] for v in vals) / 3600:>8.1f} /{statistics.fmean(v['p99_queue_s'] for v in vals) / 3600:>6.1f}")
        out(f"{s:26s}" + "".join(cells))
    out(f"{'(jobs)':26s}" + "".join(f"{statistics.fmean(n[g]) if n[g] else 0:>16.0f}" for g in GANG_BUCKETS))


# ------------------------------------------------------------------------------------------ placement latency
def placement_latency(out, sizes=(1_000, 10_000, 100_000), gangs=(1, 2, 4, 8)) -> dict:
    """Median ms of one ``place`` call by pool size and gang size, three ways (see the printed legend)."""
    from autodl.catalog import load_catalog
    from autodl.policy import place
    from autodl.spec import ResourcePolicySection
    from autodl.types import Device, Inventory, MemoryBreakdown, ResourceProfile
    from autodl_sim.inventory_index import apply_changes, indexed_partition

    cat = load_catalog()
    models = ["A100-SXM4-40GB", "V100-PCIE-32GB", "T4", "RTX-3090", "P100-PCIE-16GB"]
    prof = ResourceProfile(script="bench.py", params=25_000_000, peak_memory_bytes=9 * 2**30,
                           breakdown=MemoryBreakdown(weights_bytes=10**8, activations_bytes=6 * 2**30),
                           flops_per_step=3e12, batch_size=128)
    pol = ResourcePolicySection(preferred_devices=["A100-SXM4-40GB"])
    table = {}
    for devices in sizes:
        devs = []
        for i in range(devices):
            host, idx = divmod(i, 8)
            g = cat.get(models[host % len(models)])
            devs.append(Device(device_id=f"h{host}:{idx}", host=f"h{host}", index=idx, model=g.name, vendor=g.vendor,
                               memory_total_bytes=g.memory_bytes, memory_used_bytes=(i * 7919) % (2**32),
                               utilization_pct=float((i * 37) % 100), declared=True))
        inv = Inventory(source="benchmark", declared=True, devices=devs)
        calls = 11 if devices <= 10_000 else 5
        leases = [frozenset(f"h{h}:{c % 8}" for h in range(c % 3, devices // 8, 3)) for c in range(calls)]
        for n in gangs:
            def timed(inventory, leased):
                t = time.perf_counter()
                d = place(prof, inventory, catalog=cat, policy=pol, leased=leased, num_gpus=n,
                          partitioner=indexed_partition)
                return time.perf_counter() - t, d

            cold = [timed(inv.model_copy(), leases[0])[0] for _ in range(calls)]
            # incremental: each call sees a snapshot where 1% of the devices changed, updated in place of a rebuild
            cur = inv
            timed(cur, leases[0])
            inc = []
            size = None
            for c in range(calls):
                changed = [d.model_copy(update={"utilization_pct": float((c * 13 + k) % 100)})
                           for k, d in enumerate(cur.devices[c::100])]
                t = time.perf_counter()
                cur = apply_changes(cur, changed)
                dt = time.perf_counter() - t
                el, dec = timed(cur, leases[c])
                inc.append(dt + el)
                size = len(dec.model_dump_json())
            warm = [timed(inv, leased)[0] for leased in leases]
            table[(devices, n)] = (statistics.median(cold), statistics.median(inc), statistics.median(warm), size)
    out("\n## place() on the simulator's columnar index (autodl_sim.inventory_index): median ms per call (pool of mixed "
        "8-GPU hosts; this machine, 2 shared cores under load)")
    out("cold = a new snapshot each call (columnar index built); incremental = each call's snapshot has 1% of the "
        "devices changed, applied to the previous index (apply_changes) and timed together with place(); "
        "warm = the same snapshot with new leases")
    head = f"{'devices':>9s}{'gang':>6s}{'cold ms':>10s}{'incr ms':>10s}{'warm ms':>10s}{'decision KB':>13s}"
    out(head)
    out("-" * len(head))
    for (devices, n), (c, i, w, size) in table.items():
        out(f"{devices:>9,d}{n:>6d}{c * 1e3:>10.2f}{i * 1e3:>10.2f}{w * 1e3:>10.2f}{size / 1024:>13.1f}")
    return table


# ------------------------------------------------------------------------------------------ tuning
TUNE_GRID = {
    "aging_h": (96, 192),
    "best_fit": (0.25, 1.0, 2.0, 8.0),
    "wait_margin": (None, WAIT_MARGIN),
    "gang_first_h": (None, GANG_FIRST_S / 3600.0),
}
"""The grid ``--tune`` searches, every combination: the queue's aging, the rule weight ``best_fit``
against speed 1, the wait-for-a-faster-device rule (off or :data:`WAIT_MARGIN`) and big gangs first (off
or after :data:`GANG_FIRST_S`). History: the first tuning, on slice 0 with seeds 0-2, also had aging 24 h
and a comparative-advantage window of 4, worse in 15 of 16 cells (the window stays 1, ``CA_WINDOW``);
aging 48 h was in the grid until 2026-12-01 and never within 2% of the best mean; the margins 0 and 0.1
and the gang waits 72 and 144 h were tried at the default weights on 2026-12-01 (0.25 and 96 h kept:
``WAIT_MARGIN``, ``GANG_FIRST_S``)."""


def tune(workers: int, out, jobs: int = SLICE_JOBS) -> None:
    """Every combination of :data:`TUNE_GRID` on the tuning slices only (:data:`TUNE_SLICES`, seed = slice
    number, loads x1 and x2), and the rule that picks the defaults from it: the lowest mean JCT among the
    settings whose p99 queueing delay of 8- and 16-GPU jobs stays within 2x FIFO's on every slice and load;
    when none does, among the settings within 2% of the best mean (the replicas' noise), the lowest such
    ratio. Also Tiresias' queue threshold (its own baseline)."""
    from autodl.policy.scoring import DEFAULT_WEIGHTS

    grid = [(a * 3600.0, bf, wm, None if gh is None else gh * 3600.0)
            for a in TUNE_GRID["aging_h"] for bf in TUNE_GRID["best_fit"]
            for wm in TUNE_GRID["wait_margin"] for gh in TUNE_GRID["gang_first_h"]]
    las = (3600.0, 4 * 3600.0, 16 * 3600.0)
    seeds, loads = TUNE_SLICES, (1.0, 2.0)      # seed = slice
    tasks = []
    for sd in seeds:
        start = sd * SLICE_JOBS
        for load in loads:
            tasks.append((("fifo", sd, load), "fifo_first_fit", {"own_queue": True}, start, jobs, sd, load, 1.0, {}))
            for key in grid:
                a, bf, wm, gf = key
                over = {"aging_s": a, "wait_margin": wm, "gang_first_s": gf, "weights": {**DEFAULT_WEIGHTS, "best_fit": bf}}
                tasks.append(((*key, sd, load), "rule_based", over, start, jobs, sd, load, 1.0, {}))
            for th in las:
                tasks.append((("las", th, sd, load), "tiresias_las", {"las_threshold_gpu_s": th}, start, jobs, sd, load,
                              1.0, {}))
    res = run_tasks(tasks, workers)
    out(f"# tuning slices {seeds} of {jobs:,d} jobs (seed = slice), loads {loads}: mean avg JCT h; "
        "worst ratio of the p99 queueing delay of 8-/16-GPU jobs to FIFO's (over slices and loads)")
    out(f"{'aging h':>8s}{'best_fit':>9s}{'wait':>6s}{'gangs h':>8s}{'JCT x1':>8s}{'JCT x2':>8s}{'mean':>8s}"
        f"{'gang p99/FIFO':>15s}")
    scored = []
    for key in grid:
        a, bf, wm, gf = key
        by_load = [statistics.fmean(res[(*key, sd, load)]["avg_jct_s"] for sd in seeds) / 3600 for load in loads]
        worst = 0.0
        for sd in seeds:
            for load in loads:
                for g in (8, 16):
                    ours = res[(*key, sd, load)]["by_gang"].get(g, {}).get("p99_queue_s")
                    ff = res[("fifo", sd, load)]["by_gang"].get(g, {}).get("p99_queue_s")
                    if ours is not None and ff:
                        worst = max(worst, ours / ff)
        j = statistics.fmean(by_load)
        scored.append((j, worst, key))
        out(f"{a / 3600:>8.0f}{bf:>9.2f}{'-' if wm is None else f'{wm:g}':>6s}{'-' if gf is None else f'{gf / 3600:g}':>8s}"
            f"{by_load[0]:>8.2f}{by_load[1]:>8.2f}{j:>8.2f}{worst:>15.2f}")
    ok = [x for x in scored if x[1] <= 2.0]
    if ok:
        best = min(ok, key=lambda x: x[0])
    else:
        top = min(x[0] for x in scored)
        best = min((x for x in scored if x[0] <= 1.02 * top), key=lambda x: (x[1], x[0]))
    a, bf, wm, gf = best[2]
    out(f"pick ({'the lowest mean within the gang target' if ok else 'no setting meets the gang target on every slice: within 2% of the best mean, the lowest gang ratio'}): "
        f"aging {a / 3600:.0f} h, best_fit {bf:g}, wait {wm}, gangs first {None if gf is None else f'{gf / 3600:g} h'} "
        f"(mean {best[0]:.2f} h, gang ratio {best[1]:.2f}); in the code: AGING_S {AGING_S / 3600:.0f} h, "
        f"best_fit {DEFAULT_WEIGHTS['best_fit']:g}, wait {WAIT_MARGIN:g} for autodl's policies, gangs first off")
    for th in las:
        j = statistics.fmean(res[("las", th, sd, load)]["avg_jct_s"] for sd in seeds for load in loads) / 3600
        out(f"tiresias_las threshold {th / 3600:.0f} GPU-h: mean avg JCT {j:.2f} h (in the code: "
            f"{LAS_THRESHOLD_GPU_S / 3600:.0f} GPU-h)")


# ------------------------------------------------------------------------------------------ packing (issue 24)
PACKING_SETTINGS = tuple(x for x in SETTINGS if x[0] in ("x1", "x2", "x4", "pool/2"))
PACKED = {"sharing": "packed"}
PACKING_ROWS = {
    "autodl + packing": ("rule_based", PACKED),
    "autodl exclusive": ("rule_based", {}),
    "gavel exclusive": ("gavel_max_throughput", {"window": 1}),
    "tiresias_las": ("tiresias_las", {}),
    "gavel + packing": ("gavel_max_throughput", {"window": 1, **PACKED}),
    "blind packing": ("rule_based", {**PACKED, "pack_blind": True}),
    "autodl + packing, slow x1.5": ("rule_based", {**PACKED, "slowdown_scale": 1.5}),
    "autodl + packing, slow x2": ("rule_based", {**PACKED, "slowdown_scale": 2.0}),
}
"""The rows of ``--packing``: autodl's queue and rule_based placement with packing (the product's rule,
``autodl.policy.packing``), the exclusive runs it is compared with, Gavel-like with the same packing,
packing without the estimate, and the interference scaled up."""
PACKING_JCT_NEED = {"x1": 0.98, "x2": 1.05, "x4": 1.10, "pool/2": 1.10}
"""Issue 24's mean JCT ratio targets (exclusive baseline / autodl + packing); at x4 and pool/2 the 95%
interval must also lie above 1."""


def _packing_table(res: dict, reps, sname: str, out) -> list[tuple]:
    """One setting's rows; returns (baseline, mean, lo, hi) of the JCT ratios against autodl + packing."""
    ours = [res[(sname, "autodl + packing", i)]["avg_jct_s"] for i in range(len(reps))]
    out(f"\n## {sname}: mean over {len(reps)} replicas ± 95% CI; ratio = row's JCT / autodl + packing's (paired)")
    head = (f"{'scheduler':30s}{'avg JCT h':>17s}{'ratio [95% CI]':>22s}{'p99 queue h':>14s}{'OOM':>7s}"
            f"{'pair OOM':>9s}{'joins':>8s}{'util':>7s}")
    out(head)
    out("-" * len(head))
    found = []
    for s in PACKING_ROWS:
        rs = [res[(sname, s, i)] for i in range(len(reps))]
        jct = [r["avg_jct_s"] for r in rs]
        m, lo, hi = _ratio(jct, ours)
        rtxt = "1 (reference)" if s == "autodl + packing" else f"{m:.3f} [{lo:.3f}, {hi:.3f}]"
        out(f"{s:30s}{_fmt_ci(jct, 3600):>17s}{rtxt:>22s}{_fmt_ci([r['p99_queue_s'] for r in rs], 3600, 1):>14s}"
            f"{statistics.fmean(r['oom_failures'] for r in rs):7.1f}{statistics.fmean(r['pair_ooms'] for r in rs):9.1f}"
            f"{statistics.fmean(r['joins'] for r in rs):8.0f}{statistics.fmean(r['gpu_utilization_steady'] for r in rs):7.1%}")
        found.append((s, m, lo, hi))
    barred = sorted({b for i in range(len(reps)) for b in res[(sname, "autodl + packing", i)]["barred_pairs"]})
    out(f"pair types barred (measured below {SLOWDOWN_BAR:g}) in autodl + packing, any replica: {', '.join(barred) or '-'}")
    return found


def _gang_p99(res: dict, reps, sname: str, row: str, g: int) -> float | None:
    vals = [res[(sname, row, i)]["by_gang"].get(g, {}).get("p99_queue_s") for i in range(len(reps))]
    vals = [v for v in vals if v is not None]
    return statistics.fmean(vals) if vals else None


def packing_bench(workers: int, out, quick: bool) -> None:
    """``--packing``: issue 24's targets on the evaluation slices (see :data:`PACKING_ROWS`)."""
    jobs = 2_000 if quick else SLICE_JOBS
    reps = [(EVAL_SLICES[i], i) for i in range(2 if quick else len(EVAL_SLICES))]
    settings = PACKING_SETTINGS[:2] if quick else PACKING_SETTINGS
    out(f"# packing (issue 24): Philly slices {[s for s, _ in reps]} of {jobs:,d} jobs (replica i: slice, seed i); "
        f"pool autodl_sim/data/sim-pai-hetero.yaml scaled per setting; headroom 0.85")
    out(f"# nothing tuned: the rule's constants are the issue's (MAX_TENANTS {MAX_TENANTS}, SLOWDOWN_BAR "
        f"{SLOWDOWN_BAR:g}, devices >= {MIN_SHARED_MEMORY_BYTES / 1e9:g} GB NVIDIA); interference = Gavel's "
        "published P100 pair ratios (include/data/colocation-pairs.csv), classes mapped as autodl_sim.colocation says")
    tasks = []
    for sname, load, scale in settings:
        for s, (pol, over) in PACKING_ROWS.items():
            for i, (sl, seed) in enumerate(reps):
                tasks.append(((sname, s, i), pol, over, sl * SLICE_JOBS, jobs, seed, load, scale, {}))
    t0 = time.perf_counter()
    res = run_tasks(tasks, workers)
    wall = time.perf_counter() - t0
    verdicts = []
    for sname, _load, _scale in settings:
        found = _packing_table(res, reps, sname, out)
        verdicts.append((sname, found))
        for g in (8, 16):
            a = _gang_p99(res, reps, sname, "autodl + packing", g)
            b = _gang_p99(res, reps, sname, "autodl exclusive", g)
            if a is not None and b:
                out(f"p99 queueing of {g}-GPU jobs: packing {a / 3600:.1f} h vs exclusive autodl {b / 3600:.1f} h: "
                    f"ratio {a / b:.2f} (needs <= 1.2) {'MET' if a <= 1.2 * b else 'NOT MET'}")
    _packing_targets(res, reps, verdicts, out)
    out(f"\nwall time: simulations {wall:.0f} s ({len(tasks)} replays, {workers} processes)")


def _packing_targets(res: dict, reps, verdicts: list, out) -> None:
    """Issue 24's targets, met or not, from the tables' ratios (:data:`PACKING_JCT_NEED`)."""
    out("\n## targets (ratio = exclusive baseline's mean JCT / autodl + packing's, paired per replica)")
    for sname, found in verdicts:
        need = PACKING_JCT_NEED[sname]
        for s, m, lo, hi in found:
            if s not in ("gavel exclusive", "tiresias_las"):
                continue
            ok = m >= need and (lo > 1.0 if sname in ("x4", "pool/2") else True)
            out(f"{'MET ' if ok else 'NOT '} {sname:7s} vs {s:16s} {m:.3f} [{lo:.3f}, {hi:.3f}] (needs >= {need:.2f}"
                f"{' and CI above 1' if sname in ('x4', 'pool/2') else ''})")
        excl = next(f for f in found if f[0] == "autodl exclusive")
        out(f"      {sname:7s} autodl exclusive / autodl + packing {excl[1]:.3f} [{excl[2]:.3f}, {excl[3]:.3f}] (no target)")
        o = statistics.fmean(res[(sname, "autodl + packing", i)]["oom_failures"] for i in range(len(reps)))
        oe = statistics.fmean(res[(sname, "autodl exclusive", i)]["oom_failures"] for i in range(len(reps)))
        ob = statistics.fmean(res[(sname, "blind packing", i)]["pair_ooms"] for i in range(len(reps)))
        op = statistics.fmean(res[(sname, "autodl + packing", i)]["pair_ooms"] for i in range(len(reps)))
        out(f"{'MET ' if op == 0 else 'NOT '} {sname:7s} pair OOMs with the estimate {op:.1f} per replica (needs 0; all OOMs "
            f"{o:.1f}, exclusive autodl's {oe:.1f}); blind packing pair OOMs {ob:.1f}")
        ex = [res[(sname, "autodl exclusive", i)]["avg_jct_s"] for i in range(len(reps))]
        cells = []
        for sc, row in (("1", "autodl + packing"), ("1.5", "autodl + packing, slow x1.5"), ("2", "autodl + packing, slow x2")):
            m, lo, hi = _ratio(ex, [res[(sname, row, i)]["avg_jct_s"] for i in range(len(reps))])
            cells.append(f"slowdown x{sc}: {m:.3f} [{lo:.3f}, {hi:.3f}]")
        out(f"      {sname:7s} sensitivity, exclusive autodl / packing: " + "; ".join(cells))


# ------------------------------------------------------------------------------------------ main
def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="smoke run: 2,000-job slices, 2 replicas, loads x1 and x2")
    ap.add_argument("--tune", action="store_true", help="print the tuning grid (tuning slice only) and exit")
    ap.add_argument("--workers", type=int, default=min(2, os.cpu_count() or 1), help="processes (default 2)")
    ap.add_argument("--no-latency", action="store_true", help="skip the place() latency table")
    ap.add_argument("--packing", action="store_true", help="issue 24: packing vs exclusive (see PACKING_ROWS) and exit")
    args = ap.parse_args()
    out = lambda s="": print(s, flush=True)  # noqa: E731
    t0 = time.perf_counter()
    if args.packing:
        packing_bench(args.workers, out, args.quick)
        return 0
    if args.tune:
        tune(args.workers, out, jobs=2_000 if args.quick else SLICE_JOBS)
        out(f"\nwall time {time.perf_counter() - t0:.0f} s")
        return 0

    jobs = 2_000 if args.quick else SLICE_JOBS
    reps = [(EVAL_SLICES[i], i) for i in range(2 if args.quick else len(EVAL_SLICES))]
    settings = SETTINGS[:2] if args.quick else SETTINGS
    schedulers = SCHEDULERS
    out(f"# Philly slices {[s for s, _ in reps]} of {jobs:,d} jobs (replica i: slice, seed i); tuned on slices "
        f"{TUNE_SLICES} only")
    out(f"# pool autodl_sim/data/sim-pai-hetero.yaml (560 GPUs) scaled per setting; headroom 0.85 for every scheduler; "
        f"queue constants: aging {AGING_S / 3600:.0f} h, comparative-advantage window {CA_WINDOW}; autodl's wait "
        f"margin {WAIT_MARGIN:g}")
    tasks = []
    for sname, load, scale in settings:
        for s, (pol, over) in schedulers.items():
            for i, (sl, seed) in enumerate(reps):
                tasks.append(((sname, s, i), pol, over, sl * SLICE_JOBS, jobs, seed, load, scale, {}))
    # headroom cost, runtime-estimate sensitivity, learning with wrong catalog figures
    extra_settings = settings[:2]
    for sname, load, scale in extra_settings:
        for i, (sl, seed) in enumerate(reps):
            tasks.append(((sname, "autodl, no headroom (1.0)", i), "rule_based", {"memory_threshold": 1.0},
                          sl * SLICE_JOBS, jobs, seed, load, scale, {}))
            for sig in (0.0, 2.0, math.inf):
                for s in ("autodl", "gavel_max_throughput"):
                    pol, over = SCHEDULERS[s]
                    tasks.append(((sname, f"{s} sigma={sig:g}", i), pol, over, sl * SLICE_JOBS, jobs, seed, load, scale,
                                  {"runtime_sigma": sig}))
            for s in ("autodl", "gavel_max_throughput"):
                pol, over = SCHEDULERS[s]
                tasks.append(((sname, f"{s} per-class speeds", i), pol, {**over, "seen_by_class": True},
                              sl * SLICE_JOBS, jobs, seed, load, scale, {}))
    speed_sigmas = (0.0, 0.5, 1.0)
    for sig in speed_sigmas:
        for s in ("autodl", "rl_based"):
            pol, over = SCHEDULERS[s]
            for i, (sl, seed) in enumerate(reps):
                tasks.append((("x1", f"{s} catalog sigma={sig:g}", i), pol, over, sl * SLICE_JOBS, jobs, seed, 1.0, 1.0,
                              {"speed_sigma": sig}))
    res = run_tasks(tasks, args.workers)
    sim_wall = time.perf_counter() - t0

    verdicts = main_tables(res, reps, settings, schedulers, out)
    for sname in [s for s, _, _ in settings][:2]:
        gang_table(res, reps, sname, ["autodl", "gavel_max_throughput", "best_fit_memory", "rule_based, best_fit 8",
                                      "autodl, no wait rule", "gavel + wait rule", "autodl + gangs first 96h",
                                      "fifo_first_fit (strict)", "gavel fcfs+greedy", "tiresias_las"], out)

    out("\n## headroom: autodl planning within 0.85 of device memory vs 1.0 (OOM = attempts killed by an OOM)")
    for sname, _, _ in extra_settings:
        a = [res[(sname, "autodl", i)] for i in range(len(reps))]
        b = [res[(sname, "autodl, no headroom (1.0)", i)] for i in range(len(reps))]
        m, lo, hi = _ratio([r["avg_jct_s"] for r in a], [r["avg_jct_s"] for r in b])
        out(f"{sname}: OOM {statistics.fmean(r['oom_failures'] for r in a):.1f} (0.85) vs "
            f"{statistics.fmean(r['oom_failures'] for r in b):.1f} (1.0); rejected {statistics.fmean(r['rejected'] for r in a):.0f} vs "
            f"{statistics.fmean(r['rejected'] for r in b):.0f}; JCT(0.85)/JCT(1.0) = {m:.3f} [{lo:.3f}, {hi:.3f}]")

    out("\n## expected-runtime error (sigma of the log-normal; inf = runtimes unknown to the queue): avg JCT h")
    for sname, _, _ in extra_settings:
        for s in ("autodl", "gavel_max_throughput"):
            cells = [f"default: {_fmt_ci([res[(sname, s, i)]['avg_jct_s'] for i in range(len(reps))], 3600)}"]
            for sig in (0.0, 2.0, math.inf):
                cells.append(f"sigma={sig:g}: {_fmt_ci([res[(sname, f'{s} sigma={sig:g}', i)]['avg_jct_s'] for i in range(len(reps))], 3600)}")
            out(f"{sname} {s:22s} " + "; ".join(cells))

    out("\n## more information: every policy sees each job's own speed per device model (its class's row of the "
        "measured matrix, as Gavel's throughput matrix assumes) instead of the catalog's figures; avg JCT h")
    for sname, _, _ in extra_settings:
        a = [res[(sname, "autodl per-class speeds", i)]["avg_jct_s"] for i in range(len(reps))]
        b = [res[(sname, "gavel_max_throughput per-class speeds", i)]["avg_jct_s"] for i in range(len(reps))]
        m, lo, hi = _ratio(b, a)
        out(f"{sname}: autodl {_fmt_ci(a, 3600)} h, gavel_max_throughput {_fmt_ci(b, 3600)} h, "
            f"ratio gavel/autodl {m:.3f} [{lo:.3f}, {hi:.3f}]")

    out("\n## learning: rl_based (LinUCB rewarded with the measured speed) vs rule_based when the catalog's speed "
        "figures are off by exp(N(0, sigma)) per device model; x1; ratio = rule JCT / rl JCT")
    for sig in speed_sigmas:
        a = [res[("x1", f"autodl catalog sigma={sig:g}", i)]["avg_jct_s"] for i in range(len(reps))]
        b = [res[("x1", f"rl_based catalog sigma={sig:g}", i)]["avg_jct_s"] for i in range(len(reps))]
        m, lo, hi = _ratio(a, b)
        out(f"sigma {sig:g}: rule {_fmt_ci(a, 3600)} h, rl {_fmt_ci(b, 3600)} h, rule/rl {m:.3f} [{lo:.3f}, {hi:.3f}]")

    out("\n## targets")
    for sname, s, m, lo, hi in verdicts["jct"]:
        need = 1.1 if sname in ("x2", "x4") else 1.0
        ok = lo > 1.0 and m >= need
        out(f"{'MET ' if ok else 'NOT '} {sname:7s} autodl vs {s:26s} ratio {m:.2f} [{lo:.2f}, {hi:.2f}] "
            f"(needs CI above 1.0{' and >= 1.10' if need > 1 else ''})")
    for sname, g, ours, ff, _who in verdicts["gang"]:
        out(f"{'MET ' if ours <= 2 * ff else 'NOT '} {sname:7s} p99 queueing of {g}-GPU jobs: autodl {ours:.1f} h vs "
            f"FIFO {ff:.1f} h (needs <= 2x)")
    out("ablations (not the default; the same check): p99 queueing of 8-/16-GPU jobs / FIFO's")
    abl: dict = {}
    for sname, g, ours, ff, who in verdicts["gang_ablation"]:
        abl.setdefault(who, []).append(f"{sname} {g}: {ours / ff:.2f}{'' if ours <= 2 * ff else ' (over 2x)'}")
    for who, cells in abl.items():
        out(f"  {who:26s} " + ", ".join(cells))
    for sname, o in verdicts["oom"]:
        out(f"{'MET ' if o == 0 else 'NOT '} {sname:7s} OOM placements of autodl: {o:.1f} per replica (needs 0)")
    ff1 = [res[("x1", "fifo_first_fit (strict)", i)] for i in range(len(reps))]
    au1 = [res[("x1", "autodl", i)] for i in range(len(reps))]
    out(f"utilization (steady state: GPU-seconds held / pool GPU-seconds between the submits of the slice's 20% and "
        f"80% jobs; 'useful' leaves out attempts lost to OOM), x1: FIFO strict "
        f"{statistics.fmean(r['gpu_utilization_steady'] for r in ff1):.1%} -> autodl "
        f"{statistics.fmean(r['gpu_utilization_steady'] for r in au1):.1%}; the seed claimed "
        f"{SEED_UTILIZATION_CLAIM[0]:.0%} -> {SEED_UTILIZATION_CLAIM[1]:.0%} (whole-makespan figures in --json of "
        "autodl simulate)")
    if not args.no_latency:
        placement_latency(out, sizes=(1_000, 10_000) if args.quick else (1_000, 10_000, 100_000))
    out(f"\n{SOURCES}")
    out(f"wall time: simulations {sim_wall:.0f} s ({len(tasks)} replays, {args.workers} processes), "
        f"total {time.perf_counter() - t0:.0f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
