"""Metrics: follow a real process, stream its log, sample its RSS; summaries."""

from __future__ import annotations

import json

from autodl.catalog import load_catalog
from autodl.launch import LaunchRequest
from autodl.launch.local import LocalLauncher
from autodl.metrics import ProcessSampler, follow, make_sampler, summarise


def test_summarise_units():
    """NVML samples: device-wide 'used' is context (device_used_peak_bytes), the run's own peak is its
    per-process memory; units pass through."""
    s = summarise([{"device_used_bytes": 10, "process_bytes": 4, "utilization_pct": 50, "temperature_c": 60, "power_w": 100},
                   {"device_used_bytes": 30, "process_bytes": 8, "utilization_pct": 100, "temperature_c": 70, "power_w": 200}],
                  source="nvml", duration_s=2.0, exit_code=0)
    assert s.peak_memory_bytes == 8 and s.peak_source == "nvml_process" and s.device_used_peak_bytes == 30
    assert s.mean_utilization_pct == 75 and s.max_utilization_pct == 100
    assert s.max_temperature_c == 70 and s.mean_power_w == 150 and s.samples == 2
    empty = summarise([], source="none", duration_s=1.0, exit_code=1)
    assert empty.peak_memory_bytes is None and empty.samples == 0


def test_summarise_never_takes_device_used_as_the_runs_peak():
    """Without per-process memory and without the training's report, the run's peak is unknown (None,
    with a note), not the device-wide 'used' that counts other jobs."""
    s = summarise([{"device_used_bytes": 30 * 2**30, "process_bytes": None, "utilization_pct": None}],
                  source="nvml", duration_s=1.0, exit_code=0)
    assert s.peak_memory_bytes is None and s.device_used_peak_bytes == 30 * 2**30
    assert s.mean_utilization_pct is None
    assert any("own peak memory is unknown" in n for n in s.notes)


def test_follow_streams_log_and_samples_process(tmp_path):
    script = tmp_path / "t.py"
    script.write_text("import time, sys\nblob = bytearray(64 * 2**20)\n"
                      "for i in range(5):\n    print('line', i, flush=True)\n    time.sleep(0.2)\n"
                      "print('no newline at end', end='')\nsys.exit(2)\n")
    launcher = LocalLauncher()
    handle = launcher.launch(LaunchRequest(run_key="m", script=str(script), on_cpu=True,
                                           vendor=load_catalog().vendor("nvidia")))
    sampler = make_sampler(handle, [])
    assert isinstance(sampler, ProcessSampler)
    lines: list[str] = []
    samples_path = tmp_path / "samples.jsonl"
    metrics = follow(launcher, handle, sampler=sampler, log_sink=lines.append, interval_s=0.1, samples_path=samples_path)
    assert metrics.exit_code == 2
    assert [l for l in lines if l.startswith("line")] == [f"line {i}" for i in range(5)]
    assert lines[-1] == "no newline at end"
    assert metrics.source == "process" and metrics.samples >= 3
    assert metrics.peak_source == "rss" and metrics.peak_memory_bytes > 64 * 2**20  # the bytearray is resident
    rows = [json.loads(l) for l in samples_path.read_text().splitlines()]
    assert len(rows) == metrics.samples and all("t" in r for r in rows)


def test_read_steps_median_excludes_warmup(tmp_path):
    from autodl.metrics import read_steps

    path = tmp_path / "steps.jsonl"
    # warm-up 5 s, then steps of 1, 1, 3 s (median 1 s); 10 samples each; a torn last line is ignored
    path.write_text("\n".join(json.dumps({"step": i, "t": t, "samples": 10}) for i, t in enumerate([0, 5, 6, 7, 10]))
                    + '\n{"step": 5, "t"')
    got = read_steps(path)
    assert got == {"steps": 5, "step_time_s": 1.0, "samples_per_s": round(40 / 10, 3)}
    assert read_steps(tmp_path / "absent") == {"steps": None, "step_time_s": None, "samples_per_s": None}


def test_training_reports_its_steps_through_the_launcher(tmp_path):
    script = tmp_path / "t.py"
    script.write_text("import json, os, time\nfor i in range(4):\n    time.sleep(0.05)\n"
                      "    open(os.environ['AUTODL_METRICS_FILE'], 'a').write(json.dumps({'step': i, 't': time.time(), 'samples': 8}) + '\\n')\n")
    launcher = LocalLauncher()
    handle = launcher.launch(LaunchRequest(run_key="s", script=str(script), on_cpu=True,
                                           vendor=load_catalog().vendor("nvidia")))
    metrics = follow(launcher, handle, sampler=None, log_sink=lambda _l: None, interval_s=0.05)
    assert metrics.exit_code == 0 and metrics.steps == 4
    assert metrics.step_time_s >= 0.05 and metrics.samples_per_s > 0  # each step sleeps 50 ms
