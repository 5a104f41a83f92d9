"""The static analysis is bounded as a whole (issue 13): steps, time, memory, value sizes, recursion.

It runs in the calling process (the CLI, an Airflow worker). Each ``s_*.py`` case below hung it or
ran it out of memory before (tests/cases/bad-input, from ../shared/cases/bad-input, 1,654 fuzzed
inputs); now each ends in a warning and the profile's fallback, never a crash or a hang.
"""

from __future__ import annotations

import ast
import json
import os
import resource
import subprocess
import sys
from pathlib import Path

import pytest

from autodl.profile import profile_script
from autodl.profile.bounds import MAX_CALL_DEPTH, MAX_STEPS, AnalysisBound, Budget
from autodl.profile.interp import Interp, Opaque

REPO = Path(__file__).resolve().parents[2]
CASES = REPO / "tests" / "cases" / "bad-input"


def analyse(path: Path):
    return profile_script(path, probe=False)


def codes(p) -> dict[str, str]:
    return {f.code: f.message for f in p.findings}


@pytest.mark.parametrize("case", ["s_nested_loop.py", "s_exprec.py"])
def test_a_model_init_that_would_hang_is_not_followed_and_is_bounded_where_evaluated(case):
    """Seen: a 10k x 10k loop (``s_nested_loop``) and ``f(n) = f(n-1) + f(n-1)`` with n = 40 (``s_exprec``) in the
    model's __init__ hung the CLI. The static reading no longer follows the model's construction (Paddle builds it
    in the probe, under the probe's timeout): the profile ends in the cold-start fallback with no error; where the
    evaluator does run such code (the functions a call site sits in), the step budget stops it."""
    p = analyse(CASES / case)
    assert p.method == "cold_start" and "cold-start" in codes(p) and not p.errors
    _, result = run((CASES / case).read_text())
    assert isinstance(result, AnalysisBound) and f"more than {MAX_STEPS:,} evaluation steps" in str(result)


def test_s_bigpow_is_not_computed():
    """Seen: ``N = 10**10**8`` at module level hung the CLI computing a 100-million-digit number."""
    p = analyse(CASES / "s_bigpow.py")
    assert p.method == "cold_start" and not p.errors  # the script has no model: the profile's fallback
    interp = Interp(ast.parse((CASES / "s_bigpow.py").read_text()))
    assert isinstance(interp.globals["N"], Opaque)


@pytest.mark.parametrize("case,seen", [
    ("s_strmul.py", "'a' * 10**12 in __init__: MemoryError in the calling process"),
    ("s_range12.py", "list(range(10**12)) in __init__: MemoryError in the calling process"),
    ("s_range8.py", "range(10**8) in __init__: the CLI reached ~4 GB of resident memory"),
])
def test_huge_values_are_not_built(case, seen):
    p = analyse(CASES / case)
    assert p.method == "cold_start" and not p.errors, seen
    assert "cold-start" in codes(p)


@pytest.mark.parametrize("case", ["s_nested_loop.py", "s_bigpow.py", "s_exprec.py", "s_strmul.py", "s_range12.py",
                                  "s_range8.py"])
@pytest.mark.slow  # autodl as a real process: the address-space cap needs one
def test_the_cli_stays_within_bounded_memory(case):
    """Through ``autodl profile``, with the address space capped at 2 GiB: a profile comes out, no traceback."""
    cap = 2 << 30

    def limit():
        resource.setrlimit(resource.RLIMIT_AS, (cap, cap))

    r = subprocess.run([sys.executable, "-m", "autodl.cli", "profile", str(CASES / case), "--no-probe", "--json"],
                       capture_output=True, text=True, preexec_fn=limit,
                       env={**os.environ, "PYTHONPATH": str(REPO / "plugins")})
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr[-2000:]
    assert json.loads(r.stdout)["peak_memory_bytes"] > 0


def run(source: str, budget: Budget | None = None):
    """Evaluate a model script's module level and its model construction like the analysis does."""
    interp = Interp(ast.parse(source), budget)
    try:
        value = interp.eval(ast.parse("model", mode="eval").body, {}) if "model" in interp.globals else None
        value = value if value is not None else interp.eval(ast.parse("Net()", mode="eval").body, {})
    except AnalysisBound as exc:
        return interp, exc
    except Exception as exc:  # noqa: BLE001 - the caller asserts which
        return interp, exc
    return interp, value


NET = """
import math
import paddle.nn as nn
class Net(nn.Layer):
    def __init__(self):
        super().__init__()
{body}
        self.fc = nn.Linear(8, 2)
"""


def net(body: str) -> str:
    return NET.format(body="\n".join("        " + line for line in body.strip().splitlines()))


@pytest.mark.parametrize("body,attr", [
    ("x = 2\nfor i in range(40):\n    x = x * x\nself.k = x", "k"),   # 2**(2**40)
    ("s = 'ab'\nfor i in range(60):\n    s = s + s\nself.k = s", "k"),  # 2**61 characters
    ("self.k = math.factorial(10**7)", "k"),
    ("self.k = sum(range(10**12))", "k"),
    ("self.k = sorted(range(10**9))", "k"),
    ("self.k = len(range(10**30))", "k"),
    ("self.k = '%0*d' % (10**9, 1)", "k"),
    ("self.k = 10.0 ** 10**8", "k"),
    ("self.k = [0] * 10**7", "k"),
])
def test_no_value_grows_past_the_bounds(body, attr):
    """Each builds a huge value or spends minutes in one C call; the interpreter leaves it unknown and goes on."""
    interp, model = run(net(body))
    assert isinstance(model.attrs[attr], Opaque), model.attrs[attr]
    assert "fc" in model.attrs  # the rest of __init__ was followed
    assert interp.budget.exceeded is None and interp.budget.steps < 1000


def test_a_nested_comprehension_is_stopped_by_the_step_budget():
    interp, result = run(net("self.k = [[i * j for j in range(10000)] for i in range(10000)]"))
    assert isinstance(result, AnalysisBound) and interp.budget.steps == MAX_STEPS


def test_deep_recursion_is_cut_at_the_call_depth():
    interp, result = run(net("def f(n):\n    return f(n - 1) + 1 if n > 0 else 0\nself.k = f(10**6)"))
    assert "nested more than" in str(result) and str(MAX_CALL_DEPTH) in str(result)
    assert interp.budget.depth == 0


def test_memory_growth_stops_the_analysis():
    """A loop keeping 0.8 MB per iteration: the resident-memory bound stops it, not the step budget."""
    interp, result = run(net("keep = []\nfor i in range(10000):\n    keep.append([0] * 100000)"),
                         Budget(max_memory_bytes=200 << 20))
    assert isinstance(result, AnalysisBound) and "GiB of memory" in str(result)
    assert interp.budget.steps < MAX_STEPS


def test_the_deadline_stops_the_analysis():
    interp, result = run(net("for i in range(10000):\n    for j in range(10000):\n        pass"), Budget(max_seconds=1e-9))
    assert isinstance(result, AnalysisBound) and "more than 1e-09 s" in str(result)


def test_the_bound_is_for_the_whole_analysis_and_sticky():
    """Steps spent building the model count against the forward trace too; once reached, everything stops."""
    interp, result = run(net("for i in range(1000):\n    pass"), Budget(max_steps=250))
    assert isinstance(result, AnalysisBound)
    with pytest.raises(AnalysisBound):
        interp.eval(ast.parse("1 + 1", mode="eval").body, {})


def test_real_scripts_stay_far_below_the_bounds():
    """The repository's example and benchmark scripts use a small share of the budget (bound chosen from them)."""
    scripts = [*sorted((REPO / "benchmarks" / "models").glob("*.py")), *sorted((REPO / "include" / "scripts").glob("*.py"))]
    assert scripts
    for s in scripts:
        p = profile_script(s, probe=False)
        assert "analysis-bounded" not in codes(p), s


def test_a_model_autodl_cannot_find_has_unknown_params_not_zero():
    """Seen (esttest F7): a script whose model autodl could not find reported ``params: 0`` next to a rough
    cold-start estimate. An unknown is not a default: the count is null, the warning says it is unknown, and
    the CLI's table says "unknown" instead of 0."""
    p = analyse(CASES / "s_bigpow.py")  # no model in it: nothing can count its parameters
    assert p.method == "cold_start"
    assert p.params is None and p.trainable_params is None
    assert "parameters are unknown" in codes(p)["cold-start"]
    assert p.peak_memory_bytes > 0  # the rough estimate still goes on, flagged
    # so are its FLOPs (they came from the parameter count): null, not 0
    assert p.flops_per_step is None
    # and the largest batch per device: a figure would assume a weightless model (fresh user: "A100: 15232")
    assert p.max_batch_size(40 * 2**30, 0.85) is None and p.max_batch_size_by_device == {}
    from autodl.profile.advice import advice
    from autodl.catalog import load_catalog

    big = p.model_copy(update={"peak_memory_bytes": 200 * 2**30})   # fits no card: the advice names the batch
    lines = [line for line in advice(big, list(load_catalog().models.values()), 0.85) if "largest batch" in line]
    assert lines and all("largest batch that fits: unknown" in line for line in lines)
