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
        """Insert or replace the record of ``record.run_key``."""
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


def utc(dt: datetime) -> datetime:
    """``dt`` as timezone-aware UTC (SQLite returns naive datetimes)."""
    return dt if dt.tzinfo else dt.replace(tzinfo=timezone.utc)
