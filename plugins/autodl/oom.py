"""Out-of-memory exits explained: what the training needed vs what was free, whose memory it was, what batch would fit.

Details: docs/reference/estimator.md#autodloom.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal, TypeAlias

from pydantic import BaseModel, ConfigDict, Field

from autodl.types import ResourceProfile

GiB = 1 << 30

UNITS = {"B": 0, "kB": 1, "KB": 1, "MB": 2, "GB": 3, "TB": 4, "PB": 5, "EB": 6,
         "bytes": 0, "KiB": 1, "MiB": 2, "GiB": 3, "TiB": 4, "PiB": 5}
"""Paddle's ``HumanReadableSize`` suffixes and PyTorch's ``format_size`` ones, and their power of 1024."""

PADDLE_DEFAULT_STRATEGY = "auto_growth"
"""``FLAGS_allocator_strategy``'s default (Paddle >= 2.0; ``paddle.get_flags`` in Paddle 3.3.1 says the same)."""

CONTEXT_SLACK_BYTES = 1 * GiB
"""Memory a process holds outside Paddle's allocator (CUDA context, library handles): NVML shows
300-600 MiB per process for the context alone; 1 GiB leaves room for cuDNN/cuBLAS handles. Used only
to tell another process's memory from the run's own when nothing else says whose it is."""

TAIL_BYTES = 1 << 20
"""How much of the end of each log is searched (the fatal error is printed last)."""

def _size(name: str) -> str:
    return rf"(?P<{name}_n>[0-9.]+)\s*(?P<{name}_u>[kKMGTPE]?B)\b"


_DEV = r"(?P<dev>[A-Za-z_]+[ :]\d+)"
_PATTERNS: list[tuple[str, re.Pattern[str]]] = [
    ("device", re.compile(rf"Out of memory error on {_DEV}\.\s*Cannot allocate {_size('req')} memory on [^,]+,\s*"
                          rf"{_size('used')} memory has been allocated and available memory is only {_size('free')}")),
    ("custom", re.compile(rf"Out of memory error on {_DEV}\.\s*Cannot allocate {_size('req')} memory on [^,]+,\s*"
                          rf"available memory is only {_size('free')}")),
    ("custom_total", re.compile(rf"Out of memory error on {_DEV}\.\s*total memory is {_size('total')}, used memory is "
                                rf"{_size('used')}, available memory is only {_size('free')}")),
    ("host", re.compile(rf"Cannot allocate {_size('req')} in (?P<dev>[^,]+),\s*available {_size('free')},\s*"
                        rf"total {_size('total')},\s*used {_size('used')}")),
    ("host_alloc", re.compile(r"Fail to alloc memory of (?P<req_bytes>\d+) size(?:, error code is (?P<errno>\d+))?")),
]
def _tsize(name: str) -> str:
    """A size as PyTorch's ``format_size`` prints it: ``20.00 MiB``, ``512 bytes`` (c10/cuda/CUDACachingAllocator.cpp)."""
    return rf"(?P<{name}_n>[0-9.]+)\s*(?P<{name}_u>bytes|[KMGTP]iB)\b"


# PyTorch's CUDA caching allocator (the GPU check's framework-neutral training runs on it, issue 22):
# >= 2.2: "CUDA out of memory. Tried to allocate 20.00 MiB. GPU 0 has a total capacity of 79.15 GiB of which
# 5.06 MiB is free."; older: "... Tried to allocate 36.00 MiB (GPU 0; 7.93 GiB total capacity; 130.35 MiB
# already allocated; 47.06 MiB free; 188.00 MiB reserved in total by PyTorch)".
_PATTERNS += [
    ("device", re.compile(rf"CUDA out of memory\. Tried to allocate {_tsize('req')}\. (?P<dev>GPU \d+) has a total "
                          rf"capacity of {_tsize('total')} of which {_tsize('free')} is free")),
    ("device", re.compile(rf"CUDA out of memory\. Tried to allocate {_tsize('req')} \((?P<dev>GPU \d+); "
                          rf"{_tsize('total')} total capacity; {_tsize('used')} already allocated; {_tsize('free')} free")),
]
HOST_KINDS = frozenset({"host", "host_alloc"})
"""Messages about host (CPU) memory: on a GPU run they say nothing about the GPU's memory."""

_GENERIC = re.compile(r"ResourceExhaustedError|\(ResourceExhausted\)|(?i:\bout of memory\b)")
_ERRNO = {12: "ENOMEM: the process's memory limit (ulimit -v / RLIMIT_AS, a cgroup) or the host's memory ran out"}
"""C ``errno`` values Paddle's CPU allocator reports (``errno.h``)."""


def to_bytes(number: str, unit: str) -> int:
    """``('1.234375', 'GB')`` -> bytes (powers of 1024, as Paddle prints them)."""
    return int(round(float(number) * 1024 ** UNITS.get(unit, UNITS.get(unit.upper(), 0))))


StrategySource: TypeAlias = Literal["training", "environment", "paddle default"]
"""Where ``FLAGS_allocator_strategy`` was read."""
Verdict: TypeAlias = Literal["busy", "too_big", "unknown"]
"""Whose memory filled the device: other processes' (busy), the run's own (too big), or cannot be told."""


class OOMReport(BaseModel):
    """What an out-of-memory exit says; every byte count in bytes, None when the message did not say."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    device: str = Field(description="Paddle's device in the message, e.g. 'GPU 0', 'npu:0'.")
    requested_bytes: int | None = Field(description="The allocation that failed.")
    free_bytes: int | None = Field(description="Memory available on the device when it failed.")
    device_used_bytes: int | None = Field(description="Device-wide used (every process) when it failed.")
    device_total_bytes: int | None = None
    run_bytes: int | None = Field(None, description="The run's own memory on that device (Paddle's reserved peak).")
    others_bytes: int | None = Field(None, description="Other processes' memory on the run's devices (NVML).")
    wanted_bytes: int | None = Field(None, description="What the run needed at its batch: its own memory + the request.")
    fixed_bytes: int = Field(0, description="The batch-independent part used to rescale (from the profile).")
    allocator_strategy: str
    allocator_strategy_source: StrategySource
    verdict: Verdict
    memory: Literal["device", "host"] = Field("device", description="Whose allocator failed: the device's, or the "
                                                                    "host's (CPU) memory.")
    batch_size: int | None = None
    fitting_batch_size: int | None = Field(None, description="Largest per-device batch that would have fit (at most).")
    message: str = Field(description="The error text found in the log.")
    explanation: str


def find_oom(texts: list[str]) -> tuple[str, dict[str, Any]] | None:
    """The last Paddle out-of-memory error in ``texts``: (kind, parsed fields), or None."""
    found: tuple[int, int, str, dict[str, Any], str] | None = None
    for order, text in enumerate(texts):
        for kind, pattern in _PATTERNS:
            for m in pattern.finditer(text):
                g = m.groupdict()
                fields: dict[str, Any] = {"device": " ".join((g.get("dev") or "cpu").split())}
                for key in ("req", "used", "free", "total"):
                    if g.get(f"{key}_n"):
                        fields[key] = to_bytes(g[f"{key}_n"], g[f"{key}_u"])
                if g.get("req_bytes"):
                    fields["req"] = int(g["req_bytes"])
                if g.get("errno"):
                    fields["errno"] = int(g["errno"])
                if found is None or (order, m.start()) >= (found[0], found[1]):
                    found = (order, m.start(), kind, fields, " ".join(m.group(0).split()))
    if found is not None:
        _o, _s, kind, fields, message = found
        return kind, {**fields, "message": message}
    for text in reversed(texts):
        last: re.Match[str] | None = None
        for last in _GENERIC.finditer(text):
            pass
        if last is not None and ("ResourceExhaustedError" in text or "(ResourceExhausted)" in text):
            line = text[text.rfind("\n", 0, last.start()) + 1:
                        text.find("\n", last.end()) if "\n" in text[last.end():] else len(text)]
            return "generic", {"device": "?", "message": line.strip()[:300]}
    return None


def read_tails(paths: list[str | Path]) -> list[str]:
    """The last :data:`TAIL_BYTES` of each existing file, as text."""
    out = []
    for p in paths:
        path = Path(p)
        if not path.is_file():
            continue
        with open(path, "rb") as fh:
            fh.seek(max(0, path.stat().st_size - TAIL_BYTES))
            out.append(fh.read().decode("utf-8", errors="replace"))
    return out


def _place_of(device: str) -> str:
    """'GPU 0' -> 'gpu:0', 'npu:0' -> 'npu:0' (Paddle's place spelling, as the start-up hook reports it)."""
    name, _, index = device.replace(":", " ").partition(" ")
    return f"{name.lower()}:{index.strip()}" if index.strip() else name.lower()


def explain(
    texts: list[str],
    *,
    profile: ResourceProfile | None = None,
    memory_reports: dict[str, Any] | None = None,
    others_bytes: int | None = None,
    device_total_bytes: int | None = None,
    env: Mapping[str, str] | None = None,
    host_total_bytes: int | None = None,
    run_on_cpu: bool | None = None,
) -> OOMReport | None:
    """An :class:`OOMReport` when ``texts`` (the training's logs) hold a Paddle out-of-memory error.

    :param profile: the run's profile (batch size; batch-independent bytes) for the batch that would fit.
    :param memory_reports: :func:`autodl.metrics.read_memory_reports` of the run (the run's own memory
        per device, and ``FLAGS_allocator_strategy`` as the training saw it).
    :param others_bytes: other processes' memory on the run's devices (NVML baseline), when known.
    :param device_total_bytes: the device's own memory, when the message does not give it.
    :param env: the training's environment, for ``FLAGS_allocator_strategy`` when the training did not report it.
    :param host_total_bytes: the host's memory, for a host (CPU) allocation failure that does not give a total.
    :param run_on_cpu: False for a run on an accelerator: a host allocation failure then says nothing about the
        device's memory, so ``wanted_bytes`` stays None and the device estimate is not raised from it.
    :returns: the report, or None when no out-of-memory error is in the logs.
    """
    hit = find_oom(texts)
    if hit is None:
        return None
    kind, f = hit
    reports = memory_reports or {}
    strategy, strategy_source = _allocator_strategy(reports, os.environ if env is None else env)
    requested, free, used = f.get("req"), f.get("free"), f.get("used")
    host = kind in HOST_KINDS
    total = f.get("total") or (used + free if used is not None and free is not None else None) or \
        (host_total_bytes if host else device_total_bytes)
    if used is None and total is not None and free is not None:
        used = total - free
    run = _run_bytes(reports, _place_of(f["device"]), kind)
    verdict, others = _whose_memory(requested, free, used, total, run, others_bytes)
    if host and run_on_cpu is False:
        wanted = None   # host memory of a GPU run: not the device's need
    else:
        wanted = _wanted_bytes(kind, requested, used, run, others)
    batch = profile.batch_size if profile else None
    fixed = 0
    if profile is not None:
        fixed = max(0, profile.peak_memory_bytes - profile.breakdown.activations_bytes)
    fitting = _fitting_batch_size(batch, wanted, fixed, total, others, verdict)
    report = OOMReport(
        device=f["device"], requested_bytes=requested, free_bytes=free, device_used_bytes=used, device_total_bytes=total,
        run_bytes=run, others_bytes=others, wanted_bytes=wanted, fixed_bytes=fixed, allocator_strategy=strategy,
        allocator_strategy_source=strategy_source, verdict=verdict, memory="host" if host else "device", batch_size=batch, fitting_batch_size=fitting,
        message=f["message"], explanation="",
    )
    return report.model_copy(update={"explanation": _explanation(report, f.get("errno"), run_on_cpu)})


def _allocator_strategy(reports: dict[str, Any], env: Mapping[str, str]) -> tuple[str, StrategySource]:
    """``FLAGS_allocator_strategy`` and where it was read: the training's own report, else its environment,
    else Paddle's default."""
    if reports.get("allocator_strategy"):
        return str(reports["allocator_strategy"]), "training"
    if env.get("FLAGS_allocator_strategy"):
        return env["FLAGS_allocator_strategy"], "environment"
    return PADDLE_DEFAULT_STRATEGY, "paddle default"


def _run_bytes(reports: dict[str, Any], place: str, kind: str) -> int | None:
    """The run's own memory (Paddle's reserved peak) on the failed device ``place``: the report of that device (by
    name or by its place), else the only device reported when it is not the host's and the failure is not."""
    run = None
    places = reports.get("places") or {}
    for device, peaks in (reports.get("peak_by_device") or {}).items():
        if device == place or places.get(device) == place:
            run = peaks.get("reserved_peak_bytes")
    if run is None:
        per = reports.get("peak_by_device") or {}
        if len(per) == 1 and kind != "host":
            only = next(iter(per.values()))
            key = next(iter(per))
            if not str(key).startswith("cpu"):
                run = only.get("reserved_peak_bytes")
    return run


def _whose_memory(requested: int | None, free: int | None, used: int | None, total: int | None, run: int | None,
                  others_bytes: int | None) -> tuple[Verdict, int | None]:
    """(verdict, other processes' bytes): NVML's per-process split first, else what Paddle's own counter leaves
    over the run's memory and a CUDA context."""
    verdict: Verdict = "unknown"
    others = others_bytes
    if others is None and run is not None and used is not None and used - run > CONTEXT_SLACK_BYTES:
        others = used - run - CONTEXT_SLACK_BYTES
    if requested is not None and free is not None and others is not None:
        verdict = "busy" if others > 0 and requested <= free + others else "too_big"
    elif requested is not None and total is not None and requested > total:
        verdict = "too_big"   # more than the whole device (or host) holds, whoever else was there
    return verdict, others


def _wanted_bytes(kind: str, requested: int | None, used: int | None, run: int | None,
                  others: int | None) -> int | None:
    """What the run needed at its batch on the device: its own memory plus the failed request, or None."""
    if run is not None and requested is not None:
        return run + requested
    if used is not None and requested is not None:
        return used - (others or 0) + requested   # unknown others count as the run's: an upper bound
    if kind == "host_alloc" and requested is not None:
        return requested   # the failed request alone: a lower bound of what the run needed
    return None


def _fitting_batch_size(batch: int | None, wanted: int | None, fixed: int, total: int | None, others: int | None,
                        verdict: Verdict) -> int | None:
    """The largest per-device batch that would have fit, scaling the batch-dependent part of ``wanted``."""
    budget = (total - (others or 0)) if total is not None else None
    if not (batch and wanted and budget):
        return None
    fitting = None
    if verdict == "busy":
        fitting = batch if total is not None and wanted <= total else None
    if fitting is None:
        scale = wanted - fixed
        fitting = int(batch * (budget - fixed) / scale) if scale > 0 and budget > fixed else 0
        fitting = min(fitting, batch - 1) if wanted > budget else fitting
    return fitting


def _explanation(report: OOMReport, errno: int | None, run_on_cpu: bool | None) -> str:
    """The report in words: what was asked and free, the allocator, the verdict and the batch that would fit."""
    gib = lambda n: "?" if n is None else f"{n / GiB:.2f} GiB"  # noqa: E731
    used, fitting, batch = report.device_used_bytes, report.fitting_batch_size, report.batch_size
    parts = [f"out of memory on {report.device}: asked for {gib(report.requested_bytes)} with {gib(report.free_bytes)} "
             "free" + (f" ({gib(used)} in use on the device of {gib(report.device_total_bytes)})" if used is not None else "")]
    if errno is not None:
        parts.append(f"errno {errno}" + (f" ({_ERRNO[errno]})" if errno in _ERRNO else ""))
    if report.memory == "host" and run_on_cpu is False:
        parts.append("this is host (CPU) memory, not the GPU's: the GPU estimate is not raised from it")
    parts.append(f"allocator {report.allocator_strategy} ({report.allocator_strategy_source})")
    if report.allocator_strategy == "naive_best_fit":
        parts.append("naive_best_fit pre-allocates FLAGS_fraction_of_gpu_memory_to_use of the card, so device 'used' "
                     "overstates the run's tensors")
    if report.verdict == "busy":
        parts.append(f"BUSY: other processes held {gib(report.others_bytes)} on the device; without them the allocation "
                     "would have fit" + (f" (batch {fitting} fits on a free device)" if fitting else ""))
    elif report.verdict == "too_big":
        parts.append(f"TOO BIG for the device: the run wanted {gib(report.wanted_bytes)}"
                     + (f"; a per-device batch of at most {fitting} would fit (task.batch_size_per_gpu, now {batch})"
                        if fitting is not None and batch else ""))
    else:
        parts.append("busy or too big cannot be told: neither NVML per-process memory nor the training's own report "
                     "covers that device" + (f"; a per-device batch of at most {fitting} would fit if it is the run's own memory"
                                             if fitting is not None and batch else ""))
    if fitting is not None and batch and report.verdict != "busy":
        parts.append("that batch assumes the failed allocation scales with the batch: one batch size cannot tell; "
                     "a second failure at another batch size does (see `autodl calibration`)")
    return "; ".join(parts) + "."


def floor_at_batch(oom: dict[str, Any], batch_size: int) -> int | None:
    """What a recorded OOM says the same script needs at ``batch_size``, bytes (at least).

    The batch-independent part (``fixed_bytes``) stays; the rest scales with the batch. None when the
    report has no ``wanted_bytes`` or no batch size.
    """
    wanted, batch = oom.get("wanted_bytes"), oom.get("batch_size")
    if not wanted or not batch:
        return None
    fixed = min(int(oom.get("fixed_bytes") or 0), int(wanted))
    return int(fixed + (int(wanted) - fixed) * batch_size / int(batch))


# ---------------------------------------------------------------------------------- calibration
CALIBRATION_CONFIG_FIELDS = ("model_name", "params", "amp", "dtype", "recompute", "distributed", "num_gpus",
                             "optimizer", "input_shape", "sequence_length")
"""The profile's fields that, with the script's content and the batch, decide what a run allocates: an
out-of-memory run calibrates only runs that agree on all of them (the spec's model, precision and gang)."""

SAME_REQUEST_RATIO = 1.1
"""Two failed allocations at different batch sizes within this ratio are the same allocation: it does not scale
with the batch. Paddle prints sizes to 6 decimals of a GiB/MiB, so equal requests read equal; 10 % leaves room
for allocator rounding (auto_growth's chunk alignment)."""


def script_sha256(path: str | Path | None) -> str | None:
    """SHA-256 of the script's bytes (hex), or None when it cannot be read."""
    try:
        return hashlib.sha256(Path(path).read_bytes()).hexdigest() if path else None
    except OSError:
        return None


def config_sha256(profile: dict[str, Any]) -> str:
    """SHA-256 (hex) of the :data:`CALIBRATION_CONFIG_FIELDS` of a profile (as JSON)."""
    picked = {k: profile.get(k) for k in CALIBRATION_CONFIG_FIELDS}
    return hashlib.sha256(json.dumps(picked, sort_keys=True, default=str).encode()).hexdigest()


def memory_of(oom: dict[str, Any]) -> str:
    """``device`` or ``host``: whose memory an OOM report is about (reports older than the field: by the device
    Paddle named; ``cpu``/``Place(cpu)`` is host memory)."""
    if oom.get("memory") in ("device", "host"):
        return str(oom["memory"])
    return "host" if "cpu" in str(oom.get("device", "")).lower() else "device"


def calibration_tag(oom: dict[str, Any], *, script: str | Path | None, profile: dict[str, Any] | None,
                    device_kind: str | None) -> dict[str, Any]:
    """``oom`` with what it calibrates: ``calibration = {script_sha256, config_sha256, batch_size, device_kind,
    memory}`` (see :func:`calibration_matches`).

    :param device_kind: what the training ran on: ``cpu`` (a declared pool) or the device's vendor/model.
    """
    profile = profile or {}
    tag = {"script_sha256": script_sha256(script), "config_sha256": config_sha256(profile),
           "batch_size": oom.get("batch_size") or profile.get("batch_size"), "device_kind": device_kind,
           "memory": memory_of(oom), "cleared_at": None}
    return {**oom, "calibration": tag}


class Calibration(BaseModel):
    """What past out-of-memory runs of the same script and configuration say the next one needs."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    floor_bytes: int | None = Field(description="The least peak per device the estimate may give, bytes; None when "
                                                "only host memory ran out.")
    run_key: str | None = Field(description="The run the floor comes from.")
    batch_size: int | None = Field(description="That run's per-device batch.")
    device_kind: str | None = Field(description="What that run's training ran on (``cpu`` on a declared pool).")
    scaling: Literal["scales", "fixed", "unknown"] = Field(
        description="``fixed``: the same allocation failed at two batch sizes (a smaller batch does not help); "
                    "``scales``: it grew with the batch; ``unknown``: one batch size seen.")
    host_runs: list[str] = Field(default_factory=list, description="Runs of the script that ran out of host "
                                                                   "memory: they never raise the device estimate.")


def calibration_matches(oom: dict[str, Any], *, script: str, recorded_script: str | None, sha: str | None,
                        config: str | None) -> bool:
    """Whether a recorded OOM report calibrates a run of ``script`` (content ``sha``, configuration ``config``).

    A report tagged by :func:`calibration_tag` matches on content and configuration (a changed script or spec
    no longer matches); an untagged one (recorded before tags) on the script path. Cleared ones never match.
    """
    tag = oom.get("calibration")
    if not tag:
        return recorded_script == script
    if tag.get("cleared_at"):
        return False
    if tag.get("script_sha256") and sha and tag["script_sha256"] != sha:
        return False
    if config and tag.get("config_sha256") and tag["config_sha256"] != config:
        return False
    return recorded_script == script or (sha is not None and tag.get("script_sha256") == sha)


def scaling_of(reports: list[dict[str, Any]]) -> str:
    """``fixed`` / ``scales`` / ``unknown``: whether the failed allocation grows with the batch, from reports at
    two or more batch sizes (:data:`SAME_REQUEST_RATIO`)."""
    by_batch: dict[int, int] = {}
    for r in reports:
        size = r.get("requested_bytes") or r.get("wanted_bytes")
        if r.get("batch_size") and size:
            by_batch[int(r["batch_size"])] = max(by_batch.get(int(r["batch_size"]), 0), int(size))
    if len(by_batch) < 2:
        return "unknown"
    sizes = list(by_batch.values())
    return "fixed" if max(sizes) <= SAME_REQUEST_RATIO * min(sizes) else "scales"


def calibrate(reports: list[tuple[str, dict[str, Any]]], batch_size: int) -> Calibration | None:
    """The :class:`Calibration` from matching OOM reports ``(run key, report)``, newest first; None when there
    are none.

    Device-memory reports give the floor: the largest ``wanted_bytes`` when the allocation is ``fixed``, else
    each rescaled to ``batch_size`` (:func:`floor_at_batch`). Host-memory reports are listed, never a floor.
    """
    device = [(k, r) for k, r in reports if memory_of(r) == "device"]
    host = [k for k, r in reports if memory_of(r) == "host"]
    if not reports:
        return None
    scaling = scaling_of([r for _k, r in device])
    best: tuple[int, str, dict[str, Any]] | None = None
    for key, r in device:
        floor = int(r["wanted_bytes"]) if scaling == "fixed" and r.get("wanted_bytes") else floor_at_batch(r, batch_size)
        if floor is not None and (best is None or floor > best[0]):
            best = (floor, key, r)
    if best is None:
        return Calibration(floor_bytes=None, run_key=None, batch_size=None, device_kind=None, scaling=scaling,
                           host_runs=host)
    floor, key, r = best
    return Calibration(floor_bytes=floor, run_key=key, batch_size=r.get("batch_size"), scaling=scaling,
                       device_kind=(r.get("calibration") or {}).get("device_kind"), host_runs=host)
