"""Stopping `autodl profile` (Ctrl-C or SIGTERM) also stops the sandboxed script (dry run or probe) and removes its
files."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

REPO = Path(__file__).resolve().parents[2]
HOSTILE = REPO / "tests" / "profile" / "fixtures" / "hostile.py"

pytestmark = pytest.mark.slow


def probe_children(cfg_dirs: set[str] | None = None) -> list[psutil.Process]:
    out = []
    for p in psutil.process_iter(["cmdline"]):
        cmd = " ".join(p.info["cmdline"] or [])
        if ("_probe_child.py" in cmd and "autodl-probe-" in cmd) or ("dryrun_child" in cmd and "autodl-dryrun-" in cmd):
            out.append(p)
    return out


@pytest.mark.parametrize("sig,code", [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_interrupting_profile_kills_the_probe(tmp_path, sig, code):
    spec = tmp_path / "spec.yaml"
    spec.write_text(f"task:\n  script: {HOSTILE}\n  input_shape: [8]\n  probe: true\n")
    cli = subprocess.Popen([sys.executable, "-m", "autodl.cli", "profile", "--spec", str(spec), "--probe"],
                           env={**os.environ, "PYTHONPATH": str(REPO / "plugins"),
                                "AUTODL_TEST_MARKER": str(tmp_path / "marker")},
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                           # a CI started as a background job inherits SIGINT ignored, and Python then keeps it
                           # ignored: the CLI gets the default disposition, as in a terminal
                           preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    deadline = time.monotonic() + 120
    mine: list[psutil.Process] = []
    while not mine:
        assert cli.poll() is None, cli.communicate()
        assert time.monotonic() < deadline, "the probe never started"
        # the CLI's own: another test's dry run, in another xdist worker, was taken for it and the signal reached a
        # CLI still importing (KeyboardInterrupt, -2 for 130)
        own = {c.pid for c in psutil.Process(cli.pid).children(recursive=True)}
        mine = [p for p in probe_children() if p.pid in own]
        time.sleep(0.1)
    cfg = next(part for part in mine[0].cmdline() if "autodl-probe-" in part or "autodl-dryrun-" in part)
    cfg_dir = str(Path(cfg).parent) if cfg.endswith(".json") else cfg
    cli.send_signal(sig)
    _out, err = cli.communicate()
    assert cli.returncode == code, err
    gone, alive = psutil.wait_procs(mine, timeout=30)
    assert alive == []
    assert not Path(cfg_dir).exists()
