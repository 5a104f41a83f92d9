"""The ``autodl simulate`` subcommand: argparse wiring for :func:`autodl_sim.run_all`."""

from __future__ import annotations

import argparse
import json
import math
import sys

from autodl.errors import AutoDLError
from autodl.inputs import short


def _count(minimum: int):
    """argparse type: an integer >= ``minimum``."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            value = None
        if value is None or value < minimum:
            raise argparse.ArgumentTypeError(f"must be an integer >= {minimum}, got {short(text, 60)}")
        return value

    parse.__name__ = "integer"
    return parse


def _fraction(text: str) -> float:
    """argparse type: a relative error in [0, 1)."""
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not 0 <= value < 1:
        raise argparse.ArgumentTypeError(f"must be in [0, 1), got {short(text, 60)}")
    return value


def _margin(text: str) -> float | str:
    """argparse type: ``off`` or a fraction in [0, 1)."""
    return "off" if text.strip().lower() == "off" else _fraction(text)


def _finite_positive(what: str):
    """argparse type: a finite number > 0; ``what`` says what it is in the error."""

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            value = math.nan
        if not (math.isfinite(value) and value > 0):
            raise argparse.ArgumentTypeError(f"must be a finite number > 0 ({what}), got {short(text, 60)}")
        return value

    return parse


_positive = _finite_positive("a multiplier: 1 = as the trace and the pool file are")
_hours = _finite_positive("hours, e.g. 96")


def _path(text: str) -> str:
    """argparse type: a path that is not empty (an empty one would silently mean the default file), nor longer
    than a path can be (:func:`autodl.cli.path_arg`)."""
    from autodl.cli import path_arg

    if not text.strip():
        raise argparse.ArgumentTypeError("the path is empty; pass a file's path, or leave the option out for the default")
    return path_arg("file")(text)


def _policies(text: str) -> str:
    """argparse type: a comma-separated list of at least one policy name."""
    if not [p for p in text.split(",") if p.strip()]:
        raise argparse.ArgumentTypeError("no policy named; pass comma-separated policy names, e.g. fifo_first_fit,rule_based")
    return text


def register(subparsers) -> argparse.ArgumentParser:
    """Add the ``simulate`` subcommand to an argparse ``subparsers`` object.

    :param subparsers: what ``ArgumentParser.add_subparsers()`` returned.
    :returns: the new subparser (its ``func`` default is :func:`run`).
    """
    from autodl_sim import DEFAULT_POLICIES

    p = subparsers.add_parser(
        "simulate",
        help="replay the Philly job trace on a simulated heterogeneous pool under each placement policy",
        description="Trace-driven simulation: Philly jobs (autodl_sim/data/philly-jobs.csv) on a heterogeneous pool, "
        "speeds from gpu-relative-throughput.csv (Sia/Pollux artifacts).",
    )
    p.add_argument("--trace", type=_path, default=None, help="job CSV (default autodl_sim/data/philly-jobs.csv)")
    p.add_argument("--pool", type=_path, default=None, help="simulated pool YAML (default autodl_sim/data/sim-pai-hetero.yaml)")
    p.add_argument("--throughput", type=_path, default=None, help="heterogeneity matrix CSV")
    p.add_argument("--start", type=_count(0), default=0, help="first job of the slice after sorting by submit time")
    p.add_argument("--jobs", type=_count(1), default=None, help="number of jobs in the slice (default: to the end)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--error", type=_fraction, default=None,
                   help="a uniform relative error of memory estimates (0.15 = +-15%%); default: the estimator's "
                        "measured errors (autodl_sim/data/estimate-errors.csv)")
    p.add_argument("--errors", type=_path, default=None, help="measured error table (default autodl_sim/data/estimate-errors.csv)")
    p.add_argument("--load", type=_positive, default=1.0, help="arrival-rate multiplier (2 = twice the trace's jobs per hour)")
    p.add_argument("--pool-scale", type=_positive, default=1.0, help="hosts per device model x this (0.5 = pool halved)")
    p.add_argument("--queue", choices=("autodl", "own"), default="autodl",
                   help="autodl: every policy behind autodl's admission queue (default); own: each policy's classic "
                        "queue (fifo_first_fit strict FIFO, the others first come, first served with greedy backfill)")
    p.add_argument("--policies", type=_policies, default=",".join(DEFAULT_POLICIES), help="comma-separated policy names")
    p.add_argument("--wait-margin", type=_margin, default=None,
                   help="autodl's queue only: a run offered slow devices waits for a faster type when it would end "
                        "at least this fraction sooner there, wait included; in [0, 1) for every policy, or 'off'; "
                        "default: 0.25 for autodl's own policies (rule_based, rl_based), off for the baselines")
    p.add_argument("--gang-first-after-h", type=_hours, default=None,
                   help="autodl's queue only: once a gang of 8+ devices has waited this many hours, the "
                        "longest-waiting one goes first and takes the reservation (a priority, not a cap: it still "
                        "waits for those devices to drain); the benchmark's: 96; off by default")
    p.add_argument("--sharing", choices=("exclusive", "packed"), default="exclusive",
                   help="packed: two memory-checked 1-device jobs may share a big NVIDIA device by the product's rule "
                        "(autodl.policy.packing), each slowed by the published pair speeds; non-preemptive policies "
                        "only (default: exclusive, as the product's default)")
    p.add_argument("--plot", type=_path, default=None, help="write a PNG of JCT CDFs and utilization over time here")
    p.add_argument("--json", action="store_true", help="print a JSON document instead of the table")
    p.set_defaults(func=run)
    return p


def run(args: argparse.Namespace) -> int:
    """Run the simulation for parsed ``args``; print the table (or JSON); write the plot.

    :returns: 0 on success, the error's exit code on an :class:`AutoDLError` (message on stderr).
    """
    from autodl_sim import run_all
    from autodl_sim.report import SOURCES, format_table, write_plot

    policies = [p.strip() for p in args.policies.split(",") if p.strip()]
    try:
        if args.error is not None and not 0 <= args.error < 1:
            raise AutoDLError(f"--error {args.error}: must be in [0, 1), e.g. 0.15 for +-15%.")
        if args.queue == "own" and (args.wait_margin is not None or args.gang_first_after_h is not None):
            raise AutoDLError("--wait-margin and --gang-first-after-h are rules of autodl's queue; with --queue own "
                              "each policy keeps its classic queue, which has neither: drop them or --queue own.")
        if not args.load > 0 or not args.pool_scale > 0:
            raise AutoDLError("--load and --pool-scale must be > 0 (1 = as the trace and the pool file are).")
        from autodl_sim.engine import SimOptions

        results = run_all(
            trace=args.trace, pool=args.pool, throughput=args.throughput, start=args.start, jobs=args.jobs,
            seed=args.seed, error=args.error, errors=args.errors, load=args.load, pool_scale=args.pool_scale,
            policies=policies, options=SimOptions(
                seed=args.seed, own_queue=args.queue == "own", sharing=args.sharing,
                wait_margin={None: "policy", "off": None}.get(args.wait_margin, args.wait_margin),
                gang_first_s=args.gang_first_after_h * 3600.0 if args.gang_first_after_h is not None else None),
        )
    except AutoDLError as exc:
        from autodl.cli import error_text  # redacted, long arguments cut, bounded

        print(f"autodl: error: {error_text(exc)}", file=sys.stderr)
        # the simulator's input errors (trace, pool, tables) are plain AutoDLErrors; they are the user's input,
        # not a bug in autodl (exit 1)
        return 2 if type(exc) is AutoDLError else exc.exit_code
    if args.plot:
        try:
            write_plot(results, args.plot, f"slice start={args.start} jobs={args.jobs} seed={args.seed} load x{args.load:g}")
        except ImportError:
            print("autodl: error: --plot needs matplotlib (a dependency of autodl that this environment lacks): pip install matplotlib.", file=sys.stderr)
            return 2
    if args.json:
        settings = {k: getattr(args, k) for k in ("start", "jobs", "seed", "error", "load", "pool_scale", "queue",
                                                  "wait_margin", "gang_first_after_h", "sharing")}
        print(json.dumps({"sources": SOURCES, "settings": settings, "results": [r.summary() for r in results]}, indent=2))
    else:
        print(format_table(results))
    return 0


def main(argv: list[str] | None = None) -> int:
    """Stand-alone entry: ``python -m autodl_sim.cli simulate ...``."""
    parser = argparse.ArgumentParser(prog="autodl")
    register(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    raise SystemExit(main())
