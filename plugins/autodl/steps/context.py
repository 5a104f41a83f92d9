"""Who runs a step and where its state lives: :class:`RunContext`, run keys, the run's state folder, the failures and the report each step keeps."""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from autodl.config import autodl_home
from autodl.fields import MAX_RUN_KEY_CHARS
from autodl.launch.local import run_folder
from autodl.records import RecordStore
from autodl.redact import sanitize_report
from autodl.store import RunState
from autodl.untrusted import read_report

GiB = 1 << 30


MiB = 1 << 20


OUTPUT_DIR_ENV = "AUTODL_OUTPUT_DIR"
"""Where the training keeps checkpoints across runs (the spec's ``task.output_dir``, see
:func:`autodl.spec.output_dir_path`); a nightly job resumes from what the last night left there."""


REPORT_FILE_ENV = "AUTODL_REPORT_FILE"
"""A JSON file the training may write about itself (checkpoint resumed from, epoch, accuracy); the run
record keeps it as ``report``."""


DEFAULT_SHM_BYTES = 8 * GiB
"""/dev/shm given to a run whose DataLoader uses worker processes: 8 GiB, the design card's
``docker run --shm-size=8g`` (Docker's own default of 64 MiB makes Paddle's DataLoader workers fail
with 'bus error' / 'DataLoader worker exited unexpectedly')."""


@dataclass(frozen=True)
class RunContext:
    """Who is running a step: the run key (idempotency key) and the Airflow identity for labels."""

    run_key: str
    dag_id: str | None = None
    run_id: str | None = None
    task_id: str | None = None
    try_number: int | None = None
    user: str | None = None
    extra_labels: dict[str, str] = field(default_factory=dict)

    def labels(self, lease_id: str | None = None) -> dict[str, str]:
        out = {"autodl.run_key": self.run_key}
        for key, value in (("dag_id", self.dag_id), ("run_id", self.run_id), ("task_id", self.task_id),
                           ("try_number", self.try_number), ("lease_id", lease_id)):
            if value is not None:
                out[key] = str(value)
        out.update(self.extra_labels)
        return out


def make_run_key(dag_id: str, group_id: str, run_id: str) -> str:
    """The run key of one AutoDLTrainOperator group in one DAG run: ``dag_id.group_id.run_id``.

    A key longer than the store's column (:data:`autodl.fields.MAX_RUN_KEY_CHARS`; Airflow allows ids
    up to 750 characters together) keeps its head and ends in ``~`` and 16 hex digits of its SHA-256, so
    it stays unique and the same in every step.
    """
    key = f"{dag_id}.{group_id}.{run_id}"
    if len(key) <= MAX_RUN_KEY_CHARS:
        return key
    digest = hashlib.sha256(key.encode("utf-8", "surrogatepass")).hexdigest()[:16]
    return f"{key[:MAX_RUN_KEY_CHARS - 17]}~{digest}"


def state_dir(run_key: str) -> Path:
    """Per-run state folder (shared with the local launcher's run folder): named by a hash of the full run key
    and holding that key, so two runs never share one (see :func:`autodl.launch.local.run_folder`).

    :raises LaunchError: when the folder records another run key.
    """
    return run_folder(autodl_home() / "runs", run_key)


def note_failure(run_key: str, step: str, message: str) -> None:
    """Remember why ``step`` failed (in the run state, whichever host the step ran on) so that the
    release-and-record step can record it."""
    RunState().note_failure(run_key, step, message)


ATTEMPT_FILES = ("failure.json", "metrics.json", "samples.jsonl", "timeline.png", "collect.taken-over")
"""What a run's state folder holds of one training: a new training (a clear and re-run in Airflow) starts
without them (:func:`begin_attempt`)."""


def begin_attempt(run_key: str, log: Callable[[str], None] = print) -> Path | None:
    """A new training of ``run_key`` was just started: move the earlier attempt's failures, metrics and samples to
    ``earlier-<n>/`` in the state folder (the record of that attempt is pointed there), so this attempt's error,
    duration and timeline are its own. Every step before a launch that started a training has succeeded, so the
    failures they noted belong to the earlier attempt.

    :returns: the folder they went to, or None when there was nothing of an earlier attempt.
    """
    folder = state_dir(run_key)
    present = [name for name in ATTEMPT_FILES if (folder / name).exists()]
    facts = RunState().forget_attempt(run_key)   # the earlier training's metrics, report and failures
    if not present:
        if facts:
            log(f"a new training of {run_key}: the earlier attempt's metrics, report and failures were cleared")
        return None
    dest = folder / f"earlier-{1 + len(list(folder.glob('earlier-*')))}"
    dest.mkdir()
    for name in present:
        (folder / name).rename(dest / name)
    if "samples.jsonl" in present:
        RecordStore().set_samples_path(run_key, str(folder / "samples.jsonl"), str(dest / "samples.jsonl"))
    log(f"a new training of {run_key}: the earlier attempt's {', '.join(present)} moved to {dest}")
    return dest


def read_failures(run_key: str) -> dict[str, str]:
    """``{step: why it failed}`` of the run's failed steps, from the run state."""
    return RunState().failures(run_key)


def keep_report(run_key: str, report: dict[str, Any] | None = None, *, log: Callable[[str], None] = print) -> dict[str, Any] | None:
    """Put the training's report (what it said about itself: checkpoint resumed from, epoch) into the run
    state, for the record: ``report`` when a transport brought it (e.g. the training's log stream), else the
    ``AUTODL_REPORT_FILE`` the training wrote on this machine, if it wrote one. Called where the training is
    followed (the booked host), never where the record is written.

    :returns: the report kept, or None when there was none (or it was not a JSON object: said in the log).
    """
    try:  # untrusted: read without following links, bounded, schema-checked, redacted (autodl.redact)
        if report is None:
            found = read_report(state_dir(run_key))
            report = found.data if found is not None else None
        else:
            report = sanitize_report(report).data
    except ValueError as exc:
        log(f"the training's report (AUTODL_REPORT_FILE) could not be used ({exc}); the record goes without it")
        report = None
    if report is not None:
        RunState().put(run_key, RunState.REPORT, report)
    return report
