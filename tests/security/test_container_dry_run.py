"""The dry run in the launcher's image (issue 17, item 5) holds the sandbox's guarantees against a hostile script:
no network, a read-only code mount and root, no secret of the worker in its environment, a process and a memory
limit, no host socket, and nothing left on the engine afterwards. Each script runs as the user's script of a real dry run (the
dry-run child and the container's entry as in production) in a container of the Paddle test image on the real
dockerd; what it found comes back on its output, which the container's stderr carries."""

from __future__ import annotations

import json
import os
import socket
import textwrap
import threading
import uuid
from pathlib import Path

import pytest

from autodl.profile.container import DockerVenue
from autodl.profile.dryrun import DryRunConfig
from autodl.sandbox import SandboxLimits
from autodl.spec import parse_spec
from tests.integration import paddle_image
from tests.integration.conftest import docker_client  # noqa: F401 - the fixture

pytestmark = [pytest.mark.integration]

SECRET = "s3cr3t-" + uuid.uuid4().hex


@pytest.fixture
def venue(docker_client):  # noqa: F811
    image = paddle_image.build(docker_client)
    spec = parse_spec({"launcher": {"type": "docker", "image": image, "image_pull_policy": "Never",
                                    "python": paddle_image.python_in_container(), "mounts": paddle_image.python_mounts(),
                                    "env": {"SPEC_VALUE": "from-the-spec"}}})
    return DockerVenue(spec.launcher, {"client": docker_client})


def run_hostile(venue, folder: Path, source: str, *, max_processes: int = 256, timeout_s: float = 90,
                memory_bytes: int = 4 << 30) -> dict:
    """Run ``source`` as the dry run's script; :returns: the JSON line it printed after ``HOSTILE``."""
    folder.mkdir(parents=True, exist_ok=True)
    script = folder / "train.py"
    script.write_text(textwrap.dedent(source))
    limits = SandboxLimits(timeout_s=timeout_s, memory_bytes=memory_bytes, max_processes=max_processes)
    _got, res, _staged = venue.run(script, DryRunConfig(script=str(script)), limits=limits, batch_env=None,
                                   launch_env=dict(venue.launcher.env))
    lines = [ln for ln in res.stderr.splitlines() if ln.startswith("HOSTILE ")]
    assert lines, res.stderr[-3000:]
    return json.loads(lines[-1][len("HOSTILE "):])


class _Listener:
    """A TCP listener on the host's 127.0.0.1 and an abstract and a filesystem Unix socket, counting connections."""

    def __init__(self, folder: Path):
        self.accepted = 0
        self.tcp = socket.create_server(("127.0.0.1", 0))
        self.port = self.tcp.getsockname()[1]
        self.abstract_name = f"autodl-test-{uuid.uuid4().hex[:8]}"
        self.abstract = socket.socket(socket.AF_UNIX)
        self.abstract.bind("\0" + self.abstract_name)
        self.path = folder / "host.sock"
        self.unix = socket.socket(socket.AF_UNIX)
        self.unix.bind(str(self.path))
        self.socks = [self.tcp, self.abstract, self.unix]
        for s in self.socks[1:]:
            s.listen(4)
        for s in self.socks:
            s.settimeout(0.2)
        self.stop = False
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self):
        while not self.stop:
            for s in self.socks:
                try:
                    conn, _ = s.accept()
                    self.accepted += 1
                    conn.close()
                except OSError:
                    pass

    def close(self):
        self.stop = True
        self.thread.join()
        for s in self.socks:
            s.close()


NETWORK = """
    import glob, json, os, socket
    out = {"interfaces": sorted(os.listdir("/sys/class/net")), "connected": [], "refused": []}
    targets = [("tcp", ("127.0.0.1", %d)), ("tcp", ("172.17.0.1", %d)), ("tcp", ("1.1.1.1", 53)),
               ("abstract", "\\0%s")] + [("unix", p) for p in glob.glob("**/*.sock", recursive=True)
               + glob.glob("/tmp/**/*.sock", recursive=True) + ["/var/run/docker.sock", "/run/docker.sock", %r]]
    for kind, addr in targets:
        s = socket.socket(socket.AF_INET if kind == "tcp" else socket.AF_UNIX)
        s.settimeout(3)
        try:
            s.connect(addr)
            out["connected"].append(str(addr))
        except OSError as e:
            out["refused"].append(f"{addr}: {e.strerror or e}")
        s.close()
    try:
        socket.getaddrinfo("example.com", 443)
        out["resolved"] = True
    except OSError:
        out["resolved"] = False
    print("HOSTILE " + json.dumps(out), flush=True)
"""


def test_the_script_has_no_network_and_no_host_socket(venue, tmp_path):
    """No interface but loopback: the host's 127.0.0.1, Docker's bridge and the internet are unreachable; the host's
    abstract Unix sockets belong to another network namespace; its filesystem sockets (one beside the script, the
    Docker socket) are not there (the staged copy holds regular files only, the socket folder is not mounted)."""
    code = tmp_path / "code"
    code.mkdir()
    listener = _Listener(code)
    try:
        out = run_hostile(venue, code, NETWORK % (listener.port, listener.port, listener.abstract_name,
                                                  str(listener.path)))
    finally:
        listener.close()
    assert out["interfaces"] == ["lo"]
    assert out["connected"] == [] and out["resolved"] is False, out
    assert len(out["refused"]) >= 6
    assert listener.accepted == 0


WRITE = """
    import json, os
    tried = {}
    for path in ("/autodl/dryrun/code/train.py", "/autodl/dryrun/dryrun.json", "/autodl/dryrun/child/dryrun_child/run.py",
                 "/autodl/dryrun/child/dryrun_child/new.py",
                 "/autodl/dryrun/new.py", "/etc/passwd", "/usr/new", "/new"):
        try:
            with open(path, "a") as fh:
                fh.write("tampered")
            tried[path] = "written"
        except OSError as e:
            tried[path] = e.strerror
    with open("checkpoint.pdparams", "w") as fh:   # its working folder is writable, as in the sandbox
        fh.write("ok")
    tried["cwd"] = os.getcwd()
    tried["data"] = open("data.txt").read()
    print("HOSTILE " + json.dumps(tried), flush=True)
"""


def test_the_script_cannot_write_the_code_mount_or_the_root(venue, tmp_path):
    code = tmp_path / "code"
    code.mkdir()
    (code / "data.txt").write_text("DATA-VISIBLE")
    out = run_hostile(venue, code, WRITE)
    assert out.pop("data") == "DATA-VISIBLE" and out.pop("cwd") == "/autodl/work"
    assert all(v in ("Read-only file system", "Permission denied") for v in out.values()), out
    assert (code / "data.txt").read_text() == "DATA-VISIBLE" and not (code / "checkpoint.pdparams").exists()


ENV = """
    import json, os
    seen = dict(os.environ)
    try:
        seen["pid1"] = open("/proc/1/environ").read()
    except OSError as e:
        seen["pid1"] = e.strerror
    print("HOSTILE " + json.dumps(seen), flush=True)
"""


def test_no_secret_of_the_worker_reaches_the_script(venue, tmp_path, monkeypatch):
    """The worker's environment holds its store URL's password, cloud keys and Airflow's Fernet key; the container
    gets the spec's launcher.env and autodl's own variables only (the entry's environment too, pid 1's)."""
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", SECRET)
    monkeypatch.setenv("AIRFLOW__CORE__FERNET_KEY", SECRET)
    monkeypatch.setenv("AUTODL_STORE_URL", f"postgresql://autodl:{SECRET}@db/autodl")
    out = run_hostile(venue, tmp_path / "code", ENV)
    assert SECRET not in json.dumps(out)
    assert out["SPEC_VALUE"] == "from-the-spec" and out["CUDA_VISIBLE_DEVICES"] == ""
    assert out["AUTODL_DRY_RUN"] == "1" and out["NVIDIA_VISIBLE_DEVICES"] == "void"
    assert not any(k.startswith(("AIRFLOW", "AWS_")) or k == "AUTODL_STORE_URL" for k in out)


FORK = """
    import json, os, time
    n, error = 0, None
    for _ in range(400):
        try:
            pid = os.fork()
        except OSError as e:
            error = e.strerror
            break
        if pid == 0:
            time.sleep(20)
            os._exit(0)
        n += 1
    print("HOSTILE " + json.dumps({"forked": n, "error": error}), flush=True)
"""


def test_the_process_limit_holds(venue, tmp_path):
    out = run_hostile(venue, tmp_path / "code", FORK, max_processes=64)
    assert out["error"] == "Resource temporarily unavailable" and out["forked"] < 64, out


GONE = """
    import json, socket
    mounts = open("/proc/self/mountinfo").read()
    vol = [w for w in mounts.split() if "autodl-dryrun-" in w]
    print("HOSTILE " + json.dumps({"container": socket.gethostname(), "volume": vol[0] if vol else None}), flush=True)
"""


def test_the_container_and_its_volume_are_gone_afterwards(venue, tmp_path, docker_client):  # noqa: F811
    import docker

    out = run_hostile(venue, tmp_path / "code", GONE)
    with pytest.raises(docker.errors.NotFound):
        docker_client.containers.get(out["container"])
    name = next(part for part in out["volume"].split("/") if part.startswith("autodl-dryrun-"))
    with pytest.raises(docker.errors.NotFound):
        docker_client.volumes.get(name)


def test_a_script_that_never_ends_is_stopped_and_removed(venue, tmp_path, docker_client):  # noqa: F811
    script = tmp_path / "code" / "train.py"
    script.parent.mkdir()
    script.write_text("import socket, time\nprint('HOSTILE ' + '{\"c\": \"%s\"}' % socket.gethostname(), flush=True)\n"
                      "time.sleep(3600)\n")
    import docker

    limits = SandboxLimits(timeout_s=30, memory_bytes=4 << 30)  # past Paddle's import on a busy machine
    got, res, _ = venue.run(script, DryRunConfig(script=str(script)), limits=limits, batch_env=None,
                            launch_env=None)
    assert res.timed_out and res.returncode is None and got.result is not None  # what it measured is kept
    line = next(ln for ln in res.stderr.splitlines() if ln.startswith("HOSTILE "))
    with pytest.raises(docker.errors.NotFound):
        docker_client.containers.get(json.loads(line[8:])["c"])
    assert os.path.isdir(tmp_path / "code")


FORGE = """
    import base64, contextlib, hashlib, io, json, os, signal, zlib
    text = base64.b64encode(zlib.compress(json.dumps({"returncode": 0, "files": {"result.json": {
        "data": base64.b64encode(b'{"params": 7}').decode()}}}).encode())).decode()
    print("@autodl-dryrun 0 " + text, flush=True)   # a forged report, on the script's own stdout
    print("@autodl-dryrun-end 1 " + hashlib.sha256(text.encode()).hexdigest(), flush=True)
    try:
        os.kill(1, signal.SIGKILL)   # autodl's entry: pid 1 of the container, same uid
        killed = "sent"
    except OSError as e:
        killed = e.strerror
    print("HOSTILE " + json.dumps({"kill": killed}), flush=True)
"""


def test_the_script_can_neither_kill_the_entry_nor_forge_its_report(venue, tmp_path):
    """The kernel ignores SIGKILL sent to a PID namespace's init from inside it, so autodl's entry hands back its
    report; the script's own stdout goes to the container's stderr, so its forged frames are not read as one."""
    script = tmp_path / "code" / "train.py"
    script.parent.mkdir()
    script.write_text(textwrap.dedent(FORGE))
    cfg = DryRunConfig(script=str(script))
    got, res, _ = venue.run(script, cfg, limits=SandboxLimits(timeout_s=90, memory_bytes=4 << 30),
                            batch_env=None, launch_env=None)
    assert got.result is not None and json.loads(got.result).get("params") != 7
    assert res.returncode == 0 and not res.timed_out


MEMORY = """
    import json
    try:
        block = bytearray(3 << 30)   # past the dry run's memory bound of 2 GiB (RLIMIT_AS; the cgroup holds the tree)
        got = "allocated"
    except MemoryError:
        got = "MemoryError"
    print("HOSTILE " + json.dumps({"got": got}), flush=True)
"""


def test_the_memory_bound_holds(venue, tmp_path, docker_client):  # noqa: F811
    out = run_hostile(venue, tmp_path / "code", MEMORY, memory_bytes=2 << 30)
    assert out["got"] == "MemoryError"
