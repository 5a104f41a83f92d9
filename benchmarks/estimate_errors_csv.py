"""Write ``sim/src/autodl_sim/data/estimate-errors.csv`` (the scheduling simulator's memory-estimate errors) from the
estimator benchmark's table ``benchmarks/results/estimate_accuracy.txt``.

Run from the repository root after ``benchmarks/estimate_accuracy.py`` has rewritten the table::

    .venv/bin/python benchmarks/estimate_errors_csv.py [--source-commit abc1234]

One CSV row per configuration of the table: ``measured_bytes`` and ``estimated_bytes`` are its ``measured``
and ``estimate`` columns (MiB with one decimal, so within 0.05 MiB), ``phase`` is ``eval`` for the
configurations in :data:`EVAL_PEAK` (their measured peak is the first evaluation pass, not the training
step), else ``step``. The table measures the *tensor* peak on CPU: the GPU-only part of a device's peak
(CUDA context, cuDNN/cuBLAS workspaces, the caching allocator's reserved-but-unused blocks) is not in it,
on either side; the CSV's header says so and the simulator's headroom is what covers it.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TABLE = ROOT / "benchmarks" / "results" / "estimate_accuracy.txt"
CSV = ROOT / "sim" / "src" / "autodl_sim" / "data" / "estimate-errors.csv"
MIB = 2**20

EVAL_PEAK = {
    "eval at 320px > train at 96px": "eval peak 727,621,032 B > train 102,856,424 B (benchmarks/results/truth.json)",
    "case seg_train_eval": "eval peak 6,034,696,904 B > train 686,961,360 B (tests/cases/estimator/truth.json)",
    "user sr_eval_fullres": "eval peak 609,615,224 B > train 158,379,140 B (benchmarks/user_scripts/truth.json)",
    "user video_r2plus1d_main": "eval peak 392,232,160 B > train 377,118,064 B (benchmarks/user_scripts/truth.json)",
}
"""Configurations whose measured peak (the table's ``measured``: the larger of the training step's and
the first evaluation's) is the evaluation pass, with the truth files' two peaks (estimator branch of
2026-12-01). The other scripts with an evaluation pass peak in training: 'tiny ViT cfg class + val pass'
(eval 91.5 MB < train 226.7 MB), 'hapi Model.fit LeNet + eval' (7.8 MB < 11.0 MB)."""

ROW = re.compile(
    r"^(?P<name>.+?)\s+(?P<params>[\d,]+)\s+(?P<measured>[\d.]+)M\s+(?P<estimate>[\d.]+)M\s+(?P<err>[+-]?[\d.]+)%"
    r"\s+(?P<static>\S+)\s+(?P<path>\S+)\s"
)


def parse_table(text: str) -> list[dict]:
    """The table's configuration rows: name, measured and estimate (bytes), err (fraction), path.

    :raises ValueError: when no row parses or an estimate disagrees with its ``err`` column by more than
        the MiB rounding allows (a changed table format)."""
    rows = []
    for line in text.splitlines():
        m = ROW.match(line)
        if not m or line.startswith(("#", "script", "-")):
            continue
        measured = round(float(m["measured"]) * MIB)
        est = round(float(m["estimate"]) * MIB)
        err = float(m["err"]) / 100
        if abs(est / measured - 1 - err) > 0.001 + 0.1 * MIB / measured:
            raise ValueError(f"{TABLE.name}: row {m['name']!r}: estimate/measured - 1 = {est / measured - 1:+.4f}, "
                             f"err column {err:+.4f}")
        rows.append({"name": m["name"], "measured": measured, "estimate": est, "err": err, "path": m["path"]})
    if not rows:
        raise ValueError(f"{TABLE}: no configuration rows (format changed?)")
    return rows


def header(table_text: str, commit: str, rows: list[dict]) -> str:
    first = table_text.splitlines()[0].lstrip("# ").strip()
    errs = sorted(r["err"] for r in rows)
    return f"""# Measured errors of autodl's memory estimate (tensor peak), read by the scheduling simulator:
# each simulated job's estimate = its true peak x (estimated_bytes / measured_bytes) of one row drawn at random.
# phase: where the measured peak is reached (step: the training steps; eval: the first evaluation pass).
# Written by benchmarks/estimate_errors_csv.py from benchmarks/results/estimate_accuracy.txt (estimator commit
# {commit}; the table's first line: {first}).
# {len(rows)} configurations (models, the issue-8 cases 'case ...', independently written scripts 'user ...');
# measured = Paddle's CPU allocator peak of the second training step (or the first evaluation pass when larger),
# estimate = profile_script(..., probe=True).tensor_peak_bytes (path dry_run or probe); MiB with one decimal.
# Errors from {errs[0]:+.1%} to {errs[-1]:+.1%}. NOT measured: the GPU-side gap (CUDA context, cuDNN/cuBLAS
# workspaces, the caching allocator's reserved-but-unused memory) that neither column contains; the simulator's
# memory headroom (0.85) is what stands for it.
# Update: re-run benchmarks/estimate_accuracy.py, then this script."""


def _recorded_commit() -> str | None:
    """The estimator commit named in the current CSV's header (kept when the table is re-converted)."""
    try:
        m = re.search(r"estimator commit\n?#?\s*([0-9a-f]{7,40})", CSV.read_text(encoding="utf-8"))
    except OSError:
        return None
    return m[1] if m else None


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--source-commit", default=None,
                    help="estimator commit that measured the table (default: the one the CSV names, else the table's last commit)")
    ap.add_argument("--check", action="store_true", help="exit 1 if the CSV differs from what would be written")
    args = ap.parse_args()
    text = TABLE.read_text(encoding="utf-8")
    rows = parse_table(text)
    commit = args.source_commit or _recorded_commit() or subprocess.run(
        ["git", "-C", str(ROOT), "log", "-1", "--format=%h", "--", str(TABLE)], capture_output=True, text=True,
    ).stdout.strip() or "unknown"
    missing = set(EVAL_PEAK) - {r["name"] for r in rows}
    if missing:
        print(f"warning: eval-phase configurations not in the table: {sorted(missing)}", file=sys.stderr)
    lines = [header(text, commit, rows), "name,measured_bytes,estimated_bytes,phase,source"]
    for r in rows:
        phase = "eval" if r["name"] in EVAL_PEAK else "step"
        name = r["name"].replace(",", ";")
        lines.append(f"{name},{r['measured']},{r['estimate']},{phase},"
                     f"benchmarks/results/estimate_accuracy.txt ({r['path']})")
    out = "\n".join(lines) + "\n"
    if args.check:
        return 0 if CSV.read_text(encoding="utf-8") == out else 1
    CSV.write_text(out, encoding="utf-8")
    print(f"{CSV.relative_to(ROOT)}: {len(rows)} rows ({sum(r['name'] in EVAL_PEAK for r in rows)} eval)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
