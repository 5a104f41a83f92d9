"""Leases that survive crashes and say whose they are; the admission queue of waiting runs.

``autodl_leases`` gains its owner (DAG, run, user), a TTL with the last heartbeat and the expiry, what
was launched on it (launcher, handle, host) so a reaper can stop it, the placement, and the reaper's
claim. Leases made before this migration keep ``expires_at`` NULL: nobody heartbeats them, so they are
never reaped automatically (``autodl leases --release`` frees them).

``autodl_queue`` holds the runs waiting for devices with their request (gang size, per-device need,
vendors, the device sets their policy accepts), enqueue time and last heartbeat.

Revision ID: 0002
Revises: 0001
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None

_LEASE_COLUMNS = [
    sa.Column("owner_dag_id", sa.String(250), nullable=True),
    sa.Column("owner_run_id", sa.String(250), nullable=True),
    sa.Column("owner_user", sa.String(250), nullable=True),
    sa.Column("ttl_s", sa.Float, nullable=True),
    sa.Column("heartbeat_at", sa.DateTime(timezone=True), nullable=True),
    sa.Column("expires_at", sa.DateTime(timezone=True), nullable=True),
    sa.Column("launcher", sa.String(32), nullable=True),
    sa.Column("handle", sa.JSON, nullable=True),
    sa.Column("launched_on", sa.String(255), nullable=True),
    sa.Column("placement", sa.JSON, nullable=True),
    sa.Column("expected_runtime_s", sa.Float, nullable=True),
    sa.Column("reaping_by", sa.String(255), nullable=True),
    sa.Column("reap_started_at", sa.DateTime(timezone=True), nullable=True),
]


def upgrade() -> None:
    with op.batch_alter_table("autodl_leases") as batch:
        for column in _LEASE_COLUMNS:
            batch.add_column(column.copy())
        batch.create_index("ix_autodl_leases_expires_at", ["expires_at"])
        batch.create_index("ix_autodl_leases_owner", ["owner_dag_id", "owner_run_id"])
    op.create_table(
        "autodl_queue",
        sa.Column("run_key", sa.String(512), primary_key=True),
        sa.Column("dag_id", sa.String(250), nullable=True),
        sa.Column("run_id", sa.String(250), nullable=True),
        sa.Column("owner_user", sa.String(250), nullable=True),
        sa.Column("num_gpus", sa.Integer, nullable=False),
        sa.Column("needed_bytes", sa.BigInteger, nullable=False),
        sa.Column("vendors", sa.JSON, nullable=True),
        sa.Column("candidates", sa.JSON, nullable=False),
        sa.Column("pool", sa.String(1024), nullable=True),
        sa.Column("enqueued_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("heartbeat_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("stale_after_s", sa.Float, nullable=False),
        sa.Column("expected_runtime_s", sa.Float, nullable=True),
        sa.Column("deadline_at", sa.DateTime(timezone=True), nullable=True),
    )
    op.create_index("ix_autodl_queue_enqueued_at", "autodl_queue", ["enqueued_at"])


def downgrade() -> None:
    op.drop_index("ix_autodl_queue_enqueued_at", table_name="autodl_queue")
    op.drop_table("autodl_queue")
    with op.batch_alter_table("autodl_leases") as batch:
        batch.drop_index("ix_autodl_leases_owner")
        batch.drop_index("ix_autodl_leases_expires_at")
        for column in reversed(_LEASE_COLUMNS):
            batch.drop_column(column.name)
