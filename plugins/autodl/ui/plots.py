"""The GPU page's plots as PNG bytes (matplotlib, Agg backend): estimate vs actual peak across runs, and one
run's timeline from its metric samples."""

from __future__ import annotations

import io
import tempfile
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # no display in the api-server
from matplotlib.figure import Figure  # noqa: E402 - after choosing the backend

GiB = 1 << 30
SOURCE_STYLE = {"nvml": ("#1f77b4", "device memory (NVML)"), "process": ("#ff7f0e", "process RSS on CPU (declared pool)")}


def _png(fig: Figure) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100, bbox_inches="tight")
    return buf.getvalue()


def _empty(fig: Figure, ax, text: str) -> None:
    ax.text(0.5, 0.5, text, ha="center", va="center", transform=ax.transAxes, wrap=True)
    ax.set_xticks([])
    ax.set_yticks([])


def estimate_vs_actual_png(points: list[tuple[float, float, str, str]]) -> bytes:
    """Scatter of estimated vs measured peak memory per run (GiB), with the y = x line.

    :param points: (estimated GiB, actual GiB, metrics source, run key), as
        :func:`autodl.ui.data.estimate_points` gives them.
    """
    fig = Figure(figsize=(6.4, 4.2))
    ax = fig.subplots()
    if not points:
        _empty(fig, ax, "no finished run has both an estimate and a measured peak yet")
        return _png(fig)
    top = max(max(e, a) for e, a, _s, _k in points) * 1.15
    ax.plot([0, top], [0, top], color="#888888", linestyle="--", linewidth=1, label="estimate = actual")
    for source in sorted({s for _e, _a, s, _k in points}):
        color, label = SOURCE_STYLE.get(source, ("#2ca02c", source))
        xs = [e for e, _a, s, _k in points if s == source]
        ys = [a for _e, a, s, _k in points if s == source]
        ax.scatter(xs, ys, color=color, label=f"{label} ({len(xs)})", s=28, zorder=3)
    ax.set_xlim(0, top)
    ax.set_ylim(0, top)
    ax.set_xlabel("estimated peak per device (GiB)")
    ax.set_ylabel("measured peak (GiB)")
    ax.set_title("Estimate vs actual peak memory, recent runs")
    ax.grid(True, alpha=0.3)
    ax.legend(loc="upper left", fontsize=8)
    return _png(fig)


def timeline_png(samples: list[dict[str, float]], *, estimated_peak_bytes: int | None, source: str | None,
                 title: str) -> bytes:
    """Memory (GiB) and utilization (%) of one run over time since its first sample; the estimate as a
    dashed line. Temperature (deg C) is drawn when the samples have it.

    :param samples: rows with ``t`` (unix seconds), ``memory_bytes``, ``utilization_pct``, optional
        ``temperature_c``.
    """
    fig = Figure(figsize=(7.2, 4.0))
    ax = fig.subplots()
    if not samples:
        _empty(fig, ax, "no metric samples were recorded for this run")
        return _png(fig)
    t0 = samples[0]["t"]
    ts = [s["t"] - t0 for s in samples]
    mem = [(s.get("memory_bytes") or 0) / GiB if s.get("memory_bytes") is not None else float("nan") for s in samples]
    what = "device memory" if source in ("nvml", "dcgm") else "process RSS" if source == "process" else "memory"
    ax.plot(ts, mem, color="#1f77b4", label=f"{what} (GiB)")
    if estimated_peak_bytes:
        ax.axhline(estimated_peak_bytes / GiB, color="#d62728", linestyle="--", linewidth=1, label="estimated peak")
    ax.set_xlabel("seconds since the first sample")
    ax.set_ylabel("GiB")
    ax.grid(True, alpha=0.3)
    util = [s.get("utilization_pct") for s in samples]
    ax2 = ax.twinx()
    ax2.plot(ts, [u if u is not None else float("nan") for u in util], color="#2ca02c", alpha=0.7,
             label="utilization (%)" if source in ("nvml", "dcgm") else "CPU (% of one core)")
    temps = [s.get("temperature_c") for s in samples]
    has_temp = any(t is not None for t in temps)
    if has_temp:
        ax2.plot(ts, [t if t is not None else float("nan") for t in temps], color="#9467bd", alpha=0.7,
                 label="temperature (deg C)")
    ax2.set_ylabel("% / deg C" if has_temp else "%")
    ax.set_ylim(bottom=0)
    ax2.set_ylim(bottom=0)
    lines = ax.get_legend_handles_labels()
    lines2 = ax2.get_legend_handles_labels()
    ax.legend(lines[0] + lines2[0], lines[1] + lines2[1], loc="upper left", fontsize=8)
    ax.set_title(title, fontsize=9)
    return _png(fig)


def run_timeline_png(samples_path: Path, *, estimated_peak_bytes: int | None, source: str | None, title: str) -> bytes:
    """One run's timeline as PNG bytes: drawn by :func:`autodl.timeline.plot_run` (the metrics side's
    picture of the run folder) where this autodl has it, else by :func:`timeline_png` from the samples."""
    try:
        from autodl.timeline import plot_run
    except ImportError:
        from autodl.ui.data import read_samples

        return timeline_png(read_samples(samples_path), estimated_peak_bytes=estimated_peak_bytes, source=source,
                            title=title)
    with tempfile.TemporaryDirectory(prefix="autodl-timeline-") as tmp:
        out = Path(tmp) / "timeline.png"
        plot_run(samples_path.parent, out=out, estimate_bytes=estimated_peak_bytes, title=title)
        return out.read_bytes()
