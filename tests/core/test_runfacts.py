"""Run facts read from a training's log: strict, bounded parsing of what a container or pod says about itself."""

from __future__ import annotations

import json

import pytest

from autodl import runfacts
from autodl.launch.base import LogStream, timestamp_ns
from autodl.metrics import read_memory_reports, read_steps
from autodl.runfacts import PREFIX, FactSink, parse_fact, split_fact

MEMORY = {"kind": "memory", "t": 1764633001.5, "pid": 7, "rank": "0", "place": "cpu", "device": "cpu", "step": 3,
          "allocated_peak_bytes": 1000, "reserved_peak_bytes": 4096, "final": False, "allocator_strategy": "auto_growth"}


def test_memory_and_step_facts_land_where_the_summary_reads_them(tmp_path):
    sink = FactSink(tmp_path / "runfacts.jsonl", tmp_path / "report.json")
    sink.take("metrics " + json.dumps(MEMORY))
    for step, t in enumerate((10.0, 10.5, 11.0, 11.5)):
        sink.take("metrics " + json.dumps({"step": step, "t": t, "samples": 32, "loss": 0.5}))
    sink.take("report " + json.dumps({"epoch": 2, "resumed_from": "/autodl/output/last.pdparams"}))
    assert read_memory_reports(sink.metrics_path)["reserved_peak_bytes"] == 4096
    assert read_steps(sink.metrics_path) == {"steps": 4, "step_time_s": 0.5, "samples_per_s": 64.0}
    assert json.loads(sink.report_path.read_text()) == {"epoch": 2, "resumed_from": "/autodl/output/last.pdparams"}
    assert "loss" not in sink.metrics_path.read_text(), "keys outside the schema are not kept"
    assert sink.notes() == ["5 metrics lines and 1 reports came through the training's log stream: self-reported "
                            "by the training, as its own files are"]


@pytest.mark.parametrize("text, why", [
    ("metrics " + json.dumps({**MEMORY, "reserved_peak_bytes": -1}), "reserved_peak_bytes"),
    ("metrics " + json.dumps({**MEMORY, "reserved_peak_bytes": 2**70}), "reserved_peak_bytes"),
    ("metrics " + json.dumps({**MEMORY, "reserved_peak_bytes": "4096"}), "reserved_peak_bytes"),
    ("metrics " + json.dumps({**MEMORY, "extra": 1}), "extra"),
    ("metrics " + json.dumps({"kind": "disk", "t": 1.0}), "kind"),
    ("metrics " + json.dumps({"step": 1.5, "t": 2.0}), "step"),
    ("metrics {\"step\": 1, \"t\": NaN}", "finite"),
    ("metrics [1, 2]", "JSON object"),
    ("metrics {not json", "not JSON"),
    ("metrics " + json.dumps({"step": 1, "t": 2.0, "pad": "x" * runfacts.MAX_METRICS_LINE_BYTES}), "longer than"),
    ("report " + json.dumps({"blob": "x" * runfacts.MAX_REPORT_BYTES}), "longer than"),
    ("secrets {}", "unknown run-fact channel"),
])
def test_a_forged_or_broken_fact_is_refused_naming_why(text, why):
    with pytest.raises(ValueError, match=why):
        parse_fact(text)


def test_refused_facts_are_dropped_and_counted_never_half_used(tmp_path):
    sink = FactSink(tmp_path / "runfacts.jsonl", tmp_path / "report.json")
    sink.take("metrics " + json.dumps({**MEMORY, "reserved_peak_bytes": -1}))
    sink.take("report [1]")
    assert not sink.metrics_path.exists() and not sink.report_path.exists()
    assert sink.rejected == 2 and "2 run-fact lines" in sink.notes()[0]


def test_metrics_facts_are_capped_per_run(tmp_path, monkeypatch):
    monkeypatch.setattr(runfacts, "MAX_METRICS_FACTS", 3)
    sink = FactSink(tmp_path / "runfacts.jsonl", tmp_path / "report.json")
    for step in range(5):
        sink.take("metrics " + json.dumps({"step": step, "t": float(step)}))
    assert len(sink.metrics_path.read_text().splitlines()) == 3 and sink.rejected == 2
    resumed = FactSink(tmp_path / "runfacts.jsonl", tmp_path / "report.json")  # a follower restarted
    resumed.take("metrics " + json.dumps({"step": 9, "t": 9.0}))
    assert resumed.rejected == 1


def test_a_fact_after_an_unfinished_line_of_the_training_is_split_off():
    assert split_fact("epoch 1" + PREFIX + "report {}") == ("epoch 1", "report {}")
    assert split_fact("plain line") == ("plain line", None)


def test_timestamps_of_docker_and_the_kubelet_parse_to_nanoseconds():
    assert timestamp_ns(b"1970-01-01T00:00:01.000000002Z hello\n") == (1_000_000_002, b"hello\n")
    assert timestamp_ns(b"1970-01-01T00:01:00Z x") == (60_000_000_000, b"x")
    assert timestamp_ns(b"no time here") == (None, b"no time here")


class Chunks:
    def __init__(self, data: bytes):
        self.data = data
        self.closed = False

    def __iter__(self):
        return iter([self.data[i:i + 5] for i in range(0, len(self.data), 5)])

    def close(self):
        self.closed = True


def test_log_stream_resumes_after_its_cursor_and_counts_what_it_fetched():
    log = b"".join(b"1970-01-01T00:00:0%d.000000000Z line %d\n" % (i, i) for i in range(1, 5))
    asked = []

    def open_stream(since_s):
        asked.append(since_s)
        return Chunks(log)

    first = LogStream(open_stream)
    assert first.wait(30)
    assert first.read() == ("line 1\nline 2\nline 3\nline 4\n", 4 * 10**9)
    assert first.fetched_bytes == len(log)
    again = LogStream(open_stream, cursor_ns=2 * 10**9)
    assert again.wait(30)
    assert again.read() == ("line 3\nline 4\n", 4 * 10**9) and asked == [None, 2]


def test_a_long_line_of_partial_messages_is_one_line_again():
    from autodl.launch.base import PARTIAL_LINE_BYTES, join_partials

    body = b"a" * PARTIAL_LINE_BYTES + b"2026-12-02T00:17:44.841339696Z " + b"b" * PARTIAL_LINE_BYTES \
        + b"2026-12-02T00:17:44.841339697Z tail\n"
    assert join_partials(body) == b"a" * PARTIAL_LINE_BYTES + b"b" * PARTIAL_LINE_BYTES + b"tail\n"
    assert join_partials(b"short 2026-12-02T00:17:44Z line") == b"short 2026-12-02T00:17:44Z line"


def test_lines_slightly_out_of_time_order_within_a_stream_all_arrive():
    """stdout and stderr reach Docker's log file from two copiers: a stderr line may be written before a stdout
    line stamped a moment earlier (seen with a real dockerd). Only lines at or before the resume point are skipped."""
    log = (b"1970-01-01T00:00:02.000000001Z err\n1970-01-01T00:00:02.000000000Z out\n"
           b"1970-01-01T00:00:01.000000000Z old\n")
    stream = LogStream(lambda since_s: Chunks(log), cursor_ns=1_500_000_000)
    assert stream.wait(30)
    assert stream.read() == ("err\nout\n", 2_000_000_001)
