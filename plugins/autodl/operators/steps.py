"""The six step operators: each reads its inputs, calls one function of :mod:`autodl.steps`, pushes a small XCom."""

from __future__ import annotations

import logging
import os
import re
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict
from datetime import timedelta
from typing import TYPE_CHECKING, Any, NoReturn, Protocol

from airflow.sdk import BaseOperator, BaseSensorOperator, PokeReturnValue, TriggerRule
from airflow.sdk.exceptions import AirflowFailException, AirflowSensorTimeout, TaskDeferred

from autodl.errors import (
    AutoDLError,
    CatalogError,
    ConfigError,
    InventoryError,
    LeaseLost,
    NoFitError,
    PoolBusy,
    ProfileError,
    SpecError,
    StateError,
    TrainingFailed,
    WaitTimeout,
)
from autodl.operators import connections
from autodl.operators.links import AutoDLRunRecordLink
from autodl.operators.params import check_conf, override_value
from autodl.operators.secrets import register_secrets
from autodl.steps.collect import CollectLimits, keep_lease_for_deferral, step_collect, summarise_end
from autodl.steps.context import RunContext, make_run_key, note_failure
from autodl.steps.inputs import resolve_pool_source, run_spec
from autodl.steps.launch import require_booked_worker, step_launch
from autodl.steps.profile import step_profile
from autodl.steps.record import step_release_and_record
from autodl.steps.select import step_select
from autodl.steps.training import stop_training
from autodl.steps.wait import step_wait
from autodl.store import RunState
from autodl.types import PoolEvent, ProfileResult, Selection, StepValue

if TYPE_CHECKING:
    from airflow.sdk.types import Logger
    from airflow.triggers.base import BaseTrigger

HANDED: dict[str, tuple[type[StepValue], str]] = {
    "profile": (ProfileResult, RunState.PROFILE), "select": (Selection, RunState.SELECTION)}
"""The typed values the profile and select steps hand the later ones: (model, run-state name)."""

def _pool(value: str | None) -> str | None:
    """The operator's (rendered) gpu_pool as a source: ``pool`` names, relative paths resolved against the include
    folder (:func:`autodl.steps.inputs.resolve_pool_source`); "", "None" and None: the default source."""
    if value in ("", "None", None):
        return None
    return resolve_pool_source(value, field="pool (the trigger form's pool, or the operator's gpu_pool=)")


def default_deferrable() -> bool:
    """``[operators] default_deferrable`` (Airflow's own default: false), the default the providers'
    operators take for ``deferrable``: a deployment without a triggerer then never waits forever."""
    from airflow.configuration import conf

    return conf.getboolean("operators", "default_deferrable", fallback=False)


def _triggerer_failover_s() -> float:
    """Seconds until Airflow hands a killed triggerer's triggers to another: ``[triggerer]
    triggerer_health_check_threshold`` plus ``job_heartbeat_sec`` (Airflow's defaults: 30 s and 5 s)."""
    from airflow.configuration import conf

    return (conf.getfloat("triggerer", "triggerer_health_check_threshold", fallback=30.0)
            + conf.getfloat("triggerer", "job_heartbeat_sec", fallback=5.0))


def _deferrable(value: bool | None) -> bool:
    return default_deferrable() if value is None else bool(value)


TRIGGERER_NOTE = ("this needs a running triggerer (airflow triggerer): without one the task stays 'deferred' "
                  "until its timeout; deployments without a triggerer set deferrable=False or "
                  "[operators] default_deferrable = False")
"""Said in the log whenever a step defers (a task cannot see whether a triggerer runs: that is in Airflow's
metadata database, which autodl's tasks never read)."""

NOT_DEFERRING_NOTE = ("not deferring (deferrable=False, or [operators] default_deferrable is false): this worker "
                      "slot is held while {what}")

_FINDING = re.compile(r"^\s*(error|warning)\s+\[")
_WARNING_WORDS = ("could not ", "cannot ", "KEPT", "ignoring ", "lost a booking race", "was reclaimed")


def log_level(line: str) -> int:
    """The ``logging`` level of one line of :mod:`autodl.steps`'s log: a finding's own severity
    (``  error   [code] ...``, ``  warning [code] ...``), WARNING for a line saying something could not be
    done or was kept/ignored, INFO otherwise (the training's own output, ``[train] ...``, always INFO)."""
    if line.startswith("[train] "):
        return logging.INFO
    m = _FINDING.match(line)
    if m:
        return logging.ERROR if m.group(1) == "error" else logging.WARNING
    if any(word in line for word in _WARNING_WORDS):
        return logging.WARNING
    return logging.INFO


def _leveled(logger: Any) -> Any:
    """A one-argument log function for :mod:`autodl.steps` that logs each line at :func:`log_level`."""
    return lambda line: logger.log(log_level(str(line)), "%s", line)


PERMANENT_ERRORS = (SpecError, ProfileError, NoFitError, CatalogError, InventoryError, LeaseLost, TrainingFailed, ConfigError,
                    StateError)
"""Errors a retry cannot mend: the task fails at once, without retrying."""

STEP_IDS = {
    "profile": "profile",
    "wait": "wait_for_pool",
    "select": "select_device",
    "launch": "launch",
    "collect": "collect_metrics",
    "release": "release_and_record",
}


def _selection_host(selection: Selection | dict[str, Any] | None) -> str | None:
    """The host of the booked devices in the select step's result (also for a declared pool, whose hosts
    may be real machines without GPUs: their Docker engines are still theirs)."""
    if not selection:
        return None
    return Selection.coerce(selection, what="the select step's result").host


class _AutoDLStep(BaseOperator):
    """Common shell of the steps: run key, sibling XComs, errors as the task's last log line.

    Each subclass defines ``run_step(ctx, context)``, which calls one function of :mod:`autodl.steps`.
    """

    template_fields: Sequence[str] = ("script", "spec", "pool_source")
    ui_color = "#e8f0fe"
    operator_extra_links = (AutoDLRunRecordLink(),)
    step = ""

    def __init__(self, *, group_id: str, script: str | None = None, spec: str | None = None,
                 pool_source: str | None = None, **kwargs: Any):
        super().__init__(**kwargs)
        self.group_id = group_id
        self.script = script
        self.spec = spec
        self.pool_source = pool_source

    # ----------------------------------------------------------------------------- helpers
    def _sibling(self, step: str) -> str:
        prefix = self.task_id.rsplit(".", 1)[0] + "." if "." in self.task_id else ""
        return prefix + STEP_IDS[step]

    def _pull(self, context, step: str) -> Any:
        return context["ti"].xcom_pull(task_ids=self._sibling(step))

    def _handed(self, context, step: str) -> Any:
        """What ``step`` ("profile" or "select") handed on, typed: from the run state in autodl's store
        (written by that step, on whichever host it ran), else from its XCom; None when neither has it."""
        model, name = HANDED[step]
        value = RunState().get(self._ctx(context).run_key, name)
        where = f"the {step} step's value in autodl's run state"
        if value is None:
            value, where = self._pull(context, step), f"the {step} step's XCom ({self._sibling(step)})"
        return model.coerce(value, what=where) if value is not None else None

    def _ctx(self, context) -> RunContext:
        ti = context["ti"]
        dag_id = ti.dag_id
        run_id = context["run_id"]
        return RunContext(
            run_key=make_run_key(dag_id, self.group_id, run_id),
            dag_id=dag_id, run_id=run_id, task_id=ti.task_id, try_number=getattr(ti, "try_number", None),
            user=_user(context, getattr(self, "owner", None)),
        )

    def _none(self, value: Any) -> Any:
        return None if value in ("", "None", None) else value

    def _input(self, value: Any, context) -> Any:
        """A script or spec path as the DAG's author meant it: a relative path is read from this process's folder
        when it is there, else from the DAG file's folder or the folder above it (a project's ``dags/`` beside
        its ``include/``, as Airflow reads a template's relative path from the DAG's folder); else it is left
        as given, and the error names the folder it was read from."""
        value = self._none(value)
        if not isinstance(value, str) or os.path.isabs(value) or os.path.exists(value):
            return value
        dag = context.get("dag") or getattr(self, "dag", None)
        fileloc = getattr(dag, "fileloc", None)
        if not fileloc:
            return value
        here = os.path.dirname(os.path.abspath(fileloc))
        for base in (here, os.path.dirname(here)):
            candidate = os.path.join(base, value)
            if os.path.exists(candidate):
                self.log.info("%s is not in %s: read from %s, beside the DAG file", value, os.getcwd(), candidate)
                return candidate
        return value

    def run_step(self, ctx: RunContext, context) -> Any:
        """This step's work: one function of :mod:`autodl.steps`; its value is the step's XCom (each step
        defines it)."""
        raise NotImplementedError(f"{type(self).__name__} defines no run_step")

    def execute(self, context) -> Any:
        register_secrets([self.pool_source])
        ctx = self._ctx(context)
        try:
            return self.run_step(ctx, context)
        except AutoDLError as exc:
            note_failure(ctx.run_key, self.step, str(exc))
            self.log.error("%s", exc)
            if isinstance(exc, PERMANENT_ERRORS):
                raise AirflowFailException(str(exc)) from None  # logged above; its traceback is autodl's, not the user's
            raise
        except TaskDeferred:  # waiting (in the triggerer) is not failing
            raise
        except BaseException as exc:  # killed, interrupted, or a bug: the record says so
            note_failure(ctx.run_key, self.step, f"{type(exc).__name__}: {exc}".rstrip(": "))
            raise



class AutoDLProfileOperator(_AutoDLStep):
    """Step 1: check the trigger conf, profile the script (never running it here), log the breakdown and
    findings, and refuse at once when nothing can fit.

    :param launcher: override of the spec's ``launcher.type`` (templated; ``spec`` or empty: the spec's).
    :param policy: override of the spec's ``scheduler.algorithm`` (templated; ``spec`` or empty: the spec's).
    :param check_conf: refuse a trigger conf key that is not one of the DAG's Params (when it declares any).
    :param args: the script's arguments (templated, each element): replace the spec's ``task.args`` for this run.
    """

    template_fields: Sequence[str] = (*_AutoDLStep.template_fields, "launcher", "policy", "args")
    step = "profile"

    def __init__(self, *, probe: bool | None = None, launcher: str | None = None, policy: str | None = None,
                 check_conf: bool = True, args: list[str] | None = None, **kwargs: Any):
        super().__init__(**kwargs)
        self.probe = probe
        self.launcher = launcher
        self.policy = policy
        self.check_conf = check_conf
        self.args = args

    def _check_conf(self, context) -> None:
        declared = getattr(self.dag, "params", None) or {}
        if not self.check_conf or not declared:
            return  # a DAG without Params takes any conf (it may be meant for other tasks)
        check_conf(getattr(context.get("dag_run"), "conf", None), declared.keys())

    def run_step(self, ctx, context):
        self._check_conf(context)
        overrides = {"launcher": override_value(self.launcher), "policy": override_value(self.policy),
                     "args": self.args}
        return step_profile(self._input(self.script, context), self._input(self.spec, context), pool=_pool(self.pool_source),
                                     probe=self.probe, log=_leveled(self.log), run_key=ctx.run_key,
                                     overrides=overrides, launcher_kwargs_for=connections.launcher_kwargs).model_dump(mode="json")


def _user(context, default: str | None) -> str | None:
    """Who the run is for: the user who triggered the DAG run, else the task's owner."""
    dag_run = context.get("dag_run")
    return getattr(dag_run, "triggering_user_name", None) or default


def _run_fields(ctx: RunContext) -> dict[str, Any]:
    return {"run_key": ctx.run_key, "dag_id": ctx.dag_id, "run_id": ctx.run_id, "task_id": ctx.task_id,
            "try_number": ctx.try_number, "user": ctx.user}


class _QueueStep(Protocol):
    """What :class:`_Waiting` needs of the step it is mixed into (the wait sensor, the select step): the
    operator's log and ``defer``, the run's context and handed values, its inventory source and wait timeout."""

    wait_timeout_s: float | None

    @property
    def log(self) -> Logger: ...

    def defer(self, *, trigger: BaseTrigger, method_name: str, kwargs: dict[str, Any] | None = None,
              timeout: timedelta | int | float | None = None) -> NoReturn: ...

    def _handed(self, context, step: str) -> Any: ...

    def _ctx(self, context) -> RunContext: ...

    def _src(self) -> str | None: ...

    def _scheduler(self, context) -> tuple[float, float]: ...

    def _poll(self, context) -> dict[str, Any] | None: ...


class _Waiting:
    """Waiting in the admission queue, shared by the wait sensor and the select step (which goes back to
    waiting when it holds no lease): one poll, the trigger that polls in the triggerer, and its outcome."""

    def _scheduler(self: _QueueStep, context) -> tuple[float, float]:
        """(timeout s, poke interval s): the spec's ``scheduler`` section as the profile step read it."""
        sched = run_spec(self._handed(context, "profile") or {}).scheduler
        timeout = float(self.wait_timeout_s or sched.timeout)
        return timeout, float(sched.poke_interval)

    def _poll(self: _QueueStep, context) -> dict[str, Any] | None:
        """One poll of the queue (the selection as its XCom when booked); permanent problems fail the task, a
        wait past the timeout too."""
        ctx = self._ctx(context)
        timeout, poke = self._scheduler(context)
        try:
            selection = step_wait(ctx, self._handed(context, "profile"), pool=self._src(), log=_leveled(self.log),
                                           poke_interval_s=poke, timeout_s=timeout, launcher_kwargs_for=connections.launcher_kwargs)
            return selection.model_dump(mode="json") if selection is not None else None
        except WaitTimeout as exc:
            note_failure(ctx.run_key, "wait", f"no fitting device became free within {timeout:g} s "
                                                       "(scheduler.timeout)")
            self.log.error("%s", exc)
            raise AirflowSensorTimeout(str(exc)) from None
        except PERMANENT_ERRORS as exc:
            note_failure(ctx.run_key, "wait", str(exc))
            self.log.error("%s", exc)
            raise AirflowFailException(str(exc)) from None  # logged above; its traceback is autodl's, not the user's

    def _defer_to_queue(self: _QueueStep, context, method_name: str = "execute_complete") -> None:
        from autodl.triggers.pool import PoolTrigger

        timeout, poke = self._scheduler(context)
        ctx = self._ctx(context)
        self.log.info("waiting in the admission queue from the triggerer (no worker slot held), every %s s, "
                      "up to %s s (scheduler.timeout); %s", poke, timeout, TRIGGERER_NOTE)
        self.defer(
            trigger=PoolTrigger(profile_out=self._handed(context, "profile").model_dump(mode="json"), pool=self._src(),
                                poke_interval=poke,
                                run=_run_fields(ctx), timeout_s=timeout),
            method_name=method_name,
            # the trigger enforces the timeout from when the run joined the queue; this is a backstop
            timeout=timedelta(seconds=timeout + 10 * poke + 60),
        )

    def _queue_event(self: _QueueStep, context, event: dict[str, Any] | None) -> dict[str, Any]:
        ctx = self._ctx(context)
        try:
            typed = PoolEvent.coerce(event or {"status": "error"}, what="the admission queue trigger's event")
        except StateError as exc:  # a retry would read the same event: fail at once, saying which field
            note_failure(ctx.run_key, "wait", str(exc))
            self.log.error("%s", exc)
            raise AirflowFailException(str(exc)) from None
        if typed.status == "booked" and typed.selection is not None:
            self.log.info("%s", typed.message or "booked")
            for line in typed.selection.candidates_log:
                self.log.info("%s", line)
            return typed.selection.model_dump(mode="json")
        message = typed.message or f"waiting in the admission queue ended without a booking: {event}"
        note_failure(ctx.run_key, "wait", message)
        self.log.error("%s", message)
        if typed.status == "timeout":
            raise AirflowSensorTimeout(message)
        raise AirflowFailException(message)


class AutoDLPoolSensor(_Waiting, BaseSensorOperator):
    """Step 2: waits in autodl's admission queue and books the devices the queue grants (one step).

    Deferrable (``deferrable``, default ``[operators] default_deferrable``): after one poll in the worker it
    waits in the triggerer (:class:`PoolTrigger`).
    ``deferrable=False`` reschedules between polls instead (a worker slot only while polling); it is
    given enough retries to survive Airflow's reschedule race (apache/airflow#71172: the scheduler may
    fail a rescheduled sensor whose 'success' exit it reads late) and keeps its place in the queue
    across them. Fails at once, without waiting, when nothing in the pool could ever hold the run.
    Its XCom is the selection (lease, placement, devices).
    """

    template_fields: Sequence[str] = ("pool_source",)
    ui_color = "#fef7e0"
    operator_extra_links = (AutoDLRunRecordLink(),)

    def __init__(self, *, group_id: str, pool_source: str | None = None, deferrable: bool | None = None,
                 wait_timeout_s: float | None = None, **kwargs: Any):
        kwargs.setdefault("mode", "reschedule")
        super().__init__(**kwargs)
        self.group_id = group_id
        self.pool_source = pool_source
        self.deferrable = _deferrable(deferrable)
        self.wait_timeout_s = wait_timeout_s

    _sibling = _AutoDLStep._sibling
    _pull = _AutoDLStep._pull
    _handed = _AutoDLStep._handed
    _ctx = _AutoDLStep._ctx

    def _src(self) -> str | None:
        return _pool(self.pool_source)

    def execute(self, context) -> Any:
        register_secrets([self.pool_source])
        self.timeout, self.poke_interval = self._scheduler(context)
        if self.deferrable:
            selection = self._poll(context)
            if selection is None:
                self._defer_to_queue(context)
            return selection
        self.log.info(NOT_DEFERRING_NOTE.format(what="polling (between polls the task is rescheduled)"))
        return super().execute(context)

    def execute_complete(self, context, event: dict[str, Any] | None = None) -> dict[str, Any]:
        return self._queue_event(context, event)

    def poke(self, context) -> Any:
        try:
            selection = self._poll(context)
        except (AirflowSensorTimeout, AirflowFailException):
            raise
        except AutoDLError as exc:  # a poll that failed (store, inventory for a moment): the next one tries again
            self.log.warning("this poll failed, the next one tries again: %s", exc)
            return False
        return PokeReturnValue(is_done=True, xcom_value=selection) if selection is not None else False


class AutoDLSelectOperator(_Waiting, _AutoDLStep):
    """Step 3: the devices booked while waiting, with the ranked candidates and why each was kept or dropped.

    When the run holds no lease (it was freed between the steps) the step goes back to waiting in the
    queue (deferred, or polling in the worker), never failing because the pool is busy.
    """

    step = "select"

    def __init__(self, *, deferrable: bool | None = None, wait_timeout_s: float | None = None, **kwargs: Any):
        super().__init__(**kwargs)
        self.deferrable = _deferrable(deferrable)
        self.wait_timeout_s = wait_timeout_s

    def _src(self) -> str | None:
        return _pool(self.pool_source)

    def run_step(self, ctx, context):
        try:
            return step_select(ctx, self._handed(context, "profile"), pool=self._src(), log=_leveled(self.log),
                                        launcher_kwargs_for=connections.launcher_kwargs).model_dump(mode="json")
        except PoolBusy as exc:
            self.log.info("%s", exc)
        if self.deferrable:
            self._defer_to_queue(context)
        self.log.info(NOT_DEFERRING_NOTE.format(what="waiting for the pool again"))
        _timeout, poke = self._scheduler(context)
        while True:
            selection = self._poll(context)
            if selection is not None:
                return selection
            time.sleep(poke)

    def execute_complete(self, context, event: dict[str, Any] | None = None) -> dict[str, Any]:
        return self._queue_event(context, event)


class AutoDLBookedHostOperator(BaseOperator):
    """With ``[autodl] host_queues`` (several GPU hosts on Celery): returns ``[the booked host]``, the list
    the launch and collect steps are mapped over, so that their instances are created once the booking is
    known and autodl's cluster policy can put them on that host's queue (:mod:`autodl.policies`).

    Runs anywhere; reads only the select step's XCom.
    """

    ui_color = "#f1f3f4"

    def execute(self, context) -> list[str | None]:
        prefix = self.task_id.rsplit(".", 1)[0] + "." if "." in self.task_id else ""
        selection = context["ti"].xcom_pull(task_ids=prefix + STEP_IDS["select"])
        host = _selection_host(Selection.coerce(selection, what="the select step's XCom") if selection else None)
        self.log.info("the booked devices are on host %s", host)
        if host:
            from autodl.config import host_queues, lease_ttl_s

            self.log.info("launch and collect go to the queue %s of host %s; the booking waits for a worker of that "
                          "queue to start the training: if none does within the lease's TTL (%g s), its devices are "
                          "freed and the run goes back to the admission queue, and it is booked again when a worker "
                          "of %s runs the launch (autodl leases and the GPU page show it waiting)",
                          host_queues().get(host, "(none: not routed)"), host, lease_ttl_s(), host)
        return [host]


class AutoDLLaunchOperator(_AutoDLStep):
    """Step 4: start the training pinned to the booked devices, detached; push its handle.

    :param booked_host: the host of the booked devices, when the step is mapped over the select step's
        ``autodl_hosts`` XCom (several GPU hosts on Celery): a local training starts only on a worker whose
        ``AUTODL_HOST`` is that host (:func:`autodl.steps.launch.require_booked_worker`).
    :param sample_interval_s: the collect step's interval, seconds: a local training is sampled at it from its
        launch until the collect step takes over (:mod:`autodl.sampling`).
    """

    step = "launch"

    def __init__(self, *, booked_host: str | None = None, sample_interval_s: float | None = None, **kwargs: Any):
        super().__init__(**kwargs)
        self.booked_host = booked_host
        self.sample_interval_s = sample_interval_s

    def run_step(self, ctx, context):
        profile_out = self._handed(context, "profile")
        selection = self._handed(context, "select")
        launcher_type = run_spec(profile_out).launcher.type  # the spec's, or the run's override
        require_booked_worker(self.booked_host, ctx.run_key, launcher_type)
        poke = float(run_spec(profile_out).scheduler.poke_interval)
        while True:  # a booking released while no worker ran this launch: it waits for its turn again, here
            try:
                return step_launch(ctx, profile_out, selection,
                                            launcher_kwargs=connections.launcher_kwargs(launcher_type, _selection_host(selection)),
                                            log=_leveled(self.log), sample_interval_s=self.sample_interval_s)
            except PoolBusy as exc:
                self.log.info("%s", exc)
            time.sleep(poke)
            selection = self._handed(context, "select")


class AutoDLCollectOperator(_AutoDLStep):
    """Step 5: follow the training to its end: log lines into this task's log, metrics sampled, the lease
    heartbeated, ``scheduler.max_run_time`` and ``execution_timeout`` enforced.

    Deferrable (``deferrable``, default ``[operators] default_deferrable``): the following happens in the
    triggerer (:class:`CollectTrigger`), so no worker
    slot is held while the training runs; ``deferrable=False`` follows it in the worker.
    """

    step = "collect"

    def __init__(self, *, sample_interval_s: float = 1.0, deferrable: bool | None = None, booked_host: str | None = None,
                 **kwargs: Any):
        super().__init__(**kwargs)
        if not float(sample_interval_s) > 0:
            raise ValueError(f"sample_interval_s: {sample_interval_s!r} is not a positive number of seconds; "
                             "pass e.g. sample_interval_s=1.0")
        self.sample_interval_s = sample_interval_s
        self.deferrable = _deferrable(deferrable)
        self.booked_host = booked_host

    def _limits(self, context) -> CollectLimits:
        deadline = None
        if self.execution_timeout:
            start = getattr(context["ti"], "start_date", None)
            begun = start.timestamp() if start else time.time()
            deadline = begun + self.execution_timeout.total_seconds()
        return CollectLimits.for_run(self._handed(context, "profile"), deadline_ts=deadline,
                                              deadline_why=f"execution_timeout ({self.execution_timeout})")

    def on_kill(self) -> None:
        """Airflow stops this task (SIGTERM: marked failed, timed out, worker shutdown): stop the training
        too, so it never computes on devices whose lease the release step is about to free."""
        from airflow.sdk.exceptions import AirflowTaskTimeout

        following: tuple[dict[str, Any], RunContext] | None = getattr(self, "_following", None)
        if following is None:
            return
        handle, ctx = following
        if isinstance(sys.exc_info()[1], AirflowTaskTimeout):
            why = (f"the collect task passed its execution_timeout ({self.execution_timeout}); "
                   "the training was stopped with it")
        else:
            why = "the collect task was stopped by Airflow (SIGTERM); the training was stopped with it"
        note_failure(ctx.run_key, self.step, why)
        stop_training(handle, launcher_kwargs=connections.launcher_kwargs(handle.get("launcher", "local"), handle.get("host")),
                               log=self.log.warning)

    def run_step(self, ctx, context):
        handle = self._pull(context, "launch")
        launcher_type = handle.get("launcher", "local")
        limits = self._limits(context)
        if self.deferrable:
            from autodl.triggers.collect import CollectTrigger

            self.log.info("following the training from the triggerer (no worker slot held); its log follows; %s",
                          TRIGGERER_NOTE)
            backstop = None
            if limits.deadline_ts is not None:
                backstop = timedelta(seconds=max(0.0, limits.deadline_ts - time.time()) + 120)
            limits = keep_lease_for_deferral(ctx, handle.get("lease_id"), limits, failover_s=_triggerer_failover_s(),
                                                      interval_s=float(self.sample_interval_s), log=self.log.info)
            # the configured interval, as in the worker (a 1 s floor here left short runs with a few samples)
            self.defer(trigger=CollectTrigger(run=_run_fields(ctx), handle=handle, limits=asdict(limits),
                                              interval_s=float(self.sample_interval_s)),
                       method_name="execute_complete", timeout=backstop)
        self.log.info(NOT_DEFERRING_NOTE.format(what="the training runs"))
        self._following = (handle, ctx)
        return step_collect(ctx, handle, launcher_type=launcher_type,
                                     launcher_kwargs=connections.launcher_kwargs(launcher_type, handle.get("host")), log=_leveled(self.log),
                                     interval_s=self.sample_interval_s, limits=limits)

    def execute_complete(self, context, event: dict[str, Any] | None = None) -> dict[str, Any]:
        from autodl.types import CollectEvent, LaunchHandle

        ctx = self._ctx(context)
        try:
            typed = CollectEvent.coerce(event, what="the collect trigger's event")
        except StateError as exc:  # a retry would read the same event: fail at once, saying which field
            note_failure(ctx.run_key, self.step, str(exc))
            self.log.error("%s", exc)
            raise AirflowFailException(str(exc)) from None
        handle = LaunchHandle.model_validate(self._pull(context, "launch"))
        try:
            if typed.status == "ended":
                return summarise_end(ctx, handle, typed.metrics, self.log.info)
        except AutoDLError as exc:
            note_failure(ctx.run_key, self.step, str(exc))
            self.log.error("%s", exc)
            if isinstance(exc, PERMANENT_ERRORS):
                raise AirflowFailException(str(exc)) from None  # logged above; its traceback is autodl's, not the user's
            raise
        message = typed.message or f"following the training ended without its exit ({typed.status})"
        note_failure(ctx.run_key, self.step, message)
        self.log.error("%s", message)
        raise AirflowFailException(message)


def lease_words(result: dict[str, Any]) -> str:
    """What became of the run's lease, in words, from its :class:`autodl.records.RunResult`."""
    if result.get("lease_kept"):
        return "lease KEPT: its devices still hold the run's processes"
    return "lease freed" if result.get("lease_released") else "no lease held any more"


class AutoDLReleaseOperator(_AutoDLStep):
    """Step 6 (``trigger_rule=all_done``), the group's last task: free the lease whatever happened, write the run
    record, return the run's :class:`autodl.records.RunResult` (XCom ``return_value``). A run that did not succeed
    fails this task once its record is written (no retry), so the DAG run fails and ``group >> downstream`` does
    not run; the result is pushed all the same, for a downstream task with ``trigger_rule=all_done``."""

    step = "release"

    def __init__(self, **kwargs: Any):
        kwargs["trigger_rule"] = TriggerRule.ALL_DONE
        super().__init__(**kwargs)

    def execute(self, context) -> Any:
        result = super().execute(context)
        if result and result.get("outcome") != "succeeded":
            context["ti"].xcom_push(key="return_value", value=result)
            raise AirflowFailException(f"the run {result.get('outcome')} (recorded as {result.get('run_key')}; "
                                       f"{lease_words(result)}): {result.get('error')}")
        return result

    def run_step(self, ctx, context):
        handle = self._pull(context, "launch")
        launcher_type = (handle or {}).get("launcher", "local")
        return step_release_and_record(
            ctx, script=self._input(self.script, context), spec_path=self._input(self.spec, context),
            profile_out=self._handed(context, "profile"), selection=self._handed(context, "select"),
            handle_json=handle, metrics_json=self._pull(context, "collect"),
            launcher_kwargs=connections.launcher_kwargs(launcher_type, (handle or {}).get("host")), log=_leveled(self.log),
        )
