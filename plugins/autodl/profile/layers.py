"""The ``paddle`` model constructions the static reading recognises by name: ``paddle.nn`` layers and
``paddle.vision.models`` constructors. What a model is (its layers, its input) Paddle says in the probe."""

from __future__ import annotations


class Unsupported(Exception):
    """The static reading cannot follow this construct (the caller falls back)."""


LAYER_NAMES = frozenset({
    "Linear", *(f"{kind}{n}D" for n in (1, 2, 3) for kind in (
        "Conv", "MaxPool", "AvgPool", "AdaptiveAvgPool", "AdaptiveMaxPool", "BatchNorm", "InstanceNorm")),
    *(f"Conv{n}DTranspose" for n in (1, 2, 3)),
    "BatchNorm", "SyncBatchNorm", "GroupNorm", "LayerNorm", "RMSNorm", "Embedding",
    "ReLU", "ReLU6", "Sigmoid", "Tanh", "GELU", "LeakyReLU", "ELU", "Hardswish", "Hardsigmoid", "Silu", "Swish", "Mish",
    "Softplus", "Hardtanh", "SELU", "LogSigmoid", "Tanhshrink", "Identity", "PReLU", "Softmax", "LogSoftmax",
    "Dropout", "Dropout2D", "Dropout3D", "AlphaDropout", "Flatten", "Upsample", "LSTM", "GRU", "SimpleRNN",
    "MultiHeadAttention", "TransformerEncoderLayer", "TransformerDecoderLayer", "TransformerEncoder",
    "TransformerDecoder", "Sequential", "LayerList", "LayerDict",
})
"""``paddle.nn`` layer classes (``paddle/nn/layer/*.py``, Paddle 3.3) a script may train bare as its model
(``model = nn.Linear(8, 2)``)."""


ZOO_MODELS = frozenset({
    "resnet18", "resnet34", "resnet50", "resnet101", "resnet152", "resnext50_32x4d", "wide_resnet50_2", "vgg11",
    "vgg13", "vgg16", "vgg19", "mobilenet_v1", "mobilenet_v2", "mobilenet_v3_small", "mobilenet_v3_large", "alexnet",
    "squeezenet1_1", "squeezenet1_0", "shufflenet_v2_x1_0", "densenet121", "googlenet", "inception_v3",
})
"""``paddle.vision.models`` constructors also exported as ``paddle.vision.<name>`` (``paddle/vision/models/*.py``)."""


def is_zoo(path: str) -> bool:
    """True for ``paddle.vision.models.<name>`` (or ``paddle.vision.<name>``) constructors: every lower-case name
    there (all of them build convolutional models)."""
    parts = path.split(".")
    if len(parts) < 2 or parts[0] != "paddle" or "vision" not in parts:
        return False
    last = parts[-1]
    return last in ZOO_MODELS or ("models" in parts and last[:1].islower() and last.isidentifier()
                                  and last not in ("utils",))
