"""Metrics while a training runs, summarised into :class:`~autodl.types.RunMetrics`.

Details: docs/reference/hardware.md#autodlmetrics.
"""

from __future__ import annotations

import fcntl
import json
import os
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import datetime, timezone
from pathlib import Path
from types import ModuleType
from typing import Any, Protocol

import psutil

from autodl.launch.base import Launcher
from autodl.types import LaunchHandle, RunMetrics
from autodl.untrusted import read_json_lines

BASELINE_FILE = "nvml_baseline.json"
"""In the run's folder: NVML compute processes on the booked devices just before launch (uuid -> {pid: bytes})."""


class Sampler(Protocol):
    source: str

    def sample(self) -> dict[str, Any] | None:
        """One sample (keys depend on the sampler; see :class:`NvmlSampler`, :class:`ProcessSampler`)."""

    def close(self) -> None: ...


def _uuid(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def nvml_processes(device_uuids: list[str], nvml: ModuleType | None = None, *,
                   unreadable: dict[str, str] | None = None) -> dict[str, dict[str, int | None]] | None:
    """Compute processes on each device now: ``{uuid: {pid: used bytes or None}}``; a device NVML
    cannot query is left out (never reported as empty) and, when ``unreadable`` is given, put there
    with why (``{uuid: 'GPU is lost (NVML error 15)'}``). None when NVML is not available at all."""
    from autodl.inventory.nvml import describe, load_nvml, shutdown

    try:
        nv = load_nvml(nvml)
        nv.nvmlInit()
    except Exception:  # noqa: BLE001 - no NVML: nothing to say
        return None
    out: dict[str, dict[str, int | None]] = {}
    try:
        for uuid in device_uuids:
            try:
                handle = nv.nvmlDeviceGetHandleByUUID(uuid)
                procs = nv.nvmlDeviceGetComputeRunningProcesses(handle)
            except Exception as exc:  # noqa: BLE001 - lost, no permission, ...: unknown, said by the caller
                if unreadable is not None:
                    unreadable[uuid] = describe(exc)
                continue
            out[uuid] = {str(p.pid): (int(p.usedGpuMemory) if p.usedGpuMemory is not None else None) for p in procs}
    finally:
        shutdown(nv)
    return out


class NvmlSampler:
    """Samples the booked devices through NVML, each device and field in its own guard.

    A sample: ``device_used_bytes`` (summed, v2 memory info), ``process_bytes`` (the run's processes:
    not in ``baseline``; summed), ``others_bytes`` (the baseline's processes still there), ``utilization_pct``
    (mean over the devices; None when any of them did not report it, so a lost or silent device never
    reads as the others' load), ``temperature_c`` (max of those that report it), ``power_w`` (summed,
    None when a device does not report it), and ``devices`` (the same per device UUID). A value NVML
    could not read is absent or None, never 0. A device that stops answering mid-run (lost from the
    bus, an error other than NotSupported) is said once in ``notes``.

    :param device_uuids: the booked devices' UUIDs (GPU- or MIG-).
    :param baseline: ``{uuid: {pid: bytes}}`` before launch (:data:`BASELINE_FILE`); without it the
        per-process split is unknown.
    :raises RuntimeError: when NVML cannot be initialised or finds none of the devices.
    """

    source = "nvml"

    def __init__(self, device_uuids: list[str], nvml: ModuleType | None = None,
                 baseline: dict[str, dict[str, int | None]] | None = None):
        from autodl.inventory.nvml import describe, load_nvml

        self.nvml = load_nvml(nvml)
        try:
            self.nvml.nvmlInit()
        except Exception as exc:  # noqa: BLE001
            raise RuntimeError(f"NVML unavailable: {describe(exc)}") from None
        self.baseline = baseline
        self.handles: dict[str, Any] = {}
        self.notes: list[str] = []
        self._failing: set[tuple[str, str]] = set()
        self._started = time.time()
        for uuid in device_uuids:
            try:
                self.handles[uuid] = self.nvml.nvmlDeviceGetHandleByUUID(uuid)
            except Exception as exc:  # noqa: BLE001
                self.notes.append(f"NVML does not find device {uuid}: {describe(exc)}")
        if not self.handles:
            self.close()
            raise RuntimeError("NVML finds none of the booked devices: " + "; ".join(self.notes))

    def _failed(self, uuid: str, key: str, exc: BaseException) -> None:
        """Say once per device and field that NVML stopped answering it (NotSupported is expected and silent)."""
        from autodl.inventory.nvml import NVML_ERROR_NOT_SUPPORTED, describe, device_failed, error_code

        if error_code(exc) == NVML_ERROR_NOT_SUPPORTED:
            return
        lost = device_failed(exc)
        mark = (uuid, "device" if lost else key)
        if mark in self._failing:
            return
        self._failing.add(mark)
        when = f"{time.time() - self._started:.0f} s into sampling"
        self.notes.append(f"device {uuid} failed {when} ({key}: {describe(exc)}): its figures from then on are unknown"
                          if lost else f"device {uuid}: NVML stopped answering {key} {when} ({describe(exc)}): unknown from then on")

    def _device(self, uuid: str, handle: Any) -> dict[str, Any]:
        from autodl.inventory.nvml import read_memory

        nv = self.nvml
        out: dict[str, Any] = {}
        try:
            out["used_bytes"] = read_memory(nv, handle)[1]
        except Exception as exc:  # noqa: BLE001
            out["used_bytes"] = None
            self._failed(uuid, "memory", exc)
        for key, call in (("utilization_pct", lambda: float(nv.nvmlDeviceGetUtilizationRates(handle).gpu)),
                          ("temperature_c", lambda: float(nv.nvmlDeviceGetTemperature(handle, getattr(nv, "NVML_TEMPERATURE_GPU", 0)))),
                          ("power_w", lambda: nv.nvmlDeviceGetPowerUsage(handle) / 1000.0)):   # mW -> W
            try:
                out[key] = call()
            except Exception as exc:  # noqa: BLE001 - NotSupported (MIG, some boards): unknown
                out[key] = None
                self._failed(uuid, key, exc)
        try:
            procs = {str(p.pid): p.usedGpuMemory for p in nv.nvmlDeviceGetComputeRunningProcesses(handle)}
        except Exception as exc:  # noqa: BLE001
            procs = None
            self._failed(uuid, "processes", exc)
        if procs is not None and self.baseline is not None and uuid in self.baseline:
            before = self.baseline[uuid]
            mine = [m for pid, m in procs.items() if pid not in before]
            others = [m for pid, m in procs.items() if pid in before]
            out["process_bytes"] = None if any(m is None for m in mine) else int(sum(mine))
            out["others_bytes"] = None if any(m is None for m in others) else int(sum(others))
        else:
            out["process_bytes"] = out["others_bytes"] = None
        return out

    def sample(self) -> dict[str, Any] | None:
        per = {uuid: self._device(uuid, h) for uuid, h in self.handles.items()}

        def total(key: str) -> float | None:
            vals = [d[key] for d in per.values()]
            return None if any(v is None for v in vals) else sum(vals)

        utils = [d["utilization_pct"] for d in per.values()]
        temps = [d["temperature_c"] for d in per.values() if d["temperature_c"] is not None]
        return {
            "device_used_bytes": total("used_bytes"),
            "process_bytes": total("process_bytes"),
            "others_bytes": total("others_bytes"),
            "utilization_pct": None if not utils or None in utils else round(sum(utils) / len(utils), 2),
            "temperature_c": max(temps) if temps else None,
            "power_w": total("power_w"),
            "devices": per,
        }

    def close(self) -> None:
        from autodl.inventory.nvml import shutdown

        shutdown(self.nvml)


class ProcessSampler:
    """Samples a process tree: ``rss_bytes`` (summed) and ``cpu_pct`` (% of one core, summed).

    Used when the run is on CPU (declared pool, no driver).
    """

    source = "process"

    def __init__(self, pid: int):
        self.pid = pid
        self._procs: dict[int, psutil.Process] = {}

    def sample(self) -> dict[str, Any] | None:
        try:
            root = psutil.Process(self.pid)
            tree = [root, *root.children(recursive=True)]
        except psutil.NoSuchProcess:
            return None
        rss = cpu = 0.0
        for p in tree:
            proc = self._procs.setdefault(p.pid, p)
            try:
                rss += proc.memory_info().rss
                cpu += proc.cpu_percent(interval=None)
            except (psutil.NoSuchProcess, psutil.AccessDenied):
                continue
        return {"rss_bytes": rss, "cpu_pct": cpu}

    def close(self) -> None:
        self._procs.clear()


def read_baseline(folder: str | Path | None) -> dict[str, dict[str, int | None]] | None:
    """The NVML baseline kept in a run folder by :func:`write_baseline`, or None."""
    path = Path(folder) / BASELINE_FILE if folder else None
    if path is None or not path.is_file():
        return None
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def write_baseline(folder: str | Path, device_uuids: list[str], nvml: ModuleType | None = None) -> bool:
    """Record which processes are on the booked devices before the run starts (see :class:`NvmlSampler`).

    Written once per run folder (a relaunch or reattach keeps the first). :returns: True when written.
    """
    path = Path(folder) / BASELINE_FILE
    if path.exists() or not device_uuids:
        return False
    procs = nvml_processes(device_uuids, nvml)
    if procs is None:
        return False
    path.write_text(json.dumps(procs))
    return True


def make_sampler(handle: LaunchHandle, device_uuids: list[str], *, folder: str | Path | None = None,
                 nvml: ModuleType | None = None, notes: list[str] | None = None,
                 prometheus_url: str | None = None) -> Sampler | None:
    """NVML for a GPU run whose devices have UUIDs and are on this host; else dcgm-exporter's series in Prometheus
    (a pod's GPUs, or a container's whose host NVML here cannot read: :class:`autodl.dcgm.DcgmSampler`) when
    ``prometheus_url`` is given; else the process tree of a local run; else None.

    :param folder: the run's folder, for the NVML baseline.
    :param notes: receives why NVML (or Prometheus) was not used, when it was not.
    :param prometheus_url: the Prometheus server scraping dcgm-exporter (``[autodl] prometheus_url``).
    """
    if handle.launcher == "kubernetes":
        if handle.on_cpu:
            return None
        if prometheus_url and handle.pod_name and handle.namespace:
            from autodl.dcgm import DcgmSampler

            return DcgmSampler(prometheus_url, namespace=handle.namespace, pod=handle.pod_name,
                               expected_devices=len(handle.device_ids) or 1)
        if notes is not None:
            notes.append("GPU samples of a pod are unknown: NVML here cannot see the pod's devices and no Prometheus "
                         "scraping dcgm-exporter is configured ([autodl] prometheus_url); the run's own peak comes "
                         "from the training's report through its log")
        return None
    if not handle.on_cpu and device_uuids:
        try:
            sampler = NvmlSampler(device_uuids, nvml=nvml, baseline=read_baseline(folder))
            if notes is not None:
                notes.extend(sampler.notes)
                if sampler.baseline is None:
                    notes.append("no NVML baseline from launch time: the run's own NVML memory is unknown")
            return sampler
        except Exception as exc:  # noqa: BLE001 - NVML missing or a UUID unknown: fall back
            if prometheus_url and handle.pid is None:  # a container on another host: its DCGM series
                from autodl.dcgm import DcgmSampler

                if notes is not None:
                    notes.append(f"NVML here cannot read the booked devices ({exc}); they are sampled from "
                                 "dcgm-exporter's series in Prometheus (device-wide, not the run's own memory)")
                return DcgmSampler(prometheus_url, device_uuids=device_uuids, expected_devices=len(device_uuids))
            if notes is not None:
                notes.append(f"NVML sampling unavailable ({exc}); device memory comes from the training's own report only")
    if handle.pid is not None:
        return ProcessSampler(handle.pid)
    return None


def _rows(path: str | Path | None) -> list[dict[str, Any]]:
    """The JSON objects of a per-step file the training wrote, read as untrusted (no links or FIFOs, at most
    :data:`autodl.untrusted.STEPS_LIMIT_BYTES`; torn lines of a killed run skipped); [] when unreadable."""
    if not path:
        return []
    try:
        rows, _cut = read_json_lines(path)
    except OSError:
        return []
    return rows


def _step_rows(path: str | Path | None) -> list[tuple[float, int]]:
    """``(t, samples)`` of each step line of ``path``, in file order (memory rows and malformed lines left out)."""
    rows = []
    for row in _rows(path):
        if "kind" in row:
            continue
        try:
            rows.append((float(row["t"]), int(row.get("samples") or 0)))
        except (ValueError, KeyError, TypeError):
            continue
    return rows


def _step_stats(rows: list[tuple[float, int]]) -> dict[str, float | int | None]:
    empty = {"steps": None, "step_time_s": None, "samples_per_s": None}
    if len(rows) < 2:
        return {**empty, "steps": len(rows) or None}
    deltas = [b[0] - a[0] for a, b in zip(rows, rows[1:])]
    steady = deltas[1:] or deltas
    steady.sort()
    median = steady[len(steady) // 2]
    span = rows[-1][0] - rows[0][0]
    samples = sum(n for _t, n in rows[1:])
    return {"steps": len(rows), "step_time_s": round(median, 6),
            "samples_per_s": round(samples / span, 3) if span > 0 and samples else None}


def read_steps(path: str | Path | None) -> dict[str, float | int | None]:
    """Step statistics from the JSON lines a training appended to ``$AUTODL_METRICS_FILE``.

    Each line is ``{"step": int, "t": unix seconds, "samples": batch size}`` written after a step
    (lines with ``"kind"`` — autodl's own memory reports — are not steps). The first interval is the
    warm-up (graph build, allocator growth) and is excluded from the median.

    :returns: ``steps``, ``step_time_s`` (median seconds per step), ``samples_per_s``; None values when
        the script reported fewer than two steps or nothing. Self-reported: see :func:`checked_steps`.
    """
    return _step_stats(_step_rows(path))


STEP_CLOCK_SLACK_S = 30.0
"""Seconds a step line's own time ``t`` may lie outside the run's measured window (its start to the end autodl saw):
a container's or pod's clock against the follower's (NTP keeps them within milliseconds; 30 s also allows an
unsynchronised node) and the follower's poll interval."""

MIN_STEP_SPAN_SHARE = 0.05
"""Least share of the run's measured wall time its reported steps must span (first line's ``t`` to the last's) for
their step time to be believed. A training spends most of its time in steps; one that imports Paddle for 20 s and
then steps for 2 s still spans 9 %; 100 lines printed at once (issue 23: "100 steps at 0.001 s/step") span ~0."""

MIN_CHECKED_RUN_S = 10.0
"""Runs shorter than this (measured seconds) are not held to :data:`MIN_STEP_SPAN_SHARE`: their start-up (the
interpreter, imports) is most of them."""


def _implausible_steps(rows: list[tuple[float, int]], started_ts: float, duration_s: float) -> str | None:
    """Why the step lines ``rows`` contradict what autodl measured of the run, or None."""
    ts = [t for t, _n in rows]
    if any(b < a for a, b in zip(ts, ts[1:])):
        return "their times go backwards"
    end = started_ts + max(0.0, duration_s)
    outside = sum(1 for t in ts if t < started_ts - STEP_CLOCK_SLACK_S or t > end + STEP_CLOCK_SLACK_S)
    if outside:
        return (f"{outside} of {len(ts)} are dated outside the run (it ran {duration_s:.0f} s from "
                f"{datetime.fromtimestamp(started_ts, timezone.utc).isoformat(timespec='seconds')})")
    span = ts[-1] - ts[0]
    if duration_s >= MIN_CHECKED_RUN_S and span < MIN_STEP_SPAN_SHARE * duration_s:
        return (f"they span {span:.3g} s of the run's measured {duration_s:.0f} s (less than "
                f"{MIN_STEP_SPAN_SHARE:.0%}: lines printed at once, not steps as they ran)")
    return None


def checked_steps(path: str | Path | None, *, started_ts: float | None,
                  duration_s: float) -> tuple[dict[str, float | int | None], list[str]]:
    """:func:`read_steps`'s figures, checked against what autodl measured of the run.

    The step lines are the training's own (self-reported, forgeable by any process of it). Their step time and
    throughput are kept only when they fit the run autodl measured (:func:`_implausible_steps`: ordered times,
    all within the run's window, spanning at least :data:`MIN_STEP_SPAN_SHARE` of it); else both are None (not
    known: the learning policy, :func:`autodl.policy.placement.observe`, learns nothing from them) and a note says
    why. The reported median is always kept as ``reported_step_time_s``.

    :param started_ts: the attempt's start (Unix seconds, the launcher's clock); None skips the window check.
    :param duration_s: the run's measured wall time so far, seconds.
    :returns: ``(fields for RunMetrics, notes)``.
    """
    rows = _step_rows(path)
    stats: dict[str, float | int | None] = {**_step_stats(rows), "reported_step_time_s": None}
    stats["reported_step_time_s"] = stats["step_time_s"]
    if stats["step_time_s"] is None or started_ts is None:
        return stats, []
    why = _implausible_steps(rows, started_ts, duration_s)
    if why is None:
        return stats, []
    note = (f"the training's {len(rows)} step lines were not believed: {why}; the step time they give "
            f"({stats['step_time_s']:g} s) is kept as reported_step_time_s only (self-reported figures do not win "
            "over measured ones)")
    return {**stats, "step_time_s": None, "samples_per_s": None}, [note]


def read_memory_reports(path: str | Path | None) -> dict[str, Any]:
    """The training's own peak reports (``"kind": "memory"`` lines of ``$AUTODL_METRICS_FILE``).

    :returns: ``allocated_peak_bytes`` / ``reserved_peak_bytes`` (max over devices, None when nothing was
        reported), ``peak_by_device`` (``{device: {"allocated_peak_bytes", "reserved_peak_bytes"}}``, the
        device being the UUID from the visibility variable, or Paddle's place such as ``cpu``), ``places``
        (``{device: Paddle place}``, e.g. ``gpu:0``), ``allocator_strategy`` (``FLAGS_allocator_strategy`` as the training saw it, when reported) and
        ``series`` (``[(t, reserved peak so far)]`` for the timeline).
    """
    per: dict[str, dict[str, int]] = {}
    places: dict[str, str] = {}
    series: list[tuple[float, int]] = []
    strategy = None
    running = 0
    for row in _rows(path):
        if row.get("kind") != "memory":
            continue
        device = str(row.get("device") or row.get("place") or "?")
        places[device] = str(row.get("place") or device)
        entry = per.setdefault(device, {"allocated_peak_bytes": 0, "reserved_peak_bytes": 0})
        for key in ("allocated_peak_bytes", "reserved_peak_bytes"):
            try:
                entry[key] = max(entry[key], int(row.get(key) or 0))
            except (TypeError, ValueError):
                continue
        strategy = row.get("allocator_strategy") or strategy
        running = max(running, entry["reserved_peak_bytes"])
        try:
            series.append((float(row["t"]), running))
        except (KeyError, TypeError, ValueError):
            pass
    return {
        "allocated_peak_bytes": max((e["allocated_peak_bytes"] for e in per.values()), default=None) if per else None,
        "reserved_peak_bytes": max((e["reserved_peak_bytes"] for e in per.values()), default=None) if per else None,
        "peak_by_device": per,
        "places": places,
        "allocator_strategy": strategy,
        "series": series,
    }


def _max(values: list[Any]) -> Any:
    known = [v for v in values if v is not None]
    return max(known) if known else None


def _process_peak(samples: list[dict[str, Any]], notes: list[str]) -> tuple[Any, int]:
    """The run's NVML per-process memory peak (None, with a note, when a sample lacks it) and how many lack it."""
    process_values = [s.get("process_bytes") for s in samples]
    process_peak = _max(process_values)
    missing = sum(1 for v in process_values if v is None)
    if process_peak is not None and missing:
        # a peak over samples some of which are unknown is only a lower bound: the run's own NVML peak is unknown
        notes.append(f"NVML per-process memory of the run unknown in {missing} of {len(samples)} samples "
                     f"(at least {process_peak / 2**30:.2f} GiB seen): its NVML peak is unknown")
        process_peak = None
    return process_peak, missing


def _peak_by_device(samples: list[dict[str, Any]], reports: dict[str, Any]) -> dict[str, dict[str, int | None]]:
    """Per device: the training's reported peaks and the run's NVML per-process peak (None where a sample lacked it)."""
    by_device: dict[str, dict[str, int | None]] = {k: dict(v) for k, v in reports["peak_by_device"].items()}
    unknown_on: set[str] = set()
    for s in samples:
        for uuid, d in (s.get("devices") or {}).items():
            if d.get("process_bytes") is None:
                unknown_on.add(uuid)
            else:
                entry = by_device.setdefault(uuid, {})
                entry["process_peak_bytes"] = max(entry.get("process_peak_bytes") or 0, d["process_bytes"])
    for uuid in unknown_on:
        if "process_peak_bytes" in by_device.get(uuid, {}):
            by_device[uuid]["process_peak_bytes"] = None
    return by_device


def _run_peak(reports: dict[str, Any], process_peak: Any, rss_peak: Any, *, source: str,
              samples: list[dict[str, Any]], steps_path: str | Path | None,
              notes: list[str]) -> tuple[Any, str | None]:
    """The run's peak memory and its source: Paddle's reserved peak unless far below the measured one, else measured."""
    measured = process_peak if process_peak is not None else (rss_peak if source == "process" else None)
    if reports["reserved_peak_bytes"] is not None and measured is not None and \
            measured > reports["reserved_peak_bytes"] + MEASURED_SLACK_BYTES:
        # the training's own figure is self-reported: one far below what autodl measured is not believed
        # (issue 23: 3 GiB of RSS held for 15 s was recorded as 3,800 B from a forged line)
        peak, peak_source = measured, ("nvml_process" if process_peak is not None else "rss")
        notes.append(f"the training reported a peak of {reports['reserved_peak_bytes']} B, {measured / 2**30:.2f} GiB "
                     f"below what was measured ({peak_source}): the measured figure is kept (self-reported figures "
                     "are not trusted over measured ones)")
    elif reports["reserved_peak_bytes"] is not None:
        peak, peak_source = reports["reserved_peak_bytes"], "paddle_reserved"
    elif process_peak is not None:
        peak, peak_source = process_peak, "nvml_process"
    elif rss_peak is not None and source == "process":
        peak, peak_source = rss_peak, "rss"
    else:
        peak, peak_source = None, None
        if samples or steps_path:
            notes.append("the run's own peak memory is unknown: no report from the training and no per-process NVML memory")
    return peak, peak_source


def summarise(samples: list[dict[str, Any]], *, source: str, duration_s: float, exit_code: int | None,
              samples_path: str | None = None, steps_path: str | Path | None = None,
              notes: list[str] | None = None, started_ts: float | None = None) -> RunMetrics:
    """Reduce samples and the training's own reports to a :class:`RunMetrics`.

    The run's peak is chosen in this order: Paddle's reserved peak (the training's report), NVML's
    per-process memory of the run, RSS (a CPU run's process tree); device-wide NVML "used" is kept
    apart in ``device_used_peak_bytes``. A reported peak far below the measured one, and step lines that
    contradict the measured run (:func:`checked_steps`), are not believed; ``self_reported`` names the
    figures that are the training's own word.

    :param started_ts: the attempt's start, Unix seconds (the step lines' window; None: not checked).
    """
    notes = list(notes or [])
    steps, step_notes = checked_steps(steps_path, started_ts=started_ts, duration_s=duration_s)
    notes += step_notes
    reports = read_memory_reports(steps_path)
    readings = [s["utilization_pct"] if "utilization_pct" in s else s.get("cpu_pct") for s in samples]
    util = [u for u in readings if u is not None]
    temp = [s["temperature_c"] for s in samples if s.get("temperature_c") is not None]
    power = [s["power_w"] for s in samples if s.get("power_w") is not None]
    process_peak, missing = _process_peak(samples, notes)
    rss_peak = _max([s.get("rss_bytes") for s in samples])
    by_device = _peak_by_device(samples, reports)
    peak, peak_source = _run_peak(reports, process_peak, rss_peak, source=source, samples=samples,
                                  steps_path=steps_path, notes=notes)
    if source == "nvml" and samples and missing == len(samples):
        notes.append("NVML per-process memory unavailable: only device-wide 'used' was sampled (not the run's own)")
    return RunMetrics(
        source=source,
        duration_s=round(duration_s, 3),
        exit_code=exit_code,
        samples=len(samples),
        peak_memory_bytes=int(peak) if peak is not None else None,
        peak_source=peak_source,
        allocated_peak_bytes=reports["allocated_peak_bytes"],
        reserved_peak_bytes=reports["reserved_peak_bytes"],
        process_peak_bytes=int(process_peak) if process_peak is not None else None,
        device_used_peak_bytes=_int(_max([s.get("device_used_bytes") for s in samples])),
        others_memory_bytes=_int(_max([s.get("others_bytes") for s in samples])),
        peak_by_device=by_device,
        mean_utilization_pct=round(sum(util) / len(util), 2) if util else None,
        max_utilization_pct=round(max(util), 2) if util else None,
        max_temperature_c=max(temp) if temp else None,
        mean_power_w=round(sum(power) / len(power), 2) if power else None,
        samples_path=samples_path,
        notes=notes,
        self_reported=_self_reported(reports, steps, peak_source),
        **steps,
    )


def _self_reported(reports: dict[str, Any], steps: dict[str, Any], peak_source: str | None) -> list[str]:
    """The names of RunMetrics fields holding the training's own word (its memory report and step lines)."""
    names = [k for k in ("allocated_peak_bytes", "reserved_peak_bytes") if reports.get(k) is not None]
    names += [k for k in ("steps", "step_time_s", "samples_per_s", "reported_step_time_s") if steps.get(k) is not None]
    if peak_source == "paddle_reserved":
        names.append("peak_memory_bytes")
    return names


MEASURED_SLACK_BYTES = 1 << 30
"""How far a measured peak (NVML per-process memory, or a CPU run's RSS) may lie above the training's own
reported reserved peak before the report is not believed, bytes: 1 GiB, what a process holds outside
Paddle's allocator (the CUDA context and library handles, 300-600 MiB per process in NVML; the Python
interpreter and Paddle's libraries on a CPU run), as :data:`autodl.oom.CONTEXT_SLACK_BYTES`."""


def _int(value: Any) -> int | None:
    return int(value) if value is not None else None


# ------------------------------------------------------------------ the samples file, shared with the launch's sampler
TAKEN_OVER_FILE = "collect.taken-over"
"""In the run's folder: a follower has taken over the sampling of this attempt (the launch's sampler,
:mod:`autodl.sampling`, stops)."""
SAMPLES_FILE = "samples.jsonl"
"""The run's samples, one JSON object a line, in its folder: written by the follower and, until it takes over, by the
launch's sampler (:mod:`autodl.sampling`)."""


@contextmanager
def locked_samples(folder: str | Path) -> Iterator[int]:
    """Hold an exclusive lock on the run's samples file (created if missing; never through a link) while the block
    runs; yields its descriptor, open for appending."""
    fd = os.open(Path(folder) / SAMPLES_FILE, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield fd
    finally:
        os.close(fd)  # closing releases the lock


def take_over(folder: str | Path) -> None:
    """A follower starts sampling this attempt: mark it, under the lock, so the launch's sampler writes no more."""
    with locked_samples(folder):
        (Path(folder) / TAKEN_OVER_FILE).touch()


class Follower:
    """Follows a launched training one poll at a time: streams new log lines to ``log_sink``, samples
    metrics into ``samples_path`` (JSON lines) while it runs, and summarises.

    :func:`follow` loops over :meth:`step` in the calling thread; the collect trigger calls :meth:`step`
    from the triggerer's event loop (in a thread), so no worker slot is held while a training runs.
    A sampler that raises is dropped with a note (and a log line): metrics never fail a run.

    :param notes: what could not be measured so far (e.g. from :func:`make_sampler`).
    :param offset: log byte offset to start from (a follower resumed after a triggerer restart).
    :param resume: reload the samples already in ``samples_path`` so the summary covers the whole run.
    :param ended_ts: when the training ended (epoch seconds), as an earlier follower of the same attempt saw it
        (:func:`autodl.steps.collect.known_end`); used when the launcher cannot tell and the training had ended before
        this follower's first poll (a collect cleared and run again).
    """

    def __init__(self, launcher: Launcher, handle: LaunchHandle, *, sampler: Sampler | None,
                 log_sink: Callable[[str], None] = print, samples_path: str | Path | None = None,
                 notes: list[str] | None = None, offset: int = 0, resume: bool = False,
                 ended_ts: float | None = None):
        self.launcher = launcher
        self.ended_ts: float | None = None
        self._earlier_end = ended_ts
        self._polls = 0
        self.handle = handle
        self.sampler = sampler
        self.first = sampler  # kept after a failing sampler is dropped: its notes (e.g. a device lost mid-run)
        self.source = sampler.source if sampler else "none"
        self.log_sink = log_sink
        self.samples_path = samples_path
        self.notes = list(notes or [])
        self.offset = offset
        self.pending = ""
        self.samples: list[dict[str, Any]] = []
        self.exit_code: int | None = None
        self.facts = None
        if handle.steps_path is None and samples_path:  # a container or pod: its facts travel in its log
            from autodl.runfacts import FactSink

            folder = Path(samples_path).parent
            self.facts = FactSink(folder / "runfacts.jsonl", folder / "report.json")
        if samples_path:  # the launch's sampler (autodl.sampling) stops: what it wrote is read below
            take_over(Path(samples_path).parent)
        if resume:
            self.samples = _rows(samples_path)
        self._out = open(samples_path, "a") if samples_path else None

    def step(self) -> int | None:
        """One poll: the exit code once the training ended (its last log lines flushed), else None."""
        code = self.launcher.poll(self.handle)
        self._polls += 1
        self._read_logs()
        if self.sampler is not None and code is None:
            try:
                s = self.sampler.sample()
            except Exception as exc:  # noqa: BLE001 - a metrics failure never fails the run
                note = f"metrics sampler ({self.sampler.source}) failed and was stopped: {type(exc).__name__}: {exc}"
                self.notes.append(note)
                self.log_sink(f"autodl: {note}")
                _close(self.sampler)
                self.sampler = None
                s = None
            if s is not None:
                s["t"] = time.time()
                self.samples.append(s)
                if self._out:
                    self._out.write(json.dumps(s) + "\n")
                    self._out.flush()
        if code is not None:
            self._read_logs()
            for line in self.pending.split("\n"):
                if line:
                    self._line(line)
            self.pending = ""
            self.exit_code = code
            if self.ended_ts is None:
                self.ended_ts = self._end_time()
        return code

    def _end_time(self) -> float:
        """When the training ended, epoch seconds: the launcher's own fact (exit file, ``FinishedAt``), else what an
        earlier follower saw when this one found it already ended, else now (seen within one poll of its end)."""
        told = getattr(self.launcher, "ended_at", None)
        try:
            ended = told(self.handle) if told is not None else None
        except Exception:  # noqa: BLE001 - the engine not answering: the other sources
            ended = None
        if ended is None and self._polls == 1:
            ended = self._earlier_end
        return float(ended) if ended is not None else time.time()

    def _read_logs(self) -> None:
        text, self.offset = self.launcher.read_logs(self.handle, self.offset)
        if text:
            self.pending += text
            *lines, self.pending = self.pending.split("\n")
            for line in lines:
                self._line(line)

    def _line(self, line: str) -> None:
        """One log line: to ``log_sink``, except a run fact of a container or pod, which is kept instead."""
        if self.facts is None:
            self.log_sink(line)
            return
        from autodl.runfacts import split_fact

        text, fact = split_fact(line)
        if text.strip():
            self.log_sink(text)
        if fact is not None:
            self.facts.take(fact)

    def summary(self, exit_code: int | None = None) -> RunMetrics:
        """What the run did so far (``exit_code`` None while it still runs or when it was interrupted)."""
        said = [n for n in getattr(self.first, "notes", None) or [] if n not in self.notes]
        facts = self.facts.notes() if self.facts is not None else []
        steps_path = self.handle.steps_path or (self.facts.metrics_path if self.facts is not None else None)
        end = self.ended_ts if self.ended_ts is not None else time.time()
        return summarise(self.samples, source=self.source, duration_s=max(0.0, end - self.handle.started_at.timestamp()),
                         exit_code=exit_code, samples_path=str(self.samples_path) if self.samples_path else None,
                         steps_path=steps_path, notes=[*self.notes, *said, *facts],
                         started_ts=self.handle.started_at.timestamp())

    def close(self) -> None:
        closer = getattr(self.launcher, "close_logs", None)
        if closer is not None:
            try:
                closer(self.handle)
            except Exception:  # noqa: BLE001 - a log stream that will not close never matters to the run
                pass
        if self._out:
            self._out.close()
            self._out = None
        if self.sampler is not None:
            _close(self.sampler)
            self.sampler = None


def follow(
    launcher: Launcher,
    handle: LaunchHandle,
    *,
    sampler: Sampler | None,
    log_sink: Callable[[str], None] = print,
    interval_s: float = 1.0,
    samples_path: str | Path | None = None,
    partial_sink: Callable[[RunMetrics], None] | None = None,
    notes: list[str] | None = None,
    on_tick: Callable[[], None] | None = None,
    resume: bool = False,
    ended_ts: float | None = None,
) -> RunMetrics:
    """Follow a launched training until it exits: stream its log lines to ``log_sink``, sample metrics
    every ``interval_s`` seconds into ``samples_path`` (JSON lines), and summarise (see :class:`Follower`).

    :param partial_sink: called with the metrics gathered so far (exit code None) when following is
        interrupted (the task killed, Ctrl-C, ``on_tick`` raised), before the interruption propagates.
    :param notes: what could not be measured so far (e.g. from :func:`make_sampler`).
    :param on_tick: called after each poll while the training runs (heartbeats, time limits); what it
        raises ends the following.
    :param resume: and ``ended_ts``: as :class:`Follower` takes them (a collect of an attempt followed before).
    :returns: :class:`RunMetrics` with the exit code; duration from the handle's start to the training's end
        (:meth:`Follower._end_time`), not to when this follower saw it.
    """
    follower = Follower(launcher, handle, sampler=sampler, log_sink=log_sink, samples_path=samples_path, notes=notes,
                        resume=resume, ended_ts=ended_ts)
    try:
        while True:
            code = follower.step()
            if code is not None:
                break
            if on_tick is not None:
                on_tick()
            time.sleep(interval_s)
    except BaseException:
        if partial_sink is not None:
            partial_sink(follower.summary(None))
        raise
    finally:
        follower.close()
    return follower.summary(code)


def _close(sampler: Sampler) -> None:
    try:
        sampler.close()
    except Exception:  # noqa: BLE001 - closing a sampler never matters to the run
        pass


def rank_logs(handle: LaunchHandle) -> list[Path]:
    """The per-rank logs ``paddle.distributed.launch`` wrote for a local run (``workerlog.N`` in its log folder)."""
    if not handle.log_path:
        return []
    ranks = Path(handle.log_path).with_suffix(".ranks")
    return sorted(ranks.glob("workerlog.*")) if ranks.is_dir() else []


def explain_oom(metrics: RunMetrics, handle: LaunchHandle, folder: str | Path) -> dict[str, Any] | None:
    """The :class:`autodl.oom.OOMReport` (as a dict) of a run that died of an out-of-memory error, else None.

    Reads the run's log and per-rank logs, its own memory reports, NVML's other-process memory, and
    the profile kept in the run folder (for the batch that would fit).
    """
    from autodl.oom import explain, read_tails
    from autodl.types import ResourceProfile

    texts = read_tails([p for p in [handle.log_path, *rank_logs(handle)] if p])
    profile = None
    profile_file = Path(folder) / "profile.json"
    if profile_file.is_file():
        try:
            profile = ResourceProfile.model_validate(json.loads(profile_file.read_text())["profile"])
        except (ValueError, KeyError, TypeError):
            profile = None
    # the host's memory bounds a host allocation only for a run on this host (a container or pod has its own limit)
    host_total = psutil.virtual_memory().total if handle.launcher == "local" else None
    report = explain(texts, profile=profile, memory_reports=read_memory_reports(handle.steps_path or Path(folder) / "runfacts.jsonl"),
                     others_bytes=metrics.others_memory_bytes, host_total_bytes=host_total, run_on_cpu=handle.on_cpu)
    return report.model_dump(mode="json") if report else None


def finish(metrics: RunMetrics, handle: LaunchHandle, folder: str | Path, *,
           log: Callable[[str], None] = print) -> RunMetrics:
    """After the training ended: say what could not be measured, explain an out-of-memory exit, draw
    the timeline PNG beside the run's log. Never raises: each part that fails is logged and skipped.

    :returns: ``metrics`` with ``oom`` filled in when the training died of one.
    """
    for note in metrics.notes:
        log(f"metrics: {note}")
    if metrics.exit_code not in (0, None):
        try:
            oom = explain_oom(metrics, handle, folder)
        except Exception as exc:  # noqa: BLE001
            oom = None
            log(f"could not read the training's log for an out-of-memory error: {type(exc).__name__}: {exc}")
        if oom:
            log(f"OUT OF MEMORY: {oom['explanation']}")
            metrics = metrics.model_copy(update={"oom": oom})
    try:
        from autodl.timeline import plot_run

        log(f"timeline: {plot_run(folder)}")
    except FileNotFoundError:
        pass
    except Exception as exc:  # noqa: BLE001 - a picture never fails a run
        log(f"could not draw the timeline: {type(exc).__name__}: {exc}")
    return metrics


def run_processes_on_devices(device_uuids: list[str], baseline: dict[str, dict[str, Any]] | None,
                             nvml: ModuleType | None = None, *,
                             unreadable: dict[str, str] | None = None) -> dict[str, list[str]] | None:
    """The run's processes still on its devices per NVML: ``{uuid: [pid, ...]}`` for devices that have any.

    The run's are the processes not in the launch-time ``baseline``. None when it cannot be told
    (no NVML here, or no baseline). A device NVML cannot query is not in the answer; it goes into
    ``unreadable`` (``{uuid: why}``) when that is given — it was not seen empty.
    """
    if baseline is None:
        return None
    procs = nvml_processes(device_uuids, nvml, unreadable=unreadable)
    if procs is None:
        return None
    out = {}
    for uuid in device_uuids:
        mine = [pid for pid in procs.get(uuid, {}) if pid not in baseline.get(uuid, {})]
        if mine:
            out[uuid] = mine
    return out


def wait_devices_clear(device_uuids: list[str], folder: str | Path, *, timeout_s: float = 30.0, poll_s: float = 0.5,
                       nvml: ModuleType | None = None, log: Callable[[str], None] = print) -> bool:
    """Before a lease is freed: wait until NVML shows none of the run's processes on its devices.

    :param timeout_s: how long a stopped process may take to release its device (the driver frees a
        context when the process is gone; a process stuck in the driver never does).
    :returns: True when the devices are clear, or when NVML cannot tell (no NVML, no baseline: said in
        the log); False when the run's processes still hold a device after ``timeout_s``.
    """
    if not device_uuids:
        return True
    baseline = read_baseline(folder)
    deadline = time.monotonic() + timeout_s
    while True:
        unreadable: dict[str, str] = {}
        left = run_processes_on_devices(device_uuids, baseline, nvml, unreadable=unreadable)
        if left is None:
            log("devices not checked empty before release: " + ("no NVML here" if baseline is not None
                                                                  else "no launch-time NVML baseline"))
            return True
        checked = [u for u in device_uuids if u not in unreadable]
        if not left:
            if checked:
                log(f"devices {', '.join(checked)} checked empty (NVML): none of the run's processes left")
            if unreadable:
                log("devices not checked empty before release, NVML cannot query them: "
                    + "; ".join(f"{u}: {why}" for u, why in unreadable.items()))
            return True
        if time.monotonic() >= deadline:
            log("devices still hold the run's processes after it was stopped: "
                + "; ".join(f"{u}: pid {', '.join(p)}" for u, p in left.items()))
            return False
        time.sleep(poll_s)
