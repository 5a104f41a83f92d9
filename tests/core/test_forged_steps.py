"""Forged step lines (issue 23, item 3): "100 steps at 0.001 s/step" printed by a training must not become the
run's step time nor teach the learning policy. Step lines are the training's own word: kept, marked
self-reported, and their step time believed only where it fits the run autodl measured (autodl.metrics.checked_steps);
the bandit also refuses a step time faster than the device's peak compute (autodl.profile.runtime.fastest_step_s)."""

from __future__ import annotations

import json

import pytest

from autodl.catalog import load_catalog
from autodl.launch import LaunchRequest
from autodl.launch.local import LocalLauncher
from autodl.metrics import follow, summarise
from autodl.policy import observe
from autodl.policy.rl_based import load_bandit
from autodl.profile.runtime import fastest_step_s
from autodl.types import MemoryBreakdown, ResourceProfile, RunRecord

START = 1_764_633_000.0


def steps_file(tmp_path, times, samples=8):
    path = tmp_path / "steps.jsonl"
    path.write_text("".join(json.dumps({"step": i, "t": t, "samples": samples}) + "\n" for i, t in enumerate(times)))
    return path


def summary(path, duration_s=60.0):
    return summarise([], source="process", duration_s=duration_s, exit_code=0, steps_path=path, started_ts=START)


def test_a_hundred_lines_printed_at_once_are_not_the_runs_step_time(tmp_path):
    """The issue's forgery: 100 lines 1 ms apart at the end of a 60 s run."""
    m = summary(steps_file(tmp_path, [START + 59 + i * 0.001 for i in range(100)]))
    assert m.step_time_s is None and m.samples_per_s is None
    assert m.reported_step_time_s == pytest.approx(0.001)
    assert m.steps == 100 and "steps" in m.self_reported and "reported_step_time_s" in m.self_reported
    assert any("were not believed" in n and "span 0.099 s of the run's measured 60 s" in n for n in m.notes), m.notes


def test_step_lines_dated_outside_the_run_are_not_believed(tmp_path):
    m = summary(steps_file(tmp_path, [1000.0 + i for i in range(50)]))
    assert m.step_time_s is None and m.reported_step_time_s == 1.0
    assert any("50 of 50 are dated outside the run" in n for n in m.notes), m.notes


def test_step_lines_whose_times_go_backwards_are_not_believed(tmp_path):
    m = summary(steps_file(tmp_path, [START + 50 - i for i in range(40)]))
    assert m.step_time_s is None and any("times go backwards" in n for n in m.notes)


def test_steps_as_they_ran_are_believed_and_still_marked_self_reported(tmp_path):
    m = summary(steps_file(tmp_path, [START + 8 + i for i in range(50)]))
    assert m.step_time_s == 1.0 and m.reported_step_time_s == 1.0 and m.samples_per_s == 8.0
    assert {"steps", "step_time_s", "samples_per_s"} <= set(m.self_reported)
    assert not any("not believed" in n for n in m.notes)


def test_a_short_run_mostly_start_up_keeps_its_steps(tmp_path):
    """A 3 s run whose 4 steps took 0.2 s after 2.5 s of imports: start-up is most of it, the steps stand."""
    m = summary(steps_file(tmp_path, [START + 2.5 + i * 0.05 for i in range(4)]), duration_s=3.0)
    assert m.step_time_s == pytest.approx(0.05)


def test_a_real_training_printing_forged_steps_gets_no_step_time(tmp_path):
    script = tmp_path / "forge.py"
    script.write_text("import json, os\nwith open(os.environ['AUTODL_METRICS_FILE'], 'a') as fh:\n"
                      "    for i in range(100):\n"
                      "        fh.write(json.dumps({'step': i, 't': 1e9 + i * 0.001, 'samples': 64}) + '\\n')\n")
    launcher = LocalLauncher()
    handle = launcher.launch(LaunchRequest(run_key="forged-steps", script=str(script), on_cpu=True,
                                           vendor=load_catalog().vendor("nvidia")))
    metrics = follow(launcher, handle, sampler=None, log_sink=lambda _l: None, interval_s=0.05)
    assert metrics.exit_code == 0 and metrics.steps == 100
    assert metrics.step_time_s is None and metrics.reported_step_time_s == pytest.approx(0.001)
    assert any("dated outside the run" in n for n in metrics.notes)


def big_profile() -> ResourceProfile:
    """10 TFLOPs a step: at least 16 ms on an A100 even at its 312 TFLOPS fp16 peak, counted twice over."""
    b = MemoryBreakdown(weights_bytes=4 * 10**8, gradients_bytes=4 * 10**8, optimizer_state_bytes=8 * 10**8,
                        activations_bytes=10 * 2**30)
    return ResourceProfile(script="train.py", params=10**8, peak_memory_bytes=b.total_bytes, breakdown=b,
                           flops_per_step=1e13, batch_size=64)


def record(step_time_s, run_key="r1"):
    from autodl.policy import place
    from autodl.spec import ResourcePolicySection
    from autodl.types import Device, Inventory

    catalog = load_catalog()
    g = catalog.get("A100-SXM4-80GB")
    inv = Inventory(source="test", declared=True, devices=[
        Device(device_id="h:0", host="h", index=0, model=g.name, vendor=g.vendor, memory_total_bytes=g.memory_bytes,
               declared=True)])
    placed = place(big_profile(), inv, catalog=catalog, policy=ResourcePolicySection(), algorithm="rl_based")
    return RunRecord(run_key=run_key, script="train.py", outcome="succeeded", declared_pool=False,
                     profile=big_profile().to_json(), placement=placed.to_json(), device_model=g.name,
                     metrics={"step_time_s": step_time_s})


def test_the_bandit_does_not_learn_a_step_faster_than_the_devices_peak_compute():
    catalog = load_catalog()
    floor = fastest_step_s(big_profile(), catalog.get("A100-SXM4-80GB"))
    assert floor == pytest.approx(1e13 / 312e12 / 2)
    assert not observe(record(0.001), catalog=catalog)   # the forged 0.001 s/step
    assert not observe(record(None, "r0"), catalog=catalog)   # a step time the record did not believe
    assert "A100-SXM4-80GB" not in load_bandit().arms
    assert observe(record(0.2, "r2"), catalog=catalog)   # a plausible one teaches
    assert load_bandit().arms["A100-SXM4-80GB"].count == 1

