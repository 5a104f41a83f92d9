"""Admissions recorded: which run was admitted when, for which team, after how long a wait (``autodl exporter``'s histogram).

One row per booking the admission queue made (:func:`autodl.steps.wait.step_wait`), kept like the run
records: the exporter reads them at scrape time, so the histogram is the store's, not one process's.
"""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import DateTime, Float, Integer, String, select
from sqlalchemy.orm import Mapped, mapped_column

from autodl.store import Base, session_factory
from autodl.types import utcnow


class AdmissionRow(Base):
    __tablename__ = "autodl_admissions"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    run_key: Mapped[str] = mapped_column(String(512))
    team: Mapped[str | None] = mapped_column(String(250), nullable=True)
    num_gpus: Mapped[int] = mapped_column(Integer)
    device_model: Mapped[str | None] = mapped_column(String(250), nullable=True)
    admitted_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), index=True)
    waited_s: Mapped[float] = mapped_column(Float)


class Admissions:
    """The admissions in autodl's store.

    :param url: SQLAlchemy URL; default :func:`autodl.config.store_url`.
    """

    def __init__(self, url: str | None = None):
        self._session = session_factory(url)

    def record(self, run_key: str, *, waited_s: float, num_gpus: int, team: str | None = None,
               device_model: str | None = None, now: datetime | None = None) -> None:
        """Record one admission: ``waited_s`` seconds from joining the queue to the booking (>= 0)."""
        with self._session() as s:
            s.add(AdmissionRow(run_key=run_key, team=team, num_gpus=int(num_gpus), device_model=device_model,
                               admitted_at=now or utcnow(), waited_s=max(0.0, float(waited_s))))
            s.commit()

    def wait_times(self) -> list[tuple[str | None, float]]:
        """(team, seconds waited) of every admission, oldest first."""
        with self._session() as s:
            rows = s.execute(select(AdmissionRow.team, AdmissionRow.waited_s).order_by(AdmissionRow.id)).all()
            return [(team, float(w)) for team, w in rows]


__all__ = ["AdmissionRow", "Admissions"]
