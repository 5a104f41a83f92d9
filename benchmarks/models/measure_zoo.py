"""Measure paddle.vision.models parameter counts and activation bytes per sample (the table in autodl/profile/zoo.py).

Run once per Paddle release: ``.venv/bin/python benchmarks/models/measure_zoo.py [--batches 2,4] [names...]``.
Each model is measured in a fresh process: SGD step at two batch sizes on 224x224 inputs, allocator peak after
a warm-up step. The step's peak is a maximum of phases, each linear in the batch, so the table keeps one line
(b1, peak(b1) - base, slope) per batch pair: (2, 4) and a larger pair ((8, 16), or (4, 8) for the big models).
"""

import json
import subprocess
import sys

MODELS = ["resnet18", "resnet34", "resnet50", "resnet101", "vgg11", "vgg16", "mobilenet_v1", "mobilenet_v2",
          "mobilenet_v3_small", "mobilenet_v3_large", "alexnet", "squeezenet1_1", "shufflenet_v2_x1_0",
          "densenet121", "googlenet", "resnext50_32x4d", "wide_resnet50_2", "inception_v3"]

CHILD = r"""
import json, sys, paddle, paddle.nn.functional as F
from paddle.base import core
paddle.set_device("cpu")
name = sys.argv[1]
hw = 299 if name == "inception_v3" else 224
m = getattr(paddle.vision.models, name)()
params = sum(int(p.numel()) for p in m.parameters())
trainable = sum(int(p.numel()) for p in m.parameters() if not p.stop_gradient)
opt = paddle.optimizer.SGD(parameters=m.parameters())
out = {"params": params, "trainable": trainable, "hw": hw}
batches = [int(v) for v in sys.argv[2].split(",")]
for b in batches:
    def step():
        x = paddle.randn([b, 3, hw, hw]); y = paddle.randint(0, 1000, [b, 1])
        o = m(x)
        o = o[0] if isinstance(o, (list, tuple)) else o
        F.cross_entropy(o, y).backward(); opt.step(); opt.clear_grad()
    step()
    core.host_memory_stat_reset_peak_value("Allocated", 0)
    base = core.host_memory_stat_current_value("Allocated", 0)
    step()
    out[f"peak{b}"] = core.host_memory_stat_peak_value("Allocated", 0)
    out["base"] = base
b1, b2 = batches
out["line"] = [b1, out[f"peak{b1}"] - out["base"], (out[f"peak{b2}"] - out[f"peak{b1}"]) // (b2 - b1)]
print("RESULT " + json.dumps(out))
"""

if __name__ == "__main__":
    args = sys.argv[1:]
    batches = "2,4"
    if args[:1] == ["--batches"]:
        batches, args = args[1], args[2:]
    for n in args or MODELS:
        r = subprocess.run([sys.executable, "-c", CHILD, n, batches], capture_output=True, text=True)
        line = [l for l in r.stdout.splitlines() if l.startswith("RESULT ")]
        print(n, line[0][7:] if line else r.stderr[-500:], flush=True)
