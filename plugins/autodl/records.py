"""Run records: what each run was, where it ran, estimate vs actual, and how it ended.

One row per run key in ``autodl_runs``; writing again for the same run key replaces the row (the
release-and-record step is retryable). Records feed later estimates (estimate/actual ratio per device
model) and the learning policy.
"""

from __future__ import annotations

import json
from datetime import datetime, timezone

from sqlalchemy import JSON, BigInteger, DateTime, String, Text, select
from sqlalchemy.orm import Mapped, mapped_column

from autodl.redact import redact_obj, sanitize_report
from autodl.store import Base, session_factory
from autodl.types import RunRecord


class RunRow(Base):
    __tablename__ = "autodl_runs"

    run_key: Mapped[str] = mapped_column(String(512), primary_key=True)
    dag_id: Mapped[str | None] = mapped_column(String(250), nullable=True, index=True)
    run_id: Mapped[str | None] = mapped_column(String(250), nullable=True)
    outcome: Mapped[str] = mapped_column(String(32), index=True)
    device_model: Mapped[str | None] = mapped_column(String(128), nullable=True, index=True)
    estimated_peak_bytes: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    actual_peak_bytes: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    recorded_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), index=True)
    document: Mapped[dict] = mapped_column(JSON)
    error: Mapped[str | None] = mapped_column(Text, nullable=True)


class RecordStore:
    """Run records in autodl's store.

    :param url: SQLAlchemy URL; default :func:`autodl.config.store_url`.
    """

    def __init__(self, url: str | None = None):
        self._session = session_factory(url)

    def write(self, record: RunRecord) -> RunRecord:
        """Insert or replace the record of ``record.run_key``.

        What the training wrote is not trusted: its ``report`` goes through :func:`autodl.redact.sanitize_report`
        (bounded, JSON-only, secrets hidden; a report it refuses is stored as None and ``error`` says so) and the
        strings of ``metrics`` and ``oom`` (device names, places, log lines) through :func:`autodl.redact.redact_obj`.

        :returns: the record as stored.
        """
        record = sanitized(record)
        doc = json.loads(record.model_dump_json())
        with self._session() as s:
            row = s.get(RunRow, record.run_key)
            if row is None:
                row = RunRow(run_key=record.run_key)
                s.add(row)
            row.dag_id = record.dag_id
            row.run_id = record.run_id
            row.outcome = record.outcome
            row.device_model = record.device_model
            row.estimated_peak_bytes = record.estimated_peak_bytes
            row.actual_peak_bytes = record.actual_peak_bytes
            row.recorded_at = record.recorded_at
            row.document = doc
            row.error = record.error
            s.commit()
        return record

    def get(self, run_key: str) -> RunRecord | None:
        """The record of ``run_key``, or None."""
        with self._session() as s:
            row = s.get(RunRow, run_key)
            return RunRecord.model_validate(row.document) if row else None

    def list(self, *, dag_id: str | None = None, limit: int = 100) -> list[RunRecord]:
        """Newest first."""
        with self._session() as s:
            q = select(RunRow).order_by(RunRow.recorded_at.desc()).limit(limit)
            if dag_id:
                q = q.where(RunRow.dag_id == dag_id)
            return [RunRecord.model_validate(r.document) for r in s.execute(q).scalars()]


def sanitized(record: RunRecord) -> RunRecord:
    """``record`` with what its training wrote made fit to store and show (see :meth:`RecordStore.write`)."""
    update: dict = {"metrics": redact_obj(record.metrics) if record.metrics else record.metrics,
                    "oom": redact_obj(record.oom) if record.oom else record.oom}
    if record.report is not None:
        try:
            update["report"] = sanitize_report(record.report).data
        except ValueError as exc:
            update["report"] = None
            update["error"] = f"{record.error + '; ' if record.error else ''}{exc}"
    return record.model_copy(update=update)


def utc(dt: datetime) -> datetime:
    """``dt`` as timezone-aware UTC (SQLite returns naive datetimes)."""
    return dt if dt.tzinfo else dt.replace(tzinfo=timezone.utc)


def oom_floor(script: str, batch_size: int, *, url: str | None = None, limit: int = 200) -> tuple[int, str] | None:
    """The least peak the estimate may give ``script`` at ``batch_size``, learnt from its runs that ran out of memory.

    A failed run whose record holds an OOM report (:class:`autodl.oom.OOMReport`) needed at least its
    ``wanted_bytes`` at its batch; rescaled to ``batch_size`` (:func:`autodl.oom.floor_at_batch`), the
    largest such figure over the newest ``limit`` failed runs of the same script is the floor.

    :param script: the script path as recorded (``RunRecord.script``).
    :returns: ``(bytes, run key of the run it comes from)``, or None when no such run is recorded.
    """
    from autodl.oom import floor_at_batch

    best: tuple[int, str] | None = None
    with RecordStore(url)._session() as s:
        q = (select(RunRow).where(RunRow.outcome == "failed").order_by(RunRow.recorded_at.desc()).limit(limit))
        for row in s.execute(q).scalars():
            doc = row.document or {}
            if doc.get("script") != script or not doc.get("oom"):
                continue
            floor = floor_at_batch(doc["oom"], batch_size)
            if floor is not None and (best is None or floor > best[0]):
                best = (floor, row.run_key)
    return best


def calibrate_profile(profile, *, url: str | None = None, threshold: float | None = None):
    """``profile`` with its peak raised to what the same script needed when it ran out of memory (:func:`oom_floor`).

    The raise is said in a warning finding (code ``oom-calibration``). A store that cannot be read
    leaves the profile as it is, with a warning saying so: calibration never blocks a run.

    :param profile: a :class:`~autodl.types.ResourceProfile`.
    :param threshold: the fraction of device memory a run may plan to use, for the largest batch per device
        (``resource_policy.memory_threshold``; default the spec's default).
    :returns: the same profile, or a copy with ``peak_memory_bytes`` raised (the rise counted as activations).
    """
    from autodl.types import Finding

    try:
        found = oom_floor(profile.script, profile.batch_size, url=url)
    except Exception as exc:  # noqa: BLE001 - a store problem must not stop profiling
        note = Finding(severity="warning", code="oom-calibration",
                       message=f"could not read past out-of-memory runs of this script ({type(exc).__name__}); estimate not checked against them")
        return profile.model_copy(update={"findings": [*profile.findings, note]})
    if found is None or found[0] <= profile.peak_memory_bytes:
        return profile
    floor, run_key = found
    gib = 1 << 30
    note = Finding(severity="warning", code="oom-calibration",
                   message=f"estimate raised from {profile.peak_memory_bytes / gib:.2f} to {floor / gib:.2f} GiB per device: "
                           f"run {run_key} of this script ran out of memory needing that much at batch {profile.batch_size}")
    return _raised(profile, floor, note, threshold)


def _raised(profile, floor: int, note, threshold: float | None):
    """``profile`` with its peak raised to ``floor``, the rise counted as activations (the part that scales with the
    batch, as :func:`autodl.oom.floor_at_batch` assumes), so the largest batch per device and the advice (AMP,
    recompute, a smaller batch) are worked out from the raised figure, not from the estimate that failed."""
    from autodl.catalog import load_catalog

    extra = floor - profile.peak_memory_bytes
    activations = profile.breakdown.activations_bytes + extra
    raised = profile.model_copy(update={
        "peak_memory_bytes": floor,
        "breakdown": profile.breakdown.model_copy(update={"activations_bytes": activations}),
        "activation_bytes_per_sample": activations // max(1, profile.batch_size),
        "findings": [*profile.findings, note],
    })
    try:
        models = load_catalog().models
    except Exception:  # noqa: BLE001 - the figures below are advice; the raised peak is what matters
        return raised
    if threshold is None:
        from autodl.spec import DEFAULT_MEMORY_THRESHOLD

        threshold = DEFAULT_MEMORY_THRESHOLD
    by_device = {name: (raised.max_batch_size(models[name].memory_bytes, threshold) if name in models else n)
                 for name, n in profile.max_batch_size_by_device.items()}
    by_device = {name: b for name, b in by_device.items() if b is not None}
    return raised.model_copy(update={"max_batch_size_by_device": by_device})
