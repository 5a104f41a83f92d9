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
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone

from sqlalchemy import JSON, BigInteger, DateTime, Float, Integer, String, delete, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Mapped, mapped_column

from autodl.config import gang_wait_bound_s
from autodl.policy.admission import WAIT_MARGIN, Admission, Grant, QueuedRun, RunningRun, gang_first, queue_key
from autodl.policy.admission import decide as admission_decide
from autodl.policy.fairshare import TeamShares, fair_order
from autodl.queue_hold import WHOLE_QUEUE, QueueHold, QueueHolds, hold_of
from autodl.quota import TeamQueues
from autodl.store import Base, session_factory
from autodl.types import Device, Inventory, Lease, QueueEntry, utcnow


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
        )

    def join(self, run_key: str, *, num_gpus: int, needed_bytes: int, candidates: list[list[str]],
             stale_after_s: float, vendors: list[str] | None = None, dag_id: str | None = None,
             run_id: str | None = None, owner_user: str | None = None, pool: str | None = None,
             expected_runtime_s: float | None = None, timeout_s: float | None = None,
             team: str | None = None, priority: int = 0, speed_by_type: dict[str, float] | None = None,
             runtime_source: str | None = None, now: datetime | None = None) -> QueueEntry:
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
            row.team, row.priority = team, int(priority)
            row.num_gpus, row.needed_bytes, row.vendors = int(num_gpus), int(needed_bytes), vendors
            row.candidates, row.pool = candidates, pool
            row.heartbeat_at, row.stale_after_s = now, float(stale_after_s)
            try:
                s.commit()
            except IntegrityError:  # two polls of the same run joined at once: the other one's row stands
                s.rollback()
                return self.heartbeat(run_key, now=now) or self.get(run_key)
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
                      owner=lease.owner.user, team=lease.owner.team)


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
           rules: QueueRules | None = None, reasons: dict[str, str] | None = None) -> Grant | None:
    """The queue's grant for ``own`` now, or None (keep waiting).

    Every live entry (and ``own``, which is polling now) goes to :func:`admission`;
    ``place_own(free)`` is this run's placement policy over the devices still free at its turn, the
    other waiters are placed by :func:`place_from_candidates`.

    :param reasons: when given, filled with why each run not granted waits (for the waiter's log).
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
    return next((g for g in result.grants if g.run_key == own.run_key), None)


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


__all__ = ["AdmissionQueue", "QueueRow", "QueueRules", "admission", "admit_entries", "candidate_groups", "decide",
           "free_devices", "place_from_candidates", "product_order", "queue_rules", "queued_run", "running_run",
           "stale_after", "waiting_runs"]
