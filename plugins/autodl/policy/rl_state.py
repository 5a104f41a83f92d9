"""Store table of the ``rl_based`` contextual bandit: one row per (policy, device model) arm."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import DateTime, Integer, String, Text, UniqueConstraint
from sqlalchemy.orm import Mapped, mapped_column

from autodl.store import Base
from autodl.types import utcnow


class BanditArmRow(Base):
    """LinUCB state of one arm: ``a_inv_json`` (d x d inverse design matrix), ``b_json`` (d reward-weighted
    feature sums), ``count`` (observations)."""

    __tablename__ = "autodl_bandit_arms"
    __table_args__ = (UniqueConstraint("policy", "arm", name="uq_autodl_bandit_arm"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    policy: Mapped[str] = mapped_column(String(64), default="rl_based")
    arm: Mapped[str] = mapped_column(String(128))
    dim: Mapped[int] = mapped_column(Integer)
    a_inv_json: Mapped[str] = mapped_column(Text)
    b_json: Mapped[str] = mapped_column(Text)
    count: Mapped[int] = mapped_column(Integer, default=0)
    updated_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow, onupdate=utcnow)
