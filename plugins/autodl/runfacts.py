"""Run facts carried in a training's log stream: what a container or pod reports about itself without a shared disk.

Details: docs/launchers.md#autodlrunfacts.
"""

from __future__ import annotations

import json
import math
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

PREFIX = "@autodl-runfact "
"""Marks a run-fact line; the hook writes it at the start of a line (a training's unfinished line may precede it)."""

MAX_METRICS_LINE_BYTES = 4096
"""Longest metrics fact accepted, bytes: a memory row is ~300 B, a step line ~60 B."""

MAX_REPORT_BYTES = 65536
"""Longest report accepted, bytes (the JSON the training writes to ``$AUTODL_REPORT_FILE``)."""

MAX_METRICS_FACTS = 200_000
"""Metrics facts kept per run: a step every 20 ms for an hour is 180,000 lines (what ``read_steps`` can use)."""

MAX_INT = 2**63 - 1
"""Largest byte count or step accepted (a signed 64-bit integer, what the store's columns hold)."""


class MemoryFact(BaseModel):
    """A memory row of the start-up hook (fields as the hook writes them, see its module docstring)."""

    model_config = ConfigDict(extra="forbid", strict=True)

    kind: Literal["memory"]
    t: float = Field(ge=0, allow_inf_nan=False, description="Unix seconds.")
    pid: int = Field(ge=0, le=MAX_INT)
    rank: str = Field(max_length=16)
    place: str = Field(max_length=64, description="Paddle's place, e.g. gpu:0, cpu.")
    device: str = Field(max_length=128, description="The device UUID the place maps to, else the place.")
    step: int = Field(ge=0, le=MAX_INT)
    allocated_peak_bytes: int = Field(ge=0, le=MAX_INT)
    reserved_peak_bytes: int = Field(ge=0, le=MAX_INT)
    final: bool
    allocator_strategy: str | None = Field(None, max_length=64)


class StepFact(BaseModel):
    """A step line a script appends to ``$AUTODL_METRICS_FILE``: ``{"step", "t", "samples"}``; other keys
    (loss, lr) are dropped, not kept."""

    model_config = ConfigDict(extra="ignore")

    step: int = Field(ge=0, le=MAX_INT, strict=True)
    t: float = Field(ge=0, allow_inf_nan=False, description="Unix seconds after the step.")
    samples: int | None = Field(None, ge=0, le=MAX_INT, strict=True, description="Batch size of the step.")


class RunFact(BaseModel):
    """One parsed fact: ``channel`` says which file of the training it came from; ``row`` is what that
    file's line was (a :class:`MemoryFact` or :class:`StepFact` dump), ``report`` the whole report."""

    model_config = ConfigDict(frozen=True)

    channel: Literal["metrics", "report"]
    row: dict[str, Any] | None = None
    report: dict[str, Any] | None = None


def split_fact(line: str) -> tuple[str, str | None]:
    """``(log text before the fact, the fact's text after the prefix or None)`` for one log line."""
    at = line.find(PREFIX)
    if at < 0:
        return line, None
    return line[:at], line[at + len(PREFIX):]


def _finite(value: Any) -> bool:
    if isinstance(value, float):
        return math.isfinite(value)
    if isinstance(value, dict):
        return all(_finite(v) for v in value.values())
    if isinstance(value, list):
        return all(_finite(v) for v in value)
    return True


def parse_fact(text: str) -> RunFact:
    """Parse the text after :data:`PREFIX`: ``metrics <json object>`` or ``report <json object>``.

    :raises ValueError: naming what was wrong (unknown channel, too long, not a JSON object, a field
        outside its schema); the caller drops the line and counts it.
    """
    channel, _, payload = text.partition(" ")
    limit = {"metrics": MAX_METRICS_LINE_BYTES, "report": MAX_REPORT_BYTES}.get(channel)
    if limit is None:
        raise ValueError(f"unknown run-fact channel {channel[:20]!r} (expected 'metrics' or 'report')")
    if len(payload.encode("utf-8", "surrogatepass")) > limit:
        raise ValueError(f"{channel} fact longer than {limit} bytes")
    try:
        data = json.loads(payload)
    except ValueError:
        raise ValueError(f"{channel} fact is not JSON") from None
    if not isinstance(data, dict) or not _finite(data):
        raise ValueError(f"{channel} fact is not a JSON object of finite numbers")
    if channel == "report":
        return RunFact(channel="report", report=data)
    try:
        if "kind" in data:
            row = MemoryFact.model_validate(data).model_dump(exclude_none=True)
        else:
            row = StepFact.model_validate(data).model_dump(exclude_none=True)
    except ValidationError as exc:
        first = exc.errors(include_url=False)[0]
        raise ValueError(f"metrics fact field {'.'.join(map(str, first['loc']))[:40]}: {first['msg'][:120]}") from None
    return RunFact(channel="metrics", row=row)


class FactSink:
    """Keeps the facts of one run: metrics rows appended to ``metrics_path`` (the JSON-lines format
    :func:`autodl.metrics.read_steps` and :func:`~autodl.metrics.read_memory_reports` read), the latest
    report written to ``report_path``. Bounded by :data:`MAX_METRICS_FACTS`; rejected lines are counted.

    :param metrics_path: host file for the metrics rows (created on the first fact).
    :param report_path: host file for the report (replaced by each newer report).
    """

    def __init__(self, metrics_path: Any, report_path: Any):
        from pathlib import Path

        self.metrics_path = Path(metrics_path)
        self.report_path = Path(report_path)
        self.kept = 0
        self.rejected = 0
        self.reasons: list[str] = []
        self.reports = 0
        if self.metrics_path.is_file():  # a follower resumed after a restart: the cap counts what is kept
            with open(self.metrics_path, "rb") as fh:
                self.kept = sum(1 for _ in fh)

    def take(self, text: str) -> None:
        """Parse one fact (the text after :data:`PREFIX`) and keep it, or count it as rejected."""
        import os

        try:
            fact = parse_fact(text)
        except ValueError as exc:
            self._reject(str(exc))
            return
        if fact.channel == "report":
            tmp = self.report_path.with_name(self.report_path.name + ".tmp")
            tmp.write_text(json.dumps(fact.report))
            os.replace(tmp, self.report_path)
            self.reports += 1
            return
        if self.kept >= MAX_METRICS_FACTS:
            self._reject(f"more than {MAX_METRICS_FACTS} metrics facts")
            return
        with open(self.metrics_path, "a") as fh:
            fh.write(json.dumps(fact.row) + "\n")
        self.kept += 1

    def _reject(self, why: str) -> None:
        self.rejected += 1
        if why not in self.reasons and len(self.reasons) < 5:
            self.reasons.append(why)

    def notes(self) -> list[str]:
        """What to say in the run's metrics: that the facts are self-reported, and what was dropped."""
        out = []
        if self.kept or self.reports:
            out.append(f"{self.kept} metrics lines and {self.reports} reports came through the training's log "
                       "stream: self-reported by the training, as its own files are")
        if self.rejected:
            out.append(f"{self.rejected} run-fact lines in the training's log were dropped: " + "; ".join(self.reasons))
        return out
