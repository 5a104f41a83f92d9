"""The local launcher's runner wrapper and the stop signal: a SIGTERM that reaches the wrapper at any moment ends
the training with 143, including one that comes while the wrapper is still starting the training's process
(CI: the stop came then, was never forwarded, the training slept on and was SIGKILLed: 137 for 143)."""

from __future__ import annotations

import subprocess
import sys
import textwrap

HARNESS = textwrap.dedent("""
    import os, signal, subprocess, sys
    from autodl.launch import runner

    real = subprocess.Popen

    def popen_after_a_stop(*args, **kwargs):
        os.kill(os.getpid(), signal.SIGTERM)      # the stop lands while the training's process is being started
        return real(*args, **kwargs)

    subprocess.Popen = popen_after_a_stop
    sys.exit(runner.main(sys.argv[1:]))
""")


def test_a_stop_that_comes_while_the_training_is_starting_reaches_the_training(tmp_path):
    exit_file = tmp_path / "exit"
    training = [sys.executable, "-c", "import time; time.sleep(30); print('slept through the stop')"]
    done = subprocess.run([sys.executable, "-c", HARNESS, str(exit_file), "--", *training],
                          capture_output=True, text=True, timeout=120)
    assert "slept through the stop" not in done.stdout
    assert done.returncode == 143 and exit_file.read_text() == "143", done.stderr


def test_a_stop_before_the_training_starts_records_143_without_starting_it(tmp_path):
    exit_file, marker = tmp_path / "exit", tmp_path / "started"
    harness = HARNESS.replace("subprocess.Popen = popen_after_a_stop\n",   # after the handlers, before the start
                              "runner.become_subreaper = lambda: os.kill(os.getpid(), signal.SIGTERM)\n")
    done = subprocess.run([sys.executable, "-c", harness, str(exit_file), "--", "touch", str(marker)],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 143 and exit_file.read_text() == "143" and not marker.exists(), done.stderr
