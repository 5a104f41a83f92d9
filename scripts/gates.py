"""The code gates (issue 20): ruff and mypy on the product, ratcheted against ``.ci/gates-baseline.json``.

The baseline counts today's offences per (tool, file, rule). A change may not add one (the gate fails and
lists it), and when offences go away the baseline must come down with them (``--write``), so the count only
ever falls. ``python scripts/gates.py`` checks; ``python scripts/gates.py --write`` records the counts now.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BASELINE = ROOT / ".ci" / "gates-baseline.json"
TARGETS = ["plugins/autodl", "sim/src/autodl_sim"]
"""The product and the simulator distribution (sim/)."""
_MYPY_LINE = re.compile(r"^(?P<file>[^:]+):\d+(?::\d+)?: error: .*\[(?P<code>[a-z0-9-]+)\]$")


def ruff_counts() -> Counter:
    """(``ruff``, file, rule) -> offences, from ``ruff check --output-format json``."""
    done = subprocess.run([sys.executable, "-m", "ruff", "check", *TARGETS, "--output-format", "json", "--no-cache",
                           "--exit-zero"], cwd=ROOT, capture_output=True, text=True, check=True)
    counts: Counter = Counter()
    for item in json.loads(done.stdout or "[]"):
        path = Path(item["filename"]).resolve().relative_to(ROOT).as_posix()
        counts["ruff", path, item["code"] or "syntax"] += 1
    return counts


def mypy_counts() -> Counter:
    """(``mypy``, file, error code) -> errors, from mypy's text output (settings in pyproject.toml)."""
    done = subprocess.run([sys.executable, "-m", "mypy", *TARGETS, "--no-error-summary", "--no-pretty",
                           "--show-error-codes", "--no-color-output"], cwd=ROOT, capture_output=True, text=True)
    if done.returncode not in (0, 1):
        raise SystemExit(f"mypy could not run (exit {done.returncode}): {done.stderr.strip() or done.stdout[-2000:]}")
    counts: Counter = Counter()
    for line in done.stdout.splitlines():
        m = _MYPY_LINE.match(line.strip())
        if m:
            counts["mypy", Path(m["file"]).as_posix(), m["code"]] += 1
    return counts


def as_json(counts: Counter) -> dict[str, dict[str, dict[str, int]]]:
    out: dict[str, dict[str, dict[str, int]]] = {}
    for (tool, path, code), n in sorted(counts.items()):
        out.setdefault(tool, {}).setdefault(path, {})[code] = n
    return out


def from_json(data: dict) -> Counter:
    return Counter({(tool, path, code): n for tool, files in data.items()
                    for path, codes in files.items() for code, n in codes.items()})


def compare(now: Counter, baseline: Counter) -> tuple[list[str], list[str]]:
    """(offences above the baseline, counts below it), each a line naming the tool, file, rule and counts."""
    worse = [f"{t} {p} {c}: {now[t, p, c]} (baseline {baseline.get((t, p, c), 0)})"
             for (t, p, c) in sorted(now) if now[t, p, c] > baseline.get((t, p, c), 0)]
    better = [f"{t} {p} {c}: {now.get((t, p, c), 0)} (baseline {n})"
              for (t, p, c), n in sorted(baseline.items()) if now.get((t, p, c), 0) < n]
    return worse, better


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--write", action="store_true", help="record today's counts as the baseline")
    args = parser.parse_args(argv)
    now = ruff_counts() + mypy_counts()
    if args.write:
        BASELINE.write_text(json.dumps(as_json(now), indent=1, sort_keys=True) + "\n")
        print(f"gates: baseline written: {sum(now.values())} offences in {len({p for _t, p, _c in now})} files")
        return 0
    baseline = from_json(json.loads(BASELINE.read_text()))
    worse, better = compare(now, baseline)
    for line in worse:
        print(f"gates: NEW {line}")
    for line in better:
        print(f"gates: fewer {line}: lower the baseline with `python scripts/gates.py --write`")
    total, base = sum(now.values()), sum(baseline.values())
    print(f"gates: {total} offences (baseline {base}); {'FAILED' if worse or better else 'ok'}")
    return 1 if worse or better else 0


if __name__ == "__main__":
    sys.exit(main())
