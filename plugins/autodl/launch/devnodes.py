"""The device nodes of an isolated local training's ``/dev``: the booked accelerators' only (issue 19).

Details: docs/security.md#autodllaunchdevnodes.
"""

from __future__ import annotations

import glob
import re
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from pydantic import BaseModel, ConfigDict

from autodl.catalog import VendorInfo
from autodl.errors import LaunchError
from autodl.inventory.nvml import DeviceAddress, read_addresses
from autodl.types import Device

NVIDIA_CONTROL_NODES = ("nvidiactl", "nvidia-uvm", "nvidia-uvm-tools", "nvidia-modeset")
"""Nodes under ``/dev`` every CUDA process may open besides its GPUs' ``nvidia<minor>``: the driver's control
device, Unified Memory and its tools node, and modeset -- the control devices the NVIDIA container toolkit
(libnvidia-container, https://github.com/NVIDIA/libnvidia-container) mounts into a container with its GPUs."""

NVIDIA_ALL = ("nvidia[0-9]*", *NVIDIA_CONTROL_NODES, "nvidia-caps")
"""Every NVIDIA node (patterns under ``/dev``): what an ``auto`` training gets when the booked ones are unknown."""

OTHER_VENDOR_ALL = ("kfd", "dri", "davinci*", "davinci_manager", "devmm_svm", "hisi_hdc", "xpu*")
"""AMD ROCm's, Ascend's and Kunlun's nodes (patterns under ``/dev``): bound when a vendor is not known."""

SHARED_NODES = ("infiniband",)
"""Nodes under ``/dev`` bound for every run: RDMA's (NCCL and Gloo over InfiniBand), not an accelerator."""

MIG_MINORS = Path("/proc/driver/nvidia-caps/mig-minors")
"""The driver's table of MIG capability minors: lines ``gpu<minor>/gi<id>/access <N>`` and
``gpu<minor>/gi<id>/ci<id>/access <N>``, each device ``/dev/nvidia-caps/nvidia-cap<N>`` (NVIDIA MIG User Guide,
"Device Nodes and Capabilities": https://docs.nvidia.com/datacenter/tesla/mig-user-guide/)."""

_MIG_LINE = re.compile(r"^(gpu\d+/gi\d+(?:/ci\d+)?/access)\s+(\d+)\s*$")


class DeviceNodes(BaseModel):
    """The accelerator nodes bound into a training's ``/dev``.

    :ivar names: paths relative to ``/dev`` (``nvidia0``, ``nvidia-caps/nvidia-cap21``), each one that exists.
    :ivar narrowed: True when they are the booked devices' only (or nothing was booked).
    :ivar note: what was assumed when not narrowed (for the training's log); None when narrowed.
    """

    model_config = ConfigDict(frozen=True)

    names: list[str]
    narrowed: bool = True
    note: str | None = None


def parse_mig_minors(text: str) -> dict[str, int]:
    """``/proc/driver/nvidia-caps/mig-minors`` as ``{'gpu0/gi1/access': 21, 'gpu0/gi1/ci0/access': 22}``; the
    ``config`` and ``monitor`` lines are left out (a training never gets them)."""
    out: dict[str, int] = {}
    for line in text.splitlines():
        m = _MIG_LINE.match(line.strip())
        if m:
            out[m.group(1)] = int(m.group(2))
    return out


def _existing(dev: Path, patterns: Sequence[str]) -> list[str]:
    names: list[str] = []
    for pattern in patterns:
        names += sorted(str(Path(p).relative_to(dev)) for p in glob.glob(str(dev / pattern)))
    return list(dict.fromkeys(names))


def _mig_caps(address: DeviceAddress, mig_minors: Mapping[str, int] | None) -> list[str] | str:
    """The ``nvidia-caps/nvidia-cap<N>`` names of a MIG instance's GPU and compute instance, or why not."""
    if mig_minors is None:
        return f"{MIG_MINORS} is unreadable"
    gi = f"gpu{address.minor}/gi{address.gpu_instance}/access"
    ci = f"gpu{address.minor}/gi{address.gpu_instance}/ci{address.compute_instance}/access"
    missing = [k for k in (gi, ci) if k not in mig_minors]
    if missing:
        return f"{MIG_MINORS} has no {' or '.join(missing)}"
    return [f"nvidia-caps/nvidia-cap{mig_minors[gi]}", f"nvidia-caps/nvidia-cap{mig_minors[ci]}"]


def nvidia_nodes(addresses: Sequence[DeviceAddress], *, dev: Path = Path("/dev"),
                 mig_minors: Mapping[str, int] | None = None) -> DeviceNodes:
    """The NVIDIA nodes of the booked devices at ``addresses`` (a pure function of its inputs and ``dev``'s
    entries).

    :param dev: the folder holding the host's nodes (``/dev``; a temporary folder in tests).
    :param mig_minors: :func:`parse_mig_minors` of :data:`MIG_MINORS`; None when unreadable.
    :returns: narrowed nodes, or (any address unknown) every NVIDIA node with a note naming the device and why.
    """
    names: list[str] = []
    unknown: list[str] = []
    for a in addresses:
        if a.minor is None:
            unknown.append(f"{a.device_id} ({a.unknown or 'minor number unknown'})")
            continue
        names.append(f"nvidia{a.minor}")
        if a.gpu_instance is not None:
            caps = _mig_caps(a, mig_minors)
            if isinstance(caps, str):
                unknown.append(f"{a.device_id} (MIG capabilities: {caps})")
                continue
            names += caps
    if unknown:
        return DeviceNodes(names=_existing(dev, NVIDIA_ALL), narrowed=False, note=(
            "the device nodes of booked device(s) " + "; ".join(unknown) + " could not be read, so every GPU's "
            "node is bound into the training's /dev and only CUDA_VISIBLE_DEVICES pins it"))
    present = [n for n in dict.fromkeys(names) if (dev / n).exists()]
    return DeviceNodes(names=present + _existing(dev, NVIDIA_CONTROL_NODES))


def vendor_nodes(devices: Sequence[Device], vendor: VendorInfo | None, *, dev: Path = Path("/dev")) -> DeviceNodes:
    """Another vendor's nodes of the booked ``devices``: the vendor table's per-device and shared nodes (AMD/Hygon:
    ``/dev/kfd`` and ``/dev/dri`` whole); every non-NVIDIA node when the vendor is not known."""
    if vendor is None:
        return DeviceNodes(names=_existing(dev, OTHER_VENDOR_ALL), narrowed=False,
                           note="the booked devices' vendor is not known, so every accelerator's node is bound")
    per_device = [n.format(index=d.index) for d in devices for n in vendor.docker_device_nodes]
    patterns = [str(Path(n).relative_to("/dev")) for n in (*per_device, *vendor.docker_shared_device_nodes)
                if n.startswith("/dev/")]
    return DeviceNodes(names=_existing(dev, patterns))


def _read_mig_minors() -> dict[str, int] | None:
    try:
        return parse_mig_minors(MIG_MINORS.read_text())
    except OSError:
        return None


def booked_nodes(devices: Sequence[Device], vendor: VendorInfo | None, *, on_cpu: bool = False, strict: bool = False,
                 dev: Path = Path("/dev"),
                 addresses: Callable[[Sequence[Device]], list[DeviceAddress]] = read_addresses,
                 mig_minors: Callable[[], dict[str, int] | None] = _read_mig_minors) -> DeviceNodes:
    """The accelerator nodes bound into a local training's ``/dev`` (see the module docstring).

    NVML is asked only when the host has a GPU node (``dev/nvidia<N>``): on a host without one there is nothing to
    narrow.

    :param strict: isolation is required (``AUTODL_LOCAL_ISOLATION=bwrap``): nodes that cannot be narrowed refuse
        the launch instead of binding every GPU's.
    :param addresses: reads the NVIDIA devices' addresses (NVML; injectable for tests).
    :param mig_minors: reads :data:`MIG_MINORS` (injectable for tests).
    :raises LaunchError: ``strict`` and the booked nodes cannot be narrowed, naming the device and why.
    """
    shared = _existing(dev, SHARED_NODES)
    if on_cpu or not devices:
        return DeviceNodes(names=shared)
    nvidia = [d for d in devices if d.vendor == "nvidia"]
    if nvidia and _existing(dev, ("nvidia[0-9]*",)):
        nodes = nvidia_nodes(addresses(nvidia), dev=dev,
                             mig_minors=mig_minors() if any(d.labels.get("mig_parent") for d in nvidia) else {})
    elif nvidia:
        nodes = DeviceNodes(names=[])
    else:
        nodes = vendor_nodes(devices, vendor, dev=dev)
    if strict and nodes.note:
        raise LaunchError(f"AUTODL_LOCAL_ISOLATION=bwrap, but {nodes.note}. Fix what NVML reports for that device "
                          "(nvidia-smi -q), or set AUTODL_LOCAL_ISOLATION=auto to accept it.")
    return nodes.model_copy(update={"names": nodes.names + [n for n in shared if n not in nodes.names]})


__all__ = ["MIG_MINORS", "NVIDIA_CONTROL_NODES", "DeviceNodes", "booked_nodes", "nvidia_nodes", "parse_mig_minors",
           "vendor_nodes"]
