"""The ``paddle.nn`` layer classes the static reading recognises, with their constructor signatures (Paddle 3.3,
``paddle/nn/layer/*.py``): how a construction's arguments are bound, so that the probe can build the model and guess
its input. No forward rules: what a layer does to memory is the dry run's to measure."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

REQUIRED = object()


class Unsupported(Exception):
    """The static reading cannot follow this construct (the caller falls back)."""


@dataclass
class LayerDef:
    """How one ``paddle.nn`` layer class's constructor arguments are bound (name, default or :data:`REQUIRED`)."""

    name: str
    signature: list[tuple[str, Any]]
    container: bool = False


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


def _reg(name: str, signature, container=False) -> None:
    LAYERS[name] = LayerDef(name, signature, container)


_reg("Linear", [("in_features", REQUIRED), ("out_features", REQUIRED), ("weight_attr", None), ("bias_attr", None)])
for _n in (1, 2, 3):
    _reg(f"Conv{_n}D", _CONV_SIG)
    _reg(f"Conv{_n}DTranspose", _CONVT_SIG)
    _reg(f"MaxPool{_n}D", _POOL_SIG)
    _reg(f"AvgPool{_n}D", _POOL_SIG)
    _reg(f"AdaptiveAvgPool{_n}D", [("output_size", REQUIRED)])
    _reg(f"AdaptiveMaxPool{_n}D", [("output_size", REQUIRED)])
    _reg(f"BatchNorm{_n}D", _BN_SIG)
    _reg(f"InstanceNorm{_n}D", [("num_features", REQUIRED)])
_reg("BatchNorm", [("num_channels", REQUIRED), ("act", None)])
_reg("SyncBatchNorm", _BN_SIG)
_reg("GroupNorm", [("num_groups", REQUIRED), ("num_channels", REQUIRED)])
_reg("LayerNorm", [("normalized_shape", REQUIRED), ("epsilon", 1e-5), ("weight_attr", None), ("bias_attr", None)])
_reg("RMSNorm", [("normalized_shape", REQUIRED)])
_reg("Embedding", [("num_embeddings", REQUIRED), ("embedding_dim", REQUIRED), ("padding_idx", None), ("sparse", False)])
for _act in ("ReLU", "ReLU6", "Sigmoid", "Tanh", "GELU", "LeakyReLU", "ELU", "Hardswish", "Hardsigmoid", "Silu",
             "Swish", "Mish", "Softplus", "Hardtanh", "SELU", "LogSigmoid", "Tanhshrink", "Identity"):
    _reg(_act, [("_arg0", None)])
_reg("PReLU", [("num_parameters", 1)])
_reg("Softmax", [("axis", -1)])
_reg("LogSoftmax", [("axis", -1)])
for _d in ("Dropout", "Dropout2D", "Dropout3D", "AlphaDropout"):
    _reg(_d, [("p", 0.5)])
_reg("Flatten", [("start_axis", 1), ("stop_axis", -1)])
_reg("Upsample", [("size", None), ("scale_factor", None), ("mode", "nearest")])
_reg("LSTM", _RNN_SIG)
_reg("GRU", _RNN_SIG)
_reg("SimpleRNN", _RNN_SIG)
_reg("MultiHeadAttention", [("embed_dim", REQUIRED), ("num_heads", REQUIRED), ("dropout", 0.0), ("kdim", None),
                            ("vdim", None), ("need_weights", False), ("weight_attr", None), ("bias_attr", None)])
for _t in ("TransformerEncoderLayer", "TransformerDecoderLayer"):
    _reg(_t, [("d_model", REQUIRED), ("nhead", REQUIRED), ("dim_feedforward", REQUIRED), ("dropout", 0.1),
              ("activation", "relu"), ("attn_dropout", None), ("act_dropout", None), ("normalize_before", False)])
_reg("TransformerEncoder", [("encoder_layer", REQUIRED), ("num_layers", REQUIRED), ("norm", None)], container=True)
_reg("TransformerDecoder", [("decoder_layer", REQUIRED), ("num_layers", REQUIRED), ("norm", None)], container=True)
_reg("Sequential", [], container=True)
_reg("LayerList", [("sublayers", None)], container=True)
_reg("LayerDict", [("sublayers", None)], container=True)


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
