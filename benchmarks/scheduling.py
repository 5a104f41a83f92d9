"""Scheduling benchmark: every placement policy side by side on one Philly trace slice, plus decision latency and full-replay time.

Run from the repository root::

    .venv/bin/python benchmarks/scheduling.py            # table + latency + full 82k-job replay
    .venv/bin/python benchmarks/scheduling.py --quick    # table only

Targets (printed, never asserted): rule_based average JCT >= 1.5x better than FIFO first-fit, zero
OOM at threshold 0.85, no worse than Gavel-like; rl_based within 5% of rule_based after warm-up;
one placement among 10,000 devices <= 10 ms median; full replay <= 60 s.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "plugins"))

from autodl.catalog import load_catalog  # noqa: E402
from autodl.simulate import DEFAULT_POLICIES, run_all  # noqa: E402
from autodl.simulate.report import format_table, write_plot  # noqa: E402

SLICE_START = 20_000
SLICE_JOBS = 10_000
SEED = 0


def placement_latency(devices: int = 10_000, calls: int = 21) -> tuple[float, float]:
    """Median seconds of one ``place`` call among ``devices`` declared devices (8 per host, mixed models).

    Cold: every call gets a new ``Inventory`` object (a ``model_copy`` made outside the timer), so the
    call includes building its columnar index (:mod:`autodl.policy.inventory_index`), as when each
    decision reads a fresh snapshot. Warm: every call reuses one snapshot with a different ``leased``
    set, as a scheduler that keeps its snapshot while leases change; the index is built once before.

    :returns: (cold median, warm median), seconds.
    """
    from autodl.policy import place
    from autodl.spec import ResourcePolicySection
    from autodl.types import Device, Inventory, MemoryBreakdown, ResourceProfile

    cat = load_catalog()
    models = ["A100-SXM4-40GB", "V100-PCIE-32GB", "T4", "RTX-3090", "P100-PCIE-16GB"]
    devs = []
    for i in range(devices):
        host, idx = divmod(i, 8)
        g = cat.get(models[host % len(models)])
        devs.append(Device(device_id=f"h{host}:{idx}", host=f"h{host}", index=idx, model=g.name, vendor=g.vendor,
                           memory_total_bytes=g.memory_bytes, memory_used_bytes=(i * 7919) % (2**32),
                           utilization_pct=float((i * 37) % 100), declared=True))
    inv = Inventory(source="benchmark", declared=True, devices=devs)
    prof = ResourceProfile(script="bench.py", params=25_000_000, peak_memory_bytes=9 * 2**30,
                           breakdown=MemoryBreakdown(weights_bytes=10**8, activations_bytes=6 * 2**30),
                           flops_per_step=3e12, batch_size=128)
    pol = ResourcePolicySection(preferred_devices=["A100-SXM4-40GB"])
    leases = [frozenset(f"h{h}:{c % 8}" for h in range(c % 3, devices // 8, 3)) for c in range(calls)]

    def timed(inventory: Inventory, leased: frozenset[str]) -> float:
        t = time.perf_counter()
        place(prof, inventory, catalog=cat, policy=pol, leased=leased)
        return time.perf_counter() - t

    cold = [timed(inv.model_copy(), leases[0]) for _ in range(calls)]
    place(prof, inv, catalog=cat, policy=pol, leased=leases[0])   # builds inv's index
    warm = [timed(inv, leased) for leased in leases]
    return statistics.median(cold), statistics.median(warm)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="table only: skip latency and the full replay")
    ap.add_argument("--plot", default=None, help="PNG of JCT CDFs and utilization")
    args = ap.parse_args()

    print(f"# slice: sorted Philly jobs [{SLICE_START}, {SLICE_START + SLICE_JOBS}), seed {SEED}, "
          "estimate error +-15%, pool include/pools/sim-pai-hetero.yaml (560 GPUs)")
    results = run_all(start=SLICE_START, jobs=SLICE_JOBS, seed=SEED, policies=DEFAULT_POLICIES)
    print(format_table(results))
    by = {r.policy: r for r in results}
    rb, ff, gv, rl = by["rule_based"], by["fifo_first_fit"], by["gavel_max_throughput"], by["rl_based"]
    print()
    print("# targets")
    print(f"rule_based vs fifo_first_fit avg JCT: {ff.avg_jct_s / rb.avg_jct_s:.2f}x (target >= 1.5x)")
    print(f"rule_based vs random (same backfill queue) avg JCT: {by['random'].avg_jct_s / rb.avg_jct_s:.2f}x")
    print(f"rule_based OOM failures: {rb.oom_failures} (target 0)")
    print(f"rule_based vs gavel_max_throughput avg JCT: {gv.avg_jct_s / rb.avg_jct_s:.2f}x (target >= 1.0)")
    print(f"rl_based / rule_based avg JCT after warm-up (first 20% of jobs left out): "
          f"{rl.avg_jct_after_warmup_s / rb.avg_jct_after_warmup_s:.3f} (target <= 1.05)")
    if args.plot:
        print(f"plot: {write_plot(results, args.plot, f'Philly slice {SLICE_START}+{SLICE_JOBS}, seed {SEED}')}")
    if args.quick:
        return 0
    print()
    print("# measurements (this machine; not asserted anywhere)")
    cold, warm = placement_latency()
    print(f"place() among 10,000 devices, median of 21, new snapshot each call (index built): {cold * 1e3:.2f} ms "
          "(target <= 10 ms)")
    print(f"place() among 10,000 devices, median of 21, same snapshot, new leases each call: {warm * 1e3:.2f} ms "
          "(target <= 10 ms)")
    t = time.perf_counter()
    full = run_all(seed=SEED, policies=["rule_based"])[0]
    print(f"full replay, {full.jobs} jobs, rule_based: {time.perf_counter() - t:.1f} s incl. trace load "
          f"(simulate {full.wall_s:.1f} s; target <= 60 s); avg JCT {full.avg_jct_s / 3600:.2f} h, "
          f"OOM {full.oom_failures}, rejected {full.rejected}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
