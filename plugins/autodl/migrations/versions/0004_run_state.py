"""One run state: ``autodl_run_state``, the facts the steps of a run hand each other.

The profile, the selection (lease, placement, devices), the placement decision, the launch handle, the
metrics, the training's report and why a step failed used to be JSON files under
``$AUTODL_HOME/runs/<run key>/`` on whichever machine wrote them; a release step on another host (or a
separate triggerer) could not read them and the record silently went without. Now each is a row here,
written by the step that learns it (``written_on``: that step's host) and read by the later ones.

Revision ID: 0004
Revises: 0003
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "autodl_run_state",
        sa.Column("run_key", sa.String(512), primary_key=True),
        sa.Column("name", sa.String(64), primary_key=True),
        sa.Column("value", sa.JSON, nullable=False),
        sa.Column("written_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("written_on", sa.String(250), nullable=True),
    )


def downgrade() -> None:
    op.drop_table("autodl_run_state")
