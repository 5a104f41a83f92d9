"""``paddle.vision.models`` constructors as data: exact parameter counts, activation bytes per sample, FLOPs.

Details: docs/reference/estimator.md#autodlprofilezoo.
"""

from __future__ import annotations

from typing import Any

from autodl.profile.trace import Tensor, Trace

MEASURED: dict[str, dict] = {
    "resnet18": {"params": 11699112, "trainable": 11689512, "lines": [[2, 51727700, 20676520], [8, 175786820, 20676520]]},
    "resnet34": {"params": 21814696, "trainable": 21797672, "lines": [[2, 71827796, 30711720], [8, 256098116, 30711720]]},
    "resnet50": {"params": 25610152, "trainable": 25557032, "lines": [[2, 178328916, 83898280], [4, 346125476, 84209896]]},
    "resnet101": {"params": 44654504, "trainable": 44549160, "lines": [[2, 260425044, 124841896]]},
    "vgg11": {"params": 132863336, "trainable": 132863336, "lines": [[2, 484339540, 36648872]]},
    "vgg16": {"params": 138357544, "trainable": 138357544, "lines": [[2, 533311316, 61134760], [4, 655580836, 61134760]]},
    "mobilenet_v1": {"params": 4253864, "trainable": 4231976, "lines": [[2, 86168916, 40947624], [8, 331862084, 40959816]]},
    "mobilenet_v2": {"params": 3538984, "trainable": 3504872, "lines": [[2, 113359764, 54051656], [8, 437669700, 54051656]]},
    "mobilenet_v3_small": {"params": 2554968, "trainable": 2542856, "lines": [[2, 36709588, 16282568], [8, 134404996, 16282568]]},
    "mobilenet_v3_large": {"params": 5507432, "trainable": 5483032, "lines": [[2, 93807956, 44295176], [8, 359579012, 44295176]]},
    "alexnet": {"params": 61100840, "trainable": 61100840, "lines": [[2, 156992340, 2998696]]},
    "squeezenet1_1": {"params": 1235496, "trainable": 1235496, "lines": [[2, 39203892, 19565720]]},
    "shufflenet_v2_x1_0": {"params": 2294784, "trainable": 2278604, "lines": [[2, 41113252, 18476264]]},
    "densenet121": {"params": 8062504, "trainable": 7978856, "lines": [[2, 261966228, 128767816]]},
    "googlenet": {"params": 11535736, "trainable": 11535736, "lines": [[2, 39540500, 17722248]]},
    "resnext50_32x4d": {"params": 25097128, "trainable": 25028904, "lines": [[2, 230230356, 110792616]]},
    "wide_resnet50_2": {"params": 68951464, "trainable": 68883240, "lines": [[2, 260184404, 110190504]]},
    "inception_v3": {"params": 23869000, "trainable": 23834568, "lines": [[2, 195496940, 93583604]]},
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
    """True for ``paddle.vision.models.<name>`` (or ``paddle.vision.<name>``) constructors: every lower-case
    name there, tabulated or not (what is not tabulated has no static figures -- the dry run or the probe asks
    Paddle itself, issue 8 kind 6)."""
    parts = path.split(".")
    if len(parts) < 2 or parts[0] != "paddle" or "vision" not in parts:
        return False
    last = parts[-1]
    return last in CLASSIFIER_IN or ("models" in parts and last[:1].islower() and last.isidentifier()
                                     and last not in ("utils",))


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
    if set(kwargs) - {"num_classes", "pretrained", "args", "with_pool"} or kwargs.get("args"):
        return None  # scale=, depth multipliers, ...: the table holds the defaults only; unknown, not wrong
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


def act_bytes(name: str, batch: int, hw: tuple[int, int] | None) -> int | None:
    """Measured activation + transient bytes of a training step at ``batch`` (input included).

    The maximum over the measured lines ``act(b1) + (batch - b1) * slope``; for another input size the
    per-sample part is scaled by the pixel count (every activation of these networks is a feature map).
    """
    m = MEASURED.get(name)
    if m is None:
        return None
    s = native_size(name)
    scale = (hw[0] * hw[1]) / (s * s) if hw else 1.0
    best = 0
    for b1, act1, slope in m["lines"]:
        fixed = act1 - b1 * slope
        best = max(best, int(fixed + batch * slope * scale))
    return best


def forward(tr: Trace, layer: Any, x: Any) -> Tensor:
    """A zoo model as one op that keeps the measured activation bytes."""
    name = layer.type.split(":", 1)[1]
    n = layer.args.get("num_classes", 1000)
    n = n if isinstance(n, int) else 1000
    b = x.shape[0] if isinstance(x, Tensor) else 1
    hw = tuple(x.shape[-2:]) if isinstance(x, Tensor) and x.ndim == 4 else None
    act = act_bytes(name, b, hw) or 0
    s = native_size(name)
    scale = (hw[0] * hw[1]) / (s * s) if hw else 1.0
    flops = 2.0 * GMACS.get(name, 0.0) * 1e9 * b * scale
    inputs = [x] if isinstance(x, Tensor) else []
    out_shape = (b, n if n > 0 else CLASSIFIER_IN[name])
    # the measured figure already holds the input and a 1000-class loss; keep the rest as saved bytes
    held = (x.nbytes if isinstance(x, Tensor) else 0) + 3 * b * 1000 * 4
    return tr.op(f"zoo:{name}", inputs, out_shape, extra_saved_bytes=max(0, act - held),
                 flops=flops, layer=layer.name or name)


def non_trainable(name: str) -> int:
    """Batch-norm running statistics (registered as parameters with ``stop_gradient=True``)."""
    m = MEASURED.get(name)
    return m["params"] - m["trainable"] if m else 0


__all__ = ["is_zoo", "params", "act_bytes", "forward", "non_trainable", "CLASSIFIER_IN", "GMACS", "MEASURED"]
