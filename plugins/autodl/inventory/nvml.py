"""Inventory from the local NVIDIA driver through NVML (``nvidia-ml-py``, module ``pynvml``).

Details: docs/reference/hardware.md#autodlinventorynvml.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from types import ModuleType
from typing import Any

from pydantic import BaseModel, ConfigDict

from autodl.catalog import Catalog, GPUModel
from autodl.hosts import this_host
from autodl.types import Device, Inventory

NVML_ERROR_NOT_SUPPORTED = 3
NVML_ERROR_NO_PERMISSION = 4
NVML_ERROR_NOT_FOUND = 6
NVML_ERROR_DRIVER_NOT_LOADED = 9
NVML_ERROR_LIBRARY_NOT_FOUND = 12
NVML_ERROR_FUNCTION_NOT_FOUND = 13
NVML_ERROR_GPU_IS_LOST = 15
NVML_ERROR_RESET_REQUIRED = 16
NVML_ERROR_LIB_RM_VERSION_MISMATCH = 18
NVML_ERROR_ARGUMENT_VERSION_MISMATCH = 25
"""NVML return codes (``nvml.h``; the same values as ``pynvml.NVML_ERROR_*``)."""

ABSENT_CODES = frozenset({NVML_ERROR_DRIVER_NOT_LOADED, NVML_ERROR_LIBRARY_NOT_FOUND})
"""``nvmlInit`` errors that mean "no NVIDIA GPU stack here" (the only ones the ``auto`` pool falls back on)."""

DEVICE_FAILED_CODES = frozenset({NVML_ERROR_GPU_IS_LOST, NVML_ERROR_RESET_REQUIRED})
"""Errors of any per-device call that mean the whole device is gone, not one field: ``GPU_IS_LOST`` ("the GPU
has fallen off the bus or has otherwise become inaccessible") and ``RESET_REQUIRED`` ("the GPU requires a
reset before it can be used again") — NVML API reference, ``nvmlReturn_t``
(https://docs.nvidia.com/deploy/nvml-api/group__nvmlDeviceEnumvs.html). A device that answers one of them on
any field is unhealthy, whatever its other fields said."""

NO_MIG_CODES = frozenset({NVML_ERROR_NOT_SUPPORTED, NVML_ERROR_FUNCTION_NOT_FOUND})
"""``nvmlDeviceGetMigMode`` errors that mean "this GPU (or driver) has no MIG": the GPU is used whole. Any other
error leaves the MIG mode unknown, and the device is not offered whole (CUDA cannot use a GPU in MIG mode
except through its instances)."""

V1_FALLBACK_CODES = frozenset({NVML_ERROR_NOT_SUPPORTED, NVML_ERROR_FUNCTION_NOT_FOUND,
                               NVML_ERROR_ARGUMENT_VERSION_MISMATCH})
"""Errors of ``nvmlDeviceGetMemoryInfo_v2`` after which the v1 call is tried (driver < 510, old board)."""

MIG_PROFILE_RE = re.compile(r"(\d+)g\.(\d+)gb", re.I)
"""A MIG profile in an NVML device name, e.g. ``NVIDIA A100-SXM4-40GB MIG 1g.5gb``: ``<compute slices>g.<memory GB>gb``
(NVIDIA MIG User Guide, "Supported MIG Profiles": https://docs.nvidia.com/datacenter/tesla/mig-user-guide/)."""


class NvmlUnavailable(RuntimeError):
    """No NVIDIA stack here: the NVML library is missing, no driver is loaded, or it sees no device."""


class NvmlFailed(RuntimeError):
    """NVML is installed but does not work (driver/library version mismatch, no permission, ...).

    ``code`` is the NVML return code when there was one (the fix to suggest depends on it).
    """

    def __init__(self, message: str, code: int | None = None):
        super().__init__(message)
        self.code = code


class MemoryInfoInconsistent(ValueError):
    """NVML's memory info contradicts itself (used above total, a zero total): the reading is unknown, not a figure."""


def error_code(exc: BaseException) -> int | None:
    """The NVML return code of an ``NVMLError`` (``exc.value``), or None."""
    value = getattr(exc, "value", None)
    return value if isinstance(value, int) else None


def describe(exc: BaseException) -> str:
    """``exc`` as a short reason: NVML's own text and its code."""
    code = error_code(exc)
    text = str(exc) or type(exc).__name__
    return f"{text} (NVML error {code})" if code is not None else text


def load_nvml(nvml: ModuleType | None = None) -> ModuleType:
    """The ``pynvml`` module (``nvidia-ml-py``), or ``nvml`` when given.

    :raises NvmlUnavailable: when the binding is not installed.
    """
    if nvml is not None:
        return nvml
    try:
        import pynvml  # nvidia-ml-py
    except ImportError as exc:  # pragma: no cover - nvidia-ml-py is a dependency
        raise NvmlUnavailable(f"nvidia-ml-py is not installed ({exc})") from None
    return pynvml


def init(nvml: ModuleType) -> None:
    """``nvmlInit``, with its failure sorted into absent or broken.

    :raises NvmlUnavailable: no library / no driver loaded (:data:`ABSENT_CODES`).
    :raises NvmlFailed: any other NVML error, e.g. 18 "RM has detected an NVML/RM version mismatch".
    """
    try:
        nvml.nvmlInit()
    except Exception as exc:  # noqa: BLE001 - NVMLError, or OSError from a broken library
        if error_code(exc) in ABSENT_CODES:
            raise NvmlUnavailable(f"NVML did not initialise: {describe(exc)}") from None
        raise NvmlFailed(f"NVML did not initialise: {describe(exc)}", error_code(exc)) from None


def shutdown(nvml: ModuleType) -> None:
    """``nvmlShutdown``; its failure does not matter."""
    try:
        nvml.nvmlShutdown()
    except Exception:  # noqa: BLE001
        pass


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def read_memory(nvml: ModuleType, handle: Any) -> tuple[int, int, str]:
    """(total, used, API version) of a device or MIG handle, bytes.

    v2 first (``used`` excludes driver-reserved memory); v1 only when v2 is not supported by the
    driver, the board or the binding.

    :raises MemoryInfoInconsistent: when the answer contradicts itself (``used > total``, ``total == 0``:
        seen with a GPU in a bad state); the caller treats the memory as unknown, never as the figures.
    :raises Exception: the NVML error of the last call tried.
    """
    v2 = getattr(nvml, "nvmlMemory_v2", None)
    if v2 is not None:
        try:
            mem = nvml.nvmlDeviceGetMemoryInfo(handle, version=v2)
            return _checked(int(mem.total), int(mem.used), "v2")
        except TypeError:
            pass  # a binding whose call takes no version
        except Exception as exc:  # noqa: BLE001
            if error_code(exc) not in V1_FALLBACK_CODES:
                raise
    mem = nvml.nvmlDeviceGetMemoryInfo(handle)
    return _checked(int(mem.total), int(mem.used), "v1")


def _checked(total: int, used: int, api: str) -> tuple[int, int, str]:
    if total <= 0 or used < 0 or used > total:
        raise MemoryInfoInconsistent(
            f"{api} reports used {used / 2**30:.2f} GiB of total {total / 2**30:.2f} GiB (inconsistent)")
    return total, used, api


def device_failed(exc: BaseException) -> bool:
    """True when ``exc`` means the whole device is gone (:data:`DEVICE_FAILED_CODES`), not one unsupported field."""
    return error_code(exc) in DEVICE_FAILED_CODES


def read_field(unknown: list[str], name: str, call: Callable[[], Any]) -> Any:
    """``call()``, or None with ``'<name>: <reason>'`` appended to ``unknown`` when it fails."""
    try:
        return call()
    except Exception as exc:  # noqa: BLE001 - NotSupported, GpuIsLost, a binding without the call
        unknown.append(f"{name}: {describe(exc)}")
        return None


def _nvlink_active(nvml: ModuleType, handle: Any) -> bool:
    for link in range(getattr(nvml, "NVML_NVLINK_MAX_LINKS", 18)):
        try:
            if nvml.nvmlDeviceGetNvLinkState(handle, link) == getattr(nvml, "NVML_FEATURE_ENABLED", 1):
                return True
        except Exception:  # noqa: BLE001 - no NVLink, or no more links
            break
    return False


def _mig_children(nvml: ModuleType, handle: Any) -> tuple[list[Any], list[str], str | None]:
    """(MIG instance handles, slots that could not be read with why, why the GPU cannot be used) of a GPU.

    No MIG (not supported, disabled): ``([], [], None)`` — the GPU is used whole. MIG enabled with no
    instance, or a MIG mode NVML cannot tell: no children and the reason, since CUDA cannot run on a GPU
    in MIG mode except inside an instance (NVIDIA MIG User Guide, "CUDA Device Enumeration":
    https://docs.nvidia.com/datacenter/tesla/mig-user-guide/).
    """
    try:
        current, _pending = nvml.nvmlDeviceGetMigMode(handle)
    except AttributeError:  # a binding without MIG calls
        return [], [], None
    except Exception as exc:  # noqa: BLE001
        if error_code(exc) in NO_MIG_CODES:
            return [], [], None  # MIG not supported on this GPU
        return [], [], f"MIG mode unreadable ({describe(exc)}): the GPU is not offered whole"
    if current != getattr(nvml, "NVML_DEVICE_MIG_ENABLE", 1):
        return [], [], None
    children: list[Any] = []
    failed: list[str] = []
    try:
        count = int(nvml.nvmlDeviceGetMaxMigDeviceCount(handle))
    except Exception:  # noqa: BLE001
        count = 7
    for m in range(count):
        try:
            children.append(nvml.nvmlDeviceGetMigDeviceHandleByIndex(handle, m))
        except Exception as exc:  # noqa: BLE001
            if error_code(exc) != NVML_ERROR_NOT_FOUND:  # NOT_FOUND: no instance at this slot
                failed.append(f"MIG slot {m}: {describe(exc)}")
    if not children:
        why = "; ".join(failed) if failed else "no MIG instance exists"
        return [], failed, (f"MIG mode is enabled but {why}: CUDA cannot use this GPU until instances are created "
                            "(`nvidia-smi mig -cgi ... -C`) or MIG is disabled")
    return children, failed, None


def _mig_share(nvml: ModuleType, parent: Any, child: Any, name: str, total: int,
               parent_total: int | None) -> tuple[str, float | None, str]:
    """(profile, compute fraction, how the fraction was found) of a MIG instance.

    The fraction is the instance's streaming multiprocessors over the GPU's (``nvmlDeviceGetAttributes``);
    else its compute slices (from the profile in its name, ``1g.5gb``) over the GPU's slice count
    (``nvmlDeviceGetMaxMigDeviceCount``: 7 on A100/H100, 4 on A30 — MIG User Guide); else its share
    of the GPU's memory, which for every MIG profile is at most its compute share (1g.5gb: 1/8 of
    memory, 1/7 of compute), so speed is not overstated.
    """
    profile: str | None = None
    match = MIG_PROFILE_RE.search(name)
    attrs: Any = None  # the binding's c_nvmlDeviceAttributes_t (nvml is an untyped module here), or None
    try:
        attrs = nvml.nvmlDeviceGetAttributes(child)
    except Exception:  # noqa: BLE001 - older driver or binding
        attrs = None
    if match:
        profile = f"{match.group(1)}g.{match.group(2)}gb"
    elif attrs is not None and getattr(attrs, "gpuInstanceSliceCount", None):
        profile = f"{attrs.gpuInstanceSliceCount}g.{round(attrs.memorySizeMB / 1024)}gb"
    if attrs is not None:
        try:
            parent_sm = nvml.nvmlDeviceGetAttributes(parent).multiprocessorCount
            if parent_sm and attrs.multiprocessorCount:
                fraction = attrs.multiprocessorCount / parent_sm
                return profile or f"{fraction:.2f}", round(fraction, 4), "multiprocessors"
        except Exception:  # noqa: BLE001
            pass
    if match and profile is not None:  # a profile in the name: profile is the name's
        try:
            slices = int(nvml.nvmlDeviceGetMaxMigDeviceCount(parent))
            if slices:
                return profile, round(min(1.0, int(match.group(1)) / slices), 4), "compute slices"
        except Exception:  # noqa: BLE001
            pass
    if parent_total:
        fraction = min(1.0, total / parent_total)
        return profile or f"{total / 2**30:.1f}gib", round(fraction, 4), "memory share (conservative)"
    return profile or f"{total / 2**30:.1f}gib", None, "unknown"


UNKNOWN_TOTAL = "memory_total_bytes: unknown (neither NVML nor the catalog says it)"
"""``Device.unknown`` entry of a device whose memory total is not known (``memory_total_bytes`` is then 0, which
JSON shows as null)."""


def _device_memory(nvml: ModuleType, handle: Any, entry: GPUModel | None, unknown: list[str], problems: list[str],
                   labels: dict[str, str]) -> tuple[int, int | None, str | None]:
    """The GPU's total and used memory, bytes, and why they could not be read (the catalog's total then)."""
    try:
        total, used, api = read_memory(nvml, handle)
        labels["nvml_memory_api"] = api
        memory_error = None
    except Exception as exc:  # noqa: BLE001
        memory_error = f"memory info: {describe(exc)}"
        total = entry.memory_bytes if entry else 0
        used = None
        unknown.append(memory_error)
        problems.append(memory_error)
        labels["memory_total_source"] = "catalog" if entry else "unknown"
        if not total:
            unknown.append(UNKNOWN_TOTAL)
    return total, used, memory_error


def _mig_devices(nvml: ModuleType, handle: Any, children: list[Any], failed_slots: list[str], *, index: int,
                 host: str, uuid: str, model: str, vendor: str, pci: str | None, total: int) -> list[Device]:
    """The MIG instances of the GPU at NVML ``index``; an unreadable instance or slot is an unhealthy device."""
    out = []
    for m, child in enumerate(children):
        c_unknown: list[str] = ["utilization_pct: not reported for MIG instances (NVML)"]
        try:
            mig_uuid = _text(nvml.nvmlDeviceGetUUID(child))
            c_total, c_used, c_api = read_memory(nvml, child)
        except Exception as exc:  # noqa: BLE001
            reason = f"NVML cannot read MIG instance {m} of GPU {index}: {describe(exc)}"
            out.append(Device(device_id=f"{uuid}/mig{m}", host=host, index=index, model=f"{model} MIG",
                              vendor=vendor, memory_total_bytes=0, memory_used_bytes=None, utilization_pct=None,
                              healthy=False, health_reason=reason, declared=False, pci_bus_id=pci,
                              labels={"mig_parent": uuid, "mig_index": str(m)}, unknown=[reason, UNKNOWN_TOTAL]))
            continue
        c_name = read_field(c_unknown, "name", lambda: _text(nvml.nvmlDeviceGetName(child))) or ""
        profile, fraction, how = _mig_share(nvml, handle, child, c_name, c_total, total)
        out.append(Device(
            device_id=mig_uuid, host=host, index=index, uuid=mig_uuid, model=f"{model} MIG {profile}",
            vendor=vendor, memory_total_bytes=c_total, memory_used_bytes=c_used, utilization_pct=None,
            compute_fraction=fraction, declared=False, pci_bus_id=pci, unknown=c_unknown,
            labels={"mig_parent": uuid, "mig_index": str(m), "mig_profile": profile, "catalog_model": model,
                    "compute_fraction_source": how, "nvml_memory_api": c_api, "nvml_name": c_name},
        ))
    for slot in failed_slots:
        reason = f"NVML cannot read {slot} of GPU {index}"
        out.append(Device(device_id=f"{uuid}/{slot.split(':')[0].replace(' ', '-').lower()}", host=host,
                          index=index, model=f"{model} MIG", vendor=vendor, memory_total_bytes=0,
                          memory_used_bytes=None, utilization_pct=None, healthy=False, health_reason=reason,
                          declared=False, pci_bus_id=pci, labels={"mig_parent": uuid},
                          unknown=[reason, UNKNOWN_TOTAL]))
    return out


def _device(nvml: ModuleType, index: int, host: str, catalog: Catalog) -> list[Device]:
    """The device(s) at NVML ``index``: one GPU, or its MIG instances; unhealthy with the reason on failure.

    Each identity field is read in its own guard: a GPU whose name cannot be read keeps its UUID and memory
    (model ``unknown``), one whose UUID cannot be read keeps its name (id ``host:index``); either is
    unhealthy — it cannot be sized or pinned. A per-device error meaning the GPU is gone
    (:data:`DEVICE_FAILED_CODES`) on any field makes it unhealthy, whatever the other fields said.
    """
    try:
        handle = nvml.nvmlDeviceGetHandleByIndex(index)
    except Exception as exc:  # noqa: BLE001 - GpuIsLost, NoPermission, Unknown, ...
        reason = f"NVML cannot read GPU {index}: {describe(exc)}"
        return [Device(device_id=f"{host}:{index}", host=host, index=index, model="unknown", memory_total_bytes=0,
                       memory_used_bytes=None, utilization_pct=None, healthy=False, health_reason=reason,
                       declared=False, unknown=[reason, UNKNOWN_TOTAL])]
    unknown: list[str] = []
    problems: list[str] = []   # why the device is unhealthy, in the order found

    def field(name: str, call: Callable[[], Any], *, required: bool = False) -> Any:
        try:
            return call()
        except Exception as exc:  # noqa: BLE001 - NotSupported, GpuIsLost, a binding without the call
            why = f"{name}: {describe(exc)}"
            unknown.append(why)
            if required or device_failed(exc):
                problems.append(why)
            return None

    name = field("name", lambda: _text(nvml.nvmlDeviceGetName(handle)), required=True)
    uuid = field("uuid", lambda: _text(nvml.nvmlDeviceGetUUID(handle)), required=True)
    device_id = uuid or f"{host}:{index}"
    entry = catalog.find(name) if name else None
    model = entry.name if entry else (name or "unknown")
    vendor = entry.vendor if entry else "nvidia"
    pci = field("pci_bus_id", lambda: _text(nvml.nvmlDeviceGetPciInfo(handle).busId))
    labels = {"nvml_name": name} if name else {}
    total, used, memory_error = _device_memory(nvml, handle, entry, unknown, problems, labels)

    children, failed_slots, mig_problem = ([], [], None) if memory_error else _mig_children(nvml, handle)
    if mig_problem:
        problems.append(mig_problem)
    if children and uuid:
        return _mig_devices(nvml, handle, children, failed_slots, index=index, host=host, uuid=uuid, model=model,
                            vendor=vendor, pci=pci, total=total)

    util = field("utilization_pct", lambda: float(nvml.nvmlDeviceGetUtilizationRates(handle).gpu))
    temp = field("temperature_c",
                 lambda: float(nvml.nvmlDeviceGetTemperature(handle, getattr(nvml, "NVML_TEMPERATURE_GPU", 0))))
    power = field("power_w", lambda: nvml.nvmlDeviceGetPowerUsage(handle) / 1000.0)  # mW -> W
    group = f"{host}-nvlink" if not problems and _nvlink_active(nvml, handle) else None
    return [Device(
        device_id=device_id, host=host, index=index, uuid=uuid, model=model, vendor=vendor, memory_total_bytes=total,
        memory_used_bytes=used, utilization_pct=util, temperature_c=temp, power_w=power,
        healthy=not problems, health_reason="; ".join(problems) or None, declared=False, pci_bus_id=pci,
        nvlink_group=group, labels=labels, unknown=unknown,
    )]


def read_nvml(catalog: Catalog, nvml: ModuleType | None = None) -> Inventory:
    """Read the local GPUs.

    :param catalog: maps NVML names (``'NVIDIA A100-SXM4-40GB'``) to catalog models; a GPU that is
        not in the catalog keeps its NVML name, and the policy drops it with that reason. A MIG
        instance's model is ``'<catalog model> MIG <profile>'`` (e.g. ``'A100-SXM4-40GB MIG 1g.5gb'``).
    :param nvml: the ``pynvml`` module (injectable for tests).
    :returns: an :class:`Inventory` with ``declared=False``; memory in bytes, utilization in %,
        unknown fields None; failing devices unhealthy with ``health_reason``.
    :raises NvmlUnavailable: no NVML library, no driver loaded, or no device.
    :raises NvmlFailed: NVML present but broken (see :func:`init`).
    """
    nvml = load_nvml(nvml)
    init(nvml)
    host = this_host()  # AUTODL_HOST or the host name: the name steps compare with (autodl.hosts)
    devices: list[Device] = []
    try:
        try:
            count = int(nvml.nvmlDeviceGetCount())
        except Exception as exc:  # noqa: BLE001
            raise NvmlFailed(f"NVML cannot count the GPUs: {describe(exc)}", error_code(exc)) from None
        if count == 0:
            raise NvmlUnavailable("NVML sees no GPU")
        for index in range(count):
            devices.extend(_device(nvml, index, host, catalog))
    finally:
        shutdown(nvml)
    return Inventory(source="nvml", declared=False, devices=devices)


class DeviceAddress(BaseModel):
    """Where a device's nodes are under ``/dev``, as NVML says: ``/dev/nvidia<minor>`` and, for a MIG instance, its
    GPU and compute instance ids (the keys of ``/proc/driver/nvidia-caps/mig-minors``).

    :ivar minor: the GPU's device minor number (``nvmlDeviceGetMinorNumber``; a MIG instance's parent GPU's).
    :ivar gpu_instance: the MIG instance's GPU instance id (``nvmlDeviceGetGpuInstanceId``); None for a whole GPU.
    :ivar compute_instance: its compute instance id (``nvmlDeviceGetComputeInstanceId``); None for a whole GPU.
    :ivar unknown: why the address could not be read (then ``minor`` is None); None when it was.
    """

    model_config = ConfigDict(frozen=True)

    device_id: str
    minor: int | None = None
    gpu_instance: int | None = None
    compute_instance: int | None = None
    unknown: str | None = None


def _is_mig(device: Device) -> bool:
    return bool(device.labels.get("mig_parent")) or (device.uuid or "").startswith("MIG-")


def _address(nvml: ModuleType, device: Device) -> DeviceAddress:
    """One device's :class:`DeviceAddress`: by UUID, else (a whole GPU only) by NVML index, which is PCI bus order as
    ``CUDA_DEVICE_ORDER=PCI_BUS_ID`` pins it."""
    mig = _is_mig(device)
    try:
        if device.uuid:
            handle = nvml.nvmlDeviceGetHandleByUUID(device.uuid)
        elif not mig:
            handle = nvml.nvmlDeviceGetHandleByIndex(device.index)
        else:
            return DeviceAddress(device_id=device.device_id, unknown="a MIG instance without a UUID")
        if not mig:
            return DeviceAddress(device_id=device.device_id, minor=int(nvml.nvmlDeviceGetMinorNumber(handle)))
        parent = nvml.nvmlDeviceGetDeviceHandleFromMigDeviceHandle(handle)
        return DeviceAddress(device_id=device.device_id, minor=int(nvml.nvmlDeviceGetMinorNumber(parent)),
                             gpu_instance=int(nvml.nvmlDeviceGetGpuInstanceId(handle)),
                             compute_instance=int(nvml.nvmlDeviceGetComputeInstanceId(handle)))
    except Exception as exc:  # noqa: BLE001 - NotSupported, NotFound, a binding without the call
        return DeviceAddress(device_id=device.device_id, unknown=f"NVML: {describe(exc)}")


def read_addresses(devices: Sequence[Device], nvml: ModuleType | None = None) -> list[DeviceAddress]:
    """The device-node addresses of ``devices`` (booked NVIDIA devices on this host), in their order.

    A device whose address NVML cannot give (NVML absent or broken, a call not supported, a device not found)
    has ``unknown`` set with why; the others are read.

    :param nvml: the ``pynvml`` module (injectable for tests).
    """
    try:
        nvml = load_nvml(nvml)
        init(nvml)
    except (NvmlUnavailable, NvmlFailed) as exc:
        return [DeviceAddress(device_id=d.device_id, unknown=str(exc)) for d in devices]
    try:
        return [_address(nvml, d) for d in devices]
    finally:
        shutdown(nvml)
