"""Each policy on small hand-made pools with known right answers."""

from __future__ import annotations

import pytest
import yaml

from autodl.config import include_dir
from autodl.errors import AutoDLError
from autodl.policy import observe, place
from autodl.policy.rl_based import LinUCB, load_bandit
from autodl.spec import ResourcePolicySection
from autodl.types import Device, Inventory, MemoryBreakdown, ResourceProfile, RunRecord

GIB = 2**30


def prof(peak_gib: float = 2.0, *, num_gpus: int = 1, amp: str | None = None, flops: float = 1e11) -> ResourceProfile:
    return ResourceProfile(
        script="train.py", params=1_000_000, peak_memory_bytes=int(peak_gib * GIB),
        breakdown=MemoryBreakdown(weights_bytes=4_000_000, gradients_bytes=4_000_000, optimizer_state_bytes=8_000_000,
                                  activations_bytes=int(peak_gib * GIB) - 16_000_000),
        flops_per_step=flops, batch_size=64, num_gpus=num_gpus, amp=amp,
    )


def dev(catalog, index: int, model: str, *, host: str = "h0", used_gib: float = 0, util: float = 0,
        nvlink: str | None = None, healthy: bool = True) -> Device:
    g = catalog.get(model)
    return Device(device_id=f"{host}:{index}", host=host, index=index, model=g.name, vendor=g.vendor,
                  memory_total_bytes=g.memory_bytes, memory_used_bytes=int(used_gib * GIB), utilization_pct=util,
                  nvlink_group=nvlink, healthy=healthy, declared=True)


def inv(*devices: Device) -> Inventory:
    return Inventory(source="test", declared=True, devices=list(devices))


def demo_inventory(catalog) -> Inventory:
    raw = yaml.safe_load((include_dir() / "pools" / "demo.yaml").read_text())
    out = []
    for d in raw["devices"]:
        g = catalog.get(d["model"])
        out.append(Device(device_id=f"{raw['host']}:{d['index']}", host=raw["host"], index=d["index"], model=g.name,
                          vendor=d.get("vendor", g.vendor), memory_total_bytes=g.memory_bytes,
                          memory_used_bytes=d.get("memory_used_bytes", 0), utilization_pct=d.get("utilization_pct", 0),
                          nvlink_group=d.get("nvlink_group"), declared=True))
    return inv(*out)


def test_demo_pool_small_cnn_goes_to_the_a100(catalog):
    """The design card's expected placement: A100 at index 0, never the Ascend 910 for a CUDA script."""
    pol = ResourcePolicySection(preferred_devices=["A100-SXM4-40GB", "V100-PCIE-32GB"])
    d = place(prof(1.5, flops=5e10), demo_inventory(catalog), catalog=catalog, policy=pol)
    assert d.fits and d.available
    assert d.chosen.model == "A100-SXM4-40GB" and d.chosen.devices == ["demo-node-1:0"]
    assert set(d.chosen.terms) >= {"speed", "cost", "balance", "best_fit", "preferred"}
    ascend = [c for c in d.candidates if c.model == "Ascend-910"]
    assert ascend and not ascend[0].kept and "allowed_vendors" in ascend[0].reasons[0]
    kept = [c.kept for c in d.candidates]
    assert kept == sorted(kept, reverse=True)          # kept first
    scores = [c.score for c in d.candidates if c.kept]
    assert scores == sorted(scores, reverse=True)      # best first


def test_tie_goes_to_pool_order(catalog):
    i = inv(dev(catalog, 0, "T4", host="a"), dev(catalog, 0, "T4", host="b"))
    d = place(prof(), i, catalog=catalog, policy=ResourcePolicySection())
    assert d.chosen.devices == ["a:0"]
    assert d.candidates[0].score == d.candidates[1].score


def test_rule_based_plans_within_the_memory_threshold(catalog):
    """36 GiB > 0.85 x 40 GiB: rule_based skips the A100-40GB for the 80GB and says why."""
    i = inv(dev(catalog, 0, "A100-SXM4-40GB"), dev(catalog, 1, "A100-SXM4-80GB"))
    d = place(prof(36), i, catalog=catalog, policy=ResourcePolicySection())
    assert d.chosen.model == "A100-SXM4-80GB"
    dropped = next(c for c in d.candidates if not c.kept)
    assert dropped.model == "A100-SXM4-40GB" and "never fits" in dropped.reasons[0]


def test_gang_prefers_nvlink_and_is_never_partial(catalog):
    i = inv(
        dev(catalog, 0, "A100-SXM4-40GB", host="a"), dev(catalog, 1, "A100-SXM4-40GB", host="a"),
        dev(catalog, 2, "A100-SXM4-40GB", host="a"),
        dev(catalog, 0, "A100-SXM4-40GB", host="b", nvlink="x"), dev(catalog, 1, "A100-SXM4-40GB", host="b", nvlink="y"),
        dev(catalog, 2, "A100-SXM4-40GB", host="b", nvlink="y"), dev(catalog, 3, "A100-SXM4-40GB", host="b", nvlink="x"),
    )
    d = place(prof(num_gpus=2), i, catalog=catalog, policy=ResourcePolicySection())
    assert d.chosen.host == "b" and sorted(d.chosen.devices) == ["b:0", "b:3"]
    assert d.chosen.terms["nvlink"] > 0
    # a gang of 4 on host a (3 devices) never; on host b only while nothing is leased
    d = place(prof(num_gpus=4), i, catalog=catalog, policy=ResourcePolicySection(), leased=frozenset({"b:1"}))
    assert d.fits and not d.available and d.chosen is None
    assert any("only 3 device(s) free now on b" in r for c in d.candidates for r in c.reasons)


def test_domestic_first_on_and_off(catalog):
    i = inv(dev(catalog, 0, "A100-SXM4-40GB"), dev(catalog, 1, "Ascend-910B"))
    off = ResourcePolicySection(allowed_vendors=["nvidia", "ascend"], preferred_devices=["A100-SXM4-40GB"])
    on = off.model_copy(update={"tag_priorities": {"domestic": 2.0}})
    assert place(prof(amp="O1", flops=1e13), i, catalog=catalog, policy=off).chosen.model == "A100-SXM4-40GB"
    d = place(prof(amp="O1", flops=1e13), i, catalog=catalog, policy=on)
    assert d.chosen.model == "Ascend-910B" and d.chosen.terms["tag:domestic"] == 2.0


def test_ascend_needs_its_vendor_allowed(catalog):
    i = inv(dev(catalog, 0, "Ascend-910B"))
    d = place(prof(), i, catalog=catalog, policy=ResourcePolicySection(tag_priorities={"domestic": 5.0}))
    assert not d.fits and d.chosen is None


@pytest.mark.parametrize("order", [["V100-PCIE-32GB", "A100-SXM4-40GB"], ["A100-SXM4-40GB", "V100-PCIE-32GB"]])
def test_preferred_order_wins(catalog, order):
    i = inv(dev(catalog, 0, "A100-SXM4-40GB"), dev(catalog, 1, "V100-PCIE-32GB"))
    d = place(prof(), i, catalog=catalog, policy=ResourcePolicySection(preferred_devices=order))
    assert d.chosen.model == order[0]


def test_leased_devices_skipped(catalog):
    i = inv(dev(catalog, 0, "A100-SXM4-40GB"), dev(catalog, 1, "A100-SXM4-40GB"))
    d = place(prof(), i, catalog=catalog, policy=ResourcePolicySection(), leased=frozenset({"h0:0"}))
    assert d.chosen.devices == ["h0:1"]
    assert any(c.devices == ["h0:0"] and "leased" in c.reasons[0] for c in d.candidates if not c.kept)
    d = place(prof(), i, catalog=catalog, policy=ResourcePolicySection(), leased=frozenset({"h0:0", "h0:1"}))
    assert d.fits and not d.available and d.chosen is None


def test_busy_and_unhealthy_devices_not_available(catalog):
    i = inv(dev(catalog, 0, "T4", used_gib=15), dev(catalog, 1, "T4", util=99), dev(catalog, 2, "T4", healthy=False))
    d = place(prof(2), i, catalog=catalog, policy=ResourcePolicySection())
    assert d.fits and not d.available
    reasons = {c.reasons[0].split(":")[0] for c in d.candidates}
    assert reasons == {"not enough free memory now", "busy", "unhealthy"}


def test_not_fits_gives_suggestions(catalog):
    d = place(prof(100), demo_inventory(catalog), catalog=catalog, policy=ResourcePolicySection())
    assert not d.fits and not d.available and d.chosen is None
    assert d.suggestions


def test_unknown_algorithm_names_known(catalog):
    with pytest.raises(AutoDLError, match="rule_based"):
        place(prof(), inv(dev(catalog, 0, "T4")), catalog=catalog, policy=ResourcePolicySection(), algorithm="magic")


def test_rl_cold_start_is_rule_based_and_observe_stores(catalog):
    i = demo_inventory(catalog)
    pol = ResourcePolicySection(preferred_devices=["A100-SXM4-40GB"])
    rule = place(prof(), i, catalog=catalog, policy=pol)
    rl = place(prof(), i, catalog=catalog, policy=pol, algorithm="rl_based")
    assert rl.chosen.devices == rule.chosen.devices
    assert "cold start" in " ".join(rl.chosen.reasons)
    rec = RunRecord(run_key="r1", script="train.py", outcome="succeeded", declared_pool=False,
                    profile=prof().to_json(), placement=rl.to_json(), device_model="A100-SXM4-40GB",
                    metrics={"step_time_s": 0.05})
    assert observe(rec, catalog=catalog)
    assert observe(rec.model_copy(update={"outcome": "failed", "run_key": "r2"}), catalog=catalog)
    # nothing measured on the device (a declared pool trains on CPU; no metrics): nothing learned
    assert not observe(rec.model_copy(update={"run_key": "r3", "declared_pool": True}), catalog=catalog)
    assert not observe(rec.model_copy(update={"run_key": "r4", "metrics": {}}), catalog=catalog)
    b = load_bandit()
    assert b.arms["A100-SXM4-40GB"].count == 2


def test_bandit_reward_is_the_measured_speed_without_a_price_term(catalog):
    """Reward = ln(catalog step time on the reference V100 / measured step time): a run measured twice as
    fast as another on the same arm gets ln 2 more; the device's price does not enter (issue 11: a price
    term made the bandit prefer a T4 over a faster P100)."""
    import math

    b = LinUCB()
    assert b.cost_weight == 0.0
    assert b.reward(2.0, 0.35, 2.48, failed=False) - b.reward(1.0, 1.46, 2.48, failed=False) == pytest.approx(math.log(2))
    assert b.reward(None, None, None, failed=True) < b.reward(0.1, None, None, failed=False)
    with pytest.raises(ValueError):
        b.reward(None, None, None, failed=False)


def test_linucb_prefers_the_rewarding_arm():
    b = LinUCB(warmup=0, alpha=0.1)
    x = [1.0, 1.0, 0.5, 0.0, 0.5]
    for _ in range(10):
        b.update("good", x, 0.7)
        b.update("bad", x, -3.0)
    assert b.ucb("good", x)[0] > 0.5 > b.ucb("bad", x)[0]
    assert b.ucb("fresh", x)[1] > b.ucb("good", x)[1]     # unseen arms carry a larger bonus


def test_unknown_flops_leave_the_step_time_unknown_not_zero(catalog):
    """A cold-start profile whose model was not found has ``flops_per_step`` null: the step time on every
    device is unknown (None, not a bandwidth-only guess from 0 FLOPs), so no candidate gets a speed
    advantage from it, and the placement still goes on on memory fit."""
    from autodl.profile.runtime import estimate_step_time_s

    p = prof(2.0).model_copy(update={"flops_per_step": None, "params": None, "method": "cold_start"})
    assert estimate_step_time_s(p, catalog.get("A100-SXM4-40GB")) is None
    assert estimate_step_time_s(prof(2.0), catalog.get("A100-SXM4-40GB")) > 0
    d = place(p, inv(dev(catalog, 0, "T4"), dev(catalog, 1, "A100-SXM4-40GB")), catalog=catalog,
              policy=ResourcePolicySection())
    assert d.fits and d.chosen is not None
    assert all(c.est_step_time_s is None for c in d.candidates if c.kept)
    assert all(c.terms.get("speed", 0.0) == 0.0 for c in d.candidates if c.kept)
    # the reason names the run's unknown FLOPs, not the catalog (fresh-user report: it blamed the catalog)
    assert all(any("FLOPs are unknown" in r for r in c.reasons) and not any("catalog lacks" in r for r in c.reasons)
               for c in d.candidates if c.kept)


def test_a_model_of_unknown_size_is_placed_only_on_the_largest_device(catalog):
    """A cold start that did not find the model has a figure of activations and workspace only (the 81M GPT of
    ``benchmarks/user_scripts/gpt_lm_cfgclass.py`` got 0.6 GiB statically for a 1.5 GiB need): its weights,
    gradients and optimizer state are unknown, so the run is sized as the largest allowed device, and the T4 that
    the 0.6 GiB figure would have taken is never chosen."""
    from autodl.policy.need import needed_bytes

    p = prof(0.6).model_copy(update={"flops_per_step": None, "params": None, "method": "cold_start"})
    pool = inv(dev(catalog, 0, "T4"), dev(catalog, 1, "A100-SXM4-80GB"), dev(catalog, 2, "V100-PCIE-32GB"))
    d = place(p, pool, catalog=catalog, policy=ResourcePolicySection())
    a100 = catalog.get("A100-SXM4-80GB").memory_bytes
    assert d.needed_bytes == needed_bytes(p, pool.devices, {"nvidia"}, 0.85) == int(0.85 * a100)
    assert d.chosen is not None and d.chosen.model == "A100-SXM4-80GB"
    assert any("size is unknown" in r and "conservative" in r for r in d.chosen.reasons)
    assert {c.model for c in d.candidates if not c.kept} == {"T4", "V100-PCIE-32GB"}
    known = place(prof(0.6), pool, catalog=catalog, policy=ResourcePolicySection())
    assert known.needed_bytes == int(0.6 * GIB) and len([c for c in known.candidates if c.kept]) == 3


def test_a_model_of_unknown_size_whose_formula_exceeds_every_device_is_placed_not_refused(catalog):
    """A fresh user's 2.3M-parameter MobileNet at 128 x 128 whose dry run could not run: the cold-start formula
    (batch 96 x 3 x 224 x 224 x an assumed hidden width of 768) said 63.3 GiB, and plan refused it on every card
    ("never fits") while the cold-start warning said the run is sized as the largest allowed device. The formula is
    no bound: the run is sized as the largest allowed device, as the warning says, and placed there."""
    p = prof(63.3).model_copy(update={"flops_per_step": None, "params": None, "method": "cold_start"})
    pool = inv(dev(catalog, 0, "A100-SXM4-40GB"), dev(catalog, 1, "V100-PCIE-32GB"))
    d = place(p, pool, catalog=catalog, policy=ResourcePolicySection())
    assert d.fits and d.needed_bytes == int(0.85 * catalog.get("A100-SXM4-40GB").memory_bytes)
    assert d.chosen is not None and d.chosen.model == "A100-SXM4-40GB"
    known = place(prof(63.3), pool, catalog=catalog, policy=ResourcePolicySection())  # a measured figure still refuses
    assert not known.fits and known.chosen is None


@pytest.mark.parametrize("update", [
    {"floor_bytes": 100 * GIB},  # an allocation the dry run saw fail, or an earlier run's out-of-memory floor
    {"batch_size": 5_000_000, "input_shape": [3, 32, 32]},  # the input batch alone: 57 GiB of float32
], ids=["measured-floor", "input-batch"])
def test_a_model_of_unknown_size_is_refused_by_what_was_measured(catalog, update):
    """The size unknown, a floor that was measured still refuses the run where it exceeds every allowed device
    (``tests/cases/bad-input/s_huge_linear.py``: the 3.6 TiB weight the dry run saw requested)."""
    p = prof(0.6).model_copy(update={"flops_per_step": None, "params": None, "method": "cold_start", **update})
    pool = inv(dev(catalog, 0, "A100-SXM4-40GB"), dev(catalog, 1, "V100-PCIE-32GB"))
    d = place(p, pool, catalog=catalog, policy=ResourcePolicySection())
    assert not d.fits and d.chosen is None and d.needed_bytes > 0.85 * 40 * GIB


def test_gang_drops_are_grouped_by_reason_not_listed_per_host(catalog):
    """A gang of 8 on 200 hosts that each have 1-7 free devices, and on 50 hosts of 4 devices: two dropped
    entries (one per reason), not 250; every device is still listed."""
    devices = []
    for h in range(200):
        for i in range(8):
            devices.append(Device(device_id=f"a{h}:{i}", host=f"a{h}", index=i, model="A100-SXM4-40GB", declared=True,
                                  memory_total_bytes=catalog.get("A100-SXM4-40GB").memory_bytes,
                                  utilization_pct=100.0 if i <= h % 7 else 0.0))
    for h in range(50):
        for i in range(4):
            devices.append(Device(device_id=f"t{h}:{i}", host=f"t{h}", index=i, model="T4", declared=True,
                                  memory_total_bytes=catalog.get("T4").memory_bytes))
    d = place(prof(4, num_gpus=8), Inventory(source="t", declared=True, devices=devices), catalog=catalog,
              policy=ResourcePolicySection())
    gang = [c for c in d.candidates if not c.kept and c.reasons[0].startswith("gang")]
    assert [c.reasons[0] for c in gang] == [
        "gang of 8: only 1-7 device(s) free now on each of 200 hosts",
        "gang of 8 needs 8 fitting devices of this model on one host; 50 hosts have 4",
    ]
    assert all(c.host == "*" for c in gang) and len(gang[1].devices) == 200


def test_a_gang_that_fits_no_host_is_advised_even_when_its_memory_fits(catalog):
    """A fresh user's fleet script (2 devices assumed) on one host with an RTX-3090, a T4 and an A100: every device
    was dropped for the gang and no suggestion was printed, since the profiler's advice speaks of memory only."""
    pool = inv(dev(catalog, 0, "RTX-3090"), dev(catalog, 1, "T4"), dev(catalog, 2, "A100-SXM4-80GB"))
    d = place(prof(0.5, num_gpus=2), pool, catalog=catalog, policy=ResourcePolicySection())
    assert d.chosen is None
    assert {c.reasons[0] for c in d.candidates if not c.kept} == {
        "gang of 2 needs 2 fitting devices of this model on one host; h0 has 1"}
    assert any("gang of 2 must fit on one host" in s and "num_gpus_estimate" in s for s in d.suggestions), d.suggestions
