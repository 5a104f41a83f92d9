"""Multi-device launch and stop (cases launch/*): every rendered multi-device local command is parsed by the real
``paddle.distributed.launch`` (the CPU build installed here), and stopping a run ends every rank."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from autodl import cli
from autodl.catalog import load_catalog
from autodl.launch import LaunchRequest
from autodl.launch.local import ATTEMPT_ENV, LocalLauncher
from autodl.types import Device
from tests.hardware.conftest import CASES, GiB

RANK_DUMP = """
import json, os
keys = [k for k in os.environ if k.startswith(("FLAGS_selected_", "PADDLE_TRAINER", "PADDLE_DISTRI"))
        or k.endswith("_VISIBLE_DEVICES")]
out = os.path.join(os.environ["RANK_OUT"], "rank-%s.json" % os.environ.get("PADDLE_TRAINER_ID", "?"))
json.dump({k: os.environ[k] for k in keys}, open(out, "w"))
"""

EMULATE = {
    # PaddleCustomDevice's NPU plugin loaded; the CANN runtime shows the two visible NPUs as npu:0, npu:1
    "ascend": ("import importlib, paddle\ndevice = importlib.import_module('paddle.distributed.launch.context.device')\n"
               "device.get_all_custom_device_type = lambda: ['npu']\n"
               "device.get_available_custom_device = lambda: ['npu:0', 'npu:1']\n"),
    # a ROCm build (is_compiled_with_cuda is true for HIP builds); HIP shows the two visible GPUs as 0, 1
    "amd": ("import paddle, paddle.base.core as core\n"
            "core.is_compiled_with_cuda = lambda: True\ncore.get_cuda_device_count = lambda: 2\n"),
}
EMULATE["hygon"] = EMULATE["amd"]

SELECTED = {"nvidia": "FLAGS_selected_gpus", "kunlun": "FLAGS_selected_xpus", "ascend": "FLAGS_selected_npus",
            "amd": "FLAGS_selected_gpus", "hygon": "FLAGS_selected_gpus"}


def devices(vendor: str, uuids: bool) -> list[Device]:
    model = {"nvidia": "A100-SXM4-40GB", "kunlun": "Kunlun-R200", "ascend": "Ascend-910B", "amd": "A100-SXM4-40GB",
             "hygon": "A100-SXM4-40GB"}[vendor]
    return [Device(device_id=f"GPU-11111111-0000-0000-0000-00000000000{i}" if uuids else f"node:{i}", index=i,
                   uuid=f"GPU-11111111-0000-0000-0000-00000000000{i}" if uuids else None, model=model, vendor=vendor,
                   memory_total_bytes=32 * GiB) for i in (6, 7)]


def run_parsing(rendered: dict, tmp_path: Path, vendor: str, *, devices_arg: str | None = None) -> tuple[int, str, list[dict]]:
    """Run ``rendered``'s command for real under ``paddle.distributed.launch`` with a stand-in for the training
    script (each rank dumps its environment); returns (exit code, output, the ranks' environments)."""
    stand_in = tmp_path / "rank_dump.py"
    stand_in.write_text(RANK_DUMP)
    argv = list(rendered["command"])
    i = argv.index("paddle.distributed.launch") + 1
    while argv[i].startswith("--"):
        i += 2
    argv[i] = str(stand_in)
    if devices_arg is not None:
        argv[argv.index("--devices") + 1] = devices_arg
    out_dir = tmp_path / "ranks-out"
    shutil.rmtree(out_dir, ignore_errors=True)
    out_dir.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.endswith("_VISIBLE_DEVICES")}
    env.update(rendered["env"])
    env["RANK_OUT"] = str(out_dir)
    if vendor in EMULATE:
        emulate = tmp_path / "emulate"
        emulate.mkdir(exist_ok=True)
        (emulate / "sitecustomize.py").write_text(EMULATE[vendor])
        env["PYTHONPATH"] = f"{emulate}{os.pathsep}{env.get('PYTHONPATH', '')}"
    proc = subprocess.run(argv, env=env, capture_output=True, text=True, cwd=tmp_path, timeout=600)
    ranks = [json.loads(p.read_text()) for p in sorted(out_dir.glob("rank-*.json"))]
    return proc.returncode, proc.stdout + proc.stderr, ranks


def test_two_gpu_case_reproduces_the_old_command_and_runs_the_new_one(tmp_path, capsys, catalog):
    """Case spec_local_2gpu.yaml + pool_8gpu.yaml + simple_cnn_dp.py: the free pair is physical GPUs 6 and 7.
    With CUDA_VISIBLE_DEVICES=<UUID6>,<UUID7>, Paddle 3.3's launch reads --devices as members of that list: the
    old '--devices 0,1' fails ("'0' is not in list", reproduced here with Paddle 3.3.1 CPU); the rendered command
    lists the UUIDs and its launch starts both ranks, each on its own device."""
    work = tmp_path / "case"
    shutil.copytree(CASES / "launch", work)
    code = cli.main(["plan", str(work / "spec_local_2gpu.yaml"), "--pool", str(work / "pool_8gpu.yaml"),
                     "--no-probe", "--json"])
    plan = json.loads(capsys.readouterr().out)
    assert code == 0
    uuids = ["GPU-11111111-0000-0000-0000-000000000006", "GPU-11111111-0000-0000-0000-000000000007"]
    assert sorted(plan["placements"][0]["devices"]) == uuids
    launch = plan["launch"]
    assert launch["env"]["CUDA_VISIBLE_DEVICES"] == ",".join(uuids)
    assert launch["command"][launch["command"].index("--devices") + 1] == ",".join(uuids)

    old_code, old_out, _ = run_parsing(launch, tmp_path, "nvidia", devices_arg="0,1")
    assert old_code != 0 and "'0' is not in list" in old_out

    code, out, ranks = run_parsing(launch, tmp_path, "nvidia")
    assert code == 0, out
    assert [r["PADDLE_TRAINER_ID"] for r in ranks] == ["0", "1"]
    assert [r["FLAGS_selected_gpus"] for r in ranks] == ["0", "1"]
    assert all(r["CUDA_VISIBLE_DEVICES"] == ",".join(uuids) for r in ranks)


@pytest.mark.parametrize("vendor,uuids", [("nvidia", True), ("nvidia", False), ("kunlun", False), ("ascend", False),
                                          ("amd", False), ("hygon", False)])
def test_every_vendors_multi_device_command_parses_in_the_real_launch(tmp_path, vendor, uuids):
    """Each vendor's rendered 2-device local command goes through the real paddle.distributed.launch: it starts
    two ranks, rank i on visible device i. Ascend (PaddleCustomDevice NPU plugin) and AMD/Hygon (ROCm build) are
    emulated in the launch process by patching what their Paddle builds report (device type and count); NVIDIA
    and Kunlun need no emulation — their launch reads CUDA_/XPU_VISIBLE_DEVICES itself."""
    request = LaunchRequest(run_key=f"mv-{vendor}-{uuids}", script=str(tmp_path / "train.py"), distributed=True,
                            devices=devices(vendor, uuids), vendor=load_catalog().vendor(vendor), python=sys.executable)
    rendered = LocalLauncher().render(request)
    visible = rendered["env"][load_catalog().vendor(vendor).visible_devices_env]
    assert visible == (",".join(d.uuid for d in request.devices) if uuids else "6,7")
    code, out, ranks = run_parsing(rendered, tmp_path, vendor)
    assert code == 0, out
    assert len(ranks) == 2, out
    assert [r[SELECTED[vendor]] for r in ranks] == ["0", "1"]


def rank_processes(script: Path) -> list[psutil.Process]:
    found = []
    for p in psutil.process_iter(["cmdline"]):
        cmd = p.info["cmdline"] or []
        # the ranks only: not the launcher (python -m paddle.distributed.launch), not autodl's own processes
        # (python -m autodl...); the interpreter's path may well contain "autodl" (a checkout named so)
        if str(script) in cmd and "paddle.distributed.launch" not in cmd and not any(
                c.startswith("autodl") for c in cmd[1:3]):
            if not any("runner.py" in c for c in cmd):
                found.append(p)
    return found


def wait_for(condition, what: str, limit_s: float = 120.0):
    deadline = time.monotonic() + limit_s
    while not (value := condition()):
        assert time.monotonic() < deadline, f"{what} did not happen"
        time.sleep(0.1)
    return value


def launch_slow_workers(tmp_path: Path, run_key: str) -> tuple[LocalLauncher, object, Path, list[psutil.Process]]:
    script = tmp_path / "multi_rank_slow_worker.py"
    shutil.copy(CASES / "launch" / "multi_rank_slow_worker.py", script)
    launcher = LocalLauncher(stop_grace_s=1.0)
    request = LaunchRequest(run_key=run_key, script=str(script), distributed=True, devices=devices("nvidia", True),
                            vendor=load_catalog().vendor("nvidia"), python=sys.executable)
    handle = launcher.launch(request)
    ranks = wait_for(lambda: r if len(r := rank_processes(script)) == 2 else None, "two ranks starting")
    return launcher, handle, script, ranks


def test_stopping_a_multi_rank_run_ends_every_rank(tmp_path):
    """Case multi_rank_slow_worker.py: 2 ranks under paddle.distributed.launch that ignore SIGTERM, each in its own
    session (so killing the launcher's process group misses them). Stopping the run leaves no rank alive."""
    launcher, handle, script, ranks = launch_slow_workers(tmp_path, "slow")
    assert all(os.getsid(r.pid) == r.pid != os.getsid(handle.pid) for r in ranks)  # own sessions
    assert all(r.environ()[ATTEMPT_ENV] == handle.exit_path for r in ranks)
    launcher.stop(handle)
    for r in ranks:
        assert not r.is_running() or r.status() == psutil.STATUS_ZOMBIE
    assert launcher.processes(handle) == [] and rank_processes(script) == []
    # the ranks ignored SIGTERM, so the grace period ended in SIGKILL; paddle.distributed.launch itself may have
    # exited on the SIGTERM first, with its own code (seen in CI: 15): either way the run ended by autodl's stop
    assert launcher.poll(handle) in (128 + signal.SIGKILL, signal.SIGTERM, 128 + signal.SIGTERM)


def test_a_killed_wrapper_does_not_end_the_run_while_ranks_live(tmp_path):
    """Killing the wrapper's process group (the old stop) leaves both ranks running: the run is not over (poll says
    so) and the lease must not be freed; stop then ends the ranks."""
    from autodl.launch.isolation import training_isolation

    isolated = training_isolation(run_folder=tmp_path, workdir=tmp_path).mode == "bwrap"
    launcher, handle, script, ranks = launch_slow_workers(tmp_path, "slow-killed")
    os.killpg(handle.pgid, signal.SIGKILL)
    wait_for(lambda: not psutil.pid_exists(handle.pid) or psutil.Process(handle.pid).status() == psutil.STATUS_ZOMBIE
             or launcher._alive(handle) is False, "wrapper gone")
    if isolated:  # its PID namespace (autodl.launch.isolation) dies with its first process: every rank with it
        wait_for(lambda: rank_processes(script) == [], "ranks gone with the namespace")
        # the runner wrapper reaps what is left before it ends (issue 23); under load that outlasts the ranks a moment
        wait_for(lambda: launcher.poll(handle) is not None, "the attempt seen ended")
        return
    assert all(r.is_running() for r in ranks)
    assert launcher.poll(handle) is None
    launcher.stop(handle)
    assert rank_processes(script) == [] and launcher.poll(handle) is not None
