"""The values that flow through the six steps: profile, inventory, placement, lease, launch, metrics, record.

Every type here is a small frozen pydantic model, JSON-serialisable with ``model_dump(mode="json")``
so it can travel as an XCom, a CLI ``--json`` document or a row in the store. Units are in the field
names (``_bytes``, ``_s``, ``_pct``, ``_tflops``).
"""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any, Literal, Self

from pydantic import BaseModel, ConfigDict, Field, field_serializer, field_validator

Severity = Literal["info", "warning", "error"]

Sharing = Literal["exclusive", "packed"]
"""``exclusive``: the run's devices are its own (every lease before issue 24). ``packed``: a 1-device run may
share its device with one other packed run when both estimates fit (:func:`autodl.policy.packing.fits_beside`)."""

Venue = Literal["worker", "docker", "kubernetes"]
"""Where the dry run ran the script: this worker's sandbox, a container or a pod of the launcher's image."""

DryRunIn = Literal["auto", "worker", "launcher"]
"""Where a spec asks the dry run to run the script (``task.dry_run_in``, ``[autodl] dry_run_in``)."""

RunOutcome = Literal["succeeded", "failed", "not_started", "stopped"]
"""How a run ended, as its record says."""


def utcnow() -> datetime:
    """Current time, timezone-aware UTC."""
    return datetime.now(timezone.utc)


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    def to_json(self) -> dict[str, Any]:
        """JSON-ready dict (datetimes as ISO strings)."""
        return self.model_dump(mode="json")


# --------------------------------------------------------------------------------------- profile
class Finding(_Frozen):
    """Something the profiler noticed, with the script line when known."""

    severity: Severity
    code: str = Field(description="Stable identifier, e.g. 'hardcoded-device', 'shape-mismatch'.")
    message: str = Field(description="Shown to people: secrets in it (URLs' passwords, tokens) are redacted.")
    line: int | None = None

    @field_validator("message")
    @classmethod
    def _redacted(cls, value: str) -> str:
        # a probe's stderr may echo what the script read (e.g. the worker's environment): never print a secret
        from autodl.redact import redact_text

        return redact_text(value)


class MemoryBreakdown(_Frozen):
    """Peak training memory of one device, in bytes, by term."""

    weights_bytes: int = 0
    gradients_bytes: int = 0
    optimizer_state_bytes: int = 0
    activations_bytes: int = 0
    workspace_bytes: int = Field(0, description="CUDA context, library workspaces, allocator slack.")

    @property
    def total_bytes(self) -> int:
        return (
            self.weights_bytes
            + self.gradients_bytes
            + self.optimizer_state_bytes
            + self.activations_bytes
            + self.workspace_bytes
        )


class PhasePeak(_Frozen):
    """The tensor peak of one phase of a run (a training step, an evaluation pass), per input shape met.

    ``peak_bytes`` is at ``batch_size`` (the profile's per-device batch for training; the batch the script
    evaluates with for evaluation); ``measured`` holds the ``(batch, bytes)`` points it was read from.
    """

    name: str = Field(description="'train' or 'eval'.")
    batch_size: int | None = None
    peak_bytes: int
    extrapolated: bool = False
    measured: list[tuple[int, int]] = Field(default_factory=list, description="(batch, allocator peak bytes) as run.")
    input_shapes: list[list[int]] = Field(default_factory=list, description="Per-sample shapes of the model's inputs.")
    input_dtypes: list[str] = Field(default_factory=list)
    forward_flops_per_sample: float | None = Field(default=None, description=(
        "Forward FLOPs per sample of one call of the model."))
    step_flops_per_sample: float | None = Field(default=None, description=(
        "Training FLOPs per sample of one whole step: every forward call in it x 3, plus recomputed forwards."))
    slope_bytes_per_sample: int | None = None
    grad: bool = Field(True, description="False for an evaluation pass under no_grad.")


class ResourceProfile(_Frozen):
    """What one training run needs, per device, as estimated before anything is booked.

    ``peak_memory_bytes`` is the per-device peak (under data parallelism each card holds the
    full model and its per-card batch). ``activation_bytes_per_sample`` lets callers rescale the
    peak to another batch size: ``peak(b) = peak - activations + b * activation_bytes_per_sample``.
    """

    script: str
    model_name: str | None = None
    params: int | None  # None: unknown (the model was not found; a cold-start finding says so), never 0
    trainable_params: int | None = None
    peak_memory_bytes: int
    breakdown: MemoryBreakdown
    activation_bytes_per_sample: int = 0
    flops_per_step: float | None = Field(
        description="Training FLOPs of one step on one device (fwd+bwd); null when unknown (a model autodl "
                    "could not find: the cold-start warning says so).")
    batch_size: int
    sequence_length: int | None = None
    input_shape: list[int] | None = Field(None, description="Per-sample input shape, e.g. [3, 32, 32].")
    num_gpus: int = 1
    optimizer: str | None = None
    amp: str | None = Field(None, description="None, 'O1' or 'O2'.")
    dtype: str = "float32"
    recompute: bool = False
    distributed: str | None = Field(None, description="None, 'data_parallel' or 'fleet'.")
    num_workers: int | None = Field(0, description="DataLoader worker processes; None when the script's value could "
                                                   "not be read (acted on as > 0: the launcher gives /dev/shm).")
    method: str = Field("static", description="'dry_run', 'probe' or 'cold_start' (the conservative bound); 'static' in profiles made before issue 20.")
    method_reason: str | None = Field(None, description="Why this path was taken (and why the ones before it were not).")
    phases: list[PhasePeak] = Field(default_factory=list, description="Tensor peak per phase; the profile's is their maximum.")
    dry_run_seconds: float | None = None
    dry_run_in: Venue | None = Field(
        None, description="Where the dry run ran the script: this worker's sandbox, a container or a pod of the "
                          "launcher's image; None: it did not run (method_reason says why).")
    profile_key: str | None = Field(default=None, description=(
        "The profile cache's key (autodl.profile.cache.ProfileKey): what the profile rests on; None: not cached."))
    probe_seconds: float | None = None
    findings: list[Finding] = Field(default_factory=list)
    max_batch_size_by_device: dict[str, int] = Field(default_factory=dict)
    tensor_peak_bytes: int | None = Field(
        None, description="Peak of tensor allocations (model states + activations), the part a CPU allocator measures.")
    workspace_terms_bytes: dict[str, int] = Field(
        default_factory=dict, description="workspace_bytes by named term (cuda_context, cudnn_workspace, ...).")
    estimates_bytes: dict[str, int] = Field(
        default_factory=dict, description="Tensor peak by method ('dry_run', 'static', 'probe', 'cold_start') at batch_size.")
    probe_batch_sizes: list[int] | None = Field(None, description="Batch sizes the probe ran to extrapolate from.")
    floor_bytes: int | None = Field(None, ge=0, description=(
        "Least per-device memory the run is known to need, bytes: one allocation the dry run saw fail, or an earlier "
        "run's out-of-memory floor (autodl.records.raised_to). Measured, unlike the cold-start figure, so it holds "
        "when the model's size is unknown (autodl.policy.need)."))

    @property
    def errors(self) -> list[Finding]:
        return [f for f in self.findings if f.severity == "error"]

    def _split(self) -> tuple[int, int]:
        """(bytes that do not scale with the batch, activation bytes per sample)."""
        fixed = self.peak_memory_bytes - self.breakdown.activations_bytes
        per_sample = self.activation_bytes_per_sample or (self.breakdown.activations_bytes // max(1, self.batch_size))
        return fixed, per_sample

    def peak_at_batch(self, batch_size: int) -> int:
        """Per-device peak memory in bytes at another per-device ``batch_size``.

        Model states and workspace stay; activations scale linearly with the batch.
        """
        fixed, per_sample = self._split()
        return int(fixed + batch_size * per_sample)

    def max_batch_size(self, memory_bytes: int, threshold: float) -> int | None:
        """Largest per-device batch whose peak stays within ``threshold * memory_bytes`` (0 if none); None when
        the parameter count is unknown (a model autodl could not find: its weights, gradients and optimizer
        state are unknown, and any batch figure would assume a weightless model)."""
        if self.params is None:
            return None
        budget = threshold * memory_bytes
        fixed, per_sample = self._split()
        if fixed > budget:
            return 0
        if per_sample <= 0:
            return 1 << 20
        return int((budget - fixed) // per_sample)


# ------------------------------------------------------------------------------------- inventory
class Device(_Frozen):
    """One accelerator (or MIG instance) in the pool, as the inventory saw it."""

    device_id: str = Field(description="Stable id within the pool: the UUID when known, else 'host:index'.")
    host: str = "localhost"
    index: int = Field(description="Index on its host (PCI bus order).")
    uuid: str | None = None
    model: str = Field(description="Catalog model name, e.g. 'A100-SXM4-40GB'.")
    vendor: str = "nvidia"
    memory_total_bytes: int = Field(description=(
        "The device's own memory (a MIG instance's slice), bytes; 0 in Python and null in JSON when nobody could "
        "say it (an unhealthy device NVML could not read and the catalog does not know)."))
    memory_used_bytes: int | None = Field(
        0, description="Used now, bytes; None when the source could not read it (unknown, never 0).")
    utilization_pct: float | None = Field(
        0.0, description="Busy %, None when not reported (MIG instances, NotSupported, a stale series).")
    temperature_c: float | None = None
    power_w: float | None = None
    healthy: bool = True
    health_reason: str | None = Field(None, description="Why the device is unhealthy (e.g. 'GPU is lost').")
    compute_fraction: float | None = Field(
        None, description="Share of the parent GPU's compute (a MIG instance, 0-1); None for a whole device.")
    declared: bool = Field(False, description="True when read from a pool file, not from a driver.")
    pci_bus_id: str | None = None
    nvlink_group: str | None = Field(None, description="Devices sharing a group are NVLink-connected.")
    labels: dict[str, str] = Field(default_factory=dict)
    unknown: list[str] = Field(
        default_factory=list, description="Fields the source could not read, each with why ('utilization_pct: Not Supported').")

    @field_validator("memory_total_bytes", mode="before")
    @classmethod
    def _total_from_json(cls, value: Any) -> Any:
        return 0 if value is None else value

    @field_serializer("memory_total_bytes", when_used="json")
    def _total_to_json(self, value: int) -> int | None:
        return value or None   # unknown is null in every JSON view (CLI, UI API, XCom), never 0

    @property
    def memory_free_bytes(self) -> int | None:
        """Free memory in bytes, or None when the used memory is unknown."""
        if self.memory_used_bytes is None:
            return None
        return max(0, self.memory_total_bytes - self.memory_used_bytes)


class Inventory(_Frozen):
    """A snapshot of the pool."""

    source: str = Field(description="'nvml', 'file:<path>', 'prometheus:<url>', ...")
    declared: bool
    devices: list[Device]
    read_at: datetime = Field(default_factory=utcnow)
    notes: list[str] = Field(default_factory=list, description="How the source was chosen, what it could not read.")


# ------------------------------------------------------------------------------------- placement
class Candidate(_Frozen):
    """One device set the policy looked at, kept or dropped, with why."""

    devices: list[str]
    model: str
    host: str = "localhost"
    kept: bool
    score: float | None = None
    terms: dict[str, float] = Field(default_factory=dict, description="Score terms, each visible.")
    est_step_time_s: float | None = None
    reasons: list[str] = Field(default_factory=list)


class PlacementDecision(_Frozen):
    """The policy's answer: ranked candidates (kept first, best first), then the dropped ones."""

    algorithm: str
    fits: bool = Field(description="True when some device set in the pool could ever hold the run.")
    available: bool = Field(description="True when a fitting device set is free now.")
    needed_bytes: int
    candidates: list[Candidate]
    chosen: Candidate | None = None
    suggestions: list[str] = Field(default_factory=list)


class LeaseOwner(_Frozen):
    """Who booked a lease: the Airflow DAG and run, the user who triggered it (or ran the CLI), and the team
    queue whose quota it counts against (:mod:`autodl.quota`)."""

    dag_id: str | None = None
    run_id: str | None = None
    user: str | None = None
    team: str | None = None

    def describe(self) -> str:
        """``user U, DAG D, run R`` with unknown parts said to be unknown."""
        return (f"user {self.user or '(unknown)'}, DAG {self.dag_id or '(none)'}, "
                f"run {self.run_id or '(none)'}")


class Lease(_Frozen):
    """A booking of devices for one run; the ledger guarantees one live lease per device.

    A lease lives while its holder heartbeats: ``expires_at`` is the last heartbeat plus ``ttl_s``
    seconds; past it the lease is dead and a reaper stops what it left and frees it. ``expires_at`` None
    (a lease booked before TTLs existed) never expires by itself.
    """

    lease_id: str
    run_key: str
    device_ids: list[str]
    host: str = "localhost"
    model: str | None = None
    created_at: datetime = Field(default_factory=utcnow)
    owner: LeaseOwner = Field(default_factory=LeaseOwner)
    ttl_s: float | None = Field(None, description="Seconds the lease lives without a heartbeat.")
    heartbeat_at: datetime | None = None
    expires_at: datetime | None = None
    launcher: str | None = Field(None, description="Launcher type that runs (or will run) the training.")
    handle: dict[str, Any] | None = Field(None, description="The LaunchHandle once launched: how to stop it.")
    launched_on: str | None = Field(None, description="Host name of the machine that launched the training.")
    placement: dict[str, Any] | None = Field(None, description="The chosen candidate (devices, model, score, reasons).")
    expected_runtime_s: float | None = None
    sharing: Literal["exclusive", "shared"] = Field(
        default="exclusive", description="exclusive: the devices are this lease's alone; shared: a packed 1-device lease "
                                 "that may hold its device with one other (autodl.policy.packing).")
    reserved_bytes: int | None = Field(
        default=None, description="Device memory a shared lease reserves on its device, bytes (its estimate, plus one more "
                          "CUDA context when it joined a device in use); None for an exclusive lease (the whole device).")
    co_tenants: list[str] = Field(
        default_factory=list, description="Run keys of the leases that shared this lease's device while it lived.")

    def expired(self, now: datetime | None = None) -> bool:
        """True when the lease's TTL has run out (never for a lease without TTL)."""
        return self.expires_at is not None and self.expires_at < (now or utcnow())


class StopMark(_Frozen):
    """A training stopped by hand (``autodl leases --release``): who, when, how. Written before the stop
    signal, so whoever sees the training end (exit 143 after SIGTERM, 137 after SIGKILL) can tell a manual
    stop from a crash or an out-of-memory kill."""

    lease_id: str
    run_key: str
    by: str | None = Field(None, description="The user who released it; None when unknown.")
    at: datetime = Field(default_factory=utcnow)
    how: str = "autodl leases --release"
    forced: bool = Field(False, description="Released with --force (the lease was another user's).")

    def describe(self) -> str:
        """``stopped by autodl leases --release (by alice at 2026-12-01T04:00:00+00:00)``."""
        return f"stopped by {self.how} (by {self.by or '(unknown user)'} at {self.at.isoformat(timespec='seconds')})"


class QueueEntry(_Frozen):
    """A run waiting in the admission queue for devices, with its request.

    ``candidates`` are the device sets its own placement policy accepts (leases ignored), best first:
    the queue offers a run only devices from these, so every waiter decides the same way for the others.
    """

    run_key: str
    dag_id: str | None = None
    run_id: str | None = None
    owner_user: str | None = None
    num_gpus: int = Field(ge=1, description="Gang size: devices needed at once.")
    needed_bytes: int = Field(ge=0, description="Estimated per-device peak memory, bytes.")
    vendors: list[str] | None = None
    candidates: list[list[str]] = Field(default_factory=list)
    pool: str | None = None
    enqueued_at: datetime
    heartbeat_at: datetime
    stale_after_s: float = Field(gt=0, description="Without a heartbeat for this long the entry stops blocking others.")
    expected_runtime_s: float | None = None
    deadline_at: datetime | None = None
    team: str | None = Field(None, description="The team queue whose quota it counts against (autodl.quota).")
    priority: int = Field(0, description="Priority within its team: higher goes first.")
    speed_by_type: dict[str, float] | None = Field(None, description="Expected speed per device type (model name), "
                                                   "relative to the reference of expected_runtime_s.")
    runtime_source: str | None = Field(None, description="Where expected_runtime_s came from: 'records' (earlier "
                                       "runs of this DAG) or 'flops' (the profile's FLOPs / the device's TFLOPS).")
    sharing: Sharing = Field(
        default="exclusive", description="The spec's resource_policy.sharing: packed runs may share a device.")

    def stale(self, now: datetime | None = None) -> bool:
        """True when the poller of this entry has not been seen for ``stale_after_s`` seconds."""
        return ((now or utcnow()) - self.heartbeat_at).total_seconds() > self.stale_after_s


# ---------------------------------------------------------------------------------------- launch
class LaunchHandle(_Frozen):
    """Enough to find a started training again from another task or try."""

    launcher: str
    run_key: str
    lease_id: str | None = None
    host: str | None = Field(None, description="The GPU host the training was started on (the booked devices' host).")
    pid: int | None = None
    pgid: int | None = None
    container_id: str | None = None
    container_name: str | None = None
    pod_name: str | None = None
    namespace: str | None = None
    log_path: str | None = None
    exit_path: str | None = None
    steps_path: str | None = Field(None, description="JSON lines the training may append per step (AUTODL_METRICS_FILE).")
    command: list[str] = Field(default_factory=list)
    visible_devices: str | None = None
    device_ids: list[str] = Field(default_factory=list)
    on_cpu: bool = False
    started_at: datetime = Field(default_factory=utcnow)
    reattached: bool = False


class RunMetrics(_Frozen):
    """Summary of what the run did (the time series stays in the metrics file, not in XCom)."""

    source: str = Field(description="'nvml', 'dcgm' (dcgm-exporter's series in Prometheus: a pod's GPUs, "
                                    "autodl.dcgm), 'process' (CPU/RSS when no GPU is present) or 'none'.")
    duration_s: float
    exit_code: int | None
    samples: int = 0
    peak_memory_bytes: int | None = Field(
        None, description="The run's own per-device peak, bytes (see peak_source); never device-wide 'used'.")
    peak_source: str | None = Field(
        None, description="Where peak_memory_bytes comes from: 'paddle_reserved' (the training's allocator), "
                          "'nvml_process' (NVML per-process memory of the run's processes) or 'rss' (CPU run).")
    allocated_peak_bytes: int | None = Field(
        None, description="Paddle's max_memory_allocated (tensors), max over the run's devices, bytes.")
    reserved_peak_bytes: int | None = Field(
        None, description="Paddle's max_memory_reserved (allocator pool), max over the run's devices, bytes.")
    process_peak_bytes: int | None = Field(
        None, description="NVML per-process memory of the run's processes, max over its devices, bytes.")
    device_used_peak_bytes: int | None = Field(
        None, description="Device-wide 'used' (every process), max over samples and devices: context, not the run's.")
    others_memory_bytes: int | None = Field(
        None, description="Most memory other processes held on the run's devices while it ran, bytes.")
    peak_by_device: dict[str, dict[str, int | None]] = Field(
        default_factory=dict, description="Per device (UUID or Paddle place): allocated/reserved/process peaks, bytes.")
    oom: dict[str, Any] | None = Field(None, description="The out-of-memory explanation when the training died of one.")
    notes: list[str] = Field(default_factory=list, description="What could not be measured, and why.")
    mean_utilization_pct: float | None = None
    max_utilization_pct: float | None = None
    max_temperature_c: float | None = None
    mean_power_w: float | None = None
    steps: int | None = Field(None, description="Training steps the script reported through AUTODL_METRICS_FILE.")
    step_time_s: float | None = Field(None, description="Median seconds per step, first step (warm-up) excluded.")
    samples_per_s: float | None = Field(None, description="Training throughput from the reported steps.")
    reported_step_time_s: float | None = Field(
        None, description="The median the training's own step lines give, seconds, believed or not (step_time_s is "
                          "None when they contradict the measured run: autodl.metrics.checked_steps).")
    self_reported: list[str] = Field(
        default_factory=list, description="Fields holding the training's own word (its step lines, its memory report), "
                                          "not autodl's measurement.")
    samples_path: str | None = None


class RunRecord(_Frozen):
    """What the run was, where it ran and how it went; feeds later estimates and the rl policy."""

    run_key: str
    dag_id: str | None = None
    run_id: str | None = None
    script: str
    spec_path: str | None = None
    outcome: RunOutcome = Field(
        description="``stopped``: stopped by hand (``autodl leases --release``) before it ended; see ``stopped``.")
    declared_pool: bool
    profile: dict[str, Any] | None = None
    placement: dict[str, Any] | None = None
    lease_id: str | None = None
    launch: dict[str, Any] | None = None
    metrics: dict[str, Any] | None = None
    estimated_peak_bytes: int | None = None
    actual_peak_bytes: int | None = Field(None, description="The run's own peak (RunMetrics.peak_memory_bytes).")
    allocated_peak_bytes: int | None = Field(None, description="Paddle's allocated (tensor) peak, bytes.")
    reserved_peak_bytes: int | None = Field(None, description="Paddle's reserved (allocator pool) peak, bytes.")
    oom: dict[str, Any] | None = Field(None, description="Out-of-memory explanation (autodl.oom.OOMReport) when it died of one.")
    device_model: str | None = None
    error: str | None = Field(None, description="Why the run failed; secrets in it are redacted.")
    decision: dict[str, Any] | None = Field(
        None, description="The PlacementDecision the booking was made on: every candidate, ranked, kept or "
                          "dropped, with its score terms and reasons.")
    report: dict[str, Any] | None = Field(
        None, description="What the training said about itself in AUTODL_REPORT_FILE (e.g. the checkpoint and "
                          "epoch it resumed from); None when it wrote nothing.")
    stopped: StopMark | None = Field(
        None, description="Who stopped the training by hand and when (outcome ``stopped``); None otherwise.")
    notes: list[str] = Field(
        default_factory=list, description="What autodl did on the way that the run should know, oldest first (a "
                                          "booking released and re-queued because no worker launched it in time).")
    sharing: Literal["exclusive", "shared"] = Field(
        default="exclusive", description="Its lease's sharing: exclusive (the devices were its own) or shared (a "
                                         "packed run that may have held its device with one other).")
    co_tenants: list[str] = Field(
        default_factory=list, description="Run keys of the runs that shared its device while its lease lived "
                                          "(the lease's co_tenants); empty: it ran alone.")
    device_memory_cap_bytes: int | None = Field(
        default=None, description="The device memory a shared run was capped at (its lease's reserved_bytes, set as "
                                  "Paddle's FLAGS_gpu_memory_limit_mb), bytes; None: no cap (the whole device).")
    attempts: list[dict[str, Any]] = Field(
        default_factory=list, description="The run's earlier attempts (a clear and re-run in Airflow books and "
                                          "trains again), oldest first, each the record it had then; the record "
                                          "itself is the last attempt (autodl.records.RecordStore.write).")
    recorded_at: datetime = Field(default_factory=utcnow)

    @field_validator("error")
    @classmethod
    def _redacted(cls, value: str | None) -> str | None:
        from autodl.redact import redact_text

        return redact_text(value) if value else value


# ---------------------------------------------------------------------------------- step values
class StepValue(_Frozen):
    """A value one step hands the next (through an XCom, a trigger's kwargs and :class:`autodl.store.RunState`).

    Inside autodl it is a model; ``model_dump(mode="json")`` happens only at the XCom or trigger edge, and
    :meth:`coerce` turns what comes back from there into the model again, so a renamed or missing field
    fails where the value is read, naming the field, not later in another process.
    """

    @classmethod
    def coerce(cls, value: Any, *, what: str | None = None) -> Self:
        """``value`` as this model (a model is returned as is, a dict validated).

        :param what: where the value came from, for the message (e.g. "the profile step's XCom").
        :raises StateError: when it is not a valid value of this model (the message names the fields).
        """
        from pydantic import ValidationError

        from autodl.errors import StateError

        if isinstance(value, cls):
            return value
        try:
            return cls.model_validate(value)
        except ValidationError as exc:
            fields = "; ".join(f"{'.'.join(str(p) for p in e['loc']) or '(value)'}: {e['msg']}" for e in exc.errors()[:5])
            raise StateError(f"{what or cls.__name__} is not a valid {cls.__name__} ({fields}); it was written by "
                             "another autodl version or by hand: clear the task and its upstream steps to run "
                             "them again.") from None


class ProfileResult(StepValue):
    """What the profile step hands on: the profile and the inputs the later steps go by."""

    profile: ResourceProfile
    script: str = Field(description="The script's resolved path.")
    spec_path: str | None = None
    pool_source: str | None = Field(
        None, description="The inventory source the profile was checked against ('file:<path>', 'nvml', ...); None: not checked.")
    declared_pool: bool = False
    profiled_in: Literal[Venue, "not-run"] = Field(
        "not-run", description="Where the script ran for the estimate (the dry run's venue); 'not-run': the "
                               "estimate is the conservative bound (the profile's findings say why).")
    overrides: dict[str, str | list[str]] = Field(
        default_factory=dict, description="Run-time spec overrides, e.g. {'launcher': 'docker', 'args': ['--epochs', '3']}.")


class Selection(StepValue):
    """What the wait and select steps hand on: the lease, the chosen placement and the booked devices."""

    lease: Lease
    placement: dict[str, Any] = Field(description="The chosen candidate (devices, model, host, score, reasons).")
    devices: list[Device] = Field(description="The booked devices, in the lease's order, as the launcher needs them.")
    declared_pool: bool
    pool_source: str
    algorithm: str = Field(description="The placement policy that chose ('rule_based', 'rl_based', ...).")
    candidates_log: list[str] = Field(default_factory=list, description="The ranked candidates as logged at booking.")

    @property
    def host(self) -> str | None:
        """The booked devices' host (None when unknown, e.g. 'localhost' of a declared pool)."""
        from autodl.hosts import booked_host

        return booked_host(d.host for d in self.devices)


class PoolEvent(StepValue):
    """The event :class:`autodl.triggers.pool.PoolTrigger` fires once.

    ``booked``: the run holds its lease (``selection``); ``no_fit``: nothing in the pool could ever hold it;
    ``timeout``: it waited past ``scheduler.timeout``; ``error``: a bad spec, script or pool file.
    """

    status: Literal["booked", "no_fit", "timeout", "error"]
    selection: Selection | None = None
    message: str = ""


StopStatus = Literal["lease_lost", "timed_out", "unschedulable", "stopped"]
"""Why the collect stopped a training before it ended by itself (:class:`autodl.steps.collect.CollectStopped`)."""


class CollectEvent(StepValue):
    """The event :class:`autodl.triggers.collect.CollectTrigger` fires once.

    ``ended``: the training ended by itself (``exit_code``); ``lease_lost``, ``timed_out``, ``unschedulable``,
    ``stopped`` (by hand): the trigger stopped it early (:class:`autodl.steps.collect.CollectStopped`), ``message``
    says why. ``metrics`` is what was measured up to then, in every case.
    """

    status: Literal["ended", StopStatus] = Field(
        description="'ended', or why it was stopped (:data:`StopStatus`).")
    exit_code: int | None = Field(None, description="The training's exit status; None unless ``ended``.")
    message: str = ""
    metrics: RunMetrics
