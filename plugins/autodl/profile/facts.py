"""The call-site facts of a training script: what it builds, how it trains, and what would break on a shared pool.

Reads the syntax tree only (:mod:`ast`); the script is never imported or run. Produces :class:`ScriptFacts`: the
model construction site, batch size, input shape, sequence length, optimizer, AMP level, distributed markers,
hard-coded devices, data-loader workers, and findings with line numbers. Nothing here estimates memory: the dry run
measures it, else the profile takes the conservative bound.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass, field
from typing import Any

from autodl.profile import layers as L
from autodl.profile.interp import (
    DATASET_SHAPES,
    ArgsNS,
    ClassInfo,
    FuncRef,
    Interp,
    LayerObj,
    Mod,
    Opaque,
    UserObj,
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


@dataclass
class ModelSite:
    node: ast.Call
    func: ast.FunctionDef | None
    var: str | None
    kind: str  # 'class' | 'zoo' | 'sequential'


@dataclass
class ScriptFacts:
    """What the syntax tree says about the run."""

    interp: Interp
    findings: list[Finding] = field(default_factory=list)
    model: Any = None
    model_name: str | None = None
    model_line: int | None = None
    model_site: ModelSite | None = None
    batch_size: int | None = None
    input_shape: list[int] | None = None
    input_dtype: str = "float32"
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
    build_error: str | None = None


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
        self.calls: list[tuple[ast.Call, ast.FunctionDef | None, bool, str]] = []  # node, func, in_layer, path
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


def function_env(interp: Interp, func: ast.FunctionDef | None, upto: int, cache: dict) -> dict:
    """Locals of ``func`` from its straight-line assignments before line ``upto`` (best effort)."""
    if func is None:
        return {}
    key = (id(func), upto)
    if key in cache:
        return cache[key]
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

    def walk(body):
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
                walk(stmt.body)
            elif isinstance(stmt, (ast.Import, ast.ImportFrom)):
                interp._load_stmt(stmt)

    walk(func.body)
    cache[key] = env
    return env


def _int(v: Any) -> int | None:
    return int(v) if isinstance(v, int) and not isinstance(v, bool) and v > 0 else None


_SAMPLE_MAKERS = {"rand": "args", "randn": "args", "zeros": "shape", "ones": "shape", "empty": "shape",
                  "standard_normal": "shape", "random": "shape", "uniform": "size", "normal": "size",
                  "randint": "size", "full": "shape"}
"""numpy/paddle calls whose result's shape a Dataset's ``__getitem__`` states: ``rand(C, L)`` takes the sizes as
arguments, the others a shape (first positional or this keyword)."""


def _dataset_sample(interp: Interp, value) -> tuple[list[int], str] | None:
    """Shape and dtype of the first item a script-defined Dataset's ``__getitem__`` returns, when it is made by a
    numpy/paddle call with sizes the module's constants give (``np.random.randn(CHANNELS, LENGTH).astype(...)``);
    None when it cannot be read (the dry run then reads the real sample)."""
    for obj in list(interp.globals.values()):
        if not isinstance(obj, ClassInfo):
            continue
        if not any((isinstance(b, Mod) and "Dataset" in b.path.split(".")[-1]) for b in obj.bases):
            continue
        found = obj.find("__getitem__")
        if not found:
            continue
        for ret in ast.walk(found[1]):
            if not isinstance(ret, ast.Return) or ret.value is None:
                continue
            e = ret.value.elts[0] if isinstance(ret.value, (ast.Tuple, ast.List)) and ret.value.elts else ret.value
            if isinstance(e, ast.Dict) and e.values:  # {"input_ids": ids, ...}: the model's first input
                keys = [k.value if isinstance(k, ast.Constant) else None for k in e.keys]
                e = e.values[keys.index("input_ids")] if "input_ids" in keys else e.values[0]
            if isinstance(e, ast.Name):  # ids = np.zeros(SEQ, "int64"); ...; return ids
                made = [a.value for a in ast.walk(found[1]) if isinstance(a, ast.Assign) and len(a.targets) == 1
                        and isinstance(a.targets[0], ast.Name) and a.targets[0].id == e.id
                        and a.lineno < ret.lineno]
                if made:
                    e = made[0]
            dtype = "float32"
            while True:  # x.astype("float32") / 255.0, paddle.to_tensor(x)
                if isinstance(e, ast.BinOp):
                    e = e.left
                elif isinstance(e, ast.Call) and isinstance(e.func, ast.Attribute) and e.func.attr == "astype" \
                        and e.args:
                    dt = e.args[0]
                    if isinstance(dt, ast.Constant) and isinstance(dt.value, str):
                        dtype = dt.value
                    elif isinstance(dt, ast.Attribute):
                        dtype = dt.attr
                    e = e.func.value
                elif isinstance(e, ast.Call) and isinstance(e.func, ast.Attribute) and e.func.attr == "to_tensor" \
                        and e.args:
                    e = e.args[0]
                else:
                    break
            if not (isinstance(e, ast.Call) and isinstance(e.func, ast.Attribute) and e.func.attr in _SAMPLE_MAKERS):
                continue
            how = _SAMPLE_MAKERS[e.func.attr]
            try:
                if how == "args":
                    shape = [value(a) for a in e.args]
                else:
                    k = next((k.value for k in e.keywords if k.arg in (how, "shape", "size")), None)
                    if k is None and e.args:
                        k = e.args[-1] if e.func.attr in ("randint", "uniform", "normal") else e.args[0]
                    shape = value(k) if k is not None else None
                    shape = [shape] if isinstance(shape, int) else list(shape) if isinstance(shape, (list, tuple)) else None
            except Exception:  # noqa: BLE001 - what the reading cannot follow stays unknown
                shape = None
            dt = next((k.value for k in e.keywords if k.arg == "dtype"), None)
            if dt is None and e.func.attr in ("zeros", "ones", "empty") and len(e.args) >= 2:
                dt = e.args[1]
            if isinstance(dt, ast.Constant) and isinstance(dt.value, str) and dtype == "float32":
                dtype = dt.value
            elif isinstance(dt, ast.Attribute) and dtype == "float32":
                dtype = dt.attr
            if shape and all(isinstance(d, int) and not isinstance(d, bool) and 0 < d <= 1 << 24 for d in shape):
                if e.func.attr == "randint" and dtype == "float32":
                    dtype = "int64"
                return shape, dtype
    return None


def scan(tree: ast.Module, source: str) -> ScriptFacts:
    """Collect :class:`ScriptFacts` from a parsed script."""
    interp = Interp(tree)
    facts = ScriptFacts(interp=interp)
    sc = _Scanner(interp)
    sc.visit(tree)
    envs: dict = {}
    add = facts.findings.append

    def env_for(node, func):
        return function_env(interp, func, node.lineno, envs)

    def kw(node, name, pos=None):
        for k in node.keywords:
            if k.arg == name:
                return k.value
        if pos is not None and len(node.args) > pos:
            return node.args[pos]
        return None

    def val(node, func, expr):
        if expr is None:
            return None
        try:
            return interp.eval(expr, env_for(node, func))
        except Exception:
            return Opaque("value")

    model_sites: list[ModelSite] = []
    side_effects: list[tuple[int, str]] = []
    layer_sites: list[ModelSite] = []  # a bare paddle.nn layer as the model (``model = nn.Linear(...)``)
    batch_candidates: list[int] = []
    shape_candidates: list[tuple[list[int], str, int]] = []
    input_specs: list[tuple[list[int], str]] = []
    numpy_batches: list[list[int]] = []
    for node, func, in_layer, path in sc.calls:
        last = path.split(".")[-1] if path else ""
        line = node.lineno
        if last in CONV_CALLS or L.is_zoo(path):
            facts.has_conv = True
        if in_layer:
            if last in ("cross_entropy", "CrossEntropyLoss"):
                facts.uses_cross_entropy = True
            continue
        if last in ("DataLoader", "BatchSampler", "DistributedBatchSampler") or (last == "fit" and kw(node, "batch_size")):
            b = _int(val(node, func, kw(node, "batch_size", 2 if last == "BatchSampler" else None)))
            if b:
                batch_candidates.append(b)
            if last == "DataLoader":
                nw_expr = kw(node, "num_workers", 9)
                nw = val(node, func, nw_expr)
                if nw_expr is not None and not (isinstance(nw, int) and not isinstance(nw, bool)) \
                        and facts.num_workers == 0:
                    facts.num_workers = None
                    add(Finding(severity="warning", code="dataloader-workers-unknown", line=line,
                                message=f"line {line}: DataLoader(num_workers={ast.unparse(nw_expr)}) takes its worker "
                                        "count from a value the static reading cannot know (a config file, the "
                                        "environment); assumed > 0, so the launcher gives the run a larger /dev/shm "
                                        "(worker processes exchange batches through shared memory)."))
                if not (isinstance(nw, int) and not isinstance(nw, bool) and nw > 0):
                    # a single-process loader (or one whose workers are unknown: the conservative reading) keeps
                    # its prefetched batches as tensors in Paddle's allocator during the step
                    pf = val(node, func, kw(node, "prefetch_factor", 11))
                    pf = pf if isinstance(pf, int) and not isinstance(pf, bool) and 0 < pf <= 64 else 2
                    buffered = val(node, func, kw(node, "use_buffer_reader", 10))
                    facts.loader_depth = max(facts.loader_depth, pf + (2 if buffered is False else 3))
                if isinstance(nw, int) and nw > 0:
                    facts.num_workers = nw
                    add(Finding(severity="warning", code="dataloader-workers", line=line,
                                message=f"line {line}: DataLoader(num_workers={nw}) starts worker processes that exchange "
                                        "batches through shared memory; in a container /dev/shm is 64 MiB by default. "
                                        "autodl's Docker/Kubernetes launchers must give the run a larger /dev/shm "
                                        "(shm_size / an emptyDir with medium: Memory), or set num_workers=0."))
        elif path.startswith("paddle.optimizer.") and last in OPTIMIZER_STATE_SLOTS:
            facts.optimizer, facts.optimizer_line = last, line
        elif path.startswith("paddle.amp.") or last in ("auto_cast", "decorate", "GradScaler", "amp_guard"):
            if last in ("auto_cast", "decorate", "amp_guard"):
                lvl = val(node, func, kw(node, "level"))
                level = lvl if isinstance(lvl, str) and lvl in ("O1", "O2") else "O1"
                if facts.amp != "O2":
                    facts.amp = level
            elif last == "GradScaler" and facts.amp is None:
                facts.amp = "O1"
        elif last == "distributed_optimizer" or (last == "init" and "fleet" in path):
            facts.distributed = "fleet"
        elif last in ("DataParallel", "init_parallel_env") and facts.distributed != "fleet":
            facts.distributed = "data_parallel"
        elif last == "spawn" and "distributed" in path:
            n = _int(val(node, func, kw(node, "nprocs", 2)))
            facts.distributed_nprocs = n
            facts.distributed = facts.distributed or "data_parallel"
        elif last == "recompute" or last == "recompute_sequential":
            facts.recompute = True
        elif last in ("set_device",) and "paddle" in path:
            v = val(node, func, kw(node, "device", 0))
            if isinstance(v, str) and ":" in v and v.split(":")[0] in ("gpu", "npu", "xpu", "mlu", "custom"):
                idx = v.split(":")[1]
                add(Finding(severity="warning" if idx != "0" else "info", code="hardcoded-device", line=line,
                            message=f"line {line}: set_device('{v}') pins device index {idx}; autodl sets "
                                    "CUDA_VISIBLE_DEVICES (or the vendor's variable) so the run sees its leased "
                                    "devices as 0..n-1, and index " + idx + " may not exist or belong to another run; "
                                    "use set_device('gpu') or read the device from the environment."))
        elif last in ("CUDAPlace", "NPUPlace", "XPUPlace", "CustomPlace"):
            v = val(node, func, kw(node, "id", 0 if last != "CustomPlace" else 1))
            idx = str(v) if isinstance(v, int) else "?"
            add(Finding(severity="warning" if idx != "0" else "info", code="hardcoded-device", line=line,
                        message=f"line {line}: {last}({idx}) hard-codes a device index; autodl pins the run's devices "
                                "with CUDA_VISIBLE_DEVICES so they appear as 0..n-1; use "
                                "paddle.distributed.ParallelEnv().dev_id or set_device('gpu')."))
        elif _outside(path):
            side_effects.append((line, path))
        elif last in ("cross_entropy", "CrossEntropyLoss", "softmax_with_cross_entropy"):
            facts.uses_cross_entropy = True
        elif last in DATASET_SHAPES and "vision" in path:
            shape_candidates.append((list(DATASET_SHAPES[last]), "float32", 0))
        elif last in ("Resize", "RandomResizedCrop", "CenterCrop", "RandomCrop") and "transforms" in path:
            s = val(node, func, kw(node, "size", 0))
            if isinstance(s, int):
                shape_candidates.append(([-1, s, s], "float32", 0))
        elif last == "InputSpec":
            # paddle.static.InputSpec([None, 3, 96, 96], "float32"): the input the script declares for to_static
            shp = val(node, func, kw(node, "shape", 0))
            dt = val(node, func, kw(node, "dtype", 1))
            if isinstance(shp, (list, tuple)) and len(shp) >= 2 and all(isinstance(d, int) and d > 0 for d in shp[1:]):
                input_specs.append(([*shp[1:]], dt if isinstance(dt, str) else "float32"))
        elif last in ("rand", "randn") and path.startswith("numpy") and len(node.args) >= 2:
            # np.random.rand(B, C, H, W): sizes as arguments; a batch only when its first size is the batch size
            # (inside a Dataset's __getitem__ it is one sample: read by _dataset_sample)
            shp = [val(node, func, a) for a in node.args]
            if all(isinstance(d, int) and not isinstance(d, bool) and d > 0 for d in shp) \
                    and not (func is not None and func.name == "__getitem__"):
                numpy_batches.append(shp)
        elif last in ("randn", "rand", "zeros", "ones", "uniform", "normal", "randint", "full", "standard_normal"):
            shp = val(node, func, kw(node, "shape", 2 if last == "randint" else 0))
            if isinstance(shp, (list, tuple)) and len(shp) >= 2 and all(isinstance(s, int) for s in shp):
                dt = val(node, func, kw(node, "dtype"))
                dtype = "int64" if last == "randint" or (isinstance(dt, str) and "int" in dt) else "float32"
                shape_candidates.append((list(shp), dtype, line))
        # model construction
        if path.startswith("<local>."):
            cls = interp.globals.get(path.split(".")[1])
            if isinstance(cls, ClassInfo) and cls.is_layer():
                model_sites.append(ModelSite(node, func, sc.assign_of.get(id(node)), "class"))
        elif path.startswith("paddle") and (last == "Sequential" or "vision.models" in path or
                                            (len(path.split(".")) >= 3 and path.split(".")[-2] == "vision")):
            if last == "Sequential" or L.is_zoo(path):
                model_sites.append(ModelSite(node, func, sc.assign_of.get(id(node)), "zoo" if last != "Sequential" else "sequential"))
        elif path.startswith("paddle") and last in L.LAYERS and sc.assign_of.get(id(node)):
            layer_sites.append(ModelSite(node, func, sc.assign_of.get(id(node)), "layer"))
        elif isinstance(interp.globals.get(path), FuncRef) and path in interp.globals:
            # a builder function (def build_model(): return Net()) assigned to a variable
            fnode = interp.globals[path].node
            if any(isinstance(n, ast.Return) and isinstance(n.value, ast.Call) for n in ast.walk(fnode)) and \
                    sc.assign_of.get(id(node)) in ("model", "net", "network"):
                model_sites.append(ModelSite(node, func, sc.assign_of.get(id(node)), "builder"))

    # which construction is the trained model: the one whose .parameters() reach the optimizer
    used: set[str] = set()
    for n in ast.walk(tree):
        if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr == "parameters" \
                and isinstance(n.func.value, ast.Name):
            used.add(n.func.value.id)
        if isinstance(n, ast.Call) and _dotted(n.func, interp) and (_dotted(n.func, interp) or "").endswith(
                ("DataParallel", "distributed_model", "Model")) and n.args and isinstance(n.args[0], ast.Name):
            used.add(n.args[0].id)
    site = None
    for s in model_sites:
        if s.var and s.var in used:
            site = s
    if site is None:
        top = [s for s in model_sites if s.var]
        site = (top or model_sites or [None])[-1]
    if site is None:  # no model class, Sequential or zoo model: a single layer trained as the model
        chosen = [s for s in layer_sites if s.var in used] or [s for s in layer_sites if s.var in ("model", "net", "network")]
        site = chosen[-1] if chosen else None
    facts.model_site = site

    # hyper-parameters
    consts: dict[str, Any] = {}
    consts.update({k: v for k, v in interp.argparse.items()})
    consts.update({k.lower(): v for k, v in interp.globals.items() if isinstance(v, int)})
    if site is not None and site.func is not None:
        consts.update({k.lower(): v for k, v in env_for(site.node, site.func).items() if isinstance(v, int)})
    if batch_candidates:
        facts.batch_size = batch_candidates[0]
    else:
        for n in BATCH_NAMES:
            if _int(consts.get(n)):
                facts.batch_size = consts[n]
                break
    for n in SEQ_NAMES:
        if _int(consts.get(n)):
            facts.sequence_length = consts[n]
            break
    # input: prefer a created tensor whose first dim is the batch size
    for shp, dt, line in shape_candidates:
        if line and (facts.batch_size is None or shp[0] == facts.batch_size):
            if facts.batch_size is None:
                facts.batch_size = shp[0]
            facts.input_shape, facts.input_dtype = shp[1:], dt
            if dt == "int64" and len(shp) == 2:
                facts.sequence_length = facts.sequence_length or shp[1]
            break
    else:
        for shp, dt, line in shape_candidates:
            if not line:
                if shp[0] == -1 and facts.input_shape:
                    facts.input_shape = [facts.input_shape[0], shp[1], shp[2]]
                elif shp[0] == -1:
                    facts.input_shape = [3, shp[1], shp[2]]
                else:
                    facts.input_shape = shp
    if facts.input_shape is None and facts.batch_size:
        for shp in numpy_batches:
            if shp[0] == facts.batch_size:
                facts.input_shape, facts.input_dtype = shp[1:], "float32"
                break
    if input_specs:  # declared by the script itself: wins over tensors it creates and dataset defaults
        facts.input_shape, facts.input_dtype = input_specs[0]
    elif facts.input_shape is None:
        sample = _dataset_sample(interp, lambda e: val(e, None, e))
        if sample is not None:  # the script's own Dataset's sample (esttest F5): over a library dataset's default
            facts.input_shape, facts.input_dtype = sample
            if "int" in sample[1] and len(sample[0]) == 1:  # token ids: the sequence length too
                facts.sequence_length = facts.sequence_length or sample[0][0]
    # build the model
    if site is not None:
        try:
            env = env_for(site.node, site.func)
            obj = interp.eval(site.node, env)
            if isinstance(obj, (LayerObj, UserObj)):
                facts.model = obj
                facts.model_line = site.node.lineno
                facts.model_name = obj.cls.name if isinstance(obj, UserObj) else obj.type.replace("zoo:", "")
                name_tree(obj, "")
            else:
                facts.build_error = f"the model construction at line {site.node.lineno} could not be evaluated"
        except (L.Unsupported, RecursionError, TypeError, ValueError, KeyError, IndexError, AttributeError,
                ZeroDivisionError) as exc:
            facts.build_error = f"the model construction at line {site.node.lineno} could not be followed ({exc})"
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
    return facts


def name_tree(obj: Any, prefix: str, seen: set | None = None) -> None:
    """Give every sub-layer its dotted attribute path (e.g. ``encoder.layers.0.linear1``)."""
    seen = seen if seen is not None else set()
    if id(obj) in seen:
        return
    seen.add(id(obj))
    if isinstance(obj, UserObj):
        for k, v in obj.attrs.items():
            if isinstance(v, (LayerObj, UserObj)):
                v.name = f"{prefix}{k}"
                name_tree(v, f"{prefix}{k}.", seen)
    elif isinstance(obj, LayerObj):
        for k, v in obj.children:
            if isinstance(v, (LayerObj, UserObj)):
                if v.name is None or v.name.isidentifier() and "." not in v.name:
                    v.name = f"{prefix}{k}"
                name_tree(v, f"{prefix}{k}.", seen)


def contains(obj: Any, types: tuple[str, ...], seen: set | None = None) -> LayerObj | None:
    """The first built-in layer of one of ``types`` in definition order, or None."""
    seen = seen if seen is not None else set()
    if id(obj) in seen:
        return None
    seen.add(id(obj))
    if isinstance(obj, LayerObj):
        if obj.type in types:
            return obj
        for _, v in obj.children:
            r = contains(v, types, seen)
            if r is not None:
                return r
        if obj.type in ("TransformerEncoder",) and "TransformerEncoderLayer" in types:
            return obj.children[0][1] if obj.children else None
    if isinstance(obj, UserObj):
        for v in obj.attrs.values():
            r = contains(v, types, seen)
            if r is not None:
                return r
    return None
