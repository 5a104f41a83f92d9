"""What the GPU page shows, read from autodl's own store and inventory only (never Airflow's metadata DB).

Every value here is plain JSON-ready data. A figure autodl could not read stays ``None`` and the page says
"unknown": a device whose temperature no driver reported has no temperature, not 0 degrees.
"""

from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path
from typing import Any, Callable

from pydantic import BaseModel, ConfigDict, Field

from autodl.config import autodl_home
from autodl.errors import AutoDLError
from autodl.types import Device, Lease, RunRecord, utcnow
from autodl.ui.urls import dag_run_path, run_record_path, split_run_key

GiB = 1 << 30


class _View(BaseModel):
    model_config = ConfigDict(frozen=True)

    def to_json(self) -> dict[str, Any]:
        return self.model_dump(mode="json")


class Holder(_View):
    """Who holds a lease: the run key, and the DAG run when it is known."""

    run_key: str
    lease_id: str
    dag_id: str | None = None
    run_id: str | None = None
    owner: str | None = None
    dag_run_url: str | None = Field(None, description="Airflow UI page of the DAG run (path).")
    record_url: str = Field(description="The run's record on the GPU page (path inside the app).")
    hidden: bool = False
    """A run of a DAG the viewer may not read: who it is is left out (:func:`hide`), that the device is held is not."""


class DeviceRow(_View):
    """One device of the pool as the page shows it; None means unknown."""

    device_id: str
    host: str
    index: int
    model: str
    vendor: str
    memory_total_bytes: int | None
    memory_used_bytes: int | None
    utilization_pct: float | None
    temperature_c: float | None
    health: str = Field(description="'healthy', 'unhealthy' or 'unknown'.")
    health_reason: str | None = None
    unknown: list[str] = Field(default_factory=list, description="What the source could not read, and why.")
    declared: bool = Field(description="Values come from a pool file, not from a driver.")
    holder: Holder | None = None
    outside_pool: bool = Field(False, description="Held by a lease but not in the pool this page reads (a run "
                                                  "booked it from another pool file or source): figures unknown.")


class PoolView(_View):
    source: str | None
    declared: bool | None
    read_at: datetime | None
    devices: list[DeviceRow] = Field(default_factory=list)
    error: str | None = Field(None, description="Why the inventory could not be read, when it could not.")


class LeaseRow(_View):
    lease_id: str
    run_key: str
    device_ids: list[str]
    host: str
    model: str | None
    created_at: datetime
    held_s: float
    expires_at: datetime | None = None
    launched: bool = Field(True, description="False while the booking waits for its training to be started (on "
                                             "Celery: for a worker of the booked host's queue).")
    expired: bool = Field(False, description="Its TTL ran out (no heartbeat): the next reap frees it "
                                             "(``autodl leases --reap``); its run is probably gone.")
    holder: Holder


class QueueView(_View):
    """Runs waiting for devices, in the order the admission queue will serve them."""

    available: bool = Field(description="False while this autodl has no store-backed admission queue.")
    note: str | None = None
    rows: list[dict[str, Any]] = Field(default_factory=list)


class RunRow(_View):
    run_key: str
    dag_id: str | None
    run_id: str | None
    outcome: str
    recorded_at: datetime
    device_model: str | None
    devices: list[str] = Field(default_factory=list)
    declared_pool: bool
    estimated_peak_bytes: int | None
    actual_peak_bytes: int | None
    actual_source: str | None = Field(None, description="'nvml' (device memory) or 'process' (RSS on CPU).")
    estimate_ratio: float | None = Field(None, description="estimated / actual peak; None when they are not "
                                                            "comparable (see ``comparable``).")
    comparable: bool = Field(True, description="False when the estimate and the reading are of different memories: "
                                               "a GPU estimate (with its CUDA workspace terms) vs the host RSS of a "
                                               "training run on CPU (a declared pool).")
    duration_s: float | None
    error: str | None
    record_url: str
    dag_run_url: str | None


class RunDetail(_View):
    row: RunRow
    record: dict[str, Any]
    ranking: list[dict[str, Any]] = Field(default_factory=list, description="Candidates, kept (ranked) then dropped.")
    timeline: bool = Field(description="Metric samples of this run can be plotted here.")
    timeline_note: str | None = None


# ------------------------------------------------------------------------------------------ holders
HIDDEN_HOLDER = Holder(run_key="", lease_id="", record_url="", hidden=True, dag_run_url=None)
"""The holder shown for a run of a DAG the viewer may not read: no run key, DAG, run, owner or link."""

DagFilter = Callable[[set[str]], set[str]]
"""The DAG ids, of those given, the viewer may read (the auth manager's ``filter_authorized_dag_ids``)."""


def may_see(dag_ids: set[str | None], readable: DagFilter | None, *, admin: bool) -> Callable[[str | None], bool]:
    """Whether the viewer may see a run of each of ``dag_ids``: a DAG ``readable`` lets them read (one call for
    all, as Airflow's own views filter DAG runs); a run without a DAG (a CLI run) only for admins.
    ``readable`` None: every run."""
    if readable is None:
        return lambda _dag_id: True
    named = {d for d in dag_ids if d}
    allowed = readable(named) if named else set()
    return lambda dag_id: (dag_id in allowed) if dag_id else admin


def hide(holders: list[Holder], readable: DagFilter | None, *, admin: bool) -> list[Holder]:
    """``holders`` with those of runs the viewer may not see (:func:`may_see`) replaced by :data:`HIDDEN_HOLDER`."""
    seen = may_see({h.dag_id for h in holders}, readable, admin=admin)
    return [h if seen(h.dag_id) else HIDDEN_HOLDER for h in holders]


def holder_of(run_key: str, lease_id: str, *, dag_id: str | None = None, run_id: str | None = None,
              owner: str | None = None, base_path: str = "") -> Holder:
    """The holder of a lease, with a link to its DAG run when the DAG and run are known (from the lease
    itself, else from a run key whose run id Airflow generated)."""
    if not (dag_id and run_id):
        parts = split_run_key(run_key)
        if parts:
            dag_id, _group, run_id = parts
    return Holder(run_key=run_key, lease_id=lease_id, dag_id=dag_id, run_id=run_id, owner=owner,
                  dag_run_url=dag_run_path(dag_id, run_id, base_path) if dag_id and run_id else None,
                  record_url=run_record_path(run_key, base_path, in_ui=False))


def lease_holder(lease: Lease, base_path: str = "") -> Holder:
    """The holder of ``lease`` from the owner it records (DAG, run, user)."""
    return holder_of(lease.run_key, lease.lease_id, dag_id=lease.owner.dag_id, run_id=lease.owner.run_id,
                     owner=lease.owner.user, base_path=base_path)


# --------------------------------------------------------------------------------------------- pool
def device_row(device: Device, holder: Holder | None) -> DeviceRow:
    """A device as shown: what the inventory did not report is None (unknown), never 0."""
    healthy = getattr(device, "healthy", None)
    return DeviceRow(
        device_id=device.device_id, host=device.host, index=device.index, model=device.model, vendor=device.vendor,
        memory_total_bytes=getattr(device, "memory_total_bytes", None) or None,  # 0 = not known (Device's field)
        memory_used_bytes=getattr(device, "memory_used_bytes", None),
        utilization_pct=getattr(device, "utilization_pct", None),
        temperature_c=getattr(device, "temperature_c", None),
        health="unknown" if healthy is None else ("healthy" if healthy else "unhealthy"),
        health_reason=getattr(device, "health_reason", None), unknown=list(getattr(device, "unknown", None) or []),
        declared=device.declared, holder=holder,
    )


def pool_view(pool: str | None = None, *, leases: list[Lease] | None = None, base_path: str = "",
              readable: DagFilter | None = None, admin: bool = False) -> PoolView:
    """The pool now, each device with the lease holding it (the holder hidden where the viewer may not read its
    DAG: :func:`hide`).

    :param pool: inventory source (``auto``, ``nvml``, a pool file); default ``$AUTODL_POOL`` or ``auto``.
    :param readable: the viewer's DAG read permission (:data:`DagFilter`); None shows every holder.
    :returns: a :class:`PoolView`; ``error`` says why when the inventory could not be read.
    """
    from autodl.inventory import read_inventory

    if leases is None:
        leases = current_leases()
    by_device = {d: le for le in leases for d in le.device_ids}
    try:
        inventory = read_inventory(pool)
    except AutoDLError as exc:
        return PoolView(source=pool, declared=None, read_at=None, error=str(exc))
    rows = []
    for d in inventory.devices:
        lease = by_device.get(d.device_id)
        rows.append(device_row(d, lease_holder(lease, base_path) if lease else None))
    rows.extend(held_elsewhere(leases, {d.device_id for d in inventory.devices}, base_path))
    seen = may_see({r.holder.dag_id for r in rows if r.holder}, readable, admin=admin)
    rows = [r.model_copy(update={"holder": HIDDEN_HOLDER}) if r.holder and not seen(r.holder.dag_id) else r
            for r in rows]
    return PoolView(source=inventory.source, declared=inventory.declared, read_at=inventory.read_at, devices=rows)


def held_elsewhere(leases: list[Lease], shown: set[str], base_path: str = "") -> list[DeviceRow]:
    """Rows for the devices leases hold that the page's pool does not list (booked from another pool file or
    source): never shown as free by leaving them out; what only that source knows stays unknown."""
    rows = []
    for le in leases:
        for i, device_id in enumerate(le.device_ids):
            if device_id in shown:
                continue
            shown.add(device_id)
            rows.append(DeviceRow(device_id=device_id, host=le.host, index=i, model=le.model or "unknown",
                                  vendor="unknown", memory_total_bytes=None, memory_used_bytes=None,
                                  utilization_pct=None, temperature_c=None, health="unknown",
                                  unknown=["not in the pool this page reads: booked from another pool"],
                                  declared=False, holder=lease_holder(le, base_path), outside_pool=True))
    return rows


# ------------------------------------------------------------------------------------------- leases
def current_leases() -> list[Lease]:
    """Every lease autodl's store holds now (the page's pool, queue and lease tables read it)."""
    from autodl.ledger import Ledger

    return Ledger().leases()


def lease_rows(leases: list[Lease] | None = None, *, base_path: str = "", now: datetime | None = None,
               readable: DagFilter | None = None, admin: bool = False) -> list[LeaseRow]:
    """Live leases, oldest first; a lease of a run the viewer may not see (:func:`hide`) keeps its devices and
    times, without its run key, lease id or holder."""
    now = now or utcnow()
    leases = current_leases() if leases is None else leases
    holders = hide([lease_holder(le, base_path) for le in leases], readable, admin=admin)
    return [LeaseRow(lease_id=h.lease_id, run_key=h.run_key, device_ids=le.device_ids, host=le.host, model=le.model,
                     created_at=le.created_at, held_s=max(0.0, (now - le.created_at).total_seconds()),
                     expires_at=getattr(le, "expires_at", None), holder=h,
                     expired=le.expires_at is not None and le.expires_at <= now,
                     launched=getattr(le, "handle", None) is not None)
            for le, h in zip(leases, holders)]


# -------------------------------------------------------------------------------------------- queue
QUEUE_HIDDEN_FIELDS = ("num_gpus", "needed_bytes", "enqueued_at")
"""What a queue row of a run the viewer may not see keeps besides its position: its size, not who it is, its team
(by default its owner), priority or why it waits (the reason can name other runs)."""


def queue_view(base_path: str = "", pool: str | None = None, *, readable: DagFilter | None = None,
               admin: bool = False) -> QueueView:
    """Runs waiting for devices, in queue order, with why each waits and when it is expected to start
    (:func:`autodl.waiting.queue_report`), and the held queues in ``note``. A run the viewer may not see
    (:func:`may_see`) keeps its position and :data:`QUEUE_HIDDEN_FIELDS` only, with ``hidden``."""
    from autodl.queue_hold import QueueHolds
    from autodl.waiting import queue_report

    rows = []
    for r in queue_report(pool=pool):
        data = r.to_json()
        h = holder_of(r.entry.run_key, "", dag_id=r.entry.dag_id, run_id=r.entry.run_id, base_path=base_path)
        data.update(dag_id=h.dag_id or data.get("dag_id"), dag_run_url=h.dag_run_url, record_url=h.record_url)
        rows.append(data)
    seen = may_see({r.get("dag_id") for r in rows}, readable, admin=admin)
    rows = [r if seen(r.get("dag_id")) else {"position": r.get("position"), "hidden": True,
                                             **{k: r.get(k) for k in QUEUE_HIDDEN_FIELDS}} for r in rows]
    held = "; ".join(h.describe() for h in QueueHolds().holds())
    return QueueView(available=True, rows=rows, note=held or None)


# --------------------------------------------------------------------------------------------- runs
HOST_READINGS = ("process", "rss")
"""Metric sources that read host memory (the training's RSS), not a device's."""


def run_row(rec: RunRecord, base_path: str = "") -> RunRow:
    metrics = rec.metrics or {}
    placement = rec.placement or {}
    est, act = rec.estimated_peak_bytes, rec.actual_peak_bytes
    source = metrics.get("peak_source") or metrics.get("source")
    comparable = not (rec.declared_pool and source in HOST_READINGS)
    h = holder_of(rec.run_key, rec.lease_id or "", dag_id=rec.dag_id, run_id=rec.run_id, base_path=base_path)
    return RunRow(
        run_key=rec.run_key, dag_id=rec.dag_id, run_id=rec.run_id, outcome=rec.outcome, recorded_at=rec.recorded_at,
        device_model=rec.device_model, devices=list(placement.get("devices") or []), declared_pool=rec.declared_pool,
        estimated_peak_bytes=est, actual_peak_bytes=act, actual_source=source, comparable=comparable,
        estimate_ratio=round(est / act, 3) if est and act and comparable else None,
        duration_s=metrics.get("duration_s"), error=rec.error, record_url=h.record_url, dag_run_url=h.dag_run_url,
    )


def readable_records(records: list[RunRecord], readable: DagFilter | None, *, admin: bool) -> list[RunRecord]:
    """The records the viewer may see, in order: those of the DAGs ``readable`` lets them read (as Airflow's own
    views filter DAG runs); a record without a DAG (a CLI run) only for admins. ``readable`` None: all."""
    seen = may_see({r.dag_id for r in records}, readable, admin=admin)
    return [r for r in records if seen(r.dag_id)]


def run_rows(limit: int = 50, *, dag_id: str | None = None, base_path: str = "", readable: DagFilter | None = None,
             admin: bool = False) -> list[RunRow]:
    """The newest run records the viewer may see (:func:`readable_records`), at most ``limit``."""
    from autodl.records import RecordStore

    records = RecordStore().list(dag_id=dag_id, limit=limit if readable is None else min(limit * 4, 2000))
    return [run_row(r, base_path) for r in readable_records(records, readable, admin=admin)[:limit]]


def get_record(run_key: str) -> RunRecord | None:
    from autodl.records import RecordStore

    return RecordStore().get(run_key)


def ranking(rec: RunRecord) -> list[dict[str, Any]]:
    """The candidates the booking was decided on: kept ones ranked best first (``rank`` 1..n), then the
    dropped ones with their reasons. Older records without the decision have only the chosen placement."""
    blank: dict[str, Any] = {"devices": [], "model": None, "host": None, "kept": False, "score": None, "terms": {},
             "est_step_time_s": None, "reasons": []}
    if rec.decision and rec.decision.get("candidates"):
        out, rank = [], 0
        for c in rec.decision["candidates"]:
            if c.get("kept"):
                rank += 1
            out.append({**blank, **c, "rank": rank if c.get("kept") else None})
        return out
    if rec.placement and rec.placement.get("reasons") is not None:
        return [{**blank, **rec.placement, "kept": True, "rank": 1}]
    return []


def samples_file(rec: RunRecord) -> tuple[Path | None, str | None]:
    """The run's metric samples file when it can be read here, else (None, why not).

    Only files under ``AUTODL_HOME`` are read (the record names the path; the page never follows it
    elsewhere).
    """
    raw = (rec.metrics or {}).get("samples_path")
    if not raw:
        return None, "this run has no metric samples (it did not train, or nothing was sampled)"
    path = Path(raw).resolve()
    home = autodl_home().resolve()
    if home not in path.parents:
        return None, f"the samples file {raw} is outside AUTODL_HOME ({home}); it is not read"
    if not path.is_file():
        return None, f"the samples file {raw} is not on this host (AUTODL_HOME is not shared with the workers?)"
    return path, None


def read_samples(path: Path) -> list[dict[str, float]]:
    """The samples (``t`` unix seconds, ``memory_bytes``, ``utilization_pct``, optional ``temperature_c``,
    ``power_w``); lines that are not JSON objects are skipped (a sample cut short by a crash)."""
    rows = []
    for line in path.read_text().splitlines():
        try:
            row = json.loads(line)
        except ValueError:
            continue
        if isinstance(row, dict) and "t" in row:
            rows.append(row)
    return rows


def run_detail(run_key: str, base_path: str = "", readable: DagFilter | None = None,
               admin: bool = False) -> RunDetail | None:
    """One run's record with its ranked placement, or None when there is no record the viewer may see."""
    rec = get_record(run_key)
    if rec is None or not readable_records([rec], readable, admin=admin):
        return None
    path, why = samples_file(rec)
    return RunDetail(row=run_row(rec, base_path), record=rec.to_json(), ranking=ranking(rec),
                     timeline=path is not None, timeline_note=why)


def estimate_points(rows: list[RunRow]) -> list[tuple[float, float, str, str]]:
    """(estimated GiB, actual GiB, source, run key) for runs with both figures."""
    return [(r.estimated_peak_bytes / GiB, r.actual_peak_bytes / GiB, r.actual_source or "unknown", r.run_key)
            for r in rows if r.estimated_peak_bytes and r.actual_peak_bytes and r.comparable]
