"""The six steps of a run as plain functions over JSON-ready values; the Airflow operators are thin calls into these.

profile -> wait for the pool -> select (place + lease) -> launch -> collect metrics -> release and record; one
module per step (:mod:`~autodl.steps.profile`, :mod:`~autodl.steps.wait`, :mod:`~autodl.steps.select`,
:mod:`~autodl.steps.launch`, :mod:`~autodl.steps.collect`, :mod:`~autodl.steps.record`), with the run's context
(:mod:`~autodl.steps.context`), its inputs (:mod:`~autodl.steps.inputs`), the launched training
(:mod:`~autodl.steps.training`) and the lease reaper (:mod:`~autodl.steps.reaper`).

Each step is safe to retry: select returns the run's existing lease, launch reattaches to a running
attempt, release is idempotent. Per-run state that must outlive a failed task (metrics of a failed
training, the reason a step failed, the placement decision, the training's report) is kept in autodl's
store (:class:`autodl.store.RunState`), written by the step that learns it and read by the later ones on
any host; ``$AUTODL_HOME/runs/<run key>/`` holds only what stays on the machine that wrote it (the
training's log, samples, the timeline).

Follows astronomer-cosmos's split of ``cosmos/dbt/`` (no Airflow) from ``cosmos/airflow/``:
docs/reference/layout.md#the-anchor-each-part-follows.
"""

from autodl.profile import BATCH_SIZE_ENV  # the spec's per-device batch, passed to the training
from autodl.steps.collect import (
    LAST_LINE_CHARS,
    TRIGGERER_RESUME_MARGIN_S,
    CollectGuard,
    CollectLimits,
    CollectStopped,
    collect_sinks,
    deferred_lease_ttl_s,
    distinct_failures,
    keep_lease_for_deferral,
    keep_metrics,
    known_end,
    last_log_line,
    step_collect,
    stop_early,
    summarise_end,
)
from autodl.steps.context import (
    ATTEMPT_FILES,
    DEFAULT_SHM_BYTES,
    OUTPUT_DIR_ENV,
    REPORT_FILE_ENV,
    GiB,
    MiB,
    RunContext,
    begin_attempt,
    keep_report,
    make_run_key,
    note_failure,
    read_failures,
    state_dir,
)
from autodl.steps.inputs import (
    KEEP_SPEC,
    OVERRIDES,
    apply_overrides,
    check_overrides,
    keep_decision,
    load_inputs,
    pool_names,
    resolve_pool_source,
    run_spec,
    source_of,
)
from autodl.steps.launch import (
    book_again,
    build_request,
    renew_booking,
    require_booked_worker,
    step_launch,
)
from autodl.steps.profile import (
    check_spec_against_catalog,
    fits_ever,
    format_candidates,
    format_profile,
    no_fit_error,
    plan,
    profile_run,
    profile_venue_line,
    step_profile,
)
from autodl.steps.reaper import (
    reap_expired,
    reaper_id,
    release_by_hand,
    release_failed_run,
    release_lease,
    requeue_unlaunched,
    stop_left_behind,
)
from autodl.steps.record import (
    Outcome,
    ReleaseFacts,
    RunOutcome,
    decide_outcome,
    gather_facts,
    run_record,
    step_release_and_record,
    write_record,
)
from autodl.steps.select import (
    step_select,
)
from autodl.steps.training import (
    exit_status,
    still_running,
    stop_training,
    try_stop,
)
from autodl.steps.wait import (
    expected_runtime_s,
    owner_of,
    recorded_runtime,
    selection_of,
    step_wait,
)

__all__ = [
    "BATCH_SIZE_ENV",
    "ATTEMPT_FILES",
    "CollectGuard",
    "CollectLimits",
    "CollectStopped",
    "DEFAULT_SHM_BYTES",
    "GiB",
    "KEEP_SPEC",
    "LAST_LINE_CHARS",
    "MiB",
    "OUTPUT_DIR_ENV",
    "OVERRIDES",
    "Outcome",
    "REPORT_FILE_ENV",
    "ReleaseFacts",
    "RunContext",
    "RunOutcome",
    "TRIGGERER_RESUME_MARGIN_S",
    "apply_overrides",
    "begin_attempt",
    "book_again",
    "build_request",
    "check_overrides",
    "check_spec_against_catalog",
    "collect_sinks",
    "decide_outcome",
    "deferred_lease_ttl_s",
    "distinct_failures",
    "exit_status",
    "expected_runtime_s",
    "fits_ever",
    "format_candidates",
    "format_profile",
    "gather_facts",
    "keep_decision",
    "keep_lease_for_deferral",
    "keep_metrics",
    "keep_report",
    "known_end",
    "last_log_line",
    "load_inputs",
    "make_run_key",
    "no_fit_error",
    "note_failure",
    "owner_of",
    "plan",
    "pool_names",
    "profile_run",
    "profile_venue_line",
    "read_failures",
    "reap_expired",
    "reaper_id",
    "recorded_runtime",
    "release_by_hand",
    "release_failed_run",
    "release_lease",
    "renew_booking",
    "requeue_unlaunched",
    "require_booked_worker",
    "resolve_pool_source",
    "run_record",
    "run_spec",
    "selection_of",
    "source_of",
    "state_dir",
    "step_collect",
    "step_launch",
    "step_profile",
    "step_release_and_record",
    "step_select",
    "step_wait",
    "still_running",
    "stop_early",
    "stop_left_behind",
    "stop_training",
    "summarise_end",
    "try_stop",
    "write_record",
]
