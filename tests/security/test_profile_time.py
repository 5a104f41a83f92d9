"""Profile time: a hostile script placed at the top of a project folder that also holds Airflow's and autodl's
homes (this repository's own layout), run the way the dry run runs it (issue 19, item 1).

The dry run's own sandbox set-up (the staged copy of the script's folder, the mounts, the environment) is used as
is; only the command is the hostile script itself under plain Python instead of the Paddle hooks, so that each
attack's outcome comes back on stdout.
"""

from __future__ import annotations

import json
import socket
import sys
import textwrap
import threading
from pathlib import Path

import pytest

import autodl.profile.dryrun as D

JWT = "jwt-secret-0f1e2d3c4b5a69788796a5b4"
RUN_KEY = "other-users-run-key-77aa88bb99cc"


@pytest.fixture
def project(tmp_path, monkeypatch) -> Path:
    """``project/`` with the script's data, Airflow's home (airflow.cfg), autodl's store and another run's report."""
    p = tmp_path / "project"
    home = p / "airflow_home"
    (home / "autodl" / "runs" / "other-run").mkdir(parents=True)
    (home / "airflow.cfg").write_text(f"[api_auth]\njwt_secret = {JWT}\n")
    (home / "autodl" / "autodl.db").write_text(f"SQLite format 3 {RUN_KEY}")
    (home / "autodl" / "runs" / "other-run" / "report.json").write_text(json.dumps({"key": RUN_KEY}))
    (p / ".env").write_text(f"SECRET={JWT}\n")
    (p / "old.db").write_text(RUN_KEY)
    (p / "conf").mkdir()
    (p / "conf" / "airflow.cfg").write_text(f"jwt_secret = {JWT}\n")
    (p / "data.txt").write_text("DATA-VISIBLE")
    (p / "outside_link").symlink_to(home / "airflow.cfg")
    monkeypatch.setenv("AIRFLOW_HOME", str(home))
    monkeypatch.setenv("AUTODL_HOME", str(home / "autodl"))
    monkeypatch.delenv("AUTODL_STORE_URL", raising=False)
    return p


def run_hostile(monkeypatch, script: Path, source: str, argv: list[str] | None = None) -> list[dict]:
    """Run ``source`` (as ``script``) in the dry run's sandbox; :returns: each run's JSON line from stdout."""
    script.write_text(textwrap.dedent(source))
    from autodl.sandbox import run_sandboxed as real
    seen: list[dict] = []

    def hostile(argv_, *, workdir, limits, env, read_only_paths=()):
        cfg = json.loads(Path(argv_[-1]).read_text())
        r = real([*argv_[:-2], cfg["script"]], workdir=workdir, limits=limits, env=env,  # the dry run's flags kept
                 read_only_paths=read_only_paths)
        lines = [ln for ln in r.stdout.splitlines() if ln.startswith("{")]
        assert lines, r.stderr[-2000:]
        seen.append(json.loads(lines[-1]))
        return r

    monkeypatch.setattr(D, "run_sandboxed", hostile)
    D.run_dry_run(script, argv=argv, batch=2)
    assert seen
    return seen


READ_ALL = """
    import json, os
    found, errors = {}, []
    for root in (os.getcwd(), os.path.dirname(os.path.abspath(__file__)), %r):
        for d, dirs, files in os.walk(root):
            for f in files:
                p = os.path.join(d, f)
                try:
                    with open(p, errors="replace") as fh:
                        found[p] = fh.read(4096)
                except OSError as e:
                    errors.append(f"{p}: {e}")
    try:
        open("data.txt", "a").write("tampered")
        wrote = True
    except OSError:
        wrote = False
    print(json.dumps({"found": found, "errors": errors, "wrote_data": wrote}))
"""


def test_the_dry_run_never_shows_airflow_cfg_or_the_store_beside_the_script(sandbox_level, project, monkeypatch):
    """Seen (issue 19): the mirrored script folder exposed ``airflow_home/autodl/autodl.db`` (other users' run keys),
    ``airflow_home/airflow.cfg`` (the JWT secret) and other runs' reports. Now only the user's files are shown."""
    out = run_hostile(monkeypatch, project / "train.py", READ_ALL % str(project))[0]
    text = json.dumps(out["found"])
    assert "DATA-VISIBLE" in text  # the channel works: the user's own data is there
    assert JWT not in text and RUN_KEY not in text, sorted(out["found"])
    assert not any(Path(p).name in ("airflow.cfg", ".env", "autodl.db", "old.db", "outside_link")
                   for p in out["found"]), sorted(out["found"])
    assert out["wrote_data"] is False  # the copies are read-only
    assert (project / "data.txt").read_text() == "DATA-VISIBLE"


def test_a_script_inside_airflow_home_sees_its_own_folder_but_not_the_config(sandbox_level, project, monkeypatch):
    """A script kept in ``$AIRFLOW_HOME/dags/``: its folder's data is shown, Airflow's config and store are not."""
    dags = project / "airflow_home" / "dags"
    dags.mkdir()
    (dags / "data.txt").write_text("DATA-VISIBLE")
    out = run_hostile(monkeypatch, dags / "train.py", READ_ALL % str(project / "airflow_home"))[0]
    text = json.dumps(out["found"])
    assert "DATA-VISIBLE" in text and JWT not in text and RUN_KEY not in text, sorted(out["found"])


CONNECT = """
    import json, os, socket, glob
    tried, connected = [], []
    paths = [%r] + glob.glob("**/*.sock", recursive=True) + glob.glob("/tmp/.s.PGSQL*") + glob.glob("/run/**/*",
             recursive=True)[:200] + glob.glob("/var/run/**/*", recursive=True)[:200]
    for p in paths:
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.settimeout(2)
        try:
            s.connect(p)
            connected.append(p)
        except OSError as e:
            tried.append(f"{p}: {e.strerror}")
        s.close()
    print(json.dumps({"tried": tried, "connected": connected, "cwd": sorted(os.listdir("."))}))
"""


class _Listener:
    """A Unix socket server on the host that counts connections."""

    def __init__(self, path: Path):
        self.path, self.accepted = path, 0
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.bind(str(path))
        self.sock.listen(8)
        self.sock.settimeout(0.2)
        self.stop = False
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self):
        while not self.stop:
            try:
                conn, _ = self.sock.accept()
                self.accepted += 1
                conn.close()
            except OSError:
                continue

    def close(self):
        self.stop = True
        self.thread.join()
        self.sock.close()


def test_a_host_unix_socket_in_the_script_folder_is_unreachable(sandbox_level, project, monkeypatch):
    """Seen (issue 19): a socket bound in the script's folder was connected to from inside the sandbox (and through
    PostgreSQL's socket a script deleted another user's lease). A socket is never copied nor bound."""
    listener = _Listener(project / "pg.sock")
    try:
        control = socket.socket(socket.AF_UNIX)
        control.connect(str(project / "pg.sock"))  # the listener works
        control.close()
        out = run_hostile(monkeypatch, project / "train.py", CONNECT % str(project / "pg.sock"))[0]
    finally:
        listener.close()
    assert listener.accepted == 1, out  # the control connection only
    assert out["connected"] == [] and "pg.sock" not in out["cwd"], out


def test_a_task_args_folder_holding_a_host_socket_is_not_mounted(sandbox_level, project, monkeypatch, tmp_path):
    """A data folder named in ``task.args`` is mounted read-only, and a read-only mount does not stop ``connect``
    on a socket: a folder holding one is refused (the profile says so)."""
    data = tmp_path / "dataset"
    data.mkdir()
    (data / "part-0.txt").write_text("x")
    listener = _Listener(data / "db.sock")
    try:
        mounted, refused = D.arg_paths(["--data", str(data)])
        assert mounted == [] and "socket" in refused[0], refused
        out = run_hostile(monkeypatch, project / "train.py", CONNECT % str(data / "db.sock"), argv=["--data", str(data)])[0]
    finally:
        listener.close()
    assert listener.accepted == 0 and out["connected"] == [], out


PERSIST = """
    import json, os, site, sys
    planted = []
    targets = [os.environ.get("HOME", ""), os.getcwd(), "/tmp", "/dev/shm", os.path.dirname(os.path.abspath(__file__)),
               %r, site.getusersitepackages(), *site.getsitepackages(), *sys.path,
               *os.environ.get("PYTHONPATH", "").split(os.pathsep)]
    for d in dict.fromkeys(t for t in targets if t):
        for name, text in (("sitecustomize.py", "PERSISTED = True\\n"), ("usercustomize.py", "PERSISTED = True\\n"),
                           ("zz-hostile.pth", "import os; os.environ['HOSTILE_PTH'] = '1'\\n")):
            try:
                os.makedirs(d, exist_ok=True)
                with open(os.path.join(d, name), "w") as fh:
                    fh.write(text)
                planted.append(os.path.join(d, name))
            except OSError:
                pass
    print(json.dumps({"planted": planted, "home": os.environ.get("HOME")}))
"""

CHECK = """
    import json, os, sys
    try:
        import sitecustomize
        persisted = getattr(sitecustomize, "PERSISTED", False)
    except ImportError:
        persisted = False
    print(json.dumps({"persisted": persisted, "user": "usercustomize" in sys.modules, "pth": os.environ.get("HOSTILE_PTH"),
                      "no_user_site": sys.flags.no_user_site, "home": os.environ.get("HOME"),
                      "left": [p for p in json.loads(%r) if os.path.exists(p)]}))
"""


def test_a_planted_sitecustomize_never_runs_in_a_later_profile(sandbox_level, project, monkeypatch, tmp_path):
    """Seen (issue 19): a script wrote a ``sitecustomize.py`` into a home-like folder the sandbox could write, and
    the next, unrelated profiles executed it. It plants ``sitecustomize.py``, ``usercustomize.py`` and a ``.pth`` in
    every folder a Python imports from (HOME, user site, site-packages, ``sys.path``, ``PYTHONPATH``, its own and
    the staged folder, ``/tmp``): every writable path of a dry run is thrown away with it, its Python runs with
    ``-s`` and a fresh HOME."""
    out = run_hostile(monkeypatch, project / "train.py", PERSIST % str(project / "airflow_home"))[0]
    assert out["planted"]  # it did find writable places (its own throw-away HOME and /tmp)
    later = run_hostile(monkeypatch, project / "train.py", CHECK % json.dumps(out["planted"]))[0]
    assert later["left"] == [], later  # nothing planted is there any more
    assert later["persisted"] is False and later["user"] is False and later["pth"] is None, later
    assert later["no_user_site"] == 1  # the dry run's Python runs with -s: no user site at all
    assert later["home"] != out["home"]  # a fresh HOME per run
    for name in ("sitecustomize.py", "usercustomize.py", "zz-hostile.pth"):
        assert not list(project.rglob(name))
