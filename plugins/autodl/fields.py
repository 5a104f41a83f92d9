"""Bounded field types for what users write (spec, pool and catalog files): integers never booleans, numbers
finite and in range, so nothing downstream overflows, prints ``NaN`` or takes ``true`` for 1.

Each bound is far above anything real and says where it comes from; a value past it is a typo or an attack,
refused with the field's name by pydantic (the callers turn it into a SpecError/InventoryError/CatalogError).
"""

from __future__ import annotations

from typing import Annotated, TypeAlias

from pydantic import Field, Strict

MAX_BATCH_PER_DEVICE = 1 << 30
"""Samples per device per step (1,073,741,824): ten thousand times the largest published batches, which are 32k-64k
samples *in total* (LARS on ImageNet, You et al. 2017, arXiv:1708.03888: 32,768 over hundreds of devices); a larger
one is a typo (a 10**400), and what a batch up to it would need is still computed without overflow."""

MAX_SEQUENCE_LENGTH = 1 << 24
"""Tokens per sample (16,777,216): over ten times the longest published context windows (1M-10M tokens)."""

MAX_INPUT_DIM = 1 << 24
"""One dimension of a per-sample input shape; the same bound as a sequence."""

MAX_INPUT_ELEMENTS = 1 << 36
"""Elements of one sample (6.9e10, 256 GiB of fp32): more than any device holds, so a larger sample is a typo."""

MAX_INPUT_RANK = 8
"""Dimensions of a per-sample shape (video is 4: C, T, H, W; Paddle tensors allow at most 9 with the batch)."""

MAX_DEVICES_PER_RUN = 1 << 16
"""Devices of one data-parallel run (65,536): four times the largest published training run (Llama 3 405B: 16,384
H100s, arXiv:2407.21783)."""

MAX_HOST_BYTES = 1 << 50
"""Host sizes (/dev/shm, a container's memory limit): 1 PiB, over twenty times the largest single host
(HPE Superdome Flex: 48 TiB)."""

MAX_DEVICE_BYTES = 1 << 42
"""One accelerator's memory: 4 TiB, ten times the largest sold (AMD Instinct MI355X: 288 GB HBM3E)."""

MAX_CPUS = 8192
"""CPU cores of one container: Linux ``CONFIG_NR_CPUS`` of Debian's and Ubuntu's amd64 kernels (8192)."""

MAX_WAIT_S = 366 * 86400
"""Seconds a run may wait for a device or between pool checks: one year."""

MAX_SCORE_WEIGHT = 1e6
"""Absolute value of a user-given score term (tag priorities): the policy's own terms are O(1)."""

MAX_CATALOG_FIGURE = 1e9
"""TFLOPS, GB/s and dollars per hour in the catalog: ten thousand times today's largest figures."""

MAX_DEVICE_INDEX = 65535
"""A device index on its host (NVML numbers devices from 0; no host has more than a few dozen)."""

UINT32_ID_MAX = (1 << 32) - 2
"""Largest uid/gid: ``uid_t`` is 32-bit and (uid_t)-1 means "no change" (POSIX ``setreuid``)."""


def Int(ge: int | None = None, le: int | None = None, gt: int | None = None) -> type[int]:
    """An integer in range that YAML's ``true``/``false`` (or ``3.0``, ``"3"``) never passes as."""
    return Annotated[int, Strict(), Field(ge=ge, le=le, gt=gt)]  # type: ignore[return-value]


def Float(ge: float | None = None, le: float | None = None, gt: float | None = None) -> type[float]:
    """A finite number in range (an integer is taken as a float; ``true``, ``.nan`` and ``.inf`` are not)."""
    return Annotated[float, Strict(), Field(ge=ge, le=le, gt=gt, allow_inf_nan=False)]  # type: ignore[return-value]


MAX_RUN_KEY_CHARS = 512
"""Longest run key the store holds (``autodl_leases.run_key``, ``autodl_runs.run_key`` and the queue's are
``VARCHAR(512)``); Airflow allows a DAG id, a task group id and a run id of 250 characters each, so
:func:`autodl.steps.context.make_run_key` shortens longer keys."""

# Real type aliases (mypy reads them as int/float; pydantic reads the bounds), spelt as Int()/Float() build them.
BatchSize: TypeAlias = Annotated[int, Strict(), Field(gt=0, le=MAX_BATCH_PER_DEVICE)]
SequenceLength: TypeAlias = Annotated[int, Strict(), Field(gt=0, le=MAX_SEQUENCE_LENGTH)]
InputDim: TypeAlias = Annotated[int, Strict(), Field(gt=0, le=MAX_INPUT_DIM)]
DeviceCount: TypeAlias = Annotated[int, Strict(), Field(ge=1, le=MAX_DEVICES_PER_RUN)]
WaitSeconds: TypeAlias = Annotated[int, Strict(), Field(gt=0, le=MAX_WAIT_S)]
Fraction: TypeAlias = Annotated[float, Strict(), Field(gt=0, le=1, allow_inf_nan=False)]
ScoreWeight: TypeAlias = Annotated[float, Strict(), Field(ge=-MAX_SCORE_WEIGHT, le=MAX_SCORE_WEIGHT, allow_inf_nan=False)]
Cpus: TypeAlias = Annotated[float, Strict(), Field(gt=0, le=MAX_CPUS, allow_inf_nan=False)]
DeviceBytes: TypeAlias = Annotated[int, Strict(), Field(gt=0, le=MAX_DEVICE_BYTES)]
UsedDeviceBytes: TypeAlias = Annotated[int, Strict(), Field(ge=0)]  # compared with the device's memory by the reader
Percent: TypeAlias = Annotated[float, Strict(), Field(ge=0, le=100, allow_inf_nan=False)]
DeviceIndex: TypeAlias = Annotated[int, Strict(), Field(ge=0, le=MAX_DEVICE_INDEX)]
CatalogFigure: TypeAlias = Annotated[float, Strict(), Field(gt=0, le=MAX_CATALOG_FIGURE, allow_inf_nan=False)]
CatalogFigureOrZero: TypeAlias = Annotated[float, Strict(), Field(ge=0, le=MAX_CATALOG_FIGURE, allow_inf_nan=False)]
TolerationSeconds: TypeAlias = Annotated[int, Strict(), Field(ge=0, le=10**9)]
"""A Kubernetes toleration's ``tolerationSeconds`` (launch options): up to 10**9 s, about 31 years."""

__all__ = [
    "BatchSize", "CatalogFigure", "CatalogFigureOrZero", "Cpus", "DeviceBytes", "DeviceCount", "DeviceIndex", "Float",
    "Fraction", "InputDim", "Int", "MAX_HOST_BYTES", "MAX_RUN_KEY_CHARS", "Percent", "ScoreWeight", "SequenceLength",
    "TolerationSeconds", "UINT32_ID_MAX", "UsedDeviceBytes", "WaitSeconds",
]
