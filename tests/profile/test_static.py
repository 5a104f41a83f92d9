"""Static analysis of training scripts: parameters, activations, findings, spec overrides, errors."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from autodl.errors import ProfileError
from autodl.profile import advice, estimate_step_time_s, profile_script
from autodl.spec import parse_spec

FIX = Path(__file__).parent / "fixtures"
ROOT = Path(__file__).resolve().parents[2]


def prof(name, spec=None, **kw):
    return profile_script(FIX / name, parse_spec(spec) if spec else None, probe=False, **kw)


def write(tmp_path, text, name="train.py"):
    p = tmp_path / name
    p.write_text(text)
    return p


# ------------------------------------------------------------------------------------ parameters
def test_simple_cnn_parameters_are_exact():
    p = prof("simple_cnn.py")
    conv1 = 3 * 32 * 9 + 32
    bn1 = 4 * 32  # weight, bias, running mean, running variance
    conv2 = 32 * 64 * 9 + 64
    fc1 = 64 * 16 * 16 * 128 + 128
    fc2 = 128 * 10 + 10
    assert p.params == conv1 + bn1 + conv2 + fc1 + fc2
    assert p.trainable_params == p.params - 2 * 32
    assert p.model_name == "SimpleCNN"
    assert p.batch_size == 64
    assert p.input_shape == [3, 32, 32]
    assert p.optimizer == "Adam"
    assert p.method == "static"


@pytest.mark.parametrize(
    "call, expected",
    [
        # sum(p.numel() for p in model.parameters()) measured with Paddle 3.3.1 (benchmarks/models/measure_zoo.py)
        ("resnet18()", 11_699_112),
        ("resnet50()", 25_610_152),
        ("mobilenet_v2()", 3_538_984),
        ("resnet18(num_classes=10)", 11_699_112 - 512 * 1000 - 1000 + 512 * 10 + 10),
        ("mobilenet_v3_large(num_classes=100)", 5_507_432 - 1280 * 1000 - 1000 + 1280 * 100 + 100),
    ],
)
def test_zoo_parameter_counts_are_exact(tmp_path, call, expected):
    s = write(tmp_path, f"import paddle\nmodel = paddle.vision.models.{call}\n"
                        "opt = paddle.optimizer.SGD(parameters=model.parameters())\n")
    assert prof(s).params == expected


def test_transformer_parameters_follow_paddle_definitions():
    p = prof("tiny_transformer.py")
    d, f = 64, 256
    layer = 4 * (d * d + d) + d * f + f + f * d + d + 2 * 2 * d
    assert p.params == 1000 * d + 2 * layer + d * 2 + 2


# ------------------------------------------------------------------------------------ activations
def test_simple_cnn_activation_replay():
    """Per-sample bytes of the replayed step for the CIFAR CNN match the measured slope.

    1_060_872 B/sample: host allocator peak of a full Adam step at batch 128 minus batch 64, divided by
    64 (Paddle 3.3.1 CPU, this fixture's model).
    """
    p = prof("simple_cnn.py")
    f = 4
    kept = (3 * 32 * 32 + 32 * 32 * 32 * 3 + 64 * 32 * 32 * 1 + 64 * 16 * 16 * 2 + 128 * 2 + 10 * 2) * f
    # retained tensors plus the transient gradients at conv2's backward (its output grad and input grad)
    assert p.activation_bytes_per_sample >= kept
    assert p.activation_bytes_per_sample == pytest.approx(1_060_872, rel=0.01)


def test_attention_memory_grows_faster_than_sequence_length():
    per = {}
    for t in (128, 256, 512):
        per[t] = prof("tiny_transformer.py", {"task": {"sequence_length": t}}).activation_bytes_per_sample
    assert per[256] > 2.1 * per[128]
    assert per[512] > 2.1 * per[256]
    assert prof("tiny_transformer.py", {"task": {"sequence_length": 512}}).sequence_length == 512


def test_spec_overrides_script_values():
    p = prof("simple_cnn.py", {"task": {"batch_size_per_gpu": 7, "input_shape": [3, 64, 64]}})
    assert p.batch_size == 7
    assert p.input_shape == [3, 64, 64]
    small = prof("simple_cnn.py", {"task": {"batch_size_per_gpu": 7}})
    # the spec's 64x64 images feed a Linear built for 32x32: a shape warning (static reading, issue 8 kind 2),
    # not a crash and not an error (only the dry run, where Paddle runs the script, may say error)
    assert [f.code for f in p.findings if f.code == "shape-mismatch"] and p.errors == [] and small.errors == []


def test_argparse_defaults_are_read(tmp_path):
    p = prof("opaque_model.py")
    assert p.batch_size == 48


def test_peak_rescales_linearly_with_batch():
    p = prof("simple_cnn.py")
    assert p.peak_at_batch(p.batch_size) == p.peak_memory_bytes
    assert p.peak_at_batch(2 * p.batch_size) - p.peak_memory_bytes == p.batch_size * p.activation_bytes_per_sample


def test_max_batch_size_for_every_catalog_model(catalog):
    p = prof("simple_cnn.py")
    assert set(p.max_batch_size_by_device) == set(catalog.models)
    t4 = catalog.get("T4")
    b = p.max_batch_size_by_device["T4"]
    assert p.peak_at_batch(b) <= 0.85 * t4.memory_bytes < p.peak_at_batch(b + 1)


def test_breakdown_names_gpu_only_workspace_terms():
    p = prof("simple_cnn.py")
    terms = p.workspace_terms_bytes
    assert {"cuda_context", "cudnn_workspace", "cublas_workspace", "allocator_slack"} <= set(terms)
    assert p.breakdown.workspace_bytes == sum(terms.values())
    assert p.peak_memory_bytes == p.breakdown.total_bytes
    assert p.breakdown.optimizer_state_bytes == 2 * p.breakdown.gradients_bytes  # Adam: two moments


def test_training_flops_are_three_forward_passes():
    p = prof("simple_cnn.py")
    conv = 2 * (32 * 32 * 32 * 3 * 9 + 64 * 32 * 32 * 32 * 9)
    fc = 2 * (64 * 16 * 16 * 128 + 128 * 10)
    assert p.flops_per_step >= 3 * 64 * (conv + fc)
    assert p.flops_per_step < 3 * 64 * (conv + fc) * 1.05


def test_step_time_estimate(catalog):
    p = prof("simple_cnn.py")
    assert estimate_step_time_s(p, catalog.get("A100-SXM4-40GB")) < estimate_step_time_s(p, catalog.get("T4"))


# ------------------------------------------------------------------------------------ distributed
def test_data_parallel_batch_is_per_card():
    dp = prof("data_parallel.py")
    single = prof("single_card.py")
    assert dp.distributed == "data_parallel"
    assert dp.num_gpus == 2
    assert dp.batch_size == single.batch_size == 32
    assert dp.peak_memory_bytes == single.peak_memory_bytes
    four = prof("data_parallel.py", {"task": {"num_gpus_estimate": 4}})
    assert four.num_gpus == 4
    assert four.peak_memory_bytes == dp.peak_memory_bytes
    assert single.num_gpus == 1 and single.distributed is None


def test_amp_and_optimizer_detection():
    p = prof("resnet_zoo.py")
    assert p.amp == "O2"
    assert p.optimizer == "Momentum"
    assert p.batch_size == 32
    assert p.params == 11_699_112 - 512 * 1000 - 1000 + 512 * 10 + 10
    # O2: fp16 trainable weights + fp32 buffers, fp32 master weights in the optimizer state
    assert p.breakdown.gradients_bytes == 2 * p.trainable_params


# ------------------------------------------------------------------------------------ findings
def test_dataloader_workers_are_a_warning_for_a_container_launcher():
    p = prof("pinned_devices.py", {"launcher": {"type": "docker", "image": "x:1"}})
    (w,) = [f for f in p.findings if f.code == "dataloader-workers"]
    assert w.severity == "warning" and "/dev/shm" in w.message


def test_hardcoded_devices_and_workers_are_findings():
    p = prof("pinned_devices.py")
    by_code = {}
    for f in p.findings:
        by_code.setdefault(f.code, []).append(f)
    dev = by_code["hardcoded-device"]
    assert sorted(f.line for f in dev) == [6, 7]
    assert all(f.severity == "warning" for f in dev)
    assert "gpu:3" in dev[0].message
    (w,) = by_code["dataloader-workers"]  # a local training shares the host's /dev/shm: a note
    assert w.severity == "info" and w.line == 21 and "shared memory" in w.message and "launcher: local" in w.message
    assert p.num_workers == 4
    assert p.batch_size == 64
    assert p.optimizer == "Momentum"


def test_linear_mismatch_is_a_warning_finding_with_both_shapes():
    """Read statically, the mismatch is a warning naming the layer and both shapes; when the script runs (the dry
    run, tests/profile/test_dry_run.py) Paddle's own error on it is the error finding."""
    p = prof("bad_linear.py")
    assert p.errors == []
    (err,) = [f for f in p.findings if f.code == "shape-mismatch"]
    assert err.severity == "warning"
    assert err.line == 13
    assert "'fc'" in err.message
    assert "in_features=4096" in err.message
    assert "[16, 16384]" in err.message


def test_cold_start_when_forward_cannot_be_followed():
    p = prof("opaque_model.py")
    assert p.method == "cold_start"
    assert p.params == 5000 * 256 + 256 * 256 + 256
    (f,) = [f for f in p.findings if f.code == "cold-start"]
    assert "while loop" in f.message
    assert p.activation_bytes_per_sample == int(32 * 256 * 4 * 1.5)


# ------------------------------------------------------------------------------------ errors
def test_missing_script_is_a_profile_error(tmp_path):
    with pytest.raises(ProfileError, match="not found"):
        profile_script(tmp_path / "nope.py", probe=False)


def test_syntax_error_names_file_and_line(tmp_path):
    s = write(tmp_path, "import paddle\n\ndef f(:\n    pass\n")
    with pytest.raises(ProfileError) as exc:
        profile_script(s, probe=False)
    assert f"{s}:3:" in str(exc.value)
    assert "fix the script" in str(exc.value)


def test_hostile_script_never_runs_in_the_worker(tmp_path, monkeypatch):
    marker = tmp_path / "marker"
    monkeypatch.setenv("AUTODL_TEST_MARKER", str(marker))
    p = prof("hostile.py")
    assert not marker.exists()
    assert p.params == 8 * 8 + 8 or p.method == "cold_start"


def test_probe_program_keeps_only_definitions():
    import ast

    from autodl.profile.analysis import scan
    from autodl.profile.probe import probe_program

    tree = ast.parse((FIX / "hostile.py").read_text())
    source, expr = probe_program(tree, scan(tree, ""))
    assert "os.system" not in source
    assert "while True" in source  # inside Hang.__init__ only
    assert source.count("while True") == 1
    assert expr == "Hang()"


def test_profile_package_does_not_import_paddle():
    code = "import sys, autodl.profile; from autodl.profile import profile_script; assert 'paddle' not in sys.modules"
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env={"PYTHONPATH": str(ROOT / "plugins")},
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr


# ------------------------------------------------------------------------------------ advice
def test_advice_for_a_run_that_does_not_fit(catalog, tmp_path):
    s = write(tmp_path, (FIX / "tiny_transformer.py").read_text()
              .replace("d_model=64", "d_model=1024").replace("layers=2", "layers=24"))
    p = prof(s, {"task": {"sequence_length": 1024, "batch_size_per_gpu": 64}})
    t4 = catalog.get("T4")
    lines = advice(p, [t4], 0.85)
    text = "\n".join(lines)
    assert "T4: needs" in text and "largest batch that fits" in text
    assert "smallest catalog card" in text or "no catalog card" in text
    big = max(catalog.models.values(), key=lambda m: m.memory_bytes)
    assert advice(p.model_copy(update={"peak_memory_bytes": 1}), [big], 0.85) == []


def test_advice_suggests_amp_when_it_would_fit(catalog):
    p = prof("simple_cnn.py", {"task": {"batch_size_per_gpu": 20000}})
    t4 = catalog.get("T4")
    lines = advice(p, [t4], 0.85)
    assert any("AMP O2" in l for l in lines) or any("recompute" in l for l in lines)
    assert any(str(p.max_batch_size(t4.memory_bytes, 0.85)) in l for l in lines)


def test_calls_that_act_outside_the_process_are_listed():
    """Static analysis says what the script does outside its process (here os.system at import), because the dry
    run executes the script: in the sandbox such calls fail or do nothing, in the real run they happen."""
    p = prof("hostile.py")
    (f,) = [f for f in p.findings if f.code == "side-effects"]
    assert f.severity == "info" and f.line == 8 and "os.system" in f.message
    assert not [f for f in prof("simple_cnn.py").findings if f.code == "side-effects"]


def test_arguments_paddle_refuses_are_an_error_but_an_inferred_shape_is_a_warning(tmp_path):
    """A negative layer size is refused by Paddle whatever the input: certain from the script, an error. A
    mismatch met with an input autodl inferred is its own reading: a warning (issue 8, kind 2)."""
    script = write(tmp_path, "import paddle.nn as nn\n\nmodel = nn.Linear(8, -4)\n")
    (err,) = prof_path(script).errors
    assert err.code == "shape-mismatch" and "negative" in err.message
    assert prof("bad_linear.py").errors == []


def prof_path(path):
    return profile_script(path, None, probe=False)


def test_the_input_a_script_declares_with_input_spec(tmp_path):
    """esttest F6: ``InputSpec([None, 3, 96, 96])`` for to_static, and ``np.random.rand(B, 3, 96, 96)`` (sizes as
    arguments), are the input; the probe once made up int64[b, 1] for this Conv2D."""
    import ast

    from autodl.profile.analysis import scan

    src = ("import numpy as np\nimport paddle\nimport paddle.nn as nn\nBATCH = 24\n"
           "net = nn.Sequential(nn.Conv2D(3, 8, 3), nn.Flatten())\n"
           "net = paddle.jit.to_static(net, input_spec=[paddle.static.InputSpec([None, 3, 96, 96], 'float32')])\n")
    f = scan(ast.parse(src), src)
    assert f.input_shape == [3, 96, 96] and f.input_dtype == "float32"
    src2 = src.split("net = paddle.jit")[0] + "x = paddle.to_tensor(np.random.rand(BATCH, 3, 64, 64).astype('float32'))\n"
    f2 = scan(ast.parse(src2), src2)
    assert f2.input_shape == [3, 64, 64] and f2.batch_size == 24


def test_a_datasets_sample_shape_is_read_from_its_getitem():
    """esttest F5: a Dataset whose ``__getitem__`` returns ``np.random.randn(CHANNELS, LENGTH).astype("float32")``
    gives the input [12, 2048] (the probe once guessed a length of 128: -93%); ``paddle.randint(0, V, [SEQ])`` an
    int64 [SEQ]."""
    import ast

    from autodl.profile.analysis import scan

    src = ("import numpy as np\nimport paddle\nfrom paddle.io import Dataset, DataLoader\nCHANNELS, LENGTH = 12, 2048\n"
           "class W(Dataset):\n    def __len__(self):\n        return 8\n    def __getitem__(self, i):\n"
           "        return np.random.randn(CHANNELS, LENGTH).astype('float32'), np.int64(i)\n"
           "loader = DataLoader(W(), batch_size=32)\n")
    f = scan(ast.parse(src), src)
    assert f.input_shape == [12, 2048] and f.input_dtype == "float32" and f.batch_size == 32
    src2 = src.replace("np.random.randn(CHANNELS, LENGTH).astype('float32')", "paddle.randint(0, 100, [LENGTH])")
    f2 = scan(ast.parse(src2), src2)
    assert f2.input_shape == [2048] and f2.input_dtype == "int64"


def test_a_dataset_yielding_dicts_gives_its_input_ids():
    """esttest F17: ``__getitem__`` builds ``ids = np.zeros(SEQ, "int64")``, fills it, and returns
    ``{"input_ids": ids, "attention_mask": ..., "labels": ...}`` (HF/PaddleNLP style, ``model(**batch)``): the input
    is int64 [SEQ] (the probe once guessed a sequence length of 128: -31.5%)."""
    import ast

    from autodl.profile.analysis import scan

    src = ("import numpy as np\nfrom paddle.io import Dataset, DataLoader\nSEQ = 192\n"
           "class D(Dataset):\n    def __len__(self):\n        return 8\n    def __getitem__(self, i):\n"
           "        ids = np.zeros(SEQ, 'int64')\n        ids[:10] = 5\n"
           "        return {'attention_mask': np.ones(SEQ, 'int64'), 'input_ids': ids, 'labels': np.int64(1)}\n"
           "loader = DataLoader(D(), batch_size=24)\n")
    f = scan(ast.parse(src), src)
    assert f.input_shape == [192] and f.input_dtype == "int64" and f.sequence_length == 192
