"""The static estimate: build the model symbolically, trace one forward pass, replay the training step's memory."""

from __future__ import annotations

from dataclasses import dataclass, field

from autodl.profile import layers as L
from autodl.profile.analysis import ScriptFacts, contains, count_params
from autodl.profile.interp import LayerObj, UserObj
from autodl.profile.trace import Tensor, Trace, simulate_peak
from autodl.types import Finding


@dataclass
class StaticEstimate:
    """Result of tracing the model at the run's batch size (bytes, FLOPs)."""

    params: int | None = None
    trainable: int | None = None
    act_bytes_per_sample: int | None = None
    fixed_transient_bytes: int = 0
    forward_flops_per_sample: float | None = None
    findings: list[Finding] = field(default_factory=list)
    traced: bool = False
    has_conv: bool = False
    hidden: int | None = None
    why_not: str | None = None
    unknown_calls: list[str] = field(default_factory=list)


def model_input(facts: ScriptFacts, model, input_shape: list[int] | None, seq_len: int | None) -> tuple[list[int], str, str | None]:
    """Per-sample input shape and dtype for ``forward``: (shape, dtype, assumption-or-None)."""
    emb = contains(model, ("Embedding",))
    if facts.input_dtype == "int64" or (emb is not None and not input_shape):
        t = seq_len or (input_shape[0] if input_shape else None)
        if t is None:
            return [128], "int64", "sequence length unknown; assumed 128 (set task.sequence_length)"
        return [t], "int64", None
    if input_shape:
        return list(input_shape), "float32", None
    first = contains(model, ("Conv2D", "Conv1D", "Linear", "LSTM", "GRU", "SimpleRNN", "MultiHeadAttention",
                             "TransformerEncoderLayer"))
    if isinstance(model, LayerObj) and model.type.startswith("zoo:"):
        return [3, 224, 224], "float32", "input shape unknown; assumed [3, 224, 224] (set task.input_shape)"
    if first is None:
        raise L.Unsupported("the model's input shape is unknown; set task.input_shape in the spec")
    a = first.args
    if first.type == "Conv2D":
        return [int(a["in_channels"]), 224, 224], "float32", \
            f"input shape unknown; assumed [{a['in_channels']}, 224, 224] from the first Conv2D (set task.input_shape)"
    if first.type == "Conv1D":
        return [int(a["in_channels"]), seq_len or 128], "float32", "input length unknown; assumed 128"
    if first.type == "Linear":
        return [int(a["in_features"])], "float32", None
    if first.type in ("LSTM", "GRU", "SimpleRNN"):
        t = seq_len or 128
        return [t, int(a["input_size"])], "float32", None if seq_len else "sequence length unknown; assumed 128"
    e = int(a.get("embed_dim") or a.get("d_model"))
    t = seq_len or 128
    return [t, e], "float32", None if seq_len else "sequence length unknown; assumed 128"


def _trace(facts: ScriptFacts, model, batch: int, shape: list[int], dtype: str) -> tuple[Trace, int]:
    interp = facts.interp
    tr = Trace()
    interp.trace = tr
    try:
        x = tr.input((batch, *shape), dtype)
        out = interp.forward(model, [x], {})
        while isinstance(out, (tuple, list)) and out:
            out = out[0]
        if not isinstance(out, Tensor):
            raise L.Unsupported("forward() returned a value the estimator cannot follow")
        if facts.uses_cross_entropy and out.ndim >= 2:
            L.cross_entropy(tr, out)
        else:
            tr.op("mean", [out], ())
        return tr, simulate_peak(tr, held=[out])
    finally:
        interp.trace = None


COMMON_IMAGE_SIZES = (224, 32, 28, 64, 96, 112, 128, 160, 192, 256, 299, 320, 384, 448, 512)
"""Square image sizes tried, in this order, when the input shape is unknown: ImageNet's 224 first, then
CIFAR (32), MNIST (28) and the usual crop sizes of torchvision/paddle.vision reference recipes."""


def _infer_image_size(facts: ScriptFacts, model, batch: int, shape: list[int], dtype: str,
                      assumed: str) -> tuple[list[int], str]:
    """With the image size unknown, keep the first common size at which every layer accepts its input.

    A Linear after a flatten pins the spatial size: a model built for 32x32 inputs is not a shape error
    just because 224x224 was assumed. Returns the shape and the finding text; when no size works the
    assumed shape stays, and tracing it reports the mismatch.
    """
    for size in COMMON_IMAGE_SIZES:
        candidate = [shape[0], size, size]
        try:
            _trace(facts, model, 1, candidate, dtype)
        except L.ShapeMismatch:
            continue
        except Exception:  # noqa: BLE001 - anything else is for the real trace to report
            return candidate, assumed if size == 224 else _inferred(candidate)
        return candidate, assumed if size == 224 else _inferred(candidate)
    return shape, assumed


def _inferred(shape: list[int]) -> str:
    return (f"input shape unknown; inferred {shape}: the first common image size at which every layer's shapes "
            "agree (set task.input_shape to be sure)")


def estimate(facts: ScriptFacts, batch: int, input_shape: list[int] | None, seq_len: int | None) -> StaticEstimate:
    """Trace ``facts.model`` at ``batch`` and ``2 * batch``; the difference is the per-sample activation.

    :raises L.ShapeMismatch: when a layer cannot take its input (the caller turns it into a finding).
    """
    res = StaticEstimate()
    model = facts.model
    if model is None:
        res.why_not = facts.build_error or "no paddle.nn.Layer model construction was found in the script"
        return res
    try:
        t, nt = count_params(model)
    except L.Unsupported as exc:
        res.why_not = str(exc)
        return res
    res.params, res.trainable = t + nt, t
    res.has_conv = contains(model, ("Conv1D", "Conv2D", "Conv3D", "Conv2DTranspose")) is not None or (
        isinstance(model, LayerObj) and model.type.startswith("zoo:"))
    lin = contains(model, ("Embedding", "Linear", "LSTM", "GRU", "MultiHeadAttention", "TransformerEncoderLayer"))
    if lin is not None:
        a = lin.args
        res.hidden = int(a.get("embedding_dim") or a.get("out_features") or a.get("hidden_size") or a.get("embed_dim")
                         or a.get("d_model") or 0) or None
    try:
        shape, dtype, assumed = model_input(facts, model, input_shape, seq_len)
    except L.Unsupported as exc:
        res.why_not = str(exc)
        return res
    if assumed and len(shape) == 3 and shape[1:] == [224, 224] and not input_shape:
        shape, assumed = _infer_image_size(facts, model, batch, shape, dtype, assumed)
    if assumed:
        res.findings.append(Finding(severity="warning", code="assumed-input", message=assumed))
    if not facts.input_shape:  # shape and dtype together (issue 8, kind 1: token ids stay int64)
        facts.input_shape, facts.input_dtype = shape, dtype
    facts.interp.unknown = {}
    try:
        tr1, p1 = _trace(facts, model, batch, shape, dtype)
        res.unknown_calls = sorted(facts.interp.unknown)
        try:
            _, p2 = _trace(facts, model, 2 * batch, shape, dtype)
            per = max(0, (p2 - p1) // batch)
        except (L.Unsupported, L.ShapeMismatch, TypeError, ValueError, IndexError, KeyError, AttributeError):
            per = p1 // batch  # batch hard-coded in a reshape: all of it scales
        res.act_bytes_per_sample = per
        res.fixed_transient_bytes = max(0, p1 - per * batch)
        res.forward_flops_per_sample = tr1.forward_flops / batch
        res.traced = True
    except L.Unsupported as exc:
        res.why_not = f"forward() could not be followed: {exc}"
    except (TypeError, ValueError, IndexError, KeyError, AttributeError, ZeroDivisionError, RecursionError) as exc:
        res.why_not = f"forward() could not be followed: {type(exc).__name__}: {exc}"
    return res


def layer_line(model, name: str | None) -> int | None:
    """Construction line of the sub-layer called ``name`` (dotted path), if known."""
    if not name:
        return None
    seen: set[int] = set()

    def rec(obj):
        if id(obj) in seen:
            return None
        seen.add(id(obj))
        if isinstance(obj, (LayerObj, UserObj)) and obj.name == name:
            return obj.line
        kids = obj.attrs.values() if isinstance(obj, UserObj) else ([v for _, v in obj.children] if isinstance(obj, LayerObj) else [])
        for v in kids:
            r = rec(v)
            if r:
                return r
        return None

    return rec(model)


__all__ = ["StaticEstimate", "estimate", "layer_line", "model_input"]
