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
    from autodl.untrusted import read_report
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
    from autodl.untrusted import read_report

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


PLANT = """
    import json, os
    planted = []
    for d in json.loads(%r):
        for name, text in (("sitecustomize.py", "PERSISTED = True\\n"), ("usercustomize.py", "PERSISTED = True\\n"),
                           ("zz-autodl-hostile.pth", "import os; os.environ['AUTODL_PTH_RAN'] = '1'\\n")):
            p = os.path.join(d, name)
            try:
                os.makedirs(d, exist_ok=True)  # a sys.path entry that does not exist yet (lib/python311.zip) too
                with open(p, "x") as fh:  # "x": autodl's own start-up hook (a sitecustomize) is never overwritten
                    fh.write(text)
                planted.append(p)
            except OSError:
                pass
    print("PLANTED " + json.dumps(planted))
"""

LATER = """
    import json, os, sys
    import sitecustomize
    print("LATER " + json.dumps({"persisted": getattr(sitecustomize, "PERSISTED", False),
                                 "pth": os.environ.get("AUTODL_PTH_RAN"), "user": "usercustomize" in sys.modules}))
"""

NAMES = ("sitecustomize.py", "usercustomize.py", "zz-autodl-hostile.pth")


def _import_dirs() -> list[str]:
    """Where a planted file would run in the worker and in later trainings: the worker's site-packages, user site,
    every ``sys.path`` entry (those that do not exist too) and autodl's start-up hook folder."""
    import site
    import sys

    from autodl.launch.local import CHILD_PATH

    return [d for d in dict.fromkeys([site.getusersitepackages(), *site.getsitepackages(), *sys.path, CHILD_PATH])
            if d]


def _clean(dirs: list[str], existed: dict[str, bool], before: set[str]) -> None:
    """Remove what a failed isolation let the hostile training plant on this host (files and folders it made)."""
    import shutil

    for d in dirs:
        if not existed[d] and os.path.isdir(d):
            shutil.rmtree(d)
            continue
        for n in NAMES:
            p = os.path.join(d, n)
            if p not in before and os.path.exists(p):
                os.unlink(p)


def test_a_training_cannot_plant_start_up_code_for_the_worker_or_later_runs(sandbox_level, worker, tmp_path):
    """Seen (issue 19): a script wrote a ``sitecustomize.py`` where a later Python would import it. A local training
    runs as the worker's uid: the worker's site-packages, user site, ``sys.path`` folders (and the prefix where a
    missing one such as ``lib/python311.zip`` would be made) and autodl's start-up hook folder are read-only in its
    namespaces, so neither the worker, nor a later profile, nor another tenant's training runs what it plants
    (``sitecustomize.py``, ``usercustomize.py``, a ``.pth``)."""
    dirs = _import_dirs()
    existed = {d: os.path.isdir(d) for d in dirs}
    before = {os.path.join(d, n) for d in dirs for n in NAMES if os.path.exists(os.path.join(d, n))}
    try:
        log, _l, _h = train(tmp_path, PLANT % json.dumps(dirs), run_key="dag/run/planter")
        planted = json.loads(log.split("PLANTED ", 1)[1].splitlines()[0])
        after = {os.path.join(d, n) for d in dirs for n in NAMES if os.path.exists(os.path.join(d, n))}
        assert after == before, sorted(after - before)
        assert {d for d in dirs if os.path.isdir(d)} == {d for d in dirs if existed[d]}
        # refused inside the namespaces too, except in its private /tmp (thrown away with it; a sys.path entry of
        # this process may lie there, e.g. Airflow's config folder in a temporary AIRFLOW_HOME)
        assert [p for p in planted if not p.startswith(("/tmp/", "/dev/shm/", "/run/"))] == [], planted
        (tmp_path / "later").mkdir()
        later, _l, _h = train(tmp_path / "later", LATER, run_key="dag/run/victim")
        seen = json.loads(later.split("LATER ", 1)[1].splitlines()[0])
        assert seen == {"persisted": False, "pth": None, "user": False}, seen
    finally:
        _clean(dirs, existed, before)


def test_the_training_folders_airflow_home_stays_hidden_when_the_folder_is_under_tmp(sandbox_level, worker,
                                                                                  tmp_path, monkeypatch):
    """The project layout of the issue (``airflow_home/`` beside the script), in a folder under ``/tmp``: the
    working folder is bound back over the private ``/tmp``, and Airflow's and autodl's state inside it must stay
    masked (a bind made after the mask would show the host's folder again)."""
    project = tmp_path / "code"
    af = project / "airflow_home"
    (af / "autodl" / "runs" / "other").mkdir(parents=True)
    (af / "airflow.cfg").write_text(f"jwt_secret = {TOKEN}\n")
    (af / "autodl" / "runs" / "other" / "report.json").write_text(OTHER)
    monkeypatch.setenv("AIRFLOW_HOME", str(af))
    monkeypatch.setenv("AUTODL_HOME", str(af / "autodl"))
    log, _l, _h = train(tmp_path, f"""
        import os
        for d, _dirs, files in os.walk({str(af)!r}):
            for f in files:
                try:
                    print("READ", os.path.join(d, f), open(os.path.join(d, f)).read(100))
                except OSError as e:
                    print("DENIED", f, e.errno)
        print("DONE")
    """)
    assert "DONE" in log, log[-2000:]
    assert TOKEN not in log and OTHER not in log, log[-2000:]
