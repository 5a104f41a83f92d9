"""Holding the admission queue for maintenance: a held team's queue (or the whole queue) admits nothing until resumed.

Kueue's ClusterQueue ``stopPolicy: Hold`` (https://kueue.sigs.k8s.io/docs/concepts/cluster_queue/#stoppolicy):
runs keep their place and keep waiting, running trainings are not touched, and nothing new is admitted.
``autodl queue --hold [--team T] --reason WHY`` holds, ``autodl queue --resume [--team T]`` resumes; the
reason is shown in "why is my run waiting" (``autodl queue``, the GPU page).
"""

from __future__ import annotations

from datetime import datetime, timezone

from pydantic import BaseModel, ConfigDict
from sqlalchemy import DateTime, String, delete, select
from sqlalchemy.orm import Mapped, mapped_column

from autodl.store import Base, session_factory
from autodl.types import utcnow

WHOLE_QUEUE = "*"
"""The hold's team for a hold of the whole queue (every team)."""


class QueueHoldRow(Base):
    __tablename__ = "autodl_queue_holds"

    team: Mapped[str] = mapped_column(String(250), primary_key=True)
    reason: Mapped[str] = mapped_column(String(1000))
    held_by: Mapped[str | None] = mapped_column(String(250), nullable=True)
    held_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))


class QueueHold(BaseModel):
    """A held queue: ``team`` (:data:`WHOLE_QUEUE` for all), why, by whom, since when."""

    model_config = ConfigDict(frozen=True)

    team: str
    reason: str
    held_by: str | None = None
    held_at: datetime

    def describe(self) -> str:
        """``the whole queue is held by ops since ...: reason``, for "why waiting"."""
        what = "the whole queue" if self.team == WHOLE_QUEUE else f"team {self.team!r}'s queue"
        return (f"{what} is held for maintenance by {self.held_by or '(unknown)'} since "
                f"{self.held_at.strftime('%Y-%m-%d %H:%M')} UTC: {self.reason} (admits nothing until "
                "autodl queue --resume)")


class QueueHolds:
    """The held queues in autodl's store.

    :param url: SQLAlchemy URL; default :func:`autodl.config.store_url`.
    """

    def __init__(self, url: str | None = None):
        self._session = session_factory(url)

    def hold(self, team: str | None, reason: str, *, by: str | None = None, now: datetime | None = None) -> QueueHold:
        """Hold ``team``'s queue (None: the whole queue); holding again replaces the reason."""
        key = team or WHOLE_QUEUE
        with self._session() as s:
            row = s.get(QueueHoldRow, key) or QueueHoldRow(team=key)
            row.reason, row.held_by, row.held_at = reason[:1000], by, now or utcnow()
            s.add(row)
            s.commit()
            return self._to_hold(row)

    def resume(self, team: str | None) -> bool:
        """Resume ``team``'s queue (None: the whole queue); True when it was held."""
        with self._session() as s:
            n = s.execute(delete(QueueHoldRow).where(QueueHoldRow.team == (team or WHOLE_QUEUE))).rowcount
            s.commit()
            return bool(n)

    def holds(self) -> list[QueueHold]:
        """Every hold, the whole queue's first."""
        with self._session() as s:
            rows = s.execute(select(QueueHoldRow).order_by(QueueHoldRow.team)).scalars().all()
            return [self._to_hold(r) for r in rows]

    @staticmethod
    def _to_hold(row: QueueHoldRow) -> QueueHold:
        at = row.held_at if row.held_at.tzinfo else row.held_at.replace(tzinfo=timezone.utc)
        return QueueHold(team=row.team, reason=row.reason, held_by=row.held_by, held_at=at)


def hold_of(team: str | None, holds: list[QueueHold]) -> QueueHold | None:
    """The hold that stops ``team``'s runs: the whole queue's, else the team's own; None when not held."""
    by_team = {h.team: h for h in holds}
    return by_team.get(WHOLE_QUEUE) or (by_team.get(team) if team else None)


__all__ = ["QueueHold", "QueueHoldRow", "QueueHolds", "WHOLE_QUEUE", "hold_of"]
