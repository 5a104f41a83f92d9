"""Training time: a hostile training started by the local launcher (real processes, real bubblewrap), and the
environment the container launchers pass (issue 19, items 2-4).

The worker's secrets are put into this process's environment: the launcher runs in it, so it is the training's
ancestor, as the Celery worker is in the compose stack.
"""

from __future__ import annotations

import json
import os
import socket
import textwrap
import time
from pathlib import Path

import pytest

from autodl.catalog import load_catalog
from autodl.launch.base import LaunchRequest
from autodl.launch.local import LocalLauncher

FERNET = "fernet-key-5d0c1b2a39485766a5b4c3d2e1f0"
TOKEN = "secret-token-a1b2c3d4e5f60718293a"
STORE_PW = "store-password-99ffee88dd77"
OTHER = "other-runs-report-secret-1234abcd"


@pytest.fixture
def worker(tmp_path, monkeypatch) -> Path:
    """A worker's environment with secrets, autodl's home holding the store and another run's report."""
    home = tmp_path / "autodl"
    other = home / "runs" / "other-run"
    other.mkdir(parents=True)
    (other / "report.json").write_text(json.dumps({"secret": OTHER}))
    (home / "autodl.db").write_text(f"SQLite format 3 {OTHER}")
    monkeypatch.setenv("AUTODL_HOME", str(home))
    monkeypatch.setenv("AIRFLOW_HOME", str(tmp_path / "airflow"))
    monkeypatch.setenv("AIRFLOW__CORE__FERNET_KEY", FERNET)
    monkeypatch.setenv("SECRET_TOKEN", TOKEN)
    monkeypatch.setenv("AUTODL_STORE_URL", f"sqlite:///{home}/autodl.db?password={STORE_PW}")
    monkeypatch.setenv("AUTODL_LOCAL_ISOLATION", "bwrap")
    return home


def train(tmp_path: Path, source: str, run_key: str = "dag/run/hostile") -> tuple[str, LocalLauncher, object]:
    """Run ``source`` as a local training to its end; :returns: its log, the launcher and the handle."""
    code = tmp_path / "code"
    code.mkdir(exist_ok=True)
    script = code / "train.py"
    script.write_text(textwrap.dedent(source))
    launcher = LocalLauncher()
    handle = launcher.launch(LaunchRequest(run_key=run_key, script=str(script), on_cpu=True,
                                           vendor=load_catalog().vendor("nvidia")))
    while launcher.poll(handle) is None:
        time.sleep(0.1)
    return launcher.read_logs(handle)[0], launcher, handle


def test_a_training_cannot_read_its_ancestors_environ(sandbox_level, worker, tmp_path):
    """Seen (issue 19): a training read its ancestors' ``/proc/<pid>/environ``: the Fernet key, the store URL with
    its password, a ``SECRET_TOKEN``. In its own PID namespace it sees only its own processes."""
    log, _l, _h = train(tmp_path, """
        import glob, json, os
        seen = {}
        for p in glob.glob("/proc/[0-9]*/environ"):
            try:
                seen[p] = open(p, "rb").read().decode(errors="replace")
            except OSError as e:
                seen[p] = f"error {e.errno}"
        print("OWN-ENV-OK" if "AUTODL_RUN_KEY" in open("/proc/self/environ", "rb").read().decode() else "NO-OWN")
        print("PPID", os.getppid(), "PIDS", sorted(int(p.split("/")[2]) for p in seen))
        print(json.dumps(seen))
    """)
    assert "OWN-ENV-OK" in log, log[-2000:]
    for secret in (FERNET, TOKEN, STORE_PW):
        assert secret not in log, log[-2000:]
    assert str(os.getpid()) not in log.split("PIDS", 1)[1].split("\n", 1)[0].split(", ") or os.getpid() < 10


def test_a_training_cannot_read_another_runs_report_or_the_store(sandbox_level, worker, tmp_path):
    """Seen (issue 19): a training read other runs' reports in ``AUTODL_HOME``. Only its own run folder is there."""
    log, launcher, handle = train(tmp_path, f"""
        import os
        home = {str(worker)!r}
        for d, dirs, files in os.walk(home):
            for f in files:
                p = os.path.join(d, f)
                try:
                    print("READ", p, open(p, errors="replace").read(200))
                except OSError as e:
                    print("DENIED", p, e.errno)
        open(os.environ["AUTODL_METRICS_FILE"], "a").write('{{"step": 1, "t": 1.0, "samples": 2}}\\n')
        print("OWN-FOLDER-WRITABLE")
    """)
    assert "OWN-FOLDER-WRITABLE" in log, log[-2000:]
    assert OTHER not in log and "other-run" not in log, log[-2000:]
    folder = Path(handle.log_path).parent
    assert oct(folder.stat().st_mode & 0o777) == oct(0o700)
    steps = Path(handle.steps_path)
    assert steps.stat().st_mode & 0o077 == 0  # what the training writes is its owner's only


def test_a_host_unix_socket_in_tmp_is_unreachable_from_a_training(sandbox_level, worker, tmp_path):
    """PostgreSQL's socket lives in ``/tmp`` or ``/run/postgresql``: a training has private ones of its own."""
    sock_dir = tmp_path / "sockets"
    sock_dir.mkdir()
    server = socket.socket(socket.AF_UNIX)
    server.bind(str(sock_dir / ".s.PGSQL.5432"))
    server.listen(4)
    server.settimeout(0.1)
    try:
        log, _l, _h = train(tmp_path, f"""
            import socket
            for p in ({str(sock_dir / '.s.PGSQL.5432')!r}, "/run/docker.sock", "/var/run/docker.sock"):
                s = socket.socket(socket.AF_UNIX)
                try:
                    s.connect(p)
                    print("CONNECTED", p)
                except OSError as e:
                    print("REFUSED", p, e.errno)
        """)
        with pytest.raises(OSError):
            server.accept()
    finally:
        server.close()
    assert "REFUSED" in log and "CONNECTED" not in log, log[-2000:]


def test_a_secret_put_into_its_own_report_is_never_stored(sandbox_level, worker, tmp_path):
    """Seen (issue 19): a training handed the worker's secrets into its own report, which autodl stored in the run
    record shown to every viewer. The report is read without trusting it and redacted before it is stored."""
    from autodl.records import RecordStore
    from autodl.redact import read_report
    from autodl.types import RunRecord

    _log, _l, handle = train(tmp_path, f"""
        import json, os
        report = {{"epoch": 3, "stolen": "fernet={FERNET} token {TOKEN}", "api_key": "k-123456789",
                  "dsn": "postgresql://airflow:{STORE_PW}@db/airflow", "html": "<script>alert(1)</script>",
                  "jwt": "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiJhZG1pbiJ9.c2lnbmF0dXJlLXNpZ24"}}
        with open(os.path.join(os.path.dirname(os.environ["AUTODL_METRICS_FILE"]), "report.json"), "w") as fh:
            json.dump(report, fh)
    """)
    folder = Path(handle.log_path).parent
    report = read_report(folder)
    assert report is not None and report.data["epoch"] == 3
    url = f"sqlite:///{tmp_path / 'records.db'}"
    store = RecordStore(url)
    store.write(RunRecord(run_key="dag/run/hostile", script="train.py", outcome="succeeded", declared_pool=True,
                          report=report.data))
    stored = json.dumps(store.get("dag/run/hostile").model_dump(mode="json"))
    for secret in (FERNET, TOKEN, STORE_PW, "k-123456789", "eyJhbGciOiJIUzI1NiJ9"):
        assert secret not in stored, stored
    assert '"epoch": 3' in stored


def test_a_report_link_to_another_runs_report_is_refused(worker, tmp_path):
    """A training can make its ``report.json`` a link to another run's report (or ``/proc/<ppid>/environ``): the
    link is never followed."""
    from autodl.redact import read_report

    mine = worker / "runs" / "mine"
    mine.mkdir()
    (mine / "report.json").symlink_to(worker / "runs" / "other-run" / "report.json")
    with pytest.raises(ValueError, match="regular file"):
        read_report(mine)


@pytest.mark.parametrize("kind", ["docker", "kubernetes"])
def test_container_launchers_never_pass_the_workers_secrets(worker, tmp_path, kind):
    """The Docker and Kubernetes launchers build the container's environment from the request alone: nothing of
    the worker's environment (Airflow's Fernet key, the store URL, secret-named variables) reaches it."""
    catalog = load_catalog()
    script = tmp_path / "code" / "train.py"
    script.parent.mkdir()
    script.write_text("print(1)\n")
    req = LaunchRequest(run_key="dag/run/t", script=str(script), on_cpu=True, vendor=catalog.vendor("nvidia"),
                        labels={"dag_id": "dag", "run_id": "run", "task_id": "t", "try_number": "1"})
    if kind == "docker":
        from autodl.launch.docker import DockerLauncher

        plan = DockerLauncher().plan(req)
        env = {**plan.env, **plan.create_kwargs["environment"]}
    else:
        from autodl.launch.kubernetes import KubernetesLauncher

        pod = KubernetesLauncher(catalog=catalog).build_pod(req)
        env = {e.name: e.value for c in pod.spec.containers for e in (c.env or [])}
    text = json.dumps(env)
    for secret in (FERNET, TOKEN, STORE_PW):
        assert secret not in text, env
    assert not any(k.startswith(("AIRFLOW", "AUTODL_STORE")) or "SECRET" in k for k in env), env


def test_an_isolated_training_gets_the_stop_signal_and_may_checkpoint(sandbox_level, worker, tmp_path):
    """bubblewrap does not forward SIGTERM and, dying, kills the namespace: the training must still get the stop's
    SIGTERM itself and finish its checkpoint within the grace period, and its own exit code is the attempt's."""
    code = tmp_path / "code"
    code.mkdir()
    script = code / "train.py"
    script.write_text(textwrap.dedent("""
        import signal, sys, time
        def stop(*_):
            time.sleep(1)
            print("CHECKPOINTED", flush=True)
            sys.exit(0)
        signal.signal(signal.SIGTERM, stop)
        print("READY", flush=True)
        time.sleep(60)
    """))
    launcher = LocalLauncher(stop_grace_s=20)
    handle = launcher.launch(LaunchRequest(run_key="dag/run/stop", script=str(script), on_cpu=True,
                                           vendor=load_catalog().vendor("nvidia")))
    while "READY" not in launcher.read_logs(handle)[0]:
        assert launcher.poll(handle) is None, launcher.read_logs(handle)[0]
        time.sleep(0.1)
    launcher.stop(handle)
    while launcher.poll(handle) is None:
        time.sleep(0.1)
    assert "CHECKPOINTED" in launcher.read_logs(handle)[0]
    assert launcher.poll(handle) == 0


def test_the_runs_output_folder_in_autodl_home_stays_writable(sandbox_level, worker, tmp_path):
    """``$AUTODL_OUTPUT_DIR`` defaults to ``$AUTODL_HOME/outputs/<model>``: hidden with the rest of autodl's home, the
    checkpoints would land in a private folder and be lost. It is bound back, writable; its sibling is not shown."""
    out = worker / "outputs" / "mine"
    out.mkdir(parents=True)
    (worker / "outputs" / "theirs").mkdir()
    (worker / "outputs" / "theirs" / "ckpt.pdparams").write_text(OTHER)
    code = tmp_path / "code"
    code.mkdir()
    script = code / "train.py"
    script.write_text(textwrap.dedent(f"""
        import os
        open(os.path.join(os.environ["AUTODL_OUTPUT_DIR"], "ckpt.pdparams"), "w").write("weights")
        print("THEIRS", os.path.exists({str(worker / 'outputs' / 'theirs' / 'ckpt.pdparams')!r}))
    """))
    launcher = LocalLauncher()
    handle = launcher.launch(LaunchRequest(run_key="dag/run/out", script=str(script), on_cpu=True,
                                           env={"AUTODL_OUTPUT_DIR": str(out)}, vendor=load_catalog().vendor("nvidia")))
    while launcher.poll(handle) is None:
        time.sleep(0.1)
    assert launcher.poll(handle) == 0, launcher.read_logs(handle)[0]
    assert (out / "ckpt.pdparams").read_text() == "weights"
    assert out.stat().st_mode & 0o077 == 0 and (out / "ckpt.pdparams").stat().st_mode & 0o077 == 0
    assert "THEIRS False" in launcher.read_logs(handle)[0]
