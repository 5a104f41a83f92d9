"""The simulator's accounting on a five-job trace computed by hand, trace loading, determinism and the CLI."""

from __future__ import annotations

import argparse
import json

import pytest

from autodl.simulate import run_all
from autodl.simulate.cli import register, run
from autodl.simulate.engine import SimOptions, simulate
from autodl.simulate.pool import HostGroup, SimPool, load_sim_pool
from autodl.simulate.workload import SimJob, load_trace

GIB = 2**30
V100 = "V100-PCIE-16GB"   # 16 GiB = 17,179,869,184 bytes in the catalog


def _pool() -> SimPool:
    return SimPool("test", (HostGroup(V100, "nvidia", 1, 2, 16 * GIB, 2.48, ("datacenter",)),))


def _jobs() -> list[SimJob]:
    """j0..j3 fit (8 GiB); j4's estimate (15 GiB) fits without headroom but its true peak (17 GiB) does not."""
    return [
        SimJob(0, 0.0, 100.0, 1, "c", 8 * GIB, 8 * GIB),
        SimJob(1, 0.0, 50.0, 1, "c", 8 * GIB, 8 * GIB),
        SimJob(2, 10.0, 30.0, 2, "c", 8 * GIB, 8 * GIB),
        SimJob(3, 20.0, 10.0, 1, "c", 8 * GIB, 8 * GIB),
        SimJob(4, 200.0, 40.0, 1, "c", 17 * GIB, 15 * GIB),
    ]


SPEEDS = {"c": {V100: 1.0}}


def test_five_jobs_strict_fifo_by_hand(catalog):
    """FIFO: j0 0-100, j1 0-50, j2 (gang of 2) waits for both: 100-130, j3 blocked behind it: 130-140;
    j4 OOMs at 200+min(60, 40)=240, learns 17 GiB > 16 GiB and is rejected."""
    r = simulate(_jobs(), _pool(), "fifo_first_fit", speeds=SPEEDS, catalog=catalog)
    assert r.completed == 4 and r.oom_failures == 1 and r.rejected == 1
    assert r.avg_jct_s == pytest.approx((100 + 50 + 120 + 120) / 4)
    assert r.p99_jct_s == pytest.approx(120)
    assert r.avg_queue_s == pytest.approx((0 + 0 + 90 + 110) / 4)
    assert r.makespan_s == pytest.approx(240)
    # busy GPU-s: 100 + 50 + 2*30 + 10 + 40 (the OOM attempt) = 260 over 2 GPUs x 240 s
    assert r.gpu_utilization == pytest.approx(260 / 480)
    # first to last submit (0-200): 220 busy GPU-s over 2 x 200
    assert r.gpu_utilization_submit_window == pytest.approx(220 / 400)
    # used: 8 GiB x 220 GPU-s + 16 GiB (capped at the device) x 40; allocated: 16 GiB x 260
    assert r.memory_utilization == pytest.approx((8 * 220 + 16 * 40) / (16 * 260))


def test_five_jobs_backfill_by_hand(catalog):
    """Backfill: j3 takes the GPU j1 frees at 50 (50-60) instead of waiting behind j2's gang."""
    r = simulate(_jobs(), _pool(), "best_fit_memory", speeds=SPEEDS, catalog=catalog)
    assert r.queue == "backfill"
    assert r.avg_jct_s == pytest.approx((100 + 50 + 120 + 40) / 4)
    assert r.avg_queue_s == pytest.approx((0 + 0 + 90 + 30) / 4)
    assert r.oom_failures == 1


def test_headroom_avoids_the_oom(catalog):
    """rule_based plans within 0.85 x 16 GiB = 13.6 GiB: j4's 15 GiB estimate is refused up front."""
    r = simulate(_jobs(), _pool(), "rule_based", speeds=SPEEDS, catalog=catalog, options=SimOptions(memory_threshold=0.85))
    assert r.oom_failures == 0 and r.rejected == 1 and r.completed == 4


def test_faster_device_shortens_the_run(catalog):
    """A job on a device twice as fast runs half its V100 duration."""
    pool = SimPool("t", (HostGroup("A100-SXM4-40GB", "nvidia", 1, 1, 40 * GIB, 2.93, ()),))
    r = simulate([SimJob(0, 0.0, 100.0, 1, "c", GIB, GIB)], pool, "rule_based",
                 speeds={"c": {"A100-SXM4-40GB": 2.0}}, catalog=catalog)
    assert r.avg_jct_s == pytest.approx(50.0)


def test_trace_slice_sorted_and_classed():
    jobs = load_trace(start=100, jobs=50, seed=1)
    assert len(jobs) == 50
    assert jobs[0].submit_s == 0.0
    assert all(a.submit_s <= b.submit_s for a, b in zip(jobs, jobs[1:]))
    assert {j.model_class for j in jobs} <= {"cifar10_resnet18", "bert_finetune", "imagenet_resnet50"}
    assert all(abs(j.est_bytes / j.peak_bytes - 1) <= 0.15 + 1e-9 for j in jobs)


def test_same_seed_same_results(catalog):
    a = run_all(start=0, jobs=300, seed=3, policies=["random", "rl_based"], catalog=catalog)
    b = run_all(start=0, jobs=300, seed=3, policies=["random", "rl_based"], catalog=catalog)
    strip = lambda r: {k: v for k, v in r.summary().items() if k not in ("wall_s", "decision_us_median")}  # noqa: E731
    assert [strip(r) for r in a] == [strip(r) for r in b]
    c = run_all(start=0, jobs=300, seed=4, policies=["random"], catalog=catalog)
    assert strip(c[0]) != strip(a[0])


def test_pool_file_reads(catalog):
    pool = load_sim_pool(None, catalog)
    assert pool.gpus == 560
    assert {g.model for g in pool.groups} >= {"A100-SXM4-40GB", "RTX-3090", "Ascend-910", "T4"}


def test_cli_json_and_plot(tmp_path, capsys):
    parser = argparse.ArgumentParser()
    register(parser.add_subparsers(dest="command"))
    png = tmp_path / "sim.png"
    args = parser.parse_args(
        ["simulate", "--jobs", "200", "--policies", "fifo_first_fit,rule_based", "--json", "--plot", str(png)]
    )
    assert run(args) == 0
    doc = json.loads(capsys.readouterr().out)
    assert [r["policy"] for r in doc["results"]] == ["fifo_first_fit", "rule_based"]
    assert png.stat().st_size > 1000


def test_cli_names_bad_input(capsys):
    parser = argparse.ArgumentParser()
    register(parser.add_subparsers(dest="command"))
    assert run(parser.parse_args(["simulate", "--jobs", "10", "--policies", "nope"])) != 0
    assert "nope" in capsys.readouterr().err
