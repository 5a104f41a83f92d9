"""Inventory: declared pool files and NVML (the real library, which finds no driver here)."""

from __future__ import annotations

import pytest

from autodl.config import default_pool_file
from autodl.errors import InventoryError
from autodl.inventory import read_inventory, read_pool_file
from autodl.inventory.nvml import NvmlUnavailable, read_nvml


def has_nvml_driver() -> bool:
    import pynvml

    try:
        pynvml.nvmlInit()
        pynvml.nvmlShutdown()
        return True
    except pynvml.NVMLError:
        return False


def test_demo_pool_holds_the_four_seed_devices(catalog):
    inv = read_pool_file(default_pool_file(), catalog)
    assert inv.declared and inv.source.startswith("file:")
    assert [d.model for d in inv.devices] == ["A100-SXM4-40GB", "V100-PCIE-32GB", "RTX-3090", "Ascend-910"]
    a100 = inv.devices[0]
    assert a100.memory_total_bytes == 40 * 2**30 and a100.memory_used_bytes == 2 * 2**30
    assert a100.declared and a100.device_id.startswith("GPU-")
    assert inv.devices[3].vendor == "ascend" and inv.devices[3].device_id == "demo-node-1:3"


def test_auto_falls_back_to_declared_demo_pool_without_driver(catalog):
    inv = read_inventory("auto", catalog=catalog)
    if has_nvml_driver():
        assert inv.source == "nvml" and not inv.declared
    else:
        assert inv.declared and inv.source == f"file:{default_pool_file()}"


def test_nvml_explicit_without_driver_is_a_clear_error(catalog):
    if has_nvml_driver():
        inv = read_nvml(catalog)
        assert all(not d.declared and d.uuid for d in inv.devices)
        return
    with pytest.raises(InventoryError, match="NVIDIA driver.*pool file"):
        read_inventory("nvml", catalog=catalog)
    with pytest.raises(NvmlUnavailable):
        read_nvml(catalog)


def test_env_var_selects_pool(tmp_path, monkeypatch, catalog):
    pool = tmp_path / "p.yaml"
    pool.write_text("host: h\ndevices:\n  - {index: 0, model: T4}\n  - {index: 1, model: NVIDIA L4, memory_used_bytes: 5}\n")
    monkeypatch.setenv("AUTODL_POOL", str(pool))
    inv = read_inventory(catalog=catalog)
    assert [d.model for d in inv.devices] == ["T4", "L4"]
    assert [d.device_id for d in inv.devices] == ["h:0", "h:1"]


@pytest.mark.parametrize("text,match", [
    ("devices:\n  - {index: 0, model: Voodoo}\n", r"devices\[0\].model.*not in the GPU catalog"),
    ("devices:\n  - {index: 0, model: T4, colour: red}\n", r"devices.0.colour"),
    ("devices:\n  - {index: 0, model: T4}\n  - {index: 0, model: T4}\n", "duplicate device"),
    ("devices:\n  - {index: 0, model: T4, memory_used_bytes: 99999999999999}\n", "exceeds"),
    ("devices: [unclosed\n", "not valid YAML"),
])
def test_bad_pool_files(tmp_path, catalog, text, match):
    pool = tmp_path / "bad.yaml"
    pool.write_text(text)
    with pytest.raises(InventoryError, match=match):
        read_pool_file(pool, catalog)


def test_missing_pool_file(tmp_path, catalog):
    with pytest.raises(InventoryError, match="pool file not found"):
        read_inventory(tmp_path / "none.yaml", catalog=catalog)


class _FakeNvml:
    """An NVML with two GPUs: an A100 with NVLink and an unknown part; for the mapping logic only."""

    class NVMLError(Exception):
        def __init__(self, text, value=3):   # 3 = NVML_ERROR_NOT_SUPPORTED, as pynvml's errors carry their code
            super().__init__(text)
            self.value = value

    NVML_FEATURE_ENABLED = 1
    NVML_NVLINK_MAX_LINKS = 2
    NVML_DEVICE_MIG_ENABLE = 1

    class _Mem:
        def __init__(self, total, used):
            self.total, self.used = total, used

    class _Obj:
        def __init__(self, **kw):
            self.__dict__.update(kw)

    def __init__(self):
        self.shutdown = False

    def nvmlInit(self):
        pass

    def nvmlShutdown(self):
        self.shutdown = True

    def nvmlDeviceGetCount(self):
        return 2

    def nvmlDeviceGetHandleByIndex(self, i):
        return i

    def nvmlDeviceGetName(self, h):
        return [b"NVIDIA A100-SXM4-40GB", "Mystery GPU"][h]

    def nvmlDeviceGetUUID(self, h):
        return f"GPU-{h}"

    def nvmlDeviceGetPciInfo(self, h):
        return self._Obj(busId=f"00000000:0{h}:00.0")

    def nvmlDeviceGetNvLinkState(self, h, link):
        if h == 0:
            return 1
        raise self.NVMLError("not supported")

    def nvmlDeviceGetMigMode(self, h):
        raise self.NVMLError("not supported")

    def nvmlDeviceGetMemoryInfo(self, h):
        return self._Mem(40 * 2**30, (h + 1) * 2**30)

    def nvmlDeviceGetUtilizationRates(self, h):
        return self._Obj(gpu=10 * (h + 1))


def test_nvml_mapping_to_devices(catalog):
    fake = _FakeNvml()
    inv = read_nvml(catalog, nvml=fake)
    a100, other = inv.devices
    assert not inv.declared and inv.source == "nvml"
    assert a100.model == "A100-SXM4-40GB" and a100.uuid == "GPU-0" and a100.device_id == "GPU-0"
    assert a100.nvlink_group is not None and other.nvlink_group is None
    assert other.model == "Mystery GPU"  # unknown to the catalog: kept by name, the policy drops it
    assert a100.memory_used_bytes == 2**30 and other.utilization_pct == 20
    assert fake.shutdown


@pytest.mark.parametrize("text,match", [
    ("", "holds nothing"),
    ("- a\n- b\n", "holds list"),
    ("devices: []\n", "declares no devices"),
    ("devices:\n  - {index: -1, model: T4}\n  - {index: 0, model: T4, utilization_pct: 300}\n",
     r"devices.0.index(.|\n)*devices.1.utilization_pct"),
])
def test_empty_or_malformed_pool_files(tmp_path, catalog, text, match):
    pool = tmp_path / "p.yaml"
    pool.write_text(text)
    with pytest.raises(InventoryError, match=match):
        read_pool_file(pool, catalog)


def test_vendor_that_contradicts_the_catalog(tmp_path, catalog):
    pool = tmp_path / "p.yaml"
    pool.write_text("devices:\n  - {index: 0, model: T4, vendor: ascend}\n")
    with pytest.raises(InventoryError, match=r"devices\[0\].vendor is 'ascend'.*'nvidia' device"):
        read_pool_file(pool, catalog)
