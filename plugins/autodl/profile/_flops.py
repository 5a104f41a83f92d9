"""Forward FLOPs of what runs, counted with hooks (loaded by the sandboxed children by file path; imports no autodl).

Details: docs/reference/estimator.md#autodlprofile_flops.
"""

import math
import sys

state = {"on": False, "flops": 0.0, "pair": 0.0}
"""``flops``: forward FLOPs counted; ``pair``: the part from products of two activations (no parameter: attention's
scores and their weighting of the values), which grows with the tokens squared where ``flops`` grows linearly."""
_hooked: set[int] = set()  # id() of each layer whose forward is hooked


def _numel(t):
    """Elements of ``t`` from its shape, or None when a dimension is not known: inside a ``paddle.jit.to_static``
    trace a tensor is a graph value whose ``int(numel())`` raises (a script that trains fine failed the dry run)
    and whose shape may hold -1."""
    try:
        dims = list(t.shape)
    except Exception:  # noqa: BLE001 - not a tensor: not counted
        return None
    if any(type(d) is not int or d < 0 for d in dims):
        return None
    return math.prod(dims)


def _conv_hook(layer, inputs, output):
    if not state["on"]:
        return
    w = layer.weight
    kprod = math.prod(w.shape[2:])
    n = _numel(inputs[0]) if "Transpose" in type(layer).__name__ else _numel(output)
    if n is not None:
        state["flops"] += 2.0 * n * w.shape[1] * kprod


def _linear_hook(layer, inputs, output):
    if not state["on"]:
        return
    fin, fout = layer.weight.shape
    n = _numel(output)
    if n is not None:
        state["flops"] += 2.0 * (n // fout) * fin * fout


def _rnn_hook(layer, inputs, output):
    if not state["on"]:
        return
    x = inputs[0]
    b, t = (x.shape[1], x.shape[0]) if getattr(layer, "time_major", False) else (x.shape[0], x.shape[1])
    if min(b, t) < 0:
        return
    gates = {"LSTM": 4, "GRU": 3}.get(type(layer).__name__, 1)
    h = layer.hidden_size
    dirs = layer.num_directions
    macs = 0
    for n in range(layer.num_layers):
        inp = layer.input_size if n == 0 else h * dirs
        macs += dirs * gates * h * (inp + h)
    state["flops"] += 2.0 * b * t * macs


def attach(model):
    """Register the counting hooks on every sub-layer of ``model`` (once per layer)."""
    for sub in model.sublayers(include_self=True):
        if id(sub) in _hooked:
            continue
        _hooked.add(id(sub))
        n = type(sub).__name__
        try:
            if n.startswith("Conv") and getattr(sub, "weight", None) is not None:
                sub.register_forward_post_hook(_conv_hook)
            elif n == "Linear":
                sub.register_forward_post_hook(_linear_hook)
            elif n in ("LSTM", "GRU", "SimpleRNN"):
                sub.register_forward_post_hook(_rnn_hook)
        except Exception:  # noqa: BLE001 - a layer that takes no hooks is not counted
            pass


def _count_matmul(x, y, tx=False, ty=False):
    if not state["on"]:
        return
    try:
        xs, ys = list(x.shape), list(y.shape)
    except Exception:  # noqa: BLE001
        return
    if len(xs) == 1:
        xs = [1] + xs
    if len(ys) == 1:
        ys = ys + [1]
    if tx:
        xs[-1], xs[-2] = xs[-2], xs[-1]
    if ty:
        ys[-1], ys[-2] = ys[-2], ys[-1]
    if any(type(d) is not int or d < 0 for d in xs + ys):
        return
    bx, by = xs[:-2], ys[:-2]
    nb = max(len(bx), len(by))
    bx, by = [1] * (nb - len(bx)) + bx, [1] * (nb - len(by)) + by
    flops = 2.0 * math.prod(max(a, b) for a, b in zip(bx, by)) * xs[-2] * xs[-1] * ys[-1]
    state["flops"] += flops
    if not (getattr(x, "persistable", False) or getattr(y, "persistable", False)):  # parameters are persistable
        state["pair"] += flops


def install(paddle):
    """Wrap ``paddle.matmul``, ``paddle.bmm``, ``Tensor.matmul`` and ``@`` so that they are counted."""
    orig_matmul = paddle.matmul

    def matmul(x, y, transpose_x=False, transpose_y=False, name=None):
        _count_matmul(x, y, transpose_x, transpose_y)
        return orig_matmul(x, y, transpose_x, transpose_y, name)

    def bmm(x, y, name=None):
        _count_matmul(x, y)
        return orig_matmul(x, y)

    paddle.matmul = matmul
    paddle.tensor.matmul = matmul
    paddle.bmm = bmm
    # Paddle's own layers call the module's functions (MultiHeadAttention: ``tensor.matmul(weights, v)`` with
    # ``from ... import tensor``), and ``paddle.tensor`` is a wrapper, not that module: each module is patched
    for name in ("paddle.tensor", "paddle.tensor.linalg", "paddle.linalg"):
        mod = sys.modules.get(name)
        if mod is not None and hasattr(mod, "matmul"):
            mod.matmul = matmul
        if mod is not None and hasattr(mod, "bmm"):
            mod.bmm = bmm
    orig_op = paddle.Tensor.__matmul__

    def t_matmul(self, other):
        _count_matmul(self, other)
        return orig_op(self, other)

    paddle.Tensor.__matmul__ = t_matmul
    orig_method = paddle.Tensor.matmul

    def t_method(self, y, transpose_x=False, transpose_y=False, name=None):
        _count_matmul(self, y, transpose_x, transpose_y)
        return orig_method(self, y, transpose_x, transpose_y, name)

    paddle.Tensor.matmul = t_method
