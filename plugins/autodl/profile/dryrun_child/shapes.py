"""Shapes and bytes of the signatures the child records (lists of ``{"shape", "dtype"}``); no Paddle."""


def per_sample_elements(step):
    """Elements per sample of a step's inputs (all but their leading dimension)."""
    return sum(np_prod(d["shape"][1:]) for d in step.get("inputs") or [] if d.get("shape"))


def batch_of(sig):
    """The batch of a call's inputs: the first dimension of its first tensor with a shape; None when unknown or
    empty (a slice past the end of a tensor the dry run shrank has 0 rows: no batch, not a batch of 0)."""
    for d in sig:
        if d["shape"]:
            return d["shape"][0] or None
    return None


def input_key(sig):
    """A signature's shapes per sample and dtypes: equal for two calls of the same input at any batch."""
    return tuple((tuple(d["shape"][1:]), d["dtype"]) for d in sig or [] if d.get("shape"))


def sig_bytes(sig):
    """Bytes of the tensors of a signature."""
    return sum(int(np_prod(d["shape"])) * itemsize(d["dtype"]) for d in sig)


def np_prod(shape):
    """Elements of a tensor of ``shape`` (1 for a scalar)."""
    n = 1
    for d in shape:
        n *= int(d)
    return n


def itemsize(dtype):
    """Bytes per element of ``dtype`` by its width in the name (4 when the name has none)."""
    d = str(dtype)
    for k, v in (("64", 8), ("32", 4), ("16", 2), ("8", 1), ("bool", 1)):
        if k in d:
            return v
    return 4
