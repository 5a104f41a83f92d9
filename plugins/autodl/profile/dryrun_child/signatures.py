"""Signatures of what the script hands the model and the loader: tensor shapes, dtypes and id ranges, kept by value."""

import paddle


def signature(obj, out, depth=0, first=False):
    """Shapes and dtypes of the tensors in a forward's arguments (nested two levels); value range of integer
    tensors (token ids) for the first one only."""
    if isinstance(obj, paddle.Tensor):
        d = {"shape": [int(s) for s in obj.shape], "dtype": str(obj.dtype).split(".")[-1]}
        if first and "int" in d["dtype"] and obj.size and obj.size <= (1 << 24):
            try:
                d["min"], d["max"] = int(obj.min()), int(obj.max())
            except Exception:
                pass
        out.append(d)
    elif isinstance(obj, (list, tuple)) and depth < 3:
        for x in obj:
            signature(x, out, depth + 1, first)
    elif isinstance(obj, dict) and depth < 3:
        for x in obj.values():
            signature(x, out, depth + 1, first)
    return out


class TensorSpec:
    """A tensor argument remembered by shape, dtype and value range (not by reference: holding the tensor would
    add it to every later step's peak)."""

    def __init__(self, t):
        self.shape = [int(x) for x in t.shape]
        self.dtype = str(t.dtype).split(".")[-1]
        self.lo = self.hi = None
        if "int" in self.dtype and t.size and t.size <= (1 << 24):
            try:
                self.lo, self.hi = int(t.min()), int(t.max())
            except Exception:  # noqa: BLE001
                pass


def structure(v, d=0):
    if isinstance(v, paddle.Tensor):
        return TensorSpec(v)
    if isinstance(v, (list, tuple)) and d < 3:
        return type(v)(structure(x, d + 1) for x in v)
    if isinstance(v, dict) and d < 3:
        return {k: structure(x, d + 1) for k, x in v.items()}
    return v


def sample_sig(sample):
    import numpy as np
    out = []

    def rec(x, d=0):
        if isinstance(x, np.ndarray):
            out.append({"shape": list(x.shape), "dtype": str(x.dtype)})
        elif isinstance(x, paddle.Tensor):
            out.append({"shape": [int(s) for s in x.shape], "dtype": str(x.dtype).split(".")[-1]})
        elif isinstance(x, (int, float)) and not isinstance(x, bool):
            out.append({"shape": [], "dtype": "int64" if isinstance(x, int) else "float32"})
        elif isinstance(x, (list, tuple)) and x and all(isinstance(y, (int, float)) and not isinstance(y, bool)
                                                          for y in x):
            # a Python list of numbers (a tokenizer's ids): one field of that length, as a collate_fn stacks it
            out.append({"shape": [len(x)], "dtype": "int64" if all(isinstance(y, int) for y in x) else "float32"})
        elif isinstance(x, (list, tuple)) and d < 2:
            for y in x:
                rec(y, d + 1)
        elif isinstance(x, dict) and d < 2:
            for y in x.values():
                rec(y, d + 1)
    rec(sample)
    return out[:SAMPLE_FIELDS]


SAMPLE_FIELDS = 64
"""Fields of a first sample the report keeps (the parent refuses more:
:data:`autodl.profile.dryrun_report.SIG_TENSORS`)."""
