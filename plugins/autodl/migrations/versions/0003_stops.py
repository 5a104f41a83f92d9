"""A manual stop leaves a mark: ``autodl_stops``, one row per lease stopped by hand.

``autodl leases --release`` writes the row *before* it signals the training, so the collect step that
sees the training end (exit 143/137 after SIGTERM/SIGKILL) and the run's own release-and-record step can
tell "stopped by autodl leases --release (by <user> at <time>)" from a crash or an out-of-memory kill.
Keyed by the lease id, so a later run with the same run key (a cleared and re-run DAG run) is never taken
for the stopped one; the row outlives the lease (which is deleted when freed).

Revision ID: 0003
Revises: 0002
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "autodl_stops",
        sa.Column("lease_id", sa.String(64), primary_key=True),
        sa.Column("run_key", sa.String(512), nullable=False),
        sa.Column("by_user", sa.String(250), nullable=True),
        sa.Column("at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("how", sa.String(250), nullable=False),
        sa.Column("forced", sa.Boolean, nullable=False),
    )
    op.create_index("ix_autodl_stops_run_key", "autodl_stops", ["run_key"])


def downgrade() -> None:
    op.drop_index("ix_autodl_stops_run_key", table_name="autodl_stops")
    op.drop_table("autodl_stops")
