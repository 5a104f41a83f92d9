"""Packing: when a 1-device run may share a big NVIDIA device with one other, what it reserves there, and its cap.

The rule of ``docs/reference/fractional-leases.md`` as pure functions, used alike by the ledger (the atomic
check), the queue (where a packed run may go) and the simulator (``autodl_sim``), so the benchmark credits
exactly what ships.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable

from pydantic import BaseModel, ConfigDict, Field

from autodl.profile.memory import CUDA_CONTEXT_BYTES, MIB
from autodl.types import Device

SHARING_MODES: tuple[str, ...] = ("exclusive", "packed")

MIN_SHARED_MEMORY_BYTES = 24 * 10**9
"""Smallest device that takes a second run: the nameplate "24 GB" class, in bytes (10^9). NVML reports
23,028 MiB (24.1e9 B) for an A10 and 24,564 MiB for an RTX 4090, so both qualify; a 16 GB V100 does not.
Source: issue 24 ("NVIDIA device of >= 24 GB")."""

MAX_TENANTS = 2
"""At most two runs per device (issue 24; Gandiva and AntMan pack pairs)."""

SLOWDOWN_BAR = 0.8
"""A pair type whose measured co-located speed falls below this fraction of solo speed stops being packed
(issue 24, item 4)."""

SHARED_CONTEXT_BYTES = CUDA_CONTEXT_BYTES
"""What the second tenant adds beyond its own estimate: one more CUDA context (the estimator's own
``workspace_terms_bytes["cuda_context"]`` figure, :data:`autodl.profile.memory.CUDA_CONTEXT_BYTES`)."""


class DeviceShare(BaseModel):
    """What is booked on one device now: the ledger's share row."""

    model_config = ConfigDict(frozen=True)

    device_id: str
    capacity_bytes: int = Field(description="Bytes that may be reserved: memory threshold x device memory.")
    reserved_bytes: int = Field(0, description="Bytes reserved by the leases on it.")
    leases: int = Field(0, description="How many leases hold the device (0, 1 or 2).")
    exclusive: bool = Field(False, description="A lease holds the whole device; nothing else may join.")


def shareable(device: Device) -> bool:
    """A healthy whole NVIDIA device (not a MIG instance) of at least :data:`MIN_SHARED_MEMORY_BYTES`."""
    return (device.healthy and device.vendor == "nvidia" and device.compute_fraction is None
            and device.memory_total_bytes >= MIN_SHARED_MEMORY_BYTES)


def capacity_bytes(device: Device, memory_threshold: float) -> int:
    """Bytes the leases on ``device`` may reserve together: ``memory_threshold`` (0-1, the spec's) x its memory."""
    return int(memory_threshold * device.memory_total_bytes)


def reservation_bytes(estimate_bytes: int | None, *, joining: bool) -> int | None:
    """What a packed run reserves: its estimate, plus one more CUDA context when it joins a device that
    already holds a run; None when the estimate is unknown (an unknown never shares: it takes the device)."""
    if not estimate_bytes or estimate_bytes <= 0:
        return None
    return estimate_bytes + (SHARED_CONTEXT_BYTES if joining else 0)


def fits_beside(share: DeviceShare | None, estimate_bytes: int | None, capacity: int) -> bool:
    """Whether a packed run of ``estimate_bytes`` may take the device whose bookings are ``share`` (None: free).

    A free device takes it when the estimate fits under ``capacity``; a device with one packed run takes
    it when both reservations plus one more CUDA context fit; an exclusive or full device never does.
    """
    if share is None or share.leases == 0:
        need = reservation_bytes(estimate_bytes, joining=False)
        return need is not None and need <= capacity
    if share.exclusive or share.leases >= MAX_TENANTS:
        return False
    need = reservation_bytes(estimate_bytes, joining=True)
    return need is not None and share.reserved_bytes + need <= min(capacity, share.capacity_bytes)


def memory_cap_env(reserved_bytes: int, device_total_bytes: int) -> dict[str, str]:
    """Paddle's flags that cap a co-located training at what it reserved.

    ``FLAGS_fraction_of_gpu_memory_to_use`` (0-1, of the device's memory) bounds the ``naive_best_fit``
    allocator's chunks; ``FLAGS_gpu_memory_limit_mb`` (MiB, Paddle's ``paddle/phi/core/flags.cc``: "the
    maximum gpu memory limit that the process can allocate") bounds every allocator. Whether the default
    ``auto_growth`` allocator honours the limit is a GPU check, not yet measured (``docs/gpu-check.md``).
    """
    fraction = min(1.0, reserved_bytes / device_total_bytes) if device_total_bytes > 0 else 1.0
    return {"FLAGS_fraction_of_gpu_memory_to_use": f"{fraction:.4f}",
            "FLAGS_gpu_memory_limit_mb": str(max(1, reserved_bytes // MIB))}


CAP_NOT_VERIFIED = "memory cap not verified under auto_growth"
"""What the log and the record say of a packed run's cap until a GPU check measures whether Paddle's default
``auto_growth`` allocator honours ``FLAGS_gpu_memory_limit_mb`` (``docs/gpu-check.md``, step 9)."""


def pair_type(model_a: str | None, model_b: str | None, device_model: str) -> str:
    """The key interference is measured under: the two runs' model names (sorted) on one device model."""
    a, b = sorted((model_a or "?", model_b or "?"))
    return f"{a}+{b}@{device_model}"


def pair_barred(speed_ratios: Iterable[float]) -> bool:
    """Whether a pair type stops being packed: the mean measured co-located/solo step-speed ratio (0-1]
    is below :data:`SLOWDOWN_BAR`. No measurement: not barred (the published prior decides)."""
    ratios = [r for r in speed_ratios if r > 0]
    return bool(ratios) and statistics.fmean(ratios) < SLOWDOWN_BAR
