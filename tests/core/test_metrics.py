"""Metrics: follow a real process, stream its log, sample its RSS; summaries."""

from __future__ import annotations

import json

from autodl.catalog import load_catalog
from autodl.launch import LaunchRequest
from autodl.launch.local import LocalLauncher
from autodl.metrics import ProcessSampler, follow, make_sampler, summarise


def test_summarise_units():
    s = summarise([{"memory_bytes": 10, "utilization_pct": 50, "temperature_c": 60, "power_w": 100},
                   {"memory_bytes": 30, "utilization_pct": 100, "temperature_c": 70, "power_w": 200}],
                  source="nvml", duration_s=2.0, exit_code=0)
    assert s.peak_memory_bytes == 30 and s.mean_utilization_pct == 75 and s.max_utilization_pct == 100
    assert s.max_temperature_c == 70 and s.mean_power_w == 150 and s.samples == 2
    empty = summarise([], source="none", duration_s=1.0, exit_code=1)
    assert empty.peak_memory_bytes is None and empty.samples == 0


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
    assert metrics.peak_memory_bytes > 64 * 2**20  # the bytearray is resident
    rows = [json.loads(l) for l in samples_path.read_text().splitlines()]
    assert len(rows) == metrics.samples and all("t" in r for r in rows)
