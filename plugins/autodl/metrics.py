"""Metrics while a training runs: NVML samples of the booked devices (utilization, memory, temperature, power),
or the process tree's CPU and RSS when no GPU is present; summarised into :class:`~autodl.types.RunMetrics`.

The time series is written as JSON lines to a file next to the run's log; only the summary travels
(XCom, record).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Protocol

import psutil

from autodl.launch.base import Launcher
from autodl.types import LaunchHandle, RunMetrics


class Sampler(Protocol):
    source: str

    def sample(self) -> dict[str, float] | None:
        """One sample: ``memory_bytes``, ``utilization_pct`` and optionally ``temperature_c``, ``power_w``."""

    def close(self) -> None: ...


class NvmlSampler:
    """Samples the booked GPUs through NVML: memory used (bytes, summed), utilization (%, mean),
    temperature (°C, max), power (W, summed).

    :param device_uuids: the booked devices' UUIDs (a MIG UUID samples memory only).
    :raises RuntimeError: when NVML cannot be initialised (use :class:`ProcessSampler` instead).
    """

    source = "nvml"

    def __init__(self, device_uuids: list[str], nvml: ModuleType | None = None):
        if nvml is None:
            import pynvml as nvml
        self.nvml = nvml
        try:
            nvml.nvmlInit()
        except nvml.NVMLError as exc:
            raise RuntimeError(f"NVML unavailable: {exc}") from None
        self.handles = [nvml.nvmlDeviceGetHandleByUUID(u) for u in device_uuids]

    def sample(self) -> dict[str, float] | None:
        nv = self.nvml
        mem = util = power = 0.0
        temp = None
        for h in self.handles:
            mem += nv.nvmlDeviceGetMemoryInfo(h).used
            try:
                util += nv.nvmlDeviceGetUtilizationRates(h).gpu
            except nv.NVMLError:
                pass
            try:
                t = nv.nvmlDeviceGetTemperature(h, nv.NVML_TEMPERATURE_GPU)
                temp = t if temp is None else max(temp, t)
            except nv.NVMLError:
                pass
            try:
                power += nv.nvmlDeviceGetPowerUsage(h) / 1000.0  # milliwatts -> W
            except nv.NVMLError:
                pass
        out = {"memory_bytes": mem, "utilization_pct": util / max(1, len(self.handles)), "power_w": power}
        if temp is not None:
            out["temperature_c"] = float(temp)
        return out

    def close(self) -> None:
        try:
            self.nvml.nvmlShutdown()
        except Exception:  # noqa: BLE001 - shutdown failures do not matter
            pass


class ProcessSampler:
    """Samples a process tree: RSS (bytes, summed) and CPU utilization (% of one core, summed).

    Used when the run is on CPU (declared pool, no driver).
    """

    source = "process"

    def __init__(self, pid: int):
        self.pid = pid
        self._procs: dict[int, psutil.Process] = {}

    def sample(self) -> dict[str, float] | None:
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
        return {"memory_bytes": rss, "utilization_pct": cpu}

    def close(self) -> None:
        self._procs.clear()


def make_sampler(handle: LaunchHandle, device_uuids: list[str]) -> Sampler | None:
    """NVML for a GPU run whose devices have UUIDs, else the process tree of a local run, else None."""
    if not handle.on_cpu and device_uuids:
        try:
            return NvmlSampler(device_uuids)
        except Exception:  # noqa: BLE001 - NVML missing or a UUID unknown: fall back
            pass
    if handle.pid is not None:
        return ProcessSampler(handle.pid)
    return None


def read_steps(path: str | Path | None) -> dict[str, float | int | None]:
    """Step statistics from the JSON lines a training appended to ``$AUTODL_METRICS_FILE``.

    Each line is ``{"step": int, "t": unix seconds, "samples": batch size}`` written after a step.
    The first interval is the warm-up (graph build, allocator growth) and is excluded from the median.

    :returns: ``steps``, ``step_time_s`` (median seconds per step), ``samples_per_s``; None values when
        the script reported fewer than two steps or nothing.
    """
    empty = {"steps": None, "step_time_s": None, "samples_per_s": None}
    if not path or not Path(path).is_file():
        return empty
    rows = []
    for line in Path(path).read_text().splitlines():
        try:
            row = json.loads(line)
            rows.append((float(row["t"]), int(row.get("samples") or 0)))
        except (ValueError, KeyError, TypeError):
            continue  # a torn last line of a killed run
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


def summarise(samples: list[dict[str, float]], *, source: str, duration_s: float, exit_code: int | None,
              samples_path: str | None = None, steps_path: str | Path | None = None) -> RunMetrics:
    """Reduce samples to peak memory (bytes), mean/max utilization (%), max temperature, mean power,
    and the training's own step reports (:func:`read_steps`)."""
    mem = [s["memory_bytes"] for s in samples if "memory_bytes" in s]
    util = [s["utilization_pct"] for s in samples if "utilization_pct" in s]
    temp = [s["temperature_c"] for s in samples if "temperature_c" in s]
    power = [s["power_w"] for s in samples if "power_w" in s]
    return RunMetrics(
        source=source,
        duration_s=round(duration_s, 3),
        exit_code=exit_code,
        samples=len(samples),
        peak_memory_bytes=int(max(mem)) if mem else None,
        mean_utilization_pct=round(sum(util) / len(util), 2) if util else None,
        max_utilization_pct=round(max(util), 2) if util else None,
        max_temperature_c=max(temp) if temp else None,
        mean_power_w=round(sum(power) / len(power), 2) if power else None,
        samples_path=samples_path,
        **read_steps(steps_path),
    )


class Follower:
    """Follows a launched training one poll at a time: streams new log lines to ``log_sink``, samples
    metrics into ``samples_path`` (JSON lines) while it runs, and summarises at the end.

    :func:`follow` loops over :meth:`step` in the calling thread; the collect trigger calls :meth:`step`
    from the triggerer's event loop (in a thread), so no worker slot is held while a training runs.

    :param offset: log byte offset to start from (a follower resumed after a triggerer restart).
    :param resume: reload the samples already in ``samples_path`` so the summary covers the whole run.
    """

    def __init__(self, launcher: Launcher, handle: LaunchHandle, *, sampler: Sampler | None,
                 log_sink: Callable[[str], None] = print, samples_path: str | Path | None = None,
                 offset: int = 0, resume: bool = False):
        self.launcher = launcher
        self.handle = handle
        self.sampler = sampler
        self.log_sink = log_sink
        self.samples_path = samples_path
        self.offset = offset
        self.pending = ""
        self.samples: list[dict[str, float]] = []
        self.exit_code: int | None = None
        if resume and samples_path and Path(samples_path).is_file():
            for line in Path(samples_path).read_text().splitlines():
                try:
                    self.samples.append(json.loads(line))
                except ValueError:
                    continue  # a torn last line
        self._out = open(samples_path, "a") if samples_path else None

    def step(self) -> int | None:
        """One poll: the exit code once the training ended (its last log lines flushed), else None."""
        code = self.launcher.poll(self.handle)
        self._read_logs()
        if self.sampler is not None and code is None:
            s = self.sampler.sample()
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
                    self.log_sink(line)
            self.pending = ""
            self.exit_code = code
        return code

    def _read_logs(self) -> None:
        text, self.offset = self.launcher.read_logs(self.handle, self.offset)
        if text:
            self.pending += text
            *lines, self.pending = self.pending.split("\n")
            for line in lines:
                self.log_sink(line)

    def summary(self, exit_code: int | None = None) -> RunMetrics:
        """What the run did so far (``exit_code`` None while it still runs or when it was interrupted)."""
        return summarise(self.samples, source=self.sampler.source if self.sampler else "none",
                         duration_s=time.time() - self.handle.started_at.timestamp(), exit_code=exit_code,
                         samples_path=str(self.samples_path) if self.samples_path else None,
                         steps_path=self.handle.steps_path)

    def close(self) -> None:
        if self._out:
            self._out.close()
            self._out = None
        if self.sampler is not None:
            self.sampler.close()


def follow(
    launcher: Launcher,
    handle: LaunchHandle,
    *,
    sampler: Sampler | None,
    log_sink: Callable[[str], None] = print,
    interval_s: float = 1.0,
    samples_path: str | Path | None = None,
    partial_sink: Callable[[RunMetrics], None] | None = None,
    on_tick: Callable[[], None] | None = None,
) -> RunMetrics:
    """Follow a launched training until it exits: stream its log lines to ``log_sink``, sample metrics
    every ``interval_s`` seconds into ``samples_path`` (JSON lines), and summarise.

    :param partial_sink: called with the metrics gathered so far (exit code None) when following is
        interrupted (the task killed, Ctrl-C, ``on_tick`` raised), before the interruption propagates.
    :param on_tick: called after each poll while the training runs (heartbeats, time limits); what it
        raises ends the following.
    :returns: :class:`RunMetrics` with the exit code; duration counts from the handle's start.
    """
    follower = Follower(launcher, handle, sampler=sampler, log_sink=log_sink, samples_path=samples_path)
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
