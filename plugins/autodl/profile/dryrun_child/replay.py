"""The slope by replay: when the script's steps ran at one batch only, train the captured model on generated inputs
of the same shapes at two batches."""

import gc

import paddle
from paddle.base import core

from .batch import CTL
from .hooks import original_layer_call
from .readings import note_reading, peak, reset_peak
from .signatures import TensorSpec
from .state import READINGS_PAUSED, R, St
from .steps import counting


def _lead_rows(v, d=0):
    """The leading dimension of the first tensor in a captured call (:class:`TensorSpec`), or None."""
    if isinstance(v, TensorSpec):
        return v.shape[0] if v.shape else None
    items = v.values() if isinstance(v, dict) else v if isinstance(v, (list, tuple)) else ()
    for x in items:
        r = _lead_rows(x, d + 1) if d < 4 else None
        if r:
            return r
    return None


def _generated(x, n, b):
    """A tensor like the captured ``x`` (:class:`TensorSpec`) with ``n`` rows where it had ``b``; ``x`` itself when
    it is not a tensor. Integer tensors keep their value range (token ids), floats are normal."""
    if not isinstance(x, TensorSpec):
        return x
    shape = list(x.shape)
    if shape and shape[0] == b:
        shape[0] = n
    dt = x.dtype
    if "int" in dt:
        lo = x.lo if x.lo is not None else 0
        hi = x.hi if x.hi is not None else 1
        return paddle.randint(lo, max(lo + 1, hi + 1), shape, dtype=dt)
    if dt == "bool":
        return paddle.rand(shape) > 0.5
    return paddle.randn(shape).astype(dt)


def _inputs_at(args, kwargs, n, b):
    """The captured call's ``(args, kwargs)`` with generated tensors of ``n`` rows (nested two levels)."""
    def rec(v, d=0):
        if isinstance(v, (list, tuple)) and d < 3:
            return type(v)(rec(x, d + 1) for x in v)
        if isinstance(v, dict) and d < 3:
            return {kk: rec(x, d + 1) for kk, x in v.items()}
        return _generated(v, n, b)
    return rec(list(args)), rec(dict(kwargs))


def _train_once(model, opt, xa, xk, kept):
    """One training step of ``model`` on ``xa``, ``xk``: forward (unhooked), the mean of its first output, update."""
    out = original_layer_call(model, *xa, **xk)
    while isinstance(out, (tuple, list)):
        out = out[0]
    if isinstance(out, dict):
        out = next(iter(out.values()))
    loss = out.astype("float32").mean()
    loss.backward()
    opt.step()
    opt.clear_grad(set_to_zero=kept)
    del out, loss


def replay():
    """When the script's own steps ran at one batch size only: train the captured model on generated inputs
    of the same shapes and dtypes (the batch dimension changed) at two batch sizes and keep the slope."""
    sizes = CTL.measured_sizes()
    if len(sizes) >= 2 or not sizes or St.call_args is None or not St.optimizers or R["replay"]:
        return
    model, args, kwargs = St.call_args
    opt = St.optimizers[0]
    b = _lead_rows([args, kwargs]) or sizes[-1]  # the captured call's own batch: the dimension to change
    pts = [max(1, b // 4), max(2, b // 2)] if b >= 4 else [1, 2]
    counting(None)
    model.train()
    peaks = {}
    St.step_depth += 1
    note_reading()  # what the script reached up to now is its own; the replay's allocations are not
    READINGS_PAUSED[0] = True
    # the gradients are left as the script left them: freed (clear_grad(set_to_zero=False)) or kept as zeros; a
    # replay that kept them (Paddle's default) added a gradient per parameter to the script's next step
    kept = any(getattr(p, "grad", None) is not None for p in model.parameters())
    try:
        for n in pts:
            xa, xk = _inputs_at(args, kwargs, n, b)
            gc.collect()
            reset_peak()
            _train_once(model, opt, xa, xk, kept)
            peaks[n] = peak()
            del xa, xk
        R["replay"] = [[n, peaks[n]] for n in pts]
    except BaseException as exc:  # noqa: BLE001 - the slope then comes from elsewhere
        R["replay_error"] = f"{type(exc).__name__}: {str(exc)[:200]}"
    finally:
        St.step_depth -= 1
        # what the replay's graphs keep in reference cycles is freed now, and its peak is not the next step's
        gc.collect()
        core.host_memory_stat_reset_peak_value("Allocated", 0)
        READINGS_PAUSED[0] = False
