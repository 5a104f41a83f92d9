"""The probe: build only the model in a sandboxed subprocess, run CPU training steps at small batches, extrapolate.

Details: docs/reference/estimator.md#autodlprofileprobe.
"""

from __future__ import annotations

import ast
import json
import os
import re
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeAlias

from autodl.profile import memory as E
from autodl.profile.facts import ScriptFacts
from autodl.profile.layers import Unsupported
from autodl.sandbox import SandboxLimits, SandboxResult, SandboxUnavailable, run_sandboxed
from autodl.types import Finding

PROBE_TIMEOUT_S = 120.0
"""Seconds the probe may run, including Paddle's import (~5 s on a 2-core host)."""

PROBE_ADDRESS_SPACE_BYTES = 8 << 30
"""RLIMIT_AS of the probe: 8 GiB. Importing Paddle 3.3 (CPU) peaks at ~0.75 GiB of address space
(measured, VmPeak); small-batch steps of the benchmark models stay well under 2 GiB."""

CHILD = Path(__file__).with_name("_probe_child.py")


@dataclass
class ProbeResult:
    """What the probe measured (bytes, seconds) or why it could not."""

    ok: bool
    seconds: float
    params: int = 0
    trainable: int = 0
    peaks: dict[int, int] = field(default_factory=dict)
    batch_sizes: list[int] = field(default_factory=list)
    act_bytes_per_sample: int = 0
    fixed_transient_bytes: int = 0
    tensor_peak_bytes: int = 0
    forward_flops_per_sample: float | None = None
    inputs_from: str | None = None
    findings: list[Finding] = field(default_factory=list)


def _literal(v: Any) -> bool:
    if isinstance(v, (int, float, str, bool)) or v is None:
        return True
    if isinstance(v, (list, tuple)):
        return all(_literal(x) for x in v)
    return False


def probe_program(tree: ast.Module, facts: ScriptFacts, script: Path | None = None) -> tuple[str, str]:
    """The filtered module source and the model construction expression.

    Kept: imports (module-level and inside functions; one that fails in the probe is skipped and named if the model
    cannot be built), class and function definitions, module constants whose value calls nothing, and the config
    objects the construction reads (``cfg = Config(...)``, a script class that is not a layer, with arguments that
    call nothing). Dropped: every other top-level statement.

    :param script: the script's path, when known: a script that imports its own modules (``mypkg/`` or ``mypkg.py``
        next to it) and has no construction the static reading sees is told so, not that it has no model.
    :raises ValueError: when no model construction was found, or when the construction uses a name the kept
        statements do not define (a value a function computes, a module-level value a call made).
    """
    site = facts.model_site
    if site is None:
        raise ValueError(_no_construction_reason(tree, script))
    keep = _kept_statements(tree, facts)
    expr = _construction_expr(facts)
    missing = _undefined_names(expr, keep)
    keep += [stmt for name in missing if (stmt := _config_object(name, tree, facts, keep)) is not None]
    missing = _undefined_names(expr, keep)
    if missing:
        raise ValueError(f"the model's construction at line {site.node.lineno} uses {', '.join(missing[:4])}, "
                         f"{_where_set(missing[0], tree, site)}, which the probe does not run (it runs only the "
                         "script's imports, definitions, constants and config objects); the estimate is the "
                         "conservative bound")
    module = ast.Module(body=keep, type_ignores=[])
    return ast.unparse(ast.fix_missing_locations(module)), expr


def _local_imports(tree: ast.Module, folder: Path) -> dict[str, str]:
    """The names the script binds by importing its own modules (a top-level module that is a ``<name>.py`` file or a
    ``<name>/`` folder in ``folder``, the script's), each to the module it comes from (``Net`` -> ``mypkg.model``)."""
    def local(module: str) -> bool:
        top = module.split(".")[0]
        return bool(top) and ((folder / f"{top}.py").is_file() or (folder / top).is_dir())

    names: dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update({(a.asname or a.name).split(".")[0]: a.name for a in node.names if local(a.name)})
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module and local(node.module):
            names.update({a.asname or a.name: node.module for a in node.names if a.name != "*"})
    return names


def _no_construction_reason(tree: ast.Module, script: Path | None) -> str:
    """Why the probe has no model to build: no construction in the script, or (the script imports its own modules)
    a construction whose class the static reading does not see, named with its line and module."""
    generic = "no model construction (a paddle.nn.Layer subclass, nn.Sequential or paddle.vision.models call) was found"
    names = _local_imports(tree, script.resolve().parent) if script is not None else {}
    if not names:
        return generic
    tail = ("the static reading does not follow the script's own imports, so only the dry run (which runs the script, "
            "imports and all) can measure this model")
    call = _local_construction(tree, names)
    if call is None:
        return (f"no model construction was found in the script itself, and it imports its own modules "
                f"({', '.join(sorted(set(names.values()))[:4])}, next to it): a model built from them is not seen; "
                f"{tail}")
    func = ast.unparse(call.func)
    return (f"the script builds {func}({'...' if call.args or call.keywords else ''}) at line {call.lineno}, a class "
            f"the static reading does not see: it is imported from the script's own module "
            f"{names[_root_name(call.func) or '']} (next to the script), and {tail}")


def _local_construction(tree: ast.Module, names: dict[str, str]) -> ast.Call | None:
    """The first call (by line) of a name imported from the script's own modules that looks like the model's
    construction: a class (a capitalised name, ``Net(...)``, ``mypkg.model.Net(...)``) or a call assigned to
    ``model``/``net``/``network``."""
    model_calls = {id(n.value) for n in ast.walk(tree) if isinstance(n, ast.Assign) and isinstance(n.value, ast.Call)
                   and any(isinstance(t, ast.Name) and t.id in ("model", "net", "network") for t in n.targets)}
    calls = [n for n in ast.walk(tree) if isinstance(n, ast.Call) and _root_name(n.func) in names
             and (ast.unparse(n.func).split(".")[-1][:1].isupper() or id(n) in model_calls)]
    return min(calls, key=lambda n: n.lineno) if calls else None


def _root_name(func: ast.expr) -> str | None:
    """The name a called expression starts from (``Net`` for ``Net``, ``mypkg`` for ``mypkg.model.Net``)."""
    while isinstance(func, ast.Attribute):
        func = func.value
    return func.id if isinstance(func, ast.Name) else None


_GUARDED_IMPORT = ast.parse("try:\n    pass\nexcept ImportError as __autodl_exc:\n"
                            "    __autodl_missing__.append(str(__autodl_exc))\n").body[0]
"""The shape each kept import takes: a package missing where the probe runs (one only a Dataset needs) is skipped
and recorded in ``__autodl_missing__``, which the child names if the model cannot be built."""


def _kept_statements(tree: ast.Module, facts: ScriptFacts) -> list[ast.stmt]:
    """Every import of the script (once, each guarded), ``args`` (the argparse defaults), definitions and constants."""
    import copy

    keep: list[ast.stmt] = []
    seen_imports: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Import, ast.ImportFrom)) and ast.unparse(node) not in seen_imports:
            seen_imports.add(ast.unparse(node))
            guarded = copy.deepcopy(_GUARDED_IMPORT)
            assert isinstance(guarded, ast.Try)
            guarded.body = [node]
            keep.append(guarded)
    keep.append(ast.parse("args = __autodl_args__").body[0])
    for stmt in tree.body:
        if isinstance(stmt, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            keep.append(stmt)
        elif isinstance(stmt, (ast.Assign, ast.AnnAssign)) and stmt.value is not None and \
                facts.interp.only_safe(stmt.value) and "parse_args" not in ast.unparse(stmt.value):
            keep.append(stmt)
    return keep


def _construction_expr(facts: ScriptFacts) -> str:
    """The model's construction call, with the arguments the call-site evaluator knows written as literals (a zoo
    model's ``pretrained`` is False: its weights' values change no memory, and the probe has no network)."""
    from autodl.profile.facts import function_env

    site = facts.model_site
    assert site is not None
    env = function_env(facts.interp, site.func, site.node.lineno, {})

    def value(node: ast.expr) -> Any:
        try:
            return facts.interp.eval(node, env)
        except Unsupported:  # e.g. the analysis reached its bounds: the expression goes as written
            return Unsupported

    parts = []
    for a in site.node.args:
        v = value(a)
        parts.append(repr(v) if _literal(v) else ast.unparse(a))
    for kw in site.node.keywords:
        if site.kind == "zoo" and kw.arg == "pretrained":  # the weights' values change no memory; no download
            parts.append("pretrained=False")
            continue
        v = value(kw.value)
        text = repr(v) if _literal(v) else ast.unparse(kw.value)
        parts.append(f"**{text}" if kw.arg is None else f"{kw.arg}={text}")
    return f"{ast.unparse(site.node.func)}({', '.join(parts)})"


def _assignments(name: str, tree: ast.Module, facts: ScriptFacts) -> list[ast.Assign]:
    """The ``name = ...`` statements at the module level and, before the construction, in the function it sits in."""
    site = facts.model_site
    assert site is not None
    stmts: list[ast.stmt] = list(tree.body)
    if site.func is not None:
        stmts += [s for s in ast.walk(site.func) if isinstance(s, ast.stmt) and s.lineno < site.node.lineno]
    return [s for s in stmts if isinstance(s, ast.Assign) and len(s.targets) == 1
            and isinstance(s.targets[0], ast.Name) and s.targets[0].id == name]


def _config_object(name: str, tree: ast.Module, facts: ScriptFacts, keep: list[ast.stmt]) -> ast.stmt | None:
    """``name = Config(...)`` when ``name`` is assigned once (at the module level or in the construction's function)
    from a script class that is not a layer, with arguments that call nothing and read only what ``keep`` defines:
    a config object the probe may build."""
    from autodl.profile.interp import ClassInfo

    found = _assignments(name, tree, facts)
    if len(found) != 1 or not isinstance(call := found[0].value, ast.Call) or not isinstance(call.func, ast.Name):
        return None
    cls = facts.interp.globals.get(call.func.id)
    args = [*call.args, *(k.value for k in call.keywords)]
    if not isinstance(cls, ClassInfo) or cls.is_layer() or not all(facts.interp.only_safe(a) for a in args):
        return None
    return found[0] if not _undefined_names(ast.unparse(call), keep) else None


def _where_set(name: str, tree: ast.Module, site: Any) -> str:
    """Where ``name`` gets its value, in words, for the message that the probe cannot rebuild it: a module-level
    statement (also one inside a module-level ``with``, ``if``, ``for`` or ``try``, not in a definition)."""
    for s in _module_level_statements(tree.body):
        targets = s.targets if isinstance(s, ast.Assign) else [s.target] if isinstance(s, (ast.AnnAssign, ast.For)) \
            else [i.optional_vars for i in s.items if i.optional_vars] if isinstance(s, ast.With) else []
        if any(isinstance(n, ast.Name) and n.id == name for t in targets for n in ast.walk(t)):
            return f"set by the module-level statement at line {s.lineno}"
    return f"a value {site.func.name}() computes" if site.func is not None else "a name the script does not define"


def _module_level_statements(body: list[ast.stmt]) -> list[ast.stmt]:
    """The statements of ``body`` and, inside its compound statements other than definitions, theirs, in order."""
    out: list[ast.stmt] = []
    for s in body:
        out.append(s)
        if not isinstance(s, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            for part in ("body", "orelse", "finalbody"):
                out += _module_level_statements(getattr(s, part, None) or [])
            for handler in getattr(s, "handlers", None) or []:
                out += _module_level_statements(handler.body)
    return out


def _undefined_names(expr: str, keep: list[ast.stmt]) -> list[str]:
    """The names ``expr`` reads that neither the kept statements nor Python's builtins define, sorted: the probe would
    only fail on them with a ``NameError`` that is not the script's."""
    import builtins

    defined = set(dir(builtins))
    for stmt in keep:
        if isinstance(stmt, ast.Try):  # a guarded import
            stmt = stmt.body[0]
        if isinstance(stmt, (ast.Import, ast.ImportFrom)):
            defined.update((a.asname or a.name).split(".")[0] for a in stmt.names)
        elif isinstance(stmt, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            defined.add(stmt.name)
        elif isinstance(stmt, (ast.Assign, ast.AnnAssign)):
            targets = stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target]
            defined.update(n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name))
    nodes = list(ast.walk(ast.parse(expr, mode="eval")))
    bound = {n.id for n in nodes if isinstance(n, ast.Name) and not isinstance(n.ctx, ast.Load)} | \
        {a.arg for n in nodes if isinstance(n, ast.Lambda) for a in n.args.args}
    return sorted({n.id for n in nodes if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)} - defined - bound)


PROBE_STEP_FLOPS = 5e10
"""Training FLOPs one probe step may cost: ~1-2 s on two CPU cores (oneDNN fp32 reaches 30-50 GFLOPS there,
measured on the benchmark models)."""

PROBE_ACTIVATION_BYTES = 2 << 30
"""Activation bytes one probe step may hold (well inside :data:`PROBE_ADDRESS_SPACE_BYTES`)."""


def probe_batches(batch: int, act_per_sample: int | None, fwd_flops_per_sample: float | None) -> tuple[int, int]:
    """The two batch sizes the probe runs: as close to ``batch`` as the budgets allow.

    The training peak is the maximum over the phases of a step, each linear in the batch, so it is a
    convex piecewise-linear function of the batch: which phase peaks can change as the batch grows
    (measured: the example CNN's slope is 0.93 MB/sample up to batch 32 and 1.19 MB/sample from 32 to 64).
    Extrapolating from the largest affordable pair keeps that error small; at ``b2 == batch`` there is none.
    """
    cap = batch
    if fwd_flops_per_sample:
        cap = min(cap, int(PROBE_STEP_FLOPS // (3 * fwd_flops_per_sample)))
    if act_per_sample:
        cap = min(cap, int(PROBE_ACTIVATION_BYTES // max(1, act_per_sample)))
    b2 = max(2, cap)
    if b2 > batch:
        b2 = max(2, batch)
    b1 = max(1, b2 // 2)
    return b1, b2


REPORT_TEXT_CHARS = 500
"""Characters kept of each text the probe child reports (an error message, a layer name): they end up in findings,
logs and records, and the user's code can make them any length."""

REPORT_MAX_BYTES = 1 << 50
"""Largest peak or parameter count believed from the probe child (:data:`autodl.fields.MAX_HOST_BYTES`, 1 PiB)."""


def report_text(value: Any) -> str | None:
    """A value from the probe's report as printable text of bounded length, for messages and records.

    :param value: any JSON value, or None.
    :returns: the text (control characters replaced by spaces), or None for None.
    """
    if value is None:
        return None
    text = value if isinstance(value, str) else json.dumps(value)[:REPORT_TEXT_CHARS * 2]
    text = "".join(c if c.isprintable() else " " for c in text)  # no terminal control sequences in messages
    return text if len(text) <= REPORT_TEXT_CHARS else text[:REPORT_TEXT_CHARS - 3] + "..."


def _report_count(value: Any, what: str) -> int:
    if type(value) is not int or not 0 <= value <= REPORT_MAX_BYTES:
        raise ValueError(f"{what} is {report_text(value) if value is not None else 'missing'}, not a count "
                         f"from 0 to {REPORT_MAX_BYTES}")
    return value


def report_object(text: str) -> dict[str, Any]:
    """A report written by a sandboxed child, parsed strictly: a JSON object with no NaN/Infinity.

    :raises ValueError: saying what is wrong (not JSON, too deeply nested, a non-finite number, not an object).
    """
    def no_constant(name: str) -> Any:
        raise ValueError(f"{name} is not a number")

    try:
        data = json.loads(text, parse_constant=no_constant)
    except (ValueError, RecursionError) as exc:
        raise ValueError(f"not JSON: {report_text(str(exc))}") from None
    if not isinstance(data, dict):
        raise ValueError("not a JSON object")
    return data


def probe_report(text: str, batches: tuple[int, int]) -> dict[str, Any]:
    """The probe child's report (the JSON after ``AUTODL_PROBE``), checked field by field.

    The child executes the user's model code in its own process, so the script can print a line of its own, with
    any content; nothing in it is believed unchecked: a JSON object; texts cut to :data:`REPORT_TEXT_CHARS`
    printable characters; on success, ``peaks`` for exactly the two probed ``batches`` and ``params`` /
    ``trainable`` as integers in [0, :data:`REPORT_MAX_BYTES`] with ``trainable <= params``; ``fwd_flops_per_sample``
    a finite number >= 0 or absent; ``input_index`` a small integer or absent; a failing layer's fields as texts
    and shapes of integers.

    :returns: the report with only those fields.
    :raises ValueError: saying what is wrong (the caller keeps the conservative bound).
    """
    data = report_object(text)
    out: dict[str, Any] = {"ok": data.get("ok") is True}
    for key in ("error", "stage", "input_desc", "input_assumed"):
        out[key] = report_text(data.get(key))
    fwd = data.get("fwd_flops_per_sample")
    if fwd is not None:
        if isinstance(fwd, bool) or not isinstance(fwd, (int, float)) or not 0 <= fwd <= 1e30:
            raise ValueError(f"fwd_flops_per_sample is {report_text(fwd)}, not a number of FLOPs")
        out["fwd_flops_per_sample"] = float(fwd)
    index = data.get("input_index")
    if index is not None:
        if type(index) is not int or not 0 <= index <= 10_000:
            raise ValueError(f"input_index is {report_text(index)}, not an index")
        out["input_index"] = index
    layer = data.get("layer")
    if isinstance(layer, dict):
        shapes = layer.get("input_shapes")
        ok_shapes = isinstance(shapes, list) and len(shapes) <= 16 and all(
            isinstance(sh, list) and len(sh) <= 16 and all(type(d) is int for d in sh) for sh in shapes)
        out["layer"] = {"layer": report_text(layer.get("layer")) or "?", "type": report_text(layer.get("type")) or "?",
                        "input_shapes": shapes if ok_shapes else None,
                        "weight_shape": report_text(layer.get("weight_shape"))}
    elif layer is not None:
        raise ValueError("layer is not a JSON object")
    if out["ok"]:
        peaks = data.get("peaks")
        if not isinstance(peaks, dict) or set(peaks) != {str(b) for b in batches}:
            raise ValueError(f"peaks are not given for the probed batches {batches[0]} and {batches[1]}")
        out["peaks"] = {int(k): _report_count(v, f"the peak at batch {k}") for k, v in peaks.items()}
        out["params"] = _report_count(data.get("params"), "params")
        out["trainable"] = _report_count(data.get("trainable"), "trainable")
        if out["trainable"] > out["params"]:
            raise ValueError("more trainable parameters than parameters")
    return out


def _no_report_reason(result: SandboxResult, limit: int) -> str:
    """Why the probe child ended without its report line: out of its address space (``limit`` bytes), a signal,
    or the last lines it wrote to stderr (else its exit code)."""
    err, returncode = result.stderr, result.returncode
    tail = [report_text(line) or "" for line in (err or "").strip().splitlines()[-3:]]
    why = "; ".join(tail) or f"exit code {returncode}"
    if returncode and returncode < 0:
        why = f"killed by signal {-returncode}"
    if result.oom_kills or "MemoryError" in (err or "") or "std::bad_alloc" in (err or ""):
        why = f"ran out of its {limit >> 30} GiB address-space limit (AUTODL_PROBE_MEMORY_BYTES)"
    return why


def run_probe(
    script: Path,
    facts: ScriptFacts,
    *,
    batch: int,
    input_shape: list[int] | None,
    seq_len: int | None,
    timeout_s: float | None = None,
    act_bytes_per_sample_hint: int | None = None,
    flops_per_sample_hint: float | None = None,
    inputs: list[list[dict]] | None = None,
) -> ProbeResult:
    """Probe the model of ``script`` and extrapolate its tensor peak to ``batch``.

    :param script: the training script (for messages and ``__file__``).
    :param facts: the static analysis of the script (model construction, optimizer, loss).
    :param batch: the run's per-device batch size.
    :param input_shape: per-sample input shape (from spec or script), or None to infer.
    :param seq_len: sequence length for token models.
    :param timeout_s: seconds; default ``$AUTODL_PROBE_TIMEOUT_S`` or :data:`PROBE_TIMEOUT_S`.
    :param act_bytes_per_sample_hint: activation bytes per sample when known beforehand, to size the probe.
    :param flops_per_sample_hint: forward FLOPs per sample when known beforehand, to size the probe.
    :param inputs: candidate input lists (per-sample ``shape``, ``dtype``, optional ``min``/``max`` of integer
        ids), tried in order before the static reading's input: what the dry run saw the model get, or the
        fields of the script's Dataset's first sample (issue 8, kinds 1, 3 and 7).
    :returns: the result; failures come back as ``warning`` findings (``probe-timeout``, ``probe-failed``,
        ``probe-shape-mismatch``), never as exceptions and never as errors: the probe runs inputs autodl made up.
    """
    t0 = time.monotonic()
    site_line = facts.model_site.node.lineno if facts.model_site is not None else None
    timeout = float(timeout_s or os.environ.get("AUTODL_PROBE_TIMEOUT_S") or PROBE_TIMEOUT_S)
    limit = int(os.environ.get("AUTODL_PROBE_MEMORY_BYTES") or PROBE_ADDRESS_SPACE_BYTES)
    res = ProbeResult(ok=False, seconds=0.0)

    def fail(code: str, msg: str, severity: str = "warning", line: int | None = None) -> ProbeResult:
        res.findings.append(Finding(severity=severity, code=code, message=msg, line=line))
        res.seconds = round(time.monotonic() - t0, 3)
        return res

    try:
        source, expr = probe_program(facts.interp.tree, facts, script)
    except ValueError as exc:
        return fail("probe-skipped", f"probe not run: {exc}.", "info")
    given = declared_input(facts, input_shape, seq_len)
    b1, b2 = probe_batches(batch, act_bytes_per_sample_hint, flops_per_sample_hint)
    argp = {k: v for k, v in facts.interp.argparse.items() if _literal(v)}
    cfg = {"script": str(script), "source": source, "model_expr": expr, "argparse": argp,
           "optimizer": facts.optimizer, "input_candidates": [c for c in (inputs or []) if c], "input": given,
           "guess_input": {"seq_len": seq_len} if given is None else None,
           "cross_entropy": facts.uses_cross_entropy, "batches": [b1, b2]}
    try:
        result = _run_probe_child(script, cfg, timeout, limit)
    except SandboxUnavailable as exc:  # user code never runs unisolated: the estimate stays static
        return fail("probe-unavailable", f"{script}: the probe was not run: {exc} The estimate is the conservative bound.")
    if result.timed_out:
        guessed = given is None and not cfg["input_candidates"]
        fed = ("an input it read off the model's first layer (an image taken as 224 x 224, a sequence as 128 long: "
               "set task.input_shape to what the script trains on)" if guessed else "the script's input")
        return fail("probe-timeout",
                    f"{script}: the probe (building the model at line {site_line} and running CPU training steps "
                    f"at batch {b1} and {b2} on {fed}) did not finish within {timeout:.0f} s and was killed; the "
                    "estimate is the conservative bound. The steps may be long on this CPU (AUTODL_PROBE_TIMEOUT_S "
                    "raises the limit), or the model's __init__ or forward loops or downloads.", line=site_line)
    for note in result.notes:
        res.findings.append(Finding(severity="info", code="probe-isolation", message=f"probe sandbox: {note}"))
    data, failure = _read_probe_report(script, result, limit, facts, site_line, (b1, b2))
    if failure is not None:
        return fail(*failure)
    _measured_probe(res, data, facts, batch, (b1, b2), inputs)
    res.seconds = round(time.monotonic() - t0, 3)
    return res


def declared_input(facts: ScriptFacts, input_shape: list[int] | None, seq_len: int | None) -> list[list[dict]] | None:
    """The inputs the spec or the script declares, as the probe feeds them: candidate lists (tried in order) of
    per-sample ``shape`` and ``dtype``, one dict per argument of the model's forward; None when only the built model
    can say (the probe child then reads its first layer).

    Token ids (the script's input is ``int64``) are ``[sequence length]``: the spec's ``sequence_length``, else the
    input shape's first dimension, else 128. Several ``InputSpec`` declarations are tried as the first alone (a
    ``paddle.Model``'s ``labels`` are InputSpecs too), then all together, unless the spec's ``task.input_shape``
    replaced the first.
    """
    specs = [{"shape": list(shape), "dtype": dtype} for shape, dtype in facts.input_specs]
    several = [specs] if len(specs) >= 2 and (input_shape is None or list(input_shape) == specs[0]["shape"]) else []
    if facts.input_dtype == "int64":
        return [[{"shape": [seq_len or (input_shape[0] if input_shape else None) or 128], "dtype": "int64"}], *several]
    if input_shape:
        return [[{"shape": list(input_shape), "dtype": "float32"}], *several]
    return None


def _run_probe_child(script: Path, cfg: dict, timeout: float, limit: int) -> SandboxResult:
    """Run the probe child on ``cfg`` in the sandbox (``timeout`` seconds, ``limit`` bytes of address space).

    :raises SandboxUnavailable: when no sandbox can run it (user code never runs unisolated).
    """
    with tempfile.TemporaryDirectory(prefix="autodl-probe-") as tmp:
        cfg_path = Path(tmp) / "probe.json"
        cfg_path.write_text(json.dumps(cfg))
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "CUDA_VISIBLE_DEVICES": "",
               "PYTHONDONTWRITEBYTECODE": "1", "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "2"),
               "GLOG_minloglevel": "2", "LANG": "C.UTF-8"}
        return run_sandboxed([sys.executable, "-s", str(CHILD), str(cfg_path)], workdir=Path(tmp), env=env,
                             limits=SandboxLimits(timeout_s=timeout, memory_bytes=limit),
                             read_only_paths=[script, CHILD, CHILD.with_name("_flops.py")])


_Failure: TypeAlias = tuple[str, str, str, "int | None"]
"""A probe failure's finding: (code, message, severity, line)."""


def _read_probe_report(script: Path, result: SandboxResult, limit: int, facts: ScriptFacts, site_line: int | None,
                       batches: tuple[int, int]) -> tuple[dict, _Failure | None]:
    """The probe child's report, or the failure that says why there is none or why it did not measure."""
    lines = [l for l in result.stdout.splitlines() if l.startswith("AUTODL_PROBE ")]
    if not lines:
        why = _no_report_reason(result, limit)
        return {}, ("probe-failed", f"{script}: the probe failed ({why}); the estimate is the conservative bound.",
                    "warning", None)
    try:  # the child runs the user's code in its own process: the line may be anything the script printed
        data = probe_report(lines[-1][len("AUTODL_PROBE "):], batches)
    except ValueError as exc:
        return {}, ("probe-failed", f"{script}: the probe's report could not be read ({exc}; the script's own code "
                                    "can print such a line); the estimate is the conservative bound.", "warning",
                    site_line)
    if data.get("ok"):
        return data, None
    if data.get("stage") == "input":  # the model was built; nothing said what it takes
        return data, ("probe-skipped", f"probe not run: {data.get('error')}; set task.input_shape in the spec.",
                      "info", site_line)
    if data.get("stage") == "step" and "required positional argument" in (data.get("error") or ""):
        return data, ("probe-failed", f"{script}: the model's forward takes more inputs than the probe fed it "
                                      f"({data.get('input_desc')}; Paddle said: {data['error']}); declare each with "
                                      "paddle.static.InputSpec in the script (task.input_shape gives one input). The "
                                      "estimate is the conservative bound.", "warning", site_line)
    dropped = _dropped_value_failure(script, data, facts, site_line) or _required_options_failure(script, data, facts,
                                                                                                 site_line)
    if dropped is not None:
        return data, dropped
    layer = data.get("layer")
    if data.get("stage") == "step" and layer:
        line = layer_line(facts.interp.tree, layer.get("layer"))
        shapes = layer.get("input_shapes")
        assumed = f"; it assumed {data['input_assumed']}" if data.get("input_assumed") else ""
        msg = (f"the model-only probe, feeding inputs it made up ({data.get('input_desc') or 'from the static reading'}"
               f"{assumed}), "
               f"stopped at layer '{layer['layer']}' ({layer['type']}): input shape {shapes[0] if shapes else '?'}, "
               f"weight shape {layer.get('weight_shape')}; Paddle said: {data['error']}. This may be the probe's "
               "guess of the input, not the script: check the layer's size, or set task.input_shape. The estimate "
               "is the conservative bound.")
        return data, ("probe-shape-mismatch", msg, "warning", line or site_line)
    return data, ("probe-failed", f"{script}: the probe failed while {'building the model' if data.get('stage') != 'step' else 'running a training step'} "
                                  f"({data.get('error')}); the estimate is the conservative bound.", "warning",
                  site_line)


_NAME_ERROR = re.compile(r"NameError: name '([A-Za-z_][A-Za-z0-9_]*)' is not defined")


def _dropped_value_failure(script: Path, data: dict, facts: ScriptFacts, site_line: int | None) -> _Failure | None:
    """The probe's ``NameError`` for a value that a module-level statement of the script sets and the probe did not
    run (``cfg = json.load(...)`` read in ``__init__``), said as the probe's limit, not the script's fault; None for
    any other failure."""
    found = _NAME_ERROR.match(data.get("error") or "")
    if found is None or facts.model_site is None:
        return None
    name, tree = found.group(1), facts.interp.tree
    where = _where_set(name, tree, facts.model_site)
    if not where.startswith("set by the module-level") or not _undefined_names(name, _kept_statements(tree, facts)):
        return None
    stage = data.get("stage") or ""
    doing = {"definitions": "defining the script's classes and functions",
             "step": "running a training step"}.get(stage, "building the model")
    reader = "the script's definitions read" if stage == "definitions" else "the model's code reads"
    return ("probe-failed", f"{script}: the probe could not finish {doing}: {reader} {name}, {where}, "
                            "which the probe does not run (it runs only the script's imports, definitions, constants "
                            "and config objects), so the NameError is the probe's limit, not a fault of the script; "
                            "the estimate is the conservative bound.", "warning", site_line)


def _required_options_failure(script: Path, data: dict, facts: ScriptFacts, site_line: int | None) -> _Failure | None:
    """The probe's failure where the script has required argparse options: the probe builds the model from the
    options' defaults, and a required one has none (it stands in None), so what fails is the probe's stand-in, not
    the script (a fresh user's ``--hidden``/``--layers``: "TypeError: can't multiply sequence by non-int of type
    'NoneType'"); None where the script has no required option or the error is not about a None (a layer's shape
    error is said as such)."""
    required = facts.interp.argparse_required
    if not required or "None" not in (data.get("error") or ""):
        return None
    doing = "running a training step" if data.get("stage") == "step" else "building the model"
    return ("probe-failed", f"{script}: the probe failed while {doing} ({data.get('error')}): it builds the model from "
                            f"the script's argparse defaults, and its required options ({', '.join(required[:6])}) have "
                            "none, so it stood in None for them: the probe's limit, not a fault of the script (the dry "
                            "run gives the script task.args); the estimate is the conservative bound.", "warning",
            site_line)


def _measured_probe(res: ProbeResult, data: dict, facts: ScriptFacts, batch: int, batches: tuple[int, int],
                    inputs: list[list[dict]] | None) -> None:
    """Fill ``res`` from a report that measured: the peaks at the two batches extrapolated to ``batch`` (bytes)."""
    b1, b2 = batches
    peaks = {int(k): int(v) for k, v in data["peaks"].items()}
    res.ok = True
    res.params, res.trainable = int(data["params"]), int(data["trainable"])
    res.peaks, res.batch_sizes = peaks, [b1, b2]
    slope = max(0, (peaks[b2] - peaks[b1]) // (b2 - b1))
    res.act_bytes_per_sample = slope
    w, g, o = E.model_states(res.params, res.trainable, facts.optimizer, None)
    res.tensor_peak_bytes = peaks[b1] + (batch - b1) * slope
    res.fixed_transient_bytes = max(0, peaks[b1] - b1 * slope - (w + g + o))
    res.forward_flops_per_sample = data.get("fwd_flops_per_sample")
    if data.get("input_index") is not None and data["input_index"] < len([c for c in (inputs or []) if c]):
        res.inputs_from = data.get("input_desc")
    if data.get("input_assumed"):
        line = facts.model_site.node.lineno if facts.model_site else None
        res.findings.append(Finding(severity="warning", code="probe-input-assumed", line=line, message=(
            f"neither the script nor the spec gives the model's input size: the probe fed it {data.get('input_desc')} "
            f"({data['input_assumed']}), and the figure holds for that size only; set task.input_shape (or "
            "task.sequence_length) in the spec to what the script trains on.")))


def layer_line(tree: ast.Module, name: str | None) -> int | None:
    """Line of the script's ``self.<attribute> = ...`` (or ``add_sublayer('<attribute>', ...)``) that made the
    sub-layer Paddle names ``name`` (dotted path, e.g. ``encoder.layers.0.linear1``: its last part that is not an
    index), the first such line when several classes set one; None when the script sets none."""
    attr = next((part for part in reversed((name or "").split(".")) if part and not part.isdigit()), None)
    lines = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if any(isinstance(t, ast.Attribute) and t.attr == attr and isinstance(t.value, ast.Name)
                   and t.value.id == "self" for t in targets):
                lines.append(node.lineno)
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "add_sublayer" \
                and node.args and isinstance(node.args[0], ast.Constant) and node.args[0].value == attr:
            lines.append(node.lineno)
    return min(lines) if attr and lines else None


__all__ = ["run_probe", "ProbeResult", "probe_program", "probe_batches", "probe_report"]
