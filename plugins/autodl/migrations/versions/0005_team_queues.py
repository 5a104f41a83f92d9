"""Team queues: whose quota a waiting run and a lease count against, held queues, and how long admitted runs waited.

``autodl_queue`` gains the run's ``team``, its ``priority`` (higher first within its team) and its expected
speed per device type (``speed_by_type``, relative to the reference of ``expected_runtime_s``), with where that
runtime came from (``runtime_source``: records or FLOPs). ``autodl_leases`` gains ``owner_team``, so the
devices a team holds count against its quota. ``autodl_queue_holds`` holds a team's queue (or the whole
queue, team ``*``) for maintenance. ``autodl_admissions`` keeps one row per admitted run (team, seconds
waited) for ``autodl exporter``'s wait-time histogram.

Revision ID: 0005
Revises: 0004
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None

_QUEUE_COLUMNS: list[sa.Column] = [
    sa.Column("team", sa.String(250), nullable=True),
    sa.Column("priority", sa.Integer, nullable=False, server_default="0"),
    sa.Column("speed_by_type", sa.JSON, nullable=True),
    sa.Column("runtime_source", sa.String(32), nullable=True),
]


def upgrade() -> None:
    with op.batch_alter_table("autodl_queue") as batch:
        for column in _QUEUE_COLUMNS:
            batch.add_column(column.copy())
    with op.batch_alter_table("autodl_leases") as batch:
        batch.add_column(sa.Column("owner_team", sa.String(250), nullable=True))
    op.create_table(
        "autodl_queue_holds",
        sa.Column("team", sa.String(250), primary_key=True),
        sa.Column("reason", sa.String(1000), nullable=False),
        sa.Column("held_by", sa.String(250), nullable=True),
        sa.Column("held_at", sa.DateTime(timezone=True), nullable=False),
    )
    op.create_table(
        "autodl_admissions",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("run_key", sa.String(512), nullable=False),
        sa.Column("team", sa.String(250), nullable=True),
        sa.Column("num_gpus", sa.Integer, nullable=False),
        sa.Column("device_model", sa.String(250), nullable=True),
        sa.Column("admitted_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("waited_s", sa.Float, nullable=False),
    )
    op.create_index("ix_autodl_admissions_admitted_at", "autodl_admissions", ["admitted_at"])


def downgrade() -> None:
    op.drop_index("ix_autodl_admissions_admitted_at", table_name="autodl_admissions")
    op.drop_table("autodl_admissions")
    op.drop_table("autodl_queue_holds")
    with op.batch_alter_table("autodl_leases") as batch:
        batch.drop_column("owner_team")
    with op.batch_alter_table("autodl_queue") as batch:
        for column in reversed(_QUEUE_COLUMNS):
            batch.drop_column(column.name)
