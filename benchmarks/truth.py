"""Ground truth for one training script, in a fresh Python process (the estimator cases' ``truth.py``, extended).

    python benchmarks/truth.py [--eval] [--fake-datasets] SCRIPT [script args...]

Runs the real script (its own ``__main__``, model, optimizer and training loop) with hooks:

* ``Optimizer.clear_grad``/``Layer.clear_gradients`` after an optimizer update: the first one ends the warm-up
  step -> ``gc.collect()``, ``core.host_memory_stat_reset_peak_value("Allocated", 0)``; the second one ends the
  measured step -> ``core.host_memory_stat_peak_value("Allocated", 0)`` is the training step's truth (bytes).
  With N optimizers built before training starts (a GAN's two), a step is N such updates: the peak is read
  over updates N+1..2N (every optimizer's, after each has warmed up);
* ``--eval``: the script goes on until its first evaluation call (a top-level forward, under ``no_grad`` or in
  ``eval()`` mode, of a model the optimizer trains) has ended; its peak (reset at its entry, read when the script
  next calls a model or ends) is the evaluation pass's truth;
* ``--fake-datasets``: ``paddle.vision.datasets`` classes yield random samples of their real shapes and dtypes
  (the scripts that download them can be measured with no network; memory does not depend on pixel values).

Parameters: every parameter of the top-level layers the script called and of the optimizer (each once) -- a
frozen teacher counts, its weights are in memory. FLOPs: the reference forward count of ``autodl/profile/_flops.py``
(2 x MACs of Conv*/Linear/RNN layers and matmul/bmm/@), per forward call and per sample.
Prints one line ``TRUTH {json}``.
"""
import gc
import importlib.util
import json
import os
import runpy
import signal
import sys
import time

args = sys.argv[1:]
EVAL = "--eval" in args
FAKE = "--fake-datasets" in args
args = [a for a in args if a not in ("--eval", "--fake-datasets")]
script, argv = args[0], args[1:]
os.environ.setdefault("CUDA_VISIBLE_DEVICES", "")
import numpy as np  # noqa: E402
import paddle  # noqa: E402
from paddle.base import core  # noqa: E402

paddle.set_device("cpu")
_spec = importlib.util.spec_from_file_location(
    "_flops", os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "plugins", "autodl", "profile", "_flops.py"))
FL = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(FL)
FL.install(paddle)

state = {"n_opt": 0, "models": [], "ids": set(), "steps": 0, "clears": 0, "fwd_calls": 0, "batch": None, "input": None,
         "t0": time.time(), "train": None, "eval": None, "eval_open": None, "opts": []}



def _kill_children():
    """DataLoader worker processes would outlive ``os._exit`` and keep the output pipes open."""
    try:
        import multiprocessing
        for c in multiprocessing.active_children():
            os.kill(c.pid, signal.SIGKILL)
    except Exception:  # noqa: BLE001
        pass

def emit(extra=None):
    out = dict(state["train"] or {"error": "the script ended before two full steps were measured"})
    if state["eval"] is not None:
        out["eval_peak"] = state["eval"]["peak"]
        out["eval_input"] = state["eval"]["input"]
    out["total_s"] = round(time.time() - state["t0"], 1)
    out.update(extra or {})
    print("TRUTH " + json.dumps(out), flush=True)
    sys.stdout.flush()
    _kill_children()
    os._exit(0)


def _params():
    seen, total, trainable = set(), 0, 0
    ps = [p for m in state["models"] for p in m.parameters()]
    for o in state["opts"]:
        for p in getattr(o, "_parameter_list", None) or []:
            ps.extend(p.get("params", []) if isinstance(p, dict) else [p])
    for p in ps:
        if id(p) not in seen:
            seen.add(id(p))
            total += int(p.numel())
            trainable += 0 if p.stop_gradient else int(p.numel())
    return total, trainable


def _trained(layer):
    ids = {id(p) for o in state["opts"] for p in (getattr(o, "_parameter_list", None) or [])
           if not isinstance(p, dict)}
    return not ids or any(id(p) in ids for p in layer.parameters())


orig_call = paddle.nn.Layer.__call__
depth = [0]


def call(self, *a, **k):
    top = depth[0] == 0
    if top and (self._parameters or any(True for _ in self.parameters())):
        if id(self) not in state["ids"]:
            state["ids"].add(id(self))
            state["models"].append(self)
            FL.attach(self)
        x = a[0] if a else next(iter(k.values()), None)
        training = self.training and paddle.is_grad_enabled()
        if state["eval_open"] is not None:  # the evaluation call ended with the script's next model call
            state["eval"] = {"peak": int(core.host_memory_stat_peak_value("Allocated", 0)),
                             "input": state["eval_open"]}
            emit()
        if EVAL and state["train"] is not None and not training and _trained(self):
            gc.collect()
            core.host_memory_stat_reset_peak_value("Allocated", 0)
            state["eval_open"] = [list(x.shape), str(x.dtype).split(".")[-1]] if isinstance(x, paddle.Tensor) else None
        elif training and FL.state["on"]:
            state["fwd_calls"] += 1
            if state["batch"] is None and isinstance(x, paddle.Tensor):
                state["batch"] = int(x.shape[0])
                state["input"] = [list(x.shape), str(x.dtype).split(".")[-1]]
    depth[0] += 1
    try:
        return orig_call(self, *a, **k)
    finally:
        depth[0] -= 1


paddle.nn.Layer.__call__ = call


def on_clear():
    if state["steps"] == 0:
        return
    state["clears"] += 1
    state["steps"] = 0
    n = max(1, state["n_opt"])  # with several optimizers (a GAN) a step is one update of each
    if state["clears"] == n:
        gc.collect()
        core.host_memory_stat_reset_peak_value("Allocated", 0)
        FL.state["flops"], FL.state["on"] = 0.0, True
        state["t_step"] = time.time()
    elif state["clears"] == 2 * n:
        peak = int(core.host_memory_stat_peak_value("Allocated", 0))
        FL.state["on"] = False
        params, trainable = _params()
        calls = max(1, state["fwd_calls"])
        per_call = FL.state["flops"] / calls
        state["train"] = {
            "peak": peak, "params": params, "trainable": trainable, "input": state["input"],
            "model": [type(m).__name__ for m in state["models"]], "fwd_flops_per_call": per_call,
            "fwd_flops_per_sample": per_call / state["batch"] if state["batch"] else None,
            "fwd_calls": state["fwd_calls"], "step_s": round(time.time() - state["t_step"], 2),
            "opt": [type(o).__name__ for o in state["opts"]]}
        if not EVAL:
            emit()


def wrap_step(orig):
    def step(self, *a, **k):
        if self not in state["opts"]:
            state["opts"].append(self)
        state["steps"] += 1
        return orig(self, *a, **k)
    return step


def wrap_clear(orig):
    def clear(self, *a, **k):
        r = orig(self, *a, **k)
        on_clear()
        return r
    return clear


_orig_opt_init = paddle.optimizer.Optimizer.__init__


def _opt_init(self, *a, **k):
    _orig_opt_init(self, *a, **k)
    if state["clears"] == 0:
        state["n_opt"] += 1


paddle.optimizer.Optimizer.__init__ = _opt_init

for _n in dir(paddle.optimizer):
    _c = getattr(paddle.optimizer, _n)
    if isinstance(_c, type) and issubclass(_c, paddle.optimizer.Optimizer):
        for meth in ("step", "minimize"):
            if meth in _c.__dict__:
                setattr(_c, meth, wrap_step(_c.__dict__[meth]))
        if "clear_grad" in _c.__dict__:
            _c.clear_grad = wrap_clear(_c.__dict__["clear_grad"])
paddle.nn.Layer.clear_gradients = wrap_clear(paddle.nn.Layer.clear_gradients)

if FAKE:
    import paddle.vision.datasets as D

    SHAPES = {"MNIST": ((1, 28, 28), 60000, 10), "FashionMNIST": ((1, 28, 28), 60000, 10),
              "Cifar10": ((3, 32, 32), 50000, 10), "Cifar100": ((3, 32, 32), 50000, 100)}

    def fake(name, shape, n, classes):
        class Fake(paddle.io.Dataset):
            def __init__(self, mode="train", transform=None, download=True, backend=None, **kw):
                self.n = n if mode == "train" else n // 5
                self.transform = transform

            def __len__(self):
                return self.n

            def __getitem__(self, i):
                img = np.random.rand(*shape).astype("float32")
                if self.transform is not None:  # transforms expect HWC uint8 images like the real dataset's
                    img = self.transform((np.random.rand(shape[1], shape[2], shape[0]) * 255).astype("uint8"))
                return img, np.array([i % classes]).astype("int64")
        Fake.__name__ = name
        return Fake

    for _name, (_shape, _n, _k) in SHAPES.items():
        setattr(D, _name, fake(_name, _shape, _n, _k))

sys.argv = [script, *argv]
sys.path.insert(0, os.path.dirname(os.path.abspath(script)))
try:
    runpy.run_path(script, run_name="__main__")
finally:
    if state["eval_open"] is not None:
        state["eval"] = {"peak": int(core.host_memory_stat_peak_value("Allocated", 0)), "input": state["eval_open"]}
    emit({"ended": True})
