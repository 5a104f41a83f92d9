"""Fractional leases: ``autodl_device_shares``, one row per device in use, and leases that may share a device.

``autodl_device_shares`` holds what is booked on each device in use (its capacity under the memory threshold,
the bytes reserved, how many leases, whether one holds it whole); its primary key is the booking's atomic test
(``docs/reference/fractional-leases.md``). ``autodl_lease_devices`` is keyed by (device, lease), since a device
may appear in two shared leases, and gains each row's ``reserved_bytes``. ``autodl_leases`` gains ``sharing``
(``exclusive`` / ``shared``) and ``co_tenants`` (the run keys it shared its device with). Every lease that
exists when this runs becomes exclusive, each of its devices a share row held whole; the capacity of a device
is not known to the store, so those rows say 0 bytes (an exclusive row is never joined, whatever it says).

Revision ID: 0007
Revises: 0006
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None


def _lease_devices(name: str, *, shared: bool) -> sa.Table:
    columns: list[sa.schema.SchemaItem] = [
        sa.Column("device_id", sa.String(255), primary_key=True),
        sa.Column("lease_id", sa.String(64), sa.ForeignKey("autodl_leases.lease_id", ondelete="CASCADE"),
                  primary_key=shared, nullable=False),
        sa.Column("position", sa.Integer, nullable=False),
    ]
    if shared:
        columns.append(sa.Column("reserved_bytes", sa.BigInteger, nullable=True))
    return op.create_table(name, *columns)


def _swap_lease_devices(*, shared: bool) -> None:
    """Rebuild ``autodl_lease_devices`` with the other primary key (a copy, the same on SQLite and PostgreSQL)."""
    _lease_devices("autodl_lease_devices_new", shared=shared)
    op.execute("INSERT INTO autodl_lease_devices_new (device_id, lease_id, position) "
               "SELECT device_id, lease_id, position FROM autodl_lease_devices")
    op.drop_table("autodl_lease_devices")   # and its index (a store adopted by 0001 may not have it)
    op.rename_table("autodl_lease_devices_new", "autodl_lease_devices")
    op.create_index("ix_autodl_lease_devices_lease_id", "autodl_lease_devices", ["lease_id"])


def upgrade() -> None:
    shares = op.create_table(
        "autodl_device_shares",
        sa.Column("device_id", sa.String(255), primary_key=True),
        sa.Column("capacity_bytes", sa.BigInteger, nullable=False),
        sa.Column("reserved_bytes", sa.BigInteger, nullable=False),
        sa.Column("leases", sa.Integer, nullable=False),
        sa.Column("exclusive", sa.Boolean, nullable=False),
    )
    with op.batch_alter_table("autodl_leases") as batch:
        batch.add_column(sa.Column("sharing", sa.String(16), nullable=False, server_default="exclusive"))
        batch.add_column(sa.Column("co_tenants", sa.JSON, nullable=True))
    _swap_lease_devices(shared=True)
    held = sa.table("autodl_lease_devices", sa.column("device_id"))
    op.execute(shares.insert().from_select(
        ["device_id", "capacity_bytes", "reserved_bytes", "leases", "exclusive"],
        sa.select(held.c.device_id, sa.literal(0, sa.BigInteger), sa.literal(0, sa.BigInteger),
                  sa.literal(1, sa.Integer), sa.true()).distinct()))


def downgrade() -> None:
    _swap_lease_devices(shared=False)   # fails, as it must, while a device is held by two shared leases
    with op.batch_alter_table("autodl_leases") as batch:
        batch.drop_column("co_tenants")
        batch.drop_column("sharing")
    op.drop_table("autodl_device_shares")
