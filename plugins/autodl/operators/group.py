"""``AutoDLTrainOperator``: one line in a DAG that becomes the six autodl steps as a TaskGroup.

Details: docs/reference/provider.md#autodloperatorsgroup.
"""

from __future__ import annotations

import math
from datetime import timedelta
from typing import TYPE_CHECKING, Any, Required, TypedDict

from airflow.sdk import TaskGroup, XComArg

from autodl.operators.steps import (
    STEP_IDS,
    AutoDLBookedHostOperator,
    AutoDLCollectOperator,
    AutoDLLaunchOperator,
    AutoDLPoolSensor,
    AutoDLProfileOperator,
    AutoDLReleaseOperator,
    AutoDLSelectOperator,
    default_deferrable,
)
from autodl.policies import routing_enabled

if TYPE_CHECKING:
    from airflow.sdk.definitions.mappedoperator import MappedOperator

BOOKED_HOST_ID = "booked_host"
"""Task id of the step that turns the booking into the list launch and collect are mapped over (routed mode only)."""


def _spec_scheduler(spec: str | None) -> tuple[int, int]:
    """(timeout s, poke interval s) from a literal spec path; defaults when templated or unreadable
    (the profile step reports a bad spec with its proper message)."""
    from autodl.spec import SchedulerSection, load_spec

    default = SchedulerSection()
    if not spec or "{{" in str(spec):
        return default.timeout, default.poke_interval
    try:
        sched = load_spec(spec).scheduler
    except Exception:  # noqa: BLE001 - reported by the profile task, not at DAG parse time
        return default.timeout, default.poke_interval
    return sched.timeout, sched.poke_interval


TRANSIENT_RETRIES = 3
"""Least retries of every step: seen in a real Airflow 3.3.2 under load, one execution-API call past its 5 s
timeout failed a profile step that had no retry, and with it the whole run."""

DEFERRED_STEP_RETRIES = 3
"""Retries of the select and collect steps: a try failed by Airflow itself (a stale executor event after a
quick resume, apache/airflow#72716) is followed again; a training that failed is final (no retry)."""


def reschedule_retries(timeout_s: float, poke_interval_s: float) -> int:
    """Retries that let a rescheduled wait survive Airflow's reschedule race (apache/airflow#71172): the
    scheduler may fail the sensor once per poke, so one retry per poke the wait can make; the wait itself
    stays bounded by ``scheduler.timeout`` from when the run joined the queue, not by the retries."""
    return max(3, math.ceil(float(timeout_s) / max(1.0, float(poke_interval_s))) + 1)


_POOL_FILE_HINTS = (".yaml", ".yml", ".json")
_INVENTORY_WORDS = {"auto", "nvml"}


def refuse_inventory_as_airflow_pool(pool: str | None, task_id: str) -> None:
    """Refuse an old-style ``pool=`` that names autodl's inventory source, not one of Airflow's pools.

    ``pool`` used to be autodl's inventory source; it is now Airflow's own pool (Admin > Pools), and the
    inventory source is ``gpu_pool``. A value that reads as an inventory source (``auto``, ``nvml``,
    ``prometheus+http://...``, a path or a ``.yaml``/``.json`` file, a template of ``params.pool``) is refused
    at DAG parse time, naming ``gpu_pool``.

    :raises ValueError: for such a value.
    """
    if not isinstance(pool, str):
        return
    value = pool.strip()
    looks_like_source = (value in _INVENTORY_WORDS or value.startswith("prometheus+") or "/" in value
                         or value.endswith(_POOL_FILE_HINTS) or ("{{" in value and "params.pool" in value))
    if looks_like_source:
        raise ValueError(
            f"AutoDLTrainOperator(task_id={task_id!r}, pool={pool!r}): 'pool' is Airflow's pool (a name from "
            f"Admin > Pools, to cap how many tasks run at once); autodl's inventory source is now 'gpu_pool': "
            f"write gpu_pool={pool!r}."
        )


def default_retries(dag_default_args: dict[str, Any], group_default_args: dict[str, Any]) -> int | None:
    """The ``retries`` the DAG's (or the group's) ``default_args`` set, None when neither does."""
    merged = {**(dag_default_args or {}), **(group_default_args or {})}
    value = merged.get("retries")
    return None if value is None else int(value)


class _AirflowPool(TypedDict, total=False):
    """A step's ``pool=``: Airflow's pool (Admin > Pools); absent, the step takes Airflow's default pool."""

    pool: str


class _PoolStepKwargs(_AirflowPool, total=False):
    """What every step of the group is given, the wait sensor too: its group, inventory source and pool."""

    group_id: Required[str]
    pool_source: Required[str | None]
    task_group: Required[TaskGroup]


class _StepKwargs(_PoolStepKwargs, total=False):
    """What every step but the wait sensor is given besides: the script and spec paths (templated)."""

    script: Required[str | None]
    spec: Required[str | None]


class _Retries(TypedDict, total=False):
    """A step's ``retries=`` and, unless the DAG's ``default_args`` set one, its ``retry_delay=``."""

    retries: Required[int]
    retry_delay: timedelta


class _TrainingStepKwargs(_StepKwargs, _Retries, total=False):
    """The launch and collect steps' arguments (the two steps mapped over the booked host in routed mode)."""

    task_id: Required[str]
    sample_interval_s: Required[float]
    deferrable: bool
    execution_timeout: timedelta | None


def _retries(retries: int, retry_delay: timedelta | None) -> _Retries:
    """``retries=`` and, when ``retry_delay`` is not None, ``retry_delay=`` of one step."""
    out: _Retries = {"retries": retries}
    if retry_delay is not None:
        out["retry_delay"] = retry_delay
    return out


class AutoDLTrainOperator(TaskGroup):
    """Profile, wait for the pool (and book), select a device, launch, collect metrics, release and record.

    :param task_id: the group id; the steps are ``<task_id>.profile`` ... ``<task_id>.release_and_record``.
    :param script: training script (templated); default: the spec's ``task.script``.
    :param spec: task spec YAML (templated).
    :param gpu_pool: autodl's inventory source (templated): ``auto`` (NVML, else the demo pool file), ``nvml``,
        ``prometheus+http://HOST:PORT`` or a pool file path. Default ``$AUTODL_POOL`` / ``[autodl] pool`` or ``auto``.
    :param pool: Airflow's pool (Admin > Pools) every step takes a slot of, e.g. to cap concurrent trainings
        (a pool with "include deferred" counts the waiting and following steps too). Default: Airflow's.
    :param probe: run the sandboxed CPU probe (None: when Paddle is importable).
    :param launcher: override the spec's ``launcher.type`` (templated: ``local``, ``docker``, ``kubernetes``;
        ``spec`` or None: the spec's).
    :param policy: override the spec's ``scheduler.algorithm`` (templated: ``rule_based``, ``rl_based``;
        ``spec`` or None: the spec's).
    :param deferrable: wait in the admission queue and follow the training from the triggerer, holding no worker
        slot (needs a running ``airflow triggerer``); False: the wait reschedules between polls and collect
        follows the training in a worker. Default: ``[operators] default_deferrable`` (Airflow's default
        false), as the providers' operators do.
    :param wait_timeout_s: override the spec's ``scheduler.timeout`` (seconds).
    :param execution_timeout: the longest the training may run (the collect step's
        ``execution_timeout``); past it the training is stopped and the record says why. The spec's
        ``scheduler.max_run_time`` does the same from the spec.
    :param retries: retries of every step; default: the DAG's ``default_args`` (Airflow's default otherwise),
        raised to at least :data:`TRANSIENT_RETRIES`, since every step is idempotent and a try Airflow itself
        failed (the execution API timing out, a lost worker) must not end the run. Select and collect get at
        least :data:`DEFERRED_STEP_RETRIES`, the wait at least :func:`reschedule_retries`. autodl's own
        refusals (a bad spec, nothing fits) and failed trainings never retry.
    :param args: the script's arguments for this run (templated, each element), replacing the spec's ``task.args``.
    """

    def __init__(self, *, task_id: str, script: str | None = None, spec: str | None = None,
                 gpu_pool: str | None = None, pool: str | None = None,
                 probe: bool | None = None, launcher: str | None = None, policy: str | None = None,
                 deferrable: bool | None = None,
                 wait_timeout_s: int | None = None, retries: int | None = None, sample_interval_s: float = 1.0,
                 execution_timeout: timedelta | None = None, args: list[str] | None = None, **group_kwargs: Any):
        refuse_inventory_as_airflow_pool(pool, task_id)
        super().__init__(group_id=task_id, **group_kwargs)
        self.script = script
        self.spec = spec
        deferrable = default_deferrable() if deferrable is None else deferrable
        timeout, poke = _spec_scheduler(spec)
        timeout = wait_timeout_s or timeout
        dag_args = getattr(self.dag, "default_args", None) or {}
        inherited = default_retries(dag_args, self.default_args)
        own_delay = "retry_delay" not in {**dag_args, **(self.default_args or {})}
        airflow_pool: _AirflowPool = {"pool": pool} if pool else {}
        wait_kwargs: _PoolStepKwargs = {"group_id": task_id, "pool_source": gpu_pool, "task_group": self,
                                        **airflow_pool}
        common: _StepKwargs = {**wait_kwargs, "script": script, "spec": spec}
        # every step is idempotent: a try failed by Airflow itself (the execution API timing out under load, a
        # lost worker) is retried; autodl's own refusals and a failed training fail at once (PERMANENT_ERRORS).
        # An explicit retries= wins; default_args above the floor are kept, and their retry_delay too.
        floor = retries if retries is not None else max(inherited or 0, TRANSIENT_RETRIES)
        retry = _retries(floor, timedelta(seconds=5) if own_delay else None)
        self.profile = AutoDLProfileOperator(task_id=STEP_IDS["profile"], probe=probe, launcher=launcher, policy=policy,
                                             args=args, **common, **retry)
        self.wait = AutoDLPoolSensor(task_id=STEP_IDS["wait"], **wait_kwargs,
                                     timeout=timeout, poke_interval=poke, deferrable=deferrable,
                                     wait_timeout_s=wait_timeout_s,
                                     **_retries(max(floor, reschedule_retries(timeout, poke)),
                                                timedelta(seconds=min(poke, 5)) if own_delay else None))
        # select and collect defer too: retries absorb Airflow's stale-event race on a quick resume (see
        # autodl.triggers.MIN_DEFERRAL_S); a failed training is final (no retry)
        deferred = _retries(max(floor, DEFERRED_STEP_RETRIES), timedelta(seconds=5) if own_delay else None)
        self.select = AutoDLSelectOperator(task_id=STEP_IDS["select"], deferrable=deferrable,
                                           wait_timeout_s=wait_timeout_s, **common, **deferred)
        routed = routing_enabled()
        launch_kwargs: _TrainingStepKwargs = {"task_id": STEP_IDS["launch"], "sample_interval_s": sample_interval_s,
                                              **common, **retry}
        # routed to a GPU host's worker, collect follows the training there (its process, its GPUs) instead
        # of deferring to a triggerer on another machine
        collect_kwargs: _TrainingStepKwargs = {"task_id": STEP_IDS["collect"], "sample_interval_s": sample_interval_s,
                                               "deferrable": deferrable and not routed,
                                               "execution_timeout": execution_timeout, **common, **deferred}
        self.launch, self.collect = self._training_steps(routed, launch_kwargs, collect_kwargs, airflow_pool)
        self.release = AutoDLReleaseOperator(task_id=STEP_IDS["release"], **common, **retry)
        self.profile >> self.wait >> self.select >> self.launch >> self.collect >> self.release
        # release also runs when anything before launch failed (it waits for every upstream to be done). It is the
        # group's only leaf: `group >> downstream` waits for the record, and a run that did not succeed fails it
        # (after recording), so the DAG run fails and downstream does not run. A DAG run marked failed skips it:
        # the listeners (autodl/listeners.py) free that run's lease.
        [self.profile, self.wait, self.select, self.launch] >> self.release

    def _training_steps(self, routed: bool, launch_kwargs: _TrainingStepKwargs, collect_kwargs: _TrainingStepKwargs,
                        airflow_pool: _AirflowPool
                        ) -> tuple[AutoDLLaunchOperator | MappedOperator, AutoDLCollectOperator | MappedOperator]:
        """The launch and collect steps: plain, or (routed) mapped over the booked host, after a step that reads it."""
        if not routed:
            return AutoDLLaunchOperator(**launch_kwargs), AutoDLCollectOperator(**collect_kwargs)
        # several GPU hosts on Celery: launch and collect are created once the booking is known, so
        # that autodl's cluster policy can put them on the booked host's queue (autodl/policies.py)
        self.booked_host = AutoDLBookedHostOperator(task_id=BOOKED_HOST_ID, task_group=self, **airflow_pool)
        self.select >> self.booked_host
        hosts = XComArg(self.booked_host)
        return (AutoDLLaunchOperator.partial(**launch_kwargs).expand(booked_host=hosts),
                AutoDLCollectOperator.partial(**collect_kwargs).expand(booked_host=hosts))

    @property
    def result(self) -> XComArg:
        """The run's :class:`autodl.records.RunResult` as JSON (``release_and_record``'s XCom): ``outcome``,
        ``run_key`` (the record), ``estimated_peak_bytes``, ``actual_peak_bytes``, ``duration_s``, ..."""
        return XComArg(self.release)
