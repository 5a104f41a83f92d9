"""The code gates' ratchet (scripts/gates.py, issue 20): a new offence fails, and so does a count below the
baseline until the baseline is lowered, so offences only ever fall."""

from __future__ import annotations

import importlib.util
import json
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
spec = importlib.util.spec_from_file_location("gates", ROOT / "scripts" / "gates.py")
gates = importlib.util.module_from_spec(spec)
spec.loader.exec_module(gates)


def test_a_new_offence_is_named_with_its_file_and_rule():
    base = Counter({("ruff", "plugins/autodl/a.py", "C901"): 2})
    now = base + Counter({("ruff", "plugins/autodl/b.py", "F401"): 1})
    worse, better = gates.compare(now, base)
    assert worse == ["ruff plugins/autodl/b.py F401: 1 (baseline 0)"] and better == []


def test_fewer_offences_ask_for_the_baseline_to_come_down():
    base = Counter({("mypy", "plugins/autodl/a.py", "arg-type"): 3})
    worse, better = gates.compare(Counter({("mypy", "plugins/autodl/a.py", "arg-type"): 1}), base)
    assert worse == [] and better == ["mypy plugins/autodl/a.py arg-type: 1 (baseline 3)"]


def test_the_baseline_round_trips_and_covers_only_the_product_and_the_simulator():
    data = json.loads((ROOT / ".ci" / "gates-baseline.json").read_text())
    counts = gates.from_json(data)
    assert gates.as_json(counts) == data
    assert {tool for tool, _p, _c in counts} <= {"ruff", "mypy"}
    assert all(path.startswith(("plugins/autodl/", "sim/src/autodl_sim/")) for _t, path, _c in counts)
    assert not [path for _t, path, _c in counts if path.startswith("plugins/autodl/simulate/")]


def test_mypy_lines_are_read_with_their_code():
    m = gates._MYPY_LINE.match('plugins/autodl/x.py:12: error: Incompatible types in assignment  [assignment]')
    assert m and (m["file"], m["code"]) == ("plugins/autodl/x.py", "assignment")
