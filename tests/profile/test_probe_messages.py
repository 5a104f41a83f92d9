"""What the model-only probe says when it cannot build the model for a reason of its own, not the script's.

From a fresh user's trial: a model class imported from the script's own package read as "no model construction was
found" (as if the script had none); a module-level value read in ``__init__`` (``cfg = json.load(...)``), which the
probe does not run, came back as "the probe failed while building the model (NameError: name 'cfg' is not defined)",
which read as the script's fault.
"""

from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest

from autodl.profile.facts import ScriptFacts, scan
from autodl.profile.probe import _read_probe_report, run_probe
from autodl.sandbox import SandboxResult
from autodl.spec import parse_spec

NET = ("import paddle\n\nclass Net(paddle.nn.Layer):\n    def __init__(self):\n        super().__init__()\n"
       "        self.fc = paddle.nn.Linear(8, 2)\n\n    def forward(self, x):\n        return self.fc(x)\n")


def facts_of(script: Path) -> ScriptFacts:
    src = script.read_text()
    return scan(ast.parse(src), src)


def skipped_message(script: Path) -> str:
    """The ``probe-skipped`` finding of ``script``, whose static reading found no model construction: the probe
    returns before running anything (no sandbox, no Paddle)."""
    facts = facts_of(script)
    assert facts.model_site is None
    res = run_probe(script, facts, batch=4, input_shape=[8], seq_len=None)
    (f,) = [f for f in res.findings if f.code == "probe-skipped"]
    assert f.severity == "info" and not res.ok
    return f.message


@pytest.mark.parametrize("layout", ["package", "module"])
def test_a_model_imported_from_the_scripts_own_package_is_named_not_said_missing(tmp_path, layout):
    if layout == "package":
        (tmp_path / "mypkg").mkdir()
        (tmp_path / "mypkg" / "__init__.py").write_text("")
        (tmp_path / "mypkg" / "model.py").write_text(NET)
        imports, module = "from mypkg.model import Net\n", "mypkg.model"
    else:
        (tmp_path / "nets.py").write_text(NET)
        imports, module = "import nets\n", "nets"
    script = tmp_path / "train.py"
    call = "Net()" if layout == "package" else "nets.Net()"
    script.write_text(f"import paddle\n{imports}model = {call}\n"
                      "opt = paddle.optimizer.SGD(parameters=model.parameters())\n")
    msg = skipped_message(script)
    assert "no model construction" not in msg
    assert f"builds {call} at line 3" in msg and f"script's own module {module}" in msg
    assert "does not follow the script's own imports" in msg and "dry run" in msg


def test_a_local_import_without_a_construction_in_sight_names_the_modules(tmp_path):
    (tmp_path / "helpers").mkdir()
    (tmp_path / "helpers" / "build.py").write_text("def make():\n    return None\n")
    script = tmp_path / "train.py"
    script.write_text("import paddle\nfrom helpers.build import make\nm = make()\n")
    msg = skipped_message(script)
    assert "imports its own modules (helpers.build, next to it)" in msg
    assert "does not follow the script's own imports" in msg


def test_no_construction_and_no_local_import_keeps_the_plain_message(tmp_path):
    """``numpy`` is no file or folder next to the script: not the script's own module."""
    script = tmp_path / "train.py"
    script.write_text("import numpy\nimport paddle\nx = numpy.zeros(3)\n")
    assert skipped_message(script) == ("probe not run: no model construction (a paddle.nn.Layer subclass, "
                                       "nn.Sequential or paddle.vision.models call) was found.")


CFG_SCRIPT = ("import json, paddle\n{setter}\n"
              "class Net(paddle.nn.Layer):\n    def __init__(self):\n        super().__init__()\n"
              "        self.fc = paddle.nn.Linear(cfg['hidden'], 10)\n"
              "    def forward(self, x):\n        return self.fc(x)\n"
              "model = Net()\nopt = paddle.optimizer.SGD(parameters=model.parameters())\n")


def probe_failure(script: Path, report: dict) -> tuple[str, str, str, int | None]:
    """The finding the probe makes of the child's ``report`` (the JSON after ``AUTODL_PROBE``)."""
    result = SandboxResult(0, "AUTODL_PROBE " + json.dumps(report) + "\n", "", False, 1.0, "none")
    data, failure = _read_probe_report(script, result, 8 << 30, facts_of(script), 9, (2, 4))
    assert failure is not None
    return failure


@pytest.mark.parametrize("setter, line", [
    ("cfg = json.load(open('config.json'))", 2),
    ("with open('config.json') as f:\n    cfg = json.load(f)", 3),
])
def test_a_name_error_on_a_module_level_value_the_probe_dropped_is_said_as_the_probes_limit(tmp_path, setter, line):
    script = tmp_path / "train.py"
    script.write_text(CFG_SCRIPT.format(setter=setter))
    code, msg, severity, at = probe_failure(script, {
        "ok": False, "stage": "model", "error": "NameError: name 'cfg' is not defined"})
    assert (code, severity) == ("probe-failed", "warning")
    assert f"reads cfg, set by the module-level statement at line {line}, which the probe does not run" in msg
    assert "imports, definitions, constants and config objects" in msg and "conservative bound" in msg
    assert "not a fault of the script" in msg and "failed while building the model" not in msg


def test_a_name_error_in_the_forward_is_not_taken_for_a_shape_error(tmp_path):
    """The child reports the layer it was in: a NameError there is still the dropped value's, not the input's."""
    script = tmp_path / "train.py"
    script.write_text(CFG_SCRIPT.format(setter="cfg = json.load(open('config.json'))"))
    code, msg, _, _ = probe_failure(script, {
        "ok": False, "stage": "step", "error": "NameError: name 'cfg' is not defined",
        "layer": {"layer": "fc", "type": "Linear", "input_shapes": [[2, 8]], "weight_shape": "[8, 10]"}})
    assert code == "probe-failed" and "running a training step" in msg and "reads cfg" in msg


def test_a_name_error_the_script_would_make_too_stays_the_scripts(tmp_path):
    """``hidden`` is set by no module-level statement (nor ``cfg`` when the probe kept it, a constant): the script
    itself would fail the same way, so the message quotes the error as before."""
    script = tmp_path / "train.py"
    script.write_text(CFG_SCRIPT.format(setter="cfg = {'hidden': 8}"))
    for name in ("hidden", "cfg"):
        code, msg, _, _ = probe_failure(script, {
            "ok": False, "stage": "model", "error": f"NameError: name '{name}' is not defined"})
        assert code == "probe-failed"
        assert f"failed while building the model (NameError: name '{name}' is not defined)" in msg


REQUIRED_ARGS = (
    "import argparse\nimport paddle\n\np = argparse.ArgumentParser()\n"
    "p.add_argument('--hidden', type=int, required=True)\np.add_argument('--layers', type=int, required=True)\n"
    "args = p.parse_args()\n\n\nclass Net(paddle.nn.Layer):\n    def __init__(self, hidden, layers):\n"
    "        super().__init__()\n        self.body = paddle.nn.Sequential(*[paddle.nn.Linear(hidden, hidden)] * layers)\n"
    "\n    def forward(self, x):\n        return self.body(x)\n\n\nmodel = Net(args.hidden, args.layers)\n")


def test_a_failure_on_the_stand_ins_for_required_options_is_said_as_the_probes_limit(tmp_path):
    """A fresh user's script with required --hidden/--layers: the probe, which builds the model from the argparse
    defaults, failed with "TypeError: can't multiply sequence by non-int of type 'NoneType'" and said it as the
    script's failure ('the probe failed while building the model (TypeError ...)')."""
    script = tmp_path / "train_args.py"
    script.write_text(REQUIRED_ARGS)
    code, msg, severity, _ = probe_failure(script, {
        "ok": False, "stage": "model", "error": "TypeError: can't multiply sequence by non-int of type 'NoneType'"})
    assert code == "probe-failed" and severity == "warning"
    assert "required options (--hidden, --layers)" in msg and "not a fault of the script" in msg, msg


def test_an_error_not_about_the_stand_ins_is_not_said_as_theirs(tmp_path):
    """With required options, an error that is not about a None (a shape the probe's made-up input met) keeps its
    own finding: the stand-ins did not cause it."""
    script = tmp_path / "train_args.py"
    script.write_text(REQUIRED_ARGS)
    _, msg, _, _ = probe_failure(script, {"ok": False, "stage": "model", "error": "ValueError: (InvalidArgument) bad"})
    assert "required options" not in msg and "(ValueError: (InvalidArgument) bad)" in msg, msg


@pytest.mark.slow
def test_the_real_probe_says_both(tmp_path):
    """End to end, the probe alone (no dry run): the local package's model and the dropped ``cfg``."""
    from autodl.profile import profile_script

    spec = parse_spec({"task": {"batch_size_per_gpu": 4, "input_shape": [8]}})
    (tmp_path / "mypkg").mkdir()
    (tmp_path / "mypkg" / "__init__.py").write_text("")
    (tmp_path / "mypkg" / "model.py").write_text(NET)
    local = tmp_path / "train.py"
    local.write_text("import paddle\nfrom mypkg.model import Net\nmodel = Net()\n"
                     "opt = paddle.optimizer.SGD(parameters=model.parameters())\n")
    p = profile_script(local, spec, probe=True, dry_run=False)
    (f,) = [f for f in p.findings if f.code == "probe-skipped"]
    assert "mypkg.model" in f.message and "no model construction" not in f.message
    dropped = tmp_path / "cfg_train.py"
    dropped.write_text(CFG_SCRIPT.format(setter="cfg = json.load(open('config.json'))"))
    (tmp_path / "config.json").write_text('{"hidden": 8}')
    p = profile_script(dropped, spec, probe=True, dry_run=False)
    (f,) = [f for f in p.findings if f.code == "probe-failed"]
    assert "reads cfg, set by the module-level statement at line 2" in f.message and f.line == 9
    assert p.method != "probe"
