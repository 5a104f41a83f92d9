"""The record's peak is not whatever the training says (issue 23): a self-reported peak far below what autodl
measured is replaced by the measured one, and said."""

from __future__ import annotations

import json

from autodl.metrics import MEASURED_SLACK_BYTES, summarise

GiB = 1 << 30


def _steps(tmp_path, reserved: int):
    path = tmp_path / "steps.jsonl"
    path.write_text(json.dumps({"kind": "memory", "t": 1.0, "device": "cpu", "place": "cpu",
                                "allocated_peak_bytes": reserved, "reserved_peak_bytes": reserved}) + "\n")
    return path


def test_a_forged_tiny_peak_does_not_hide_three_gib_of_measured_rss(tmp_path):
    samples = [{"t": float(i), "rss_bytes": 3 * GiB, "cpu_pct": 100.0} for i in range(15)]
    m = summarise(samples, source="process", duration_s=15.0, exit_code=0, steps_path=_steps(tmp_path, 3800))
    assert m.peak_memory_bytes == 3 * GiB and m.peak_source == "rss"
    assert m.reserved_peak_bytes == 3800                      # the self-reported figure is kept beside
    assert any("not trusted over measured" in n for n in m.notes)


def test_an_nvml_process_peak_far_above_the_report_wins(tmp_path):
    samples = [{"t": 0.0, "process_bytes": 30 * GiB, "device_used_bytes": 31 * GiB}]
    m = summarise(samples, source="nvml", duration_s=5.0, exit_code=0, steps_path=_steps(tmp_path, 2 * GiB))
    assert m.peak_memory_bytes == 30 * GiB and m.peak_source == "nvml_process"


def test_a_report_within_the_context_allowance_is_the_peak(tmp_path):
    # NVML counts the CUDA context beside Paddle's reserved memory: a gap under the allowance is expected
    samples = [{"t": 0.0, "process_bytes": 4 * GiB + MEASURED_SLACK_BYTES // 2}]
    m = summarise(samples, source="nvml", duration_s=5.0, exit_code=0, steps_path=_steps(tmp_path, 4 * GiB))
    assert m.peak_memory_bytes == 4 * GiB and m.peak_source == "paddle_reserved"
