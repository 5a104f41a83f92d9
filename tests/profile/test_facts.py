"""The call-site facts of training scripts and the conservative bound the profile takes when nothing measured."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from autodl.errors import ProfileError
from autodl.profile import profile_script
from autodl.spec import parse_spec

FIX = Path(__file__).parent / "fixtures"
ROOT = Path(__file__).resolve().parents[2]


def prof(name, spec=None, **kw):
    return profile_script(FIX / name, parse_spec(spec) if spec else None, probe=False, **kw)


def write(tmp_path, text, name="train.py"):
    p = tmp_path / name
    p.write_text(text)
    return p


# ------------------------------------------------------------------------------------ the conservative bound
def test_a_script_nothing_measured_has_an_unknown_size_said_in_a_warning():
    """Without the dry run or the probe, nothing measured the model: its size is unknown (``params`` None, never a
    small number read from the text), the warning says so and that placement takes the largest allowed device."""
    p = prof("simple_cnn.py")
    assert p.method == "cold_start"
    assert p.params is None and p.trainable_params is None
    (f,) = [f for f in p.findings if f.code == "cold-start"]
    assert f.severity == "warning"
    assert "could not be measured" in f.message and "largest allowed device" in f.message
    # the advice names what measures it, here what turned it off (a fresh user with task.probe: false was told to
    # install Paddle, installed, and to drop a --no-probe never passed); task.model_name only names outputs
    assert "let the dry run measure the script: this profile turned it off (task.probe: false" in f.message
    assert "paddle extra" not in f.message
    assert "task.model_name does not change the figure" in f.message
    assert p.max_batch_size_by_device == {}  # no largest batch without the model states
    assert p.flops_per_step is None and p.estimates_bytes == {}


def test_the_cold_start_advice_after_a_dry_run_that_measured_nothing_is_to_mend_what_it_met():
    """A fresh user's dry run met a missing file; the cold-start warning still advised installing Paddle (the paddle
    extra, without --no-probe), which had just run the script."""
    from autodl.profile import paths as P

    inputs = P.RunInputs(spec_batch=None, batch=8, seq_len=None, input_shape=None, assumptions=[])
    bound = P.bound_path(inputs)
    (untried,) = P.kept_findings(bound.estimate, bound)
    (tried,) = P.kept_findings(bound.estimate, bound, tried=True)
    (off,) = P.kept_findings(bound.estimate, bound, off=True)
    assert "task.probe: false" in off.message and "paddle extra" not in off.message
    assert "paddle extra" in untried.message
    assert "mend what stopped the dry run" in tried.message and "paddle extra" not in tried.message
    assert "task.input_shape or task.sequence_length" in tried.message


def test_the_bound_places_an_unknown_size_on_the_largest_allowed_device(catalog):
    """autodl.policy.need sizes the bound as the threshold of the largest allowed device, never by its figure of
    activations alone."""
    from autodl.policy.need import needed_bytes
    from autodl.types import Device

    p = prof("simple_cnn.py")
    gib = 1 << 30
    devices = [Device(device_id=f"gpu{i}", index=i, vendor="nvidia", model=m, memory_total_bytes=mem)
               for i, (m, mem) in enumerate([("T4", 16 * gib), ("A100-SXM4-80GB", 80 * gib)])]
    assert needed_bytes(p, devices, {"nvidia"}, 0.85) == int(0.85 * 80 * gib) > p.peak_memory_bytes


def test_the_call_site_facts_of_the_simple_cnn():
    """What the call sites say, exactly: the model class, the loader's batch, the input tensors, the optimizer."""
    p = prof("simple_cnn.py")
    assert p.model_name == "SimpleCNN"
    assert p.batch_size == 64
    assert p.input_shape == [3, 32, 32]
    assert p.optimizer == "Adam"


def test_spec_overrides_script_values():
    p = prof("simple_cnn.py", {"task": {"batch_size_per_gpu": 7, "input_shape": [3, 64, 64]}})
    assert p.batch_size == 7
    assert p.input_shape == [3, 64, 64]
    assert p.errors == []  # no shape reading: a mismatch is the dry run's to find, when Paddle runs the script


def test_argparse_defaults_are_read(tmp_path):
    p = prof("opaque_model.py")
    assert p.batch_size == 48


def test_peak_rescales_linearly_with_batch():
    p = prof("simple_cnn.py")
    assert p.peak_at_batch(p.batch_size) == p.peak_memory_bytes
    assert p.peak_at_batch(2 * p.batch_size) - p.peak_memory_bytes == p.batch_size * p.activation_bytes_per_sample


def test_breakdown_names_gpu_only_workspace_terms():
    """A script that calls a convolution gets cuDNN's workspace (the call-site fact; the dry run's model decides
    when it ran)."""
    p = prof("simple_cnn.py")
    terms = p.workspace_terms_bytes
    assert {"cuda_context", "cudnn_workspace", "cublas_workspace", "allocator_slack"} <= set(terms)
    assert p.breakdown.workspace_bytes == sum(terms.values())
    assert p.peak_memory_bytes == p.breakdown.total_bytes
    assert "cudnn_workspace" not in prof("tiny_transformer.py").workspace_terms_bytes


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
    assert p.amp == "O2" and p.dtype == "float16"
    assert p.optimizer == "Momentum"
    assert p.batch_size == 32
    assert p.params is None  # a zoo model's size is the dry run's to measure


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
    assert p.params is None and p.method == "cold_start"


def test_probe_program_keeps_only_definitions():
    import ast

    from autodl.profile.facts import scan
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


def test_calls_that_act_outside_the_process_are_listed():
    """Static analysis says what the script does outside its process (here os.system at import), because the dry
    run executes the script: in the sandbox such calls fail or do nothing, in the real run they happen."""
    p = prof("hostile.py")
    (f,) = [f for f in p.findings if f.code == "side-effects"]
    assert f.severity == "info" and f.line == 8 and "os.system" in f.message
    assert not [f for f in prof("simple_cnn.py").findings if f.code == "side-effects"]


def test_the_input_a_script_declares_with_input_spec(tmp_path):
    """esttest F6: ``InputSpec([None, 3, 96, 96])`` for to_static, and ``np.random.rand(B, 3, 96, 96)`` (sizes as
    arguments), are the input; the probe once made up int64[b, 1] for this Conv2D."""
    import ast

    from autodl.profile.facts import scan

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

    from autodl.profile.facts import scan

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

    from autodl.profile.facts import scan

    src = ("import numpy as np\nfrom paddle.io import Dataset, DataLoader\nSEQ = 192\n"
           "class D(Dataset):\n    def __len__(self):\n        return 8\n    def __getitem__(self, i):\n"
           "        ids = np.zeros(SEQ, 'int64')\n        ids[:10] = 5\n"
           "        return {'attention_mask': np.ones(SEQ, 'int64'), 'input_ids': ids, 'labels': np.int64(1)}\n"
           "loader = DataLoader(D(), batch_size=24)\n")
    f = scan(ast.parse(src), src)
    assert f.input_shape == [192] and f.input_dtype == "int64" and f.sequence_length == 192


def test_the_model_is_named_by_the_class_a_builder_function_returns():
    """``model = build()`` where ``build`` returns ``Net(...)``: the profile's model is ``Net`` (its pair type and
    records), read from the construction's syntax, not from following ``__init__``."""
    import ast

    from autodl.profile.facts import scan

    src = ("import paddle\nclass Net(paddle.nn.Layer):\n    def __init__(self, width):\n        super().__init__()\n"
           "        self.fc = paddle.nn.Linear(width, 2)\n"
           "def build(width=8):\n    if width < 0:\n        return None\n    return Net(width)\n"
           "model = build()\nopt = paddle.optimizer.Adam(parameters=model.parameters())\n")
    f = scan(ast.parse(src), src)
    assert f.model_site is not None and f.model_site.kind == "builder"
    assert f.model_name == "Net"


def test_a_layer_paddle_names_is_found_at_the_line_that_set_it():
    """The probe's shape error names a sub-layer by Paddle's dotted path; the finding's line is the script's
    ``self.<name> = ...`` (a list index is skipped), or ``add_sublayer('<name>', ...)``."""
    import ast

    from autodl.profile.probe import layer_line

    src = ("import paddle.nn as nn\nclass Block(nn.Layer):\n    def __init__(self):\n        super().__init__()\n"
           "        self.proj = nn.Linear(4, 4)\n"
           "class Net(nn.Layer):\n    def __init__(self):\n        super().__init__()\n"
           "        self.blocks = nn.LayerList([Block() for _ in range(3)])\n"
           "        self.add_sublayer('head', nn.Linear(4, 2))\n")
    tree = ast.parse(src)
    assert layer_line(tree, "blocks.2.proj") == 5
    assert layer_line(tree, "blocks.1") == 9
    assert layer_line(tree, "head") == 10
    assert layer_line(tree, "missing") is None and layer_line(tree, None) is None


def test_a_model_built_from_a_local_of_main_is_not_probed_and_the_reason_names_it():
    """``model = mlp(cfg)`` inside ``main()``, ``cfg`` read from a file there: the probe runs the script's imports,
    definitions, constants and config objects only, so it would fail on ``cfg`` with a ``NameError`` that is not the
    script's. It is not run, and the reason names ``cfg``, ``main()`` and the line
    (benchmarks/models/cfg_dataclass_mlp.py); a module-level value is named by its line."""
    import ast

    from autodl.profile.facts import scan
    from autodl.profile.probe import probe_program

    path = ROOT / "benchmarks" / "models" / "cfg_dataclass_mlp.py"
    src = path.read_text()
    f = scan(ast.parse(src), src)
    with pytest.raises(ValueError, match=r"construction at line 55 uses cfg, a value main\(\) computes, which the "
                                         r"probe does not run"):
        probe_program(f.interp.tree, f)  # cfg = TrainConfig.load(path): a call, not a config object's construction
    src = ("import paddle\nWIDTH = 8\nclass Net(paddle.nn.Layer):\n    def __init__(self, w, act=None):\n"
           "        super().__init__()\n        self.fc = paddle.nn.Linear(w, 2)\n"
           "model = Net(WIDTH, act=lambda x: max(x, 0))\n")
    f = scan(ast.parse(src), src)
    assert probe_program(f.interp.tree, f)[1] == "Net(8, act=lambda x: max(x, 0))"  # constants, builtins, lambdas

    src = ("import paddle\nclass Net(paddle.nn.Layer):\n    def __init__(self, body):\n        super().__init__()\n"
           "        self.body = body\nbody = paddle.nn.Linear(4, 4)\nmodel = Net(body)\n")
    f = scan(ast.parse(src), src)
    with pytest.raises(ValueError, match=r"uses body, set by the module-level statement at line 6, which the probe"):
        probe_program(f.interp.tree, f)


def test_the_probe_program_builds_config_objects_and_skips_imports_that_fail():
    """What the probe runs: a config object the construction reads (``CFG = ModelConfig()`` at the module level, a
    script class that is not a layer) is built before it; an import that fails where the probe runs (a package only
    the Dataset needs) is skipped and recorded, not fatal."""
    import ast

    from autodl.profile.facts import ModelSite, scan
    from autodl.profile.probe import probe_program

    src = ("import json\nfrom dataclasses import dataclass\n@dataclass\nclass ModelConfig:\n    width: int = 8\n"
           "CFG = ModelConfig(width=4)\n"
           "class Net:\n    def __init__(self, cfg):\n        self.width = cfg.width\n"
           "class Data:\n    def __getitem__(self, i):\n        import not_installed_audio_lib\n        return i\n"
           "def main():\n    model = Net(CFG)\n")
    f = scan(ast.parse(src), src)
    main = f.interp.tree.body[-1]  # Net is no paddle layer here (the test process imports no paddle): named by hand
    f.model_site = ModelSite(node=main.body[0].value, func=main, var="model", kind="class")
    source, expr = probe_program(f.interp.tree, f)
    assert expr == "Net(CFG)" and "CFG = ModelConfig(width=4)" in source
    ns = {"__autodl_missing__": [], "__autodl_args__": None}
    exec(compile(source, "probe", "exec"), ns)
    assert ns["__autodl_missing__"] == ["No module named 'not_installed_audio_lib'"]
    assert eval(expr, ns).width == 4


@pytest.mark.parametrize("transform, shape", [
    ("T.RandomResizedCrop(128)", [3, 128, 128]),
    ("T.Resize((64, 96))", [3, 64, 96]),
], ids=["crop-before-dataset", "resize-tuple"])
def test_a_transforms_size_wins_over_the_datasets_default_wherever_written(transform, shape):
    """A fresh user's fine-tuning script built its transform (``RandomResizedCrop(128)``) before the
    ``DatasetFolder`` that uses it: the folder's documented default, 3 x 224 x 224, replaced the 128 x 128 the
    transform makes (and a ``Resize((64, 64))`` of a tuple was not read at all)."""
    import ast

    from autodl.profile.facts import scan

    src = ("import paddle\nimport paddle.vision.transforms as T\nfrom paddle.vision.datasets import DatasetFolder\n"
           f"def main():\n    tf = T.Compose([{transform}, T.ToTensor()])\n"
           "    train = DatasetFolder('/data/train', transform=tf)\n"
           "    loader = paddle.io.DataLoader(train, batch_size=8)\n")
    f = scan(ast.parse(src), src)
    assert f.input_shape == shape


def test_the_probe_builds_a_zoo_model_without_its_pretrained_weights():
    """``mobilenet_v2(pretrained=True)``: the probe has no network, and the weights' values change no memory, so it
    builds the model with ``pretrained=False`` (a fresh user's probe failed on the download)."""
    import ast

    from autodl.profile.facts import scan
    from autodl.profile.probe import probe_program

    src = ("import paddle\nfrom paddle.vision.models import mobilenet_v2\n"
           "model = mobilenet_v2(pretrained=True, num_classes=5)\n"
           "opt = paddle.optimizer.Adam(parameters=model.parameters())\n")
    f = scan(ast.parse(src), src)
    assert probe_program(f.interp.tree, f)[1] == "mobilenet_v2(pretrained=False, num_classes=5)"
