"""Local launcher: real detached processes, pinned by environment, idempotent per run key."""

from __future__ import annotations

import json
import os
import sys
import time

import psutil
import pytest

from autodl.catalog import load_catalog
from autodl.launch import LaunchRequest, get_launcher, training_command
from autodl.launch.local import LocalLauncher, run_dir_name
from autodl.errors import LaunchError
from autodl.types import Device

ENV_DUMP = """
import json, os, sys, time
keys = ["CUDA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER", "AUTODL_PADDLE_DEVICE", "AUTODL_RUN_KEY", "AUTODL_LEASE_ID",
        "ASCEND_RT_VISIBLE_DEVICES"]
print(json.dumps({k: os.environ.get(k) for k in keys}), flush=True)
time.sleep(float(sys.argv[1]) if len(sys.argv) > 1 else 0)
sys.exit(int(sys.argv[2]) if len(sys.argv) > 2 else 0)
"""


def gpu(i, uuid=True, vendor="nvidia"):
    return Device(device_id=f"GPU-{i}" if uuid else f"h:{i}", index=i, uuid=f"GPU-{i}" if uuid else None,
                  model="A100-SXM4-40GB", vendor=vendor, memory_total_bytes=40 * 2**30)


def request(tmp_path, run_key="r1", args=(), devices=None, vendor="nvidia", **kw):
    script = tmp_path / "train.py"
    script.write_text(ENV_DUMP)
    return LaunchRequest(run_key=run_key, script=str(script), args=list(args),
                         devices=devices if devices is not None else [gpu(2), gpu(3)],
                         vendor=load_catalog().vendor(vendor), labels={"lease_id": "L1"}, **kw)


def wait(launcher, handle, timeout=60):
    deadline = time.monotonic() + timeout
    while (code := launcher.poll(handle)) is None:
        assert time.monotonic() < deadline, "training did not end"
        time.sleep(0.05)
    return code


def first_json_line(launcher, handle):
    text, _ = launcher.read_logs(handle)
    return json.loads(text.splitlines()[0])


def test_registry_gives_local():
    assert isinstance(get_launcher("local"), LocalLauncher)
    with pytest.raises(LaunchError, match="unknown launcher 'slurm'"):
        get_launcher("slurm")


def test_pinned_by_uuid_in_pci_order(tmp_path):
    launcher = LocalLauncher()
    handle = launcher.launch(request(tmp_path, args=["0", "0"]))
    assert wait(launcher, handle) == 0
    env = first_json_line(launcher, handle)
    assert env["CUDA_VISIBLE_DEVICES"] == "GPU-2,GPU-3"
    assert env["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"
    assert env["AUTODL_PADDLE_DEVICE"] == "gpu"
    assert env["AUTODL_RUN_KEY"] == "r1" and env["AUTODL_LEASE_ID"] == "L1"
    assert handle.visible_devices == "GPU-2,GPU-3"


def test_indices_when_no_uuid_and_vendor_variable(tmp_path):
    launcher = LocalLauncher()
    devs = [gpu(1, uuid=False, vendor="ascend"), gpu(5, uuid=False, vendor="ascend")]
    handle = launcher.launch(request(tmp_path, devices=devs, vendor="ascend"))
    assert wait(launcher, handle) == 0
    env = first_json_line(launcher, handle)
    assert env["ASCEND_RT_VISIBLE_DEVICES"] == "1,5"
    assert env["CUDA_VISIBLE_DEVICES"] is None or env["CUDA_VISIBLE_DEVICES"] == os.environ.get("CUDA_VISIBLE_DEVICES")
    assert env["AUTODL_PADDLE_DEVICE"] == "npu"


def test_cpu_run_hides_devices(tmp_path):
    launcher = LocalLauncher()
    handle = launcher.launch(request(tmp_path, on_cpu=True))
    assert wait(launcher, handle) == 0
    env = first_json_line(launcher, handle)
    assert env["CUDA_VISIBLE_DEVICES"] == "" and env["AUTODL_PADDLE_DEVICE"] == "cpu"
    assert handle.on_cpu


def test_exit_code_is_reported(tmp_path):
    launcher = LocalLauncher()
    handle = launcher.launch(request(tmp_path, args=["0", "3"]))
    assert wait(launcher, handle) == 3


def test_retried_launch_reattaches_instead_of_second_copy(tmp_path):
    launcher = LocalLauncher()
    req = request(tmp_path, args=["30"])
    first = launcher.launch(req)
    second = LocalLauncher().launch(req)  # another task try, another launcher object
    try:
        assert second.reattached and second.pid == first.pid
        assert len(list(launcher.run_dir("r1").glob("attempt-*.log"))) == 1
    finally:
        launcher.stop(first)
    assert launcher.poll(first) == 128 + 15  # SIGTERM


def test_launch_after_end_starts_next_attempt(tmp_path):
    launcher = LocalLauncher()
    req = request(tmp_path, args=["0", "1"])
    first = launcher.launch(req)
    assert wait(launcher, first) == 1
    second = launcher.launch(req)
    assert not second.reattached and second.pid != first.pid
    assert second.log_path.endswith("attempt-2.log")
    assert wait(launcher, second) == 1


def test_a_handle_whose_log_names_no_attempt_is_refused_naming_the_file(tmp_path):
    """A handle.json whose log_path has no ``attempt-N`` (not written by the local launcher) gave an AttributeError
    ('NoneType' object has no attribute 'group'; mypy found it); the next launch now says which file and what to do."""
    launcher = LocalLauncher()
    req = request(tmp_path, args=["0", "1"])
    first = launcher.launch(req)
    assert wait(launcher, first) == 1
    handle_file = launcher.run_dir("r1") / "handle.json"
    handle_file.write_text(first.model_copy(update={"log_path": str(tmp_path / "train.log")}).model_dump_json())
    with pytest.raises(LaunchError, match=r"handle\.json: its log_path .*names no attempt.*move the run folder away"):
        launcher.launch(req)


def test_stop_kills_the_whole_process_group(tmp_path):
    script = tmp_path / "spawner.py"
    script.write_text("import subprocess, sys, time\n"
                      "p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'])\n"
                      "print(p.pid, flush=True)\ntime.sleep(60)\n")
    launcher = LocalLauncher()
    handle = launcher.launch(LaunchRequest(run_key="grp", script=str(script), on_cpu=True,
                                           vendor=load_catalog().vendor("nvidia")))
    deadline = time.monotonic() + 30
    while not launcher.read_logs(handle)[0].strip():
        assert time.monotonic() < deadline
        time.sleep(0.05)
    # the pid it printed is its own PID namespace's (autodl.launch.isolation): find the grandchild on the host
    mine = [p for p in psutil.process_iter(["cmdline"]) if (p.info["cmdline"] or [])[-1:] ==
            ["import time; time.sleep(60)"] and p.environ().get("AUTODL_ATTEMPT_ID") == handle.exit_path]
    assert len(mine) == 1
    grandchild = mine[0].pid
    launcher.stop(handle)
    assert launcher.poll(handle) is not None
    deadline = time.monotonic() + 10
    while psutil.pid_exists(grandchild) and psutil.Process(grandchild).status() != psutil.STATUS_ZOMBIE:
        assert time.monotonic() < deadline, "grandchild survived stop()"
        time.sleep(0.05)
    launcher.stop(handle)  # idempotent


def test_a_training_that_heeds_sigterm_only_after_the_stop_began_gets_it_and_is_not_killed(tmp_path):
    """Seen under load (tests/core/test_reaper.py, exit 137): a stop right after the launch found the sandbox's
    shim (which ignores SIGTERM) and no training yet; the training started, ignoring it until its own shim restored
    it, nobody signalled it again, and it was SIGKILLed at the end of the grace period. Here the training ignores
    SIGTERM for its first half second: the stop still ends it by SIGTERM (143), long before a 60 s grace."""
    ready = tmp_path / "ignoring"
    script = tmp_path / "late.py"
    script.write_text("import pathlib, signal, sys, time\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
                      "pathlib.Path(sys.argv[1]).touch()\ntime.sleep(0.5)\n"
                      "signal.signal(signal.SIGTERM, signal.SIG_DFL)\ntime.sleep(600)\n")
    launcher = LocalLauncher(stop_grace_s=60)
    handle = launcher.launch(LaunchRequest(run_key="late", script=str(script), args=[str(ready)], on_cpu=True,
                                           vendor=load_catalog().vendor("nvidia")))
    deadline = time.monotonic() + 60
    while not ready.exists():
        assert time.monotonic() < deadline, launcher.read_logs(handle)[0]
        time.sleep(0.02)
    launcher.stop(handle)
    assert launcher.poll(handle) == 143


def test_missing_script_is_launch_error(tmp_path):
    req = LaunchRequest(run_key="x", script=str(tmp_path / "none.py"))
    with pytest.raises(LaunchError, match="does not exist"):
        LocalLauncher().launch(req)


def test_distributed_command_lists_members_of_the_visible_list(tmp_path):
    """With CUDA_VISIBLE_DEVICES=<UUIDs> Paddle 3.3's launch resolves --devices as members of that list:
    --devices lists the UUIDs themselves, never positions or host ids; rank logs go to the run folder."""
    req = request(tmp_path, devices=[gpu(4), gpu(6)], distributed=True)
    argv = training_command(req)
    assert argv[1:6] == ["-u", "-m", "paddle.distributed.launch", "--devices", "GPU-4,GPU-6"]
    rendered = LocalLauncher().render(req)
    assert rendered["env"]["CUDA_VISIBLE_DEVICES"] == "GPU-4,GPU-6"
    assert "paddle.distributed.launch --devices GPU-4,GPU-6 --log_dir " in rendered["shell"]
    log_dir = rendered["command"][rendered["command"].index("--log_dir") + 1]
    assert log_dir.endswith(f"/runs/{run_dir_name('r1')}/attempt-1.ranks")
    single = training_command(request(tmp_path, devices=[gpu(4)], distributed=True))
    assert "paddle.distributed.launch" not in single
    assert single[0] == sys.executable


def test_a_training_whose_handle_cannot_be_written_is_stopped_and_the_launch_says_why(tmp_path, monkeypatch):
    """ENOSPC between the start and the handle (issue 23): no later task could find the training again, so it
    must not run on; the launch is autodl's error naming the disk."""
    import errno

    import autodl.launch.local as local

    def full(*_a, **_k):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(local, "atomic_write_text", full)
    launcher = LocalLauncher()
    with pytest.raises(LaunchError, match="No space left on device.*free space there"):
        launcher.launch(request(tmp_path, run_key="nospace", args=["60"]))
    status = launcher.run_dir("nospace") / "status"
    assert (status / "attempt-1.exit").read_text() in ("143", "137")  # stopped by autodl, recorded as such
    left = [p for p in psutil.process_iter(["cmdline"]) if any(str(status) in part for part in p.info["cmdline"] or [])]
    assert [p for p in left if p.status() != psutil.STATUS_ZOMBIE] == []
