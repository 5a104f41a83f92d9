"""The admission queue kept in autodl's store: the runs waiting for devices, and who of them goes next.

Each waiting run has one row in ``autodl_queue`` with its request (gang size, per-device need, vendors,
the device groups its own placement policy accepts), when it joined and when its poller was last seen.
At each poll a waiter refreshes its row and asks :func:`decide`, which hands every live entry to the pure
queue decision :func:`autodl.policy.admission.admit`; the run books only the devices the queue grants
it (the booking itself is the ledger's atomic insert, so a lost race means: keep waiting). Every waiter
computes the same decision from the same rows, so only the run at the front of the queue acts on it.

An entry whose poller has not been seen for ``stale_after_s`` seconds (its task died, its triggerer is
gone) stops blocking the others; it keeps its place if it comes back.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta, timezone

from sqlalchemy import JSON, BigInteger, DateTime, Float, Integer, String, delete, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Mapped, mapped_column

from autodl.config import gang_wait_bound_s
from autodl.errors import StoreError
from autodl.policy.admission import (
    WAIT_MARGIN,
    Admission,
    Grant,
    QueuedRun,
    Reservation,
    RunningRun,
    gang_first,
    queue_key,
)
from autodl.policy.admission import decide as admission_decide
from autodl.policy.fairshare import TeamShares, fair_order
from autodl.policy.packing import (
    SHARED_CONTEXT_BYTES,
    SLOWDOWN_BAR,
    DeviceShare,
    capacity_bytes,
    fits_beside,
    reservation_bytes,
    shareable,
)
from autodl.queue_hold import WHOLE_QUEUE, QueueHold, QueueHolds, hold_of
from autodl.quota import NO_TEAM, TeamQueues
from autodl.store import Base, session_factory
from autodl.types import Device, Inventory, Lease, QueueEntry, ResourceProfile, utcnow


class QueueRow(Base):
    __tablename__ = "autodl_queue"

    run_key: Mapped[str] = mapped_column(String(512), primary_key=True)
    dag_id: Mapped[str | None] = mapped_column(String(250), nullable=True)
    run_id: Mapped[str | None] = mapped_column(String(250), nullable=True)
    owner_user: Mapped[str | None] = mapped_column(String(250), nullable=True)
    num_gpus: Mapped[int] = mapped_column(Integer)
    needed_bytes: Mapped[int] = mapped_column(BigInteger)
    vendors: Mapped[list | None] = mapped_column(JSON, nullable=True)
    candidates: Mapped[list] = mapped_column(JSON)
    pool: Mapped[str | None] = mapped_column(String(1024), nullable=True)
    enqueued_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), index=True)
    heartbeat_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    stale_after_s: Mapped[float] = mapped_column(Float)
    expected_runtime_s: Mapped[float | None] = mapped_column(Float, nullable=True)
    deadline_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True), nullable=True)
    team: Mapped[str | None] = mapped_column(String(250), nullable=True)
    priority: Mapped[int] = mapped_column(Integer, server_default="0")
    speed_by_type: Mapped[dict | None] = mapped_column(JSON, nullable=True)
    runtime_source: Mapped[str | None] = mapped_column(String(32), nullable=True)
    sharing: Mapped[str] = mapped_column(String(16), server_default="exclusive", default="exclusive")


def _utc(dt: datetime | None) -> datetime | None:
    if dt is None:
        return None
    return dt if dt.tzinfo else dt.replace(tzinfo=timezone.utc)


def stale_after(poke_interval_s: float) -> float:
    """Seconds without a heartbeat after which a waiter stops blocking others: three missed polls plus
    60 s for the scheduler to bring a rescheduled sensor back (autodl's choice: a poll every
    ``poke_interval_s`` is the waiter's promise; one late poll must not cost it its place)."""
    return 3.0 * float(poke_interval_s) + 60.0


class AdmissionQueue:
    """The waiting runs in autodl's store.

    :param url: SQLAlchemy URL; default :func:`autodl.config.store_url`.
    """

    def __init__(self, url: str | None = None):
        self._session = session_factory(url)

    @staticmethod
    def _to_entry(row: QueueRow) -> QueueEntry:
        return QueueEntry(
            run_key=row.run_key, dag_id=row.dag_id, run_id=row.run_id, owner_user=row.owner_user,
            num_gpus=row.num_gpus, needed_bytes=row.needed_bytes, vendors=row.vendors,
            candidates=[list(c) for c in (row.candidates or [])], pool=row.pool,
            enqueued_at=_utc(row.enqueued_at), heartbeat_at=_utc(row.heartbeat_at), stale_after_s=row.stale_after_s,
            expected_runtime_s=row.expected_runtime_s, deadline_at=_utc(row.deadline_at),
            team=row.team, priority=row.priority or 0, speed_by_type=row.speed_by_type, runtime_source=row.runtime_source,
            sharing="packed" if row.sharing == "packed" else "exclusive",
        )

    def join(self, run_key: str, *, num_gpus: int, needed_bytes: int, candidates: list[list[str]],
             stale_after_s: float, vendors: list[str] | None = None, dag_id: str | None = None,
             run_id: str | None = None, owner_user: str | None = None, pool: str | None = None,
             expected_runtime_s: float | None = None, timeout_s: float | None = None,
             team: str | None = None, priority: int = 0, speed_by_type: dict[str, float] | None = None,
             runtime_source: str | None = None, now: datetime | None = None,
             sharing: str = "exclusive") -> QueueEntry:
        """Enter the queue, or (already in it) refresh the request and the heartbeat.

        A run keeps the place it got when it first joined: ``enqueued_at``, the deadline
        (``enqueued_at + timeout_s``) and ``expected_runtime_s`` (the queue's sort key,
        :func:`autodl.policy.admission.queue_key`) are set once, so retries and reschedules never move it, and
        every waiter sees the same order; so are ``speed_by_type`` and ``runtime_source`` (they go with that
        runtime). ``team`` and ``priority`` follow the newest poll (a changed team queue file applies). (Seen: two waiters both said "#2 of 2". An expected runtime refreshed by
        each waiter's own poll from the DAG's newest records lets each count the other first; whether that was
        the cause of the report is not known.)
        """
        now = now or utcnow()
        with self._session() as s:
            row = s.get(QueueRow, run_key)
            if row is None:
                row = QueueRow(run_key=run_key, enqueued_at=now, expected_runtime_s=expected_runtime_s,
                               deadline_at=now + timedelta(seconds=timeout_s) if timeout_s else None,
                               speed_by_type=speed_by_type, runtime_source=runtime_source)
                s.add(row)
            row.dag_id, row.run_id, row.owner_user = dag_id, run_id, owner_user
            row.team, row.priority, row.sharing = team, int(priority), sharing
            row.num_gpus, row.needed_bytes, row.vendors = int(num_gpus), int(needed_bytes), vendors
            row.candidates, row.pool = candidates, pool
            row.heartbeat_at, row.stale_after_s = now, float(stale_after_s)
            try:
                s.commit()
            except IntegrityError:  # two polls of the same run joined at once: the other one's row stands
                s.rollback()
                entry = self.heartbeat(run_key, now=now) or self.get(run_key)
                if entry is None:  # and that poll left the queue before this one could read its row
                    raise StoreError(f"queue entry {run_key}: another poll of the same run joined and left the queue "
                                     "at once; poll again (the run is not in the queue)")
                return entry
            return self._to_entry(row)

    def heartbeat(self, run_key: str, *, now: datetime | None = None) -> QueueEntry | None:
        """Mark the run's poller as seen now; None when the run is not in the queue."""
        with self._session() as s:
            row = s.get(QueueRow, run_key)
            if row is None:
                return None
            row.heartbeat_at = now or utcnow()
            s.commit()
            return self._to_entry(row)

    def leave(self, run_key: str) -> bool:
        """Leave the queue (booked, gave up, failed). Idempotent; True when the run was in it."""
        with self._session() as s:
            n = s.execute(delete(QueueRow).where(QueueRow.run_key == run_key)).rowcount
            s.commit()
            return bool(n)

    def leave_all(self, *, dag_id: str, run_id: str | None = None) -> list[str]:
        """Remove every entry of a DAG (run): its runs will not poll again. Returns their run keys."""
        with self._session() as s:
            q = select(QueueRow.run_key).where(QueueRow.dag_id == dag_id)
            if run_id is not None:
                q = q.where(QueueRow.run_id == run_id)
            keys = [k for (k,) in s.execute(q)]
            if keys:
                s.execute(delete(QueueRow).where(QueueRow.run_key.in_(keys)))
                s.commit()
            return keys

    def get(self, run_key: str) -> QueueEntry | None:
        """The run's entry, or None."""
        with self._session() as s:
            row = s.get(QueueRow, run_key)
            return self._to_entry(row) if row else None

    def entries(self) -> list[QueueEntry]:
        """Every entry, stale ones included, in the order they joined."""
        with self._session() as s:
            rows = s.execute(select(QueueRow).order_by(QueueRow.enqueued_at, QueueRow.run_key)).scalars().all()
            return [self._to_entry(r) for r in rows]

    def in_order(self, now: datetime | None = None, *, queues: TeamQueues | None = None,
                 held: Counter | None = None) -> list[QueueEntry]:
        """Live entries in the order the queue considers them (:func:`product_order`), then the stale ones
        (for display: who waits, who is next).

        :param queues: the team queues (default: none, one queue ordered by priority and expected GPU-time).
        :param held: devices each team holds now (fair sharing orders by it).
        """
        now = now or utcnow()
        entries = self.entries()
        live = {e.run_key: e for e in entries if not e.stale(now)}
        runs = product_order([queued_run(e) for e in live.values()], now.timestamp(), queues or TeamQueues(),
                             held or Counter())
        ordered = [live[r.run_key] for r in runs]
        return ordered + [e for e in entries if e.run_key not in live]

    def purge(self, *, now: datetime | None = None, factor: float = 10.0) -> list[str]:
        """Delete entries whose poller has been gone for ``factor`` times their ``stale_after_s`` (its run
        is surely over); returns their run keys."""
        now = now or utcnow()
        gone = [e.run_key for e in self.entries()
                if (now - e.heartbeat_at).total_seconds() > factor * e.stale_after_s]
        if gone:
            with self._session() as s:
                s.execute(delete(QueueRow).where(QueueRow.run_key.in_(gone)))
                s.commit()
        return gone


def waiting_runs(url: str | None = None) -> list[QueueEntry]:
    """The runs waiting for devices, in the order the queue serves them (live entries first, then those
    whose poller has not been seen lately), for the GPU page and ``autodl queue``."""
    return AdmissionQueue(url).in_order()


# ----------------------------------------------------------------------------------------- the decision
@dataclass(frozen=True)
class QueueRules:
    """What the product's queue decides with besides its entries: the team queues, the held queues and
    the pool's device types (for quotas per type, speeds per type and the wait-for-a-faster-device rule).

    :ivar device_type: device id -> device type (model name); None: every device one type.
    :ivar host_of: device id -> host (the wait rule counts a gang's devices per host).
    """

    queues: TeamQueues = field(default_factory=TeamQueues)
    holds: tuple[QueueHold, ...] = ()
    device_type: Callable[[Hashable], str] | None = None
    host_of: Callable[[Hashable], Hashable] | None = None


def queue_rules(inventory: Inventory | None, *, url: str | None = None, queues: TeamQueues | None = None) -> QueueRules:
    """The product's :class:`QueueRules`: the team queues of ``[autodl] team_queues``, the holds in the store,
    and the device types and hosts of ``inventory``.

    A team queues file that cannot be read or is malformed holds the whole queue (nothing is admitted, no
    waiting run fails or loses its place, no quota is broken), and every "why waiting" names the file and
    the field to fix.
    """
    from autodl.errors import ConfigError
    from autodl.quota import load_team_queues

    holds = list(QueueHolds(url).holds())
    if queues is None:
        try:
            queues = load_team_queues()
        except ConfigError as exc:
            queues = TeamQueues()
            holds.insert(0, QueueHold(team=WHOLE_QUEUE, reason=f"the team queues cannot be used: {exc}",
                                      held_by="autodl", held_at=utcnow()))
    types = {d.device_id: d.model for d in inventory.devices} if inventory is not None else {}
    hosts = {d.device_id: d.host for d in inventory.devices} if inventory is not None else {}
    return QueueRules(queues=queues, holds=tuple(holds),
                      device_type=(lambda dev: types.get(str(dev), "unknown")) if types else None,
                      host_of=(lambda dev: hosts.get(str(dev))) if hosts else None)


def queued_run(entry: QueueEntry) -> QueuedRun:
    """The queue entry as the pure decision sees it (times as epoch seconds)."""
    return QueuedRun(run_key=entry.run_key, num_gpus=entry.num_gpus, needed_bytes=entry.needed_bytes,
                     enqueued_at=entry.enqueued_at.timestamp(), owner=entry.owner_user,
                     expected_runtime_s=entry.expected_runtime_s, speed_by_type=entry.speed_by_type,
                     team=entry.team, priority=entry.priority)


def running_run(lease: Lease, now: datetime | None = None) -> RunningRun:
    """A lease as a running run; expected to end ``expected_runtime_s`` after it was booked, when known.

    :param now: when given, a lease already past its expected end has an unknown end (it holds on for as
        long as it does; the queue never assumes it is about to end).
    """
    end = (lease.created_at.timestamp() + lease.expected_runtime_s) if lease.expected_runtime_s else None
    if end is not None and now is not None and end <= now.timestamp():
        end = None
    return RunningRun(run_key=lease.run_key, devices=tuple(lease.device_ids), expected_end=end,
                      owner=lease.owner.user, team=lease.owner.team, device_share=device_share(lease))


def running_runs(leases: Sequence[Lease], now: datetime | None = None) -> list[RunningRun]:
    """:func:`running_run` of each lease, the tenants of one shared device expected to free it together, when
    the last of them ends (unknown when one end is): a gang's reservation never counts on a device half freed
    (``docs/reference/fractional-leases.md``)."""
    runs = [running_run(le, now) for le in leases]
    tenants: dict[str, list[int]] = {}
    for i, le in enumerate(leases):
        if le.sharing == "shared":
            for dev in le.device_ids:
                tenants.setdefault(dev, []).append(i)
    for mine in tenants.values():
        if len(mine) > 1:
            ends = [runs[i].expected_end for i in mine]
            last = None if any(e is None for e in ends) else max(e for e in ends if e is not None)
            for i in mine:
                runs[i] = replace(runs[i], expected_end=last)
    return runs


def free_devices(inventory: Inventory, leased: frozenset[str]) -> frozenset[str]:
    """Ids of the pool's devices that are healthy and under no lease."""
    return frozenset(d.device_id for d in inventory.devices if d.healthy and d.device_id not in leased)


def place_from_candidates(entry: QueueEntry, free: frozenset) -> tuple[str, ...] | None:
    """Where another waiter would go among ``free``: ``num_gpus`` devices of the first of its candidate
    groups (one host and model each, its policy's order) that has that many free."""
    for group in entry.candidates:
        devices = [d for d in group if d in free]
        if len(devices) >= entry.num_gpus:
            return tuple(devices[: entry.num_gpus])
    return None


def decide(own: QueueEntry, entries: Sequence[QueueEntry], free: frozenset[str], running: Sequence[RunningRun],
           now: datetime, place_own: Callable[[frozenset], Sequence[str] | None],
           rules: QueueRules | None = None, reasons: dict[str, str] | None = None,
           held_back: set | None = None) -> Grant | None:
    """The queue's grant for ``own`` now, or None (keep waiting).

    Every live entry (and ``own``, which is polling now) goes to :func:`admission`;
    ``place_own(free)`` is this run's placement policy over the devices still free at its turn, the
    other waiters are placed by :func:`place_from_candidates`.

    :param reasons: when given, filled with why each run not granted waits (for the waiter's log).
    :param held_back: when given, filled with the devices held back for the head of the queue (:func:`_held_back`),
        which no packed run may join.
    """
    live = {e.run_key: e for e in entries if not e.stale(now)}
    live[own.run_key] = own

    def place_on(run: QueuedRun, free_now: frozenset):
        if run.run_key == own.run_key:
            return place_own(free_now)
        return place_from_candidates(live[run.run_key], free_now)

    result = admission(list(live.values()), free, running, now.timestamp(), place_on, rules,
                       explain=reasons is not None)
    if reasons is not None:
        reasons.update(result.waiting_reasons)
    if held_back is not None:
        held_back.update(_held_back(own, list(live.values()), running, now.timestamp(), rules or QueueRules(),
                                    result.reservation))
    return next((g for g in result.grants if g.run_key == own.run_key), None)


def _held_back(own: QueueEntry, live: Sequence[QueueEntry], running: Sequence[RunningRun], at: float,
                rules: QueueRules, reservation: Reservation | None) -> frozenset:
    """The devices a packed run may not join (``docs/reference/fractional-leases.md``, rule 3: packing must not delay
    a run ahead of it): the reservation of another run, when the decision made one, and every device a run ahead of
    it in the queue's order could use (its candidate groups). A run that waits for a device to itself is then not
    overtaken by packed runs behind it: the device frees for it when its tenants end. The decision reserves nothing
    while no device is free, which is when packing matters, so where the head would be reserved is not known, and
    all it could use is held back (the conservative side)."""
    held_back = reservation.devices if reservation is not None and reservation.run_key != own.run_key else frozenset()
    held: Counter = Counter()
    for r in running:
        held[r.team or NO_TEAM] += len(r.devices) * r.device_share  # type: ignore[assignment] # half devices
    active = [queued_run(e) for e in live if hold_of(e.team, list(rules.holds)) is None]
    ahead: set[str] = set()
    for run in product_order(active, at, rules.queues, held):
        if run.run_key == own.run_key:
            break
        ahead.add(run.run_key)
    return held_back | frozenset(d for e in live if e.run_key in ahead for group in e.candidates for d in group)


def product_order(runs: Sequence[QueuedRun], at: float, queues: TeamQueues, held: Counter) -> list[QueuedRun]:
    """The product queue's order: team fair sharing and priorities (:func:`autodl.policy.fairshare.fair_order`)
    over shortest expected GPU-time first with aging (:func:`autodl.policy.admission.queue_key`), then the
    bounded wait for gangs (:func:`product_gang_rule`)."""
    return gang_first(fair_order(runs, queues, held, queue_key), at, *product_gang_rule())


def admission(entries: Sequence[QueueEntry], free: frozenset[str], running: Sequence[RunningRun], at: float,
              place_on: Callable[[QueuedRun, frozenset], Sequence[str] | None], rules: QueueRules | None = None,
              *, explain: bool = False) -> Admission:
    """The product's admission decision among ``entries`` (live ones) at epoch ``at``.

    autodl's rule (:func:`autodl.policy.admission.decide`) in :func:`product_order`, with team quotas and
    borrowing (:class:`autodl.policy.fairshare.TeamShares`: a run is offered only devices its team may
    take), the wait-for-a-faster-device rule (:data:`autodl.policy.admission.WAIT_MARGIN`, for runs whose
    speed per type is known), and held queues (their runs are granted nothing and block nobody).

    :returns: the grants, the reservation, and (``explain``) why each other run waits.
    """
    rules = rules or QueueRules()
    by_key = {e.run_key: e for e in entries}
    runs = [queued_run(e) for e in entries]
    stopped = {r.run_key: h for r in runs if (h := hold_of(r.team, list(rules.holds))) is not None}
    active = [r for r in runs if r.run_key not in stopped]
    dtype = rules.device_type or (lambda _dev: "device")

    def usable(run: QueuedRun) -> frozenset[str]:
        return frozenset(dtype(g[0]) for g in by_key[run.run_key].candidates if g)

    shares = TeamShares(rules.queues, running, active, dtype, usable)
    order = product_order(active, at, rules.queues, shares.held_total())
    result = admission_decide(order, free, list(running), at, shares.place_on(place_on), presorted=True,
                              explain=explain, on_grant=shares.take, device_type=rules.device_type,
                              host_of=rules.host_of,
                              wait_margin=WAIT_MARGIN if rules.device_type is not None else None)
    if not explain:
        return result
    reasons = dict(result.waiting_reasons)
    granted = {g.run_key for g in result.grants}
    for key, why in shares.reasons.items():
        if key not in granted:
            reasons[key] = why
    for run in active:
        if run.run_key in granted:
            continue
        if run.run_key not in reasons:
            reasons[run.run_key] = ("no device is free now" if not free else
                                    "not reached this round: the free devices went to the runs ahead of it")
        lent = shares.lent(run)
        if lent:
            reasons[run.run_key] += f"; {lent}"
    for key, h in stopped.items():
        reasons[key] = h.describe()
    return Admission(result.grants, result.reservation, reasons)


def admit_entries(entries: Sequence[QueueEntry], free: frozenset[str], running: Sequence[RunningRun],
                  now: datetime, place_on: Callable[[QueuedRun, frozenset], Sequence[str] | None],
                  rules: QueueRules | None = None) -> list[Grant]:
    """Every grant the product's admission queue makes now among ``entries`` (live ones): :func:`admission`."""
    return list(admission(entries, free, running, now.timestamp(), place_on, rules).grants)


PRODUCT_GANG_MIN_GPUS = 2
"""Gang size from which the product's bounded wait (:func:`autodl.config.gang_wait_bound_s`) applies: every
gang, since shortest-GPU-time-first ranks any multi-device run behind every single-device one (with 200
waiters, all gangs of 4 were served after all 195 smaller runs, later ones included: issue 23)."""


def product_gang_rule() -> tuple[float | None, int]:
    """(seconds after which a gang goes first or None, smallest such gang) for the product's queue."""
    return gang_wait_bound_s(), PRODUCT_GANG_MIN_GPUS


def candidate_groups(inventory: Inventory, devices_fit: Callable[[Device], bool],
                     ranked: Sequence[tuple[str, str]] = ()) -> list[list[str]]:
    """The device groups (one host and model each, devices in index order) whose devices could ever hold
    a run, the groups named in ``ranked`` ((host, model), the policy's order) first.

    :param devices_fit: whether one device could ever hold the run (vendor allowed, memory under the threshold).
    """
    groups: dict[tuple[str, str], list[Device]] = {}
    for d in inventory.devices:
        if devices_fit(d):
            groups.setdefault((d.host, d.model), []).append(d)
    rank = {key: i for i, key in enumerate(ranked)}
    keys = sorted(groups, key=lambda k: (rank.get(k, len(rank)), k))
    return [[d.device_id for d in sorted(groups[k], key=lambda d: d.index)] for k in keys]


# ------------------------------------------------------------------------------------------------ packing
SHARED_DEVICE_SHARE = 0.5
"""What one device of a shared lease counts against its team's quota: two packed runs use one device of quota
(``docs/reference/fractional-leases.md``)."""

GIB = 1 << 30


def device_share(lease: Lease) -> float:
    """The part of each of its devices ``lease`` counts as holding: :data:`SHARED_DEVICE_SHARE` when shared, else 1."""
    return SHARED_DEVICE_SHARE if lease.sharing == "shared" else 1.0


def held_by_team(leases: Sequence[Lease]) -> Counter:
    """Devices each team holds now (a shared lease's device as :data:`SHARED_DEVICE_SHARE`), for fair sharing."""
    held: Counter = Counter()
    for le in leases:
        held[le.owner.team or NO_TEAM] += len(le.device_ids) * device_share(le)  # type: ignore[assignment] # half devices
    return held


def known_estimate(profile: ResourceProfile) -> int | None:
    """The per-device peak, bytes, a packed run reserves; None when it is unknown (no estimate, or a cold start
    that did not find the model: ``params`` None), and then the run never shares."""
    if profile.peak_memory_bytes <= 0 or profile.params is None:
        return None
    return profile.peak_memory_bytes


@dataclass(frozen=True)
class ShareTerms:
    """How a packed run books its device: the ledger's ``reserved_bytes`` and ``capacity_bytes``
    (:meth:`autodl.ledger.Ledger.book` with ``sharing="shared"``)."""

    reserved_bytes: int
    capacity_bytes: int
    speed_ratio: float | None = None
    """A run that joins: its expected speed beside the device's tenant, as a fraction of solo (the pair type's
    measured, else published, mean: :func:`autodl.interference.pair_speed`); None: the first tenant (solo at first)."""
    speed_source: str | None = None
    """Where ``speed_ratio`` comes from (:attr:`autodl.interference.PairSpeed.detail`)."""

    def booking(self) -> dict:
        """Keyword arguments of :meth:`autodl.ledger.Ledger.book`."""
        return {"sharing": "shared", "reserved_bytes": self.reserved_bytes, "capacity_bytes": self.capacity_bytes}


def share_terms(device: Device, estimate: int | None, threshold: float,
                share: DeviceShare | None = None) -> ShareTerms | None:
    """The terms a packed run of ``estimate`` bytes books ``device`` on, beside ``share`` (None: the device is
    free), or None when it may not share it: not a shareable device (:func:`autodl.policy.packing.shareable`),
    an unknown estimate, or no room (:func:`autodl.policy.packing.fits_beside`).

    :param threshold: the spec's memory threshold (0-1).
    """
    if not shareable(device) or estimate is None:
        return None
    capacity = capacity_bytes(device, threshold)
    if not fits_beside(share, estimate, capacity):
        return None
    need = reservation_bytes(estimate, joining=share is not None and share.leases > 0)
    return ShareTerms(need, capacity) if need is not None else None


def why_exclusive(profile: ResourceProfile, device: Device, threshold: float) -> str | None:
    """Why a ``packed`` run books ``device`` exclusively, for its log; None when it books it shared."""
    if profile.num_gpus != 1:
        return f"sharing: packed, but a run of {profile.num_gpus} devices never shares: it books them exclusively"
    estimate = known_estimate(profile)
    if estimate is None:
        return ("sharing: packed, but the run's memory estimate is unknown: it books its device exclusively (an "
                "unknown estimate never shares)")
    if share_terms(device, estimate, threshold) is None:
        return (f"sharing: packed, but {device.model} {device.device_id} ({device.memory_total_bytes / GIB:.1f} GiB) "
                "is not shareable for it (a healthy whole NVIDIA device of >= 24 GB, i.e. 24 x 10^9 bytes, 22.4 GiB, "
                "with room for the estimate): it books it exclusively")
    return None


def _within_quota(entry: QueueEntry, device_id: str, leases: Sequence[Lease], rules: QueueRules) -> bool:
    """Whether ``entry``'s team stays within its nominal quota of the device's type with half a device more (a
    packed run joining a device never borrows)."""
    queues = rules.queues
    if not queues.teams:
        return True
    dtype = rules.device_type or (lambda _dev: "device")
    team = entry.team or NO_TEAM
    kind = dtype(device_id)
    held = sum(device_share(le) for le in leases if (le.owner.team or NO_TEAM) == team
               for dev in le.device_ids if dtype(dev) == kind)
    return held + SHARED_DEVICE_SHARE <= queues.quota(team).nominal(kind)


def pack_beside(entry: QueueEntry, estimate: int | None, threshold: float, inventory: Inventory,
                shares: dict[str, DeviceShare], leases: Sequence[Lease], rules: QueueRules,
                held_back: set, pair_judge: Callable[[list[Lease], Device], PairVerdict] | None = None,
                log: Callable[[str], None] | None = None) -> tuple[Grant, ShareTerms] | None:
    """A device for a packed 1-device run that the queue granted no free device now: the first device of its
    candidate groups (its policy's order) that holds one packed lease and has room beside it
    (:func:`share_terms`), outside ``held_back`` (the head gang's reservation: packing there would delay the
    gang), while its team's queue is not held and the team stays within its nominal quota; else None.

    :param estimate: the run's per-device peak, bytes (:func:`known_estimate`); None: it never shares.
    :param shares: the ledger's share rows (:meth:`autodl.ledger.Ledger.shares`).
    :param pair_judge: whether the run may go beside these leases on this device and how fast it is expected to
        run there (:func:`pair_check`); None: no interference check, no expected slowdown.
    """
    if entry.num_gpus != 1 or estimate is None or hold_of(entry.team, list(rules.holds)) is not None:
        return None
    by_id = {d.device_id: d for d in inventory.devices}
    for dev_id in (d for group in entry.candidates for d in group):
        share, device = shares.get(dev_id), by_id.get(dev_id)
        if device is None or share is None or share.exclusive or share.leases != 1 or dev_id in held_back:
            continue
        terms = share_terms(device, estimate, threshold, share)
        if terms is None or not _within_quota(entry, dev_id, leases, rules):
            continue
        neighbours = [le for le in leases if dev_id in le.device_ids]
        verdict = pair_judge(neighbours, device) if pair_judge is not None else None
        if verdict is not None and verdict.barred:
            if log is not None:
                log(f"sharing: not packed on {dev_id}: {verdict.barred}")
            continue
        if verdict is not None:
            terms = replace(terms, speed_ratio=verdict.speed_ratio, speed_source=verdict.detail)
        beside = ", ".join(le.run_key for le in neighbours) or "a packed run"
        reason = (f"packed beside {beside} on {dev_id}: it reserves {share.reserved_bytes / GIB:.2f} GiB, this run "
                  f"{terms.reserved_bytes / GIB:.2f} GiB (its estimate and one more CUDA context, "
                  f"{SHARED_CONTEXT_BYTES / GIB:.2f} GiB, which the run that joins carries), of "
                  f"{terms.capacity_bytes / GIB:.2f} GiB under the memory threshold ({threshold:g} x "
                  f"{device.memory_total_bytes / GIB:.1f} GiB)")
        return Grant(entry.run_key, (dev_id,), reason), terms
    return None


RUN_MODEL_KEY = "run_model"
"""Key of a packed lease's ``placement`` holding its run's model name (the profile's), so a run that would join it
knows the pair type (:func:`pair_check`)."""


@dataclass(frozen=True)
class PairVerdict:
    """Rule 5's answer for a run that would join a device (:func:`pair_check`)."""

    barred: str | None
    """Why it may not join (its pair type measured, or published, below the bar), else None."""
    speed_ratio: float | None = None
    """Its expected speed there, a fraction of solo: the slowest neighbour's pair mean (None: not known)."""
    detail: str | None = None
    """Where ``speed_ratio`` comes from."""


def pair_check(model_name: str | None, records: Callable[[], list] | None = None
               ) -> Callable[[list[Lease], Device], PairVerdict]:
    """Rule 5 for a run of ``model_name``: whether it may join these leases on this device (not when a pair type this
    pool measured, or that was published, is below :data:`autodl.policy.packing.SLOWDOWN_BAR`), and its expected
    speed there. The run records are read once, at the first device asked about (``records``: default the store's
    newest, :func:`autodl.interference.recent_records`)."""
    import statistics

    from autodl import interference

    seen: list[list] = []

    def judge(neighbours: list[Lease], device: Device) -> PairVerdict:
        if not seen:
            seen.append((records or interference.recent_records)())
        slowest: PairVerdict = PairVerdict(barred=None)
        for lease in neighbours:
            other = (lease.placement or {}).get(RUN_MODEL_KEY)
            speed = interference.pair_speed(model_name, other, device.model, seen[0])
            if speed.barred:
                return PairVerdict(barred=f"beside {lease.run_key}, {speed.detail}: below {SLOWDOWN_BAR} of solo speed")
            ratio = statistics.fmean(speed.ratios) if speed.ratios else None
            if ratio is not None and (slowest.speed_ratio is None or ratio < slowest.speed_ratio):
                slowest = PairVerdict(barred=None, speed_ratio=ratio, detail=speed.detail)
        return slowest

    return judge


def packed_grant(grant: Grant | None, entry: QueueEntry, profile: ResourceProfile, threshold: float,
                 inventory: Inventory, shares: Callable[[], dict[str, DeviceShare]], leases: Sequence[Lease],
                 rules: QueueRules, held_back: set, place_own: Callable[[frozenset], object],
                 log: Callable[[str], None], model_name: str | None = None) -> tuple[Grant | None, ShareTerms | None]:
    """The wait step's grant and booking terms for a ``packed`` run (terms None: it books exclusively).

    The queue's ``grant`` of free devices stands: a 1-device run whose device is shareable becomes its first
    tenant, any other books exclusively and the log says why (:func:`why_exclusive`). With no grant, the run
    may join a device holding one packed run (:func:`pack_beside`); ``place_own`` then places it there, so the
    lease keeps the policy's placement.

    :param shares: reads the ledger's share rows (only when needed).
    :param model_name: the run's model (the spec's ``task.model_name``, else the profile's): its pair type.
    """
    if grant is not None:
        first = next(d for d in inventory.devices if d.device_id == grant.devices[0])
        why = why_exclusive(profile, first, threshold)
        if why:
            log(why)
            return grant, None
        return grant, share_terms(first, known_estimate(profile), threshold)
    packed = pack_beside(entry, known_estimate(profile), threshold, inventory, shares(), leases, rules, held_back,
                         pair_check(model_name or profile.model_name), log)
    if packed is None:
        if known_estimate(profile) is None:
            log("sharing: packed, but the run's memory estimate is unknown: it never shares a device, and waits for "
                "one to itself")
        return None, None
    place_own(frozenset(packed[0].devices))
    return packed


__all__ = ["AdmissionQueue", "QueueRow", "QueueRules", "admission", "admit_entries", "candidate_groups", "decide",
           "device_share", "free_devices", "held_by_team", "known_estimate", "pack_beside", "packed_grant", "pair_check", "PairVerdict", "place_from_candidates",
           "product_order", "queue_rules", "queued_run", "running_run", "running_runs", "share_terms", "stale_after",
           "waiting_runs", "why_exclusive", "ShareTerms"]
