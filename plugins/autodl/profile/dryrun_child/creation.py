"""Tensors the script creates with the run's batch as first dimension, and sizes it draws per batch: shrunk to the
schedule's batch, drawn at their largest."""

import random

import paddle

from .batch import CTL, NATIVE_BATCHES, position
from .report import note, user_frame
from .state import COLLATING, R, St


def _creation_batch():
    """The batch a tensor created by the script with the run's batch as first dimension should get now."""
    if not NATIVE_BATCHES:
        return None
    if not CTL.reduce:  # not reduced: still recorded as the step's batch in the script's unit
        return max(NATIVE_BATCHES)
    return CTL.at(position(), max(NATIVE_BATCHES))


def _patch_creation(mod, name, shape_pos, shape_kw="shape"):
    orig = getattr(mod, name, None)
    if orig is None:
        return

    def f(*a, **k):
        b = _creation_batch() if user_frame(2) and not getattr(COLLATING, "on", False) else None
        if b is not None:
            shp = k.get(shape_kw) if shape_kw in k else (a[shape_pos] if len(a) > shape_pos else None)
            native = isinstance(shp, (list, tuple)) and shp and isinstance(shp[0], int) and shp[0] in NATIVE_BATCHES
            if native:
                CTL.intended[position()] = min(b, shp[0])  # the step's batch in the script's unit, reduced or not
            if native and b < shp[0]:
                new = [b, *shp[1:]]
                if len(R["created_batches"]) < 50:
                    R["created_batches"].append([shp[0], b])
                R["reduced"] = True
                if shape_kw in k:
                    k[shape_kw] = new
                else:
                    a = a[:shape_pos] + (new,) + a[shape_pos + 1:]
        return orig(*a, **k)
    setattr(mod, name, f)


_orig_to_tensor = paddle.to_tensor


def _to_tensor(data, *a, **k):
    """``paddle.to_tensor(array)`` of an array the script made with the run's batch as first dimension: the rows
    the schedule's batch needs (the same data, fewer samples)."""
    b = _creation_batch() if user_frame(2) and not getattr(COLLATING, "on", False) else None
    shape = getattr(data, "shape", None)
    native = b is not None and shape is not None and len(shape) >= 1 and int(shape[0]) in NATIVE_BATCHES
    if native:
        CTL.intended[position()] = min(b, int(shape[0]))
    if native and b < int(shape[0]):
        if len(R["created_batches"]) < 50:
            R["created_batches"].append([int(shape[0]), b])
        R["reduced"] = True
        data = data[:b]
    return _orig_to_tensor(data, *a, **k)



MAX_DRAWN_SIZES = 64
"""Longest population of whole numbers whose draws the dry run takes at their largest (a list of scales, not a data
set's indices)."""

_orig_choice = random.choice


def _drawn_sizes(seq):
    """Whether ``seq`` is a short list of sizes: whole numbers, each at least 2 (indices and flags -- a task index of
    ``[0, 1, 2]``, a flip of ``[0, 1]`` -- start below), not all the same."""
    return isinstance(seq, (list, tuple, range)) and 2 <= len(seq) <= MAX_DRAWN_SIZES \
        and all(type(x) is int for x in seq) and min(seq) >= 2 and max(seq) > min(seq)


def _choice(seq):
    """``random.choice`` as the script gets it: while training steps run (after the first model call), a draw the
    script makes from a short list of whole numbers (``random.choice(args.scales)``: multi-scale training) gives
    the largest of them, so the dry run measures at the largest size the script can choose (the draw is still
    made, so the script's random stream goes on as it would)."""
    got = _orig_choice(seq)
    if St.window is None or not user_frame(2) or not _drawn_sizes(seq):
        return got
    top = max(seq)
    note(f"the script drew a size per batch with random.choice from {list(seq)[:16]}: while it trained, the dry run "
         f"took the largest, {top}, at every draw (the figure is for the largest size it can choose)")
    return top



def install():
    """Hook Paddle's creation functions (``randn``... ``normal``), ``paddle.to_tensor`` and ``random.choice``."""
    for name in ("randn", "rand", "zeros", "ones", "empty", "standard_normal"):
        _patch_creation(paddle, name, 0)
    _patch_creation(paddle, "randint", 2)
    _patch_creation(paddle, "full", 0)
    _patch_creation(paddle, "uniform", 0)
    _patch_creation(paddle, "normal", 2)
    setattr(paddle, "to_tensor", _to_tensor)
    setattr(random, "choice", _choice)
