"""A picture per run: memory and utilization against time, with the estimate as a line, as a PNG beside the run's log.

Drawn with matplotlib's object API (``Figure`` + Agg canvas, no ``pyplot`` state, no display) from
the run folder's files: ``samples.jsonl`` (NVML or process samples, :mod:`autodl.metrics`), the
training's own peak reports in its ``attempt-N.steps.jsonl``, and the estimate in ``profile.json``.
"""

from __future__ import annotations

import json
import math
import os
import textwrap
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from matplotlib.axes import Axes

GiB = 1 << 30
PNG_NAME = "timeline.png"
TITLE_WIDTH = 90
"""Characters per title line: a run key is long, and a 9-inch figure holds about this many at medium size."""


class OutputPathError(ValueError):
    """The PNG cannot be written where asked."""


def check_output_path(out: str | Path) -> Path:
    """``out`` as a path a PNG can be written to.

    :raises OutputPathError: when it is a folder, or its folder does not exist or is not writable.
    """
    path = Path(out)
    try:
        path.is_dir() and path.parent.is_dir()
    except OSError as exc:  # a name too long, a loop: refused, never a traceback
        raise OutputPathError(f"{str(path)[:120]}: {exc.strerror or exc}; choose another --out") from None
    if path.is_dir():
        raise OutputPathError(f"{path} is a folder; give a file name, e.g. {path / PNG_NAME}")
    parent = path.parent
    if not parent.is_dir():
        raise OutputPathError(f"{parent} does not exist; create it or choose another --out")
    if not os.access(parent, os.W_OK):
        raise OutputPathError(f"{parent} is not writable; choose another --out")
    return path


def _jsonl(path: Path | None) -> list[dict[str, Any]]:
    if path is None or not path.is_file():
        return []
    rows = []
    for line in path.read_text().splitlines():
        try:
            row = json.loads(line)
        except ValueError:
            continue
        if isinstance(row, dict):
            rows.append(row)
    return rows


def _handle(folder: Path) -> dict[str, Any]:
    for name in ("handle-latest.json", "handle.json"):
        if (folder / name).is_file():
            try:
                return json.loads((folder / name).read_text())
            except ValueError:
                continue
    return {}


def _memory_reports(folder: Path) -> list[dict[str, Any]]:
    """The training's own memory reports (``kind: memory``) in the steps file its launch handle names."""
    handle = _handle(folder)
    steps = _jsonl(Path(handle["steps_path"])) if handle.get("steps_path") else []
    return [r for r in steps if r.get("kind") == "memory"]


def _profile_estimate_bytes(folder: Path) -> int | None:
    """``profile.json``'s ``peak_memory_bytes``; None when the file is missing or unreadable."""
    if not (folder / "profile.json").is_file():
        return None
    try:
        return json.loads((folder / "profile.json").read_text())["profile"]["peak_memory_bytes"]
    except (ValueError, KeyError, TypeError):
        return None


def _series(samples: list[dict[str, Any]], t0: float, key: str, scale: float = GiB) -> tuple[list[float], list[float]]:
    """Points of ``key`` (seconds since ``t0``, value / ``scale``); a sample where it is unknown is NaN, so the
    line breaks there instead of bridging the gap with invented values."""
    rows = [r for r in samples if "t" in r and key in r]
    if not any(r[key] is not None for r in rows):
        return [], []
    return [r["t"] - t0 for r in rows], [math.nan if r[key] is None else r[key] / scale for r in rows]


def _draw_sampled_memory(mem_ax: Axes, samples: list[dict[str, Any]], t0: float) -> bool:
    """The sampled memory lines (the run's processes, the device, the others); whether any was drawn."""
    drawn = False
    for key, label, style in (("process_bytes", "run's processes (NVML)", "-"),
                              ("rss_bytes", "run's processes RSS (CPU run)", "-"),
                              ("device_used_bytes", "device used, all processes (NVML)", ":"),
                              ("others_bytes", "other processes (NVML)", "--")):
        xs, ys = _series(samples, t0, key)
        if xs:
            mem_ax.plot(xs, ys, style, label=label)
            drawn = True
    return drawn


def _draw_paddle_peaks(mem_ax: Axes, reports: list[dict[str, Any]], t0: float) -> None:
    """Paddle's reserved and allocated peaks as the training reported them: two step lines per device."""
    by_device: dict[str, list[tuple[float, float, float]]] = {}
    for r in reports:
        by_device.setdefault(str(r.get("device") or r.get("place")), []).append(
            (r["t"] - t0, (r.get("reserved_peak_bytes") or 0) / GiB, (r.get("allocated_peak_bytes") or 0) / GiB))
    for device, pts in by_device.items():
        short = device if len(device) <= 16 else device[:12] + "…"
        mem_ax.step([p[0] for p in pts], [p[1] for p in pts], where="post", label=f"Paddle reserved peak {short}")
        mem_ax.step([p[0] for p in pts], [p[2] for p in pts], where="post", alpha=0.6,
                    label=f"Paddle allocated peak {short}")


def _draw_memory(mem_ax: Axes, samples: list[dict[str, Any]], reports: list[dict[str, Any]], t0: float,
                 estimate_bytes: int | None) -> None:
    """The top panel: memory in GiB, the estimate as a horizontal line."""
    drawn = _draw_sampled_memory(mem_ax, samples, t0)
    if reports:
        _draw_paddle_peaks(mem_ax, reports, t0)
        drawn = True
    if estimate_bytes:
        mem_ax.axhline(estimate_bytes / GiB, color="red", linestyle="-.", label=f"estimate {estimate_bytes / GiB:.2f} GiB")
    mem_ax.set_ylabel("memory (GiB)")
    if drawn or estimate_bytes:
        mem_ax.legend(loc="best", fontsize="small")
    mem_ax.grid(True, alpha=0.3)


def _draw_utilization(util_ax: Axes, samples: list[dict[str, Any]], t0: float) -> None:
    """The bottom panel: GPU utilization, or CPU % of one core on a CPU run."""
    for key, label in (("utilization_pct", "GPU utilization (mean of devices; gap = unknown)"),
                       ("cpu_pct", "CPU % of one core")):
        xs, ys = _series(samples, t0, key, scale=1.0)
        if xs:
            util_ax.plot(xs, ys, label=label)
    util_ax.set_ylabel("utilization (%)")
    util_ax.set_xlabel("seconds since the first sample")
    util_ax.grid(True, alpha=0.3)
    if util_ax.lines:
        util_ax.legend(loc="best", fontsize="small")


def plot_run(folder: str | Path, *, out: str | Path | None = None, estimate_bytes: int | None = None,
             title: str | None = None) -> Path:
    """Draw the run kept in ``folder`` and write it as a PNG.

    Top panel: memory in GiB against seconds since the first sample — the run's own memory (Paddle's
    reserved peak as the training reported it, NVML per-process memory, or RSS on CPU), device-wide
    NVML "used" (dotted, context only), other processes' memory, and the estimate as a horizontal line.
    Bottom panel: utilization in % (GPU, or CPU % of one core on a CPU run).

    :param folder: the run's folder (``$AUTODL_HOME/runs/<run key>``).
    :param out: the PNG path; default ``<folder>/timeline.png`` (beside the attempt logs).
    :param estimate_bytes: the estimate; default ``profile.json``'s ``peak_memory_bytes``.
    :returns: the PNG path.
    :raises FileNotFoundError: when the folder holds neither samples nor the training's reports.
    :raises OutputPathError: when ``out`` cannot be written (a folder, or its folder is missing).
    """
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    folder = Path(folder)
    if out is not None:
        check_output_path(out)
    samples = _jsonl(folder / "samples.jsonl")
    reports = _memory_reports(folder)
    if not samples and not reports:
        raise FileNotFoundError(f"{folder}: no metric samples and no memory reports to draw")
    if estimate_bytes is None:
        estimate_bytes = _profile_estimate_bytes(folder)
    times = [r["t"] for r in samples if "t" in r] + [r["t"] for r in reports if "t" in r]
    t0 = min(times) if times else 0.0

    fig = Figure(figsize=(9, 5.5), dpi=100)
    FigureCanvasAgg(fig)
    mem_ax, util_ax = fig.subplots(2, 1, sharex=True, gridspec_kw={"height_ratios": [2, 1]})
    _draw_memory(mem_ax, samples, reports, t0, estimate_bytes)
    _draw_utilization(util_ax, samples, t0)
    fig.suptitle(textwrap.fill(title or f"run {folder.name}", TITLE_WIDTH), fontsize="medium")
    fig.tight_layout()
    path = Path(out) if out else folder / PNG_NAME
    fig.savefig(path, format="png")
    return path
