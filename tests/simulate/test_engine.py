"""The simulator: accounting on a five-job trace computed by hand, truth vs what the policy sees, OOM cost,
reservations against gang starvation, the preemptive baseline, learning, trace loading, determinism and the CLI."""

from __future__ import annotations

import argparse
import json
import math

import pytest

from autodl.policy.scoring import DEFAULT_WEIGHTS
from autodl_sim import run_all
from autodl_sim.cli import register, run
from autodl_sim.engine import EVAL_PEAK_FRACTION, PEAK_STEP_S, SimOptions, simulate
from autodl_sim.pool import HostGroup, SimPool, load_sim_pool, scale_pool
from autodl_sim.workload import SimJob, load_errors, load_trace

pytestmark = pytest.mark.simulator

GIB = 2**30
V100 = "V100-PCIE-16GB"   # 16 GiB = 17,179,869,184 bytes in the catalog
EXACT = dict(tick_s=0.0)  # decide at every event (the hand-computed traces)


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
    """FIFO (no backfill, no headroom): j0 0-100, j1 0-50, j2 (gang of 2) waits for both: 100-130, j3
    blocked behind it: 130-140; j4 OOMs at 200+min(60, 40)=240, learns it needs more than 16 GiB: fits nowhere."""
    opt = SimOptions(own_queue=True, own_headroom=True, **EXACT)
    r = simulate(_jobs(), _pool(), "fifo_first_fit", speeds=SPEEDS, catalog=catalog, options=opt)
    assert r.queue == "fcfs+none" and r.headroom == 1.0
    assert r.completed == 4 and r.oom_failures == 1 and r.failed == 1 and r.rejected == 0
    assert r.avg_jct_s == pytest.approx((100 + 50 + 120 + 120) / 4)
    assert r.p99_jct_s == pytest.approx(120)
    assert r.avg_queue_s == pytest.approx((0 + 0 + 90 + 110) / 4)
    assert r.makespan_s == pytest.approx(240)
    # busy GPU-s: 100 + 50 + 2*30 + 10 + 40 (the OOM attempt) = 260 over 2 GPUs x 240 s
    assert r.gpu_utilization == pytest.approx(260 / 480)
    # used: 8 GiB x 220 GPU-s + 16 GiB (capped at the device) x 40; allocated: 16 GiB x 260
    assert r.memory_utilization == pytest.approx((8 * 220 + 16 * 40) / (16 * 260))
    assert r.by_gang[2]["avg_jct_s"] == pytest.approx(120) and r.by_gang[1]["p99_queue_s"] == pytest.approx(110)


def test_five_jobs_greedy_backfill_by_hand(catalog):
    """Greedy backfill: j3 takes the GPU j1 frees at 50 (50-60) instead of waiting behind j2's gang."""
    opt = SimOptions(own_queue=True, own_headroom=True, **EXACT)
    r = simulate(_jobs(), _pool(), "best_fit_memory", speeds=SPEEDS, catalog=catalog, options=opt)
    assert r.queue == "fcfs+greedy"
    assert r.avg_jct_s == pytest.approx((100 + 50 + 120 + 40) / 4)
    assert r.avg_queue_s == pytest.approx((0 + 0 + 90 + 30) / 4)
    assert r.oom_failures == 1


def test_five_jobs_easy_by_hand(catalog):
    """Shortest expected GPU-time first with EASY, runtimes known exactly: j1 (50) and j0 (100) start at 0;
    at 10 the gang j2 (60 GPU-s) waits with both devices reserved from t=100; at 50 j3 (10 GPU-s, ahead of
    j2 in the order) takes the freed device until 60; j2 runs 100-130."""
    jobs = [SimJob(j.job_id, j.submit_s, j.duration_s, j.num_gpus, "c", j.peak_bytes, j.est_bytes, j.duration_s)
            for j in _jobs()[:4]]
    r = simulate(jobs, _pool(), "rule_based", speeds=SPEEDS, catalog=catalog, options=SimOptions(**EXACT))
    assert r.queue.startswith("sjf+easy")
    assert r.avg_jct_s == pytest.approx((100 + 50 + 120 + 40) / 4)


def test_headroom_is_the_same_for_every_policy(catalog):
    """Every policy plans within 0.85 x 16 GiB = 13.6 GiB: j4's 15 GiB estimate is refused up front, for
    the baselines as for rule_based (before, only autodl's policies kept headroom)."""
    for policy in ("rule_based", "fifo_first_fit", "gavel_max_throughput"):
        r = simulate(_jobs(), _pool(), policy, speeds=SPEEDS, catalog=catalog, options=SimOptions(**EXACT))
        assert r.headroom == 0.85 and r.oom_failures == 0 and r.rejected == 1 and r.completed == 4


def test_the_policy_sees_assumed_speeds_the_run_takes_the_true_ones(catalog):
    """The catalog says the T4 is faster; the policy picks it; the run takes the T4's true (slower) time."""
    pool = SimPool("t", (HostGroup("T4", "nvidia", 1, 1, 16 * GIB, 0.35, ()),
                         HostGroup("A100-SXM4-40GB", "nvidia", 1, 1, 40 * GIB, 2.93, ())))
    truth = {"c": {"T4": 0.5, "A100-SXM4-40GB": 2.0}}
    seen = {"T4": 4.0, "A100-SXM4-40GB": 1.0}
    r = simulate([SimJob(0, 0.0, 100.0, 1, "c", GIB, GIB, 100.0)], pool, "gavel_max_throughput", speeds=truth,
                 catalog=catalog, options=SimOptions(seen_speeds=seen, **EXACT))
    assert r.placed_on == {"T4": 1} and r.avg_jct_s == pytest.approx(200.0)


@pytest.mark.parametrize("phase,expected", [("step", PEAK_STEP_S), ("eval", EVAL_PEAK_FRACTION * 2000.0)])
def test_an_oom_costs_the_time_until_the_peak(catalog, phase, expected):
    """An under-estimated run OOMs when its peak is reached: after the first steps, or at its first
    evaluation; then it needs more than that device's memory and runs on the bigger one."""
    pool = SimPool("t", (HostGroup(V100, "nvidia", 1, 1, 16 * GIB, 2.48, ()),
                         HostGroup("A100-SXM4-40GB", "nvidia", 1, 1, 40 * GIB, 2.93, ())))
    job = SimJob(0, 0.0, 2000.0, 1, "c", 20 * GIB, 8 * GIB, 2000.0, phase)
    r = simulate([job], pool, "fifo_first_fit", speeds={"c": {V100: 1.0, "A100-SXM4-40GB": 1.0}}, catalog=catalog,
                 options=SimOptions(**EXACT))
    assert r.oom_failures == 1 and r.completed == 1
    assert r.avg_jct_s == pytest.approx(expected + 2000.0)
    assert r.placed_on == {V100: 1, "A100-SXM4-40GB": 1}


def _gang_vs_stream() -> list[SimJob]:
    """Four 1-GPU runs hold a 4-GPU host from t=0 (ending 1000, 1100, 1200, 1300); a gang of 4 (300 s)
    arrives at t=50; then a 1-GPU run of 500 s every 100 s until t=20,000, more than the host can serve
    (every job's runtime known)."""
    jobs = [SimJob(i, 0.0 if i == 0 else 100.0 * i, 1000.0, 1, "c", GIB, GIB, 1000.0) for i in range(4)]
    jobs[1:4] = [SimJob(i, 0.0, 1000.0 + 100 * i, 1, "c", GIB, GIB, 1000.0 + 100 * i) for i in range(1, 4)]
    jobs.append(SimJob(4, 50.0, 300.0, 4, "c", GIB, GIB, 300.0))
    jobs += [SimJob(5 + k, 100.0 + 100 * k, 500.0, 1, "c", GIB, GIB, 500.0) for k in range(200)]
    return sorted(jobs, key=lambda j: j.submit_s)


def test_reservation_prevents_gang_starvation(catalog):
    """Greedy backfill hands every freed device to the next 1-GPU run: the gang waits until the stream
    stops and its backlog drains. First come, first served with EASY reserves the host for it at t=1300:
    it starts then. Shortest-first ranks the gang (1,200 GPU-s) behind the 500-s runs until aging lifts it
    above the newcomers (here with 3 h of aging: ln(1200/500) x 3 h = 2.6 h); then it is the head, gets
    the reservation and starts, long before the stream ends."""
    pool = SimPool("t", (HostGroup(V100, "nvidia", 1, 4, 16 * GIB, 2.48, ()),))
    greedy = simulate(_gang_vs_stream(), pool, "rule_based", speeds=SPEEDS, catalog=catalog,
                      options=SimOptions(order="fcfs", backfill="greedy", **EXACT))
    easy = simulate(_gang_vs_stream(), pool, "rule_based", speeds=SPEEDS, catalog=catalog,
                    options=SimOptions(order="fcfs", backfill="easy", **EXACT))
    sjf = simulate(_gang_vs_stream(), pool, "rule_based", speeds=SPEEDS, catalog=catalog,
                   options=SimOptions(aging_s=3 * 3600.0, **EXACT))
    assert greedy.by_gang[4]["avg_queue_s"] > 20_000
    assert easy.by_gang[4]["avg_queue_s"] == pytest.approx(1300 - 50)
    assert sjf.by_gang[4]["avg_queue_s"] < 0.7 * greedy.by_gang[4]["avg_queue_s"]
    assert sjf.by_gang[4]["avg_queue_s"] < 20_000 - 50


def test_tiresias_preempts_the_long_job_for_the_short_one(catalog):
    """One GPU; a long job (attained service past the threshold) is preempted by a new short one, pays the
    checkpoint cost when it resumes; the short one does not wait behind it."""
    pool = SimPool("t", (HostGroup(V100, "nvidia", 1, 1, 16 * GIB, 2.48, ()),))
    jobs = [SimJob(0, 0.0, 10_000.0, 1, "c", GIB, GIB), SimJob(1, 5_000.0, 100.0, 1, "c", GIB, GIB)]
    opt = SimOptions(las_threshold_gpu_s=1_000.0, checkpoint_s=60.0, las_promote_knob=None, **EXACT)
    r = simulate(jobs, pool, "tiresias_las", speeds=SPEEDS, catalog=catalog, options=opt)
    assert r.preemptions == 1 and r.completed == 2
    assert sorted(r.jcts) == pytest.approx([100.0, 10_000.0 + 100.0 + 60.0])


def test_the_bandit_learns_the_true_speed_when_the_catalog_is_wrong(catalog):
    """The catalog calls the T4 four times faster than the A100; the truth is the reverse. rule_based keeps
    believing it; rl_based, rewarded with the measured speed, moves to the A100 once warmed up."""
    pool = SimPool("t", (HostGroup("T4", "nvidia", 2, 4, 16 * GIB, 0.35, ()),
                         HostGroup("A100-SXM4-40GB", "nvidia", 2, 4, 40 * GIB, 2.93, ())))
    truth = {"c": {"T4": 0.5, "A100-SXM4-40GB": 2.0}}
    seen = {"T4": 2.0, "A100-SXM4-40GB": 0.5}
    jobs = [SimJob(i, 60.0 * i, 50.0, 1, "c", GIB, GIB, 50.0) for i in range(200)]
    opt = SimOptions(seen_speeds=seen, **EXACT)
    rule = simulate(jobs, pool, "rule_based", speeds=truth, catalog=catalog, options=opt)
    rl = simulate(jobs, pool, "rl_based", speeds=truth, catalog=catalog, options=opt)
    assert rule.placed_on == {"T4": 200}
    assert rl.placed_on["A100-SXM4-40GB"] > 150
    assert rl.avg_jct_s < 0.6 * rule.avg_jct_s


def test_seen_by_class_shows_each_job_its_own_speed(catalog):
    """With ``seen_by_class`` the policy sees each job's class row of the true matrix: class "a" is
    fastest on the A100, class "b" on the T4, and each goes there; with the class-averaged figures
    (the default) both classes see the same speeds and go to the same device model."""
    pool = SimPool("t", (HostGroup("T4", "nvidia", 1, 4, 16 * GIB, 0.35, ()),
                         HostGroup("A100-SXM4-40GB", "nvidia", 1, 4, 40 * GIB, 2.93, ())))
    truth = {"a": {"T4": 0.5, "A100-SXM4-40GB": 2.0}, "b": {"T4": 2.0, "A100-SXM4-40GB": 1.0}}
    jobs = [SimJob(i, 0.0, 100.0, 1, "ab"[i % 2], GIB, GIB, 100.0) for i in range(4)]
    spd = {**DEFAULT_WEIGHTS, "best_fit": 0.0, "cost": 0.0}   # speed alone decides
    by_class = simulate(jobs, pool, "rule_based", speeds=truth, catalog=catalog,
                        options=SimOptions(seen_by_class=True, weights=spd, **EXACT))
    assert by_class.placed_on == {"A100-SXM4-40GB": 2, "T4": 2}
    assert by_class.avg_jct_s == pytest.approx(50.0)
    averaged = simulate(jobs, pool, "rule_based", speeds=truth, catalog=catalog,
                        options=SimOptions(weights=spd, **EXACT))
    assert averaged.placed_on == {"A100-SXM4-40GB": 4}


STRIP = ("wall_s", "decision_us_median")


@pytest.mark.parametrize("rules", [{}, {"wait_margin": None}, {"gang_first_s": 600.0}],
                         ids=["default", "no-wait-rule", "gangs-first"])
def test_shortcuts_decide_as_the_plain_calls(catalog, rules):
    """The simulator's prefilter (only runs that could fit are handed to decide, the gangs past the wait
    longest-waiting big gang put first) and its incremental reservation search change nothing: same results as the plain
    calls, on a real slice under load, with the queue's optional rules too."""
    kw = dict(start=5000, jobs=700, seed=2, load=3.0, pool_scale=0.25, catalog=catalog)   # 36 gangs of 8+
    fast = run_all(policies=["rule_based"], options=SimOptions(seed=2, **rules), **kw)[0]
    plain = run_all(policies=["rule_based"], options=SimOptions(seed=2, prefilter=False, fast_reservation=False,
                                                                **rules), **kw)[0]
    strip = lambda r: {k: v for k, v in r.summary().items() if k not in STRIP}  # noqa: E731
    assert fast.oom_failures + fast.completed > 0 and strip(fast) == strip(plain)
    if rules:                   # the rule changes decisions on this slice (not only the queue's label)
        default = run_all(policies=["rule_based"], **kw)[0]
        assert default.avg_jct_s != fast.avg_jct_s


def test_faster_device_shortens_the_run(catalog):
    """A job on a device twice as fast runs half its V100 duration."""
    pool = SimPool("t", (HostGroup("A100-SXM4-40GB", "nvidia", 1, 1, 40 * GIB, 2.93, ()),))
    r = simulate([SimJob(0, 0.0, 100.0, 1, "c", GIB, GIB)], pool, "rule_based",
                 speeds={"c": {"A100-SXM4-40GB": 2.0}}, catalog=catalog, options=SimOptions(**EXACT))
    assert r.avg_jct_s == pytest.approx(50.0)


def test_trace_slice_sorted_and_classed():
    jobs = load_trace(start=100, jobs=50, seed=1, error=0.15)
    assert len(jobs) == 50
    assert jobs[0].submit_s == 0.0
    assert all(a.submit_s <= b.submit_s for a, b in zip(jobs, jobs[1:]))
    assert {j.model_class for j in jobs} <= {"cifar10_resnet18", "bert_finetune", "imagenet_resnet50"}
    assert all(abs(j.est_bytes / j.peak_bytes - 1) <= 0.15 + 1e-9 for j in jobs)
    assert all(j.owner for j in jobs)


def test_measured_errors_are_what_the_policy_sees():
    """By default each estimate is the true peak x one measured ratio of the estimator benchmark's table
    (65 configurations, -1.4% to +3.0% in the table of 2026-12-01; four peak in an evaluation pass)."""
    samples = load_errors()
    ratios = sorted(s.ratio for s in samples)
    assert len(samples) == 65 and 0.98 < ratios[0] < 0.99 and 1.025 < ratios[-1] < 1.035
    assert sum(s.phase == "eval" for s in samples) == 4
    jobs = load_trace(start=0, jobs=3000, seed=4)
    seen = {round(j.est_bytes / j.peak_bytes, 2) for j in jobs}
    assert seen <= {round(r, 2) for r in ratios} | {round(r, 2) + d for r in ratios for d in (-0.01, 0.01)}
    assert {j.peak_phase for j in jobs} == {"step", "eval"}
    # the queue sees a noisy expected runtime; load x2 halves the submit times
    assert any(abs(j.est_duration_s / j.duration_s - 1) > 0.5 for j in jobs)
    twice = load_trace(start=0, jobs=3000, seed=4, load=2.0)
    assert twice[-1].submit_s == pytest.approx(jobs[-1].submit_s / 2)
    assert [j.est_bytes for j in twice] == [j.est_bytes for j in jobs]


def test_error_table_is_the_benchmark_table_converted():
    """``autodl_sim/data/estimate-errors.csv`` is what ``benchmarks/estimate_errors_csv.py`` writes from
    ``benchmarks/results/estimate_accuracy.txt``: row for row, with the eval-phase scripts marked."""
    import importlib.util
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    spec = importlib.util.spec_from_file_location("estimate_errors_csv", root / "benchmarks" / "estimate_errors_csv.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    rows = mod.parse_table(mod.TABLE.read_text(encoding="utf-8"))
    samples = load_errors()
    assert [s.name for s in samples] == [r["name"].replace(",", ";") for r in rows]
    for s, r in zip(samples, rows):
        assert s.ratio == pytest.approx(r["estimate"] / r["measured"])
        assert abs(s.ratio - 1 - r["err"]) < 0.002 + 0.1 * 2**20 / r["measured"]
        assert s.phase == ("eval" if r["name"] in mod.EVAL_PEAK else "step")
    assert mod._recorded_commit() == "dad92ef"  # the commit that wrote benchmarks/results/estimate_accuracy.txt
    with pytest.raises(ValueError, match="no configuration rows"):
        mod.parse_table("# header only\n")


def test_bad_error_table_names_the_row(tmp_path):
    from autodl.errors import AutoDLError

    p = tmp_path / "e.csv"
    p.write_text("name,measured_bytes,estimated_bytes,phase,source\nx,100,abc,step,here\n")
    with pytest.raises(AutoDLError, match="row 2"):
        load_errors(p)


def test_same_seed_same_results(catalog):
    a = run_all(start=0, jobs=300, seed=3, policies=["random", "rl_based"], catalog=catalog)
    b = run_all(start=0, jobs=300, seed=3, policies=["random", "rl_based"], catalog=catalog)
    strip = lambda r: {k: v for k, v in r.summary().items() if k not in ("wall_s", "decision_us_median")}  # noqa: E731
    assert [strip(r) for r in a] == [strip(r) for r in b]
    c = run_all(start=0, jobs=300, seed=4, policies=["random"], catalog=catalog)
    assert strip(c[0]) != strip(a[0])


def test_pool_file_reads_and_scales(catalog):
    pool = load_sim_pool(None, catalog)
    assert pool.gpus == 560
    assert {g.model for g in pool.groups} >= {"A100-SXM4-40GB", "RTX-3090", "Ascend-910", "T4"}
    half, quarter = scale_pool(pool, 0.5), scale_pool(pool, 0.25)
    assert 270 <= half.gpus <= 290 and 130 <= quarter.gpus <= 150
    assert all(g.hosts >= 1 for g in quarter.groups)


def test_steady_state_utilization_is_defined_on_the_window(catalog):
    """Utilization counts the window between the submits of the slice's 20% and 80% jobs, and the useful
    part leaves out attempts that end in an OOM."""
    r = run_all(start=5000, jobs=800, seed=1, load=2.0, policies=["fifo_first_fit"], catalog=catalog)[0]
    assert 0.0 < r.useful_utilization_steady <= r.gpu_utilization_steady <= 1.0


def test_cli_json_and_plot(tmp_path, capsys):
    parser = argparse.ArgumentParser()
    register(parser.add_subparsers(dest="command"))
    png = tmp_path / "sim.png"
    args = parser.parse_args(
        ["simulate", "--jobs", "200", "--policies", "fifo_first_fit,rule_based,tiresias_las", "--json", "--plot", str(png),
         "--load", "2"]
    )
    assert run(args) == 0
    doc = json.loads(capsys.readouterr().out)
    assert [r["policy"] for r in doc["results"]] == ["fifo_first_fit", "rule_based", "tiresias_las"]
    assert all(not math.isnan(r["avg_jct_s"]) for r in doc["results"])
    assert png.stat().st_size > 1000


def test_cli_names_bad_input(capsys):
    parser = argparse.ArgumentParser()
    register(parser.add_subparsers(dest="command"))
    assert run(parser.parse_args(["simulate", "--jobs", "10", "--policies", "nope"])) != 0
    assert "nope" in capsys.readouterr().err


def test_cli_turns_the_queue_rules_on(capsys):
    """``--wait-margin`` and ``--gang-first-after-h`` reach the queue: the same slice gives other results with
    the wait rule off (it is on for rule_based by default) and with big gangs first; bad values are refused
    naming the flag."""
    parser = argparse.ArgumentParser()
    register(parser.add_subparsers(dest="command"))
    base = ["simulate", "--start", "5000", "--jobs", "700", "--seed", "2", "--load", "3", "--pool-scale", "0.25",
            "--policies", "rule_based", "--json"]
    docs = {}
    for extra in ([], ["--wait-margin", "off"], ["--gang-first-after-h", "0.01"]):
        assert run(parser.parse_args(base + extra)) == 0
        docs[tuple(extra)] = json.loads(capsys.readouterr().out)["results"][0]["avg_jct_s"]
    assert len(set(docs.values())) == 3, docs
    for flag, bad in (("--wait-margin", "1.5"), ("--gang-first-after-h", "0")):
        with pytest.raises(SystemExit):
            parser.parse_args(base + [flag, bad])
        err = capsys.readouterr().err
        assert flag in err and ("hours" in err) == (flag == "--gang-first-after-h")
    # the settings are in the JSON and the queue label (fresh user: saved results could not be told apart)
    assert run(parser.parse_args(base + ["--wait-margin", "0.25", "--gang-first-after-h", "96"])) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["settings"]["wait_margin"] == 0.25 and doc["settings"]["gang_first_after_h"] == 96.0
    assert doc["settings"]["load"] == 3.0 and doc["results"][0]["queue"] == "sjf+easy+wait0.25+gangs96h"
    # the default: on for autodl's rule_based, labelled
    assert run(parser.parse_args(base)) == 0
    assert json.loads(capsys.readouterr().out)["results"][0]["queue"] == "sjf+easy+wait0.25"
    # classic queues have neither rule: refused, not silently ignored
    assert run(parser.parse_args(base + ["--queue", "own", "--wait-margin", "0.25"])) == 2
    assert "--queue own" in capsys.readouterr().err


def test_cli_sharing_packed_packs_and_exclusive_never_does(capsys):
    """``autodl simulate --sharing packed`` runs the product's packing rule; the default keeps devices exclusive."""
    parser = argparse.ArgumentParser()
    register(parser.add_subparsers(dest="command"))
    joins = {}
    for mode in ("exclusive", "packed"):
        assert run(parser.parse_args(["simulate", "--jobs", "300", "--policies", "rule_based", "--json",
                                      "--sharing", mode])) == 0
        doc = json.loads(capsys.readouterr().out)
        assert doc["settings"]["sharing"] == mode
        joins[mode] = doc["results"][0]["joins"]
    assert joins["exclusive"] == 0 < joins["packed"]
