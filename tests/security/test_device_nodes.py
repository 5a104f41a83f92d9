"""Only the booked accelerators' device nodes in an isolated local training's ``/dev`` (issue 19, item 2).

Seen: every ``/dev/nvidia*`` of the host was bound into the training, so a tenant booked on one GPU could open the
others (pinning was ``CUDA_VISIBLE_DEVICES`` alone, which the script may change). The host's nodes are stood in for
by files in a temporary folder, NVML by the fake the hardware tests use (``tests/cases/hardware/fake_nvml``).
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

from autodl.catalog import load_catalog
from autodl.errors import LaunchError
from autodl.inventory.nvml import DeviceAddress, read_addresses
from autodl.launch.devnodes import booked_nodes, nvidia_nodes, parse_mig_minors
from autodl.launch.isolation import training_isolation
from autodl.types import Device

FAKE_NVML = Path(__file__).resolve().parents[1] / "cases" / "hardware" / "fake_nvml" / "pynvml.py"
GiB = 1 << 30
UUIDS = [f"GPU-0000000{i}-aaaa-bbbb-cccc-000000000000" for i in range(4)]
MIG_UUID = "MIG-11111111-2222-3333-4444-555555555555"

MIG_MINORS_TEXT = """config 1
monitor 2
gpu0/gi1/access 12
gpu0/gi1/ci0/access 13
gpu0/gi2/access 21
gpu0/gi2/ci0/access 22
gpu1/gi1/access 111
gpu1/gi1/ci0/access 112
"""
"""``/proc/driver/nvidia-caps/mig-minors`` of a host with two MIG GPUs (the driver's format: MIG User Guide)."""


@pytest.fixture
def dev(tmp_path) -> Path:
    """A stand-in for the host's ``/dev``: four GPUs, the control nodes, MIG capabilities, InfiniBand."""
    root = tmp_path / "dev"
    (root / "nvidia-caps").mkdir(parents=True)
    (root / "infiniband").mkdir()
    for name in ("nvidia0", "nvidia1", "nvidia2", "nvidia3", "nvidiactl", "nvidia-uvm", "nvidia-uvm-tools",
                 "nvidia-modeset", "infiniband/uverbs0", "kfd"):
        (root / name).write_text(name)
    for cap in (1, 2, 12, 13, 21, 22, 111, 112):
        (root / "nvidia-caps" / f"nvidia-cap{cap}").write_text(str(cap))
    return root


@pytest.fixture
def nvml(tmp_path, monkeypatch):
    """Installs the fake NVML as ``pynvml`` with four GPUs whose minor numbers are not their indices (3, 2, 1, 0),
    the last in MIG mode with one instance (GPU instance 2, compute instance 0)."""
    devices = [{"name": "NVIDIA A100-SXM4-40GB", "uuid": u, "total": 40 * GiB, "minor": 3 - i}
               for i, u in enumerate(UUIDS)]
    devices[3]["mig"] = [{"uuid": MIG_UUID, "total": 20 * GiB, "gi": 2, "ci": 0}]
    path = tmp_path / "nvml.json"
    path.write_text(json.dumps({"devices": devices}))
    monkeypatch.setenv("FAKE_NVML_CONFIG", str(path))
    spec = importlib.util.spec_from_file_location("fake_pynvml", FAKE_NVML)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    monkeypatch.setitem(sys.modules, "pynvml", module)
    return path


def gpu(index: int, **kw) -> Device:
    return Device(**{"device_id": UUIDS[index], "uuid": UUIDS[index], "index": index, "model": "A100-SXM4-40GB",
                     "memory_total_bytes": 40 * GiB, **kw})


def test_a_booked_gpu_gets_its_own_node_by_nvml_minor_number_and_the_control_nodes(nvml, dev):
    """GPU index 1 has minor number 2 here: its node is ``/dev/nvidia2``, the others' are left out."""
    nodes = booked_nodes([gpu(1)], load_catalog().vendor("nvidia"), dev=dev)
    assert nodes.narrowed and nodes.note is None
    assert sorted(nodes.names) == sorted(["nvidia2", "nvidiactl", "nvidia-uvm", "nvidia-uvm-tools",
                                          "nvidia-modeset", "infiniband"])


def test_a_mig_instance_gets_its_parents_node_and_its_own_capabilities_only(nvml, dev, tmp_path):
    """The MIG instance (GPU instance 2 of the GPU with minor 0) gets ``nvidia0`` and capabilities 21 and 22, never
    another instance's (12, 13), nor ``config``/``monitor`` (1, 2)."""
    mig = Device(device_id=MIG_UUID, uuid=MIG_UUID, index=3, model="A100-SXM4-40GB MIG 3g.20gb",
                 memory_total_bytes=20 * GiB, labels={"mig_parent": UUIDS[3], "mig_index": "0"})
    nodes = booked_nodes([mig], load_catalog().vendor("nvidia"), dev=dev,
                         mig_minors=lambda: parse_mig_minors(MIG_MINORS_TEXT))
    assert nodes.narrowed
    assert "nvidia0" in nodes.names
    assert [n for n in nodes.names if n.startswith("nvidia-caps/")] == ["nvidia-caps/nvidia-cap21",
                                                                         "nvidia-caps/nvidia-cap22"]
    assert not {"nvidia1", "nvidia2", "nvidia3"} & set(nodes.names)


def test_parse_mig_minors_leaves_out_config_and_monitor():
    table = parse_mig_minors(MIG_MINORS_TEXT)
    assert table["gpu1/gi1/ci0/access"] == 112
    assert "config" not in table and "monitor" not in table and len(table) == 6


def test_an_unreadable_minor_number_refuses_the_launch_when_isolation_is_required(nvml, dev):
    """Fail closed: with ``AUTODL_LOCAL_ISOLATION=bwrap`` a device whose node NVML cannot give is refused, named."""
    stranger = gpu(0).model_copy(update={"device_id": "GPU-not-on-this-host", "uuid": "GPU-not-on-this-host"})
    with pytest.raises(LaunchError, match="GPU-not-on-this-host.*Not Found"):
        booked_nodes([stranger], load_catalog().vendor("nvidia"), dev=dev, strict=True)


def test_an_unreadable_minor_number_in_auto_binds_every_gpu_and_says_so(nvml, dev):
    stranger = gpu(0).model_copy(update={"device_id": "GPU-not-on-this-host", "uuid": "GPU-not-on-this-host"})
    nodes = booked_nodes([stranger], load_catalog().vendor("nvidia"), dev=dev)
    assert not nodes.narrowed
    assert {"nvidia0", "nvidia1", "nvidia2", "nvidia3", "nvidiactl"} <= set(nodes.names)
    assert "GPU-not-on-this-host" in (nodes.note or "") and "CUDA_VISIBLE_DEVICES" in (nodes.note or "")


def test_missing_mig_capabilities_are_an_unknown_not_the_gpu_alone(dev):
    """A MIG instance whose capabilities are not in the table is not narrowed (its parent's node alone would not
    run it, and guessing another instance's capability would hand it over)."""
    address = DeviceAddress(device_id=MIG_UUID, minor=0, gpu_instance=5, compute_instance=0)
    nodes = nvidia_nodes([address], dev=dev, mig_minors=parse_mig_minors(MIG_MINORS_TEXT))
    assert not nodes.narrowed and "gpu0/gi5/access" in (nodes.note or "")


def test_nvml_unavailable_leaves_every_address_unknown_with_why(tmp_path, monkeypatch):
    path = tmp_path / "nvml.json"
    path.write_text(json.dumps({"init_error": 9, "devices": []}))
    monkeypatch.setenv("FAKE_NVML_CONFIG", str(path))
    spec = importlib.util.spec_from_file_location("fake_pynvml", FAKE_NVML)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    [address] = read_addresses([gpu(0)], nvml=module)
    assert address.minor is None and "Driver Not Loaded" in (address.unknown or "")


def test_a_cpu_run_gets_no_accelerator_node(dev):
    nodes = booked_nodes([gpu(0)], load_catalog().vendor("nvidia"), on_cpu=True, dev=dev,
                         addresses=lambda _d: pytest.fail("NVML asked for a CPU run"))
    assert nodes.names == ["infiniband"]


def test_a_host_without_gpu_nodes_does_not_ask_nvml(tmp_path):
    nodes = booked_nodes([gpu(0)], load_catalog().vendor("nvidia"), dev=tmp_path, strict=True,
                         addresses=lambda _d: pytest.fail("NVML asked on a host without /dev/nvidia<N>"))
    assert nodes.names == [] and nodes.narrowed


def test_an_ascend_device_gets_its_own_davinci_node(tmp_path):
    for name in ("davinci0", "davinci1", "davinci_manager", "devmm_svm", "hisi_hdc"):
        (tmp_path / name).write_text(name)
    npu = Device(device_id="npu-1", index=1, model="Ascend910B", vendor="ascend", memory_total_bytes=64 * GiB)
    nodes = booked_nodes([npu], load_catalog().vendor("ascend"), dev=tmp_path)
    assert sorted(nodes.names) == ["davinci1", "davinci_manager", "devmm_svm", "hisi_hdc"]


def test_an_isolated_training_does_not_see_an_unbooked_gpus_node(sandbox_level, nvml, dev, tmp_path, monkeypatch):
    """A real bubblewrap run: booked GPU index 2 (minor 1) sees ``/dev/nvidia1`` and the control nodes; the other
    GPUs' nodes (``nvidia0``, ``nvidia2``, ``nvidia3``) and the MIG capabilities are absent from its ``/dev``."""
    monkeypatch.setenv("AUTODL_LOCAL_ISOLATION", "bwrap")
    monkeypatch.setenv("AUTODL_HOME", str(tmp_path / "autodl"))
    run = tmp_path / "autodl" / "runs" / "r"
    run.mkdir(parents=True)
    iso = training_isolation(run_folder=run, workdir=tmp_path, devices=[gpu(2)],
                             vendor=load_catalog().vendor("nvidia"), dev=dev)
    assert iso.mode == "bwrap" and iso.note is None
    listing = subprocess.run([*iso.prefix, "/bin/sh", "-c", "ls -A /dev; ls -A /dev/nvidia-caps 2>&1; cat /dev/nvidia1"],
                             capture_output=True, text=True, check=True).stdout.split()
    assert {"nvidia1", "nvidiactl", "nvidia-uvm", "null"} <= set(listing), listing
    assert not {"nvidia0", "nvidia2", "nvidia3", "nvidia-cap21", "kfd"} & set(listing), listing
    assert listing[-1] == "nvidia1"  # the host's node, bound through
