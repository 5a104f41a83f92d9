"""DockerLauncher without an engine: the container it would create (render/plan), for every vendor."""

from __future__ import annotations

import json
import re
import shlex

import pytest

from autodl.errors import LaunchError, SpecError
from autodl.launch import get_launcher
from autodl.launch.base import LaunchRequest, training_command
from autodl.launch.docker import (
    DEFAULT_IMAGE,
    DockerLauncher,
    complete_utf8_length,
    container_user_ids,
    docker_size,
    gpus_flag,
    output_volume_name,
    run_files_archive,
)
from autodl.section import parse_size
from autodl.spec import parse_spec
from autodl.types import Device

MODELS = {"nvidia": "A100-SXM4-40GB", "ascend": "Ascend-910", "kunlun": "Kunlun-R200", "amd": "MI250X",
          "hygon": "DCU-Z100"}


def devices(vendor: str = "nvidia", indices=(2, 3), uuids: bool = True) -> list[Device]:
    return [
        Device(device_id=f"{vendor}-{i}", index=i, uuid=f"GPU-{i:04d}-uuid" if uuids else None, model=MODELS[vendor],
               vendor=vendor, memory_total_bytes=40 << 30)
        for i in indices
    ]


def request_for(script, catalog, *, vendor="nvidia", devs=None, **kw) -> LaunchRequest:
    labels = kw.pop("labels", {"dag_id": "dag_a", "run_id": "manual__2026-01-01T00:00:00+00:00", "task_id": "t.launch",
                               "try_number": "1", "lease_id": "lease-1"})
    return LaunchRequest(run_key=kw.pop("run_key", "dag_a/manual__1/train"), script=str(script),
                         devices=devs if devs is not None else devices(vendor), vendor=catalog.vendor(vendor),
                         labels=labels, **kw)


def render(req: LaunchRequest) -> dict:
    return DockerLauncher().render(req)


# --------------------------------------------------------------------------------- NVIDIA pinning
def test_gpu_request_lists_host_uuids_and_container_sees_positions(script, catalog):
    out = render(request_for(script, catalog))
    (dr,) = out["create_kwargs"]["device_requests"]
    assert dr["DeviceIDs"] == ["GPU-0002-uuid", "GPU-0003-uuid"]
    assert dr["Count"] == 0, "a device list, never a count"
    assert dr["Capabilities"] == [["gpu"]]
    env = out["env"]
    assert env["CUDA_VISIBLE_DEVICES"] == "0,1", "inside the container the devices are renumbered 0..n-1"
    assert env["NVIDIA_VISIBLE_DEVICES"] == "GPU-0002-uuid,GPU-0003-uuid"
    assert env["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"


def test_index_only_devices_are_ids_not_a_count(script, catalog):
    """`--gpus 2` means "any two GPUs" and `--gpus 0` none: ids must travel as a quoted device list."""
    out = render(request_for(script, catalog, devs=devices(uuids=False, indices=(0,))))
    (dr,) = out["create_kwargs"]["device_requests"]
    assert dr["DeviceIDs"] == ["0"] and dr["Count"] == 0
    assert "--gpus '\"device=0\"'" in out["shell"]


def test_gpus_flag_is_quoted_for_the_shell(script, catalog):
    """NVIDIA Container Toolkit docs: `--gpus '"device=2,3"'`; unquoted, the CLI's CSV parser splits at the comma."""
    out = render(request_for(script, catalog, devs=devices(uuids=False)))
    assert "--gpus '\"device=2,3\"'" in out["shell"]
    argv = shlex.split(out["shell"])
    assert argv[argv.index("--gpus") + 1] == '"device=2,3"'
    assert gpus_flag(["GPU-a", "GPU-b"]) == '"device=GPU-a,GPU-b"'


def test_shell_line_round_trips_to_the_same_container(script, catalog):
    out = render(request_for(script, catalog, env={"MSG": "it's a 'quoted' $VALUE"}))
    argv = shlex.split(out["shell"])
    assert argv[:3] == ["docker", "run", "--detach"]
    assert "MSG=it's a 'quoted' $VALUE" in argv
    image_at = argv.index(DEFAULT_IMAGE)
    assert argv[image_at + 1:] == out["command"]
    json.dumps(out)  # JSON-ready for `autodl plan --json`


def test_cpu_run_hides_every_gpu(script, catalog):
    out = render(request_for(script, catalog, devs=[]))
    assert "device_requests" not in out["create_kwargs"]
    assert out["env"]["NVIDIA_VISIBLE_DEVICES"] == "void"
    assert out["env"]["CUDA_VISIBLE_DEVICES"] == ""
    assert out["env"]["AUTODL_PADDLE_DEVICE"] == "cpu"
    assert "--gpus" not in out["shell"]


def test_declared_pool_runs_on_cpu_even_with_devices(script, catalog):
    out = render(request_for(script, catalog, on_cpu=True))
    assert "device_requests" not in out["create_kwargs"]
    assert out["env"]["NVIDIA_VISIBLE_DEVICES"] == "void"


# ------------------------------------------------------------------------------ distributed
def test_two_gpus_distributed_launch_uses_positions(script, catalog):
    req = request_for(script, catalog, distributed=True)
    out = render(req)
    # inside the container CUDA_VISIBLE_DEVICES=0,1, so --devices lists its members; rank logs go to /tmp
    # (the code folder is read-only)
    assert out["command"] == ["python", "-u", "-m", "paddle.distributed.launch", "--devices", "0,1",
                              "--log_dir", "/tmp/autodl-launch-logs", "/workspace/train.py"]
    assert out["env"]["CUDA_VISIBLE_DEVICES"] == "0,1"
    assert out["create_kwargs"]["device_requests"][0]["DeviceIDs"] == ["GPU-0002-uuid", "GPU-0003-uuid"]


def test_base_training_command_on_the_host_lists_members_of_the_visible_list(script, catalog):
    """base.training_command: beside CUDA_VISIBLE_DEVICES=<UUIDs>, Paddle 3.3's launch looks each --devices
    entry up in that list, so --devices lists the same UUIDs (positions 0,1,2 fail: '0' is not in list)."""
    req = request_for(script, catalog, distributed=True, devs=devices(indices=(4, 6, 7)))
    argv = training_command(req)
    assert argv[argv.index("--devices") + 1] == "GPU-0004-uuid,GPU-0006-uuid,GPU-0007-uuid"
    single = request_for(script, catalog, distributed=True, devs=devices(indices=(5,)))
    assert "paddle.distributed.launch" not in training_command(single)


def test_container_python_not_the_hosts(script, catalog):
    out = render(request_for(script, catalog, python="/opt/airflow/venv/bin/python3.11"))
    assert out["command"][0] == "python"
    out = render(request_for(script, catalog, options={"python": "python3.10"}))
    assert out["command"][0] == "python3.10"


def test_command_override_replaces_argv(script, catalog):
    out = render(request_for(script, catalog, options={"command": ["sh", "-c", "echo hi"]}))
    assert out["command"] == ["sh", "-c", "echo hi"]
    assert out["shell"].endswith("sh -c 'echo hi'")


# ---------------------------------------------------------------------------------- vendors
@pytest.mark.parametrize(
    ("vendor", "expected_env"),
    [
        # Ascend Docker Runtime reads host indices from ASCEND_VISIBLE_DEVICES and renumbers them.
        ("ascend", {"ASCEND_VISIBLE_DEVICES": "2,3", "ASCEND_RT_VISIBLE_DEVICES": "0,1"}),
        # Device nodes passed through whole: nothing renumbers, the host ids stay.
        ("kunlun", {"XPU_VISIBLE_DEVICES": "GPU-0002-uuid,GPU-0003-uuid"}),
        ("amd", {"HIP_VISIBLE_DEVICES": "GPU-0002-uuid,GPU-0003-uuid"}),
        ("hygon", {"HIP_VISIBLE_DEVICES": "GPU-0002-uuid,GPU-0003-uuid"}),
    ],
)
def test_other_vendors_pin_with_their_variable(script, catalog, vendor, expected_env):
    opts = {"devices": ["/dev/kfd", "/dev/dri"], "runtime": "ascend" if vendor == "ascend" else None}
    out = render(request_for(script, catalog, vendor=vendor, options=opts))
    for key, value in expected_env.items():
        assert out["env"][key] == value
    assert "CUDA_VISIBLE_DEVICES" not in out["env"]
    assert "device_requests" not in out["create_kwargs"]
    assert out["env"]["AUTODL_PADDLE_DEVICE"] == catalog.vendor(vendor).paddle_device
    vendor_nodes = {"ascend": [], "kunlun": ["/dev/xpu2", "/dev/xpu3", "/dev/xpuctrl"]}.get(vendor, [])
    assert out["create_kwargs"]["devices"] == [f"{d}:{d}:rwm" for d in
                                               dict.fromkeys([*vendor_nodes, "/dev/kfd", "/dev/dri"])]


def test_ascend_without_its_runtime_passes_the_davinci_devices(script, catalog):
    """Case (README, Ascend in Docker): ASCEND_VISIBLE_DEVICES is read only by the Ascend container runtime;
    with plain runc the container must get /dev/davinciN of the booked NPUs, /dev/davinci_manager,
    /dev/devmm_svm and /dev/hisi_hdc, and the driver read-only, or it sees no NPU."""
    out = render(request_for(script, catalog, vendor="ascend"))
    assert out["create_kwargs"]["devices"] == [f"{d}:{d}:rwm" for d in (
        "/dev/davinci2", "/dev/davinci3", "/dev/davinci_manager", "/dev/devmm_svm", "/dev/hisi_hdc")]
    assert "ASCEND_VISIBLE_DEVICES" not in out["env"] and out["env"]["ASCEND_RT_VISIBLE_DEVICES"] == "0,1"
    assert out["create_kwargs"]["volumes"]["/usr/local/Ascend/driver"] == {"bind": "/usr/local/Ascend/driver", "mode": "ro"}
    assert "--device /dev/davinci2" in out["shell"] and "--runtime" not in out["shell"]
    with_runtime = render(request_for(script, catalog, vendor="ascend", options={"runtime": "ascend"}))
    assert with_runtime["env"]["ASCEND_VISIBLE_DEVICES"] == "2,3" and "devices" not in with_runtime["create_kwargs"]
    assert "--runtime ascend" in with_runtime["shell"]


def test_kunlun_without_uuids_uses_host_indices(script, catalog):
    out = render(request_for(script, catalog, vendor="kunlun", devs=devices("kunlun", uuids=False)))
    assert out["env"]["XPU_VISIBLE_DEVICES"] == "2,3"


def test_vendor_taken_from_the_catalog_when_request_has_none(script, catalog):
    req = request_for(script, catalog, vendor="ascend").model_copy(update={"vendor": None})
    assert render(req)["env"]["ASCEND_RT_VISIBLE_DEVICES"] == "0,1"


# ------------------------------------------------------------------------- container settings
def test_shm_memory_user_mount_network(script, catalog):
    req = request_for(script, catalog, shm_bytes=8 << 30,
                      options={"memory_limit": "32g", "network": "none", "cpus": 4})
    out = render(req)
    kw = out["create_kwargs"]
    assert kw["shm_size"] == 8 << 30
    assert kw["mem_limit"] == 32 << 30
    assert kw["nano_cpus"] == 4_000_000_000
    assert kw["user"] == "1000:1000"
    assert kw["network_mode"] == "none"
    assert kw["volumes"] == {str(script.parent): {"bind": "/workspace", "mode": "ro"}}
    assert not any("docker.sock" in source for source in kw["volumes"])
    for flag in ("--shm-size 8g", "--memory 32g", "--network none", f"--volume {script.parent}:/workspace:ro",
                 "--user 1000:1000"):
        assert flag in out["shell"]


def test_spec_shm_size_overrides_the_request(script, catalog):
    kw = render(request_for(script, catalog, shm_bytes=8 << 30, options={"shm_size": "16g"}))["create_kwargs"]
    assert kw["shm_size"] == 16 << 30


def test_ipc_host_instead_of_a_sized_shm(script, catalog):
    kw = render(request_for(script, catalog, shm_bytes=8 << 30, options={"ipc_mode": "host"}))["create_kwargs"]
    assert kw["ipc_mode"] == "host" and "shm_size" not in kw


def test_shm_and_ipc_host_together_are_rejected(script, catalog):
    with pytest.raises(LaunchError, match="ipc_mode"):
        render(request_for(script, catalog, options={"ipc_mode": "host", "shm_size": "1g"}))


@pytest.mark.parametrize("user", ["root", "0", "0:0", "root:root"])
def test_root_is_refused(script, catalog, user):
    with pytest.raises(LaunchError, match="launcher.user.*non-root"):
        render(request_for(script, catalog, options={"user": user}))


def test_docker_socket_is_never_mounted(script, catalog):
    with pytest.raises(LaunchError, match="Docker socket"):
        render(request_for(script, catalog, options={"mounts": [{"source": "/var/run/docker.sock",
                                                                 "target": "/var/run/docker.sock"}]}))


def test_extra_mounts_default_read_only(script, catalog, tmp_path):
    data = tmp_path / "data"  # not tmp_path itself: it holds this test's AUTODL_HOME, which is never mounted
    opts = {"mounts": [{"source": str(data), "target": "/data"},
                       {"source": "/ckpt", "target": "/ckpt", "read_only": False}]}
    vols = render(request_for(script, catalog, options=opts))["create_kwargs"]["volumes"]
    assert vols[str(data)] == {"bind": "/data", "mode": "ro"}
    assert vols["/ckpt"] == {"bind": "/ckpt", "mode": "rw"}


def test_script_outside_the_code_folder(script, catalog, tmp_path):
    other = tmp_path / "elsewhere"
    other.mkdir()
    with pytest.raises(LaunchError, match="not inside the code folder"):
        render(request_for(script, catalog, workdir=str(other)))


def test_workdir_mounts_the_code_root(script, catalog, tmp_path):
    out = render(request_for(script, catalog, workdir=str(tmp_path)))
    assert out["command"][-1] == "/workspace/code/train.py"
    assert str(tmp_path) in out["create_kwargs"]["volumes"]


def test_image_default_and_override(script, catalog):
    assert render(request_for(script, catalog))["image"] == DEFAULT_IMAGE
    assert render(request_for(script, catalog, options={"image": "reg.local/paddle:x"}))["image"] == "reg.local/paddle:x"


# --------------------------------------------------------------------------------- identity
def test_labels_carry_the_run_identity(script, catalog):
    labels = render(request_for(script, catalog))["labels"]
    assert labels == {
        "autodl.run_key": "dag_a/manual__1/train", "autodl.dag_id": "dag_a",
        "autodl.run_id": "manual__2026-01-01T00:00:00+00:00", "autodl.task_id": "t.launch",
        "autodl.try_number": "1", "autodl.lease_id": "lease-1", "autodl.managed": "true",
    }


def test_container_name_unique_per_try_and_valid(script, catalog):
    first = render(request_for(script, catalog))["container_name"]
    again = render(request_for(script, catalog))["container_name"]
    labels = {"dag_id": "dag_a", "try_number": "2"}
    second = render(request_for(script, catalog, labels=labels))["container_name"]
    other_run = render(request_for(script, catalog, run_key="dag_a/manual__2/train"))["container_name"]
    assert first == again and first != second and first != other_run
    for name in (first, second, other_run):
        assert re.fullmatch(r"[a-zA-Z0-9][a-zA-Z0-9_.-]+", name) and len(name) <= 63


# ------------------------------------------------------------------------------------ spec
def test_spec_shorthand_and_fields():
    assert parse_spec({"launcher": "docker"}).launcher.type == "docker"
    spec = parse_spec({"launcher": {"type": "docker", "shm_size": "8g", "memory_limit": "1.5GiB", "network": "none"}})
    assert spec.launcher.shm_size == 8 << 30
    assert spec.launcher.memory_limit == int(1.5 * (1 << 30))


def test_spec_bad_size_names_the_field():
    with pytest.raises(SpecError, match="launcher.shm_size"):
        parse_spec({"launcher": {"type": "docker", "shm_size": "eight gigs"}})


@pytest.mark.parametrize(("text", "n"), [("8g", 8 << 30), ("8G", 8 << 30), ("8GiB", 8 << 30), ("8Gi", 8 << 30),
                                         ("512m", 512 << 20), ("1024", 1024), (64, 64), ("1.5k", 1536)])
def test_parse_size(text, n):
    assert parse_size(text) == n
    assert parse_size(docker_size(n)) == n


def test_registry_picks_docker():
    assert isinstance(get_launcher("docker"), DockerLauncher)


def test_incomplete_utf8_waits_for_the_next_read():
    data = "é€".encode()
    assert complete_utf8_length(data) == len(data)
    assert complete_utf8_length(data[:-1]) == 2
    assert complete_utf8_length(data[:1]) == 0
    assert complete_utf8_length(b"abc") == 3


def test_measurement_and_outputs_get_container_paths(script, catalog):
    req = request_for(script, catalog, env={"AUTODL_OUTPUT_DIR": "/srv/autodl/outputs/text_classifier",
                                            "AUTODL_REPORT_FILE": "/srv/autodl/runs/x/report.json"},
                      options={"env": {"PYTHONPATH": "/opt/extra"}})
    out = render(req)
    env = out["env"]
    assert env["PYTHONPATH"] == "/autodl/hook:/opt/extra", "the hook first, the spec's path kept"
    assert env["AUTODL_RUNFACTS"] == "log" and env["AUTODL_METRICS_FILE"] == "/autodl/run/metrics.jsonl"
    assert env["AUTODL_REPORT_FILE"] == "/autodl/run/report.json", "never the host path"
    assert env["AUTODL_OUTPUT_DIR"] == "/autodl/output"
    volume = out["output_volume"]
    assert volume == output_volume_name("/srv/autodl/outputs/text_classifier")
    assert re.fullmatch(r"autodl-output-text_classifier-[0-9a-f]{12}", volume)
    assert out["create_kwargs"]["volumes"][volume] == {"bind": "/autodl/output", "mode": "rw"}
    assert f"--volume {volume}:/autodl/output:rw" in out["shell"]
    assert output_volume_name("/home/b/outputs/text_classifier") != volume, "one volume per model and home"
    # inside, the devices are 0..n-1: the hook maps Paddle's gpu:N to the Nth booked device's UUID
    assert env["CUDA_VISIBLE_DEVICES"] == "0,1" and env["AUTODL_DEVICE_IDS"] == "GPU-0002-uuid,GPU-0003-uuid"


def test_a_run_without_an_output_folder_mounts_no_volume(script, catalog):
    out = render(request_for(script, catalog))
    assert out["output_volume"] is None and "AUTODL_OUTPUT_DIR" not in out["env"]
    assert out["env"]["AUTODL_RUNFACTS"] == "log"


def test_run_files_archive_holds_the_hook_and_user_owned_folders():
    import io
    import tarfile

    from autodl.launch.child_path import sitecustomize

    with tarfile.open(fileobj=io.BytesIO(run_files_archive(1000, 1000))) as tar:
        members = {m.name: m for m in tar.getmembers()}
        hook = tar.extractfile(members["autodl/hook/sitecustomize.py"]).read()
    assert hook == open(sitecustomize.__file__, "rb").read()
    assert (members["autodl/hook"].uid, members["autodl/hook"].mode) == (0, 0o755), "root's: the training cannot change it"
    assert (members["autodl/run"].uid, members["autodl/run"].gid) == (1000, 1000)
    assert (members["autodl/output"].uid, members["autodl/output"].gid) == (1000, 1000)
    assert container_user_ids("1000") == (1000, 0) and container_user_ids("1001:1002") == (1001, 1002)
