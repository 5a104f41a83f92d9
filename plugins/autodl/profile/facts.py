"""The call-site facts of a training script: what it builds, how it trains, and what would break on a shared pool.

Reads the syntax tree only (:mod:`ast`); the script is never imported or run. Produces :class:`ScriptFacts`: the
model construction site, batch size, input shape, sequence length, optimizer, AMP level, distributed markers,
hard-coded devices, data-loader workers, and findings with line numbers. Nothing here estimates memory: the dry run
measures it, else the profile takes the conservative bound.
"""

from __future__ import annotations

import ast
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, TypeAlias

from autodl.profile import layers as L
from autodl.profile.interp import (
    DATASET_SHAPES,
    ArgsNS,
    ClassInfo,
    FuncRef,
    Interp,
    Mod,
    Opaque,
)
from autodl.types import Finding

OPTIMIZER_STATE_SLOTS = {
    "SGD": 0, "Momentum": 1, "Adam": 2, "AdamW": 2, "Adamax": 2, "Lamb": 2, "RMSProp": 2, "Adagrad": 1,
    "Adadelta": 2, "NAdam": 2, "RAdam": 2, "ASGD": 2, "LBFGS": 0, "Rprop": 2,
}
"""fp32 state tensors of each parameter's size per ``paddle.optimizer`` class: Momentum keeps a velocity;
Adam/AdamW/Lamb two moments (Kingma & Ba 2015, Alg. 1); RMSProp mean-square and momentum (plus mean-grad
when ``centered``); Adagrad a moment (``paddle/optimizer/*.py``, ``_create_accumulators``)."""

CONV_CALLS = frozenset({"Conv1D", "Conv2D", "Conv3D", "Conv1DTranspose", "Conv2DTranspose", "Conv3DTranspose",
                        "conv1d", "conv2d", "conv3d", "conv1d_transpose", "conv2d_transpose", "conv3d_transpose"})
"""``paddle.nn`` convolution layers and ``paddle.nn.functional`` convolutions: a script that calls one needs cuDNN's
workspace on the device (:data:`autodl.profile.memory.CUDNN_WORKSPACE_BYTES`) unless the dry run saw its model."""

SEQ_NAMES = ("seq_len", "seq_length", "max_len", "max_length", "max_seq_len", "max_seq_length", "sequence_length",
             "block_size", "context_length", "n_ctx", "seqlen", "maxlen")
BATCH_NAMES = ("batch_size", "bs", "train_batch_size", "batch", "per_device_batch_size", "micro_batch_size")


FunctionNode: TypeAlias = ast.FunctionDef | ast.AsyncFunctionDef
"""A script's ``def`` or ``async def``: the function a call site sits in."""


@dataclass
class ModelSite:
    node: ast.Call
    func: FunctionNode | None
    var: str | None
    kind: str  # 'class' | 'zoo' | 'sequential' | 'layer' | 'builder'


@dataclass
class ScriptFacts:
    """What the syntax tree says about the run."""

    interp: Interp
    findings: list[Finding] = field(default_factory=list)
    model_name: str | None = None
    model_site: ModelSite | None = None
    batch_size: int | None = None
    input_shape: list[int] | None = None
    input_dtype: str = "float32"
    input_specs: list[tuple[list[int], str]] = field(default_factory=list)  # every InputSpec: (shape, dtype)
    sequence_length: int | None = None
    optimizer: str | None = None
    optimizer_line: int | None = None
    amp: str | None = None
    distributed: str | None = None
    distributed_nprocs: int | None = None
    recompute: bool = False
    num_workers: int | None = 0
    loader_depth: int = 0
    uses_cross_entropy: bool = False
    has_conv: bool = False


def _dotted(node: ast.AST, interp: Interp, env: dict | None = None) -> str | None:
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name):
        return None
    base = (env or {}).get(node.id, interp.globals.get(node.id))
    if isinstance(base, Mod):
        root = base.path
    elif isinstance(base, ClassInfo):
        root = f"<local>.{base.name}"
    else:
        root = node.id
    return ".".join([root, *reversed(parts)])


class _Scanner(ast.NodeVisitor):
    def __init__(self, interp: Interp):
        self.interp = interp
        self.stack: list[ast.AST] = []
        self.calls: list[tuple[ast.Call, FunctionNode | None, bool, str]] = []  # node, func, in_layer, path
        self.assign_of: dict[int, str] = {}

    def visit_ClassDef(self, node):
        self.stack.append(node)
        self.generic_visit(node)
        self.stack.pop()

    def visit_FunctionDef(self, node):
        self.stack.append(node)
        self.generic_visit(node)
        self.stack.pop()

    visit_AsyncFunctionDef = visit_FunctionDef

    def visit_Assign(self, node):
        if isinstance(node.value, ast.Call) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            self.assign_of[id(node.value)] = node.targets[0].id
        self.generic_visit(node)

    def visit_Call(self, node):
        in_layer = any(isinstance(s, ast.ClassDef) and isinstance(self.interp.globals.get(s.name), ClassInfo)
                       and self.interp.globals[s.name].is_layer() for s in self.stack)
        funcs = [s for s in self.stack if isinstance(s, (ast.FunctionDef, ast.AsyncFunctionDef))]
        path = _dotted(node.func, self.interp) or ""
        self.calls.append((node, funcs[0] if funcs and not in_layer else None, in_layer, path))
        self.generic_visit(node)


_OUTSIDE = ("os.system", "os.popen", "os.remove", "os.unlink", "os.rmdir", "os.kill", "os.fork", "os.exec",
            "subprocess.", "socket.", "shutil.rmtree", "shutil.move", "requests.", "urllib.request.",
            "paddle.utils.download.", "wget.", "http.client.")
"""Calls that reach outside the script's process (processes, network, deleting files, downloads)."""


def _outside(path: str) -> bool:
    return bool(path) and path.startswith(_OUTSIDE)


def function_env(interp: Interp, func: FunctionNode | None, upto: int,
                 cache: dict[tuple[int, int], dict[str, Any]]) -> dict[str, Any]:
    """Locals of ``func`` from its straight-line assignments before line ``upto`` (best effort)."""
    if func is None:
        return {}
    key = (id(func), upto)
    if key in cache:
        return cache[key]
    env = _parameter_env(interp, func)
    _run_straight_line(interp, func.body, upto, env)
    cache[key] = env
    return env


def _parameter_env(interp: Interp, func: FunctionNode) -> dict[str, Any]:
    """``func``'s parameters that have a default, by that default; a parameter named like a parsed configuration
    (``args``, ``opt``, ``config``, ``cfg``, ``flags``) without one is the script's argparse defaults."""
    env: dict[str, Any] = {}
    a = func.args
    params = a.posonlyargs + a.args
    for p, d in zip(params[len(params) - len(a.defaults):], a.defaults):
        try:
            env[p.arg] = interp.eval(d, {})
        except Exception:
            pass
    for p in params:
        if p.arg in ("args", "opt", "config", "cfg", "flags") and p.arg not in env:
            env[p.arg] = ArgsNS(dict(interp.argparse))
    return env


def _run_straight_line(interp: Interp, body: list[ast.stmt], upto: int, env: dict[str, Any]) -> None:
    """Run the assignments and imports of ``body`` before line ``upto`` into ``env``, into ``with``/``if``/``try``
    bodies; a name whose value cannot be followed is Opaque."""
    for stmt in body:
        if getattr(stmt, "lineno", 0) >= upto:
            return
        if isinstance(stmt, (ast.Assign, ast.AnnAssign)):
            try:
                interp.exec_stmt(stmt, env)
            except Exception:
                targets = stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target]
                for t in targets:
                    if isinstance(t, ast.Name):
                        env[t.id] = Opaque("local")
        elif isinstance(stmt, (ast.With, ast.If, ast.Try)):
            _run_straight_line(interp, stmt.body, upto, env)
        elif isinstance(stmt, (ast.Import, ast.ImportFrom)):
            interp.load_stmt(stmt)


def _int(v: Any) -> int | None:
    return int(v) if isinstance(v, int) and not isinstance(v, bool) and v > 0 else None


_SAMPLE_MAKERS = {"rand": "args", "randn": "args", "zeros": "shape", "ones": "shape", "empty": "shape",
                  "standard_normal": "shape", "random": "shape", "uniform": "size", "normal": "size",
                  "randint": "size", "full": "shape"}
"""numpy/paddle calls whose result's shape a Dataset's ``__getitem__`` states: ``rand(C, L)`` takes the sizes as
arguments, the others a shape (first positional or this keyword)."""


def _dataset_sample(interp: Interp, value: Callable[[ast.expr], Any]) -> tuple[list[int], str] | None:
    """Shape and dtype of the first item a script-defined Dataset's ``__getitem__`` returns, when it is made by a
    numpy/paddle call with sizes the module's constants give (``np.random.randn(CHANNELS, LENGTH).astype(...)``);
    None when it cannot be read (the dry run then reads the real sample)."""
    for getitem in _dataset_getitems(interp):
        for ret in ast.walk(getitem):
            if not isinstance(ret, ast.Return) or ret.value is None:
                continue
            sample = _returned_sample(getitem, ret, ret.value, value)
            if sample is not None:
                return sample
    return None


def _dataset_getitems(interp: Interp) -> Iterator[FunctionNode]:
    """The ``__getitem__`` of each script-defined class with a ``*Dataset*`` library base, in definition order."""
    for obj in list(interp.globals.values()):
        if not isinstance(obj, ClassInfo):
            continue
        if not any((isinstance(b, Mod) and "Dataset" in b.path.split(".")[-1]) for b in obj.bases):
            continue
        found = obj.find("__getitem__")
        if found:
            yield found[1]


def _returned_sample(getitem: FunctionNode, ret: ast.Return, returned: ast.expr,
                     value: Callable[[ast.expr], Any]) -> tuple[list[int], str] | None:
    """Shape and dtype of the first item ``return <returned>`` gives, when a sample maker makes it; else None."""
    e = _named_value(getitem, _first_item(returned), ret.lineno)
    e, dtype = _strip_conversions(e)
    if not (isinstance(e, ast.Call) and isinstance(e.func, ast.Attribute) and e.func.attr in _SAMPLE_MAKERS):
        return None
    shape = _maker_shape(e, e.func.attr, value)
    dtype = _maker_dtype(e, e.func.attr, dtype)
    if shape and all(isinstance(d, int) and not isinstance(d, bool) and 0 < d <= 1 << 24 for d in shape):
        if e.func.attr == "randint" and dtype == "float32":
            dtype = "int64"
        return shape, dtype
    return None


def _first_item(e: ast.expr) -> ast.expr:
    """The model's input among what ``__getitem__`` returns: a tuple's or list's first item, a dict's
    ``input_ids`` (``{"input_ids": ids, ...}``) or first value."""
    if isinstance(e, (ast.Tuple, ast.List)) and e.elts:
        e = e.elts[0]
    if isinstance(e, ast.Dict) and e.values:
        keys = [k.value if isinstance(k, ast.Constant) else None for k in e.keys]
        e = e.values[keys.index("input_ids")] if "input_ids" in keys else e.values[0]
    return e


def _named_value(getitem: FunctionNode, e: ast.expr, before_line: int) -> ast.expr:
    """For a returned name, the value of its first plain assignment above the return
    (``ids = np.zeros(SEQ, "int64"); ...; return ids``); else ``e`` itself."""
    if not isinstance(e, ast.Name):
        return e
    made = [a.value for a in ast.walk(getitem) if isinstance(a, ast.Assign) and len(a.targets) == 1
            and isinstance(a.targets[0], ast.Name) and a.targets[0].id == e.id and a.lineno < before_line]
    return made[0] if made else e


def _dtype_name(dt: ast.expr | None) -> str | None:
    """A dtype written as a string (``"int64"``) or an attribute (``np.int64``, ``paddle.float16``)."""
    if isinstance(dt, ast.Constant) and isinstance(dt.value, str):
        return dt.value
    if isinstance(dt, ast.Attribute):
        return dt.attr
    return None


def _strip_conversions(e: ast.expr) -> tuple[ast.expr, str]:
    """The call under ``x.astype("float32") / 255.0`` and ``paddle.to_tensor(x)``, and the dtype an ``astype``
    names (float32 when none does)."""
    dtype = "float32"
    while True:
        if isinstance(e, ast.BinOp):
            e = e.left
        elif isinstance(e, ast.Call) and isinstance(e.func, ast.Attribute) and e.func.attr == "astype" and e.args:
            named = _dtype_name(e.args[0])
            if named is not None:
                dtype = named
            e = e.func.value
        elif isinstance(e, ast.Call) and isinstance(e.func, ast.Attribute) and e.func.attr == "to_tensor" and e.args:
            e = e.args[0]
        else:
            return e, dtype


def _maker_shape(e: ast.Call, maker: str, value: Callable[[ast.expr], Any]) -> list[Any] | None:
    """The shape a sample maker's call states (its sizes as arguments, or its shape argument); None when the
    reading cannot follow it."""
    how = _SAMPLE_MAKERS[maker]
    try:
        if how == "args":
            return [value(a) for a in e.args]
        k = next((k.value for k in e.keywords if k.arg in (how, "shape", "size")), None)
        if k is None and e.args:
            k = e.args[-1] if maker in ("randint", "uniform", "normal") else e.args[0]
        shape = value(k) if k is not None else None
        return [shape] if isinstance(shape, int) else list(shape) if isinstance(shape, (list, tuple)) else None
    except Exception:  # noqa: BLE001 - what the reading cannot follow stays unknown
        return None


def _maker_dtype(e: ast.Call, maker: str, dtype: str) -> str:
    """The maker's own ``dtype`` (keyword, or ``zeros(shape, dtype)``'s second argument) unless an ``astype``
    already named one."""
    dt = next((k.value for k in e.keywords if k.arg == "dtype"), None)
    if dt is None and maker in ("zeros", "ones", "empty") and len(e.args) >= 2:
        dt = e.args[1]
    named = _dtype_name(dt)
    if named is not None and dtype == "float32":
        return named
    return dtype


def _kwarg(node: ast.Call, name: str, pos: int | None = None) -> ast.expr | None:
    """The expression a call passes as ``name=`` (or at position ``pos``), or None."""
    for k in node.keywords:
        if k.arg == name:
            return k.value
    if pos is not None and len(node.args) > pos:
        return node.args[pos]
    return None


@dataclass(frozen=True)
class _Call:
    """One call site outside a ``paddle.nn.Layer`` subclass: its node, enclosing function and dotted path."""

    node: ast.Call
    func: FunctionNode | None
    path: str

    @property
    def last(self) -> str:
        return self.path.split(".")[-1] if self.path else ""

    @property
    def line(self) -> int:
        return self.node.lineno


class _CallSites:
    """Reads each call site's fact into :class:`ScriptFacts` and the candidates the whole script decides between
    (batch sizes, input shapes, model constructions).

    One fact per call, first match in :attr:`_FACT_READERS` order; then whether the call constructs the model.
    """

    def __init__(self, interp: Interp, facts: ScriptFacts, assign_of: dict[int, str]):
        self.interp = interp
        self.facts = facts
        self.assign_of = assign_of
        self.envs: dict[tuple[int, int], dict[str, Any]] = {}
        self.model_sites: list[ModelSite] = []
        self.layer_sites: list[ModelSite] = []  # a bare paddle.nn layer as the model (``model = nn.Linear(...)``)
        self.side_effects: list[tuple[int, str]] = []
        self.batch_candidates: list[int] = []
        self.shape_candidates: list[tuple[list[int], str, int]] = []  # shape, dtype, line (0: a dataset default)
        self.input_specs: list[tuple[list[int], str]] = []
        self.numpy_batches: list[list[int]] = []

    # ------------------------------------------------------------------------------------------ values
    def env_for(self, node: ast.AST, func: FunctionNode | None) -> dict[str, Any]:
        return function_env(self.interp, func, getattr(node, "lineno", 0), self.envs)

    def value(self, node: ast.AST, func: FunctionNode | None, expr: ast.expr | None) -> Any:
        """``expr``'s value in ``func``'s locals before ``node``; None without an expression, Opaque when the
        evaluator fails."""
        if expr is None:
            return None
        try:
            return self.interp.eval(expr, self.env_for(node, func))
        except Exception:
            return Opaque("value")

    def arg(self, call: _Call, name: str, pos: int | None = None) -> Any:
        """The value a call passes as ``name=`` (or at ``pos``)."""
        return self.value(call.node, call.func, _kwarg(call.node, name, pos))

    def add(self, finding: Finding) -> None:
        self.facts.findings.append(finding)

    # ------------------------------------------------------------------------------------------ one call
    def read(self, node: ast.Call, func: FunctionNode | None, in_layer: bool, path: str) -> None:
        call = _Call(node, func, path)
        if call.last in CONV_CALLS or L.is_zoo(path):
            self.facts.has_conv = True
        if in_layer:  # inside a Layer subclass: only its loss; the class itself is the model
            if call.last in ("cross_entropy", "CrossEntropyLoss"):
                self.facts.uses_cross_entropy = True
            return
        for reader in self._FACT_READERS:
            if reader(self, call):
                break
        self._model_construction(call)

    # ------------------------------------------------------------------- data loading and batch size
    def _data_loader(self, call: _Call) -> bool:
        last, node = call.last, call.node
        if not (last in ("DataLoader", "BatchSampler", "DistributedBatchSampler")
                or (last == "fit" and _kwarg(node, "batch_size"))):
            return False
        b = _int(self.arg(call, "batch_size", 2 if last == "BatchSampler" else None))
        if b:
            self.batch_candidates.append(b)
        if last == "DataLoader":
            self._loader_workers(call)
        return True

    def _loader_workers(self, call: _Call) -> None:
        """``DataLoader(num_workers=...)``: a worker count read or unknown (findings), and the batches a
        single-process loader keeps in the training process (:attr:`ScriptFacts.loader_depth`)."""
        nw_expr = _kwarg(call.node, "num_workers", 9)
        nw = self.value(call.node, call.func, nw_expr)
        known = isinstance(nw, int) and not isinstance(nw, bool)
        if nw_expr is not None and not known and self.facts.num_workers == 0:
            self.facts.num_workers = None
            self.add(_workers_unknown_finding(call.line, nw_expr))
        if not (known and nw > 0):
            # a single-process loader (or one whose workers are unknown: the conservative reading) keeps
            # its prefetched batches as tensors in Paddle's allocator during the step
            pf = self.arg(call, "prefetch_factor", 11)
            pf = pf if isinstance(pf, int) and not isinstance(pf, bool) and 0 < pf <= 64 else 2
            buffered = self.arg(call, "use_buffer_reader", 10)
            self.facts.loader_depth = max(self.facts.loader_depth, pf + (2 if buffered is False else 3))
        if isinstance(nw, int) and nw > 0:
            self.facts.num_workers = nw
            self.add(_workers_finding(call.line, nw))

    # ---------------------------------------------------------------------- optimizer, AMP, distributed
    def _optimizer(self, call: _Call) -> bool:
        if not (call.path.startswith("paddle.optimizer.") and call.last in OPTIMIZER_STATE_SLOTS):
            return False
        self.facts.optimizer, self.facts.optimizer_line = call.last, call.line
        return True

    def _amp(self, call: _Call) -> bool:
        last = call.last
        if not (call.path.startswith("paddle.amp.") or last in ("auto_cast", "decorate", "GradScaler", "amp_guard")):
            return False
        if last in ("auto_cast", "decorate", "amp_guard"):
            lvl = self.arg(call, "level")
            level = lvl if isinstance(lvl, str) and lvl in ("O1", "O2") else "O1"
            if self.facts.amp != "O2":
                self.facts.amp = level
        elif last == "GradScaler" and self.facts.amp is None:
            self.facts.amp = "O1"
        return True

    def _fleet(self, call: _Call) -> bool:
        if not (call.last == "distributed_optimizer" or (call.last == "init" and "fleet" in call.path)):
            return False
        self.facts.distributed = "fleet"
        return True

    def _data_parallel(self, call: _Call) -> bool:
        if not (call.last in ("DataParallel", "init_parallel_env") and self.facts.distributed != "fleet"):
            return False
        self.facts.distributed = "data_parallel"
        return True

    def _spawn(self, call: _Call) -> bool:
        if not (call.last == "spawn" and "distributed" in call.path):
            return False
        self.facts.distributed_nprocs = _int(self.arg(call, "nprocs", 2))
        self.facts.distributed = self.facts.distributed or "data_parallel"
        return True

    def _recompute(self, call: _Call) -> bool:
        if call.last not in ("recompute", "recompute_sequential"):
            return False
        self.facts.recompute = True
        return True

    # ------------------------------------------------------------------------------ hard-coded devices
    def _set_device(self, call: _Call) -> bool:
        if not (call.last in ("set_device",) and "paddle" in call.path):
            return False
        v = self.arg(call, "device", 0)
        if isinstance(v, str) and ":" in v and v.split(":")[0] in ("gpu", "npu", "xpu", "mlu", "custom"):
            self.add(_set_device_finding(call.line, v))
        return True

    def _device_place(self, call: _Call) -> bool:
        last = call.last
        if last not in ("CUDAPlace", "NPUPlace", "XPUPlace", "CustomPlace"):
            return False
        v = self.arg(call, "id", 0 if last != "CustomPlace" else 1)
        idx = str(v) if isinstance(v, int) else "?"
        self.add(Finding(severity="warning" if idx != "0" else "info", code="hardcoded-device", line=call.line,
                         message=f"line {call.line}: {last}({idx}) hard-codes a device index; autodl pins the run's "
                                 "devices with CUDA_VISIBLE_DEVICES so they appear as 0..n-1; use "
                                 "paddle.distributed.ParallelEnv().dev_id or set_device('gpu')."))
        return True

    # ----------------------------------------------------------------------------- outside the process
    def _side_effect(self, call: _Call) -> bool:
        if not _outside(call.path):
            return False
        self.side_effects.append((call.line, call.path))
        return True

    def _cross_entropy(self, call: _Call) -> bool:
        if call.last not in ("cross_entropy", "CrossEntropyLoss", "softmax_with_cross_entropy"):
            return False
        self.facts.uses_cross_entropy = True
        return True

    # --------------------------------------------------------------------------------- input shape
    def _vision_dataset(self, call: _Call) -> bool:
        if not (call.last in DATASET_SHAPES and "vision" in call.path):
            return False
        self.shape_candidates.append((list(DATASET_SHAPES[call.last]), "float32", 0))
        return True

    def _image_resize(self, call: _Call) -> bool:
        if not (call.last in ("Resize", "RandomResizedCrop", "CenterCrop", "RandomCrop") and "transforms" in call.path):
            return False
        s = self.arg(call, "size", 0)
        if isinstance(s, int):
            self.shape_candidates.append(([-1, s, s], "float32", 0))
        elif isinstance(s, (tuple, list)) and len(s) == 2 and all(isinstance(d, int) for d in s):  # (height, width)
            self.shape_candidates.append(([-1, s[0], s[1]], "float32", 0))
        return True

    def _input_spec(self, call: _Call) -> bool:
        """paddle.static.InputSpec([None, 3, 96, 96], "float32"): the input the script declares for to_static."""
        if call.last != "InputSpec":
            return False
        shp = self.arg(call, "shape", 0)
        dt = self.arg(call, "dtype", 1)
        if isinstance(shp, (list, tuple)) and len(shp) >= 2 and all(isinstance(d, int) and d > 0 for d in shp[1:]):
            self.input_specs.append(([*shp[1:]], dt if isinstance(dt, str) else "float32"))
        return True

    def _numpy_batch(self, call: _Call) -> bool:
        """np.random.rand(B, C, H, W): sizes as arguments; a batch only when its first size is the batch size
        (inside a Dataset's __getitem__ it is one sample: read by _dataset_sample)."""
        node, func = call.node, call.func
        if not (call.last in ("rand", "randn") and call.path.startswith("numpy") and len(node.args) >= 2):
            return False
        shp = [self.value(node, func, a) for a in node.args]
        if all(isinstance(d, int) and not isinstance(d, bool) and d > 0 for d in shp) \
                and not (func is not None and func.name == "__getitem__"):
            self.numpy_batches.append(shp)
        return True

    def _created_tensor(self, call: _Call) -> bool:
        last = call.last
        if last not in ("randn", "rand", "zeros", "ones", "uniform", "normal", "randint", "full", "standard_normal"):
            return False
        shp = self.arg(call, "shape", 2 if last == "randint" else 0)
        if isinstance(shp, (list, tuple)) and len(shp) >= 2 and all(isinstance(s, int) for s in shp):
            dt = self.arg(call, "dtype")
            dtype = "int64" if last == "randint" or (isinstance(dt, str) and "int" in dt) else "float32"
            self.shape_candidates.append((list(shp), dtype, call.line))
        return True

    _FACT_READERS: tuple[Callable[[_CallSites, _Call], bool], ...] = (
        _data_loader, _optimizer, _amp, _fleet, _data_parallel, _spawn, _recompute, _set_device, _device_place,
        _side_effect, _cross_entropy, _vision_dataset, _image_resize, _input_spec, _numpy_batch, _created_tensor)

    # ---------------------------------------------------------------------------- model construction
    def _model_construction(self, call: _Call) -> None:
        """A construction the trained model may be: a script Layer class, ``Sequential`` or a zoo model, a bare
        ``paddle.nn`` layer assigned to a name, or a builder function assigned to ``model``/``net``/``network``."""
        node, path, last = call.node, call.path, call.last
        var = self.assign_of.get(id(node))
        if path.startswith("<local>."):
            cls = self.interp.globals.get(path.split(".")[1])
            if isinstance(cls, ClassInfo) and cls.is_layer():
                self.model_sites.append(ModelSite(node, call.func, var, "class"))
        elif path.startswith("paddle") and (last == "Sequential" or "vision.models" in path or
                                            (len(path.split(".")) >= 3 and path.split(".")[-2] == "vision")):
            if last == "Sequential" or L.is_zoo(path):
                self.model_sites.append(ModelSite(node, call.func, var, "zoo" if last != "Sequential" else "sequential"))
        elif path.startswith("paddle") and last in L.LAYER_NAMES and var:
            self.layer_sites.append(ModelSite(node, call.func, var, "layer"))
        elif isinstance(self.interp.globals.get(path), FuncRef) and path in self.interp.globals:
            # a builder function (def build_model(): return Net()) assigned to a variable
            fnode = self.interp.globals[path].node
            if any(isinstance(n, ast.Return) and isinstance(n.value, ast.Call) for n in ast.walk(fnode)) and \
                    var in ("model", "net", "network"):
                self.model_sites.append(ModelSite(node, call.func, var, "builder"))


def _workers_unknown_finding(line: int, nw_expr: ast.expr) -> Finding:
    return Finding(severity="warning", code="dataloader-workers-unknown", line=line,
                   message=f"line {line}: DataLoader(num_workers={ast.unparse(nw_expr)}) takes its worker "
                           "count from a value the static reading cannot know (a config file, the "
                           "environment); assumed > 0, so the launcher gives the run a larger /dev/shm "
                           "(worker processes exchange batches through shared memory).")


def _workers_finding(line: int, nw: int) -> Finding:
    return Finding(severity="warning", code="dataloader-workers", line=line,
                   message=f"line {line}: DataLoader(num_workers={nw}) starts worker processes that exchange "
                           "batches through shared memory; in a container /dev/shm is 64 MiB by default. "
                           "autodl's Docker/Kubernetes launchers must give the run a larger /dev/shm "
                           "(shm_size / an emptyDir with medium: Memory), or set num_workers=0.")


def _set_device_finding(line: int, device: str) -> Finding:
    idx = device.split(":")[1]
    return Finding(severity="warning" if idx != "0" else "info", code="hardcoded-device", line=line,
                   message=f"line {line}: set_device('{device}') pins device index {idx}; autodl sets "
                           "CUDA_VISIBLE_DEVICES (or the vendor's variable) so the run sees its leased "
                           "devices as 0..n-1, and index " + idx + " may not exist or belong to another run; "
                           "use set_device('gpu') or read the device from the environment.")


def _trained_names(tree: ast.Module, interp: Interp) -> set[str]:
    """Names whose ``.parameters()`` are taken, or that are wrapped by ``DataParallel``/``distributed_model``/
    ``Model``: the constructions the script trains."""
    used: set[str] = set()
    for n in ast.walk(tree):
        if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr == "parameters" \
                and isinstance(n.func.value, ast.Name):
            used.add(n.func.value.id)
        if isinstance(n, ast.Call) and _dotted(n.func, interp) and (_dotted(n.func, interp) or "").endswith(
                ("DataParallel", "distributed_model", "Model")) and n.args and isinstance(n.args[0], ast.Name):
            used.add(n.args[0].id)
    return used


def _trained_site(model_sites: list[ModelSite], layer_sites: list[ModelSite], used: set[str]) -> ModelSite | None:
    """Which construction is the trained model: the last whose variable is trained, else the last assigned one,
    else the last one; without any, a single ``paddle.nn`` layer trained (or named) as the model."""
    site = None
    for s in model_sites:
        if s.var and s.var in used:
            site = s
    if site is None:
        top = [s for s in model_sites if s.var]
        candidates = top or model_sites
        site = candidates[-1] if candidates else None
    if site is None:  # no model class, Sequential or zoo model: a single layer trained as the model
        chosen = [s for s in layer_sites if s.var in used] or [s for s in layer_sites if s.var in ("model", "net", "network")]
        site = chosen[-1] if chosen else None
    return site


def _hyper_parameters(facts: ScriptFacts, sites: _CallSites, site: ModelSite | None) -> None:
    """Batch size (a loader's, else a constant named like one) and sequence length (a constant named like one):
    argparse defaults, module constants and the model site's function locals, by lower-case name."""
    consts: dict[str, Any] = {}
    consts.update({k: v for k, v in sites.interp.argparse.items()})
    consts.update({k.lower(): v for k, v in sites.interp.globals.items() if isinstance(v, int)})
    if site is not None and site.func is not None:
        consts.update({k.lower(): v for k, v in sites.env_for(site.node, site.func).items() if isinstance(v, int)})
    if sites.batch_candidates:
        facts.batch_size = sites.batch_candidates[0]
    else:
        for name in BATCH_NAMES:
            if _int(consts.get(name)):
                facts.batch_size = consts[name]
                break
    for name in SEQ_NAMES:
        if _int(consts.get(name)):
            facts.sequence_length = consts[name]
            break


def _input_from_tensors(facts: ScriptFacts, sites: _CallSites) -> None:
    """Input shape and dtype from the tensors the script creates: one whose first size is the batch size (which
    also gives the batch size when none is known), else a library dataset's or a resize's sample shape, else a
    numpy batch of the batch size."""
    for shp, dt, line in sites.shape_candidates:
        if line and (facts.batch_size is None or shp[0] == facts.batch_size):
            if facts.batch_size is None:
                facts.batch_size = shp[0]
            facts.input_shape, facts.input_dtype = shp[1:], dt
            if dt == "int64" and len(shp) == 2:
                facts.sequence_length = facts.sequence_length or shp[1]
            break
    else:  # a library dataset's default sample first, then a resize (its transform) over it, wherever written
        for shp, dt, line in sorted(sites.shape_candidates, key=lambda c: c[0][0] == -1):
            if not line:
                if shp[0] == -1 and facts.input_shape:
                    facts.input_shape = [facts.input_shape[0], shp[1], shp[2]]
                elif shp[0] == -1:
                    facts.input_shape = [3, shp[1], shp[2]]
                else:
                    facts.input_shape = shp
    if facts.input_shape is None and facts.batch_size:
        for shp in sites.numpy_batches:
            if shp[0] == facts.batch_size:
                facts.input_shape, facts.input_dtype = shp[1:], "float32"
                break


def _declared_input(facts: ScriptFacts, sites: _CallSites) -> None:
    """An ``InputSpec`` the script declares wins over tensors it creates and dataset defaults; without an input
    shape so far, the script's own Dataset's sample (esttest F5) is taken over a library dataset's default."""
    if sites.input_specs:
        facts.input_shape, facts.input_dtype = sites.input_specs[0]
        facts.input_specs = list(sites.input_specs)
    elif facts.input_shape is None:
        sample = _dataset_sample(sites.interp, lambda e: sites.value(e, None, e))
        if sample is not None:
            facts.input_shape, facts.input_dtype = sample
            if "int" in sample[1] and len(sample[0]) == 1:  # token ids: the sequence length too
                facts.sequence_length = facts.sequence_length or sample[0][0]


def _model_name(interp: Interp, site: ModelSite) -> str | None:
    """The trained model's name as its construction says it: the script class, zoo constructor or layer it calls (for
    a builder function, the call the builder returns)."""
    call = site.node
    if site.kind == "builder":
        builder = interp.globals.get(_dotted(call.func, interp) or "")
        returns = [n.value for n in ast.walk(builder.node) if isinstance(n, ast.Return) and isinstance(n.value, ast.Call)] \
            if isinstance(builder, FuncRef) else []
        call = max(returns, key=lambda c: c.lineno) if returns else call
    path = _dotted(call.func, interp)
    return path.split(".")[-1] if path else None


def _whole_script_findings(facts: ScriptFacts, interp: Interp, side_effects: list[tuple[int, str]]) -> None:
    """Findings about the analysis and the script as a whole: bounded analysis, side effects, recompute."""
    add = facts.findings.append
    if interp.budget.exceeded:  # the bounds of autodl.profile.bounds: a warning and the fallback, never a hang
        add(Finding(severity="warning", code="analysis-bounded",
                    message=f"{interp.budget.exceeded}; the estimate falls back to what it knows without the model "
                            "(cold start) unless the probe measures it. Set task.input_shape and batch_size_per_gpu "
                            "in the spec, or simplify the model's __init__ (no long loops or deep recursion)."))
    if side_effects:
        where = ", ".join(f"line {ln}: {p}" for ln, p in side_effects[:6])
        add(Finding(severity="info", code="side-effects", line=side_effects[0][0], message=(
            f"the script acts outside its process ({where}{', ...' if len(side_effects) > 6 else ''}): the "
            "profile's dry run runs it in the sandbox only (no network, read-only files outside its working "
            "directory), so such calls fail or do nothing there; the real run will do them.")))
    if facts.recompute:
        add(Finding(severity="info", code="recompute", message="recompute is used: activations of recomputed "
                    "segments are not kept; the activation estimate is an upper bound."))


def scan(tree: ast.Module, source: str) -> ScriptFacts:
    """Collect :class:`ScriptFacts` from a parsed script."""
    interp = Interp(tree)
    facts = ScriptFacts(interp=interp)
    sc = _Scanner(interp)
    sc.visit(tree)
    sites = _CallSites(interp, facts, sc.assign_of)
    for node, func, in_layer, path in sc.calls:
        sites.read(node, func, in_layer, path)
    site = _trained_site(sites.model_sites, sites.layer_sites, _trained_names(tree, interp))
    facts.model_site = site
    _hyper_parameters(facts, sites, site)
    _input_from_tensors(facts, sites)
    _declared_input(facts, sites)
    if site is not None:
        facts.model_name = _model_name(interp, site)
    _whole_script_findings(facts, interp, sites.side_effects)
    return facts
