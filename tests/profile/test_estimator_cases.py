"""The seven handed estimator cases (tests/cases/estimator/, README and truth.json there): each script's right value.

Each script was refused, or estimated far off, before the dry run existed (issue 8). Truth = Paddle 3.3.1's CPU
allocator peak of the second full training step, measured by the cases' ``truth.py`` (``truth.json``), plus the
exact parameter count; for ``seg_train_eval.py`` also the second evaluation step's peak. The dry run runs the
script itself, so the estimate is the measurement of the same step: it is held to the issue's targets (never under
by more than 5%, never over by more than 10%). Seen: within 0.4% when the script's own batch runs; -4.6% once on
lstm_seq2seq.py, where a loaded machine left time for a smaller largest batch and the step was extrapolated from
it. These run Paddle and are ``slow``.
"""

from __future__ import annotations

from pathlib import Path

import json

import pytest

from autodl.profile import profile_script

CASES = Path(__file__).resolve().parents[1] / "cases" / "estimator"
MIB = 1 << 20
TRUTH = {c["file"]: c for c in json.loads((CASES / "truth.json").read_text())["cases"]}

pytestmark = pytest.mark.slow


def _close(est: int, truth: float, under: float = 0.05, over: float = 0.10) -> bool:
    """Within the issue's targets: at most ``under`` below the truth, at most ``over`` above it."""
    return -under <= (est - truth) / truth <= over



def _profile(name: str):
    p = profile_script(CASES / name, probe=True)
    assert p.method == "dry_run", (p.method_reason, [f.message for f in p.findings])
    assert p.errors == [], [f.message for f in p.errors]
    return p


def test_gru_text_cls_int64_ids_from_the_dataset():
    """Was: the probe fed float ids to the Embedding -> false "shape-mismatch", exit 3. Truth 595,579,104 B,
    4,337,668 params; ids [64, 200] int64 from a Dataset/DataLoader."""
    p = _profile("gru_text_cls.py")
    assert p.params == 4_337_668
    assert _close(p.tensor_peak_bytes, 595_579_104)
    (train,) = p.phases
    assert train.input_shapes == [[200]] and train.input_dtypes == ["int64"] and train.batch_size == 64


def test_fpn_functional_interpolate_skips():
    """Was: F.interpolate taken as shape-keeping -> false broadcast error, +6338%. Truth 28,274,696 B, 524,962."""
    p = _profile("fpn_functional.py")
    assert p.params == 524_962
    assert _close(p.tensor_peak_bytes, 28_274_696)
    assert not [f for f in p.findings if f.code == "shape-mismatch"]


def test_lstm_seq2seq_two_inputs():
    """Was: two-input forward -> probe TypeError reported as the user's error; -44%. Truth 451,898,792 B."""
    p = _profile("lstm_seq2seq.py")
    assert p.params == 15_556_416
    assert _close(p.tensor_peak_bytes, 451_898_792)
    assert p.phases[0].input_shapes == [[40], [40]]


def test_bert_encoder_config_in_class_attributes():
    """Was: config object not read -> params 0, FLOPs 0, -97%. Truth 368,957,936 B, 11,171,074 params."""
    p = _profile("bert_encoder.py")
    assert p.params == 11_171_074
    assert _close(p.tensor_peak_bytes, 368_957_936)
    assert p.flops_per_step > 0 and p.optimizer == "AdamW"


def test_densenet169_zoo_name_from_paddle_itself():
    """Was: zoo name not tabulated -> no model, params 0, +235%. Truth 827,829,320 B, 12,809,380 params."""
    p = _profile("densenet169_cls.py")
    assert p.params == 12_809_380
    assert _close(p.tensor_peak_bytes, 827_829_320)


def test_unet_input_size_from_the_dataset():
    """Was: input assumed 224x224 while the Dataset yields 128x128 -> +158%. Truth 223,782,572 B, 1,945,589."""
    p = _profile("unet_seg.py")
    assert p.params == 1_945_589
    assert _close(p.tensor_peak_bytes, 223_782_572)
    assert p.input_shape == [3, 128, 128]


def test_seg_train_eval_eval_pass_is_estimated_and_flagged(monkeypatch):
    """Was: only the training step estimated; the evaluation pass at 2048x2048 needs 8.8x. Truth (truth.json):
    train step 686,961,360 B (655.1 MiB); second eval step 6,034,696,904 B (5755.1 MiB: the first step's 5691.1
    MiB plus its prediction and argmax, which the script keeps alive into the second)."""
    t = TRUTH["seg_train_eval.py"]
    # the 2048x2048 evaluation step takes ~60 s of the 150 s default on two idle cores; on a loaded machine the
    # default can end the dry run before it (a dry-run-timeout finding says so): this test is about the phase
    monkeypatch.setenv("AUTODL_DRYRUN_TIMEOUT_S", "600")
    p = _profile("seg_train_eval.py")
    train = next(ph for ph in p.phases if ph.name == "train")
    ev = next(ph for ph in p.phases if ph.name == "eval")
    assert _close(train.peak_bytes, t["train_peak_bytes"]) and train.batch_size == 2
    assert _close(ev.peak_bytes, t["eval_peak_bytes"]) and ev.input_shapes == [[3, 2048, 2048]] and not ev.grad
    assert p.tensor_peak_bytes == ev.peak_bytes
    (f,) = [f for f in p.findings if f.code == "phase-peaks"]
    assert f.severity == "warning" and "eval" in f.message and "8.8x" in f.message
