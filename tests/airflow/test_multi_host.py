"""Several GPU hosts on Airflow's own executors: a pool spans two hosts, and the steps that must run on the
booked host (launch, collect) are put on that host's Celery queue by autodl's cluster policy.

The DAG runs in-process (``dag.test``), through the same code the scheduler runs to create task
instances: mapped ``launch``/``collect_metrics`` instances are created after the booking
(``TaskMap.expand_mapped_task``) and the ``airflow.policy`` entry point of the installed package
(:mod:`autodl.policies`) sets their queue. The CeleryExecutor sends an instance to ``ti.queue``.

Then for real: a Redis broker and two Celery workers, one per host (own ``AUTODL_HOST``, own
``AUTODL_HOME``: no disk shared with the control plane or each other), each reading its host's queue; the
control plane (this process, a third ``AUTODL_HOME``) profiles, books, routes launch and collect to the
booked host's queue and writes the record from autodl's store alone.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from contextlib import contextmanager
from pathlib import Path

import pytest

from autodl.ledger import Ledger
from autodl.records import RecordStore
from autodl.types import utcnow

pytestmark = [pytest.mark.airflow, pytest.mark.services]  # Redis: the Celery workers' broker

CASES = Path(__file__).resolve().parents[1] / "cases" / "multi_host"
DEVICE = {"gpu-a": "GPU-aaaa0000-0000-0000-0000-000000000000", "gpu-b": "GPU-bbbb0000-0000-0000-0000-000000000000"}
QUEUES = {"gpu-a": "q_gpu_a", "gpu-b": "q_gpu_b"}


def build_dag(dag_id: str, spec: Path, pool: Path):
    import pendulum
    from airflow.sdk import DAG

    from autodl.operators import AutoDLTrainOperator

    with DAG(dag_id, schedule=None, start_date=pendulum.datetime(2026, 1, 1, tz="UTC"), catchup=False) as dag:
        AutoDLTrainOperator(task_id="train", spec=str(spec), gpu_pool=str(pool), probe=False, sample_interval_s=0.2)
    return dag


def serialize(dag) -> None:
    """Write ``dag`` to the metadata database as the DAG processor would (``dag.test`` runs only
    serialized DAGs; this one is built in the test, not read from the dags folder)."""
    from airflow.dag_processing.bundles.manager import DagBundlesManager
    from airflow.dag_processing.dagbag import DagBag, sync_bag_to_db

    DagBundlesManager().sync_bundles_to_db()
    bag = DagBag(dag_folder="/dev/null")
    bag.bag_dag(dag)
    sync_bag_to_db(bag, "dags-folder", None)


def run_on(dag, busy_host: str | None):
    """One DAG run while ``busy_host``'s device is booked by another run, so the placement goes to the other host."""
    from airflow.utils.session import create_session

    ledger = Ledger()
    if busy_host:
        ledger.book("other-run", [DEVICE[busy_host]], host=busy_host, model="A100-SXM4-40GB")
    try:
        dr = dag.test()
    finally:
        if busy_host:
            ledger.release("other-run")
    with create_session() as session:
        tis = {(ti.task_id.split(".", 1)[1], ti.map_index): ti for ti in dr.get_task_instances(session=session)}
        return dr, {key: (str(ti.state), ti.queue) for key, ti in tis.items()}


def test_group_maps_launch_and_collect_only_when_hosts_have_queues(monkeypatch):
    spec, pool = CASES / "spec_local.yaml", CASES / "pool_two_hosts.yaml"
    plain = build_dag("autodl_one_host", spec, pool)
    assert not any(getattr(t, "is_mapped", False) for t in plain.tasks)
    monkeypatch.setenv("AUTODL_HOST_QUEUES", "gpu-a=q_gpu_a,gpu-b=q_gpu_b")
    routed = build_dag("autodl_two_hosts", spec, pool)
    mapped = sorted(t.task_id for t in routed.tasks if getattr(t, "is_mapped", False))
    assert mapped == ["train.collect_metrics", "train.launch"]
    # routed to the GPU host's worker, collect follows the training there, never from a triggerer elsewhere
    assert routed.get_task("train.collect_metrics").partial_kwargs["deferrable"] is False
    assert plain.get_task("train.collect_metrics").deferrable is True


def test_runs_placed_on_each_host_go_to_that_hosts_queue(airflow_db, monkeypatch):
    monkeypatch.setenv("AUTODL_HOST_QUEUES", ",".join(f"{h}={q}" for h, q in QUEUES.items()))
    dag = build_dag("autodl_two_hosts_routing", CASES / "spec_local.yaml", CASES / "pool_two_hosts.yaml")
    serialize(dag)
    for host, busy in (("gpu-a", "gpu-b"), ("gpu-b", "gpu-a")):
        monkeypatch.setenv("AUTODL_HOST", host)  # as on that host's worker (dag.test runs every task here)
        dr, tis = run_on(dag, busy)
        assert all(state == "success" for state, _ in tis.values()), tis
        assert tis[("launch", 0)][1] == QUEUES[host] and tis[("collect_metrics", 0)][1] == QUEUES[host], tis
        # the steps that may run anywhere keep the default queue
        for step in ("profile", "wait_for_pool", "select_device", "release_and_record"):
            assert tis[(step, -1)][1] not in QUEUES.values(), (step, tis)
        record = RecordStore().get(f"autodl_two_hosts_routing.train.{dr.run_id}")
        assert record.outcome == "succeeded" and record.placement["host"] == host
        assert record.launch["host"] == host
    assert Ledger().leases() == []


def test_local_launch_refuses_a_host_it_is_not_on(monkeypatch):
    """Without routing a worker on gpu-a would start a training pinned to gpu-b's device ids: refused."""
    from autodl.errors import LaunchError
    from autodl.hosts import require_here

    monkeypatch.setenv("AUTODL_HOST", "gpu-a")
    require_here("gpu-a", "start the training", "k")
    require_here(None, "start the training", "k")
    with pytest.raises(LaunchError, match="booked devices are on host gpu-b, but this step runs on gpu-a"):
        require_here("gpu-b", "start the training", "k")



def test_a_routed_launch_refuses_a_worker_that_is_not_the_booked_host(monkeypatch):
    """Issue 25: a worker whose AUTODL_HOST was unset launched a training booked on another host without a word
    (declared devices run on CPU anywhere, so the host check let it through)."""
    from autodl.errors import ConfigError
    from autodl.pipeline import require_booked_worker

    monkeypatch.delenv("AUTODL_HOST", raising=False)
    with pytest.raises(ConfigError, match="booked on host gpu-b .* this worker has no AUTODL_HOST.*AUTODL_HOST=gpu-b"):
        require_booked_worker("gpu-b", "k", "local")
    monkeypatch.setenv("AUTODL_HOST", "gpu-a")
    with pytest.raises(ConfigError, match="booked on host gpu-b, but this worker is AUTODL_HOST=gpu-a"):
        require_booked_worker("gpu-b", "k", "local")
    monkeypatch.setenv("AUTODL_HOST", "gpu-b")
    require_booked_worker("gpu-b", "k", "local")
    require_booked_worker(None, "k", "local")  # not routed: require_here checks what it can
    require_booked_worker("gpu-b", "k", "docker")  # a Docker connection per host starts it there from anywhere


# ------------------------------------------------------------------------------ real Celery workers
REPO = Path(__file__).resolve().parents[2]


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _require(available: bool, what: str, how: str) -> None:
    from tests.integration.conftest import require_service

    require_service(available, what, how)


@contextmanager
def redis_url():
    """``AUTODL_TEST_REDIS_URL`` (.ci/redis.sh starts one), else a ``redis-server`` started here on a free
    127.0.0.1 port with a password, stopped by its pid after."""
    given = os.environ.get("AUTODL_TEST_REDIS_URL")
    if given:
        yield given
        return
    _require(bool(shutil.which("redis-server")), "redis-server", "run `source .ci/redis.sh` (installs Debian's redis-server)")
    port, password = _free_port(), uuid.uuid4().hex
    proc = subprocess.Popen(["redis-server", "--bind", "127.0.0.1", "--port", str(port), "--save", "",
                             "--appendonly", "no", "--requirepass", password], stdout=subprocess.DEVNULL,
                            stderr=subprocess.STDOUT, start_new_session=True)
    try:
        url = f"redis://:{password}@127.0.0.1:{port}/0"
        import redis

        client = redis.Redis.from_url(url)
        while True:  # until it answers, or it exited
            try:
                client.ping()
                break
            except redis.exceptions.ConnectionError:
                assert proc.poll() is None, f"redis-server exited with {proc.returncode}"
                time.sleep(0.1)
        yield url
    finally:
        _stop(proc)


def _stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


class Workers(dict):
    """The host workers' processes by host; :meth:`stop` and :meth:`start` one of them (a GPU host's worker down,
    then back)."""

    def __init__(self, root: Path, broker: str, store: str, docker_hosts: dict[str, str] | None = None):
        super().__init__()
        self.root, self.broker, self.store, self.docker_hosts = root, broker, store, docker_hosts

    def start(self, host: str) -> subprocess.Popen:
        home = self.root / host
        home.mkdir(parents=True, exist_ok=True)
        env = {**os.environ, "AUTODL_HOME": str(home), "AUTODL_HOST": host, "AUTODL_STORE_URL": self.store,
               "AUTODL_TEST_REDIS_URL": self.broker, "PYTHONPATH": str(REPO)}
        if self.docker_hosts:
            env["DOCKER_HOST"] = self.docker_hosts[host]
        log = open(self.root / f"{host}.log", "ab")
        self[host] = subprocess.Popen(
            [sys.executable, "-m", "celery", "-A", "tests.airflow.celery_hosts", "worker", "-Q", QUEUES[host],
             "-n", f"{host}@%h", "--pool", "solo", "--without-gossip", "--without-mingle", "-l", "INFO"],
            cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        log.close()
        return self[host]

    def stop(self, host: str) -> None:
        """Stop ``host``'s worker (SIGTERM: Celery's warm shutdown) and forget it, so :func:`result_of` does not
        take it for a crash."""
        _stop(self.pop(host))


@contextmanager
def host_workers(root: Path, broker: str, store: str, docker_hosts: dict[str, str] | None = None):
    """One Celery worker per host, each on its host's queue with its own AUTODL_HOST and AUTODL_HOME (and,
    given ``docker_hosts``, its own Docker engine as DOCKER_HOST)."""
    procs = Workers(root, broker, store, docker_hosts)
    try:
        for host in QUEUES:
            procs.start(host)
        yield procs
    finally:
        for proc in procs.values():
            _stop(proc)


def result_of(result, procs: dict, root: Path):
    """The task's result; fails (with the worker's log) as soon as a worker process is gone, never waits on one."""
    while not result.ready():
        for host, proc in procs.items():
            if proc.poll() is not None:
                tail = (root / f"{host}.log").read_text(errors="replace")[-3000:]
                pytest.fail(f"the Celery worker of {host} exited with {proc.returncode}:\n{tail}")
        time.sleep(0.2)
    return result.get()


@contextmanager
def shared_store(root: Path):
    """The store every host reaches: the test PostgreSQL when there is one (as in production; a schema of
    its own, dropped after), else one SQLite file outside every host's AUTODL_HOME."""
    url = os.environ.get("AUTODL_TEST_PG_URL")
    if not url:
        yield f"sqlite:///{root / 'shared-store.db'}"
        return
    from sqlalchemy import create_engine, text

    schema = f"mh_{uuid.uuid4().hex[:8]}"
    engine = create_engine(url)
    with engine.begin() as conn:
        conn.execute(text(f"CREATE SCHEMA {schema}"))
    try:
        yield f"{url}?options=-csearch_path%3D{schema}"
    finally:
        with engine.begin() as conn:
            conn.execute(text(f"DROP SCHEMA {schema} CASCADE"))
        engine.dispose()


@contextmanager
def two_hosts(monkeypatch, docker_hosts: dict[str, str] | None = None):
    """Store, broker and the two host workers; this process is the control plane (AUTODL_HOST=control).

    Yields (root folder, worker processes, a Celery client of this test's broker)."""
    from celery import Celery

    from tests.airflow import celery_hosts

    root = Path(tempfile.mkdtemp(prefix="adl-mh-"))
    monkeypatch.setenv("AUTODL_HOST", "control")
    monkeypatch.setenv("AUTODL_HOST_QUEUES", ",".join(f"{h}={q}" for h, q in QUEUES.items()))
    try:
        with (shared_store(root) as store, redis_url() as broker,
              host_workers(root, broker, store, docker_hosts) as procs):
            monkeypatch.setenv("AUTODL_STORE_URL", store)
            client = Celery("autodl_test_control", broker=broker, backend=broker)
            client.conf.update(celery_hosts.app.conf.table(with_defaults=False))
            client.conf.update(broker_url=broker, result_backend=broker)
            try:
                yield root, procs, client
            finally:
                client.close()
    finally:
        shutil.rmtree(root, ignore_errors=True)


def run_on_booked_host(hosts: tuple, spec: Path, busy: str, *, launcher_kwargs_of=None):
    """One run as the six steps run it across hosts: profile and book here (``busy``'s device taken by
    another run), launch and collect on the booked host's queue, release and record here.

    :returns: (run key, booked host, what the launch task returned, what the collect task returned).
    """
    from autodl import pipeline
    from autodl.config import host_queues

    root, procs, client = hosts
    pool = str(CASES / "pool_two_hosts.yaml")
    run_id = f"celery__{uuid.uuid4().hex[:8]}"
    ctx = pipeline.RunContext(run_key=f"autodl_celery.train.{run_id}", dag_id="autodl_celery", run_id=run_id)
    run = {"run_key": ctx.run_key, "dag_id": ctx.dag_id, "run_id": ctx.run_id}
    Ledger().book(f"other-{run_id}", [DEVICE[busy]], host=busy, model="A100-SXM4-40GB")
    try:
        prof = pipeline.step_profile(None, str(spec), pool=pool, probe=False, run_key=ctx.run_key, log=lambda _l: None)
        sel = pipeline.step_select(ctx, prof, pool=pool, log=lambda _l: None)
    finally:
        Ledger().release(f"other-{run_id}")
    queue = host_queues()[sel.host]
    launched = result_of(client.send_task("autodl_test.launch", queue=queue,
                                          args=[run, prof.model_dump(mode="json"), sel.model_dump(mode="json")]),
                         procs, root)
    collected = result_of(client.send_task("autodl_test.collect", args=[run, launched["handle"]], queue=queue),
                          procs, root)
    # the record is written here, on the control plane, from the steps' values and the store only
    out = pipeline.step_release_and_record(
        ctx, script=None, spec_path=str(spec), profile_out=prof, selection=sel, handle_json=launched["handle"],
        metrics_json=collected["metrics"], log=lambda _l: None,
        launcher_kwargs=launcher_kwargs_of(sel.host) if launcher_kwargs_of else None)
    assert out["outcome"] == "succeeded" and out["lease_released"], out
    return ctx.run_key, sel.host, launched, collected


def assert_placed_and_decided_on(run_key: str, host: str, launched: dict, collected: dict):
    """Launch and collect ran on ``host``'s worker; the record says ``host`` and keeps the decision made here."""
    from autodl.store import RunState

    assert launched["ran_on"] == host and launched["handle"]["host"] == host
    assert collected["ran_on"] == host and collected["metrics"]["exit_code"] == 0
    record = RecordStore().get(run_key)
    assert record.outcome == "succeeded" and record.placement["host"] == host and record.launch["host"] == host
    kept = [c for c in record.decision["candidates"] if c["kept"]]
    assert kept and kept[0]["host"] == host and record.decision["chosen"]["host"] == host
    written_on = RunState().names(run_key)
    assert written_on["handle"] == host and written_on["metrics"] == host
    assert written_on["decision"] == "control" and written_on["profile"] == "control"
    return record, written_on


def test_celery_workers_run_launch_and_collect_on_the_booked_host_and_each_record_is_complete(monkeypatch):
    from autodl import pipeline

    with two_hosts(monkeypatch) as hosts:
        root = hosts[0]
        for host, busy in (("gpu-a", "gpu-b"), ("gpu-b", "gpu-a")):
            run_key, booked, launched, collected = run_on_booked_host(hosts, CASES / "spec_report.yaml", busy)
            assert booked == host
            record, written_on = assert_placed_and_decided_on(run_key, host, launched, collected)
            assert record.actual_peak_bytes and record.actual_peak_bytes > 64 << 20, record.metrics
            assert record.report == {"epoch": 1, "run_key": run_key, "resumed_from": None}
            assert written_on["report"] == host
            # the training's report file stayed on its host; the control plane never had one to read
            assert Path(launched["autodl_home"]).parent == root
            assert not (pipeline.state_dir(run_key) / "report.json").exists()
            # the estimate reached the host's own OOM explanation and timeline through the store, not a shared disk
            on_host = Path(launched["handle"]["log_path"]).parent
            assert str(on_host).startswith(launched["autodl_home"]) and (on_host / "profile.json").is_file()
        assert Ledger().leases() == []


@pytest.fixture
def host_engines():
    """A Docker engine per host (own dockerd, socket and data root), the test image imported into each."""
    from tests.integration.conftest import IMAGE, _rootfs_tar
    from tests.integration.engines import Engine, start, stop

    usable = os.geteuid() == 0 and shutil.which("dockerd") and shutil.which("docker") and Path("/bin/busybox").is_file()
    _require(bool(usable), "dockerd (as root), the docker CLI and /bin/busybox",
             "run `source .ci/docker.sh` as root (installs Debian's docker.io and busybox-static)")
    root = Path(tempfile.mkdtemp(prefix="adl-", dir="/tmp"))  # short: unix socket paths under it
    engines = [Engine(name, root / name[-1]) for name in QUEUES]
    try:
        try:
            start(engines)
        except RuntimeError as exc:
            _require(False, "extra Docker engines", str(exc))
        tar = _rootfs_tar()
        for engine in engines:
            subprocess.run(["docker", "-H", engine.base_url, "import", "--change", "ENV PATH=/bin", "-", IMAGE],
                           input=tar, check=True, capture_output=True)
        yield {e.name: e.base_url for e in engines}
    finally:
        stop(engines)
        shutil.rmtree(root, ignore_errors=True)


@pytest.mark.integration
def test_celery_workers_each_with_its_own_docker_engine_start_the_container_there(monkeypatch, host_engines):
    import docker

    def containers(base_url: str, run_key: str) -> list:
        client = docker.DockerClient(base_url=base_url, timeout=30)
        try:
            return [(c.status, c.logs().decode()) for c in
                    client.containers.list(all=True, filters={"label": f"autodl.run_key={run_key}"})]
        finally:
            client.close()

    with two_hosts(monkeypatch, docker_hosts=host_engines) as hosts:
        for host, busy in (("gpu-a", "gpu-b"), ("gpu-b", "gpu-a")):
            run_key, booked, launched, collected = run_on_booked_host(
                hosts, CASES / "spec_docker.yaml", busy, launcher_kwargs_of=lambda h: {"base_url": host_engines[h]})
            assert booked == host and launched["handle"]["launcher"] == "docker"
            assert_placed_and_decided_on(run_key, host, launched, collected)
            here = containers(host_engines[host], run_key)
            assert len(here) == 1 and here[0][0] == "exited" and f"trained run {run_key}" in here[0][1], here
            other = next(url for h, url in host_engines.items() if h != host)
            assert containers(other, run_key) == []
        assert Ledger().leases() == []


def _training_column() -> str:
    """The last column (``training``) of ``autodl leases`` as a user runs it, its folded lines joined."""
    out = subprocess.run([sys.executable, "-m", "autodl", "leases"], capture_output=True, text=True, check=True)
    cells = [line.split("│")[-2].strip() for line in out.stdout.splitlines() if line.count("│") > 2]
    return " ".join(cells)


def test_a_booking_whose_hosts_worker_is_down_waits_visibly_is_requeued_and_completes_when_the_worker_is_back(
        monkeypatch):
    """Issue 25: when a GPU host's worker was down its booking expired silently and the run failed later with
    "lease is gone", nothing saying what it waited for. With gpu-a's real Celery worker stopped, a run booked on
    gpu-a is shown waiting for a worker on gpu-a (``autodl leases``, the GPU page's data); past the lease's TTL
    with nothing launched, the reaper frees its device and puts the run back in the admission queue (no record
    of a failure); when the worker is back it runs the launch, which books gpu-a again, and the run completes,
    its record noting what happened."""
    from autodl import pipeline
    from autodl.config import host_queues
    from autodl.queue import AdmissionQueue
    from autodl.store import RunState
    from autodl.ui.data import lease_rows, queue_view

    monkeypatch.setenv("AUTODL_LEASE_TTL", "4")  # the bound: a booking nothing launched within 4 s is re-queued
    with two_hosts(monkeypatch) as (root, procs, client):
        procs.stop("gpu-a")
        run_id = f"celery__{uuid.uuid4().hex[:8]}"
        ctx = pipeline.RunContext(run_key=f"autodl_celery.train.{run_id}", dag_id="autodl_celery", run_id=run_id)
        run = {"run_key": ctx.run_key, "dag_id": ctx.dag_id, "run_id": ctx.run_id}
        pool = str(CASES / "pool_two_hosts.yaml")
        Ledger().book(f"other-{run_id}", [DEVICE["gpu-b"]], host="gpu-b", model="A100-SXM4-40GB", ttl_s=3600)
        prof = pipeline.step_profile(None, str(CASES / "spec_report.yaml"), pool=pool, probe=False, run_key=ctx.run_key,
                                     log=lambda _l: None)
        sel = pipeline.step_select(ctx, prof, pool=pool, log=lambda _l: None)
        assert sel.host == "gpu-a"
        pending = client.send_task("autodl_test.launch", queue=host_queues()["gpu-a"],
                                   args=[run, prof.model_dump(mode="json"), sel.model_dump(mode="json")])
        # visible: booked on gpu-a, waiting for a worker there
        assert "not launched: waiting for a worker on gpu-a to start it" in _training_column()
        [row] = [r for r in lease_rows() if r.run_key == ctx.run_key]
        assert row.launched is False and row.host == "gpu-a"   # the page's "booked, not launched yet" line
        while not Ledger().get(ctx.run_key).expired(utcnow()):
            time.sleep(0.2)
        reaped = json.loads(subprocess.run([sys.executable, "-m", "autodl", "leases", "--reap", "--json"],
                                           capture_output=True, text=True, check=True).stdout)
        assert ctx.run_key in reaped["reaped"]
        assert any("went back to the admission queue" in line and "worker of gpu-a" in line for line in reaped["log"])
        # kept, not lost: its device is free, the run waits in the admission queue, no failure recorded
        assert Ledger().get(ctx.run_key) is None and AdmissionQueue().get(ctx.run_key) is not None
        assert ctx.run_key in [r["run_key"] for r in queue_view().rows]
        assert RecordStore().get(ctx.run_key) is None and pipeline.read_failures(ctx.run_key) == {}
        assert "is the Celery worker of gpu-a's queue running?" in RunState().get(ctx.run_key, RunState.REQUEUED)["message"]
        assert not pending.ready()

        procs.start("gpu-a")  # the worker is back: it runs the launch waiting on its queue
        launched = result_of(pending, procs, root)
        assert launched["ran_on"] == "gpu-a" and launched["handle"]["host"] == "gpu-a"
        assert launched["handle"]["lease_id"] != sel.lease.lease_id  # booked again
        assert AdmissionQueue().get(ctx.run_key) is None
        collected = result_of(client.send_task("autodl_test.collect", args=[run, launched["handle"]],
                                               queue=host_queues()["gpu-a"]), procs, root)
        out = pipeline.step_release_and_record(
            ctx, script=None, spec_path=str(CASES / "spec_report.yaml"), profile_out=prof,
            selection=RunState().get(ctx.run_key, RunState.SELECTION), handle_json=launched["handle"],
            metrics_json=collected["metrics"], log=lambda _l: None)
        assert out["outcome"] == "succeeded" and out["lease_released"], out
        record = RecordStore().get(ctx.run_key)
        assert record.error is None and record.lease_id == launched["handle"]["lease_id"]
        assert record.placement["host"] == "gpu-a"
        [note] = record.notes
        assert f"lease {sel.lease.lease_id} expired before its training was launched: booked on host gpu-a" in note
        Ledger().release(f"other-{run_id}")
        assert Ledger().leases() == []
