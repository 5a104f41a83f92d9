"""The per-device memory a run is placed by: its estimate, or, when the model's size is unknown, the largest device.

A cold start that did not find the model (``ResourceProfile.params`` None) has a figure of activations and
workspace only: weights, gradients and optimizer state are unknown, so that figure can be any number of times under
the truth. Placement, the admission queue and the refusal check then act on the conservative side: the run needs
the largest allowed device of the pool, under the memory threshold, and says so.
"""

from __future__ import annotations

from collections.abc import Iterable

from autodl.types import Device, ResourceProfile


def size_unknown(profile: ResourceProfile) -> bool:
    """Whether the run's model size is unknown (a cold start that did not find the model: ``params`` None)."""
    return profile.params is None


def needed_bytes(profile: ResourceProfile, devices: Iterable[Device], allowed: set[str], threshold: float) -> int:
    """Per-device bytes the run is placed by.

    :param devices: the pool's devices (healthy or not: the size a device could ever give).
    :param allowed: the vendors the run may use.
    :param threshold: ``resource_policy.memory_threshold`` (0-1) the need must stay under.
    :returns: ``profile.peak_memory_bytes`` when the model's size is known; else the larger of that and
        ``threshold`` x the largest allowed device's memory (so only the largest devices qualify).
    """
    need = profile.peak_memory_bytes
    if not size_unknown(profile):
        return need
    largest = max((d.memory_total_bytes for d in devices if d.vendor in allowed), default=0)
    return max(need, int(threshold * largest))


def unknown_size_reason(need: int) -> str:
    """The line placement and the queue log when :func:`needed_bytes` sized the run as the largest device."""
    return (f"the model's size is unknown (a cold start: the cold-start warning says why), so the run is sized as the "
            f"largest allowed device: {need / 2**30:.2f} GiB (conservative); a dry run that measures the script "
            "gives the real figure (the cold-start warning says how)")
