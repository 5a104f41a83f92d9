"""Issue 8's kinds of fault that the seven handed cases do not stand for, each on a script of that style.

Scripts are the benchmark's own (``benchmarks/models/``, one copy); truth (``tests/cases/estimator/kinds/truth.json``) is
the benchmark's measurement: Paddle 3.3.1's CPU allocator peak of the second full training step in a fresh
process, the exact parameter count and the forward FLOPs counted from what ran. Held to the issue's targets:
params exact, FLOPs within 10%, the tensor peak never under by more than 5% nor over by more than 10%, no error
finding. These run Paddle and are ``slow``.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from autodl.profile import profile_script

KINDS = Path(__file__).resolve().parents[1] / "cases" / "estimator" / "kinds"
SCRIPTS = Path(__file__).resolve().parents[2] / "benchmarks" / "models"
TRUTH = json.loads((KINDS / "truth.json").read_text())["scripts"]

pytestmark = pytest.mark.slow


def _check(name: str):
    t = TRUTH[name]
    p = profile_script(SCRIPTS / name, probe=True)
    assert p.method == "dry_run", (p.method_reason, [f.message for f in p.findings])
    assert p.errors == [], [f.message for f in p.errors]
    assert p.params == t["params"] and p.trainable_params == t["trainable"]
    err = (p.tensor_peak_bytes - t["peak"]) / t["peak"]
    assert -0.05 <= err <= 0.10, (p.tensor_peak_bytes, t["peak"], err)
    train = next(ph for ph in p.phases if ph.name == "train")
    assert abs(train.forward_flops_per_sample - t["fwd_flops_per_sample"]) <= 0.10 * t["fwd_flops_per_sample"]
    shape, dtype = t["input"]
    assert train.input_shapes[0] == shape[1:] and train.input_dtypes[0] == dtype
    return p


def test_kind4_settings_in_a_dataclass_overridden_by_a_json_file_under_main():
    """Kind 4: settings in a dataclass, overridden by mlp_config.json next to the script (batch 256, 2 workers),
    the model built under ``if __name__ == "__main__":``. Was: no model found, params 0. Truth 69,063,096 B,
    3,173,908 params (3,166,740 trainable)."""
    p = _check("cfg_dataclass_mlp.py")
    assert p.batch_size == 256 and p.num_workers == 2


def test_kind5_functional_ops_outside_any_table():
    """Kind 5: TextCNN with F.adaptive_max_pool1d, squeeze and concat over a list of convolutions, settings in a
    dict. Was: the unknown functional op taken as shape-keeping -> a false concat error. Truth 262,884,576 B,
    9,463,109 params, token ids int64 [64, 256]."""
    p = _check("textcnn_dict_cfg.py")
    assert not [f for f in p.findings if f.code == "shape-mismatch"]


def test_kind6_zoo_model_with_constructor_kwargs():
    """Kind 6: paddle.vision.models.mobilenet_v2(scale=0.5, num_classes=10), the scale from argparse. Was: kwargs
    ignored (a full-width MobileNetV2). Truth 199,949,272 B, 719,034 params, 96x96 images from a Dataset."""
    _check("zoo_mobilenet_kwargs.py")


def test_kind10_conv3d_has_its_own_scratch():
    """Kind 10: a C3D-style network (Conv3D, BatchNorm3D, MaxPool3D) on 8x56x56 clips. Was: Conv3D sized with the
    Conv2D scratch rule, -28% on one layer. Truth 70,462,180 B, 735,717 params."""
    _check("conv3d_video.py")


def test_kind10_conv_bn_relu_autoencoder_at_module_level():
    """Kind 10: a small Conv-BN-ReLU autoencoder, everything at module level, 64x64 grayscale from a Dataset.
    Was: -21%. Truth 87,823,564 B, 406,145 params."""
    _check("conv_bn_autoencoder.py")
