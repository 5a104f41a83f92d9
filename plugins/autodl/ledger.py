"""The lease ledger: which devices are booked by which run, with one live lease per device guaranteed by the store.

Booking is atomic: a lease's devices are inserted as rows of ``autodl_lease_devices`` whose primary
key is the device id, in one transaction, so two runs racing for a device cannot both win (the
loser gets :class:`~autodl.errors.LeaseError`). The rows are always inserted in sorted device-id order,
so two gang bookings never wait on each other in opposite orders (on PostgreSQL that was a
``DeadlockDetected``). Booking and releasing are idempotent per run key.

A lease records its owner (DAG, run, user) and lives while its holder heartbeats: each heartbeat moves
``expires_at`` to now + ``ttl_s``. A lease past ``expires_at`` is dead for good (a late heartbeat does not
revive it); a reaper claims it (:meth:`Ledger.claim_expired`), stops what it left and releases it.
"""

from __future__ import annotations

import uuid
from datetime import datetime, timedelta, timezone
from typing import Any

from sqlalchemy import JSON, Boolean, DateTime, Float, ForeignKey, Index, String, and_, delete, insert, or_, select, update
from sqlalchemy.exc import DBAPIError, IntegrityError
from sqlalchemy.orm import Mapped, mapped_column

from autodl.config import lease_ttl_s
from autodl.errors import LeaseError, LeaseLost
from autodl.store import Base, session_factory
from autodl.types import Lease, LeaseOwner, StopMark, utcnow

REAP_CLAIM_S = 300.0
"""A reaper's claim on an expired lease lapses after this many seconds (the reaper died while stopping the
training), so another reaper can finish the job. Stopping takes at most the launchers' grace periods
(10 s local, Docker's stop timeout, Kubernetes' 30 s), far less than this."""

_LOST_RACE_CODES = {"40P01", "40001"}
"""PostgreSQL SQLSTATEs that mean 'another transaction won': deadlock_detected, serialization_failure."""


class LeaseRow(Base):
    __tablename__ = "autodl_leases"
    __table_args__ = (Index("ix_autodl_leases_owner", "owner_dag_id", "owner_run_id"),)

    lease_id: Mapped[str] = mapped_column(String(64), primary_key=True)
    run_key: Mapped[str] = mapped_column(String(512), unique=True, index=True)
    host: Mapped[str] = mapped_column(String(255))
    model: Mapped[str | None] = mapped_column(String(128), nullable=True)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    owner_dag_id: Mapped[str | None] = mapped_column(String(250), nullable=True)
    owner_run_id: Mapped[str | None] = mapped_column(String(250), nullable=True)
    owner_user: Mapped[str | None] = mapped_column(String(250), nullable=True)
    owner_team: Mapped[str | None] = mapped_column(String(250), nullable=True)
    ttl_s: Mapped[float | None] = mapped_column(Float, nullable=True)
    heartbeat_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True), nullable=True)
    expires_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True), nullable=True, index=True)
    launcher: Mapped[str | None] = mapped_column(String(32), nullable=True)
    handle: Mapped[dict | None] = mapped_column(JSON, nullable=True)
    launched_on: Mapped[str | None] = mapped_column(String(255), nullable=True)
    placement: Mapped[dict | None] = mapped_column(JSON, nullable=True)
    expected_runtime_s: Mapped[float | None] = mapped_column(Float, nullable=True)
    reaping_by: Mapped[str | None] = mapped_column(String(255), nullable=True)
    reap_started_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True), nullable=True)


class LeaseDeviceRow(Base):
    __tablename__ = "autodl_lease_devices"

    device_id: Mapped[str] = mapped_column(String(255), primary_key=True)
    lease_id: Mapped[str] = mapped_column(String(64), ForeignKey("autodl_leases.lease_id", ondelete="CASCADE"), index=True)
    position: Mapped[int] = mapped_column()


class StopRow(Base):
    """A lease stopped by hand (:class:`~autodl.types.StopMark`); outlives the lease (migration 0003)."""

    __tablename__ = "autodl_stops"

    lease_id: Mapped[str] = mapped_column(String(64), primary_key=True)
    run_key: Mapped[str] = mapped_column(String(512), index=True)
    by_user: Mapped[str | None] = mapped_column(String(250), nullable=True)
    at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    how: Mapped[str] = mapped_column(String(250))
    forced: Mapped[bool] = mapped_column(Boolean)


def _utc(dt: datetime | None) -> datetime | None:
    if dt is None:
        return None
    return dt if dt.tzinfo else dt.replace(tzinfo=timezone.utc)


def _lost_race(exc: DBAPIError) -> bool:
    return getattr(getattr(exc, "orig", None), "pgcode", None) in _LOST_RACE_CODES


class Ledger:
    """Leases in autodl's store.

    :param url: SQLAlchemy URL; default :func:`autodl.config.store_url`.
    """

    def __init__(self, url: str | None = None):
        self._session = session_factory(url)

    def _to_lease(self, row: LeaseRow, device_ids: list[str]) -> Lease:
        return Lease(
            lease_id=row.lease_id, run_key=row.run_key, device_ids=device_ids, host=row.host, model=row.model,
            created_at=_utc(row.created_at),
            owner=LeaseOwner(dag_id=row.owner_dag_id, run_id=row.owner_run_id, user=row.owner_user,
                             team=row.owner_team),
            ttl_s=row.ttl_s, heartbeat_at=_utc(row.heartbeat_at), expires_at=_utc(row.expires_at),
            launcher=row.launcher, handle=row.handle, launched_on=row.launched_on, placement=row.placement,
            expected_runtime_s=row.expected_runtime_s,
        )

    def _devices_of(self, s, lease_id: str) -> list[str]:
        rows = s.execute(
            select(LeaseDeviceRow.device_id).where(LeaseDeviceRow.lease_id == lease_id).order_by(LeaseDeviceRow.position)
        )
        return [r[0] for r in rows]

    def book(self, run_key: str, device_ids: list[str], *, host: str = "localhost", model: str | None = None,
             owner: LeaseOwner | None = None, ttl_s: float | None = None, launcher: str | None = None,
             placement: dict[str, Any] | None = None, expected_runtime_s: float | None = None) -> Lease:
        """Book ``device_ids`` for ``run_key`` atomically.

        :param owner: who books (DAG, run, user); kept with the lease.
        :param ttl_s: seconds the lease lives without a heartbeat; default :func:`autodl.config.lease_ttl_s`.
        :returns: the new lease, or the run's existing lease when it already holds one (a retried
            step must not book twice).
        :raises LeaseError: when any of the devices is held by another run, or another booking won a race
            for them (nothing is booked then).
        """
        if not device_ids:
            raise LeaseError(f"run {run_key}: a lease needs at least one device.")
        existing = self.get(run_key)
        if existing is not None:
            return existing
        ttl = float(ttl_s) if ttl_s is not None else lease_ttl_s()
        owner = owner or LeaseOwner()
        lease_id = uuid.uuid4().hex
        now = utcnow()
        with self._session() as s:
            try:
                s.add(LeaseRow(lease_id=lease_id, run_key=run_key, host=host, model=model, created_at=now,
                               owner_dag_id=owner.dag_id, owner_run_id=owner.run_id, owner_user=owner.user,
                               owner_team=owner.team, ttl_s=ttl, heartbeat_at=now, expires_at=now + timedelta(seconds=ttl),
                               launcher=launcher, placement=placement, expected_runtime_s=expected_runtime_s))
                s.flush()
                # one order for every booking: the device rows' locks are always taken in sorted order
                position = {dev: i for i, dev in enumerate(device_ids)}
                s.execute(insert(LeaseDeviceRow), [
                    {"device_id": dev, "lease_id": lease_id, "position": position[dev]} for dev in sorted(position)
                ])
                s.commit()
            except (IntegrityError, DBAPIError) as exc:
                s.rollback()
                if not isinstance(exc, IntegrityError) and not _lost_race(exc):
                    raise
                again = self.get(run_key)
                if again is not None:  # the same run booked concurrently (a racing retry)
                    return again
                holders = self.holders(device_ids)
                who = ", ".join(sorted(set(holders.values()))) or "a booking that committed at the same time"
                raise LeaseError(
                    f"run {run_key}: device(s) {', '.join(sorted(holders)) or ', '.join(device_ids)} already leased "
                    f"by {who}; it keeps waiting for devices."
                ) from None
        return self.get(run_key) or Lease(lease_id=lease_id, run_key=run_key, device_ids=list(device_ids), host=host,
                                          model=model, created_at=now)

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
        """Every device currently under a lease (expired ones included until a reaper frees them)."""
        return frozenset(self.holders())

    def leases(self, *, owner_dag_id: str | None = None, owner_run_id: str | None = None) -> list[Lease]:
        """Live leases, oldest first; only those of one DAG (and run) when given."""
        with self._session() as s:
            q = select(LeaseRow).order_by(LeaseRow.created_at)
            if owner_dag_id is not None:
                q = q.where(LeaseRow.owner_dag_id == owner_dag_id)
            if owner_run_id is not None:
                q = q.where(LeaseRow.owner_run_id == owner_run_id)
            rows = s.execute(q).scalars().all()
            return [self._to_lease(r, self._devices_of(s, r.lease_id)) for r in rows]

    # ------------------------------------------------------------------------------- liveness
    def heartbeat(self, run_key: str, lease_id: str | None = None, *, now: datetime | None = None,
                  ttl_s: float | None = None) -> Lease:
        """Keep the lease of ``run_key`` alive: its expiry moves to ``now + ttl_s``.

        :param lease_id: when given, only that lease (not a newer one of the same run key) is kept.
        :param ttl_s: when given, the lease's TTL from now on (seconds; a collect followed from the triggerer
            raises it to :func:`autodl.steps.collect.deferred_lease_ttl_s`); else the lease keeps its own.
        :returns: the lease after the heartbeat.
        :raises LeaseLost: when the lease is gone (released or reaped), has expired already (a dead lease
            stays dead) or a reaper has claimed it; the message says which.
        """
        now = now or utcnow()
        with self._session() as s:
            row = s.execute(select(LeaseRow).where(LeaseRow.run_key == run_key)).scalar_one_or_none()
            if row is None or (lease_id and row.lease_id != lease_id):
                raise LeaseLost(f"run {run_key}: its lease {lease_id or ''} is gone (released, or reclaimed after it "
                                "expired); the training must not go on without it.".replace("  ", " "))
            ttl = float(ttl_s) if ttl_s is not None else row.ttl_s
            values: dict[str, Any] = {"heartbeat_at": now}
            if ttl_s is not None:
                values["ttl_s"] = ttl
            if ttl is not None:
                values["expires_at"] = now + timedelta(seconds=ttl)
            result = s.execute(
                update(LeaseRow)
                .where(LeaseRow.lease_id == row.lease_id, LeaseRow.reaping_by.is_(None),
                       or_(LeaseRow.expires_at.is_(None), LeaseRow.expires_at >= now))
                .values(**values)
                .execution_options(synchronize_session=False)
            )
            s.commit()
            if result.rowcount != 1:
                held_id = row.lease_id   # read before expiring: the row may be gone (released in between)
                s.expire_all()
                row = s.execute(select(LeaseRow).where(LeaseRow.lease_id == held_id)).scalar_one_or_none()
                if row is None:  # released between the read and the update
                    raise LeaseLost(f"run {run_key}: its lease {lease_id or ''} is gone (released, or reclaimed after "
                                    "it expired); the training must not go on without it.".replace("  ", " "))
                expired = _utc(row.expires_at)
                if row.reaping_by:
                    why = f"a reaper ({row.reaping_by}) is reclaiming it"
                else:
                    why = f"it expired at {expired.isoformat() if expired else '?'}"
                last = _utc(row.heartbeat_at)
                raise LeaseLost(
                    f"run {run_key}: lease {row.lease_id} is dead: {why} (last heartbeat "
                    f"{last.isoformat() if last else 'never'}, TTL {ttl:g} s)."
                    if ttl is not None else f"run {run_key}: lease {row.lease_id} is dead: {why}."
                )
            s.refresh(row)
            return self._to_lease(row, self._devices_of(s, row.lease_id))

    def attach(self, run_key: str, *, handle: dict[str, Any] | None = None, launched_on: str | None = None,
               launcher: str | None = None) -> Lease:
        """Record what was launched on the lease (so a reaper can stop it) and heartbeat it.

        :raises LeaseLost: as :meth:`heartbeat`.
        """
        lease = self.heartbeat(run_key)
        values: dict[str, Any] = {}
        if handle is not None:
            values["handle"] = handle
        if launched_on is not None:
            values["launched_on"] = launched_on
        if launcher is not None:
            values["launcher"] = launcher
        if values:
            with self._session() as s:
                s.execute(update(LeaseRow).where(LeaseRow.lease_id == lease.lease_id).values(**values)
                          .execution_options(synchronize_session=False))
                s.commit()
        return self.get(run_key) or lease

    def expired(self, now: datetime | None = None) -> list[Lease]:
        """Leases whose TTL has run out (claimed by a reaper or not), oldest expiry first."""
        now = now or utcnow()
        with self._session() as s:
            rows = s.execute(select(LeaseRow).where(LeaseRow.expires_at.is_not(None), LeaseRow.expires_at < now)
                             .order_by(LeaseRow.expires_at)).scalars().all()
            return [self._to_lease(r, self._devices_of(s, r.lease_id)) for r in rows]

    def claim_expired(self, lease_id: str, reaper: str, *, now: datetime | None = None) -> bool:
        """Claim an expired lease for reaping; of several reapers exactly one gets True.

        A claim older than :data:`REAP_CLAIM_S` (its reaper died) may be taken over.
        """
        now = now or utcnow()
        with self._session() as s:
            result = s.execute(
                update(LeaseRow)
                .where(LeaseRow.lease_id == lease_id, LeaseRow.expires_at.is_not(None), LeaseRow.expires_at < now,
                       or_(LeaseRow.reaping_by.is_(None),
                           and_(LeaseRow.reap_started_at.is_not(None),
                                LeaseRow.reap_started_at < now - timedelta(seconds=REAP_CLAIM_S))))
                .values(reaping_by=reaper[:255], reap_started_at=now)
                .execution_options(synchronize_session=False)
            )
            s.commit()
            return result.rowcount == 1

    def release(self, run_key: str, lease_id: str | None = None) -> Lease | None:
        """Free the lease of ``run_key`` (only if it is ``lease_id``, when given). Idempotent.

        :returns: the lease that was freed, or None when the run held none.
        """
        with self._session() as s:
            q = select(LeaseRow).where(LeaseRow.run_key == run_key)
            if lease_id:
                q = q.where(LeaseRow.lease_id == lease_id)
            row = s.execute(q).scalar_one_or_none()
            if row is None:
                return None
            lease = self._to_lease(row, self._devices_of(s, row.lease_id))
            s.execute(delete(LeaseDeviceRow).where(LeaseDeviceRow.lease_id == row.lease_id))
            deleted = s.execute(delete(LeaseRow).where(LeaseRow.lease_id == row.lease_id)).rowcount
            s.commit()
            return lease if deleted else None

    def mark_stopped(self, lease: Lease, *, by: str | None, how: str = "autodl leases --release",
                     forced: bool = False) -> StopMark:
        """Record that ``lease``'s training is being stopped by hand, before it is signalled. Idempotent: a
        second mark of the same lease keeps the first (who stopped it first, and when).

        :returns: the mark in the store.
        """
        with self._session() as s:
            row = s.get(StopRow, lease.lease_id)
            if row is None:
                row = StopRow(lease_id=lease.lease_id, run_key=lease.run_key, by_user=(by or None) and by[:250],
                              at=utcnow(), how=how[:250], forced=forced)
                s.add(row)
                try:
                    s.commit()
                except IntegrityError:  # another release marked it first: keep theirs
                    s.rollback()
                    row = s.get(StopRow, lease.lease_id)
            return self._to_mark(row)

    def stop_mark(self, lease_id: str | None) -> StopMark | None:
        """The manual stop of lease ``lease_id``, or None (never stopped by hand, or no lease id known)."""
        if not lease_id:
            return None
        with self._session() as s:
            row = s.get(StopRow, lease_id)
            return self._to_mark(row) if row is not None else None

    @staticmethod
    def _to_mark(row: StopRow) -> StopMark:
        return StopMark(lease_id=row.lease_id, run_key=row.run_key, by=row.by_user, at=_utc(row.at), how=row.how,
                        forced=row.forced)
