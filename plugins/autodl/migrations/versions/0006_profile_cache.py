"""The profile cache: ``autodl_profile_cache``, one profile per key of what it rests on (issue 18, item 8).

A script's profile is reused while its content, the files beside it, the spec, the dry run's environment and
Paddle's and autodl's versions are unchanged (:mod:`autodl.profile.cache`). The rows are in the store, not in a
local file, so every worker host reuses what one of them measured.

Revision ID: 0006
Revises: 0004
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "autodl_profile_cache",
        sa.Column("key", sa.String(64), primary_key=True),
        sa.Column("script", sa.String(1024), nullable=False),
        sa.Column("spec_sha256", sa.String(64), nullable=False),
        sa.Column("profile", sa.JSON, nullable=False),
        sa.Column("parts", sa.JSON, nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("created_on", sa.String(250), nullable=True),
    )
    op.create_index("ix_autodl_profile_cache_script", "autodl_profile_cache", ["script"])


def downgrade() -> None:
    op.drop_index("ix_autodl_profile_cache_script", "autodl_profile_cache")
    op.drop_table("autodl_profile_cache")
