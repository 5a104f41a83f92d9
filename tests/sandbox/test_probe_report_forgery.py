"""The probe's report is the user's code's to forge (issue 13, helper sectest).

The probe child executes the model's ``__init__`` in its own process, so the script can print an ``AUTODL_PROBE``
line of its own. Seen before the fix, with the real CLI (``autodl profile --probe --json``): ``AUTODL_PROBE {bad``,
``[1,2]``, ``{"ok": true}``, NaN or 1e300 peaks, a 5,000-digit integer, a ``layer`` that is a string, each ended
the profile in ``internal error`` (exit 1, a KeyError/ValueError/OverflowError in the calling process: an Airflow
task failed by the user's script); negative peaks and ``params: -100`` were taken as measured (``method: probe``,
``params: -100``); a 3 MB error text went whole into a finding. Now every field is checked
(:func:`autodl.profile.probe.probe_report`) and a bad report is a ``probe-failed`` warning with the conservative bound.
"""

from __future__ import annotations

import json

import pytest

from autodl.profile.probe import REPORT_TEXT_CHARS, probe_report

GOOD = {"ok": True, "peaks": {"2": 1000, "4": 2000}, "params": 10, "trainable": 10}


@pytest.mark.parametrize("text, why", [
    pytest.param("{bad", "not JSON", id="not-json-was-JSONDecodeError"),
    pytest.param("[1, 2]", "not a JSON object", id="list-was-AttributeError"),
    pytest.param('{"ok": true}', "peaks", id="no-peaks-was-KeyError"),
    pytest.param('{"ok": true, "peaks": {"2": NaN, "4": 1}, "params": 1, "trainable": 1}', "NaN",
                 id="nan-was-ValueError"),
    pytest.param('{"ok": true, "peaks": {"2": 1e300, "4": 1e308}, "params": 1, "trainable": 1}', "peak",
                 id="1e300-was-OverflowError"),
    pytest.param('{"ok": true, "peaks": {"2": -5, "4": -1}, "params": -100, "trainable": -100}', "peak",
                 id="negative-was-taken-as-measured"),
    pytest.param('{"ok": true, "peaks": {"2": 1, "4": 2}, "params": ' + "9" * 5000 + ', "trainable": 1}', "not JSON",
                 id="5000-digits-was-ValueError"),
    pytest.param('{"ok": true, "peaks": {"2": 1, "4": 2}, "params": true, "trainable": 1}', "params",
                 id="bool-params"),
    pytest.param('{"ok": true, "peaks": {"2": 1, "4": 2}, "params": 1, "trainable": 5}', "trainable",
                 id="more-trainable-than-params"),
    pytest.param('{"ok": true, "peaks": {"1": 1, "8": 2}, "params": 1, "trainable": 1}', "batches",
                 id="other-batches-was-KeyError"),
    pytest.param('{"ok": false, "stage": "step", "layer": "abc"}', "layer", id="layer-string-was-AttributeError"),
    pytest.param('{"ok": true, "peaks": {"2": 1, "4": 2}, "params": 1, "trainable": 1, "fwd_flops_per_sample": "x"}',
                 "fwd_flops", id="flops-text"),
    pytest.param("[" * 100_000 + "]" * 100_000, "not JSON", id="deep-nesting"),
])
def test_a_forged_report_is_refused(text, why):
    with pytest.raises(ValueError, match=why):
        probe_report(text, (2, 4))


def test_a_real_report_is_kept_and_texts_are_bounded_and_printable():
    assert probe_report(json.dumps(GOOD), (2, 4))["peaks"] == {2: 1000, 4: 2000}
    failed = probe_report(json.dumps({"ok": False, "stage": "step", "error": "E" * 3_000_000 + "\x1b[2J",
                                      "layer": {"layer": "fc\x1b]0;x\x07", "type": "Linear", "input_shapes": [[2, 8]],
                                                "weight_shape": [8, 2]}}), (2, 4))
    assert len(failed["error"]) <= REPORT_TEXT_CHARS
    assert "\x1b" not in failed["layer"]["layer"] and failed["layer"]["input_shapes"] == [[2, 8]]


FORGER = '''
import json, os, sys
import paddle
import paddle.nn as nn


class Net(nn.Layer):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 2)
        sys.stdout.write("AUTODL_PROBE " + {line!r} + "\\n")
        sys.stdout.flush()
        os._exit(0)

    def forward(self, x):
        return self.fc(x)


model = Net()
'''


@pytest.mark.slow
@pytest.mark.parametrize("line", [
    pytest.param('{"ok": true, "peaks": {"2": -1000000000000, "4": -5}, "params": -100, "trainable": -100}',
                 id="negative-params-were-the-estimate"),
    pytest.param('{"ok": true, "peaks": {"2": 1e300, "4": 1e308}, "params": 1e308, "trainable": 1}',
                 id="huge-was-internal-error"),
])
def test_profile_keeps_the_conservative_bound_when_the_script_forges_the_report(sandbox_level, tmp_path, line):
    from autodl.profile import profile_script
    from autodl.spec import parse_spec

    script = tmp_path / "forger.py"
    script.write_text(FORGER.format(line=line))
    p = profile_script(script, parse_spec({"task": {"input_shape": [8], "batch_size_per_gpu": 4}}), probe=True)
    assert p.method == "cold_start" and p.params is None and p.peak_memory_bytes > 0  # nothing forged is believed
    (failed,) = [f for f in p.findings if f.code == "probe-failed"]
    assert failed.severity == "warning" and "could not be read" in failed.message
