"""The lease ledger: which devices are booked by which run, with one live lease per device guaranteed by the store.

Details: docs/reference/leases.md#autodlledger.
"""

from __future__ import annotations

import uuid
from datetime import datetime, timedelta, timezone
from typing import Any

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    DateTime,
    Float,
    ForeignKey,
    Index,
    Integer,
    String,
    and_,
    delete,
    false,
    insert,
    or_,
    select,
    update,
)
from sqlalchemy.exc import DBAPIError, IntegrityError
from sqlalchemy.orm import Mapped, mapped_column

from autodl.config import lease_ttl_s
from autodl.errors import LeaseError, LeaseLost
from autodl.policy.packing import MAX_TENANTS, DeviceShare
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
    sharing: Mapped[str] = mapped_column(String(16), server_default="exclusive")
    co_tenants: Mapped[list | None] = mapped_column(JSON, nullable=True)


class LeaseDeviceRow(Base):
    """One device of one lease; a device is in two rows while two shared leases hold it (migration 0007)."""

    __tablename__ = "autodl_lease_devices"

    device_id: Mapped[str] = mapped_column(String(255), primary_key=True)
    lease_id: Mapped[str] = mapped_column(String(64), ForeignKey("autodl_leases.lease_id", ondelete="CASCADE"),
                                          primary_key=True, index=True)
    position: Mapped[int] = mapped_column()
    reserved_bytes: Mapped[int | None] = mapped_column(BigInteger, nullable=True)


class DeviceShareRow(Base):
    """What is booked on one device in use (:class:`autodl.policy.packing.DeviceShare`); the primary key is the
    booking's atomic test (migration 0007)."""

    __tablename__ = "autodl_device_shares"

    device_id: Mapped[str] = mapped_column(String(255), primary_key=True)
    capacity_bytes: Mapped[int] = mapped_column(BigInteger)
    reserved_bytes: Mapped[int] = mapped_column(BigInteger)
    leases: Mapped[int] = mapped_column(Integer)
    exclusive: Mapped[bool] = mapped_column(Boolean)


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


class _NoRoom(Exception):
    """A shared booking's guarded increment updated no share row: the device is full or held whole."""


SHARING_KINDS = ("exclusive", "shared")
"""The values of :attr:`autodl.types.Lease.sharing`."""


def _check_sharing(run_key: str, device_ids: list[str], sharing: str, reserved: int | None, capacity: int | None) -> None:
    if sharing not in SHARING_KINDS:
        raise LeaseError(f"run {run_key}: sharing {sharing!r} is not one of {', '.join(SHARING_KINDS)}.")
    if sharing == "shared" and (len(device_ids) != 1 or not reserved or reserved <= 0 or not capacity):
        raise LeaseError(f"run {run_key}: a shared lease is of one device with its reserved_bytes and capacity_bytes "
                         f"(got {len(device_ids)} device(s), reserved {reserved}, capacity {capacity}); a gang or a "
                         "run whose estimate is unknown books exclusively.")


def _insert_ignoring_conflict(s, table: type[Base], values: dict[str, Any]):
    """``INSERT .. ON CONFLICT DO NOTHING`` in the session's dialect (PostgreSQL or SQLite)."""
    from sqlalchemy.dialects import postgresql, sqlite

    if s.get_bind().dialect.name == "postgresql":
        return postgresql.insert(table).values(**values).on_conflict_do_nothing()
    return sqlite.insert(table).values(**values).on_conflict_do_nothing()


def _with(keys: list | None, key: str) -> list[str]:
    return sorted(set(keys or []) | {key})


class Ledger:
    """Leases in autodl's store.

    :param url: SQLAlchemy URL; default :func:`autodl.config.store_url`.
    """

    def __init__(self, url: str | None = None):
        self._session = session_factory(url)

    def _to_lease(self, row: LeaseRow, devices: list[tuple[str, int | None]]) -> Lease:
        shared = row.sharing == "shared"
        return Lease(
            lease_id=row.lease_id, run_key=row.run_key, device_ids=[d for d, _ in devices], host=row.host, model=row.model,
            created_at=_utc(row.created_at),
            owner=LeaseOwner(dag_id=row.owner_dag_id, run_id=row.owner_run_id, user=row.owner_user,
                             team=row.owner_team),
            ttl_s=row.ttl_s, heartbeat_at=_utc(row.heartbeat_at), expires_at=_utc(row.expires_at),
            launcher=row.launcher, handle=row.handle, launched_on=row.launched_on, placement=row.placement,
            expected_runtime_s=row.expected_runtime_s, sharing="shared" if shared else "exclusive",
            reserved_bytes=sum(r or 0 for _, r in devices) if shared else None, co_tenants=list(row.co_tenants or []),
        )

    def _devices_of(self, s, lease_id: str) -> list[tuple[str, int | None]]:
        rows = s.execute(
            select(LeaseDeviceRow.device_id, LeaseDeviceRow.reserved_bytes)
            .where(LeaseDeviceRow.lease_id == lease_id).order_by(LeaseDeviceRow.position)
        )
        return [(r[0], r[1]) for r in rows]

    def book(self, run_key: str, device_ids: list[str], *, host: str = "localhost", model: str | None = None,
             owner: LeaseOwner | None = None, ttl_s: float | None = None, launcher: str | None = None,
             placement: dict[str, Any] | None = None, expected_runtime_s: float | None = None,
             sharing: str = "exclusive", reserved_bytes: int | None = None,
             capacity_bytes: int | None = None) -> Lease:
        """Book ``device_ids`` for ``run_key`` atomically.

        :param owner: who books (DAG, run, user); kept with the lease.
        :param ttl_s: seconds the lease lives without a heartbeat; default :func:`autodl.config.lease_ttl_s`.
        :param sharing: ``exclusive`` (the default): the devices are this lease's alone, and none may be in any
            other lease. ``shared``: a 1-device lease that may hold its device beside one other shared lease
            (``docs/reference/fractional-leases.md``), when the bytes reserved there plus ``reserved_bytes``
            stay within ``capacity_bytes``.
        :param reserved_bytes: bytes a shared lease reserves on its device
            (:func:`autodl.policy.packing.reservation_bytes`); required for ``shared``.
        :param capacity_bytes: bytes the device's leases may reserve together, memory threshold x device memory
            (:func:`autodl.policy.packing.capacity_bytes`); required for ``shared``; for ``exclusive`` it is
            recorded as what the lease reserves (default 0: not known; nothing can join an exclusive lease).
        :returns: the new lease, or the run's existing lease when it already holds one (a retried
            step must not book twice).
        :raises LeaseError: when any of the devices is held by another run (a shared booking: held exclusively,
            by two leases, or with too few bytes left), or another booking won a race for them (nothing is booked
            then); when a shared booking is not of one device with its reserved and capacity bytes.
        """
        if not device_ids:
            raise LeaseError(f"run {run_key}: a lease needs at least one device.")
        _check_sharing(run_key, device_ids, sharing, reserved_bytes, capacity_bytes)
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
                               launcher=launcher, placement=placement, expected_runtime_s=expected_runtime_s,
                               sharing=sharing))
                s.flush()
                if sharing == "shared":
                    self._join(s, run_key, lease_id, device_ids[0], int(reserved_bytes or 0), int(capacity_bytes or 0))
                else:
                    self._take(s, lease_id, device_ids, int(capacity_bytes or 0))
                s.commit()
            except (IntegrityError, DBAPIError, _NoRoom) as exc:
                s.rollback()
                if isinstance(exc, DBAPIError) and not isinstance(exc, IntegrityError) and not _lost_race(exc):
                    raise
                again = self.get(run_key)
                if again is not None:  # the same run booked concurrently (a racing retry)
                    return again
                raise self._taken(run_key, device_ids, str(exc) if isinstance(exc, _NoRoom) else None) from None
        return self.get(run_key) or Lease(lease_id=lease_id, run_key=run_key, device_ids=list(device_ids), host=host,
                                          model=model, created_at=now)

    @staticmethod
    def _take(s, lease_id: str, device_ids: list[str], capacity: int) -> None:
        """An exclusive booking: one share row per device held whole; an existing row (the device is in use) is
        the unique-key violation of a lost race. Rows go in sorted device order (one lock order for all)."""
        position = {dev: i for i, dev in enumerate(device_ids)}
        s.execute(insert(DeviceShareRow), [
            {"device_id": dev, "capacity_bytes": capacity, "reserved_bytes": capacity, "leases": 1, "exclusive": True}
            for dev in sorted(position)
        ])
        s.execute(insert(LeaseDeviceRow), [
            {"device_id": dev, "lease_id": lease_id, "position": position[dev], "reserved_bytes": capacity or None}
            for dev in sorted(position)
        ])

    @staticmethod
    def _join(s, run_key: str, lease_id: str, device_id: str, need: int, capacity: int) -> None:
        """A shared booking: the device's share row (made when the device is free), then one guarded increment,
        the atomic test: not held whole, fewer than :data:`~autodl.policy.packing.MAX_TENANTS` leases, and the
        bytes reserved plus ``need`` within both capacities. The lease already there and this one name each
        other as co-tenants.

        :raises _NoRoom: the increment updated nothing.
        """
        s.execute(_insert_ignoring_conflict(s, DeviceShareRow, {
            "device_id": device_id, "capacity_bytes": capacity, "reserved_bytes": 0, "leases": 0, "exclusive": False}))
        room = s.execute(
            update(DeviceShareRow)
            .where(DeviceShareRow.device_id == device_id, DeviceShareRow.exclusive == false(),
                   DeviceShareRow.leases < MAX_TENANTS, DeviceShareRow.reserved_bytes + need <= capacity,
                   DeviceShareRow.reserved_bytes + need <= DeviceShareRow.capacity_bytes)
            .values(reserved_bytes=DeviceShareRow.reserved_bytes + need, leases=DeviceShareRow.leases + 1)
            .execution_options(synchronize_session=False)
        ).rowcount
        if room != 1:
            raise _NoRoom(f"no room on {device_id} for {need} more bytes (held whole, by {MAX_TENANTS} leases, "
                          f"or over its capacity of {capacity} bytes)")
        s.execute(insert(LeaseDeviceRow), [{"device_id": device_id, "lease_id": lease_id, "position": 0,
                                            "reserved_bytes": need}])
        others = s.execute(
            select(LeaseRow.lease_id, LeaseRow.run_key, LeaseRow.co_tenants)
            .join(LeaseDeviceRow, LeaseDeviceRow.lease_id == LeaseRow.lease_id)
            .where(LeaseDeviceRow.device_id == device_id, LeaseRow.lease_id != lease_id)
        ).all()
        for other_id, other_key, theirs in others:
            s.execute(update(LeaseRow).where(LeaseRow.lease_id == other_id)
                      .values(co_tenants=_with(theirs, run_key)).execution_options(synchronize_session=False))
        if others:
            s.execute(update(LeaseRow).where(LeaseRow.lease_id == lease_id)
                      .values(co_tenants=sorted(k for _, k, _ in others)).execution_options(synchronize_session=False))

    def _taken(self, run_key: str, device_ids: list[str], why: str | None) -> LeaseError:
        holders = self.holders(device_ids)
        who = ", ".join(sorted(set(holders.values()))) or "a booking that committed at the same time"
        return LeaseError(
            f"run {run_key}: device(s) {', '.join(sorted(holders)) or ', '.join(device_ids)} already leased "
            f"by {who}{f' ({why})' if why else ''}; it keeps waiting for devices."
        )

    def shares(self) -> dict[str, DeviceShare]:
        """What is booked on each device in use: device id -> :class:`~autodl.policy.packing.DeviceShare`."""
        with self._session() as s:
            rows = s.execute(select(DeviceShareRow)).scalars().all()
            return {r.device_id: DeviceShare(device_id=r.device_id, capacity_bytes=r.capacity_bytes,
                                             reserved_bytes=r.reserved_bytes, leases=r.leases,
                                             exclusive=bool(r.exclusive)) for r in rows}

    def get(self, run_key: str) -> Lease | None:
        """The live lease of ``run_key``, or None."""
        with self._session() as s:
            row = s.execute(select(LeaseRow).where(LeaseRow.run_key == run_key)).scalar_one_or_none()
            if row is None:
                return None
            return self._to_lease(row, self._devices_of(s, row.lease_id))

    def holders(self, device_ids: list[str] | None = None) -> dict[str, str]:
        """device id -> run key of the lease holding it (all leased devices when ``device_ids`` is None); the run
        keys of a device's two shared leases are given sorted, as ``"a, b"``."""
        with self._session() as s:
            q = select(LeaseDeviceRow.device_id, LeaseRow.run_key).join(LeaseRow, LeaseRow.lease_id == LeaseDeviceRow.lease_id)
            if device_ids is not None:
                q = q.where(LeaseDeviceRow.device_id.in_(device_ids))
            keys: dict[str, list[str]] = {}
            for d, r in s.execute(q):
                keys.setdefault(d, []).append(r)
            return {d: ", ".join(sorted(rs)) for d, rs in keys.items()}

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

        In one transaction its device rows go, their bytes and lease count come off the devices' share rows,
        and a share row left with no lease goes (the reaper frees leases the same way).

        :returns: the lease that was freed, or None when the run held none.
        """
        with self._session() as s:
            q = select(LeaseRow).where(LeaseRow.run_key == run_key)
            if lease_id:
                q = q.where(LeaseRow.lease_id == lease_id)
            row = s.execute(q).scalar_one_or_none()
            if row is None:
                return None
            held = self._devices_of(s, row.lease_id)
            lease = self._to_lease(row, held)
            freed = []
            for dev, reserved in sorted(held):
                # the delete is the guard: of two releases racing, only one takes the bytes off
                gone = s.execute(delete(LeaseDeviceRow).where(LeaseDeviceRow.device_id == dev,
                                                              LeaseDeviceRow.lease_id == row.lease_id)).rowcount
                if gone:
                    freed.append(dev)
                    s.execute(update(DeviceShareRow).where(DeviceShareRow.device_id == dev)
                              .values(leases=DeviceShareRow.leases - 1,
                                      reserved_bytes=DeviceShareRow.reserved_bytes - int(reserved or 0))
                              .execution_options(synchronize_session=False))
            if freed:
                s.execute(delete(DeviceShareRow).where(DeviceShareRow.device_id.in_(freed), DeviceShareRow.leases <= 0))
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
