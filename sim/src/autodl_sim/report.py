"""Simulator output: the side-by-side table, the JSON document and the PNG of JCT CDFs and utilization over time."""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

from autodl_sim.engine import SimResult

SOURCES = (
    "Jobs: Philly trace (Jeon et al., USENIX ATC 2019; job table from the Sia SOSP 2023 artifacts, CC BY 4.0). "
    "True speeds: gpu-relative-throughput.csv (Sia/Pollux artifacts; V100 = 1.0); device models absent from it "
    "are scaled by a catalog roofline bound; policies see the catalog's roofline figures. Memory estimate errors: "
    "autodl_sim/data/estimate-errors.csv (autodl's estimator, measured)."
)

SEED_UTILIZATION_CLAIM = (0.52, 0.83)
"""The project seed's claim: GPU utilization from 52% to 83% with autodl's placement. Printed
beside the measured figures, not reproduced by construction."""


def _h(seconds: float) -> str:
    return f"{seconds / 3600:.2f}"


def format_table(results: Sequence[SimResult], baseline: str = "fifo_first_fit") -> str:
    """Fixed-width table, one row per policy; JCT ratio against ``baseline`` when present.

    ``util`` is the steady-state utilization (see :class:`SimResult`); ``useful`` leaves out attempts
    lost to OOM.

    :returns: the table with a header line and a sources line.
    """
    base = next((r for r in results if r.policy == baseline), None)
    head = (
        f"{'policy':<22}{'queue':<16}{'headroom':>9}{'avg JCT h':>11}{'p99 JCT h':>11}{f'x {baseline}'[:8]:>9}"
        f"{'avg queue h':>12}{'p99 queue h':>12}{'util':>7}{'useful':>8}{'mem util':>9}"
        f"{'OOM':>6}{'preempt':>8}{'rejected':>9}{'failed':>7}{'decide us':>10}{'wall s':>8}"
    )
    lines = [head, "-" * len(head)]
    for r in results:
        speed = f"{base.avg_jct_s / r.avg_jct_s:.2f}" if base and r.avg_jct_s else "-"
        lines.append(
            f"{r.policy:<22}{r.queue[:15]:<16}{r.headroom:>9.2f}{_h(r.avg_jct_s):>11}{_h(r.p99_jct_s):>11}"
            f"{speed:>9}{_h(r.avg_queue_s):>12}{_h(r.p99_queue_s):>12}{r.gpu_utilization_steady:>7.1%}"
            f"{r.useful_utilization_steady:>8.1%}{r.memory_utilization:>9.1%}{r.oom_failures:>6}{r.preemptions:>8}"
            f"{r.rejected:>9}{r.failed:>7}{r.decision_us_median:>10.1f}{r.wall_s:>8.2f}"
        )
    lines.append(
        f"the project's stated goal, GPU utilization {SEED_UTILIZATION_CLAIM[0]:.0%} -> {SEED_UTILIZATION_CLAIM[1]:.0%}: "
        "(not reproduced by placement; util = steady-state window, see benchmarks/scheduling.py)"
    )
    lines.append(SOURCES)
    return "\n".join(lines)


def write_plot(results: Sequence[SimResult], path: str | Path, title: str = "") -> Path:
    """PNG with two panels: JCT CDF per policy (log x) and GPU utilization over time.

    :param results: replays to draw.
    :param path: output PNG.
    :returns: the path written.
    :raises ImportError: when matplotlib is not installed (``pip install matplotlib``).
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (a, b) = plt.subplots(1, 2, figsize=(13, 4.8))
    for r in results:
        if r.jcts:
            n = len(r.jcts)
            a.plot([x / 3600 for x in r.jcts], [(i + 1) / n for i in range(n)], label=r.policy)
        if r.timeline:
            b.plot([t / 3600 for t, _ in r.timeline], [u * 100 for _, u in r.timeline], label=r.policy, lw=1)
    a.set_xscale("log")
    a.set_xlabel("job completion time (h)")
    a.set_ylabel("fraction of jobs")
    a.set_title("JCT CDF")
    a.legend(fontsize=8)
    b.set_xlabel("time since first submit (h)")
    b.set_ylabel("busy GPUs (%)")
    b.set_title("GPU utilization over time")
    fig.suptitle(title or "autodl simulate", fontsize=10)
    fig.text(0.01, 0.01, SOURCES, fontsize=6, wrap=True)
    fig.tight_layout(rect=(0, 0.05, 1, 0.95))
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out
