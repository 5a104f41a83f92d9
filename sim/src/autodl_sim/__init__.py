"""Trace-driven scheduling simulator: replay the Philly job trace on a heterogeneous pool under each placement policy.

Pure code (no Airflow): :func:`run_all` loads the trace slice, the pool and the heterogeneity
matrix and replays every policy named; :mod:`autodl_sim.cli` exposes it as ``autodl simulate``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

from autodl.catalog import Catalog, load_catalog
from autodl_sim.engine import SimOptions, SimResult, simulate
from autodl_sim.pool import SimPool, load_sim_pool, scale_pool
from autodl_sim.workload import (
    SimJob,
    assumed_speeds,
    load_errors,
    load_throughput,
    load_trace,
    perturb_speeds,
    speed_table,
)

DEFAULT_POLICIES = ("fifo_first_fit", "random", "best_fit_memory", "gavel_max_throughput", "rule_based", "rl_based",
                    "tiresias_las")


def run_all(
    *,
    trace: str | Path | None = None,
    pool: str | Path | None = None,
    throughput: str | Path | None = None,
    start: int = 0,
    jobs: int | None = None,
    seed: int = 0,
    error: float | None = None,
    errors: str | Path | None = None,
    load: float = 1.0,
    pool_scale: float = 1.0,
    runtime_sigma: float | None = None,
    speed_sigma: float = 0.0,
    policies: Sequence[str] = DEFAULT_POLICIES,
    options: SimOptions | None = None,
    catalog: Catalog | None = None,
) -> list[SimResult]:
    """Replay one trace slice under each policy, side by side (same jobs, same draws).

    :param trace: job CSV (default ``autodl_sim/data/philly-jobs.csv``).
    :param pool: simulated pool file (default ``autodl_sim/data/sim-pai-hetero.yaml``).
    :param throughput: heterogeneity matrix CSV (default ``include/data/gpu-relative-throughput.csv``).
    :param start: first job of the slice, after sorting by submit time.
    :param jobs: slice length (``None`` = to the end).
    :param seed: seeds memory draws, estimate errors, catalog errors and policy randomness.
    :param error: a uniform memory estimate error (0.15 = +-15%); default None = the measured errors.
    :param errors: the measured error table (default ``autodl_sim/data/estimate-errors.csv``).
    :param load: arrival-rate multiplier (2 = submit times halved).
    :param pool_scale: hosts per device model multiplied by this (0.5 = the pool halved; at least one host each).
    :param runtime_sigma: spread of the expected runtimes the queue sees (default
        :data:`autodl_sim.workload.RUNTIME_SIGMA`; ``math.inf`` = unknown).
    :param speed_sigma: the catalog's speed figures the policies see are off by exp(N(0, speed_sigma))
        per device model (0 = the catalog's roofline figures as they are).
    :param policies: placement policy names (each placed through the admission queue), or ``tiresias_las``.
    :param options: knobs (queue, headroom; its ``seen_speeds`` default to the catalog's figures).
    :returns: one :class:`SimResult` per policy, in ``policies`` order.
    :raises AutoDLError: on missing files or unknown policies.
    """
    import dataclasses

    from autodl_sim.workload import RUNTIME_SIGMA

    cat = catalog or load_catalog()
    sim_pool = load_sim_pool(pool, cat)
    if pool_scale != 1.0:
        sim_pool = scale_pool(sim_pool, pool_scale)
    models = [g.model for g in sim_pool.groups]
    speeds, _ = speed_table(models, cat, load_throughput(throughput))
    job_list = load_trace(trace, start=start, jobs=jobs, seed=seed, error=error, errors=errors,
                          runtime_sigma=RUNTIME_SIGMA if runtime_sigma is None else runtime_sigma, load=load)
    opt = options or SimOptions(seed=seed)
    if opt.seen_speeds is None:
        opt = dataclasses.replace(opt, seen_speeds=perturb_speeds(assumed_speeds(models, cat), speed_sigma, seed))
    return [simulate(job_list, sim_pool, p, speeds=speeds, catalog=cat, options=opt) for p in policies]


__all__ = [
    "DEFAULT_POLICIES", "SimJob", "SimOptions", "SimPool", "SimResult", "assumed_speeds", "load_errors", "load_sim_pool",
    "load_throughput", "load_trace", "perturb_speeds", "run_all", "scale_pool", "simulate", "speed_table",
]
