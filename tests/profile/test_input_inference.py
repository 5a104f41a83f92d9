"""Unknown input shape with nothing run: no shape error and no guessed input, the conservative bound."""

from __future__ import annotations

from pathlib import Path

from autodl.profile import profile_script

REPO = Path(__file__).resolve().parents[2]

CNN = """
import paddle
import paddle.nn as nn

class Net(nn.Layer):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2D(1, 8, 3, padding=1)
        self.pool = nn.MaxPool2D(2, 2)
        self.fc = nn.Linear({fc_in}, 10)

    def forward(self, x):
        x = self.pool(self.conv(x))
        return self.fc(paddle.flatten(x, 1))

model = Net()
"""


def test_an_unknown_input_is_never_a_shape_error_when_the_script_is_not_run(tmp_path):
    """The example CNN is built for 32x32 images; with no spec and nothing run, no input is assumed and no shape is
    read from the text (a 224x224 guess once refused the run: 'expects in_features=4096 but its input has shape
    [64, 200704]'). A layer that really does not fit (fc_in=1234) is Paddle's to refuse in the dry run
    (tests/profile/test_dry_run.py), not autodl's reading: the profile is the conservative bound."""
    p = profile_script(REPO / "include" / "scripts" / "simple_cnn.py", probe=False)
    assert p.errors == [] and p.method == "cold_start" and p.params is None
    script = tmp_path / "broken.py"
    script.write_text(CNN.format(fc_in=1234))
    broken = profile_script(script, probe=False)
    assert broken.errors == [] and not [f for f in broken.findings if f.code == "shape-mismatch"]


def test_spec_can_turn_the_probe_off(tmp_path):
    from autodl.spec import parse_spec

    spec = parse_spec({"task": {"probe": False, "input_shape": [3, 32, 32]}})
    p = profile_script(REPO / "include" / "scripts" / "simple_cnn.py", spec)
    assert p.method == "cold_start" and p.probe_seconds is None and p.dry_run_seconds is None


def test_spec_batch_the_script_never_uses_is_flagged(tmp_path):
    from autodl.spec import parse_spec

    script = tmp_path / "mlp.py"
    script.write_text("import paddle\nimport paddle.nn as nn\n\nBATCH_SIZE = 32\n\n"
                      "class MLP(nn.Layer):\n    def __init__(self):\n        super().__init__()\n"
                      "        self.fc = nn.Linear(784, 10)\n\n    def forward(self, x):\n        return self.fc(x)\n\n"
                      "model = MLP()\n")
    p = profile_script(script, parse_spec({"task": {"batch_size_per_gpu": 4096}}), probe=False)
    assert p.batch_size == 4096
    flagged = [f for f in p.findings if f.code == "spec-batch-not-used"]
    assert flagged and "uses batch 32" in flagged[0].message
    ok = profile_script(REPO / "include" / "scripts" / "simple_cnn.py", parse_spec({"task": {"batch_size_per_gpu": 16}}),
                        probe=False)
    assert not [f for f in ok.findings if f.code == "spec-batch-not-used"]  # it reads AUTODL_BATCH_SIZE_PER_GPU
