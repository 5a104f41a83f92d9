"""The sandbox works when the Python environment lies under /tmp (a clone and its .venv in a temporary folder,
as a CI checkout often is): the sandbox's private /tmp must not hide the interpreter.

Seen (issue 12, running .ci/run from a fresh clone in /tmp): every probe and hostile-script test failed with
"bwrap: execvp /tmp/.../.venv/bin/python: No such file or directory"."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

pytestmark = pytest.mark.sandbox

REPO = Path(__file__).resolve().parents[2]
SITE = next(p for p in sys.path if p.endswith("site-packages"))

CALL = """
import json, sys
from pathlib import Path
from autodl.sandbox import SandboxLimits, run_sandboxed
work = Path(sys.argv[1])
r = run_sandboxed([sys.executable, "-c", "import sys; print(sys.prefix)"], workdir=work,
                  limits=SandboxLimits(timeout_s=60, memory_bytes=1 << 30, max_processes=32, max_output_bytes=1 << 20),
                  env={"PATH": "/usr/bin:/bin"})
print(json.dumps({"rc": r.returncode, "out": r.stdout.strip(), "err": r.stderr.strip()}))
"""


def test_interpreter_in_a_tmp_venv_runs_in_the_sandbox(sandbox_level, tmp_path):
    with tempfile.TemporaryDirectory(prefix="autodl-venv-", dir="/tmp") as tmp:
        venv = Path(tmp) / "venv"
        subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
        work = tmp_path / "work"
        work.mkdir()
        env = {**os.environ, "PYTHONPATH": f"{REPO / 'plugins'}:{SITE}"}
        out = subprocess.run([str(venv / "bin" / "python"), "-c", CALL, str(work)], env=env,
                             capture_output=True, text=True, check=True)
        result = json.loads(out.stdout.strip().splitlines()[-1])
        assert result["rc"] == 0, result
        assert result["out"] == str(venv.resolve()), result
