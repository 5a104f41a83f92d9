"""Probe child: build only the model from a filtered script, run a few CPU training steps, print the allocator peak.

Run by :mod:`autodl.profile.probe` as ``python _probe_child.py CONFIG.json`` inside the sandbox. It imports
nothing from autodl. The last stdout line is ``AUTODL_PROBE {json}``.
"""

import json
import os
import sys
import time
import traceback


def emit(obj):
    sys.stdout.write("AUTODL_PROBE " + json.dumps(obj) + "\n")
    sys.stdout.flush()


def _load_flops():
    import importlib.util
    spec = importlib.util.spec_from_file_location("_autodl_flops", os.path.join(os.path.dirname(__file__), "_flops.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


class _Args:
    """The script's argparse defaults, as the namespace its code reads (``args.hidden``)."""

    def __init__(self, d):
        self.__dict__.update(d)


def _build_model(cfg, paddle):
    """The model the filtered script's expression builds, or None after emitting why it could not be built."""
    ns = {"__name__": "__autodl_probe__", "__file__": cfg["script"]}
    ns["__autodl_args__"] = _Args(cfg.get("argparse") or {})
    ns["__autodl_missing__"] = missing = []  # imports that failed here (the program skips them)
    try:
        code = compile(cfg["source"], cfg["script"], "exec")
        exec(code, ns)
    except Exception as exc:
        emit({"ok": False, "stage": "definitions", "error": f"{type(exc).__name__}: {exc}"})
        return None
    try:
        model = eval(compile(cfg["model_expr"], cfg["script"] + ":model", "eval"), ns)
    except Exception as exc:
        failed = f" (imports that failed in the probe: {'; '.join(missing)})" if missing else ""
        emit({"ok": False, "stage": "model", "error": f"{type(exc).__name__}: {exc}{failed}",
              "trace": traceback.format_exc()[-1500:]})
        return None
    if isinstance(model, (tuple, list)):
        model = model[0]
    if not isinstance(model, paddle.nn.Layer):
        emit({"ok": False, "stage": "model", "error": f"the model expression gave {type(model).__name__}, not a paddle.nn.Layer"})
        return None
    return model


CALLS_KEPT = 10_000
"""Layer calls the child remembers in order (the first attempts' forward passes; a deeper model's are cut)."""


def _track_layers(model, paddle, stack, calls):
    """Name each sublayer; a pre-hook keeps in ``stack`` the layers being run, for shape errors, and in ``calls`` the
    order the forward calls them in."""
    names = {}
    for n, sub in model.named_sublayers(include_self=True):
        names[id(sub)] = n or type(model).__name__
        def pre(layer, inputs):
            shapes = [list(t.shape) for t in inputs if isinstance(t, paddle.Tensor)]
            stack.append((names.get(id(layer)), type(layer).__name__, shapes, layer))
            if len(calls) < CALLS_KEPT:
                calls.append(layer)
        def post(layer, inputs, output):
            if stack:
                stack.pop()
        sub.register_forward_pre_hook(pre)
        sub.register_forward_post_hook(post)


def _optimizer(cfg, paddle, model):
    """The script's optimizer class over the model's parameters (Adam when it is unknown or takes other arguments)."""
    opt_name = cfg.get("optimizer") or "Adam"
    opt_cls = getattr(paddle.optimizer, opt_name, paddle.optimizer.Adam)
    try:
        return opt_cls(learning_rate=1e-3, parameters=model.parameters())
    except TypeError:
        return paddle.optimizer.Adam(learning_rate=1e-3, parameters=model.parameters())


def _make_input(paddle, d, b):
    """A random tensor of batch ``b`` for one input description (per-sample shape, dtype, integer id range)."""
    shape, dt = [b, *d["shape"]], d["dtype"]
    if "int" in dt:
        lo, hi = int(d.get("min") or 0), int(d.get("max") if d.get("max") is not None else 1)
        return paddle.randint(lo, max(lo + 1, hi + 1), shape, dtype=dt)
    if dt == "bool":
        return paddle.rand(shape) > 0.5
    return paddle.randn(shape).astype(dt if "float" in dt else "float32")


def _vocabulary(paddle, model):
    """Rows of the model's first ``Embedding`` (its token ids are below it), or None without one."""
    for sub in model.sublayers(include_self=True):
        if isinstance(sub, paddle.nn.Embedding):
            return int(sub.weight.shape[0])
    return None


NO_INPUT_LAYER = ("the model's input shape is unknown (no Conv1D/2D, Linear, recurrent or attention layer comes "
                  "before its other Paddle layers with weights)")


def _first_layer_input(paddle, layers, seq_len):
    """What the built model's first input layer takes: (per-sample float32 shape, what of it was assumed or None), or
    None.

    Read off Paddle's own layers in ``layers``' order (registration order, containers before what they hold; or the
    order a forward called them in): the first
    that is a ``Conv2D`` takes ``[in_channels, 224, 224]`` (224: ``paddle.vision.models``' documented input size), a
    ``Conv1D`` ``[in_channels, length]``, a ``Linear`` ``[in_features]``, a recurrent layer ``[length, input_size]``,
    attention ``[length, embed_dim]``; a length not given (``seq_len``) is 128. A first Paddle layer with weights of
    another kind (``Conv3D``, a norm) says nothing: None, rather than a later layer's guess.
    """
    nn, t = paddle.nn, seq_len or 128
    for sub in layers:
        name = type(sub).__name__
        length = None if seq_len else f"a length of 128, its first {name} giving no length"
        if isinstance(sub, nn.Conv2D):
            return [int(sub._in_channels), 224, 224], "224 x 224 images, its first Conv2D giving no image size"
        if isinstance(sub, nn.Conv1D):
            return [int(sub._in_channels), t], length
        if isinstance(sub, nn.Linear):
            return [int(sub.weight.shape[0])], None
        if isinstance(sub, (nn.LSTM, nn.GRU, nn.SimpleRNN)):
            return [t, int(sub.input_size)], length
        if isinstance(sub, nn.MultiHeadAttention):
            return [t, int(sub.embed_dim)], length
        if isinstance(sub, nn.TransformerEncoderLayer):
            return [t, int(sub.self_attn.embed_dim)], length
        if type(sub).__module__.startswith("paddle.") and sub.parameters(include_sublayers=False):
            return None  # a Paddle layer with weights that takes another input first (a script's own layer's
            # parameters, such as a position embedding, take no input)
    return None


def _input_candidates(cfg, paddle, model):
    """The candidate input lists to try, in order, and why there is none when the list is empty.

    ``cfg["input_candidates"]`` come first (the dry run's inputs, the script's Dataset sample), then
    ``cfg["input"]`` (the spec's or the script's declared inputs; integer ids below the model's vocabulary). Without
    one, ``cfg["guess_input"]`` asks the model's own layers: token ids when it has an ``Embedding``, else its first
    input layer's shape (that input's ``assumed`` says what size was assumed, if any).
    """
    cands = list(cfg.get("input_candidates") or [])
    vocab = _vocabulary(paddle, model)
    if cfg.get("input") is not None:
        cands += [[{**d, "min": 0, "max": (vocab or 2) - 1} for d in c] for c in cfg["input"]]
        return cands, None
    seq_len = (cfg.get("guess_input") or {}).get("seq_len")  # the parent asks for a guess whenever it declares none
    if vocab is not None:
        # no Embedding is indexed past its rows: a position embedding's rows bound the length it can take
        length = seq_len or min(128, *(int(sub.weight.shape[0]) for sub in model.sublayers(include_self=True)
                                       if isinstance(sub, paddle.nn.Embedding)))
        assumed = None if seq_len else f"sequences of {length} token ids, its first Embedding giving no length"
        cands.append([{"shape": [length], "dtype": "int64", "min": 0, "max": vocab - 1, "assumed": assumed}])
        return cands, None
    first = _first_layer_input(paddle, model.sublayers(include_self=True), seq_len)
    if first is None:
        return cands, NO_INPUT_LAYER
    cands.append([{"shape": first[0], "dtype": "float32", "min": 0, "max": 1, "assumed": first[1], "read": "layers"}])
    return cands, None


def _retry_in_call_order(step, paddle, cands, calls, batch, stack, seq_len):
    """When the input read off the first *registered* layer failed (a script may register its stem after its head),
    the first layer the failing forward *called* says what the model takes: one more candidate, tried at ``batch``.

    :returns: (the index of the candidate that worked or None, the last exception).
    """
    first = _first_layer_input(paddle, calls, seq_len)
    guessed = cands[-1][0]
    if first is None or guessed.get("read") != "layers" or first[0] == guessed["shape"]:
        return None, None
    assumed = first[1] or "the width of the first layer its forward called"
    cands.append([{"shape": first[0], "dtype": "float32", "min": 0, "max": 1, "assumed": assumed, "read": "calls"}])
    index, exc = _first_working_input(step, cands[-1:], batch, stack, calls)
    return (len(cands) - 1 if index is not None else None), exc


class _TrainingStep:
    """One training step of the model on made-up inputs: forward, a loss, backward, the optimizer's step."""

    def __init__(self, paddle, F, model, opt, ce):
        self.paddle, self.F, self.model, self.opt, self.ce = paddle, F, model, opt, ce
        self.held = None

    def __call__(self, b, inputs):
        paddle = self.paddle
        xs = [_make_input(paddle, d, b) for d in inputs]
        out = self.model(*xs)
        # a training loop's variables (``logits = model(x)``) keep the previous step's outputs alive through the
        # next forward, until they are assigned again: the probe keeps them the same way (measured: a tied-MLM
        # encoder's 131 MB of logits, -16% without; where the step is a function returning a float the run holds
        # less, and this errs high by one output)
        self.held = out
        while isinstance(out, (tuple, list)):
            out = out[0]
        if isinstance(out, dict):
            out = next(iter(out.values()))
        if self.ce and out.ndim >= 2 and "float" in str(out.dtype):
            y = paddle.randint(0, int(out.shape[-1]), out.shape[:-1] + [1])
            loss = self.F.cross_entropy(out, y)
        else:
            loss = out.astype("float32").mean()
        loss.backward()
        self.opt.step()
        self.opt.clear_grad()


def _describe(inputs):
    return ", ".join(f"{d['dtype']}[b, {', '.join(str(x) for x in d['shape'])}]" for d in inputs)


def _first_working_input(step, cands, batch, stack, calls):
    """Index of the first candidate input list a step at ``batch`` runs with, and the last candidate's exception."""
    exc_last = None
    for i, inputs in enumerate(cands):
        try:
            stack.clear()
            calls.clear()
            step(batch, inputs)
            return i, None
        except Exception as exc:  # noqa: BLE001 - try the next candidate input
            exc_last = exc
    return None, exc_last


def _measure(step, fl, core, batches, inputs):
    """Host allocator peak (bytes) of a step at each batch after one step there, and forward FLOPs per sample at
    the last batch."""
    peaks = {}
    flops = None
    for j, b in enumerate(batches):
        if j:
            step(b, inputs)
        core.host_memory_stat_reset_peak_value("Allocated", 0)
        fl.state["flops"], fl.state["on"] = 0.0, True
        step(b, inputs)
        fl.state["on"] = False
        peaks[b] = int(core.host_memory_stat_peak_value("Allocated", 0))
        flops = fl.state["flops"] / b
    return peaks, flops


def _step_failure(exc, stack):
    """The report fields of a failed step: Paddle's line that names the shape, and the layer being run."""
    msg = str(exc).strip().splitlines()
    short = next((l for l in msg if "InvalidArgument" in l or "mismatch" in l.lower() or "shape" in l.lower()),
                 msg[0] if msg else type(exc).__name__)
    info = None
    if stack:
        name, typ, shapes, layer = stack[-1]
        own = [list(p.shape) for p in layer.parameters(include_sublayers=False)]
        own = [sh for sh in own if len(sh) >= 2][:4] or own[:1]  # weights, not biases; a model's own may be several
        info = {"layer": name, "type": typ, "input_shapes": shapes,
                "weight_shape": (own[0] if len(own) == 1 else own) or None}
    return {"ok": False, "stage": "step", "error": f"{type(exc).__name__}: {short[:400]}", "layer": info}


def main():
    cfg = json.load(open(sys.argv[1]))
    t0 = time.time()
    os.environ.setdefault("CUDA_VISIBLE_DEVICES", "")
    import paddle
    import paddle.nn.functional as F
    from paddle.base import core

    paddle.set_device("cpu")
    paddle.seed(0)
    model = _build_model(cfg, paddle)
    if model is None:
        return
    params = sum(int(p.numel()) for p in model.parameters())
    trainable = sum(int(p.numel()) for p in model.parameters() if not p.stop_gradient)
    model.train()
    stack, calls = [], []  # the layers being run; those the current attempt's forward called, in order
    _track_layers(model, paddle, stack, calls)
    opt = _optimizer(cfg, paddle, model)
    cands, unknown = _input_candidates(cfg, paddle, model)
    if not cands:
        emit({"ok": False, "stage": "input", "error": unknown, "params": params, "trainable": trainable})
        return
    fl = _load_flops()
    fl.install(paddle)
    fl.attach(model)
    step = _TrainingStep(paddle, F, model, opt, bool(cfg.get("cross_entropy")))
    chosen, exc_last = _first_working_input(step, cands, cfg["batches"][0], stack, calls)
    if chosen is None:
        seq_len = (cfg.get("guess_input") or {}).get("seq_len")
        retried, exc_retry = _retry_in_call_order(step, paddle, cands, calls, cfg["batches"][0], stack, seq_len)
        chosen, exc_last = (retried, exc_last) if retried is not None else (None, exc_retry or exc_last)
    try:
        if chosen is None:
            raise exc_last
        peaks, flops = _measure(step, fl, core, cfg["batches"], cands[chosen])
    except Exception as exc:
        emit({**_step_failure(exc, stack), "params": params, "trainable": trainable,
              "input_desc": _describe(cands[-1]), "input_assumed": cands[-1][0].get("assumed")})
        return
    emit({"ok": True, "params": params, "trainable": trainable, "peaks": peaks, "seconds": time.time() - t0,
          "fwd_flops_per_sample": flops or None, "input_index": chosen, "input_desc": _describe(cands[chosen]),
          "input_assumed": cands[chosen][0].get("assumed")})


if __name__ == "__main__":
    main()
