"""The six step operators: each reads its inputs, calls one function of :mod:`autodl.pipeline`, pushes a small XCom."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from airflow.sdk import BaseOperator, BaseSensorOperator, TriggerRule
from airflow.sdk.exceptions import AirflowFailException, AirflowSensorTimeout

from autodl import pipeline
from autodl.errors import AutoDLError, CatalogError, ConfigError, InventoryError, NoFitError, ProfileError, SpecError
from autodl.operators.links import AutoDLRunRecordLink
from autodl.operators.params import check_conf, override_value

PERMANENT_ERRORS = (SpecError, ProfileError, NoFitError, CatalogError, InventoryError, ConfigError)
"""Errors a retry cannot mend: the task fails at once, without retrying."""

STEP_IDS = {
    "profile": "profile",
    "wait": "wait_for_pool",
    "select": "select_device",
    "launch": "launch",
    "collect": "collect_metrics",
    "release": "release_and_record",
}


def _launcher_kwargs(launcher_type: str, host: str | None = None) -> dict[str, Any]:
    """Connection details for the launcher from Airflow connections (docker_default, kubernetes_default,
    and the booked host's own Docker engine ``docker_<host>``)."""
    if launcher_type == "local":
        return {}
    try:
        from autodl.operators.connections import launcher_kwargs
    except ImportError:
        return {}
    return launcher_kwargs(launcher_type, host)


def _selection_host(selection: dict[str, Any] | None) -> str | None:
    """The host of the booked devices in the select step's result (also for a declared pool, whose hosts
    may be real machines without GPUs: their Docker engines are still theirs)."""
    if not selection:
        return None
    from autodl.hosts import booked_host

    return booked_host(d.get("host") for d in selection.get("devices") or [])


class _AutoDLStep(BaseOperator):
    """Common shell of the steps: run key, sibling XComs, errors as the task's last log line.

    Each subclass defines ``run_step(ctx, context)``, which calls one function of :mod:`autodl.pipeline`.
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

    def _ctx(self, context) -> pipeline.RunContext:
        ti = context["ti"]
        dag_id = ti.dag_id
        run_id = context["run_id"]
        return pipeline.RunContext(
            run_key=pipeline.make_run_key(dag_id, self.group_id, run_id),
            dag_id=dag_id, run_id=run_id, task_id=ti.task_id, try_number=getattr(ti, "try_number", None),
        )

    def _none(self, value: Any) -> Any:
        return None if value in ("", "None", None) else value

    def execute(self, context) -> Any:
        ctx = self._ctx(context)
        try:
            return self.run_step(ctx, context)
        except AutoDLError as exc:
            pipeline.note_failure(ctx.run_key, self.step, str(exc))
            self.log.error("%s", exc)
            if isinstance(exc, PERMANENT_ERRORS):
                raise AirflowFailException(str(exc)) from exc
            raise
        except BaseException as exc:  # killed, interrupted, or a bug: the record says so
            pipeline.note_failure(ctx.run_key, self.step, f"{type(exc).__name__}: {exc}".rstrip(": "))
            raise



class AutoDLProfileOperator(_AutoDLStep):
    """Step 1: check the trigger conf, profile the script (never running it here), log the breakdown and
    findings, and refuse at once when nothing can fit.

    :param launcher: override of the spec's ``launcher.type`` (templated; ``spec`` or empty: the spec's).
    :param policy: override of the spec's ``scheduler.algorithm`` (templated; ``spec`` or empty: the spec's).
    :param check_conf: refuse a trigger conf key that is not one of the DAG's Params (when it declares any).
    """

    template_fields: Sequence[str] = (*_AutoDLStep.template_fields, "launcher", "policy")
    step = "profile"

    def __init__(self, *, probe: bool | None = None, launcher: str | None = None, policy: str | None = None,
                 check_conf: bool = True, **kwargs: Any):
        super().__init__(**kwargs)
        self.probe = probe
        self.launcher = launcher
        self.policy = policy
        self.check_conf = check_conf

    def _check_conf(self, context) -> None:
        declared = getattr(self.dag, "params", None) or {}
        if not self.check_conf or not declared:
            return  # a DAG without Params takes any conf (it may be meant for other tasks)
        check_conf(getattr(context.get("dag_run"), "conf", None), declared.keys())

    def run_step(self, ctx, context):
        self._check_conf(context)
        overrides = {"launcher": override_value(self.launcher), "policy": override_value(self.policy)}
        return pipeline.step_profile(self._none(self.script), self._none(self.spec), pool=self._none(self.pool_source),
                                     probe=self.probe, log=self.log.info, run_key=ctx.run_key, overrides=overrides)


class AutoDLPoolSensor(BaseSensorOperator):
    """Step 2: waits (reschedule mode by default, or deferred) until a fitting device is free.

    Fails at once, without waiting, when nothing in the pool could ever hold the run.
    """

    template_fields: Sequence[str] = ("pool_source",)
    ui_color = "#fef7e0"
    operator_extra_links = (AutoDLRunRecordLink(),)

    def __init__(self, *, group_id: str, pool_source: str | None = None, deferrable: bool = False,
                 timeout_from_spec: bool = True, **kwargs: Any):
        kwargs.setdefault("mode", "reschedule")
        super().__init__(**kwargs)
        self.group_id = group_id
        self.pool_source = pool_source
        self.deferrable = deferrable
        self.timeout_from_spec = timeout_from_spec

    def _apply_spec_scheduler(self, context) -> None:
        """Take ``scheduler.timeout`` and ``scheduler.poke_interval`` from the spec the profile step read
        (the spec path may be templated, so it is known only at run time)."""
        if not self.timeout_from_spec:
            return
        spec_path = (self._pull(context, "profile") or {}).get("spec_path")
        if not spec_path:
            return
        from autodl.spec import load_spec

        sched = load_spec(spec_path).scheduler
        self.timeout = float(sched.timeout)
        self.poke_interval = float(sched.poke_interval)
        self.log.info("waiting up to %s s for a fitting device (scheduler.timeout), checking every %s s",
                      sched.timeout, sched.poke_interval)

    _sibling = _AutoDLStep._sibling
    _pull = _AutoDLStep._pull
    _ctx = _AutoDLStep._ctx

    def _src(self) -> str | None:
        return None if self.pool_source in ("", "None", None) else self.pool_source

    def execute(self, context) -> Any:
        try:
            return self._wait(context)
        except AirflowSensorTimeout as exc:
            pipeline.note_failure(self._ctx(context).run_key, "wait",
                                  f"no fitting device became free within {self.timeout:g} s (scheduler.timeout)")
            self.log.error("no fitting device became free within %s s (scheduler.timeout): %s", self.timeout, exc)
            raise
        except AirflowFailException as exc:
            pipeline.note_failure(self._ctx(context).run_key, "wait", str(exc))
            raise

    def _wait(self, context) -> Any:
        self._apply_spec_scheduler(context)
        if self.deferrable and not self._ready(context):
            from autodl.triggers.pool import PoolTrigger

            self.defer(
                trigger=PoolTrigger(profile_out=self._pull(context, "profile"), pool=self._src(),
                                    poke_interval=float(self.poke_interval)),
                method_name="execute_complete",
                timeout=self.timeout,
            )
            return None
        return super().execute(context)

    def execute_complete(self, context, event: dict[str, Any] | None = None) -> None:
        if not event or event.get("status") != "available":
            raise AirflowFailException(f"waiting for the pool ended without a free device: {event}")
        self.log.info("a fitting device is free: %s", event.get("message", ""))

    def _ready(self, context) -> bool:
        try:
            return pipeline.step_wait(self._pull(context, "profile"), pool=self._src(), log=self.log.info)
        except NoFitError as exc:
            self.log.error("%s", exc)
            raise AirflowFailException(str(exc)) from exc

    def poke(self, context) -> bool:
        return self._ready(context)


class AutoDLSelectOperator(_AutoDLStep):
    """Step 3: rank the devices, book the best atomically, log why each was kept or dropped."""

    step = "select"

    def run_step(self, ctx, context):
        return pipeline.step_select(ctx, self._pull(context, "profile"), pool=self._none(self.pool_source), log=self.log.info)


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
        host = _selection_host(selection)
        self.log.info("the booked devices are on host %s", host)
        return [host]


class AutoDLLaunchOperator(_AutoDLStep):
    """Step 4: start the training pinned to the booked devices, detached; push its handle.

    :param booked_host: the host of the booked devices, when the step is mapped over the select step's
        ``autodl_hosts`` XCom (several GPU hosts on Celery); informational: the lease says where.
    """

    step = "launch"

    def __init__(self, *, booked_host: str | None = None, **kwargs: Any):
        super().__init__(**kwargs)
        self.booked_host = booked_host

    def run_step(self, ctx, context):
        profile_out = self._pull(context, "profile")
        selection = self._pull(context, "select")
        launcher_type = pipeline.run_spec(profile_out).launcher.type  # the spec's, or the run's override
        return pipeline.step_launch(ctx, profile_out, selection,
                                    launcher_kwargs=_launcher_kwargs(launcher_type, _selection_host(selection)),
                                    log=self.log.info)


class AutoDLCollectOperator(_AutoDLStep):
    """Step 5: follow the training to its end: log lines into this task's log, metrics sampled."""

    step = "collect"

    def __init__(self, *, sample_interval_s: float = 1.0, booked_host: str | None = None, **kwargs: Any):
        super().__init__(**kwargs)
        self.sample_interval_s = sample_interval_s
        self.booked_host = booked_host

    def on_kill(self) -> None:
        """Airflow stops this task (SIGTERM: marked failed, timed out, worker shutdown): stop the training
        too, so it never computes on devices whose lease the release step is about to free."""
        handle, ctx = getattr(self, "_following", (None, None))
        if handle is None:
            return
        pipeline.note_failure(ctx.run_key, self.step, "the collect task was stopped by Airflow (SIGTERM); "
                                                      "the training was stopped with it")
        pipeline.stop_training(handle, launcher_kwargs=_launcher_kwargs(handle.get("launcher", "local"), handle.get("host")),
                               log=self.log.warning)

    def run_step(self, ctx, context):
        handle = self._pull(context, "launch")
        launcher_type = handle.get("launcher", "local")
        self._following = (handle, ctx)
        return pipeline.step_collect(ctx, handle, launcher_type=launcher_type,
                                     launcher_kwargs=_launcher_kwargs(launcher_type, handle.get("host")),
                                     log=self.log.info, interval_s=self.sample_interval_s)


class AutoDLReleaseOperator(_AutoDLStep):
    """Step 6 (``trigger_rule=all_done``): free the lease whatever happened, write the run record."""

    step = "release"

    def __init__(self, **kwargs: Any):
        kwargs["trigger_rule"] = TriggerRule.ALL_DONE  # as_teardown() (group.py) keeps its run-always meaning
        super().__init__(**kwargs)

    def run_step(self, ctx, context):
        handle = self._pull(context, "launch")
        launcher_type = (handle or {}).get("launcher", "local")
        return pipeline.step_release_and_record(
            ctx, script=self._none(self.script), spec_path=self._none(self.spec),
            profile_out=self._pull(context, "profile"), selection=self._pull(context, "select"),
            handle_json=handle, metrics_json=self._pull(context, "collect"),
            launcher_kwargs=_launcher_kwargs(launcher_type, (handle or {}).get("host")), log=self.log.info,
        )
