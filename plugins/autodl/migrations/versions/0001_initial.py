"""The store as it was before migrations: leases, lease devices, run records, the bandit's arms.

A store made by the old ``create_all`` already has these tables: each is created only when absent, so
that store is adopted as it is.

Revision ID: 0001
Revises:
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def _absent(name: str) -> bool:
    return not sa.inspect(op.get_bind()).has_table(name)


def upgrade() -> None:
    if _absent("autodl_leases"):
        op.create_table(
            "autodl_leases",
            sa.Column("lease_id", sa.String(64), primary_key=True),
            sa.Column("run_key", sa.String(512), nullable=False),
            sa.Column("host", sa.String(255), nullable=False),
            sa.Column("model", sa.String(128), nullable=True),
            sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        )
        op.create_index("ix_autodl_leases_run_key", "autodl_leases", ["run_key"], unique=True)
    if _absent("autodl_lease_devices"):
        op.create_table(
            "autodl_lease_devices",
            sa.Column("device_id", sa.String(255), primary_key=True),
            sa.Column("lease_id", sa.String(64), sa.ForeignKey("autodl_leases.lease_id", ondelete="CASCADE"),
                      nullable=False),
            sa.Column("position", sa.Integer, nullable=False),
        )
        op.create_index("ix_autodl_lease_devices_lease_id", "autodl_lease_devices", ["lease_id"])
    if _absent("autodl_runs"):
        op.create_table(
            "autodl_runs",
            sa.Column("run_key", sa.String(512), primary_key=True),
            sa.Column("dag_id", sa.String(250), nullable=True),
            sa.Column("run_id", sa.String(250), nullable=True),
            sa.Column("outcome", sa.String(32), nullable=False),
            sa.Column("device_model", sa.String(128), nullable=True),
            sa.Column("estimated_peak_bytes", sa.BigInteger, nullable=True),
            sa.Column("actual_peak_bytes", sa.BigInteger, nullable=True),
            sa.Column("recorded_at", sa.DateTime(timezone=True), nullable=False),
            sa.Column("document", sa.JSON, nullable=False),
            sa.Column("error", sa.Text, nullable=True),
        )
        op.create_index("ix_autodl_runs_dag_id", "autodl_runs", ["dag_id"])
        op.create_index("ix_autodl_runs_outcome", "autodl_runs", ["outcome"])
        op.create_index("ix_autodl_runs_device_model", "autodl_runs", ["device_model"])
        op.create_index("ix_autodl_runs_recorded_at", "autodl_runs", ["recorded_at"])
    if _absent("autodl_bandit_arms"):
        op.create_table(
            "autodl_bandit_arms",
            sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
            sa.Column("policy", sa.String(64), nullable=False),
            sa.Column("arm", sa.String(128), nullable=False),
            sa.Column("dim", sa.Integer, nullable=False),
            sa.Column("a_inv_json", sa.Text, nullable=False),
            sa.Column("b_json", sa.Text, nullable=False),
            sa.Column("count", sa.Integer, nullable=False),
            sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
            sa.UniqueConstraint("policy", "arm", name="uq_autodl_bandit_arm"),
        )


def downgrade() -> None:
    for name in ("autodl_bandit_arms", "autodl_runs", "autodl_lease_devices", "autodl_leases"):
        op.drop_table(name)
