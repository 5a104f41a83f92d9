"""Bounds of the static analysis: steps, seconds and memory for the whole analysis, and the size of any value it builds.

Details: docs/reference/estimator.md#autodlprofilebounds.
"""

from __future__ import annotations

import os
import time
from typing import Any

from autodl.profile import layers as L

MAX_STEPS = 500_000
"""Evaluation steps of one analysis. Measured (this repository's benchmark models, test fixtures and
example scripts, and the independent user scripts of benchmarks/user_scripts: 73 scripts): at most
3,081 steps, most under 400. The interpreter evaluates 150,000-350,000 steps/s on one core of this
host (s_exprec.py, s_nested_loop.py), so a runaway script reaches the bound in 1.5-3.5 s."""

MAX_SECONDS = 30.0
"""Wall-clock seconds of one analysis (a backstop for slow steps; normal scripts take well under 1 s)."""

MAX_MEMORY_BYTES = 1 << 30
"""Growth of the process's resident memory an analysis may cause: 1 GiB (normal scripts: a few MiB)."""

CHECK_EVERY = 256
"""Steps between two checks of the clock and of resident memory (a step allocates at most
:data:`MAX_ELEMENTS` references, ~0.8 MB, so memory overshoots the bound by at most ~200 MB)."""

MAX_ELEMENTS = 100_000
"""Largest sequence the interpreter builds or walks (loops stop at :data:`autodl.profile.interp.MAX_LOOP`
= 10,000 iterations anyway; model code needs lists of layers, not of data)."""

MAX_INT_BITS = 1 << 16
"""Largest integer the interpreter computes, bits (~19,700 decimal digits; Python itself refuses to
print more than 4,300). Arithmetic on such numbers takes microseconds."""

MAX_CALL_DEPTH = 48
"""Deepest nesting of the script's own function and constructor calls the interpreter follows
(each costs ~8 Python frames here; Python's default recursion limit is 1,000)."""


class AnalysisBound(L.Unsupported):
    """The analysis reached one of its bounds; from then on every evaluation raises it again."""


def _rss() -> int | None:
    """Resident memory of this process, bytes (``/proc/self/statm``), or None where unreadable."""
    try:
        with open("/proc/self/statm", "rb") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return None


def _env_number(name: str, default: float) -> float:
    try:
        value = float(os.environ.get(name, ""))
    except ValueError:
        return default
    return value if value > 0 and value == value and value != float("inf") else default


class Budget:
    """Steps, time and memory of one whole analysis (see the module docstring)."""

    def __init__(self, max_steps: int | None = None, max_seconds: float | None = None,
                 max_memory_bytes: int | None = None):
        self.max_steps = int(max_steps or _env_number("AUTODL_ANALYSIS_MAX_STEPS", MAX_STEPS))
        self.max_seconds = float(max_seconds or _env_number("AUTODL_ANALYSIS_TIMEOUT_S", MAX_SECONDS))
        self.max_memory_bytes = int(max_memory_bytes or _env_number("AUTODL_ANALYSIS_MEMORY_BYTES", MAX_MEMORY_BYTES))
        self.steps = 0
        self.depth = 0
        self.started = time.monotonic()
        self.rss0 = _rss()
        self.exceeded: str | None = None

    def stop(self, why: str) -> None:
        self.exceeded = (f"the static analysis stopped at its bound: {why}; what it had not followed by then is "
                         "unknown")
        raise AnalysisBound(self.exceeded)

    def step(self) -> None:
        """Count one evaluation step; raise :class:`AnalysisBound` when a bound is (or was) reached."""
        if self.exceeded is not None:
            raise AnalysisBound(self.exceeded)
        if self.steps >= self.max_steps:
            self.stop(f"more than {self.max_steps:,} evaluation steps (a loop or recursion too long to follow)")
        self.steps += 1
        if self.steps % CHECK_EVERY == 0:
            if time.monotonic() - self.started > self.max_seconds:
                self.stop(f"more than {self.max_seconds:g} s")
            rss = _rss()
            if rss is not None and self.rss0 is not None and rss - self.rss0 > self.max_memory_bytes:
                self.stop(f"more than {self.max_memory_bytes / (1 << 30):.2g} GiB of memory")

    def enter_call(self) -> None:
        self.depth += 1
        if self.depth > MAX_CALL_DEPTH:
            self.depth -= 1
            raise L.Unsupported(f"calls nested more than {MAX_CALL_DEPTH} deep (recursion)")

    def leave_call(self) -> None:
        self.depth -= 1


def too_big(v: Any) -> bool:
    """True for a value the interpreter must not walk or compute with: a sequence (or range) of more
    than :data:`MAX_ELEMENTS` elements, an integer of more than :data:`MAX_INT_BITS` bits."""
    if isinstance(v, bool):
        return False
    if isinstance(v, int):
        return v.bit_length() > MAX_INT_BITS
    if isinstance(v, (range, list, tuple, str, bytes, dict, set, frozenset)):
        try:
            return len(v) > MAX_ELEMENTS
        except OverflowError:  # a range longer than sys.maxsize
            return True
    return False


def result_too_big(op: type, a: Any, b: Any) -> bool:
    """True when ``a <op> b`` (an ``ast`` operator type) would build a value :func:`too_big` refuses,
    judged from the operands' sizes without computing it."""
    if too_big(a) or too_big(b):
        return True
    ints = isinstance(a, int) and isinstance(b, int) and not isinstance(a, bool) and not isinstance(b, bool)
    name = op.__name__
    if name == "Pow" and ints:
        return b > 0 and abs(a) > 1 and b * abs(a).bit_length() > MAX_INT_BITS
    if name == "Mult":
        if ints:
            return a.bit_length() + b.bit_length() > MAX_INT_BITS
        seq, n = (a, b) if isinstance(b, int) else (b, a)
        if isinstance(n, int) and isinstance(seq, (list, tuple, str, bytes)):
            return len(seq) * max(0, n) > MAX_ELEMENTS
    if name == "Add" and isinstance(a, (list, tuple, str, bytes)) and isinstance(b, (list, tuple, str, bytes)):
        return len(a) + len(b) > MAX_ELEMENTS
    if name == "Mod" and isinstance(a, (str, bytes)):
        return True  # printf-style formatting: '%0*d' % (10**9, 1) is a gigabyte
    return False


__all__ = ["AnalysisBound", "Budget", "MAX_CALL_DEPTH", "MAX_ELEMENTS", "MAX_INT_BITS", "MAX_MEMORY_BYTES",
           "MAX_SECONDS", "MAX_STEPS", "result_too_big", "too_big"]
