"""`autodl profile` on a model whose ``__init__`` attacks (issue 13): the probe runs it sandboxed, nothing escapes.

Seen with the old probe: the model's ``__init__`` read the CLI's ``/proc/<pid>/environ`` and autodl
echoed the store URL's password in a ``probe-failed`` finding; it connected to Unix sockets, left a
``setsid`` daemon behind, forked 100 children and wrote outside its folder. Now the same script
yields a ``probe-failed`` warning that quotes only what the sandbox could see, and the conservative bound.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from autodl.profile import profile_script
from autodl.spec import parse_spec
from tests.sandbox.helpers import survivors

pytestmark = [pytest.mark.sandbox, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]

HOSTILE = '''
import os
import socket
import sys
import time

import paddle
import paddle.nn as nn

SOCK = {sock!r}
OUTSIDE = {outside!r}
MARK = {mark!r}


class Net(nn.Layer):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 2)
        loot = []
        for pid in os.listdir("/proc"):
            if pid.isdigit():
                try:
                    loot.append(open("/proc/" + pid + "/environ", "rb").read().decode(errors="replace"))
                except OSError:
                    pass
        for target in (SOCK, "/tmp/.s.PGSQL.55432", "/var/run/docker.sock"):
            try:
                s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                s.connect(target)
                loot.append("connected " + target)
            except OSError:
                pass
        try:
            open(OUTSIDE, "w").write("x")
            loot.append("wrote " + OUTSIDE)
        except OSError:
            pass
        if os.fork() == 0:
            os.setsid()
            if os.fork() == 0:
                os.execv("/bin/sh", ["sh", "-c", "while :; do sleep 1; done # " + MARK])
            os._exit(0)
        for i in range(100):
            try:
                if os.fork() == 0:
                    time.sleep(3600)
                    os._exit(0)
            except OSError:
                loot.append("fork refused")
                break
        print(loot)
        print(loot, file=sys.stderr)
        raise RuntimeError("hostile: " + " | ".join(loot))

    def forward(self, x):
        return self.fc(x)


model = Net()
opt = paddle.optimizer.SGD(parameters=model.parameters())
'''


@pytest.fixture
def hostile(tmp_path, marker):
    outside = tmp_path / "outside"
    outside.mkdir()
    sock_path = outside / "s.sock"
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(str(sock_path))
    server.listen(8)
    server.setblocking(False)
    script = tmp_path / "scripts" / "hostile_model.py"
    script.parent.mkdir()
    script.write_text(HOSTILE.format(sock=str(sock_path), outside=str(outside / "written"), mark=marker))
    spec = tmp_path / "spec.yaml"
    spec.write_text(f"task:\n  script: {script}\n  input_shape: [8]\n  batch_size_per_gpu: 4\n  probe: true\n")
    yield script, spec, outside, server
    server.close()


def _assert_nothing_escaped(outside: Path, server: socket.socket, marker: str) -> None:
    assert not (outside / "written").exists()
    with pytest.raises(BlockingIOError):
        server.accept()
    assert survivors(marker) == []


def test_autodl_profile_on_a_hostile_model_init(sandbox_level, hostile, marker):
    script, spec, outside, server = hostile
    secret = "s3cr3t-" + os.urandom(8).hex()
    env = {**os.environ, "PYTHONPATH": str(REPO / "plugins"),
           "AUTODL_STORE_URL": f"postgresql+psycopg2://autodl:{secret}@127.0.0.1:55432/autodl",
           "AIRFLOW__CORE__FERNET_KEY": secret, "AUTODL_API_TOKEN": secret}
    r = subprocess.run([sys.executable, "-m", "autodl.cli", "profile", "--spec", str(spec), "--probe", "--json"],
                       env=env, capture_output=True, text=True, timeout=600)
    assert secret not in r.stdout and secret not in r.stderr
    assert r.returncode == 0, r.stderr
    profile = json.loads(r.stdout)
    (failed,) = [f for f in profile["findings"] if f["code"] == "probe-failed"]
    assert failed["severity"] == "warning"
    # the __init__ did run (in the sandbox): its exception is quoted; what it found is only the sandbox's own
    assert "hostile: " in failed["message"]
    assert "connected" not in failed["message"] and "wrote" not in failed["message"]
    assert profile["method"] != "probe" and profile["peak_memory_bytes"] > 0
    _assert_nothing_escaped(outside, server, marker)


def test_profile_falls_back_to_static_when_no_sandbox_can_be_made(hostile, marker, monkeypatch):
    """No isolation here: the probe is not run at all (a warning says so), the estimate is the conservative bound."""
    import autodl.sandbox as sandbox

    script, spec, outside, server = hostile
    monkeypatch.setattr(sandbox, "bwrap_path", lambda: None)
    sandbox._bwrap_check.cache_clear()
    try:
        assert sandbox.isolation() == "none"
        p = profile_script(script, parse_spec({"task": {"input_shape": [8], "batch_size_per_gpu": 4}}), probe=True)
    finally:
        sandbox._bwrap_check.cache_clear()
    (f,) = [f for f in p.findings if f.code == "probe-unavailable"]
    assert f.severity == "warning"
    assert "bubblewrap" in f.message and "conservative bound" in f.message
    assert p.method == "cold_start" and p.params is None and p.peak_memory_bytes > 0
    _assert_nothing_escaped(outside, server, marker)


def test_run_sandboxed_refuses_without_isolation(tmp_path, monkeypatch):
    import autodl.sandbox as sandbox

    monkeypatch.setattr(sandbox, "bwrap_path", lambda: None)
    sandbox._bwrap_check.cache_clear()
    ran = tmp_path / "ran"
    try:
        with pytest.raises(sandbox.SandboxUnavailable, match="bubblewrap"):
            sandbox.run_sandboxed([sys.executable, "-c", f"open({str(ran)!r}, 'w')"], workdir=tmp_path,
                                  limits=sandbox.SandboxLimits(timeout_s=30, memory_bytes=1 << 30),
                                  env={"PATH": "/usr/bin:/bin"})
    finally:
        sandbox._bwrap_check.cache_clear()
    assert not ran.exists()
