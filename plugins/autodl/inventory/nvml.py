"""Inventory from the local NVIDIA driver through NVML (``nvidia-ml-py``, module ``pynvml``).

Reads every GPU in PCI bus order (NVML's own order), and each MIG instance of a GPU in MIG mode
as its own device (``model`` = the parent's catalog model, memory = the instance's).
"""

from __future__ import annotations

import socket
from types import ModuleType

from autodl.catalog import Catalog
from autodl.types import Device, Inventory


class NvmlUnavailable(RuntimeError):
    """No NVIDIA driver answers (library missing, no device, driver/library mismatch)."""


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


def _nvlink_active(nvml: ModuleType, handle) -> bool:
    for link in range(getattr(nvml, "NVML_NVLINK_MAX_LINKS", 18)):
        try:
            if nvml.nvmlDeviceGetNvLinkState(handle, link) == nvml.NVML_FEATURE_ENABLED:
                return True
        except nvml.NVMLError:
            break
    return False


def read_nvml(catalog: Catalog, nvml: ModuleType | None = None) -> Inventory:
    """Read the local GPUs.

    :param catalog: maps NVML names (``'NVIDIA A100-SXM4-40GB'``) to catalog models; a GPU that is
        not in the catalog keeps its NVML name, and the policy drops it with that reason.
    :param nvml: the ``pynvml`` module (injectable for tests).
    :returns: an :class:`Inventory` with ``declared=False``; memory in bytes, utilization in %.
    :raises NvmlUnavailable: when the NVML library or driver is absent.
    """
    if nvml is None:
        try:
            import pynvml as nvml  # nvidia-ml-py
        except ImportError as exc:  # pragma: no cover - nvidia-ml-py is a dependency
            raise NvmlUnavailable(f"nvidia-ml-py is not installed ({exc})") from None
    try:
        nvml.nvmlInit()
    except nvml.NVMLError as exc:
        raise NvmlUnavailable(f"NVML did not initialise: {exc}") from None
    host = socket.gethostname()
    devices: list[Device] = []
    try:
        for index in range(nvml.nvmlDeviceGetCount()):
            handle = nvml.nvmlDeviceGetHandleByIndex(index)
            name = _text(nvml.nvmlDeviceGetName(handle))
            entry = catalog.find(name)
            model = entry.name if entry else name
            vendor = entry.vendor if entry else "nvidia"
            uuid = _text(nvml.nvmlDeviceGetUUID(handle))
            pci = _text(nvml.nvmlDeviceGetPciInfo(handle).busId)
            group = f"{host}-nvlink" if _nvlink_active(nvml, handle) else None
            mig_children = []
            try:
                current, _pending = nvml.nvmlDeviceGetMigMode(handle)
                if current == getattr(nvml, "NVML_DEVICE_MIG_ENABLE", 1):
                    for m in range(nvml.nvmlDeviceGetMaxMigDeviceCount(handle)):
                        try:
                            mig_children.append(nvml.nvmlDeviceGetMigDeviceHandleByIndex(handle, m))
                        except nvml.NVMLError:
                            continue
            except nvml.NVMLError:
                pass  # MIG not supported on this GPU
            if mig_children:
                for m, child in enumerate(mig_children):
                    mem = nvml.nvmlDeviceGetMemoryInfo(child)
                    mig_uuid = _text(nvml.nvmlDeviceGetUUID(child))
                    devices.append(
                        Device(device_id=mig_uuid, host=host, index=index, uuid=mig_uuid, model=model,
                               vendor=vendor, memory_total_bytes=int(mem.total), memory_used_bytes=int(mem.used),
                               utilization_pct=0.0, declared=False, pci_bus_id=pci,
                               labels={"mig_parent": uuid, "mig_index": str(m)})
                    )
                continue
            mem = nvml.nvmlDeviceGetMemoryInfo(handle)
            try:
                util = float(nvml.nvmlDeviceGetUtilizationRates(handle).gpu)
            except nvml.NVMLError:
                util = 0.0
            devices.append(
                Device(device_id=uuid, host=host, index=index, uuid=uuid, model=model, vendor=vendor,
                       memory_total_bytes=int(mem.total), memory_used_bytes=int(mem.used),
                       utilization_pct=util, declared=False, pci_bus_id=pci, nvlink_group=group,
                       labels={"nvml_name": name})
            )
    finally:
        try:
            nvml.nvmlShutdown()
        except nvml.NVMLError:
            pass
    return Inventory(source="nvml", declared=False, devices=devices)
