"""Ground truth for one training script, in a fresh Python process (truth.py's method, widened to more styles).

    python measure.py [--phase train|eval] [--no-ref-flops] [--max-over-steps N] SCRIPT [script args...]

Prints one line ``TRUTH {json}``. Adapted from ``tests/cases/estimator/truth.py`` (the handed cases' truth); the
method is the same:

* the script runs as itself (``runpy.run_path(..., run_name="__main__")``, its own ``sys.argv``, its own model,
  optimizer, data pipeline and loop), on CPU (``CUDA_VISIBLE_DEVICES=""``, ``paddle.set_device("cpu")``);
* the model is the first top-level ``paddle.nn.Layer.__call__`` of a layer that has parameters; at that call
  ``gc.collect()`` runs;
* ``--phase train`` (default): a "step" is what the script does between two gradient clears that follow an
  optimizer update.  The first such clear ends the warm-up step: ``gc.collect()`` then
  ``core.host_memory_stat_reset_peak_value("Allocated", 0)``; the second ends the measured step and
  ``core.host_memory_stat_peak_value("Allocated", 0)`` (bytes) is the truth.  Then the process ends
  (``os._exit(0)``).
* ``--phase eval``: training runs on unmeasured; an "eval step" is one top-level call of the model with gradients
  disabled (``paddle.no_grad`` / ``@no_grad``) plus whatever the script does until the next event.  At the start of
  the second eval call: ``gc.collect()`` then reset of the peak; at the next event (the third eval call, a
  call of the model with gradients on, ``Layer.train()`` on the model, an optimizer update or clear, or the end of
  the script) the peak is read and the process ends.  ``first_eval_peak`` is a side reading: the peak from the
  start of the first eval call to the start of the second (after ``gc.collect()`` and a reset), i.e. the first eval
  step, when the previous eval step's outputs are not yet alive.

Widened (each change gives the same number as truth.py on a script truth.py handles; the handed cases were
re-measured with both):

* an optimizer update is ``Optimizer.step`` (as truth.py) **or** ``Optimizer.minimize`` (``paddle.Model.fit``, the
  static-style ``opt.minimize(loss)``); a gradient clear is ``Optimizer.clear_grad`` (as truth.py) **or**
  ``Layer.clear_gradients`` (``paddle.Model.fit`` clears through the network);
* a clear counts only if an update happened since the previous counted clear (truth.py counts every clear after
  the first update; the two agree when a script clears once per update, as all handed cases do).

Also reported:

* ``params`` / ``trainable``: exact parameter counts of the model (``sum(p.numel())``), and ``opt_params``: the
  count of the parameters the optimizer updates (a cross-check; they differ when a script trains several top-level
  layers or freezes some);
* ``fwd_flops_per_call``: truth.py's reference forward FLOPs of the measured step, counted with hooks: 2 x MACs of
  Conv*/Linear/RNN layers and of ``paddle.matmul``/``bmm``/``@`` (element-wise ops not counted), per forward call;
  ``fwd_flops_in_backward_per_call``: the part of it the hooks counted inside ``Tensor.backward`` (forward passes
  recomputed there, ``recompute``; 0 without);
* ``ref_flops`` (train phase, unless ``--no-ref-flops``): ``paddle.flops(model, input_shape,
  print_detail=False)`` at the exact input shape of the model's first call, **only** when that call had exactly
  one positional tensor input, no keyword tensors, and a floating dtype (``paddle.flops`` feeds
  ``paddle.randn``, so token-id and multi-input models get none).  It is run after the peak was read, so it does
  not disturb the measurement.  Paddle counts about one op per multiply-add for Conv/Linear plus element ops of
  BatchNorm/activations/pooling, and zero for layers it has no rule for (e.g. RNNs, Embedding, attention
  matmuls inside custom layers);
* ``step_s``: wall seconds of the measured step; ``total_s``: wall seconds from start to the reading.

``--max-over-steps N`` (train phase; default off, so a plain run is unchanged): for scripts whose inputs change
size between steps (variable image sizes, graphs of different sizes, bucketed lengths) one step is not the truth.
After the warm-up step, N consecutive steps are measured, each from its own ``gc.collect()`` + peak reset at the
clear that starts it to the clear that ends it; ``peak`` is the largest of them, ``per_step_peak_bytes`` and
``per_step_s`` list them all, ``max_over_steps`` is N and ``peak_step`` the 0-based index of the largest.
``fwd_flops_per_call`` is then averaged over the N steps' forward calls.  If the script ends before N steps were
measured, the steps measured so far are reported with ``ended_by`` saying so (none measured is an error).
"""
import gc
import json
import math
import os
import runpy
import sys
import time

os.environ.setdefault("CUDA_VISIBLE_DEVICES", "")
import paddle  # noqa: E402
from paddle.base import core  # noqa: E402

paddle.set_device("cpu")

args = sys.argv[1:]
phase = "train"
ref_flops_wanted = True
max_over_steps = 0
while args and args[0].startswith("--"):
    opt = args.pop(0)
    if opt == "--phase":
        phase = args.pop(0)
    elif opt.startswith("--phase="):
        phase = opt.split("=", 1)[1]
    elif opt == "--no-ref-flops":
        ref_flops_wanted = False
    elif opt == "--max-over-steps":
        max_over_steps = int(args.pop(0))
    elif opt.startswith("--max-over-steps="):
        max_over_steps = int(opt.split("=", 1)[1])
    else:
        sys.exit(f"measure.py: unknown option {opt!r}; use --phase train|eval, --no-ref-flops, --max-over-steps N")
if phase not in ("train", "eval") or not args or max_over_steps < 0 or (max_over_steps and phase != "train"):
    sys.exit("usage: measure.py [--phase train|eval] [--no-ref-flops] [--max-over-steps N (train only)] "
             "SCRIPT [script args...]")
script, argv = args[0], args[1:]
state = {"model": None, "updates_since_clear": 0, "updates": 0, "clears": 0, "counting": False, "flops": 0.0,
         "fwd_calls": 0, "input": None, "single_float_input": False, "t0": time.time(), "in_rnn": 0,
         "eval_calls": 0, "eval_measuring": False, "done": False, "opt": None, "step_peaks": [], "step_s": [],
         "in_backward": False, "bwd_flops": 0.0}


# --------------------------------------------------------------------------- FLOP reference (forward), as truth.py
def _conv_hook(layer, inputs, output):
    if not state["counting"]:
        return
    w = layer.weight
    kprod = math.prod(w.shape[2:])
    if "Transpose" in type(layer).__name__:
        x = inputs[0]
        macs = int(x.numel()) * w.shape[1] * kprod
    else:
        macs = int(output.numel()) * w.shape[1] * kprod
    state["flops"] += 2.0 * macs


def _linear_hook(layer, inputs, output):
    if not state["counting"]:
        return
    fin, fout = layer.weight.shape
    rows = int(output.numel()) // fout
    state["flops"] += 2.0 * rows * fin * fout


def _rnn_hook(layer, inputs, output):
    if not state["counting"]:
        return
    x = inputs[0]
    t_major = getattr(layer, "time_major", False)
    b, t = (x.shape[1], x.shape[0]) if t_major else (x.shape[0], x.shape[1])
    gates = {"LSTM": 4, "GRU": 3}.get(type(layer).__name__, 1)
    h = layer.hidden_size
    dirs = layer.num_directions
    macs = 0
    for n in range(layer.num_layers):
        inp = layer.input_size if n == 0 else h * dirs
        macs += dirs * gates * h * (inp + h)
    state["flops"] += 2.0 * b * t * macs


_orig_matmul = paddle.matmul


def _count_matmul(x, y, transpose_x=False, transpose_y=False):
    if not state["counting"] or state["in_rnn"]:
        return
    xs, ys = list(x.shape), list(y.shape)
    if len(xs) == 1:
        xs = [1] + xs
    if len(ys) == 1:
        ys = ys + [1]
    if transpose_x:
        xs[-1], xs[-2] = xs[-2], xs[-1]
    if transpose_y:
        ys[-1], ys[-2] = ys[-2], ys[-1]
    bx, by = xs[:-2], ys[:-2]
    nb = max(len(bx), len(by))
    bx, by = [1] * (nb - len(bx)) + bx, [1] * (nb - len(by)) + by
    batch = math.prod(max(a, b) for a, b in zip(bx, by))
    state["flops"] += 2.0 * batch * xs[-2] * xs[-1] * ys[-1]


def matmul(x, y, transpose_x=False, transpose_y=False, name=None):
    _count_matmul(x, y, transpose_x, transpose_y)
    return _orig_matmul(x, y, transpose_x, transpose_y, name)


def bmm(x, y, name=None):
    _count_matmul(x, y)
    return _orig_matmul(x, y)


paddle.matmul = matmul
paddle.tensor.matmul = matmul
for _name in ("paddle.tensor", "paddle.tensor.linalg", "paddle.linalg"):  # MultiHeadAttention calls the module's
    if hasattr(sys.modules.get(_name), "matmul"):
        sys.modules[_name].matmul = matmul
paddle.bmm = bmm
_orig_t_matmul = paddle.Tensor.__matmul__


def t_matmul(self, other):
    _count_matmul(self, other)
    return _orig_t_matmul(self, other)


paddle.Tensor.__matmul__ = t_matmul
_orig_t_method = paddle.Tensor.matmul


def t_method(self, y, transpose_x=False, transpose_y=False, name=None):
    _count_matmul(self, y, transpose_x, transpose_y)
    return _orig_t_method(self, y, transpose_x, transpose_y, name)


paddle.Tensor.matmul = t_method
_orig_backward = paddle.Tensor.backward


def t_backward(self, *a, **k):
    """``loss.backward()``: what the hooks count while it runs is forward passes recomputed inside it (``recompute``),
    kept apart as ``bwd_flops`` (they are part of the step's forward calls, and of ``fwd_flops_per_call``)."""
    before, outer = state["flops"], state["in_backward"]
    state["in_backward"] = True
    try:
        return _orig_backward(self, *a, **k)
    finally:
        state["in_backward"] = outer
        if not outer:
            state["bwd_flops"] += state["flops"] - before


paddle.Tensor.backward = t_backward


# ------------------------------------------------------------------------------- reporting
def _count(params):
    seen, total, trainable = set(), 0, 0
    for p in params:
        if id(p) in seen:
            continue
        seen.add(id(p))
        total += int(p.numel())
        trainable += 0 if p.stop_gradient else int(p.numel())
    return total, trainable


def _opt_params(opt):
    if opt is None:
        return None
    plist = getattr(opt, "_parameter_list", None) or []
    flat = []
    for p in plist:
        if isinstance(p, dict):
            flat.extend(p["params"])
        else:
            flat.append(p)
    return _count(flat)[0]


def _ref_flops(m):
    if not ref_flops_wanted or m is None or not state["single_float_input"]:
        return None, None
    shape = state["input"][0]
    import contextlib
    import io
    orig_int = paddle.Tensor.__int__

    def one_element_int(t):
        # paddle.flops calls int() on its shape-[1] counters; NumPy >= 2.3 refuses int() of a 1-element 1-D array
        # ("only 0-dimensional arrays can be converted"), so read the one element; the count is unchanged.
        a = t.numpy()
        return int(a.reshape(-1)[0]) if a.size == 1 else int(a)

    paddle.Tensor.__int__ = one_element_int
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            return int(paddle.flops(m, shape, print_detail=False)), shape
    except Exception as e:  # a reference we could not get is recorded as such, never as 0
        return None, f"paddle.flops failed: {type(e).__name__}: {e}"
    finally:
        paddle.Tensor.__int__ = orig_int


def report(peak, what):
    state["done"] = True
    state["counting"] = False
    m = state["model"]
    params, trainable = _count(m.parameters()) if m is not None else (None, None)
    calls = max(1, state["fwd_calls"])
    out = {"phase": phase, "peak": peak, "params": params, "trainable": trainable,
           "opt_params": _opt_params(state["opt"]), "model": type(m).__name__ if m is not None else None,
           "input": state["input"], "fwd_flops_per_call": state["flops"] / calls, "fwd_calls": state["fwd_calls"],
           "fwd_flops_in_backward_per_call": state["bwd_flops"] / calls,
           "step_s": round(time.time() - state["t_step"], 2), "total_s": round(time.time() - state["t0"], 1),
           "opt": type(state["opt"]).__name__ if state["opt"] is not None else None, "ended_by": what,
           "paddle": paddle.__version__}
    if phase == "eval":
        out["first_eval_peak"] = state.get("first_eval_peak")
    if max_over_steps:
        out["max_over_steps"] = max_over_steps
        out["per_step_peak_bytes"] = state["step_peaks"]
        out["per_step_s"] = state["step_s"]
        out["peak_step"] = state["step_peaks"].index(peak)
        out["step_s"] = max(state["step_s"])
    if phase == "train":
        out["ref_flops"], out["ref_flops_input"] = _ref_flops(m)
    print("\nTRUTH " + json.dumps(out), flush=True)  # a newline first: a progress bar may hold the line
    sys.stdout.flush()
    _end_children()
    os._exit(0)


def _end_children():
    """DataLoader worker processes (num_workers > 0) do not notice os._exit of their parent: end them here."""
    import multiprocessing
    kids = multiprocessing.active_children()
    for c in kids:
        c.terminate()
    for c in kids:
        c.join(timeout=10)


def _end_eval(what):
    if state["eval_measuring"] and not state["done"]:
        report(int(core.host_memory_stat_peak_value("Allocated", 0)), what)


# ------------------------------------------------------------------------------- model capture
orig_call = paddle.nn.Layer.__call__
depth = [0]
hooked_ids = set()


def attach(model):
    for sub in model.sublayers(include_self=True):
        if id(sub) in hooked_ids:
            continue
        hooked_ids.add(id(sub))
        n = type(sub).__name__
        if n.startswith("Conv") and hasattr(sub, "weight"):
            sub.register_forward_post_hook(_conv_hook)
        elif n == "Linear":
            sub.register_forward_post_hook(_linear_hook)
        elif n in ("LSTM", "GRU", "SimpleRNN"):
            sub.register_forward_post_hook(_rnn_hook)


def call(self, *a, **k):
    top = depth[0] == 0
    if top and state["model"] is None and list(self.parameters()):
        state["model"] = self
        attach(self)
        x = a[0] if a else next(iter(k.values()), None)
        if isinstance(x, paddle.Tensor):
            state["input"] = [list(x.shape), str(x.dtype).split(".")[-1]]
            state["single_float_input"] = (len(a) == 1 and not any(isinstance(v, paddle.Tensor) for v in k.values())
                                           and x.dtype in (paddle.float32, paddle.float16, paddle.bfloat16,
                                                           paddle.float64))
        gc.collect()
    if top and self is state["model"]:
        if state["counting"]:
            state["fwd_calls"] += 1
        if phase == "eval" and not state["done"]:
            if paddle.is_grad_enabled():
                _end_eval("a forward with gradients on")
            else:
                state["eval_calls"] += 1
                if state["eval_calls"] == 1:  # side reading: the first eval step (a warm-up, as in training)
                    gc.collect()
                    core.host_memory_stat_reset_peak_value("Allocated", 0)
                elif state["eval_calls"] == 2:
                    state["first_eval_peak"] = int(core.host_memory_stat_peak_value("Allocated", 0))
                    gc.collect()
                    core.host_memory_stat_reset_peak_value("Allocated", 0)
                    state["eval_measuring"] = True
                    state["counting"] = True
                    state["t_step"] = time.time()
                elif state["eval_calls"] == 3:
                    _end_eval("the next eval forward")
    depth[0] += 1
    try:
        return orig_call(self, *a, **k)
    finally:
        depth[0] -= 1


paddle.nn.Layer.__call__ = call

orig_train = paddle.nn.Layer.train


def train_mode(self, *a, **k):
    if self is state["model"]:
        _end_eval("model.train()")
    return orig_train(self, *a, **k)


paddle.nn.Layer.train = train_mode


# ------------------------------------------------------------------------------- step boundaries
def on_clear(opt):
    if phase == "eval":
        _end_eval("a gradient clear")
        return
    if state["updates_since_clear"] == 0:
        return
    state["updates_since_clear"] = 0
    state["clears"] += 1
    if state["clears"] == 1:
        gc.collect()
        core.host_memory_stat_reset_peak_value("Allocated", 0)
        state["counting"] = True
        state["t_step"] = time.time()
    elif max_over_steps:
        _end_one_of_many_steps(opt)
    elif state["clears"] == 2:
        if opt is not None:
            state["opt"] = opt
        report(int(core.host_memory_stat_peak_value("Allocated", 0)), "the second gradient clear")


def _end_one_of_many_steps(opt):
    """``--max-over-steps N``: record the step that this clear ends; report the max after N, else start the next."""
    state["step_peaks"].append(int(core.host_memory_stat_peak_value("Allocated", 0)))
    state["step_s"].append(round(time.time() - state["t_step"], 2))
    if opt is not None:
        state["opt"] = opt
    if len(state["step_peaks"]) == max_over_steps:
        report(max(state["step_peaks"]),
               f"gradient clear number {max_over_steps + 1} (max over {max_over_steps} steps)")
    gc.collect()
    core.host_memory_stat_reset_peak_value("Allocated", 0)
    state["t_step"] = time.time()


orig_clear = paddle.optimizer.Optimizer.clear_grad


def clear(self, *a, **k):
    r = orig_clear(self, *a, **k)
    on_clear(self)
    return r


orig_layer_clear = paddle.nn.Layer.clear_gradients


def layer_clear(self, *a, **k):
    r = orig_layer_clear(self, *a, **k)
    if depth[0] == 0:
        on_clear(None)
    return r


in_update = [0]


def _wrap_update(orig):
    def upd(self, *a, **k):
        outer = in_update[0] == 0
        if outer:
            if phase == "eval":
                _end_eval("an optimizer update")
            state["opt"] = self
        in_update[0] += 1
        try:
            return orig(self, *a, **k)
        finally:
            in_update[0] -= 1
            if outer:
                state["updates"] += 1
                state["updates_since_clear"] += 1
    return upd


import inspect  # noqa: E402
for _n in dir(paddle.optimizer):
    _c = getattr(paddle.optimizer, _n)
    if inspect.isclass(_c) and issubclass(_c, paddle.optimizer.Optimizer):
        for _m in ("step", "minimize"):
            if _m in _c.__dict__:
                setattr(_c, _m, _wrap_update(_c.__dict__[_m]))
paddle.optimizer.Optimizer.clear_grad = clear
paddle.nn.Layer.clear_gradients = layer_clear

sys.argv = [script, *argv]
sys.path.insert(0, os.path.dirname(os.path.abspath(script)))
runpy.run_path(script, run_name="__main__")
_end_eval("the end of the script")
if max_over_steps and state["step_peaks"] and not state["done"]:
    report(max(state["step_peaks"]), f"the end of the script after {len(state['step_peaks'])} of {max_over_steps} "
                                     "measured steps")
print("TRUTH " + json.dumps({"error": f"the script ended before the {phase} step was measured",
                             "clears": state["clears"], "updates": state["updates"],
                             "eval_calls": state["eval_calls"]}), flush=True)
