"""Trace-driven scheduling simulator: replay the Philly job trace on a heterogeneous pool under each placement policy.

Pure code (no Airflow): :func:`run_all` loads the trace slice, the pool and the heterogeneity
matrix and replays every policy named; :mod:`autodl.simulate.cli` exposes it as ``autodl simulate``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

from autodl.catalog import Catalog, load_catalog
from autodl.simulate.engine import SimOptions, SimResult, simulate
from autodl.simulate.pool import SimPool, load_sim_pool
from autodl.simulate.workload import SimJob, load_throughput, load_trace, speed_table

DEFAULT_POLICIES = ("fifo_first_fit", "random", "best_fit_memory", "gavel_max_throughput", "rule_based", "rl_based")


def run_all(
    *,
    trace: str | Path | None = None,
    pool: str | Path | None = None,
    throughput: str | Path | None = None,
    start: int = 0,
    jobs: int | None = None,
    seed: int = 0,
    error: float = 0.15,
    policies: Sequence[str] = DEFAULT_POLICIES,
    options: SimOptions | None = None,
    catalog: Catalog | None = None,
) -> list[SimResult]:
    """Replay one trace slice under each policy, side by side.

    :param trace: job CSV (default ``include/data/philly-jobs.csv``).
    :param pool: simulated pool file (default ``include/pools/sim-pai-hetero.yaml``).
    :param throughput: heterogeneity matrix CSV (default ``include/data/gpu-relative-throughput.csv``).
    :param start: first job of the slice, after sorting by submit time.
    :param jobs: slice length (``None`` = to the end).
    :param seed: seeds memory draws, estimate errors and policy randomness.
    :param error: relative error of the memory estimate the policies see (0.15 = +-15%).
    :param policies: registry names to replay.
    :returns: one :class:`SimResult` per policy, in ``policies`` order.
    :raises AutoDLError: on missing files or unknown policies.
    """
    cat = catalog or load_catalog()
    sim_pool = load_sim_pool(pool, cat)
    speeds, _ = speed_table([g.model for g in sim_pool.groups], cat, load_throughput(throughput))
    job_list = load_trace(trace, start=start, jobs=jobs, seed=seed, error=error)
    opt = options or SimOptions(seed=seed)
    return [simulate(job_list, sim_pool, p, speeds=speeds, catalog=cat, options=opt) for p in policies]


__all__ = [
    "DEFAULT_POLICIES", "SimJob", "SimOptions", "SimPool", "SimResult", "load_sim_pool", "load_throughput",
    "load_trace", "run_all", "simulate", "speed_table",
]
