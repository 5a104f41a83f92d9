"""Hostile code through the real sandbox (issue 13): nothing escapes, nothing secret is printed.

Each test is one thing an attacker did through a model's ``__init__`` against the old probe sandbox
(a network namespace, RLIMIT_AS and a timeout, as the caller's user): a Unix-socket connect to a
file-system socket and to PostgreSQL's, reading ``/proc/<parent>/environ``, a ``setsid`` daemon that
outlived the profile, 100 forks, three children of 1.6 GiB each under a 3 GiB cap, writes outside
the temporary folder. TCP to the host was already blocked and stays so.
"""

from __future__ import annotations

import json
import os
import socket
import sys
import textwrap
from pathlib import Path

import pytest

from autodl.sandbox import SANDBOX_UID, SandboxLimits, run_sandboxed
from tests.sandbox.helpers import run_code, survivors

pytestmark = pytest.mark.sandbox

PG_SOCKET = Path("/tmp/.s.PGSQL.55432")
DOCKER_SOCKET = Path("/var/run/docker.sock")


def _last_json(stdout: str) -> dict:
    return json.loads(stdout.strip().splitlines()[-1])


def test_unix_sockets_of_the_host_are_unreachable(sandbox_level, workdir, tmp_path):
    """Seen: the old probe connected to a file-system socket and to PostgreSQL's, then deleted a lease."""
    outside = tmp_path / "outside"
    outside.mkdir()
    path = outside / "s.sock"
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(str(path))
    server.listen(8)
    abstract = f"\0autodl-test-{os.getpid()}-{id(server)}"
    aserver = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    aserver.bind(abstract)
    aserver.listen(8)
    # the control: from the host, the test's own sockets answer (PostgreSQL's and Docker's are targets too, but
    # no daemon need run for this test: a socket file left by a stopped server answers nobody)
    for target in (str(path), abstract):
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as c:
            c.connect(target)
    for s in (server, aserver):
        s.accept()[0].close()

    code = textwrap.dedent("""
        import json, socket, sys
        out = {}
        for target in sys.argv[1:]:
            try:
                with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as c:
                    c.connect(target.replace("@", "\\0", 1) if target.startswith("@") else target)
                out[target] = "connected"
            except OSError as exc:
                out[target] = type(exc).__name__
        print(json.dumps(out))
    """)
    targets = [str(path), "@" + abstract[1:], str(PG_SOCKET), str(DOCKER_SOCKET), "/run/docker.sock"]
    r = run_code(code, workdir, argv=targets)
    assert r.returncode == 0, r.stderr
    seen = _last_json(r.stdout)
    assert set(seen) == set(targets)
    assert "connected" not in seen.values(), seen
    for s in (server, aserver):
        s.setblocking(False)
        with pytest.raises(BlockingIOError):
            s.accept()
        s.close()


def _listening(family: int, host: str) -> socket.socket:
    server = socket.socket(family, socket.SOCK_STREAM)
    server.bind((host, 0))
    server.listen(8)
    return server


def test_tcp_to_the_host_is_blocked(sandbox_level, workdir):
    """TCP to a port listening on the host's 127.0.0.1 and ::1 answers on the host, not in the sandbox.

    The listeners are the test's own, so no daemon need run; PostgreSQL's 55432 is tried as well.
    """
    servers = [_listening(socket.AF_INET, "127.0.0.1"), _listening(socket.AF_INET6, "::1")]
    targets = [[s.getsockname()[0], s.getsockname()[1]] for s in servers]
    targets += [["127.0.0.1", 55432], ["::1", 55432]]
    for host, port in targets[:2]:  # the control: from the host, the test's own ports answer
        socket.create_connection((host, port), timeout=5).close()
    for s in servers:
        s.accept()[0].close()
    code = textwrap.dedent("""
        import json, socket, sys
        out = {}
        for host, port in json.loads(sys.argv[1]):
            try:
                socket.create_connection((host, port), timeout=5).close()
                out[f"{host}:{port}"] = "connected"
            except OSError as exc:
                out[f"{host}:{port}"] = type(exc).__name__
        print(json.dumps(out))
        print(open("/proc/net/dev").read())
    """)
    r = run_code(code, workdir, argv=[json.dumps(targets)])
    assert r.returncode == 0, r.stderr
    lines = r.stdout.strip().splitlines()
    seen = json.loads(lines[0])
    assert len(seen) == len(targets)
    assert "connected" not in seen.values(), seen
    interfaces = [l.split(":")[0].strip() for l in lines[3:] if ":" in l]
    assert interfaces == ["lo"]
    for s in servers:  # nothing reached the host's listeners from inside
        s.setblocking(False)
        with pytest.raises(BlockingIOError):
            s.accept()
        s.close()


def test_proc_of_the_caller_is_invisible_and_no_secret_is_printed(sandbox_level, workdir, monkeypatch):
    """Seen: the old probe read the Airflow process's /proc/<pid>/environ (tokens, the store URL's password)."""
    secret = "s3cr3t-" + os.urandom(8).hex()
    monkeypatch.setenv("AUTODL_STORE_URL", f"postgresql://autodl:{secret}@db/autodl")
    monkeypatch.setenv("AIRFLOW__CORE__FERNET_KEY", secret)
    code = textwrap.dedent("""
        import json, os, sys
        out = {"pids": sorted(p for p in os.listdir("/proc") if p.isdigit()), "read": {}}
        for pid in [sys.argv[1], str(os.getppid()), "1", *out["pids"]]:
            for name in ("environ", "cmdline"):
                try:
                    out["read"][pid + "/" + name] = open(f"/proc/{pid}/{name}", "rb").read().decode(errors="replace")
                except OSError as exc:
                    out["read"][pid + "/" + name] = type(exc).__name__
        out["env"] = dict(os.environ)
        text = json.dumps(out)
        print(text)
        print(text, file=sys.stderr)
        raise SystemExit(text)
    """)
    r = run_code(code, workdir, argv=[str(os.getpid())])
    assert secret not in r.stdout and secret not in r.stderr
    seen = _last_json(r.stdout)
    # only the sandbox's own processes: bubblewrap's init (1) and the command (2)
    assert seen["pids"] == ["1", "2"], seen["pids"]
    assert seen["read"][f"{os.getpid()}/environ"] in ("FileNotFoundError", "") or os.getpid() in (1, 2)
    assert set(seen["env"]) <= {"PATH", "LANG", "HOME", "PWD", "LC_CTYPE", "PYTHONNOUSERSITE"}, seen["env"]
    assert seen["env"].get("PYTHONNOUSERSITE") == "1"  # no user site for any Python in it (issue 19)


def test_not_root_no_capabilities_no_new_user_namespace(sandbox_level, workdir):
    code = textwrap.dedent("""
        import ctypes, json, os
        status = dict(l.split(":", 1) for l in open("/proc/self/status").read().splitlines() if ":" in l)
        libc = ctypes.CDLL(None, use_errno=True)
        rc = libc.unshare(0x10000000)  # CLONE_NEWUSER
        print(json.dumps({"uid": os.getuid(), "gid": os.getgid(), "euid": os.geteuid(),
                          "cap_eff": status["CapEff"].strip(), "cap_prm": status["CapPrm"].strip(),
                          "no_new_privs": status["NoNewPrivs"].strip(), "unshare_user": rc,
                          "errno": ctypes.get_errno(), "hostname": os.uname().nodename}))
    """)
    r = run_code(code, workdir)
    assert r.returncode == 0, r.stderr
    seen = _last_json(r.stdout)
    assert seen["uid"] == seen["euid"] == seen["gid"] == SANDBOX_UID
    assert int(seen["cap_eff"], 16) == 0 and int(seen["cap_prm"], 16) == 0
    assert seen["no_new_privs"] == "1"
    assert seen["unshare_user"] == -1, "the sandbox could create a user namespace"
    assert seen["hostname"] == "sandbox" != os.uname().nodename


@pytest.mark.parametrize("ending", ["exits", "times_out"])
def test_a_setsid_daemon_dies_with_the_call(sandbox_level, workdir, marker, ending):
    """Seen: a daemon started with setsid from a model's __init__ outlived a successful profile."""
    code = textwrap.dedent(f"""
        import os, time
        if os.fork() == 0:
            os.setsid()
            if os.fork() == 0:
                os.closerange(0, 3)
                open("daemon-started", "w").close()
                os.execv("/bin/sh", ["sh", "-c", "while :; do sleep 1; done # {marker}"])
            os._exit(0)
        while not os.path.exists("daemon-started"):
            time.sleep(0.05)
        print("daemon started", flush=True)
        if {ending == "times_out"!r}:
            time.sleep(3600)
    """)
    r = run_code(code, workdir, timeout_s=60 if ending == "exits" else 8)
    assert "daemon started" in r.stdout, r.stderr
    assert (workdir / "daemon-started").exists()
    if ending == "exits":
        assert r.returncode == 0 and not r.timed_out
    else:
        assert r.timed_out and r.returncode is None
    assert survivors(marker) == []


def test_a_fork_bomb_is_bounded(sandbox_level, workdir, marker):
    """Seen: the old probe forked 100 children (no process limit)."""
    code = textwrap.dedent(f"""
        import os, signal, time
        # {marker}
        made = refused = 0
        for _ in range(200):
            try:
                pid = os.fork()
            except OSError:
                refused += 1
                continue
            if pid == 0:
                time.sleep(3600)
                os._exit(0)
            made += 1
        print(made, refused, flush=True)
    """)
    r = run_code(code, workdir, max_processes=32)
    made, refused = map(int, r.stdout.split())
    assert made < 32 and refused == 200 - made
    if sandbox_level == "bwrap+cgroup":
        assert r.forks_refused and r.forks_refused >= refused
    assert survivors(marker) == []  # the children sleeping for an hour died with the call


def test_an_exponential_fork_bomb_is_bounded_and_killed(sandbox_level, workdir, marker):
    code = f"import os\n# {marker}\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass\n"
    r = run_code(code, workdir, max_processes=32, timeout_s=5)
    assert r.timed_out
    if sandbox_level == "bwrap+cgroup":
        assert r.forks_refused and r.forks_refused > 0
    assert survivors(marker) == []


def test_memory_of_the_whole_tree_is_bounded(sandbox_level, workdir, marker):
    """Seen: three children each took 1.6 GiB under a 3 GiB cap (the cap was per process)."""
    if sandbox_level != "bwrap+cgroup":
        pytest.skip("without a cgroup the sandbox bounds memory per process only (its notes say so)")
    code = textwrap.dedent(f"""
        import os, signal, time
        # {marker}
        kids = []
        for i in range(3):
            pid = os.fork()
            if pid == 0:
                block = b"\\1" * int(1.6 * (1 << 30))   # written, so resident
                time.sleep(60)
                os._exit(0)
            kids.append(pid)
        statuses = []
        pid, status = os.wait()
        statuses.append(status)
        for k in kids:
            if k != pid:
                os.kill(k, signal.SIGKILL)
        print(statuses, flush=True)
    """)
    cap = 3 << 30
    r = run_code(code, workdir, memory_bytes=cap)
    assert r.peak_memory_bytes is not None and r.peak_memory_bytes <= cap
    assert r.peak_memory_bytes > 2 << 30  # two blocks were resident at once: the bound, not luck, stopped the third
    assert r.oom_kills and r.oom_kills >= 1
    assert any("memory limit" in n for n in r.notes)
    assert survivors(marker) == []


def test_a_single_process_over_the_limit_gets_memory_error(sandbox_level, workdir):
    r = run_code("b = b'1' * (2 << 30)\n", workdir, memory_bytes=1 << 30)
    assert r.returncode == 1 and "MemoryError" in r.stderr


def test_writes_outside_the_workdir_fail_or_land_nowhere(sandbox_level, workdir, tmp_path):
    """Seen: the old probe wrote files outside its temporary folder."""
    outside = tmp_path / "outside"
    outside.mkdir()
    script_dir = tmp_path / "scripts"
    script_dir.mkdir()
    script = script_dir / "train.py"
    script.write_text("print('hi')\n")
    name = f"autodl-hostile-{os.getpid()}-{id(workdir)}"
    targets = [str(outside / name), str(script_dir / name), str(script), f"/tmp/{name}", f"/dev/shm/{name}",
               f"/{name}", f"/usr/{name}", f"/etc/{name}", f"/var/tmp/{name}", f"{sys.prefix}/{name}",
               str(Path.home() / name), str(workdir.parent / name), "inside.txt"]
    code = textwrap.dedent("""
        import json, sys
        out = {}
        for t in sys.argv[1:]:
            try:
                with open(t, "a") as f:
                    f.write("x")
                out[t] = "written"
            except OSError as exc:
                out[t] = type(exc).__name__
        print(json.dumps(out))
    """)
    r = run_code(code, workdir, argv=targets, read_only_paths=[script])
    assert r.returncode == 0, r.stderr
    seen = _last_json(r.stdout)
    assert seen["inside.txt"] == "written" and (workdir / "inside.txt").read_text() == "x"
    assert seen[f"/tmp/{name}"] == seen[f"/dev/shm/{name}"] == "written"  # the sandbox's private tmpfs...
    for t in targets[:-1]:
        if not t.startswith(("/tmp/", "/dev/shm/")):  # (here tmp_path, so the script's folder, lies under /tmp)
            assert seen[t] != "written", t
        assert not Path(t).exists() or Path(t) == script, t  # ...and nothing of it is on the host
    assert script.read_text() == "print('hi')\n"


def test_endless_output_cannot_fill_the_callers_memory(sandbox_level, workdir):
    code = "import sys\nwhile True:\n    sys.stdout.write('x' * 65536)\n    sys.stderr.write('y' * 65536)\n"
    r = run_code(code, workdir, timeout_s=3, max_output_bytes=1 << 20)
    assert r.timed_out
    assert len(r.stdout) <= 1 << 20 and len(r.stderr) <= 1 << 20
    assert set(r.stdout) == {"x"} and set(r.stderr) == {"y"}
    assert any(n.startswith("stdout was longer than") for n in r.notes)


def test_read_only_paths_stay_read_only_even_inside_the_workdir(sandbox_level, workdir, tmp_path):
    inner = workdir / "cfg.json"
    inner.write_text("{}")
    real = tmp_path / "real.py"
    real.write_text("X = 1\n")
    link = tmp_path / "link.py"
    link.symlink_to(real)
    code = textwrap.dedent("""
        import json, sys
        out = {}
        for t in sys.argv[1:]:
            try:
                out[t] = open(t).read()
                open(t, "a").write("changed")
                out[t] = "written"
            except OSError as exc:
                out[t] = out[t] + " " + type(exc).__name__
        print(json.dumps(out))
    """)
    r = run_code(code, workdir, argv=[str(inner), str(link)], read_only_paths=[inner, link])
    seen = _last_json(r.stdout)
    assert seen == {str(inner): "{} OSError", str(link): "X = 1\n OSError"}, seen
    assert inner.read_text() == "{}" and real.read_text() == "X = 1\n"


def test_a_command_that_cannot_start_is_an_exit_status_not_an_exception(sandbox_level, workdir):
    r = run_sandboxed(["/nonexistent/python"], workdir=workdir, limits=SandboxLimits(timeout_s=30, memory_bytes=1 << 30),
                      env={"PATH": "/usr/bin:/bin"})
    assert r.returncode not in (0, None) and "nonexistent" in r.stderr


FORKS = textwrap.dedent("""
    import os, time
    made = refused = 0
    for _ in range(200):
        try:
            pid = os.fork()
        except OSError:
            refused += 1
            continue
        if pid == 0:
            time.sleep(3600)
            os._exit(0)
        made += 1
    print(made, refused)
""")


def test_without_a_cgroup_the_notes_say_what_is_bounded(sandbox_level, workdir, monkeypatch):
    """Where no cgroup can be made (a container with a read-only cgroupfs) the rlimits apply, and the result says so."""
    import autodl.sandbox as sandbox

    def no_cgroup(*_a):
        raise OSError("disabled by the test")

    monkeypatch.setattr(sandbox, "_Cgroup", no_cgroup)
    r = run_code(FORKS, workdir, max_processes=32)
    assert r.isolation == "bwrap+rlimit" and r.peak_memory_bytes is None
    (note,) = [n for n in r.notes if n.startswith("no cgroup")]
    assert "memory only per process" in note
    made, _refused = map(int, r.stdout.split())
    if os.geteuid() == 0:
        assert "bounded only by the timeout" in note and made == 200  # the kernel exempts uid 0 from RLIMIT_NPROC
    else:
        assert "RLIMIT_NPROC=32" in note and made < 32


@pytest.fixture
def nobody_home():
    """A folder uid 65534 owns, outside pytest's (root-only) base folder, with a ``w`` folder in it."""
    import shutil
    import tempfile

    home = Path(tempfile.mkdtemp(prefix="autodl-sandbox-nobody-"))
    (home / "w").mkdir()
    for d in (home, home / "w"):
        os.chown(d, 65534, 65534)
    yield home
    shutil.rmtree(home)


@pytest.mark.skipif(os.geteuid() != 0 or not os.access("/usr/bin/python3", os.X_OK),
                    reason="runs a caller as uid 65534 (needs root to switch, and a Python outside /root)")
def test_without_a_cgroup_rlimit_nproc_bounds_a_non_root_callers_tree(sandbox_level, nobody_home):
    """The same fork loop from a caller of uid 65534 (no cgroup write access either): RLIMIT_NPROC holds the
    tree to 32 processes, counted in the sandbox's own user namespace (not the caller's other processes)."""
    import subprocess

    home = nobody_home
    caller = textwrap.dedent(f"""
        import json, sys
        sys.path.insert(0, {str(Path(__file__).resolve().parents[2] / "plugins")!r})
        from pathlib import Path
        import autodl.sandbox as sb
        r = sb.run_sandboxed([sys.executable, "-c", {FORKS!r}], workdir=Path({str(home / "w")!r}),
                             limits=sb.SandboxLimits(timeout_s=60, memory_bytes=1 << 30, max_processes=32),
                             env={{"PATH": "/usr/bin:/bin"}})
        print(json.dumps({{"isolation": r.isolation, "stdout": r.stdout, "notes": r.notes}}))
    """)
    p = subprocess.run(["setpriv", "--reuid", "65534", "--regid", "65534", "--clear-groups", "--",
                        "/usr/bin/python3", "-c", caller], capture_output=True, text=True, cwd=home, timeout=300)
    assert p.returncode == 0, p.stderr
    seen = _last_json(p.stdout)
    assert seen["isolation"] == "bwrap+rlimit", seen
    made, refused = map(int, seen["stdout"].split())
    assert made == 30 and refused == 170  # 32 = bubblewrap's pid 1 + the command + 30 children
