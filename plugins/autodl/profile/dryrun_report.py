"""The dry-run child's report as a typed model: every field it may hold, bounded, since the user's script ran in
the process that wrote it and can forge any of it (issue 20 item 7).

Details: docs/reference/estimator.md#autodlprofiledryrun_report.
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    SerializerFunctionWrapHandler,
    ValidationError,
    model_serializer,
    model_validator,
)

from autodl.profile.probe import REPORT_MAX_BYTES, report_object, report_text

MAX_BATCH = 1 << 30
"""Largest batch believed from the report (:data:`autodl.fields.MAX_BATCH_PER_DEVICE`)."""

SIG_TENSORS = 64
"""Most tensors of one input signature believed (the child's first-sample fields: ``SAMPLE_FIELDS``)."""

MAX_RECORDS = 10_000
"""Most step or evaluation records believed (the child measures a few dozen)."""


def _count(lo: int = 0, hi: int = REPORT_MAX_BYTES) -> Any:
    """An integer (not a bool, not a float) from ``lo`` to ``hi``."""
    return Field(strict=True, ge=lo, le=hi)


def _number(hi: float = 1e30) -> Any:
    """A finite number (int or float, not a bool) from 0 to ``hi``."""
    return Field(strict=True, ge=0, le=hi)


def _or_zero(v: Any) -> Any:
    return v or 0


def _none_is_empty(v: Any) -> Any:
    return [] if v is None else v


def _is_true(v: Any) -> bool:
    return v is True


Bytes = Annotated[int, _count()]
Batch = Annotated[int, _count(1, MAX_BATCH)]
ZeroBytes = Annotated[int, BeforeValidator(_or_zero), _count()]
Text = Annotated[str | None, BeforeValidator(report_text)]
Flag = Annotated[bool, BeforeValidator(_is_true)]
Seconds = Annotated[float, BeforeValidator(_or_zero), _number(1e7)]
Flops = Annotated[float, BeforeValidator(_or_zero), _number()]


def _keep_set(handler: SerializerFunctionWrapHandler, value: Any, optional: tuple[str, ...]) -> dict[str, Any]:
    """``value`` dumped without the ``optional`` keys that are None (the report holds them only when set)."""
    out = handler(value)
    return {k: v for k, v in out.items() if k not in optional or v is not None}


class _Model(BaseModel):
    # unknown keys are dropped, not refused: the report keeps only what summarize reads (as the hand checks did)
    model_config = ConfigDict(extra="ignore", frozen=True)


class TensorSig(_Model):
    """One tensor of an input signature (a step's inputs, a loader's first sample)."""

    shape: Annotated[list[Annotated[int, _count(0, MAX_BATCH)]], BeforeValidator(_none_is_empty),
                     Field(max_length=16)] = Field(default_factory=list, description="dimensions, at most 16")
    dtype: Annotated[str, BeforeValidator(lambda v: report_text(v) or "?")] = Field(
        default="?", description="Paddle dtype name; ``?`` when not said")
    min: Annotated[int, _count(-(1 << 62), 1 << 62)] | None = Field(
        default=None, description="smallest value of an integer tensor (embedding ids, labels)")
    max: Annotated[int, _count(-(1 << 62), 1 << 62)] | None = Field(
        default=None, description="largest value of an integer tensor")

    @model_serializer(mode="wrap")
    def _dump(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        return _keep_set(handler, self, ("min", "max"))


Signature = Annotated[list[TensorSig], Field(max_length=SIG_TENSORS)] | None


class _Record(_Model):
    batch: Batch | None = Field(default=None, description="the model's batch (inputs' first dimension)")
    peak: Bytes = Field(description="allocator peak of the step or call (bytes)")
    start_bytes: Bytes = Field(description="allocated when it started (bytes)")
    inputs: Signature = Field(default=None, description="its inputs' signature")
    fwd_flops: Flops = Field(default=0.0, description="forward FLOPs counted")
    seconds: Seconds = Field(default=0.0, description="wall time (s)")


class StepRecord(_Record):
    """One training step the child measured."""

    fwd_bwd_peak: Bytes = Field(description="peak up to the end of backward (bytes)")
    update_peak: Bytes = Field(description="peak of the optimizer update (bytes)")
    kept_adjust: ZeroBytes = Field(default=0, description="bytes kept across steps the peak is corrected by")
    fwd_calls: Annotated[int, BeforeValidator(_or_zero), _count(0, 1 << 20)] = Field(
        default=0, description="forward calls in the step")
    draws: Annotated[int, BeforeValidator(_or_zero), _count(0, 1 << 20)] = Field(
        default=0, description="batches the script drew from its loaders in the step (more than one: gradient "
                               "accumulation)")
    recompute_flops: Flops = Field(default=0.0, description="FLOPs of recomputed forward passes")
    pair_flops: Flops = Field(default=0.0, description="of fwd_flops, products of two activations (attention)")
    index: Annotated[int, BeforeValidator(_or_zero), _count(0, 1 << 30)] = Field(
        default=0, description="position of the step in the run")
    fwd_bwd_seconds: Seconds = Field(default=0.0, description="time to the end of backward (s)")
    update_seconds: Seconds = Field(default=0.0, description="time of the optimizer update (s)")
    measured: Flag = Field(default=False, description="the step counts (not a warm-up)")
    steady: Flag = Field(default=False, description="its peak no longer grows")
    loader_batch: Batch | None = Field(default=None, description="samples the loader handed out for it")


class EvalRecord(_Record):
    """One evaluation call the child measured."""

    grad: Flag = Field(default=False, description="it ran with gradients on")
    native_batch: Batch | None = Field(default=None, description="the evaluation loader's own batch")
    steady_peak: Bytes | None = Field(default=None, description="peak of its later batches (bytes)")

    @model_serializer(mode="wrap")
    def _dump(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        return _keep_set(handler, self, ("steady_peak",))


class Loader(_Model):
    """A DataLoader the script made."""

    first_sample: Signature = Field(default=None, description="signature of its first sample")
    batch_size: Annotated[Batch | None, BeforeValidator(lambda v: v if type(v) is int else None)] = Field(
        default=None, description="its batch size (an integer, else not kept)")


class Frame(_Model):
    """One traceback frame."""

    file: Annotated[str, BeforeValidator(lambda v: report_text(v) or "")] = Field(default="", description="file")
    func: Text = Field(default=None, description="function")
    code: Annotated[str, BeforeValidator(lambda v: report_text(v) or "")] = Field(default="", description="line")
    line: Annotated[int | None, BeforeValidator(lambda v: v if type(v) is int and 0 < v < 1 << 31 else None)] = \
        Field(default=None, description="line number")


def _frame_or_none(v: Any) -> Any:
    return v if isinstance(v, dict) else None


MaybeFrame = Annotated[Frame | None, BeforeValidator(_frame_or_none)]


class ScriptError(_Model):
    """The exception the script ended on."""

    type: Annotated[str, BeforeValidator(lambda v: report_text(v) or "Exception")] = Field(
        default="Exception", description="exception class name")
    message: Text = Field(default=None, description="its message")
    frames: Annotated[list[MaybeFrame], BeforeValidator(_none_is_empty), Field(max_length=64),
                      AfterValidator(lambda fs: [f for f in fs if f])] = Field(
        default_factory=list, description="traceback, at most 64 frames")
    last_frame: MaybeFrame = Field(default=None, description="innermost frame")
    user_frame: MaybeFrame = Field(default=None, description="innermost frame in the user's files")
    errno: Annotated[int | None, BeforeValidator(lambda v: v if type(v) is int else None)] = Field(
        default=None, description="an OSError's errno")
    during: Text = Field(default=None, description="the phase it was raised in")
    batch_reduced: Flag = Field(default=False, description="the batch was the dry run's reduced one")


class Plan(_Model):
    """The batch sizes the child planned after the first measured step."""

    native: Batch | None = Field(default=None, description="the training loader's own batch")
    then: Annotated[list[Batch], BeforeValidator(_none_is_empty), Field(max_length=8)] = Field(
        default_factory=list, description="the batches planned next")


class EpochWalk(_Model):
    """The child's walk over a training loader's first epoch (``_epoch_head`` in the child)."""

    loader: Annotated[int, _count(0, 1 << 16)] | None = Field(default=None, description="index in ``loaders``")
    read: Flag = Field(default=False, description="its samples were read (else the lengths are unknown)")
    complete: Flag = Field(default=False, description="the whole epoch was read, within the walk's bounds")
    batches: ZeroBytes = Field(default=0, description="batches walked")
    samples: ZeroBytes = Field(default=0, description="samples read")
    seconds: Seconds = Field(default=0.0, description="time the walk took (s)")
    largest_bytes: Bytes | None = Field(default=None, description="bytes of the largest collated batch")
    first_bytes: Bytes | None = Field(default=None, description="bytes of the epoch's first collated batch")
    largest_at: Annotated[int, _count(0, 1 << 40)] | None = Field(
        default=None, description="0-based position of the largest batch in the epoch")
    largest_batch: Batch | None = Field(default=None, description="samples in the largest batch")
    error: Text = Field(default=None, description="why the samples were not read")
    in_order: Flag = Field(default=False, description="the data set is read in order only (an IterableDataset): "
                                                      "nothing to walk ahead of the steps")
    varies: Flag = Field(default=False, description="the largest batch read again held other sizes (random per read)")


Texts = Annotated[list[Text], BeforeValidator(_none_is_empty), Field(max_length=64)]
"""At most 64 texts; None is none."""

WorkerCount = Annotated[int, _count(0, 1 << 16)] | Annotated[str, Field(strict=True), AfterValidator(report_text)]


class DryRunReport(_Model):
    """The child's result file (``R`` in :mod:`autodl.profile.dryrun_child.state`), checked: byte counts integers in
    [0, 1 PiB] (:data:`~autodl.profile.probe.REPORT_MAX_BYTES`); batches in [1, :data:`MAX_BATCH`]; texts cut to
    :data:`~autodl.profile.probe.REPORT_TEXT_CHARS` printable characters; lists bounded. Unknown keys are dropped.
    """

    steps: Annotated[list[StepRecord], BeforeValidator(_none_is_empty), Field(max_length=MAX_RECORDS)] = Field(
        default_factory=list, description="the training steps measured")
    evals: Annotated[list[EvalRecord], BeforeValidator(_none_is_empty), Field(max_length=MAX_RECORDS)] = Field(
        default_factory=list, description="the evaluation calls measured")
    eval_partial: Annotated[EvalRecord | None, BeforeValidator(lambda v: v or None)] = Field(
        default=None, description="an evaluation call cut short by the end of the run")
    replay: Annotated[list[tuple[Batch, Bytes]], BeforeValidator(_none_is_empty), Field(max_length=8)] = Field(
        default_factory=list, description="``[batch, peak bytes]`` of the allocator replay")
    params: Bytes | None = Field(default=None, description="parameters of the model")
    trainable: Bytes | None = Field(default=None, description="trainable parameters (at most ``params``)")
    optimizer: Texts = Field(default_factory=list, description="optimizer class names")
    model: Texts = Field(default_factory=list, description="model layer class names")
    amp: Annotated[list[Any], BeforeValidator(_none_is_empty), Field(max_length=4),
                   AfterValidator(lambda v: [a for a in v if a in ("O1", "O2")])] = Field(
        default_factory=list, description="AMP levels the script asked for (others dropped)")
    distributed_calls: Annotated[list[Any], BeforeValidator(_none_is_empty), Field(max_length=MAX_RECORDS),
                                 AfterValidator(lambda v: [report_text(c) for c in v[:64]])] = Field(
        default_factory=list, description="paddle.distributed calls seen, the first 64 kept")
    conv: Annotated[bool | None, BeforeValidator(lambda v: v if isinstance(v, bool) else None)] = Field(
        default=None, description="the model has a convolution")
    inputs: Signature = Field(default=None, description="the first training step's inputs")
    loaders: Annotated[list[Loader], BeforeValidator(_none_is_empty), Field(max_length=64)] = Field(
        default_factory=list, description="the DataLoaders made")
    num_workers: Annotated[list[WorkerCount], BeforeValidator(_none_is_empty), Field(max_length=64)] = Field(
        default_factory=list, description="their num_workers (a count, or a text the script passed)")
    error: ScriptError | None = Field(default=None, description="the exception the script ended on")
    end: Text = Field(default=None, description="how the run ended (script-finished, measured, exit, exception)")
    exit_code: Annotated[int, _count(-(1 << 31), 1 << 31)] | None = Field(
        default=None, description="the script's sys.exit code")
    exit_message: Text = Field(default=None, description="a text the script passed to sys.exit")
    notes: Texts = Field(default_factory=list, description="what the child noticed (stand-ins, skips)")
    created_batches: Annotated[list[tuple[Batch, Batch]], BeforeValidator(_none_is_empty), Field(max_length=64)] = \
        Field(default_factory=list, description="``[asked, made]`` batches of tensors the script created")
    alloc_preexisting: Bytes | None = Field(default=None, description="allocated before recording began (bytes)")
    reduced: Flag = Field(default=False, description="the dry run reduced the script's batch")
    max_reading: Bytes | None = Field(default=None, description="highest allocator reading (bytes)")
    max_reading_batch: Batch | None = Field(default=None, description="the batch at that reading")
    epoch_walk: Annotated[list[EpochWalk], BeforeValidator(_none_is_empty), Field(max_length=64)] = Field(
        default_factory=list, description="the walks over the training loaders' first epoch")
    plan: Annotated[Plan | None, BeforeValidator(lambda v: v if isinstance(v, dict) else None)] = Field(
        default=None, description="the batches planned (kept only when it is an object)")

    @model_validator(mode="after")
    def _trainable_within_params(self) -> DryRunReport:
        if self.trainable is not None and self.params is not None and self.trainable > self.params:
            raise ValueError("more trainable parameters than parameters")
        return self

    @model_serializer(mode="wrap")
    def _dump(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        return _keep_set(handler, self, ("plan",))


def _why(exc: ValidationError) -> str:
    """The first error of ``exc`` as one line naming the field: ``steps.0.peak is -5: Input should be ...``."""
    err = exc.errors(include_url=False)[0]
    if not err["loc"]:
        return str(err["msg"])
    return f"{'.'.join(str(p) for p in err['loc'])} is {report_text(err.get('input'))}: {err['msg']}"


def dryrun_report(text: str) -> dict[str, Any]:
    """The dry-run child's result file, checked by :class:`DryRunReport` (the user's code runs in that process and
    can write the file with any content): JSON without NaN/Infinity, every field bounded.

    :returns: the report with only the fields :func:`autodl.profile.dryrun.summarize` reads, as plain JSON values.
    :raises ValueError: saying what is wrong (the caller falls back as for any dry run that could not measure).
    """
    data = report_object(text)
    try:
        return DryRunReport.model_validate(data).model_dump(mode="json")
    except ValidationError as exc:
        raise ValueError(_why(exc)) from None
