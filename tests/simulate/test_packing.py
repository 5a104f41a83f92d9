"""Packing in the simulator (``SimOptions.sharing="packed"``): the product's rule decides who shares, the
published pair ratios slow both tenants, the true peaks decide an OOM, and a pair type measured below the
bar stops being packed."""

from __future__ import annotations

import pytest

from autodl.policy import packing
from autodl_sim.colocation import load_pair_ratios, pair_ratio
from autodl_sim.engine import SimOptions, simulate
from autodl_sim.pool import HostGroup, SimPool
from autodl_sim.workload import SimJob

pytestmark = pytest.mark.simulator

GIB = 2**30
BIG = "A100-SXM4-80GB"
SMALL = "V100-PCIE-16GB"
CLS = "cifar10_resnet18"          # -> ResNet-50 in the pair table
SPEEDS = {CLS: {BIG: 1.0, SMALL: 1.0}, "bert_finetune": {BIG: 1.0, SMALL: 1.0}}
R = load_pair_ratios()[("ResNet-50", "ResNet-50")]   # 1.774 / 3.466 steps/s, Gavel's P100 pair


def _pool(model: str = BIG, memory: int = 80 * 10**9) -> SimPool:
    return SimPool("test", (HostGroup(model, "nvidia", 1, 1, memory, 1.0, ("datacenter",)),))


def _job(i: int, submit: float, dur: float, peak: int = 8 * GIB, est: int | None = None) -> SimJob:
    return SimJob(i, submit, dur, 1, CLS, peak, peak if est is None else est)


def _run(jobs, pool=None, **opt):
    return simulate(jobs, pool or _pool(), "rule_based", speeds=SPEEDS, catalog=None or _cat(),
                    options=SimOptions(tick_s=0.0, **opt))


def _cat():
    from autodl.catalog import load_catalog
    return load_catalog()


def test_two_small_runs_share_a_big_device_and_both_slow_by_the_pair_ratio():
    """j0 (100 s) and j1 (50 s) share from 0: both at R; j1 ends at 50/R, then j0 runs its last 50 s solo."""
    jobs = [_job(0, 0.0, 100.0), _job(1, 0.0, 50.0)]
    solo = _run(jobs)
    assert solo.joins == 0 and solo.avg_jct_s == pytest.approx((100 + 150) / 2)
    r = _run(jobs, sharing="packed")
    assert r.joins == 1 and r.oom_failures == 0 and r.completed == 2
    t1 = 50.0 / R
    assert sorted(r.jcts) == pytest.approx(sorted([t1, t1 + 50.0]))
    # one device, busy from 0 to the end: a shared device counts once
    assert r.gpu_utilization == pytest.approx(1.0)


def test_equal_runs_both_finish_later_than_solo_by_the_ratio():
    r = _run([_job(0, 0.0, 100.0), _job(1, 0.0, 100.0)], sharing="packed")
    assert r.jcts == pytest.approx([100.0 / R, 100.0 / R])


def test_a_16_gb_device_never_shares():
    r = _run([_job(0, 0.0, 100.0), _job(1, 0.0, 50.0)], pool=_pool(SMALL, 16 * GIB), sharing="packed")
    assert not packing.shareable(packing.Device(device_id="x", index=0, model=SMALL, memory_total_bytes=16 * GIB))
    assert r.joins == 0 and sorted(r.jcts) == pytest.approx([100.0, 150.0])


def test_estimates_that_do_not_fit_beside_each_other_do_not_share():
    """Two 40 GiB estimates: each fits under 0.85 x 80 GB alone, not both plus a CUDA context."""
    r = _run([_job(0, 0.0, 100.0, 40 * GIB), _job(1, 0.0, 50.0, 40 * GIB)], sharing="packed")
    assert r.joins == 0 and sorted(r.jcts) == pytest.approx([100.0, 150.0])


def test_blind_packing_ooms_where_packing_with_the_estimate_does_not():
    """True peaks 45 GiB each (90 GiB > 80 GB together); the estimates say so, blind packing does not look."""
    jobs = [_job(0, 0.0, 1000.0, 45 * GIB), _job(1, 0.0, 500.0, 45 * GIB)]
    with_est = _run(jobs, sharing="packed")
    assert with_est.oom_failures == 0 and with_est.joins == 0 and with_est.completed == 2
    blind = _run(jobs, sharing="packed", pack_blind=True)
    assert blind.joins >= 1 and blind.oom_failures >= 1 and blind.pair_ooms == blind.oom_failures
    assert blind.completed == 2      # the later arrival is re-queued and runs alone
    assert with_est.pair_ooms == 0


def test_a_pair_type_measured_below_the_bar_stops_being_packed():
    """j0+j1 share and end (ratio R < 0.8): the pair type is barred, so j2 and j3 run one after the other."""
    jobs = [_job(0, 0.0, 100.0), _job(1, 0.0, 100.0), _job(2, 1000.0, 100.0), _job(3, 1000.0, 100.0)]
    r = _run(jobs, sharing="packed")
    assert R < packing.SLOWDOWN_BAR
    assert r.joins == 1 and r.barred_pairs == [packing.pair_type(CLS, CLS, BIG)]
    assert r.jcts == pytest.approx(sorted([100.0 / R, 100.0 / R, 100.0, 200.0]))


def test_a_pair_type_above_the_bar_keeps_being_packed():
    """slowdown_scale 0.1: ratio 1 - 0.1 (1 - R) > 0.8, so the second pair shares too."""
    jobs = [_job(0, 0.0, 100.0), _job(1, 0.0, 100.0), _job(2, 1000.0, 100.0), _job(3, 1000.0, 100.0)]
    r = _run(jobs, sharing="packed", slowdown_scale=0.1)
    ratio = pair_ratio(load_pair_ratios(), CLS, CLS, 0.1)
    assert ratio > packing.SLOWDOWN_BAR
    assert r.joins == 2 and r.barred_pairs == [] and r.jcts == pytest.approx([100.0 / ratio] * 4)


def test_an_unknown_sharing_mode_is_refused():
    with pytest.raises(ValueError, match="sharing"):
        _run([_job(0, 0.0, 10.0)], sharing="shared")
