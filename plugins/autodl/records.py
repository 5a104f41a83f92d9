"""Run records: what each run was, where it ran, estimate vs actual, and how it ended.

One row per run key in ``autodl_runs``; writing again for the same run key replaces the row (the
release-and-record step is retryable). Records feed later estimates (estimate/actual ratio per device
model) and the learning policy.
"""

from __future__ import annotations

import json
from datetime import datetime, timezone

from pydantic import BaseModel, ConfigDict, Field
from sqlalchemy import JSON, BigInteger, DateTime, String, Text, select
from sqlalchemy.orm import Mapped, mapped_column

from autodl.redact import redact_obj, sanitize_report
from autodl.store import Base, session_factory
from autodl.types import Lease, RunRecord


class RunResult(BaseModel):
    """A run's result: the ``release_and_record`` step's XCom, which is the task group's result
    (``AutoDLTrainOperator.result``); bytes per device, seconds. Figures the run never produced are None."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    run_key: str = Field(description="The record's key in autodl's store (``autodl runs --json``, the GPU page).")
    outcome: str = Field(description="``succeeded``, ``failed``, ``stopped`` or ``not_started``.")
    error: str | None = Field(None, description="Why it did not succeed (as the record says).")
    record_store: str = Field(description="The store the record is in (password redacted).")
    lease_released: bool = Field(description="This step freed the run's lease (False: none was held any more, or kept).")
    lease_kept: bool = Field(False, description="The lease is still held: the run's processes still held its devices.")
    declared_pool: bool
    device_model: str | None = None
    estimated_peak_bytes: int | None = None
    actual_peak_bytes: int | None = Field(None, description="The run's own peak (on a declared pool: host RSS).")
    allocated_peak_bytes: int | None = None
    reserved_peak_bytes: int | None = None
    duration_s: float | None = None
    exit_code: int | None = None

    @classmethod
    def of(cls, record: RunRecord, *, record_store: str, lease_released: bool, lease_kept: bool = False) -> "RunResult":
        """The result of ``record``."""
        m = record.metrics or {}
        return cls(run_key=record.run_key, outcome=record.outcome, error=record.error, record_store=record_store,
                   lease_released=lease_released, lease_kept=lease_kept, declared_pool=record.declared_pool, device_model=record.device_model,
                   estimated_peak_bytes=record.estimated_peak_bytes, actual_peak_bytes=record.actual_peak_bytes,
                   allocated_peak_bytes=record.allocated_peak_bytes, reserved_peak_bytes=record.reserved_peak_bytes,
                   duration_s=m.get("duration_s"), exit_code=m.get("exit_code"))


class RunRow(Base):
    __tablename__ = "autodl_runs"

    run_key: Mapped[str] = mapped_column(String(512), primary_key=True)
    dag_id: Mapped[str | None] = mapped_column(String(250), nullable=True, index=True)
    run_id: Mapped[str | None] = mapped_column(String(250), nullable=True)
    outcome: Mapped[str] = mapped_column(String(32), index=True)
    device_model: Mapped[str | None] = mapped_column(String(128), nullable=True, index=True)
    estimated_peak_bytes: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    actual_peak_bytes: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    recorded_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), index=True)
    document: Mapped[dict] = mapped_column(JSON)
    error: Mapped[str | None] = mapped_column(Text, nullable=True)


class RecordStore:
    """Run records in autodl's store.

    :param url: SQLAlchemy URL; default :func:`autodl.config.store_url`.
    """

    def __init__(self, url: str | None = None):
        self._session = session_factory(url)

    def write(self, record: RunRecord) -> RunRecord:
        """Insert or replace the record of ``record.run_key``.

        A record of another attempt (its lease differs from the stored one's: Airflow's clear and re-run booked
        again) keeps the stored one in ``attempts``; the same attempt (a retried release) replaces it.

        What the training wrote is not trusted: its ``report`` goes through :func:`autodl.redact.sanitize_report`
        (bounded, JSON-only, secrets hidden; a report it refuses is stored as None and ``error`` says so) and the
        strings of ``metrics`` and ``oom`` (device names, places, log lines) through :func:`autodl.redact.redact_obj`.

        :returns: the record as stored.
        """
        record = sanitized(record)
        with self._session() as s:
            row = s.get(RunRow, record.run_key)
            if row is None:
                row = RunRow(run_key=record.run_key)
                s.add(row)
            else:
                record = with_attempts(record, row.document or {})
            doc = json.loads(record.model_dump_json())
            row.dag_id = record.dag_id
            row.run_id = record.run_id
            row.outcome = record.outcome
            row.device_model = record.device_model
            row.estimated_peak_bytes = record.estimated_peak_bytes
            row.actual_peak_bytes = record.actual_peak_bytes
            row.recorded_at = record.recorded_at
            row.document = doc
            row.error = record.error
            s.commit()
        return record

    def set_samples_path(self, run_key: str, old: str, new: str) -> None:
        """Point the stored record (and its attempts) at samples moved from ``old`` to ``new`` (a new attempt's
        training gets a fresh samples file; :func:`autodl.steps.context.begin_attempt`)."""
        with self._session() as s:
            row = s.get(RunRow, run_key)
            if row is None:
                return
            doc = json.loads(json.dumps(row.document or {}))
            for part in [doc, *doc.get("attempts", [])]:
                if (part.get("metrics") or {}).get("samples_path") == old:
                    part["metrics"]["samples_path"] = new
            row.document = doc
            s.commit()

    def get(self, run_key: str) -> RunRecord | None:
        """The record of ``run_key``, or None."""
        with self._session() as s:
            row = s.get(RunRow, run_key)
            return RunRecord.model_validate(row.document) if row else None

    def list(self, *, dag_id: str | None = None, limit: int = 100) -> list[RunRecord]:
        """Newest first."""
        with self._session() as s:
            q = select(RunRow).order_by(RunRow.recorded_at.desc()).limit(limit)
            if dag_id:
                q = q.where(RunRow.dag_id == dag_id)
            return [RunRecord.model_validate(r.document) for r in s.execute(q).scalars()]


def with_sharing(record: RunRecord, lease: Lease | dict | None, *, previous: RunRecord | None = None) -> RunRecord:
    """``record`` with whom its run shared its device, from its lease (``Lease.sharing``, ``co_tenants``, and the
    memory cap a shared lease's ``reserved_bytes`` set).

    A shared run's record also carries, in ``notes``, that its cap was not verified under Paddle's default
    allocator (:data:`autodl.policy.packing.CAP_NOT_VERIFIED`, until ``docs/gpu-check.md`` step 9 measures it).
    Its step time is already in ``metrics.step_time_s``; :mod:`autodl.interference` reads the two together.

    :param lease: the run's :class:`~autodl.types.Lease` (the one released, which knows every neighbour that
        joined, else the booking's, as JSON); None: what ``previous`` said, else the record as it is.
    :param previous: the record a first writer stored for the same attempt (a reaper before the run's own
        release): its sharing is kept when this writer has no lease to read it from.
    :returns: a copy of ``record``; calling it twice adds the note once.
    """
    from autodl.policy.packing import CAP_NOT_VERIFIED
    from autodl.profile.memory import MIB

    if lease is None:
        if previous is None or previous.sharing == "exclusive":
            return record
        notes = [*record.notes, *(n for n in previous.notes if CAP_NOT_VERIFIED in n and n not in record.notes)]
        return record.model_copy(update={"sharing": previous.sharing, "co_tenants": list(previous.co_tenants),
                                         "device_memory_cap_bytes": previous.device_memory_cap_bytes, "notes": notes})
    lease = lease if isinstance(lease, Lease) else Lease.model_validate(lease)
    update: dict = {"sharing": lease.sharing, "co_tenants": list(lease.co_tenants)}
    if lease.sharing == "shared":
        beside = ", ".join(lease.co_tenants) or "no other run (a packed lease: another run could have joined)"
        if record.declared_pool:  # no driver answered: the training ran on CPU and no launcher set a device cap
            update["device_memory_cap_bytes"] = None
            note = (f"packed: shared its device with {beside}; the pool is declared, so the training ran on CPU and no "
                    f"device memory cap was set (a real device would have capped it at {(lease.reserved_bytes or 0) // MIB}"
                    " MiB)")
        else:
            update["device_memory_cap_bytes"] = lease.reserved_bytes
            cap = (f"capped at {lease.reserved_bytes // MIB} MiB" if lease.reserved_bytes
                   else "not capped (no reservation)")
            note = f"packed: shared its device with {beside}; device memory {cap}; {CAP_NOT_VERIFIED}"
        if note not in record.notes:
            update["notes"] = [*record.notes, note]
    return record.model_copy(update=update)


def same_attempt(record: RunRecord, stored: dict) -> bool:
    """Whether ``record`` is the stored record's attempt again: the same lease, or neither booked one."""
    return record.lease_id == stored.get("lease_id")


def with_attempts(record: RunRecord, stored: dict) -> RunRecord:
    """``record`` with the stored record's attempts, and the stored record itself when it was another attempt."""
    earlier = list(stored.get("attempts") or [])
    if not stored or same_attempt(record, stored):
        return record.model_copy(update={"attempts": earlier}) if earlier and not record.attempts else record
    return record.model_copy(update={"attempts": [*earlier, {k: v for k, v in stored.items() if k != "attempts"}]})


def sanitized(record: RunRecord) -> RunRecord:
    """``record`` with what its training wrote made fit to store and show (see :meth:`RecordStore.write`)."""
    update: dict = {"metrics": redact_obj(record.metrics) if record.metrics else record.metrics,
                    "oom": redact_obj(record.oom) if record.oom else record.oom}
    if record.report is not None:
        try:
            update["report"] = sanitize_report(record.report).data
        except ValueError as exc:
            update["report"] = None
            update["error"] = f"{record.error + '; ' if record.error else ''}{exc}"
    return record.model_copy(update=update)


def utc(dt: datetime) -> datetime:
    """``dt`` as timezone-aware UTC (SQLite returns naive datetimes)."""
    return dt if dt.tzinfo else dt.replace(tzinfo=timezone.utc)


def _oom_reports(script: str, *, sha: str | None, config: str | None, url: str | None,
                 limit: int) -> list[tuple[str, dict]]:
    """``(run key, OOM report)`` of the newest ``limit`` failed runs that calibrate ``script`` (newest first;
    :func:`autodl.oom.calibration_matches`)."""
    from autodl.oom import calibration_matches

    found = []
    with RecordStore(url)._session() as s:
        q = (select(RunRow).where(RunRow.outcome == "failed").order_by(RunRow.recorded_at.desc()).limit(limit))
        for row in s.execute(q).scalars():
            doc = row.document or {}
            if doc.get("oom") and calibration_matches(doc["oom"], script=script, recorded_script=doc.get("script"),
                                                      sha=sha, config=config):
                found.append((row.run_key, doc["oom"]))
    return found


def find_calibration(script: str, batch_size: int, *, profile: dict | None = None, url: str | None = None,
                     limit: int = 200):
    """What the same script (same content, same configuration) needed when it ran out of memory.

    :param script: the script path as recorded (``RunRecord.script``); its content is hashed to match.
    :param profile: the new run's profile (as JSON) for the configuration hash; None matches any configuration.
    :returns: an :class:`autodl.oom.Calibration`, or None when no such run is recorded (or all are cleared).
    """
    from autodl.oom import calibrate, config_sha256, script_sha256

    config = config_sha256(profile) if profile is not None else None
    reports = _oom_reports(script, sha=script_sha256(script), config=config, url=url, limit=limit)
    return calibrate(reports, batch_size)


def oom_floor(script: str, batch_size: int, *, url: str | None = None, limit: int = 200) -> tuple[int, str] | None:
    """``(bytes, run key)`` of :func:`find_calibration`'s device-memory floor for ``script`` at ``batch_size``, or None."""
    found = find_calibration(script, batch_size, url=url, limit=limit)
    if found is None or found.floor_bytes is None or found.run_key is None:
        return None
    return found.floor_bytes, found.run_key


def clear_calibration(script: str | None = None, *, url: str | None = None) -> list[str]:
    """Forget what out-of-memory runs taught the estimate (``autodl calibration --clear``); the records stay.

    :param script: only this script's runs (its path as recorded); None: every script's.
    :returns: the run keys whose OOM reports no longer calibrate anything.
    """
    cleared = []
    now = datetime.now(timezone.utc).isoformat(timespec="seconds")
    with RecordStore(url)._session() as s:
        for row in s.execute(select(RunRow).where(RunRow.outcome == "failed")).scalars():
            doc = dict(row.document or {})
            oom = doc.get("oom")
            if not oom or (script is not None and doc.get("script") != script):
                continue
            tag = dict(oom.get("calibration") or {})
            if tag.get("cleared_at"):
                continue
            doc["oom"] = {**oom, "calibration": {**tag, "cleared_at": now}}
            row.document = doc
            cleared.append(row.run_key)
        s.commit()
    return cleared


def measured_peak(profile, *, url: str | None = None, limit: int = 200) -> tuple[int, str, str | None] | None:
    """``(bytes, run key, device model)`` of the newest succeeded run of the very profile ``profile`` is (same
    :attr:`~autodl.types.ResourceProfile.profile_key`: script content, folder, spec, environment, versions) at
    the same batch, on a device (not a declared pool: a CPU run's RSS is not a device's need), with a measured
    peak (``actual_peak_bytes``: NVML's per-process memory, CUDA context included, as ``peak_memory_bytes``)."""
    if not profile.profile_key:
        return None
    with RecordStore(url)._session() as s:
        q = (select(RunRow).where(RunRow.outcome == "succeeded", RunRow.actual_peak_bytes.is_not(None))
             .order_by(RunRow.recorded_at.desc()).limit(limit))
        for row in s.execute(q).scalars():
            doc = row.document or {}
            prof = doc.get("profile") or {}
            if prof.get("profile_key") == profile.profile_key and prof.get("batch_size") == profile.batch_size \
                    and not doc.get("declared_pool") and (row.actual_peak_bytes or 0) > 0:
                return int(row.actual_peak_bytes), row.run_key, row.device_model
    return None


def _measured_calibration(profile, url: str | None, threshold: float | None):
    """``profile`` calibrated by the previous run's own measured peak (:func:`measured_peak`): raised to it when it
    was higher (a ``measured-calibration`` warning), kept when it was lower (an info with the ratio: a run's peak
    can depend on the data it met, so one run's lower peak does not lower the estimate)."""
    from autodl.types import Finding

    found = measured_peak(profile, url=url)
    if found is None:
        return profile
    peak, key, device = found
    gib = 1 << 30
    where = f"run {key}" + (f" on {device}" if device else "")
    if peak > profile.peak_memory_bytes:
        note = Finding(severity="warning", code="measured-calibration", message=(
            f"estimate raised from {profile.peak_memory_bytes / gib:.2f} to {peak / gib:.2f} GiB per device: {where}, "
            f"the same script and spec at batch {profile.batch_size}, measured that peak (its own, CUDA context "
            "included); a run needs at least what the same run needed."))
        return raised_to(profile, peak, note, threshold)
    note = Finding(severity="info", code="measured-calibration", message=(
        f"{where}, the same script and spec at batch {profile.batch_size}, measured a peak of {peak / gib:.2f} GiB "
        f"per device, {peak / max(1, profile.peak_memory_bytes):.0%} of this estimate ({profile.peak_memory_bytes / gib:.2f} "
        "GiB); the estimate is kept (one run's peak depends on the data it met)."))
    return profile.model_copy(update={"findings": [*profile.findings, note]})


def calibrate_profile(profile, *, url: str | None = None, threshold: float | None = None):
    """``profile`` with its peak raised to what the same script needed when it ran out of memory (:func:`find_calibration`),
    and to what the previous successful run of the same profile measured (:func:`measured_peak`, issue 18).

    The raise is said in a warning finding (code ``oom-calibration``): from what to what, after which run, and
    how to clear it; host-memory failures are said, never raised from. A store that cannot be read leaves the
    profile as it is, with a warning saying so: calibration never blocks a run.

    :param profile: a :class:`~autodl.types.ResourceProfile`.
    :param threshold: the fraction of device memory a run may plan to use, for the largest batch per device
        (``resource_policy.memory_threshold``; default the spec's default).
    :returns: the same profile, or a copy with ``peak_memory_bytes`` raised (the rise counted as activations when
        the failed allocation scales with the batch or is not known not to, as workspace when it does not).
    """
    from autodl.types import Finding

    try:
        profile = _measured_calibration(profile, url, threshold)
        found = find_calibration(profile.script, profile.batch_size, profile=profile.to_json(), url=url)
    except Exception as exc:  # noqa: BLE001 - a store problem must not stop profiling
        note = Finding(severity="warning", code="oom-calibration",
                       message=f"could not read past out-of-memory runs of this script ({type(exc).__name__}); estimate not checked against them")
        return profile.model_copy(update={"findings": [*profile.findings, note]})
    if found is None:
        return profile
    gib = 1 << 30
    clear = f"`autodl calibration --clear --script {profile.script}` forgets it"
    notes = []
    if found.host_runs:
        notes.append(Finding(severity="info", code="oom-calibration",
                             message=f"run {found.host_runs[0]} of this script ran out of host (CPU) memory: the device "
                                     "estimate is not raised from it"))
    if found.floor_bytes is None or found.floor_bytes <= profile.peak_memory_bytes:
        return profile.model_copy(update={"findings": [*profile.findings, *notes]}) if notes else profile
    how = {"fixed": " (the same allocation failed at two batch sizes: it does not scale with the batch, so a smaller "
                    "batch does not help)",
           "scales": " (rescaled from its batch: the failed allocation grew with the batch)",
           "unknown": "" if found.batch_size == profile.batch_size else
                      f" (rescaled from batch {found.batch_size}, assuming it scales with the batch)"}[found.scaling]
    note = Finding(severity="warning", code="oom-calibration",
                   message=f"estimate raised from {profile.peak_memory_bytes / gib:.2f} to {found.floor_bytes / gib:.2f} GiB "
                           f"per device after run {found.run_key}, which ran out of memory on "
                           f"{found.device_kind or 'an unknown device'} at batch {found.batch_size}{how}; "
                           f"a change to the script, or {clear}")
    return raised_to(profile, found.floor_bytes, note, threshold, fixed=found.scaling == "fixed", extra_notes=notes)


def raised_to(profile, floor: int, note, threshold: float | None, *, fixed: bool = False, extra_notes=(),
              measured: int | None = None):
    """``profile`` with its peak raised to ``floor``, so the largest batch per device and the advice (AMP, recompute,
    a smaller batch) are worked out from the raised figure, not from the estimate that failed.

    :param fixed: the failed allocation does not scale with the batch (:func:`autodl.oom.scaling_of`): the rise is
        counted as workspace, so no smaller batch is worked out to fit; otherwise as activations (the part that
        scales with the batch, as :func:`autodl.oom.floor_at_batch` assumes).
    :param extra_notes: findings added before ``note`` (host-memory failures that raised nothing).
    :param measured: the part of ``floor`` that was measured (bytes), kept as ``floor_bytes``; default all of it.
    """
    from autodl.catalog import load_catalog

    extra = floor - profile.peak_memory_bytes
    if fixed:  # batch-independent: workspace, so no smaller batch is worked out to fit
        update = {"breakdown": profile.breakdown.model_copy(update={
            "workspace_bytes": profile.breakdown.workspace_bytes + extra})}
    else:
        activations = profile.breakdown.activations_bytes + extra
        update = {"breakdown": profile.breakdown.model_copy(update={"activations_bytes": activations}),
                  "activation_bytes_per_sample": activations // max(1, profile.batch_size)}
    known = max(profile.floor_bytes or 0, floor if measured is None else measured)
    raised = profile.model_copy(update={"peak_memory_bytes": floor, "floor_bytes": known, **update,
                                        "findings": [*profile.findings, *extra_notes, note]})
    try:
        models = load_catalog().models
    except Exception:  # noqa: BLE001 - the figures below are advice; the raised peak is what matters
        return raised
    if threshold is None:
        from autodl.spec import DEFAULT_MEMORY_THRESHOLD

        threshold = DEFAULT_MEMORY_THRESHOLD
    by_device = {name: (raised.max_batch_size(models[name].memory_bytes, threshold) if name in models else n)
                 for name, n in profile.max_batch_size_by_device.items()}
    by_device = {name: b for name, b in by_device.items() if b is not None}
    return raised.model_copy(update={"max_batch_size_by_device": by_device})
