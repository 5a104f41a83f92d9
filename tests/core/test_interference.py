"""Interference measured, not assumed: a pair type's co-located/solo speed from the records, else the published prior."""

from __future__ import annotations

import pytest

from autodl.interference import (barred_pairs, may_pack, measured_ratios, model_key, pair_speed, published_pairs,
                                 published_prior)
from autodl.policy.packing import SLOWDOWN_BAR
from autodl.records import RecordStore
from autodl.types import RunRecord

DEVICE = "H100-SXM5-80GB"


def run(key, model, step_s, *, sharing="exclusive", co=(), device=DEVICE, outcome="succeeded") -> RunRecord:
    return RunRecord(run_key=key, script=f"/{model}.py", outcome=outcome, declared_pool=False, device_model=device,
                     profile={"model_name": model}, metrics={"step_time_s": step_s}, sharing=sharing,
                     co_tenants=list(co))


def pair(ratio_a: float, ratio_b: float, a="bert", b="gpt2") -> list[RunRecord]:
    """Solo runs of a (0.10 s/step) and b (0.20 s/step), then one shared pair at the given speed ratios."""
    return [run("a-solo-1", a, 0.10), run("a-solo-2", a, 0.10), run("b-solo", b, 0.20),
            run("a-shared", a, 0.10 / ratio_a, sharing="shared", co=["b-shared"]),
            run("b-shared", b, 0.20 / ratio_b, sharing="shared", co=["a-shared"])]


def test_a_pair_type_measured_at_0_7_is_barred():
    records = pair(0.7, 0.7)
    speed = pair_speed("bert", "gpt2", DEVICE, records)
    assert speed.source == "measured" and speed.ratios == pytest.approx([0.7, 0.7]) and speed.barred
    assert not may_pack("bert", "gpt2", DEVICE, records=records)
    assert not may_pack("gpt2", "bert", DEVICE, records=records), "a pair type is the same either way round"
    assert barred_pairs(records) == {f"bert+gpt2@{DEVICE}"}


def test_a_pair_type_measured_at_0_9_is_not_barred():
    records = pair(0.9, 0.9)
    speed = pair_speed("bert", "gpt2", DEVICE, records)
    assert speed.source == "measured" and speed.ratios == pytest.approx([0.9, 0.9]) and not speed.barred
    assert may_pack("bert", "gpt2", DEVICE, records=records) and barred_pairs(records) == set()


def test_the_bar_is_on_the_mean_of_both_runs():
    assert pair_speed("bert", "gpt2", DEVICE, pair(0.95, 0.7)).barred is False  # mean 0.825
    assert pair_speed("bert", "gpt2", DEVICE, pair(0.85, 0.7)).barred is True  # mean 0.775


def test_a_pair_none_measured_falls_to_the_published_prior():
    """Transformer beside LM on a P100 (Gavel): 3.945/3.978 and 9.951/10.082, both near 0.99: packable."""
    speed = pair_speed("Transformer", "LM", DEVICE, [])
    assert speed.source == "published" and speed.ratios == pytest.approx([3.945 / 3.978, 9.951 / 10.082])
    assert not speed.barred and may_pack("Transformer", "LM", DEVICE, records=[])
    resnets = pair_speed("ResNet-50", "resnet50", DEVICE, [])
    assert resnets.source == "published" and resnets.ratios == pytest.approx([1.774 / 3.466, 1.776 / 3.466])
    assert resnets.barred


def test_a_pair_neither_measured_nor_published_is_packed_until_measured_and_says_what_to_expect():
    """Rule 5 bars what was measured below 0.8; a pair nobody measured is packed (the run asked for packed) and the
    detail gives the median of the six published pairs' means (0.62) as what to expect meanwhile."""
    ratios, source, detail = published_prior("unet", "vit")
    assert source == "published-median" and ratios[0] == pytest.approx(0.618, abs=0.001) and ratios[0] < SLOWDOWN_BAR
    assert "never measured" in detail
    speed = pair_speed("unet", "vit", DEVICE, [])
    assert not speed.barred and "packed until this pool measures it" in speed.detail
    assert may_pack("unet", "vit", DEVICE, records=[])
    slow = [run("u-solo", "unet", 0.10), run("v-solo", "vit", 0.10),
            run("u", "unet", 0.10 / 0.6, sharing="shared", co=["v"]), run("v", "vit", 0.10 / 0.6, sharing="shared",
                                                                            co=["u"])]
    assert not may_pack("unet", "vit", DEVICE, records=slow), "once measured at 0.6, the pair stops being packed"


def test_a_measurement_here_overrides_the_prior():
    records = [run("solo", "resnet50", 0.10), run("x", "ResNet50", 0.10 / 0.9, sharing="shared", co=["y"]),
               run("y", "resnet-50", 0.10 / 0.9, sharing="shared", co=["x"])]
    assert measured_ratios(records) == {f"resnet50+resnet50@{DEVICE}": pytest.approx([0.9, 0.9])}
    assert may_pack("ResNet-50", "ResNet-50", DEVICE, records=records), "measured 0.9 here beats the published 0.51"


def test_what_does_not_count_as_a_measurement():
    base = [run("a-solo", "bert", 0.10), run("b-solo", "gpt2", 0.20)]
    failed = [*base, run("a", "bert", 0.5, sharing="shared", co=["b"], outcome="failed"), run("b", "gpt2", 0.2)]
    two_neighbours = [*base, run("a", "bert", 0.5, sharing="shared", co=["b", "c"]), run("b", "gpt2", 0.2),
                      run("c", "gpt2", 0.2)]
    unknown_neighbour = [*base, run("a", "bert", 0.5, sharing="shared", co=["gone"])]
    no_solo = [run("a", "bert", 0.5, sharing="shared", co=["b"]), run("b", "gpt2", 0.2, sharing="shared", co=["a"])]
    other_device = [run("a-solo", "bert", 0.10, device="A100-SXM4-80GB"), run("b", "gpt2", 0.2),
                    run("a", "bert", 0.5, sharing="shared", co=["b"])]
    for records in (failed, two_neighbours, unknown_neighbour, no_solo, other_device):
        assert measured_ratios(records) == {}, records


def test_a_shared_run_faster_than_alone_counts_as_no_slowdown_not_a_gain():
    records = pair(1.3, 1.0)
    assert measured_ratios(records)[f"bert+gpt2@{DEVICE}"] == pytest.approx([1.0, 1.0])


def test_the_published_pairs_are_the_six_gavel_p100_pairs():
    pairs = published_pairs()
    assert set(pairs) == {("resnet50", "resnet50"), ("resnet50", "transformer"), ("lm", "resnet50"),
                          ("transformer", "transformer"), ("lm", "transformer"), ("lm", "lm")}
    assert all(0 < r <= 1 for ratios in pairs.values() for r in ratios)
    assert model_key("ResNet-50") == "resnet50" and model_key(None) == "?"


def test_may_pack_reads_the_store(autodl_home):
    store = RecordStore()
    for r in pair(0.7, 0.7):
        store.write(r)
    assert not may_pack("bert", "gpt2", DEVICE)
    assert may_pack("Transformer", "LM", DEVICE), "other pairs keep their prior"
