"""Following a growing pod log with restarts (the benchmark's fake kubelet): every line once, each byte fetched about once."""

from __future__ import annotations

from pathlib import Path

from tests.load_file import load_file

BENCH = Path(__file__).resolve().parents[2] / "benchmarks" / "log_follow.py"


def load_bench():
    return load_file(BENCH, "log_follow_bench")


def test_a_followed_pod_log_is_fetched_about_once_across_restarts():
    row = load_bench().pod_row(seconds=240, restarts=3)  # exits when a line is lost or repeated
    assert row["fetched"] / row["log"] <= 1.1
    assert row["before"] > 100, "the former follower re-read the whole log at every poll"
