"""autodl.timeline.plot_run: what the run folder's files put in the picture (the training's own peak reports,
the estimate from profile.json), and what it refuses."""

from __future__ import annotations

import json

import matplotlib.figure
import pytest

from autodl.timeline import OutputPathError, plot_run

GiB = 1 << 30


def _drawn_axes(monkeypatch) -> dict:
    """The figure's axes as plot_run saves it."""
    drawn: dict = {}
    original = matplotlib.figure.Figure.savefig

    def keep(fig, *a, **k):
        drawn["axes"] = fig.axes
        return original(fig, *a, **k)

    monkeypatch.setattr(matplotlib.figure.Figure, "savefig", keep)
    return drawn


def _run_folder(tmp_path, *, samples: list[dict], reports: list[dict], estimate_bytes: int | None):
    steps = tmp_path / "attempt-1.steps.jsonl"
    steps.write_text("\n".join(json.dumps(r) for r in reports) + "\nnot json\n")
    (tmp_path / "handle.json").write_text(json.dumps({"steps_path": str(steps)}))
    (tmp_path / "samples.jsonl").write_text("\n".join(json.dumps(r) for r in samples))
    if estimate_bytes is not None:
        (tmp_path / "profile.json").write_text(json.dumps({"profile": {"peak_memory_bytes": estimate_bytes}}))


def test_paddle_peak_reports_are_steps_per_device_and_the_estimate_comes_from_profile_json(tmp_path, monkeypatch):
    """The training's memory reports draw a reserved and an allocated step line per device (a long device name
    shortened), times from the first sample or report; the estimate is profile.json's, drawn as a line."""
    drawn = _drawn_axes(monkeypatch)
    long_place = "Place(gpu:0) on a very long name"
    _run_folder(tmp_path, samples=[{"t": 10.0, "process_bytes": GiB, "cpu_pct": 80.0}],
                reports=[{"kind": "memory", "t": 11.0, "device": "gpu:0", "reserved_peak_bytes": 2 * GiB,
                          "allocated_peak_bytes": GiB},
                         {"kind": "memory", "t": 12.0, "place": long_place, "reserved_peak_bytes": 3 * GiB},
                         {"kind": "step", "t": 12.5}],
                estimate_bytes=4 * GiB)
    path = plot_run(tmp_path)
    assert path == tmp_path / "timeline.png" and path.read_bytes()[:4] == b"\x89PNG"
    mem_ax, util_ax = drawn["axes"]
    labels = [line.get_label() for line in mem_ax.lines]
    assert labels == ["run's processes (NVML)", "Paddle reserved peak gpu:0", "Paddle allocated peak gpu:0",
                      f"Paddle reserved peak {long_place[:12]}…", f"Paddle allocated peak {long_place[:12]}…",
                      "estimate 4.00 GiB"]
    reserved = mem_ax.lines[1]
    assert list(reserved.get_xdata()) == [1.0] and list(reserved.get_ydata()) == [2.0]
    assert list(mem_ax.lines[4].get_ydata()) == [0.0]  # an allocated peak the report does not give: 0
    assert list(mem_ax.lines[5].get_ydata()) == [4.0, 4.0]
    assert [t.get_text() for t in mem_ax.get_legend().get_texts()] == labels
    assert [line.get_label() for line in util_ax.lines] == ["CPU % of one core"]
    assert util_ax.get_legend() is not None


def test_an_estimate_given_wins_over_profile_json_and_an_unreadable_profile_json_draws_none(tmp_path, monkeypatch):
    drawn = _drawn_axes(monkeypatch)
    _run_folder(tmp_path, samples=[{"t": 0.0, "process_bytes": GiB}], reports=[], estimate_bytes=4 * GiB)
    plot_run(tmp_path, estimate_bytes=2 * GiB, out=tmp_path / "given.png")
    assert drawn["axes"][0].lines[-1].get_label() == "estimate 2.00 GiB"
    (tmp_path / "profile.json").write_text("{not json")
    plot_run(tmp_path)
    mem_ax, util_ax = drawn["axes"]
    assert [line.get_label() for line in mem_ax.lines] == ["run's processes (NVML)"]
    assert util_ax.get_legend() is None  # nothing drawn below: no legend


def test_a_folder_without_samples_or_reports_and_an_unwritable_out_are_refused(tmp_path):
    with pytest.raises(FileNotFoundError, match="no metric samples and no memory reports"):
        plot_run(tmp_path)
    (tmp_path / "samples.jsonl").write_text(json.dumps({"t": 0.0, "process_bytes": GiB}))
    with pytest.raises(OutputPathError, match="is a folder"):
        plot_run(tmp_path, out=tmp_path)
    with pytest.raises(OutputPathError, match="does not exist"):
        plot_run(tmp_path, out=tmp_path / "missing" / "t.png")
