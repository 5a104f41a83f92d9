"""DockerLauncher against a real Docker engine: env, mounts, /dev/shm, labels, exit codes, logs,
kill and cleanup, retry reattach, and a GPU device request on an engine without the NVIDIA runtime.

The "training" is a shell script run by busybox (``launcher.command``); production runs ``python``.
Every container runs with ``--network none``.
"""

from __future__ import annotations

import time
import uuid

import pytest

from autodl.catalog import load_catalog
from autodl.errors import LaunchError
from autodl.launch.base import LaunchRequest, timestamp_ns
from autodl.launch.docker import DockerLauncher
from autodl.types import Device

pytestmark = pytest.mark.integration


@pytest.fixture
def code(tmp_path):
    folder = tmp_path / "code"
    folder.mkdir()
    (folder / "train.py").write_text("print('hello from the code folder')\n")
    return folder


@pytest.fixture
def launcher(docker_client):
    return DockerLauncher(client=docker_client, stop_timeout_s=1)


@pytest.fixture
def run_key(launcher, request):
    """A fresh run key; every container of it is removed after the test."""
    key = f"it/{request.node.name}/{uuid.uuid4().hex[:8]}"
    yield key
    for container in launcher.containers_of(key):
        container.remove(force=True)


def make_request(code, run_key, image, command, *, try_number="1", devices=(), **kw) -> LaunchRequest:
    options = {"image": image, "network": "none", "command": ["sh", "-c", command],
               "image_pull_policy": "Never", **kw.pop("options", {})}
    return LaunchRequest(
        run_key=run_key, script=str(code / "train.py"), devices=list(devices),
        vendor=load_catalog().vendor("nvidia"), options=options,
        labels={"dag_id": "it_dag", "run_id": "manual__it", "task_id": "train.launch", "try_number": try_number,
                "lease_id": "lease-it"},
        **kw,
    )


def wait_exit(launcher, handle, polls: int = 600) -> int:
    """Poll until the container ends (bounded number of polls, 0.1 s apart); no timing is asserted."""
    for _ in range(polls):
        code = launcher.poll(handle)
        if code is not None:
            return code
        time.sleep(0.1)
    raise AssertionError(f"container {handle.container_name} still running after {polls} polls")


def test_env_mounts_shm_labels_exit_code(launcher, busybox_image, code, run_key, docker_client):
    script = (
        "echo uid=$(id -u); echo cvd=[$CUDA_VISIBLE_DEVICES]; echo nvd=$NVIDIA_VISIBLE_DEVICES; "
        "echo key=$AUTODL_RUN_KEY; df -k /dev/shm | tail -n 1; cat /workspace/train.py; "
        "touch /workspace/new 2>/dev/null && echo writable || echo read-only; exit 3"
    )
    req = make_request(code, run_key, busybox_image, script, shm_bytes=256 << 20, options={"memory_limit": "512m"})
    handle = launcher.launch(req)
    assert not handle.reattached and handle.container_name.endswith("-t1")
    assert wait_exit(launcher, handle) == 3
    text, offset = launcher.read_logs(handle)
    assert "uid=1000" in text
    assert "cvd=[]" in text and "nvd=void" in text, "a CPU container sees no GPU"
    assert f"key={run_key}" in text
    assert "262144" in text, "/dev/shm is 256 MiB = 262144 KiB"
    assert "hello from the code folder" in text
    assert "read-only" in text and not (code / "new").exists()
    assert offset > 0 and launcher.read_logs(handle, offset) == ("", offset)

    attrs = docker_client.containers.get(handle.container_id).attrs
    assert attrs["HostConfig"]["ShmSize"] == 256 << 20
    assert attrs["HostConfig"]["Memory"] == 512 << 20
    assert attrs["HostConfig"]["NetworkMode"] == "none"
    assert attrs["Config"]["User"] == "1000:1000"
    (mount,) = attrs["Mounts"]
    assert mount["Source"] == str(code) and mount["Destination"] == "/workspace" and mount["RW"] is False
    assert not any("docker.sock" in m["Source"] for m in attrs["Mounts"])
    labels = attrs["Config"]["Labels"]
    assert labels["autodl.run_key"] == run_key and labels["autodl.dag_id"] == "it_dag"
    assert labels["autodl.try_number"] == "1" and labels["autodl.lease_id"] == "lease-it"


def test_logs_stream_and_offsets(launcher, busybox_image, code, run_key, docker_client):
    req = make_request(code, run_key, busybox_image,
                       "for i in 1 2 3 4 5; do echo step $i; sleep 0.2; done; echo 'done ✓' >&2")
    handle = launcher.launch(req)
    streamed = "".join(launcher.stream_logs(handle))
    assert wait_exit(launcher, handle) == 0
    assert [line for line in streamed.splitlines()] == ["step 1", "step 2", "step 3", "step 4", "step 5", "done ✓"]
    head, end = launcher.read_logs(handle, 0)
    assert head == streamed
    assert launcher.read_logs(handle, end) == ("", end), "an ended container's log is read once"
    # a reattach (a fresh launcher, e.g. after a triggerer restart) resumes after the line it last read
    first_line = docker_client.containers.get(handle.container_id).logs(timestamps=True).split(b"\n")[0]
    after_first, _ = timestamp_ns(first_line + b"\n")
    rest, again = DockerLauncher(client=docker_client).read_logs(handle, after_first)
    assert rest == streamed[len("step 1\n"):] and again == end


def test_stop_kills_and_removes(launcher, busybox_image, code, run_key):
    handle = launcher.launch(make_request(code, run_key, busybox_image, "sleep 300"))
    assert launcher.poll(handle) is None
    launcher.stop(handle)
    assert launcher.containers_of(run_key) == []
    with pytest.raises(LaunchError, match="no longer exists"):
        launcher.poll(handle)
    launcher.stop(handle)  # idempotent


def test_retry_reattaches_to_the_running_container(launcher, busybox_image, code, run_key):
    first = launcher.launch(make_request(code, run_key, busybox_image, "sleep 300", try_number="1"))
    again = launcher.launch(make_request(code, run_key, busybox_image, "sleep 300", try_number="2"))
    assert again.reattached and again.container_id == first.container_id
    assert len(launcher.containers_of(run_key)) == 1
    launcher.stop(again)
    assert launcher.containers_of(run_key) == []


def test_retry_after_failure_replaces_the_ended_container(launcher, busybox_image, code, run_key):
    first = launcher.launch(make_request(code, run_key, busybox_image, "exit 1", try_number="1"))
    assert wait_exit(launcher, first) == 1
    second = launcher.launch(make_request(code, run_key, busybox_image, "echo second; exit 0", try_number="2"))
    assert not second.reattached and second.container_name != first.container_name
    assert wait_exit(launcher, second) == 0
    assert [c.id for c in launcher.containers_of(run_key)] == [second.container_id]


def _gpus(n: int) -> list[Device]:
    return [Device(device_id=f"GPU-it-{i}", index=i + 2, uuid=f"GPU-it-{i}-0000", model="A100-SXM4-40GB",
                   memory_total_bytes=40 << 30) for i in range(n)]


def test_gpu_request_recorded_then_clear_error_without_nvidia_runtime(launcher, busybox_image, code, run_key,
                                                                      docker_client):
    req = make_request(code, run_key, busybox_image, "echo $CUDA_VISIBLE_DEVICES", devices=_gpus(2), distributed=True)
    container = launcher.create(req)
    host = container.attrs["HostConfig"]
    (device_request,) = host["DeviceRequests"]
    assert device_request["DeviceIDs"] == ["GPU-it-0-0000", "GPU-it-1-0000"]
    assert device_request["Capabilities"] == [["gpu"]]
    assert not device_request.get("Count"), "device ids, never a count"
    env = dict(item.split("=", 1) for item in container.attrs["Config"]["Env"])
    assert env["CUDA_VISIBLE_DEVICES"] == "0,1", "positions inside the container, not host indices 2,3"
    assert env["NVIDIA_VISIBLE_DEVICES"] == "GPU-it-0-0000,GPU-it-1-0000"

    nvidia_runtime = "nvidia" in (docker_client.info().get("Runtimes") or {})
    with pytest.raises(LaunchError) as err:
        launcher.launch(req)  # replaces the created container, then starting it fails: the UUIDs are fake
    if not nvidia_runtime:
        assert "NVIDIA Container Toolkit" in str(err.value) and "container-toolkit" in str(err.value)
    assert launcher.containers_of(run_key) == [], "a container that could not start is removed"


def test_a_packed_containers_env_on_the_engine_carries_the_memory_cap_the_lower_wins(launcher, busybox_image, code,
                                                                                      run_key, caplog):
    """The engine's own record of the container (``Config.Env``) holds Paddle's cap flags of the run's share:
    10 GiB of a 40 GiB device; the user's higher ``FLAGS_gpu_memory_limit_mb`` does not raise it."""
    req = make_request(code, run_key, busybox_image, "true", devices=_gpus(1), device_memory_cap_bytes=10 << 30,
                       options={"env": {"FLAGS_gpu_memory_limit_mb": "40960"}})
    with caplog.at_level("INFO", logger="autodl.launch.docker"):
        container = launcher.create(req)
    env = dict(item.split("=", 1) for item in container.attrs["Config"]["Env"])
    assert env["FLAGS_gpu_memory_limit_mb"] == "10240"
    assert env["FLAGS_fraction_of_gpu_memory_to_use"] == "0.2500"
    assert "memory cap not verified under auto_growth" in caplog.text
    assert "FLAGS_gpu_memory_limit_mb=40960 from launcher.env would not keep" in caplog.text
    container.remove(force=True)


def test_missing_image_with_pull_never(launcher, code, run_key):
    req = make_request(code, run_key, "autodl-no-such-image:0", "true")
    with pytest.raises(LaunchError, match="docker pull autodl-no-such-image:0"):
        launcher.launch(req)


def test_a_line_longer_than_docker_s_partial_messages_arrives_whole(launcher, busybox_image, code, run_key):
    """Docker cuts a line into 16 KiB partial messages, each with its own timestamp in a timestamped log."""
    req = make_request(code, run_key, busybox_image, "head -c 40000 /dev/zero | tr '\\0' a; echo; echo next")
    handle = launcher.launch(req)
    assert wait_exit(launcher, handle) == 0
    text, _ = launcher.read_logs(handle, 0)
    assert text == "a" * 40000 + "\nnext\n"
