"""An attempt's processes and exit status (issue 23, item 1): real local trainings, with and without bubblewrap.

A training that double-forks a sleeper into a session of its own and exits leaves nothing behind when its attempt
ends; a training that writes a forged exit file (its ``$AUTODL_ATTEMPT_ID``, the run folder's ``attempt-N.exit``,
the status folder's) and exits 1 is recorded as failed with exit 1: the code comes from the runner's own
``waitpid`` of the training, written where the training cannot write.
"""

from __future__ import annotations

import textwrap
import time
import uuid
from pathlib import Path

import psutil
import pytest

from autodl.catalog import load_catalog
from autodl.launch.base import LaunchRequest
from autodl.launch.local import LocalLauncher


def isolation(request, monkeypatch, mode):
    """Set ``$AUTODL_LOCAL_ISOLATION``; the bubblewrap case needs the sandbox (fails under CI without it)."""
    if mode == "bwrap":
        request.getfixturevalue("sandbox_level")
    monkeypatch.setenv("AUTODL_LOCAL_ISOLATION", mode)


def start(tmp_path: Path, source: str, run_key: str) -> tuple[LocalLauncher, object]:
    script = tmp_path / f"{uuid.uuid4().hex[:8]}.py"
    script.write_text(textwrap.dedent(source))
    launcher = LocalLauncher()
    handle = launcher.launch(LaunchRequest(run_key=run_key, script=str(script), on_cpu=True,
                                           vendor=load_catalog().vendor("nvidia")))
    return launcher, handle


def wait(launcher, handle, timeout=120):
    deadline = time.monotonic() + timeout
    while (code := launcher.poll(handle)) is None:
        assert time.monotonic() < deadline, "the attempt did not end"
        time.sleep(0.1)
    return code


def left_with(marker: str) -> list[psutil.Process]:
    """Live processes whose command line holds ``marker``."""
    out = []
    for proc in psutil.process_iter(["cmdline"]):
        try:
            if any(marker in part for part in proc.info["cmdline"] or []) and proc.status() != psutil.STATUS_ZOMBIE:
                out.append(proc)
        except (psutil.NoSuchProcess, psutil.ZombieProcess):
            continue
    return out


DOUBLE_FORK = """
import os, sys, time
marker = sys.argv[1]
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:  # the grandchild: a new session, no autodl variable, reparented away from the training
        os.execve(sys.executable, [sys.executable, "-c", "import time; time.sleep(120)", marker], {{}})
    os._exit(0)
os.wait()
time.sleep(1)
print("left a sleeper behind", flush=True)
sys.exit({code})
"""


@pytest.mark.parametrize("mode", ["bwrap", "none"])
def test_a_double_forked_sleeper_is_gone_when_the_attempt_ends(request, monkeypatch, tmp_path, mode):
    isolation(request, monkeypatch, mode)
    marker = f"autodl-sleeper-{uuid.uuid4().hex}"
    script = tmp_path / "fork.py"
    script.write_text(textwrap.dedent(DOUBLE_FORK.format(code=0)))
    launcher = LocalLauncher()
    handle = launcher.launch(LaunchRequest(run_key=f"fork-{mode}", script=str(script), args=[marker], on_cpu=True,
                                           vendor=load_catalog().vendor("nvidia")))
    try:
        code = wait(launcher, handle)
        assert "left a sleeper behind" in launcher.read_logs(handle)[0]
        assert code == 0
        assert left_with(marker) == [], "a process of the attempt outlived it"
    finally:
        for proc in left_with(marker):
            proc.kill()


def test_a_training_cannot_kill_its_runner_from_inside_its_namespaces(request, monkeypatch, tmp_path):
    """The issue's training killed its runner and re-exec'd in a new session: the lease was freed, it ran on.
    In its PID namespace the runner is not there to be killed, and when the training's command ends the
    namespace ends with every process in it."""
    isolation(request, monkeypatch, "bwrap")
    marker = f"autodl-sleeper-{uuid.uuid4().hex}"
    launcher, handle = start(tmp_path, f"""
        import os, signal, sys
        parent = os.getppid()
        try:
            os.kill(parent, signal.SIGKILL) if parent > 1 else None
            print("parent", parent, "signalled", flush=True)
        except OSError as exc:
            print("cannot signal", parent, exc, flush=True)
        if os.fork() == 0:
            os.setsid()
            os.execve(sys.executable, [sys.executable, "-c", "import time; time.sleep(120)", "{marker}"], {{}})
        sys.exit(0)
        """, "kill-runner")
    try:
        wait(launcher, handle)
        assert left_with(marker) == [], "a process of the attempt outlived it"
        runner = psutil.Process(handle.pid) if psutil.pid_exists(handle.pid) else None
        assert runner is None or runner.status() == psutil.STATUS_ZOMBIE
    finally:
        for proc in left_with(marker):
            proc.kill()


FORGER = """
import os, pathlib, sys, time
attempt = os.environ["AUTODL_ATTEMPT_ID"]
run_folder = pathlib.Path(os.environ["AUTODL_METRICS_FILE"]).parent
targets = [pathlib.Path(attempt), *run_folder.glob("attempt-*"), *run_folder.glob("*/attempt-*.exit")]
targets += [run_folder / name for name in ("attempt-1.exit", "status/attempt-1.exit")]
for target in dict.fromkeys(targets):
    if target.suffix == ".exit":
        try:
            target.write_text("0")
            print("forged", target, flush=True)
        except OSError as exc:
            print("cannot forge", target, exc.strerror, flush=True)
time.sleep(float(sys.argv[1]) if len(sys.argv) > 1 else 0)
sys.exit(1)
"""


@pytest.mark.parametrize("mode", ["bwrap", "none"])
def test_a_forged_exit_file_is_not_the_attempts_exit_code(request, monkeypatch, tmp_path, mode):
    """A training that writes ``0`` into every exit file it can reach and exits 1 is recorded as exit 1."""
    isolation(request, monkeypatch, mode)
    script = tmp_path / "forge.py"
    script.write_text(FORGER)
    launcher = LocalLauncher()
    handle = launcher.launch(LaunchRequest(run_key=f"forge-{mode}", script=str(script), on_cpu=True,
                                           vendor=load_catalog().vendor("nvidia")))
    assert wait(launcher, handle) == 1
    assert LocalLauncher().poll(handle) == 1  # another process (a later task) reads the same


@pytest.mark.parametrize("mode", ["bwrap", "none"])
def test_a_forged_exit_file_does_not_end_a_running_attempt(request, monkeypatch, tmp_path, mode):
    """The issue's training wrote ``0`` into its own exit file and kept running: collect said "exit code 0" and
    release freed the lease while it ran. While the runner runs, the attempt runs, whatever a file says."""
    isolation(request, monkeypatch, mode)
    script = tmp_path / "forge.py"
    script.write_text(FORGER)
    launcher = LocalLauncher()
    handle = launcher.launch(LaunchRequest(run_key=f"forge-run-{mode}", script=str(script), args=["30"], on_cpu=True,
                                           vendor=load_catalog().vendor("nvidia")))
    try:
        deadline = time.monotonic() + 60
        while "forge" not in launcher.read_logs(handle)[0]:
            assert time.monotonic() < deadline, "the training did not start"
            time.sleep(0.1)
        assert LocalLauncher().poll(handle) is None
    finally:
        launcher.stop(handle)
    assert launcher.poll(handle) == 128 + 15


@pytest.mark.parametrize("mode", ["bwrap", "none"])
def test_a_forged_exit_file_is_recorded_as_the_failure_it_was(request, monkeypatch, tmp_path, mode):
    """Through the steps: collect says "failed with exit code 1", the record's outcome is failed with exit 1."""
    from autodl import pipeline
    from autodl.errors import TrainingFailed
    from autodl.records import RecordStore
    from autodl.types import MemoryBreakdown, ResourceProfile

    isolation(request, monkeypatch, mode)
    script = tmp_path / "train.py"
    script.write_text(FORGER)
    b = MemoryBreakdown(weights_bytes=1000, gradients_bytes=1000, optimizer_state_bytes=1000, activations_bytes=2**20)
    profile = ResourceProfile(script=str(script), params=250, peak_memory_bytes=b.total_bytes, breakdown=b,
                              flops_per_step=1e9, batch_size=8, num_gpus=1)
    out = {"profile": profile.to_json(), "spec_path": None, "script": str(script)}
    ctx = pipeline.RunContext(run_key=f"dag.train.forged-{mode}")
    sel = pipeline.step_select(ctx, out, log=lambda _l: None)
    handle = pipeline.step_launch(ctx, out, sel, log=lambda _l: None)
    with pytest.raises(TrainingFailed, match="failed with exit code 1"):
        pipeline.step_collect(ctx, handle, log=lambda _l: None, interval_s=0.05)
    pipeline.step_release_and_record(ctx, script=str(script), spec_path=None, profile_out=out, selection=sel,
                                     handle_json=handle, metrics_json=None, log=lambda _l: None)
    record = RecordStore().get(ctx.run_key)
    assert record.outcome == "failed" and record.metrics["exit_code"] == 1


def test_without_namespaces_a_training_that_kills_its_runner_dies_with_it(monkeypatch, tmp_path):
    """The issue's training killed its runner, then re-exec'd itself in a new session with a clean environment
    (no AUTODL_ATTEMPT_ID to find it by). Without bubblewrap the runner is its parent: it dies with the runner
    (the parent-death signal survives the exec), and the attempt is recorded as killed (137)."""
    monkeypatch.setenv("AUTODL_LOCAL_ISOLATION", "none")
    marker = f"autodl-reexec-{uuid.uuid4().hex}"
    launcher, handle = start(tmp_path, f"""
        import os, signal, sys
        os.kill(os.getppid(), signal.SIGKILL)
        os.setsid()
        os.execve(sys.executable, [sys.executable, "-c", "import time; time.sleep(120)", "{marker}"], {{}})
        """, "kill-runner-none")
    try:
        assert wait(launcher, handle) == 137
        deadline = time.monotonic() + 30
        while left_with(marker):
            assert time.monotonic() < deadline, "the training outlived its killed runner"
            time.sleep(0.1)
    finally:
        for proc in left_with(marker):
            proc.kill()
