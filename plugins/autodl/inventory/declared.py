"""Declared pools: devices listed in a YAML file, for machines without a driver and for simulation.

Details: docs/reference/hardware.md#autodlinventorydeclared.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, StrictBool, ValidationError, field_validator

from autodl.catalog import Catalog
from autodl.config import read_yaml, shipped_hint
from autodl.errors import CatalogError, InventoryError
from autodl.fields import DeviceBytes, DeviceIndex, Percent, UsedDeviceBytes
from autodl.inputs import clip, short
from autodl.types import Device, Inventory

RESERVED_DEVICE_IDS = frozenset({"all", "none", "void"})
"""Values the NVIDIA container runtime reads as device *sets* in ``NVIDIA_VISIBLE_DEVICES`` and ``--gpus``
(https://docs.nvidia.com/datacenter/cloud-native/container-toolkit/latest/docker-specialized.html): a device
declared with one of them as its uuid would be given every GPU of the host (or none)."""

_UUID_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:/-]{0,199}")
_HOST_RE = re.compile(r"[A-Za-z0-9_\[][A-Za-z0-9_.:\[\]-]{0,252}")


def _no_control(value: Any) -> Any:
    if isinstance(value, str) and any(not c.isprintable() for c in value):
        raise ValueError("holds a control character (a terminal escape, a line break); write plain text")
    return value


class _DeclaredDevice(BaseModel):
    model_config = ConfigDict(extra="forbid")

    index: DeviceIndex
    model: str = Field(max_length=200)
    uuid: str | None = Field(None, max_length=200)
    vendor: str | None = Field(None, max_length=100)
    host: str | None = Field(None, max_length=253)
    memory_total_bytes: DeviceBytes | None = None
    memory_used_bytes: UsedDeviceBytes = 0
    utilization_pct: Percent = 0.0
    healthy: StrictBool = True
    nvlink_group: str | None = Field(None, max_length=200)
    pci_bus_id: str | None = Field(None, max_length=200)
    labels: dict[str, str] = Field(default_factory=dict)

    @field_validator("model", "vendor", "nvlink_group", "pci_bus_id")
    @classmethod
    def _plain(cls, value: Any) -> Any:
        return _no_control(value)

    @field_validator("labels")
    @classmethod
    def _plain_labels(cls, value: dict[str, str]) -> dict[str, str]:
        for k, v in value.items():
            _no_control(k)
            _no_control(v)
        return value

    @field_validator("uuid")
    @classmethod
    def _one_device(cls, value: str | None) -> str | None:
        # the uuid goes into CUDA_VISIBLE_DEVICES / NVIDIA_VISIBLE_DEVICES / --gpus device=...: one device, never a list
        if value is not None and (not _UUID_RE.fullmatch(value) or value.lower() in RESERVED_DEVICE_IDS):
            raise ValueError(f"{short(value, 40)} is not one device's UUID (letters, digits and ._:/- only, no ',', "
                             "not 'all'/'none'/'void', which the container runtime reads as sets of devices); write "
                             "the UUID nvidia-smi -L shows, e.g. GPU-0d5c0b9e-...")
        return value

    @field_validator("host")
    @classmethod
    def _host_name(cls, value: str | None) -> str | None:
        if value is not None and not _HOST_RE.fullmatch(value):
            raise ValueError(f"{short(value, 40)} is not a host name (letters, digits and ._:-[] only)")
        return value


class _PoolFile(BaseModel):
    model_config = ConfigDict(extra="forbid")

    host: str = Field("localhost", max_length=253)
    devices: list[_DeclaredDevice]

    @field_validator("host")
    @classmethod
    def _host_name(cls, value: str) -> str:
        if not _HOST_RE.fullmatch(value):
            raise ValueError(f"{short(value, 40)} is not a host name (letters, digits and ._:-[] only)")
        return value


def read_pool_file(path: str | Path, catalog: Catalog) -> Inventory:
    """Read a declared pool.

    :param path: the pool YAML file.
    :param catalog: used to resolve model names and default memory/vendor.
    :returns: an :class:`Inventory` with ``declared=True``.
    :raises InventoryError: missing file, bad YAML, unknown field, unknown model, duplicate device.
    """
    p = Path(path)
    raw = read_yaml(p, InventoryError, "pool file not found; pass an existing pool YAML"
                    + shipped_hint("pools", p) + ".")
    if not isinstance(raw, dict):
        raise InventoryError(f"{p}: a pool file is a mapping with a 'devices:' list (see include/pools/demo.yaml); "
                             f"this one holds {type(raw).__name__ if raw is not None else 'nothing'}.")
    pool = _validated_pool(p, raw)
    if not pool.devices:
        raise InventoryError(f"{p}: the pool declares no devices; list at least one under 'devices:'.")
    devices: list[Device] = []
    seen: set[str] = set()
    for i, d in enumerate(pool.devices):
        devices.append(_declared_device(p, i, d, pool.host, catalog, seen))
    return Inventory(source=f"file:{p}", declared=True, devices=devices)


def _validated_pool(p: Path, raw: dict) -> _PoolFile:
    """The pool file's mapping validated as a :class:`_PoolFile`; else an error naming up to ten bad fields."""
    try:
        return _PoolFile.model_validate(raw)
    except ValidationError as exc:
        errors = exc.errors(include_url=False)
        lines = [f"{clip(p)}: field '{clip('.'.join(str(x) for x in err['loc']), 100)}': {clip(err['msg'].removeprefix('Value error, '), 200)} "
                 f"(got {short(err.get('input'), 60)})" for err in errors[:10]]
        if len(errors) > 10:
            lines.append(f"{clip(p)}: ... and {len(errors) - 10} more errors")
        raise InventoryError("\n".join(lines) + "\nfix the pool file (see include/pools/demo.yaml).") from None


def _declared_device(p: Path, i: int, d: _DeclaredDevice, pool_host: str, catalog: Catalog, seen: set[str]) -> Device:
    """The pool's ``devices[i]`` as a :class:`Device`, its model from the catalog; its id is added to ``seen``."""
    try:
        model = catalog.get(d.model)
    except CatalogError as exc:
        raise InventoryError(f"{p}: devices[{i}].model: {exc}") from None
    if d.vendor and d.vendor != model.vendor:
        raise InventoryError(f"{p}: devices[{i}].vendor is {d.vendor!r} but the catalog's {model.name} is a "
                             f"{model.vendor!r} device; remove the vendor or fix the model.")
    host = d.host or pool_host
    device_id = d.uuid or f"{host}:{d.index}"
    if device_id in seen:
        raise InventoryError(f"{p}: devices[{i}]: duplicate device {device_id}; give each device a unique index or uuid.")
    seen.add(device_id)
    total = d.memory_total_bytes or model.memory_bytes
    if d.memory_used_bytes > total:
        raise InventoryError(f"{p}: devices[{i}].memory_used_bytes exceeds the device's memory ({total} bytes).")
    return Device(
        device_id=device_id,
        host=host,
        index=d.index,
        uuid=d.uuid,
        model=model.name,
        vendor=d.vendor or model.vendor,
        memory_total_bytes=total,
        memory_used_bytes=d.memory_used_bytes,
        utilization_pct=d.utilization_pct,
        healthy=d.healthy,
        declared=True,
        nvlink_group=d.nvlink_group,
        pci_bus_id=d.pci_bus_id,
        labels=d.labels,
    )
