"""The lease ledger: which devices are booked by which run, with one live lease per device guaranteed by the store.

Booking is atomic: a lease's devices are inserted as rows of ``autodl_lease_devices`` whose primary
key is the device id, in one transaction, so two runs racing for a device cannot both win (the
loser gets :class:`~autodl.errors.LeaseError`). Booking and releasing are idempotent per run key.
"""

from __future__ import annotations

import uuid
from datetime import datetime, timezone

from sqlalchemy import DateTime, ForeignKey, String, delete, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Mapped, mapped_column

from autodl.errors import LeaseError
from autodl.store import Base, session_factory
from autodl.types import Lease


class LeaseRow(Base):
    __tablename__ = "autodl_leases"

    lease_id: Mapped[str] = mapped_column(String(64), primary_key=True)
    run_key: Mapped[str] = mapped_column(String(512), unique=True, index=True)
    host: Mapped[str] = mapped_column(String(255))
    model: Mapped[str | None] = mapped_column(String(128), nullable=True)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))


class LeaseDeviceRow(Base):
    __tablename__ = "autodl_lease_devices"

    device_id: Mapped[str] = mapped_column(String(255), primary_key=True)
    lease_id: Mapped[str] = mapped_column(String(64), ForeignKey("autodl_leases.lease_id", ondelete="CASCADE"), index=True)
    position: Mapped[int] = mapped_column()


class Ledger:
    """Leases in autodl's store.

    :param url: SQLAlchemy URL; default :func:`autodl.config.store_url`.
    """

    def __init__(self, url: str | None = None):
        self._session = session_factory(url)

    def _to_lease(self, row: LeaseRow, device_ids: list[str]) -> Lease:
        created = row.created_at if row.created_at.tzinfo else row.created_at.replace(tzinfo=timezone.utc)
        return Lease(lease_id=row.lease_id, run_key=row.run_key, device_ids=device_ids, host=row.host,
                     model=row.model, created_at=created)

    def _devices_of(self, s, lease_id: str) -> list[str]:
        rows = s.execute(
            select(LeaseDeviceRow.device_id).where(LeaseDeviceRow.lease_id == lease_id).order_by(LeaseDeviceRow.position)
        )
        return [r[0] for r in rows]

    def book(self, run_key: str, device_ids: list[str], *, host: str = "localhost", model: str | None = None) -> Lease:
        """Book ``device_ids`` for ``run_key`` atomically.

        :returns: the new lease, or the run's existing lease when it already holds one (a retried
            select step must not book twice).
        :raises LeaseError: when any of the devices is held by another run (nothing is booked then).
        """
        if not device_ids:
            raise LeaseError(f"run {run_key}: a lease needs at least one device.")
        existing = self.get(run_key)
        if existing is not None:
            return existing
        lease_id = uuid.uuid4().hex
        now = datetime.now(timezone.utc)
        with self._session() as s:
            try:
                s.add(LeaseRow(lease_id=lease_id, run_key=run_key, host=host, model=model, created_at=now))
                s.flush()
                for pos, dev in enumerate(device_ids):
                    s.add(LeaseDeviceRow(device_id=dev, lease_id=lease_id, position=pos))
                s.commit()
            except IntegrityError:
                s.rollback()
                again = self.get(run_key)
                if again is not None:  # the same run booked concurrently (a racing retry)
                    return again
                holders = self.holders(device_ids)
                raise LeaseError(
                    f"run {run_key}: device(s) {', '.join(sorted(holders))} already leased by "
                    f"{', '.join(sorted(set(holders.values())))}; the select step will pick again."
                ) from None
        return Lease(lease_id=lease_id, run_key=run_key, device_ids=list(device_ids), host=host, model=model, created_at=now)

    def get(self, run_key: str) -> Lease | None:
        """The live lease of ``run_key``, or None."""
        with self._session() as s:
            row = s.execute(select(LeaseRow).where(LeaseRow.run_key == run_key)).scalar_one_or_none()
            if row is None:
                return None
            return self._to_lease(row, self._devices_of(s, row.lease_id))

    def holders(self, device_ids: list[str] | None = None) -> dict[str, str]:
        """device id -> run key of the lease holding it (all leased devices when ``device_ids`` is None)."""
        with self._session() as s:
            q = select(LeaseDeviceRow.device_id, LeaseRow.run_key).join(LeaseRow, LeaseRow.lease_id == LeaseDeviceRow.lease_id)
            if device_ids is not None:
                q = q.where(LeaseDeviceRow.device_id.in_(device_ids))
            return {d: r for d, r in s.execute(q)}

    def leased_device_ids(self) -> frozenset[str]:
        """Every device currently under a lease."""
        return frozenset(self.holders())

    def leases(self) -> list[Lease]:
        """All live leases, oldest first."""
        with self._session() as s:
            rows = s.execute(select(LeaseRow).order_by(LeaseRow.created_at)).scalars().all()
            return [self._to_lease(r, self._devices_of(s, r.lease_id)) for r in rows]

    def release(self, run_key: str) -> Lease | None:
        """Free the lease of ``run_key``. Idempotent.

        :returns: the lease that was freed, or None when the run held none.
        """
        with self._session() as s:
            row = s.execute(select(LeaseRow).where(LeaseRow.run_key == run_key)).scalar_one_or_none()
            if row is None:
                return None
            lease = self._to_lease(row, self._devices_of(s, row.lease_id))
            s.execute(delete(LeaseDeviceRow).where(LeaseDeviceRow.lease_id == row.lease_id))
            s.execute(delete(LeaseRow).where(LeaseRow.lease_id == row.lease_id))
            s.commit()
            return lease
