"""NVML failure modes from tests/cases/hardware/nvml (public bug reports), each with its right behaviour."""

from __future__ import annotations

import json

import pytest

from autodl.config import default_pool_file, include_dir
from autodl.errors import InventoryError
from autodl.inventory import read_inventory
from autodl.inventory.nvml import NvmlFailed, NvmlUnavailable, read_nvml
from autodl.policy import place
from autodl.spec import ResourcePolicySection
from tests.cli_helpers import run_cli
from tests.hardware.conftest import GiB, MiB, nvml_calls

SPEC = str(include_dir() / "specs" / "simple_cnn.yaml")


def small_profile(catalog, need=GiB):
    from autodl.types import MemoryBreakdown, ResourceProfile

    return ResourceProfile(script="t.py", params=1000, peak_memory_bytes=need,
                           breakdown=MemoryBreakdown(weights_bytes=need // 2, activations_bytes=need // 2),
                           flops_per_step=1e12, batch_size=32)


def test_a14_idle_card_reads_memory_info_v2(fake_nvml, catalog, tmp_path):
    """A14: an idle RTX 3090 on a driver >= 510: v1 'used' = 336 MiB of driver-reserved memory, v2 used = 0.
    The inventory asks for v2 (not v1) and reports ~0 used."""
    fake_nvml("A14-nvml.json")
    inv = read_inventory("auto", catalog=catalog)
    (dev,) = inv.devices
    assert not inv.declared and dev.model == "RTX-3090"
    assert dev.memory_used_bytes == 0 and dev.labels["nvml_memory_api"] == "v2"
    calls = [c for c in nvml_calls(tmp_path) if c.startswith("nvmlDeviceGetMemoryInfo")]
    assert calls and all(c.endswith(f"version {0x02000028}") for c in calls), calls


def test_a14_v1_only_where_v2_is_not_supported(fake_nvml, catalog):
    """A driver < 510 has no nvmlDeviceGetMemoryInfo_v2 (FunctionNotFound): v1 is used, and says so."""
    nv = fake_nvml("A14-nvml.json")
    real = nv.nvmlDeviceGetMemoryInfo

    def old_driver(handle, version=None):
        if version:
            raise nv.NVMLError(13)  # NVML_ERROR_FUNCTION_NOT_FOUND
        return real(handle)

    nv.nvmlDeviceGetMemoryInfo = old_driver
    (dev,) = read_nvml(catalog, nvml=nv).devices
    assert dev.labels["nvml_memory_api"] == "v1" and dev.memory_used_bytes == 336 * MiB


def test_a15_unsupported_fields_are_unknown_not_zero(fake_nvml, catalog, capsys):
    """A15: utilization, temperature and power NotSupported: each is null (never 0); memory still works and the
    device is placed on, its unknown load scored as fully busy, said in the reasons."""
    fake_nvml("A15-nvml_fields.json")
    inv = read_inventory("auto", catalog=catalog)
    (dev,) = inv.devices
    assert dev.utilization_pct is None and dev.temperature_c is None and dev.power_w is None
    assert dev.memory_used_bytes == 4 * GiB and dev.healthy
    assert {u.split(":")[0] for u in dev.unknown} == {"utilization_pct", "temperature_c", "power_w"}
    decision = place(small_profile(catalog), inv, catalog=catalog, policy=ResourcePolicySection())
    assert decision.chosen is not None and decision.chosen.devices == [dev.device_id]
    assert any("utilization unknown" in r and "fully loaded" in r for r in decision.chosen.reasons)
    code, out, _ = run_cli(capsys, "inventory", "--json")
    assert code == 0
    listed = json.loads(out)["devices"][0]
    assert listed["utilization_pct"] is None and listed["power_w"] is None and listed["temperature_c"] is None
    code, out, _ = run_cli(capsys, "inventory")
    assert code == 0 and "?" in out and "unknown" in out


def test_a15_memory_not_supported_on_one_gpu(fake_nvml, catalog, capsys):
    """A15: memory info NotSupported on GPU 0, GPU 1 fine: no traceback; GPU 1 listed and usable; GPU 0 unhealthy
    with the reason."""
    fake_nvml("A15-nvml_memory.json")
    inv = read_inventory("auto", catalog=catalog)
    gpu0, gpu1 = inv.devices
    assert not gpu0.healthy and "memory info: Not Supported" in gpu0.health_reason and gpu0.memory_used_bytes is None
    assert gpu1.healthy and gpu1.memory_used_bytes == 0
    decision = place(small_profile(catalog), inv, catalog=catalog, policy=ResourcePolicySection())
    assert decision.chosen.devices == [gpu1.device_id]
    dropped = [c for c in decision.candidates if not c.kept]
    assert dropped[0].devices == [gpu0.device_id] and "unhealthy: memory info: Not Supported" in dropped[0].reasons[0]
    code, out, err = run_cli(capsys, "inventory")
    assert code == 0 and "UNHEALTHY: memory info: Not Supported" in out and "Traceback" not in err
    code, out, err = run_cli(capsys, "plan", SPEC, "--no-probe", "--json")
    assert code == 0 and "Traceback" not in err
    assert json.loads(out)["placements"][0]["devices"] == [gpu1.device_id]


def test_b09_gpu_lost_from_the_bus(fake_nvml, catalog, capsys):
    """B09: 3 A100s, one fallen off the bus (GpuIsLost on every query): the two healthy ones listed and placed on,
    the lost one unhealthy; no traceback in inventory or plan."""
    fake_nvml("B09-gpu-lost-nvml_lost.json")
    inv = read_inventory("auto", catalog=catalog)
    assert len(inv.devices) == 3
    lost = inv.devices[1]
    assert not lost.healthy and "GPU is lost" in lost.health_reason and lost.index == 1
    healthy = [d.device_id for d in inv.devices if d.healthy]
    assert healthy == ["GPU-b09b09b0-a100-0000-0000-000000000000", "GPU-b09b09b2-a100-0000-0000-000000000000"]
    decision = place(small_profile(catalog), inv, catalog=catalog, policy=ResourcePolicySection(), num_gpus=2)
    assert decision.chosen is not None and sorted(decision.chosen.devices) == healthy
    code, out, err = run_cli(capsys, "inventory")
    assert code == 0 and "GPU is lost" in out and "Traceback" not in err
    code, out, err = run_cli(capsys, "plan", SPEC, "--no-probe", "--json")
    assert code == 0 and "Traceback" not in err and json.loads(out)["placements"]


def test_b01_version_mismatch_is_an_inventory_error_not_the_demo_pool(fake_nvml, catalog, capsys):
    """B01: nvmlInit fails with a driver/library version mismatch (18) on a host that has the library: under the
    default auto pool that is an inventory error (exit 5), not a silent switch to the demo pool and a CPU run."""
    fake_nvml("B01-nvml-mismatch-nvml_mismatch.json")
    with pytest.raises(InventoryError, match="version mismatch.*reboot"):
        read_inventory("auto", catalog=catalog)
    with pytest.raises(NvmlFailed):
        read_nvml(catalog)
    code, _out, err = run_cli(capsys, "inventory")
    assert code == 5 and "NVML/RM version mismatch" in err and "Traceback" not in err
    code, _out, err = run_cli(capsys, "plan", SPEC, "--no-probe")
    assert code == 5


@pytest.mark.parametrize("code", [9, 12])
def test_no_driver_or_no_library_falls_back_to_the_declared_pool(fake_nvml, catalog, code):
    """Only 'no NVIDIA stack here' (driver not loaded 9, library not found 12) lets auto use the declared pool,
    and the inventory says why."""
    fake_nvml({"init_error": code, "devices": []})
    inv = read_inventory("auto", catalog=catalog)
    assert inv.declared and inv.source == f"file:{default_pool_file()}"
    assert any("no NVIDIA GPU here" in n for n in inv.notes)
    with pytest.raises(NvmlUnavailable):
        read_nvml(catalog)


def test_no_device_falls_back(fake_nvml, catalog):
    fake_nvml({"devices": []})
    assert read_inventory("auto", catalog=catalog).declared


def test_mig_instances_are_devices_with_their_own_memory_and_compute_share(fake_nvml, catalog):
    """MIG mode: each instance is its own device (MIG UUID, own memory, utilization unknown), with its share of
    the GPU's compute; placement scales speed and cost to it."""
    fake_nvml({"devices": [
        {"name": "NVIDIA A100-SXM4-40GB", "uuid": "GPU-aaaa", "bus": "00000000:07:00.0", "total": 40 * GiB,
         "used_v2": 0, "mig": [{"uuid": "MIG-1111", "total": 5 * GiB, "used": 0},
                               {"uuid": "MIG-2222", "total": 20 * GiB, "used": GiB}]},
        {"name": "NVIDIA A100-SXM4-40GB", "uuid": "GPU-bbbb", "bus": "00000000:0B:00.0", "total": 40 * GiB,
         "used_v2": 0, "util": 5},
    ]})
    inv = read_inventory("auto", catalog=catalog)
    small, big, whole = inv.devices
    assert small.device_id == small.uuid == "MIG-1111" and small.memory_total_bytes == 5 * GiB
    assert small.labels["mig_parent"] == "GPU-aaaa" and small.labels["catalog_model"] == "A100-SXM4-40GB"
    assert small.compute_fraction == pytest.approx(5 / 40) and big.compute_fraction == pytest.approx(0.5)
    assert small.utilization_pct is None and small.model.startswith("A100-SXM4-40GB MIG ")
    assert whole.compute_fraction is None and whole.model == "A100-SXM4-40GB"
    decision = place(small_profile(catalog, need=2 * GiB), inv, catalog=catalog, policy=ResourcePolicySection())
    step = {c.model: c.est_step_time_s for c in decision.candidates if c.kept}
    assert step[small.model] == pytest.approx(step[whole.model] * 8, rel=1e-6)  # 1/8 of compute and bandwidth
    kept_small = next(c for c in decision.candidates if c.kept and c.model == small.model)
    assert any("MIG instance" in r for r in kept_small.reasons)


def test_mig_share_from_multiprocessor_counts_when_nvml_gives_them(fake_nvml, catalog):
    """Where NVML has nvmlDeviceGetAttributes, the compute share is the instance's SMs over the GPU's (1g.5gb on an
    A100: 14 of 98 SMs = 1/7) and the profile comes from the instance's name."""
    nv = fake_nvml({"devices": [{"name": "NVIDIA A100-SXM4-40GB", "uuid": "GPU-aaaa", "total": 40 * GiB, "used_v2": 0,
                                 "mig": [{"uuid": "MIG-1111", "total": 5 * GiB, "used": 0,
                                          "name": "NVIDIA A100-SXM4-40GB MIG 1g.5gb"}]}]})

    class Attrs:
        def __init__(self, sms):
            self.multiprocessorCount, self.gpuInstanceSliceCount, self.memorySizeMB = sms, 1, 4864

    nv.nvmlDeviceGetAttributes = lambda h: Attrs(14 if h.parent is not None else 98)
    (dev,) = read_nvml(catalog, nvml=nv).devices
    assert dev.model == "A100-SXM4-40GB MIG 1g.5gb" and dev.compute_fraction == pytest.approx(1 / 7, abs=1e-4)
    assert dev.labels["compute_fraction_source"] == "multiprocessors"


def test_a_device_failing_any_other_way_keeps_the_rest(fake_nvml, catalog):
    """Any NVML error on one device (here an unknown error getting its handle) makes only that device unhealthy."""
    fake_nvml({"devices": [
        {"name": "NVIDIA A100-SXM4-40GB", "uuid": "GPU-0", "total": 40 * GiB, "used_v2": 0, "handle_error": "Unknown"},
        {"name": "NVIDIA A100-SXM4-40GB", "uuid": "GPU-1", "total": 40 * GiB, "used_v2": 0},
    ]})
    bad, good = read_inventory("nvml", catalog=catalog).devices
    assert not bad.healthy and "Unknown Error" in bad.health_reason and good.healthy
