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

from collections.abc import Callable, Sequence
from datetime import datetime, timedelta, timezone

from sqlalchemy import JSON, BigInteger, DateTime, Float, Integer, String, delete, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Mapped, mapped_column

from autodl.config import gang_wait_bound_s
from autodl.policy.admission import Grant, QueuedRun, RunningRun, admit, gang_first, queue_order
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
        )

    def join(self, run_key: str, *, num_gpus: int, needed_bytes: int, candidates: list[list[str]],
             stale_after_s: float, vendors: list[str] | None = None, dag_id: str | None = None,
             run_id: str | None = None, owner_user: str | None = None, pool: str | None = None,
             expected_runtime_s: float | None = None, timeout_s: float | None = None,
             now: datetime | None = None) -> QueueEntry:
        """Enter the queue, or (already in it) refresh the request and the heartbeat.

        A run keeps the place it got when it first joined: ``enqueued_at``, the deadline
        (``enqueued_at + timeout_s``) and ``expected_runtime_s`` (the queue's sort key,
        :func:`autodl.policy.admission.queue_key`) are set once, so retries and reschedules never move it, and
        every waiter sees the same order. (Seen: two waiters both said "#2 of 2". An expected runtime refreshed by
        each waiter's own poll from the DAG's newest records lets each count the other first; whether that was
        the cause of the report is not known.)
        """
        now = now or utcnow()
        with self._session() as s:
            row = s.get(QueueRow, run_key)
            if row is None:
                row = QueueRow(run_key=run_key, enqueued_at=now, expected_runtime_s=expected_runtime_s,
                               deadline_at=now + timedelta(seconds=timeout_s) if timeout_s else None)
                s.add(row)
            row.dag_id, row.run_id, row.owner_user = dag_id, run_id, owner_user
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

    def in_order(self, now: datetime | None = None) -> list[QueueEntry]:
        """Live entries in the order the queue considers them (:func:`autodl.policy.admission.queue_order`),
        then the stale ones (for display: who waits, who is next)."""
        now = now or utcnow()
        entries = self.entries()
        live = {e.run_key: e for e in entries if not e.stale(now)}
        at = now.timestamp()
        runs = gang_first(queue_order([queued_run(e) for e in live.values()], at), at, *product_gang_rule())
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
def queued_run(entry: QueueEntry) -> QueuedRun:
    """The queue entry as the pure decision sees it (times as epoch seconds)."""
    return QueuedRun(run_key=entry.run_key, num_gpus=entry.num_gpus, needed_bytes=entry.needed_bytes,
                     enqueued_at=entry.enqueued_at.timestamp(), owner=entry.owner_user,
                     expected_runtime_s=entry.expected_runtime_s)


def running_run(lease: Lease) -> RunningRun:
    """A lease as a running run; expected to end ``expected_runtime_s`` after it was booked, when known."""
    end = (lease.created_at.timestamp() + lease.expected_runtime_s) if lease.expected_runtime_s else None
    return RunningRun(run_key=lease.run_key, devices=tuple(lease.device_ids), expected_end=end,
                      owner=lease.owner.user)


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
           now: datetime, place_own: Callable[[frozenset], Sequence[str] | None]) -> Grant | None:
    """The queue's grant for ``own`` now, or None (keep waiting).

    Every live entry (and ``own``, which is polling now) goes to :func:`autodl.policy.admission.admit`;
    ``place_own(free)`` is this run's placement policy over the devices still free at its turn, the
    other waiters are placed by :func:`place_from_candidates`.
    """
    live = {e.run_key: e for e in entries if not e.stale(now)}
    live[own.run_key] = own

    def place_on(run: QueuedRun, free_now: frozenset):
        if run.run_key == own.run_key:
            return place_own(free_now)
        return place_from_candidates(live[run.run_key], free_now)

    grants = admit_entries(list(live.values()), free, running, now, place_on)
    return next((g for g in grants if g.run_key == own.run_key), None)


def admit_entries(entries: Sequence[QueueEntry], free: frozenset[str], running: Sequence[RunningRun],
                  now: datetime, place_on: Callable[[QueuedRun, frozenset], Sequence[str] | None]) -> list[Grant]:
    """Every grant the product's admission queue makes now among ``entries`` (live ones): autodl's rule
    (:func:`autodl.policy.admission.admit`) with the bounded wait for gangs (:func:`product_gang_rule`)."""
    after_s, min_gpus = product_gang_rule()
    return admit([queued_run(e) for e in entries], free, list(running), now.timestamp(), place_on,
                 gang_first_s=after_s, gang_first_min_gpus=min_gpus)


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


__all__ = ["AdmissionQueue", "QueueRow", "admit_entries", "candidate_groups", "decide", "free_devices", "place_from_candidates",
           "queued_run", "running_run", "stale_after", "waiting_runs"]
