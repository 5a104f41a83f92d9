"""Paddle layers and ops as the static estimator sees them: parameter counts, output shapes, FLOPs, saved tensors.

Parameter formulas follow the layer definitions in ``paddle/nn/layer/*.py`` (Paddle 3.3). Forward
FLOPs count a multiply-add as 2 FLOPs (the convention of Kaplan et al. 2020, "Scaling Laws for
Neural Language Models", and of ``paddle.flops``); element-wise ops count 1 FLOP per output element.
Which tensors an op keeps for backward follows ``paddle/phi/ops/yaml/backward.yaml``; kernel scratch
sizes were measured on Paddle 3.3.1 CPU (``benchmarks/estimate_accuracy.py --ops``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable

from autodl.profile.trace import Tensor, Trace

REQUIRED = object()


class ShapeMismatch(Exception):
    """A layer got an input whose shape it cannot take; the message names the layer and both shapes."""


class Refused(ShapeMismatch):
    """Paddle refuses to build a layer from these arguments whatever its input (a negative or non-integer size,
    more parameters than int64 holds): certain from the script alone, unlike a shape met with a guessed input."""


class Unsupported(Exception):
    """The static estimator cannot follow this construct (caller falls back)."""


# ------------------------------------------------------------------------------------------ helpers
def _pair(v: Any, n: int = 2) -> tuple[int, ...]:
    if isinstance(v, (list, tuple)):
        vals = [int(x) for x in v]
        if len(vals) == 1:
            return tuple(vals * n)
        return tuple(vals[:n]) if len(vals) >= n else tuple(vals + [vals[-1]] * (n - len(vals)))
    return tuple([int(v)] * n)


def broadcast(a: tuple[int, ...], b: tuple[int, ...], what: str) -> tuple[int, ...]:
    out = []
    for x, y in zip(reversed((1,) * (len(b) - len(a)) + tuple(a)), reversed((1,) * (len(a) - len(b)) + tuple(b))):
        if x == y or y == 1:
            out.append(x)
        elif x == 1:
            out.append(y)
        else:
            raise ShapeMismatch(f"{what}: shapes {list(a)} and {list(b)} do not broadcast")
    return tuple(reversed(out))


def _norm_axis(axis: int, ndim: int) -> int:
    return axis + ndim if axis < 0 else axis


# ------------------------------------------------------------------------------------ functional
def unary(tr: Trace, x: Tensor, kind: str, layer: str | None = None) -> Tensor:
    """Element-wise activation. relu/tanh/sigmoid-family grads take ``out`` and run in place
    (backward.yaml ``inplace: (out_grad -> x_grad)``); gelu/silu/softplus grads take ``x``."""
    if kind in ("relu", "relu6", "tanh", "sigmoid", "leaky_relu", "elu", "hardsigmoid", "hardtanh"):
        return tr.op(kind, [x], x.shape, saves="o", inplace_grad=True, flops=x.numel, layer=layer)
    return tr.op(kind, [x], x.shape, saves="x", flops=4 * x.numel, layer=layer)


def softmax(tr: Trace, x: Tensor, layer: str | None = None) -> Tensor:
    return tr.op("softmax", [x], x.shape, saves="o", flops=5 * x.numel, layer=layer)


def dropout(tr: Trace, x: Tensor, p: float, layer: str | None = None) -> Tensor:
    """Keeps a uint8 mask of the input's size (``dropout_grad(mask, out_grad)``)."""
    if not p:
        return tr.op("dropout", [x], x.shape, extra_saved_bytes=0, flops=x.numel, layer=layer)
    return tr.op("dropout", [x], x.shape, extra_saved_bytes=x.numel, flops=x.numel, layer=layer)


def add(tr: Trace, a: Tensor, b: Tensor, kind: str = "add", layer: str | None = None) -> Tensor:
    shape = broadcast(a.shape, b.shape, f"'{kind}' ({layer or 'forward'})")
    saves = "i" if kind in ("multiply", "divide") else ""
    return tr.op(kind, [a, b], shape, saves=saves, flops=math.prod(shape), layer=layer)


def scale(tr: Trace, x: Tensor, layer: str | None = None) -> Tensor:
    return tr.op("scale", [x], x.shape, flops=x.numel, layer=layer)


def matmul(tr: Trace, x: Tensor, y: Tensor, tx: bool = False, ty: bool = False, layer: str | None = None) -> Tensor:
    xs, ys = list(x.shape), list(y.shape)
    if len(xs) == 1:
        xs = [1] + xs
    if len(ys) == 1:
        ys = ys + [1]
    if tx:
        xs[-1], xs[-2] = xs[-2], xs[-1]
    if ty:
        ys[-1], ys[-2] = ys[-2], ys[-1]
    if xs[-1] != ys[-2]:
        raise ShapeMismatch(
            f"matmul ({layer or 'forward'}): inner dimensions differ: x {list(x.shape)} vs y {list(y.shape)}"
            f"{' (transpose_x)' if tx else ''}{' (transpose_y)' if ty else ''}"
        )
    batch = broadcast(tuple(xs[:-2]), tuple(ys[:-2]), f"matmul ({layer or 'forward'})")
    out = batch + (xs[-2], ys[-1])
    flops = 2.0 * math.prod(out) * xs[-1]
    return tr.op("matmul", [x, y], out, saves="i", flops=flops, layer=layer)


def linear(tr: Trace, x: Tensor, in_f: int, out_f: int, bias: bool, layer: str | None = None) -> Tensor:
    if x.shape[-1] != in_f:
        raise ShapeMismatch(
            f"layer '{layer}' (Linear) expects in_features={in_f} but its input has shape {list(x.shape)} "
            f"(last dim {x.shape[-1]}); set in_features to {x.shape[-1]} or fix the preceding reshape"
        )
    rows = x.numel // max(1, in_f)
    pbytes = (in_f * out_f + (out_f if bias else 0)) * 4
    return tr.op("linear", [x], x.shape[:-1] + (out_f,), saves="x", param_bytes=pbytes,
                 flops=2.0 * rows * in_f * out_f, layer=layer)


def conv_out(size: int, k: int, s: int, p: int, d: int, ceil: bool = False) -> int:
    """Output length of a convolution or pooling window: floor((n + 2p - d(k-1) - 1)/s) + 1."""
    num = size + 2 * p - d * (k - 1) - 1
    return (-(-num // s) if ceil else num // s) + 1


def _padding(pad: Any, k: tuple[int, ...], d: tuple[int, ...], n: int) -> tuple[int, ...]:
    if isinstance(pad, str):
        if pad.lower() == "same":
            return tuple((d[i] * (k[i] - 1)) // 2 for i in range(n))
        return (0,) * n
    if isinstance(pad, (list, tuple)) and len(pad) == 2 * n:
        return tuple(int(pad[2 * i]) for i in range(n))
    return _pair(pad, n)


def conv(tr: Trace, x: Tensor, a: dict, n: int, layer: str | None, transpose: bool = False) -> Tensor:
    cin, cout = int(a["in_channels"]), int(a["out_channels"])
    kind = f"Conv{n}D{'Transpose' if transpose else ''}"
    if x.ndim != n + 2:
        raise ShapeMismatch(f"layer '{layer}' ({kind}) expects a {n + 2}-D input [N, C, ...] but got shape {list(x.shape)}")
    channels_last = str(a.get("data_format", "NCHW")).upper().endswith("C")
    c_in_x = x.shape[-1] if channels_last else x.shape[1]
    if c_in_x != cin:
        raise ShapeMismatch(
            f"layer '{layer}' ({kind}) expects in_channels={cin} but its input has shape {list(x.shape)} "
            f"({c_in_x} channels); set in_channels to {c_in_x} or fix the previous layer"
        )
    k = _pair(a["kernel_size"], n)
    s = _pair(a.get("stride", 1), n)
    d = _pair(a.get("dilation", 1), n)
    p = _padding(a.get("padding", 0), k, d, n)
    spatial = x.shape[1:-1] if channels_last else x.shape[2:]
    if transpose:
        op = _pair(a.get("output_padding", 0), n)
        out_sp = tuple((spatial[i] - 1) * s[i] - 2 * p[i] + d[i] * (k[i] - 1) + op[i] + 1 for i in range(n))
    else:
        out_sp = tuple(conv_out(spatial[i], k[i], s[i], p[i], d[i]) for i in range(n))
    if any(v <= 0 for v in out_sp):
        raise ShapeMismatch(f"layer '{layer}' ({kind}) input {list(x.shape)} is smaller than its kernel {list(k)}")
    out = (x.shape[0], *out_sp, cout) if channels_last else (x.shape[0], cout, *out_sp)
    groups = int(a.get("groups", 1) or 1)
    macs = math.prod(out) * (cin // groups) * math.prod(k)
    if transpose:
        macs = x.numel * (cout // groups) * math.prod(k)
    pb = conv_params(a, n) * 4
    # conv2d_grad's scratch: 2 x output bytes, released before the input gradient is allocated
    # (measured: peak of the backward = input + 3 x output per sample for 5 kernel/channel shapes)
    scratch = max(0, 2 * Tensor(out).nbytes - (x.nbytes if x.requires_grad else 0))
    return tr.op(kind.lower(), [x], out, saves="x", param_bytes=pb, grad_scratch_bytes=scratch,
                 flops=2.0 * macs, layer=layer)


def pool(tr: Trace, x: Tensor, a: dict, n: int, kind: str, layer: str | None) -> Tensor:
    if x.ndim != n + 2:
        raise ShapeMismatch(f"layer '{layer}' ({kind}) expects a {n + 2}-D input but got shape {list(x.shape)}")
    k = _pair(a["kernel_size"], n)
    s = _pair(a.get("stride") or a["kernel_size"], n)
    p = _padding(a.get("padding", 0), k, (1,) * n, n)
    ceil = bool(a.get("ceil_mode", False))
    out_sp = tuple(conv_out(x.shape[2 + i], k[i], s[i], p[i], 1, ceil) for i in range(n))
    if any(v <= 0 for v in out_sp):
        raise ShapeMismatch(f"layer '{layer}' ({kind}) input {list(x.shape)} is smaller than its window {list(k)}")
    out = x.shape[:2] + out_sp
    return tr.op(kind, [x], out, saves="io", flops=math.prod(out) * math.prod(k), layer=layer)


def adaptive_pool(tr: Trace, x: Tensor, output_size: Any, n: int, kind: str, layer: str | None) -> Tensor:
    spatial = x.shape[2:]
    osz = output_size if isinstance(output_size, (list, tuple)) else [output_size] * n
    out_sp = tuple(int(o) if o is not None else spatial[i] for i, o in enumerate(osz))
    out = x.shape[:2] + out_sp
    return tr.op(kind, [x], out, saves="io", flops=x.numel, layer=layer)


def batch_norm(tr: Trace, x: Tensor, c: int, layer: str | None, kind: str = "BatchNorm") -> Tensor:
    if x.ndim < 2 or x.shape[1] != c:
        raise ShapeMismatch(
            f"layer '{layer}' ({kind}) expects num_features={c} but its input has shape {list(x.shape)}; "
            f"set num_features to {x.shape[1] if x.ndim > 1 else '?'}"
        )
    return tr.op("batch_norm", [x], x.shape, saves="x", param_bytes=2 * c * 4, extra_saved_bytes=2 * c * 4,
                 flops=8 * x.numel, layer=layer)


def layer_norm(tr: Trace, x: Tensor, normalized: tuple[int, ...], affine: bool, layer: str | None) -> Tensor:
    if tuple(x.shape[-len(normalized):]) != tuple(normalized):
        raise ShapeMismatch(
            f"layer '{layer}' (LayerNorm) normalizes shape {list(normalized)} but its input has shape {list(x.shape)}"
        )
    rows = x.numel // max(1, math.prod(normalized))
    pb = 2 * math.prod(normalized) * 4 if affine else 0
    # layer_norm_grad scratch: 2 x input size (measured, Paddle 3.3.1 CPU)
    return tr.op("layer_norm", [x], x.shape, saves="x", param_bytes=pb, extra_saved_bytes=2 * rows * 4,
                 grad_scratch_bytes=2 * x.nbytes, flops=8 * x.numel, layer=layer)


def view(tr: Trace, x: Tensor, shape: tuple[int, ...], kind: str = "reshape") -> Tensor:
    return tr.op(kind, [x], shape, view=True, inplace_grad=True)


def copy_like(tr: Trace, x: Tensor, shape: tuple[int, ...], kind: str) -> Tensor:
    return tr.op(kind, [x], shape, inplace_grad=True)


def resolve_reshape(x: Tensor, shape: list[int], what: str = "reshape") -> tuple[int, ...]:
    shape = [int(s) for s in shape]
    out = []
    for i, s in enumerate(shape):
        out.append(x.shape[i] if s == 0 and i < x.ndim else s)
    if out.count(-1) > 1:
        raise Unsupported("reshape with two -1")
    known = math.prod(v for v in out if v != -1)
    if -1 in out:
        if known == 0 or x.numel % known:
            raise ShapeMismatch(f"{what}: cannot reshape input of shape {list(x.shape)} ({x.numel} elements) to {shape}")
        out[out.index(-1)] = x.numel // known
    elif known != x.numel:
        raise ShapeMismatch(f"{what}: cannot reshape input of shape {list(x.shape)} ({x.numel} elements) to {shape}")
    return tuple(out)


def flatten_shape(x: Tensor, start: int = 0, stop: int = -1) -> tuple[int, ...]:
    if x.ndim == 0:
        return (1,)
    s, e = _norm_axis(start, x.ndim), _norm_axis(stop, x.ndim)
    return x.shape[:s] + (math.prod(x.shape[s:e + 1]),) + x.shape[e + 1:]


def concat(tr: Trace, xs: list[Tensor], axis: int, layer: str | None = None) -> Tensor:
    ax = _norm_axis(axis, xs[0].ndim)
    for t in xs[1:]:
        if t.ndim != xs[0].ndim or any(t.shape[i] != xs[0].shape[i] for i in range(t.ndim) if i != ax):
            raise ShapeMismatch(f"concat along axis {axis}: shapes {list(xs[0].shape)} and {list(t.shape)} differ off that axis")
    out = list(xs[0].shape)
    out[ax] = sum(t.shape[ax] for t in xs)
    return tr.op("concat", list(xs), tuple(out), layer=layer)


def cross_entropy(tr: Trace, logits: Tensor, layer: str | None = None) -> Tensor:
    """softmax_with_cross_entropy keeps the softmax (logits' size) and the labels for backward; its grad
    kernel writes the logits gradient into that softmax buffer (backward.yaml ``inplace``)."""
    rows = logits.numel // max(1, logits.shape[-1])
    label = tr.input(logits.shape[:-1] + (1,), "int64")
    return tr.op("cross_entropy", [logits, label], (rows, 1), saves="", extra_saved_bytes=logits.nbytes,
                 grad_into_saved=True, flops=5 * logits.numel, layer=layer)


def embedding(tr: Trace, ids: Tensor, num: int, dim: int, layer: str | None) -> Tensor:
    return tr.op("embedding", [ids], ids.shape + (dim,), saves="x", param_bytes=num * dim * 4,
                 dtype="float32", flops=0, layer=layer)


# --------------------------------------------------------------------------- builtin layer table
@dataclass
class LayerDef:
    """How one ``paddle.nn`` layer class is bound, counted and run symbolically."""

    name: str
    signature: list[tuple[str, Any]]
    params: Callable[[dict], tuple[int, int]] = lambda a: (0, 0)
    forward: Callable[..., Any] | None = None
    container: bool = False


def _bias(a: dict, key: str = "bias_attr") -> bool:
    return a.get(key, None) is not False


def conv_params(a: dict, n: int) -> int:
    k = _pair(a["kernel_size"], n)
    cin, cout = int(a["in_channels"]), int(a["out_channels"])
    g = int(a.get("groups", 1) or 1)
    return cout * (cin // g) * math.prod(k) + (cout if _bias(a) else 0)


def _rnn_params(a: dict, gates: int) -> tuple[int, int]:
    h, i, layers = int(a["hidden_size"]), int(a["input_size"]), int(a.get("num_layers", 1))
    dirs = 2 if str(a.get("direction", "forward")) in ("bidirect", "bidirectional") else 1
    total = 0
    for layer in range(layers):
        inp = i if layer == 0 else h * dirs
        total += dirs * (gates * h * (inp + h) + 2 * gates * h)
    return total, 0


def _mha_params(a: dict) -> int:
    e = int(a["embed_dim"])
    kd, vd = int(a.get("kdim") or e), int(a.get("vdim") or e)
    b = _bias(a)
    return e * e + kd * e + vd * e + e * e + (4 * e if b else 0)


def _enc_params(a: dict) -> int:
    e, f = int(a["d_model"]), int(a["dim_feedforward"])
    return _mha_params({"embed_dim": e}) + e * f + f + f * e + e + 4 * e


def _dec_params(a: dict) -> int:
    e, f = int(a["d_model"]), int(a["dim_feedforward"])
    return 2 * _mha_params({"embed_dim": e}) + e * f + f + f * e + e + 6 * e


def _ln_shape(a: dict) -> tuple[int, ...]:
    ns = a["normalized_shape"]
    return tuple(int(v) for v in ns) if isinstance(ns, (list, tuple)) else (int(ns),)


_ACT = ["name"]
_CONV_SIG = [("in_channels", REQUIRED), ("out_channels", REQUIRED), ("kernel_size", REQUIRED), ("stride", 1),
             ("padding", 0), ("dilation", 1), ("groups", 1), ("padding_mode", "zeros"), ("weight_attr", None),
             ("bias_attr", None), ("data_format", "NCHW")]
_CONVT_SIG = [("in_channels", REQUIRED), ("out_channels", REQUIRED), ("kernel_size", REQUIRED), ("stride", 1),
              ("padding", 0), ("output_padding", 0), ("groups", 1), ("dilation", 1), ("weight_attr", None),
              ("bias_attr", None), ("data_format", "NCHW")]
_BN_SIG = [("num_features", REQUIRED), ("momentum", 0.9), ("epsilon", 1e-5), ("weight_attr", None),
           ("bias_attr", None), ("data_format", "NCHW"), ("use_global_stats", None), ("name", None)]
_POOL_SIG = [("kernel_size", REQUIRED), ("stride", None), ("padding", 0), ("ceil_mode", False)]
_RNN_SIG = [("input_size", REQUIRED), ("hidden_size", REQUIRED), ("num_layers", 1), ("direction", "forward"),
            ("time_major", False), ("dropout", 0.0)]

LAYERS: dict[str, LayerDef] = {}


def _reg(name: str, signature, params=None, forward=None, container=False) -> None:
    LAYERS[name] = LayerDef(name, signature, params or (lambda a: (0, 0)), forward, container)


_reg("Linear", [("in_features", REQUIRED), ("out_features", REQUIRED), ("weight_attr", None), ("bias_attr", None)],
     lambda a: (int(a["in_features"]) * int(a["out_features"]) + (int(a["out_features"]) if _bias(a) else 0), 0),
     lambda tr, a, name, x: linear(tr, x, int(a["in_features"]), int(a["out_features"]), _bias(a), name))
for _n in (1, 2, 3):
    _reg(f"Conv{_n}D", _CONV_SIG, (lambda n: lambda a: (conv_params(a, n), 0))(_n),
         (lambda n: lambda tr, a, name, x: conv(tr, x, a, n, name))(_n))
    _reg(f"Conv{_n}DTranspose", _CONVT_SIG, (lambda n: lambda a: (conv_params(a, n), 0))(_n),
         (lambda n: lambda tr, a, name, x: conv(tr, x, a, n, name, transpose=True))(_n))
    _reg(f"MaxPool{_n}D", _POOL_SIG, None, (lambda n: lambda tr, a, name, x: pool(tr, x, a, n, "max_pool", name))(_n))
    _reg(f"AvgPool{_n}D", _POOL_SIG, None, (lambda n: lambda tr, a, name, x: pool(tr, x, a, n, "avg_pool", name))(_n))
    _reg(f"AdaptiveAvgPool{_n}D", [("output_size", REQUIRED)], None,
         (lambda n: lambda tr, a, name, x: adaptive_pool(tr, x, a["output_size"], n, "adaptive_avg_pool", name))(_n))
    _reg(f"AdaptiveMaxPool{_n}D", [("output_size", REQUIRED)], None,
         (lambda n: lambda tr, a, name, x: adaptive_pool(tr, x, a["output_size"], n, "adaptive_max_pool", name))(_n))
    _reg(f"BatchNorm{_n}D", _BN_SIG, lambda a: (2 * int(a["num_features"]), 2 * int(a["num_features"])),
         lambda tr, a, name, x: batch_norm(tr, x, int(a["num_features"]), name))
    _reg(f"InstanceNorm{_n}D", [("num_features", REQUIRED)], lambda a: (2 * int(a["num_features"]), 0),
         lambda tr, a, name, x: batch_norm(tr, x, int(a["num_features"]), name, "InstanceNorm"))
_reg("BatchNorm", [("num_channels", REQUIRED), ("act", None)],
     lambda a: (2 * int(a["num_channels"]), 2 * int(a["num_channels"])),
     lambda tr, a, name, x: batch_norm(tr, x, int(a["num_channels"]), name))
_reg("SyncBatchNorm", _BN_SIG, lambda a: (2 * int(a["num_features"]), 2 * int(a["num_features"])),
     lambda tr, a, name, x: batch_norm(tr, x, int(a["num_features"]), name))
_reg("GroupNorm", [("num_groups", REQUIRED), ("num_channels", REQUIRED)], lambda a: (2 * int(a["num_channels"]), 0),
     lambda tr, a, name, x: batch_norm(tr, x, int(a["num_channels"]), name, "GroupNorm"))
_reg("LayerNorm", [("normalized_shape", REQUIRED), ("epsilon", 1e-5), ("weight_attr", None), ("bias_attr", None)],
     lambda a: ((2 if _bias(a) else 1) * math.prod(_ln_shape(a)), 0),
     lambda tr, a, name, x: layer_norm(tr, x, _ln_shape(a), True, name))
_reg("RMSNorm", [("normalized_shape", REQUIRED)], lambda a: (math.prod(_ln_shape(a)), 0),
     lambda tr, a, name, x: layer_norm(tr, x, _ln_shape(a), True, name))
_reg("Embedding", [("num_embeddings", REQUIRED), ("embedding_dim", REQUIRED), ("padding_idx", None), ("sparse", False)],
     lambda a: (int(a["num_embeddings"]) * int(a["embedding_dim"]), 0),
     lambda tr, a, name, x: embedding(tr, x, int(a["num_embeddings"]), int(a["embedding_dim"]), name))
for _act, _k in [("ReLU", "relu"), ("ReLU6", "relu6"), ("Sigmoid", "sigmoid"), ("Tanh", "tanh"), ("GELU", "gelu"),
                 ("LeakyReLU", "leaky_relu"), ("ELU", "elu"), ("Hardswish", "hardswish"), ("Hardsigmoid", "hardsigmoid"),
                 ("Silu", "silu"), ("Swish", "silu"), ("Mish", "mish"), ("Softplus", "softplus"), ("Hardtanh", "hardtanh"),
                 ("SELU", "selu"), ("LogSigmoid", "logsigmoid"), ("Tanhshrink", "tanhshrink")]:
    _reg(_act, [("_arg0", None)], None, (lambda k: lambda tr, a, name, x: unary(tr, x, k, name))(_k))
_reg("PReLU", [("num_parameters", 1)], lambda a: (int(a.get("num_parameters", 1)), 0),
     lambda tr, a, name, x: unary(tr, x, "prelu", name))
_reg("Softmax", [("axis", -1)], None, lambda tr, a, name, x: softmax(tr, x, name))
_reg("LogSoftmax", [("axis", -1)], None, lambda tr, a, name, x: softmax(tr, x, name))
for _d in ("Dropout", "Dropout2D", "Dropout3D", "AlphaDropout"):
    _reg(_d, [("p", 0.5)], None, lambda tr, a, name, x: dropout(tr, x, float(a.get("p", 0.5)), name))
_reg("Identity", [("_arg0", None)], None, lambda tr, a, name, x: x)
_reg("Flatten", [("start_axis", 1), ("stop_axis", -1)], None,
     lambda tr, a, name, x: copy_like(tr, x, flatten_shape(x, int(a["start_axis"]), int(a["stop_axis"])), "flatten"))
_reg("Upsample", [("size", None), ("scale_factor", None), ("mode", "nearest")], None,
     lambda tr, a, name, x: tr.op("interpolate", [x], x.shape[:2] + (
         tuple(_pair(a["size"], x.ndim - 2)) if a.get("size") else
         tuple(int(d * float(a["scale_factor"])) for d in x.shape[2:])), flops=x.numel, layer=name))
_reg("LSTM", _RNN_SIG, lambda a: _rnn_params(a, 4))
_reg("GRU", _RNN_SIG, lambda a: _rnn_params(a, 3))
_reg("SimpleRNN", _RNN_SIG, lambda a: _rnn_params(a, 1))
_reg("MultiHeadAttention", [("embed_dim", REQUIRED), ("num_heads", REQUIRED), ("dropout", 0.0), ("kdim", None),
                            ("vdim", None), ("need_weights", False), ("weight_attr", None), ("bias_attr", None)],
     lambda a: (_mha_params(a), 0))
_reg("TransformerEncoderLayer", [("d_model", REQUIRED), ("nhead", REQUIRED), ("dim_feedforward", REQUIRED),
                                 ("dropout", 0.1), ("activation", "relu"), ("attn_dropout", None),
                                 ("act_dropout", None), ("normalize_before", False)],
     lambda a: (_enc_params(a), 0))
_reg("TransformerDecoderLayer", [("d_model", REQUIRED), ("nhead", REQUIRED), ("dim_feedforward", REQUIRED),
                                 ("dropout", 0.1), ("activation", "relu"), ("attn_dropout", None),
                                 ("act_dropout", None), ("normalize_before", False)],
     lambda a: (_dec_params(a), 0))
_reg("TransformerEncoder", [("encoder_layer", REQUIRED), ("num_layers", REQUIRED), ("norm", None)], container=True)
_reg("TransformerDecoder", [("decoder_layer", REQUIRED), ("num_layers", REQUIRED), ("norm", None)], container=True)
_reg("Sequential", [], container=True)
_reg("LayerList", [("sublayers", None)], container=True)
_reg("LayerDict", [("sublayers", None)], container=True)


# ------------------------------------------------------------------------ composite forwards
def mha_forward(tr: Trace, a: dict, name: str, q_in: Tensor, k_in: Tensor | None = None,
                v_in: Tensor | None = None, causal_mask: bool = False) -> Tensor:
    """``paddle.nn.MultiHeadAttention.forward`` op by op (q/k/v projections, reshape+transpose,
    ``matmul(q * d^-0.5, k^T)``, optional mask add, softmax, optional dropout, ``matmul(w, v)``,
    transpose+reshape, output projection). Attention weights are [B, heads, Lq, Lk]: memory grows
    with seq_len^2 (Vaswani et al. 2017, sec. 4)."""
    e, h = int(a["embed_dim"]), int(a["num_heads"])
    if e % h:
        raise ShapeMismatch(f"layer '{name}' (MultiHeadAttention): embed_dim {e} is not divisible by num_heads {h}")
    k_in = q_in if k_in is None else k_in
    v_in = k_in if v_in is None else v_in
    if q_in.shape[-1] != e:
        raise ShapeMismatch(f"layer '{name}' (MultiHeadAttention) expects embed_dim={e} but its query has shape {list(q_in.shape)}")
    d = e // h
    kd, vd = int(a.get("kdim") or e), int(a.get("vdim") or e)
    bias = _bias(a)
    q = linear(tr, q_in, e, e, bias, f"{name}.q_proj")
    k = linear(tr, k_in, kd, e, bias, f"{name}.k_proj")
    v = linear(tr, v_in, vd, e, bias, f"{name}.v_proj")
    heads = []
    for t in (q, k, v):
        b, l = t.shape[0], t.shape[1]
        t = view(tr, t, (b, l, h, d))
        heads.append(tr.op("transpose", [t], (b, h, l, d), inplace_grad=True))
    qh, kh, vh = heads
    qs = scale(tr, qh, name)
    prod = matmul(tr, qs, kh, ty=True, layer=name)
    if causal_mask:
        mask = tr.input(prod.shape[-2:])
        prod = add(tr, prod, mask, layer=name)
    w = softmax(tr, prod, name)
    p = float(a.get("dropout") or 0.0)
    if p:
        w = dropout(tr, w, p, name)
    out = matmul(tr, w, vh, layer=name)
    b, _, l, _ = out.shape
    out = tr.op("transpose", [out], (b, l, h, d), inplace_grad=True)
    out = view(tr, out, (b, l, e))
    return linear(tr, out, e, e, bias, f"{name}.out_proj")


def encoder_layer_forward(tr: Trace, a: dict, name: str, src: Tensor, mask: bool = False) -> Tensor:
    """``paddle.nn.TransformerEncoderLayer.forward`` (post-norm unless ``normalize_before``)."""
    e, f = int(a["d_model"]), int(a["dim_feedforward"])
    p = float(a.get("dropout", 0.1) or 0.0)
    pa = float(a["attn_dropout"]) if a.get("attn_dropout") is not None else p
    pact = float(a["act_dropout"]) if a.get("act_dropout") is not None else p
    pre = bool(a.get("normalize_before"))
    act = str(a.get("activation", "relu"))
    residual = src
    x = layer_norm(tr, src, (e,), True, f"{name}.norm1") if pre else src
    x = mha_forward(tr, {"embed_dim": e, "num_heads": a["nhead"], "dropout": pa}, f"{name}.self_attn", x,
                    causal_mask=mask)
    x = add(tr, residual, dropout(tr, x, p, f"{name}.dropout1"), layer=name)
    if not pre:
        x = layer_norm(tr, x, (e,), True, f"{name}.norm1")
    residual = x
    if pre:
        x = layer_norm(tr, x, (e,), True, f"{name}.norm2")
    x = linear(tr, x, e, f, True, f"{name}.linear1")
    x = unary(tr, x, act, f"{name}.activation")
    x = dropout(tr, x, pact, f"{name}.dropout")
    x = linear(tr, x, f, e, True, f"{name}.linear2")
    x = add(tr, residual, dropout(tr, x, p, f"{name}.dropout2"), layer=name)
    if not pre:
        x = layer_norm(tr, x, (e,), True, f"{name}.norm2")
    return x


RNN_SAVED_PER_STEP = {"LSTM": 12.8, "GRU": 9.6, "SimpleRNN": 3.0}
"""Floats the fused ``rnn`` op keeps per time step per hidden unit per layer and direction (gates,
cell states and reserve space), measured on Paddle 3.3.1 CPU with input_size = hidden_size = 256,
seq 256 (``benchmarks/estimate_accuracy.py --ops``); SimpleRNN is an assumption (one gate)."""


def rnn_forward(tr: Trace, kind: str, a: dict, name: str, x: Tensor) -> Tensor:
    i, h = int(a["input_size"]), int(a["hidden_size"])
    if x.shape[-1] != i:
        raise ShapeMismatch(f"layer '{name}' ({kind}) expects input_size={i} but its input has shape {list(x.shape)}")
    layers = int(a.get("num_layers", 1))
    dirs = 2 if str(a.get("direction", "forward")) in ("bidirect", "bidirectional") else 1
    b, t = (x.shape[1], x.shape[0]) if a.get("time_major") else (x.shape[0], x.shape[1])
    gates = {"LSTM": 4, "GRU": 3}.get(kind, 1)
    pcount = _rnn_params(a, gates)[0]
    reserve = int(RNN_SAVED_PER_STEP.get(kind, 4.0) * b * t * h * layers * dirs * 4)
    macs = b * t * sum(dirs * gates * h * ((i if n == 0 else h * dirs) + h) for n in range(layers))
    out_shape = x.shape[:-1] + (h * dirs,)
    return tr.op("rnn", [x], out_shape, saves="x", extra_saved_bytes=reserve, param_bytes=pcount * 4,
                 flops=2.0 * macs, layer=name)
