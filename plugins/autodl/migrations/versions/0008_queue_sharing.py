"""The admission queue says how each waiting run asked to share: ``autodl_queue.sharing`` (``exclusive``/``packed``).

Revision ID: 0008
Revises: 0007
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("autodl_queue") as batch:
        batch.add_column(sa.Column("sharing", sa.String(16), nullable=False, server_default="exclusive"))


def downgrade() -> None:
    with op.batch_alter_table("autodl_queue") as batch:
        batch.drop_column("sharing")
