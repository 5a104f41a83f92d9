"""The per-device memory a run is placed by: its estimate, or, when the model's size is unknown, the largest device.

A cold start that did not find the model (``ResourceProfile.params`` None) has a figure of activations and
workspace only: weights, gradients and optimizer state are unknown, so that figure can be any number of times under
the truth. Placement, the admission queue and the refusal check then act on the conservative side: the run needs
the largest allowed device of the pool, under the memory threshold, and says so.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

from autodl.types import Device, ResourceProfile


def size_unknown(profile: ResourceProfile) -> bool:
    """Whether the run's model size is unknown (a cold start that did not find the model: ``params`` None)."""
    return profile.params is None


INPUT_FLOOR_BYTES_PER_ELEMENT = 4
"""Bytes per element of an input batch taken as certain: float32, what ``paddle.vision.transforms.ToTensor`` and
Paddle's ``DataLoader`` hand a model for float data."""


def input_floor_bytes(profile: ResourceProfile) -> int:
    """Bytes of one batch of the run's input (batch x input size x :data:`INPUT_FLOOR_BYTES_PER_ELEMENT`): memory
    every training step holds however the model is made, where the profile knows the input size; else 0."""
    size = profile.sequence_length or (math.prod(profile.input_shape) if profile.input_shape else 0)
    return profile.batch_size * size * INPUT_FLOOR_BYTES_PER_ELEMENT


def needed_bytes(profile: ResourceProfile, devices: Iterable[Device], allowed: set[str], threshold: float) -> int:
    """Per-device bytes the run is placed by.

    :param devices: the pool's devices (healthy or not: the size a device could ever give).
    :param allowed: the vendors the run may use.
    :param threshold: ``resource_policy.memory_threshold`` (0-1) the need must stay under.
    :returns: ``profile.peak_memory_bytes`` when the model's size is known; else ``threshold`` x the largest allowed
        device's memory (so only the largest devices qualify), or a measured floor where that is more (the input
        batch alone, :func:`input_floor_bytes`; ``profile.floor_bytes``, an allocation the dry run saw fail or an
        earlier run's out-of-memory floor): a run that cannot fit is refused. The cold-start formula's figure counts
        neither way: it is no bound (its hidden width of 768 is assumed), and it refused a fresh user's
        2.3M-parameter MobileNet at 128 x 128 on every card ("never fits: needs 63.3 GiB"). With no allowed device
        in the pool, the figure stands.
    """
    need = profile.peak_memory_bytes
    if not size_unknown(profile):
        return need
    largest = max((d.memory_total_bytes for d in devices if d.vendor in allowed), default=0)
    return max(int(threshold * largest), input_floor_bytes(profile), profile.floor_bytes or 0) if largest else need


def unknown_size_reason(need: int) -> str:
    """The line placement and the queue log when :func:`needed_bytes` sized the run as the largest device."""
    return (f"the model's size is unknown (a cold start: the cold-start warning says why), so the run is sized as the "
            f"largest allowed device: {need / 2**30:.2f} GiB (conservative); a dry run that measures the script "
            "gives the real figure (the cold-start warning says how)")
